//! The chunk allocator's books: which ranges of the region are free, and who owns
//! each allocated chunk under which rkey. Pure logic: no locks, no memory access.
//!
//! Design: free space is a set of extents (`BTreeMap` start -> length). Allocation is
//! first-fit in address order; sizes are rounded up to the region's page
//! granularity, so every chunk starts and ends on a page boundary (which lets the
//! region zero freed chunks with `madvise`). Freeing coalesces the extent with its
//! neighbours.
//!
//! Invariants (checked by [`ChunkAllocator::check_invariants`] in tests):
//! - free extents and chunks are page-aligned, lie inside `[base, base + capacity)`,
//!   never overlap, and together tile the whole region;
//! - no two free extents touch (they would have been coalesced);
//! - `used` is the sum of chunk lengths;
//! - every chunk has a non-zero rkey unique among live chunks, drawn from the key
//!   source (the OS random generator in production), so rkeys cannot be guessed from
//!   each other.
//!
//! There is deliberately no "free everything of an owner" here: a departed client's
//! chunks are revoked in the grant table first and freed one by one after zeroing
//! (see `pool.rs`), so a chunk the same client allocates meanwhile is never swept up.

use std::collections::{BTreeMap, HashMap};
use thiserror::Error;

/// One allocated chunk: `[addr, addr + len)`, granted to `owner` under `rkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Chunk {
    pub owner: u64,
    pub addr: u64,
    pub len: u64,
    pub rkey: u32,
}

impl Chunk {
    /// The chunk as the control protocol describes it to its owner.
    pub fn to_wire(self) -> rmemfs_common::protocol::Allocation {
        rmemfs_common::protocol::Allocation {
            addr: self.addr,
            len: self.len,
            rkey: self.rkey,
        }
    }
}

#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum AllocError {
    #[error("an allocation of zero bytes makes no sense")]
    ZeroSize,
    #[error("{bytes} bytes exceeds this memnode's capacity of {capacity} bytes")]
    TooLarge { bytes: u64, capacity: u64 },
    #[error("no free range of {need} bytes ({free} bytes free in total)")]
    NoSpace { need: u64, free: u64 },
    #[error("no allocation at {addr:#x} with rkey {rkey:#x} belongs to this client")]
    NotFound { addr: u64, rkey: u32 },
    #[error("no randomness available for a new rkey")]
    NoKey,
}

/// Where rkeys come from; `None` when no randomness is available.
pub type KeySource = Box<dyn FnMut() -> Option<u32> + Send>;

/// Tries for a fresh rkey before giving up (a collision is already ~2^-20 likely).
const KEY_TRIES: usize = 64;

pub struct ChunkAllocator {
    base: u64,
    capacity: u64,
    granularity: u64,
    /// Free extents: start -> length.
    free: BTreeMap<u64, u64>,
    /// Live chunks by rkey.
    chunks: HashMap<u32, Chunk>,
    used: u64,
    keys: KeySource,
}

impl std::fmt::Debug for ChunkAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkAllocator")
            .field("base", &self.base)
            .field("capacity", &self.capacity)
            .field("granularity", &self.granularity)
            .field("used", &self.used)
            .field("chunks", &self.chunks.len())
            .field("free_extents", &self.free.len())
            .finish()
    }
}

impl ChunkAllocator {
    /// Books for `[base, base + capacity)` handed out in multiples of `granularity`
    /// (a power of two), with rkeys from the OS random generator. `capacity` is
    /// rounded down to whole pages.
    pub fn new(base: u64, capacity: u64, granularity: u64) -> ChunkAllocator {
        Self::with_keys(
            base,
            capacity,
            granularity,
            Box::new(|| getrandom::u32().ok()),
        )
    }

    /// Like [`ChunkAllocator::new`] with a chosen key source (tests).
    pub fn with_keys(base: u64, capacity: u64, granularity: u64, keys: KeySource) -> Self {
        let granularity = granularity.max(1);
        // The region must not wrap the address space.
        let capacity = capacity.min(u64::MAX - base);
        let capacity = capacity - capacity % granularity;
        let mut free = BTreeMap::new();
        if capacity > 0 {
            free.insert(base, capacity);
        }
        ChunkAllocator {
            base,
            capacity,
            granularity,
            free,
            chunks: HashMap::new(),
            used: 0,
            keys,
        }
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes held by chunks (after rounding).
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Live chunks.
    pub fn count(&self) -> usize {
        self.chunks.len()
    }

    /// The live chunk with this rkey.
    #[cfg(test)]
    pub fn get(&self, rkey: u32) -> Option<&Chunk> {
        self.chunks.get(&rkey)
    }

    /// Allocates at least `bytes` (rounded up to the granularity) for `owner`: the
    /// lowest free range that fits, with a fresh rkey.
    pub fn alloc(&mut self, owner: u64, bytes: u64) -> Result<Chunk, AllocError> {
        if bytes == 0 {
            return Err(AllocError::ZeroSize);
        }
        if bytes > self.capacity {
            return Err(AllocError::TooLarge {
                bytes,
                capacity: self.capacity,
            });
        }
        // Cannot overflow: bytes <= capacity, a multiple of the granularity.
        let need = bytes.div_ceil(self.granularity) * self.granularity;
        let Some((&addr, &len)) = self.free.iter().find(|(_, &len)| len >= need) else {
            return Err(AllocError::NoSpace {
                need,
                free: self.capacity - self.used,
            });
        };
        let rkey = self.fresh_key()?;
        self.free.remove(&addr);
        if len > need {
            self.free.insert(addr + need, len - need);
        }
        let chunk = Chunk {
            owner,
            addr,
            len: need,
            rkey,
        };
        self.chunks.insert(rkey, chunk);
        self.used += need;
        Ok(chunk)
    }

    fn fresh_key(&mut self) -> Result<u32, AllocError> {
        for _ in 0..KEY_TRIES {
            let k = (self.keys)().ok_or(AllocError::NoKey)?;
            if k != 0 && !self.chunks.contains_key(&k) {
                return Ok(k);
            }
        }
        Err(AllocError::NoKey)
    }

    /// Frees `owner`'s chunk starting at `addr` with `rkey`. Anything else (unknown
    /// rkey, another start address, another owner) is `NotFound` and changes nothing.
    pub fn free(&mut self, owner: u64, addr: u64, rkey: u32) -> Result<Chunk, AllocError> {
        let chunk = match self.chunks.get(&rkey) {
            Some(c) if c.owner == owner && c.addr == addr => *c,
            _ => return Err(AllocError::NotFound { addr, rkey }),
        };
        self.chunks.remove(&rkey);
        self.release(chunk.addr, chunk.len);
        self.used -= chunk.len;
        Ok(chunk)
    }

    /// Returns `[addr, addr + len)` to the free extents, merging with neighbours.
    fn release(&mut self, addr: u64, len: u64) {
        let mut start = addr;
        let mut total = len;
        if let Some((&prev, &prev_len)) = self.free.range(..addr).next_back() {
            if prev + prev_len == addr {
                self.free.remove(&prev);
                start = prev;
                total += prev_len;
            }
        }
        if let Some(next_len) = self.free.remove(&(addr + len)) {
            total += next_len;
        }
        self.free.insert(start, total);
    }

    /// Free extents in address order.
    #[cfg(test)]
    pub fn free_extents(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.free.iter().map(|(&a, &l)| (a, l))
    }

    /// Checks every invariant in the module docs; returns what is broken.
    #[cfg(test)]
    pub fn check_invariants(&self) -> Result<(), String> {
        let g = self.granularity;
        let end = self.base + self.capacity;
        let mut pieces: Vec<(u64, u64, bool)> =
            self.free_extents().map(|(a, l)| (a, l, true)).collect();
        pieces.extend(self.chunks.values().map(|c| (c.addr, c.len, false)));
        pieces.sort_unstable();
        let mut at = self.base;
        let mut prev_free = false;
        for (addr, len, is_free) in pieces {
            if addr != at {
                return Err(format!("gap or overlap at {addr:#x} (expected {at:#x})"));
            }
            if len == 0 || (addr - self.base) % g != 0 || len % g != 0 {
                return Err(format!("piece {addr:#x}+{len:#x} is not page-granular"));
            }
            if is_free && prev_free {
                return Err(format!("free extent at {addr:#x} was not coalesced"));
            }
            prev_free = is_free;
            at = addr + len;
        }
        if at != end {
            return Err(format!("pieces end at {at:#x}, region ends at {end:#x}"));
        }
        let sum: u64 = self.chunks.values().map(|c| c.len).sum();
        if sum != self.used {
            return Err(format!("used is {} but chunks hold {sum}", self.used));
        }
        for (k, c) in &self.chunks {
            if *k == 0 || *k != c.rkey {
                return Err(format!("chunk {c:?} is filed under rkey {k:#x}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "allocator_tests.rs"]
mod tests;
