//! The server's payload paths against a raw client that speaks the wire format
//! itself, so it can do what the real client never does: leave completions unread
//! until the socket is full, trickle a payload in, or have the memory deregistered
//! while a WRITE's payload is still arriving; and its connection caps and deadlines
//! against idle, slow and half-done connections from several loopback addresses.

use super::*;
use crate::fabric::{ControlReply, MemoryRegistry};
use std::io::ErrorKind;

/// Every SEND says hello as client 1 and is answered "ok".
struct Hello;

impl ControlHandler for Hello {
    fn handle(&self, conn: &mut ConnectionState, _frame: &[u8]) -> ControlReply {
        conn.client = Some(1);
        ControlReply {
            frame: b"ok".to_vec(),
            close: false,
        }
    }

    fn disconnected(&self, _conn: &ConnectionState) {}
}

struct Fixture {
    _server: TcpServer,
    registry: Arc<dyn MemoryRegistry>,
    stream: TcpStream,
}

fn connect() -> Fixture {
    let listener = crate::fabric::tcp::TcpListener::bind("127.0.0.1:0").expect("bind");
    let registry = crate::fabric::Listener::registry(&listener);
    let server = listener.start(Arc::new(Hello)).expect("serve");
    let mut stream = TcpStream::connect(server.local_addr()).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    send_request(&mut stream, OP_SEND, 0, 0, 0, b"hello");
    let (h, reply) = completion(&mut stream);
    assert_eq!((h.status, reply.as_slice()), (STATUS_OK, &b"ok"[..]));
    Fixture {
        _server: server,
        registry,
        stream,
    }
}

/// A leaked (so always mapped) buffer of `len` bytes of `seed`'s pattern,
/// registered for client 1: (address, rkey).
fn region(registry: &dyn MemoryRegistry, len: usize, seed: u8) -> (u64, u32) {
    let buf: &'static mut [u8] = pattern(len, seed).leak();
    let addr = buf.as_mut_ptr() as u64;
    // SAFETY: the buffer is leaked, so it stays mapped for the rest of the process.
    let rkey = unsafe { registry.register(1, addr, len as u64) }.expect("register");
    (addr, rkey)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

/// The memory at `addr` as the server holds it.
fn memory(addr: u64, len: usize) -> Vec<u8> {
    // SAFETY: `addr` is a leaked buffer of at least `len` bytes, and no request is
    // in flight when the tests look.
    unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec()
}

fn header(op: u8, wr_id: u64, addr: u64, rkey: u32, len: usize) -> [u8; REQUEST_HEADER_LEN] {
    RequestHeader {
        op,
        len: len as u32,
        wr_id,
        addr,
        rkey,
    }
    .encode()
}

fn send_request(s: &mut TcpStream, op: u8, wr_id: u64, addr: u64, rkey: u32, payload: &[u8]) {
    s.write_all(&header(op, wr_id, addr, rkey, payload.len()))
        .expect("request header");
    s.write_all(payload).expect("request payload");
}

fn completion(s: &mut TcpStream) -> (CompletionHeader, Vec<u8>) {
    let mut b = [0u8; COMPLETION_HEADER_LEN];
    s.read_exact(&mut b).expect("completion header");
    let h = CompletionHeader::decode(&b);
    let mut payload = vec![0u8; h.len as usize];
    s.read_exact(&mut payload).expect("completion payload");
    (h, payload)
}

#[test]
fn reads_left_unread_until_the_socket_is_full_arrive_whole_and_in_order() {
    let mut f = connect();
    let len = 4 << 20;
    let (addr, rkey) = region(&*f.registry, len, 5);
    let expected = pattern(len, 5);
    // 16 MiB of READ payloads, large and small, with WRITEs between: far more than
    // the socket buffers hold, so the server finds the socket full part way through
    // many of its sends.
    let mut asked = Vec::new();
    for i in 0..256u64 {
        let size = if i % 5 == 0 { 4096 } else { 64 << 10 };
        let off = (i as usize * 40_961) % (len - size);
        f.stream
            .write_all(&header(OP_READ, i, addr + off as u64, rkey, size))
            .expect("READ request");
        asked.push((i, off, size));
        if i % 50 == 49 {
            // Rewrites bytes with their own values, so the expected image holds.
            let w = 1000 + i;
            let at = (i as usize * 7919) % (len - 100);
            let bytes = &expected[at..at + 100];
            send_request(&mut f.stream, OP_WRITE, w, addr + at as u64, rkey, bytes);
            asked.push((w, at, 0));
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    for (wr_id, off, size) in asked {
        let (h, payload) = completion(&mut f.stream);
        assert_eq!((h.wr_id, h.status), (wr_id, STATUS_OK), "completion order");
        assert!(
            payload == expected[off..off + size],
            "READ {wr_id} ({size} bytes at {off}) must hold the memory's bytes"
        );
    }
}

#[test]
fn a_write_payload_that_trickles_in_lands_whole() {
    let mut f = connect();
    let len = 256 << 10;
    let (addr, rkey) = region(&*f.registry, len, 0);
    let data = pattern(len, 77);
    f.stream
        .write_all(&header(OP_WRITE, 7, addr, rkey, len))
        .expect("header");
    for piece in data.chunks(len / 7 + 1) {
        f.stream.write_all(piece).expect("piece");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (h, _) = completion(&mut f.stream);
    assert_eq!((h.wr_id, h.status), (7, STATUS_OK));
    assert!(memory(addr, len) == data, "the WRITE must land whole");
}

#[test]
fn a_write_whose_memory_goes_away_midway_fails_and_the_connection_goes_on() {
    let mut f = connect();
    let len = 1 << 20;
    let (addr, rkey) = region(&*f.registry, len, 0);
    let before = memory(addr, len);
    let data = vec![0xeeu8; len];
    let half = len / 2;
    f.stream
        .write_all(&header(OP_WRITE, 9, addr, rkey, len))
        .expect("header");
    f.stream.write_all(&data[..half]).expect("first half");
    std::thread::sleep(Duration::from_millis(100));
    f.registry.deregister(rkey);
    f.stream.write_all(&data[half..]).expect("second half");
    let (h, _) = completion(&mut f.stream);
    assert_eq!((h.wr_id, h.status), (9, STATUS_REMOTE_ACCESS));
    // Nothing reached the memory after it was deregistered.
    assert!(memory(addr, len)[half..] == before[half..]);
    // The connection is still in step: the next request is answered.
    send_request(&mut f.stream, OP_SEND, 10, 0, 0, b"again");
    let (h, reply) = completion(&mut f.stream);
    assert_eq!(
        (h.wr_id, h.status, reply.as_slice()),
        (10, STATUS_OK, &b"ok"[..])
    );
}

/// A Hello of two round trips, as the real one: "hello" is answered "challenge"
/// (the client is not known yet), "prove" then "welcome" as client 1.
struct TwoStep;

impl ControlHandler for TwoStep {
    fn handle(&self, conn: &mut ConnectionState, frame: &[u8]) -> ControlReply {
        let reply: &[u8] = match frame {
            b"prove" => {
                conn.client = Some(1);
                b"welcome"
            }
            b"hello" => b"challenge",
            _ => b"?",
        };
        ControlReply {
            frame: reply.to_vec(),
            close: false,
        }
    }

    fn disconnected(&self, _conn: &ConnectionState) {}
}

/// The bound on every wait of these tests for something that should happen.
const LIMIT: Duration = Duration::from_secs(10);

fn limits(pending: usize, per_source: usize, authenticated: usize) -> ConnectionLimits {
    ConnectionLimits {
        authenticated,
        pending,
        pending_per_source: per_source,
        hello_timeout: LIMIT * 3,
        frame_timeout: LIMIT * 3,
    }
}

/// A server with `limits` and [`TwoStep`]; the registry to give client 1 memory.
fn serve_with(limits: ConnectionLimits) -> (TcpServer, Arc<dyn MemoryRegistry>) {
    let listener = crate::fabric::tcp::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .with_limits(limits);
    let registry = crate::fabric::Listener::registry(&listener);
    (listener.start(Arc::new(TwoStep)).expect("serve"), registry)
}

/// A connection to `server` from the loopback address `from` (127.0.0.x).
fn connect_from(from: &str, server: &TcpServer) -> TcpStream {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    let local: SocketAddr = format!("{from}:0").parse().expect("address");
    socket.bind(&local.into()).expect("bind the source address");
    socket
        .connect(&server.local_addr().into())
        .expect("connect");
    let s: TcpStream = socket.into();
    s.set_read_timeout(Some(LIMIT)).expect("timeout");
    s
}

/// One control exchange; None when the server closed the connection instead.
fn call(s: &mut TcpStream, frame: &[u8]) -> Option<Vec<u8>> {
    s.write_all(&header(OP_SEND, 3, 0, 0, frame.len())).ok()?;
    s.write_all(frame).ok()?;
    let mut b = [0u8; COMPLETION_HEADER_LEN];
    s.read_exact(&mut b).ok()?;
    let h = CompletionHeader::decode(&b);
    let mut reply = vec![0u8; h.len as usize];
    s.read_exact(&mut reply).ok()?;
    Some(reply)
}

/// Both round trips of the Hello.
fn hello(s: &mut TcpStream) {
    assert_eq!(call(s, b"hello").as_deref(), Some(&b"challenge"[..]));
    assert_eq!(call(s, b"prove").as_deref(), Some(&b"welcome"[..]));
}

/// Whether the server closes `s` within `within` (anything it sends is dropped).
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).expect("timeout");
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

/// A READ of client 1's memory, answered with its bytes: the connection is past
/// its Hello and served.
fn read_works(s: &mut TcpStream, registry: &dyn MemoryRegistry) {
    let (addr, rkey) = region(registry, 4096, 3);
    s.write_all(&header(OP_READ, 9, addr, rkey, 4096))
        .expect("READ request");
    let (h, payload) = completion(s);
    assert_eq!((h.wr_id, h.status), (9, STATUS_OK));
    assert!(payload == pattern(4096, 3));
}

#[test]
fn idle_connections_from_many_addresses_do_not_keep_a_client_out() {
    let (server, registry) = serve_with(limits(8, 4, 4));
    let mut idle: Vec<TcpStream> = (0..32)
        .map(|_| connect_from("127.0.0.1", &server))
        .collect();
    for a in 2..10 {
        let from = format!("127.0.0.{a}");
        idle.extend((0..4).map(|_| connect_from(&from, &server)));
    }
    // A newcomer from the flooding address and one from elsewhere both get in.
    let mut good = Vec::new();
    for from in ["127.0.0.1", "127.0.0.50"] {
        let mut c = connect_from(from, &server);
        hello(&mut c);
        read_works(&mut c, &*registry);
        good.push(c);
    }
    assert!(
        closed_within(&mut idle[0], LIMIT),
        "the oldest idle connection was closed to make room"
    );
    let counts = server.connection_counts();
    assert!(counts.pending <= 8, "{counts:?}");
    assert_eq!(counts.authenticated, 2, "{counts:?}");
}

#[test]
fn a_connection_is_pending_until_its_welcome() {
    let (server, registry) = serve_with(limits(2, 2, 4));
    let mut halfway = connect_from("127.0.0.1", &server);
    assert_eq!(
        call(&mut halfway, b"hello").as_deref(),
        Some(&b"challenge"[..])
    );
    let _b = connect_from("127.0.0.1", &server);
    let _c = connect_from("127.0.0.1", &server);
    // The challenged connection was the oldest pending one: closed for `_c`.
    assert_eq!(call(&mut halfway, b"prove"), None);
    let mut done = connect_from("127.0.0.1", &server);
    hello(&mut done);
    let _more: Vec<TcpStream> = (0..6).map(|_| connect_from("127.0.0.1", &server)).collect();
    read_works(&mut done, &*registry);
}

#[test]
fn past_the_authenticated_cap_a_hello_is_refused_until_a_client_leaves() {
    let (server, registry) = serve_with(limits(8, 8, 2));
    let mut first = connect_from("127.0.0.1", &server);
    let mut second = connect_from("127.0.0.1", &server);
    hello(&mut first);
    hello(&mut second);
    let mut third = connect_from("127.0.0.1", &server);
    assert_eq!(
        call(&mut third, b"hello").as_deref(),
        Some(&b"challenge"[..])
    );
    assert_eq!(call(&mut third, b"prove"), None, "refused, with no welcome");
    drop(first);
    // The first connection's thread ends a moment after its socket closes.
    let deadline = Instant::now() + LIMIT;
    let mut fourth = loop {
        let mut c = connect_from("127.0.0.1", &server);
        call(&mut c, b"hello");
        if call(&mut c, b"prove").is_some() {
            break c;
        }
        assert!(Instant::now() < deadline, "no room after a client left");
        std::thread::sleep(Duration::from_millis(20));
    };
    read_works(&mut fourth, &*registry);
    read_works(&mut second, &*registry);
}

#[test]
fn a_connection_without_its_hello_is_closed_at_the_hello_deadline() {
    let (server, registry) = serve_with(ConnectionLimits {
        hello_timeout: Duration::from_millis(300),
        ..limits(8, 8, 8)
    });
    let mut silent = connect_from("127.0.0.1", &server);
    let mut halfway = connect_from("127.0.0.1", &server);
    let mut done = connect_from("127.0.0.1", &server);
    call(&mut halfway, b"hello").expect("challenged");
    hello(&mut done);
    assert!(closed_within(&mut silent, LIMIT), "silent");
    assert!(
        closed_within(&mut halfway, LIMIT),
        "challenged, never proved"
    );
    // Past the deadline, the connection that said its Hello is still served.
    read_works(&mut done, &*registry);
}

#[test]
fn a_client_that_reads_none_of_its_replies_is_closed_at_the_hello_deadline() {
    let (server, _registry) = serve_with(ConnectionLimits {
        hello_timeout: Duration::from_secs(1),
        ..limits(8, 8, 8)
    });
    // A small receive buffer, so that the server's writes block well before the
    // deadline: it must not wait on them past it.
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    socket
        .set_recv_buffer_size(4096)
        .expect("a small receive buffer");
    socket
        .connect(&server.local_addr().into())
        .expect("connect");
    let mut greedy: TcpStream = socket.into();
    // READs before the Hello, each answered with an error completion this client
    // never reads: the server's writes block once the socket is full.
    greedy
        .set_write_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    let requests: Vec<u8> = (0..4096)
        .flat_map(|i| header(OP_READ, i, 0, 0, 64))
        .collect();
    let until = Instant::now() + LIMIT;
    while Instant::now() < until && greedy.write_all(&requests).is_ok() {}
    // The connection's thread ends, though the client reads nothing (reading would
    // unblock the server's writes).
    let deadline = Instant::now() + LIMIT;
    while server.connection_counts().live > 0 {
        assert!(
            Instant::now() < deadline,
            "the connection outlived its deadline"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `head`, then `len` bytes one at a time, each after the last was left
/// waiting `gap`: Ok(bytes sent) once the server closes the connection, Err if it
/// is still open after `most` bytes.
fn trickle(s: &mut TcpStream, head: &[u8], most: usize, gap: Duration) -> Result<usize, ()> {
    s.write_all(head).expect("the frame's start");
    for sent in 0..most {
        if closed_within(s, gap) {
            return Ok(sent);
        }
        if s.write_all(&[0x5a]).is_err() {
            return Ok(sent);
        }
    }
    Err(())
}

#[test]
fn a_frame_trickled_a_byte_at_a_time_is_closed_at_its_deadline() {
    let (server, registry) = serve_with(ConnectionLimits {
        frame_timeout: Duration::from_millis(300),
        ..limits(8, 8, 8)
    });
    let gap = Duration::from_millis(50);
    // A byte every 50 ms, each well within the deadline, would take 10 s: the
    // deadline counts from the frame's start, not from the last byte.
    let mut control = connect_from("127.0.0.1", &server);
    hello(&mut control);
    let head = header(OP_SEND, 1, 0, 0, 1000);
    let sent = trickle(&mut control, &head, 200, gap);
    assert!(sent.is_ok(), "a trickled control frame was never cut off");

    let mut write = connect_from("127.0.0.1", &server);
    hello(&mut write);
    let (addr, rkey) = region(&*registry, 4096, 0);
    let head = header(OP_WRITE, 2, addr, rkey, 4096);
    assert!(
        trickle(&mut write, &head, 200, gap).is_ok(),
        "a WRITE payload"
    );

    let mut split = connect_from("127.0.0.1", &server);
    hello(&mut split);
    // Even a header: its first byte starts the frame.
    let head = header(OP_READ, 3, addr, rkey, 64);
    let (first, rest) = head.split_at(1);
    split.write_all(first).expect("first byte");
    for b in rest {
        if closed_within(&mut split, gap) {
            break;
        }
        let _ = split.write_all(&[*b]);
    }
    assert!(closed_within(&mut split, LIMIT), "a trickled header");
}
