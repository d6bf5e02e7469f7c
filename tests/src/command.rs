//! Running the real programs the tests use on a mount (tar, git, sqlite3, cargo): a
//! bounded wait, and a failure message with the command line, exit status and both
//! output streams.

use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The command line of `cmd`, for messages.
pub fn command_line(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `cmd` (stdin from /dev/null unless set) to completion within `limit` and
/// returns its output, whatever its exit status; a program still running at `limit` is
/// killed (by its pid) and the test fails naming `what`.
pub fn run_within(cmd: &mut Command, limit: Duration, what: &str) -> Output {
    let line = command_line(cmd);
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot run `{line}`: {e}"));
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => panic!("{what}: waiting for `{line}`: {e}"),
        Err(_) => {
            // SAFETY: kill(2) with the pid of our own child, which has not been reaped
            // (the waiting thread still waits for it).
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            panic!("{what}: `{line}` did not finish within {limit:?}")
        }
    }
}

/// As [`run_within`], and the program must exit 0; returns its stdout as text.
#[track_caller]
pub fn run_ok(cmd: &mut Command, limit: Duration, what: &str) -> String {
    let out = run_within(cmd, limit, what);
    if !out.status.success() {
        panic!(
            "{what}: `{}` exited with {}\nstdout:\n{}\nstderr:\n{}",
            command_line(cmd),
            out.status,
            tail(&out.stdout),
            tail(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// As [`run_ok`], printing how long the program took: `what: 1.23 s`.
#[track_caller]
pub fn run_timed(cmd: &mut Command, limit: Duration, what: &str) -> (String, Duration) {
    let started = Instant::now();
    let out = run_ok(cmd, limit, what);
    let took = started.elapsed();
    println!("{what}: {:.2} s", took.as_secs_f64());
    (out, took)
}

fn tail(bytes: &[u8]) -> String {
    const KEEP: usize = 8 << 10;
    String::from_utf8_lossy(&bytes[bytes.len().saturating_sub(KEEP)..]).into_owned()
}
