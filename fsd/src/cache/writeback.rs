//! Write-back: storing dirty pages in batches (their dirty sectors only where the
//! remote I/O can take a block in part, whole blocks otherwise), for eviction, fsync
//! and unmount; and the cleaner, which writes back the coldest dirty pages ahead of
//! eviction so that requests needing a buffer find clean ones.

use super::page::{Page, PageState};
use super::{PageCache, PageKey, RemoteIo, Store};
use crate::error::FsError;
use rmemfs_common::sync::{lock, wait_timeout_while};
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

impl PageCache {
    /// Writes the dirty ones among `pages` (all locked by the caller) back in one
    /// batch and marks them clean: those that succeeded, or all with
    /// `clean_on_error`. Returns the first error. A page whose block can be written in
    /// part (see [`RemoteIo::stores_in_part`]) writes its dirty sectors only; the others
    /// are made whole first (one load batch) and written whole.
    pub(super) fn write_back(
        &self,
        io: &dyn RemoteIo,
        pages: &mut [(PageKey, &mut PageState)],
        clean_on_error: bool,
    ) -> Result<(), FsError> {
        let full = self.sectors.full;
        let mut dirty: Vec<usize> = (0..pages.len())
            .filter(|&i| pages[i].1.is_dirty())
            .collect();
        if dirty.is_empty() {
            return Ok(());
        }
        let in_part: Vec<bool> = pages
            .iter()
            .map(|(k, s)| s.is_dirty() && s.dirty != full && io.stores_in_part(*k))
            .collect();
        let mut first_err = Ok(());
        // Whole blocks are stored for the others: complete the partly valid pages
        // first, in one batch.
        let partial: Vec<usize> = dirty
            .iter()
            .copied()
            .filter(|&i| !in_part[i] && pages[i].1.valid != full)
            .collect();
        if !partial.is_empty() {
            let mut sub: Vec<(PageKey, &mut PageState, u64)> = Vec::with_capacity(partial.len());
            let mut wanted = partial.iter().peekable();
            for (i, (k, s)) in pages.iter_mut().enumerate() {
                if wanted.peek() == Some(&&i) {
                    wanted.next();
                    sub.push((*k, &mut **s, full));
                }
            }
            let results = self.fill_sectors(io, &mut sub);
            drop(sub);
            for (&i, r) in partial.iter().zip(results) {
                if let Err(e) = r {
                    // Its missing sectors are unknown: storing it would overwrite them.
                    io.record_write_error(pages[i].0, &e);
                    if clean_on_error {
                        pages[i].1.clean();
                    }
                    if first_err.is_ok() {
                        first_err = Err(e);
                    }
                }
            }
            dirty.retain(|&i| in_part[i] || pages[i].1.valid == full);
            if dirty.is_empty() {
                return first_err;
            }
        }
        // One write per run of dirty sectors and per part, or one of the whole block.
        let mut owner = Vec::new();
        let mut batch: Vec<Store<'_>> = Vec::new();
        for &i in &dirty {
            let (key, s) = (pages[i].0, &*pages[i].1);
            if in_part[i] {
                self.counters.partial_stores.fetch_add(1, Ordering::Relaxed);
                for run in self.sectors.runs(s.dirty).chain(s.parts.iter().cloned()) {
                    batch.push(Store {
                        key,
                        offset: run.start,
                        sums: s.sums_from(run.start, self.sum_unit),
                        bytes: &s.buf[run],
                    });
                    owner.push(i);
                }
            } else {
                batch.push(Store {
                    key,
                    offset: 0,
                    bytes: &s.buf[..],
                    sums: &s.sums,
                });
                owner.push(i);
            }
        }
        let results = io.store(&batch);
        drop(batch);
        self.counters
            .writebacks
            .fetch_add(dirty.len() as u64, Ordering::Relaxed);
        let mut failed = vec![false; pages.len()];
        for (&i, r) in owner.iter().zip(results) {
            if let Err(e) = r {
                failed[i] = true;
                if first_err.is_ok() {
                    first_err = Err(e);
                }
            }
        }
        for &i in &dirty {
            if !failed[i] || clean_on_error {
                pages[i].1.clean();
            }
        }
        first_err
    }

    /// Writes back every dirty page of `ino`. Returns the first error.
    pub fn flush_inode(&self, io: &dyn RemoteIo, ino: u64) -> Result<(), FsError> {
        // The pages are looked up a group at a time, not all at once: a page this holds
        // cannot recycle its buffer when it is evicted (the buffer goes with the page),
        // so holding every page of a large file for a whole flush made evictions meanwhile
        // allocate heap buffers in place of slab slots, which then stayed in use.
        let idxs: Vec<u64> = lock(&self.index)
            .by_inode
            .get(&ino)
            .map(|set| set.iter().copied().collect())
            .unwrap_or_default();
        let mut first_err = Ok(());
        for chunk in idxs.chunks(self.group_len().max(16)) {
            let range = chunk[0]..chunk[chunk.len() - 1] + 1;
            let group = lock(&self.index).pages_of(ino, range);
            // `pages_of` returns ascending indices: locking in order is safe.
            let mut guards: Vec<_> = group.iter().map(|p| (p.key, lock(&p.state))).collect();
            // Dead pages were written back by their evictor, or invalidated.
            let mut batch: Vec<(PageKey, &mut PageState)> = guards
                .iter_mut()
                .filter(|(_, g)| g.live)
                .map(|(k, g)| (*k, &mut **g))
                .collect();
            if let Err(e) = self.write_back(io, &mut batch, false) {
                if first_err.is_ok() {
                    first_err = Err(e);
                }
            }
        }
        first_err
    }

    /// Writes back every dirty page (the periodic flusher, unmount).
    pub fn flush_all(&self, io: &dyn RemoteIo) -> Result<(), FsError> {
        let inodes: Vec<u64> = lock(&self.index).by_inode.keys().copied().collect();
        let mut first_err = Ok(());
        for ino in inodes {
            if let Err(e) = self.flush_inode(io, ino) {
                if first_err.is_ok() {
                    first_err = Err(e);
                }
            }
        }
        first_err
    }

    /// Wakes the cleaner's [`PageCache::wait_for_work`].
    pub(super) fn wake_cleaner(&self) {
        *lock(&self.evicting_now) = true;
        self.evicted.notify_one();
    }

    /// Waits up to `d` for work for the cleaner (the cache evicted, or blocks were
    /// queued to write behind); true if there was some meanwhile.
    pub fn wait_for_work(&self, d: Duration) -> bool {
        let g = lock(&self.evicting_now);
        let (mut g, _) = wait_timeout_while(&self.evicted, g, d, |evicting| !*evicting);
        std::mem::take(&mut *g)
    }

    /// Writes back the dirty pages among the `n` least recently used, so that the
    /// evictions to come find clean pages: run by a thread of its own while the cache
    /// is evicting, this takes remote writes out of the requests that need a buffer.
    /// Pages in use are skipped. Returns how many pages were written back.
    pub fn clean_cold(&self, io: &dyn RemoteIo, n: usize) -> usize {
        let mut cold: Vec<Arc<Page>> = {
            let idx = lock(&self.index);
            idx.lru
                .iter()
                .rev()
                .take(n)
                .map(|(_, p)| p.clone())
                .collect()
        };
        // Ascending keys: the lock order for several pages.
        cold.sort_by_key(|p| p.key);
        let written = self.clean_pages(io, &cold).0;
        self.cold_dirty.store(written > 0, Ordering::Relaxed);
        written
    }

    /// Writes back the dirty ones among `pages` (ascending keys) in one batch,
    /// skipping pages in use. Returns how many were written back, those of `pages`
    /// that were clean after it, and those skipped.
    pub(super) fn clean_pages<'p>(
        &self,
        io: &dyn RemoteIo,
        pages: &'p [Arc<Page>],
    ) -> (usize, Vec<&'p Arc<Page>>, Vec<&'p Arc<Page>>) {
        let mut busy = Vec::new();
        let mut clean = Vec::new();
        // Only the dirty pages stay locked through the write-back: a clean one held
        // meanwhile would be skipped by an eviction (in use) and put back as if used.
        let mut guards: Vec<(&Arc<Page>, MutexGuard<'_, PageState>)> = Vec::new();
        for p in pages {
            match p.state.try_lock() {
                Ok(g) if g.live && g.is_dirty() => guards.push((p, g)),
                Ok(g) if g.live => clean.push(p),
                Ok(_) => {}
                Err(_) => busy.push(p),
            }
        }
        let mut batch: Vec<(PageKey, &mut PageState)> =
            guards.iter_mut().map(|(p, g)| (p.key, &mut **g)).collect();
        let written = batch.len();
        if let Err(e) = self.write_back(io, &mut batch, false) {
            // Recorded by remote I/O; the page stays dirty for its eviction to retry.
            log::debug!("cleaning pages: {e}");
        }
        drop(batch);
        clean.extend(
            guards
                .iter()
                .filter(|(_, g)| !g.is_dirty())
                .map(|(p, _)| *p),
        );
        drop(guards);
        clean.sort_by_key(|p| p.key);
        (written, clean, busy)
    }
}
