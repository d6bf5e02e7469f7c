//! The `memnode` binary as scripts use it: the transport and listening lines on
//! stdout, signals, and clear failures for bad arguments, a busy port and a transport
//! this host cannot provide.

mod support;

use rmemfs_common::control::{self, ControlError};
use rmemfs_common::fabric::tcp::TcpEndpoint;
use rmemfs_common::fabric::{self, Transport};
use rmemfs_common::protocol::ErrorCode;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use support::TIMEOUT;

fn memnode(args: &[&str], token_env: Option<&str>) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_memnode"));
    cmd.args(args)
        .env("RUST_LOG", "info")
        .env_remove("RMEMFS_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(t) = token_env {
        cmd.env("RMEMFS_TOKEN", t);
    }
    cmd
}

/// A running memnode process, killed if the test fails before it exits.
struct Running {
    child: Child,
    addr: String,
    /// The `memnode transport ...` line.
    transport: String,
    /// The `memnode listening on ...` line.
    line: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the binary over tcp (the tests talk to it with a [`TcpEndpoint`]).
fn spawn(args: &[&str], token_env: Option<&str>) -> Running {
    let args: Vec<&str> = args.iter().copied().chain(["--transport", "tcp"]).collect();
    spawn_as_is(&args, token_env)
}

/// Starts the binary with exactly `args` and waits (bounded) for its stdout lines:
/// the transport line, then the listening line.
fn spawn_as_is(args: &[&str], token_env: Option<&str>) -> Running {
    let mut child = memnode(args, token_env)
        .spawn()
        .expect("the memnode binary starts");
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let mut first_two = || Some((lines.next()?.ok()?, lines.next()?.ok()?));
        let _ = tx.send(first_two());
    });
    let (transport, line) = match rx.recv_timeout(TIMEOUT) {
        Ok(Some(lines)) => lines,
        Ok(None) | Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "expected a transport and a listening line on stdout within {TIMEOUT:?}; \
                 stderr: {}",
                stderr_of(&mut child)
            );
        }
    };
    assert!(
        transport.starts_with("memnode transport "),
        "expected `memnode transport ...` first, got {transport:?}"
    );
    let addr = line
        .split_whitespace()
        .skip_while(|w| *w != "on")
        .nth(1)
        .unwrap_or_else(|| panic!("expected `memnode listening on <ADDR> ...`, got {line:?}"))
        .to_string();
    Running {
        child,
        addr,
        transport,
        line,
    }
}

fn wait_exit(child: &mut Child) -> ExitStatus {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "expected memnode to exit within {TIMEOUT:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Runs the binary with `args` until it exits (bounded); returns its status and
/// stderr, which must not show a panic.
fn run_to_exit(args: &[&str]) -> (ExitStatus, String) {
    let mut child = memnode(args, None)
        .spawn()
        .expect("the memnode binary starts");
    let status = wait_exit(&mut child);
    let err = stderr_of(&mut child);
    assert!(
        !err.contains("panicked"),
        "memnode {args:?} must not panic: {err}"
    );
    (status, err)
}

fn stderr_of(child: &mut Child) -> String {
    let mut s = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut s);
    }
    s
}

#[test]
fn prints_one_listening_line_serves_and_exits_cleanly_on_sigterm() {
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let mut node = spawn(&["--listen", "127.0.0.1:0", "--size", "64M"], None);
        assert!(
            node.line.starts_with("memnode listening on ")
                && node
                    .line
                    .trim_end()
                    .ends_with(&format!("capacity {}", 64 << 20)),
            "unexpected listening line {:?}",
            node.line
        );
        let ep =
            TcpEndpoint::connect(&node.addr, TIMEOUT).expect("connects to the printed address");
        let welcome = control::hello(&ep, 1, b"").expect("Hello is welcome");
        assert_eq!(
            welcome.capacity,
            64 << 20,
            "capacity must be the --size given"
        );
        let pid = i32::try_from(node.child.id()).expect("pid fits in i32");
        // SAFETY: sending a signal to our own child process.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "kill() must succeed");
        let status = wait_exit(&mut node.child);
        assert!(
            status.success(),
            "signal {signal}: expected exit 0, got {status}"
        );
    }
}

#[test]
fn the_token_can_come_from_the_environment() {
    let node = spawn(
        &["--listen", "127.0.0.1:0", "--size", "4M"],
        Some("a-token-from-the-environment"),
    );
    let ep = TcpEndpoint::connect(&node.addr, TIMEOUT).expect("connects");
    match control::hello(&ep, 1, b"a-wrong-token-for-this-test") {
        Err(ControlError::Refused {
            code: ErrorCode::AuthFailed,
            ..
        }) => {}
        other => panic!("a wrong token: expected AuthFailed, got {other:?}"),
    }
    let ep = TcpEndpoint::connect(&node.addr, TIMEOUT).expect("connects");
    control::hello(&ep, 1, b"a-token-from-the-environment")
        .expect("the token from RMEMFS_TOKEN is accepted");
}

#[test]
fn a_bad_poll_budget_is_a_usage_error_with_exit_code_2() {
    for bad in ["-1", "lots", "1000001"] {
        let (status, err) = run_to_exit(&[&format!("--poll-us={bad}")]);
        assert_eq!(status.code(), Some(2), "--poll-us {bad}: {err}");
        assert!(err.contains("--poll-us"), "--poll-us {bad}: {err}");
    }
}

#[test]
fn a_bad_lease_is_a_usage_error_with_exit_code_2() {
    for bad in ["0", "-1", "3601", "soon"] {
        let (status, err) = run_to_exit(&[&format!("--lease-secs={bad}")]);
        assert_eq!(status.code(), Some(2), "--lease-secs {bad}: {err}");
        assert!(err.contains("--lease-secs"), "--lease-secs {bad}: {err}");
    }
}

#[test]
fn lease_secs_sets_how_long_a_silent_holder_keeps_its_volume() {
    let node = spawn(
        &[
            "--listen",
            "127.0.0.1:0",
            "--size",
            "4M",
            "--lease-secs",
            "1",
        ],
        None,
    );
    let a = TcpEndpoint::connect(&node.addr, TIMEOUT).expect("connects");
    control::hello(&a, 1, b"").expect("welcome");
    control::volume_open(&a, "v", true, false).expect("A creates the volume");
    let b = TcpEndpoint::connect(&node.addr, TIMEOUT).expect("connects");
    control::hello(&b, 2, b"").expect("welcome");
    match control::volume_open(&b, "v", false, false) {
        Err(e) if e.is_busy() => {}
        other => panic!("within A's lease: expected Busy, got {other:?}"),
    }
    std::thread::sleep(Duration::from_millis(1500));
    control::volume_open(&b, "v", false, false).expect("B gets the volume after a 1 s lease");
    match control::alloc(&a, 1) {
        Err(e) if e.is_fenced() => {}
        other => panic!("A after losing its lease: expected Fenced, got {other:?}"),
    }
}

#[test]
fn a_bad_size_is_a_usage_error_with_exit_code_2() {
    for size in ["lots", "12X", "0", "99999999999T"] {
        let (status, err) = run_to_exit(&["--size", size]);
        assert_eq!(
            status.code(),
            Some(2),
            "--size {size}: expected exit 2, stderr: {err}"
        );
        assert!(
            err.contains("--size"),
            "--size {size}: the error must name the option: {err}"
        );
    }
}

#[test]
fn a_busy_port_fails_with_a_message_and_no_panic() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = busy.local_addr().expect("addr").to_string();
    let (status, err) = run_to_exit(&["--listen", &addr, "--size", "4M", "--transport", "tcp"]);
    assert!(
        !status.success(),
        "listening on a busy port must fail, got {status}"
    );
    assert!(
        err.contains("cannot listen on"),
        "expected a clear message, got: {err}"
    );
}

#[test]
fn auto_is_the_default_and_says_which_transport_it_picked() {
    let want = match fabric::verbs_device() {
        Ok(_) => "verbs",
        Err(_) => "tcp",
    };
    for args in [&["--transport", "auto"][..], &[]] {
        let mut all = vec!["--listen", "127.0.0.1:0", "--size", "4M"];
        all.extend(args);
        let node = spawn_as_is(&all, None);
        assert!(
            node.transport
                .starts_with(&format!("memnode transport {want} (")),
            "{args:?}: expected auto to pick {want} and say why, got {:?}",
            node.transport
        );
        let ep = fabric::connect(Transport::Auto, &node.addr, 1, TIMEOUT, Duration::ZERO)
            .expect("a client with --transport auto connects");
        control::hello(ep.as_ref(), 1, b"").expect("Hello over the chosen transport");
    }
}

#[test]
fn transport_verbs_without_an_rdma_device_fails_naming_the_missing_device() {
    if let Ok(dev) = fabric::verbs_device() {
        eprintln!("SKIPPED: this host has RDMA device {dev}, so verbs cannot fail for lack of one");
        return;
    }
    let started = Instant::now();
    let (status, err) = run_to_exit(&[
        "--listen",
        "127.0.0.1:0",
        "--size",
        "4M",
        "--transport",
        "verbs",
    ]);
    assert!(
        !status.success(),
        "--transport verbs without a device must fail, got {status} after {:?}",
        started.elapsed()
    );
    assert!(
        err.contains("no RDMA device"),
        "the error must name the missing device: {err}"
    );
}

#[test]
fn an_unknown_transport_is_a_usage_error_with_exit_code_2() {
    let (status, err) = run_to_exit(&["--transport", "bogus"]);
    assert_eq!(status.code(), Some(2), "expected exit 2, stderr: {err}");
    assert!(
        err.contains("--transport") && err.contains("bogus"),
        "the error must name the option and the value: {err}"
    );
}

#[test]
fn a_memory_file_of_another_size_is_refused_and_reset_needs_a_memory_file() {
    let (status, err) = run_to_exit(&["--memory-file-reset", "--size", "4M"]);
    assert_eq!(
        status.code(),
        Some(2),
        "reset alone is a usage error: {err}"
    );
    assert!(err.contains("--memory-file"), "{err}");

    let dir = std::env::temp_dir().join(format!("memnode-cli-memfile-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let file = dir.join("memory");
    let file = file.to_str().expect("a UTF-8 path");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .to_string();
    let base = [
        "--transport",
        "tcp",
        "--listen",
        &port,
        "--memory-file",
        file,
    ];
    let mut first = spawn_as_is(&[&base[..], &["--size", "4M"]].concat(), None);
    let pid = i32::try_from(first.child.id()).expect("pid fits in i32");
    // SAFETY: sending a signal to our own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    assert!(wait_exit(&mut first.child).success());
    let (status, err) = run_to_exit(&[&base[..], &["--size", "8M"]].concat());
    assert_eq!(
        status.code(),
        Some(1),
        "another size must refuse to start: {err}"
    );
    assert!(
        err.contains("holds a region of") && err.contains("--size"),
        "the refusal must say why: {err}"
    );
    let (status, err) = run_to_exit(&[
        "--transport",
        "tcp",
        "--listen",
        "127.0.0.1:0",
        "--memory-file",
        file,
        "--size",
        "4M",
    ]);
    assert_eq!(status.code(), Some(1), "another address must refuse: {err}");
    assert!(err.contains(&format!("--listen {port}")), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_tenants_file_admits_each_tenants_token_and_a_bad_one_stops_the_start() {
    let dir = std::env::temp_dir().join(format!("memnode-cli-tenants-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let key: String = rmemfs_common::auth::token_key(b"alice-token")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let good = dir.join("good.toml");
    std::fs::write(
        &good,
        format!("[[tenant]]\nname = \"alice\"\ntoken_sha256 = \"{key}\"\nquota_bytes = \"1M\"\n"),
    )
    .unwrap();
    let path = good.to_str().expect("a UTF-8 path");
    let node = spawn(
        &["--listen", "127.0.0.1:0", "--size", "4M", "--tenants", path],
        None,
    );
    let ep = TcpEndpoint::connect(&node.addr, TIMEOUT).expect("connects");
    match control::hello(&ep, 1, b"bob-token") {
        Err(ControlError::Refused {
            code: ErrorCode::AuthFailed,
            ..
        }) => {}
        other => panic!("a token of no tenant: expected AuthFailed, got {other:?}"),
    }
    let ep = TcpEndpoint::connect(&node.addr, TIMEOUT).expect("connects");
    control::hello(&ep, 2, b"alice-token").expect("alice's token is welcome");
    match control::alloc(&ep, 2 << 20) {
        Err(ControlError::Refused {
            code: ErrorCode::OverQuota,
            message,
        }) => assert!(message.contains("\"alice\""), "{message}"),
        other => panic!("2 MiB past a 1 MiB quota: expected OverQuota, got {other:?}"),
    }
    drop(node);

    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[[tenant]]\nname = \"alice\"\nquota_bytes = \"1M\"\n").unwrap();
    let bad_path = bad.to_str().expect("a UTF-8 path");
    let (status, err) = run_to_exit(&["--listen", "127.0.0.1:0", "--tenants", bad_path]);
    assert!(!status.success(), "a tenants file without a token: {err}");
    for want in [bad_path, "\"alice\"", "token"] {
        assert!(err.contains(want), "the error should name {want}: {err}");
    }
    let (status, err) = run_to_exit(&["--tenants", path, "--token", "t"]);
    assert_eq!(status.code(), Some(2), "--tenants with --token: {err}");
    assert!(err.contains("cannot be used with"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
