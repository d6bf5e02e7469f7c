//! Unit tests of the control service, fed frames directly (no sockets).

use super::*;
use crate::region::{system_page_size, Region};
use rmemfs_common::auth;
use rmemfs_common::fabric::tcp::TcpRegistry;
use rmemfs_common::fabric::{AccessError, ConnectionState, ControlHandler};
use rmemfs_common::protocol::{
    Allocation, ErrorCode, Request, Response, VolumeInfo, HEADER_LEN, MAX_CHUNKS_PER_REPLY,
};
use std::sync::atomic::Ordering;

const TOKEN: &[u8] = b"s3cret";

/// One tenant with `token`, or the open tenant without one.
fn tenants_of(token: Option<&[u8]>) -> Arc<Tenants> {
    Arc::new(token.map_or_else(Tenants::open, Tenants::single))
}

fn service(token: Option<&[u8]>) -> ControlService {
    let region = Arc::new(Region::reserve(16 * system_page_size(), false).expect("reserve"));
    let pool = Arc::new(ChunkPool::new(region, Arc::new(TcpRegistry::new())));
    ControlService::new(
        pool,
        tenants_of(token),
        0xfeed,
        Duration::from_secs(10),
        Duration::ZERO,
    )
}

/// A service that keeps an idle session's memory for `grace`.
fn service_with_grace(grace: Duration) -> ControlService {
    let region = Arc::new(Region::reserve(16 * system_page_size(), false).expect("reserve"));
    let pool = Arc::new(ChunkPool::new(region, Arc::new(TcpRegistry::new())));
    ControlService::new(
        pool,
        tenants_of(None),
        0xfeed,
        Duration::from_secs(10),
        grace,
    )
}

/// A service over `pages` pages with a lease of `lease`, and its registry (the NIC)
/// to read and write chunks through.
fn service_with(pages: u64, lease: Duration) -> (ControlService, Arc<TcpRegistry>) {
    let region = Arc::new(Region::reserve(pages * system_page_size(), false).expect("reserve"));
    let nic = Arc::new(TcpRegistry::new());
    let pool = Arc::new(ChunkPool::new(region, nic.clone()));
    (
        ControlService::new(pool, tenants_of(None), 0xfeed, lease, Duration::ZERO),
        nic,
    )
}

fn conn(id: u64) -> ConnectionState {
    ConnectionState::new(id, format!("test-peer-{id}"))
}

/// Sends `req` and decodes the reply; returns it with the close flag.
fn ask(s: &ControlService, c: &mut ConnectionState, req: &Request) -> (Response, bool) {
    send_raw(s, c, &req.encode())
}

fn send_raw(s: &ControlService, c: &mut ConnectionState, frame: &[u8]) -> (Response, bool) {
    let r = s.handle(c, frame);
    let resp = Response::decode(&r.frame).expect("the service always replies with a valid frame");
    (resp, r.close)
}

/// Hello on `c` as client `id`: the transcript its Prove must cover, or the refusal
/// and its close flag.
fn challenged(
    s: &ControlService,
    c: &mut ConnectionState,
    id: u64,
    resume: bool,
) -> Result<auth::Transcript, (Response, bool)> {
    let client_nonce = auth::new_nonce().unwrap();
    let hello = Request::Hello {
        client_id: id,
        nonce: client_nonce,
        resume,
    };
    match ask(s, c, &hello) {
        (Response::Challenge { nonce }, _) => Ok(auth::Transcript {
            client_id: id,
            client_nonce,
            server_nonce: nonce,
        }),
        refused => Err(refused),
    }
}

/// Hello and Prove on `c` as client `id` with `token`, resuming `session` unless it
/// is `NONE`, as a client does (`rmemfs_common::control::hello_in_session`): the last
/// reply, its close flag, and the session's secret as the client now knows it (`NONE`
/// when refused).
fn greet(
    s: &ControlService,
    c: &mut ConnectionState,
    id: u64,
    token: &[u8],
    session: SessionSecret,
) -> (Response, bool, SessionSecret) {
    let resume = !session.is_none();
    let t = match challenged(s, c, id, resume) {
        Ok(t) => t,
        Err((resp, close)) => return (resp, close, SessionSecret::NONE),
    };
    let key = auth::token_key(token);
    let prove = Request::Prove {
        proof: auth::client_proof(&key, &t),
        session: resume.then(|| auth::session_proof(&session, &t)),
    };
    let (resp, close) = ask(s, c, &prove);
    if let Some((facts, proof)) = resp.welcome_facts() {
        assert_eq!(
            proof,
            auth::server_proof(&key, &t, &facts),
            "the memnode proves it knows the token, over what its Welcome says"
        );
    }
    let secret = match &resp {
        Response::Welcome { resumed: true, .. } => session,
        Response::Welcome { .. } => auth::session_secret(&key, &t),
        _ => SessionSecret::NONE,
    };
    (resp, close, secret)
}

/// The handshake of a new session on `c` as `id` with `token`.
fn hello(s: &ControlService, c: &mut ConnectionState, id: u64, token: &[u8]) -> (Response, bool) {
    let (resp, close, _) = greet(s, c, id, token, SessionSecret::NONE);
    (resp, close)
}

/// Whether a Welcome says the session was resumed.
fn resumed(resp: &Response) -> bool {
    match resp {
        Response::Welcome { resumed, .. } => *resumed,
        other => panic!("expected Welcome, got {other:?}"),
    }
}

/// The handshake on `c` as `id`, joining the session of `secret`.
fn join(s: &ControlService, c: &mut ConnectionState, id: u64, secret: SessionSecret) -> Response {
    let (resp, close, _) = greet(s, c, id, b"", secret);
    assert!(!close, "joining the session was refused: {resp:?}");
    resp
}

fn code(resp: &Response) -> Option<ErrorCode> {
    match resp {
        Response::Error { code, .. } => Some(*code),
        _ => None,
    }
}

#[test]
fn requests_before_hello_are_refused_and_close() {
    let s = service(None);
    for req in [
        Request::Stat,
        Request::Alloc { bytes: 1 },
        Request::Free { addr: 0, rkey: 1 },
        Request::VolumeOpen {
            name: b"v".to_vec(),
            create: true,
            takeover: true,
        },
        Request::VolumeChunks { after: 0 },
        Request::VolumeClose,
        Request::VolumeList { after: vec![] },
        Request::VolumeDestroy {
            name: b"v".to_vec(),
        },
    ] {
        let mut c = conn(1);
        let (resp, close) = ask(&s, &mut c, &req);
        assert_eq!(
            code(&resp),
            Some(ErrorCode::NotAuthenticated),
            "{req:?} before Hello"
        );
        assert!(close, "{req:?} before Hello must close the connection");
        assert_eq!(c.client, None);
    }
}

#[test]
fn hello_is_checked_against_the_token() {
    let s = service(Some(TOKEN));
    for bad in [&b""[..], b"s3cre", b"s3cret!", b"S3cret"] {
        let mut c = conn(1);
        let (resp, close) = hello(&s, &mut c, 5, bad);
        assert_eq!(
            code(&resp),
            Some(ErrorCode::AuthFailed),
            "token {bad:?} must fail"
        );
        assert!(close, "a failed Hello must close");
        assert_eq!(c.client, None, "a failed Hello must not authenticate");
    }
    let mut c = conn(2);
    let (resp, close) = hello(&s, &mut c, 5, TOKEN);
    let Response::Welcome {
        node_id,
        capacity,
        features,
        resumed,
        boot,
        ..
    } = resp
    else {
        panic!("expected Welcome, got {resp:?}")
    };
    assert_eq!(
        (node_id, capacity, features, resumed, boot),
        (
            0xfeed,
            16 * system_page_size(),
            rmemfs_common::protocol::FEATURE_COPY,
            false,
            0
        )
    );
    assert!(!close);
    assert_eq!(c.client, Some(5));
    assert_eq!(s.stats().clients, 1);
}

#[test]
fn without_a_token_any_proof_is_welcome_but_the_memnode_proves_no_token() {
    let s = service(None);
    let mut c = conn(1);
    let (resp, _) = hello(&s, &mut c, 9, b"");
    assert!(
        matches!(resp, Response::Welcome { .. }),
        "expected Welcome, got {resp:?}"
    );
    // A client that has a token gets in too, but the Welcome's proof is not made
    // with its token: it sees the memnode does not know it (and refuses to go on).
    let mut c = conn(2);
    let t = challenged(&s, &mut c, 10, false).expect("a challenge");
    let key = auth::token_key(b"a token the memnode lacks");
    let prove = Request::Prove {
        proof: auth::client_proof(&key, &t),
        session: None,
    };
    let Some((facts, proof)) = ask(&s, &mut c, &prove).0.welcome_facts() else {
        panic!("no welcome")
    };
    assert_ne!(proof, auth::server_proof(&key, &t, &facts));
}

#[test]
fn a_second_hello_is_a_bad_request() {
    let s = service(None);
    let mut c = conn(1);
    hello(&s, &mut c, 9, b"");
    let (resp, close) = hello(&s, &mut c, 10, b"");
    assert_eq!(code(&resp), Some(ErrorCode::BadRequest));
    assert!(!close);
    assert_eq!(
        c.client,
        Some(9),
        "a second Hello must not change the client"
    );
}

#[test]
fn undecodable_frames_get_an_error_and_close() {
    let s = service(None);
    // Version 1: a client from before the handshake of `auth.rs`.
    let mut v1 = Request::Stat.encode();
    v1[0..2].copy_from_slice(&1u16.to_le_bytes());
    let mut trailing = Request::Stat.encode();
    trailing.push(0);
    let mut bad_name = Request::VolumeOpen {
        name: b"ok".to_vec(),
        create: true,
        takeover: false,
    }
    .encode();
    bad_name[HEADER_LEN + 3] = b'/';
    let mut bad_flags = Request::VolumeOpen {
        name: b"ok".to_vec(),
        create: true,
        takeover: false,
    }
    .encode();
    *bad_flags.last_mut().expect("non-empty") = 0x10;
    let mut short_destroy = Request::VolumeDestroy {
        name: b"abc".to_vec(),
    }
    .encode();
    short_destroy.pop();
    short_destroy[4] -= 1;
    let cases: [(&str, Vec<u8>, ErrorCode); 7] = [
        ("protocol version 1", v1, ErrorCode::VersionMismatch),
        ("an empty frame", vec![], ErrorCode::BadRequest),
        // This version so the garbage gets past the version check.
        (
            "garbage",
            vec![2, 0, 0xbe, 0xef, 1, 0, 0, 0, 5],
            ErrorCode::BadRequest,
        ),
        ("trailing bytes", trailing, ErrorCode::BadRequest),
        (
            "a volume name with a slash",
            bad_name,
            ErrorCode::BadRequest,
        ),
        ("unknown VolumeOpen flags", bad_flags, ErrorCode::BadRequest),
        (
            "a truncated VolumeDestroy",
            short_destroy,
            ErrorCode::BadRequest,
        ),
    ];
    for (what, frame, want) in cases {
        for authenticated in [false, true] {
            let mut c = conn(1);
            if authenticated {
                hello(&s, &mut c, 3, b"");
            }
            let (resp, close) = send_raw(&s, &mut c, &frame);
            assert_eq!(code(&resp), Some(want), "{what}: expected {want:?}");
            assert!(close, "{what} must close the connection");
        }
    }
}

#[test]
fn alloc_free_and_stat_after_hello() {
    let s = service(None);
    let page = system_page_size();
    let mut c = conn(1);
    hello(&s, &mut c, 3, b"");
    let (resp, _) = ask(&s, &mut c, &Request::Alloc { bytes: page + 1 });
    let Response::Allocated(a) = resp else {
        panic!("expected Allocated, got {resp:?}")
    };
    assert_eq!(a.len, 2 * page, "the size is rounded up to pages");
    let (resp, _) = ask(&s, &mut c, &Request::Stat);
    assert_eq!(
        resp,
        Response::Stats(NodeStats {
            capacity: 16 * page,
            used: 2 * page,
            clients: 1,
            allocations: 1
        })
    );
    let cases = [
        (Request::Alloc { bytes: 0 }, ErrorCode::BadRequest),
        (Request::Alloc { bytes: 15 * page }, ErrorCode::NoSpace),
        (Request::Alloc { bytes: u64::MAX }, ErrorCode::NoSpace),
        (
            Request::Free {
                addr: a.addr,
                rkey: a.rkey ^ 1,
            },
            ErrorCode::NotFound,
        ),
        (
            Request::Free {
                addr: a.addr + 1,
                rkey: a.rkey,
            },
            ErrorCode::NotFound,
        ),
    ];
    for (req, want) in cases {
        let (resp, close) = ask(&s, &mut c, &req);
        assert_eq!(code(&resp), Some(want), "{req:?}: expected {want:?}");
        assert!(!close, "{req:?} is a refusal, not a reason to close");
    }
    let (resp, _) = ask(
        &s,
        &mut c,
        &Request::Free {
            addr: a.addr,
            rkey: a.rkey,
        },
    );
    assert_eq!(resp, Response::Freed);
    assert_eq!(s.stats().used, 0);
}

#[test]
fn another_client_cannot_free_a_chunk() {
    let s = service(None);
    let (mut a, mut b) = (conn(1), conn(2));
    hello(&s, &mut a, 1, b"");
    hello(&s, &mut b, 2, b"");
    let Response::Allocated(x) = ask(&s, &mut a, &Request::Alloc { bytes: 1 }).0 else {
        panic!("expected Allocated")
    };
    let (resp, _) = ask(
        &s,
        &mut b,
        &Request::Free {
            addr: x.addr,
            rkey: x.rkey,
        },
    );
    assert_eq!(code(&resp), Some(ErrorCode::NotFound));
    assert_eq!(s.stats().allocations, 1, "the owner's chunk must survive");
}

#[test]
fn chunks_are_reclaimed_when_the_clients_last_connection_closes() {
    let s = service(None);
    let (mut a1, mut a2, mut b) = (conn(1), conn(2), conn(3));
    let (_, _, secret) = greet(&s, &mut a1, 1, b"", SessionSecret::NONE);
    join(&s, &mut a2, 1, secret);
    hello(&s, &mut b, 2, b"");
    ask(&s, &mut a1, &Request::Alloc { bytes: 1 });
    ask(&s, &mut a2, &Request::Alloc { bytes: 1 });
    ask(&s, &mut b, &Request::Alloc { bytes: 1 });
    assert_eq!((s.stats().clients, s.stats().allocations), (2, 3));
    s.disconnected(&a1);
    assert_eq!(s.stats().allocations, 3, "client 1 still has a connection");
    s.disconnected(&a2);
    let st = s.stats();
    assert_eq!(
        (st.clients, st.allocations),
        (1, 1),
        "client 1's chunks must be freed"
    );
    assert_eq!(st.used, system_page_size());
    s.disconnected(&conn(4)); // never said hello: nothing to do
    assert_eq!(s.stats().allocations, 1);
}

#[test]
fn a_proof_is_good_for_its_own_connection_only() {
    // An eavesdropper who saw a Prove cannot use it on a connection of its own: the
    // memnode's nonce differs.
    let s = service(Some(TOKEN));
    let mut c = conn(1);
    let t = challenged(&s, &mut c, 5, false).expect("a challenge");
    let seen = Request::Prove {
        proof: auth::client_proof(&auth::token_key(TOKEN), &t),
        session: None,
    };
    assert!(matches!(ask(&s, &mut c, &seen).0, Response::Welcome { .. }));
    let mut replay = conn(2);
    let other = challenged(&s, &mut replay, 5, false).expect("a challenge");
    assert_ne!(
        other.server_nonce, t.server_nonce,
        "each connection gets its own nonce"
    );
    let (resp, close) = ask(&s, &mut replay, &seen);
    assert_eq!(code(&resp), Some(ErrorCode::AuthFailed), "{resp:?}");
    assert!(close);
    assert_eq!(replay.client, None);
}

#[test]
fn prove_without_hello_or_hello_twice_is_refused_and_closes() {
    let s = service(None);
    let mut c = conn(1);
    let prove = Request::Prove {
        proof: [0; auth::PROOF_LEN],
        session: None,
    };
    let (resp, close) = ask(&s, &mut c, &prove);
    assert_eq!(code(&resp), Some(ErrorCode::NotAuthenticated));
    assert!(close);
    let hello = Request::Hello {
        client_id: 1,
        nonce: [1; auth::NONCE_LEN],
        resume: false,
    };
    let mut c = conn(2);
    ask(&s, &mut c, &hello);
    let (resp, close) = ask(&s, &mut c, &hello);
    assert_eq!(code(&resp), Some(ErrorCode::BadRequest));
    assert!(close);
}

mod tenants;
mod volumes;

fn alloc_on(s: &ControlService, c: &mut ConnectionState, bytes: u64) -> Allocation {
    match ask(s, c, &Request::Alloc { bytes }).0 {
        Response::Allocated(a) => a,
        other => panic!("Alloc: {other:?}"),
    }
}

#[test]
fn copy_moves_bytes_between_a_clients_chunks_and_checks_every_span_first() {
    use rmemfs_common::protocol::CopySpan;
    let (s, nic) = service_with(64, Duration::from_secs(10));
    let page = system_page_size();
    let mut c = conn(1);
    hello(&s, &mut c, 5, b"");
    let (a, b) = (
        alloc_on(&s, &mut c, 2 * page),
        alloc_on(&s, &mut c, 2 * page),
    );
    let data: Vec<u8> = (0..page as usize).map(|i| (i % 253) as u8).collect();
    nic.write(5, a.addr + 100, a.rkey, &data).unwrap();
    let span =
        |src: &Allocation, src_off: u64, dst: &Allocation, dst_off: u64, len: u32| CopySpan {
            src_addr: src.addr + src_off,
            src_rkey: src.rkey,
            dst_addr: dst.addr + dst_off,
            dst_rkey: dst.rkey,
            len,
        };
    let copy =
        |c: &mut ConnectionState, spans: Vec<CopySpan>| ask(&s, c, &Request::Copy { spans }).0;
    let whole = span(&a, 100, &b, page, page as u32);
    assert_eq!(copy(&mut c, vec![whole]), Response::Copied { bytes: page });
    let mut back = vec![0u8; page as usize];
    nic.read(5, b.addr + page, b.rkey, &mut back).unwrap();
    assert_eq!(back, data, "the bytes arrived where asked");
    // Past the end of the destination, or under another client's rkey: refused,
    // and nothing of the request is copied, not even its good first span.
    let mut other = conn(2);
    hello(&s, &mut other, 6, b"");
    let theirs = alloc_on(&s, &mut other, page);
    nic.write(6, theirs.addr, theirs.rkey, &vec![9u8; page as usize])
        .unwrap();
    let first = span(&a, 0, &b, 0, 8);
    for bad in [
        span(&a, 0, &b, 2 * page - 4, 8),
        span(&theirs, 0, &b, 0, 8),
        span(&a, 0, &theirs, 0, 8),
    ] {
        let resp = copy(&mut c, vec![first, bad]);
        assert_eq!(code(&resp), Some(ErrorCode::NotFound), "{bad:?}: {resp:?}");
    }
    let mut head = [1u8; 8];
    nic.read(5, b.addr, b.rkey, &mut head).unwrap();
    assert_eq!(head, [0; 8], "no span of a refused request was copied");
    // The other client's chunk is untouched, and its own copy is its business.
    let mut theirs_back = vec![0u8; page as usize];
    nic.read(6, theirs.addr, theirs.rkey, &mut theirs_back)
        .unwrap();
    assert!(theirs_back.iter().all(|&x| x == 9));
}

#[test]
fn requests_and_refusals_show_in_the_metrics() {
    use prometheus_client::encoding::text::encode;
    use prometheus_client::registry::Registry;
    let s = Arc::new(service(Some(TOKEN)));
    let mut bad = conn(1);
    assert_eq!(
        code(&hello(&s, &mut bad, 7, b"wrong").0),
        Some(ErrorCode::AuthFailed)
    );
    let mut c = conn(2);
    hello(&s, &mut c, 8, TOKEN);
    ask(&s, &mut c, &Request::Stat);
    let page = system_page_size();
    assert!(code(&ask(&s, &mut c, &Request::Alloc { bytes: page }).0).is_none());
    let too_much = Request::Alloc { bytes: 1 << 40 };
    assert_eq!(
        code(&ask(&s, &mut c, &too_much).0),
        Some(ErrorCode::NoSpace)
    );
    // A frame of another protocol version.
    send_raw(&s, &mut conn(3), b"\x01garbage");
    let mut reg = Registry::default();
    reg.register_collector(Box::new(crate::metrics::MemnodeCollector { control: s }));
    let mut out = String::new();
    encode(&mut out, &reg).unwrap();
    for line in [
        format!("memnode_capacity_bytes {}", 16 * page),
        format!("memnode_used_bytes {page}"),
        "memnode_chunks 1".to_string(),
        "memnode_clients 1".to_string(),
        "memnode_connections 1".to_string(),
        "memnode_volumes 0".to_string(),
        "memnode_control_requests_total{request=\"hello\"} 2".to_string(),
        "memnode_control_requests_total{request=\"stat\"} 1".to_string(),
        "memnode_control_requests_total{request=\"alloc\"} 2".to_string(),
        "memnode_control_requests_total{request=\"malformed\"} 1".to_string(),
        "memnode_control_refused_total{reason=\"auth_failed\"} 1".to_string(),
        "memnode_control_refused_total{reason=\"no_space\"} 1".to_string(),
        "memnode_control_refused_total{reason=\"version_mismatch\"} 1".to_string(),
    ] {
        assert!(
            out.lines().any(|l| l == line),
            "no line {line:?} in:\n{out}"
        );
    }
}

#[test]
fn a_second_connection_joins_a_session_only_with_its_secret() {
    let s = service_with_grace(Duration::from_secs(60));
    let mut a = conn(1);
    let (first, _, secret) = greet(&s, &mut a, 1, b"", SessionSecret::NONE);
    assert!(!secret.is_none(), "a new session gets a secret");
    assert!(!resumed(&first), "a new session is not a resumed one");
    // Knowing the client id is not enough: no secret, or a wrong one, is refused.
    for wrong in [SessionSecret::NONE, SessionSecret([7; 16])] {
        let mut intruder = conn(2);
        let (resp, close, _) = greet(&s, &mut intruder, 1, b"", wrong);
        assert_eq!(code(&resp), Some(ErrorCode::AuthFailed), "{resp:?}");
        assert!(close, "a refused Hello closes the connection");
        assert_eq!(intruder.client, None);
        let Response::Error { message, .. } = &resp else {
            unreachable!()
        };
        assert!(
            !message.as_bytes().windows(16).any(|w| w == secret.0),
            "the error never shows the secret"
        );
    }
    let mut a2 = conn(3);
    let (resp, _, joined) = greet(&s, &mut a2, 1, b"", secret);
    assert!(resumed(&resp));
    assert_eq!(joined, secret);
}

#[test]
fn an_idle_session_keeps_its_memory_through_the_grace_period_and_resumes() {
    let s = service_with_grace(Duration::from_secs(60));
    let mut a = conn(1);
    let (_, _, secret) = greet(&s, &mut a, 1, b"", SessionSecret::NONE);
    let (resp, _) = ask(&s, &mut a, &Request::Alloc { bytes: 1 });
    let Response::Allocated(chunk) = resp else {
        panic!("alloc: {resp:?}")
    };
    s.disconnected(&a);
    assert_eq!(s.idle_sessions(), 1);
    assert_eq!(
        s.stats().allocations,
        1,
        "the chunk outlives the connection"
    );
    assert_eq!(s.stats().clients, 0, "no client is connected");
    assert_eq!(s.reap_expired(), 0, "the grace period has not run out");
    let mut back = conn(2);
    let resp = join(&s, &mut back, 1, secret);
    assert!(resumed(&resp), "the reconnect resumed the session");
    assert_eq!(s.idle_sessions(), 0);
    assert_eq!(s.counters.sessions_resumed.load(Ordering::Relaxed), 1);
    // Its session lists it (a client whose Alloc reply was lost finds it so).
    let (resp, _) = ask(&s, &mut back, &Request::SessionChunks { after: 0 });
    assert_eq!(
        resp,
        Response::ChunkList {
            chunks: vec![chunk],
            more: false
        }
    );
    // The chunk is still the client's: it frees it.
    let (resp, _) = ask(
        &s,
        &mut back,
        &Request::Free {
            addr: chunk.addr,
            rkey: chunk.rkey,
        },
    );
    assert_eq!(resp, Response::Freed);
}

#[test]
fn a_session_not_resumed_within_its_grace_is_reclaimed_and_a_late_resume_starts_anew() {
    let s = service_with_grace(Duration::from_millis(50));
    let mut a = conn(1);
    let (_, _, first) = greet(&s, &mut a, 1, b"", SessionSecret::NONE);
    ask(&s, &mut a, &Request::Alloc { bytes: 1 });
    s.disconnected(&a);
    std::thread::sleep(Duration::from_millis(80));
    assert_eq!(s.reap_expired(), 1);
    assert_eq!(
        s.stats().allocations,
        0,
        "the expired session's chunk is freed"
    );
    assert_eq!(s.counters.sessions_expired.load(Ordering::Relaxed), 1);
    // The old secret now starts a new, empty session: the client learns its memory
    // is gone from `resumed`.
    let mut late = conn(2);
    let (resp, close, secret) = greet(&s, &mut late, 1, b"", first);
    assert!(!close);
    assert!(!resumed(&resp), "nothing was there to resume");
    assert_ne!(secret, first, "a new session has a new secret");
}

#[test]
fn a_session_that_ended_is_reclaimed_when_its_last_connection_closes() {
    let s = service_with_grace(Duration::from_secs(60));
    let mut a = conn(1);
    hello(&s, &mut a, 1, b"");
    ask(&s, &mut a, &Request::Alloc { bytes: 1 });
    let (resp, _) = ask(&s, &mut a, &Request::SessionEnd);
    assert_eq!(resp, Response::SessionEnding);
    assert_eq!(s.stats().allocations, 1, "ending waits for the connections");
    s.disconnected(&a);
    assert_eq!(s.stats().allocations, 0, "no grace for an ended session");
    assert_eq!(s.idle_sessions(), 0);
}
