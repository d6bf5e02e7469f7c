//! Changing a file's size (setattr with a size). Shrinking frees the blocks past the
//! new end, first dropped from the cache (waiting out any write-back of them), and
//! zeros the rest of the new last block, so that bytes past end-of-file stay zero
//! (the invariants in `fs.rs`); growing only changes the size (the new bytes are a
//! hole).

use super::{RmemFs, MAX_FILE_SIZE};
use crate::cache::Fill;
use crate::error::{FsError, FsResult};
use crate::inode::{FileKind, Inode};

impl RmemFs {
    pub(super) fn truncate(&self, inode: &Inode, size: u64) -> FsResult<()> {
        if size > MAX_FILE_SIZE {
            return Err(FsError::TooLarge);
        }
        let _io = inode.io_exclusive();
        let old = {
            let m = inode.meta();
            match m.attr.kind {
                FileKind::File => {}
                FileKind::Dir => return Err(FsError::IsDir),
                _ => return Err(FsError::Invalid),
            }
            m.attr.size
        };
        if size < old {
            let bs = self.block_size;
            let first_gone = size.div_ceil(bs);
            self.cache.invalidate(inode.ino, first_gone);
            let tail = size % bs;
            let last = size / bs;
            let last_exists = inode.meta().blocks.contains_key(&last);
            if tail != 0 && last_exists {
                // Keep "bytes past EOF in the last block are zero" true.
                let (from, to) = (tail as usize, bs as usize);
                self.cache.access(
                    self,
                    inode.ino,
                    last..last + 1,
                    |_| Fill::Write { from, to },
                    |_, buf, dirty| {
                        buf[tail as usize..].fill(0);
                        *dirty = true;
                        // The pages past the new end hold nothing any more.
                        self.shrink_block(inode, last, tail);
                        Ok(())
                    },
                )?;
                if self.volume.is_some() {
                    // On a volume the smaller size may be committed (by anyone's
                    // fsync) before this page is written back; after a crash the old
                    // bytes past the new end would then come back when the file
                    // grows again. So the zeros reach remote memory first.
                    self.cache.flush_inode(self, inode.ino)?;
                }
            }
            let freed = {
                let mut m = inode.meta();
                let freed = m.blocks.split_off(&first_gone);
                m.recount_allocated();
                for &i in freed.keys() {
                    m.block_changed(i);
                }
                m.attr.size = size;
                m.touch_mtime();
                freed
            };
            // Marked before the free is queued: the commit that releases the blocks
            // is then one that records them gone (see `volume/journal.rs`).
            self.changed(inode);
            self.free_later(freed.into_values().map(|e| e.loc));
        }
        let mut m = inode.meta();
        m.attr.size = size;
        m.touch_mtime();
        drop(m);
        self.changed(inode);
        Ok(())
    }
}
