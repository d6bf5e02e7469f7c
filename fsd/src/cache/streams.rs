//! Streams: a sequential reader's blocks are dropped behind it once served, and a
//! sequential writer's finished blocks are written behind it by the cleaner, so a
//! stream longer than the cache cycles through a few buffers and leaves the rest of
//! the cache alone (see the module comment of `cache`).

use super::page::Page;
use super::{lock, PageCache, RemoteIo};
use std::ops::Range;
use std::sync::Arc;

impl PageCache {
    /// Makes the clean pages of blocks `blocks` of `ino` the next to be evicted, the
    /// last of them first: for a stream's blocks once they are served. The kernel's
    /// page cache (or the program) has them then, so a stream longer than the cache
    /// does not push out the rest of what it holds, and its next blocks reuse the
    /// buffers it just read (still in the CPU's caches) rather than the coldest ones.
    /// Dirty pages and pages in use keep their place.
    pub fn drop_behind(&self, ino: u64, blocks: Range<u64>) {
        let pages = lock(&self.index).pages_of(ino, blocks);
        let clean: Vec<&Arc<Page>> = pages
            .iter()
            .filter(|p| p.state.try_lock().is_ok_and(|g| g.live && !g.is_dirty()))
            .collect();
        self.demote(&clean);
    }

    /// Moves `pages` (ascending keys) that are still cached to the cold end of the
    /// LRU, the last of them coldest.
    fn demote(&self, pages: &[&Arc<Page>]) {
        let mut idx = lock(&self.index);
        for p in pages {
            if idx.lru.peek(&p.key).is_some_and(|q| Arc::ptr_eq(q, p)) {
                idx.lru.demote(&p.key);
            }
        }
    }

    /// Queues blocks `blocks` of `ino`, which a sequential writer has finished, to be
    /// written back soon by the cleaner ([`PageCache::clean_behind`]) rather than when
    /// they grow cold, and dropped behind then: a written stream reaches remote memory
    /// right behind the writer, and its next blocks reuse buffers it just wrote
    /// (still in the CPU's caches) rather than the coldest ones. At most a cache's
    /// worth of blocks wait; beyond that, blocks are left to the usual write-back.
    pub fn write_behind(&self, ino: u64, blocks: Range<u64>) {
        {
            let mut q = lock(&self.behind);
            let room = self.capacity.saturating_sub(q.len());
            q.extend(blocks.take(room).map(|i| (ino, i)));
        }
        self.wake_cleaner();
    }

    /// Writes back the blocks queued by [`PageCache::write_behind`] that are still
    /// dirty, in batches, and drops behind those that are clean then. Pages in use
    /// are left to the usual write-back. Returns how many pages were written back.
    pub fn clean_behind(&self, io: &dyn RemoteIo) -> usize {
        let mut keys = std::mem::take(&mut *lock(&self.behind));
        if keys.is_empty() {
            return 0;
        }
        // Ascending keys: the lock order for several pages.
        keys.sort_unstable();
        keys.dedup();
        let mut written = 0;
        // A batch at a time: a batch's pages stay locked until it is stored.
        for keys in keys.chunks(self.group_len()) {
            let pages: Vec<Arc<Page>> = {
                let idx = lock(&self.index);
                keys.iter()
                    .filter_map(|k| idx.lru.peek(k).cloned())
                    .collect()
            };
            let (n, clean, busy) = self.clean_pages(io, &pages);
            self.demote(&clean);
            written += n;
            // In use (a reader, a flush): their turn comes at the cleaner's next round.
            lock(&self.behind).extend(busy.iter().map(|p| p.key));
        }
        written
    }
}
