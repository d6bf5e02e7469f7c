//! The callers' way in: [`PageCache::access`], [`PageCache::read`] and
//! [`PageCache::read_together`] lock groups of pages in key order, fill each as its
//! [`Fill`] says (one load batch per group), run the caller's callback on its bytes
//! and record what the callback made valid and dirty.

use super::page::{Page, PageState};
use super::{lock, Fill, PageCache, PageKey, RemoteIo};
use crate::error::FsError;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

impl PageCache {
    /// Runs `f(block index, bytes, dirty)` on the pages of `ino` for every index in
    /// `idxs`, in order, each locked and made fully valid, or prepared as `fill` says
    /// for the bytes `f` reads or overwrites. Blocks to load are loaded in one batch
    /// per group. `f` sets `*dirty` (false when called) if it changed bytes: the
    /// sectors the fill names ([`Fill::Read`], [`Fill::Write`]), or all, become dirty.
    /// `bytes` is the whole block.
    pub fn access<F>(
        &self,
        io: &dyn RemoteIo,
        ino: u64,
        idxs: Range<u64>,
        fill: impl Fn(u64) -> Fill,
        mut f: F,
    ) -> Result<(), FsError>
    where
        F: FnMut(u64, &mut [u8], &mut bool) -> Result<(), FsError>,
    {
        // Without sector pages every buffer is the whole block (its base is 0).
        self.access_pages(io, ino, idxs, fill, false, |i, _, bytes, dirty| {
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
        io: &dyn RemoteIo,
        ino: u64,
        idxs: Range<u64>,
        fill: impl Fn(u64) -> Fill,
        mut f: F,
    ) -> Result<(), FsError>
    where
        F: FnMut(u64, usize, &[u8]) -> Result<(), FsError>,
    {
        self.access_pages(io, ino, idxs, fill, true, |i, base, bytes, _| {
            f(i, base, bytes)
        })
    }

    /// [`PageCache::access`] and [`PageCache::read`]: with `sector_pages`, `f` gets a
    /// sector page's buffer and its base where the fill reads only its sector.
    fn access_pages<F>(
        &self,
        io: &dyn RemoteIo,
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
            self.access_group(io, &keys, &hows, sector_pages, false, &mut f)?;
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
        io: &dyn RemoteIo,
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
            loaded += self.access_group(io, &keys, &hows, true, true, read)?;
        }
        Ok(loaded)
    }

    /// The pages of `keys` (ascending), locked together, each filled as `hows` says:
    /// one batch of loads for all of them, then `f` on each in turn (see
    /// [`PageCache::access_pages`]). `batched`: for [`PageCache::read_together`].
    fn access_group<F>(
        &self,
        io: &dyn RemoteIo,
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
                    self.acquire(io, key, sector, batched)
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
            // Pages to load from remote I/O, with the sectors each needs.
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
                let results = self.fill_sectors(io, &mut batch);
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
                        self.shrink(io);
                    }
                    return Err(e);
                }
            }
            drop(guards);
            if grew {
                self.shrink(io);
            }
            return Ok(loaded);
        }
    }
}
