//! A `memnode` process under test.

use crate::binaries::binary;
use crate::output::{self, Announce, Tail};
use rmemfs_common::control;
use rmemfs_common::fabric::tcp::TcpEndpoint;
use rmemfs_common::protocol::NodeStats;
use std::process::{Child, ExitStatus};
use std::time::Duration;

/// How long a memnode may take to reserve its region and start listening.
const START_LIMIT: Duration = Duration::from_secs(30);
/// Timeout of the control connections the harness makes.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// A running memnode listening on a free loopback port. Dropping it kills it.
pub struct MemnodeProc {
    child: Child,
    addr: String,
    capacity: u64,
    token: Vec<u8>,
    stderr: Tail,
}

impl MemnodeProc {
    /// `memnode --listen 127.0.0.1:0 --size SIZE` (SIZE like `64M`).
    pub fn start(size: &str) -> MemnodeProc {
        MemnodeProc::start_with(size, &[])
    }

    /// As [`MemnodeProc::start`], with extra arguments (e.g. `["--token", "t"]`; the
    /// harness then presents that token itself).
    pub fn start_with(size: &str, extra: &[&str]) -> MemnodeProc {
        let bin = binary("memnode");
        let argv: Vec<String> = ["--listen", "127.0.0.1:0", "--size", size]
            .iter()
            .chain(extra)
            .map(|a| a.to_string())
            .collect();
        let (mut child, stdout, stderr) = output::spawn_daemon(&bin, &argv, "memnode");
        let token = extra
            .iter()
            .position(|a| *a == "--token")
            .and_then(|i| extra.get(i + 1))
            .map(|t| t.as_bytes().to_vec())
            .unwrap_or_default();
        let line = match output::wait_for_line(&mut child, &stdout, START_LIMIT, |l| {
            l.starts_with("memnode listening on ")
        }) {
            Announce::Line(l) => l,
            Announce::Exited(status) => panic!(
                "memnode --size {size} exited ({status}) before it listened; stderr:\n{}",
                stderr.text()
            ),
            Announce::TimedOut => {
                output::kill_and_reap(&mut child);
                panic!(
                    "memnode --size {size} printed no `memnode listening on` line within \
                     {START_LIMIT:?}; stderr:\n{}",
                    stderr.text()
                )
            }
        };
        let (addr, capacity) = parse_listening(&line).unwrap_or_else(|| {
            output::kill_and_reap(&mut child);
            panic!(
                "memnode's stdout line {line:?} is not \
                 `memnode listening on <ADDR> capacity <BYTES>`"
            )
        });
        MemnodeProc {
            child,
            addr,
            capacity,
            token,
            stderr,
        }
    }

    /// The address it listens on, `127.0.0.1:PORT`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The capacity it announced, in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What it wrote to stderr so far (the end of it).
    pub fn stderr(&self) -> String {
        self.stderr.text()
    }

    /// A well-behaved client: a connected endpoint that has said Hello with a fresh
    /// random client id (returned beside it).
    pub fn client(&self) -> (TcpEndpoint, u64) {
        let ep = TcpEndpoint::connect(&self.addr, CONTROL_TIMEOUT)
            .unwrap_or_else(|e| panic!("connecting to memnode {}: {e}", self.addr));
        let id = rand::random::<u64>();
        control::hello(&ep, id, &self.token)
            .unwrap_or_else(|e| panic!("hello to memnode {} refused: {e}", self.addr));
        (ep, id)
    }

    /// Its current stats, over a connection of its own (a fresh client that owns no
    /// memory).
    pub fn stats(&self) -> NodeStats {
        let (ep, _) = self.client();
        control::stat(&ep).unwrap_or_else(|e| panic!("stat of memnode {}: {e}", self.addr))
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL: the memnode vanishes as a crashed host would.
    pub fn kill(&mut self) {
        output::kill_and_reap(&mut self.child)
            .unwrap_or_else(|| panic!("memnode {} survived SIGKILL for 10 s", self.pid()));
    }

    /// SIGSTOP: the memnode stops answering but its connections stay open.
    pub fn freeze(&self) {
        assert!(
            output::signal(self.pid(), libc::SIGSTOP),
            "SIGSTOP to memnode failed"
        );
    }

    /// SIGCONT after [`MemnodeProc::freeze`].
    pub fn thaw(&self) {
        output::signal(self.pid(), libc::SIGCONT);
    }

    /// SIGTERM, and the exit status (panics if it does not exit within 30 s).
    pub fn terminate(&mut self) -> ExitStatus {
        output::signal(self.pid(), libc::SIGTERM);
        output::wait_exit(&mut self.child, Duration::from_secs(30)).unwrap_or_else(|| {
            panic!(
                "memnode did not exit within 30 s of SIGTERM; stderr:\n{}",
                self.stderr()
            )
        })
    }
}

impl Drop for MemnodeProc {
    fn drop(&mut self) {
        // A frozen process still dies of SIGKILL.
        output::kill_and_reap(&mut self.child);
    }
}

/// `memnode listening on 127.0.0.1:4242 capacity 67108864` -> (addr, capacity).
fn parse_listening(line: &str) -> Option<(String, u64)> {
    let rest = line.strip_prefix("memnode listening on ")?;
    let (addr, capacity) = rest.split_once(" capacity ")?;
    Some((addr.trim().to_string(), capacity.trim().parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::parse_listening;

    #[test]
    fn parses_the_listening_line() {
        assert_eq!(
            parse_listening("memnode listening on 127.0.0.1:4242 capacity 67108864"),
            Some(("127.0.0.1:4242".to_string(), 64 << 20))
        );
        assert_eq!(parse_listening("memnode listening on 127.0.0.1:1"), None);
        assert_eq!(parse_listening("hello"), None);
    }
}
