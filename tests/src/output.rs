//! Child process plumbing shared by the memnode and fsd wrappers: stdout as a channel of
//! lines, stderr as a bounded tail kept for failure messages, signals, bounded waits.

use rmemfs_common::sync::lock;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How much of a child's stderr is kept (the end of it).
const TAIL_BYTES: usize = 64 << 10;

/// The last [`TAIL_BYTES`] a child wrote to a stream, collected by a thread.
#[derive(Clone)]
pub(crate) struct Tail {
    buf: Arc<Mutex<Vec<u8>>>,
    /// Set when the stream reached its end (the child closed it, normally by exiting).
    eof: Arc<AtomicBool>,
}

impl Tail {
    pub(crate) fn capture(stream: impl Read + Send + 'static, name: &str) -> Tail {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = buf.clone();
        let eof = Arc::new(AtomicBool::new(false));
        let at_end = eof.clone();
        std::thread::Builder::new()
            .name(format!("{name} stderr"))
            .spawn(move || {
                let mut stream = stream;
                let mut chunk = [0u8; 8192];
                loop {
                    match stream.read(&mut chunk) {
                        Ok(0) | Err(_) => {
                            at_end.store(true, Ordering::Release);
                            return;
                        }
                        Ok(n) => {
                            let mut b = lock(&sink);
                            b.extend_from_slice(&chunk[..n]);
                            if b.len() > TAIL_BYTES {
                                let cut = b.len() - TAIL_BYTES;
                                b.drain(..cut);
                            }
                        }
                    }
                }
            })
            .expect("spawning a stderr reader");
        Tail { buf, eof }
    }

    /// The text once the child has exited: waits (at most 2 s) for the reader to reach
    /// the end of the stream, so the last words of a child that died at start-up (its
    /// error message) are in it.
    pub(crate) fn final_text(&self) -> String {
        let deadline = Instant::now() + Duration::from_secs(2);
        while !self.eof.load(Ordering::Acquire) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.text()
    }

    pub(crate) fn text(&self) -> String {
        let b = lock(&self.buf);
        String::from_utf8_lossy(&b).into_owned()
    }
}

/// Starts a daemon with its stdout as a channel of lines and its stderr kept as a
/// tail for failure messages.
pub(crate) fn spawn_daemon(
    bin: &Path,
    args: &[String],
    name: &str,
) -> (Child, Receiver<String>, Tail) {
    let mut child = Command::new(bin)
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
    let stdout = lines(child.stdout.take().expect("piped stdout"), name);
    let stderr = Tail::capture(child.stderr.take().expect("piped stderr"), name);
    (child, stdout, stderr)
}

/// Every line a child writes to `stream`, as a channel (closed at EOF).
pub(crate) fn lines(stream: impl Read + Send + 'static, name: &str) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(format!("{name} stdout"))
        .spawn(move || {
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    // Nobody listens any more; keep draining so the child never blocks.
                    continue;
                }
            }
        })
        .expect("spawning a stdout reader");
    rx
}

/// What happened while waiting for a child's announcement line.
pub(crate) enum Announce {
    Line(String),
    Exited(ExitStatus),
    TimedOut,
}

/// Waits for the first line on `rx` that `matches`, while watching that the child is
/// still alive, until `limit` passes.
pub(crate) fn wait_for_line(
    child: &mut Child,
    rx: &Receiver<String>,
    limit: Duration,
    matches: impl Fn(&str) -> bool,
) -> Announce {
    let deadline = Instant::now() + limit;
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(line) if matches(&line) => return Announce::Line(line),
            Ok(_) => {}
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // stdout closed: the child is exiting; give it a moment to be reaped.
                if let Some(status) = wait_exit(child, Duration::from_secs(5)) {
                    return Announce::Exited(status);
                }
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Announce::Exited(status);
        }
        if Instant::now() >= deadline {
            return Announce::TimedOut;
        }
    }
}

/// Waits up to `limit` for the child to exit.
pub(crate) fn wait_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => {}
            Err(e) => panic!("waiting for child {}: {e}", child.id()),
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `signal` to process `pid`; false if it is gone.
pub(crate) fn signal(pid: u32, signal: i32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill(2) takes plain integers and has no memory-safety preconditions.
    unsafe { libc::kill(pid, signal) == 0 }
}

/// SIGKILLs the child (if it still runs) and reaps it, within a bound.
pub(crate) fn kill_and_reap(child: &mut Child) -> Option<ExitStatus> {
    if let Ok(Some(status)) = child.try_wait() {
        return Some(status);
    }
    let _ = child.kill();
    wait_exit(child, Duration::from_secs(10))
}
