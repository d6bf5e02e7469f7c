//! The chunk pool: the allocator's books, the grant table and the region, kept in step.
//!
//! Allocating books a chunk in the [`ChunkAllocator`], then grants it (the rkey
//! becomes usable). Freeing runs the other way, and the order is what keeps the
//! "free memory reads as zero" invariant without a lock around data copies:
//!
//! 1. revoke the grant (`GrantTable::revoke` waits out in-flight READ/WRITEs; it is
//!    also the arbiter between two racing frees: only one gets the chunk);
//! 2. zero the chunk (`Region::zero`), which nothing else can reach now: no grant
//!    covers it and the allocator still books it as in use;
//! 3. give it back to the allocator, which may hand it out again at once.
//!
//! Locks: the allocator mutex and the grant table lock are never held together.
//! Callers may hold their own locks around `grant`/`revoke` calls (control does, see
//! `control.rs`), never the other way round.

use crate::access::GrantTable;
use crate::allocator::{AllocError, Chunk, ChunkAllocator};
use crate::region::Region;
use std::sync::{Arc, Mutex, MutexGuard};

#[derive(Debug)]
pub struct ChunkPool {
    region: Arc<Region>,
    allocator: Mutex<ChunkAllocator>,
    grants: Arc<GrantTable>,
}

/// Capacity and usage of the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub capacity: u64,
    pub used: u64,
    pub chunks: usize,
}

impl ChunkPool {
    /// A pool over the whole region; access to granted chunks goes through `grants`.
    pub fn new(region: Arc<Region>, grants: Arc<GrantTable>) -> ChunkPool {
        let allocator = ChunkAllocator::new(region.base(), region.len(), region.granularity());
        ChunkPool {
            region,
            allocator: Mutex::new(allocator),
            grants,
        }
    }

    // The allocator is consistent at every unlock point, so poisoning is ignored.
    fn books(&self) -> MutexGuard<'_, ChunkAllocator> {
        self.allocator.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Allocates and grants a chunk of at least `bytes` to `owner`.
    pub fn alloc(&self, owner: u64, bytes: u64) -> Result<Chunk, AllocError> {
        let chunk = self.books().alloc(owner, bytes)?;
        self.grants.grant(chunk);
        Ok(chunk)
    }

    /// Frees `owner`'s chunk at `addr` with `rkey`: revoke, zero, release.
    pub fn free(&self, owner: u64, addr: u64, rkey: u32) -> Result<Chunk, AllocError> {
        let chunk = self
            .grants
            .revoke(owner, addr, rkey)
            .ok_or(AllocError::NotFound { addr, rkey })?;
        self.scrub_and_release(chunk);
        Ok(chunk)
    }

    /// Revokes every grant of `owner` (step 1 for all its chunks); the caller then
    /// passes the result to [`ChunkPool::release_revoked`].
    pub fn revoke_all_of(&self, owner: u64) -> Vec<Chunk> {
        self.grants.revoke_all_of(owner)
    }

    /// Zeroes and releases chunks already revoked; returns the bytes reclaimed.
    pub fn release_revoked(&self, chunks: &[Chunk]) -> u64 {
        chunks.iter().map(|&c| self.scrub_and_release(c)).sum()
    }

    /// Steps 2 and 3 for one revoked chunk; returns its length, or 0 if it had to
    /// be leaked.
    fn scrub_and_release(&self, chunk: Chunk) -> u64 {
        let offset = chunk.addr.wrapping_sub(self.region.base());
        if let Err(e) = self.region.zero(offset, chunk.len) {
            // Cannot happen for a chunk the allocator booked; leaking it is the only
            // choice that never hands out someone's old bytes.
            log::error!("cannot zero freed chunk {chunk:?} ({e}); leaking it");
            return 0;
        }
        match self.books().free(chunk.owner, chunk.addr, chunk.rkey) {
            Ok(_) => chunk.len,
            Err(e) => {
                log::error!("granted chunk {chunk:?} was not in the allocator's books: {e}");
                0
            }
        }
    }

    pub fn usage(&self) -> Usage {
        let books = self.books();
        Usage {
            capacity: books.capacity(),
            used: books.used(),
            chunks: books.count(),
        }
    }

    pub fn capacity(&self) -> u64 {
        self.region.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::RegionTarget;
    use crate::region::system_page_size;
    use rmemfs_common::fabric::{AccessError, MemoryTarget};

    fn pool(pages: u64) -> (ChunkPool, RegionTarget) {
        let region = Arc::new(Region::reserve(pages * system_page_size(), false).expect("reserve"));
        let grants = Arc::new(GrantTable::default());
        let target = RegionTarget::new(region.clone(), grants.clone());
        (ChunkPool::new(region, grants), target)
    }

    #[test]
    fn a_freed_chunk_reads_as_zero_for_its_next_owner() {
        let (p, t) = pool(4);
        let cap = p.capacity();
        let a = p.alloc(1, cap).expect("whole region");
        t.write(1, a.addr, a.rkey, &vec![0xab; cap as usize])
            .expect("owner writes");
        p.free(1, a.addr, a.rkey).expect("owner frees");
        let b = p.alloc(2, cap).expect("whole region again");
        assert_eq!(b.addr, a.addr, "the same memory must be handed out again");
        let mut back = vec![0xffu8; cap as usize];
        t.read(2, b.addr, b.rkey, &mut back)
            .expect("new owner reads");
        assert!(
            back.iter().all(|&x| x == 0),
            "memory of a freed chunk must read as zero"
        );
    }

    #[test]
    fn a_freed_rkey_no_longer_grants_access() {
        let (p, t) = pool(4);
        let a = p.alloc(1, 1).expect("fits");
        p.free(1, a.addr, a.rkey).expect("frees");
        assert_eq!(
            t.read(1, a.addr, a.rkey, &mut [0u8; 4]),
            Err(AccessError::UnknownKey)
        );
        assert_eq!(
            p.free(1, a.addr, a.rkey),
            Err(AllocError::NotFound {
                addr: a.addr,
                rkey: a.rkey
            }),
            "a second free must be NotFound"
        );
    }

    #[test]
    fn revoking_and_releasing_an_owner_reclaims_only_its_chunks() {
        let (p, t) = pool(8);
        let page = system_page_size();
        let mine = [
            p.alloc(1, page).expect("fits"),
            p.alloc(1, 2 * page).expect("fits"),
        ];
        let theirs = p.alloc(2, page).expect("fits");
        let revoked = p.revoke_all_of(1);
        assert_eq!(revoked.len(), 2);
        assert_eq!(p.release_revoked(&revoked), 3 * page, "3 pages reclaimed");
        assert_eq!(
            p.usage().used,
            page,
            "only the other owner's page stays used"
        );
        for c in mine {
            assert_eq!(
                t.read(1, c.addr, c.rkey, &mut [0u8; 1]),
                Err(AccessError::UnknownKey)
            );
        }
        t.write(2, theirs.addr, theirs.rkey, b"ok")
            .expect("other owner unaffected");
    }

    #[test]
    fn frees_racing_with_accesses_never_expose_old_bytes() {
        let (p, t) = pool(16);
        let p = Arc::new(p);
        let t = Arc::new(t);
        let page = system_page_size() as usize;
        std::thread::scope(|s| {
            // Writers fill their own chunks with their id while freeing and
            // reallocating; readers check a fresh chunk is zero before writing.
            for owner in 1..=4u64 {
                let (p, t) = (p.clone(), t.clone());
                s.spawn(move || {
                    for _ in 0..200 {
                        let Ok(c) = p.alloc(owner, page as u64) else {
                            continue;
                        };
                        let mut buf = vec![0xffu8; page];
                        t.read(owner, c.addr, c.rkey, &mut buf)
                            .expect("owner reads");
                        assert!(buf.iter().all(|&b| b == 0), "fresh chunk must be zero");
                        t.write(owner, c.addr, c.rkey, &vec![owner as u8; page])
                            .expect("owner writes");
                        p.free(owner, c.addr, c.rkey).expect("owner frees");
                    }
                });
            }
        });
        assert_eq!(p.usage().used, 0);
    }
}
