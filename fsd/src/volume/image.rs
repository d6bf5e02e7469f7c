//! A volume's metadata as plain data: what replaying a checkpoint and a log gives,
//! before it becomes a live namespace, and what the offline check (`fsck`) walks.
//! Pure: no locks, no remote memory, so replay and every check are unit-tested.

use super::format::{Record, StoredAttr, StoredBlock, StoredCopy};
use std::collections::{BTreeMap, HashMap, HashSet};

/// The root directory's inode number.
pub const ROOT: u64 = 1;
const KIND_DIR: u8 = 2;
const KIND_SYMLINK: u8 = 3;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInode {
    pub attr: StoredAttr,
    pub target: Option<Vec<u8>>,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    pub blocks: BTreeMap<u64, StoredBlock>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ImageDir {
    pub parent: u64,
    /// name -> (inode, readdir cookie)
    pub entries: BTreeMap<Vec<u8>, (u64, u64)>,
    pub next_cookie: u64,
}

/// Readdir cookies 1 and 2 are "." and "..".
pub const FIRST_COOKIE: u64 = 3;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Image {
    pub inodes: HashMap<u64, ImageInode>,
    pub dirs: HashMap<u64, ImageDir>,
    pub next_ino: u64,
    /// Records that named something that did not exist (applied as far as they
    /// could be); a healthy log has none.
    pub anomalies: Vec<String>,
}

impl Image {
    /// Applies one record.
    pub fn apply(&mut self, r: Record) {
        match r {
            Record::Attr(a) => {
                self.next_ino = self.next_ino.max(a.ino.saturating_add(1));
                match self.inodes.get_mut(&a.ino) {
                    Some(i) => i.attr = a,
                    None => {
                        self.inodes.insert(
                            a.ino,
                            ImageInode {
                                attr: a,
                                target: None,
                                xattrs: Vec::new(),
                                blocks: BTreeMap::new(),
                            },
                        );
                    }
                }
            }
            Record::Target { ino, target } => match self.inodes.get_mut(&ino) {
                Some(i) => i.target = Some(target),
                None => self.anomaly(format!("target for missing inode {ino}")),
            },
            Record::Xattrs { ino, xattrs } => match self.inodes.get_mut(&ino) {
                Some(i) => i.xattrs = xattrs,
                None => self.anomaly(format!("xattrs for missing inode {ino}")),
            },
            Record::Block(b) => match self.inodes.get_mut(&b.ino) {
                Some(i) => {
                    i.blocks.insert(b.index, b);
                }
                None => self.anomaly(format!("block {} of missing inode {}", b.index, b.ino)),
            },
            Record::SumsStale { ino } => {
                if let Some(i) = self.inodes.get_mut(&ino) {
                    for b in i.blocks.values_mut() {
                        b.sums.clear();
                    }
                }
            }
            Record::BlockGone { ino, index } => {
                if let Some(i) = self.inodes.get_mut(&ino) {
                    i.blocks.remove(&index);
                }
            }
            Record::InodeGone { ino } => {
                self.inodes.remove(&ino);
                self.dirs.remove(&ino);
            }
            Record::Dir { ino, parent } => {
                let d = self.dirs.entry(ino).or_default();
                d.parent = parent;
                d.next_cookie = d.next_cookie.max(FIRST_COOKIE);
            }
            Record::DirAdd {
                dir,
                cookie,
                ino,
                name,
            } => match self.dirs.get_mut(&dir) {
                Some(d) => {
                    d.next_cookie = d.next_cookie.max(cookie.saturating_add(1));
                    d.entries.insert(name, (ino, cookie));
                }
                None => self.anomaly(format!("entry added to missing directory {dir}")),
            },
            Record::DirRemove { dir, name } => {
                let removed = self
                    .dirs
                    .get_mut(&dir)
                    .and_then(|d| d.entries.remove(&name));
                if removed.is_none() {
                    self.anomaly(format!(
                        "removal of missing entry {:?} from directory {dir}",
                        String::from_utf8_lossy(&name)
                    ));
                }
            }
            Record::DirNextCookie { dir, next } => match self.dirs.get_mut(&dir) {
                Some(d) => d.next_cookie = d.next_cookie.max(next),
                None => self.anomaly(format!("cookie of missing directory {dir}")),
            },
            Record::NextIno { next } => self.next_ino = self.next_ino.max(next),
        }
    }

    fn anomaly(&mut self, what: String) {
        if self.anomalies.len() < 100 {
            self.anomalies.push(what);
        }
    }

    /// Inodes no directory entry names (deleted while open when fsd stopped): their
    /// data is reclaimed when the volume is mounted.
    pub fn orphans(&self) -> Vec<u64> {
        let named: HashSet<u64> = self
            .dirs
            .values()
            .flat_map(|d| d.entries.values().map(|&(i, _)| i))
            .collect();
        let mut v: Vec<u64> = self
            .inodes
            .keys()
            .copied()
            .filter(|&i| i != ROOT && !named.contains(&i))
            .collect();
        v.sort_unstable();
        v
    }

    /// Drops orphans (see [`Image::orphans`]); returns how many.
    pub fn drop_orphans(&mut self) -> usize {
        let orphans = self.orphans();
        for ino in &orphans {
            self.inodes.remove(ino);
            self.dirs.remove(ino);
        }
        orphans.len()
    }

    /// Every copy of every block, with the inode and block index holding it.
    pub fn copies(&self) -> impl Iterator<Item = (u64, u64, StoredCopy)> + '_ {
        self.inodes.values().flat_map(|i| {
            i.blocks
                .values()
                .flat_map(|b| b.copies.iter().map(move |c| (b.ino, b.index, *c)))
        })
    }

    /// The namespace's own consistency: every problem found, in words.
    pub fn check(&self) -> Vec<String> {
        let mut problems = self.anomalies.clone();
        match self.inodes.get(&ROOT) {
            Some(r) if r.attr.kind == KIND_DIR && self.dirs.contains_key(&ROOT) => {}
            _ => problems.push("the root directory is missing".into()),
        }
        let mut links: HashMap<u64, u32> = HashMap::new();
        let mut subdirs: HashMap<u64, u32> = HashMap::new();
        for (&dir, d) in &self.dirs {
            if !self.inodes.contains_key(&dir) {
                problems.push(format!("directory table {dir} has no inode"));
            }
            for (name, &(ino, _)) in &d.entries {
                let name = String::from_utf8_lossy(name);
                match self.inodes.get(&ino) {
                    None => problems.push(format!("{dir}/{name} names missing inode {ino}")),
                    Some(i) if i.attr.kind == KIND_DIR => {
                        *subdirs.entry(dir).or_default() += 1;
                        match self.dirs.get(&ino) {
                            Some(sub) if sub.parent == dir => {}
                            Some(sub) => problems.push(format!(
                                "directory {ino} ({dir}/{name}) says its parent is {}",
                                sub.parent
                            )),
                            None => problems.push(format!("directory {ino} has no entries table")),
                        }
                        *links.entry(ino).or_default() += 1;
                    }
                    Some(_) => *links.entry(ino).or_default() += 1,
                }
            }
        }
        for (&ino, i) in &self.inodes {
            let is_dir = i.attr.kind == KIND_DIR;
            let want = if is_dir {
                if ino != ROOT && links.get(&ino).copied().unwrap_or(0) > 1 {
                    problems.push(format!("directory {ino} has several names"));
                }
                2 + subdirs.get(&ino).copied().unwrap_or(0)
            } else {
                links.get(&ino).copied().unwrap_or(0)
            };
            if want != 0 && i.attr.nlink != want {
                problems.push(format!(
                    "inode {ino} has link count {} but {want} links",
                    i.attr.nlink
                ));
            }
            if !is_dir && self.dirs.contains_key(&ino) {
                problems.push(format!("inode {ino} is not a directory but has entries"));
            }
            if i.attr.kind == KIND_SYMLINK && i.target.is_none() {
                problems.push(format!("symlink {ino} has no target"));
            }
            if ino >= self.next_ino {
                problems.push(format!("inode {ino} is not below the next inode number"));
            }
        }
        let mut seen: HashMap<(u16, u64), (u64, u64)> = HashMap::new();
        for (ino, index, c) in self.copies() {
            if let Some(&(o, oi)) = seen.get(&(c.slot, c.addr)) {
                problems.push(format!(
                    "block {index} of inode {ino} and block {oi} of inode {o} share the copy at \
                     {:#x} of member {}",
                    c.addr, c.slot
                ));
            } else {
                seen.insert((c.slot, c.addr), (ino, index));
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::format::Time;

    fn attr(ino: u64, kind: u8, nlink: u32) -> Record {
        Record::Attr(StoredAttr {
            ino,
            kind,
            perm: 0o755,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            size: 0,
            atime: Time::default(),
            mtime: Time::default(),
            ctime: Time::default(),
        })
    }

    fn root() -> Image {
        let mut im = Image::default();
        im.apply(attr(ROOT, KIND_DIR, 2));
        im.apply(Record::Dir {
            ino: ROOT,
            parent: ROOT,
        });
        im
    }

    fn add(im: &mut Image, dir: u64, name: &str, ino: u64, cookie: u64) {
        im.apply(Record::DirAdd {
            dir,
            cookie,
            ino,
            name: name.as_bytes().to_vec(),
        });
    }

    fn block(ino: u64, index: u64, addr: u64) -> Record {
        Record::Block(StoredBlock {
            ino,
            index,
            flags: 1,
            alloc_len: 4096,
            sums: Vec::new(),
            copies: vec![StoredCopy { slot: 0, addr }],
        })
    }

    #[test]
    fn a_consistent_tree_has_no_problems_and_cookies_continue() {
        let mut im = root();
        im.apply(attr(2, 1, 2));
        add(&mut im, ROOT, "a", 2, 3);
        add(&mut im, ROOT, "b", 2, 4);
        im.apply(attr(3, KIND_DIR, 2));
        im.apply(Record::Dir {
            ino: 3,
            parent: ROOT,
        });
        add(&mut im, ROOT, "d", 3, 5);
        im.apply(attr(ROOT, KIND_DIR, 3));
        im.apply(block(2, 0, 4096));
        assert_eq!(im.check(), Vec::<String>::new());
        assert_eq!(im.dirs[&ROOT].next_cookie, 6);
        assert_eq!(im.next_ino, 4);
        assert!(im.orphans().is_empty());
    }

    #[test]
    fn wrong_link_counts_shared_copies_and_dangling_entries_are_reported() {
        let mut im = root();
        im.apply(attr(2, 1, 3));
        add(&mut im, ROOT, "a", 2, 3);
        add(&mut im, ROOT, "ghost", 9, 4);
        im.apply(attr(4, 1, 1));
        add(&mut im, ROOT, "c", 4, 5);
        im.apply(block(2, 0, 8192));
        im.apply(block(4, 7, 8192));
        let p = im.check();
        assert!(p.iter().any(|s| s.contains("link count 3 but 1")), "{p:?}");
        assert!(p.iter().any(|s| s.contains("missing inode 9")), "{p:?}");
        assert!(p.iter().any(|s| s.contains("share the copy")), "{p:?}");
    }

    #[test]
    fn gone_inodes_vanish_and_unnamed_ones_are_orphans() {
        let mut im = root();
        im.apply(attr(2, 1, 0));
        im.apply(block(2, 0, 4096));
        im.apply(attr(3, 1, 1));
        add(&mut im, ROOT, "x", 3, 3);
        im.apply(Record::InodeGone { ino: 3 });
        assert!(!im.inodes.contains_key(&3));
        assert_eq!(im.orphans(), vec![2]);
        assert_eq!(im.drop_orphans(), 1);
        assert_eq!(im.copies().count(), 0);
        // The entry still names 3: a log that deletes an inode without its entry.
        assert!(im.check().iter().any(|s| s.contains("missing inode 3")));
    }

    #[test]
    fn records_about_missing_things_are_anomalies_not_panics() {
        let mut im = Image::default();
        im.apply(block(5, 0, 0));
        im.apply(Record::DirRemove {
            dir: 8,
            name: b"n".to_vec(),
        });
        im.apply(Record::Target {
            ino: 5,
            target: b"t".to_vec(),
        });
        assert_eq!(im.anomalies.len(), 3);
        assert!(im.check().len() >= 4, "root missing plus the anomalies");
    }
}
