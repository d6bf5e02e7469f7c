//! The page cache: file blocks held locally, LRU, with write-back.
//!
//! A page holds one block of one file, keyed by `(inode, block index)`. Its bytes live
//! in a buffer from a bounded pool (`--cache` bytes of buffers of `block_size` bytes,
//! or of a sector's for sector pages, below), so fsd's memory for data is bounded by
//! `--cache` however large the files are.
//!
//! A page need not hold all of its block: it tracks which *sectors* of it are valid
//! (sector = max(4 KiB, block size / 64), at most 64 per block, one bit each). A write
//! that covers whole sectors of a block that is not cached does not read the block
//! from remote memory: the page holds just those sectors, dirty. A random read
//! ([`Fill::Read`]) loads only the sectors it reads. Missing sectors are fetched when
//! they are needed, straight into the page's buffer, one remote read per run of
//! consecutive missing bytes (never over a valid sector or a part): before a read of
//! them and before a write-back of the whole block.
//!
//! A random read that misses makes a *sector page*: a page that holds the sectors
//! random reads of one sector each have read, each in a buffer of its own (from a
//! second slab, of sector-sized buffers), rather than a buffer of the whole block, so
//! the cache's memory holds as many randomly read sectors as it has room for (with
//! 64 KiB blocks and 4 KiB reads, up to 16 times as many as whole-block pages
//! would). Memory is counted in bytes: `--cache` bounds what the pages' block and
//! sector buffers take together (and free buffers whose memory is kept for reuse add
//! a 32nd of it, or briefly two: [`PageCache::trim_memory`], which the cleaner runs,
//! as does a request that takes a buffer past that, `PageCache::trim_if_due`). A
//! sector page serves and takes in reads of one sector each, up to all of its
//! block's; anything else done to its block (a read of more than a sector, a write,
//! a stream's load, a flush) first gives it a buffer of the whole block, its sectors
//! copied in. It is never dirty, since only a read makes one and a write gives it a
//! whole buffer first. Over RDMA there are none (see
//! [`PageCache::register_with_fabric`]).
//!
//! A write that ends inside a sector the page does not hold keeps what it wrote there
//! as a *part* of that sector (a byte range, dirty), and the rest of the sector is
//! fetched only when something needs it, or never if later writes fill it: the kernel
//! splits a direct write from a buffer that is not page-aligned at a byte inside a
//! sector, and its second half then completes the sector without a remote read. A
//! write that would leave a gap in a sector's part loads that sector first (around
//! the part).
//!
//! A page also tracks which sectors are dirty. A block that remote memory holds, with
//! all its copies, is written back as its dirty sectors only (one remote write per
//! run), with nothing read; any other block (new, or getting new copies, which need
//! all of it) is completed and written back whole.
//!
//! A page keeps the checksum of each 4 KiB of its buffer that a write filled whole
//! (`remote/sums.rs`), computed right after the write's copy, while those bytes are
//! still in the writing CPU's caches, and hands it to [`RemoteIo::store`] with the
//! bytes: a stream's write-back then sends its pages without a second pass over
//! them. Any other change to those bytes (a fill, zeros, a write of part of them,
//! a caller that changes what it likes) forgets their sums, so a sum handed over is
//! always the sum of the bytes beside it; remote I/O sums what it is not given.
//!
//! Structure and invariants:
//! - `Index::lru` maps keys to live pages, least recently used first. `Index::evicting`
//!   holds pages taken out of the LRU whose write-back is under way; a lookup that finds
//!   its key there takes the page back, so nobody ever reads a block from remote memory
//!   while a newer version is still on its way there.
//! - `Index::by_inode` lists the cached block indices of each inode (both maps), for
//!   fsync and truncate.
//! - A page's bytes and flags are only touched under its own mutex. `valid` says which
//!   sectors of the bytes are the block's content (the others are to be taken from
//!   remote I/O, and a fill never overwrites a valid sector); `dirty` says which
//!   valid sectors are newer than remote memory (never one that is not valid).
//!   `parts` are byte ranges of sectors not in `valid`, at most one per sector and
//!   never a whole one, always newer than remote memory; a sector whose part is
//!   completed (by a fill around it, or by writes) becomes valid and dirty. A page
//!   written back whole is made fully valid first, in one load batch per write-back
//!   batch; a page written back in part stores its dirty sectors and its parts.
//! - Streams do not age like other pages: a sequential reader's blocks are moved to
//!   the cold end of the LRU once served ([`PageCache::drop_behind`]), and a
//!   sequential writer's finished blocks are written back by the cleaner right away
//!   and moved there then ([`PageCache::write_behind`]). The last page moved there
//!   goes first, so a stream cycles through a few buffers that are still in the
//!   CPU's caches and leaves the rest of the cache alone (what it read or wrote
//!   before the cache filled included).
//! - The pool may briefly overshoot `capacity` when every page is in use at once (many
//!   threads each holding pages); it never blocks waiting for a buffer, so no thread
//!   can deadlock on memory another waiting thread holds.
//!
//! Lock order: a page's mutex may be taken while holding no other page mutex, or
//! several page mutexes in ascending key order. The index mutex is innermost: nothing
//! else is locked while holding it. Write-back and loading call the [`RemoteIo`] with
//! page mutexes held; remote I/O must not touch the cache.
//!
//! Layout: this file holds the cache's surface, what the rest of fsd uses
//! ([`PageCache`], [`RemoteIo`], [`Store`], [`Fill`], [`CacheCounters`]); the work is
//! in submodules, each an `impl PageCache` of one job. `sectors`: masks of a block's
//! sectors; `page`: one page's state (valid and dirty sectors, parts, checksums);
//! `index`: the LRU index, finding or making a page, invalidation; `budget`: the
//! pages' buffers against `--cache`; `fill`: loading what pages lack, sector pages
//! and their promotion; `access`: the callers' reads and writes; `evict`: eviction;
//! `writeback`: write-back, flushes and the cleaner; `streams`: drop-behind and
//! write-behind; `buffers`: the slabs the buffers come from.

mod access;
mod budget;
mod buffers;
mod evict;
mod fill;
mod index;
mod page;
mod sectors;
mod streams;
mod writeback;

pub use sectors::sector_size;

use crate::error::FsError;
use budget::kept_free_bytes;
use buffers::Slab;
use index::Index;
use lru::LruCache;
use page::Page;
use sectors::Sectors;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// `(inode number, block index)`.
pub type PageKey = (u64, u64);

/// The bytes a checksum covers: a page of remote memory (tests use smaller ones).
const SUM_UNIT: usize = crate::remote::PAGE as usize;

/// One write-back: bytes `offset..offset + bytes.len()` of block `key`, and the
/// checksums of its 4 KiB pages the cache knows, from the page at `offset` (which is
/// then page-aligned; empty when it is not), `None` where it does not.
pub struct Store<'a> {
    pub key: PageKey,
    pub offset: usize,
    pub bytes: &'a [u8],
    pub sums: &'a [Option<u32>],
}

/// Where pages come from and go to: remote memory, via the filesystem's block maps.
pub trait RemoteIo: Send + Sync {
    /// Fills each buffer with bytes `offset..offset + buffer length` of its block's
    /// current content (zeros for a hole). A block may appear several times, for
    /// different ranges.
    fn load(&self, reads: &mut [(PageKey, usize, &mut [u8])]) -> Vec<Result<(), FsError>>;
    /// Writes each buffer to bytes `offset..offset + buffer length` of its block in
    /// remote memory. A whole block (offset 0, a whole buffer) may get new copies; a
    /// part of one (only ever asked for where [`RemoteIo::stores_in_part`] said yes) is
    /// written to the copies the block has. A failure is recorded by remote I/O, for
    /// fsync or close to report.
    fn store(&self, writes: &[Store<'_>]) -> Vec<Result<(), FsError>>;
    /// Whether block `key` can be written back in part: remote memory holds its
    /// content and it needs no new copy (which would need all of it).
    fn stores_in_part(&self, key: PageKey) -> bool;
    /// A dirty page could not be written back for a reason of the cache's own (its
    /// block could not be loaded to complete it): record `e` as `store` records its
    /// failures.
    fn record_write_error(&self, key: PageKey, e: &FsError);
}

/// How a page that is not fully valid is to be filled before use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// Read the block from remote I/O (into the sectors the page does not hold).
    Load,
    /// The caller reads bytes `from..to` of the block and nothing else: only the
    /// sectors those touch are loaded (a random read loads what it reads, in whole
    /// sectors, not the block).
    Read { from: usize, to: usize },
    /// The block has no content yet (a hole or beyond EOF): zeros (in the sectors
    /// the page does not hold).
    Zero,
    /// The caller overwrites the whole block; leave the buffer as it is.
    Overwrite,
    /// The caller overwrites bytes `from..to` of the block and nothing else. Sectors
    /// it covers whole need no content; the block is loaded only if an end of the
    /// range falls inside a sector the page does not hold.
    Write { from: usize, to: usize },
}

/// Statistics, for logs and benchmarks.
#[derive(Debug, Default)]
pub struct CacheCounters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub evictions: AtomicU64,
    pub writebacks: AtomicU64,
    /// Writes into pages that did not hold their sectors and that needed no load.
    pub partial_writes: AtomicU64,
    /// Loads of part of a block: the sectors a random read needs, or those a partly
    /// valid page lacks (before a read, an unaligned write or a write-back).
    pub partial_fills: AtomicU64,
    /// Write-backs of a page's dirty sectors only.
    pub partial_stores: AtomicU64,
    /// Misses of reads that came together, loaded in one batch
    /// ([`PageCache::read_together`]); counted in `misses` too.
    pub batched_misses: AtomicU64,
}

use rmemfs_common::sync::lock;

pub struct PageCache {
    /// Block buffers the cache's memory holds.
    capacity: usize,
    /// Bytes of buffers the cache holds: `capacity` blocks.
    budget: usize,
    sectors: Sectors,
    /// Bytes per checksum ([`SUM_UNIT`]).
    sum_unit: usize,
    slab: Slab,
    /// Buffers of sector pages.
    sector_slab: Slab,
    /// Whether random reads make sector pages (not once the block buffers are
    /// registered: [`PageCache::register_with_fabric`]).
    sector_pages: AtomicBool,
    /// Set when the two slabs' resident memory went past [`PageCache::resident_limit`]:
    /// the request that sees it gives back free buffers' memory at once (see
    /// [`PageCache::trim_if_due`]) rather than leave it to the cleaner.
    trim_due: AtomicBool,
    index: Mutex<Index>,
    /// Set by an eviction round or a queued write-behind: the cleaner has work (see
    /// [`PageCache::wait_for_work`]).
    evicting_now: Mutex<bool>,
    evicted: Condvar,
    /// The cleaner's last round of cold pages found some dirty: evictions keep
    /// waking it while there are (see [`PageCache::evict`]).
    cold_dirty: AtomicBool,
    /// Blocks sequential writers have finished, for the cleaner to write back soon
    /// (see [`PageCache::write_behind`]).
    behind: Mutex<Vec<PageKey>>,
    pub counters: CacheCounters,
}

impl PageCache {
    /// A cache of `capacity_bytes` (at least two blocks) in blocks of `block_size`,
    /// with sectors of [`sector_size`].
    pub fn new(capacity_bytes: u64, block_size: usize) -> PageCache {
        PageCache::with_sector_size(capacity_bytes, block_size, sector_size(block_size))
    }

    /// As [`PageCache::new`], with sectors of `sector` bytes (dividing the block into
    /// at most 64).
    pub fn with_sector_size(capacity_bytes: u64, block_size: usize, sector: usize) -> PageCache {
        let capacity = ((capacity_bytes / block_size as u64) as usize).max(2);
        let budget = capacity * block_size;
        let sectors = Sectors::new(block_size, sector);
        // Beyond its slab's slots a buffer comes from the heap (`buffers`): the
        // sector slab has room for some overshoot. A block of one sector has no
        // sector pages.
        let sector_slots = if sector < block_size {
            (budget + kept_free_bytes(budget, block_size)) / sector
        } else {
            0
        };
        PageCache {
            capacity,
            budget,
            sectors,
            sum_unit: SUM_UNIT,
            // Just the budget: registered for RDMA, this is what the device pins.
            slab: Slab::new(capacity, block_size),
            sector_slab: Slab::new(sector_slots, sector),
            sector_pages: AtomicBool::new(sector_slots > 0),
            trim_due: AtomicBool::new(false),
            index: Mutex::new(Index {
                lru: LruCache::unbounded(),
                evicting: HashMap::new(),
                by_inode: HashMap::new(),
                held: 0,
            }),
            evicting_now: Mutex::new(false),
            evicted: Condvar::new(),
            cold_dirty: AtomicBool::new(false),
            behind: Mutex::new(Vec::new()),
            counters: CacheCounters::default(),
        }
    }

    /// The same cache with checksums of `unit` bytes (tests: tiny blocks).
    #[cfg(test)]
    fn with_sum_unit(mut self, unit: usize) -> PageCache {
        self.sum_unit = unit;
        self
    }

    pub fn capacity_pages(&self) -> usize {
        self.capacity
    }

    /// Registers the block buffers with the fabric once (see `buffers`), for RDMA: the
    /// device then holds (pins) all of their memory, `--cache` of it, for the rest of
    /// the process's life. Random reads then make no sector pages, whose buffers
    /// would pin as much again.
    pub fn register_with_fabric(&self) -> Result<(), rmemfs_common::fabric::FabricError> {
        self.sector_pages.store(false, Ordering::SeqCst);
        self.slab.register_with_fabric()
    }

    /// Pages handled per locked group: small enough that a group never holds a large
    /// share of the cache.
    fn group_len(&self) -> usize {
        (self.capacity / 4).clamp(1, 64)
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
        pages.iter().filter(|p| lock(&p.state).is_dirty()).count()
    }

    /// Pages currently cached.
    pub fn cached_pages(&self) -> usize {
        lock(&self.index).lru.len()
    }

    /// Bytes of the buffers of the cache's pages.
    #[cfg(test)]
    fn held_bytes(&self) -> usize {
        lock(&self.index).held
    }

    /// The cache's memory in use, in blocks: the bytes of the buffers of its pages
    /// (a sector page's are sectors), over the block size.
    pub fn held_blocks(&self) -> usize {
        lock(&self.index).held / self.sectors.block_len()
    }
}

#[cfg(test)]
mod tests;
