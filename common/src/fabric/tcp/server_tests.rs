//! The server's payload paths against a raw client that speaks the wire format
//! itself, so it can do what the real client never does: leave completions unread
//! until the socket is full, trickle a payload in, or have the memory deregistered
//! while a WRITE's payload is still arriving.

use super::*;
use crate::fabric::{ControlReply, MemoryRegistry};
use std::time::Duration;

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
