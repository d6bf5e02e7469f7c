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
