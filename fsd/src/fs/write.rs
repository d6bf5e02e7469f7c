//! Writes: every block a write touches gets its remote copies first (so full remote
//! memory fails the write with ENOSPC before anything is acknowledged), then the
//! bytes go into the cache's pages; a sequential writer has the blocks it finished
//! written behind it.

use super::{finished_blocks, FileCounters, RmemFs, MAX_FILE_SIZE};
use crate::cache::Fill;
use crate::error::{FsError, FsResult};
use crate::inode::{BlockEntry, Ino, Inode};
use crate::privs;
use crate::remote::BlockLoc;
use std::ffi::OsStr;
use std::sync::atomic::Ordering;

/// How far from where the last write to a file ended a large write may start and
/// still count as the same stream. With `--writeback-cache` the kernel sends a
/// stream as runs of up to 1 MiB, several at a time, which fsd's request loops
/// finish in any order: an exact match missed most of them, and their blocks
/// waited to be evicted instead of being written behind.
const STREAM_REORDER: u64 = 8 << 20;

/// The smallest write [`STREAM_REORDER`] applies to: random small writes within a
/// few MiB of each other (a small file's updates) are not a stream.
const MIN_REORDERED_RUN: u64 = 256 << 10;

/// Whether a write of `len` bytes at `offset`, after one that ended at `prev_end`,
/// continues a stream.
fn continues_stream(prev_end: u64, offset: u64, len: u64) -> bool {
    offset > 0
        && (prev_end == offset
            || (len >= MIN_REORDERED_RUN && prev_end.abs_diff(offset) <= STREAM_REORDER))
}

impl RmemFs {
    pub fn write(&self, ino: Ino, offset: u64, data: &[u8]) -> FsResult<u32> {
        if data.is_empty() {
            return Ok(0);
        }
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or(FsError::TooLarge)?;
        let inode = self.file_inode(ino)?;
        let _io = inode.io_shared();
        self.retry_when_full(|| self.allocate_blocks(&inode, offset..end))?;
        self.write_allocated(&inode, offset, data)
    }

    /// The second half of [`RmemFs::write`]: `data` into blocks that have locations,
    /// under the caller's io lock. Writers hold that lock shared, so another write may
    /// have filled a block this one allocated, and the page may even have gone to
    /// remote memory since: the rest of a partly written block is therefore always
    /// taken from the block (now, or when the page is completed before a read or a
    /// write-back, see `cache.rs`), never assumed empty because this writer allocated
    /// it. Loading a block whose content never reached remote memory yields zeros
    /// without a remote read (`written`).
    pub(super) fn write_allocated(&self, inode: &Inode, offset: u64, data: &[u8]) -> FsResult<u32> {
        let end = offset + data.len() as u64;
        let bs = self.block_size;
        let first = offset / bs;
        let last = (end - 1) / bs;
        self.cache.access(
            self,
            inode.ino,
            first..last + 1,
            |i| {
                let block_start = i * bs;
                if offset <= block_start && end >= block_start + bs {
                    Fill::Overwrite
                } else {
                    Fill::Write {
                        from: (offset.max(block_start) - block_start) as usize,
                        to: (end.min(block_start + bs) - block_start) as usize,
                    }
                }
            },
            |i, buf, dirty| {
                let block_start = i * bs;
                let from = offset.max(block_start);
                let to = end.min(block_start + bs);
                // The page is locked: no write-back or load of the block is under
                // way while its copies change size.
                self.fit_block(inode, i, to - block_start)?;
                let src = &data[(from - offset) as usize..(to - offset) as usize];
                buf[(from - block_start) as usize..(to - block_start) as usize]
                    .copy_from_slice(src);
                *dirty = true;
                Ok(())
            },
        )?;
        let mut m = inode.meta();
        if end > m.attr.size {
            m.attr.size = end;
        }
        m.touch_mtime();
        // A write drops file capabilities, as on a local filesystem. The kernel asks
        // for that itself before writes through its page cache, not direct-I/O ones.
        m.xattrs.remove(OsStr::new(privs::FILE_CAPABILITIES));
        drop(m);
        self.changed(inode);
        let prev_end = inode.next_write.swap(end, Ordering::Relaxed);
        if continues_stream(prev_end, offset, end - offset) {
            // A stream: what it has finished goes to remote memory now, behind it
            // (see `PageCache::write_behind`).
            self.cache
                .write_behind(inode.ino, finished_blocks(first, last, end, bs, false));
        }
        let c = &self.counters;
        FileCounters::count(&c.writes, &c.write_bytes, data.len());
        Ok(data.len() as u32)
    }

    /// Gives every block that bytes `range` of the file touch and that has none a
    /// remote location, of the block's bytes up to the range's end (in whole pages).
    /// On failure the blocks allocated by this call are given back, so nothing
    /// half-made remains. Returns the blocks that are new (their remote content is
    /// undefined). Blocks that have a smaller location keep it: see
    /// [`RmemFs::fit_block`].
    pub(super) fn allocate_blocks(
        &self,
        inode: &Inode,
        range: std::ops::Range<u64>,
    ) -> FsResult<Vec<u64>> {
        let bs = self.block_size;
        let mut m = inode.meta();
        let mut fresh = Vec::new();
        for i in range.start / bs..(range.end - 1) / bs + 1 {
            if m.blocks.contains_key(&i) {
                continue;
            }
            let alloc = match self.may_grow() {
                true => self
                    .remote
                    .alloc_block(range.end.min((i + 1) * bs) - i * bs),
                false => Err(crate::remote::RemoteError::NoSpace),
            };
            match alloc {
                Ok(loc) => {
                    m.insert_block(i, BlockEntry::unwritten(loc));
                    m.block_changed(i);
                    fresh.push(i);
                }
                Err(e) => {
                    let undo: Vec<BlockLoc> = fresh
                        .iter()
                        .filter_map(|&i| m.remove_block(i))
                        .map(|e| e.loc)
                        .collect();
                    drop(m);
                    // Never committed (the meta lock was held throughout): free now.
                    self.remote.free_blocks(undo);
                    return Err(e.into());
                }
            }
        }
        drop(m);
        if !fresh.is_empty() {
            self.grew_blocks(fresh.len());
            self.changed(inode);
        }
        Ok(fresh)
    }
}
