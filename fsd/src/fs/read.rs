//! Reads: one at a time (`read_into`, straight into the caller's buffer), with a
//! sequential reader detected and its next blocks read ahead (by the prefetch
//! thread when one runs, `prefetch.rs`), and random reads that came together
//! answered in one round trip per file (`read_together`).

use super::{finished_blocks, FileCounters, RmemFs};
use crate::cache::{Fill, PageKey};
use crate::error::FsResult;
use crate::inode::{Ino, Inode};
use std::ops::Range;
use std::sync::atomic::Ordering;

/// Bytes per page sum: a read around the cache is of whole ones.
const SUM_PAGE: usize = crate::remote::PAGE as usize;

/// A read that came with others (see [`RmemFs::read_together`]): `dst.len()` bytes
/// of file `ino` at `offset`, and once answered how many of them it read (fewer
/// only at the end of the file).
pub struct ReadTogether<'a> {
    pub ino: Ino,
    pub offset: u64,
    pub dst: &'a mut [u8],
    pub done: Option<usize>,
}

impl RmemFs {
    /// Up to `len` bytes at `offset` (fewer at the end of the file).
    pub fn read(&self, ino: Ino, offset: u64, len: u32) -> FsResult<Vec<u8>> {
        let mut out = vec![0u8; len as usize];
        let n = self.read_into(ino, offset, &mut out)?;
        out.truncate(n);
        Ok(out)
    }

    /// Reads into `dst` the bytes at `offset..offset + dst.len()` and returns how many
    /// it read (fewer at the end of the file): straight from the cache's pages into
    /// the caller's buffer (the FUSE ring's payload), with no copy in between.
    pub fn read_into(&self, ino: Ino, offset: u64, dst: &mut [u8]) -> FsResult<usize> {
        let len = dst.len();
        let inode = self.file_inode(ino)?;
        let _io = inode.io_shared();
        self.accessed(&inode);
        let size = inode.meta().attr.size;
        if offset >= size || len == 0 {
            FileCounters::count(&self.counters.reads, &self.counters.read_bytes, 0);
            return Ok(0);
        }
        let end = size.min(offset.saturating_add(len as u64));
        let bs = self.block_size;
        let first = offset / bs;
        let last = (end - 1) / bs;
        // A sequential reader gets the following blocks read ahead: by the prefetch
        // thread when one runs, else in this request's own batch.
        let sequential = inode.next_read.swap(end, Ordering::Relaxed) == offset && offset > 0;
        let last_block_of_file = (size - 1) / bs;
        let readahead_end = (last + 1 + self.readahead_blocks).min(last_block_of_file + 1);
        let load_end = if !sequential {
            inode.readahead_to.store(0, Ordering::Relaxed);
            last + 1
        } else if self.prefetch.is_running() {
            // Queue the blocks past what is queued already, to load while this
            // request is answered.
            let queued = inode.readahead_to.load(Ordering::Relaxed);
            // Beyond the window: left by an earlier pass over the file.
            let from = if queued > readahead_end {
                last + 1
            } else {
                queued.max(last + 1)
            };
            if from < readahead_end {
                inode.readahead_to.store(readahead_end, Ordering::Relaxed);
                self.prefetch.push(ino, from..readahead_end);
            }
            last + 1
        } else {
            readahead_end
        };
        // The bytes of block `i` this read returns.
        let wanted = |i: u64| {
            let block_start = i * bs;
            let from = offset.max(block_start) - block_start;
            let to = end.min(block_start + bs) - block_start;
            from as usize..to as usize
        };
        if !sequential
            && first == last
            && self.read_mapped(&inode, (ino, first), wanted(first), dst)
        {
            let done = wanted(first).len();
            FileCounters::count(&self.counters.reads, &self.counters.read_bytes, done);
            return Ok(done);
        }
        let mut done = 0usize;
        self.cache.read(
            self,
            ino,
            first..load_end,
            |i| {
                if !inode.meta().blocks.contains_key(&i) {
                    Fill::Zero
                } else if sequential {
                    // A stream: whole blocks, and the next ones read ahead.
                    Fill::Load
                } else {
                    // A random read loads what it reads, not the whole block.
                    let r = wanted(i);
                    Fill::Read {
                        from: r.start,
                        to: r.end,
                    }
                }
            },
            |i, base, buf| {
                if i <= last {
                    // A sector page's buffer starts at its sector (`base`).
                    let r = wanted(i);
                    let part = &buf[r.start - base..r.end - base];
                    dst[done..done + part.len()].copy_from_slice(part);
                    done += part.len();
                }
                Ok(())
            },
        )?;
        if sequential {
            // The stream is done with the blocks this read ends: they go first when
            // the cache needs room (see `PageCache::drop_behind`).
            self.cache
                .drop_behind(ino, finished_blocks(first, last, end, bs, end == size));
        }
        let c = &self.counters;
        FileCounters::count(&c.reads, &c.read_bytes, done);
        Ok(done)
    }

    /// Answers random reads that came together, what they miss loaded in one round
    /// trip per file (`PageCache::read_together`), under the file's I/O lock as
    /// [`RmemFs::read_into`] takes it. It leaves to `read_into` (their `done` stays
    /// None) the reads that continue a stream, the file's last read or one of the
    /// batch (the stream's read-ahead is there), that span blocks, read a hole or
    /// start at or past the end of the file, those of files it cannot read (the read
    /// reports why), and those whose load failed (the read loads again and reports
    /// the error). Returns how many blocks it loaded.
    pub fn read_together(&self, reads: &mut [ReadTogether<'_>]) -> usize {
        let mut order: Vec<usize> = (0..reads.len()).collect();
        order.sort_unstable_by_key(|&n| (reads[n].ino, reads[n].offset, n));
        let bs = self.block_size;
        let mut loaded = 0;
        let inos: Vec<Ino> = reads.iter().map(|r| r.ino).collect();
        for file in order.chunk_by(|&a, &b| inos[a] == inos[b]) {
            let ino = reads[file[0]].ino;
            let Ok(inode) = self.file_inode(ino) else {
                continue;
            };
            let _io = inode.io_shared();
            // The reads answered here, by offset: (block, its bytes they read, read).
            let mut wanted: Vec<(u64, std::ops::Range<usize>, usize)> =
                Vec::with_capacity(file.len());
            {
                let meta = inode.meta();
                let size = meta.attr.size;
                let next_read = inode.next_read.load(Ordering::Relaxed);
                let end_of = |r: &ReadTogether<'_>| r.offset.saturating_add(r.dst.len() as u64);
                for &n in file {
                    let (offset, len) = (reads[n].offset, reads[n].dst.len() as u64);
                    if offset >= size
                        || len == 0
                        || offset == next_read
                        || file.iter().any(|&m| end_of(&reads[m]) == offset)
                    {
                        continue;
                    }
                    let end = size.min(offset.saturating_add(len));
                    let i = offset / bs;
                    if (end - 1) / bs != i || !meta.blocks.contains_key(&i) {
                        continue;
                    }
                    let start = i * bs;
                    wanted.push((i, (offset - start) as usize..(end - start) as usize, n));
                }
            }
            if wanted.is_empty() {
                continue;
            }
            self.accessed(&inode);
            // Over the mapped fabric, what the cache lacks is copied straight to the
            // readers (`read_mapped`); the rest goes through the cache.
            let c = &self.counters;
            wanted.retain(|(i, r, n)| {
                let read = &mut reads[*n];
                if !self.read_mapped(&inode, (ino, *i), r.clone(), read.dst) {
                    return true;
                }
                read.done = Some(r.len());
                FileCounters::count(&c.reads, &c.read_bytes, r.len());
                false
            });
            // One range per block: all that its reads want. None when every read went
            // around the cache: the cache then reads nothing, and the stream's state
            // below is kept as ever.
            let mut blocks: Vec<(u64, std::ops::Range<usize>)> = Vec::with_capacity(wanted.len());
            for (i, r, _) in &wanted {
                match blocks.last_mut() {
                    Some((j, all)) if j == i => all.end = all.end.max(r.end),
                    _ => blocks.push((*i, r.clone())),
                }
            }
            let read = self
                .cache
                .read_together(self, ino, &blocks, |i, base, buf| {
                    for (_, r, n) in wanted.iter().filter(|w| w.0 == i) {
                        // A sector page's buffer starts at its sector (`base`).
                        let part = &buf[r.start - base..r.end - base];
                        reads[*n].dst[..part.len()].copy_from_slice(part);
                        reads[*n].done = Some(part.len());
                    }
                    Ok(())
                });
            match read {
                Ok(n) => loaded += n,
                Err(e) => log::debug!("reads that came together: {e}; each is read alone"),
            }
            let c = &self.counters;
            for &(_, _, n) in &wanted {
                if let Some(done) = reads[n].done {
                    FileCounters::count(&c.reads, &c.read_bytes, done);
                }
            }
            // The file's next read continues a stream if it follows the last read
            // answered, as after reads answered one by one; when reads of it are left
            // to `read_into`, they set that as they are answered.
            if file.iter().all(|&n| reads[n].done.is_some()) {
                let last = file.iter().max().map(|&n| &reads[n]);
                if let Some(r) = last {
                    inode.readahead_to.store(0, Ordering::Relaxed);
                    let end = r.offset + r.done.unwrap_or(0) as u64;
                    inode.next_read.store(end, Ordering::Relaxed);
                }
            }
        }
        loaded
    }
}

impl RmemFs {
    /// Over the mapped fabric, bytes `range` of block `key` (of `inode`, whose I/O
    /// lock the caller holds shared) copied straight from a memnode's mapped region
    /// into `dst`, around the cache: true if they were, and are good. Only whole pages
    /// the cache holds no page of (its page may be newer than remote memory), and only
    /// as `remote/mapped.rs` checks them; false leaves the read to the cache, which
    /// waits, repairs and reports. Counted as a cache miss: the cache did not hold it.
    fn read_mapped(
        &self,
        inode: &Inode,
        key: PageKey,
        range: Range<usize>,
        dst: &mut [u8],
    ) -> bool {
        let pages = !range.is_empty()
            && range.start.is_multiple_of(SUM_PAGE)
            && range.len().is_multiple_of(SUM_PAGE)
            && dst.len() >= range.len();
        if !pages || !self.remote.maps_any() {
            return false;
        }
        let (loc, expected) = {
            let m = inode.meta();
            match m.blocks.get(&key.1).filter(|e| e.written) {
                Some(e) => (e.loc.clone(), e.sums.expected(range.start, range.len())),
                None => return false,
            }
        };
        let Some(copy) = self.remote.mapped_copy(&loc) else {
            return false;
        };
        if self.cache.holds_page(key) {
            return false;
        }
        let dst = &mut dst[..range.len()];
        let good = self
            .remote
            .read_mapped(&loc, copy, range.start, dst, &expected);
        if good {
            self.cache.counters.misses.fetch_add(1, Ordering::Relaxed);
        }
        good
    }
}
