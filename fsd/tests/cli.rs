//! fsd's command line: bad options and transport selection fail clearly, never
//! with a panic.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn fsd(args: &[&str]) -> (Output, Duration) {
    let dir = std::env::temp_dir().join(format!("fsd-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mountpoint");
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_fsd"))
        .arg(&dir)
        .args(args)
        .output()
        .expect("run fsd");
    (out, start.elapsed())
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn verbs_without_an_rdma_device_fails_at_once_naming_the_device() {
    if let Ok(dev) = rmemfs_common::fabric::verbs_device() {
        println!("SKIPPED: this host has RDMA device {dev}; the no-device error cannot occur");
        return;
    }
    for extra in [&[][..], &["--memnode", "192.0.2.1:7070"][..]] {
        let mut args = vec!["--transport", "verbs"];
        args.extend_from_slice(extra);
        let (out, took) = fsd(&args);
        let err = stderr(&out);
        assert!(!out.status.success(), "fsd {args:?} must fail: {err}");
        assert!(err.contains("no RDMA device"), "fsd {args:?}: {err}");
        assert!(!err.contains("panicked"), "fsd {args:?} panicked: {err}");
        assert!(took < Duration::from_secs(10), "fsd {args:?} took {took:?}");
    }
}

#[test]
fn a_poll_budget_that_is_not_0_to_a_second_in_micros_is_a_usage_error() {
    for bad in ["-1", "lots", "1000001", "100us"] {
        let (out, _) = fsd(&[&format!("--poll-us={bad}")]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "--poll-us {bad}: {err}");
        assert!(err.contains("--poll-us"), "--poll-us {bad}: {err}");
    }
}

#[test]
fn an_unknown_transport_is_a_usage_error() {
    let (out, _) = fsd(&["--transport", "carrier-pigeon"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("unknown transport"), "{err}");
}

#[test]
fn an_unknown_mount_option_or_an_empty_fsname_is_a_usage_error_naming_it() {
    for (args, says) in [
        (
            &["-o", "nosuid,bogus"][..],
            "unknown mount option \"bogus\"",
        ),
        (
            &["-o", "ro", "-o", "cache=1G"][..],
            "unknown mount option \"cache=1G\"",
        ),
        (&["--fsname", ""][..], "non-empty"),
    ] {
        let (out, _) = fsd(args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "fsd {args:?}: {err}");
        assert!(err.contains(says), "fsd {args:?}: {err}");
    }
}
