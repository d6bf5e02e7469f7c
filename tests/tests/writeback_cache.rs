//! `fsd --writeback-cache`: the kernel caches writes and writes them back to fsd
//! later. Small writes reach fsd as a few large ones, fsync puts them on the memnode,
//! and they read back byte for byte once the page cache has dropped them. SEEK_DATA
//! and SEEK_HOLE never call a range a hole that the kernel holds data for but fsd has
//! not seen. (A full remote memory in this mode: full_remote_memory.rs. fsx, pjdfstest
//! and the real programs run on such a mount in scripts/conformance.)

use rmemfs_tests::config::SMALL_CACHE;
use rmemfs_tests::data::create;
use rmemfs_tests::kernel::drop_page_cache;
use rmemfs_tests::{heavy_test, FsdMount, FsdStats, MemnodeProc, Pattern, StatsFile, MIB};
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::time::Duration;

const WRITE: usize = 4096;

fn mount(memnode: &MemnodeProc, stats: &StatsFile) -> FsdMount {
    let mut args = SMALL_CACHE.to_vec();
    args.extend(["--stats-file", stats.arg(), "--writeback-cache"]);
    FsdMount::with_memnode(memnode, &args)
}

#[test]
fn small_writes_reach_fsd_in_runs_and_read_back_from_the_memnode() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("fsd --writeback-cache round trip");
    let memnode = MemnodeProc::start("256M");
    let stats = StatsFile::new();
    let fsd = mount(&memnode, &stats);
    let path = fsd.join("small-writes");
    let len = 8 * MIB; // four times fsd's cache
    let calls = len / WRITE as u64;

    let f = create(&path);
    for i in 0..calls {
        let at = i * WRITE as u64;
        f.write_all_at(&pattern.bytes(at, WRITE), at)
            .unwrap_or_else(|e| panic!("write of {WRITE} at {at}: {e}"));
    }
    f.sync_all().expect("fsync");

    // fsync returns once fsd has the data and has written it to the memnode; the
    // stats file follows within a second.
    let s: FsdStats = stats.wait_for(
        Duration::from_secs(10),
        "fsd's counters to show the fsynced file",
        |s| s.value("file_write_bytes") >= len,
    );
    let requests = s.value("file_writes");
    println!(
        "{calls} write(2) calls of {WRITE} bytes reached fsd as {requests} write requests; \
         {} bytes written to the memnode",
        s.value("remote_write_bytes")
    );
    assert!(
        requests <= calls / 8,
        "{calls} sequential write(2) calls of {WRITE} bytes reached fsd as {requests} \
         requests: the kernel should have cached them and written them back in runs"
    );
    assert!(
        s.value("remote_write_bytes") >= len,
        "after fsync the memnode should hold the whole {len}-byte file: {s}"
    );
    drop(f);

    // From the memnode: the page cache dropped, fsd's 2 MiB cache holds at most a
    // quarter of the file.
    drop_page_cache();
    pattern.verify_file(&path, len);
    fsd.unmount();
}

/// `lseek(fd, from, whence)`, or the errno it failed with.
fn seek(f: &std::fs::File, from: u64, whence: i32) -> Result<u64, i32> {
    // SAFETY: lseek takes an open descriptor and plain integers.
    let r = unsafe { libc::lseek(f.as_raw_fd(), from as libc::off_t, whence) };
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(r as u64)
    }
}

#[test]
fn seek_data_finds_data_that_fsd_has_not_been_sent() {
    let _serial = heavy_test();
    let memnode = MemnodeProc::start("64M");
    let stats = StatsFile::new();
    let fsd = mount(&memnode, &stats);
    let len = 4 * MIB;
    let at = 2 * MIB;

    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(fsd.join("sparse"))
        .expect("create");
    f.set_len(len)
        .expect("ftruncate to 4 MiB: a file of one hole");
    // Cached in the kernel: fsd sees it at write-back, seconds from now or at fsync.
    f.write_all_at(&[0x5a; WRITE], at)
        .expect("write in the hole");

    let data = seek(&f, 0, libc::SEEK_DATA);
    let hole = seek(&f, 0, libc::SEEK_HOLE);
    println!("before fsync: SEEK_DATA from 0 = {data:?}, SEEK_HOLE from 0 = {hole:?}");
    assert_eq!(
        data,
        Ok(0),
        "SEEK_DATA from 0 must not skip the 4 KiB written at {at}: with the write-back \
         cache the whole file counts as data"
    );
    assert_eq!(
        hole,
        Ok(len),
        "SEEK_HOLE from 0: the only hole is the end of file"
    );
    assert_eq!(
        seek(&f, len, libc::SEEK_DATA),
        Err(libc::ENXIO),
        "SEEK_DATA at the end of file"
    );

    f.sync_all().expect("fsync");
    assert_eq!(seek(&f, 0, libc::SEEK_DATA), Ok(0), "SEEK_DATA after fsync");
    let mut back = vec![0u8; WRITE];
    f.read_exact_at(&mut back, at).expect("read back");
    assert!(
        back.iter().all(|&b| b == 0x5a),
        "the written bytes read back"
    );
    drop(f);
    fsd.unmount();
}
