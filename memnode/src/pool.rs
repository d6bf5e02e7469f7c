//! The chunk pool: the allocator's books, the fabric's memory registrations and the
//! region, kept in step.
//!
//! Allocating books a range in the [`ChunkAllocator`], registers it with the fabric's
//! [`MemoryRegistry`] for its owner (what `ibv_reg_mr` is on a NIC: the rkey comes
//! from there, and from then on the owner's READs and WRITEs reach the range without
//! this code), and files the chunk under its rkey in the pool's own table. Freeing
//! runs the other way, and the order is what keeps the "free memory reads as zero"
//! invariant without a lock around data copies:
//!
//! 1. take the chunk out of the pool's table: the arbiter between racing frees (only
//!    one finds it) and the owner check (only the owner's own `(addr, rkey)` matches);
//! 2. deregister it, which returns once no READ/WRITE under its rkey is in flight and
//!    none can start;
//! 3. zero it (`Region::zero`; `MADV_DONTNEED` is fine with verbs too, as no memory
//!    region pins the pages any more), which nothing else can reach now;
//! 4. give it back to the allocator, which may hand it out again at once.
//!
//! Every registration the pool makes is deregistered before the pool lets go of the
//! region: by a free, by [`ChunkPool::revoke_all_of`], or when the pool is dropped.
//! That is what `register`'s safety contract asks.
//!
//! Locks: the allocator mutex and the chunk table mutex are never held together, and
//! neither is held while calling the registry. Callers may hold their own locks around
//! pool calls (control does, see `control.rs`), never the other way round.

use crate::allocator::{AllocError, Booking, ChunkAllocator};
use crate::region::Region;
use rmemfs_common::fabric::{FabricError, MemoryRegistry};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use thiserror::Error;

/// One allocated chunk: `[addr, addr + len)`, registered for `owner` under `rkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Chunk {
    pub owner: u64,
    pub addr: u64,
    pub len: u64,
    pub rkey: u32,
}

impl Chunk {
    fn new(b: Booking, rkey: u32) -> Chunk {
        Chunk {
            owner: b.owner,
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
    #[error("cannot register {len} bytes for remote access: {error}")]
    Register { len: u64, error: FabricError },
}

pub struct ChunkPool {
    region: Arc<Region>,
    allocator: Mutex<ChunkAllocator>,
    registry: Arc<dyn MemoryRegistry>,
    /// Registered chunks by rkey.
    chunks: Mutex<HashMap<u32, Chunk>>,
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

// Both mutexes are consistent at every unlock point (single inserts and removes), so
// poisoning is ignored.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
        }
    }

    /// Allocates a chunk of at least `bytes` to `owner` and registers it.
    pub fn alloc(&self, owner: u64, bytes: u64) -> Result<Chunk, PoolError> {
        let booking = lock(&self.allocator).alloc(owner, bytes)?;
        // SAFETY: the allocator books only ranges inside the region, a private
        // read/write mapping that lives as long as `self.region`; the pool deregisters
        // every rkey it files before it drops its `Arc<Region>` (see the module docs
        // and `Drop`), and the range is booked to this chunk alone until then.
        let registered = unsafe { self.registry.register(owner, booking.addr, booking.len) };
        match registered {
            Ok(rkey) => {
                let chunk = Chunk::new(booking, rkey);
                lock(&self.chunks).insert(rkey, chunk);
                Ok(chunk)
            }
            Err(error) => {
                // Never reachable, so still zero: straight back to the books.
                self.release(booking);
                Err(PoolError::Register {
                    len: booking.len,
                    error,
                })
            }
        }
    }

    /// Frees `owner`'s chunk at `addr` with `rkey`: take, deregister, zero, release.
    pub fn free(&self, owner: u64, addr: u64, rkey: u32) -> Result<Chunk, PoolError> {
        let chunk = {
            let mut chunks = lock(&self.chunks);
            match chunks.get(&rkey) {
                Some(c) if c.owner == owner && c.addr == addr => chunks.remove(&rkey),
                _ => None,
            }
        }
        .ok_or(PoolError::NotFound { addr, rkey })?;
        self.registry.deregister(chunk.rkey);
        self.scrub_and_release(chunk);
        Ok(chunk)
    }

    /// Takes every chunk of `owner` out of the table and deregisters it (steps 1 and
    /// 2 for all of them); returns once none is being accessed. The caller then passes
    /// the result to [`ChunkPool::release_revoked`].
    pub fn revoke_all_of(&self, owner: u64) -> Vec<Chunk> {
        let mine: Vec<Chunk> = {
            let mut chunks = lock(&self.chunks);
            let mine: Vec<Chunk> = chunks
                .values()
                .filter(|c| c.owner == owner)
                .copied()
                .collect();
            for c in &mine {
                chunks.remove(&c.rkey);
            }
            mine
        };
        for c in &mine {
            self.registry.deregister(c.rkey);
        }
        mine
    }

    /// Zeroes and releases chunks already revoked; returns the bytes reclaimed.
    pub fn release_revoked(&self, chunks: &[Chunk]) -> u64 {
        chunks.iter().map(|&c| self.scrub_and_release(c)).sum()
    }

    /// Steps 3 and 4 for one deregistered chunk; returns its length, or 0 if it had
    /// to be leaked.
    fn scrub_and_release(&self, chunk: Chunk) -> u64 {
        let offset = chunk.addr.wrapping_sub(self.region.base());
        if let Err(e) = self.region.zero(offset, chunk.len) {
            // Cannot happen for a chunk the allocator booked; leaking it is the only
            // choice that never hands out someone's old bytes.
            log::error!("cannot zero freed chunk {chunk:?} ({e}); leaking it");
            return 0;
        }
        self.release(Booking {
            owner: chunk.owner,
            addr: chunk.addr,
            len: chunk.len,
        })
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
