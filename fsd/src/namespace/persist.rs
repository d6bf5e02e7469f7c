//! The namespace on a durable volume: the records its changes are logged as, the
//! whole-namespace records of a checkpoint, and the namespace rebuilt from a replayed
//! [`Image`]. The format itself is `volume/format.rs`; this is what maps fsd's
//! inodes and directories onto it. The volume reaches all of this through its
//! [`Logged`] trait, implemented here: it names no type of the namespace's, so the
//! namespace depends on the volume and not the other way round.

use super::{Dir, Namespace};
use crate::inode::{Attr, BlockEntry, FileKind, Ino, Inode, Meta, ROOT_INO};
use crate::volume::format::{Record, StoredAttr, Time};
use crate::volume::image::Image;
use crate::volume::journal::Journal;
use crate::volume::{BlockEncoder, Logged};
use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The records of `m`'s blocks `indexes` (a gone one as such); notes in `m` whether
/// the log now holds sums of them.
fn block_records(
    ino: Ino,
    m: &mut Meta,
    indexes: impl IntoIterator<Item = u64>,
    encode: BlockEncoder<'_>,
    out: &mut Vec<Record>,
) {
    let with_sums = m.writebacks == 0;
    for index in indexes {
        out.push(match m.blocks.get(&index) {
            Some(e) => {
                m.sums_logged |= with_sums && e.sums.known() > 0;
                encode(ino, index, e, with_sums)
            }
            None => Record::BlockGone { ino, index },
        });
    }
}

fn kind_code(k: FileKind) -> u8 {
    match k {
        FileKind::File => 1,
        FileKind::Dir => 2,
        FileKind::Symlink => 3,
        FileKind::Fifo => 4,
        FileKind::Socket => 5,
        FileKind::CharDevice => 6,
        FileKind::BlockDevice => 7,
    }
}

fn kind_of(code: u8) -> FileKind {
    match code {
        2 => FileKind::Dir,
        3 => FileKind::Symlink,
        4 => FileKind::Fifo,
        5 => FileKind::Socket,
        6 => FileKind::CharDevice,
        7 => FileKind::BlockDevice,
        _ => FileKind::File,
    }
}

fn time_of(t: SystemTime) -> Time {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Time {
            secs: d.as_secs() as i64,
            nanos: d.subsec_nanos(),
        },
        Err(e) => {
            // Before the epoch: whole seconds down, nanoseconds up.
            let d = e.duration();
            let (mut secs, mut nanos) = (-(d.as_secs() as i64), d.subsec_nanos());
            if nanos > 0 {
                secs -= 1;
                nanos = 1_000_000_000 - nanos;
            }
            Time { secs, nanos }
        }
    }
}

fn system_time(t: Time) -> SystemTime {
    let nanos = Duration::from_nanos(t.nanos as u64);
    if t.secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(t.secs as u64) + nanos
    } else {
        UNIX_EPOCH - Duration::from_secs(t.secs.unsigned_abs()) + nanos
    }
}

pub fn attr_record(a: &Attr) -> Record {
    Record::Attr(StoredAttr {
        ino: a.ino,
        kind: kind_code(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        size: a.size,
        atime: time_of(a.atime),
        mtime: time_of(a.mtime),
        ctime: time_of(a.ctime),
    })
}

fn attr_of(s: &StoredAttr) -> Attr {
    Attr {
        ino: s.ino,
        kind: kind_of(s.kind),
        size: s.size,
        allocated: 0,
        perm: s.perm & 0o7777,
        nlink: s.nlink,
        uid: s.uid,
        gid: s.gid,
        rdev: s.rdev,
        atime: system_time(s.atime),
        mtime: system_time(s.mtime),
        ctime: system_time(s.ctime),
    }
}

/// An inode's own records, without its blocks: attributes, target, xattrs.
pub fn inode_records(m: &Meta) -> Vec<Record> {
    let ino = m.attr.ino;
    let mut r = vec![attr_record(&m.attr)];
    if let Some(t) = &m.target {
        r.push(Record::Target {
            ino,
            target: t.as_os_str().as_bytes().to_vec(),
        });
    }
    r.push(Record::Xattrs {
        ino,
        xattrs: m
            .xattrs
            .iter()
            .map(|(n, v)| (n.as_bytes().to_vec(), v.clone()))
            .collect(),
    });
    r
}

pub fn dir_add(dir: Ino, cookie: u64, ino: Ino, name: &OsStr) -> Record {
    Record::DirAdd {
        dir,
        cookie,
        ino,
        name: name.as_bytes().to_vec(),
    }
}

pub fn dir_remove(dir: Ino, name: &OsStr) -> Record {
    Record::DirRemove {
        dir,
        name: name.as_bytes().to_vec(),
    }
}

impl Namespace {
    /// Appends one structural change's records to the journal, if there is one.
    /// Called with the tree lock held exclusively, after the change.
    pub(super) fn log(&self, build: impl FnOnce() -> Vec<Record>) {
        if let Some(j) = &self.journal {
            j.append(build());
        }
    }

    /// The attribute records of `inos` (each once; missing ones skipped).
    pub(super) fn attr_records(&self, inos: &[Ino]) -> Vec<Record> {
        let mut seen = Vec::new();
        let mut out = Vec::new();
        for &i in inos {
            if seen.contains(&i) {
                continue;
            }
            seen.push(i);
            if let Ok(inode) = self.get(i) {
                out.push(attr_record(&inode.meta().attr));
            }
        }
        out
    }

    /// The journal structural changes are logged to, if any.
    pub fn journal(&self) -> Option<&Arc<Journal>> {
        self.journal.as_ref()
    }

    /// The records of what changed in inode `ino` since its last commit: its state,
    /// and its changed blocks; or that it is gone.
    fn dirty_records(&self, ino: Ino, encode: BlockEncoder<'_>, out: &mut Vec<Record>) {
        let Ok(inode) = self.get(ino) else {
            out.push(Record::InodeGone { ino });
            return;
        };
        inode.journal_dirty.store(false, Ordering::Release);
        let mut m = inode.meta();
        if m.released {
            // A deleted file whose data went back: only its name's removal (logged
            // already) and its forgetting matter.
            if let Some(d) = &mut m.dirty_blocks {
                d.clear();
            }
            out.push(attr_record(&m.attr));
            return;
        }
        out.extend(inode_records(&m));
        let changed = m.dirty_blocks.as_mut().map(std::mem::take);
        block_records(ino, &mut m, changed.into_iter().flatten(), encode, out);
    }

    /// The records of every inode and directory in `tree`; with `checkpoint`, each
    /// inode is marked as committed by them (its dirty flags cleared).
    fn all_records(
        &self,
        tree: &HashMap<Ino, Dir>,
        encode: BlockEncoder<'_>,
        checkpoint: bool,
    ) -> Vec<Record> {
        let mut out = vec![Record::NextIno {
            next: self.next_ino.load(Ordering::Relaxed),
        }];
        let mut inodes: Vec<Arc<Inode>> = self.all();
        inodes.sort_unstable_by_key(|i| i.ino);
        for inode in inodes {
            let mut m = inode.meta();
            if checkpoint {
                inode.journal_dirty.store(false, Ordering::Release);
                if let Some(d) = &mut m.dirty_blocks {
                    d.clear();
                }
            }
            if m.attr.nlink == 0 && inode.ino != ROOT_INO {
                continue; // deleted, only still open: nothing to bring back
            }
            out.extend(inode_records(&m));
            let indexes: Vec<u64> = m.blocks.keys().copied().collect();
            if checkpoint {
                // A checkpoint replaces the log: sums in it are all that stands.
                m.sums_logged = false;
                block_records(inode.ino, &mut m, indexes, encode, &mut out);
            } else {
                let with_sums = m.writebacks == 0;
                out.extend(
                    indexes
                        .iter()
                        .map(|i| encode(inode.ino, *i, &m.blocks[i], with_sums)),
                );
            }
        }
        let mut dirs: Vec<(&Ino, &Dir)> = tree.iter().collect();
        dirs.sort_unstable_by_key(|(i, _)| **i);
        for (&ino, d) in dirs {
            out.push(Record::Dir {
                ino,
                parent: d.parent,
            });
            for (&cookie, name) in &d.by_cookie {
                if let Some(&(child, _)) = d.entries.get(name) {
                    out.push(dir_add(ino, cookie, child, name));
                }
            }
            out.push(Record::DirNextCookie {
                dir: ino,
                next: d.next_cookie,
            });
        }
        out
    }
}

impl Logged for Namespace {
    fn new_logged(uid: u32, gid: u32, journal: Arc<Journal>) -> Namespace {
        let mut ns = Namespace::new(uid, gid);
        if let Ok(root) = ns.get(ROOT_INO) {
            root.meta().dirty_blocks = Some(Default::default());
        }
        ns.journal = Some(journal);
        ns
    }

    fn from_image(
        image: Image,
        journal: Arc<Journal>,
        block: &dyn Fn(&crate::volume::format::StoredBlock) -> Option<BlockEntry>,
    ) -> Namespace {
        let mut inodes = HashMap::new();
        let mut max_ino = ROOT_INO;
        for (ino, i) in image.inodes {
            max_ino = max_ino.max(ino);
            let target = i.target.map(|t| PathBuf::from(OsString::from_vec(t)));
            let inode = Inode::new(attr_of(&i.attr), target);
            {
                let mut m = inode.meta();
                m.xattrs = i
                    .xattrs
                    .into_iter()
                    .map(|(n, v)| (OsString::from_vec(n), v))
                    .collect();
                m.blocks = i
                    .blocks
                    .values()
                    .filter_map(|b| Some((b.index, block(b)?)))
                    .collect::<BTreeMap<_, _>>();
                m.recount_allocated();
                m.dirty_blocks = Some(Default::default());
                m.sums_logged = m.blocks.values().any(|e| e.sums.known() > 0);
            }
            inodes.insert(ino, Arc::new(inode));
        }
        let mut tree = HashMap::new();
        for (ino, d) in image.dirs {
            let mut dir = Dir::new(d.parent);
            for (name, (child, cookie)) in d.entries {
                let name = OsString::from_vec(name);
                dir.by_cookie.insert(cookie, name.clone());
                dir.entries.insert(name, (child, cookie));
                dir.next_cookie = dir.next_cookie.max(cookie.saturating_add(1));
            }
            dir.next_cookie = dir.next_cookie.max(d.next_cookie);
            tree.insert(ino, dir);
        }
        Namespace {
            tree: RwLock::new(tree),
            inodes: RwLock::new(inodes),
            next_ino: AtomicU64::new(image.next_ino.max(max_ino.saturating_add(1))),
            journal: Some(journal),
        }
    }

    fn commit_records(
        &self,
        take: impl FnOnce() -> (Vec<Vec<Record>>, Vec<Ino>),
        encode: BlockEncoder<'_>,
    ) -> (Vec<Vec<Record>>, Vec<Record>) {
        let _tree = self.tree_read();
        let (entries, dirty) = take();
        let mut records = Vec::new();
        for ino in dirty {
            self.dirty_records(ino, encode, &mut records);
        }
        (entries, records)
    }

    fn checkpoint_records(&self, take: impl FnOnce(), encode: BlockEncoder<'_>) -> Vec<Record> {
        let tree = self.tree_write();
        take();
        self.all_records(&tree, encode, true)
    }

    fn checkpoint_preview(&self, measured: impl FnOnce(), encode: BlockEncoder<'_>) -> Vec<Record> {
        let tree = self.tree_read();
        measured();
        self.all_records(&tree, encode, false)
    }

    fn inodes(&self) -> Vec<Arc<Inode>> {
        self.all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_before_and_after_the_epoch_survive_the_round_trip() {
        for t in [
            UNIX_EPOCH,
            UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789),
            UNIX_EPOCH - Duration::new(5, 250_000_000),
            UNIX_EPOCH - Duration::from_secs(86_400),
        ] {
            assert_eq!(system_time(time_of(t)), t);
        }
    }

    #[test]
    fn every_kind_survives_the_round_trip() {
        for k in [
            FileKind::File,
            FileKind::Dir,
            FileKind::Symlink,
            FileKind::Fifo,
            FileKind::Socket,
            FileKind::CharDevice,
            FileKind::BlockDevice,
        ] {
            assert_eq!(kind_of(kind_code(k)), k);
        }
    }
}
