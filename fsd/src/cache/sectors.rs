//! Sector masks: which sectors of a block a page holds, as the bits of a `u64`.
//!
//! A block is split into at most 64 sectors (see the module comment of `cache`), so
//! one word says which are valid, which dirty, which have a part; the arithmetic on
//! those words (the sectors a byte range covers or touches, their runs, the gaps
//! around parts) lives here, apart from the pages that use it.

use std::ops::Range;

/// Which sectors of a block are valid, and how to tell.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sectors {
    /// Bytes per sector; divides the block size.
    pub(super) len: usize,
    /// Every sector of a block.
    pub(super) full: u64,
}

impl Sectors {
    pub(super) fn new(block_size: usize, sector: usize) -> Sectors {
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
    pub(super) fn block_len(&self) -> usize {
        self.len * self.full.count_ones() as usize
    }

    /// The sectors that bytes `from..to` of a block cover whole, and those they touch.
    pub(super) fn of(&self, from: usize, to: usize) -> (u64, u64) {
        let whole = bits(from.div_ceil(self.len), to / self.len);
        let touched = bits(from / self.len, to.div_ceil(self.len));
        (whole, touched)
    }

    /// The sector holding byte `at` of a block, as a mask.
    pub(super) fn bit_of(&self, at: usize) -> u64 {
        1 << (at / self.len)
    }

    /// The bytes of the sectors in `mask` other than `parts` (in order, each inside
    /// one sector): what a fill of those sectors loads, in runs.
    pub(super) fn gaps(&self, mask: u64, parts: &[Range<usize>]) -> Vec<Range<usize>> {
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
    pub(super) fn each(&self, mut mask: u64) -> impl Iterator<Item = Range<usize>> + '_ {
        std::iter::from_fn(move || {
            let i = (mask != 0).then(|| mask.trailing_zeros() as usize)?;
            mask &= mask - 1;
            Some(i * self.len..(i + 1) * self.len)
        })
    }

    /// The runs of consecutive sectors in `mask`, as byte ranges of the block.
    pub(super) fn runs(&self, mut mask: u64) -> impl Iterator<Item = Range<usize>> + '_ {
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
pub(super) fn bits(a: usize, b: usize) -> u64 {
    if b <= a {
        0
    } else if b - a == 64 {
        u64::MAX
    } else {
        ((1u64 << (b - a)) - 1) << a
    }
}

/// The default sector size for a block size: 4 KiB, or a 64th of the block.
pub fn sector_size(block_size: usize) -> usize {
    (block_size / 64).max(4096).min(block_size)
}
