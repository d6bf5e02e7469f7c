//! `fsd --direct-io` (the default): every handle bypasses the kernel's page cache. Plain buffered
//! reads and writes round-trip byte for byte through a cache smaller than the file
//! (so the data comes back from the memnode), every read reaches fsd however recently
//! the same bytes were read (fsd counts the bytes it serves), and shared mappings stay
//! coherent with read(2) and write(2) on kernels that allow them (Linux 6.6). On the
//! `--page-cache` mount the same second read never reaches fsd, which shows the count can
//! tell the two apart. A write the kernel splits inside a sector (from a buffer that
//! is not page-aligned) reads nothing from the memnode.

use rmemfs_tests::config::SMALL_CACHE;
use rmemfs_tests::data::{assert_bytes_eq, create};
use rmemfs_tests::kernel::Mapping;
use rmemfs_tests::{heavy_test, FsdMount, FsdStats, MemnodeProc, Pattern, StatsFile, MIB};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::time::Duration;

/// What fsd logs when the kernel will not map direct-I/O files shared.
const NO_SHARED_MMAP: &str = "cannot map files of a direct-I/O mount shared";

fn mount(memnode: &MemnodeProc, stats: &StatsFile, extra: &[&str]) -> FsdMount {
    let mut args = SMALL_CACHE.to_vec();
    args.extend(["--stats-file", stats.arg()]);
    args.extend_from_slice(extra);
    FsdMount::with_memnode(memnode, &args)
}

/// Bytes fsd has returned to read requests so far.
fn served(s: &FsdStats) -> u64 {
    s.value("file_read_bytes")
}

/// The stats once a full stats period (fsd writes them every second) has passed
/// since the last request.
fn settled(stats: &StatsFile) -> FsdStats {
    std::thread::sleep(Duration::from_millis(2500));
    stats.current()
}

/// Reads `expected.len()` bytes at 0 twice through one descriptor, back to back,
/// checking them against `expected`; returns the bytes fsd served for both reads.
///
/// Back to back because this VM's kernel (Linux 6.18 under Firecracker) lets clean
/// page-cache pages of a FUSE file go within seconds with nothing touching the file
/// and no memory pressure: with 2.5 s between the reads, a few scattered 8 KiB
/// ranges of the MiB reached fsd again in about a third of runs; read back to
/// back, none did in ten.
fn read_twice(path: &std::path::Path, expected: &[u8], stats: &StatsFile) -> u64 {
    let f = File::open(path).expect("open for reading");
    let mut buf = vec![0u8; expected.len()];
    let before = served(&settled(stats));
    f.read_exact_at(&mut buf, 0).expect("first read");
    assert_bytes_eq(expected, &buf, 0, "first read");
    f.read_exact_at(&mut buf, 0).expect("second read");
    assert_bytes_eq(expected, &buf, 0, "second read of the same bytes");
    served(&settled(stats)) - before
}

#[test]
fn with_direct_io_buffered_io_round_trips_and_every_read_reaches_fsd() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("fsd --direct-io round trip");
    let memnode = MemnodeProc::start("256M");
    let stats = StatsFile::new();
    let fsd = mount(&memnode, &stats, &["--direct-io"]);
    let path = fsd.join("direct");
    let len = 8 * MIB; // four times the cache

    // Unaligned buffered writes: each is a request of its own, of its own size.
    let f = create(&path);
    let mut at = 0u64;
    while at < len {
        let n = (100_003).min(len - at);
        f.write_all_at(&pattern.bytes(at, n as usize), at)
            .unwrap_or_else(|e| panic!("write of {n} at {at}: {e}"));
        at += n;
    }
    f.sync_all().expect("fsync");
    drop(f);
    let s = settled(&stats);
    assert!(
        s.value("remote_write_bytes") >= len,
        "the whole file went to the memnode: {s}"
    );
    pattern.verify_file(&path, len);

    let served = read_twice(&path, &pattern.bytes(0, MIB as usize), &stats);
    assert_eq!(
        served,
        2 * MIB,
        "each 1 MiB read reaches fsd whole: bytes fsd served for both"
    );
    fsd.unmount();
}

#[test]
fn with_direct_io_writes_from_an_unaligned_buffer_read_nothing_from_the_memnode() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("fsd --direct-io unaligned buffers");
    let memnode = MemnodeProc::start("256M");
    let stats = StatsFile::new();
    let fsd = mount(&memnode, &stats, &["--direct-io"]);
    let path = fsd.join("overwritten");
    let len = 4 * MIB; // twice the cache: the overwrites find most blocks uncached
    pattern.write_file(&path, len);

    // A 1 MiB buffer starting 100 bytes into a page spans 257 pages, more than a
    // request may carry (256), so the kernel splits each write 100 bytes before its
    // end, inside a 4 KiB sector, and sends the 100 bytes after it as a request of
    // their own. fsd must not read that sector from the memnode to complete it.
    let new = pattern.derive(1);
    let mut storage = vec![0u8; 2 * MIB as usize];
    let skew = (4096 + 100 - storage.as_ptr() as usize % 4096) % 4096;
    let f = OpenOptions::new().write(true).open(&path).expect("open");
    let before = settled(&stats);
    let writes = len / MIB;
    for n in 0..writes {
        let buf = &mut storage[skew..skew + MIB as usize];
        buf.copy_from_slice(&new.bytes(n * MIB, MIB as usize));
        f.write_all_at(buf, n * MIB).expect("write");
    }
    f.sync_all().expect("fsync");
    drop(f);
    let after = settled(&stats);
    let requests = after.value("file_writes") - before.value("file_writes");
    assert!(
        requests > writes,
        "the kernel split the {writes} writes (fsd got {requests} requests)"
    );
    assert_eq!(
        after.value("remote_reads") - before.value("remote_reads"),
        0,
        "no sector was read from the memnode to complete a split write: {after}"
    );
    assert!(after.value("remote_write_bytes") - before.value("remote_write_bytes") >= len);
    new.verify_file(&path, len);
    fsd.unmount();
}

#[test]
fn with_page_cache_the_kernel_answers_a_second_read() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("page cache answers re-reads");
    let memnode = MemnodeProc::start("256M");
    let stats = StatsFile::new();
    let fsd = mount(&memnode, &stats, &["--page-cache"]);
    let path = fsd.join("cached");
    pattern.write_file(&path, MIB);
    rmemfs_tests::kernel::drop_page_cache();
    let served = read_twice(&path, &pattern.bytes(0, MIB as usize), &stats);
    assert_eq!(
        served, MIB,
        "the first read reached fsd and the second came from the kernel's page cache: \
         bytes fsd served for both"
    );
    fsd.unmount();
}

#[test]
fn with_direct_io_a_shared_mapping_is_coherent_with_read_and_write() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("fsd --direct-io and mmap");
    let memnode = MemnodeProc::start("256M");
    let stats = StatsFile::new();
    let fsd = mount(&memnode, &stats, &["--direct-io"]);
    let path = fsd.join("mapped");
    let len = MIB as usize;
    create(&path)
        .write_all_at(&pattern.bytes(0, len), 0)
        .expect("write the file");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .expect("open read-write");
    let map = Mapping::shared(&file, len);
    if fsd.stderr().contains(NO_SHARED_MMAP) {
        let e = map
            .err()
            .expect("fsd said the kernel refuses shared mappings");
        assert_eq!(
            e.raw_os_error(),
            Some(libc::ENODEV),
            "a kernel without FUSE_DIRECT_IO_ALLOW_MMAP refuses with ENODEV: {e}"
        );
        println!("this kernel refuses shared mappings of direct-I/O files (ENODEV), as fsd said");
        fsd.unmount();
        return;
    }
    let mut map = map.expect("mmap MAP_SHARED of a file on a --direct-io mount");
    assert_bytes_eq(&pattern.bytes(0, len), map.as_slice(), 0, "the mapping");

    // write(2) then the mapping.
    let written = pattern.derive(1).bytes(0, 10_000);
    file.write_all_at(&written, 5_000).expect("write");
    assert_bytes_eq(
        &written,
        &map.as_slice()[5_000..15_000],
        5_000,
        "the mapping after a write(2) over it",
    );

    // Stores, then read(2) before any msync: the kernel writes them back first.
    let stored = pattern.derive(2).bytes(0, 70_000);
    map.as_mut_slice()[200_000..270_000].copy_from_slice(&stored);
    let mut got = vec![0u8; stored.len()];
    file.read_exact_at(&mut got, 200_000).expect("read");
    assert_bytes_eq(
        &stored,
        &got,
        200_000,
        "read(2) after stores to the mapping",
    );
    drop(map);
    drop(file);
    let mut expected = pattern.bytes(0, len);
    expected[5_000..15_000].copy_from_slice(&written);
    expected[200_000..270_000].copy_from_slice(&stored);
    assert_bytes_eq(
        &expected,
        &std::fs::read(&path).expect("read the whole file"),
        0,
        "the whole file after unmapping",
    );
    fsd.unmount();
}
