//! Space management of regular files: `fallocate` (reserve, punch a hole, zero a
//! range) and `lseek` with `SEEK_DATA` / `SEEK_HOLE`, all in terms of the block map.
//!
//! - A file's data is exactly its blocks in the block map; a hole is a block index
//!   absent from it. So SEEK_DATA / SEEK_HOLE answer at block granularity, as local
//!   filesystems answer at theirs: a reserved (fallocated) block counts as data.
//! - Reserving gives blocks a remote location without content (`written` false, so
//!   they read as zeros), the same way a first write does; full remote memory fails
//!   the call with ENOSPC and gives back what the call had reserved.
//! - Punching frees the remote memory of every block the range covers whole and zeros
//!   the covered part of the blocks at its edges. Before a block is freed its cached
//!   page is made clean and zero under the page's lock, which waits for any write-back
//!   of it in flight; since write-back takes a block's location from the block map
//!   at the time it writes, no page can write into a freed (perhaps reused) block.
//!
//! All of these hold the inode's `io` lock exclusively, like truncate: no read or
//! write of the file runs meanwhile.

use super::RmemFs;
use crate::cache::Fill;
use crate::error::{FsError, FsResult};
use crate::inode::{FileKind, Ino, Inode};
use std::ops::Range;

/// What `fallocate` is asked to do (the Linux mode bits, decoded at the boundary).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocate {
    /// Mode 0, or `FALLOC_FL_KEEP_SIZE` with `keep_size`: reserve the range.
    Reserve { keep_size: bool },
    /// `FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`: free the range; reads give zeros.
    PunchHole,
    /// `FALLOC_FL_ZERO_RANGE`: the range reads as zeros and stays reserved.
    ZeroRange { keep_size: bool },
}

/// Which `lseek` search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seek {
    /// `SEEK_DATA`: the first byte at or after the offset that lies in data.
    Data,
    /// `SEEK_HOLE`: the first byte at or after the offset that lies in a hole (end of
    /// file counts as one).
    Hole,
}

impl RmemFs {
    /// `fallocate(2)` on a regular file.
    pub fn fallocate(&self, ino: Ino, offset: u64, len: u64, how: Allocate) -> FsResult<()> {
        if len == 0 {
            return Err(FsError::Invalid);
        }
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= super::MAX_FILE_SIZE)
            .ok_or(FsError::TooLarge)?;
        let inode = self.file_inode(ino)?;
        let _io = inode.io_exclusive();
        match how {
            Allocate::Reserve { keep_size } => {
                self.reserve(&inode, offset..end)?;
                let mut m = inode.meta();
                if !keep_size && end > m.attr.size {
                    m.attr.size = end;
                }
                m.touch_ctime();
            }
            Allocate::PunchHole => {
                self.punch(&inode, offset..end)?;
                inode.meta().touch_mtime();
            }
            Allocate::ZeroRange { keep_size } => {
                self.punch(&inode, offset..end)?;
                self.reserve(&inode, offset..end)?;
                let mut m = inode.meta();
                if !keep_size && end > m.attr.size {
                    m.attr.size = end;
                }
                m.touch_mtime();
            }
        }
        self.changed(&inode);
        Ok(())
    }

    /// Gives every block that `bytes` touches remote memory up to the range's end.
    fn reserve(&self, inode: &Inode, bytes: Range<u64>) -> FsResult<()> {
        self.retry_when_full(|| self.allocate_blocks(inode, bytes.clone()))?;
        self.fit_blocks(inode, bytes)
    }

    /// Makes `bytes` a hole: zeros in the edge blocks, whole blocks freed.
    fn punch(&self, inode: &Inode, bytes: Range<u64>) -> FsResult<()> {
        let bs = self.block_size;
        let first_whole = bytes.start.div_ceil(bs);
        let end_whole = bytes.end / bs;
        // Edge blocks that the range covers only in part keep their other bytes.
        // (Remainders by hand: `is_multiple_of` is newer than the workspace's MSRV.)
        let (head, tail) = (bytes.start % bs, bytes.end % bs);
        let mut edges = Vec::new();
        if head != 0 {
            edges.push(bytes.start / bs);
        }
        if tail != 0 && edges.last() != Some(&(bytes.end / bs)) {
            edges.push(bytes.end / bs);
        }
        for idx in edges {
            if !inode.meta().blocks.contains_key(&idx) {
                continue; // already a hole
            }
            let block = idx * bs;
            let from = (bytes.start.max(block) - block) as usize;
            let to = (bytes.end.min(block + bs) - block) as usize;
            self.cache.access(
                self,
                inode.ino,
                idx..idx + 1,
                |_| Fill::Write { from, to },
                |_, buf, dirty| {
                    buf[from..to].fill(0);
                    *dirty = true;
                    Ok(())
                },
            )?;
        }
        if first_whole >= end_whole {
            return Ok(());
        }
        let doomed: Vec<u64> = inode
            .meta()
            .blocks
            .range(first_whole..end_whole)
            .map(|(&i, _)| i)
            .collect();
        for run in runs(&doomed) {
            // Cached pages of doomed blocks go, dirty or not: nothing of theirs is
            // written back any more, and a later read of the hole finds zeros. (This
            // holds the inode's io lock exclusively: no access brings them back.)
            self.cache.invalidate_blocks(inode.ino, run);
        }
        let freed: Vec<_> = {
            let mut m = inode.meta();
            let freed = doomed
                .iter()
                .filter_map(|&i| m.remove_block(i))
                .map(|e| e.loc)
                .collect();
            for &i in &doomed {
                m.block_changed(i);
            }
            freed
        };
        self.changed(inode);
        self.free_later(freed);
        Ok(())
    }

    /// `lseek(2)` with `SEEK_DATA` or `SEEK_HOLE`. An offset at or past end of file
    /// has neither (ENXIO), as on local filesystems.
    pub fn seek(&self, ino: Ino, offset: u64, what: Seek) -> FsResult<u64> {
        let inode = self.ns.get(ino)?;
        let m = inode.meta();
        match m.attr.kind {
            FileKind::File => {}
            FileKind::Dir => return Err(FsError::IsDir),
            _ => return Err(FsError::Invalid),
        }
        let size = m.attr.size;
        if offset >= size {
            return Err(FsError::NoSuchOffset);
        }
        let bs = self.block_size;
        let at = offset / bs;
        match what {
            Seek::Data => {
                let first = m.blocks.range(at..).next().map(|(&i, _)| i * bs);
                match first {
                    Some(b) if b < size => Ok(b.max(offset)),
                    _ => Err(FsError::NoSuchOffset),
                }
            }
            Seek::Hole => {
                let mut idx = at;
                for (&i, _) in m.blocks.range(at..) {
                    if i != idx {
                        break;
                    }
                    idx += 1;
                }
                Ok((idx * bs).max(offset).min(size))
            }
        }
    }
}

/// Splits ascending block indices into ranges of consecutive ones.
fn runs(idxs: &[u64]) -> Vec<Range<u64>> {
    let mut out: Vec<Range<u64>> = Vec::new();
    for &i in idxs {
        match out.last_mut() {
            Some(r) if r.end == i => r.end = i + 1,
            _ => out.push(i..i + 1),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::runs;

    #[test]
    fn runs_split_at_gaps() {
        assert_eq!(runs(&[]), vec![]);
        assert_eq!(runs(&[3]), vec![3..4]);
        assert_eq!(runs(&[1, 2, 3, 7, 8, 10]), vec![1..4, 7..9, 10..11]);
    }
}
