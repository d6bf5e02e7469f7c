//! stress-ng's filesystem stressors, an outside suite (stress-ng 0.15, Debian's
//! package), on a durable volume: each stressor in turn with `--verify`, every one
//! must pass, fsd must log no failed commit, and the volume must unmount clean and
//! check clean. Stressors that fill the filesystem and then delete what they wrote
//! (fallocate, fsize, fpunch, iomix) are what found volumes wedging once the memnode
//! filled: the deletes could never be committed (`volume/mod.rs`, "Room for the next
//! checkpoint").
//!
//! Left out, with the reason stress-ng would give: `binderfs` needs a kernel with
//! binderfs (it aborts "out of system resources" without one), `io-uring`
//! fails its own IORING_OP_STATX check on tmpfs too (a stress-ng 0.15 bug), and
//! `procfs` reads /proc, not the mount under test: run as root it reads /proc/kmsg,
//! which blocks until the kernel logs something, and on a quiet kernel its threads
//! never return (seen in CI: its readers in `syslog_print` for 8 minutes, stress-ng
//! waiting to join them; a line written to /dev/kmsg let it finish).

use rmemfs_tests::binaries::program;
use rmemfs_tests::command::run_within_watching;
use rmemfs_tests::{heavy_test, volume, FsdMount, MemnodeProc};
use std::process::Command;
use std::time::{Duration, Instant};

const EXCLUDED: &str = "binderfs,io-uring,procfs";

#[test]
fn stress_ng_filesystem_stressors_pass_on_a_volume() {
    let _serial = heavy_test();
    let stress_ng = program("stress-ng", "stress-ng");
    let memnode = MemnodeProc::start("1536M");
    let fsd = FsdMount::with_memnode(&memnode, &["--volume", "stress", "--cache", "64M"]);
    let dir = fsd.join("stress-ng");
    std::fs::create_dir(&dir).expect("mkdir stress-ng");
    let started = Instant::now();
    let mut cmd = Command::new(&stress_ng);
    cmd.args(["--class", "filesystem", "--seq", "1", "--timeout", "2"])
        .args(["--verify", "--exclude", EXCLUDED, "--temp-path"])
        .arg(&dir)
        .current_dir(&dir);
    // A hang fails with what each stressor and each fsd thread was waiting in.
    let out = run_within_watching(
        &mut cmd,
        Duration::from_secs(900),
        "stress-ng",
        &[fsd.pid()],
    );
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    // What stress-ng says about each stressor that did not simply pass.
    let notes: Vec<&str> = text
        .lines()
        .filter(|l| {
            ["fail", "error", "skipping", "aborted", "not supported"]
                .iter()
                .any(|w| l.contains(w))
        })
        .collect();
    println!(
        "stress-ng --class filesystem (all but {EXCLUDED}) in {:.0} s, {}:\n{}",
        started.elapsed().as_secs_f64(),
        out.status,
        notes.join("\n")
    );
    assert!(
        out.status.success(),
        "stress-ng's filesystem stressors should all pass on a volume, but it exited with \
         {}:\n{}",
        out.status,
        text.lines().rev().take(60).collect::<Vec<_>>().join("\n")
    );
    let log = fsd.stderr();
    assert!(
        !log.contains("commit failed"),
        "fsd failed to commit during stress-ng:\n{}",
        log.lines()
            .filter(|l| l.contains("ERROR") || l.contains("WARN"))
            .take(20)
            .collect::<Vec<_>>()
            .join("\n")
    );
    std::fs::remove_dir_all(&dir).expect("rm -r stress-ng");
    fsd.unmount();
    volume::assert_fsck_clean("stress", &[&memnode], "after stress-ng");
}
