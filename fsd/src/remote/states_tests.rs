//! A memnode's states as fsd sees it: up; unreachable (a broken connection or no
//! answer), with its copies kept and its session resumed when the same instance
//! answers again; lost (a new instance answered, or it stayed away past the dead
//! time). In-process memnodes over tcp, with faults injected into fsd's side of the
//! connections.

use super::*;
use crate::remote::{Connector, RemoteConfig, RemoteError};
use rmemfs_common::fabric::fault::{Faults, FaultyEndpoint};
use rmemfs_common::fabric::tcp::TcpEndpoint;
use rmemfs_common::fabric::Endpoint;
use std::sync::Arc;

const BS: u64 = 4096;
const LIMIT: Duration = Duration::from_secs(20);

fn start_node(listen: &str) -> memnode::Memnode {
    memnode::Memnode::start(memnode::MemnodeConfig {
        listen: listen.into(),
        size: 64 * 16 * BS,
        token: None,
        tenants: None,
        huge_pages: false,
        transport: rmemfs_common::fabric::Transport::Tcp,
        poll: Duration::ZERO,
        lease: memnode::DEFAULT_LEASE,
        session_grace: Duration::from_secs(60),
        memory_file: None,
        connections: rmemfs_common::fabric::ConnectionLimits::default(),
    })
    .expect("memnode starts")
}

/// A store on the memnode at `addr` whose connections fail as `faults` say.
fn store_on(
    addr: &str,
    faults: &Arc<Faults>,
    dead_time: Duration,
    unreachable_timeout: Option<Duration>,
) -> RemoteStore {
    let faults = faults.clone();
    let connect: Arc<Connector> = Arc::new(move |peer: &str, _client: u64| {
        let tcp = TcpEndpoint::connect(peer, Duration::from_secs(2))?;
        Ok(Box::new(FaultyEndpoint::new(Box::new(tcp), faults.clone())) as Box<dyn Endpoint>)
    });
    RemoteStore::connect(
        &[addr.to_string()],
        &RemoteConfig {
            block_size: BS,
            chunk_size: 16 * BS,
            connections: 2,
            client_id: 77,
            token: Vec::new(),
            replicas: 1,
            watch_interval: Duration::from_millis(100),
            dead_time,
            unreachable_timeout,
            volume: None,
        },
        connect,
    )
    .expect("connects")
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {LIMIT:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A block written with `byte`.
fn written_block(r: &RemoteStore, byte: u8) -> BlockLoc {
    let loc = r.alloc_block(BS).expect("a block");
    let data = vec![byte; BS as usize];
    let out = r.write_copies(&[(&loc, 0, &data[..])]);
    assert!(out[0].iter().all(Result::is_ok), "{out:?}");
    loc
}

fn read_block(r: &RemoteStore, loc: &BlockLoc) -> Result<Vec<u8>, RemoteError> {
    let mut buf = vec![0u8; BS as usize];
    r.read_blocks(&mut [(loc, 0, &mut buf[..], &[])])
        .remove(0)
        .map(|()| buf)
}

#[test]
fn a_broken_connection_is_unreachable_and_the_same_instance_resumes_with_every_copy() {
    let node = start_node("127.0.0.1:0");
    let faults = Arc::new(Faults::default());
    let r = store_on(
        &node.local_addr().to_string(),
        &faults,
        Duration::from_secs(600),
        Some(Duration::from_millis(300)),
    );
    let loc = written_block(&r, 0x5a);
    let copy = loc.replicas()[0];
    let used = node.stats().used;
    // Every call and read now fails as a broken connection does: the node is
    // unreachable (the heartbeat finds it so) and a reconnect cannot say hello.
    faults.fail_calls.store(true, Ordering::SeqCst);
    faults.fail_reads.store(true, Ordering::SeqCst);
    wait_until("the node unreachable", || !r.node_is_up(0));
    assert!(matches!(
        r.node_state(0),
        Some(NodeState::Unreachable { .. })
    ));
    assert!(r.has_copy(&copy), "an unreachable node's copy still counts");
    assert!(!r.holds(&copy), "but it cannot be read now");
    // A read with no other copy waits (here a soft mount's 300 ms), then fails.
    let started = Instant::now();
    let e = read_block(&r, &loc).expect_err("no copy in reach");
    assert!(matches!(e, RemoteError::NodeDown { .. }), "{e:?}");
    assert!(started.elapsed() >= Duration::from_millis(250), "it waited");
    // The network heals: the same instance resumes the session, copies and all.
    faults.fail_calls.store(false, Ordering::SeqCst);
    faults.fail_reads.store(false, Ordering::SeqCst);
    wait_until("the node back up", || r.node_is_up(0));
    assert!(
        r.holds(&copy),
        "the copy is in reach again, in the same epoch"
    );
    assert_eq!(read_block(&r, &loc).expect("read"), vec![0x5a; BS as usize]);
    assert_eq!(
        r.node_events(0),
        Some((1, 1, 0)),
        "unreachable, resumed, lost"
    );
    assert_eq!(node.stats().used, used, "the memnode kept the memory");
    assert_eq!(node.idle_sessions(), 0, "the session is live again");
}

#[test]
fn a_write_cut_off_by_a_broken_connection_is_sent_again_once_the_node_is_back() {
    let node = start_node("127.0.0.1:0");
    let faults = Arc::new(Faults::default());
    let r = Arc::new(store_on(
        &node.local_addr().to_string(),
        &faults,
        Duration::from_secs(600),
        None,
    ));
    let loc = written_block(&r, 1);
    faults.fail_writes.store(true, Ordering::SeqCst);
    let writer = {
        let (r, loc) = (r.clone(), loc.clone());
        std::thread::spawn(move || {
            let data = vec![2u8; BS as usize];
            r.write_copies(&[(&loc, 0, &data[..])]).remove(0)
        })
    };
    std::thread::sleep(Duration::from_millis(400));
    assert!(
        !writer.is_finished(),
        "with no other copy, the write waits for the memnode (a hard mount)"
    );
    faults.fail_writes.store(false, Ordering::SeqCst);
    let out = writer.join().expect("writer");
    assert!(out.iter().all(Result::is_ok), "{out:?}");
    assert_eq!(read_block(&r, &loc).expect("read"), vec![2u8; BS as usize]);
    assert!(r.counters.ops_retried.load(Ordering::Relaxed) > 0);
    assert_eq!(r.node_events(0).map(|e| e.2), Some(0), "nothing lost");
}

#[test]
fn a_new_instance_at_the_same_address_loses_the_copies_once() {
    let mut first = start_node("127.0.0.1:0");
    let addr = first.local_addr().to_string();
    let faults = Arc::new(Faults::default());
    let r = store_on(&addr, &faults, Duration::from_secs(600), None);
    let loc = written_block(&r, 3);
    let copy = loc.replicas()[0];
    first.shutdown();
    drop(first);
    wait_until("the node unreachable", || !r.node_is_up(0));
    assert!(r.has_copy(&copy), "unreachable is not lost");
    let _second = start_node(&addr);
    wait_until("the new instance connected", || r.node_is_up(0));
    assert!(
        !r.has_copy(&copy),
        "a new instance holds none of the old copies"
    );
    assert!(matches!(read_block(&r, &loc), Err(RemoteError::Lost)));
    assert_eq!(r.node_events(0).map(|e| (e.1, e.2)), Some((0, 1)));
    // The node is used for new copies.
    let again = written_block(&r, 4);
    assert_eq!(
        read_block(&r, &again).expect("read"),
        vec![4u8; BS as usize]
    );
}

#[test]
fn a_node_unreachable_past_the_dead_time_is_lost() {
    let node = start_node("127.0.0.1:0");
    let faults = Arc::new(Faults::default());
    let r = store_on(
        &node.local_addr().to_string(),
        &faults,
        Duration::from_millis(300),
        None,
    );
    let loc = written_block(&r, 5);
    faults.fail_calls.store(true, Ordering::SeqCst);
    wait_until("the node lost", || {
        matches!(r.node_state(0), Some(NodeState::Down { .. }))
    });
    assert!(!r.has_copy(&loc.replicas()[0]));
    assert_eq!(r.node_events(0).map(|e| e.2), Some(1));
    // A read of a lost copy fails at once: nothing is left to wait for.
    assert!(matches!(read_block(&r, &loc), Err(RemoteError::Lost)));
    // When it answers again, it is a fresh session (the old one is given up on).
    faults.fail_calls.store(false, Ordering::SeqCst);
    wait_until("the node back", || r.node_is_up(0));
    assert_eq!(r.node_events(0).map(|e| (e.1, e.2)), Some((0, 1)));
}

#[test]
fn an_operator_may_declare_an_unreachable_node_lost_but_not_an_up_one() {
    let node = start_node("127.0.0.1:0");
    let faults = Arc::new(Faults::default());
    let r = store_on(
        &node.local_addr().to_string(),
        &faults,
        Duration::from_secs(600),
        None,
    );
    let loc = written_block(&r, 6);
    assert!(!r.declare_lost(0), "an up node is not declared lost");
    faults.fail_calls.store(true, Ordering::SeqCst);
    wait_until("the node unreachable", || !r.node_is_up(0));
    assert!(r.declare_lost(0));
    assert!(!r.has_copy(&loc.replicas()[0]));
    assert!(matches!(r.node_state(0), Some(NodeState::Down { .. })));
}
