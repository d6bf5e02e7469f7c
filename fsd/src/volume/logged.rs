//! What a volume needs of the namespace it keeps ([`Logged`]), and the block
//! records it has the namespace make ([`encode_block`]: only the volume knows the
//! member slots).
//!
//! The namespace builds on the volume: it logs its changes to the volume's
//! [`Journal`] and maps its inodes and directories onto the volume's records
//! (`format.rs`, `image.rs`). The volume sees the namespace only through this trait,
//! so the dependency goes one way, namespace -> volume, and the volume's code names
//! no type of the namespace's.

use super::format::{Record, StoredBlock, StoredCopy, BLOCK_WRITTEN};
use super::image::Image;
use super::journal::Journal;
use crate::inode::{BlockEntry, Ino, Inode};
use std::sync::Arc;

/// Turns a block's entry into its record (the volume knows the member slots); the
/// flag says whether its page sums go in (not while a write-back of the file may be
/// changing the pages: see `volume/mod.rs`, "Page sums in the log").
pub type BlockEncoder<'a> = &'a dyn Fn(Ino, u64, &BlockEntry, bool) -> Record;

/// A namespace kept on a volume (`crate::namespace::Namespace` is the one): made
/// fresh or from what a mount replayed, logging to the volume's journal, and giving
/// the records a commit or checkpoint writes.
pub trait Logged: Sized {
    /// A fresh volume's namespace: the root alone, owned by `uid:gid`.
    fn new_logged(uid: u32, gid: u32, journal: Arc<Journal>) -> Self;

    /// The namespace a replayed volume describes, logging to `journal` from now on.
    /// `block` turns each stored block into its entry (or drops it when no copy of it
    /// is left). Orphans must have been dropped from `image` first.
    fn from_image(
        image: Image,
        journal: Arc<Journal>,
        block: &dyn Fn(&StoredBlock) -> Option<BlockEntry>,
    ) -> Self;

    /// A commit's view: with structural changes held off, runs `take` (which takes the
    /// journal's entries and dirty inodes) and returns its entries and the records of
    /// the dirty inodes' current state.
    fn commit_records(
        &self,
        take: impl FnOnce() -> (Vec<Vec<Record>>, Vec<Ino>),
        encode: BlockEncoder<'_>,
    ) -> (Vec<Vec<Record>>, Vec<Record>);

    /// Every record of the whole namespace, for a checkpoint. Structural changes are
    /// held off meanwhile; `take` runs first under the same hold (it discards what the
    /// journal holds: the checkpoint covers it).
    fn checkpoint_records(&self, take: impl FnOnce(), encode: BlockEncoder<'_>) -> Vec<Record>;

    /// The records a checkpoint would hold now, to measure its size: nothing is
    /// marked committed. `measured` runs with structural changes held off.
    fn checkpoint_preview(&self, measured: impl FnOnce(), encode: BlockEncoder<'_>) -> Vec<Record>;

    /// Every inode (a mount zeroes what a crash left past the end of files).
    fn inodes(&self) -> Vec<Arc<Inode>>;
}

/// A block entry as stored: its copies on this generation's members only, and its
/// page sums when `with_sums`.
pub(super) fn encode_block(
    members: &[Option<(u32, u64)>],
    ino: Ino,
    index: u64,
    e: &BlockEntry,
    with_sums: bool,
) -> Record {
    let copies = e
        .loc
        .replicas()
        .iter()
        .filter(|r| {
            members
                .get(r.node as usize)
                .copied()
                .flatten()
                .is_some_and(|(epoch, _)| epoch == r.epoch)
        })
        .map(|r| StoredCopy {
            slot: r.node,
            addr: r.remote.addr,
        })
        .collect();
    Record::Block(StoredBlock {
        ino,
        index,
        flags: if e.written { BLOCK_WRITTEN } else { 0 },
        alloc_len: e.loc.bytes() as u32,
        sums: if with_sums && e.written {
            e.sums.stored()
        } else {
            Vec::new()
        },
        copies,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::{BlockLoc, Replica};
    use rmemfs_common::fabric::RemoteAddr;

    #[test]
    fn a_block_stores_only_the_copies_of_this_generations_members() {
        let members = vec![Some((0, 11)), None, Some((3, 13))];
        let rep = |node: u16, epoch: u32, addr: u64| Replica {
            node,
            epoch,
            remote: RemoteAddr { addr, rkey: 1 },
        };
        let e = BlockEntry {
            loc: BlockLoc::from_replicas(
                65536,
                [rep(0, 0, 4096), rep(1, 0, 8192), rep(2, 2, 0), rep(2, 3, 0)],
            ),
            written: true,
            sums: Default::default(),
        };
        let Record::Block(b) = encode_block(&members, 5, 9, &e, true) else {
            panic!("not a block record");
        };
        assert_eq!(b.flags, BLOCK_WRITTEN);
        // node 1 is no member; node 2's copy of epoch 2 is of an older link.
        assert_eq!(
            b.copies,
            vec![
                StoredCopy {
                    slot: 0,
                    addr: 4096
                },
                StoredCopy { slot: 2, addr: 0 }
            ]
        );
    }

    #[test]
    fn a_block_stores_its_known_page_sums_only_when_asked_and_when_written() {
        let loc = BlockLoc::from_replicas(
            16384,
            [Replica {
                node: 0,
                epoch: 0,
                remote: RemoteAddr { addr: 0, rkey: 1 },
            }],
        );
        let mut sums = crate::remote::sums::Sums::default();
        sums.record(&crate::remote::sums::written(4096, &[7u8; 4096]));
        let mut e = BlockEntry {
            loc,
            written: true,
            sums,
        };
        let members = vec![Some((0, 11))];
        let stored = |e: &BlockEntry, with: bool| match encode_block(&members, 5, 0, e, with) {
            Record::Block(b) => b.sums,
            _ => panic!("not a block record"),
        };
        let one = rmemfs_common::crc32c::crc32c(&[7u8; 4096]);
        assert_eq!(stored(&e, true), vec![None, Some(one)]);
        assert!(
            stored(&e, false).is_empty(),
            "no sums while a write-back may change the pages"
        );
        e.written = false;
        assert!(
            stored(&e, true).is_empty(),
            "an unwritten block has no bytes to sum"
        );
    }
}
