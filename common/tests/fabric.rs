//! Fabric-level tests, run over the backend named by `RMEMFS_TRANSPORT` (`tcp` when
//! unset; the Soft-RoCE VM stage runs them with `verbs`): one-sided READ and WRITE
//! against registered memory (checked in the server's memory itself), SEND/RECV,
//! many outstanding operations, and the error completions (wrong rkey, out of
//! bounds, deregistered memory, another client's memory, no Hello, a peer that
//! goes away). The server side is a small control handler that registers buffers on
//! request; the memnode itself is tested elsewhere.

use rmemfs_common::fabric::{
    self, ConnectionState, ControlHandler, ControlReply, Endpoint, FabricError, MemoryRegistry,
    RdmaOp, RemoteAddr, Server, Transport,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn transport() -> Transport {
    let t = std::env::var("RMEMFS_TRANSPORT").unwrap_or_else(|_| "tcp".into());
    let t: Transport = t.parse().expect("RMEMFS_TRANSPORT");
    eprintln!("fabric tests over {t}");
    t
}

/// The address to listen on: loopback, or `RMEMFS_TEST_HOST` (the VM's rxe address).
fn listen_addr() -> String {
    format!(
        "{}:0",
        std::env::var("RMEMFS_TEST_HOST").unwrap_or_else(|_| "127.0.0.1".into())
    )
}

const TIMEOUT: Duration = Duration::from_secs(20);

/// Control frames of the test handler: `H` + client id (hello), `R` + u32 length
/// (register a fresh zeroed buffer; reply addr u64 + rkey u32), `D` + rkey
/// (deregister), `X` (reply and close); anything else is echoed.
struct TestControl {
    registry: Arc<dyn MemoryRegistry>,
    arena: Arena,
}

/// The test server's memory: a memfd mapped shared (so the mapped backend can
/// offer it), handed out in page-aligned pieces and never reused.
struct Arena {
    fd: std::os::fd::OwnedFd,
    base: u64,
    len: u64,
    next: std::sync::atomic::AtomicU64,
}

const ARENA: u64 = 256 << 20;

impl Arena {
    fn new() -> Arena {
        use std::os::fd::AsRawFd;
        let fd = fabric::mapped::shared::memfd("fabric-test", ARENA).expect("memfd");
        // SAFETY: a fresh shared mapping of our own file; it is never unmapped (the
        // fixture's memory must stay mapped while registered, and tests are short).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                ARENA as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "map the arena");
        Arena {
            fd,
            base: p as u64,
            len: ARENA,
            next: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn take(&self, len: u64) -> Option<u64> {
        let len = len.max(1).next_multiple_of(4096);
        let at = self
            .next
            .fetch_add(len, std::sync::atomic::Ordering::Relaxed);
        (at + len <= self.len).then_some(self.base + at)
    }
}

impl ControlHandler for TestControl {
    fn handle(&self, conn: &mut ConnectionState, frame: &[u8]) -> ControlReply {
        let reply = |frame: Vec<u8>| ControlReply {
            frame,
            close: false,
        };
        match frame.first() {
            Some(b'H') => {
                conn.client = Some(u64::from_le_bytes(frame[1..9].try_into().unwrap()));
                reply(b"ok".to_vec())
            }
            Some(b'R') => {
                let Some(client) = conn.client else {
                    return reply(b"no hello".to_vec());
                };
                let len = u32::from_le_bytes(frame[1..5].try_into().unwrap()) as usize;
                let Some(addr) = self.arena.take(len as u64) else {
                    return reply(b"arena full".to_vec());
                };
                // SAFETY: the arena is never unmapped.
                match unsafe { self.registry.register(client, addr, len as u64) } {
                    Ok(rkey) => {
                        let mut out = addr.to_le_bytes().to_vec();
                        out.extend_from_slice(&rkey.to_le_bytes());
                        reply(out)
                    }
                    Err(e) => reply(format!("error {e}").into_bytes()),
                }
            }
            Some(b'D') => {
                let rkey = u32::from_le_bytes(frame[1..5].try_into().unwrap());
                self.registry.deregister(rkey);
                reply(b"ok".to_vec())
            }
            Some(b'X') => ControlReply {
                frame: b"bye".to_vec(),
                close: true,
            },
            _ => reply(frame.to_vec()),
        }
    }

    fn disconnected(&self, _conn: &ConnectionState) {}
}

struct Fixture {
    t: Transport,
    server: Box<dyn Server>,
    peer: String,
    /// The server memory's file (to cut it short under a mapped reader).
    arena_fd: std::os::fd::OwnedFd,
}

fn server() -> Fixture {
    server_on(transport())
}

fn server_on(t: Transport) -> Fixture {
    server_at(t, &listen_addr())
}

fn server_at(t: Transport, listen: &str) -> Fixture {
    let mut listener = fabric::bind(t, listen, fabric::DEFAULT_POLL).expect("bind the test server");
    let registry = listener.registry();
    let arena = Arena::new();
    if t == Transport::Mapped {
        listener
            .share_region(fabric::mapped::offer::SharedRegion {
                fd: arena.fd.try_clone().expect("dup"),
                offset: 0,
                base: arena.base,
                len: arena.len,
            })
            .expect("share the arena");
    }
    let arena_fd = arena.fd.try_clone().expect("dup");
    let server = listener
        .serve(Arc::new(TestControl { registry, arena }))
        .expect("serve");
    let peer = server.local_addr().to_string();
    Fixture {
        t,
        server,
        peer,
        arena_fd,
    }
}

impl Fixture {
    fn connect(&self, client: u64) -> Box<dyn Endpoint> {
        fabric::connect(self.t, &self.peer, client, TIMEOUT, fabric::DEFAULT_POLL).expect("connect")
    }

    /// A connection that has said hello as `client`.
    fn client(&self, client: u64) -> Box<dyn Endpoint> {
        let ep = self.connect(client);
        let mut hello = vec![b'H'];
        hello.extend_from_slice(&client.to_le_bytes());
        assert_eq!(ep.call(&hello).expect("hello"), b"ok");
        ep.after_hello().expect("after the hello");
        ep
    }
}

/// Registers `len` bytes on the server for the endpoint's client.
fn register(ep: &dyn Endpoint, len: u32) -> (RemoteAddr, *mut u8) {
    let mut req = vec![b'R'];
    req.extend_from_slice(&len.to_le_bytes());
    let r = ep.call(&req).expect("register call");
    assert_eq!(
        r.len(),
        12,
        "register reply: {}",
        String::from_utf8_lossy(&r)
    );
    let addr = u64::from_le_bytes(r[..8].try_into().unwrap());
    let rkey = u32::from_le_bytes(r[8..].try_into().unwrap());
    (RemoteAddr { addr, rkey }, addr as *mut u8)
}

/// The server's memory at `ptr` (same process: the test reads it directly).
fn server_bytes(ptr: *mut u8, len: usize) -> Vec<u8> {
    // SAFETY: `ptr` is in the arena, never unmapped, at least `len` bytes.
    unsafe { std::slice::from_raw_parts(ptr, len) }.to_vec()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn write(ep: &dyn Endpoint, data: &[u8], remote: RemoteAddr) -> Result<(), FabricError> {
    ep.execute(&mut [RdmaOp::Write {
        local: data,
        remote,
    }])
    .remove(0)
}

fn read(ep: &dyn Endpoint, len: usize, remote: RemoteAddr) -> Result<Vec<u8>, FabricError> {
    let mut buf = vec![0u8; len];
    ep.execute(&mut [RdmaOp::Read {
        local: &mut buf,
        remote,
    }])
    .remove(0)
    .map(|()| buf)
}

fn at(r: RemoteAddr, off: u64) -> RemoteAddr {
    RemoteAddr {
        addr: r.addr + off,
        rkey: r.rkey,
    }
}

#[test]
fn send_recv_carries_control_frames_both_ways() {
    let f = server();
    let ep = f.client(7);
    for n in [1usize, 100, 1000] {
        let frame = pattern(n, n as u8);
        assert_eq!(ep.call(&frame).expect("echo"), frame, "{n}-byte frame");
    }
}

#[test]
fn write_lands_in_server_memory_and_reads_back_byte_exact() {
    let f = server();
    let ep = f.client(7);
    let len = 1 << 20;
    let (remote, ptr) = register(&*ep, len as u32);
    let data = pattern(len, 3);
    write(&*ep, &data, remote).expect("WRITE");
    assert!(
        server_bytes(ptr, len) == data,
        "the server's memory must hold exactly what was written"
    );
    assert!(read(&*ep, len, remote).expect("READ") == data);
    // Unaligned pieces inside the region.
    let piece = pattern(4097, 9);
    write(&*ep, &piece, at(remote, 12345)).expect("unaligned WRITE");
    assert_eq!(read(&*ep, 4097, at(remote, 12345)).expect("READ"), piece);
    assert_eq!(server_bytes(ptr, len)[12345..12345 + 4097], piece[..]);
}

#[test]
fn registered_local_buffers_are_used_in_place() {
    let f = server();
    let ep = f.client(7);
    let (remote, ptr) = register(&*ep, 1 << 16);
    let slab: &'static mut [u8] = vec![0u8; 1 << 20].leak();
    // SAFETY: leaked, so mapped for the rest of the process.
    unsafe { fabric::register_local(slab.as_mut_ptr(), slab.len()) }.expect("register_local");
    slab[..1 << 16].copy_from_slice(&pattern(1 << 16, 5));
    let (src, dst) = slab.split_at_mut(1 << 16);
    let results = ep.execute(&mut [
        RdmaOp::Write { local: src, remote },
        RdmaOp::Read {
            local: &mut dst[..1 << 16],
            remote,
        },
    ]);
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    assert_eq!(server_bytes(ptr, 1 << 16), pattern(1 << 16, 5));
    assert_eq!(dst[..1 << 16], pattern(1 << 16, 5)[..]);
}

#[test]
fn many_outstanding_operations_in_one_batch_and_from_many_threads() {
    let f = server();
    let ep: Arc<dyn Endpoint> = Arc::from(f.client(7));
    let block = 4096usize;
    let blocks = 1024usize;
    let (remote, ptr) = register(&*ep, (block * blocks) as u32);
    let data: Vec<Vec<u8>> = (0..blocks).map(|i| pattern(block, i as u8)).collect();
    let mut ops: Vec<RdmaOp> = data
        .iter()
        .enumerate()
        .map(|(i, d)| RdmaOp::Write {
            local: d,
            remote: at(remote, (i * block) as u64),
        })
        .collect();
    let results = ep.execute(&mut ops);
    assert!(
        results.iter().all(|r| r.is_ok()),
        "a WRITE of the batch failed"
    );
    let all = server_bytes(ptr, block * blocks);
    for (i, d) in data.iter().enumerate() {
        assert_eq!(
            &all[i * block..(i + 1) * block],
            &d[..],
            "block {i} in server memory"
        );
    }
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let ep = ep.clone();
            std::thread::spawn(move || {
                for round in 0..4 {
                    let mut bufs = vec![vec![0u8; block]; blocks / 4];
                    let mut ops: Vec<RdmaOp> = bufs
                        .iter_mut()
                        .enumerate()
                        .map(|(k, b)| RdmaOp::Read {
                            local: b,
                            remote: at(remote, (((t * blocks / 4) + k) * block) as u64),
                        })
                        .collect();
                    let results = ep.execute(&mut ops);
                    assert!(
                        results.iter().all(|r| r.is_ok()),
                        "thread {t} round {round}"
                    );
                    for (k, b) in bufs.iter().enumerate() {
                        assert_eq!(b, &pattern(block, (t * blocks / 4 + k) as u8));
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("reader thread");
    }
}

#[test]
fn batches_keep_their_order_and_any_length() {
    let f = server();
    let ep = f.client(7);
    let slot = 2048usize;
    let pairs = 1500usize;
    let (remote, ptr) = register(&*ep, (slot * pairs) as u32);
    // Each READ follows the WRITE of its slot in the same batch and must see it.
    let data: Vec<Vec<u8>> = (0..pairs).map(|i| pattern(slot, i as u8 ^ 0x5a)).collect();
    let mut bufs = vec![vec![0u8; slot]; pairs];
    let mut ops = Vec::with_capacity(2 * pairs);
    for (i, (d, b)) in data.iter().zip(bufs.iter_mut()).enumerate() {
        let r = at(remote, (i * slot) as u64);
        ops.push(RdmaOp::Write {
            local: d,
            remote: r,
        });
        ops.push(RdmaOp::Read {
            local: b,
            remote: r,
        });
    }
    let results = ep.execute(&mut ops);
    drop(ops);
    assert_eq!(results.len(), 2 * pairs, "one result per operation");
    assert!(results.iter().all(|r| r.is_ok()), "alternating batch");
    for (i, (d, b)) in data.iter().zip(&bufs).enumerate() {
        assert_eq!(b, d, "READ {i} after its WRITE in one batch");
    }
    // Long runs of one kind: every WRITE, then every READ back.
    let data: Vec<Vec<u8>> = (0..pairs).map(|i| pattern(slot, i as u8)).collect();
    let mut ops: Vec<RdmaOp> = data
        .iter()
        .enumerate()
        .map(|(i, d)| RdmaOp::Write {
            local: d,
            remote: at(remote, (i * slot) as u64),
        })
        .collect();
    assert!(ep.execute(&mut ops).iter().all(|r| r.is_ok()), "WRITE run");
    assert_eq!(
        server_bytes(ptr, slot * pairs),
        data.concat(),
        "server memory"
    );
    let mut bufs = vec![vec![0u8; slot]; pairs];
    let mut ops: Vec<RdmaOp> = bufs
        .iter_mut()
        .enumerate()
        .map(|(i, b)| RdmaOp::Read {
            local: b,
            remote: at(remote, (i * slot) as u64),
        })
        .collect();
    assert!(ep.execute(&mut ops).iter().all(|r| r.is_ok()), "READ run");
    drop(ops);
    assert_eq!(bufs, data, "READ run");
}

fn assert_remote_access(r: Result<(), FabricError>, what: &str) {
    assert!(
        matches!(r, Err(FabricError::RemoteAccess { .. })),
        "{what}: expected a remote access error, got {r:?}"
    );
}

#[test]
fn a_wrong_rkey_is_a_remote_access_error_and_writes_nothing() {
    let f = server();
    let ep = f.client(7);
    let (remote, ptr) = register(&*ep, 8192);
    let bad = RemoteAddr {
        addr: remote.addr,
        rkey: remote.rkey ^ 0x5a5a_0000,
    };
    assert_remote_access(write(&*ep, &[0xee; 64], bad), "WRITE with a wrong rkey");
    assert!(
        server_bytes(ptr, 8192).iter().all(|&b| b == 0),
        "nothing written"
    );
}

#[test]
fn out_of_bounds_accesses_are_remote_access_errors() {
    let f = server();
    let ep = f.client(7);
    let (remote, ptr) = register(&*ep, 8192);
    assert_remote_access(
        write(&*ep, &[0xee; 64], at(remote, 8192 - 32)),
        "WRITE past the end",
    );
    assert!(
        server_bytes(ptr, 8192).iter().all(|&b| b == 0),
        "nothing written"
    );
    let ep = f.client(7);
    assert_remote_access(
        read(&*ep, 64, at(remote, 8192)).map(drop),
        "READ past the end",
    );
}

#[test]
fn side_by_side_operations_each_get_their_own_outcome() {
    let f = server();
    let ep = f.client(7);
    let (remote, ptr) = register(&*ep, 8192);
    // Three WRITEs that continue one another; the last runs past the end. A
    // backend may carry them as one request, but the first two land.
    let data = [pattern(4096, 1), pattern(4096, 2), pattern(64, 3)];
    let mut ops: Vec<RdmaOp> = data
        .iter()
        .enumerate()
        .map(|(i, d)| RdmaOp::Write {
            local: d,
            remote: at(remote, (i * 4096) as u64),
        })
        .collect();
    let r = ep.execute(&mut ops);
    assert_eq!(r[..2], [Ok(()), Ok(())], "the WRITEs inside");
    assert_remote_access(r[2].clone(), "the WRITE past the end");
    assert_eq!(server_bytes(ptr, 8192), data[..2].concat(), "server memory");
    // The same READs back, on a new connection: over verbs the refusal put the
    // queue pair in the error state, as it does on RDMA hardware.
    let ep = f.client(7);
    let mut bufs = [vec![0u8; 4096], vec![0u8; 4096], vec![0u8; 64]];
    let mut ops: Vec<RdmaOp> = bufs
        .iter_mut()
        .enumerate()
        .map(|(i, b)| RdmaOp::Read {
            local: b,
            remote: at(remote, (i * 4096) as u64),
        })
        .collect();
    let r = ep.execute(&mut ops);
    drop(ops);
    assert_eq!(r[..2], [Ok(()), Ok(())], "the READs inside");
    assert_remote_access(r[2].clone(), "the READ past the end");
    assert_eq!(bufs[..2], data[..2], "what the READs inside got");
}

#[test]
fn deregistered_memory_cannot_be_reached() {
    let f = server();
    let ep = f.client(7);
    let (remote, ptr) = register(&*ep, 4096);
    write(&*ep, &[1; 16], remote).expect("WRITE while registered");
    let mut req = vec![b'D'];
    req.extend_from_slice(&remote.rkey.to_le_bytes());
    assert_eq!(ep.call(&req).expect("deregister"), b"ok");
    assert_remote_access(write(&*ep, &[2; 16], remote), "WRITE after deregistration");
    assert_eq!(
        server_bytes(ptr, 16),
        vec![1; 16],
        "the old content is untouched"
    );
}

#[test]
fn another_clients_memory_is_refused() {
    let f = server();
    let owner = f.client(7);
    let (remote, ptr) = register(&*owner, 4096);
    let other = f.client(8);
    assert_remote_access(write(&*other, &[3; 16], remote), "WRITE by another client");
    assert!(server_bytes(ptr, 16).iter().all(|&b| b == 0));
    write(&*owner, &[4; 16], remote).expect("the owner still writes");
}

#[test]
fn no_one_sided_access_before_hello() {
    let f = server();
    let owner = f.client(7);
    let (remote, ptr) = register(&*owner, 4096);
    let stranger = f.connect(7);
    assert_remote_access(write(&*stranger, &[5; 16], remote), "WRITE before Hello");
    assert!(server_bytes(ptr, 16).iter().all(|&b| b == 0));
}

#[test]
fn a_peer_that_goes_away_fails_operations_promptly() {
    let mut f = server();
    let ep = f.client(7);
    let (remote, _) = register(&*ep, 4096);
    f.server.shutdown();
    let start = Instant::now();
    let r = write(&*ep, &[6; 16], remote);
    assert!(
        r.is_err(),
        "an operation after the server closed must fail, got {r:?}"
    );
    let r = ep.call(b"echo");
    assert!(
        r.is_err(),
        "a call after the server closed must fail, got {r:?}"
    );
    assert!(
        start.elapsed() < TIMEOUT + Duration::from_secs(10),
        "failing took {:?}",
        start.elapsed()
    );
    assert!(!ep.is_connected());
}

#[test]
fn a_server_that_closes_after_replying_delivers_the_reply() {
    let f = server();
    let ep = f.client(7);
    assert_eq!(ep.call(b"X").expect("the reply before the close"), b"bye");
    let deadline = Instant::now() + TIMEOUT;
    while ep.call(b"echo").is_ok() {
        assert!(Instant::now() < deadline, "the connection must close");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn choosing_verbs_without_a_device_names_what_is_missing() {
    if fabric::verbs_device().is_ok() {
        eprintln!(
            "skipped: this host has an RDMA device ({:?})",
            fabric::verbs_device()
        );
        return;
    }
    let err = Transport::Verbs
        .resolve()
        .expect_err("verbs without a device");
    assert!(err.to_string().contains("no RDMA device"), "{err}");
    assert_eq!(Transport::Auto.resolve().expect("auto"), Transport::Tcp);
}

/// A mapped endpoint to `f` that has said hello as `client` and mapped the region.
fn mapped_client(f: &Fixture, client: u64) -> fabric::mapped::MappedEndpoint {
    let ep = fabric::mapped::MappedEndpoint::connect(
        &f.peer,
        client,
        TIMEOUT,
        fabric::DEFAULT_POLL,
        true,
    )
    .expect("connect");
    let mut hello = vec![b'H'];
    hello.extend_from_slice(&client.to_le_bytes());
    assert_eq!(ep.call(&hello).expect("hello"), b"ok");
    ep.after_hello().expect("the mapping");
    ep
}

#[test]
fn mapped_reads_and_writes_are_copies_of_the_shared_region() {
    let f = server_on(Transport::Mapped);
    let ep = mapped_client(&f, 7);
    assert!(ep.is_mapped(), "a memnode on this host is mapped");
    let (remote, ptr) = register(&ep, 8192);
    let data = pattern(8192, 3);
    write(&ep, &data, remote).expect("WRITE");
    assert_eq!(
        server_bytes(ptr, 8192),
        data,
        "the bytes are in the server's memory"
    );
    assert_eq!(read(&ep, 100, at(remote, 50)).expect("READ"), data[50..150]);
    // The NIC's checks, made by the copy: bounds, rkey, owner.
    assert_remote_access(write(&ep, &[1; 16], at(remote, 8190)), "WRITE past the end");
    let wrong = RemoteAddr {
        addr: remote.addr,
        rkey: remote.rkey ^ 1,
    };
    assert_remote_access(read(&ep, 16, wrong).map(drop), "READ under a wrong rkey");
    let other = mapped_client(&f, 8);
    assert_remote_access(write(&other, &[2; 16], remote), "another client's WRITE");
    assert_eq!(server_bytes(ptr, 8192), data, "nothing refused was written");
}

#[test]
fn a_mapped_write_after_deregistration_is_refused_and_lands_nowhere() {
    let f = server_on(Transport::Mapped);
    let ep = mapped_client(&f, 7);
    let (remote, ptr) = register(&ep, 4096);
    write(&ep, &[1; 16], remote).expect("WRITE while registered");
    let mut req = vec![b'D'];
    req.extend_from_slice(&remote.rkey.to_le_bytes());
    assert_eq!(ep.call(&req).expect("deregister"), b"ok");
    assert_remote_access(write(&ep, &[2; 16], remote), "WRITE after deregistration");
    assert_eq!(server_bytes(ptr, 16), vec![1; 16]);
}

#[test]
fn a_region_cut_short_under_a_mapped_reader_is_an_error_not_a_crash() {
    use std::os::fd::AsRawFd;
    let f = server_on(Transport::Mapped);
    let ep = mapped_client(&f, 7);
    let (remote, _) = register(&ep, 4096);
    write(&ep, &[9; 64], remote).expect("WRITE");
    // SAFETY: truncating the test's own memfd; nothing in this process touches the
    // arena's pages after this but the guarded copy below.
    assert_eq!(unsafe { libc::ftruncate(f.arena_fd.as_raw_fd(), 0) }, 0);
    let r = read(&ep, 64, remote);
    assert!(
        matches!(r, Err(FabricError::Disconnected { .. })),
        "a READ of lost pages: {r:?}"
    );
    assert!(!ep.is_connected(), "the mapping is known broken");
}

#[test]
fn a_memnode_that_shares_nothing_cannot_be_mapped_but_auto_uses_tcp() {
    // On loopback, where auto means tcp (mapped where it can) even on a host with an
    // RDMA device, as in the Soft-RoCE VM.
    let f = server_at(Transport::Tcp, "127.0.0.1:0");
    let required =
        fabric::mapped::MappedEndpoint::connect(&f.peer, 7, TIMEOUT, fabric::DEFAULT_POLL, true)
            .expect("connect");
    let mut hello = vec![b'H'];
    hello.extend_from_slice(&7u64.to_le_bytes());
    assert_eq!(required.call(&hello).expect("hello"), b"ok");
    let e = required
        .after_hello()
        .expect_err("--transport mapped to a tcp-only server");
    assert!(e.to_string().contains("shares no memory"), "{e}");
    let auto = fabric::connect(Transport::Auto, &f.peer, 7, TIMEOUT, fabric::DEFAULT_POLL)
        .expect("connect");
    assert_eq!(auto.call(&hello).expect("hello"), b"ok");
    auto.after_hello().expect("auto falls back to tcp");
    let (remote, ptr) = register(&*auto, 4096);
    write(&*auto, &[5; 32], remote).expect("WRITE over tcp");
    assert_eq!(server_bytes(ptr, 32), vec![5; 32]);
}

#[test]
fn a_mapped_client_whose_server_stops_fails_at_once() {
    let mut f = server_on(Transport::Mapped);
    let ep = mapped_client(&f, 7);
    let (remote, _) = register(&ep, 4096);
    f.server.shutdown();
    let r = write(&ep, &[6; 16], remote);
    assert!(
        matches!(r, Err(FabricError::Disconnected { .. })),
        "a mapped WRITE after the server stopped: {r:?}"
    );
}
