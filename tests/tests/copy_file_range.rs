//! copy_file_range(2) on the mount is served by fsd itself: a program that copies a
//! large file with it (as newer `cp` does; Debian 12's cp 9.1 still reads and
//! writes) makes copy requests that fsd answers inside its cache, not a read and a
//! write request per chunk through the kernel, and the copy reads back exactly.

use rmemfs_tests::{FsdMount, MemnodeProc, Pattern, StatsFile, MIB};
use std::process::Command;
use std::time::Duration;

const LEN: u64 = 48 * MIB;

#[test]
fn a_copy_file_range_loop_is_served_by_fsd_and_reads_back_exact() {
    let pattern = Pattern::for_test("copy_file_range");
    let memnode = MemnodeProc::start("256M");
    let stats = StatsFile::new();
    let fsd = FsdMount::with_memnode(&memnode, &["--cache", "16M", "--stats-file", stats.arg()]);
    pattern.write_file(&fsd.join("src"), LEN);
    let before = stats.current();
    // The loop a copying program runs: copy_file_range until it returns 0.
    let script = "import os, sys\n\
                  s = os.open(sys.argv[1], os.O_RDONLY)\n\
                  d = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)\n\
                  while os.copy_file_range(s, d, 1 << 30):\n    pass\n";
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(fsd.join("src"))
        .arg(fsd.join("dst"))
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "the copy_file_range loop failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = stats.wait_for(Duration::from_secs(10), "the copy", |s| {
        s.value("file_copy_bytes") >= before.value("file_copy_bytes") + LEN
    });
    let copies = after.value("file_copies") - before.value("file_copies");
    println!("copy of {} MiB: {copies} copy requests", LEN / MIB);
    // The kernel's fallback would have sent reads and writes and no copy at all.
    assert!(
        copies >= LEN / (16 * MIB),
        "{copies} copy requests for {LEN} bytes"
    );
    pattern.verify_file(&fsd.join("dst"), LEN);
    fsd.unmount();
}
