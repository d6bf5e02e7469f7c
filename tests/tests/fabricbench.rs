//! `fabricbench`, the benchmark's measure of the fabric alone, against a real memnode:
//! every job shape moves real, checked data and reports numbers that agree with
//! each other; the memory it borrowed goes back; bad input is a clear error.

use rmemfs_tests::binaries::binary;
use rmemfs_tests::command::run_within;
use rmemfs_tests::memnode::MemnodeProc;
use std::process::{Command, Output};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

fn fabricbench(m: &MemnodeProc, args: &[&str]) -> Output {
    let mut cmd = Command::new(binary("fabricbench"));
    cmd.args([
        "--memnode",
        m.addr(),
        "--transport",
        &m.transport().to_string(),
    ]);
    cmd.args(args);
    run_within(&mut cmd, LIMIT, "fabricbench")
}

/// The number after `"key": ` in `text`.
fn number(text: &str, key: &str) -> f64 {
    let at = text
        .find(&format!("\"{key}\": "))
        .unwrap_or_else(|| panic!("no {key} in {text}"));
    let rest = &text[at + key.len() + 4..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    rest[..end]
        .parse()
        .unwrap_or_else(|e| panic!("{key} in {text}: {e}"))
}

/// The `read` or `write` section of a result.
fn section<'a>(json: &'a str, which: &str) -> &'a str {
    let read = json.find("\"read\": {").expect("a read section");
    let write = json.find("\"write\": {").expect("a write section");
    if which == "read" {
        &json[read..write]
    } else {
        &json[write..]
    }
}

#[test]
fn every_job_shape_moves_checked_data_and_reports_consistent_numbers() {
    let m = MemnodeProc::start("64M");
    let before = m.stats();
    let cases: [(&str, u64, &str, &str); 5] = [
        ("read", 1 << 20, "read", "1"),
        ("write", 1 << 20, "write", "1"),
        ("randread", 4096, "read", "1"),
        ("randwrite", 4096, "write", "1"),
        ("randread", 4096, "read", "3"),
    ];
    for (rw, bs, dir, jobs) in cases {
        let bs_arg = bs.to_string();
        let args = [
            "--rw",
            rw,
            "--bs",
            &bs_arg,
            "--numjobs",
            jobs,
            "--size",
            "16M",
            "--runtime",
            "0.5",
            "--ramp",
            "0.1",
        ];
        let out = fabricbench(&m, &args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{rw} x{jobs} failed: {stderr}");
        let json = String::from_utf8(out.stdout).expect("UTF-8 JSON");
        let moved = section(&json, dir);
        let other = section(&json, if dir == "read" { "write" } else { "read" });
        let bytes = number(moved, "io_bytes");
        let ios = number(moved, "total_ios");
        let ms = number(moved, "runtime");
        assert!(ios > 0.0, "{rw}: no block measured: {json}");
        assert_eq!(
            bytes,
            ios * bs as f64,
            "{rw}: bytes are blocks times block size"
        );
        assert!(
            (450.0..5000.0).contains(&ms),
            "{rw}: measured {ms} ms of 500: {json}"
        );
        let iops = number(moved, "iops");
        assert!(
            (iops - ios * 1000.0 / ms).abs() <= iops * 0.01 + 1.0,
            "{rw}: IOPS {iops} is not {ios} blocks in {ms} ms"
        );
        let p50 = number(moved, "50.000000");
        let p99 = number(moved, "99.000000");
        assert!(
            p50 > 0.0 && p50 <= p99,
            "{rw}: latency percentiles {p50} > {p99}"
        );
        assert_eq!(
            number(other, "io_bytes"),
            0.0,
            "{rw}: only one direction moves"
        );
        assert!(
            stderr.contains("MB/s"),
            "a human summary goes to stderr: {stderr}"
        );
        // The figures, for the log (over verbs in the Soft-RoCE guest, say).
        println!("{}", stderr.trim());
    }
    let after = m.stats();
    assert_eq!(
        (after.allocations, after.used),
        (before.allocations, before.used),
        "every run gave its memory back"
    );
}

#[test]
fn refusals_and_bad_arguments_are_clear_errors_that_leave_nothing_behind() {
    let m = MemnodeProc::start("16M");
    let before = m.stats();
    let failing: [(&[&str], &str); 4] = [
        (&["--rw", "randread", "--size", "64M"], "refused"),
        (&["--rw", "read", "--bs", "4"], "8 bytes for its tag"),
        (
            &["--rw", "read", "--bs", "1M", "--size", "64K"],
            "smaller than one block",
        ),
        (&["--rw", "sideways"], "invalid value 'sideways'"),
    ];
    for (args, says) in failing {
        let out = fabricbench(&m, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(
            stderr.contains(says),
            "{args:?}: expected {says:?} in: {stderr}"
        );
        assert!(out.stdout.is_empty(), "{args:?}: no result on failure");
    }
    let after = m.stats();
    assert_eq!(
        (after.allocations, after.used),
        (before.allocations, before.used),
        "nothing left allocated"
    );

    let guarded = MemnodeProc::start_with("16M", &["--token", "the-right-token-of-the-test"]);
    let out = fabricbench(
        &guarded,
        &[
            "--rw",
            "read",
            "--size",
            "1M",
            "--token",
            "a-wrong-token-of-the-test",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a wrong token was accepted");
    assert!(stderr.contains("refused hello"), "{stderr}");
}
