//! `rmemfs status MOUNTPOINT`, end to end: on a mount with two memnodes and two
//! copies of every block, the report (text and `--json`) shows what the test did:
//! the files written, both memnodes up with their copies and memory; then, with one
//! memnode killed, that memnode down and every block degraded (exit 1, a
//! re-replication bar waiting for a memnode); then, with the memnode back, every
//! block restored to two copies (exit 0). And it says plainly when there is no live
//! rmemfs mount to report on (exit 2).

use rmemfs_tests::config::{BLOCK, DEAD_TIME};
use rmemfs_tests::status::{self, u64_at};
use rmemfs_tests::{FsdMount, MemnodeProc, Pattern, MIB};
use serde_json::Value;
use std::time::Duration;

const FILES: u64 = 3;
const FILE: u64 = MIB;
/// Blocks the files take (whole blocks, one file after another).
const BLOCKS: u64 = FILES * FILE / BLOCK;
/// Time for fsd to notice a change, count copies and rewrite its status.
const SETTLE: Duration = Duration::from_secs(30);

fn memnode_up(v: &Value, i: usize) -> bool {
    v.pointer(&format!("/memnodes/{i}/up")) == Some(&Value::Bool(true))
}

#[test]
fn status_shows_memnodes_copies_and_a_memnode_lost_and_restored() {
    let mut nodes = [MemnodeProc::start("128M"), MemnodeProc::start("128M")];
    let fsd = FsdMount::with_memnodes(
        &[&nodes[0], &nodes[1]],
        &[
            "--replicas",
            "2",
            "--cache",
            "4M",
            "--chunk-size",
            "4M",
            "--dead-time",
            DEAD_TIME,
        ],
    );
    let mount = fsd.path().to_path_buf();
    let pattern = Pattern::for_test("status");
    for i in 0..FILES {
        let path = fsd.join(format!("file{i}"));
        pattern.derive(i).write_file(&path, FILE);
        std::fs::File::open(&path)
            .and_then(|f| f.sync_all())
            .unwrap_or_else(|e| panic!("fsync of {}: {e}", path.display()));
    }

    // Healthy: every block on both memnodes, both heard from.
    let (code, v) = status::wait_for(
        &mount,
        SETTLE,
        "the files' blocks on both memnodes",
        |_, v| {
            v["blocks"].as_u64() >= Some(BLOCKS)
                && (0..2).all(|i| {
                    v.pointer(&format!("/memnodes/{i}/copies"))
                        .and_then(Value::as_u64)
                        >= Some(BLOCKS)
                        && v.pointer(&format!("/memnodes/{i}/used"))
                            .and_then(Value::as_u64)
                            >= Some(FILES * FILE)
                })
        },
    );
    assert_eq!(code, 0, "a healthy mount exits 0: {v}");
    assert_eq!(v["health"], "healthy");
    assert_eq!(v["mountpoint"], mount.to_string_lossy().as_ref());
    assert_eq!(u64_at(&v, "/pid"), u64::from(fsd.pid()));
    assert_eq!(u64_at(&v, "/replicas"), 2);
    assert_eq!(u64_at(&v, "/block_size"), BLOCK);
    assert_eq!(u64_at(&v, "/memnodes_up"), 2);
    assert_eq!(v["volume"], Value::Null);
    for (i, node) in nodes.iter().enumerate() {
        assert_eq!(v["memnodes"][i]["name"], node.addr());
        assert_eq!(
            u64_at(&v, &format!("/memnodes/{i}/capacity")),
            node.capacity()
        );
    }
    assert_eq!(u64_at(&v, "/blocks_degraded"), 0);
    assert_eq!(u64_at(&v, "/blocks_lost"), 0);
    assert_eq!(v["rereplication"]["state"], "idle");
    assert!(
        u64_at(&v, "/counters/file_write_bytes") >= FILES * FILE,
        "the --stats-file counters ride along: {v}"
    );
    assert_eq!(u64_at(&v, "/checksum_failures"), 0);
    let text = status::run(&mount, false).ok("status of a healthy mount");
    let first = text.stdout.lines().next().unwrap_or("");
    assert_eq!(
        first,
        format!("{}: healthy", mount.display()),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout.contains("memnodes: 2 of 2 up"),
        "{}",
        text.stdout
    );
    for node in &nodes {
        let row: Vec<String> = text
            .stdout
            .lines()
            .find(|l| l.trim_start().starts_with(node.addr()))
            .unwrap_or_else(|| panic!("no row for memnode {}:\n{}", node.addr(), text.stdout))
            .split_whitespace()
            .map(str::to_string)
            .collect();
        assert_eq!(row[1], "up", "{row:?}");
        assert!(
            row.last().and_then(|c| c.parse::<u64>().ok()) >= Some(BLOCKS),
            "the row shows the memnode's copies: {row:?}"
        );
    }
    assert!(
        text.stdout
            .contains("re-replication idle: every block has its 2 copies"),
        "{}",
        text.stdout
    );

    // One memnode killed: down, every block degraded, re-replication waiting for a
    // memnode to copy to (only one is up for two copies).
    let addr = nodes[1].addr().to_string();
    println!("killing memnode 1 ({addr})");
    nodes[1].kill();
    let (code, v) = status::wait_for(&mount, SETTLE, "memnode 1 down, blocks degraded", |_, v| {
        !memnode_up(v, 1) && v["blocks_degraded"].as_u64() >= Some(BLOCKS)
    });
    assert_eq!(code, 1, "a degraded mount exits 1: {v}");
    assert_eq!(v["health"], "degraded");
    assert!(memnode_up(&v, 0));
    assert_eq!(u64_at(&v, "/memnodes_up"), 1);
    assert_eq!(
        u64_at(&v, "/blocks_lost"),
        0,
        "the other copy of each block is there"
    );
    assert_eq!(v["rereplication"]["state"], "waiting");
    let problems = v["problems"].to_string();
    assert!(
        problems.contains(&format!("memnode {addr} is down")),
        "{problems}"
    );
    let text = status::run(&mount, false);
    assert_eq!(text.code, 1, "{}", text.context());
    assert!(
        text.stdout.starts_with(&format!(
            "{}: DEGRADED\n  ! memnode {addr} is down\n",
            mount.display()
        )),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout.contains("memnodes: 1 of 2 up"),
        "{}",
        text.stdout
    );
    let row = text
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with(&addr))
        .unwrap_or_else(|| panic!("no row for {addr}:\n{}", text.stdout));
    assert_eq!(row.split_whitespace().nth(1), Some("DOWN"), "{row}");
    let bar = text
        .stdout
        .lines()
        .find(|l| l.starts_with("re-replication"))
        .unwrap_or_else(|| panic!("no re-replication line:\n{}", text.stdout));
    assert!(
        bar.contains("[")
            && bar.contains("0%")
            && bar.contains("(waiting: 1 memnode up, 2 needed)"),
        "{bar}"
    );

    // The memnode back (empty): fsd reconnects and copies every block to it again.
    nodes[1] = MemnodeProc::start_at(&addr, "128M");
    let (code, v) = status::wait_for(
        &mount,
        Duration::from_secs(60),
        "every block restored",
        |c, v| {
            c == 0
                && memnode_up(v, 1)
                && v["blocks_degraded"].as_u64() == Some(0)
                && v.pointer("/memnodes/1/copies").and_then(Value::as_u64) >= Some(BLOCKS)
        },
    );
    assert_eq!(v["health"], "healthy", "{v}");
    assert!(
        u64_at(&v, "/rereplication/copies_restored") >= BLOCKS,
        "every block got its second copy back: {v}"
    );
    assert_eq!(code, 0);
    let text = status::run(&mount, false).ok("status after the restore");
    assert!(
        text.stdout.contains("memnodes: 2 of 2 up"),
        "{}",
        text.stdout
    );
    for i in 0..FILES {
        pattern
            .derive(i)
            .verify_file(&fsd.join(format!("file{i}")), FILE);
    }
    fsd.unmount();

    // No mount there any more.
    let gone = status::run(&mount, false);
    assert_eq!(gone.code, 2, "{}", gone.context());
    assert!(gone.stderr.contains("is not mounted"), "{}", gone.context());
}

#[test]
fn status_refuses_what_is_not_a_live_rmemfs_mount() {
    let dir = rmemfs_tests::fresh_dir("rmemfs-status");
    let r = status::run(&dir, false);
    let _ = std::fs::remove_dir(&dir);
    assert_eq!(r.code, 2, "{}", r.context());
    assert!(r.stderr.contains("is not mounted"), "{}", r.context());
    let r = status::run(std::path::Path::new("/proc"), true);
    assert_eq!(r.code, 2, "{}", r.context());
    assert!(
        r.stderr.contains("is not an rmemfs mount (it is proc"),
        "{}",
        r.context()
    );
    assert!(r.stdout.is_empty(), "no report on stdout: {}", r.context());
}
