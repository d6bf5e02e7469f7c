//! copy_file_range(2) on the mount is served by fsd, inside remote memory: a program
//! that copies a file larger than fsd's cache with it (as newer `cp` does; Debian
//! 12's cp 9.1 still reads and writes) gets the copy's whole blocks made by the
//! memnode that holds the source, without the bytes passing through fsd, and the
//! copy reads back exactly from remote memory.

use rmemfs_tests::config::{BLOCK, BLOCK_SIZE};
use rmemfs_tests::{FsdMount, MemnodeProc, Pattern, StatsFile, MIB};
use std::process::Command;
use std::time::Duration;

const LEN: u64 = 48 * MIB;

/// Copies `src` to `dst` with a copy_file_range loop from byte `skip` of `src` to
/// byte `skip2` of `dst`, as a copying program would.
fn copy_file_range(src: &std::path::Path, dst: &std::path::Path, skip: u64, skip2: u64) {
    let script = "import os, sys\n\
                  s = os.open(sys.argv[1], os.O_RDONLY)\n\
                  d = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)\n\
                  a, b = int(sys.argv[3]), int(sys.argv[4])\n\
                  while True:\n\
                  \x20   n = os.copy_file_range(s, d, 1 << 30, a, b)\n\
                  \x20   if n == 0: break\n\
                  \x20   a += n; b += n\n";
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(src)
        .arg(dst)
        .arg(skip.to_string())
        .arg(skip2.to_string())
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "the copy_file_range loop failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_copy_file_range_loop_is_copied_by_the_memnode_and_reads_back_exact() {
    let pattern = Pattern::for_test("copy_file_range");
    let memnode = MemnodeProc::start("256M");
    let stats = StatsFile::new();
    let fsd = FsdMount::with_memnode(
        &memnode,
        &[
            "--cache",
            "16M",
            "--block-size",
            BLOCK_SIZE,
            "--stats-file",
            stats.arg(),
        ],
    );
    pattern.write_file(&fsd.join("src"), LEN);
    let before = stats.current();
    copy_file_range(&fsd.join("src"), &fsd.join("dst"), 0, 0);
    let after = stats.wait_for(Duration::from_secs(10), "the copy", |s| {
        s.value("file_copy_bytes") >= before.value("file_copy_bytes") + LEN
    });
    let copies = after.value("file_copies") - before.value("file_copies");
    let by_memnode = after.value("memnode_copy_bytes") - before.value("memnode_copy_bytes");
    let through = after.value("remote_write_bytes") - before.value("remote_write_bytes");
    println!(
        "copy of {} MiB: {copies} requests, {} MiB copied by the memnode, {} MiB \
         written to remote memory",
        LEN / MIB,
        by_memnode / MIB,
        through / MIB
    );
    assert!(copies >= 1, "fsd served no copy request");
    assert_eq!(by_memnode, LEN, "every block copied by the memnode");
    assert!(
        through < LEN / 8,
        "{through} bytes went through fsd to remote memory for a {LEN}-byte copy"
    );
    fsd.push_out_of_cache(16 * MIB, BLOCK);
    pattern.verify_file(&fsd.join("dst"), LEN);
    pattern.verify_file(&fsd.join("src"), LEN);
    fsd.unmount();
}

#[test]
fn a_copy_at_offsets_not_as_far_into_their_blocks_is_exact_too() {
    let pattern = Pattern::for_test("copy_file_range_unaligned");
    let fsd = FsdMount::start(&["--cache", "4M", "--embedded-size", "128M"]);
    let len = 8 * MIB + 12_345;
    pattern.write_file(&fsd.join("src"), len);
    // From byte 1000 to byte 4096 + 1000 (blocks line up), then to byte 7 (they don't).
    for (name, skip2) in [("lined-up", 4096 + 1000), ("shifted", 7)] {
        copy_file_range(&fsd.join("src"), &fsd.join(name), 1000, skip2);
        fsd.push_out_of_cache(4 * MIB, BLOCK);
        let got = std::fs::read(fsd.join(name)).expect("read the copy");
        assert_eq!(got.len() as u64, skip2 + len - 1000, "{name}: size");
        assert!(
            got[..skip2 as usize].iter().all(|&b| b == 0),
            "{name}: head"
        );
        assert!(
            got[skip2 as usize..] == pattern.bytes(1000, (len - 1000) as usize)[..],
            "{name}: the copied bytes differ"
        );
    }
    fsd.unmount();
}
