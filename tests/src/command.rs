//! Running the real programs the tests use on a mount (tar, git, sqlite3, cargo): a
//! bounded wait, and a failure message with the command line, exit status and both
//! output streams.

use crate::procinfo;
use std::os::unix::process::CommandExt;
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
/// killed (with every process it started) and the test fails naming `what`.
pub fn run_within(cmd: &mut Command, limit: Duration, what: &str) -> Output {
    run_within_watching(cmd, limit, what, &[])
}

/// As [`run_within`]; when the program hangs, the failure also says what each of its
/// processes and each thread of the `watched` processes (the fsd under test) was
/// waiting in, and the end of what the program printed: the evidence a hang leaves.
pub fn run_within_watching(
    cmd: &mut Command,
    limit: Duration,
    what: &str,
    watched: &[u32],
) -> Output {
    let line = command_line(cmd);
    // A group of its own, so that a hang is ended with every process it forked (whose
    // pipes would otherwise keep its output from ever ending).
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
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
            let mut evidence = procinfo::group_report(pid);
            for &w in watched {
                evidence += &procinfo::threads_report(w);
            }
            // SAFETY: kill(2) of the process group our child leads; the child is not
            // reaped yet (the waiting thread still waits for it), so its id is ours.
            unsafe { libc::kill(-(pid as libc::pid_t), libc::SIGKILL) };
            let printed = match rx.recv_timeout(Duration::from_secs(10)) {
                Ok(Ok(out)) => format!(
                    "its stdout ended with:\n{}\nits stderr ended with:\n{}",
                    tail(&out.stdout),
                    tail(&out.stderr)
                ),
                _ => "its output could not be read after the kill".to_string(),
            };
            panic!(
                "{what}: `{line}` did not finish within {limit:?}; what was waiting where \
                 at that moment:\n{evidence}{printed}"
            )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hung_program_fails_with_where_its_processes_wait_and_is_killed_with_them() {
        // A program that forks a child holding its output open, prints, and hangs.
        // Its sleeps last a time no other process on the machine sleeps (this test
        // process's id in the fraction), so the check below sees only its own.
        let sleep = format!("sleep 300.{}", std::process::id());
        let hang = std::panic::catch_unwind(|| {
            let mut cmd = Command::new("sh");
            cmd.args(["-c", &format!("{sleep} & echo started; {sleep}")]);
            run_within_watching(
                &mut cmd,
                Duration::from_secs(2),
                "a hanging shell",
                &[std::process::id()],
            )
        });
        let message = match hang {
            Ok(out) => panic!("a program still running at the limit returned {out:?}"),
            Err(p) => p
                .downcast_ref::<String>()
                .cloned()
                .expect("a formatted panic message"),
        };
        for wanted in [
            "did not finish within 2s",
            "sh: state S",
            "sleep: state S",
            &format!("threads of process {}", std::process::id()),
            "its stdout ended with:\nstarted",
        ] {
            assert!(
                message.contains(wanted),
                "the failure should say {wanted:?}:\n{message}"
            );
        }
        // The forked sleep went with the group: none of ours is left.
        let left = Command::new("pgrep")
            .args(["-f", &format!("^{sleep}$")])
            .output()
            .expect("pgrep");
        assert!(
            left.stdout.is_empty(),
            "the hung program's children should be killed with it: {}",
            String::from_utf8_lossy(&left.stdout)
        );
    }
}
