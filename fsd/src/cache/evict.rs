//! Eviction: pages taken out of the LRU are written back if dirty and leave the
//! cache, their buffers recycled; pages in use are skipped and put back.
//!
//! Kept apart from the write-back itself (`writeback`), which flushes and the cleaner
//! share: eviction is what decides a page leaves, and settles the index after.

use super::page::{Page, PageState};
use super::{lock, PageCache, PageKey, RemoteIo};
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl PageCache {
    /// Evicts until the cache's buffers are within its budget again, after sector pages
    /// took more memory while their locks were held. Pages in use are skipped. Must be
    /// called with no page mutex held.
    pub(super) fn shrink(&self, io: &dyn RemoteIo) {
        // A page at a time: the overshoot is a sector or a block.
        loop {
            let victim = {
                let mut idx = lock(&self.index);
                if idx.held <= self.budget {
                    return;
                }
                let Some((k, p)) = idx.lru.pop_lru() else {
                    return;
                };
                idx.evicting.insert(k, p.clone());
                p
            };
            if self.evict(io, vec![victim]) == 0 {
                return;
            }
        }
    }

    /// Writes back the dirty victims and recycles the buffers of those nobody else
    /// holds. Returns how many pages left the cache.
    pub(super) fn evict(&self, io: &dyn RemoteIo, victims: Vec<Arc<Page>>) -> usize {
        // Victims in use elsewhere are skipped (put back as recently used): waiting for
        // them could deadlock against a thread holding page locks in key order.
        let mut locked = Vec::new();
        let mut busy = Vec::new();
        for v in &victims {
            match v.state.try_lock() {
                Ok(g) => locked.push((v, g)),
                Err(_) => busy.push(v.clone()),
            }
        }
        // The cleaner writes back the pages next in line, so that evictions to come
        // find them clean. Only where there are dirty ones: woken for every round of
        // a cache that reads only, it cost each 4 KiB random read that misses a
        // context switch and a scan of clean pages (4 readers: 0.13 wakeups per read).
        if self.cold_dirty.load(Ordering::Relaxed) || locked.iter().any(|(_, g)| g.is_dirty()) {
            self.wake_cleaner();
        }
        let mut batch: Vec<(PageKey, &mut PageState)> =
            locked.iter_mut().map(|(p, g)| (p.key, &mut **g)).collect();
        // A failed write-back is recorded by remote I/O for fsync/close to report;
        // the page cannot be kept without unbounded memory, so it goes anyway.
        if let Err(e) = self.write_back(io, &mut batch, true) {
            log::error!("write-back during eviction failed: {e}");
        }
        drop(batch);
        let mut idx = lock(&self.index);
        let mut evicted = 0;
        for (page, mut state) in locked {
            let still_evicting = idx
                .evicting
                .get(&page.key)
                .is_some_and(|p| Arc::ptr_eq(p, page));
            if !still_evicting {
                continue; // taken back meanwhile, or invalidated
            }
            idx.evicting.remove(&page.key);
            idx.forget_key(page.key);
            state.live = false;
            evicted += 1;
            self.counters.evictions.fetch_add(1, Ordering::Relaxed);
            // The Arc in `victims` is the only one left: recycle the buffer. Otherwise
            // another thread still holds the page (and will find it dead), and the
            // buffer is freed with the page.
            if Arc::strong_count(page) == 1 {
                state.valid = 0;
                state.parts.clear();
                for buf in state.take_bufs() {
                    self.put_buf(&mut idx, buf);
                }
            } else {
                idx.held -= state.held();
            }
        }
        for p in busy {
            if idx.evicting.get(&p.key).is_some_and(|e| Arc::ptr_eq(e, &p)) {
                idx.evicting.remove(&p.key);
                idx.lru.put(p.key, p);
            }
        }
        evicted
    }
}
