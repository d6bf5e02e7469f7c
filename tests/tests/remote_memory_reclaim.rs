//! Unlink and truncate give remote memory back: the memnode's used bytes fall.

use rmemfs_tests::{heavy_test, poll_until, FsdMount, MemnodeProc, Pattern, MIB};
use std::fs::OpenOptions;
use std::time::Duration;

const FILE_LEN: u64 = 192 * MIB;
/// How long fsd may take to hand freed chunks back (it may do so lazily).
const GIVE_BACK_LIMIT: Duration = Duration::from_secs(20);

/// Writes the big file, and returns the memnode's used bytes once it is on the memnode.
fn write_big(memnode: &MemnodeProc, fsd: &FsdMount, pattern: Pattern) -> u64 {
    pattern.write_file(&fsd.join("big"), FILE_LEN);
    let used = memnode.stats().used;
    assert!(
        used >= FILE_LEN,
        "after fsync of a {} MiB file the memnode reports only {} MiB used",
        FILE_LEN / MIB,
        used / MIB
    );
    used
}

/// Waits for the memnode's used bytes to fall by at least half the file's size.
fn assert_used_falls(memnode: &MemnodeProc, before: u64, what: &str) {
    let target = before - FILE_LEN / 2;
    let mut last = before;
    let fell = poll_until(GIVE_BACK_LIMIT, || {
        last = memnode.stats().used;
        (last <= target).then_some(last)
    });
    assert!(
        fell.is_some(),
        "after {what} of a {} MiB file the memnode's used bytes should fall by at least {} MiB \
         within {GIVE_BACK_LIMIT:?}: {} MiB before, still {} MiB",
        FILE_LEN / MIB,
        FILE_LEN / 2 / MIB,
        before / MIB,
        last / MIB
    );
    println!(
        "{what}: memnode used {} MiB -> {} MiB",
        before / MIB,
        last / MIB
    );
}

#[test]
fn unlink_of_a_big_file_gives_its_remote_memory_back() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("unlink gives memory back");
    let memnode = MemnodeProc::start("512M");
    let fsd = FsdMount::with_memnode(&memnode, &["--cache", "16M"]);
    let before = write_big(&memnode, &fsd, pattern);
    std::fs::remove_file(fsd.join("big")).expect("unlink of the big file");
    assert_used_falls(&memnode, before, "unlink");
    fsd.unmount();
}

#[test]
fn truncate_of_a_big_file_to_zero_gives_its_remote_memory_back() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("truncate gives memory back");
    let memnode = MemnodeProc::start("512M");
    let fsd = FsdMount::with_memnode(&memnode, &["--cache", "16M"]);
    let before = write_big(&memnode, &fsd, pattern);
    let f = OpenOptions::new()
        .write(true)
        .open(fsd.join("big"))
        .expect("opening the big file");
    f.set_len(0).expect("truncate to 0");
    f.sync_all().expect("fsync after truncate");
    drop(f);
    assert_eq!(
        std::fs::metadata(fsd.join("big")).expect("stat").len(),
        0,
        "size after truncate to 0"
    );
    assert_used_falls(&memnode, before, "truncate to 0");
    fsd.unmount();
}
