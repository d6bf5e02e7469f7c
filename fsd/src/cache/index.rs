//! The index of cached pages: the LRU, the pages being evicted, the blocks cached
//! per inode; finding or making the page of a block (evicting for its buffer), and
//! dropping pages (truncate, hole punch).
//!
//! The index mutex is innermost (see the lock order in the module comment of
//! `cache`): nothing here takes a page mutex while holding it.

use super::buffers::PageBuf;
use super::page::{Page, PageState};
use super::{lock, PageCache, PageKey, RemoteIo};
use lru::LruCache;
use std::collections::{BTreeSet, HashMap};
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// Pages popped per eviction round: write-backs of several victims share one batch.
const EVICT_BATCH: usize = 8;

pub(super) struct Index {
    pub(super) lru: LruCache<PageKey, Arc<Page>>,
    pub(super) evicting: HashMap<PageKey, Arc<Page>>,
    pub(super) by_inode: HashMap<u64, BTreeSet<u64>>,
    /// Bytes of the pages' buffers: at most the cache's `budget` but for brief
    /// overshoots (see the module comment).
    pub(super) held: usize,
}

impl Index {
    pub(super) fn forget_key(&mut self, key: PageKey) {
        if let Some(set) = self.by_inode.get_mut(&key.0) {
            set.remove(&key.1);
            if set.is_empty() {
                self.by_inode.remove(&key.0);
            }
        }
    }

    /// Pages of `ino` with index in `range`, from both maps.
    pub(super) fn pages_of(&mut self, ino: u64, range: Range<u64>) -> Vec<Arc<Page>> {
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

impl PageCache {
    /// Whether the cache has a page of `key`, in use or being written back, without
    /// counting or touching it. A reader that goes around the cache
    /// (`RmemFs::read_mapped`) must not while there is one: its bytes may be newer
    /// than remote memory's.
    pub fn holds_page(&self, key: PageKey) -> bool {
        let idx = lock(&self.index);
        idx.lru.contains(&key) || idx.evicting.contains_key(&key)
    }

    /// Returns the page for `key`, creating it (holding nothing) if needed, evicting as
    /// needed: a sector page of the sector starting at `sector` if given, else a page of
    /// the whole block; `batched`: a miss is one of reads that came together. Must
    /// be called with no page mutex held.
    pub(super) fn acquire(
        &self,
        io: &dyn RemoteIo,
        key: PageKey,
        sector: Option<usize>,
        batched: bool,
    ) -> Arc<Page> {
        // Set when an eviction round freed nothing (every victim busy): allocate
        // instead of spinning on the same busy pages.
        let mut overshoot = false;
        // Over budget (a sector page grew, and its access failed before it shrank the
        // cache): evict for it first, once.
        let mut shrunk = false;
        loop {
            let victims = {
                let mut idx = lock(&self.index);
                if idx.held > self.budget && !shrunk {
                    drop(idx);
                    self.shrink(io);
                    shrunk = true;
                    continue;
                }
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
                let len = match sector {
                    Some(_) => self.sectors.len,
                    None => self.sectors.block_len(),
                };
                // With nothing left to evict (everything is in flight), allocate
                // rather than wait: see the module comment.
                let force = idx.lru.is_empty() || overshoot;
                if let Some(buf) = self.take_buf(&mut idx, len, force) {
                    self.counters.misses.fetch_add(1, Ordering::Relaxed);
                    if batched {
                        self.counters.batched_misses.fetch_add(1, Ordering::Relaxed);
                    }
                    let (buf, sectors) = match sector {
                        Some(at) => (PageBuf::default(), vec![(at, buf)]),
                        None => (buf, Vec::new()),
                    };
                    let page = Arc::new(Page {
                        key,
                        state: Mutex::new(PageState {
                            buf,
                            sectors,
                            valid: 0,
                            dirty: 0,
                            parts: Vec::new(),
                            live: true,
                            sums: vec![None; self.sectors.block_len() / self.sum_unit],
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
            overshoot = self.evict(io, victims) == 0;
        }
    }

    /// Drops the pages of `ino` from block `from` on, dirty or not (truncate, delete).
    /// Waits for write-backs in flight on those pages, so once this returns no page of
    /// the range can write to remote memory any more.
    pub fn invalidate(&self, ino: u64, from: u64) {
        self.invalidate_blocks(ino, from..u64::MAX);
    }

    /// As [`PageCache::invalidate`], for the pages of blocks `blocks` (a hole punched).
    pub fn invalidate_blocks(&self, ino: u64, blocks: Range<u64>) {
        let pages = {
            let mut idx = lock(&self.index);
            let pages = idx.pages_of(ino, blocks);
            for p in &pages {
                if idx.lru.pop(&p.key).is_none() {
                    idx.evicting.remove(&p.key);
                }
                idx.forget_key(p.key);
            }
            pages
        };
        let mut freed = 0;
        for p in pages {
            let mut g = lock(&p.state);
            g.clean();
            g.valid = 0;
            g.live = false;
            freed += g.held();
        }
        // The buffers go with the pages.
        lock(&self.index).held -= freed;
    }
}
