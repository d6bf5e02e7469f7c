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
//! still in the writing CPU's caches, and hands it to [`Backing::store`] with the
//! bytes: a stream's write-back then sends its pages without a second pass over
//! them. Any other change to those bytes (a fill, zeros, a write of part of them,
//! a caller that changes what it likes) forgets their sums, so a sum handed over is
//! always the sum of the bytes beside it; the backing sums what it is not given.
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
//!   the backing, and a fill never overwrites a valid sector); `dirty` says which
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
//! else is locked while holding it. Write-back and loading call the [`Backing`] with
//! page mutexes held; the backing must not touch the cache.

mod buffers;

use crate::error::FsError;
use buffers::{PageBuf, Slab};
use lru::LruCache;
use std::collections::{BTreeSet, HashMap};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// `(inode number, block index)`.
pub type PageKey = (u64, u64);

/// Pages popped per eviction round: write-backs of several victims share one batch.
const EVICT_BATCH: usize = 8;

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
pub trait Backing: Send + Sync {
    /// Fills each buffer with bytes `offset..offset + buffer length` of its block's
    /// current content (zeros for a hole). A block may appear several times, for
    /// different ranges.
    fn load(&self, reads: &mut [(PageKey, usize, &mut [u8])]) -> Vec<Result<(), FsError>>;
    /// Writes each buffer to bytes `offset..offset + buffer length` of its block in
    /// remote memory. A whole block (offset 0, a whole buffer) may get new copies; a
    /// part of one (only ever asked for where [`Backing::stores_in_part`] said yes) is
    /// written to the copies the block has. A failure is recorded by the backing, for
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
    /// Read the block from the backing (into the sectors the page does not hold).
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

struct PageState {
    /// The block's bytes; empty for a sector page.
    buf: PageBuf,
    /// A sector page's sectors (see the module comment): each one's start in the
    /// block and its buffer. Empty for a page with a buffer of the whole block.
    sectors: Vec<(usize, PageBuf)>,
    /// Bit `i`: sector `i` of `buf` holds the block's content.
    valid: u64,
    /// Bit `i`: sector `i` is newer than remote memory (always within `valid`).
    dirty: u64,
    /// Bytes written into sectors not in `valid`, by block offset, in order (see the
    /// module comment). Empty unless a write ended inside a sector the page lacked.
    parts: Vec<Range<usize>>,
    /// False once the page has left the cache (evicted or invalidated). A thread that
    /// got the page before that and locks it after must not use it: its changes would
    /// be lost with the page.
    live: bool,
    /// The checksum of each 4 KiB of `buf` that a write filled whole since (see the
    /// module comment); `None` where not known.
    sums: Vec<Option<u32>>,
}

impl PageState {
    /// Bytes of the page's buffers.
    fn held(&self) -> usize {
        self.buf.len() + self.sectors.iter().map(|(_, b)| b.len()).sum::<usize>()
    }

    /// Takes the page's buffers out of it (it is leaving the cache).
    fn take_bufs(&mut self) -> impl Iterator<Item = PageBuf> {
        let whole = std::mem::take(&mut self.buf);
        let sectors = std::mem::take(&mut self.sectors);
        (!whole.is_empty())
            .then_some(whole)
            .into_iter()
            .chain(sectors.into_iter().map(|(_, b)| b))
    }

    /// Whether the page holds anything newer than remote memory.
    fn is_dirty(&self) -> bool {
        self.dirty != 0 || !self.parts.is_empty()
    }

    /// Forgets the checksums of the `unit`-byte pages that `bytes` of the buffer touch.
    fn forget_sums(&mut self, bytes: Range<usize>, unit: usize) {
        let n = self.sums.len();
        let pages = (bytes.start / unit).min(n)..bytes.end.div_ceil(unit).min(n);
        self.sums[pages].fill(None);
    }

    /// After a write of `bytes` of the buffer: sums the `unit`-byte pages it filled
    /// whole (their bytes are still in this CPU's caches) and forgets those it wrote
    /// in part.
    fn sum_written(&mut self, bytes: Range<usize>, unit: usize) {
        self.forget_sums(bytes.clone(), unit);
        let whole = bytes.start.div_ceil(unit)..(bytes.end / unit).min(self.sums.len());
        for p in whole {
            let page = &self.buf[p * unit..(p + 1) * unit];
            self.sums[p] = Some(crate::remote::sums::page_sum(page));
        }
    }

    /// The known checksums of the pages of bytes `at..` for a store of them: from the
    /// page at `at` when `at` is a page boundary, none otherwise.
    fn sums_from(&self, at: usize, unit: usize) -> &[Option<u32>] {
        if at.is_multiple_of(unit) {
            self.sums.get(at / unit..).unwrap_or(&[])
        } else {
            &[]
        }
    }

    /// Forgets that anything is newer than remote memory.
    fn clean(&mut self) {
        self.dirty = 0;
        self.parts.clear();
    }

    /// The sectors that have a part.
    fn part_mask(&self, sectors: &Sectors) -> u64 {
        self.parts
            .iter()
            .fold(0, |m, p| m | sectors.bit_of(p.start))
    }

    /// Whether `piece` (bytes of one sector the page lacks) can join that sector's
    /// part: the sector has none, or `piece` overlaps or touches it.
    fn can_join(&self, sectors: &Sectors, piece: &Range<usize>) -> bool {
        let sector = sectors.bit_of(piece.start);
        self.parts
            .iter()
            .find(|p| sectors.bit_of(p.start) == sector)
            .is_none_or(|p| piece.start <= p.end && p.start <= piece.end)
    }

    /// Adds `piece` (see [`PageState::can_join`]) to its sector's part. Returns true
    /// if that completed the sector, which is then valid (no longer a part).
    fn join(&mut self, sectors: &Sectors, piece: Range<usize>) -> bool {
        let sector = sectors.bit_of(piece.start);
        let merged = match self
            .parts
            .iter()
            .position(|p| sectors.bit_of(p.start) == sector)
        {
            Some(i) => {
                let p = self.parts.remove(i);
                p.start.min(piece.start)..p.end.max(piece.end)
            }
            None => piece,
        };
        if merged.len() == sectors.len {
            self.valid |= sector;
            return true;
        }
        let at = self.parts.partition_point(|p| p.start < merged.start);
        self.parts.insert(at, merged);
        false
    }
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
    /// Bytes of the pages' buffers: at most the cache's `budget` but for brief
    /// overshoots (see the module comment).
    held: usize,
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

/// Which sectors of a block are valid, and how to tell.
#[derive(Debug, Clone, Copy)]
struct Sectors {
    /// Bytes per sector; divides the block size.
    len: usize,
    /// Every sector of a block.
    full: u64,
}

impl Sectors {
    fn new(block_size: usize, sector: usize) -> Sectors {
        // (A remainder by hand: `is_multiple_of` is newer than the workspace's MSRV.)
        let rest = if sector > 0 { block_size % sector } else { 1 };
        assert!(
            rest == 0 && block_size / sector <= 64,
            "sector size {sector} does not split a {block_size}-byte block into 1 to 64"
        );
        Sectors {
            len: sector,
            full: bits(0, block_size / sector),
        }
    }

    /// Bytes of a block.
    fn block_len(&self) -> usize {
        self.len * self.full.count_ones() as usize
    }

    /// The sectors that bytes `from..to` of a block cover whole, and those they touch.
    fn of(&self, from: usize, to: usize) -> (u64, u64) {
        let whole = bits(from.div_ceil(self.len), to / self.len);
        let touched = bits(from / self.len, to.div_ceil(self.len));
        (whole, touched)
    }

    /// The sector holding byte `at` of a block, as a mask.
    fn bit_of(&self, at: usize) -> u64 {
        1 << (at / self.len)
    }

    /// The bytes of the sectors in `mask` other than `parts` (in order, each inside
    /// one sector): what a fill of those sectors loads, in runs.
    fn gaps(&self, mask: u64, parts: &[Range<usize>]) -> Vec<Range<usize>> {
        let mut out = Vec::new();
        for run in self.runs(mask) {
            let mut at = run.start;
            for p in parts.iter().filter(|p| run.contains(&p.start)) {
                if p.start > at {
                    out.push(at..p.start);
                }
                at = p.end;
            }
            if at < run.end {
                out.push(at..run.end);
            }
        }
        out
    }

    /// Each sector in `mask`, as a byte range of the block.
    fn each(&self, mut mask: u64) -> impl Iterator<Item = Range<usize>> + '_ {
        std::iter::from_fn(move || {
            let i = (mask != 0).then(|| mask.trailing_zeros() as usize)?;
            mask &= mask - 1;
            Some(i * self.len..(i + 1) * self.len)
        })
    }

    /// The runs of consecutive sectors in `mask`, as byte ranges of the block.
    fn runs(&self, mut mask: u64) -> impl Iterator<Item = Range<usize>> + '_ {
        std::iter::from_fn(move || {
            if mask == 0 {
                return None;
            }
            let start = mask.trailing_zeros() as usize;
            let len = (!(mask >> start)).trailing_zeros() as usize;
            mask &= !bits(start, start + len);
            Some(start * self.len..(start + len) * self.len)
        })
    }
}

/// Bits `a..b` set (empty if `b <= a`); `b <= 64`.
fn bits(a: usize, b: usize) -> u64 {
    if b <= a {
        0
    } else if b - a == 64 {
        u64::MAX
    } else {
        ((1u64 << (b - a)) - 1) << a
    }
}

/// Bytes of free buffers whose memory a cache of `budget` bytes keeps beside its
/// pages: enough that pages coming and going reuse buffers rather than give memory
/// back and take it again.
fn kept_free_bytes(budget: usize, block_size: usize) -> usize {
    (budget / 32).max(2 * block_size)
}

/// The default sector size for a block size: 4 KiB, or a 64th of the block.
pub fn sector_size(block_size: usize) -> usize {
    (block_size / 64).max(4096).min(block_size)
}

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

    /// A buffer of `len` bytes (a block's or a sector's) for a page, if the pages'
    /// budget has room for it or `force` says to go over it.
    fn take_buf(&self, idx: &mut Index, len: usize, force: bool) -> Option<PageBuf> {
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
    /// gives that back too late, at 200 ms intervals: fsd with a 128 MiB cache
    /// peaked at 293 MiB in the bench.
    fn resident_limit(&self) -> usize {
        self.budget + 2 * kept_free_bytes(self.budget, self.sectors.block_len())
    }

    /// Gives back free buffers' memory if a buffer taken took the slabs past
    /// [`PageCache::resident_limit`]. Takes no index lock: called by requests with
    /// none held (page locks may be).
    fn trim_if_due(&self) {
        if self.trim_due.load(Ordering::Relaxed) && self.trim_due.swap(false, Ordering::AcqRel) {
            self.trim_memory();
        }
    }

    /// Takes back the buffer of a page that left the cache (or of a sector page that
    /// got a whole block's): its slot is the next its slab gives out.
    fn put_buf(&self, idx: &mut Index, buf: PageBuf) {
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

    /// Evicts until the cache's buffers are within its budget again, after sector pages
    /// took more memory while their locks were held. Pages in use are skipped. Must be
    /// called with no page mutex held.
    fn shrink(&self, backing: &dyn Backing) {
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
            if self.evict(backing, vec![victim]) == 0 {
                return;
            }
        }
    }

    /// A buffer for a sector page (locked by the caller) to take in another sector.
    /// May take the cache briefly over its budget: it cannot evict while the caller
    /// holds page locks; [`PageCache::shrink`] evicts for it once they are let go.
    fn take_sector_buf(&self) -> PageBuf {
        let mut idx = lock(&self.index);
        self.take_buf(&mut idx, self.sectors.len, true)
            .expect("a forced take always gives a buffer")
    }

    /// Gives a sector page (locked by the caller) a buffer of its whole block, with its
    /// sectors copied in. May go over the budget as [`PageCache::take_sector_buf`] does.
    fn promote(&self, g: &mut PageState) {
        let mut idx = lock(&self.index);
        let mut whole = self
            .take_buf(&mut idx, self.sectors.block_len(), true)
            .expect("a forced take always gives a buffer");
        for (at, buf) in std::mem::take(&mut g.sectors) {
            whole[at..at + buf.len()].copy_from_slice(&buf);
            self.put_buf(&mut idx, buf);
        }
        g.buf = whole;
    }

    /// The sector a fill reads, if it is a random read of one sector and the block
    /// has several: such a read makes or uses a sector page. Returns its start.
    fn sector_read(&self, how: Fill) -> Option<usize> {
        let Fill::Read { from, to } = how else {
            return None;
        };
        let touched = self.sectors.of(from, to).1;
        (self.sector_pages.load(Ordering::Relaxed) && touched.count_ones() == 1)
            .then(|| touched.trailing_zeros() as usize * self.sectors.len)
    }

    /// Readies sector page `g` (locked by the caller) for `how`: for a read of one
    /// sector (with `sector_pages`) it stays a sector page, with a buffer (not yet
    /// valid) for that sector if it had none; for anything else it gets a buffer of
    /// the whole block.
    fn ready_sector_page(&self, g: &mut PageState, how: Fill, sector_pages: bool) {
        match self.sector_read(how).filter(|_| sector_pages) {
            Some(at) if g.sectors.iter().any(|(s, _)| *s == at) => {}
            Some(at) => {
                let buf = self.take_sector_buf();
                g.sectors.push((at, buf));
            }
            None => self.promote(g),
        }
    }

    /// Returns the page for `key`, creating it (holding nothing) if needed, evicting as
    /// needed: a sector page of the sector starting at `sector` if given, else a page of
    /// the whole block; `batched`: a miss is one of reads that came together. Must
    /// be called with no page mutex held.
    fn acquire(
        &self,
        backing: &dyn Backing,
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
                    self.shrink(backing);
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
        // The cleaner writes back the pages next in line, so that evictions to come
        // find them clean. Only where there are dirty ones: woken for every round of
        // a cache that reads only, it cost each 4 KiB random read that misses a
        // context switch and a scan of clean pages (4 readers: 0.13 wakeups per read).
        if self.cold_dirty.load(Ordering::Relaxed) || locked.iter().any(|(_, g)| g.is_dirty()) {
            self.wake_cleaner();
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

    /// Writes the dirty ones among `pages` (all locked by the caller) back in one
    /// batch and marks them clean: those that succeeded, or all with
    /// `clean_on_error`. Returns the first error. A page whose block can be written in
    /// part (see [`Backing::stores_in_part`]) writes its dirty sectors only; the others
    /// are made whole first (one load batch) and written whole.
    fn write_back(
        &self,
        backing: &dyn Backing,
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
            .map(|(k, s)| s.is_dirty() && s.dirty != full && backing.stores_in_part(*k))
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
            let results = self.fill_sectors(backing, &mut sub);
            drop(sub);
            for (&i, r) in partial.iter().zip(results) {
                if let Err(e) = r {
                    // Its missing sectors are unknown: storing it would overwrite them.
                    backing.record_write_error(pages[i].0, &e);
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
        let results = backing.store(&batch);
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

    /// Gives each of `pages` (locked by the caller) the sectors of its `wanted` mask it
    /// lacks: one batch of loads, one per run of consecutive missing bytes, straight
    /// into the page's buffer (valid sectors and parts are never written); a sector
    /// with a part becomes valid and dirty. One result per page; a page whose load
    /// failed gains nothing.
    fn fill_sectors(
        &self,
        backing: &dyn Backing,
        pages: &mut [(PageKey, &mut PageState, u64)],
    ) -> Vec<Result<(), FsError>> {
        let full = self.sectors.full;
        let missing: Vec<u64> = pages.iter().map(|(_, s, w)| *w & !s.valid).collect();
        let mut out: Vec<Result<(), FsError>> = missing.iter().map(|_| Ok(())).collect();
        // The page each load is for.
        let mut owner = Vec::new();
        let mut batch: Vec<(PageKey, usize, &mut [u8])> = Vec::new();
        for (n, ((key, s, _), &lacks)) in pages.iter_mut().zip(&missing).enumerate() {
            if lacks != full && lacks != 0 {
                self.counters.partial_fills.fetch_add(1, Ordering::Relaxed);
            }
            if !s.sectors.is_empty() {
                // A sector page (no parts): each sector it lacks into its own buffer.
                // It is only ever asked for sectors it has buffers for.
                for (at, buf) in s.sectors.iter_mut() {
                    if lacks & self.sectors.bit_of(*at) != 0 {
                        batch.push((*key, *at, &mut buf[..]));
                        owner.push(n);
                    }
                }
                continue;
            }
            // Split the buffer into the runs to load, front to back.
            let gaps = self.sectors.gaps(lacks, &s.parts);
            for run in &gaps {
                s.forget_sums(run.clone(), self.sum_unit);
            }
            let mut rest: &mut [u8] = &mut s.buf[..];
            let mut at = 0;
            for run in gaps {
                let (_, tail) = std::mem::take(&mut rest).split_at_mut(run.start - at);
                let (part, after) = tail.split_at_mut(run.len());
                batch.push((*key, run.start, part));
                owner.push(n);
                rest = after;
                at = run.end;
            }
        }
        if batch.is_empty() {
            return out;
        }
        let results = backing.load(&mut batch);
        drop(batch);
        for (&n, r) in owner.iter().zip(results) {
            if let (Err(e), true) = (r, out[n].is_ok()) {
                out[n] = Err(e);
            }
        }
        // A failed load may have left bytes in the sectors it was filling; they stay
        // invalid, so nothing reads them.
        for ((_, s, _), (&lacks, r)) in pages.iter_mut().zip(missing.iter().zip(&out)) {
            if r.is_ok() {
                s.valid |= lacks;
                // Completed parts: their bytes are still newer than remote memory.
                s.dirty |= s.part_mask(&self.sectors) & lacks;
                s.parts
                    .retain(|p| lacks & self.sectors.bit_of(p.start) == 0);
            }
        }
        out
    }

    /// Makes a page of a block that has no content yet (a hole, beyond EOF) fully
    /// valid: zeros around its valid sectors and its parts, which become dirty sectors.
    fn zero_fill(&self, g: &mut PageState) {
        let parts = g.part_mask(&self.sectors);
        for gap in self.sectors.gaps(self.sectors.full & !g.valid, &g.parts) {
            g.forget_sums(gap.clone(), self.sum_unit);
            g.buf[gap].fill(0);
        }
        g.dirty |= parts;
        g.parts.clear();
        g.valid = self.sectors.full;
    }

    /// Runs `f(block index, bytes, dirty)` on the pages of `ino` for every index in
    /// `idxs`, in order, each locked and made fully valid, or prepared as `fill` says
    /// for the bytes `f` reads or overwrites. Blocks to load are loaded in one batch
    /// per group. `f` sets `*dirty` (false when called) if it changed bytes: the
    /// sectors the fill names ([`Fill::Read`], [`Fill::Write`]), or all, become dirty.
    /// `bytes` is the whole block.
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
        // Without sector pages every buffer is the whole block (its base is 0).
        self.access_pages(backing, ino, idxs, fill, false, |i, _, bytes, dirty| {
            f(i, bytes, dirty)
        })
    }

    /// As [`PageCache::access`] for a read, which changes nothing: runs `f(block
    /// index, base, bytes)` where `bytes` are bytes `base..` of the block and hold at
    /// least those the fill names. A [`Fill::Read`] of one sector of a block with no
    /// page makes a sector page, and one of a sector page's own sector uses it as it
    /// is (see the module comment).
    pub fn read<F>(
        &self,
        backing: &dyn Backing,
        ino: u64,
        idxs: Range<u64>,
        fill: impl Fn(u64) -> Fill,
        mut f: F,
    ) -> Result<(), FsError>
    where
        F: FnMut(u64, usize, &[u8]) -> Result<(), FsError>,
    {
        self.access_pages(backing, ino, idxs, fill, true, |i, base, bytes, _| {
            f(i, base, bytes)
        })
    }

    /// [`PageCache::access`] and [`PageCache::read`]: with `sector_pages`, `f` gets a
    /// sector page's buffer and its base where the fill reads only its sector.
    fn access_pages<F>(
        &self,
        backing: &dyn Backing,
        ino: u64,
        idxs: Range<u64>,
        fill: impl Fn(u64) -> Fill,
        sector_pages: bool,
        mut f: F,
    ) -> Result<(), FsError>
    where
        F: FnMut(u64, usize, &mut [u8], &mut bool) -> Result<(), FsError>,
    {
        let group = self.group_len() as u64;
        let mut start = idxs.start;
        while start < idxs.end {
            let end = (start + group).min(idxs.end);
            let keys: Vec<PageKey> = (start..end).map(|i| (ino, i)).collect();
            // How each page is to be filled.
            let hows: Vec<Fill> = (start..end).map(&fill).collect();
            self.access_group(backing, &keys, &hows, sector_pages, false, &mut f)?;
            start = end;
        }
        Ok(())
    }

    /// Reads for reads that came together what each wants of its block, with one
    /// batch of loads for all that the cache lacks (per group of pages): `blocks`
    /// are block indices of file `ino` in ascending order, each once, with the bytes
    /// of it wanted (as [`Fill::Read`]). Runs `f(block index, base, bytes)` as
    /// [`PageCache::read`] does. Their misses count as batched ones too. Returns how
    /// many pages it loaded into. A failed load fails its group before `f` runs on
    /// any page of it (the groups before it were read); the pages whose loads
    /// worked keep what they loaded.
    pub fn read_together<F>(
        &self,
        backing: &dyn Backing,
        ino: u64,
        blocks: &[(u64, Range<usize>)],
        mut f: F,
    ) -> Result<usize, FsError>
    where
        F: FnMut(u64, usize, &[u8]) -> Result<(), FsError>,
    {
        debug_assert!(
            blocks.windows(2).all(|w| w[0].0 < w[1].0),
            "ascending, once each"
        );
        let mut loaded = 0;
        for chunk in blocks.chunks(self.group_len()) {
            let keys: Vec<PageKey> = chunk.iter().map(|(i, _)| (ino, *i)).collect();
            let hows: Vec<Fill> = chunk
                .iter()
                .map(|(_, r)| Fill::Read {
                    from: r.start,
                    to: r.end,
                })
                .collect();
            let read = &mut |i, base, bytes: &mut [u8], _: &mut bool| f(i, base, bytes);
            loaded += self.access_group(backing, &keys, &hows, true, true, read)?;
        }
        Ok(loaded)
    }

    /// The pages of `keys` (ascending), locked together, each filled as `hows` says:
    /// one batch of loads for all of them, then `f` on each in turn (see
    /// [`PageCache::access_pages`]). `batched`: for [`PageCache::read_together`].
    fn access_group<F>(
        &self,
        backing: &dyn Backing,
        keys: &[PageKey],
        hows: &[Fill],
        sector_pages: bool,
        batched: bool,
        f: &mut F,
    ) -> Result<usize, FsError>
    where
        F: FnMut(u64, usize, &mut [u8], &mut bool) -> Result<(), FsError>,
    {
        loop {
            // Acquire every page before locking any: acquiring may evict, and evicting
            // must not happen while we hold page locks. A page evicted between its
            // acquisition and our lock is dead: start the group again.
            let pages: Vec<Arc<Page>> = keys
                .iter()
                .zip(hows)
                .map(|(&key, &how)| {
                    let sector = self.sector_read(how).filter(|_| sector_pages);
                    self.acquire(backing, key, sector, batched)
                })
                .collect();
            self.trim_if_due();
            let mut guards: Vec<MutexGuard<'_, PageState>> =
                pages.iter().map(|p| lock(&p.state)).collect();
            if guards.iter().any(|g| !g.live) {
                drop(guards);
                continue; // lost a race with eviction; redo this group
            }
            let full = self.sectors.full;
            let mut grew = false;
            for (g, &how) in guards.iter_mut().zip(hows) {
                if !g.sectors.is_empty() {
                    self.ready_sector_page(g, how, sector_pages);
                    grew = true;
                }
            }
            self.trim_if_due();
            // Sectors each page gains from the callback: those it overwrites whole.
            let mut gains = vec![0u64; guards.len()];
            // Sectors the callback may change: those that become dirty if it says so.
            let mut touches = vec![full; guards.len()];
            // Sectors of a write's ends that the page lacks, whose new bytes join the
            // sector's part, with the bytes written.
            let mut joins: Vec<(u64, Range<usize>)> = vec![(0, 0..0); guards.len()];
            // Pages to load from the backing, with the sectors each needs.
            let mut to_load: Vec<(usize, u64)> = Vec::new();
            for (n, g) in guards.iter_mut().enumerate() {
                let how = hows[n];
                if let Fill::Read { from, to } | Fill::Write { from, to } = how {
                    // Even in a page it holds whole, a write dirties only what it touches.
                    touches[n] = self.sectors.of(from, to).1;
                }
                if g.valid == full {
                    continue;
                }
                match how {
                    Fill::Load => to_load.push((n, full)),
                    Fill::Read { .. } => {
                        if touches[n] & !g.valid != 0 {
                            to_load.push((n, touches[n]));
                        }
                    }
                    Fill::Zero => self.zero_fill(g),
                    Fill::Overwrite => gains[n] = full,
                    Fill::Write { from, to } => {
                        let (whole, touched) = self.sectors.of(from, to);
                        gains[n] = whole;
                        // A sector it writes in part and the page lacks keeps the new
                        // bytes as (part of) its part; one whose part they would leave
                        // a gap in is loaded first.
                        let ends = touched & !whole & !g.valid;
                        let mut split = 0;
                        for sector in self.sectors.each(ends) {
                            let piece = from.max(sector.start)..to.min(sector.end);
                            if !g.can_join(&self.sectors, &piece) {
                                split |= self.sectors.bit_of(piece.start);
                            }
                        }
                        joins[n] = (ends & !split, from..to);
                        if split != 0 {
                            to_load.push((n, split));
                        } else if touched & !g.valid != 0 {
                            self.counters.partial_writes.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
            let loaded = to_load.len();
            if !to_load.is_empty() {
                let mut batch: Vec<(PageKey, &mut PageState, u64)> =
                    Vec::with_capacity(to_load.len());
                let mut wanted = to_load.iter().peekable();
                for (n, g) in guards.iter_mut().enumerate() {
                    if let Some(&&(_, mask)) = wanted.peek().filter(|(w, _)| *w == n) {
                        wanted.next();
                        batch.push((keys[n], &mut **g, mask));
                    }
                }
                let results = self.fill_sectors(backing, &mut batch);
                drop(batch);
                for r in results {
                    r?;
                }
            }
            for (n, g) in guards.iter_mut().enumerate() {
                let g = &mut **g;
                let mut dirty = false;
                let result = match self.sector_read(hows[n]) {
                    // A sector page: the buffer of the sector read.
                    Some(at) if !g.sectors.is_empty() => {
                        let (at, buf) = g
                            .sectors
                            .iter_mut()
                            .find(|(s, _)| *s == at)
                            .expect("a sector page holds the sector it reads");
                        f(keys[n].1, *at, &mut buf[..], &mut dirty)
                    }
                    _ => f(keys[n].1, 0, &mut g.buf, &mut dirty),
                };
                if dirty {
                    // Checksums of what the callback wrote, while it is hot; it may
                    // have changed anything the fill names. (Only `read` gets sector
                    // pages, and it writes nothing.)
                    let unit = self.sum_unit;
                    let block = 0..self.sectors.block_len();
                    match hows[n] {
                        Fill::Overwrite => g.sum_written(block, unit),
                        Fill::Write { from, to } => g.sum_written(from..to, unit),
                        _ => g.forget_sums(block, unit),
                    }
                }
                // What the callback wrote in full (Overwrite, Write) is now content;
                // not if it failed: those sectors were never loaded, and the buffer
                // (recycled from any page) may hold any file's bytes there.
                if result.is_ok() {
                    g.valid |= gains[n];
                }
                // A part of a sector it overwrote whole is gone into that sector.
                let valid = g.valid;
                g.parts
                    .retain(|p| valid & self.sectors.bit_of(p.start) == 0);
                if dirty {
                    let (joined, ref written) = joins[n];
                    for sector in self.sectors.each(joined) {
                        let piece = written.start.max(sector.start)..written.end.min(sector.end);
                        if !g.join(&self.sectors, piece) {
                            touches[n] &= !self.sectors.bit_of(sector.start);
                        }
                    }
                    g.dirty |= touches[n];
                }
                if let Err(e) = result {
                    drop(guards);
                    if grew {
                        self.shrink(backing);
                    }
                    return Err(e);
                }
            }
            drop(guards);
            if grew {
                self.shrink(backing);
            }
            return Ok(loaded);
        }
    }

    /// Writes back every dirty page of `ino`. Returns the first error.
    pub fn flush_inode(&self, backing: &dyn Backing, ino: u64) -> Result<(), FsError> {
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
    pub fn clean_behind(&self, backing: &dyn Backing) -> usize {
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
            let (n, clean, busy) = self.clean_pages(backing, &pages);
            self.demote(&clean);
            written += n;
            // In use (a reader, a flush): their turn comes at the cleaner's next round.
            lock(&self.behind).extend(busy.iter().map(|p| p.key));
        }
        written
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

    /// Wakes the cleaner's [`PageCache::wait_for_work`].
    fn wake_cleaner(&self) {
        *lock(&self.evicting_now) = true;
        self.evicted.notify_one();
    }

    /// Waits up to `d` for work for the cleaner (the cache evicted, or blocks were
    /// queued to write behind); true if there was some meanwhile.
    pub fn wait_for_work(&self, d: Duration) -> bool {
        let g = lock(&self.evicting_now);
        let (mut g, _) = self
            .evicted
            .wait_timeout_while(g, d, |evicting| !*evicting)
            .unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *g)
    }

    /// Writes back the dirty pages among the `n` least recently used, so that the
    /// evictions to come find clean pages: run by a thread of its own while the cache
    /// is evicting, this takes remote writes out of the requests that need a buffer.
    /// Pages in use are skipped. Returns how many pages were written back.
    pub fn clean_cold(&self, backing: &dyn Backing, n: usize) -> usize {
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
        let written = self.clean_pages(backing, &cold).0;
        self.cold_dirty.store(written > 0, Ordering::Relaxed);
        written
    }

    /// Writes back the dirty ones among `pages` (ascending keys) in one batch,
    /// skipping pages in use. Returns how many were written back, those of `pages`
    /// that were clean after it, and those skipped.
    fn clean_pages<'p>(
        &self,
        backing: &dyn Backing,
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
        if let Err(e) = self.write_back(backing, &mut batch, false) {
            // Recorded by the backing; the page stays dirty for its eviction to retry.
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

#[cfg(test)]
mod tests;
