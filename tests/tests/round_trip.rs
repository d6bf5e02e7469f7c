//! A file much larger than fsd's page cache survives the round trip through remote
//! memory byte for byte.

use rmemfs_tests::{heavy_test, FsdMount, MemnodeProc, Pattern, MIB};
use std::time::Instant;

#[test]
fn a_256_mib_file_through_a_32_mib_cache_reads_back_byte_exact() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("round trip larger than the cache");
    let memnode = MemnodeProc::start("512M");
    let fsd = FsdMount::with_memnode(&memnode, &["--cache", "32M"]);
    let path = fsd.join("big");
    let len = 256 * MIB;

    let t = Instant::now();
    pattern.write_file(&path, len);
    println!("wrote {} MiB in {:?}", len / MIB, t.elapsed());

    let t = Instant::now();
    pattern.verify_file(&path, len);
    println!("read back {} MiB in {:?}", len / MIB, t.elapsed());

    fsd.unmount();
}

/// A script that mounts and stops at once: the SIGTERM arrives as soon as fsd says it
/// mounted, and fsd must still unmount and exit 0 every time (it once took the default
/// action when the signal beat its handlers).
#[test]
fn fsd_stopped_as_soon_as_it_mounts_unmounts_cleanly() {
    let _serial = heavy_test();
    for _ in 0..50 {
        FsdMount::start(&["--embedded-size", "64M", "--cache", "4M"]).unmount();
    }
}
