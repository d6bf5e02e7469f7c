//! What has changed since the last commit, waiting to be written to the log.
//!
//! Two kinds of change reach the log:
//! - **structural** changes (create, link, unlink, rename, rmdir) are appended as one
//!   entry each, built while the namespace's tree lock is held exclusively, so an
//!   entry is atomic (a rename is never half replayed) and entries are in the order
//!   the changes happened;
//! - **everything else** (sizes, times, modes, xattrs, block maps) only marks its
//!   inode dirty ([`Journal::touch`], one atomic flag per inode, so the write path
//!   takes no shared lock once an inode is marked); a commit then writes each dirty
//!   inode's *current* state. Records are states, so the latest is always right.
//!
//! Blocks freed (truncate, hole punching, deleted files) wait here until the commit
//! that records them gone is durable: reused earlier, a crash could bring back a
//! file whose block now holds another file's bytes.
//!
//! It also counts how much the next checkpoint may have grown since its size was
//! last measured ([`Journal::growth`]): the volume keeps that below the room its
//! spares have (see "Room to grow" in `volume/mod.rs`).

use crate::inode::{Ino, Inode};
use crate::remote::BlockLoc;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::format::{encode_records, Record};

#[derive(Default)]
pub struct Journal {
    entries: Mutex<Vec<Vec<Record>>>,
    dirty: Mutex<HashSet<Ino>>,
    frees: Mutex<Vec<BlockLoc>>,
    /// Bytes the checkpoint may have grown by since it was last measured.
    growth: AtomicU64,
}

use rmemfs_common::sync::lock;

impl Journal {
    /// Appends one structural change (called under the tree lock, exclusively).
    /// One that adds a name (create, link, rename) counts whole as growth; one that
    /// only removes (unlink, rmdir) shrinks the checkpoint and counts nothing.
    pub fn append(&self, records: Vec<Record>) {
        if !records.is_empty() {
            if records.iter().any(|r| matches!(r, Record::DirAdd { .. })) {
                self.grew(encode_records(&records).len() as u64);
            }
            lock(&self.entries).push(records);
        }
    }

    /// Counts `bytes` more the checkpoint may hold (new blocks, extended attributes).
    pub fn grew(&self, bytes: u64) {
        self.growth.fetch_add(bytes, Ordering::Relaxed);
    }

    /// What the checkpoint may have grown by since [`Journal::measured`].
    pub fn growth(&self) -> u64 {
        self.growth.load(Ordering::Relaxed)
    }

    /// The checkpoint's size was just measured (called where the namespace was read
    /// for it, under the tree lock): growth counts from here.
    pub fn measured(&self) {
        self.growth.store(0, Ordering::Relaxed);
    }

    /// Marks `inode` as changed; called after the change is made.
    pub fn touch(&self, inode: &Inode) {
        if !inode.journal_dirty.swap(true, Ordering::AcqRel) {
            lock(&self.dirty).insert(inode.ino);
        }
    }

    /// Marks an inode that is no longer in the namespace (forgotten after its last
    /// name went): the next commit records it gone.
    pub fn forgotten(&self, ino: Ino) {
        lock(&self.dirty).insert(ino);
    }

    /// Blocks to give back once the next commit is durable.
    pub fn defer_free(&self, blocks: impl IntoIterator<Item = BlockLoc>) {
        lock(&self.frees).extend(blocks);
    }

    /// True when blocks wait for a commit to be given back.
    pub fn has_frees(&self) -> bool {
        !lock(&self.frees).is_empty()
    }

    /// Takes the deferred frees (first, before [`Journal::take`]: see the module docs).
    pub fn take_frees(&self) -> Vec<BlockLoc> {
        std::mem::take(&mut *lock(&self.frees))
    }

    /// Gives back frees whose commit failed: they wait for the next one.
    pub fn return_frees(&self, blocks: Vec<BlockLoc>) {
        lock(&self.frees).extend(blocks);
    }

    /// Takes the structural entries and the dirty inodes.
    pub fn take(&self) -> (Vec<Vec<Record>>, Vec<Ino>) {
        let entries = std::mem::take(&mut *lock(&self.entries));
        let mut dirty: Vec<Ino> = lock(&self.dirty).drain().collect();
        dirty.sort_unstable();
        (entries, dirty)
    }

    /// True when nothing waits to be committed.
    pub fn is_idle(&self) -> bool {
        lock(&self.entries).is_empty()
            && lock(&self.dirty).is_empty()
            && lock(&self.frees).is_empty()
    }
}
