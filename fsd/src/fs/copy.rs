//! `copy_file_range(2)` served by fsd, copying inside remote memory.
//!
//! The kernel's fallback for a filesystem without copy_file_range reads every chunk
//! from fsd and writes it back: the bytes come from the memnodes into fsd's cache,
//! cross to the kernel and back, are copied into the destination's cache pages and
//! written to the memnodes again. Here, each destination block that the range covers
//! whole, and whose bytes are a whole block of the source (the two offsets are as far
//! into their blocks), gets new remote copies holding the source block's bytes, made
//! by the memnodes themselves where they hold a copy of the source
//! (`remote/copy.rs`), and the source block's page sums: nothing passes through the
//! page cache and nothing is summed again. The bytes at the ends of the range, and a
//! whole range whose offsets are not as far into their blocks, go through the cache
//! as a read and a write (in fsd, one request instead of one per chunk).
//!
//! While blocks are copied both files' io locks are held exclusively (in inode
//! order), so no write changes the source between its write-back and the copy (its
//! sums would no longer match the copied bytes) and nothing reads or writes the
//! destination blocks being replaced. A hole in the source (or a block never written)
//! becomes a hole in the destination. The destination's old blocks are freed as by
//! a truncate (after the next commit on a volume).

use super::{FileCounters, RmemFs, MAX_FILE_SIZE};
use crate::error::{FsError, FsResult};
use crate::inode::{BlockEntry, Ino, Inode};
use crate::remote::{BlockCopy, BlockLoc};
use std::sync::atomic::Ordering;

/// Bytes one request copies at most; the caller asks again for the rest, as
/// copying programs do, so no request holds both files for long.
pub const COPY_MAX: u64 = 256 << 20;
/// Blocks allocated and copied per remote round.
const BATCH: u64 = 256;
/// Bytes per step of a copy through the cache.
const STEP: usize = 1 << 20;

impl RmemFs {
    /// Copies up to `len` bytes (at most [`COPY_MAX`]) of file `from` at `off_in` to
    /// file `to` at `off_out`, stopping at the end of `from`. Returns the bytes
    /// copied; an error after some were copied ends the copy short instead, as a
    /// short write would.
    pub fn copy_range(
        &self,
        from: Ino,
        off_in: u64,
        to: Ino,
        off_out: u64,
        len: u64,
    ) -> FsResult<u64> {
        let src = self.file_inode(from)?;
        self.file_inode(to)?;
        let size = src.meta().attr.size;
        let len = len.min(size.saturating_sub(off_in)).min(COPY_MAX);
        if len == 0 {
            return Ok(0);
        }
        let end_out = off_out
            .checked_add(len)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or(FsError::TooLarge)?;
        if from == to && off_in < end_out && off_out < off_in + len {
            return Err(FsError::Invalid);
        }
        let bs = self.block_size;
        // Destination blocks covered whole, whose source is a whole block too.
        let (first, last) = if off_in % bs == off_out % bs {
            (off_out.div_ceil(bs), end_out / bs)
        } else {
            (0, 0)
        };
        let done = if first < last {
            let head = first * bs - off_out;
            let mut done = self.copy_through_cache(from, off_in, to, off_out, head)?;
            if done == head {
                let blocks = self.copy_whole_blocks(from, off_in + head, to, first..last);
                done += match blocks {
                    Ok(n) => n,
                    Err(_) if done > 0 => 0,
                    Err(e) => return Err(e),
                };
                if done == last * bs - off_out {
                    let tail = end_out - last * bs;
                    done += self
                        .copy_through_cache(from, off_in + done, to, off_out + done, tail)
                        .unwrap_or(0);
                }
            }
            done
        } else {
            self.copy_through_cache(from, off_in, to, off_out, len)?
        };
        let c = &self.counters;
        FileCounters::count(&c.copies, &c.copy_bytes, done as usize);
        Ok(done)
    }

    /// Copies `len` bytes as reads and writes through the cache. Returns the bytes
    /// copied (short after an error, an error if none were).
    fn copy_through_cache(
        &self,
        from: Ino,
        off_in: u64,
        to: Ino,
        off_out: u64,
        len: u64,
    ) -> FsResult<u64> {
        let mut buf = vec![0u8; (len as usize).min(STEP)];
        let mut done = 0;
        while done < len {
            let want = ((len - done) as usize).min(buf.len());
            let step = self
                .read_into(from, off_in + done, &mut buf[..want])
                .and_then(|n| match n {
                    0 => Ok(0),
                    n => self.write(to, off_out + done, &buf[..n]).map(|w| w as u64),
                });
            match step {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(_) if done > 0 => break,
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    /// Gives destination blocks `blocks` of `to` the content of the source blocks
    /// of `from` starting at byte `src_start` (a block boundary). Returns the bytes
    /// copied: a multiple of the block size, fewer than asked after an error (an
    /// error if none).
    fn copy_whole_blocks(
        &self,
        from: Ino,
        src_start: u64,
        to: Ino,
        blocks: std::ops::Range<u64>,
    ) -> FsResult<u64> {
        let src = self.file_inode(from)?;
        let dst = self.file_inode(to)?;
        // Both exclusively, in inode order (one lock when they are the same file).
        let (_first, _second) = match from.cmp(&to) {
            std::cmp::Ordering::Equal => (src.io_exclusive(), None),
            std::cmp::Ordering::Less => (src.io_exclusive(), Some(dst.io_exclusive())),
            std::cmp::Ordering::Greater => (dst.io_exclusive(), Some(src.io_exclusive())),
        };
        // The source's remote copies hold its bytes from now on: nothing can write
        // into it while its lock is held.
        self.cache.flush_inode(self, from)?;
        let bs = self.block_size;
        let src_first = src_start / bs;
        let mut done = 0;
        let mut at = blocks.start;
        while at < blocks.end {
            let end = (at + BATCH).min(blocks.end);
            let r = self.copy_batch(&src, src_first + (at - blocks.start), &dst, at..end);
            match r {
                Ok(()) => done += (end - at) * bs,
                Err(_) if done > 0 => break,
                Err(e) => return Err(e),
            }
            at = end;
        }
        let mut m = dst.meta();
        let end = blocks.start * bs + done;
        if end > m.attr.size {
            m.attr.size = end;
        }
        m.touch_mtime();
        drop(m);
        self.changed(&dst);
        self.counters
            .copied_blocks
            .fetch_add(done / bs, Ordering::Relaxed);
        Ok(done)
    }

    /// One round of [`RmemFs::copy_whole_blocks`]: destination blocks `blocks` from
    /// the source blocks from `src_first` on; all or nothing.
    fn copy_batch(
        &self,
        src: &Inode,
        src_first: u64,
        dst: &Inode,
        blocks: std::ops::Range<u64>,
    ) -> FsResult<()> {
        // The source blocks with content; the others become holes.
        let sources: Vec<(u64, Option<BlockEntry>)> = {
            let m = src.meta();
            blocks
                .clone()
                .map(|i| {
                    let e = m.blocks.get(&(src_first + i - blocks.start));
                    (i, e.filter(|e| e.written).cloned())
                })
                .collect()
        };
        let mut new: Vec<(u64, BlockLoc)> = Vec::new();
        if sources.iter().any(|(_, e)| e.is_some()) && !self.may_grow() {
            return Err(FsError::NoSpace);
        }
        for (i, e) in &sources {
            let Some(e) = e else { continue };
            match self.remote.alloc_block_beside(&e.loc) {
                Ok(loc) => new.push((*i, loc)),
                Err(err) => {
                    self.remote.free_blocks(new.into_iter().map(|(_, l)| l));
                    return Err(err.into());
                }
            }
        }
        let sums: Vec<Vec<Option<u32>>> = sources
            .iter()
            .filter_map(|(_, e)| e.as_ref())
            .map(|e| e.sums.expected(0, e.loc.bytes() as usize))
            .collect();
        let copies: Vec<BlockCopy<'_>> = sources
            .iter()
            .filter_map(|(_, e)| e.as_ref())
            .zip(&new)
            .zip(&sums)
            .map(|((e, (_, loc)), sums)| BlockCopy {
                from: &e.loc,
                sums,
                to: loc,
            })
            .collect();
        let results = self.remote.copy_blocks(&copies);
        drop(copies);
        if let Some(Err(e)) = results.into_iter().find(Result::is_err) {
            self.remote.free_blocks(new.into_iter().map(|(_, l)| l));
            return Err(e.into());
        }
        // Nothing of the old blocks may be written back into them any more.
        self.cache.invalidate_blocks(dst.ino, blocks.clone());
        self.grew_blocks(new.len());
        let mut new = new.into_iter().peekable();
        let mut old = Vec::new();
        {
            let mut m = dst.meta();
            for (i, e) in sources {
                if let Some(gone) = m.remove_block(i) {
                    old.push(gone.loc);
                }
                if let (Some(e), Some((_, loc))) = (e, new.next_if(|(n, _)| *n == i)) {
                    m.insert_block(
                        i,
                        BlockEntry {
                            loc,
                            written: true,
                            sums: e.sums,
                        },
                    );
                }
                m.block_changed(i);
            }
        }
        self.changed(dst);
        self.free_later(old);
        Ok(())
    }
}
