//! Helpers shared by the memnode integration tests: a memnode on a free port, clients
//! over the real tcp fabric, and bounded polling (never a blind sleep).

#![allow(dead_code)] // each test binary uses a different subset

use memnode::{Memnode, MemnodeConfig};
use rmemfs_common::control;
use rmemfs_common::fabric::tcp::TcpEndpoint;
use rmemfs_common::fabric::{Endpoint, FabricError, RdmaOp, RemoteAddr, Transport};
use rmemfs_common::protocol::{Allocation, SessionSecret};
use rmemfs_common::sync::lock;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Bound on every fabric operation and every wait in these tests.
pub const TIMEOUT: Duration = Duration::from_secs(10);

pub fn start(size: u64) -> Memnode {
    start_with_token(size, None)
}

pub fn start_with_token(size: u64, token: Option<&[u8]>) -> Memnode {
    start_with(size, token, memnode::DEFAULT_LEASE)
}

pub fn start_with_lease(size: u64, lease: Duration) -> Memnode {
    start_with(size, None, lease)
}

fn start_with(size: u64, token: Option<&[u8]>, lease: Duration) -> Memnode {
    Memnode::start(MemnodeConfig {
        listen: "127.0.0.1:0".into(),
        size,
        token: token.map(<[u8]>::to_vec),
        tenants: None,
        huge_pages: false,
        transport: Transport::Tcp,
        poll: std::time::Duration::ZERO,
        lease,
        // Reclaimed at once, as the tests of reclaim expect; the session tests
        // (`memory_file.rs`, `src/control/tests.rs`) set their own.
        session_grace: Duration::ZERO,
        memory_file: None,
        connections: rmemfs_common::fabric::ConnectionLimits::default(),
    })
    .expect("a memnode on 127.0.0.1:0 starts")
}

/// A connection that has not said Hello.
pub fn connect(node: &Memnode) -> TcpEndpoint {
    TcpEndpoint::connect(&node.local_addr().to_string(), TIMEOUT).expect("connects to the memnode")
}

type Sessions = Option<HashMap<(String, u64), SessionSecret>>;

fn lock_sessions() -> std::sync::MutexGuard<'static, Sessions> {
    static SESSIONS: std::sync::Mutex<Sessions> = std::sync::Mutex::new(None);
    lock(&SESSIONS)
}

/// The secret of the session [`client`] started as `client_id` on `node` (none yet:
/// `NONE`).
pub fn session_of(node: &Memnode, client_id: u64) -> SessionSecret {
    lock_sessions()
        .as_ref()
        .and_then(|m| m.get(&(node.local_addr().to_string(), client_id)).copied())
        .unwrap_or_default()
}

/// A connection that said Hello as `client_id`, in that client's session on `node`
/// (its first Hello starts one; later connections present its secret and join it).
pub fn client(node: &Memnode, client_id: u64) -> TcpEndpoint {
    let ep = connect(node);
    let known = session_of(node, client_id);
    let w = control::hello_in_session(&ep, client_id, b"", known).expect("Hello is welcome");
    lock_sessions()
        .get_or_insert_with(Default::default)
        .insert((node.local_addr().to_string(), client_id), w.session);
    ep
}

pub fn alloc(ep: &TcpEndpoint, bytes: u64) -> Allocation {
    control::alloc(ep, bytes).unwrap_or_else(|e| panic!("alloc({bytes}) should succeed: {e}"))
}

pub fn remote(a: &Allocation, offset: u64) -> RemoteAddr {
    RemoteAddr {
        addr: a.addr.wrapping_add(offset),
        rkey: a.rkey,
    }
}

pub fn write_at(ep: &TcpEndpoint, at: RemoteAddr, data: &[u8]) -> Result<(), FabricError> {
    let mut ops = [RdmaOp::Write {
        local: data,
        remote: at,
    }];
    one(ep.execute(&mut ops))
}

pub fn read_at(ep: &TcpEndpoint, at: RemoteAddr, len: usize) -> Result<Vec<u8>, FabricError> {
    let mut buf = vec![0u8; len];
    let mut ops = [RdmaOp::Read {
        local: &mut buf,
        remote: at,
    }];
    one(ep.execute(&mut ops))?;
    Ok(buf)
}

fn one(mut results: Vec<Result<(), FabricError>>) -> Result<(), FabricError> {
    assert_eq!(results.len(), 1, "execute must return one result per op");
    results.remove(0)
}

/// `len` bytes of a pattern that differs per `seed` and per position.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Polls `done` until it holds, failing with `what` after [`TIMEOUT`].
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "timed out after {TIMEOUT:?} waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// True for the error a refused one-sided access gives.
pub fn is_remote_access(r: &Result<impl std::fmt::Debug, FabricError>) -> bool {
    matches!(r, Err(FabricError::RemoteAccess { .. }))
}
