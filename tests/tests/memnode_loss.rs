//! File data lives in the memnode's memory, not in fsd: fsd's RSS stays far below the
//! file size while the memnode's used bytes cover it. When the memnode is lost (it
//! stayed away past fsd's `--dead-time`), reads that need it fail with EIO in bounded
//! time, and on a soft mount (`--unreachable-timeout`) so do reads of a memnode that
//! stopped answering; the namespace (kept by fsd) stays usable and fsd still
//! unmounts cleanly.

use rmemfs_tests::config::{BLOCK, DEAD_TIME, FAIL_LIMIT, OP_TIMEOUT};
use rmemfs_tests::data::{timed_uncached_read, write_small};
use rmemfs_tests::{
    assert_errno, describe, heavy_test, within, FsdMount, MemnodeProc, Pattern, Transport, MIB,
};
use std::collections::BTreeSet;

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// The namespace is fsd's own: with the memnode gone, listing and stat still work.
fn assert_namespace_usable(fsd: &FsdMount, big_len: u64) {
    let (root, dir, big) = (fsd.path().to_path_buf(), fsd.join("dir"), fsd.join("big"));
    let listed = within(FAIL_LIMIT, "listing the mount root", move || {
        rmemfs_tests::dir_names(&root)
    });
    assert_eq!(listed, set(&["big", "dir"]), "entries of the mount root");
    let d = dir.clone();
    let listed = within(FAIL_LIMIT, "listing a subdirectory", move || {
        rmemfs_tests::dir_names(&d)
    });
    assert_eq!(listed, set(&["small"]), "entries of dir/");
    let meta = within(FAIL_LIMIT, "stat of the big file", move || {
        std::fs::metadata(big)
    });
    let meta = meta.unwrap_or_else(|e| panic!("stat of big after the memnode was lost: {e}"));
    assert_eq!(meta.len(), big_len, "size of big");
    let small = dir.join("small");
    let meta = within(FAIL_LIMIT, "stat of a small file", move || {
        std::fs::symlink_metadata(small)
    });
    let meta = meta.unwrap_or_else(|e| panic!("stat of dir/small after the memnode was lost: {e}"));
    assert!(meta.is_file(), "dir/small is a regular file");
    assert_eq!(meta.len(), 4096, "size of dir/small");
}

#[test]
fn file_data_lives_on_the_memnode_and_its_loss_gives_eio_not_a_hang() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("data lives on the memnode");
    let mut memnode = MemnodeProc::start("512M");
    let cache = 32 * MIB;
    let fsd = FsdMount::with_memnode(
        &memnode,
        &[
            "--cache",
            "32M",
            "--op-timeout",
            OP_TIMEOUT,
            "--dead-time",
            DEAD_TIME,
        ],
    );
    std::fs::create_dir(fsd.join("dir")).expect("mkdir dir");
    write_small(&fsd.join("dir/small"), &[7u8; 4096]);

    let len = 256 * MIB;
    let path = fsd.join("big");
    let file = rmemfs_tests::data::create(&path);
    let mut max_rss = fsd.rss_bytes();
    pattern
        .write_range(&file, 0, len, |done| {
            if done % (16 * MIB) == 0 {
                max_rss = max_rss.max(fsd.rss_bytes());
            }
        })
        .expect("writing the 256 MiB file");
    file.sync_all().expect("fsync of the 256 MiB file");
    drop(file);
    max_rss = max_rss.max(fsd.rss_bytes());
    let rss_limit = cache + 64 * MIB;
    println!(
        "fsd RSS peaked at {} MiB while writing {} MiB",
        max_rss / MIB,
        len / MIB
    );
    assert!(
        max_rss < rss_limit,
        "fsd's RSS reached {} MiB while writing a {} MiB file with a {} MiB cache: \
         file data should live on the memnode, not in fsd (limit {} MiB)",
        max_rss / MIB,
        len / MIB,
        cache / MIB,
        rss_limit / MIB
    );
    let stats = memnode.stats();
    assert!(
        stats.used >= len,
        "after fsync of a {len}-byte file the memnode should have at least that many bytes \
         in use, but reports {stats:?}"
    );

    // None of the file is in fsd's cache now: its first block reads back from the
    // memnode while it is alive.
    fsd.push_out_of_cache(cache, BLOCK);
    let (r, _) = timed_uncached_read(path.clone(), 0, BLOCK as usize, FAIL_LIMIT);
    let data = r.expect("reading the first block while the memnode is alive");
    rmemfs_tests::data::assert_bytes_eq(&pattern.bytes(0, BLOCK as usize), &data, 0, "first block");

    memnode.kill();
    println!("memnode killed");
    for offset in [64 * MIB, 128 * MIB + BLOCK] {
        let (r, took_now) = timed_uncached_read(path.clone(), offset, BLOCK as usize, FAIL_LIMIT);
        println!(
            "read at {offset} after the memnode died: {} in {took_now:?}",
            describe(&r)
        );
        assert_errno(
            r,
            libc::EIO,
            &format!("reading an uncached block at {offset} after the memnode was killed"),
        );
    }
    assert_namespace_usable(&fsd, len);
    fsd.unmount();
}

/// tcp only, whatever RMEMFS_TRANSPORT says: a stopped memnode process stalls the
/// data path only when that process serves it. Over verbs the NIC (rxe in the kernel,
/// with Soft-RoCE) serves READ and WRITE without the memnode's CPU, so a frozen
/// memnode's data stays readable, as it should (seen in the Soft-RoCE guest: the read
/// succeeded in 0.1 s). The verbs counterpart of "the peer stops answering" is a lost
/// network path, which this harness does not simulate yet.
#[test]
fn a_frozen_memnode_gives_eio_after_the_unreachable_timeout_of_a_soft_mount() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("frozen memnode");
    let memnode = MemnodeProc::start_on(Transport::Tcp, "256M", &[]);
    let fsd = FsdMount::with_memnode(
        &memnode,
        &[
            "--cache",
            "8M",
            "--op-timeout",
            OP_TIMEOUT,
            "--unreachable-timeout",
            "3",
        ],
    );
    std::fs::create_dir(fsd.join("dir")).expect("mkdir dir");
    write_small(&fsd.join("dir/small"), &[7u8; 4096]);
    let len = 64 * MIB;
    let path = fsd.join("big");
    pattern.write_file(&path, len);

    fsd.push_out_of_cache(8 * MIB, BLOCK);

    // SIGSTOP: connections stay open but nothing answers, so only fsd's timeout helps.
    memnode.freeze();
    let (r, took) = timed_uncached_read(path.clone(), 0, BLOCK as usize, FAIL_LIMIT);
    println!("read from a frozen memnode: {} in {took:?}", describe(&r));
    assert_errno(
        r,
        libc::EIO,
        "reading an uncached block from a frozen memnode",
    );
    assert_namespace_usable(&fsd, len);
    fsd.unmount();
    memnode.thaw();
}
