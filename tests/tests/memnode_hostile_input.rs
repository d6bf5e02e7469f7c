//! A memnode faced with hostile peers: garbage, truncated and oversized frames, a wrong
//! protocol version, accesses before Hello, wrong rkeys and out-of-bounds addresses.
//! Each gets an error or a closed connection, never a crash or a hang, and never
//! touches memory it has no right to; a well-behaved client keeps working throughout.
//!
//! tcp only, whatever RMEMFS_TRANSPORT says: the hostile peers speak raw bytes of the
//! tcp backend's wire format (over verbs the NIC checks rkeys and bounds; the wrong-rkey
//! check over verbs is in common/tests/fabric.rs).

use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use rmemfs_common::control;
use rmemfs_common::fabric::tcp::wire::{
    CompletionHeader, RequestHeader, COMPLETION_HEADER_LEN, OP_READ, OP_SEND, OP_WRITE,
    REQUEST_MAGIC, STATUS_OK,
};
use rmemfs_common::fabric::tcp::TcpEndpoint;
use rmemfs_common::fabric::{Endpoint, FabricError, RdmaOp, RemoteAddr};
use rmemfs_common::protocol::{Allocation, ErrorCode, Request, Response};
use rmemfs_tests::data::assert_bytes_eq;
use rmemfs_tests::{MemnodeProc, Pattern, Transport};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

/// How long a hostile connection may wait for its error or its close.
const ANSWER_LIMIT: Duration = Duration::from_secs(10);
const ALLOC: u64 = 1 << 20;

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
    stream
        .set_read_timeout(Some(ANSWER_LIMIT))
        .expect("setting a read timeout");
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
    let mut stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    stream
        .set_write_timeout(Some(ANSWER_LIMIT))
        .expect("setting a write timeout");
    if let Err(e) = stream.write_all(bytes) {
        // memnode closed the connection while we were still sending.
        return Answer::Closed(format!("while sending: {e}"));
    }
    if shut {
        let _ = stream.shutdown(Shutdown::Write);
    }
    read_answer(&mut stream)
}

fn header(op: u8, len: u32, addr: u64, rkey: u32) -> Vec<u8> {
    RequestHeader {
        op,
        len,
        wr_id: 7,
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

fn hello_frame() -> Vec<u8> {
    Request::Hello {
        client_id: 0x0bad_c0de,
        token: Vec::new(),
        session: rmemfs_common::protocol::SessionSecret::NONE,
    }
    .encode()
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

#[test]
fn hostile_frames_get_an_error_or_a_closed_connection_while_a_good_client_keeps_working() {
    let pattern = Pattern::for_test("hostile frames");
    let mut memnode = MemnodeProc::start_on(Transport::Tcp, "64M", &[]);
    let addr = memnode.addr().to_string();
    let mut good = GoodClient::new(&memnode, pattern);

    let mut garbage = vec![0u8; 4096];
    StdRng::seed_from_u64(pattern.seed()).fill_bytes(&mut garbage);
    if u16::from_le_bytes([garbage[0], garbage[1]]) == REQUEST_MAGIC {
        garbage[0] ^= 0xff;
    }
    let hello = hello_frame();
    let mut v2_hello = hello.clone();
    v2_hello[0..2].copy_from_slice(&2u16.to_le_bytes());
    let mut huge_body = Request::Stat.encode();
    huge_body[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    let mut lying_body = hello.clone();
    lying_body.extend_from_slice(b"xyz");
    let huge_token = {
        let mut body = 1u64.to_le_bytes().to_vec();
        body.extend_from_slice(&u16::MAX.to_le_bytes());
        body.extend_from_slice(b"abc");
        let mut f = hello[..4].to_vec(); // a Hello's version and kind
        f.extend_from_slice(&(body.len() as u32).to_le_bytes());
        f.extend_from_slice(&body);
        f
    };
    let (victim_addr, victim_rkey) = (good.alloc.addr, good.alloc.rkey);
    let mut sneaky_write = header(OP_WRITE, 4096, victim_addr, victim_rkey);
    sneaky_write.extend_from_slice(&[0xee; 4096]);
    let mut short_send = header(OP_SEND, 64, 0, 0);
    short_send.extend_from_slice(&[1u8; 10]);

    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        ("4 KiB of random bytes", garbage, false),
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
            "a SEND claiming u32::MAX bytes",
            header(OP_SEND, u32::MAX, 0, 0),
            false,
        ),
        (
            "a WRITE claiming u32::MAX bytes",
            header(OP_WRITE, u32::MAX, 0, 0),
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
            "a Hello with a 65535-byte token length",
            send_frame(&huge_token),
            false,
        ),
        (
            "a Hello in protocol version 2",
            send_frame(&v2_hello),
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
        if *name == "a Hello in protocol version 2" {
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
