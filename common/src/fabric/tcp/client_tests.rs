//! The client against a scripted peer: deadlines, broken and odd completions, and
//! a peer that goes away while the connection is idle. (Well-behaved traffic is
//! tested against the real server in `common/tests/fabric.rs`.)

use super::*;
use crate::fabric::RemoteAddr;
use std::net::TcpListener;
use std::sync::Arc;
use std::thread::JoinHandle;

const SHORT: Duration = Duration::from_millis(300);

/// A peer on loopback that plays `script` on the one connection it accepts.
fn peer(script: impl FnOnce(TcpStream) + Send + 'static) -> (String, JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    let t = std::thread::spawn(move || {
        let (s, _) = l.accept().expect("accept");
        script(s);
    });
    (addr, t)
}

/// Reads one request and its payload.
fn request(s: &mut TcpStream) -> RequestHeader {
    let mut b = [0u8; REQUEST_HEADER_LEN];
    s.read_exact(&mut b).expect("a request header");
    let h = RequestHeader::decode(&b).expect("the request magic");
    if h.op != OP_READ {
        let mut payload = vec![0u8; h.len as usize];
        s.read_exact(&mut payload).expect("the request payload");
    }
    h
}

fn complete(s: &mut TcpStream, wr_id: u64, status: u8, payload: &[u8]) {
    completion_header(s, wr_id, status, payload.len());
    std::io::Write::write_all(s, payload).expect("completion payload");
}

/// A completion's header alone, announcing `len` payload bytes.
fn completion_header(s: &mut TcpStream, wr_id: u64, status: u8, len: usize) {
    let h = CompletionHeader {
        wr_id,
        status,
        len: len as u32,
    };
    std::io::Write::write_all(s, &h.encode()).expect("completion header");
}

fn read_op(buf: &mut [u8]) -> RdmaOp<'_> {
    RdmaOp::Read {
        local: buf,
        remote: RemoteAddr { addr: 64, rkey: 9 },
    }
}

fn read_one(ep: &TcpEndpoint, len: usize) -> Result<Vec<u8>, FabricError> {
    let mut buf = vec![0u8; len];
    ep.execute(&mut [read_op(&mut buf)]).remove(0).map(|()| buf)
}

#[test]
fn a_silent_peer_times_out_and_the_connection_closes() {
    let (addr, t) = peer(|mut s| {
        request(&mut s);
        // Never answers; the client's close ends this read.
        let _ = s.read(&mut [0u8; 1]);
    });
    let ep = Arc::new(TcpEndpoint::connect(&addr, SHORT).expect("connect"));
    let caller = {
        let ep = ep.clone();
        std::thread::spawn(move || {
            let start = Instant::now();
            (read_one(&ep, 16), start.elapsed())
        })
    };
    let start = Instant::now();
    while !ep.is_busy() {
        assert!(
            !caller.is_finished(),
            "the call ended before it was seen busy"
        );
        assert!(start.elapsed() < 10 * SHORT, "never seen busy");
        std::thread::sleep(Duration::from_millis(5));
    }
    let (r, took) = caller.join().expect("caller");
    assert!(
        matches!(r, Err(FabricError::Timeout { .. })),
        "expected a timeout, got {r:?}"
    );
    assert!(
        took >= SHORT && took < 5 * SHORT,
        "timed out after {took:?}, deadline {SHORT:?}"
    );
    assert!(!ep.is_connected(), "a timed-out connection is closed");
    let start = Instant::now();
    let r = read_one(&ep, 16);
    assert!(
        matches!(r, Err(FabricError::Disconnected { .. })),
        "a later READ: {r:?}"
    );
    let c = ep.call(b"hi");
    assert!(
        matches!(c, Err(FabricError::Disconnected { .. })),
        "a later call: {c:?}"
    );
    assert!(start.elapsed() < SHORT, "later calls fail at once");
    t.join().expect("peer");
}

#[test]
fn a_completion_for_an_unknown_request_breaks_the_connection() {
    let (addr, t) = peer(|mut s| {
        let h = request(&mut s);
        complete(&mut s, h.wr_id + 1000, STATUS_OK, &[0; 16]);
        let _ = s.read(&mut [0u8; 1]);
    });
    let ep = TcpEndpoint::connect(&addr, Duration::from_secs(5)).expect("connect");
    let r = read_one(&ep, 16);
    assert!(
        matches!(r, Err(FabricError::Disconnected { .. })),
        "expected the connection to break, got {r:?}"
    );
    assert!(!ep.is_connected());
    t.join().expect("peer");
}

#[test]
fn odd_completions_fail_their_operation_only() {
    let (addr, t) = peer(|mut s| {
        // A READ answered with too few bytes, then an error with a message, then a
        // refusal, then a good READ: all in one batch.
        let hs: Vec<RequestHeader> = (0..4).map(|_| request(&mut s)).collect();
        complete(&mut s, hs[0].wr_id, STATUS_OK, &[1; 10]);
        complete(&mut s, hs[1].wr_id, STATUS_BAD_REQUEST, b"too long");
        complete(&mut s, hs[2].wr_id, STATUS_REMOTE_ACCESS, &[]);
        complete(&mut s, hs[3].wr_id, STATUS_OK, &[7; 16]);
        // The connection still works: a control call.
        let h = request(&mut s);
        complete(&mut s, h.wr_id, STATUS_OK, b"pong");
        let _ = s.read(&mut [0u8; 1]);
    });
    let ep = TcpEndpoint::connect(&addr, Duration::from_secs(5)).expect("connect");
    let mut bufs = vec![vec![0u8; 16]; 4];
    let mut ops: Vec<RdmaOp> = bufs.iter_mut().map(|b| read_op(b)).collect();
    let r = ep.execute(&mut ops);
    drop(ops);
    assert!(
        matches!(&r[0], Err(FabricError::BadRequest(m)) if m.contains("10 bytes")),
        "short READ: {:?}",
        r[0]
    );
    assert_eq!(r[1], Err(FabricError::BadRequest("too long".into())));
    assert_eq!(
        r[2],
        Err(FabricError::RemoteAccess {
            addr: 64,
            rkey: 9,
            len: 16
        })
    );
    assert_eq!(r[3], Ok(()));
    assert_eq!(bufs[3], vec![7; 16], "the good READ's data");
    assert_eq!(
        ep.call(b"ping").expect("call after odd completions"),
        b"pong"
    );
    assert!(ep.is_connected());
    drop(ep);
    t.join().expect("peer");
}

/// Reads one request's header and its payload (none for a READ).
fn request_with_payload(s: &mut TcpStream) -> (RequestHeader, Vec<u8>) {
    let mut b = [0u8; REQUEST_HEADER_LEN];
    s.read_exact(&mut b).expect("a request header");
    let h = RequestHeader::decode(&b).expect("the request magic");
    let mut payload = Vec::new();
    if h.op != OP_READ {
        payload.resize(h.len as usize, 0);
        s.read_exact(&mut payload).expect("the request payload");
    }
    (h, payload)
}

fn at(addr: u64, rkey: u32) -> RemoteAddr {
    RemoteAddr { addr, rkey }
}

#[test]
fn operations_that_continue_one_another_go_as_one_request() {
    let (addr, t) = peer(|mut s| {
        // Three WRITEs side by side under rkey 9 come as one request carrying all
        // their bytes; the fourth (another rkey) and the fifth (a gap) alone.
        let hs: Vec<(RequestHeader, Vec<u8>)> =
            (0..3).map(|_| request_with_payload(&mut s)).collect();
        let shape: Vec<(u8, u64, u32, u32)> = hs
            .iter()
            .map(|(h, _)| (h.op, h.addr, h.len, h.rkey))
            .collect();
        assert_eq!(
            shape,
            [
                (OP_WRITE, 1000, 30, 9),
                (OP_WRITE, 1030, 5, 8),
                (OP_WRITE, 1040, 5, 8)
            ]
        );
        let mut want = vec![1u8; 10];
        want.extend([2u8; 10]);
        want.extend([3u8; 10]);
        assert_eq!(hs[0].1, want, "the merged payload, in order");
        for (h, _) in &hs {
            complete(&mut s, h.wr_id, STATUS_OK, &[]);
        }
        // Two READs side by side: one request, its payload split among them.
        let h = request(&mut s);
        assert_eq!((h.op, h.addr, h.len), (OP_READ, 5000, 24));
        let payload: Vec<u8> = (0..24).collect();
        complete(&mut s, h.wr_id, STATUS_OK, &payload);
        let _ = s.read(&mut [0u8; 1]);
    });
    let ep = TcpEndpoint::connect(&addr, Duration::from_secs(5)).expect("connect");
    let data = [[1u8; 10], [2; 10], [3; 10]];
    let mut ops = vec![
        RdmaOp::Write {
            local: &data[0],
            remote: at(1000, 9),
        },
        RdmaOp::Write {
            local: &data[1],
            remote: at(1010, 9),
        },
        RdmaOp::Write {
            local: &data[2],
            remote: at(1020, 9),
        },
        RdmaOp::Write {
            local: &[4; 5],
            remote: at(1030, 8),
        },
        RdmaOp::Write {
            local: &[5; 5],
            remote: at(1040, 8),
        },
    ];
    assert!(ep.execute(&mut ops).iter().all(|r| r.is_ok()));
    let (mut a, mut b) = (vec![0u8; 16], vec![0u8; 8]);
    let mut ops = vec![
        RdmaOp::Read {
            local: &mut a,
            remote: at(5000, 9),
        },
        RdmaOp::Read {
            local: &mut b,
            remote: at(5016, 9),
        },
    ];
    assert!(ep.execute(&mut ops).iter().all(|r| r.is_ok()));
    drop(ops);
    assert_eq!(a, (0..16).collect::<Vec<u8>>());
    assert_eq!(b, (16..24).collect::<Vec<u8>>());
    drop(ep);
    t.join().expect("peer");
}

#[test]
fn a_refused_merged_request_is_sent_again_one_operation_each() {
    let (addr, t) = peer(|mut s| {
        let h = request(&mut s);
        assert_eq!((h.addr, h.len), (64, 32), "the two READs as one request");
        complete(&mut s, h.wr_id, STATUS_REMOTE_ACCESS, &[]);
        // Again, one by one: the first is served, the second refused.
        let a = request(&mut s);
        let b = request(&mut s);
        assert_eq!([(a.addr, a.len), (b.addr, b.len)], [(64, 16), (80, 16)]);
        complete(&mut s, a.wr_id, STATUS_OK, &[6; 16]);
        complete(&mut s, b.wr_id, STATUS_REMOTE_ACCESS, &[]);
        let _ = s.read(&mut [0u8; 1]);
    });
    let ep = TcpEndpoint::connect(&addr, Duration::from_secs(5)).expect("connect");
    let (mut a, mut b) = (vec![0u8; 16], vec![0u8; 16]);
    let mut ops = vec![
        RdmaOp::Read {
            local: &mut a,
            remote: at(64, 9),
        },
        RdmaOp::Read {
            local: &mut b,
            remote: at(80, 9),
        },
    ];
    let r = ep.execute(&mut ops);
    drop(ops);
    assert_eq!(r[0], Ok(()));
    assert_eq!(a, vec![6; 16]);
    assert_eq!(
        r[1],
        Err(FabricError::RemoteAccess {
            addr: 80,
            rkey: 9,
            len: 16
        })
    );
    assert!(ep.is_connected());
    drop(ep);
    t.join().expect("peer");
}

#[test]
fn a_peer_that_closes_is_seen_while_idle() {
    let (addr, t) = peer(drop);
    let ep = TcpEndpoint::connect(&addr, Duration::from_secs(5)).expect("connect");
    t.join().expect("peer");
    let start = Instant::now();
    while ep.is_connected() {
        assert!(start.elapsed() < Duration::from_secs(5), "close never seen");
        std::thread::sleep(Duration::from_millis(5));
    }
    let r = read_one(&ep, 16);
    assert!(
        matches!(r, Err(FabricError::Disconnected { .. })),
        "a READ after the close: {r:?}"
    );
}

#[test]
fn a_merged_read_arriving_in_pieces_fills_each_buffer_in_order() {
    // Larger than the receive buffer, so most of it is read straight into the
    // callers' buffers, and sent in pieces so that takes several reads.
    let lens = [40 << 10, 1, 24 << 10];
    let total: usize = lens.iter().sum();
    let (addr, t) = peer(move |mut s| {
        let h = request(&mut s);
        assert_eq!((h.op, h.addr, h.len as usize), (OP_READ, 0, total));
        let payload: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
        completion_header(&mut s, h.wr_id, STATUS_OK, total);
        for piece in payload.chunks(7 << 10) {
            std::thread::sleep(Duration::from_millis(5));
            std::io::Write::write_all(&mut s, piece).expect("a piece");
        }
        let _ = s.read(&mut [0u8; 1]);
    });
    let ep = TcpEndpoint::connect(&addr, Duration::from_secs(5)).expect("connect");
    let mut bufs: Vec<Vec<u8>> = lens.iter().map(|&n| vec![0u8; n]).collect();
    let mut at_addr = 0;
    let mut ops: Vec<RdmaOp<'_>> = bufs
        .iter_mut()
        .map(|b| {
            let op = RdmaOp::Read {
                remote: at(at_addr, 9),
                local: b,
            };
            at_addr += op.len() as u64;
            op
        })
        .collect();
    let r = ep.execute(&mut ops);
    assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
    drop(ops);
    let got: Vec<u8> = bufs.concat();
    assert_eq!(got.len(), total);
    assert!(
        got.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8),
        "every byte lands where it belongs"
    );
    drop(ep);
    t.join().expect("peer");
}

#[test]
fn a_peer_that_trickles_a_payload_still_times_out_at_the_deadline() {
    let (addr, t) = peer(|mut s| {
        let h = request(&mut s);
        completion_header(&mut s, h.wr_id, STATUS_OK, h.len as usize);
        // A byte now and then: every read returns, but the payload never ends.
        while std::io::Write::write_all(&mut s, &[7]).is_ok() {
            std::thread::sleep(SHORT / 10);
        }
    });
    let ep = TcpEndpoint::connect(&addr, SHORT).expect("connect");
    let start = Instant::now();
    let r = read_one(&ep, 64 << 10);
    let took = start.elapsed();
    assert!(
        matches!(r, Err(FabricError::Timeout { .. })),
        "expected a timeout, got {r:?}"
    );
    assert!(
        took >= SHORT && took < 3 * SHORT,
        "timed out after {took:?}, deadline {SHORT:?}"
    );
    assert!(!ep.is_connected(), "a timed-out connection is closed");
    t.join().expect("peer");
}
