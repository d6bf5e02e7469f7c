//! A memnode faced with hostile peers: garbage, truncated and oversized frames, a wrong
//! protocol version, accesses before Hello, malformed volume requests, wrong rkeys and
//! out-of-bounds addresses. Each gets an error or a closed connection, never a crash or
//! a hang, and never touches memory it has no right to; a well-behaved client keeps
//! working before, during and after.
//!
//! tcp only, whatever RMEMFS_TRANSPORT says: the hostile peers speak raw bytes of the
//! tcp backend's wire format (over verbs the NIC checks rkeys and bounds; the wrong-rkey
//! check over verbs is in common/tests/fabric.rs). The memnode is a real process
//! ([`MemnodeProc`]), so a crash shows as a dead process, not a panicked thread.

use rmemfs_common::control;
use rmemfs_common::fabric::tcp::wire::{
    CompletionHeader, RequestHeader, COMPLETION_HEADER_LEN, OP_READ, OP_SEND, OP_WRITE,
    REQUEST_MAGIC, STATUS_BAD_REQUEST, STATUS_OK, STATUS_REMOTE_ACCESS,
};
use rmemfs_common::fabric::tcp::TcpEndpoint;
use rmemfs_common::fabric::{Endpoint, FabricError, RdmaOp, RemoteAddr, MAX_DATA_OP};
use rmemfs_common::protocol::{
    Allocation, ErrorCode, Request, Response, SessionSecret, MAX_CONTROL_FRAME,
};
use rmemfs_tests::data::assert_bytes_eq;
use rmemfs_tests::{poll_until, MemnodeProc, Pattern, Transport};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// How long a hostile connection may wait for its error or its close; the bound on
/// every wait here.
const ANSWER_LIMIT: Duration = Duration::from_secs(10);
const ALLOC: u64 = 1 << 20;
/// The work request id of every raw request: a reply must carry it back.
const WR_ID: u64 = 7;

/// A raw connection to the memnode at `addr`, reads and writes bounded.
fn raw(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(ANSWER_LIMIT))
        .expect("setting a read timeout");
    s.set_write_timeout(Some(ANSWER_LIMIT))
        .expect("setting a write timeout");
    s
}

fn header(op: u8, len: u32, addr: u64, rkey: u32) -> Vec<u8> {
    RequestHeader {
        op,
        len,
        wr_id: WR_ID,
        addr,
        rkey,
    }
    .encode()
    .to_vec()
}

/// A SEND carrying `frame` as its payload, length consistent.
fn send_frame(frame: &[u8]) -> Vec<u8> {
    let mut v = header(OP_SEND, frame.len() as u32, 0, 0);
    v.extend_from_slice(frame);
    v
}

/// Sends `bytes` (ignoring a write refused because the peer already closed).
fn send(s: &mut TcpStream, bytes: &[u8]) {
    match s.write_all(bytes) {
        Ok(()) => {}
        Err(e) if matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset) => {}
        Err(e) => panic!("sending hostile bytes failed unexpectedly: {e}"),
    }
}

/// `len` bytes of `pattern` that do not start with a valid request header by chance.
fn garbage(pattern: Pattern, len: usize) -> Vec<u8> {
    let mut g = pattern.bytes(0, len);
    if u16::from_le_bytes([g[0], g[1]]) == REQUEST_MAGIC {
        g[0] ^= 0xff;
    }
    g
}

/// How memnode answered a hostile connection.
enum Answer {
    Closed(String),
    ErrorCompletion {
        status: u8,
        message: String,
    },
    ControlError {
        code: ErrorCode,
        message: String,
    },
    /// A success: memnode accepted something it should have refused.
    Accepted(String),
    Silent,
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answer::Closed(how) => write!(f, "connection closed ({how})"),
            Answer::ErrorCompletion { status, message } => {
                write!(f, "error completion, status {status}: {message:?}")
            }
            Answer::ControlError { code, message } => {
                write!(f, "control error reply {code:?}: {message:?}")
            }
            Answer::Accepted(what) => write!(f, "accepted: {what}"),
            Answer::Silent => write!(f, "no answer"),
        }
    }
}

impl Answer {
    fn is_refusal(&self) -> bool {
        matches!(
            self,
            Answer::Closed(_) | Answer::ErrorCompletion { .. } | Answer::ControlError { .. }
        )
    }
}

/// Reads the first answer on `stream`: a completion (decoded) or the connection closing.
fn read_answer(stream: &mut TcpStream) -> Answer {
    let closed_or_silent = |e: std::io::Error| match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => Answer::Silent,
        ErrorKind::UnexpectedEof => Answer::Closed("EOF".into()),
        _ => Answer::Closed(e.to_string()),
    };
    let mut header = [0u8; COMPLETION_HEADER_LEN];
    if let Err(e) = stream.read_exact(&mut header) {
        return closed_or_silent(e);
    }
    let h = CompletionHeader::decode(&header);
    if h.len > 1 << 20 {
        return Answer::Accepted(format!("a completion claiming {} bytes", h.len));
    }
    let mut payload = vec![0u8; h.len as usize];
    if let Err(e) = stream.read_exact(&mut payload) {
        return closed_or_silent(e);
    }
    if h.status != STATUS_OK {
        return Answer::ErrorCompletion {
            status: h.status,
            message: String::from_utf8_lossy(&payload).into_owned(),
        };
    }
    match Response::decode(&payload) {
        Ok(Response::Error { code, message }) => Answer::ControlError { code, message },
        Ok(other) => Answer::Accepted(format!("{other:?}")),
        Err(e) => Answer::Accepted(format!(
            "a successful completion of {} bytes that is no control reply ({e})",
            payload.len()
        )),
    }
}

/// Sends `bytes` on a fresh raw connection (then half-closes it if `shut`), and
/// returns memnode's answer.
fn send_raw(addr: &str, bytes: &[u8], shut: bool) -> Answer {
    let mut stream = raw(addr);
    if let Err(e) = stream.write_all(bytes) {
        // memnode closed the connection while we were still sending.
        return Answer::Closed(format!("while sending: {e}"));
    }
    if shut {
        let _ = stream.shutdown(Shutdown::Write);
    }
    read_answer(&mut stream)
}

/// Reads until the memnode closes the connection; returns what it sent before that.
fn expect_closed(s: &mut TcpStream, what: &str) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return got,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                panic!(
                    "{what}: expected the memnode to close the connection within {ANSWER_LIMIT:?}"
                )
            }
            Err(e) => panic!("{what}: unexpected read error {e}"),
        }
    }
}

/// Reads one completion: header and payload.
fn read_completion(s: &mut TcpStream, what: &str) -> (CompletionHeader, Vec<u8>) {
    let mut h = [0u8; COMPLETION_HEADER_LEN];
    s.read_exact(&mut h)
        .unwrap_or_else(|e| panic!("{what}: expected a completion, got {e}"));
    let h = CompletionHeader::decode(&h);
    let mut payload = vec![0u8; h.len as usize];
    s.read_exact(&mut payload)
        .unwrap_or_else(|e| panic!("{what}: expected a {}-byte payload, got {e}", h.len));
    (h, payload)
}

/// A control reply that must be an error with `code`, followed by a close.
fn expect_error_reply_and_close(s: &mut TcpStream, code: ErrorCode, what: &str) {
    let (h, payload) = read_completion(s, what);
    assert_eq!(h.wr_id, WR_ID, "{what}: the reply must answer our request");
    match Response::decode(&payload) {
        Ok(Response::Error { code: got, .. }) if got == code => {}
        other => panic!("{what}: expected an error reply {code:?}, got {other:?}"),
    }
    expect_closed(s, what);
}

fn hello_frame() -> Vec<u8> {
    Request::Hello {
        client_id: 0x0bad_c0de,
        nonce: [7; rmemfs_common::auth::NONCE_LEN],
        resume: false,
    }
    .encode()
}

/// The handshake (Hello, Challenge, Prove) on a raw stream, with no token, as
/// `client_id` in `session` (or a new one): the reply to the Prove.
fn raw_handshake(s: &mut TcpStream, client_id: u64, session: SessionSecret) -> Response {
    use rmemfs_common::auth;
    let client_nonce = [5; auth::NONCE_LEN];
    let resume = !session.is_none();
    let hello = Request::Hello {
        client_id,
        nonce: client_nonce,
        resume,
    };
    send(s, &send_frame(&hello.encode()));
    let (_, payload) = read_completion(s, "Hello");
    let Ok(Response::Challenge {
        nonce: server_nonce,
    }) = Response::decode(&payload)
    else {
        panic!("expected a Challenge, got {:?}", Response::decode(&payload));
    };
    let t = auth::Transcript {
        client_id,
        client_nonce,
        server_nonce,
    };
    let prove = Request::Prove {
        proof: auth::client_proof(&auth::token_key(b""), &t),
        session: resume.then(|| auth::session_proof(&session, &t)),
    };
    send(s, &send_frame(&prove.encode()));
    let (_, payload) = read_completion(s, "Prove");
    Response::decode(&payload).expect("a reply that decodes")
}

/// A control frame with `kind` and `body`, in this build's protocol version.
fn control_frame(kind: u16, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(8 + body.len());
    f.extend_from_slice(&rmemfs_common::protocol::PROTOCOL_VERSION.to_le_bytes());
    f.extend_from_slice(&kind.to_le_bytes());
    f.extend_from_slice(&(body.len() as u32).to_le_bytes());
    f.extend_from_slice(body);
    f
}

/// A name field: a u16 length and the bytes.
fn name_field(name: &[u8]) -> Vec<u8> {
    let mut b = (name.len() as u16).to_le_bytes().to_vec();
    b.extend_from_slice(name);
    b
}

fn one(ep: &TcpEndpoint, op: RdmaOp<'_>) -> Result<(), FabricError> {
    let mut ops = [op];
    ep.execute(&mut ops)
        .pop()
        .expect("one result per operation")
}

fn write(ep: &TcpEndpoint, addr: u64, rkey: u32, data: &[u8]) -> Result<(), FabricError> {
    one(
        ep,
        RdmaOp::Write {
            local: data,
            remote: RemoteAddr { addr, rkey },
        },
    )
}

fn read(ep: &TcpEndpoint, addr: u64, rkey: u32, len: usize) -> Result<Vec<u8>, FabricError> {
    let mut buf = vec![0u8; len];
    one(
        ep,
        RdmaOp::Read {
            local: &mut buf,
            remote: RemoteAddr { addr, rkey },
        },
    )?;
    Ok(buf)
}

/// A client that said Hello as `client_id`, starting its session: the connection and
/// the session's secret (another connection presents it to join the session).
fn hello_as(memnode: &MemnodeProc, client_id: u64) -> (TcpEndpoint, SessionSecret) {
    let ep = TcpEndpoint::connect(memnode.addr(), ANSWER_LIMIT)
        .unwrap_or_else(|e| panic!("connecting to memnode {}: {e}", memnode.addr()));
    let w = control::hello_in_session(&ep, client_id, b"", SessionSecret::NONE)
        .expect("Hello is welcome");
    (ep, w.session)
}

/// Waits (bounded) until the memnode behind `ep` counts `n` connected clients: the
/// hostile connections are gone.
fn wait_for_clients(ep: &TcpEndpoint, n: u32, what: &str) {
    poll_until(ANSWER_LIMIT, || {
        let stats = control::stat(ep).unwrap_or_else(|e| panic!("Stat while {what}: {e}"));
        (stats.clients == n).then_some(())
    })
    .unwrap_or_else(|| panic!("timed out after {ANSWER_LIMIT:?} waiting until {what}"));
}

/// A well-behaved client with one allocation whose expected contents it tracks.
struct GoodClient {
    ep: TcpEndpoint,
    alloc: Allocation,
    expected: Vec<u8>,
    pattern: Pattern,
    round: u64,
}

impl GoodClient {
    fn new(memnode: &MemnodeProc, pattern: Pattern) -> GoodClient {
        let (ep, _) = memnode.tcp_client();
        let alloc = control::alloc(&ep, ALLOC).expect("a good client's Alloc");
        assert!(alloc.len >= ALLOC, "asked {ALLOC} bytes, got {alloc:?}");
        let mut c = GoodClient {
            ep,
            alloc,
            expected: vec![0u8; ALLOC as usize],
            pattern,
            round: 0,
        };
        let fresh = read(&c.ep, alloc.addr, alloc.rkey, ALLOC as usize).expect("first READ");
        assert!(
            fresh.iter().all(|&b| b == 0),
            "a new allocation must be zeroed"
        );
        c.check("start");
        c
    }

    /// Writes a new slice, reads the whole allocation back, checks it against what it
    /// wrote so far, and asks for stats: panics naming `after` if anything fails.
    fn check(&mut self, after: &str) {
        self.round += 1;
        let slot = 64 << 10;
        let off = (self.round as usize * slot) % self.expected.len();
        let data = self.pattern.derive(self.round).bytes(0, slot);
        write(
            &self.ep,
            self.alloc.addr + off as u64,
            self.alloc.rkey,
            &data,
        )
        .unwrap_or_else(|e| panic!("good client's WRITE after {after}: {e}"));
        self.expected[off..off + slot].copy_from_slice(&data);
        let got = read(&self.ep, self.alloc.addr, self.alloc.rkey, ALLOC as usize)
            .unwrap_or_else(|e| panic!("good client's READ after {after}: {e}"));
        assert_bytes_eq(
            &self.expected,
            &got,
            0,
            &format!("good client's allocation after {after}"),
        );
        control::stat(&self.ep).unwrap_or_else(|e| panic!("good client's Stat after {after}: {e}"));
    }
}

type Case = (&'static str, fn(&str, Pattern));

/// Hostile connections that must be closed (or answered with exactly this error);
/// each gets a pattern of its own for its garbage.
const CASES: &[Case] = &[
    ("random garbage", |addr, p| {
        let mut s = raw(addr);
        send(&mut s, &garbage(p, 4096));
        expect_closed(&mut s, "random garbage");
    }),
    ("a truncated header", |addr, _| {
        let mut s = raw(addr);
        send(&mut s, &header(OP_SEND, 8, 0, 0)[..10]);
        let _ = s.shutdown(Shutdown::Write);
        expect_closed(&mut s, "a truncated header");
    }),
    ("a truncated WRITE payload", |addr, _| {
        let mut s = raw(addr);
        send(&mut s, &header(OP_WRITE, 4096, 0, 0));
        send(&mut s, &[0x42; 100]);
        let _ = s.shutdown(Shutdown::Write);
        expect_closed(&mut s, "a truncated WRITE payload");
    }),
    ("a truncated control frame", |addr, _| {
        let mut s = raw(addr);
        let frame = Request::Stat.encode();
        send(&mut s, &header(OP_SEND, frame.len() as u32 + 20, 0, 0));
        send(&mut s, &frame);
        let _ = s.shutdown(Shutdown::Write);
        expect_closed(&mut s, "a truncated control frame");
    }),
    ("a SEND with an absurd length", |addr, _| {
        let mut s = raw(addr);
        send(&mut s, &header(OP_SEND, u32::MAX, 0, 0));
        expect_closed(&mut s, "a SEND with an absurd length");
    }),
    ("a SEND just over the control limit", |addr, _| {
        let mut s = raw(addr);
        send(&mut s, &header(OP_SEND, MAX_CONTROL_FRAME as u32 + 1, 0, 0));
        expect_closed(&mut s, "a SEND just over the control limit");
    }),
    ("a WRITE with an absurd length", |addr, _| {
        let mut s = raw(addr);
        send(&mut s, &header(OP_WRITE, u32::MAX, 0, 0));
        expect_closed(&mut s, "a WRITE with an absurd length");
    }),
    ("an unknown op", |addr, _| {
        let mut s = raw(addr);
        send(&mut s, &header(99, 0, 0, 0));
        expect_closed(&mut s, "an unknown op");
    }),
    ("a READ with an absurd length", |addr, _| {
        let mut s = raw(addr);
        send(&mut s, &header(OP_READ, MAX_DATA_OP as u32 + 1, 0, 0));
        let (h, _) = read_completion(&mut s, "a READ with an absurd length");
        assert_eq!(
            h.status, STATUS_BAD_REQUEST,
            "an oversized READ must be refused"
        );
    }),
    ("a control frame in protocol version 1", |addr, _| {
        let mut s = raw(addr);
        let mut frame = Request::Stat.encode();
        frame[0..2].copy_from_slice(&1u16.to_le_bytes());
        send(&mut s, &send_frame(&frame));
        expect_error_reply_and_close(&mut s, ErrorCode::VersionMismatch, "protocol version 1");
    }),
    ("a control frame of garbage", |addr, p| {
        let mut s = raw(addr);
        let mut frame = garbage(p, 40);
        frame[0..2].copy_from_slice(&rmemfs_common::protocol::PROTOCOL_VERSION.to_le_bytes());
        send(&mut s, &send_frame(&frame));
        expect_error_reply_and_close(&mut s, ErrorCode::BadRequest, "a control frame of garbage");
    }),
    (
        "a READ of another client's memory without Hello",
        |addr, _| {
            let mut s = raw(addr);
            send(&mut s, &header(OP_READ, 64, 0, 0));
            let (h, payload) = read_completion(&mut s, "a READ without Hello");
            assert_eq!(
                h.status, STATUS_REMOTE_ACCESS,
                "a READ without Hello must be refused"
            );
            assert!(payload.is_empty(), "a refused READ must return no bytes");
        },
    ),
    ("a connection closed at once", |addr, _| {
        drop(raw(addr));
    }),
];

/// Each of [`CASES`] three times while a good client keeps writing, reading and
/// asking for stats on another thread.
#[test]
fn hostile_bytes_get_an_error_or_a_close_and_a_good_client_keeps_working() {
    let pattern = Pattern::for_test("hostile bytes");
    let memnode = MemnodeProc::start_on(Transport::Tcp, "16M", &[]);
    let addr = memnode.addr().to_string();
    let (good, _) = memnode.tcp_client();
    let chunk = control::alloc(&good, ALLOC).expect("the good client's Alloc");
    // 256 different 8 KiB blocks: a round writes one of them into one of 64 slots.
    let blocks = pattern.bytes(0, 256 * 8192);
    let stop = AtomicBool::new(false);
    let rounds = AtomicU64::new(0);
    // `lane` keeps the background thread (0) and the main thread (1) on separate bytes.
    let round_trip = |lane: u64, i: u64| {
        let at = (i % 256) as usize * 8192;
        let data = &blocks[at..at + 8192];
        let addr = chunk.addr + lane * (512 << 10) + (i % 64) * 8192;
        write(&good, addr, chunk.rkey, data).expect("the good client's WRITE succeeds");
        let back =
            read(&good, addr, chunk.rkey, data.len()).expect("the good client's READ succeeds");
        assert!(
            back == data,
            "the good client's data must round-trip (round {i})"
        );
        control::stat(&good).expect("the good client's Stat succeeds");
    };
    /// Stops the background client however the scope ends (a failed case panics).
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        let background = s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                round_trip(0, rounds.fetch_add(1, Ordering::Relaxed));
            }
        });
        for (k, (name, case)) in CASES.iter().enumerate() {
            for round in 0..3 {
                case(&addr, pattern.derive(1 + 3 * k as u64 + round));
            }
            // Also check synchronously after each case, whatever the thread's pace.
            round_trip(1, rounds.load(Ordering::Relaxed));
            assert!(
                good.is_connected(),
                "after {name}: the good client must stay connected"
            );
        }
        stop.store(true, Ordering::Relaxed);
        background
            .join()
            .expect("the good client's background traffic never failed");
    });
    assert!(
        rounds.load(Ordering::Relaxed) > 0,
        "the background client made progress"
    );
    wait_for_clients(&good, 1, "only the good client remains");
    assert_eq!(
        control::stat(&good).expect("the good client's Stat").used,
        ALLOC,
        "hostile connections allocated nothing"
    );
}

/// More hostile connections, one each, that must be refused (an error or a close);
/// after each the good client's whole allocation is as it wrote it and the memnode
/// still runs, a client arriving after them all is served, and the memnode exits 0 on
/// SIGTERM. (A SEND or WRITE claiming u32::MAX bytes is in [`CASES`].)
#[test]
fn hostile_frames_get_an_error_or_a_closed_connection_while_a_good_client_keeps_working() {
    let pattern = Pattern::for_test("hostile frames");
    let mut memnode = MemnodeProc::start_on(Transport::Tcp, "64M", &[]);
    let addr = memnode.addr().to_string();
    let mut good = GoodClient::new(&memnode, pattern);

    let hello = hello_frame();
    // Version 1: a Hello of the days when it carried the token in clear.
    let mut v1_hello = hello.clone();
    v1_hello[0..2].copy_from_slice(&1u16.to_le_bytes());
    let mut huge_body = Request::Stat.encode();
    huge_body[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    let mut lying_body = hello.clone();
    lying_body.extend_from_slice(b"xyz");
    let (victim_addr, victim_rkey) = (good.alloc.addr, good.alloc.rkey);
    let mut sneaky_write = header(OP_WRITE, 4096, victim_addr, victim_rkey);
    sneaky_write.extend_from_slice(&[0xee; 4096]);
    let mut short_send = header(OP_SEND, 64, 0, 0);
    short_send.extend_from_slice(&[1u8; 10]);

    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        ("4 KiB of random bytes", garbage(pattern, 4096), false),
        (
            "a request header with an unknown op",
            header(0x77, 0, 0, 0),
            false,
        ),
        (
            "a request header cut short",
            header(OP_READ, 4096, 0, 0)[..20].to_vec(),
            true,
        ),
        ("a SEND whose payload stops short", short_send, true),
        (
            "a control frame cut short",
            send_frame(&hello[..hello.len() - 5]),
            false,
        ),
        (
            "a control frame with trailing bytes",
            send_frame(&lying_body),
            false,
        ),
        (
            "a READ of u32::MAX bytes",
            header(OP_READ, u32::MAX, 0, 0),
            false,
        ),
        (
            "a control body length of u32::MAX",
            send_frame(&huge_body),
            false,
        ),
        (
            "a Hello in protocol version 1",
            send_frame(&v1_hello),
            false,
        ),
        (
            "a Stat before Hello",
            send_frame(&Request::Stat.encode()),
            false,
        ),
        (
            "a READ of another client's memory before Hello",
            header(OP_READ, 4096, victim_addr, victim_rkey),
            false,
        ),
        (
            "a WRITE into another client's memory before Hello",
            sneaky_write,
            false,
        ),
        ("a connection closed without a byte", Vec::new(), true),
    ];
    for (name, bytes, shut) in &cases {
        let answer = send_raw(&addr, bytes, *shut);
        println!("{name}: {answer}");
        assert!(
            answer.is_refusal(),
            "{name}: expected an error reply or a closed connection within {ANSWER_LIMIT:?}, \
             got {answer}"
        );
        if *name == "a Hello in protocol version 1" {
            if let Answer::ControlError { code, .. } = &answer {
                assert_eq!(*code, ErrorCode::VersionMismatch, "{name}: error code");
            }
        }
        assert!(
            memnode.is_running(),
            "memnode died after {name}; stderr:\n{}",
            memnode.stderr()
        );
        good.check(name);
    }

    // A client arriving after all that is served as usual.
    let mut late = GoodClient::new(&memnode, pattern.derive(1000));
    late.check("the hostile cases");
    good.check("a second client joined");
    let stats = memnode.stats();
    assert!(
        stats.used >= 2 * ALLOC,
        "two live 1 MiB allocations, but memnode reports {} bytes used",
        stats.used
    );
    drop((good, late));
    let status = memnode.terminate();
    assert!(
        status.success(),
        "memnode should exit 0 on SIGTERM, got {status}; stderr:\n{}",
        memnode.stderr()
    );
}

/// Malformed volume requests (by kind number, so the encoder cannot tidy them).
fn malformed_volume_frames() -> Vec<(&'static str, Vec<u8>)> {
    let with_flags = |name: &[u8], flags: u8| {
        let mut b = name_field(name);
        b.push(flags);
        b
    };
    vec![
        (
            "an open of \"a/b\"",
            control_frame(0x0005, &with_flags(b"a/b", 1)),
        ),
        (
            "an open of \"..\"",
            control_frame(0x0005, &with_flags(b"..", 1)),
        ),
        (
            "an open of an empty name",
            control_frame(0x0005, &with_flags(b"", 1)),
        ),
        (
            "an open of a 65-byte name",
            control_frame(0x0005, &with_flags(&[b'a'; 65], 1)),
        ),
        (
            "an open with unknown flags",
            control_frame(0x0005, &with_flags(b"v", 0x80)),
        ),
        (
            "an open without its flags",
            control_frame(0x0005, &name_field(b"v")),
        ),
        ("an open whose name runs past the body", {
            let mut b = 60u16.to_le_bytes().to_vec();
            b.extend_from_slice(b"short");
            control_frame(0x0005, &b)
        }),
        (
            "a chunk list request cut short",
            control_frame(0x0006, &[0; 7]),
        ),
        ("a close with a trailing byte", control_frame(0x0007, &[0])),
        (
            "a list after a bad name",
            control_frame(0x0008, &name_field(b"a b")),
        ),
        (
            "a destroy of \".\"",
            control_frame(0x0009, &name_field(b".")),
        ),
        ("a destroy with trailing bytes", {
            let mut b = name_field(b"v");
            b.push(0);
            control_frame(0x0009, &b)
        }),
        (
            "a VolumeOpened sent as a request",
            control_frame(0x8005, &[0; 41]),
        ),
    ]
}

#[test]
fn malformed_volume_frames_close_only_their_connection() {
    let pattern = Pattern::for_test("malformed volume frames");
    let memnode = MemnodeProc::start_on(Transport::Tcp, "16M", &[]);
    let addr = memnode.addr().to_string();
    let (holder, holder_session) = hello_as(&memnode, 1);
    let info = control::volume_open(&holder, "vol", true, false).expect("creates the volume");
    let chunk = control::alloc(&holder, ALLOC).expect("the holder's Alloc");
    let data = pattern.bytes(0, 4096);
    write(&holder, chunk.addr, chunk.rkey, &data).expect("the holder writes");
    for (k, (what, frame)) in malformed_volume_frames().into_iter().enumerate() {
        // Anonymous, as a stranger, and as another connection of the holder itself.
        // (A stranger of its own id each time: the last one's session may not have
        // ended yet.)
        let stranger = (1000 + k as u64, SessionSecret::NONE);
        for hello in [None, Some(stranger), Some((1, holder_session))] {
            let mut s = raw(&addr);
            if let Some((client_id, session)) = hello {
                let reply = raw_handshake(&mut s, client_id, session);
                assert!(
                    matches!(reply, Response::Welcome { .. }),
                    "{what}: the raw handshake must be welcome, got {reply:?}"
                );
            }
            send(&mut s, &send_frame(&frame));
            expect_error_reply_and_close(&mut s, ErrorCode::BadRequest, what);
        }
        assert!(
            holder.is_connected(),
            "after {what}: the holder stays connected"
        );
        assert_eq!(
            read(&holder, chunk.addr, chunk.rkey, data.len()).expect("the holder reads"),
            data,
            "after {what}: the holder's data is intact"
        );
        let chunks = control::volume_chunks(&holder).expect("the holder still holds its volume");
        assert_eq!(chunks, vec![chunk], "after {what}");
    }
    let v = control::volume_list(&holder).expect("the holder lists the volumes");
    assert_eq!(
        (v.len(), v[0].holder, v[0].chunks, v[0].bytes),
        (1, 1, 2, ALLOC + info.root.len),
        "the volume is as it was"
    );
    wait_for_clients(&holder, 1, "only the holder remains");
}

/// Asserts `r` is a remote access error.
#[track_caller]
fn assert_remote_access<T: std::fmt::Debug>(r: Result<T, FabricError>, what: &str) {
    assert!(
        matches!(r, Err(FabricError::RemoteAccess { .. })),
        "{what}: expected FabricError::RemoteAccess, got {r:?}"
    );
}

#[test]
fn access_with_a_wrong_rkey_or_outside_an_allocation_fails_and_touches_nothing() {
    let pattern = Pattern::for_test("remote access errors");
    let memnode = MemnodeProc::start_on(Transport::Tcp, "64M", &[]);
    let (a_ep, _) = memnode.tcp_client();
    let (b_ep, _) = memnode.tcp_client();
    let a = control::alloc(&a_ep, ALLOC).expect("client A's first Alloc");
    let a2 = control::alloc(&a_ep, ALLOC).expect("client A's second Alloc");
    let b = control::alloc(&b_ep, ALLOC).expect("client B's Alloc");
    let contents = |n: u64| pattern.derive(n).bytes(0, ALLOC as usize);
    let (ca, ca2, cb) = (contents(1), contents(2), contents(3));
    write(&a_ep, a.addr, a.rkey, &ca).expect("A writes its allocation");
    write(&a_ep, a2.addr, a2.rkey, &ca2).expect("A writes its second allocation");
    write(&b_ep, b.addr, b.rkey, &cb).expect("B writes its allocation");

    let rkeys = [a.rkey, a2.rkey, b.rkey];
    let mut wrong = a.rkey.wrapping_add(1);
    while rkeys.contains(&wrong) {
        wrong = wrong.wrapping_add(1);
    }
    let junk = vec![0xa5u8; 8192];
    let end = a.addr + a.len;

    assert_remote_access(
        write(&a_ep, a.addr, wrong, &junk[..4096]),
        "WRITE with an unknown rkey",
    );
    assert_remote_access(
        read(&a_ep, a.addr, wrong, 4096),
        "READ with an unknown rkey",
    );
    assert_remote_access(
        write(&a_ep, a.addr, a2.rkey, &junk[..4096]),
        "WRITE to one allocation with the rkey of another",
    );
    assert_remote_access(
        write(&a_ep, end - 4096, a.rkey, &junk),
        "WRITE straddling the end of the allocation",
    );
    assert_remote_access(
        read(&a_ep, end - 4096, a.rkey, 8192),
        "READ straddling the end of the allocation",
    );
    assert_remote_access(
        write(&a_ep, end, a.rkey, &junk[..1]),
        "WRITE of one byte just past the end",
    );
    if a.addr >= 4096 {
        assert_remote_access(
            write(&a_ep, a.addr - 4096, a.rkey, &junk),
            "WRITE starting before the allocation",
        );
    }
    assert_remote_access(
        write(&a_ep, u64::MAX - 1000, a.rkey, &junk[..4096]),
        "WRITE whose range wraps around the address space",
    );
    assert_remote_access(
        write(&a_ep, b.addr, b.rkey, &junk[..4096]),
        "WRITE into another client's allocation with its rkey",
    );
    assert_remote_access(
        read(&a_ep, b.addr, b.rkey, 4096),
        "READ of another client's allocation with its rkey",
    );

    // In one batch, each operation completes on its own: the good ones succeed.
    let mut good_read = vec![0u8; 4096];
    let mut ops = [
        RdmaOp::Write {
            local: &ca[..4096],
            remote: RemoteAddr {
                addr: a.addr,
                rkey: a.rkey,
            },
        },
        RdmaOp::Write {
            local: &junk[..4096],
            remote: RemoteAddr {
                addr: a.addr,
                rkey: wrong,
            },
        },
        RdmaOp::Read {
            local: &mut good_read,
            remote: RemoteAddr {
                addr: a.addr,
                rkey: a.rkey,
            },
        },
        RdmaOp::Write {
            local: &junk[..4096],
            remote: RemoteAddr {
                addr: end - 100,
                rkey: a.rkey,
            },
        },
    ];
    let results = a_ep.execute(&mut ops);
    assert_eq!(results.len(), 4, "one completion per operation");
    assert_eq!(results[0], Ok(()), "a valid WRITE in a mixed batch");
    assert_remote_access(results[1].clone(), "an unknown rkey in a mixed batch");
    assert_eq!(results[2], Ok(()), "a valid READ in a mixed batch");
    assert_remote_access(results[3].clone(), "a WRITE past the end in a mixed batch");
    assert_bytes_eq(&ca[..4096], &good_read, 0, "READ in a mixed batch");

    assert!(
        a_ep.is_connected(),
        "refused accesses must not cost the connection"
    );
    let check = |ep: &TcpEndpoint, al: &Allocation, want: &[u8], what: &str| {
        let got = read(ep, al.addr, al.rkey, ALLOC as usize)
            .unwrap_or_else(|e| panic!("reading back {what}: {e}"));
        assert_bytes_eq(want, &got, 0, what);
    };
    check(&a_ep, &a, &ca, "A's allocation after refused accesses");
    check(
        &a_ep,
        &a2,
        &ca2,
        "A's second allocation after refused accesses",
    );
    check(&b_ep, &b, &cb, "B's allocation after A's refused accesses");

    // A freed allocation's rkey is revoked.
    control::free(&a_ep, a2.addr, a2.rkey).expect("Free of A's second allocation");
    assert_remote_access(
        write(&a_ep, a2.addr, a2.rkey, &junk[..4096]),
        "WRITE with the rkey of a freed allocation",
    );
    assert_remote_access(
        read(&a_ep, a2.addr, a2.rkey, 4096),
        "READ with the rkey of a freed allocation",
    );
    check(
        &a_ep,
        &a,
        &ca,
        "A's allocation after its neighbour was freed",
    );

    // Memory handed to a new owner never shows the old owner's bytes.
    let b2 = control::alloc(&b_ep, ALLOC).expect("B's Alloc after A's Free");
    println!(
        "B's new allocation {:#x} {} A's freed one {:#x}",
        b2.addr,
        if b2.addr == a2.addr {
            "reuses"
        } else {
            "does not reuse"
        },
        a2.addr
    );
    check(
        &b_ep,
        &b2,
        &vec![0u8; ALLOC as usize],
        "a new allocation after another client's Free",
    );
    check(&b_ep, &b, &cb, "B's allocation at the end");
}
