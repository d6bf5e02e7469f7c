//! Durable volumes (`fsd --volume NAME`): a named filesystem whose chunks and metadata
//! live on the memnodes, so it outlives fsd.
//!
//! - A tree of 10,000+ files (small and large, sparse files with holes at known
//!   offsets, deep directories, xattrs, symlinks, hard links, other owners, varied
//!   modes, old timestamps) comes back after an unmount and a mount exactly: contents,
//!   lstat fields (inode numbers and ctime included), xattrs; the memnode keeps the
//!   volume's memory while nothing is mounted, and `rmemfs volume list` shows it with
//!   no holder.
//! - One writer per volume: a second fsd is refused naming the holder; `--takeover`
//!   mounts anyway and fences the first fsd, whose writes then fail, never reaching
//!   the volume.
//! - `rmemfs volume list` / `volume destroy`: the list's JSON, and destroy giving the
//!   memnode back exactly the memory it had before the volume, without touching
//!   another volume; the name can then be mounted again as a new, empty volume.
//! - A full volume: a delete's room goes to the next write at once; with the memnode
//!   full of data, creates fail with ENOSPC once the metadata would outgrow the room
//!   kept for the next checkpoint, and every file made before survives a remount.

use rmemfs_tests::data::{assert_bytes_eq, create, UncachedReader};
use rmemfs_tests::fileset::FileSet;
use rmemfs_tests::snapshot::{lchown, set_times, set_xattr, Kind, TreeSnapshot};
use rmemfs_tests::tree::{self, TreeSpec};
use rmemfs_tests::{
    describe, dir_names, heavy_test, poll_until, volume, within, FsdMount, MemnodeProc, Pattern,
    MIB,
};
use std::collections::BTreeSet;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A sparse file: its size and the pieces of data in it (offset, length); everything
/// else is a hole and reads as zeros.
struct Sparse {
    rel: &'static str,
    size: u64,
    pieces: Vec<(u64, u64)>,
    /// A range punched out of the data after writing (FALLOC_FL_PUNCH_HOLE).
    punched: Option<(u64, u64)>,
}

fn sparse_files() -> Vec<Sparse> {
    vec![
        Sparse {
            rel: "sparse/tail_hole",
            size: 48 * MIB + 5,
            pieces: vec![(0, 10_000), (5 * MIB + 123, 70_000), (40 * MIB, 4096)],
            punched: None,
        },
        Sparse {
            rel: "sparse/only_size",
            size: 16 * MIB,
            pieces: vec![(8 * MIB - 10, 20)],
            punched: None,
        },
        Sparse {
            rel: "sparse/head_hole",
            size: 31 * MIB,
            pieces: vec![(30 * MIB, MIB)],
            punched: None,
        },
        Sparse {
            rel: "sparse/punched",
            size: 4 * MIB,
            pieces: vec![(0, 4 * MIB)],
            punched: Some((MIB, 2 * MIB)),
        },
    ]
}

impl Sparse {
    /// The whole expected contents.
    fn expected(&self, pattern: &Pattern) -> Vec<u8> {
        let mut v = vec![0u8; self.size as usize];
        for &(off, len) in &self.pieces {
            pattern.fill(off, &mut v[off as usize..(off + len) as usize]);
        }
        if let Some((off, len)) = self.punched {
            v[off as usize..(off + len) as usize].fill(0);
        }
        v
    }

    /// Bytes of data (not hole).
    fn data_bytes(&self) -> u64 {
        self.pieces.iter().map(|&(_, l)| l).sum::<u64>() - self.punched.map_or(0, |(_, l)| l)
    }

    fn write(&self, root: &Path, pattern: &Pattern) {
        let path = root.join(self.rel);
        let f = create(&path);
        for &(off, len) in &self.pieces {
            f.write_all_at(&pattern.bytes(off, len as usize), off)
                .unwrap_or_else(|e| panic!("writing {} at {off}: {e}", path.display()));
        }
        f.set_len(self.size)
            .unwrap_or_else(|e| panic!("truncating {} to {}: {e}", path.display(), self.size));
        if let Some((off, len)) = self.punched {
            // SAFETY: fallocate on an open descriptor with plain integers.
            let rc = unsafe {
                libc::fallocate(
                    f.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    off as libc::off_t,
                    len as libc::off_t,
                )
            };
            assert_eq!(
                rc,
                0,
                "punching {len} bytes at {off} of {}: {}",
                path.display(),
                io::Error::last_os_error()
            );
        }
        f.sync_all()
            .unwrap_or_else(|e| panic!("fsync of {}: {e}", path.display()));
    }

    /// The file's data and hole boundaries per SEEK_DATA / SEEK_HOLE.
    fn layout(&self, root: &Path) -> Vec<(u64, u64)> {
        let path = root.join(self.rel);
        let f = std::fs::File::open(&path)
            .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
        let mut out = Vec::new();
        let mut pos: i64 = 0;
        loop {
            // SAFETY: lseek on an open descriptor.
            let data = unsafe { libc::lseek(f.as_raw_fd(), pos, libc::SEEK_DATA) };
            if data < 0 {
                let e = io::Error::last_os_error();
                assert_eq!(
                    e.raw_os_error(),
                    Some(libc::ENXIO),
                    "SEEK_DATA at {pos} of {}: {e}",
                    path.display()
                );
                return out;
            }
            // SAFETY: as above.
            let hole = unsafe { libc::lseek(f.as_raw_fd(), data, libc::SEEK_HOLE) };
            assert!(
                hole >= data,
                "SEEK_HOLE at {data} of {}: {}",
                path.display(),
                io::Error::last_os_error()
            );
            out.push((data as u64, hole as u64));
            if hole as u64 >= self.size {
                return out;
            }
            pos = hole;
        }
    }

    /// Reads the whole file around the page cache and compares it with what it should
    /// hold: data where written, zeros in the holes.
    fn verify(&self, root: &Path, pattern: &Pattern, when: &str) {
        let path = root.join(self.rel);
        let size = std::fs::metadata(&path)
            .unwrap_or_else(|e| panic!("{when}: stat {}: {e}", path.display()))
            .len();
        assert_eq!(size, self.size, "{when}: size of sparse file {}", self.rel);
        let expected = self.expected(pattern);
        let mut r = UncachedReader::open(&path)
            .unwrap_or_else(|e| panic!("{when}: opening {}: {e}", path.display()));
        let mut pos = 0u64;
        while pos < self.size {
            let n = (4 * MIB).min(self.size - pos) as usize;
            let got = r
                .read_at(pos, n)
                .unwrap_or_else(|e| panic!("{when}: reading {} at {pos}: {e}", self.rel));
            assert_bytes_eq(
                &expected[pos as usize..pos as usize + n],
                &got,
                pos,
                &format!(
                    "{when}: sparse file {} (data where written, zeros in holes)",
                    self.rel
                ),
            );
            pos += n as u64;
        }
    }
}

/// Gives the tree the metadata a remount must keep: user.* xattrs, other owners,
/// varied modes and old timestamps (to the nanosecond), each on a reproducible subset
/// of the paths. Returns how many paths got each: (xattrs, chowns, chmods, utimes).
// `u64::is_multiple_of` is newer than the workspace's rust-version (1.85).
#[allow(unknown_lints, clippy::manual_is_multiple_of)]
fn decorate(root: &Path, seed: u64) -> (usize, usize, usize, usize) {
    let snap = TreeSnapshot::take(root);
    let mut counts = (0, 0, 0, 0);
    for (i, (rel, e)) in snap.entries.iter().enumerate() {
        if rel.as_os_str().is_empty() {
            continue;
        }
        let path = root.join(rel);
        let i = i as u64 ^ (seed % 7);
        let file_or_dir = matches!(e.kind, Kind::File | Kind::Dir);
        if file_or_dir && i % 7 == 0 {
            set_xattr(&path, "user.rmemfs.index", i.to_string().as_bytes());
            if i % 3 == 0 {
                set_xattr(&path, "user.empty", b"");
            }
            if i % 5 == 0 {
                let long: Vec<u8> = (0..1000u32).map(|k| (k as u64 ^ i) as u8).collect();
                set_xattr(&path, "user.long", &long);
            }
            counts.0 += 1;
        }
        if i % 11 == 3 {
            lchown(&path, 1000 + (i % 50) as u32, 2000 + (i % 30) as u32);
            counts.1 += 1;
        }
        if i % 13 == 5 && e.kind != Kind::Symlink {
            let mode = if e.kind == Kind::Dir {
                [0o700, 0o750, 0o1777, 0o2755][(i / 13 % 4) as usize]
            } else {
                [0o600, 0o640, 0o444, 0o4755, 0o2750, 0o000, 0o777, 0o6711][(i / 13 % 8) as usize]
            };
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .unwrap_or_else(|e| panic!("chmod {mode:o} {}: {e}", path.display()));
            counts.2 += 1;
        }
    }
    // Timestamps last (children before parents: setting one does not touch another).
    let mut paths: Vec<&PathBuf> = snap.entries.keys().collect();
    paths.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for (i, rel) in paths.iter().enumerate() {
        if i % 17 == 2 {
            let t = (
                1_000_000_000 + (i as i64) * 37,
                (i as i64 * 7_919) % 1_000_000_000,
            );
            set_times(&root.join(rel), (t.0 + 1, 0), t);
            counts.3 += 1;
        }
    }
    counts
}

/// Bytes of file data in the tree: each regular file's size once per inode, with the
/// sparse files counted by their data only.
fn data_bytes(snap: &TreeSnapshot, sparse: &[Sparse]) -> u64 {
    let sparse_paths: BTreeSet<PathBuf> = sparse.iter().map(|s| PathBuf::from(s.rel)).collect();
    let mut seen = BTreeSet::new();
    let mut total = 0;
    for (rel, e) in &snap.entries {
        if e.kind == Kind::File && !sparse_paths.contains(rel) && seen.insert(e.ino) {
            total += e.size;
        }
    }
    total + sparse.iter().map(Sparse::data_bytes).sum::<u64>()
}

#[test]
fn remount_keeps_a_tree() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("remount keeps a tree");
    let sparse_pattern = pattern.derive(1 << 40);
    let memnode = MemnodeProc::start("1G");
    let args = ["--volume", "v", "--cache", "32M", "--block-size", "4K"];
    let fsd = FsdMount::with_memnode(&memnode, &args);
    let held = volume::expect(&memnode, "v");
    println!("while mounted: {held:?}");
    assert_ne!(
        held.holder, 0,
        "rmemfs volume list should show the mounted volume v held by its fsd, but shows {held:?}"
    );

    let started = Instant::now();
    let spec = TreeSpec {
        small_files: 10_000,
        bytes: 56 * MIB,
    };
    let summary = tree::generate(&fsd.join("tree"), pattern.seed(), spec);
    std::fs::create_dir(fsd.join("sparse")).expect("mkdir sparse");
    let sparse = sparse_files();
    for s in &sparse {
        s.write(fsd.path(), &sparse_pattern);
    }
    let decorated = decorate(fsd.path(), pattern.seed());
    println!(
        "tree of {summary:?} written in {:.1} s; xattrs on {}, chown of {}, chmod of {}, \
         utimes of {} paths",
        started.elapsed().as_secs_f64(),
        decorated.0,
        decorated.1,
        decorated.2,
        decorated.3
    );
    let before = TreeSnapshot::take(fsd.path());
    let (files, dirs, links, _) = before.counts();
    println!("recorded {files} files, {dirs} directories, {links} symlinks");
    assert!(
        files >= 10_000,
        "the tree should hold 10,000+ files, holds {files}"
    );
    let layouts: Vec<Vec<(u64, u64)>> = sparse.iter().map(|s| s.layout(fsd.path())).collect();
    for s in &sparse {
        s.verify(fsd.path(), &sparse_pattern, "before the unmount");
    }
    let data = data_bytes(&before, &sparse);
    let used_mounted = memnode.stats().used;
    let started = Instant::now();
    fsd.unmount();
    println!(
        "unmounted in {:.1} s; {} MiB of file data, memnode used {} MiB while mounted",
        started.elapsed().as_secs_f64(),
        data / MIB,
        used_mounted / MIB
    );

    // Nothing mounted: the memory stays, the volume is listed without a holder.
    let used_between = memnode.stats().used;
    let idle = volume::expect(&memnode, "v");
    println!(
        "between the mounts: memnode used {} MiB; {idle:?}",
        used_between / MIB
    );
    assert!(
        used_between >= data,
        "with volume v unmounted the memnode should still hold its {} MiB of file data, but \
         has {} MiB in use (it had {} MiB while mounted): the volume's memory was reclaimed",
        data / MIB,
        used_between / MIB,
        used_mounted / MIB
    );
    assert_eq!(
        idle.holder, 0,
        "rmemfs volume list should show v with holder 0 while nothing mounts it: {idle:?}"
    );
    assert!(
        idle.bytes > 0 && idle.chunks > 0,
        "rmemfs volume list should show v's bytes and chunks: {idle:?}"
    );
    let text = volume::list_text(&memnode);
    let header = text.lines().next().unwrap_or("");
    assert!(
        ["NAME", "ID", "SIZE", "CHUNKS", "HOLDER"]
            .iter()
            .all(|c| header.contains(c)),
        "rmemfs volume list should start with a header line naming NAME ID SIZE CHUNKS \
         HOLDER; it printed:\n{text}"
    );
    assert!(
        text.lines()
            .skip(1)
            .any(|l| l.split_whitespace().next() == Some("v")),
        "rmemfs volume list should have a line for volume v; it printed:\n{text}"
    );

    let started = Instant::now();
    let fsd = FsdMount::with_memnode(&memnode, &args);
    println!("mounted again in {:.1} s", started.elapsed().as_secs_f64());
    let after = TreeSnapshot::take(fsd.path());
    before.assert_same(&after, "the tree after an unmount and a mount of volume v");
    for (s, layout) in sparse.iter().zip(&layouts) {
        s.verify(fsd.path(), &sparse_pattern, "after the remount");
        let rel = PathBuf::from(s.rel);
        let (b, a) = (&before.entries[&rel], &after.entries[&rel]);
        assert!(
            a.blocks <= b.blocks,
            "sparse file {} used {} blocks before the remount and {} after: its holes were \
             filled",
            s.rel,
            b.blocks,
            a.blocks
        );
        assert_eq!(
            &s.layout(fsd.path()),
            layout,
            "SEEK_DATA/SEEK_HOLE layout of sparse file {} after the remount (before it)",
            s.rel
        );
    }
    let used_remounted = memnode.stats().used;
    println!(
        "memnode used: {} MiB mounted, {} MiB between, {} MiB mounted again",
        used_mounted / MIB,
        used_between / MIB,
        used_remounted / MIB
    );
    assert!(
        used_remounted <= used_between + 128 * MIB,
        "mounting volume v again should reuse its memory, but the memnode's use grew from \
         {} MiB to {} MiB",
        used_between / MIB,
        used_remounted / MIB
    );
    fsd.unmount();
}

/// A write and fsync of `data` to `path` on a fenced fsd's mount, bounded.
fn fenced_write(path: PathBuf, data: Vec<u8>) -> io::Result<()> {
    within(
        Duration::from_secs(60),
        &format!("write+fsync of {} on the fenced fsd", path.display()),
        move || {
            let f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)?;
            f.write_all_at(&data, 0)?;
            f.sync_all()
        },
    )
}

#[test]
fn second_fsd_is_refused_and_takeover_fences() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("takeover fences the first fsd");
    let memnode = MemnodeProc::start("256M");
    let args = ["--volume", "t", "--cache", "8M"];
    let fsd1 = FsdMount::with_memnode(&memnode, &args);
    let len = 2 * MIB;
    let (a0, a1, b) = (pattern.derive(0), pattern.derive(1), pattern.derive(2));
    a0.write_file(&fsd1.join("shared"), len);
    std::fs::File::open(fsd1.path())
        .and_then(|d| d.sync_all())
        .expect("fsync of fsd1's root");
    let holder1 = volume::expect(&memnode, "t").holder;
    assert_ne!(
        holder1, 0,
        "volume t is mounted by fsd1, so it has a holder"
    );

    let refusal = FsdMount::refused(&[&memnode], &args);
    println!(
        "second fsd on volume t: {}; stderr:\n{}",
        refusal.status,
        refusal.stderr.trim_end()
    );
    assert!(
        !refusal.status.success(),
        "a second fsd on a volume held by a live fsd should exit non-zero, but exited {}",
        refusal.status
    );
    assert!(
        refusal.stderr.contains("is held by") && !refusal.stderr.contains("panicked"),
        "the second fsd should say the volume `is held by` its holder (without panicking); \
         stderr:\n{}",
        refusal.stderr
    );
    assert!(
        volume::hex_numbers(&refusal.stderr).contains(&holder1),
        "the refusal should name the holder's client id in hex ({holder1:#x}, per rmemfs \
         volume list); stderr:\n{}",
        refusal.stderr
    );

    let mut takeover = args.to_vec();
    takeover.push("--takeover");
    let fsd2 = FsdMount::with_memnode(&memnode, &takeover);
    let holder2 = volume::expect(&memnode, "t").holder;
    assert!(
        holder2 != 0 && holder2 != holder1,
        "after --takeover the holder should be the new fsd, not {holder1:#x}; list shows \
         {holder2:#x}"
    );
    a0.verify_file(&fsd2.join("shared"), len);
    b.write_file(&fsd2.join("shared"), len);
    FileSet::new(pattern.derive(3)).write(fsd2.path(), "from2", 100_000);

    // fsd1 is fenced: what it writes must fail, and reach nothing.
    let r = fenced_write(fsd1.join("shared"), a1.bytes(0, len as usize));
    println!(
        "write+fsync of shared through the fenced fsd1: {}",
        describe(&r)
    );
    assert!(
        r.is_err(),
        "after fsd2 took volume t over, a write+fsync through fsd1 must fail (EIO or \
         similar), but it succeeded; fsd1 stderr:\n{}",
        fsd1.stderr()
    );
    let r = fenced_write(fsd1.join("from1"), a1.bytes(0, 100_000));
    println!("creating from1 through the fenced fsd1: {}", describe(&r));
    assert!(
        r.is_err(),
        "after the takeover, creating and fsyncing a file through fsd1 must fail, but it \
         succeeded"
    );
    b.verify_file(&fsd2.join("shared"), len);
    assert!(
        !fsd2.join("from1").exists(),
        "fsd2 shows from1, a file the fenced fsd1 created"
    );
    println!("fsd1 after being fenced: {:?}", fsd1.terminate());
    fsd2.unmount();

    // What the next mount sees is fsd2's volume, untouched by fsd1.
    let fsd3 = FsdMount::with_memnode(&memnode, &args);
    b.verify_file(&fsd3.join("shared"), len);
    assert_eq!(
        dir_names(fsd3.path()),
        ["from2", "shared"].iter().map(|s| s.to_string()).collect(),
        "volume t after the takeover holds what fsd2 wrote, nothing of the fenced fsd1"
    );
    fsd3.unmount();
    volume::assert_fsck_clean("t", &[&memnode], "after a takeover");
}

#[test]
fn rmemfs_volume_list_and_destroy() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("volume list and destroy");
    let memnode = MemnodeProc::start("256M");
    let used_at_start = memnode.stats().used;
    assert!(
        volume::list(&memnode).is_empty(),
        "a fresh memnode has no volumes"
    );
    let args_w = ["--volume", "w", "--cache", "4M"];
    let args_v = ["--volume", "v", "--cache", "4M"];

    // Volume w first, so destroying v must leave w alone.
    let fsd = FsdMount::with_memnode(&memnode, &args_w);
    let mut w_files = FileSet::new(pattern.derive(1));
    w_files.write(fsd.path(), "keep", 3 * MIB);
    fsd.unmount();
    let used_before_v = memnode.stats().used;

    let fsd = FsdMount::with_memnode(&memnode, &args_v);
    let mut v_files = FileSet::new(pattern.derive(2));
    v_files.write_mix(fsd.path(), 12, 4 * MIB);
    fsd.unmount();
    let used_with_v = memnode.stats().used;
    let v = volume::expect(&memnode, "v");
    let w = volume::expect(&memnode, "w");
    println!(
        "used: {} at start, {} with w, {} with v and w; {v:?}; {w:?}",
        used_at_start, used_before_v, used_with_v
    );
    assert!(
        v.bytes > 0 && v.chunks > 0 && v.holder == 0,
        "rmemfs volume list --json should show v with bytes and chunks and no holder: {v:?}"
    );
    assert_ne!(v.id, w.id, "two volumes have different ids");
    assert!(
        used_with_v >= used_before_v + v_files.bytes(),
        "volume v's {} bytes of files should be in the memnode's use ({used_before_v} -> \
         {used_with_v})",
        v_files.bytes()
    );
    let text = volume::list_text(&memnode);
    for name in ["v", "w"] {
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().next() == Some(name)),
            "rmemfs volume list should have a line for {name}:\n{text}"
        );
    }

    volume::destroy("v", &[&memnode]);
    let back = poll_until(Duration::from_secs(10), || {
        let used = memnode.stats().used;
        (used == used_before_v).then_some(used)
    });
    assert!(
        back.is_some(),
        "after rmemfs volume destroy v the memnode should have exactly the {used_before_v} \
         bytes in use it had before v existed, but has {}",
        memnode.stats().used
    );
    let names: Vec<String> = volume::list(&memnode).into_iter().map(|v| v.name).collect();
    assert_eq!(names, vec!["w".to_string()], "volumes after destroying v");

    // w is intact; v is a new, empty volume.
    let fsd = FsdMount::with_memnode(&memnode, &args_w);
    w_files.verify_all(fsd.path(), "volume w after v was destroyed");
    fsd.unmount();
    let fsd = FsdMount::with_memnode(&memnode, &args_v);
    assert!(
        dir_names(fsd.path()).is_empty(),
        "volume v mounted after it was destroyed should be new and empty, but holds {:?}",
        dir_names(fsd.path())
    );
    let mut again = FileSet::new(pattern.derive(3));
    again.write(fsd.path(), "new", 100_000);
    fsd.unmount();
    let v2 = volume::expect(&memnode, "v");
    println!("v created again: {v2:?}");
    let fsd = FsdMount::with_memnode(&memnode, &args_v);
    again.verify_all(fsd.path(), "the new volume v after a remount");
    fsd.unmount();

    volume::destroy("v", &[&memnode]);
    volume::destroy("w", &[&memnode]);
    let back = poll_until(Duration::from_secs(10), || {
        (memnode.stats().used == used_at_start).then_some(())
    });
    assert!(
        back.is_some(),
        "with every volume destroyed the memnode should be back to {used_at_start} bytes in \
         use, but has {}",
        memnode.stats().used
    );
    assert!(
        volume::list(&memnode).is_empty(),
        "no volumes are left after destroying both"
    );
}

/// Writes `path` in 1 MiB pieces of `pattern` until the filesystem answers ENOSPC;
/// the bytes written. Any other error fails the test.
fn write_until_full(path: &Path, pattern: &Pattern) -> u64 {
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
    let mut at = 0u64;
    loop {
        let piece = pattern.bytes(at, MIB as usize);
        match f.write_all_at(&piece, at) {
            Ok(()) => at += piece.len() as u64,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("write {} at {at}: {e}", path.display()),
        }
        assert!(at < 1 << 30, "{} never filled the memnode", path.display());
    }
    // What made it is whole pieces: cut a piece the full memnode took only in part.
    f.set_len(at).expect("truncate to the whole pieces");
    f.sync_all().expect("fsync");
    at
}

/// A volume whose memnode fills up: a file deleted gives its room to the next write
/// at once (the write's ENOSPC commits the delete), and a volume that is full still
/// unmounts with its last checkpoint written (to the spare metadata chunks) and
/// mounts again with every byte and fsck clean.
#[test]
fn a_full_volume_gives_a_deleted_files_room_back_at_once_and_unmounts_clean() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("a full volume");
    let memnode = MemnodeProc::start("96M");
    let args = ["--volume", "full", "--cache", "16M"];
    let fsd = FsdMount::with_memnode(&memnode, &args);
    let first = write_until_full(&fsd.join("first"), &pattern);
    assert!(first >= 32 * MIB, "only {first} bytes fit a 96 MiB memnode");
    std::fs::remove_file(fsd.join("first")).expect("rm first");
    let second = write_until_full(&fsd.join("second"), &pattern);
    println!("{first} bytes before the delete, {second} right after it");
    assert!(
        second + 2 * MIB >= first,
        "a write right after deleting a {first}-byte file got only {second} bytes: the \
         delete's room was not given back"
    );
    fsd.unmount();
    volume::assert_fsck_clean(
        "full",
        &[&memnode],
        "after an unmount with the memnode full",
    );
    let fsd = FsdMount::with_memnode(&memnode, &args);
    assert!(!fsd.join("first").exists(), "the deleted file came back");
    let got = std::fs::read(fsd.join("second")).expect("read second");
    assert_bytes_eq(
        &pattern.bytes(0, second as usize),
        &got,
        0,
        "second after a remount",
    );
    fsd.unmount();
}

/// Makes empty files with long names in `dir`, numbered from `first`, until one fails
/// with ENOSPC: how many it made. Any other error fails the test.
fn create_until_full(dir: &Path, first: usize) -> usize {
    let pad = "n".repeat(200);
    for n in 0..400_000 {
        let path = dir.join(format!("{pad}{:08}", first + n));
        match std::fs::File::create(&path) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => return n,
            Err(e) => panic!("create {}: {e}", path.display()),
        }
    }
    panic!("400,000 files made with the memnode full of data: the metadata never ran out of room");
}

/// A volume whose memnode is full of data still takes files that need no data (empty
/// ones) until their metadata would not fit the room kept for the next checkpoint:
/// then a create fails with ENOSPC, and every file made before is durable (the
/// unmount's checkpoint fits). Before, creates never failed, the checkpoint outgrew
/// its room, and no commit, not even the unmount's, could make anything durable.
/// Deleting data gives the room back.
#[test]
fn a_volume_full_of_data_refuses_files_its_metadata_has_no_room_for_and_keeps_those_made() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("metadata room");
    let memnode = MemnodeProc::start("96M");
    let args = ["--volume", "meta", "--cache", "16M"];
    let fsd = FsdMount::with_memnode(&memnode, &args);
    let data = write_until_full(&fsd.join("data"), &pattern);
    std::fs::create_dir(fsd.join("many")).expect("mkdir with data filling the memnode");
    let made = create_until_full(&fsd.join("many"), 0);
    println!("{data} bytes of data, then {made} empty files before ENOSPC");
    assert!(made >= 1000, "only {made} files before ENOSPC");
    fsd.unmount();
    volume::assert_fsck_clean("meta", &[&memnode], "after an unmount with no room to grow");
    let fsd = FsdMount::with_memnode(&memnode, &args);
    let names = std::fs::read_dir(fsd.join("many"))
        .expect("readdir")
        .count();
    assert_eq!(
        names, made,
        "every file made before ENOSPC is back after a remount"
    );
    let got = std::fs::read(fsd.join("data")).expect("read data");
    assert_bytes_eq(
        &pattern.bytes(0, data as usize),
        &got,
        0,
        "data after a remount",
    );
    std::fs::remove_file(fsd.join("data")).expect("rm data");
    let again = create_until_full(&fsd.join("many"), made);
    println!("{again} more files after the data was deleted");
    assert!(
        again >= 1000,
        "only {again} files made after deleting the data: its memory gave no room back"
    );
    fsd.unmount();
    volume::assert_fsck_clean("meta", &[&memnode], "after more files");
}
