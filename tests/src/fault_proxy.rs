//! A fault-injecting TCP proxy in the manner of toxiproxy, put between fsd and a
//! memnode (fsd gets [`FaultProxy::addr`] as its `--memnode`) so that a test can make
//! the transient network faults fsd must survive happen on demand, at a chosen moment,
//! the same way on every run: every connection reset at once ([`FaultProxy::reset_all`],
//! what `ss -K` or a NAT table dropping its entries does), a path that stops carrying
//! bytes for a while and then delivers all of them ([`FaultProxy::stall`]), a host that
//! swallows new connections without a word ([`FaultProxy::blackhole`]) and a port that
//! is closed ([`FaultProxy::refuse`]). Killing the memnode tests something else: its
//! memory is gone, whereas behind these faults it is still there.
//!
//! Each accepted connection has its own thread, which connects to the upstream and
//! forwards client to upstream while a second thread forwards the other way. Every
//! blocking call is bounded by a short tick (socket timeouts, `poll`, condition-variable
//! waits), so each thread notices a fault or the proxy's end within a tick and no thread
//! ever spins.

use rmemfs_common::sync::{lock, wait_timeout};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// How long any thread of the proxy blocks before it looks at the fault modes and the
/// stop flag again: the latency of every fault and of `Drop`.
const TICK: Duration = Duration::from_millis(50);

/// How long a connection waits for the upstream to answer before the client is reset:
/// upstreams are memnodes on this host, which answer at once; a stop waits at most
/// this long for a connect under way.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Bytes read at once in each direction.
const CHUNK: usize = 64 * 1024;

/// The fault modes, changed by the test and obeyed by every thread.
#[derive(Clone, Copy, Default)]
struct Mode {
    stalled: bool,
    blackholed: bool,
    refusing: bool,
}

impl Mode {
    fn flowing(&self) -> bool {
        !self.stalled && !self.blackholed
    }
}

/// One open connection as the proxy's owner sees it: how to ask it to end with a reset,
/// and its thread, to wait for the reset to have happened.
struct Conn {
    abort: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

struct Shared {
    upstream: Vec<SocketAddr>,
    mode: Mutex<Mode>,
    /// Notified, under `mode`'s lock, on every change a waiting thread must see: a mode,
    /// a connection's abort, the stop flag.
    changed: Condvar,
    stop: AtomicBool,
    accepted: AtomicUsize,
    next_id: AtomicU64,
    conns: Mutex<HashMap<u64, Conn>>,
    /// Every byte forwarded either way, up to [`RECORD_LIMIT`]: what an eavesdropper on
    /// the path would see (see [`FaultProxy::recorded`]).
    recorded: Mutex<Vec<u8>>,
}

/// Bytes the proxy keeps of what it forwarded.
const RECORD_LIMIT: usize = 64 << 20;

impl Shared {
    fn mode(&self) -> MutexGuard<'_, Mode> {
        lock(&self.mode)
    }

    fn conns(&self) -> MutexGuard<'_, HashMap<u64, Conn>> {
        lock(&self.conns)
    }

    fn set_mode(&self, change: impl FnOnce(&mut Mode)) {
        change(&mut self.mode());
        self.changed.notify_all();
    }

    /// Wakes every waiter after a flag outside `mode` changed. Taking the lock first
    /// means no waiter is between its check of the flags and its wait, so none misses
    /// the change and sleeps a whole tick on it.
    fn wake(&self) {
        let _mode = self.mode();
        self.changed.notify_all();
    }

    /// Waits until the modes satisfy `ready` (true), or until the proxy stops or the
    /// connection is aborted (false).
    fn wait_for(&self, abort: &AtomicBool, ready: impl Fn(&Mode) -> bool) -> bool {
        let mut mode = self.mode();
        loop {
            if self.stop.load(SeqCst) || abort.load(SeqCst) {
                return false;
            }
            if ready(&mode) {
                return true;
            }
            mode = wait_timeout(&self.changed, mode, TICK).0;
        }
    }

    /// Takes every open connection out of the table, to end them and wait for them.
    fn take_conns(&self) -> Vec<Conn> {
        self.conns().drain().map(|(_, conn)| conn).collect()
    }
}

/// A TCP proxy on `127.0.0.1` that forwards to one upstream and injects faults on
/// demand. Dropping it closes every connection and stops every thread.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// Listens on 127.0.0.1:0 and forwards every accepted connection to `upstream`
    /// ("host:port"; a name is resolved now, and its addresses are tried in order for
    /// each connection). Panics if it cannot set itself up: this is a test harness.
    pub fn start(upstream: &str) -> FaultProxy {
        let targets: Vec<SocketAddr> = upstream
            .to_socket_addrs()
            .unwrap_or_else(|e| panic!("fault proxy: cannot resolve upstream {upstream:?}: {e}"))
            .collect();
        assert!(
            !targets.is_empty(),
            "fault proxy: upstream {upstream:?} resolves to no address"
        );
        let listener = TcpListener::bind("127.0.0.1:0")
            .unwrap_or_else(|e| panic!("fault proxy: cannot listen on 127.0.0.1:0: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("fault proxy: cannot read its own address: {e}"));
        // Non-blocking so that a connection which goes away between poll and accept
        // cannot leave the accept thread blocked where it does not see the stop flag.
        listener
            .set_nonblocking(true)
            .unwrap_or_else(|e| panic!("fault proxy: cannot make its listener non-blocking: {e}"));
        let shared = Arc::new(Shared {
            upstream: targets,
            mode: Mutex::new(Mode::default()),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            accepted: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
            recorded: Mutex::new(Vec::new()),
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name(format!("fault-proxy {addr} accept"))
                .spawn(move || accept_loop(listener, &shared))
                .unwrap_or_else(|e| panic!("fault proxy: cannot spawn its accept thread: {e}"))
        };
        FaultProxy {
            addr,
            shared,
            acceptor: Some(acceptor),
        }
    }

    /// "127.0.0.1:PORT", the address to give fsd as `--memnode`.
    /// Every byte the proxy forwarded so far, both ways run together (the first 64
    /// MiB): what an eavesdropper on the path saw.
    pub fn recorded(&self) -> Vec<u8> {
        lock(&self.shared.recorded).clone()
    }

    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// Resets every open connection at once, both sides: each socket gets SO_LINGER 0
    /// and is closed, so the client and the upstream each get ECONNRESET, as after
    /// `ss -K` or a NAT timeout. Held (black-holed) connections are reset too. Returns
    /// once the resets are sent, with how many connections were reset. New connections
    /// are accepted and forwarded as usual afterwards.
    pub fn reset_all(&self) -> usize {
        let conns = self.shared.take_conns();
        for conn in &conns {
            conn.abort.store(true, SeqCst);
        }
        self.shared.wake();
        let count = conns.len();
        // Joining is what makes "returns once the resets are sent" true: the sockets
        // are closed by their connection's thread as it ends.
        for conn in conns {
            let _ = conn.thread.join();
        }
        count
    }

    /// Stops the flow of bytes in both directions on every connection, present and
    /// future: nothing more is read from either side or forwarded (what a side sends
    /// after this returns waits in the sockets' buffers and then in the sender's), and
    /// the connections stay open. Connections are still accepted and connected upstream.
    pub fn stall(&self) {
        self.shared.set_mode(|m| m.stalled = true);
    }

    /// Ends [`stall`](Self::stall): everything that waited is forwarded, in order,
    /// nothing lost. Connections stay stalled while the proxy is black-holed.
    pub fn unstall(&self) {
        self.shared.set_mode(|m| m.stalled = false);
    }

    /// Black-holes the proxy: new connections are accepted (the kernel completes the
    /// handshake) but never forwarded nor answered, and they hang until the proxy
    /// leaves this mode, when they are closed; existing connections are stalled as by
    /// [`stall`](Self::stall). A black-holed connection counts as open.
    pub fn blackhole(&self) {
        self.shared.set_mode(|m| m.blackholed = true);
    }

    /// Ends both [`stall`](Self::stall) and [`blackhole`](Self::blackhole): existing
    /// connections resume with everything that waited, connections held by the black
    /// hole are closed. Refusing is left as it is.
    pub fn restore(&self) {
        self.shared.set_mode(|m| {
            m.stalled = false;
            m.blackholed = false;
        });
    }

    /// While on, every new connection is closed at once with a reset, as by a host whose
    /// port is closed (the handshake completes, then the client reads ECONNRESET).
    /// Refusing wins over black-holing. Existing connections are not affected.
    pub fn refuse(&self, on: bool) {
        self.shared.set_mode(|m| m.refusing = on);
    }

    /// Connections open now: forwarded, connecting upstream, or held by the black hole.
    pub fn open_connections(&self) -> usize {
        self.shared.conns().len()
    }

    /// Connections accepted in all, refused and black-holed ones included.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        self.shared.wake();
        // The accept thread first, so that no connection is added to the table after
        // it has been emptied.
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        for conn in self.shared.take_conns() {
            let _ = conn.thread.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: &Arc<Shared>) {
    while !shared.stop.load(SeqCst) {
        match poll_fd(listener.as_raw_fd(), libc::POLLIN, TICK) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(_) => {
                // Not expected for a listening socket; the sleep keeps a persistent
                // error from turning this loop into a spin.
                thread::sleep(TICK);
                continue;
            }
        }
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(e) if is_transient(&e) || e.kind() == io::ErrorKind::ConnectionAborted => continue,
            Err(_) => {
                // Out of descriptors, say: the pending connection stays queued, so
                // retrying at once would spin.
                thread::sleep(TICK);
                continue;
            }
        };
        shared.accepted.fetch_add(1, SeqCst);
        let mode = *shared.mode();
        if mode.refusing {
            close(client, true);
            continue;
        }
        let id = shared.next_id.fetch_add(1, SeqCst);
        let abort = Arc::new(AtomicBool::new(false));
        // Spawning under the table's lock: the thread removes itself from the table as
        // it ends, which must not happen before it has been put there.
        let mut conns = shared.conns();
        let spawned = {
            let shared = Arc::clone(shared);
            let abort = Arc::clone(&abort);
            thread::Builder::new()
                .name(format!("fault-proxy conn {id}"))
                .spawn(move || {
                    serve(client, mode.blackholed, &abort, &shared);
                    shared.conns().remove(&id);
                })
        };
        // A failed spawn drops the closure and with it the client: closed, if not reset.
        if let Ok(thread) = spawned {
            conns.insert(id, Conn { abort, thread });
        }
    }
}

/// Runs one connection to its end and closes both sides: with a reset if the
/// connection was aborted (reset_all, or an error on either side), plainly otherwise.
fn serve(client: TcpStream, held: bool, abort: &AtomicBool, shared: &Shared) {
    if held {
        shared.wait_for(abort, |m| !m.blackholed);
        close(client, abort.load(SeqCst));
        return;
    }
    let cancelled = || shared.stop.load(SeqCst) || abort.load(SeqCst);
    let upstream = match connect_upstream(&shared.upstream, &cancelled) {
        Ok(upstream) => upstream,
        Err(_) => {
            // The client learns what a direct connection would have told it: that
            // there is nothing there.
            close(client, true);
            return;
        }
    };
    if configure(&client)
        .and_then(|()| configure(&upstream))
        .is_err()
    {
        close(client, true);
        close(upstream, true);
        return;
    }
    thread::scope(|scope| {
        let back = thread::Builder::new()
            .name(
                thread::current()
                    .name()
                    .map_or_else(|| "fault-proxy".to_string(), |n| format!("{n} back")),
            )
            .spawn_scoped(scope, || pump(&upstream, &client, abort, shared));
        if back.is_err() {
            abort.store(true, SeqCst);
            return;
        }
        pump(&client, &upstream, abort, shared);
    });
    let reset = abort.load(SeqCst);
    close(client, reset);
    close(upstream, reset);
}

/// Forwards `from` to `to` until `from` ends (passed on as a half-close, so that a
/// peer's shutdown(Write) reaches the other side as one) or either side fails (the
/// whole connection is then aborted, so the other direction ends too).
fn pump(from: &TcpStream, to: &TcpStream, abort: &AtomicBool, shared: &Shared) {
    let (mut from, mut to) = (from, to);
    let flowing = || shared.wait_for(abort, Mode::flowing);
    let fail = || {
        abort.store(true, SeqCst);
        shared.wake();
    };
    let mut buf = vec![0u8; CHUNK];
    loop {
        if !flowing() {
            return;
        }
        let n = match from.read(&mut buf) {
            Ok(0) => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => n,
            Err(e) if is_transient(&e) => continue,
            Err(_) => return fail(),
        };
        {
            let mut seen = lock(&shared.recorded);
            let room = RECORD_LIMIT.saturating_sub(seen.len()).min(n);
            seen.extend_from_slice(&buf[..room]);
        }
        let mut rest = &buf[..n];
        while !rest.is_empty() {
            // Checked before every write, not only before reads: bytes read just as a
            // stall began are held too.
            if !flowing() {
                return;
            }
            match to.write(rest) {
                Ok(0) => return fail(),
                Ok(written) => rest = &rest[written..],
                Err(e) if is_transient(&e) => {}
                Err(_) => return fail(),
            }
        }
    }
}

/// A socket timeout (a tick passed) or an interrupted call: look at the flags, retry.
fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

fn configure(stream: &TcpStream) -> io::Result<()> {
    // Without NODELAY the proxy would hold back small requests that fsd itself sends
    // at once, adding latency no real network path adds.
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(TICK))?;
    stream.set_write_timeout(Some(TICK))
}

fn close(stream: TcpStream, reset: bool) {
    if reset {
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: setsockopt(2) on a descriptor the stream owns, with a pointer to a
        // live `linger` and its exact size. Its failure would only turn the reset into
        // an orderly close, which nothing here could do better about.
        unsafe {
            libc::setsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&linger as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            );
        }
    }
    drop(stream);
}

/// Waits up to `timeout` for `events` on `fd`; Ok(false) if they did not come (or a
/// signal interrupted the wait).
fn poll_fd(fd: RawFd, events: libc::c_short, timeout: Duration) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: poll(2) on one pollfd that lives across the call.
    let rc = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as libc::c_int) };
    match rc {
        0 => Ok(false),
        rc if rc > 0 => Ok(true),
        _ => {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            }
        }
    }
}

/// Connects to the first upstream address that answers. Upstreams are the tests'
/// own memnodes on this host, which accept or refuse at once; the timeout only
/// bounds how long a stop can wait for a connect under way.
fn connect_upstream(targets: &[SocketAddr], cancelled: &dyn Fn() -> bool) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::InvalidInput, "no upstream address");
    for target in targets {
        match TcpStream::connect_timeout(target, CONNECT_TIMEOUT) {
            Ok(stream) => return Ok(stream),
            Err(e) => last = e,
        }
        if cancelled() {
            break;
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::FaultProxy;
    use crate::{poll_until, within};
    use std::io::{self, Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    use std::sync::{mpsc, Arc};
    use std::thread::{self, JoinHandle};
    use std::time::{Duration, Instant};

    /// A bound on every single wait of these tests that is expected to succeed.
    const WAIT: Duration = Duration::from_secs(5);

    /// How a connection ended, as the echo server saw it: `None` for EOF.
    type Ending = Option<io::ErrorKind>;

    /// An echo server on 127.0.0.1:0: each connection gets back what it sends, and a
    /// half-close is answered with one once everything is echoed.
    struct Echo {
        addr: String,
        accepted: Arc<AtomicUsize>,
        received: Arc<AtomicUsize>,
        endings: mpsc::Receiver<Ending>,
        stop: Arc<AtomicBool>,
        thread: Option<JoinHandle<()>>,
    }

    impl Echo {
        fn start() -> Echo {
            let listener = TcpListener::bind("127.0.0.1:0").expect("echo server: bind");
            let addr = listener.local_addr().unwrap().to_string();
            let accepted = Arc::new(AtomicUsize::new(0));
            let received = Arc::new(AtomicUsize::new(0));
            let stop = Arc::new(AtomicBool::new(false));
            let (tx, endings) = mpsc::channel();
            let thread = {
                let (accepted, received, stop) = (
                    Arc::clone(&accepted),
                    Arc::clone(&received),
                    Arc::clone(&stop),
                );
                thread::spawn(move || {
                    for conn in listener.incoming() {
                        if stop.load(SeqCst) {
                            return;
                        }
                        let Ok(conn) = conn else { continue };
                        accepted.fetch_add(1, SeqCst);
                        let (received, tx) = (Arc::clone(&received), tx.clone());
                        thread::spawn(move || {
                            let _ = tx.send(echo(conn, &received));
                        });
                    }
                })
            };
            Echo {
                addr,
                accepted,
                received,
                endings,
                stop,
                thread: Some(thread),
            }
        }

        /// The next connection to end, within `limit`.
        fn ended(&self, limit: Duration) -> Ending {
            self.endings
                .recv_timeout(limit)
                .unwrap_or_else(|_| panic!("no echo connection ended within {limit:?}"))
        }
    }

    impl Drop for Echo {
        fn drop(&mut self) {
            self.stop.store(true, SeqCst);
            // A connection of our own is what wakes the blocked accept; if it cannot be
            // made the thread is left behind rather than joined forever.
            if TcpStream::connect(&self.addr).is_ok() {
                if let Some(thread) = self.thread.take() {
                    let _ = thread.join();
                }
            }
        }
    }

    fn echo(conn: TcpStream, received: &AtomicUsize) -> Ending {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match (&conn).read(&mut buf) {
                Ok(0) => {
                    let _ = conn.shutdown(Shutdown::Write);
                    return None;
                }
                Ok(n) => {
                    received.fetch_add(n, SeqCst);
                    if let Err(e) = (&conn).write_all(&buf[..n]) {
                        return Some(e.kind());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Some(e.kind()),
            }
        }
    }

    fn connect(addr: &str) -> TcpStream {
        let s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
        s.set_read_timeout(Some(WAIT)).unwrap();
        s.set_write_timeout(Some(WAIT)).unwrap();
        s
    }

    /// Sends `msg` and reads it back, failing on anything else.
    fn ping(s: &TcpStream, msg: &[u8]) {
        (&*s).write_all(msg).expect("ping: write");
        let mut back = vec![0u8; msg.len()];
        (&*s).read_exact(&mut back).expect("ping: read the echo");
        assert_eq!(back, msg, "ping: the echo differs");
    }

    /// Reproducible pseudorandom bytes (xorshift64*), different for each seed.
    fn pattern(seed: u64, len: usize) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
        }
        out.truncate(len);
        out
    }

    /// Sends `len` pattern bytes through `addr`, half-closes, reads the echo to EOF
    /// and checks it byte for byte.
    fn transfer(addr: &str, seed: u64, len: usize) {
        let data = pattern(seed, len);
        let s = connect(addr);
        let back = thread::scope(|scope| {
            scope.spawn(|| {
                for chunk in data.chunks(100_000) {
                    (&s).write_all(chunk).expect("transfer: write");
                }
                s.shutdown(Shutdown::Write).expect("transfer: half-close");
            });
            let mut back = Vec::with_capacity(len);
            (&s).read_to_end(&mut back)
                .expect("transfer: read the echo to EOF");
            back
        });
        if let Some(at) = data.iter().zip(&back).position(|(a, b)| a != b) {
            panic!("seed {seed}: the echo differs first at byte {at} of {len}");
        }
        assert_eq!(
            back.len(),
            len,
            "seed {seed}: the echo has the wrong length"
        );
    }

    /// The read on a connection the proxy ended: EOF or an error, never a timeout.
    fn ended_read(s: &mut TcpStream) -> io::Result<usize> {
        let r = s.read(&mut [0u8; 16]);
        if let Err(e) = &r {
            assert!(
                !matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ),
                "the connection was not ended within {WAIT:?}"
            );
        }
        r
    }

    fn assert_quiet(s: &mut TcpStream, what: &str) {
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        match s.read(&mut [0u8; 16]) {
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            other => panic!("{what}: expected nothing for 300 ms, got {other:?}"),
        }
        s.set_read_timeout(Some(WAIT)).unwrap();
    }

    #[test]
    fn forwards_bytes_exactly_on_concurrent_connections() {
        let echo = Echo::start();
        let proxy = FaultProxy::start(&echo.addr);
        let addr = proxy.addr();
        within(
            Duration::from_secs(60),
            "8 transfers through the proxy",
            move || {
                thread::scope(|scope| {
                    for seed in 0..8u64 {
                        let addr = &addr;
                        let len = if seed == 0 { 12 << 20 } else { 1 << 20 };
                        scope.spawn(move || transfer(addr, seed, len));
                    }
                });
            },
        );
        assert_eq!(proxy.accepted(), 8);
        assert_eq!(echo.accepted.load(SeqCst), 8);
        assert_eq!(echo.received.load(SeqCst), (12 << 20) + 7 * (1 << 20));
        for _ in 0..8 {
            // A clean end both ways: the half-close reached the server, nothing reset.
            assert_eq!(echo.ended(WAIT), None, "the server saw a connection fail");
        }
        assert_eq!(
            poll_until(WAIT, || (proxy.open_connections() == 0).then_some(())),
            Some(()),
            "the proxy still has {} connections open after they all ended",
            proxy.open_connections()
        );
    }

    #[test]
    fn reset_all_resets_both_sides_and_new_connections_work() {
        let echo = Echo::start();
        let proxy = FaultProxy::start(&echo.addr);
        let s = connect(&proxy.addr());
        ping(&s, b"before the reset");
        assert_eq!(proxy.open_connections(), 1);

        let (tx, rx) = mpsc::channel();
        let mut reader = s.try_clone().unwrap();
        thread::spawn(move || {
            let _ = tx.send(reader.read(&mut [0u8; 16]));
        });
        // Not a synchronisation: the test holds whether or not the read has started,
        // this only makes it likely that the reset meets a read already blocked.
        thread::sleep(Duration::from_millis(100));
        let t = Instant::now();
        assert_eq!(proxy.reset_all(), 1);
        let r = rx
            .recv_timeout(WAIT)
            .expect("the client's blocked read did not return after reset_all");
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "reset took {:?}",
            t.elapsed()
        );
        match r {
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
            other => panic!("the client's read: expected ECONNRESET, got {other:?}"),
        }
        assert_eq!(
            echo.ended(WAIT),
            Some(io::ErrorKind::ConnectionReset),
            "the server side: expected ECONNRESET"
        );
        assert_eq!(proxy.open_connections(), 0);

        let s2 = connect(&proxy.addr());
        ping(&s2, b"after the reset");
        assert_eq!(proxy.accepted(), 2);
        assert_eq!(proxy.open_connections(), 1);
        assert_eq!(proxy.reset_all(), 1);
    }

    #[test]
    fn stall_holds_bytes_and_unstall_delivers_them_all() {
        let echo = Echo::start();
        let proxy = FaultProxy::start(&echo.addr);
        let mut s = connect(&proxy.addr());
        ping(&s, b"before the stall");
        let before = echo.received.load(SeqCst);

        proxy.stall();
        let data = pattern(42, 200_000);
        let writer = {
            let (s, data) = (s.try_clone().unwrap(), data.clone());
            thread::spawn(move || (&s).write_all(&data))
        };
        assert_quiet(&mut s, "a stalled connection");
        assert_eq!(
            echo.received.load(SeqCst),
            before,
            "bytes reached the server through a stalled proxy"
        );
        assert_eq!(proxy.open_connections(), 1, "a stall closed the connection");

        proxy.unstall();
        let mut back = vec![0u8; data.len()];
        s.read_exact(&mut back)
            .expect("after unstall: read back everything that waited");
        assert!(
            back == data,
            "after unstall the bytes differ from those sent"
        );
        writer
            .join()
            .unwrap()
            .expect("the writer of the stalled bytes");
        ping(&s, b"after the stall");
    }

    #[test]
    fn blackhole_holds_new_connections_and_stalls_old_ones() {
        let echo = Echo::start();
        let proxy = FaultProxy::start(&echo.addr);
        let mut old = connect(&proxy.addr());
        ping(&old, b"before the black hole");

        proxy.blackhole();
        old.write_all(b"waits").unwrap();
        let mut new = connect(&proxy.addr());
        new.write_all(b"never answered").unwrap();
        assert_quiet(&mut new, "a connection into the black hole");
        assert_quiet(&mut old, "a connection stalled by the black hole");
        assert_eq!(
            echo.accepted.load(SeqCst),
            1,
            "the black hole forwarded a connection"
        );
        assert_eq!(proxy.accepted(), 2);
        assert_eq!(proxy.open_connections(), 2);

        proxy.restore();
        let mut back = [0u8; 5];
        old.read_exact(&mut back)
            .expect("after restore: the bytes that waited");
        assert_eq!(&back, b"waits");
        // The held connection is closed: unread bytes make that a reset on Linux, and
        // an EOF is as good.
        let _ = ended_read(&mut new);
        ping(&old, b"after the black hole");
        let fresh = connect(&proxy.addr());
        ping(&fresh, b"a new connection after the black hole");
    }

    #[test]
    fn refuse_resets_new_connections_until_turned_off() {
        let echo = Echo::start();
        let proxy = FaultProxy::start(&echo.addr);
        let old = connect(&proxy.addr());
        ping(&old, b"before refusing");

        proxy.refuse(true);
        let t = Instant::now();
        // The kernel completes the handshake before the proxy can reset it, so the
        // refusal shows on the first read (or on connect, should the reset come first).
        if let Ok(mut s) = TcpStream::connect(proxy.addr()) {
            s.set_read_timeout(Some(WAIT)).unwrap();
            let r = ended_read(&mut s);
            assert!(
                matches!(&r, Ok(0)) || r.is_err(),
                "a refused connection read {r:?}"
            );
        }
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "refusing took {:?}",
            t.elapsed()
        );
        assert_eq!(proxy.accepted(), 2);
        assert_eq!(proxy.open_connections(), 1, "a refused connection was kept");
        assert_eq!(
            echo.accepted.load(SeqCst),
            1,
            "a refused connection was forwarded"
        );
        ping(&old, b"an existing connection is not refused");

        proxy.refuse(false);
        let s = connect(&proxy.addr());
        ping(&s, b"after refusing");
        assert_eq!(echo.accepted.load(SeqCst), 2);
    }

    #[test]
    fn drop_returns_promptly_with_connections_open() {
        let echo = Echo::start();
        let proxy = FaultProxy::start(&echo.addr);
        let addr = proxy.addr();
        let mut clients: Vec<TcpStream> = (0..3).map(|_| connect(&addr)).collect();
        for c in &clients {
            ping(c, b"open");
        }
        // Every kind of thread the proxy has: one connection with bytes held by a
        // stall, one held by the black hole.
        proxy.blackhole();
        clients[0].write_all(&pattern(7, 100_000)).unwrap();
        clients.push(connect(&addr));
        assert_eq!(
            poll_until(WAIT, || (proxy.accepted() == 4).then_some(())),
            Some(()),
            "the proxy did not accept the 4th connection"
        );

        let t = Instant::now();
        within(WAIT, "dropping the proxy", move || drop(proxy));
        let took = t.elapsed();
        assert!(
            took < Duration::from_secs(1),
            "dropping the proxy took {took:?}"
        );
        for c in &mut clients {
            let _ = ended_read(c);
        }
    }
}
