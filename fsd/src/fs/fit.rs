//! Blocks whose copies hold only their first pages, and growing them.
//!
//! A block's copies hold its first `loc.bytes()` bytes, in whole 4 KiB pages (see
//! `remote/pool.rs`): a block is allocated up to the end of the write (or
//! reservation) that creates it, so a 300-byte file takes one page of remote memory
//! and a 70 KiB one a 64 KiB block and two pages, as on tmpfs. The bytes past the
//! copies are zeros that nobody wrote. A later write past them first moves the
//! block to larger copies:
//!
//! - where the pages right after every copy are free, the copies just grow into
//!   them (nothing moves: a file written or appended to in order usually grows so;
//!   a written block's new pages are zeroed in remote memory, one write);
//! - else a block whose content never reached remote memory (`written` false) just gets
//!   copies of the new size; the cache holds everything it has;
//! - a written block's content is copied over (read from the old copies, written to
//!   the new ones with zeros after it) and its copies double in size at least, so a file appended to in
//!   small steps after each write-back costs about one copy of itself, not one per
//!   append.
//!
//! Whoever grows a block holds its cached page's lock (or the inode's io lock
//! exclusively, with no page cached): no write-back or load of the block is under
//! way with the old copies, which are given back at once (after the next commit on
//! a volume, like any other freed block). A written block keeps its page sums
//! (`remote/sums.rs`) across a move, and its new pages get the sum of zeros.

use super::RmemFs;
use crate::cache::Fill;
use crate::error::FsResult;
use crate::inode::Inode;
use crate::remote::{pages_for, BlockLoc, RemoteError, Replica};
use std::ops::Range;

impl RmemFs {
    /// Makes block `index`'s copies hold at least its first `need` bytes. The caller
    /// holds the block's page lock (see the module comment). A block without copies
    /// is left alone (a hole).
    pub(super) fn fit_block(&self, inode: &Inode, index: u64, need: u64) -> FsResult<()> {
        let need = pages_for(need).min(self.block_size);
        let (old, written, expected) = {
            let m = inode.meta();
            match m.blocks.get(&index) {
                Some(e) if e.loc.bytes() < need => (
                    e.loc.clone(),
                    e.written,
                    e.sums.expected(0, e.loc.bytes() as usize),
                ),
                _ => return Ok(()),
            }
        };
        // Copies lost with a memnode are dropped here, as a write-back drops them;
        // copies out of reach are waited for when no other can be reached, and
        // dropped when one can.
        self.remote.await_reachable(&old);
        let mut live = old.clone();
        self.remote.prune_for_write(&mut live);
        if self.remote.live_copies(&live) == 0 {
            live = BlockLoc::from_replicas(live.bytes(), std::iter::empty());
        }
        if written && live.is_empty() {
            return Err(RemoteError::Lost.into());
        }
        let grown = match live.is_empty() {
            true => None,
            false => self.remote.grow_in_place(&live, need),
        };
        if let Some(grown) = grown {
            let grown = if written {
                // The pages grown into held someone else's bytes: zeros, as the
                // bytes past the old copies always read.
                let zeros = vec![0u8; (grown.bytes() - old.bytes()) as usize];
                match self.write_surviving(&grown, old.bytes() as usize, &zeros) {
                    Ok(kept) => kept,
                    Err(e) => {
                        self.remote.shrink_in_place(&grown, old.bytes());
                        return Err(e);
                    }
                }
            } else {
                grown
            };
            self.grew_pages(grown.bytes().saturating_sub(old.bytes()));
            self.replace_copies(inode, index, grown);
            return Ok(());
        }
        let size = if written {
            need.max(old.bytes() * 2).min(self.block_size)
        } else {
            need
        };
        let mut new = self.remote.alloc_block(size)?;
        if written {
            new = self.copy_block(&live, &expected, new)?;
        }
        self.grew_pages(new.bytes().saturating_sub(old.bytes()));
        if let Some(replaced) = self.replace_copies(inode, index, new) {
            self.free_later([replaced]);
        }
        Ok(())
    }

    /// Cuts block `index`'s copies to the pages holding its first `keep` bytes (a
    /// truncate ended the file inside it; the bytes past `keep` are zeros). The
    /// caller holds the block's page lock. The pages cut go back like freed blocks.
    pub(super) fn shrink_block(&self, inode: &Inode, index: u64, keep: u64) {
        let keep = pages_for(keep);
        let old = match inode.meta().blocks.get(&index) {
            Some(e) if e.loc.bytes() > keep => e.loc.clone(),
            _ => return,
        };
        let tail = old.replicas().iter().map(|r| Replica {
            remote: r.remote.offset(keep as usize),
            ..*r
        });
        let tail = BlockLoc::from_replicas(old.bytes() - keep, tail);
        let kept = BlockLoc::from_replicas(keep, old.replicas().iter().copied());
        self.replace_copies(inode, index, kept);
        self.free_later([tail]);
    }

    /// Gives block `index` the copies `loc`, holding its content and then zeros (or
    /// its first `loc.bytes()` bytes); returns the ones it had.
    fn replace_copies(&self, inode: &Inode, index: u64, loc: BlockLoc) -> Option<BlockLoc> {
        let replaced = {
            let mut m = inode.meta();
            let new_bytes = loc.bytes();
            let replaced = m.resize_block(index, loc);
            if let (Some(old), Some(e)) = (&replaced, m.blocks.get_mut(&index)) {
                if new_bytes > old.bytes() {
                    if e.written {
                        e.sums.record_zeros(old.bytes(), new_bytes);
                    }
                } else {
                    e.sums.truncate(new_bytes);
                }
            }
            m.block_changed(index);
            replaced
        };
        self.changed(inode);
        replaced
    }

    /// The content of `from` (all its bytes, checked against `expected`, then zeros)
    /// into the copies of `to`; returns `to` with the copies that took it (`to` is
    /// given back on failure).
    fn copy_block(
        &self,
        from: &BlockLoc,
        expected: &[Option<u32>],
        to: BlockLoc,
    ) -> FsResult<BlockLoc> {
        let mut buf = vec![0u8; to.bytes() as usize];
        let old = &mut buf[..from.bytes() as usize];
        if let Err(e) = self
            .remote
            .read_blocks(&mut [(from, 0, old, expected)])
            .remove(0)
        {
            self.remote.free_blocks([to]);
            return Err(e.into());
        }
        self.write_surviving(&to, 0, &buf)
            .inspect_err(|_| self.remote.free_blocks([to]))
    }

    /// Writes `data` at `offset` of every copy of `loc` and returns `loc` without the
    /// copies whose write failed (given back, like copies a write-back loses: the
    /// caller puts the result in the block map). Fails when no copy took it, giving
    /// nothing back.
    fn write_surviving(&self, loc: &BlockLoc, offset: usize, data: &[u8]) -> FsResult<BlockLoc> {
        let results = self.remote.write_copies(&[(loc, offset, data)]).remove(0);
        let failed = |r: &crate::remote::Replica| {
            let i = loc.replicas().iter().position(|x| x == r);
            i.is_some_and(|i| results[i].is_err())
        };
        let (mut kept, mut lost) = (loc.clone(), loc.clone());
        kept.retain(|r| !failed(r));
        lost.retain(failed);
        if kept.is_empty() {
            let first = results.iter().find_map(|r| r.clone().err());
            return Err(first.unwrap_or(RemoteError::Lost).into());
        }
        if !lost.is_empty() {
            self.remote.free_blocks([lost]);
        }
        Ok(kept)
    }

    /// Grows the blocks that bytes `range` touch and that already have smaller
    /// copies, so a reservation (fallocate) really holds the space it promises. The
    /// caller holds the inode's io lock exclusively.
    pub(super) fn fit_blocks(&self, inode: &Inode, range: Range<u64>) -> FsResult<()> {
        let bs = self.block_size;
        let short: Vec<(u64, u64)> = {
            let m = inode.meta();
            (range.start / bs..(range.end - 1) / bs + 1)
                .map(|i| (i, range.end.min((i + 1) * bs) - i * bs))
                .filter(|&(i, need)| {
                    m.blocks
                        .get(&i)
                        .is_some_and(|e| e.loc.bytes() < pages_for(need).min(bs))
                })
                .collect()
        };
        for (index, need) in short {
            // Through the cache, so the page (if any) is locked while the copies
            // change; loading it first is cheap next to a reservation's rarity.
            self.cache.access(
                self,
                inode.ino,
                index..index + 1,
                |_| Fill::Load,
                |i, _, _| self.fit_block(inode, i, need),
            )?;
        }
        Ok(())
    }
}
