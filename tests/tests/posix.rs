//! POSIX behaviour through a real mount: directories, readdir, symlinks, hard links,
//! rename, unlink, truncate, sparse files, chmod/chown/utimens, statfs, and the
//! embedded-memnode mode. Each test has its own memnode, fsd and mountpoint, and ends
//! with a clean unmount.

use rmemfs_tests::data::{assert_bytes_eq, create, write_small};
use rmemfs_tests::{assert_errno, FsdMount, MemnodeProc, Pattern, UncachedReader, MIB};
use std::collections::BTreeSet;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A memnode and an fsd on it with a small cache, so file data goes remote. fsd comes
/// first so it is dropped (detached) before its memnode is killed.
fn mount(memnode_size: &str) -> (FsdMount, MemnodeProc) {
    let memnode = MemnodeProc::start(memnode_size);
    let fsd = FsdMount::with_memnode(&memnode, &["--cache", "2M"]);
    (fsd, memnode)
}

fn set<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> BTreeSet<String> {
    items.into_iter().map(|s| s.as_ref().to_string()).collect()
}

/// The whole file, read around the kernel page cache (so from fsd).
fn read_uncached(path: &Path) -> Vec<u8> {
    let len = fs::metadata(path)
        .unwrap_or_else(|e| panic!("stat of {}: {e}", path.display()))
        .len();
    let mut r =
        UncachedReader::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let data = r
        .read_at(0, len as usize)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    assert_eq!(data.len() as u64, len, "bytes read from {}", path.display());
    data
}

#[test]
fn mkdir_and_rmdir_with_enotempty_eexist_and_enoent() {
    let (fsd, _memnode) = mount("64M");
    let d = fsd.join("d");
    fs::create_dir(&d).expect("mkdir d");
    assert!(
        fs::metadata(&d).expect("stat d").is_dir(),
        "d is a directory"
    );
    assert_errno(
        fs::create_dir(&d),
        libc::EEXIST,
        "mkdir of an existing directory",
    );
    write_small(&d.join("f"), b"x");
    fs::create_dir(d.join("sub")).expect("mkdir d/sub");
    assert_errno(
        fs::remove_dir(&d),
        libc::ENOTEMPTY,
        "rmdir of a non-empty directory",
    );
    assert_errno(
        fs::remove_dir(d.join("f")),
        libc::ENOTDIR,
        "rmdir of a regular file",
    );
    fs::remove_file(d.join("f")).expect("unlink d/f");
    assert_errno(
        fs::remove_dir(&d),
        libc::ENOTEMPTY,
        "rmdir of a directory holding a directory",
    );
    fs::remove_dir(d.join("sub")).expect("rmdir d/sub");
    fs::remove_dir(&d).expect("rmdir of the now empty d");
    assert_errno(
        fs::metadata(&d),
        libc::ENOENT,
        "stat of a removed directory",
    );
    assert_errno(
        fs::remove_dir(fsd.join("nope")),
        libc::ENOENT,
        "rmdir of a missing name",
    );
    assert_errno(
        fs::create_dir(fsd.join("nope/deeper")),
        libc::ENOENT,
        "mkdir under a missing directory",
    );
    assert_eq!(
        rmemfs_tests::dir_names(fsd.path()),
        set::<&str>([]),
        "the root is empty again"
    );
    fsd.unmount();
}

#[test]
fn readdir_lists_exactly_the_entries_with_their_types() {
    let (fsd, _memnode) = mount("64M");
    for f in ["a", "b", "c"] {
        write_small(&fsd.join(f), f.as_bytes());
    }
    fs::create_dir(fsd.join("d")).expect("mkdir d");
    std::os::unix::fs::symlink("a", fsd.join("l")).expect("symlink l");
    assert_eq!(
        rmemfs_tests::dir_names(fsd.path()),
        set(["a", "b", "c", "d", "l"]),
        "root entries"
    );
    for e in fs::read_dir(fsd.path()).expect("readdir root") {
        let e = e.expect("readdir entry");
        let t = e.file_type().expect("entry type");
        let name = e.file_name().to_string_lossy().into_owned();
        let want = match name.as_str() {
            "d" => "dir",
            "l" => "symlink",
            _ => "file",
        };
        let got = if t.is_dir() {
            "dir"
        } else if t.is_symlink() {
            "symlink"
        } else if t.is_file() {
            "file"
        } else {
            "other"
        };
        assert_eq!(got, want, "type of {name} in readdir");
    }
    // Enough entries that the kernel reads the directory in several calls.
    let many: Vec<String> = (0..500)
        .map(|i| format!("entry-with-a-longish-name-{i:04}"))
        .collect();
    for n in &many {
        fs::File::create(fsd.join("d").join(n)).unwrap_or_else(|e| panic!("create d/{n}: {e}"));
    }
    assert_eq!(
        rmemfs_tests::dir_names(&fsd.join("d")),
        set(&many),
        "500 entries of d/"
    );
    fs::remove_file(fsd.join("b")).expect("unlink b");
    assert_eq!(
        rmemfs_tests::dir_names(fsd.path()),
        set(["a", "c", "d", "l"]),
        "root entries after unlink of b"
    );
    fsd.unmount();
}

#[test]
fn symlink_keeps_its_target_and_readlink_returns_it() {
    let (fsd, _memnode) = mount("64M");
    let link = fsd.join("link");
    std::os::unix::fs::symlink("some/relative/../target", &link).expect("symlink");
    assert_eq!(
        fs::read_link(&link).expect("readlink"),
        Path::new("some/relative/../target"),
        "readlink of a relative symlink"
    );
    let meta = fs::symlink_metadata(&link).expect("lstat of the link");
    assert!(meta.file_type().is_symlink(), "lstat says symlink");
    assert_eq!(
        meta.len(),
        "some/relative/../target".len() as u64,
        "a symlink's size is its target's length"
    );
    assert_errno(
        fs::metadata(&link),
        libc::ENOENT,
        "stat through a dangling symlink",
    );

    write_small(&fsd.join("real"), b"through the link");
    let abs = fsd.join("abs");
    std::os::unix::fs::symlink(fsd.join("real"), &abs).expect("symlink to an absolute path");
    assert_eq!(fs::read_link(&abs).expect("readlink"), fsd.join("real"));
    assert_eq!(
        fs::read(&abs).expect("read through the link"),
        b"through the link"
    );
    std::os::unix::fs::symlink("real", fsd.join("rel")).expect("relative symlink");
    assert_eq!(
        fs::read(fsd.join("rel")).expect("read through a relative link"),
        b"through the link"
    );
    assert_errno(
        std::os::unix::fs::symlink("x", &link),
        libc::EEXIST,
        "symlink over an existing name",
    );
    fs::remove_file(&link).expect("unlink of a symlink");
    assert!(
        fsd.join("real").exists(),
        "removing a link leaves its target"
    );
    fsd.unmount();
}

#[test]
fn hard_links_share_data_and_count_links() {
    let pattern = Pattern::for_test("hard links");
    let (fsd, _memnode) = mount("64M");
    let (f, g) = (fsd.join("f"), fsd.join("g"));
    let len = 3 * MIB + 12345;
    pattern.write_file(&f, len);
    fs::hard_link(&f, &g).expect("link f g");
    let (mf, mg) = (
        fs::metadata(&f).expect("stat f"),
        fs::metadata(&g).expect("stat g"),
    );
    assert_eq!(mf.ino(), mg.ino(), "both names name one inode");
    assert_eq!(mf.nlink(), 2, "nlink of f after link");
    assert_eq!(mg.nlink(), 2, "nlink of g after link");
    pattern.verify_file(&g, len);

    // A write through one name is seen through the other.
    let patch = vec![0x5au8; 4096];
    let h = OpenOptions::new().write(true).open(&g).expect("open g");
    h.write_all_at(&patch, MIB).expect("write through g");
    h.sync_all().expect("fsync g");
    drop(h);
    let got = read_uncached(&f);
    let mut want = pattern.bytes(0, len as usize);
    want[MIB as usize..MIB as usize + 4096].copy_from_slice(&patch);
    assert_bytes_eq(&want, &got, 0, "f after writing through g");

    fs::hard_link(&f, fsd.join("h")).expect("link f h");
    assert_eq!(
        fs::metadata(&f).expect("stat f").nlink(),
        3,
        "nlink with three names"
    );
    fs::remove_file(&f).expect("unlink f");
    fs::remove_file(fsd.join("h")).expect("unlink h");
    assert_eq!(
        fs::metadata(&g).expect("stat g").nlink(),
        1,
        "nlink after unlinking two names"
    );
    assert_bytes_eq(
        &want,
        &read_uncached(&g),
        0,
        "g after its other names were unlinked",
    );
    assert_errno(
        fs::hard_link(&g, fsd.join("g")),
        libc::EEXIST,
        "link onto an existing name",
    );
    fsd.unmount();
}

#[test]
fn rename_moves_a_file_and_replaces_an_existing_one() {
    let (fsd, _memnode) = mount("64M");
    let (a, b, c) = (fsd.join("a"), fsd.join("b"), fsd.join("c"));
    write_small(&a, b"contents of a");
    fs::rename(&a, &b).expect("rename a b");
    assert_errno(fs::metadata(&a), libc::ENOENT, "the old name after rename");
    assert_eq!(fs::read(&b).expect("read b"), b"contents of a");

    write_small(&c, b"contents of c");
    let replaced_ino = fs::metadata(&b).expect("stat b").ino();
    fs::rename(&c, &b).expect("rename c over the existing b");
    assert_errno(fs::metadata(&c), libc::ENOENT, "c after renaming it over b");
    assert_eq!(
        fs::read(&b).expect("read b"),
        b"contents of c",
        "b now holds c's data"
    );
    assert_ne!(
        fs::metadata(&b).expect("stat b").ino(),
        replaced_ino,
        "b is c's inode now"
    );
    assert_eq!(
        rmemfs_tests::dir_names(fsd.path()),
        set(["b"]),
        "root after the renames"
    );

    fs::create_dir(fsd.join("d")).expect("mkdir d");
    fs::rename(&b, fsd.join("d/b")).expect("rename into a directory");
    fs::rename(fsd.join("d"), fsd.join("e")).expect("rename a directory");
    assert_eq!(
        fs::read(fsd.join("e/b")).expect("read e/b"),
        b"contents of c"
    );
    fs::create_dir(fsd.join("empty")).expect("mkdir empty");
    assert_errno(
        fs::rename(fsd.join("empty"), fsd.join("e")),
        libc::ENOTEMPTY,
        "rename of a directory over a non-empty directory",
    );
    fs::rename(fsd.join("e"), fsd.join("empty")).expect("rename a directory over an empty one");
    assert_eq!(
        rmemfs_tests::dir_names(fsd.path()),
        set(["empty"]),
        "root after renaming e over empty"
    );
    assert_eq!(
        fs::read(fsd.join("empty/b")).expect("read"),
        b"contents of c"
    );
    assert_errno(
        fs::rename(fsd.join("missing"), fsd.join("x")),
        libc::ENOENT,
        "rename of a missing name",
    );
    fsd.unmount();
}

#[test]
fn unlink_removes_the_name_while_an_open_descriptor_keeps_the_data() {
    let pattern = Pattern::for_test("unlink");
    let (fsd, _memnode) = mount("64M");
    let f = fsd.join("f");
    let len = 4 * MIB;
    pattern.write_file(&f, len);
    let open = fs::File::open(&f).expect("open f");
    fs::remove_file(&f).expect("unlink f");
    assert_errno(fs::metadata(&f), libc::ENOENT, "stat after unlink");
    assert_errno(fs::remove_file(&f), libc::ENOENT, "a second unlink");
    assert_eq!(
        rmemfs_tests::dir_names(fsd.path()),
        set::<&str>([]),
        "root after unlink"
    );
    // POSIX: the data lives on until the last descriptor closes.
    let mut got = vec![0u8; len as usize];
    open.read_exact_at(&mut got, 0)
        .expect("reading an unlinked but open file");
    assert_bytes_eq(
        &pattern.bytes(0, len as usize),
        &got,
        0,
        "unlinked open file",
    );
    drop(open);
    write_small(&f, b"new file, same name");
    assert_eq!(fs::read(&f).expect("read"), b"new file, same name");
    fsd.unmount();
}

#[test]
fn truncate_up_reads_zeros_and_truncate_down_then_extend_reads_zeros_beyond() {
    let pattern = Pattern::for_test("truncate");
    let (fsd, _memnode) = mount("64M");
    let path = fsd.join("t");
    let f = create(&path);
    let data = pattern.bytes(0, MIB as usize);
    f.write_all_at(&data, 0).expect("write 1 MiB");
    f.sync_all().expect("fsync");

    f.set_len(3 * MIB).expect("truncate up to 3 MiB");
    assert_eq!(
        fs::metadata(&path).expect("stat").len(),
        3 * MIB,
        "size after truncate up"
    );
    let mut want = data.clone();
    want.resize(3 * MIB as usize, 0);
    assert_bytes_eq(
        &want,
        &read_uncached(&path),
        0,
        "after truncate up (read by fsd)",
    );
    assert_bytes_eq(
        &want,
        &fs::read(&path).expect("read"),
        0,
        "after truncate up (buffered read)",
    );

    // Cut inside a block, then grow again: the cut-off tail must read as zeros, not
    // as the old data.
    let cut = 100_001u64;
    f.set_len(cut).expect("truncate down");
    f.sync_all().expect("fsync");
    assert_eq!(
        fs::metadata(&path).expect("stat").len(),
        cut,
        "size after truncate down"
    );
    f.set_len(2 * MIB).expect("extend again");
    let mut want = data[..cut as usize].to_vec();
    want.resize(2 * MIB as usize, 0);
    assert_bytes_eq(
        &want,
        &read_uncached(&path),
        0,
        "after truncate down and extend",
    );
    assert_bytes_eq(
        &want,
        &fs::read(&path).expect("read"),
        0,
        "after truncate down and extend (buffered)",
    );

    // Writing past the end leaves a zero gap.
    f.write_all_at(b"tail", 5 * MIB)
        .expect("write past the end");
    drop(f);
    want.resize(5 * MIB as usize, 0);
    want.extend_from_slice(b"tail");
    assert_bytes_eq(
        &want,
        &read_uncached(&path),
        0,
        "after a write past the end",
    );
    fsd.unmount();
}

#[test]
fn sparse_file_reads_zeros_in_its_holes_and_takes_no_remote_memory_for_them() {
    let pattern = Pattern::for_test("sparse file");
    let (fsd, memnode) = mount("256M");
    let path = fsd.join("sparse");
    let at = 100 * MIB;
    let tail = pattern.bytes(at, 4096);
    let f = create(&path);
    f.write_all_at(&tail, at).expect("write 4 KiB at 100 MiB");
    f.sync_all().expect("fsync");
    drop(f);
    assert_eq!(
        fs::metadata(&path).expect("stat").len(),
        at + 4096,
        "size of the sparse file"
    );
    let used = memnode.stats().used;
    assert!(
        used < at,
        "a 100 MiB hole should take no remote memory, but the memnode has {} MiB in use",
        used / MIB
    );

    let mut r = UncachedReader::open(&path).expect("open");
    let zeros = vec![0u8; MIB as usize];
    for i in 0..100u64 {
        let got = r.read_at(i * MIB, MIB as usize).expect("reading the hole");
        assert_bytes_eq(&zeros, &got, i * MIB, "the hole");
    }
    let got = r.read_at(at, 8192).expect("reading the data");
    assert_bytes_eq(&tail, &got, at, "data after the hole (and EOF after it)");
    drop(r);
    let used_after = memnode.stats().used;
    assert!(
        used_after < at,
        "reading a hole should not allocate remote memory: {} MiB in use",
        used_after / MIB
    );
    fsd.unmount();
}

#[test]
fn chmod_chown_and_utimens_are_visible_in_stat() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    assert!(
        root,
        "this test changes file owners and must run as root (scripts/test does)"
    );
    let (fsd, _memnode) = mount("64M");
    let path = fsd.join("f");
    write_small(&path, b"attrs");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).expect("chmod 640");
    assert_eq!(
        fs::metadata(&path).expect("stat").mode() & 0o7777,
        0o640,
        "mode after chmod 640"
    );
    fs::set_permissions(&path, fs::Permissions::from_mode(0o4751)).expect("chmod 4751");
    assert_eq!(
        fs::metadata(&path).expect("stat").mode() & 0o7777,
        0o4751,
        "mode after chmod 4751"
    );
    fs::create_dir(fsd.join("d")).expect("mkdir");
    fs::set_permissions(fsd.join("d"), fs::Permissions::from_mode(0o700)).expect("chmod dir");
    let dm = fs::metadata(fsd.join("d")).expect("stat d");
    assert_eq!(dm.mode() & 0o7777, 0o700, "directory mode after chmod");
    assert_eq!(
        dm.mode() & libc::S_IFMT,
        libc::S_IFDIR,
        "chmod keeps the file type"
    );

    std::os::unix::fs::chown(&path, Some(1234), Some(5678)).expect("chown 1234:5678");
    let m = fs::metadata(&path).expect("stat");
    assert_eq!((m.uid(), m.gid()), (1234, 5678), "owner after chown");
    std::os::unix::fs::chown(&path, None, Some(42)).expect("chgrp 42");
    let m = fs::metadata(&path).expect("stat");
    assert_eq!((m.uid(), m.gid()), (1234, 42), "owner after chgrp");

    let atime = UNIX_EPOCH + Duration::new(1_000_000_000, 123_456_789);
    let mtime = UNIX_EPOCH + Duration::new(1_500_000_000, 987_654_321);
    let f = OpenOptions::new().write(true).open(&path).expect("open");
    f.set_times(fs::FileTimes::new().set_accessed(atime).set_modified(mtime))
        .expect("utimens");
    drop(f);
    let m = fs::metadata(&path).expect("stat");
    assert_eq!(
        (m.atime(), m.atime_nsec()),
        (1_000_000_000, 123_456_789),
        "atime after utimens"
    );
    assert_eq!(
        (m.mtime(), m.mtime_nsec()),
        (1_500_000_000, 987_654_321),
        "mtime after utimens"
    );
    assert!(
        m.ctime()
            >= SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .expect("clock")
                .as_secs() as i64
                - 600,
        "ctime should be recent after attribute changes, got {}",
        m.ctime()
    );
    fsd.unmount();
}

#[test]
fn statfs_free_space_follows_what_files_use_in_remote_memory() {
    let (fsd, _memnode) = mount("256M");
    let free = |st: &libc::statvfs| st.f_bfree * st.f_frsize;
    let before = free(&rmemfs_tests::kernel::statvfs(fsd.path()));
    let path = fsd.join("big");
    let pattern = Pattern::for_test("statfs free space");
    pattern.write_file(&path, 48 * MIB);
    fs::File::open(&path)
        .and_then(|f| f.sync_all())
        .expect("fsync");
    let written = free(&rmemfs_tests::kernel::statvfs(fsd.path()));
    println!("free: {before} before, {written} with 48 MiB written");
    assert!(
        before.saturating_sub(written) >= 47 * MIB,
        "48 MiB of data must take at least 47 MiB off the free space: {before} -> {written}"
    );
    assert!(
        before.saturating_sub(written) <= 48 * MIB + 4 * MIB,
        "48 MiB of data took {} bytes off the free space",
        before - written
    );
    fs::remove_file(&path).expect("unlink");
    // The kernel sends RELEASE for the closed handles asynchronously, and an unlinked
    // file's blocks go back only once its last handle is released: wait, bounded.
    let mut after = 0;
    let returned = rmemfs_tests::poll_until(Duration::from_secs(10), || {
        after = free(&rmemfs_tests::kernel::statvfs(fsd.path()));
        (after + MIB >= before).then_some(())
    });
    println!("free after unlink: {after}");
    assert!(
        returned.is_some(),
        "unlinking gives the space back within 10 s: {before} before, {after} after"
    );
    fsd.unmount();
}

#[test]
fn statfs_reports_the_memnode_capacity() {
    let (fsd, memnode) = mount("256M");
    let st = rmemfs_tests::kernel::statvfs(fsd.path());
    let total = st.f_blocks * st.f_frsize;
    let cap = memnode.capacity();
    println!(
        "statfs: {} blocks of {} = {total} bytes; memnode capacity {cap}",
        st.f_blocks, st.f_frsize
    );
    assert!(
        total.abs_diff(cap) <= cap / 20,
        "statfs says {total} bytes ({} blocks of {}), the memnode lends {cap}: expected within 5%",
        st.f_blocks,
        st.f_frsize
    );
    assert!(
        st.f_bfree <= st.f_blocks && st.f_bavail <= st.f_blocks,
        "free blocks exceed the total: {} {} of {}",
        st.f_bfree,
        st.f_bavail,
        st.f_blocks
    );
    fsd.unmount();
}

#[test]
fn embedded_memnode_mount_round_trips_data() {
    let pattern = Pattern::for_test("embedded memnode");
    // No --memnode: fsd starts its own. A 1 MiB cache makes the data go through it.
    let fsd = FsdMount::start(&["--cache", "1M"]);
    let path = fsd.join("f");
    let len = 16 * MIB + 777;
    pattern.write_file(&path, len);
    pattern.verify_file(&path, len);
    let mut f = OpenOptions::new()
        .append(true)
        .open(&path)
        .expect("open for append");
    f.write_all(b"appended").expect("append");
    drop(f);
    let got = read_uncached(&path);
    assert_eq!(got.len() as u64, len + 8, "size after append");
    assert_bytes_eq(b"appended", &got[len as usize..], len, "appended bytes");
    fsd.unmount();
}
