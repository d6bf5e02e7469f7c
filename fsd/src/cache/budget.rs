//! The pages' memory: buffers taken against the budget (`--cache` bytes) and given
//! back, and the memory of free buffers trimmed so that the two slabs together stay
//! near what the cache holds.
//!
//! Separate from the index because it is about bytes, not pages: a sector page and a
//! whole-block page take different amounts, and the slabs (`buffers`) keep memory
//! after a buffer is given back.

use super::buffers::PageBuf;
use super::index::Index;
use super::PageCache;
use std::sync::atomic::Ordering;

/// Bytes of free buffers whose memory a cache of `budget` bytes keeps beside its
/// pages: enough that pages coming and going reuse buffers rather than give memory
/// back and take it again.
pub(super) fn kept_free_bytes(budget: usize, block_size: usize) -> usize {
    (budget / 32).max(2 * block_size)
}

impl PageCache {
    /// A buffer of `len` bytes (a block's or a sector's) for a page, if the pages'
    /// budget has room for it or `force` says to go over it.
    pub(super) fn take_buf(&self, idx: &mut Index, len: usize, force: bool) -> Option<PageBuf> {
        if idx.held + len > self.budget && !force {
            return None;
        }
        idx.held += len;
        let slab = if len == self.sectors.block_len() {
            &self.slab
        } else {
            &self.sector_slab
        };
        let buf = slab.take();
        if self.slab.resident_bytes() + self.sector_slab.resident_bytes() > self.resident_limit()
            && !self.trim_due.load(Ordering::Relaxed)
        {
            self.trim_due.store(true, Ordering::Relaxed);
        }
        Some(buf)
    }

    /// The most memory the two slabs may hold before a request gives some back: the
    /// budget, the free buffers kept (`kept_free_bytes`) and as much again, so that
    /// memory is given back in batches of at least that much. While the cache turns
    /// from blocks to sectors (a stream, then random reads), each sector that comes
    /// takes new memory while the blocks it replaces free theirs; the cleaner alone
    /// gives that back too late, at its idle intervals, and fsd's peak RSS ran far
    /// past `--cache` (docs/benchmarks-history.md, "Memory given back by the request
    /// that passes the limit").
    pub(super) fn resident_limit(&self) -> usize {
        self.budget + 2 * kept_free_bytes(self.budget, self.sectors.block_len())
    }

    /// Gives back free buffers' memory if a buffer taken took the slabs past
    /// [`PageCache::resident_limit`]. Takes no index lock: called by requests with
    /// none held (page locks may be).
    pub(super) fn trim_if_due(&self) {
        if self.trim_due.load(Ordering::Relaxed) && self.trim_due.swap(false, Ordering::AcqRel) {
            self.trim_memory();
        }
    }

    /// Takes back the buffer of a page that left the cache (or of a sector page that
    /// got a whole block's): its slot is the next its slab gives out.
    pub(super) fn put_buf(&self, idx: &mut Index, buf: PageBuf) {
        idx.held -= buf.len();
    }

    /// Gives the memory of free buffers back to the kernel but for a few of each size
    /// (see `buffers`): what pages of one size let go, pages of the other size would
    /// otherwise hold beside their own. The cleaner runs it, and so does a request
    /// that took the slabs past `PageCache::resident_limit`.
    pub fn trim_memory(&self) -> usize {
        let keep = kept_free_bytes(self.budget, self.sectors.block_len()) / 2;
        self.slab.trim(keep / self.sectors.block_len())
            + self.sector_slab.trim(keep / self.sectors.len)
    }
}
