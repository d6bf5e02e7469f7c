//! The chunk allocator's books: which ranges of the region are free, and which owner
//! holds each booked range. Pure logic: no locks, no memory access, no rkeys (those
//! come from registering a booked range with the fabric, see `pool.rs`).
//!
//! Design: free space is a set of extents (`BTreeMap` start -> length). Allocation is
//! first-fit in address order; sizes are rounded up to the region's page
//! granularity, so every booking starts and ends on a page boundary (which lets the
//! region zero freed chunks with `madvise`). Freeing coalesces the extent with its
//! neighbours.
//!
//! Invariants (checked by [`ChunkAllocator::check_invariants`] in tests):
//! - free extents and bookings are page-aligned, lie inside `[base, base + capacity)`,
//!   never overlap, and together tile the whole region;
//! - no two free extents touch (they would have been coalesced);
//! - `used` is the sum of booking lengths.
//!
//! There is deliberately no "free everything of an owner" here: a departed client's
//! chunks are deregistered first and freed one by one after zeroing (see `pool.rs`),
//! so a chunk the same client allocates meanwhile is never swept up.

use std::collections::BTreeMap;
use thiserror::Error;

/// Who a booking belongs to: a client (scratch memory, reclaimed when the client
/// goes) or a volume (kept until the volume is destroyed). The two never match each
/// other, whatever their numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Owner {
    Client(u64),
    Volume(u64),
}

/// One booked range of the region: `[addr, addr + len)`, held by `owner`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Booking {
    pub owner: Owner,
    pub addr: u64,
    pub len: u64,
}

#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum AllocError {
    #[error("an allocation of zero bytes makes no sense")]
    ZeroSize,
    #[error("{bytes} bytes exceeds this memnode's capacity of {capacity} bytes")]
    TooLarge { bytes: u64, capacity: u64 },
    #[error("no free range of {need} bytes ({free} bytes free in total)")]
    NoSpace { need: u64, free: u64 },
    #[error("no booking of this owner starts at {addr:#x}")]
    NotFound { addr: u64 },
}

pub struct ChunkAllocator {
    base: u64,
    capacity: u64,
    granularity: u64,
    /// Free extents: start -> length.
    free: BTreeMap<u64, u64>,
    /// Bookings by start address.
    booked: BTreeMap<u64, Booking>,
    used: u64,
}

impl std::fmt::Debug for ChunkAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkAllocator")
            .field("base", &self.base)
            .field("capacity", &self.capacity)
            .field("granularity", &self.granularity)
            .field("used", &self.used)
            .field("bookings", &self.booked.len())
            .field("free_extents", &self.free.len())
            .finish()
    }
}

impl ChunkAllocator {
    /// Books for `[base, base + capacity)` handed out in multiples of `granularity`
    /// (a power of two). `capacity` is rounded down to whole pages.
    pub fn new(base: u64, capacity: u64, granularity: u64) -> ChunkAllocator {
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
            booked: BTreeMap::new(),
            used: 0,
        }
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes held by bookings (after rounding).
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Live bookings.
    pub fn count(&self) -> usize {
        self.booked.len()
    }

    /// The booking starting at `addr`.
    pub fn get(&self, addr: u64) -> Option<&Booking> {
        self.booked.get(&addr)
    }

    /// Books at least `bytes` (rounded up to the granularity) for `owner`: the lowest
    /// free range that fits.
    pub fn alloc(&mut self, owner: Owner, bytes: u64) -> Result<Booking, AllocError> {
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
        self.free.remove(&addr);
        if len > need {
            self.free.insert(addr + need, len - need);
        }
        let booking = Booking {
            owner,
            addr,
            len: need,
        };
        self.booked.insert(addr, booking);
        self.used += need;
        Ok(booking)
    }

    /// Frees `owner`'s booking starting at `addr`. Anything else (no booking there,
    /// another owner's) is `NotFound` and changes nothing.
    pub fn free(&mut self, owner: Owner, addr: u64) -> Result<Booking, AllocError> {
        let booking = match self.booked.get(&addr) {
            Some(b) if b.owner == owner => *b,
            _ => return Err(AllocError::NotFound { addr }),
        };
        self.booked.remove(&addr);
        self.release(booking.addr, booking.len);
        self.used -= booking.len;
        Ok(booking)
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

    /// Books exactly `[addr, addr + len)` for `owner`, as a memnode restarting on its
    /// memory file re-books what it had lent. The range must be page-granular and
    /// lie inside one free extent; anything else is refused and changes nothing.
    pub fn book_at(&mut self, owner: Owner, addr: u64, len: u64) -> Result<Booking, AllocError> {
        let g = self.granularity;
        let aligned = addr >= self.base && (addr - self.base) % g == 0 && len % g == 0;
        let fits = self
            .free
            .range(..=addr)
            .next_back()
            .map(|(&start, &flen)| (start, flen))
            .filter(|&(start, flen)| addr.checked_add(len).is_some_and(|end| end <= start + flen));
        let (start, flen) = match fits {
            Some(extent) if aligned && len > 0 => extent,
            _ => return Err(AllocError::NotFound { addr }),
        };
        self.free.remove(&start);
        if start < addr {
            self.free.insert(start, addr - start);
        }
        if addr + len < start + flen {
            self.free.insert(addr + len, start + flen - addr - len);
        }
        let booking = Booking { owner, addr, len };
        self.booked.insert(addr, booking);
        self.used += len;
        Ok(booking)
    }

    /// Every booking, in address order.
    pub fn bookings(&self) -> impl Iterator<Item = &Booking> + '_ {
        self.booked.values()
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
        pieces.extend(self.booked.values().map(|b| (b.addr, b.len, false)));
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
        let sum: u64 = self.booked.values().map(|b| b.len).sum();
        if sum != self.used {
            return Err(format!("used is {} but bookings hold {sum}", self.used));
        }
        for (a, b) in &self.booked {
            if *a != b.addr {
                return Err(format!("booking {b:?} is filed under {a:#x}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "allocator_tests.rs"]
mod tests;
