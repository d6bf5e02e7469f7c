//! The one-sided path, what a NIC does on a memnode: serve READ and WRITE against the
//! region, checking each access the way a NIC checks an rkey.
//!
//! [`GrantTable`] is the NIC's table of memory registrations: rkey -> chunk (owner,
//! start, length). [`RegionTarget`] implements the fabric's [`MemoryTarget`] with it:
//! the rkey must be granted, the grant must belong to the connection's client, and
//! `[addr, addr + len)` must lie inside the grant (overflow-safe); only then are
//! bytes copied. A refused access copies nothing.
//!
//! Revocation: an access holds the table's read lock for its whole copy; revoking a
//! grant takes the write lock, so `revoke` returns only after every access that could
//! still see the grant has finished, and no later access can find it. The pool relies
//! on this to zero a chunk after revoking it without racing a READ or WRITE.
//! Control logic never runs here, and this path never touches the allocator.

use crate::allocator::Chunk;
use crate::region::Region;
use rmemfs_common::fabric::{AccessError, MemoryTarget};
use std::collections::HashMap;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// rkey -> granted chunk.
#[derive(Debug, Default)]
pub struct GrantTable {
    grants: RwLock<HashMap<u32, Chunk>>,
}

impl GrantTable {
    // Poisoning cannot leave the map half-updated (every update is one insert or
    // remove), so a poisoned lock is used as is.
    fn read(&self) -> RwLockReadGuard<'_, HashMap<u32, Chunk>> {
        self.grants.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, HashMap<u32, Chunk>> {
        self.grants.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes `chunk` accessible to its owner under its rkey.
    pub fn grant(&self, chunk: Chunk) {
        self.write().insert(chunk.rkey, chunk);
    }

    /// Revokes `owner`'s grant starting at `addr` with `rkey`; None if there is no
    /// such grant. Returns once no access to the chunk is in flight.
    pub fn revoke(&self, owner: u64, addr: u64, rkey: u32) -> Option<Chunk> {
        let mut grants = self.write();
        match grants.get(&rkey) {
            Some(c) if c.owner == owner && c.addr == addr => grants.remove(&rkey),
            _ => None,
        }
    }

    /// Revokes every grant of `owner`; returns once none of them is being accessed.
    pub fn revoke_all_of(&self, owner: u64) -> Vec<Chunk> {
        let mut grants = self.write();
        let mine: Vec<Chunk> = grants
            .values()
            .filter(|c| c.owner == owner)
            .copied()
            .collect();
        for c in &mine {
            grants.remove(&c.rkey);
        }
        mine
    }

    /// Live grants.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.read().len()
    }
}

/// The region as a fabric backend's one-sided path sees it.
#[derive(Debug)]
pub struct RegionTarget {
    region: Arc<Region>,
    grants: Arc<GrantTable>,
}

impl RegionTarget {
    pub fn new(region: Arc<Region>, grants: Arc<GrantTable>) -> RegionTarget {
        RegionTarget { region, grants }
    }

    /// Checks an access of `len` bytes at `addr` under `rkey` by `client` and, if it
    /// is allowed, runs `copy` with the region offset while the grant cannot be
    /// revoked.
    fn access(
        &self,
        client: u64,
        addr: u64,
        rkey: u32,
        len: usize,
        copy: impl FnOnce(u64) -> Result<(), crate::region::OutOfRegion>,
    ) -> Result<(), AccessError> {
        let grants = self.grants.read();
        let grant = grants.get(&rkey).ok_or(AccessError::UnknownKey)?;
        if grant.owner != client {
            return Err(AccessError::NotOwner);
        }
        let end = u64::try_from(len)
            .ok()
            .and_then(|len| addr.checked_add(len))
            .ok_or(AccessError::OutOfBounds)?;
        let grant_end = grant
            .addr
            .checked_add(grant.len)
            .ok_or(AccessError::OutOfBounds)?;
        if addr < grant.addr || end > grant_end {
            return Err(AccessError::OutOfBounds);
        }
        let offset = addr
            .checked_sub(self.region.base())
            .ok_or(AccessError::OutOfBounds)?;
        // A grant always lies inside the region; the region checks again anyway.
        copy(offset).map_err(|_| AccessError::OutOfBounds)?;
        drop(grants);
        Ok(())
    }
}

impl MemoryTarget for RegionTarget {
    fn read(&self, client: u64, addr: u64, rkey: u32, dst: &mut [u8]) -> Result<(), AccessError> {
        let len = dst.len();
        self.access(client, addr, rkey, len, |off| self.region.read(off, dst))
    }

    fn write(&self, client: u64, addr: u64, rkey: u32, src: &[u8]) -> Result<(), AccessError> {
        self.access(client, addr, rkey, src.len(), |off| {
            self.region.write(off, src)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::region::system_page_size;

    const OWNER: u64 = 11;
    const RKEY: u32 = 0x1234_5678;

    /// A region of 4 pages with page 1 granted to OWNER under RKEY.
    fn target() -> (RegionTarget, Chunk) {
        let region = Arc::new(Region::reserve(4 * system_page_size(), false).expect("reserve"));
        let page = region.granularity();
        let chunk = Chunk {
            owner: OWNER,
            addr: region.base() + page,
            len: page,
            rkey: RKEY,
        };
        let grants = Arc::new(GrantTable::default());
        grants.grant(chunk);
        (RegionTarget::new(region, grants), chunk)
    }

    #[test]
    fn the_owner_reads_back_what_it_wrote_anywhere_inside_its_chunk() {
        let (t, c) = target();
        let data: Vec<u8> = (0..c.len).map(|i| (i % 251) as u8).collect();
        t.write(OWNER, c.addr, RKEY, &data)
            .expect("whole chunk write");
        let mut back = vec![0u8; c.len as usize];
        t.read(OWNER, c.addr, RKEY, &mut back)
            .expect("whole chunk read");
        assert_eq!(back, data, "the whole chunk must read back byte-exact");
        let mut tail = [0u8; 8];
        t.read(OWNER, c.addr + c.len - 8, RKEY, &mut tail)
            .expect("last 8 bytes");
        assert_eq!(&tail[..], &data[data.len() - 8..]);
        t.read(OWNER, c.addr + c.len, RKEY, &mut [])
            .expect("empty access at the end");
    }

    #[test]
    fn refused_accesses_name_the_reason_and_copy_nothing() {
        let (t, c) = target();
        t.write(OWNER, c.addr, RKEY, &vec![7u8; c.len as usize])
            .expect("fill");
        let cases: [(&str, u64, u64, u32, usize, AccessError); 6] = [
            (
                "unknown rkey",
                OWNER,
                c.addr,
                RKEY ^ 1,
                8,
                AccessError::UnknownKey,
            ),
            (
                "another client",
                OWNER + 1,
                c.addr,
                RKEY,
                8,
                AccessError::NotOwner,
            ),
            (
                "past the end",
                OWNER,
                c.addr + c.len - 4,
                RKEY,
                8,
                AccessError::OutOfBounds,
            ),
            (
                "before the start",
                OWNER,
                c.addr - 4,
                RKEY,
                8,
                AccessError::OutOfBounds,
            ),
            (
                "addr + len overflows",
                OWNER,
                u64::MAX - 2,
                RKEY,
                8,
                AccessError::OutOfBounds,
            ),
            (
                "outside entirely",
                OWNER,
                0,
                RKEY,
                8,
                AccessError::OutOfBounds,
            ),
        ];
        for (what, client, addr, rkey, len, want) in cases {
            let mut buf = vec![0u8; len];
            assert_eq!(
                t.read(client, addr, rkey, &mut buf),
                Err(want),
                "READ with {what}"
            );
            assert!(
                buf.iter().all(|&b| b == 0),
                "a refused READ ({what}) must copy nothing"
            );
            assert_eq!(
                t.write(client, addr, rkey, &vec![9u8; len]),
                Err(want),
                "WRITE with {what}"
            );
        }
        let mut region = vec![0u8; 3 * c.len as usize];
        t.region.read(0, &mut region).expect("in bounds");
        let page = c.len as usize;
        assert!(
            region[..page].iter().all(|&b| b == 0),
            "page before the chunk untouched"
        );
        assert!(
            region[page..2 * page].iter().all(|&b| b == 7),
            "chunk untouched"
        );
        assert!(
            region[2 * page..].iter().all(|&b| b == 0),
            "page after the chunk untouched"
        );
    }

    #[test]
    fn a_revoked_grant_refuses_every_later_access() {
        let (t, c) = target();
        assert_eq!(
            t.grants.revoke(OWNER + 1, c.addr, RKEY),
            None,
            "only the owner revokes"
        );
        assert_eq!(
            t.grants.revoke(OWNER, c.addr + 1, RKEY),
            None,
            "by its start address"
        );
        assert_eq!(t.grants.revoke(OWNER, c.addr, RKEY), Some(c));
        assert_eq!(
            t.read(OWNER, c.addr, RKEY, &mut [0u8; 8]),
            Err(AccessError::UnknownKey)
        );
        assert_eq!(t.grants.len(), 0);
    }

    #[test]
    fn revoke_all_of_takes_only_that_owners_grants() {
        let (t, c) = target();
        let other = Chunk {
            owner: OWNER + 1,
            addr: c.addr + c.len,
            len: c.len,
            rkey: RKEY + 1,
        };
        t.grants.grant(other);
        assert_eq!(t.grants.revoke_all_of(OWNER), vec![c]);
        t.write(OWNER + 1, other.addr, other.rkey, b"still mine")
            .expect("other owner keeps access");
    }
}
