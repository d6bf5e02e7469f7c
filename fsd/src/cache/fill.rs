//! Filling pages: loading the sectors a page lacks from remote I/O, in one batch
//! for several pages, zero-filling a block with no content yet, and sector pages
//! (made by random reads of one sector) getting more sectors or being promoted to a
//! buffer of the whole block.
//!
//! Everything here runs with the pages locked by the caller (`access`, `writeback`).

use super::buffers::PageBuf;
use super::page::PageState;
use super::{lock, Fill, PageCache, PageKey, RemoteIo};
use crate::error::FsError;
use std::sync::atomic::Ordering;

impl PageCache {
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
    pub(super) fn sector_read(&self, how: Fill) -> Option<usize> {
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
    pub(super) fn ready_sector_page(&self, g: &mut PageState, how: Fill, sector_pages: bool) {
        match self.sector_read(how).filter(|_| sector_pages) {
            Some(at) if g.sectors.iter().any(|(s, _)| *s == at) => {}
            Some(at) => {
                let buf = self.take_sector_buf();
                g.sectors.push((at, buf));
            }
            None => self.promote(g),
        }
    }

    /// Gives each of `pages` (locked by the caller) the sectors of its `wanted` mask it
    /// lacks: one batch of loads, one per run of consecutive missing bytes, straight
    /// into the page's buffer (valid sectors and parts are never written); a sector
    /// with a part becomes valid and dirty. One result per page; a page whose load
    /// failed gains nothing.
    pub(super) fn fill_sectors(
        &self,
        io: &dyn RemoteIo,
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
        let results = io.load(&mut batch);
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
    pub(super) fn zero_fill(&self, g: &mut PageState) {
        let parts = g.part_mask(&self.sectors);
        for gap in self.sectors.gaps(self.sectors.full & !g.valid, &g.parts) {
            g.forget_sums(gap.clone(), self.sum_unit);
            g.buf[gap].fill(0);
        }
        g.dirty |= parts;
        g.parts.clear();
        g.valid = self.sectors.full;
    }
}
