//! Hostile bytes on raw TCP sockets: every case gets an error reply or a closed
//! connection, and a well-behaved client keeps working before, during and after.

mod support;

use rmemfs_common::control;
use rmemfs_common::fabric::tcp::wire::*;
use rmemfs_common::fabric::{Endpoint, MAX_DATA_OP};
use rmemfs_common::protocol::{ErrorCode, Request, Response, MAX_CONTROL_FRAME};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use support::*;

fn raw(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("raw connect");
    s.set_read_timeout(Some(TIMEOUT)).expect("read timeout");
    s.set_write_timeout(Some(TIMEOUT)).expect("write timeout");
    s
}

fn header(op: u8, len: u32) -> [u8; REQUEST_HEADER_LEN] {
    RequestHeader {
        op,
        len,
        wr_id: 77,
        addr: 0,
        rkey: 0,
    }
    .encode()
}

/// Sends `bytes` (ignoring a write refused because the peer already closed).
fn send(s: &mut TcpStream, bytes: &[u8]) {
    match s.write_all(bytes) {
        Ok(()) => {}
        Err(e) if matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset) => {}
        Err(e) => panic!("sending hostile bytes failed unexpectedly: {e}"),
    }
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
                panic!("{what}: expected the memnode to close the connection within {TIMEOUT:?}")
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
    assert_eq!(h.wr_id, 77, "{what}: the reply must answer our request");
    match Response::decode(&payload) {
        Ok(Response::Error { code: got, .. }) if got == code => {}
        other => panic!("{what}: expected an error reply {code:?}, got {other:?}"),
    }
    expect_closed(s, what);
}

fn random_garbage(len: usize) -> Vec<u8> {
    let mut g = vec![0u8; len];
    getrandom::fill(&mut g).expect("randomness");
    if u16::from_le_bytes([g[0], g[1]]) == REQUEST_MAGIC {
        g[0] ^= 0xff; // make sure it is not a valid header by chance
    }
    g
}

type Case = (&'static str, fn(SocketAddr));

const CASES: &[Case] = &[
    ("random garbage", |addr| {
        let mut s = raw(addr);
        send(&mut s, &random_garbage(4096));
        expect_closed(&mut s, "random garbage");
    }),
    ("a truncated header", |addr| {
        let mut s = raw(addr);
        send(&mut s, &header(OP_SEND, 8)[..10]);
        let _ = s.shutdown(Shutdown::Write);
        expect_closed(&mut s, "a truncated header");
    }),
    ("a truncated WRITE payload", |addr| {
        let mut s = raw(addr);
        send(&mut s, &header(OP_WRITE, 4096));
        send(&mut s, &[0x42; 100]);
        let _ = s.shutdown(Shutdown::Write);
        expect_closed(&mut s, "a truncated WRITE payload");
    }),
    ("a truncated control frame", |addr| {
        let mut s = raw(addr);
        let frame = Request::Stat.encode();
        send(&mut s, &header(OP_SEND, frame.len() as u32 + 20));
        send(&mut s, &frame);
        let _ = s.shutdown(Shutdown::Write);
        expect_closed(&mut s, "a truncated control frame");
    }),
    ("a SEND with an absurd length", |addr| {
        let mut s = raw(addr);
        send(&mut s, &header(OP_SEND, u32::MAX));
        expect_closed(&mut s, "a SEND with an absurd length");
    }),
    ("a SEND just over the control limit", |addr| {
        let mut s = raw(addr);
        send(&mut s, &header(OP_SEND, MAX_CONTROL_FRAME as u32 + 1));
        expect_closed(&mut s, "a SEND just over the control limit");
    }),
    ("a WRITE with an absurd length", |addr| {
        let mut s = raw(addr);
        send(&mut s, &header(OP_WRITE, u32::MAX));
        expect_closed(&mut s, "a WRITE with an absurd length");
    }),
    ("an unknown op", |addr| {
        let mut s = raw(addr);
        send(&mut s, &header(99, 0));
        expect_closed(&mut s, "an unknown op");
    }),
    ("a READ with an absurd length", |addr| {
        let mut s = raw(addr);
        send(&mut s, &header(OP_READ, MAX_DATA_OP as u32 + 1));
        let (h, _) = read_completion(&mut s, "a READ with an absurd length");
        assert_eq!(
            h.status, STATUS_BAD_REQUEST,
            "an oversized READ must be refused"
        );
    }),
    ("a control frame in protocol version 2", |addr| {
        let mut s = raw(addr);
        let mut frame = Request::Stat.encode();
        frame[0..2].copy_from_slice(&2u16.to_le_bytes());
        send(&mut s, &header(OP_SEND, frame.len() as u32));
        send(&mut s, &frame);
        expect_error_reply_and_close(&mut s, ErrorCode::VersionMismatch, "protocol version 2");
    }),
    ("a control frame of garbage", |addr| {
        let mut s = raw(addr);
        let mut frame = random_garbage(40);
        frame[0..2].copy_from_slice(&1u16.to_le_bytes());
        send(&mut s, &header(OP_SEND, frame.len() as u32));
        send(&mut s, &frame);
        expect_error_reply_and_close(&mut s, ErrorCode::BadRequest, "a control frame of garbage");
    }),
    ("a READ of another client's memory without Hello", |addr| {
        let mut s = raw(addr);
        send(&mut s, &header(OP_READ, 64));
        let (h, payload) = read_completion(&mut s, "a READ without Hello");
        assert_eq!(
            h.status, STATUS_REMOTE_ACCESS,
            "a READ without Hello must be refused"
        );
        assert!(payload.is_empty(), "a refused READ must return no bytes");
    }),
    ("a connection closed at once", |addr| {
        drop(raw(addr));
    }),
];

#[test]
fn hostile_bytes_get_an_error_or_a_close_and_a_good_client_keeps_working() {
    let node = start(16 << 20);
    let addr = node.local_addr();
    let good = client(&node, 1);
    let chunk = alloc(&good, 1 << 20);
    let stop = AtomicBool::new(false);
    let rounds = AtomicU64::new(0);
    // `lane` keeps the background thread (0) and the main thread (1) on separate bytes.
    let round_trip = |lane: u64, i: u64| {
        let data = pattern(i as u8, 8192);
        let at = remote(&chunk, lane * (512 << 10) + (i % 64) * 8192);
        write_at(&good, at, &data).expect("the good client's WRITE succeeds");
        let back = read_at(&good, at, data.len()).expect("the good client's READ succeeds");
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
        for (name, case) in CASES {
            for _ in 0..3 {
                case(addr);
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
    wait_until("only the good client remains", || node.stats().clients == 1);
    assert_eq!(
        node.stats().used,
        1 << 20,
        "hostile connections allocated nothing"
    );
}

/// A control frame with `kind` and `body`, in protocol version 1.
fn control_frame(kind: u16, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(8 + body.len());
    f.extend_from_slice(&1u16.to_le_bytes());
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

/// Sends one control frame on a raw socket.
fn send_control(s: &mut TcpStream, frame: &[u8]) {
    send(s, &header(OP_SEND, frame.len() as u32));
    send(s, frame);
}

#[test]
fn malformed_volume_frames_close_only_their_connection() {
    let node = start(16 << 20);
    let addr = node.local_addr();
    let holder = client(&node, 1);
    let info = control::volume_open(&holder, "vol", true, false).expect("creates the volume");
    let chunk = alloc(&holder, 1 << 20);
    let data = pattern(3, 4096);
    write_at(&holder, remote(&chunk, 0), &data).expect("the holder writes");
    for (k, (what, frame)) in malformed_volume_frames().into_iter().enumerate() {
        // Anonymous, as a stranger, and as another connection of the holder itself.
        // (A stranger of its own id each time: the last one's session may not have
        // ended yet.)
        let stranger = 1000 + k as u64;
        for hello_as in [None, Some(stranger), Some(1u64)] {
            let mut s = raw(addr);
            if let Some(id) = hello_as {
                send_control(
                    &mut s,
                    &Request::Hello {
                        client_id: id,
                        token: vec![],
                        session: session_of(&node, id),
                    }
                    .encode(),
                );
                let (_, payload) = read_completion(&mut s, "Hello");
                assert!(
                    matches!(Response::decode(&payload), Ok(Response::Welcome { .. })),
                    "{what}: the raw Hello must be welcome"
                );
            }
            send_control(&mut s, &frame);
            expect_error_reply_and_close(&mut s, ErrorCode::BadRequest, what);
        }
        assert!(
            holder.is_connected(),
            "after {what}: the holder stays connected"
        );
        assert_eq!(
            read_at(&holder, remote(&chunk, 0), data.len()).expect("the holder reads"),
            data,
            "after {what}: the holder's data is intact"
        );
        let chunks = control::volume_chunks(&holder).expect("the holder still holds its volume");
        assert_eq!(chunks, vec![chunk], "after {what}");
    }
    let v = node.volumes();
    assert_eq!(
        (v.len(), v[0].holder, v[0].chunks, v[0].bytes),
        (1, 1, 2, (1 << 20) + info.root.len),
        "the volume is as it was"
    );
    wait_until("only the holder remains", || node.stats().clients == 1);
}
