//! A `memnode` process under test.

use crate::binaries::{binary, program};
use crate::output::{self, Announce, Tail};
use crate::transport::{self, Transport};
use rmemfs_common::control;
use rmemfs_common::fabric::tcp::TcpEndpoint;
use rmemfs_common::fabric::{self as fabric, Endpoint};
use rmemfs_common::protocol::NodeStats;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// How long a memnode may take to reserve its region and start listening.
const START_LIMIT: Duration = Duration::from_secs(30);
/// Timeout of the control connections the harness makes.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`MemnodeProc::start_at`] keeps trying to listen on a given address.
const REBIND_LIMIT: Duration = Duration::from_secs(10);

/// A running memnode listening on a free port (or on the address it was given, see
/// [`MemnodeProc::start_at`]). Dropping it kills it.
pub struct MemnodeProc {
    child: Child,
    transport: Transport,
    addr: String,
    capacity: u64,
    token: Vec<u8>,
    stderr: Tail,
    /// The metrics endpoint's address, when it was started with `--metrics`.
    metrics: Option<String>,
}

/// The memnodes' `--session-grace` unless a test gives its own, in seconds.
pub const TEST_SESSION_GRACE: &str = "3";

impl MemnodeProc {
    /// `memnode --transport T --listen HOST:0 --size SIZE` (SIZE like `64M`), on the
    /// transport `RMEMFS_TRANSPORT` names and the host of
    /// [`transport::listen_host`] (127.0.0.1 unless the environment says otherwise).
    pub fn start(size: &str) -> MemnodeProc {
        MemnodeProc::start_with(size, &[])
    }

    /// As [`MemnodeProc::start`], with extra arguments (e.g. `["--token", "t"]`; the
    /// harness then presents that token itself).
    pub fn start_with(size: &str, extra: &[&str]) -> MemnodeProc {
        MemnodeProc::launch(transport::transport(), false, size, extra)
    }

    /// As [`MemnodeProc::start_with`] on `transport` whatever `RMEMFS_TRANSPORT` says:
    /// for tests that only make sense on one backend (raw TCP bytes to the memnode).
    pub fn start_on(transport: Transport, size: &str, extra: &[&str]) -> MemnodeProc {
        MemnodeProc::launch(transport, true, size, extra)
    }

    /// `memnode --transport T --listen ADDR --size SIZE` on the address `addr` (`HOST:PORT`)
    /// exactly, on the transport `RMEMFS_TRANSPORT` names: a memnode coming back where
    /// a killed one was (fsd reconnects to the address on its command line). The port
    /// may still be held for a moment after the old process died, so a memnode that
    /// exits before listening is started again for up to 10 s.
    pub fn start_at(addr: &str, size: &str) -> MemnodeProc {
        MemnodeProc::start_at_with(addr, size, &[])
    }

    /// As [`MemnodeProc::start_at`], with extra arguments (a memnode restarted on its
    /// `--memory-file`).
    pub fn start_at_with(addr: &str, size: &str, extra: &[&str]) -> MemnodeProc {
        let transport = transport::transport();
        transport::announce(transport, false, "memnode");
        let deadline = Instant::now() + REBIND_LIMIT;
        loop {
            match MemnodeProc::spawn(None, transport, addr, size, extra) {
                Ok(m) => {
                    assert_eq!(
                        m.addr, addr,
                        "memnode started with --listen {addr} announced another address"
                    );
                    return m;
                }
                Err(e) if Instant::now() < deadline => {
                    println!(
                        "memnode --listen {addr} failed, retrying: {}",
                        e.lines().next().unwrap_or("")
                    );
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => panic!("{e}\n(kept retrying for {REBIND_LIMIT:?})"),
            }
        }
    }

    fn launch(transport: Transport, fixed: bool, size: &str, extra: &[&str]) -> MemnodeProc {
        assert!(
            !extra
                .iter()
                .any(|a| *a == "--transport" || a.starts_with("--transport=")),
            "pass the transport to MemnodeProc::start_on, not as an extra argument"
        );
        transport::announce(transport, fixed, "memnode");
        let listen = transport::listen_arg(transport);
        MemnodeProc::spawn(None, transport, &listen, size, extra).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `memnode --transport T --listen LISTEN --size SIZE EXTRA...` run by `ip netns
    /// exec NETNS` (which execs it, so the process is the memnode itself): a memnode on
    /// another "host" of this machine (crate::wireguard). LISTEN is `HOST:PORT`, port 0
    /// for a free one; T is fixed by the test.
    pub fn start_in_netns(
        netns: &str,
        transport: Transport,
        listen: &str,
        size: &str,
        extra: &[&str],
    ) -> MemnodeProc {
        transport::announce(transport, true, "memnode");
        MemnodeProc::spawn(Some(netns), transport, listen, size, extra)
            .unwrap_or_else(|e| panic!("in network namespace {netns}: {e}"))
    }

    /// Starts a memnode listening on `listen` (in network namespace `netns` when
    /// given) and waits for its announcement. A memnode
    /// that exits before listening is an `Err` carrying its status and stderr; one that
    /// hangs or announces nonsense panics.
    fn spawn(
        netns: Option<&str>,
        transport: Transport,
        listen: &str,
        size: &str,
        extra: &[&str],
    ) -> Result<MemnodeProc, String> {
        let bin = binary("memnode");
        let transport_name = transport.to_string();
        // A short grace for sessions whose fsd went away, unless the test sets one:
        // a killed fsd's memory and volume come back in seconds, as the tests of
        // crashes expect, while a reconnect (within milliseconds) still resumes.
        let grace: &[&str] = if extra.iter().any(|a| a.starts_with("--session-grace")) {
            &[]
        } else {
            &["--session-grace", TEST_SESSION_GRACE]
        };
        // A memnode with no token beyond loopback (the Soft-RoCE VM's RDMA address)
        // must be told it is meant: the VM's network is the test's own.
        let authenticated = extra
            .iter()
            .any(|a| matches!(*a, "--token" | "--token-file" | "--tenants" | "--insecure"));
        let loopback = listen
            .rsplit_once(':')
            .map(|(host, _)| host.trim_matches(['[', ']']))
            .and_then(|host| host.parse::<std::net::IpAddr>().ok())
            .is_some_and(|ip| ip.is_loopback());
        let insecure: &[&str] = if authenticated || loopback {
            &[]
        } else {
            &["--insecure"]
        };
        let argv: Vec<String> = [
            "--transport",
            &transport_name,
            "--listen",
            listen,
            "--size",
            size,
        ]
        .iter()
        .chain(grace)
        .chain(insecure)
        .chain(extra)
        .map(|a| a.to_string())
        .collect();
        let (mut child, stdout, stderr) = match netns {
            None => output::spawn_daemon(&bin, &argv, "memnode"),
            Some(ns) => {
                let wrapped: Vec<String> = ["netns", "exec", ns]
                    .iter()
                    .map(|a| a.to_string())
                    .chain(std::iter::once(bin.to_string_lossy().into_owned()))
                    .chain(argv.iter().cloned())
                    .collect();
                output::spawn_daemon(&program("ip", "iproute2"), &wrapped, "memnode")
            }
        };
        let token = extra
            .iter()
            .position(|a| *a == "--token")
            .and_then(|i| extra.get(i + 1))
            .map(|t| t.as_bytes().to_vec())
            .unwrap_or_default();
        // `memnode transport <BACKEND> (<WHY>)` comes first: what `auto` picked.
        let served_over = std::cell::RefCell::new(None::<String>);
        // `memnode metrics on <ADDR>` comes before the listening line with --metrics.
        let metrics = std::cell::RefCell::new(None::<String>);
        let line = match output::wait_for_line(&mut child, &stdout, START_LIMIT, |l| {
            if let Some(t) = l.strip_prefix("memnode transport ") {
                *served_over.borrow_mut() = Some(t.to_string());
            }
            if let Some(a) = l.strip_prefix("memnode metrics on ") {
                *metrics.borrow_mut() = Some(a.trim().to_string());
            }
            l.starts_with("memnode listening on ")
        }) {
            Announce::Line(l) => l,
            Announce::Exited(status) => {
                return Err(format!(
                    "memnode --transport {transport} --listen {listen} --size {size} exited ({status}) \
                     before it listened; stderr:\n{}",
                    stderr.final_text()
                ))
            }
            Announce::TimedOut => {
                output::kill_and_reap(&mut child);
                panic!(
                    "memnode --transport {transport} --listen {listen} --size {size} printed no \
                     `memnode listening on` line within {START_LIMIT:?}; stderr:\n{}",
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
        println!(
            "memnode {addr}: --transport {transport}, serves over {}",
            served_over
                .into_inner()
                .as_deref()
                .unwrap_or("? (it printed no `memnode transport` line)")
        );
        Ok(MemnodeProc {
            child,
            transport,
            addr,
            capacity,
            token,
            stderr,
            metrics: metrics.into_inner(),
        })
    }

    /// The address it listens on, `HOST:PORT`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The transport it was started with (what fsd and the harness's clients use).
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// The token it was started with (`--token`), if any: what clients present.
    pub fn token(&self) -> Option<&str> {
        (!self.token.is_empty()).then(|| std::str::from_utf8(&self.token).unwrap_or(""))
    }

    /// The address of its metrics endpoint (`--metrics`, announced on stdout); panics
    /// when it was started without one.
    pub fn metrics_addr(&self) -> &str {
        self.metrics.as_deref().unwrap_or_else(|| {
            panic!(
                "memnode {} announced no metrics endpoint (started without --metrics?)",
                self.addr
            )
        })
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

    /// A well-behaved client on the memnode's transport: a connected endpoint that has
    /// said Hello with a fresh random client id (returned beside it).
    pub fn client(&self) -> (Box<dyn Endpoint>, u64) {
        self.client_with_token(&self.token)
    }

    /// As [`MemnodeProc::client`], presenting `token` (a tenant's, of a memnode
    /// started with `--tenants`).
    pub fn client_with_token(&self, token: &[u8]) -> (Box<dyn Endpoint>, u64) {
        let id = rand::random::<u64>();
        let ep = fabric::connect(
            self.transport,
            &self.addr,
            id,
            CONTROL_TIMEOUT,
            Duration::ZERO,
        )
        .unwrap_or_else(|e| {
            panic!(
                "connecting to memnode {} over {}: {e}",
                self.addr, self.transport
            )
        });
        control::hello(&*ep, id, token)
            .unwrap_or_else(|e| panic!("hello to memnode {} refused: {e}", self.addr));
        (ep, id)
    }

    /// As [`MemnodeProc::client`], as the tcp backend's own endpoint type (for tests
    /// that speak the tcp wire format); panics unless the memnode runs on tcp.
    pub fn tcp_client(&self) -> (TcpEndpoint, u64) {
        assert_eq!(
            self.transport,
            Transport::Tcp,
            "tcp_client() on a memnode started with --transport {}: start it with \
             MemnodeProc::start_on(Transport::Tcp, ..)",
            self.transport
        );
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
        control::stat(&*ep).unwrap_or_else(|e| panic!("stat of memnode {}: {e}", self.addr))
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
