//! What nullfs remembers: one flat root directory of regular files, each with a
//! name, an inode number, a size, an owner, permission bits and times, and no data.
//! Pure bookkeeping, no FUSE: the glue in `fuse.rs` turns these results into replies.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::time::SystemTime;

/// The root directory; files get the numbers after it, never reused.
pub const ROOT_INO: u64 = 1;
/// Longest file name, as on most local filesystems.
pub const MAX_NAME: usize = 255;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    NotFound,
    NotDir,
    IsDir,
    Exists,
    NameTooLong,
    Invalid,
    TooLarge,
}

pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub kind: Kind,
    pub size: u64,
    /// Permission bits, including setuid, setgid and sticky (mode & 0o7777).
    pub perm: u16,
    /// 2 for the root, 1 for a file, 0 once unlinked.
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
}

/// The attribute changes of one `setattr`; times are already resolved (no "now").
#[derive(Debug, Default, Clone)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SystemTime>,
    pub mtime: Option<SystemTime>,
}

/// One `readdir` entry; `next` is the offset the kernel passes back to continue after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    pub next: u64,
    pub kind: Kind,
    pub name: OsString,
}

struct Node {
    attr: Attr,
    /// None once unlinked (and for the root).
    name: Option<OsString>,
    /// Lookups the kernel holds; an unlinked file lives on until they are forgotten,
    /// so a file removed while open still answers reads and writes.
    lookups: u64,
}

pub struct Namespace {
    names: HashMap<OsString, u64>,
    /// By inode number, so `readdir` can continue from a number across calls even
    /// when files come and go in between.
    nodes: BTreeMap<u64, Node>,
    next_ino: u64,
}

fn check_name(name: &OsStr) -> Result<()> {
    if name.len() > MAX_NAME {
        return Err(Error::NameTooLong);
    }
    if name.is_empty() || name == "." || name == ".." {
        return Err(Error::Invalid);
    }
    Ok(())
}

impl Namespace {
    /// An empty root directory owned by `uid:gid`.
    pub fn new(uid: u32, gid: u32, now: SystemTime) -> Namespace {
        let root = Attr {
            ino: ROOT_INO,
            kind: Kind::Dir,
            size: 0,
            perm: 0o755,
            nlink: 2,
            uid,
            gid,
            atime: now,
            mtime: now,
            ctime: now,
        };
        let mut nodes = BTreeMap::new();
        nodes.insert(
            ROOT_INO,
            Node {
                attr: root,
                name: None,
                lookups: 0,
            },
        );
        Namespace {
            names: HashMap::new(),
            nodes,
            next_ino: ROOT_INO + 1,
        }
    }

    /// Only the root holds names; any other parent is a file or gone.
    fn check_parent(&self, parent: u64) -> Result<()> {
        match self.nodes.get(&parent) {
            Some(_) if parent == ROOT_INO => Ok(()),
            Some(_) => Err(Error::NotDir),
            None => Err(Error::NotFound),
        }
    }

    fn node_mut(&mut self, ino: u64) -> Result<&mut Node> {
        self.nodes.get_mut(&ino).ok_or(Error::NotFound)
    }

    fn file_mut(&mut self, ino: u64) -> Result<&mut Node> {
        let node = self.node_mut(ino)?;
        match node.attr.kind {
            Kind::File => Ok(node),
            Kind::Dir => Err(Error::IsDir),
        }
    }

    /// The file `name` in `parent`; the kernel now holds one more lookup of it.
    pub fn lookup(&mut self, parent: u64, name: &OsStr) -> Result<Attr> {
        self.check_parent(parent)?;
        let ino = *self.names.get(name).ok_or(Error::NotFound)?;
        let node = self.node_mut(ino)?;
        node.lookups += 1;
        Ok(node.attr.clone())
    }

    /// The kernel dropped `n` lookups of `ino`.
    pub fn forget(&mut self, ino: u64, n: u64) {
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.lookups = node.lookups.saturating_sub(n);
            if node.lookups == 0 && node.name.is_none() && ino != ROOT_INO {
                self.nodes.remove(&ino);
            }
        }
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        self.nodes
            .get(&ino)
            .map(|n| n.attr.clone())
            .ok_or(Error::NotFound)
    }

    pub fn setattr(&mut self, ino: u64, req: &SetAttr, now: SystemTime) -> Result<Attr> {
        let node = self.node_mut(ino)?;
        if req.size.is_some() && node.attr.kind == Kind::Dir {
            return Err(Error::IsDir);
        }
        let a = &mut node.attr;
        if let Some(mode) = req.mode {
            a.perm = (mode & 0o7777) as u16;
        }
        if let Some(uid) = req.uid {
            a.uid = uid;
        }
        if let Some(gid) = req.gid {
            a.gid = gid;
        }
        if let Some(size) = req.size {
            a.size = size;
            a.mtime = now;
        }
        if let Some(t) = req.atime {
            a.atime = t;
        }
        if let Some(t) = req.mtime {
            a.mtime = t;
        }
        a.ctime = now;
        Ok(a.clone())
    }

    /// A new empty file `name` in `parent` (counts as a lookup, as the kernel sees it).
    pub fn create(
        &mut self,
        parent: u64,
        name: &OsStr,
        perm: u32,
        uid: u32,
        gid: u32,
        now: SystemTime,
    ) -> Result<Attr> {
        self.check_parent(parent)?;
        check_name(name)?;
        if self.names.contains_key(name) {
            return Err(Error::Exists);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        let attr = Attr {
            ino,
            kind: Kind::File,
            size: 0,
            perm: (perm & 0o7777) as u16,
            nlink: 1,
            uid,
            gid,
            atime: now,
            mtime: now,
            ctime: now,
        };
        self.names.insert(name.to_os_string(), ino);
        self.nodes.insert(
            ino,
            Node {
                attr: attr.clone(),
                name: Some(name.to_os_string()),
                lookups: 1,
            },
        );
        self.touch_root(now);
        Ok(attr)
    }

    pub fn unlink(&mut self, parent: u64, name: &OsStr, now: SystemTime) -> Result<()> {
        self.check_parent(parent)?;
        let ino = self.names.remove(name).ok_or(Error::NotFound)?;
        let node = self.node_mut(ino)?;
        node.name = None;
        node.attr.nlink = 0;
        node.attr.ctime = now;
        if node.lookups == 0 {
            self.nodes.remove(&ino);
        }
        self.touch_root(now);
        Ok(())
    }

    fn touch_root(&mut self, now: SystemTime) {
        if let Some(root) = self.nodes.get_mut(&ROOT_INO) {
            root.attr.mtime = now;
            root.attr.ctime = now;
        }
    }

    /// How many bytes a read of `size` at `offset` returns: up to the end of the file.
    pub fn read_len(&self, ino: u64, offset: u64, size: u32) -> Result<u32> {
        let node = self.nodes.get(&ino).ok_or(Error::NotFound)?;
        if node.attr.kind == Kind::Dir {
            return Err(Error::IsDir);
        }
        let left = node.attr.size.saturating_sub(offset);
        Ok(left.min(size as u64) as u32)
    }

    /// Records a write of `len` bytes at `offset` (the bytes themselves are dropped):
    /// the file grows to cover it. Returns the bytes written, all of them.
    pub fn write(&mut self, ino: u64, offset: u64, len: u32, now: SystemTime) -> Result<u32> {
        let node = self.file_mut(ino)?;
        let end = offset.checked_add(len as u64).ok_or(Error::TooLarge)?;
        if end > i64::MAX as u64 {
            return Err(Error::TooLarge);
        }
        node.attr.size = node.attr.size.max(end);
        node.attr.mtime = now;
        node.attr.ctime = now;
        Ok(len)
    }

    /// Records an fallocate of `len` bytes at `offset`: the file grows to cover them
    /// unless `keep_size` (there is nothing to reserve).
    pub fn allocate(
        &mut self,
        ino: u64,
        offset: u64,
        len: u64,
        keep_size: bool,
        now: SystemTime,
    ) -> Result<()> {
        let node = self.file_mut(ino)?;
        let end = offset.checked_add(len).ok_or(Error::TooLarge)?;
        if end > i64::MAX as u64 {
            return Err(Error::TooLarge);
        }
        if !keep_size && end > node.attr.size {
            node.attr.size = end;
            node.attr.mtime = now;
        }
        node.attr.ctime = now;
        Ok(())
    }

    /// Up to `max` entries of the root after `offset`: "." (offset 0), ".." (1), then
    /// the files in inode order, where a file's `next` is its inode number plus one.
    pub fn readdir(&self, ino: u64, offset: u64, max: usize) -> Result<Vec<DirEntry>> {
        match self.nodes.get(&ino).map(|n| n.attr.kind) {
            None => return Err(Error::NotFound),
            Some(Kind::File) => return Err(Error::NotDir),
            Some(Kind::Dir) => {}
        }
        let dots = [(".", 1), ("..", 2)].into_iter().skip(offset as usize);
        let mut out: Vec<DirEntry> = dots
            .map(|(name, next)| DirEntry {
                ino: ROOT_INO,
                next,
                kind: Kind::Dir,
                name: name.into(),
            })
            .collect();
        let files = self
            .nodes
            .range(offset.max(ROOT_INO + 1)..)
            .filter_map(|(&ino, n)| {
                Some(DirEntry {
                    ino,
                    next: ino + 1,
                    kind: Kind::File,
                    name: n.name.clone()?,
                })
            });
        out.extend(files);
        out.truncate(max);
        Ok(out)
    }

    /// Files with a name.
    pub fn file_count(&self) -> u64 {
        self.names.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns() -> Namespace {
        Namespace::new(0, 0, SystemTime::UNIX_EPOCH)
    }

    fn now() -> SystemTime {
        SystemTime::now()
    }

    fn name(s: &str) -> &OsStr {
        OsStr::new(s)
    }

    #[test]
    fn write_extends_size_and_never_shrinks() {
        let mut ns = ns();
        let a = ns.create(ROOT_INO, name("f"), 0o644, 1, 2, now()).unwrap();
        assert_eq!(a.size, 0);
        assert_eq!(ns.write(a.ino, 0, 4096, now()), Ok(4096));
        assert_eq!(ns.getattr(a.ino).unwrap().size, 4096);
        assert_eq!(ns.write(a.ino, 1 << 20, 10, now()), Ok(10));
        assert_eq!(ns.getattr(a.ino).unwrap().size, (1 << 20) + 10);
        assert_eq!(ns.write(a.ino, 0, 1, now()), Ok(1));
        assert_eq!(ns.getattr(a.ino).unwrap().size, (1 << 20) + 10);
        assert_eq!(ns.write(a.ino, u64::MAX, 1, now()), Err(Error::TooLarge));
        assert_eq!(ns.write(ROOT_INO, 0, 1, now()), Err(Error::IsDir));
    }

    #[test]
    fn allocate_extends_size_unless_kept() {
        let mut ns = ns();
        let ino = ns
            .create(ROOT_INO, name("f"), 0o644, 0, 0, now())
            .unwrap()
            .ino;
        ns.allocate(ino, 0, 1 << 20, true, now()).unwrap();
        assert_eq!(ns.getattr(ino).unwrap().size, 0);
        ns.allocate(ino, 4096, 1 << 20, false, now()).unwrap();
        assert_eq!(ns.getattr(ino).unwrap().size, 4096 + (1 << 20));
        ns.allocate(ino, 0, 10, false, now()).unwrap();
        assert_eq!(ns.getattr(ino).unwrap().size, 4096 + (1 << 20));
        let r = ns.allocate(ino, i64::MAX as u64, 1, false, now());
        assert_eq!(r, Err(Error::TooLarge));
    }

    #[test]
    fn read_is_short_at_end_of_file() {
        let mut ns = ns();
        let ino = ns
            .create(ROOT_INO, name("f"), 0o644, 0, 0, now())
            .unwrap()
            .ino;
        ns.write(ino, 0, 10_000, now()).unwrap();
        assert_eq!(ns.read_len(ino, 0, 4096), Ok(4096));
        assert_eq!(ns.read_len(ino, 8192, 4096), Ok(10_000 - 8192));
        assert_eq!(ns.read_len(ino, 10_000, 4096), Ok(0));
        assert_eq!(ns.read_len(ino, 20_000, 4096), Ok(0));
        assert_eq!(ns.read_len(99, 0, 1), Err(Error::NotFound));
    }

    #[test]
    fn setattr_keeps_what_it_is_given() {
        let mut ns = ns();
        let ino = ns
            .create(ROOT_INO, name("f"), 0o644, 0, 0, now())
            .unwrap()
            .ino;
        ns.write(ino, 0, 100, now()).unwrap();
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1234);
        let req = SetAttr {
            mode: Some(0o100600),
            uid: Some(7),
            gid: Some(8),
            size: Some(10),
            atime: Some(t),
            mtime: Some(t),
        };
        let a = ns.setattr(ino, &req, now()).unwrap();
        assert_eq!((a.perm, a.uid, a.gid, a.size), (0o600, 7, 8, 10));
        assert_eq!((a.atime, a.mtime), (t, t));
        assert_eq!(ns.getattr(ino).unwrap(), a);
        let trunc = SetAttr {
            size: Some(1),
            ..SetAttr::default()
        };
        assert_eq!(ns.setattr(ROOT_INO, &trunc, now()), Err(Error::IsDir));
    }

    #[test]
    fn create_checks_names_and_parent() {
        let mut ns = ns();
        let f = ns.create(ROOT_INO, name("f"), 0o644, 0, 0, now()).unwrap();
        let c = |ns: &mut Namespace, p, n: &str| ns.create(p, name(n), 0o644, 0, 0, now());
        assert_eq!(c(&mut ns, ROOT_INO, "f"), Err(Error::Exists));
        assert_eq!(c(&mut ns, f.ino, "g"), Err(Error::NotDir));
        assert_eq!(c(&mut ns, 99, "g"), Err(Error::NotFound));
        assert_eq!(c(&mut ns, ROOT_INO, ".."), Err(Error::Invalid));
        let long = "x".repeat(MAX_NAME + 1);
        assert_eq!(c(&mut ns, ROOT_INO, &long), Err(Error::NameTooLong));
        assert!(c(&mut ns, ROOT_INO, &long[..MAX_NAME]).is_ok());
    }

    #[test]
    fn unlink_removes_and_open_files_live_until_forgotten() {
        let mut ns = ns();
        let ino = ns
            .create(ROOT_INO, name("f"), 0o644, 0, 0, now())
            .unwrap()
            .ino;
        assert_eq!(ns.lookup(ROOT_INO, name("f")).unwrap().ino, ino);
        assert_eq!(ns.file_count(), 1);
        ns.unlink(ROOT_INO, name("f"), now()).unwrap();
        assert_eq!(ns.file_count(), 0);
        assert_eq!(ns.lookup(ROOT_INO, name("f")), Err(Error::NotFound));
        assert_eq!(ns.unlink(ROOT_INO, name("f"), now()), Err(Error::NotFound));
        // Created (1 lookup) and looked up (1 more): still there for open handles.
        assert_eq!(ns.write(ino, 0, 5, now()), Ok(5));
        assert_eq!(ns.getattr(ino).unwrap().nlink, 0);
        ns.forget(ino, 1);
        assert!(ns.getattr(ino).is_ok());
        ns.forget(ino, 1);
        assert_eq!(ns.getattr(ino), Err(Error::NotFound));
        // The root is never forgotten away.
        ns.forget(ROOT_INO, 10);
        assert!(ns.getattr(ROOT_INO).is_ok());
    }

    #[test]
    fn readdir_lists_dots_then_files_and_continues() {
        let mut ns = ns();
        let a = ns
            .create(ROOT_INO, name("a"), 0o644, 0, 0, now())
            .unwrap()
            .ino;
        let b = ns
            .create(ROOT_INO, name("b"), 0o644, 0, 0, now())
            .unwrap()
            .ino;
        let names = |v: &[DirEntry]| v.iter().map(|e| e.name.clone()).collect::<Vec<_>>();
        let all = ns.readdir(ROOT_INO, 0, 100).unwrap();
        assert_eq!(names(&all), [".", "..", "a", "b"]);
        // Continue after "a" while "b" is removed and "c" added in between.
        let after_a = all[2].next;
        ns.unlink(ROOT_INO, name("b"), now()).unwrap();
        ns.forget(b, 1);
        ns.create(ROOT_INO, name("c"), 0o644, 0, 0, now()).unwrap();
        assert_eq!(names(&ns.readdir(ROOT_INO, after_a, 100).unwrap()), ["c"]);
        assert_eq!(names(&ns.readdir(ROOT_INO, 1, 2).unwrap()), ["..", "a"]);
        assert_eq!(ns.readdir(a, 0, 10), Err(Error::NotDir));
    }
}
