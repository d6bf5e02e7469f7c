//! `kill -9` of fsd loses only what was not synced.
//!
//! Each round mounts the volume, runs a workload (create, write, append, truncate,
//! rename, unlink, mkdir, with fsync/fdatasync of files and fsync of directories at
//! random points) and SIGKILLs fsd at a random moment. The workload keeps a model of
//! what it did and what was synced, updated *before* each change is issued and only
//! *after* each sync returned, so the model errs on the side of "not durable":
//!
//! - a file whose contents were synced and not changed since reads back exactly;
//! - a file whose name was synced (its directory fsynced after it was created or
//!   renamed) exists under that name, and an unlink that was synced stays done;
//! - any other file may be missing, shorter or older, but every byte it holds is 0
//!   or a byte that some write put at that offset of that file (each write's bytes are
//!   random and non-zero, so bytes of another file, of freed memory or of metadata
//!   are caught), and it only appears under a name it had;
//! - nothing appears that the workload never created.
//!
//! After the check the volume is unmounted cleanly, `rmemfs fsck` must find it
//! consistent with no leaked chunks, and the next round first checks that the clean
//! unmount kept everything exactly.
//!
//! Directory names, file names and contents encode the model's ids, so what is found
//! after a crash is matched to the model by name. Every workload operation goes
//! through a descriptor of the mount's root (openat and friends), so once fsd is dead
//! the workload only gets errors, never the directory under the detached mount.
//!
//! `RMEMFS_CRASH_ROUNDS` sets the rounds (default 6); `RMEMFS_TEST_SEED` repeats the
//! printed seed (the kill's timing varies anyway).

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use rmemfs_tests::{heavy_test, volume, FsdMount, MemnodeProc, MIB};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// No file grows past this.
const MAX_FILE: u64 = 4 * MIB;
/// The workload keeps the live files' bytes under this.
const MAX_LIVE_BYTES: u64 = 48 * MIB;
/// ... and this many live files.
const MAX_LIVE_FILES: usize = 150;
/// Bytes of write history (since the last sync of each file) the model may keep.
const MAX_HISTORY: u64 = 96 * MIB;
/// Deepest directory nesting.
const MAX_DEPTH: usize = 4;
/// The bound on the workload noticing that fsd is gone.
const STOP_LIMIT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
struct DirM {
    rel: String,
    depth: usize,
    /// Its entry in its parent was fsynced (the root always is).
    durable: bool,
}

#[derive(Debug, Clone)]
struct FileM {
    dir: usize,
    name: String,
    /// Not unlinked (as far as the workload got).
    live: bool,
    /// Names (in `dir`) it may be found under after a crash.
    possible: BTreeSet<String>,
    renames: u32,
    /// The contents as the workload last made them.
    content: Vec<u8>,
    /// The contents at the last sync (or round start); with `writes`, every byte the
    /// file may hold after a crash.
    base: Vec<u8>,
    writes: Vec<(u64, Arc<Vec<u8>>)>,
    /// The largest size it had since `base`.
    max_size: u64,
    content_dirty: bool,
    name_dirty: bool,
}

impl FileM {
    fn history_bytes(&self) -> u64 {
        self.writes.iter().map(|(_, d)| d.len() as u64).sum()
    }

    /// Whether `actual` (found after a crash) holds only bytes this file may hold.
    fn check_bytes(&self, actual: &[u8]) -> Result<(), (usize, String)> {
        if actual.len() as u64 > self.max_size {
            return Err((
                actual.len(),
                format!(
                    "{} bytes long, but it was never longer than {}",
                    actual.len(),
                    self.max_size
                ),
            ));
        }
        for (o, &b) in actual.iter().enumerate() {
            if b == 0
                || self.content.get(o) == Some(&b)
                || self.base.get(o) == Some(&b)
                || self.writes.iter().rev().any(|(off, d)| {
                    let off = *off as usize;
                    o >= off && o < off + d.len() && d[o - off] == b
                })
            {
                continue;
            }
            let bad = actual[o..]
                .iter()
                .enumerate()
                .filter(|&(k, &b)| b != 0 && self.content.get(o + k) != Some(&b))
                .count();
            return Err((
                o,
                format!(
                    "byte {o} is {b:#04x}, which was never written at that offset of this file \
                 (current model byte {:?}, at last sync {:?}); from there on {bad} non-zero \
                 bytes differ from the model. Found {} bytes; model: {} bytes now, {} at \
                 the last sync, never longer than {}, writes since: {:?}",
                    self.content.get(o),
                    self.base.get(o),
                    actual.len(),
                    self.content.len(),
                    self.base.len(),
                    self.max_size,
                    self.writes
                        .iter()
                        .map(|(off, d)| (*off, d.len()))
                        .collect::<Vec<_>>()
                ),
            ));
        }
        Ok(())
    }

    /// Where the first bad byte's neighbourhood (`needle`) is in this file's model.
    fn holds(&self, needle: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        let mut look = |what: &str, hay: &[u8], base: u64| {
            if let Some(i) = hay.windows(needle.len()).position(|w| w == needle) {
                out.push(format!("{what} at offset {}", base + i as u64));
            }
        };
        look("current contents", &self.content, 0);
        look("contents at the last sync", &self.base, 0);
        for (off, d) in &self.writes {
            look("an unsynced write", d, *off);
        }
        out
    }
}

#[derive(Debug, Clone)]
struct Model {
    dirs: Vec<DirM>,
    files: BTreeMap<u64, FileM>,
    next_file: u64,
    next_dir: u64,
}

impl Model {
    fn new() -> Model {
        Model {
            dirs: vec![DirM {
                rel: String::new(),
                depth: 0,
                durable: true,
            }],
            files: BTreeMap::new(),
            next_file: 0,
            next_dir: 0,
        }
    }

    fn rel(&self, dir: usize, name: &str) -> String {
        let d = &self.dirs[dir].rel;
        if d.is_empty() {
            name.to_string()
        } else {
            format!("{d}/{name}")
        }
    }

    fn live_files(&self) -> Vec<u64> {
        self.files
            .iter()
            .filter(|(_, f)| f.live)
            .map(|(&id, _)| id)
            .collect()
    }

    fn live_bytes(&self) -> u64 {
        self.files
            .values()
            .filter(|f| f.live)
            .map(|f| f.content.len() as u64)
            .sum()
    }

    fn history(&self) -> u64 {
        self.files.values().map(FileM::history_bytes).sum()
    }

    /// A directory fsync of `dir` returned: every name change in it is durable.
    fn dir_synced(&mut self, dir: usize) {
        for f in self.files.values_mut().filter(|f| f.dir == dir) {
            if f.name_dirty {
                f.possible = if f.live {
                    [f.name.clone()].into()
                } else {
                    BTreeSet::new()
                };
                f.name_dirty = false;
            }
        }
    }

    /// A file fsync returned: its contents are durable.
    fn file_synced(&mut self, id: u64) {
        let f = self.files.get_mut(&id).expect("a modelled file");
        f.content_dirty = false;
        f.base = f.content.clone();
        f.writes.clear();
        f.max_size = f.content.len() as u64;
    }
}

/// What the workload did before it stopped.
struct WorkloadEnd {
    ops: u64,
    syncs: u64,
    /// The error that stopped it, and whether fsd had been killed by then.
    error: Option<(String, bool)>,
    log: Vec<String>,
}

fn cstr(s: &str) -> CString {
    CString::new(if s.is_empty() { "." } else { s }).expect("no NUL in model paths")
}

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn openat(root: RawFd, rel: &str, flags: i32) -> io::Result<File> {
    let c = cstr(rel);
    // SAFETY: a valid directory descriptor and a NUL-terminated relative path.
    let fd = check(unsafe { libc::openat(root, c.as_ptr(), flags | libc::O_CLOEXEC, 0o644) })?;
    // SAFETY: `fd` was just opened and is owned by nothing else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

fn mkdirat(root: RawFd, rel: &str) -> io::Result<()> {
    let c = cstr(rel);
    // SAFETY: as for openat.
    check(unsafe { libc::mkdirat(root, c.as_ptr(), 0o755) }).map(|_| ())
}

fn renameat(root: RawFd, from: &str, to: &str) -> io::Result<()> {
    let (a, b) = (cstr(from), cstr(to));
    // SAFETY: as for openat.
    check(unsafe { libc::renameat(root, a.as_ptr(), root, b.as_ptr()) }).map(|_| ())
}

fn unlinkat(root: RawFd, rel: &str) -> io::Result<()> {
    let c = cstr(rel);
    // SAFETY: as for openat.
    check(unsafe { libc::unlinkat(root, c.as_ptr(), 0) }).map(|_| ())
}

/// `n` random non-zero bytes.
fn data(rng: &mut StdRng, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rng.fill_bytes(&mut v);
    for b in &mut v {
        if *b == 0 {
            *b = 0x5a;
        }
    }
    v
}

/// A write length: mostly small, sometimes up to 1 MiB.
fn write_len(rng: &mut StdRng) -> u64 {
    match rng.random_range(0..10) {
        0..=6 => rng.random_range(1..=16 << 10),
        7 | 8 => rng.random_range(1..=128 << 10),
        _ => rng.random_range(1..=MIB),
    }
}

/// Runs random operations under the mount root `root` until an error (fsd killed) or
/// `max_ops`, updating `model` as the module docs say.
fn workload(
    root: File,
    model: &mut Model,
    seed: u64,
    killed: &AtomicBool,
    max_ops: u64,
) -> WorkloadEnd {
    let mut rng = StdRng::seed_from_u64(seed);
    let r = root.as_raw_fd();
    let mut end = WorkloadEnd {
        ops: 0,
        syncs: 0,
        error: None,
        log: Vec::new(),
    };
    let step = |model: &mut Model, rng: &mut StdRng, log: &mut Vec<String>| -> io::Result<bool> {
        let live = model.live_files();
        let full = live.len() >= MAX_LIVE_FILES || model.live_bytes() >= MAX_LIVE_BYTES;
        // Too much history kept: sync the file with the most.
        if model.history() > MAX_HISTORY {
            let (&id, _) = model
                .files
                .iter()
                .filter(|(_, f)| f.live)
                .max_by_key(|(_, f)| f.history_bytes())
                .expect("history belongs to live files");
            let rel = model.rel(model.files[&id].dir, &model.files[&id].name);
            log.push(format!("fsync {rel} (history cap)"));
            openat(r, &rel, libc::O_RDWR)?.sync_all()?;
            model.file_synced(id);
            return Ok(true);
        }
        let pick = rng.random_range(0..100);
        let op = match pick {
            _ if live.is_empty() => 0,
            _ if full && pick < 40 => 60, // unlink instead of creating or growing
            p => p,
        };
        match op {
            0..=14 => {
                let durable: Vec<usize> = (0..model.dirs.len())
                    .filter(|&d| model.dirs[d].durable)
                    .collect();
                let dir = durable[rng.random_range(0..durable.len())];
                let id = model.next_file;
                model.next_file += 1;
                let name = format!("f{id}");
                let len = if rng.random_range(0..10) == 0 {
                    rng.random_range(MIB..=3 * MIB)
                } else {
                    rng.random_range(0..=64 << 10)
                };
                let bytes = Arc::new(data(rng, len as usize));
                model.files.insert(
                    id,
                    FileM {
                        dir,
                        name: name.clone(),
                        live: true,
                        possible: [name.clone()].into(),
                        renames: 0,
                        content: bytes.to_vec(),
                        base: Vec::new(),
                        writes: vec![(0, bytes.clone())],
                        max_size: len,
                        content_dirty: true,
                        name_dirty: true,
                    },
                );
                let rel = model.rel(dir, &name);
                log.push(format!("create {rel} with {len} bytes"));
                let f = openat(r, &rel, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY)?;
                f.write_all_at(&bytes, 0)?;
            }
            15..=39 => {
                let id = live[rng.random_range(0..live.len())];
                let rel = model.rel(model.files[&id].dir, &model.files[&id].name);
                let f = model.files.get_mut(&id).expect("live");
                let size = f.content.len() as u64;
                let append = op >= 32;
                let off = if append {
                    size
                } else {
                    rng.random_range(0..=size + (64 << 10))
                };
                if off >= MAX_FILE {
                    return Ok(false);
                }
                let n = write_len(rng).min(MAX_FILE - off);
                let bytes = Arc::new(data(rng, n as usize));
                f.content_dirty = true;
                f.writes.push((off, bytes.clone()));
                let end = (off + n) as usize;
                if f.content.len() < end {
                    f.content.resize(end, 0);
                }
                f.content[off as usize..end].copy_from_slice(&bytes);
                f.max_size = f.max_size.max(end as u64);
                log.push(format!(
                    "{} {rel} at {off}, {n} bytes",
                    if append { "append to" } else { "write" }
                ));
                openat(r, &rel, libc::O_WRONLY)?.write_all_at(&bytes, off)?;
            }
            40..=47 => {
                let id = live[rng.random_range(0..live.len())];
                let rel = model.rel(model.files[&id].dir, &model.files[&id].name);
                let f = model.files.get_mut(&id).expect("live");
                let size = f.content.len() as u64;
                let to = if rng.random_bool(0.7) {
                    rng.random_range(0..=size)
                } else {
                    rng.random_range(0..=MAX_FILE.min(size + MIB))
                };
                f.content_dirty = true;
                f.content.resize(to as usize, 0);
                f.max_size = f.max_size.max(to);
                log.push(format!("truncate {rel} from {size} to {to}"));
                openat(r, &rel, libc::O_WRONLY)?.set_len(to)?;
            }
            48..=55 => {
                let id = live[rng.random_range(0..live.len())];
                let f = model.files.get_mut(&id).expect("live");
                f.renames += 1;
                let new = format!("f{id}.{}", f.renames);
                let old = std::mem::replace(&mut f.name, new.clone());
                f.possible.insert(new.clone());
                f.name_dirty = true;
                let dir = f.dir;
                let (from, to) = (model.rel(dir, &old), model.rel(dir, &new));
                log.push(format!("rename {from} -> {to}"));
                renameat(r, &from, &to)?;
            }
            56..=62 => {
                let id = live[rng.random_range(0..live.len())];
                let rel = model.rel(model.files[&id].dir, &model.files[&id].name);
                let f = model.files.get_mut(&id).expect("live");
                f.live = false;
                f.name_dirty = true;
                log.push(format!("unlink {rel}"));
                unlinkat(r, &rel)?;
            }
            63..=66 => {
                let parents: Vec<usize> = (0..model.dirs.len())
                    .filter(|&d| model.dirs[d].durable && model.dirs[d].depth < MAX_DEPTH)
                    .collect();
                let parent = parents[rng.random_range(0..parents.len())];
                let n = model.next_dir;
                model.next_dir += 1;
                let rel = model.rel(parent, &format!("d{n}"));
                let depth = model.dirs[parent].depth + 1;
                model.dirs.push(DirM {
                    rel: rel.clone(),
                    depth,
                    durable: false,
                });
                log.push(format!("mkdir {rel} and fsync its parent"));
                mkdirat(r, &rel)?;
                let p = model.dirs[parent].rel.clone();
                openat(r, &p, libc::O_RDONLY | libc::O_DIRECTORY)?.sync_all()?;
                let d = model.dirs.len() - 1;
                model.dirs[d].durable = true;
                model.dir_synced(parent);
                return Ok(true);
            }
            67..=84 => {
                let id = live[rng.random_range(0..live.len())];
                let rel = model.rel(model.files[&id].dir, &model.files[&id].name);
                let data_only = rng.random_bool(0.5);
                log.push(format!(
                    "{} {rel}",
                    if data_only { "fdatasync" } else { "fsync" }
                ));
                let f = openat(r, &rel, libc::O_RDWR)?;
                if data_only {
                    f.sync_data()?;
                } else {
                    f.sync_all()?;
                }
                model.file_synced(id);
                return Ok(true);
            }
            85..=94 => {
                let durable: Vec<usize> = (0..model.dirs.len())
                    .filter(|&d| model.dirs[d].durable)
                    .collect();
                let dir = durable[rng.random_range(0..durable.len())];
                let rel = model.dirs[dir].rel.clone();
                log.push(format!("fsync directory {:?}", rel));
                openat(r, &rel, libc::O_RDONLY | libc::O_DIRECTORY)?.sync_all()?;
                model.dir_synced(dir);
                return Ok(true);
            }
            _ => {
                // A file made wholly durable: fsync it, then its directory.
                let id = live[rng.random_range(0..live.len())];
                let dir = model.files[&id].dir;
                let rel = model.rel(dir, &model.files[&id].name);
                log.push(format!("fsync {rel} and its directory"));
                openat(r, &rel, libc::O_RDWR)?.sync_all()?;
                model.file_synced(id);
                let d = model.dirs[dir].rel.clone();
                openat(r, &d, libc::O_RDONLY | libc::O_DIRECTORY)?.sync_all()?;
                model.dir_synced(dir);
                return Ok(true);
            }
        }
        Ok(false)
    };
    while end.ops < max_ops {
        match step(model, &mut rng, &mut end.log) {
            Ok(synced) => {
                end.ops += 1;
                end.syncs += synced as u64;
            }
            Err(e) => {
                let when_killed = killed.load(Ordering::SeqCst);
                end.error = Some((
                    format!("{}: {e}", end.log.last().map_or("?", String::as_str)),
                    when_killed,
                ));
                break;
            }
        }
    }
    end
}

/// The file ids named in `text`: every word whose last path component is a file name
/// of the model (`f12`, `f12.3`).
fn ids_in(text: &str) -> BTreeSet<u64> {
    text.split(|c: char| c.is_whitespace() || "(),:\"".contains(c))
        .filter_map(|w| parse_file_name(w.rsplit('/').next().unwrap_or(w)))
        .collect()
}

/// The failure report's tail: the last operations, and every operation of this round
/// on the files the problems name.
fn history(log: &[String], problems: &[String]) -> String {
    let ids = ids_in(&problems.join("\n"));
    let mut out = format!(
        "last operations before the kill:\n{}",
        log[log.len().saturating_sub(40)..].join("\n")
    );
    for id in ids {
        let ops: Vec<&String> = log.iter().filter(|l| ids_in(l).contains(&id)).collect();
        out.push_str(&format!(
            "\nthis round's {} operations on file {id}{}:\n{}",
            ops.len(),
            if ops.len() > 80 { " (the last 80)" } else { "" },
            ops[ops.len().saturating_sub(80)..]
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        ));
    }
    out
}

/// What a check of the mount against the model found.
struct Found {
    /// id -> (dir index, name, contents)
    files: BTreeMap<u64, (usize, String, Vec<u8>)>,
    dirs: BTreeSet<String>,
    exact: usize,
    loose: usize,
}

fn parse_file_name(name: &str) -> Option<u64> {
    let rest = name.strip_prefix('f')?;
    let id = rest.split('.').next()?;
    id.parse().ok()
}

/// Which modelled file's data the bytes at `o` of `actual` (a file's first byte it
/// may not hold, and the 31 after it) come from: a block of another file, or of this one at another offset, points at
/// a block reused or a block map gone wrong.
fn whose(model: &Model, actual: &[u8], o: usize) -> String {
    let needle = &actual[o..(o + 32).min(actual.len())];
    if needle.len() < 8 {
        return "too few bytes to say whose they are".to_string();
    }
    let mut hits = Vec::new();
    for (id, g) in &model.files {
        for h in g.holds(needle) {
            hits.push(format!("file {id} ({}): {h}", model.rel(g.dir, &g.name)));
        }
    }
    if hits.is_empty() {
        format!(
            "the bytes at {o} ({:02x?}) are in no modelled file's data (another file's older \
             data, freed memory or metadata)",
            &needle[..8]
        )
    } else {
        format!("the bytes at {o} are those of {}", hits.join("; "))
    }
}

/// Checks the mount at `root` against `model` (see the module docs); returns what it
/// found, or every problem.
fn check_mount(root: &Path, model: &Model) -> Result<Found, Vec<String>> {
    let mut problems = Vec::new();
    let mut found = Found {
        files: BTreeMap::new(),
        dirs: BTreeSet::new(),
        exact: 0,
        loose: 0,
    };
    let dir_index: BTreeMap<&str, usize> = model
        .dirs
        .iter()
        .enumerate()
        .map(|(i, d)| (d.rel.as_str(), i))
        .collect();
    let mut stack = vec![String::new()];
    while let Some(rel) = stack.pop() {
        found.dirs.insert(rel.clone());
        let Some(&di) = dir_index.get(rel.as_str()) else {
            problems.push(format!("directory {rel:?} appeared: it was never created"));
            continue;
        };
        let path = root.join(&rel);
        let entries = match std::fs::read_dir(&path) {
            Ok(e) => e,
            Err(e) => {
                problems.push(format!("readdir {rel:?}: {e}"));
                continue;
            }
        };
        for e in entries {
            let e = match e {
                Ok(e) => e,
                Err(err) => {
                    problems.push(format!("readdir {rel:?}: {err}"));
                    break;
                }
            };
            let name = e.file_name().to_string_lossy().into_owned();
            let child = model.rel(di, &name);
            let meta = match std::fs::symlink_metadata(root.join(&child)) {
                Ok(m) => m,
                Err(err) => {
                    problems.push(format!("lstat {child}: {err}"));
                    continue;
                }
            };
            if meta.is_dir() {
                stack.push(child);
                continue;
            }
            if !meta.is_file() {
                problems.push(format!("{child} appeared as a {:?}", meta.file_type()));
                continue;
            }
            let Some(id) = parse_file_name(&name) else {
                problems.push(format!("{child} appeared: no such name was ever created"));
                continue;
            };
            let Some(f) = model.files.get(&id) else {
                problems.push(format!("{child} appeared: file {id} was never created"));
                continue;
            };
            if f.dir != di || !f.possible.contains(&name) {
                problems.push(format!(
                    "{child} (file {id}) is there, but after what was synced it can only be \
                     in {:?} as one of {:?} (live: {}, name synced: {})",
                    model.dirs[f.dir].rel, f.possible, f.live, !f.name_dirty
                ));
                continue;
            }
            let bytes = match std::fs::read(root.join(&child)) {
                Ok(b) => b,
                Err(err) => {
                    problems.push(format!("reading {child}: {err}"));
                    continue;
                }
            };
            if !f.content_dirty {
                found.exact += 1;
                if bytes != f.content {
                    let at = bytes
                        .iter()
                        .zip(&f.content)
                        .position(|(a, b)| a != b)
                        .unwrap_or(bytes.len().min(f.content.len()));
                    let differ = bytes.iter().zip(&f.content).filter(|(a, b)| a != b).count();
                    let last = bytes
                        .iter()
                        .zip(&f.content)
                        .rposition(|(a, b)| a != b)
                        .unwrap_or(at);
                    problems.push(format!(
                        "{child} (file {id}): its contents were synced ({} bytes) and not \
                         changed since, but it reads {} bytes, first difference at offset \
                         {at} (last at {last}, {differ} bytes differ; read {:02x?}, synced \
                         {:02x?}); {}",
                        f.content.len(),
                        bytes.len(),
                        &bytes[at.min(bytes.len())..(at + 8).min(bytes.len())],
                        &f.content[at.min(f.content.len())..(at + 8).min(f.content.len())],
                        whose(model, &bytes, at)
                    ));
                }
            } else {
                found.loose += 1;
                if let Err((at, why)) = f.check_bytes(&bytes) {
                    problems.push(format!(
                        "{child} (not synced since its last change): {why}; {}",
                        whose(model, &bytes, at)
                    ));
                }
            }
            if let Some((_, other, _)) = found.files.insert(id, (di, name.clone(), bytes)) {
                problems.push(format!(
                    "file {id} is there twice, as {child} and as {other} (one inode, no links)"
                ));
            }
        }
    }
    for d in model.dirs.iter().filter(|d| d.durable) {
        if !found.dirs.contains(&d.rel) {
            problems.push(format!(
                "directory {:?} is missing though its parent was fsynced after mkdir",
                d.rel
            ));
        }
    }
    for (id, f) in &model.files {
        let must = f.live && !f.name_dirty && model.dirs[f.dir].durable;
        if must && !found.files.contains_key(id) {
            problems.push(format!(
                "{} (file {id}) is missing, though its directory was fsynced after it got \
                 that name ({})",
                model.rel(f.dir, &f.name),
                if f.content_dirty {
                    "contents changed since the last sync"
                } else {
                    "contents synced too"
                }
            ));
        }
    }
    if problems.is_empty() {
        Ok(found)
    } else {
        Err(problems)
    }
}

/// The model of what a clean unmount keeps: exactly what was found.
fn rebuild(model: &Model, found: &Found) -> Model {
    let mut next = Model {
        dirs: Vec::new(),
        files: BTreeMap::new(),
        next_file: model.next_file,
        next_dir: model.next_dir,
    };
    let mut index = BTreeMap::new();
    for (i, d) in model.dirs.iter().enumerate() {
        if found.dirs.contains(&d.rel) {
            index.insert(i, next.dirs.len());
            next.dirs.push(DirM {
                durable: true,
                ..d.clone()
            });
        }
    }
    for (&id, (dir, name, bytes)) in &found.files {
        let old = &model.files[&id];
        next.files.insert(
            id,
            FileM {
                dir: index[dir],
                name: name.clone(),
                live: true,
                possible: [name.clone()].into(),
                renames: old.renames,
                content: bytes.clone(),
                base: bytes.clone(),
                writes: Vec::new(),
                max_size: bytes.len() as u64,
                content_dirty: false,
                name_dirty: false,
            },
        );
    }
    next
}

#[test]
fn kill_9_loses_only_unsynced_data() {
    let _serial = heavy_test();
    let seed = std::env::var("RMEMFS_TEST_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    let rounds: u64 = std::env::var("RMEMFS_CRASH_ROUNDS")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(6);
    println!("kill -9 rounds: {rounds}, seed {seed} (RMEMFS_TEST_SEED={seed} repeats it)");
    let memnode = MemnodeProc::start("512M");
    let args = ["--volume", "crash", "--cache", "4M"];
    let mut model = Model::new();
    let started = Instant::now();
    for round in 0..rounds {
        let round_seed = seed ^ round.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut rng = StdRng::seed_from_u64(round_seed);
        let delay = if rng.random_range(0..5) == 0 {
            Duration::from_millis(rng.random_range(0..300))
        } else {
            Duration::from_millis(rng.random_range(300..4000))
        };
        println!(
            "round {round}: seed {round_seed}, kill -9 after {delay:?}; {} files, {} dirs \
             so far",
            model.files.len(),
            model.dirs.len()
        );
        let fsd = FsdMount::with_memnode(&memnode, &args);
        if round > 0 {
            if let Err(problems) = check_mount(fsd.path(), &model) {
                panic!(
                    "round {round} (seed {seed}): after the previous round's clean unmount \
                     the volume should hold exactly what was there, but:\n{}",
                    problems.join("\n")
                );
            }
        }
        let root = File::open(fsd.path()).expect("opening the mount root");
        let killed = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let worker = {
            let killed = killed.clone();
            let mut m = model.clone();
            std::thread::spawn(move || {
                let end = workload(root, &mut m, round_seed, &killed, 1_000_000);
                let _ = tx.send((m, end));
            })
        };
        std::thread::sleep(delay);
        killed.store(true, Ordering::SeqCst);
        let fsd_stderr = fsd.kill9();
        let (after, end) = rx.recv_timeout(STOP_LIMIT).unwrap_or_else(|_| {
            panic!("round {round}: the workload did not stop within {STOP_LIMIT:?} of kill -9")
        });
        let _ = worker.join();
        println!(
            "round {round}: {} operations ({} syncs) before the kill; stopped by {:?}",
            end.ops, end.syncs, end.error
        );
        match &end.error {
            Some((e, false)) => panic!(
                "round {round} (seed {round_seed}): an operation failed before fsd was \
                 killed: {e}\nlast operations:\n{}\nfsd stderr:\n{fsd_stderr}",
                end.log[end.log.len().saturating_sub(40)..].join("\n")
            ),
            None => println!("round {round}: the workload ran out of operations before the kill"),
            Some((_, true)) => {}
        }
        model = after;

        // Offline, before the mount repairs anything: the metadata is consistent, and
        // what fsd took after its last commit is reported as space the next mount
        // gives back (the clean fsck after this round shows that it does).
        let crashed = volume::fsck_text_after_crash("crash", &[&memnode]);
        let counts = volume::parse_fsck_text(&crashed.stdout).unwrap_or_else(|| {
            panic!(
                "round {round}: fsck after kill -9 printed no counts; {}",
                crashed.context()
            )
        });
        println!(
            "round {round}: fsck after kill -9: exit {}, {counts:?}",
            crashed.code
        );
        assert_eq!(
            counts.inconsistencies,
            0,
            "round {round}: after kill -9 the volume's metadata should be consistent; {}",
            crashed.context()
        );
        assert!(
            counts.leaked_chunks == 0 || crashed.stdout.contains("the next mount gives them back"),
            "round {round}: fsck should say leaked chunks come back at the next mount; {}",
            crashed.context()
        );

        let fsd = volume::remount_after_crash(&[&memnode], &args);
        let found = match check_mount(fsd.path(), &model) {
            Ok(found) => found,
            Err(problems) => panic!(
                "round {round} (seed {round_seed}): after kill -9 and a remount, {} \
                 problems:\n{}\n{}\nfsd stderr:\n{}",
                problems.len(),
                problems.join("\n"),
                history(&end.log, &problems),
                fsd.stderr()
            ),
        };
        println!(
            "round {round}: after the crash {} files checked exactly, {} within what was \
             written, {} of {} modelled files there",
            found.exact,
            found.loose,
            found.files.len(),
            model.files.len()
        );
        model = rebuild(&model, &found);
        fsd.unmount();
        volume::assert_fsck_clean("crash", &[&memnode], &format!("after round {round}"));
        println!(
            "round {round} done at {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    let fsd = FsdMount::with_memnode(&memnode, &args);
    if let Err(problems) = check_mount(fsd.path(), &model) {
        panic!(
            "after the last round's clean unmount the volume should hold exactly what was \
             there, but:\n{}",
            problems.join("\n")
        );
    }
    fsd.unmount();
}
