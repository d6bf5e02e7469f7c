//! The page cache: file blocks held locally, LRU, with write-back.
//!
//! A page holds one whole block of one file, keyed by `(inode, block index)`. Its bytes
//! live in a buffer from a bounded pool (`capacity` buffers of `block_size` bytes), so
//! fsd's memory for data is bounded by `--cache` however large the files are.
//!
//! Structure and invariants:
//! - `Index::lru` maps keys to live pages, least recently used first. `Index::evicting`
//!   holds pages taken out of the LRU whose write-back is under way; a lookup that finds
//!   its key there takes the page back, so nobody ever reads a block from remote memory
//!   while a newer version is still on its way there.
//! - `Index::by_inode` lists the cached block indices of each inode (both maps), for
//!   fsync and truncate.
//! - A page's bytes and flags are only touched under its own mutex. `loaded` says the
//!   bytes are the block's content; `dirty` says they are newer than remote memory.
//! - The pool may briefly overshoot `capacity` when every page is in use at once (many
//!   threads each holding pages); it never blocks waiting for a buffer, so no thread
//!   can deadlock on memory another waiting thread holds.
//!
//! Lock order: a page's mutex may be taken while holding no other page mutex, or
//! several page mutexes in ascending key order. The index mutex is innermost: nothing
//! else is locked while holding it. Write-back and loading call the [`Backing`] with
//! page mutexes held; the backing must not touch the cache.

mod buffers;

use crate::error::FsError;
use buffers::{PageBuf, Slab};
use lru::LruCache;
use std::collections::{BTreeSet, HashMap};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// `(inode number, block index)`.
pub type PageKey = (u64, u64);

/// Pages popped per eviction round: write-backs of several victims share one batch.
const EVICT_BATCH: usize = 8;

/// Where pages come from and go to: remote memory, via the filesystem's block maps.
pub trait Backing: Send + Sync {
    /// Fills each buffer with its block's current content (zeros for a hole).
    fn load(&self, pages: &mut [(PageKey, &mut [u8])]) -> Vec<Result<(), FsError>>;
    /// Writes each buffer to its block's remote location.
    fn store(&self, pages: &[(PageKey, &[u8])]) -> Vec<Result<(), FsError>>;
}

/// How a page that is not loaded yet is to be filled before use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// Read the block from the backing.
    Load,
    /// The block has no content yet (a hole or beyond EOF): zeros.
    Zero,
    /// The caller overwrites the whole block; leave the buffer as it is.
    Overwrite,
}

/// Statistics, for logs and benchmarks.
#[derive(Debug, Default)]
pub struct CacheCounters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub evictions: AtomicU64,
    pub writebacks: AtomicU64,
}

struct PageState {
    buf: PageBuf,
    loaded: bool,
    dirty: bool,
    /// False once the page has left the cache (evicted or invalidated). A thread that
    /// got the page before that and locks it after must not use it: its changes would
    /// be lost with the page.
    live: bool,
}

struct Page {
    key: PageKey,
    state: Mutex<PageState>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Index {
    lru: LruCache<PageKey, Arc<Page>>,
    evicting: HashMap<PageKey, Arc<Page>>,
    by_inode: HashMap<u64, BTreeSet<u64>>,
    /// Buffers not in any page, ready for reuse.
    spare: Vec<PageBuf>,
    /// Buffers in existence (in pages or spare).
    buffers: usize,
}

impl Index {
    fn forget_key(&mut self, key: PageKey) {
        if let Some(set) = self.by_inode.get_mut(&key.0) {
            set.remove(&key.1);
            if set.is_empty() {
                self.by_inode.remove(&key.0);
            }
        }
    }

    /// Pages of `ino` with index in `range`, from both maps.
    fn pages_of(&mut self, ino: u64, range: Range<u64>) -> Vec<Arc<Page>> {
        let Some(set) = self.by_inode.get(&ino) else {
            return Vec::new();
        };
        let idxs: Vec<u64> = set.range(range).copied().collect();
        idxs.into_iter()
            .filter_map(|i| {
                let key = (ino, i);
                self.lru
                    .peek(&key)
                    .or_else(|| self.evicting.get(&key))
                    .cloned()
            })
            .collect()
    }
}

pub struct PageCache {
    capacity: usize,
    slab: Slab,
    index: Mutex<Index>,
    pub counters: CacheCounters,
}

impl PageCache {
    /// A cache of `capacity_bytes` (at least two blocks) in blocks of `block_size`.
    pub fn new(capacity_bytes: u64, block_size: usize) -> PageCache {
        let capacity = ((capacity_bytes / block_size as u64) as usize).max(2);
        PageCache {
            capacity,
            slab: Slab::new(capacity, block_size),
            index: Mutex::new(Index {
                lru: LruCache::unbounded(),
                evicting: HashMap::new(),
                by_inode: HashMap::new(),
                spare: Vec::new(),
                buffers: 0,
            }),
            counters: CacheCounters::default(),
        }
    }

    pub fn capacity_pages(&self) -> usize {
        self.capacity
    }

    /// Registers the page buffers with the fabric once (see `buffers`).
    pub fn register_with_fabric(&self) -> Result<(), rmemfs_common::fabric::FabricError> {
        self.slab.register_with_fabric()
    }

    /// Pages handled per locked group: small enough that a group never holds a large
    /// share of the cache.
    fn group_len(&self) -> usize {
        (self.capacity / 4).clamp(1, 64)
    }

    /// Returns the page for `key`, creating it (unloaded) if needed, evicting as needed.
    /// Must be called with no page mutex held.
    fn acquire(&self, backing: &dyn Backing, key: PageKey) -> Arc<Page> {
        // Set when an eviction round freed nothing (every victim busy): allocate
        // instead of spinning on the same busy pages.
        let mut overshoot = false;
        loop {
            let victims = {
                let mut idx = lock(&self.index);
                if let Some(p) = idx.lru.get(&key) {
                    self.counters.hits.fetch_add(1, Ordering::Relaxed);
                    return p.clone();
                }
                if let Some(p) = idx.evicting.remove(&key) {
                    // Still being written back: take it back rather than re-read.
                    self.counters.hits.fetch_add(1, Ordering::Relaxed);
                    idx.lru.put(key, p.clone());
                    return p;
                }
                let buf = if let Some(b) = idx.spare.pop() {
                    Some(b)
                } else if idx.buffers < self.capacity || idx.lru.is_empty() || overshoot {
                    // Under capacity, or nothing left to evict (everything is in flight):
                    // allocate rather than wait, see the module comment.
                    idx.buffers += 1;
                    Some(self.slab.take())
                } else {
                    None
                };
                if let Some(buf) = buf {
                    self.counters.misses.fetch_add(1, Ordering::Relaxed);
                    let page = Arc::new(Page {
                        key,
                        state: Mutex::new(PageState {
                            buf,
                            loaded: false,
                            dirty: false,
                            live: true,
                        }),
                    });
                    idx.lru.put(key, page.clone());
                    idx.by_inode.entry(key.0).or_default().insert(key.1);
                    return page;
                }
                let mut victims = Vec::new();
                // Small caches evict one page at a time, large ones a batch.
                let batch = (self.capacity / 16).clamp(1, EVICT_BATCH);
                while victims.len() < batch {
                    let Some((k, p)) = idx.lru.pop_lru() else {
                        break;
                    };
                    idx.evicting.insert(k, p.clone());
                    victims.push(p);
                }
                victims
            };
            overshoot = self.evict(backing, victims) == 0;
        }
    }

    /// Writes back the dirty victims and recycles the buffers of those nobody else
    /// holds. Returns how many pages left the cache.
    fn evict(&self, backing: &dyn Backing, victims: Vec<Arc<Page>>) -> usize {
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
        let mut batch: Vec<(PageKey, &mut PageState)> =
            locked.iter_mut().map(|(p, g)| (p.key, &mut **g)).collect();
        // A failed write-back is recorded by the backing for fsync/close to report;
        // the page cannot be kept without unbounded memory, so it goes anyway.
        if let Err(e) = self.write_back(backing, &mut batch, true) {
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
                state.loaded = false;
                let buf = std::mem::take(&mut state.buf);
                if idx.buffers <= self.capacity {
                    idx.spare.push(buf);
                } else {
                    idx.buffers -= 1;
                }
            } else {
                idx.buffers -= 1;
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

    /// Writes the dirty ones among `pages` (all locked by the caller) back in one
    /// batch and marks them clean: those that succeeded, or all with
    /// `clean_on_error`. Returns the first error.
    fn write_back(
        &self,
        backing: &dyn Backing,
        pages: &mut [(PageKey, &mut PageState)],
        clean_on_error: bool,
    ) -> Result<(), FsError> {
        let dirty: Vec<usize> = (0..pages.len()).filter(|&i| pages[i].1.dirty).collect();
        if dirty.is_empty() {
            return Ok(());
        }
        let batch: Vec<(PageKey, &[u8])> = dirty
            .iter()
            .map(|&i| (pages[i].0, &pages[i].1.buf[..]))
            .collect();
        let results = backing.store(&batch);
        drop(batch);
        self.counters
            .writebacks
            .fetch_add(dirty.len() as u64, Ordering::Relaxed);
        let mut first_err = Ok(());
        for (&i, r) in dirty.iter().zip(results) {
            if r.is_ok() || clean_on_error {
                pages[i].1.dirty = false;
            }
            if let (Err(e), true) = (r, first_err.is_ok()) {
                first_err = Err(e);
            }
        }
        first_err
    }

    /// Runs `f(block index, bytes, dirty)` on the pages of `ino` for every index in
    /// `idxs`, in order, each loaded (or filled as `fill` says) and locked. Pages missing
    /// from the cache are loaded in one batch per group.
    pub fn access<F>(
        &self,
        backing: &dyn Backing,
        ino: u64,
        idxs: Range<u64>,
        fill: impl Fn(u64) -> Fill,
        mut f: F,
    ) -> Result<(), FsError>
    where
        F: FnMut(u64, &mut [u8], &mut bool) -> Result<(), FsError>,
    {
        let group = self.group_len() as u64;
        let mut start = idxs.start;
        while start < idxs.end {
            let end = (start + group).min(idxs.end);
            // Acquire every page before locking any: acquiring may evict, and evicting
            // must not happen while we hold page locks. A page evicted between its
            // acquisition and our lock is dead: start the group again.
            let pages: Vec<Arc<Page>> = (start..end)
                .map(|i| self.acquire(backing, (ino, i)))
                .collect();
            let mut guards: Vec<MutexGuard<'_, PageState>> =
                pages.iter().map(|p| lock(&p.state)).collect();
            if guards.iter().any(|g| !g.live) {
                drop(guards);
                continue; // lost a race with eviction; redo this group
            }
            let mut to_load = Vec::new();
            for (n, g) in guards.iter_mut().enumerate() {
                if g.loaded {
                    continue;
                }
                let i = start + n as u64;
                match fill(i) {
                    Fill::Load => to_load.push(n),
                    Fill::Zero => {
                        g.buf.fill(0);
                        g.loaded = true;
                    }
                    Fill::Overwrite => {}
                }
            }
            if !to_load.is_empty() {
                let mut batch: Vec<(PageKey, &mut [u8])> = Vec::with_capacity(to_load.len());
                let mut wanted = to_load.iter().peekable();
                for (n, g) in guards.iter_mut().enumerate() {
                    if wanted.peek() == Some(&&n) {
                        wanted.next();
                        batch.push(((ino, start + n as u64), &mut g.buf[..]));
                    }
                }
                let results = backing.load(&mut batch);
                drop(batch);
                for (&n, r) in to_load.iter().zip(results) {
                    r?;
                    guards[n].loaded = true;
                }
            }
            for (n, g) in guards.iter_mut().enumerate() {
                let g = &mut **g;
                let result = f(start + n as u64, &mut g.buf, &mut g.dirty);
                // A page the callback wrote in full (Overwrite) now holds real content.
                g.loaded = true;
                result?;
            }
            start = end;
        }
        Ok(())
    }

    /// Writes back every dirty page of `ino`. Returns the first error.
    pub fn flush_inode(&self, backing: &dyn Backing, ino: u64) -> Result<(), FsError> {
        let pages = lock(&self.index).pages_of(ino, 0..u64::MAX);
        let mut first_err = Ok(());
        for group in pages.chunks(self.group_len().max(16)) {
            // `pages_of` returns ascending indices: locking in order is safe.
            let mut guards: Vec<_> = group.iter().map(|p| (p.key, lock(&p.state))).collect();
            // Dead pages were written back by their evictor, or invalidated.
            let mut batch: Vec<(PageKey, &mut PageState)> = guards
                .iter_mut()
                .filter(|(_, g)| g.live)
                .map(|(k, g)| (*k, &mut **g))
                .collect();
            if let Err(e) = self.write_back(backing, &mut batch, false) {
                if first_err.is_ok() {
                    first_err = Err(e);
                }
            }
        }
        first_err
    }

    /// Writes back every dirty page (the periodic flusher, unmount).
    pub fn flush_all(&self, backing: &dyn Backing) -> Result<(), FsError> {
        let inodes: Vec<u64> = lock(&self.index).by_inode.keys().copied().collect();
        let mut first_err = Ok(());
        for ino in inodes {
            if let Err(e) = self.flush_inode(backing, ino) {
                if first_err.is_ok() {
                    first_err = Err(e);
                }
            }
        }
        first_err
    }

    /// Drops the pages of `ino` from block `from` on, dirty or not (truncate, delete).
    /// Waits for write-backs in flight on those pages, so once this returns no page of
    /// the range can write to remote memory any more.
    pub fn invalidate(&self, ino: u64, from: u64) {
        let pages = {
            let mut idx = lock(&self.index);
            let pages = idx.pages_of(ino, from..u64::MAX);
            for p in &pages {
                if idx.lru.pop(&p.key).is_none() {
                    idx.evicting.remove(&p.key);
                }
                idx.forget_key(p.key);
            }
            idx.buffers -= pages.len();
            pages
        };
        for p in pages {
            let mut g = lock(&p.state);
            g.dirty = false;
            g.loaded = false;
            g.live = false;
        }
    }

    /// Number of dirty pages (for tests and statistics).
    pub fn dirty_pages(&self) -> usize {
        let pages: Vec<Arc<Page>> = {
            let idx = lock(&self.index);
            idx.lru
                .iter()
                .map(|(_, p)| p.clone())
                .chain(idx.evicting.values().cloned())
                .collect()
        };
        pages.iter().filter(|p| lock(&p.state).dirty).count()
    }

    /// Pages currently cached.
    pub fn cached_pages(&self) -> usize {
        lock(&self.index).lru.len()
    }
}

#[cfg(test)]
mod tests;
