//! A set of files with known contents in a mount, to write once and check after every
//! remount: each file is a [`Pattern`] stream of a known length, so nothing but the
//! seed and the lengths is kept in memory.
//!
//! [`FileSet::verify_all`] wants every file back exactly; [`FileSet::verify_shown`]
//! accepts missing files but wants every regular file the mount shows to be one of the
//! set with exactly its contents (what a damaged volume may honestly show), and no
//! file that was never written.

use crate::data::{create, Pattern, UncachedReader};
use crate::MIB;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Files by path relative to the mount root: (pattern index, length).
#[derive(Debug, Clone)]
pub struct FileSet {
    pattern: Pattern,
    files: BTreeMap<PathBuf, (u64, u64)>,
}

impl FileSet {
    pub fn new(pattern: Pattern) -> FileSet {
        FileSet {
            pattern,
            files: BTreeMap::new(),
        }
    }

    /// The files, relative path -> length.
    pub fn files(&self) -> impl Iterator<Item = (&PathBuf, u64)> {
        self.files.iter().map(|(p, &(_, len))| (p, len))
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// Total bytes of all files.
    pub fn bytes(&self) -> u64 {
        self.files.values().map(|&(_, len)| len).sum()
    }

    fn pattern_of(&self, index: u64) -> Pattern {
        self.pattern.derive(index)
    }

    /// Writes `rel` (creating its parent directories) with `len` bytes, fsyncs it and
    /// its directory.
    pub fn write(&mut self, root: &Path, rel: &str, len: u64) {
        let index = self.files.len() as u64 + 1;
        let path = root.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .unwrap_or_else(|e| panic!("mkdir -p {}: {e}", parent.display()));
        }
        let p = self.pattern_of(index);
        let f = create(&path);
        p.write_range(&f, 0, len, |_| {})
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        f.sync_all()
            .unwrap_or_else(|e| panic!("fsync of {}: {e}", path.display()));
        drop(f);
        if let Some(parent) = path.parent() {
            std::fs::File::open(parent)
                .and_then(|d| d.sync_all())
                .unwrap_or_else(|e| panic!("fsync of directory {}: {e}", parent.display()));
        }
        self.files.insert(PathBuf::from(rel), (index, len));
    }

    /// Writes a typical mix under `root`: `count` files from 0 bytes to `max_len`, in
    /// a few directories (sizes from `seed`, all recorded).
    pub fn write_mix(&mut self, root: &Path, count: usize, max_len: u64) {
        let sizes = [0, 1, 4095, 4096, 65_537, 300_000, MIB, 3 * MIB + 17];
        for i in 0..count {
            let len = sizes[i % sizes.len()].min(max_len);
            let rel = match i % 3 {
                0 => format!("f{i:03}"),
                1 => format!("dir/f{i:03}"),
                _ => format!("dir/sub/f{i:03}"),
            };
            self.write(root, &rel, len);
        }
    }

    /// Every file of the set is in `root` with exactly its bytes (read around the
    /// kernel page cache); panics naming the first that is not.
    pub fn verify_all(&self, root: &Path, when: &str) {
        for (rel, &(index, len)) in &self.files {
            let path = root.join(rel);
            assert!(
                path.symlink_metadata().is_ok_and(|m| m.is_file()),
                "{when}: {} should be a regular file of {len} bytes, but lstat gives {:?}",
                rel.display(),
                path.symlink_metadata().map(|m| m.file_type())
            );
            verify(
                &self.pattern_of(index),
                &path,
                len,
                &format!("{when}: {}", rel.display()),
            );
        }
    }

    /// Every regular file under `root` is a file of the set, with exactly its bytes;
    /// files of the set may be missing. Returns how many of the set were shown. The
    /// paths in `ignore` (relative) are skipped.
    pub fn verify_shown(&self, root: &Path, when: &str, ignore: &[&str]) -> usize {
        let mut shown = 0;
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            let dir = root.join(&rel);
            let entries = std::fs::read_dir(&dir)
                .unwrap_or_else(|e| panic!("{when}: readdir {}: {e}", dir.display()));
            for e in entries {
                let e = e.unwrap_or_else(|e| panic!("{when}: readdir {}: {e}", dir.display()));
                let child = rel.join(e.file_name());
                if ignore.iter().any(|i| Path::new(i) == child) {
                    continue;
                }
                let path = root.join(&child);
                let meta = path
                    .symlink_metadata()
                    .unwrap_or_else(|e| panic!("{when}: lstat {}: {e}", path.display()));
                if meta.is_dir() {
                    stack.push(child);
                } else if meta.is_file() {
                    let Some(&(index, len)) = self.files.get(&child) else {
                        panic!(
                            "{when}: the mount shows a file {} ({} bytes) that was never \
                             written",
                            child.display(),
                            meta.len()
                        );
                    };
                    verify(
                        &self.pattern_of(index),
                        &path,
                        len,
                        &format!("{when}: {} (shown by the mount)", child.display()),
                    );
                    shown += 1;
                }
            }
        }
        shown
    }
}

/// `path` holds exactly `len` bytes of `p` (size first, then contents, uncached).
fn verify(p: &Pattern, path: &Path, len: u64, what: &str) {
    let size = std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{what}: stat: {e}"))
        .len();
    assert_eq!(size, len, "{what}: size");
    let mut r = UncachedReader::open(path).unwrap_or_else(|e| panic!("{what}: open: {e}"));
    let mut pos = 0;
    while pos < len {
        let n = MIB.min(len - pos) as usize;
        let got = r
            .read_at(pos, n)
            .unwrap_or_else(|e| panic!("{what}: reading at {pos}: {e}"));
        crate::data::assert_bytes_eq(&p.bytes(pos, n), &got, pos, what);
        pos += n as u64;
    }
}
