//! A cached page and its state: the buffers, valid and dirty sectors, parts and
//! checksums of one block (see the module comment of `cache` for what each means).
//!
//! Only the page's own bookkeeping is here: what a page knows and how a write or a
//! fill changes that. Finding pages, filling them and writing them back are the
//! cache's jobs, in the sibling modules.

use super::buffers::PageBuf;
use super::sectors::Sectors;
use super::PageKey;
use std::ops::Range;
use std::sync::Mutex;

pub(super) struct PageState {
    /// The block's bytes; empty for a sector page.
    pub(super) buf: PageBuf,
    /// A sector page's sectors (see the module comment): each one's start in the
    /// block and its buffer. Empty for a page with a buffer of the whole block.
    pub(super) sectors: Vec<(usize, PageBuf)>,
    /// Bit `i`: sector `i` of `buf` holds the block's content.
    pub(super) valid: u64,
    /// Bit `i`: sector `i` is newer than remote memory (always within `valid`).
    pub(super) dirty: u64,
    /// Bytes written into sectors not in `valid`, by block offset, in order (see the
    /// module comment). Empty unless a write ended inside a sector the page lacked.
    pub(super) parts: Vec<Range<usize>>,
    /// False once the page has left the cache (evicted or invalidated). A thread that
    /// got the page before that and locks it after must not use it: its changes would
    /// be lost with the page.
    pub(super) live: bool,
    /// The checksum of each 4 KiB of `buf` that a write filled whole since (see the
    /// module comment); `None` where not known.
    pub(super) sums: Vec<Option<u32>>,
}

impl PageState {
    /// Bytes of the page's buffers.
    pub(super) fn held(&self) -> usize {
        self.buf.len() + self.sectors.iter().map(|(_, b)| b.len()).sum::<usize>()
    }

    /// Takes the page's buffers out of it (it is leaving the cache).
    pub(super) fn take_bufs(&mut self) -> impl Iterator<Item = PageBuf> {
        let whole = std::mem::take(&mut self.buf);
        let sectors = std::mem::take(&mut self.sectors);
        (!whole.is_empty())
            .then_some(whole)
            .into_iter()
            .chain(sectors.into_iter().map(|(_, b)| b))
    }

    /// Whether the page holds anything newer than remote memory.
    pub(super) fn is_dirty(&self) -> bool {
        self.dirty != 0 || !self.parts.is_empty()
    }

    /// Forgets the checksums of the `unit`-byte pages that `bytes` of the buffer touch.
    pub(super) fn forget_sums(&mut self, bytes: Range<usize>, unit: usize) {
        let n = self.sums.len();
        let pages = (bytes.start / unit).min(n)..bytes.end.div_ceil(unit).min(n);
        self.sums[pages].fill(None);
    }

    /// After a write of `bytes` of the buffer: sums the `unit`-byte pages it filled
    /// whole (their bytes are still in this CPU's caches) and forgets those it wrote
    /// in part.
    pub(super) fn sum_written(&mut self, bytes: Range<usize>, unit: usize) {
        self.forget_sums(bytes.clone(), unit);
        let whole = bytes.start.div_ceil(unit)..(bytes.end / unit).min(self.sums.len());
        for p in whole {
            let page = &self.buf[p * unit..(p + 1) * unit];
            self.sums[p] = Some(crate::remote::sums::page_sum(page));
        }
    }

    /// The known checksums of the pages of bytes `at..` for a store of them: from the
    /// page at `at` when `at` is a page boundary, none otherwise.
    pub(super) fn sums_from(&self, at: usize, unit: usize) -> &[Option<u32>] {
        if at.is_multiple_of(unit) {
            self.sums.get(at / unit..).unwrap_or(&[])
        } else {
            &[]
        }
    }

    /// Forgets that anything is newer than remote memory.
    pub(super) fn clean(&mut self) {
        self.dirty = 0;
        self.parts.clear();
    }

    /// The sectors that have a part.
    pub(super) fn part_mask(&self, sectors: &Sectors) -> u64 {
        self.parts
            .iter()
            .fold(0, |m, p| m | sectors.bit_of(p.start))
    }

    /// Whether `piece` (bytes of one sector the page lacks) can join that sector's
    /// part: the sector has none, or `piece` overlaps or touches it.
    pub(super) fn can_join(&self, sectors: &Sectors, piece: &Range<usize>) -> bool {
        let sector = sectors.bit_of(piece.start);
        self.parts
            .iter()
            .find(|p| sectors.bit_of(p.start) == sector)
            .is_none_or(|p| piece.start <= p.end && p.start <= piece.end)
    }

    /// Adds `piece` (see [`PageState::can_join`]) to its sector's part. Returns true
    /// if that completed the sector, which is then valid (no longer a part).
    pub(super) fn join(&mut self, sectors: &Sectors, piece: Range<usize>) -> bool {
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

pub(super) struct Page {
    pub(super) key: PageKey,
    pub(super) state: Mutex<PageState>,
}
