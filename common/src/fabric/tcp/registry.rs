//! The tcp backend's memory registry: the table of memory registrations a NIC keeps,
//! and the checked one-sided access a NIC makes against it.
//!
//! [`TcpRegistry::register`] files `[addr, addr + len)` for one owner under a fresh
//! random non-zero rkey (unique among live registrations, so rkeys cannot be guessed
//! from each other). A READ or WRITE from a connection is allowed only when the rkey
//! is registered, the registration belongs to the connection's client, and the whole
//! range lies inside it (overflow-safe); only then are bytes copied. A refused access
//! copies nothing.
//!
//! Revocation: an access holds the table's read lock for its whole copy;
//! [`MemoryRegistry::deregister`] takes the write lock, so it returns only after every
//! access that could still see the registration has finished, and no later access can
//! find it. Callers rely on this to reuse memory (zero it, hand it to someone else)
//! right after deregistering it, without racing a READ or WRITE.
//!
//! Soundness: the copies go through raw pointers built from the registered addresses.
//! They are valid because [`MemoryRegistry::register`] is `unsafe` and its caller
//! promises the range stays mapped readable and writable until deregistration has
//! returned, and an access runs only while its registration is in the table.

use crate::fabric::mapped::offer::MapOffer;
use crate::fabric::{AccessError, FabricError, MemoryRegistry};
use crate::sync::{lock, read, write};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Where rkeys come from; `None` when no randomness is available.
pub type KeySource = Box<dyn FnMut() -> Option<u32> + Send>;

/// Tries for a fresh rkey before giving up (a collision is already ~2^-20 likely).
const KEY_TRIES: usize = 64;

/// One registration: `[addr, addr + len)` of this process, reachable by `owner`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Registration {
    owner: u64,
    addr: u64,
    /// `addr + len`, computed once at registration (never overflows).
    end: u64,
}

/// rkey -> registration, with the checks and copies of the one-sided path.
///
/// Lock order: `table`, then `keys` (only `register` takes both).
pub struct TcpRegistry {
    table: RwLock<HashMap<u32, Registration>>,
    keys: Mutex<KeySource>,
    /// The region shared by mapping, when the memnode shares one: registrations in
    /// it are filed as grants for mapped clients, and revoked from them too.
    offer: OnceLock<Arc<MapOffer>>,
}

impl std::fmt::Debug for TcpRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpRegistry")
            .field("registrations", &self.len())
            .finish_non_exhaustive()
    }
}

impl Default for TcpRegistry {
    fn default() -> TcpRegistry {
        TcpRegistry::new()
    }
}

impl TcpRegistry {
    /// An empty registry drawing rkeys from the OS random generator.
    pub fn new() -> TcpRegistry {
        TcpRegistry::with_keys(Box::new(|| getrandom::u32().ok()))
    }

    /// An empty registry with a chosen key source (tests).
    pub fn with_keys(keys: KeySource) -> TcpRegistry {
        TcpRegistry {
            table: RwLock::new(HashMap::new()),
            keys: Mutex::new(keys),
            offer: OnceLock::new(),
        }
    }

    /// Shares registrations inside `offer`'s region with mapped clients from now
    /// on (once; before any registration).
    pub fn share(&self, offer: Arc<MapOffer>) -> Result<(), FabricError> {
        if !self.is_empty() {
            return Err(FabricError::Invalid(
                "a region is shared before anything is registered".into(),
            ));
        }
        self.offer
            .set(offer)
            .map_err(|_| FabricError::Invalid("a region is shared already".into()))
    }

    /// The mapped region's offer, if one is shared.
    pub fn offer(&self) -> Option<&Arc<MapOffer>> {
        self.offer.get()
    }

    // Poisoning cannot leave the map half-updated (every update is one insert or
    // remove), so a poisoned lock is used as is.
    fn read_table(&self) -> RwLockReadGuard<'_, HashMap<u32, Registration>> {
        read(&self.table)
    }

    fn write_table(&self) -> RwLockWriteGuard<'_, HashMap<u32, Registration>> {
        write(&self.table)
    }

    /// Live registrations.
    pub fn len(&self) -> usize {
        self.read_table().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A non-zero rkey not in `table`.
    fn fresh_key(&self, table: &HashMap<u32, Registration>) -> Result<u32, FabricError> {
        let mut keys = lock(&self.keys);
        for _ in 0..KEY_TRIES {
            let k = keys().ok_or_else(no_key)?;
            if k != 0 && !table.contains_key(&k) {
                return Ok(k);
            }
        }
        Err(no_key())
    }

    /// Runs `io` on the start of `[addr, addr + len)` if `client` may access that
    /// range under `rkey`, holding the table's read lock for the whole call: the
    /// range is registered (mapped, readable and writable) until `io` returns, and
    /// no deregistration completes before. `io` must not block (every
    /// deregistration, and every access queued behind one, waits for it) and must
    /// not keep the pointer. A refused access does not call `io`.
    pub fn access<R>(
        &self,
        client: u64,
        addr: u64,
        rkey: u32,
        len: usize,
        io: impl FnOnce(*mut u8) -> R,
    ) -> Result<R, AccessError> {
        let table = self.read_table();
        check(&table, client, addr, rkey, len)?;
        let r = io(addr as *mut u8);
        drop(table);
        Ok(r)
    }

    /// READ: copies `dst.len()` bytes at `addr` under `rkey` into `dst`, if `client`
    /// may.
    pub fn read(
        &self,
        client: u64,
        addr: u64,
        rkey: u32,
        dst: &mut [u8],
    ) -> Result<(), AccessError> {
        self.access(client, addr, rkey, dst.len(), |src| {
            // SAFETY: `access` passes the start of a checked range that stays
            // registered during this call, so by `register`'s contract it is mapped
            // readable memory of this process. `ptr::copy` allows the ranges to
            // overlap, and no reference into registered memory is formed.
            unsafe { std::ptr::copy(src, dst.as_mut_ptr(), dst.len()) }
        })
    }

    /// WRITE: copies `src` to `addr` under `rkey`, if `client` may.
    pub fn write(&self, client: u64, addr: u64, rkey: u32, src: &[u8]) -> Result<(), AccessError> {
        self.access(client, addr, rkey, src.len(), |dst| {
            // SAFETY: as in `read`, and the memory is writable by the backend at any
            // time (`register`'s contract).
            unsafe { std::ptr::copy(src.as_ptr(), dst, src.len()) }
        })
    }
}

fn no_key() -> FabricError {
    FabricError::Local("no randomness available for a new rkey".into())
}

/// The checks a NIC makes before a one-sided access of `len` bytes at `addr`.
fn check(
    table: &HashMap<u32, Registration>,
    client: u64,
    addr: u64,
    rkey: u32,
    len: usize,
) -> Result<(), AccessError> {
    let reg = table.get(&rkey).ok_or(AccessError::UnknownKey)?;
    if reg.owner != client {
        return Err(AccessError::NotOwner);
    }
    let end = u64::try_from(len)
        .ok()
        .and_then(|len| addr.checked_add(len))
        .ok_or(AccessError::OutOfBounds)?;
    if addr < reg.addr || end > reg.end {
        return Err(AccessError::OutOfBounds);
    }
    Ok(())
}

impl MemoryRegistry for TcpRegistry {
    unsafe fn register(&self, owner: u64, addr: u64, len: u64) -> Result<u32, FabricError> {
        let end = addr.checked_add(len).ok_or_else(|| {
            FabricError::Invalid(format!(
                "registration of {len} bytes at {addr:#x} wraps the address space"
            ))
        })?;
        let mut table = self.write_table();
        let rkey = self.fresh_key(&table)?;
        table.insert(rkey, Registration { owner, addr, end });
        drop(table);
        if let Some(offer) = self.offer() {
            offer.granted(rkey, owner, addr, len);
        }
        Ok(rkey)
    }

    fn deregister(&self, rkey: u32) {
        // Mapped clients first: when this returns, no copy of theirs is in flight.
        if let Some(offer) = self.offer() {
            offer.revoked(rkey);
        }
        // The write lock waits out every access holding the read lock.
        self.write_table().remove(&rkey);
    }
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
