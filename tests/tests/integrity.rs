//! Page checksums through a real mount: bytes of a file changed inside a memnode's
//! memory behind fsd's back (through `/proc/PID/mem`, as a bad DIMM or a stray write
//! on that host would) never come back as file data. With two copies the read gets
//! the right bytes from the other one and the bad copy is rewritten; with one the
//! read fails with EIO, and fsd's statistics count the failure.

use rmemfs_tests::config::{BLOCK, BLOCK_SIZE};
use rmemfs_tests::procmem;
use rmemfs_tests::{FsdMount, MemnodeProc, Pattern, StatsFile};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::Duration;

const CACHE: u64 = 1 << 20;
const FILE: u64 = 2 << 20;
/// The page of the file whose bytes are damaged.
const AT: u64 = FILE / 2 + 3 * 4096;

/// Writes the file and pushes it out of fsd's cache; its pattern.
fn written(fsd: &FsdMount, test: &str) -> Pattern {
    let pattern = Pattern::for_test(test);
    pattern.write_file(&fsd.join("f"), FILE);
    fsd.push_out_of_cache(CACHE, BLOCK);
    pattern
}

/// Where the memnode holds the file's page at `AT`: the one page-aligned address
/// whose bytes are that page's.
fn page_in(memnode: &MemnodeProc, pattern: &Pattern) -> u64 {
    let page = pattern.bytes(AT, 4096);
    let found = procmem::find_pages(memnode.pid(), &page);
    assert_eq!(
        found.len(),
        1,
        "the file's page at {AT} should be in memnode {} exactly once, found at {found:x?}",
        memnode.addr()
    );
    found[0]
}

/// fsd's arguments; `scrub_rate` "0" keeps the scrubber from finding (and counting)
/// a damaged page at the same time as the read a test makes.
fn args<'a>(stats: &'a StatsFile, replicas: &'a str, scrub_rate: &'a str) -> Vec<&'a str> {
    let mut a = vec![
        "--cache",
        "1M",
        "--block-size",
        BLOCK_SIZE,
        "--replicas",
        replicas,
        "--scrub-rate",
        scrub_rate,
    ];
    a.extend(["--stats-file", stats.arg()]);
    a
}

#[test]
fn a_damaged_copy_is_read_past_and_repaired_with_two_copies() {
    let (a, b) = (MemnodeProc::start("64M"), MemnodeProc::start("64M"));
    let stats = StatsFile::new();
    let fsd = FsdMount::with_memnodes(&[&a, &b], &args(&stats, "2", "0"));
    let pattern = written(&fsd, "integrity-two-copies");
    let addr = page_in(&a, &pattern);
    let good = procmem::flip(a.pid(), addr + 100, 8);

    pattern.verify_file(&fsd.join("f"), FILE);
    let s = stats.wait_for(Duration::from_secs(10), "the failure counted", |s| {
        s.value("checksum_failures") >= 1
    });
    assert_eq!(
        s.value("checksum_failures"),
        1,
        "one bad copy, read once: {s}"
    );
    assert!(
        s.value("pages_repaired") >= 1,
        "the bad copy rewritten: {s}"
    );
    assert_eq!(
        procmem::read(a.pid(), addr + 100, 8),
        good,
        "memnode {} holds the right bytes again",
        a.addr()
    );
    // Read again from remote memory: nothing is bad any more.
    fsd.push_out_of_cache(CACHE, BLOCK);
    pattern.verify_file(&fsd.join("f"), FILE);
    std::thread::sleep(Duration::from_millis(1500));
    let s = stats.read().expect("stats");
    assert_eq!(
        s.value("checksum_failures"),
        1,
        "the repaired copy passes: {s}"
    );
    assert!(
        fsd.stderr_with("checksum mismatch")
            .contains("checksum mismatch"),
        "fsd logged the failure"
    );
    fsd.unmount();
}

#[test]
fn with_one_copy_a_damaged_page_fails_with_eio() {
    let memnode = MemnodeProc::start("64M");
    let stats = StatsFile::new();
    let fsd = FsdMount::with_memnode(&memnode, &args(&stats, "1", "0"));
    let pattern = written(&fsd, "integrity-one-copy");
    let addr = page_in(&memnode, &pattern);
    procmem::flip(memnode.pid(), addr + 4000, 1);

    let file = File::open(fsd.join("f")).expect("open");
    let mut page = vec![0u8; 4096];
    let err = file
        .read_exact_at(&mut page, AT)
        .expect_err("a read of the damaged page must fail, not return its bytes");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    let s = stats.wait_for(Duration::from_secs(10), "the failure counted", |s| {
        s.value("checksum_failures") >= 1
    });
    assert_eq!(s.value("checksum_failures"), 1, "{s}");
    assert_eq!(s.value("pages_repaired"), 0, "{s}");
    // The rest of the file still reads.
    let mut before = vec![0u8; 4096];
    file.read_exact_at(&mut before, AT - 4096)
        .expect("the page before");
    assert_eq!(before, pattern.bytes(AT - 4096, 4096));
    drop(file);
    fsd.unmount();
}

#[test]
fn the_scrubber_repairs_a_damaged_copy_nobody_reads() {
    let (a, b) = (MemnodeProc::start("64M"), MemnodeProc::start("64M"));
    let stats = StatsFile::new();
    let fsd_args = args(&stats, "2", "64M");
    let fsd = FsdMount::with_memnodes(&[&a, &b], &fsd_args);
    let pattern = written(&fsd, "integrity-scrub");
    let addr = page_in(&b, &pattern);
    let good = procmem::flip(b.pid(), addr + 2000, 4);
    let s = stats.wait_for(Duration::from_secs(30), "the scrubber's repair", |s| {
        s.value("pages_repaired") >= 1
    });
    assert_eq!(s.value("scrub_bad_pages"), 1, "{s}");
    assert_eq!(s.value("checksum_failures"), 1, "{s}");
    assert_eq!(
        procmem::read(b.pid(), addr + 2000, 4),
        good,
        "memnode {} holds the right bytes again, with no read of the file",
        b.addr()
    );
    stats.wait_for(Duration::from_secs(30), "a later scrub pass", |s| {
        s.value("scrub_passes") >= 2
    });
    assert_eq!(stats.read().expect("stats").value("checksum_failures"), 1);
    fsd.unmount();
}

#[test]
fn on_a_volume_the_sums_outlive_fsd_and_catch_damage_after_a_remount() {
    let memnode = MemnodeProc::start("64M");
    let stats = StatsFile::new();
    let mut fsd_args = args(&stats, "1", "0");
    fsd_args.extend(["--volume", "sums"]);
    let fsd = FsdMount::with_memnode(&memnode, &fsd_args);
    let pattern = Pattern::for_test("integrity-volume");
    pattern.write_file(&fsd.join("f"), FILE);
    fsd.unmount();
    // A new fsd knows the sums only from the volume's metadata.
    let fsd = FsdMount::with_memnode(&memnode, &fsd_args);
    let addr = page_in(&memnode, &pattern);
    procmem::flip(memnode.pid(), addr + 12, 1);
    let file = File::open(fsd.join("f")).expect("open");
    let mut page = vec![0u8; 4096];
    let err = file
        .read_exact_at(&mut page, AT)
        .expect_err("a damaged page of a remounted volume must fail, not read");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    let s = stats.wait_for(Duration::from_secs(10), "the failure counted", |s| {
        s.value("checksum_failures") >= 1
    });
    assert_eq!(s.value("checksum_failures"), 1, "{s}");
    drop(file);
    fsd.unmount();
}
