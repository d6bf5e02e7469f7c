//! A reproducible source tree for the real-program tests: the same seed gives the same
//! names, contents, modes, links and timestamps, so an archive of it made with
//! `tar --sort=name` is the same byte for byte.
//!
//! Shaped like a source checkout: many small files (0 to 8 KiB) in nested directories,
//! a few large ones (1 to 4 MiB) that carry most of the bytes, executable and private
//! modes, relative symlinks (and one dangling), hard links, empty files and
//! directories, names with spaces and UTF-8, and paths longer than 100 bytes (which
//! tar stores in extra headers).

use crate::data::Pattern;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// What to generate.
#[derive(Debug, Clone, Copy)]
pub struct TreeSpec {
    /// Small regular files (the large ones come on top).
    pub small_files: usize,
    /// Total bytes of file contents to aim for (large files fill what the small ones
    /// leave).
    pub bytes: u64,
}

/// What was generated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeSummary {
    pub files: usize,
    pub dirs: usize,
    pub symlinks: usize,
    pub hardlinks: usize,
    pub bytes: u64,
}

const SMALL_MAX: u64 = 8 << 10;
const LARGE_MIN: u64 = 1 << 20;
const LARGE_MAX: u64 = 4 << 20;
/// All timestamps fall after this (2020-09-13), in whole seconds (what tar keeps).
const EPOCH: i64 = 1_600_000_000;

/// Generates the tree of `seed` under `root` (which must not exist yet).
pub fn generate(root: &Path, seed: u64, spec: TreeSpec) -> TreeSummary {
    let mut rng = StdRng::seed_from_u64(seed);
    let pattern = Pattern::new(seed);
    let mut sum = TreeSummary::default();
    mkdir(root, 0o755);
    // Directories: each under a random earlier one, at most 6 deep.
    let mut dirs: Vec<(PathBuf, usize)> = vec![(root.to_path_buf(), 0)];
    let ndirs = (spec.small_files / 12).max(4);
    for i in 0..ndirs {
        let (parent, depth) = loop {
            let (p, d) = &dirs[rng.random_range(0..dirs.len())];
            if *d < 6 {
                break (p.clone(), *d);
            }
        };
        let name = match i % 40 {
            7 => format!("dir with spaces {i}"),
            13 => format!("ünïcödé-{i}"),
            21 => format!("{}-{i}", "a_rather_long_directory_name".repeat(3)),
            _ => format!("mod_{i}"),
        };
        let path = parent.join(name);
        mkdir(&path, if i % 29 == 5 { 0o700 } else { 0o755 });
        dirs.push((path, depth + 1));
        sum.dirs += 1;
    }
    // Files: small ones, then large ones up to the byte budget.
    let mut files: Vec<PathBuf> = Vec::new();
    let mut write = |rng: &mut StdRng, sum: &mut TreeSummary, size: u64, n: usize| {
        let dir = &dirs[rng.random_range(0..dirs.len())].0;
        let ext = ["rs", "c", "h", "md", "toml", "txt"][n % 6];
        let path = dir.join(format!("file_{n}.{ext}"));
        std::fs::write(&path, pattern.derive(n as u64).bytes(0, size as usize))
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        let mode = match n % 20 {
            3 | 11 => 0o755,
            7 => 0o600,
            _ => 0o644,
        };
        chmod(&path, mode);
        sum.files += 1;
        sum.bytes += size;
        files.push(path);
    };
    for n in 0..spec.small_files {
        let size = if n % 50 == 0 {
            0
        } else {
            rng.random_range(1..=SMALL_MAX)
        };
        write(&mut rng, &mut sum, size, n);
    }
    let mut n = spec.small_files;
    while sum.bytes + LARGE_MIN <= spec.bytes {
        let size = rng
            .random_range(LARGE_MIN..=LARGE_MAX)
            .min(spec.bytes - sum.bytes);
        write(&mut rng, &mut sum, size, n);
        n += 1;
    }
    // Links: relative symlinks to files, one dangling, hard links.
    for i in 0..(files.len() / 50).max(1) {
        let dir = dirs[rng.random_range(0..dirs.len())].0.clone();
        let target = &files[rng.random_range(0..files.len())];
        let up = dir
            .strip_prefix(root)
            .expect("dirs are under root")
            .components()
            .count();
        let rel = target.strip_prefix(root).expect("files are under root");
        let mut value = PathBuf::new();
        for _ in 0..up {
            value.push("..");
        }
        value.push(rel);
        symlink(&value, &dir.join(format!("link_{i}")));
        sum.symlinks += 1;
    }
    symlink(Path::new("no/such/target"), &root.join("dangling"));
    sum.symlinks += 1;
    for i in 0..(files.len() / 100).max(1) {
        let dir = &dirs[rng.random_range(0..dirs.len())].0;
        let target = &files[rng.random_range(0..files.len())];
        let link = dir.join(format!("hardlink_{i}"));
        std::fs::hard_link(target, &link).unwrap_or_else(|e| {
            panic!("hard link {} -> {}: {e}", link.display(), target.display())
        });
        sum.hardlinks += 1;
    }
    // Timestamps last, deepest paths first, so setting one does not change another.
    let mut all: Vec<PathBuf> = Vec::new();
    collect(root, &mut all);
    all.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for (i, p) in all.iter().enumerate() {
        set_mtime(p, EPOCH + (mix(seed ^ i as u64) % 100_000_000) as i64);
    }
    sum
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z ^ (z >> 31)
}

fn mkdir(p: &Path, mode: u32) {
    std::fs::create_dir(p).unwrap_or_else(|e| panic!("mkdir {}: {e}", p.display()));
    chmod(p, mode);
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {:o} {}: {e}", mode, p.display()));
}

fn symlink(value: &Path, link: &Path) {
    std::os::unix::fs::symlink(value, link)
        .unwrap_or_else(|e| panic!("symlink {} -> {}: {e}", link.display(), value.display()));
}

/// Every path under `dir` (itself included), without following symlinks.
fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_path_buf());
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("readdir {}: {e}", dir.display()))
    {
        let entry = entry.unwrap_or_else(|e| panic!("readdir {}: {e}", dir.display()));
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            collect(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// Sets atime and mtime of `p` (not of a symlink's target) to `secs`.
fn set_mtime(p: &Path, secs: i64) {
    let c = CString::new(p.as_os_str().as_bytes()).expect("paths have no NUL");
    let t = libc::timespec {
        tv_sec: secs,
        tv_nsec: 0,
    };
    let times = [t, t];
    // SAFETY: a NUL-terminated path and an array of two timespecs, as utimensat takes.
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
            p.display(),
            std::io::Error::last_os_error()
        );
    }
}
