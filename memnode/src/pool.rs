//! The chunk pool: the allocator's books, the fabric's memory registrations and the
//! region, kept in step.
//!
//! Allocating books a range in the [`ChunkAllocator`], registers it with the fabric's
//! [`MemoryRegistry`] for the client that will access it (what `ibv_reg_mr` is on a
//! NIC: the rkey comes from there, and from then on that client's READs and WRITEs
//! reach the range without this code), and files the chunk under its rkey in the
//! pool's own table. Freeing runs the other way, and the order is what keeps the
//! "free memory reads as zero" invariant without a lock around data copies:
//!
//! 1. take the chunk out of the pool's table: the arbiter between racing frees (only
//!    one finds it) and the owner check (only the owner's own `(addr, rkey)` matches);
//! 2. deregister it, which returns once no READ/WRITE under its rkey is in flight and
//!    none can start;
//! 3. zero it (`Region::zero`; `MADV_DONTNEED` is fine with verbs too, as no memory
//!    region pins the pages any more), which nothing else can reach now;
//! 4. give it back to the allocator, which may hand it out again at once.
//!
//! Who a chunk is booked to ([`Owner`]) and who may access it (the registration's
//! client) are kept apart: a scratch chunk is booked to the client that accesses it;
//! a volume chunk is booked to its volume and registered for whichever client holds
//! the volume, or for nobody (then it is in the books but not in the table). Volume
//! chunks are registered again ([`ChunkPool::register`]) and deregistered
//! ([`ChunkPool::deregister`]) as holders come and go, without being freed;
//! [`ChunkPool::revoke_all_of`] a client only ever takes that client's scratch chunks.
//!
//! Every registration the pool makes is deregistered before the pool lets go of the
//! region: by a free, by [`ChunkPool::revoke_all_of`] or [`ChunkPool::deregister`],
//! or when the pool is dropped. That is what `register`'s safety contract asks.
//!
//! Copy ([`ChunkPool::copy`]) is an access like a READ and a WRITE: it checks its
//! spans under the chunk table's lock and **pins** their rkeys there, then copies
//! with no lock held; taking a chunk out of the table (a free, a deregistration, a
//! revoke) waits until no copy pins its rkey, as the registry's deregistration waits
//! for READs and WRITEs in flight. So a chunk is never written after it was zeroed
//! or handed to someone else, and one client's copies (up to 16 MiB a request)
//! never hold a lock every other client's Alloc, Free and open needs.
//!
//! Locks: the allocator mutex and the chunk table mutex are never held together, and
//! neither is held while calling the registry. The pins' mutex is taken inside the
//! chunk table's or alone, and never held while waiting for anything but a copy to
//! end. Callers may hold their own locks around pool calls (control does, see
//! `control.rs`), never the other way round.

use crate::allocator::{AllocError, Booking, ChunkAllocator, Owner};
use crate::region::Region;
use rmemfs_common::fabric::{FabricError, MemoryRegistry};
use rmemfs_common::protocol::CopySpan;
use rmemfs_common::sync::{lock, wait};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex};
use thiserror::Error;

/// One registered chunk: `[addr, addr + len)`, booked to `owner` and registered for
/// `client` under `rkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Chunk {
    pub owner: Owner,
    pub client: u64,
    pub addr: u64,
    pub len: u64,
    pub rkey: u32,
}

impl Chunk {
    fn new(b: Booking, client: u64, rkey: u32) -> Chunk {
        Chunk {
            owner: b.owner,
            client,
            addr: b.addr,
            len: b.len,
            rkey,
        }
    }

    /// The chunk as the control protocol describes it to its owner.
    pub fn to_wire(self) -> rmemfs_common::protocol::Allocation {
        rmemfs_common::protocol::Allocation {
            addr: self.addr,
            len: self.len,
            rkey: self.rkey,
        }
    }
}

/// Why the pool refused an allocation or a free.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum PoolError {
    #[error(transparent)]
    Alloc(#[from] AllocError),
    #[error("no allocation at {addr:#x} with rkey {rkey:#x} belongs to this client")]
    NotFound { addr: u64, rkey: u32 },
    #[error("no chunk of {owner:?} starts at {addr:#x}")]
    NotBooked { owner: Owner, addr: u64 },
    #[error("cannot register {len} bytes for remote access: {error}")]
    Register { len: u64, error: FabricError },
    #[error("{len} bytes at {addr:#x} are not all inside an allocation of this client's with rkey {rkey:#x}")]
    Access { addr: u64, len: u64, rkey: u32 },
}

pub struct ChunkPool {
    region: Arc<Region>,
    allocator: Mutex<ChunkAllocator>,
    registry: Arc<dyn MemoryRegistry>,
    /// Registered chunks by rkey.
    chunks: Mutex<HashMap<u32, Chunk>>,
    /// Copies in flight under each rkey (see the module docs).
    pins: Mutex<HashMap<u32, usize>>,
    /// Signalled when a copy ends.
    unpinned: Condvar,
}

impl std::fmt::Debug for ChunkPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkPool")
            .field("region", &self.region)
            .field("allocator", &self.allocator)
            .finish_non_exhaustive()
    }
}

/// Capacity and usage of the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub capacity: u64,
    pub used: u64,
    pub chunks: usize,
}

impl ChunkPool {
    /// A pool over the whole region; chunks become accessible by registering them
    /// with `registry`.
    pub fn new(region: Arc<Region>, registry: Arc<dyn MemoryRegistry>) -> ChunkPool {
        let allocator = ChunkAllocator::new(region.base(), region.len(), region.granularity());
        ChunkPool {
            region,
            allocator: Mutex::new(allocator),
            registry,
            chunks: Mutex::new(HashMap::new()),
            pins: Mutex::new(HashMap::new()),
            unpinned: Condvar::new(),
        }
    }

    /// `bytes` as the allocator books them: rounded up to whole pages (what a
    /// tenant is charged before an Alloc).
    pub fn rounded(&self, bytes: u64) -> u64 {
        let page = self.page().max(1);
        bytes
            .checked_next_multiple_of(page)
            .unwrap_or(u64::MAX - u64::MAX % page)
    }

    /// Allocates a scratch chunk of at least `bytes` to `client` and registers it.
    pub fn alloc(&self, client: u64, bytes: u64) -> Result<Chunk, PoolError> {
        self.alloc_for(Owner::Client(client), client, bytes)
    }

    /// Books a chunk of at least `bytes` to `owner` and registers it for `client`.
    pub fn alloc_for(&self, owner: Owner, client: u64, bytes: u64) -> Result<Chunk, PoolError> {
        let booking = lock(&self.allocator).alloc(owner, bytes)?;
        match self.register_booking(booking, client) {
            Ok(chunk) => Ok(chunk),
            Err(e) => {
                // Never reachable, so still zero: straight back to the books.
                self.release(booking);
                Err(e)
            }
        }
    }

    /// Registers `owner`'s existing chunk at `addr` (booked earlier, not freed since)
    /// for `client` under a fresh rkey. The chunk keeps any other registration it has.
    pub fn register(&self, owner: Owner, client: u64, addr: u64) -> Result<Chunk, PoolError> {
        let booking = match lock(&self.allocator).get(addr) {
            Some(b) if b.owner == owner => *b,
            _ => return Err(PoolError::NotBooked { owner, addr }),
        };
        self.register_booking(booking, client)
    }

    fn register_booking(&self, booking: Booking, client: u64) -> Result<Chunk, PoolError> {
        // SAFETY: the allocator books only ranges inside the region, a private
        // read/write mapping that lives as long as `self.region`; the pool deregisters
        // every rkey it files before it drops its `Arc<Region>` (see the module docs
        // and `Drop`), and a booked range is not released (so not reused or unmapped)
        // while a registration of it is filed.
        let registered = unsafe { self.registry.register(client, booking.addr, booking.len) };
        match registered {
            Ok(rkey) => {
                let chunk = Chunk::new(booking, client, rkey);
                lock(&self.chunks).insert(rkey, chunk);
                Ok(chunk)
            }
            Err(error) => Err(PoolError::Register {
                len: booking.len,
                error,
            }),
        }
    }

    /// Revokes the registration `rkey` (returns once no access under it is in
    /// flight) and keeps the chunk booked. `None` when the pool has no such rkey.
    pub fn deregister(&self, rkey: u32) -> Option<Chunk> {
        let chunk = lock(&self.chunks).remove(&rkey)?;
        self.wait_unpinned(rkey);
        self.registry.deregister(rkey);
        Some(chunk)
    }

    /// Copies each span inside the region, as `client` could with a READ under
    /// `src_rkey` and a WRITE under `dst_rkey`: every span is checked (both rkeys
    /// registered for `client`, both ranges inside their chunks) before any is
    /// copied. The rkeys are pinned meanwhile, so no chunk involved can be freed or
    /// deregistered under the copy, and no lock is held while it copies (see the
    /// module docs). Returns the bytes copied.
    pub fn copy(&self, client: u64, spans: &[CopySpan]) -> Result<u64, PoolError> {
        let mut checked = Vec::with_capacity(spans.len());
        let mut rkeys = Vec::with_capacity(2 * spans.len());
        {
            let chunks = lock(&self.chunks);
            let inside = |addr: u64, len: u64, rkey: u32| {
                chunks
                    .get(&rkey)
                    .filter(|c| c.client == client)
                    .filter(|c| addr >= c.addr && addr.saturating_add(len) <= c.addr + c.len)
                    .map(|_| addr - self.region.base())
                    .ok_or(PoolError::Access { addr, len, rkey })
            };
            for s in spans {
                let len = s.len as u64;
                let from = inside(s.src_addr, len, s.src_rkey)?;
                let to = inside(s.dst_addr, len, s.dst_rkey)?;
                checked.push((from, to, len));
                rkeys.extend([s.src_rkey, s.dst_rkey]);
            }
            // Pinned before the table's lock goes: a removal after this waits.
            let mut pins = lock(&self.pins);
            for r in &rkeys {
                *pins.entry(*r).or_default() += 1;
            }
        }
        let mut copied = Ok(0);
        for (from, to, len) in checked {
            // Inside registered chunks, so inside the region.
            if self.region.copy_within(from, to, len).is_err() {
                copied = Err(PoolError::Access {
                    addr: from,
                    len,
                    rkey: 0,
                });
                break;
            }
            copied = copied.map(|b| b + len);
        }
        self.unpin(&rkeys);
        copied
    }

    fn unpin(&self, rkeys: &[u32]) {
        let mut pins = lock(&self.pins);
        for r in rkeys {
            if let Some(n) = pins.get_mut(r) {
                *n -= 1;
                if *n == 0 {
                    pins.remove(r);
                }
            }
        }
        drop(pins);
        self.unpinned.notify_all();
    }

    /// Returns once no copy pins `rkey`; the caller has taken it out of the table,
    /// so none can start.
    fn wait_unpinned(&self, rkey: u32) {
        let mut pins = lock(&self.pins);
        while pins.contains_key(&rkey) {
            pins = wait(&self.unpinned, pins);
        }
    }

    /// Frees `client`'s scratch chunk at `addr` with `rkey`.
    pub fn free(&self, client: u64, addr: u64, rkey: u32) -> Result<Chunk, PoolError> {
        self.free_as(Owner::Client(client), client, addr, rkey)
    }

    /// Frees the chunk at `addr` booked to `owner` and registered for `client` under
    /// `rkey`: take, deregister, zero, release.
    pub fn free_as(
        &self,
        owner: Owner,
        client: u64,
        addr: u64,
        rkey: u32,
    ) -> Result<Chunk, PoolError> {
        let chunk = {
            let mut chunks = lock(&self.chunks);
            match chunks.get(&rkey) {
                Some(c) if c.owner == owner && c.client == client && c.addr == addr => {
                    chunks.remove(&rkey)
                }
                _ => None,
            }
        }
        .ok_or(PoolError::NotFound { addr, rkey })?;
        self.wait_unpinned(chunk.rkey);
        self.registry.deregister(chunk.rkey);
        self.scrub_and_release(chunk.owner, chunk.addr, chunk.len);
        Ok(chunk)
    }

    /// Zeroes and frees `owner`'s chunks starting at `addrs`, which the caller has
    /// deregistered already; returns the bytes freed. A chunk that is somehow still
    /// registered, or not `owner`'s, is left alone (and logged): it may be in use.
    pub fn release_unregistered(&self, owner: Owner, addrs: &[u64]) -> u64 {
        let registered: HashSet<u64> = lock(&self.chunks).values().map(|c| c.addr).collect();
        let mut bytes = 0;
        for &addr in addrs {
            if registered.contains(&addr) {
                log::error!("chunk {addr:#x} of {owner:?} is still registered; not freeing it");
                continue;
            }
            let booking = match lock(&self.allocator).get(addr) {
                Some(b) if b.owner == owner => *b,
                _ => {
                    log::error!("no chunk of {owner:?} at {addr:#x} to free");
                    continue;
                }
            };
            bytes += self.scrub_and_release(owner, addr, booking.len);
        }
        bytes
    }

    /// True when `client` has a scratch chunk.
    /// Up to `max` scratch chunks of `client` with `addr > after`, in address order,
    /// and whether more follow.
    pub fn scratch_after(&self, client: u64, after: u64, max: usize) -> (Vec<Chunk>, bool) {
        let mut mine: Vec<Chunk> = lock(&self.chunks)
            .values()
            .filter(|c| c.owner == Owner::Client(client) && c.addr > after)
            .copied()
            .collect();
        mine.sort_unstable_by_key(|c| c.addr);
        let more = mine.len() > max;
        mine.truncate(max);
        (mine, more)
    }

    pub fn has_scratch(&self, client: u64) -> bool {
        lock(&self.chunks)
            .values()
            .any(|c| c.owner == Owner::Client(client))
    }

    /// Addresses of `owner`'s bookings that no registration covers (a memnode
    /// restarted on its memory file registers them when their client is back).
    pub fn unregistered_of(&self, owner: Owner) -> Vec<u64> {
        let registered: HashSet<u64> = lock(&self.chunks).values().map(|c| c.addr).collect();
        lock(&self.allocator)
            .bookings()
            .filter(|b| b.owner == owner && !registered.contains(&b.addr))
            .map(|b| b.addr)
            .collect()
    }

    /// Takes every scratch chunk of `client` out of the table and deregisters it
    /// (steps 1 and 2 for all of them); returns once none is being accessed. The
    /// caller then passes the result to [`ChunkPool::release_revoked`]. Volume chunks
    /// registered for `client` are not touched: they are not the client's. Scratch
    /// chunks of `client` not registered since a restart are returned too.
    pub fn revoke_all_of(&self, client: u64) -> Vec<Chunk> {
        let owner = Owner::Client(client);
        // Before the registered ones leave the table (they would look unregistered).
        let unregistered = self.unregistered_of(owner);
        let mut mine: Vec<Chunk> = {
            let mut chunks = lock(&self.chunks);
            let mine: Vec<Chunk> = chunks
                .values()
                .filter(|c| c.owner == Owner::Client(client))
                .copied()
                .collect();
            for c in &mine {
                chunks.remove(&c.rkey);
            }
            mine
        };
        for c in &mine {
            self.wait_unpinned(c.rkey);
            self.registry.deregister(c.rkey);
        }
        let books = lock(&self.allocator);
        mine.extend(unregistered.into_iter().filter_map(|addr| {
            let b = books.get(addr)?;
            Some(Chunk {
                owner,
                client,
                addr,
                len: b.len,
                rkey: 0,
            })
        }));
        mine
    }

    /// Zeroes and releases chunks already revoked; returns the bytes reclaimed.
    pub fn release_revoked(&self, chunks: &[Chunk]) -> u64 {
        chunks
            .iter()
            .map(|c| self.scrub_and_release(c.owner, c.addr, c.len))
            .sum()
    }

    /// Steps 3 and 4 for one deregistered chunk; returns its length, or 0 if it had
    /// to be leaked.
    fn scrub_and_release(&self, owner: Owner, addr: u64, len: u64) -> u64 {
        let offset = addr.wrapping_sub(self.region.base());
        if let Err(e) = self.region.zero(offset, len) {
            // Cannot happen for a chunk the allocator booked; leaking it is the only
            // choice that never hands out someone's old bytes.
            log::error!(
                "cannot zero freed chunk {addr:#x}+{len:#x} of {owner:?} ({e}); leaking it"
            );
            return 0;
        }
        self.release(Booking { owner, addr, len })
    }

    /// Gives a booking back to the allocator; returns its length, or 0 if the books
    /// did not have it.
    fn release(&self, b: Booking) -> u64 {
        match lock(&self.allocator).free(b.owner, b.addr) {
            Ok(_) => b.len,
            Err(e) => {
                log::error!("chunk {b:?} was not in the allocator's books: {e}");
                0
            }
        }
    }

    /// Every booking, in address order (what a memory file saves).
    pub fn bookings(&self) -> Vec<Booking> {
        lock(&self.allocator).bookings().copied().collect()
    }

    /// Books `b` again exactly where it was (a memnode restarting on its memory
    /// file); it is registered for nobody until [`ChunkPool::register`].
    pub fn rebook(&self, b: Booking) -> Result<(), PoolError> {
        lock(&self.allocator).book_at(b.owner, b.addr, b.len)?;
        Ok(())
    }

    pub fn usage(&self) -> Usage {
        let books = lock(&self.allocator);
        Usage {
            capacity: books.capacity(),
            used: books.used(),
            chunks: books.count(),
        }
    }

    pub fn capacity(&self) -> u64 {
        self.region.len()
    }

    /// The region's page: the smallest chunk the pool books.
    pub fn page(&self) -> u64 {
        self.region.granularity()
    }
}

impl Drop for ChunkPool {
    /// The registry may outlive the pool (the fabric holds it), but no registration
    /// may outlive the region's mapping: deregister whatever is still registered.
    fn drop(&mut self) {
        for (rkey, _) in lock(&self.chunks).drain() {
            self.registry.deregister(rkey);
        }
    }
}

#[cfg(test)]
#[path = "pool_tests.rs"]
mod tests;
