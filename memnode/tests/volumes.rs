//! Volumes on a real memnode over the real tcp fabric, as fsd uses them: data that
//! outlives its client, moves to the next client with fresh rkeys, and is fenced
//! away from a holder that was taken over.

mod support;

use rmemfs_common::control::{self, ControlError};
use rmemfs_common::fabric::Endpoint;
use rmemfs_common::protocol::{ErrorCode, ProtocolError, MAX_CHUNKS_PER_REPLY};
use std::time::Duration;
use support::*;

const MIB: u64 = 1 << 20;

#[test]
fn a_volume_outlives_its_client_and_moves_between_clients_with_fencing() {
    let node = start(16 * MIB);
    let used_before = node.stats().used;

    // A creates the volume, fills a chunk and the root, and goes away.
    let a = client(&node, 0xa);
    let info_a = control::volume_open(&a, "home", true, false).expect("A creates the volume");
    assert!(info_a.created, "a new volume says so");
    assert_eq!((info_a.chunks, info_a.bytes), (1, info_a.root.len));
    let chunk = alloc(&a, MIB);
    let data = pattern(5, 64 << 10);
    write_at(&a, remote(&chunk, 100), &data).expect("A writes its chunk");
    write_at(&a, remote(&info_a.root, 0), b"superblock").expect("A writes the root");
    let used_with_volume = node.stats().used;
    assert_eq!(used_with_volume, used_before + MIB + info_a.root.len);
    drop(a);
    wait_until("A's disconnect releases the volume", || {
        node.volumes().first().is_some_and(|v| v.holder == 0)
    });
    assert_eq!(
        node.stats().used,
        used_with_volume,
        "a disconnect frees nothing of a volume"
    );

    // B opens it (no takeover: nobody holds it) and finds everything.
    let b = client(&node, 0xb);
    let info_b = control::volume_open(&b, "home", false, false).expect("B opens the volume");
    assert!(!info_b.created);
    assert_eq!(
        (info_b.volume_id, info_b.chunks, info_b.bytes),
        (info_a.volume_id, 2, MIB + info_a.root.len)
    );
    assert_eq!(info_b.root.addr, info_a.root.addr);
    assert_ne!(info_b.root.rkey, info_a.root.rkey, "a fresh rkey for B");
    let chunks_b = control::volume_chunks(&b).expect("B lists the chunks");
    assert_eq!(chunks_b.len(), 1, "the root is not listed");
    assert_eq!((chunks_b[0].addr, chunks_b[0].len), (chunk.addr, chunk.len));
    assert_eq!(
        read_at(&b, remote(&chunks_b[0], 100), data.len()).expect("B reads"),
        data,
        "B reads what A wrote"
    );
    assert_eq!(
        read_at(&b, remote(&info_b.root, 0), 10).expect("B reads the root"),
        b"superblock"
    );

    // A's old rkeys are dead, for B and for A back again.
    let r = read_at(&b, remote(&chunk, 0), 8);
    assert!(is_remote_access(&r), "A's old rkey through B: {r:?}");
    let a_again = client(&node, 0xa);
    for (what, old) in [("chunk", &chunk), ("root", &info_a.root)] {
        let r = read_at(&a_again, remote(old, 0), 8);
        assert!(is_remote_access(&r), "A's old {what} rkey: {r:?}");
    }
    drop(a_again);

    // C is refused while B is live, and told who holds it.
    let c = client(&node, 0xc);
    match control::volume_open(&c, "home", false, false) {
        Err(e) if e.is_busy() => {
            let msg = e.to_string();
            assert!(msg.contains("0xb"), "Busy must name B: {msg}");
        }
        other => panic!("C's open of B's live volume: expected Busy, got {other:?}"),
    }

    // C takes over: B is fenced.
    let info_c = control::volume_open(&c, "home", false, true).expect("C takes the volume over");
    assert_eq!(info_c.volume_id, info_a.volume_id);
    let w = write_at(&b, remote(&chunks_b[0], 0), b"stale");
    assert!(is_remote_access(&w), "B's WRITE after the takeover: {w:?}");
    match control::alloc(&b, 1) {
        Err(e) if e.is_fenced() => {}
        other => panic!("B's Alloc after the takeover: expected Fenced, got {other:?}"),
    }
    match control::volume_chunks(&b) {
        Err(e) if e.is_fenced() => {}
        other => panic!("B's VolumeChunks after the takeover: expected Fenced, got {other:?}"),
    }
    let chunks_c = control::volume_chunks(&c).expect("C lists the chunks");
    assert_eq!(
        read_at(&c, remote(&chunks_c[0], 100), data.len()).expect("C reads"),
        data,
        "B's refused WRITE changed nothing"
    );
    let list = control::volume_list(&c).expect("lists volumes");
    assert_eq!(list.len(), 1);
    assert_eq!(
        (list[0].name.as_slice(), list[0].holder),
        (&b"home"[..], 0xc)
    );

    // Destroy gives everything back.
    let freed = control::volume_destroy(&c, "home").expect("C destroys its volume");
    assert_eq!(freed, used_with_volume - used_before);
    assert_eq!(node.stats().used, used_before);
    assert!(node.volumes().is_empty());
    match control::volume_open(&c, "home", false, false) {
        Err(e) if e.is_not_found() => {}
        other => panic!("an open of a destroyed volume: expected NotFound, got {other:?}"),
    }
}

#[test]
fn a_holder_that_stops_talking_loses_its_volume_when_the_lease_runs_out() {
    let lease = Duration::from_millis(300);
    let node = start_with_lease(16 * MIB, lease);
    let a = client(&node, 1);
    control::volume_open(&a, "v", true, false).expect("creates");
    let x = alloc(&a, MIB);
    write_at(&a, remote(&x, 0), b"kept").expect("writes");
    let b = client(&node, 2);
    std::thread::sleep(lease * 2);
    assert!(a.is_connected(), "A is connected, only silent");
    control::volume_open(&b, "v", false, false).expect("B gets it once A's lease expired");
    let r = read_at(&a, remote(&x, 0), 4);
    assert!(
        is_remote_access(&r),
        "A's READ after losing the lease: {r:?}"
    );
    match control::free(&a, x.addr, x.rkey) {
        Err(e) if e.is_fenced() => {}
        other => panic!("A's Free after losing the lease: expected Fenced, got {other:?}"),
    }
    let chunks = control::volume_chunks(&b).expect("lists");
    assert_eq!(
        read_at(&b, remote(&chunks[0], 0), 4).expect("reads"),
        b"kept"
    );
}

#[test]
fn listing_and_chunk_paging_work_over_the_wire() {
    let node = start(16 * MIB);
    let names: Vec<String> = (0..60)
        .map(|i| format!("vol-{i:02}.{}", "n".repeat(50)))
        .collect();
    for (i, name) in names.iter().enumerate() {
        let ep = client(&node, 100 + i as u64);
        control::volume_open(&ep, name, true, false).expect("creates");
    }
    let holder = client(&node, 1);
    control::volume_open(&holder, "big", true, false).expect("creates");
    let mut made: Vec<u64> = (0..MAX_CHUNKS_PER_REPLY * 2 + 3)
        .map(|_| alloc(&holder, 4096).addr)
        .collect();
    made.sort_unstable();
    let listed: Vec<u64> = control::volume_chunks(&holder)
        .expect("pages through the chunks")
        .iter()
        .map(|c| c.addr)
        .collect();
    assert_eq!(listed, made, "every chunk once, in address order");
    let mut want: Vec<Vec<u8>> = names.iter().map(|n| n.clone().into_bytes()).collect();
    want.push(b"big".to_vec());
    want.sort();
    let got: Vec<Vec<u8>> = control::volume_list(&holder)
        .expect("pages through the volumes")
        .into_iter()
        .map(|v| v.name)
        .collect();
    assert_eq!(got, want, "every volume once, in name order");
    assert_eq!(node.volumes().len(), 61);
}

#[test]
fn bad_volume_names_are_refused_before_sending() {
    let node = start(MIB);
    let ep = client(&node, 1);
    for bad in ["", ".", "..", "a/b", "a b", &"x".repeat(65), "é"] {
        match control::volume_open(&ep, bad, true, false) {
            Err(ControlError::Protocol(ProtocolError::BadField("volume name"))) => {}
            other => panic!("open of {bad:?}: expected a bad name, got {other:?}"),
        }
        match control::volume_destroy(&ep, bad) {
            Err(ControlError::Protocol(ProtocolError::BadField("volume name"))) => {}
            other => panic!("destroy of {bad:?}: expected a bad name, got {other:?}"),
        }
    }
    assert!(ep.is_connected(), "nothing was sent");
    match control::volume_close(&ep) {
        Err(ControlError::Refused {
            code: ErrorCode::BadRequest,
            ..
        }) => {}
        other => panic!("close without a volume: expected BadRequest, got {other:?}"),
    }
    assert!(node.volumes().is_empty());
}
