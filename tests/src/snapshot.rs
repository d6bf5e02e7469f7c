//! A record of everything a tree shows (`diff -r` plus `stat`, plus xattrs), to compare
//! the same tree before and after an unmount and mount.
//!
//! For every path (relative to the root; the root itself is `""`): the file type, the
//! lstat fields that must survive a remount (mode, uid, gid, size, nlink, inode number,
//! mtime, ctime, to the nanosecond; atime is left out, reading changes it), every
//! extended attribute (name and value, read without following symlinks), a symlink's
//! target and a 128-bit digest of a regular file's contents. Comparing two records
//! lists every difference, path by path.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::hash::Hasher;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// What kind of thing a path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Other,
}

/// Everything recorded of one path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub kind: Kind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u64,
    pub ino: u64,
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
    /// Not compared (fsd may count a file's blocks differently once reloaded); kept
    /// for tests that look at sparseness.
    pub blocks: u64,
    pub xattrs: BTreeMap<String, Vec<u8>>,
    /// A regular file's contents digest.
    pub digest: Option<(u64, u64)>,
    /// A symlink's target.
    pub target: Option<PathBuf>,
}

/// A whole tree: relative path -> entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TreeSnapshot {
    pub entries: BTreeMap<PathBuf, Entry>,
}

impl TreeSnapshot {
    /// Records the tree under `root` (without following symlinks).
    pub fn take(root: &Path) -> TreeSnapshot {
        let mut snap = TreeSnapshot::default();
        walk(root, Path::new(""), &mut snap.entries);
        snap
    }

    /// Every difference between `self` (expected) and `other` (found), one line each.
    pub fn differences(&self, other: &TreeSnapshot) -> Vec<String> {
        let mut out = Vec::new();
        for (path, a) in &self.entries {
            match other.entries.get(path) {
                None => out.push(format!("{}: missing", show(path))),
                Some(b) => compare(path, a, b, &mut out),
            }
        }
        for path in other.entries.keys() {
            if !self.entries.contains_key(path) {
                out.push(format!("{}: appeared", show(path)));
            }
        }
        out
    }

    /// Panics listing the differences (the first 40) if `other` differs from `self`.
    #[track_caller]
    pub fn assert_same(&self, other: &TreeSnapshot, what: &str) {
        let diffs = self.differences(other);
        if !diffs.is_empty() {
            let shown: Vec<&String> = diffs.iter().take(40).collect();
            panic!(
                "{what}: {} differences over {} paths (first {}):\n{}",
                diffs.len(),
                self.entries.len(),
                shown.len(),
                shown
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
    }

    /// Counts by kind: (files, dirs, symlinks, others).
    pub fn counts(&self) -> (usize, usize, usize, usize) {
        let mut c = (0, 0, 0, 0);
        for e in self.entries.values() {
            match e.kind {
                Kind::File => c.0 += 1,
                Kind::Dir => c.1 += 1,
                Kind::Symlink => c.2 += 1,
                _ => c.3 += 1,
            }
        }
        c
    }
}

fn show(p: &Path) -> String {
    if p.as_os_str().is_empty() {
        "(root)".to_string()
    } else {
        p.display().to_string()
    }
}

fn compare(path: &Path, a: &Entry, b: &Entry, out: &mut Vec<String>) {
    let p = show(path);
    macro_rules! field {
        ($f:ident, $fmt:literal) => {
            if a.$f != b.$f {
                out.push(format!(
                    concat!("{}: ", stringify!($f), " was ", $fmt, ", is now ", $fmt),
                    p, a.$f, b.$f
                ));
            }
        };
    }
    if a.kind != b.kind {
        out.push(format!("{p}: was a {:?}, is now a {:?}", a.kind, b.kind));
        return;
    }
    field!(mode, "{:o}");
    field!(uid, "{}");
    field!(gid, "{}");
    field!(size, "{}");
    field!(nlink, "{}");
    field!(ino, "{}");
    field!(mtime, "{:?}");
    field!(ctime, "{:?}");
    field!(target, "{:?}");
    if a.digest != b.digest {
        out.push(format!(
            "{p}: contents differ (same size: {})",
            a.size == b.size
        ));
    }
    if a.xattrs != b.xattrs {
        let names = |e: &Entry| e.xattrs.keys().cloned().collect::<Vec<_>>();
        out.push(format!(
            "{p}: xattrs differ: were {:?}, are now {:?}{}",
            names(a),
            names(b),
            if names(a) == names(b) {
                " (values differ)"
            } else {
                ""
            }
        ));
    }
}

fn walk(root: &Path, rel: &Path, out: &mut BTreeMap<PathBuf, Entry>) {
    let path = root.join(rel);
    let entry = record(&path);
    let is_dir = entry.kind == Kind::Dir;
    out.insert(rel.to_path_buf(), entry);
    if is_dir {
        let mut names: Vec<_> = std::fs::read_dir(&path)
            .unwrap_or_else(|e| panic!("readdir {}: {e}", path.display()))
            .map(|e| {
                e.unwrap_or_else(|e| panic!("readdir entry of {}: {e}", path.display()))
                    .file_name()
            })
            .collect();
        names.sort();
        for name in names {
            walk(root, &rel.join(name), out);
        }
    }
}

/// Records one path.
pub fn record(path: &Path) -> Entry {
    let m =
        std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("lstat {}: {e}", path.display()));
    let ft = m.file_type();
    let kind = if ft.is_file() {
        Kind::File
    } else if ft.is_dir() {
        Kind::Dir
    } else if ft.is_symlink() {
        Kind::Symlink
    } else if ft.is_fifo() {
        Kind::Fifo
    } else {
        Kind::Other
    };
    let digest = (kind == Kind::File)
        .then(|| file_digest(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display())));
    let target = (kind == Kind::Symlink).then(|| {
        std::fs::read_link(path).unwrap_or_else(|e| panic!("readlink {}: {e}", path.display()))
    });
    Entry {
        kind,
        mode: m.mode(),
        uid: m.uid(),
        gid: m.gid(),
        size: m.size(),
        nlink: m.nlink(),
        ino: m.ino(),
        mtime: (m.mtime(), m.mtime_nsec()),
        ctime: (m.ctime(), m.ctime_nsec()),
        blocks: m.blocks(),
        xattrs: xattrs(path).unwrap_or_else(|e| panic!("xattrs of {}: {e}", path.display())),
        digest,
        target,
    }
}

/// Two independent 64-bit SipHash digests of the file's bytes (the std hasher has
/// fixed keys, so digests compare within and across runs of one build).
pub fn file_digest(path: &Path) -> io::Result<(u64, u64)> {
    let mut f = std::fs::File::open(path)?;
    let mut h1 = std::hash::DefaultHasher::new();
    let mut h2 = std::hash::DefaultHasher::new();
    h2.write_u64(0x9e37_79b9_7f4a_7c15);
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h1.write(&buf[..n]);
        h2.write(&buf[..n]);
        total += n as u64;
    }
    h1.write_u64(total);
    Ok((h1.finish(), h2.finish()))
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("paths have no NUL")
}

/// Every extended attribute of `path` (not following a symlink): name -> value.
pub fn xattrs(path: &Path) -> io::Result<BTreeMap<String, Vec<u8>>> {
    let c = cpath(path);
    let mut out = BTreeMap::new();
    // SAFETY: a NUL-terminated path; a null buffer of size 0 asks for the size.
    let size = unsafe { libc::llistxattr(c.as_ptr(), std::ptr::null_mut(), 0) };
    if size < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
            return Ok(out);
        }
        return Err(e);
    }
    if size == 0 {
        return Ok(out);
    }
    let mut names = vec![0u8; size as usize + 256];
    // SAFETY: a NUL-terminated path; `names` has names.len() writable bytes.
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    names.truncate(n as usize);
    for name in names.split(|&b| b == 0).filter(|s| !s.is_empty()) {
        let cname = CString::new(name).expect("split at NULs");
        let value = lgetxattr(&c, &cname)?;
        out.insert(String::from_utf8_lossy(name).into_owned(), value);
    }
    Ok(out)
}

fn lgetxattr(path: &CString, name: &CString) -> io::Result<Vec<u8>> {
    // SAFETY: NUL-terminated strings; a null buffer of size 0 asks for the size.
    let size = unsafe { libc::lgetxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
    if size < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; size as usize + 1];
    // SAFETY: NUL-terminated strings; `buf` has buf.len() writable bytes.
    let n = unsafe {
        libc::lgetxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// setxattr(2) on `path` (following symlinks, like the tools do); panics on error.
pub fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    let (c, n) = (cpath(path), CString::new(name).expect("no NUL in a name"));
    // SAFETY: NUL-terminated strings and a slice that outlive the call.
    let rc = unsafe {
        libc::setxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc != 0 {
        panic!(
            "setxattr {name} on {}: {}",
            path.display(),
            io::Error::last_os_error()
        );
    }
}

/// lchown(2); panics on error.
pub fn lchown(path: &Path, uid: u32, gid: u32) {
    let c = cpath(path);
    // SAFETY: a NUL-terminated path.
    if unsafe { libc::lchown(c.as_ptr(), uid, gid) } != 0 {
        panic!(
            "lchown {uid}:{gid} {}: {}",
            path.display(),
            io::Error::last_os_error()
        );
    }
}

/// Sets atime and mtime of `path` (not following a symlink), to the nanosecond.
pub fn set_times(path: &Path, atime: (i64, i64), mtime: (i64, i64)) {
    let c = cpath(path);
    let ts = |(s, ns): (i64, i64)| libc::timespec {
        tv_sec: s,
        tv_nsec: ns,
    };
    let times = [ts(atime), ts(mtime)];
    // SAFETY: a NUL-terminated path and an array of two timespecs.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc != 0 {
        panic!(
            "utimensat {}: {}",
            path.display(),
            io::Error::last_os_error()
        );
    }
}
