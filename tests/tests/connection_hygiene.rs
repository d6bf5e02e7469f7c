//! A memnode that anyone can reach, token or not, keeps serving its clients (issue
//! 54, items 2 and 6): 1024 idle sockets that never say Hello, from the good client's
//! own address and from others, do not keep a client with the right token out; a
//! socket silent past the Hello deadline is closed; a frame trickled in a byte at a
//! time is closed at its whole-frame deadline, though each byte comes well within
//! it; slow clients of the metrics endpoint that keep reconnecting do not stop
//! scrapes. The deadlines are shortened with `--hello-timeout` and `--frame-timeout`
//! so that each test takes seconds.
//!
//! tcp only, whatever RMEMFS_TRANSPORT says: the hostile peers are raw sockets (the
//! verbs server has the same caps and Hello deadline, unit-checked in its build).

use rmemfs_common::control;
use rmemfs_common::fabric::tcp::wire::{RequestHeader, OP_SEND};
use rmemfs_common::protocol::MAX_CONTROL_FRAME;
use rmemfs_tests::exposition::Format;
use rmemfs_tests::metrics::scrape;
use rmemfs_tests::{MemnodeProc, Transport};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The bound on every wait for something that should happen.
const LIMIT: Duration = Duration::from_secs(20);
const TOKEN: &str = "hygiene-test-token";

/// Lets this process hold `n` descriptors (as far as its hard limit allows).
fn allow_descriptors(n: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read or write one valid rlimit each.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        if lim.rlim_cur < n {
            lim.rlim_cur = n.min(lim.rlim_max);
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        }
    }
    assert!(
        lim.rlim_cur >= n,
        "this test needs {n} open files; the hard limit is {}",
        lim.rlim_max
    );
}

/// A connection to `to` from the loopback address `from` (127.0.0.x).
fn connect_from(from: &str, to: &str) -> TcpStream {
    let to: SocketAddr = to.parse().expect("the memnode's address");
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("a socket");
    let local: SocketAddr = format!("{from}:0").parse().expect("a source address");
    socket
        .bind(&local.into())
        .unwrap_or_else(|e| panic!("binding {from}: {e}"));
    socket
        .connect(&to.into())
        .unwrap_or_else(|e| panic!("connecting from {from} to {to}: {e}"));
    socket.into()
}

/// Whether the peer closes `s` within `within` (what it sends meanwhile is dropped).
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).expect("a read timeout");
    let mut sink = [0u8; 256];
    loop {
        match s.read(&mut sink) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return false
            }
            Err(_) => return true, // reset
        }
    }
}

fn count(text: &str, what: &str) -> usize {
    text.lines().filter(|l| l.contains(what)).count()
}

#[test]
fn idle_sockets_that_never_say_hello_do_not_keep_a_client_out() {
    allow_descriptors(4096);
    let memnode = MemnodeProc::start_on(Transport::Tcp, "64M", &["--token", TOKEN]);
    let addr = memnode.addr().to_string();
    // 1024 sockets, what filled every connection of a memnode before: most from
    // the good client's own address, the rest from 16 others.
    let mut idle: Vec<TcpStream> = (0..768).map(|_| connect_from("127.0.0.1", &addr)).collect();
    for a in 0..256 {
        idle.push(connect_from(&format!("127.0.0.{}", 2 + a % 16), &addr));
    }
    let (ep, _) = memnode.tcp_client();
    let chunk = control::alloc(&ep, 1 << 20).expect("the client allocates past the flood");
    assert_eq!(chunk.len, 1 << 20);
    // The oldest idle sockets were closed to make room.
    assert!(closed_within(&mut idle[0], LIMIT));
    let log = memnode.stderr();
    assert!(
        count(&log, "closed a connection from") <= 5,
        "hundreds of evictions make a line per interval, not one each:\n{log}"
    );
    assert!(
        !log.contains("open-file limit is"),
        "the memnode's descriptors fall short of its caps:\n{log}"
    );
    drop(idle);
}

#[test]
fn a_socket_silent_past_the_hello_deadline_is_closed() {
    let memnode = MemnodeProc::start_on(
        Transport::Tcp,
        "64M",
        &["--token", TOKEN, "--hello-timeout", "1"],
    );
    let mut silent = TcpStream::connect(memnode.addr()).expect("connects");
    // Half a SEND: a Hello that never ends.
    let mut halfway = TcpStream::connect(memnode.addr()).expect("connects");
    halfway
        .write_all(
            &RequestHeader {
                op: OP_SEND,
                len: 64,
                wr_id: 1,
                addr: 0,
                rkey: 0,
            }
            .encode(),
        )
        .expect("sends a header");
    let (client, _) = memnode.tcp_client();
    assert!(closed_within(&mut silent, LIMIT), "a silent socket");
    assert!(
        closed_within(&mut halfway, LIMIT),
        "a Hello begun, never ended"
    );
    // The deadline is for the Hello only: the client that said it is served past it.
    control::stat(&client).expect("the client is served past the Hello deadline");
    assert!(memnode.stderr().contains("before its Hello"));
}

#[test]
fn a_frame_trickled_a_byte_at_a_time_is_closed_at_its_deadline() {
    let memnode = MemnodeProc::start_on(
        Transport::Tcp,
        "64M",
        &[
            "--token",
            TOKEN,
            "--frame-timeout",
            "1",
            "--hello-timeout",
            "60",
        ],
    );
    let mut s = TcpStream::connect(memnode.addr()).expect("connects");
    s.write_all(
        &RequestHeader {
            op: OP_SEND,
            len: MAX_CONTROL_FRAME as u32,
            wr_id: 1,
            addr: 0,
            rkey: 0,
        }
        .encode(),
    )
    .expect("sends a header");
    // A byte every 250 ms: each well within the 1 s deadline, the whole frame
    // (1 KiB) in minutes. The frame's deadline runs from its start, and the Hello's
    // (60 s) is far off, so the close comes at the frame's.
    let start = Instant::now();
    let mut sent = 0;
    let closed = loop {
        if closed_within(&mut s, Duration::from_millis(250)) {
            break true;
        }
        if start.elapsed() > LIMIT || s.write_all(&[0x5a]).is_err() {
            break start.elapsed() <= LIMIT;
        }
        sent += 1;
    };
    assert!(closed, "still open after {sent} trickled bytes");
    assert!(sent < MAX_CONTROL_FRAME, "the frame was never cut off");
    let (client, _) = memnode.tcp_client();
    control::stat(&client).expect("the memnode serves on");
}

/// Until `stop`: connects to `addr`, sends `request`, keeps the connection for up to
/// 300 ms reading nothing (or, for a whole request, its answer a byte at a time),
/// then leaves and comes back.
fn slow_metrics_client(addr: String, request: &'static [u8], stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::SeqCst) {
        let Ok(mut c) = TcpStream::connect(&addr) else {
            continue;
        };
        let _ = c.write_all(request);
        let _ = c.set_read_timeout(Some(Duration::from_millis(30)));
        let until = Instant::now() + Duration::from_millis(300);
        let mut byte = [0u8; 1];
        while Instant::now() < until && !stop.load(Ordering::SeqCst) {
            if let Ok(0) = c.read(&mut byte) {
                break;
            }
        }
    }
}

#[test]
fn slow_metrics_clients_that_keep_reconnecting_do_not_stop_scrapes() {
    let memnode = MemnodeProc::start_on(
        Transport::Tcp,
        "64M",
        &["--token", TOKEN, "--metrics", "127.0.0.1:0"],
    );
    let addr = memnode.metrics_addr().to_string();
    let stop = Arc::new(AtomicBool::new(false));
    // Twice the 18 that held every worker and queue place of the old endpoint.
    let slow: Vec<_> = (0..36)
        .map(|i| {
            let request: &'static [u8] = if i % 4 == 0 {
                b"GET /metrics HTTP/1.1\r\n\r\n"
            } else {
                b"GET /metr"
            };
            let (addr, stop) = (addr.clone(), stop.clone());
            std::thread::spawn(move || slow_metrics_client(addr, request, stop))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    for _ in 0..10 {
        let e = scrape(&addr, Format::Prometheus);
        assert!(
            e.families.keys().any(|k| k.starts_with("memnode_")),
            "a scrape answers with the memnode's metrics"
        );
    }
    stop.store(true, Ordering::SeqCst);
    for t in slow {
        t.join().expect("a slow client");
    }
}
