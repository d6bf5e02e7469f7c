//! The namespace: which inodes exist and how directories name them.
//!
//! - `inodes` maps numbers to live inodes. Its lock is innermost: nothing else is ever
//!   locked while it is held.
//! - `tree` holds every directory's entries. Structural changes (create, link, unlink,
//!   rename) take it exclusively, which also makes rename's "not into its own subtree"
//!   check race-free; lookups and readdir take it shared. The data path never takes it.
//!
//! Lock order: tree -> inode meta -> inodes map.
//!
//! Directory entries carry a cookie, allocated once per entry and never reused within
//! the directory, that serves as the readdir offset: a listing that continues after
//! entries were removed or added neither skips nor repeats the others. An entry
//! renamed within its directory, or replacing another, takes over a cookie it
//! already had (its own, or the replaced one's), so renames under way cannot make a
//! listing go on forever.

use crate::error::{FsError, FsResult};
use crate::inode::{Attr, FileKind, Ino, Inode, ROOT_INO};
use crate::volume::format::Record;
use crate::volume::journal::Journal;
use rmemfs_common::sync::{read, write};
use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

/// Longest name in a directory, as on local filesystems.
pub const MAX_NAME: usize = 255;
/// Readdir offsets 1 and 2 are "." and ".."; entry cookies start after them.
const FIRST_COOKIE: u64 = 3;

#[derive(Debug)]
struct Dir {
    parent: Ino,
    entries: HashMap<OsString, (Ino, u64)>,
    by_cookie: BTreeMap<u64, OsString>,
    next_cookie: u64,
}

impl Dir {
    fn new(parent: Ino) -> Dir {
        Dir {
            parent,
            entries: HashMap::new(),
            by_cookie: BTreeMap::new(),
            next_cookie: FIRST_COOKIE,
        }
    }

    /// Adds an entry; returns its cookie.
    fn insert(&mut self, name: OsString, ino: Ino) -> u64 {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        self.insert_at(cookie, name, ino);
        cookie
    }

    /// Adds an entry with cookie `cookie` (one this directory gave out and no
    /// longer uses).
    fn insert_at(&mut self, cookie: u64, name: OsString, ino: Ino) {
        self.by_cookie.insert(cookie, name.clone());
        self.entries.insert(name, (ino, cookie));
    }

    fn cookie_of(&self, name: &OsStr) -> Option<u64> {
        self.entries.get(name).map(|&(_, c)| c)
    }

    fn remove(&mut self, name: &OsStr) -> Option<Ino> {
        let (ino, cookie) = self.entries.remove(name)?;
        self.by_cookie.remove(&cookie);
        Some(ino)
    }

    fn get(&self, name: &OsStr) -> Option<Ino> {
        self.entries.get(name).map(|&(i, _)| i)
    }
}

/// One readdir entry.
#[derive(Debug, Clone)]
pub struct DirEntry {
    /// The offset to pass to continue after this entry.
    pub offset: u64,
    pub ino: Ino,
    pub kind: FileKind,
    pub name: OsString,
}

/// What a new inode should look like.
#[derive(Debug, Clone)]
pub struct NewInode {
    pub kind: FileKind,
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub target: Option<PathBuf>,
    /// Extended attributes it starts with (ACLs inherited from its directory).
    pub xattrs: BTreeMap<OsString, Vec<u8>>,
}

/// How to rename.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RenameMode {
    /// Fail with EEXIST instead of replacing an existing target.
    pub no_replace: bool,
    /// Swap source and target atomically; both must exist.
    pub exchange: bool,
    /// RENAME_WHITEOUT: leave a whiteout owned by this (uid, gid) where the source
    /// was (see [`Namespace::whiteout_locked`]).
    pub whiteout: Option<(u32, u32)>,
}

pub struct Namespace {
    tree: RwLock<HashMap<Ino, Dir>>,
    inodes: RwLock<HashMap<Ino, Arc<Inode>>>,
    next_ino: AtomicU64,
    /// On a durable volume: where structural changes are logged (`persist.rs`).
    journal: Option<Arc<Journal>>,
}

fn check_name(name: &OsStr) -> FsResult<()> {
    if name.len() > MAX_NAME {
        return Err(FsError::NameTooLong);
    }
    if name.is_empty() || name == "." || name == ".." {
        return Err(FsError::Invalid);
    }
    Ok(())
}

/// The attributes of an inode made now: empty, every time now, and a link per name
/// (a directory's own "." too).
fn fresh_attr(ino: Ino, kind: FileKind, perm: u16, (uid, gid): (u32, u32), rdev: u32) -> Attr {
    let now = SystemTime::now();
    Attr {
        ino,
        kind,
        size: 0,
        allocated: 0,
        perm: perm & 0o7777,
        nlink: if kind == FileKind::Dir { 2 } else { 1 },
        uid,
        gid,
        rdev,
        atime: now,
        mtime: now,
        ctime: now,
    }
}

impl Namespace {
    /// A namespace holding only the root directory, owned by `uid:gid`.
    pub fn new(uid: u32, gid: u32) -> Namespace {
        let root = Inode::new(
            fresh_attr(ROOT_INO, FileKind::Dir, 0o755, (uid, gid), 0),
            None,
        );
        let mut tree = HashMap::new();
        tree.insert(ROOT_INO, Dir::new(ROOT_INO));
        let mut inodes = HashMap::new();
        inodes.insert(ROOT_INO, Arc::new(root));
        Namespace {
            tree: RwLock::new(tree),
            inodes: RwLock::new(inodes),
            next_ino: AtomicU64::new(ROOT_INO + 1),
            journal: None,
        }
    }

    fn tree_read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<Ino, Dir>> {
        read(&self.tree)
    }

    fn tree_write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<Ino, Dir>> {
        write(&self.tree)
    }

    /// The inode numbered `ino`, if it exists.
    pub fn get(&self, ino: Ino) -> FsResult<Arc<Inode>> {
        read(&self.inodes)
            .get(&ino)
            .cloned()
            .ok_or(FsError::NotFound)
    }

    /// Looks `name` up in `parent` and counts a kernel reference to the result.
    ///
    /// The kernel never resolves "." or ".." here for a path; it asks for them to
    /// open a file handle whose inode it no longer has cached (FUSE export support):
    /// "." of any inode is the inode itself while it has a name (a handle to an
    /// unlinked file is stale), ".." of a directory its parent. Inode numbers are
    /// never reused (on a volume not even across mounts), so generation 0 names
    /// every inode for good.
    pub fn lookup(&self, parent: Ino, name: &OsStr) -> FsResult<Arc<Inode>> {
        if name.len() > MAX_NAME {
            return Err(FsError::NameTooLong);
        }
        let tree = self.tree_read();
        let ino = match name.as_encoded_bytes() {
            b"." => {
                let inode = self.get(parent).map_err(|_| FsError::NotFound)?;
                if inode.meta().attr.nlink == 0 {
                    return Err(FsError::NotFound);
                }
                parent
            }
            b".." => tree.get(&parent).ok_or(FsError::NotDir)?.parent,
            _ => {
                let dir = tree.get(&parent).ok_or(FsError::NotDir)?;
                dir.get(name).ok_or(FsError::NotFound)?
            }
        };
        let inode = self.get(ino)?;
        inode.meta().lookups += 1;
        Ok(inode)
    }

    /// Creates `name` in `parent`; the result carries one kernel reference.
    pub fn create(&self, parent: Ino, name: &OsStr, new: NewInode) -> FsResult<Arc<Inode>> {
        check_name(name)?;
        let mut tree = self.tree_write();
        let dir = tree.get(&parent).ok_or(FsError::NotDir)?;
        if dir.get(name).is_some() {
            return Err(FsError::Exists);
        }
        let parent_inode = self.get(parent)?;
        let ino = self.next_ino.fetch_add(1, Ordering::Relaxed);
        let is_dir = new.kind == FileKind::Dir;
        let mut attr = fresh_attr(ino, new.kind, new.perm, (new.uid, new.gid), new.rdev);
        attr.size = new
            .target
            .as_ref()
            .map_or(0, |t| t.as_os_str().len() as u64);
        let inode = Arc::new(Inode::new(attr, new.target));
        {
            let mut m = inode.meta();
            m.lookups = 1;
            m.xattrs = new.xattrs;
            if self.journal.is_some() {
                m.dirty_blocks = Some(Default::default());
            }
        }
        if is_dir {
            tree.insert(ino, Dir::new(parent));
        }
        let cookie = tree
            .get_mut(&parent)
            .map_or(0, |d| d.insert(name.to_os_string(), ino));
        {
            let mut pm = parent_inode.meta();
            if is_dir {
                pm.attr.nlink += 1;
            }
            pm.touch_mtime();
        }
        self.log(|| {
            let mut r = persist::inode_records(&inode.meta());
            if is_dir {
                r.push(Record::Dir { ino, parent });
            }
            r.push(persist::dir_add(parent, cookie, ino, name));
            r.push(persist::attr_record(&parent_inode.meta().attr));
            r
        });
        write(&self.inodes).insert(ino, inode.clone());
        Ok(inode)
    }

    /// Adds a hard link to `ino` as `name` in `parent`; counts a kernel reference.
    pub fn link(&self, ino: Ino, parent: Ino, name: &OsStr) -> FsResult<Arc<Inode>> {
        check_name(name)?;
        let mut tree = self.tree_write();
        let dir = tree.get_mut(&parent).ok_or(FsError::NotDir)?;
        if dir.get(name).is_some() {
            return Err(FsError::Exists);
        }
        let inode = self.get(ino)?;
        {
            let mut m = inode.meta();
            if m.attr.kind == FileKind::Dir {
                return Err(FsError::NotPermitted);
            }
            if m.attr.nlink == 0 {
                return Err(FsError::NotFound);
            }
            if m.attr.nlink >= u32::MAX - 1 {
                return Err(FsError::TooManyLinks);
            }
            m.attr.nlink += 1;
            m.lookups += 1;
            m.touch_ctime();
        }
        let cookie = dir.insert(name.to_os_string(), ino);
        let parent_inode = self.get(parent)?;
        parent_inode.meta().touch_mtime();
        self.log(|| {
            vec![
                persist::dir_add(parent, cookie, ino, name),
                persist::attr_record(&inode.meta().attr),
                persist::attr_record(&parent_inode.meta().attr),
            ]
        });
        Ok(inode)
    }

    /// Removes the non-directory `name` from `parent`. Returns the inode, whose link
    /// count has dropped; the caller releases its data if nothing refers to it.
    pub fn unlink(&self, parent: Ino, name: &OsStr) -> FsResult<Arc<Inode>> {
        let mut tree = self.tree_write();
        let dir = tree.get(&parent).ok_or(FsError::NotDir)?;
        let ino = dir.get(name).ok_or(FsError::NotFound)?;
        if tree.contains_key(&ino) {
            return Err(FsError::IsDir);
        }
        let inode = self.get(ino)?;
        if let Some(d) = tree.get_mut(&parent) {
            d.remove(name);
        }
        {
            let mut m = inode.meta();
            m.attr.nlink = m.attr.nlink.saturating_sub(1);
            m.touch_ctime();
        }
        let parent_inode = self.get(parent)?;
        parent_inode.meta().touch_mtime();
        self.log(|| {
            vec![
                persist::dir_remove(parent, name),
                persist::attr_record(&inode.meta().attr),
                persist::attr_record(&parent_inode.meta().attr),
            ]
        });
        Ok(inode)
    }

    /// Removes the empty directory `name` from `parent`.
    pub fn rmdir(&self, parent: Ino, name: &OsStr) -> FsResult<Arc<Inode>> {
        let mut tree = self.tree_write();
        let dir = tree.get(&parent).ok_or(FsError::NotDir)?;
        let ino = dir.get(name).ok_or(FsError::NotFound)?;
        let victim = tree.get(&ino).ok_or(FsError::NotDir)?;
        if !victim.entries.is_empty() {
            return Err(FsError::NotEmpty);
        }
        let inode = self.get(ino)?;
        tree.remove(&ino);
        if let Some(d) = tree.get_mut(&parent) {
            d.remove(name);
        }
        {
            let mut m = inode.meta();
            m.attr.nlink = 0;
            m.touch_ctime();
        }
        let parent_inode = self.get(parent)?;
        let mut pm = parent_inode.meta();
        pm.attr.nlink = pm.attr.nlink.saturating_sub(1);
        pm.touch_mtime();
        drop(pm);
        self.log(|| {
            vec![
                persist::dir_remove(parent, name),
                Record::InodeGone { ino },
                persist::attr_record(&parent_inode.meta().attr),
            ]
        });
        Ok(inode)
    }

    /// True if `ancestor` is `ino` or one of its ancestors.
    fn is_ancestor(tree: &HashMap<Ino, Dir>, ancestor: Ino, mut ino: Ino) -> bool {
        loop {
            if ino == ancestor {
                return true;
            }
            match tree.get(&ino) {
                Some(d) if d.parent != ino => ino = d.parent,
                _ => return false,
            }
        }
    }

    /// Renames `parent/name` to `new_parent/new_name`. Returns an inode whose last
    /// link was replaced away, for the caller to release.
    pub fn rename(
        &self,
        parent: Ino,
        name: &OsStr,
        new_parent: Ino,
        new_name: &OsStr,
        mode: RenameMode,
    ) -> FsResult<Option<Arc<Inode>>> {
        check_name(new_name)?;
        let mut tree = self.tree_write();
        let src = tree
            .get(&parent)
            .ok_or(FsError::NotDir)?
            .get(name)
            .ok_or(FsError::NotFound)?;
        let dst = tree.get(&new_parent).ok_or(FsError::NotDir)?.get(new_name);
        let src_is_dir = tree.contains_key(&src);
        // A directory cannot move below itself.
        if src_is_dir && Self::is_ancestor(&tree, src, new_parent) {
            return Err(FsError::Invalid);
        }
        if mode.exchange {
            if mode.whiteout.is_some() {
                return Err(FsError::Invalid);
            }
            let dst = dst.ok_or(FsError::NotFound)?;
            let dst_is_dir = tree.contains_key(&dst);
            if dst_is_dir && Self::is_ancestor(&tree, dst, parent) {
                return Err(FsError::Invalid);
            }
            self.swap_entries(&mut tree, (parent, name, src), (new_parent, new_name, dst))?;
            return Ok(None);
        }
        let mut replaced = None;
        // A name that is replaced keeps its place in the directory: a listing under
        // way neither misses it nor returns it twice.
        let mut reused_cookie = None;
        if let Some(dst) = dst {
            if mode.no_replace {
                return Err(FsError::Exists);
            }
            if dst == src {
                return Ok(None); // two links to the same inode: nothing to do
            }
            match (src_is_dir, tree.get(&dst)) {
                (true, None) => return Err(FsError::NotDir),
                (false, Some(_)) => return Err(FsError::IsDir),
                (true, Some(d)) if !d.entries.is_empty() => return Err(FsError::NotEmpty),
                _ => {}
            }
            let dst_inode = self.get(dst)?;
            if let Some(d) = tree.get_mut(&new_parent) {
                reused_cookie = d.cookie_of(new_name);
                d.remove(new_name);
            }
            {
                let mut m = dst_inode.meta();
                if src_is_dir {
                    m.attr.nlink = 0;
                } else {
                    m.attr.nlink = m.attr.nlink.saturating_sub(1);
                }
                m.touch_ctime();
            }
            if src_is_dir {
                tree.remove(&dst);
                // The replaced directory's ".." no longer counts against new_parent.
                let np = self.get(new_parent)?;
                let mut m = np.meta();
                m.attr.nlink = m.attr.nlink.saturating_sub(1);
            }
            replaced = Some(dst_inode);
        }
        if let Some(d) = tree.get_mut(&parent) {
            // Renamed within its directory, an entry keeps its place too: a listing
            // that renames each entry it reads (and back) must come to an end.
            if parent == new_parent && reused_cookie.is_none() {
                reused_cookie = d.cookie_of(name);
            }
            d.remove(name);
        }
        let cookie = tree
            .get_mut(&new_parent)
            .map_or(0, |d| match reused_cookie {
                Some(c) => {
                    d.insert_at(c, new_name.to_os_string(), src);
                    c
                }
                None => d.insert(new_name.to_os_string(), src),
            });
        if src_is_dir {
            if let Some(d) = tree.get_mut(&src) {
                d.parent = new_parent;
            }
            if parent != new_parent {
                let old = self.get(parent)?;
                let mut m = old.meta();
                m.attr.nlink = m.attr.nlink.saturating_sub(1);
                drop(m);
                self.get(new_parent)?.meta().attr.nlink += 1;
            }
        }
        self.get(src)?.meta().touch_ctime();
        self.get(parent)?.meta().touch_mtime();
        if new_parent != parent {
            self.get(new_parent)?.meta().touch_mtime();
        }
        let whiteout = mode
            .whiteout
            .map(|owner| self.whiteout_locked(&mut tree, parent, name, owner));
        self.log(|| {
            let mut r = vec![persist::dir_remove(parent, name)];
            if let Some(dst) = &replaced {
                r.push(persist::dir_remove(new_parent, new_name));
                r.push(if src_is_dir {
                    Record::InodeGone { ino: dst.ino }
                } else {
                    persist::attr_record(&dst.meta().attr)
                });
            }
            r.push(persist::dir_add(new_parent, cookie, src, new_name));
            if src_is_dir {
                r.push(Record::Dir {
                    ino: src,
                    parent: new_parent,
                });
            }
            if let Some((w, w_cookie)) = &whiteout {
                r.extend(persist::inode_records(&w.meta()));
                r.push(persist::dir_add(parent, *w_cookie, w.ino, name));
            }
            r.extend(self.attr_records(&[src, parent, new_parent]));
            r
        });
        Ok(replaced)
    }

    /// A whiteout, the character device 0:0 that overlayfs takes for "deleted in the
    /// layers below", as `name` in `parent` (RENAME_WHITEOUT leaves one where the
    /// source was), under the tree lock the caller holds. The kernel gets no
    /// reference to it, so it counts no lookup. Returns it and its cookie.
    fn whiteout_locked(
        &self,
        tree: &mut HashMap<Ino, Dir>,
        parent: Ino,
        name: &OsStr,
        owner: (u32, u32),
    ) -> (Arc<Inode>, u64) {
        let ino = self.next_ino.fetch_add(1, Ordering::Relaxed);
        let attr = fresh_attr(ino, FileKind::CharDevice, 0, owner, 0);
        let inode = Arc::new(Inode::new(attr, None));
        if self.journal.is_some() {
            inode.meta().dirty_blocks = Some(Default::default());
        }
        let cookie = tree
            .get_mut(&parent)
            .map_or(0, |d| d.insert(name.to_os_string(), ino));
        write(&self.inodes).insert(ino, inode.clone());
        (inode, cookie)
    }

    fn swap_entries(
        &self,
        tree: &mut HashMap<Ino, Dir>,
        (pa, na, a): (Ino, &OsStr, Ino),
        (pb, nb, b): (Ino, &OsStr, Ino),
    ) -> FsResult<()> {
        if a == b {
            return Ok(());
        }
        let mut records = Vec::new();
        for (p, n, i) in [(pa, na, b), (pb, nb, a)] {
            if let Some(d) = tree.get_mut(&p) {
                d.remove(n);
                let cookie = d.insert(n.to_os_string(), i);
                records.push(persist::dir_remove(p, n));
                records.push(persist::dir_add(p, cookie, i, n));
            }
        }
        let a_dir = tree.contains_key(&a);
        let b_dir = tree.contains_key(&b);
        if let Some(d) = tree.get_mut(&a) {
            d.parent = pb;
        }
        if let Some(d) = tree.get_mut(&b) {
            d.parent = pa;
        }
        if pa != pb && a_dir != b_dir {
            // A directory moved from one parent to the other: move its ".." link too.
            let (gains, loses) = if a_dir { (pb, pa) } else { (pa, pb) };
            self.get(gains)?.meta().attr.nlink += 1;
            let l = self.get(loses)?;
            let mut m = l.meta();
            m.attr.nlink = m.attr.nlink.saturating_sub(1);
        }
        for i in [a, b] {
            self.get(i)?.meta().touch_ctime();
        }
        for p in [pa, pb] {
            self.get(p)?.meta().touch_mtime();
        }
        self.log(|| {
            for (i, p) in [(a, pb), (b, pa)] {
                if tree.contains_key(&i) {
                    records.push(Record::Dir { ino: i, parent: p });
                }
            }
            records.extend(self.attr_records(&[a, b, pa, pb]));
            records
        });
        Ok(())
    }

    /// Entries of directory `ino` after `offset` (0 starts at ".").
    pub fn readdir(&self, ino: Ino, offset: u64, max: usize) -> FsResult<Vec<DirEntry>> {
        let tree = self.tree_read();
        let dir = tree.get(&ino).ok_or(FsError::NotDir)?;
        let mut out = Vec::new();
        if offset < 1 {
            out.push(DirEntry {
                offset: 1,
                ino,
                kind: FileKind::Dir,
                name: ".".into(),
            });
        }
        if offset < 2 {
            out.push(DirEntry {
                offset: 2,
                ino: dir.parent,
                kind: FileKind::Dir,
                name: "..".into(),
            });
        }
        for (&cookie, name) in dir.by_cookie.range(offset.max(2) + 1..) {
            if out.len() >= max {
                break;
            }
            let Some(child) = dir.get(name) else { continue };
            let Ok(inode) = self.get(child) else { continue };
            let kind = inode.meta().attr.kind;
            out.push(DirEntry {
                offset: cookie,
                ino: child,
                kind,
                name: name.clone(),
            });
        }
        Ok(out)
    }

    /// Drops `n` kernel references; forgets the inode once none are left and it has
    /// no name. Returns the inode when it was forgotten, so the caller can release
    /// data still held.
    pub fn forget(&self, ino: Ino, n: u64) -> Option<Arc<Inode>> {
        if ino == ROOT_INO {
            return None;
        }
        let inode = self.get(ino).ok()?;
        let gone = {
            let mut m = inode.meta();
            m.lookups = m.lookups.saturating_sub(n);
            m.lookups == 0 && m.attr.nlink == 0 && m.opens == 0
        };
        if gone {
            write(&self.inodes).remove(&ino);
            if let Some(j) = &self.journal {
                j.forgotten(ino);
            }
            return Some(inode);
        }
        None
    }

    /// Number of inodes (for statfs).
    pub fn inode_count(&self) -> u64 {
        read(&self.inodes).len() as u64
    }

    /// Every inode (for shutdown).
    pub fn all(&self) -> Vec<Arc<Inode>> {
        read(&self.inodes).values().cloned().collect()
    }
}

mod persist;

#[cfg(test)]
mod tests;
