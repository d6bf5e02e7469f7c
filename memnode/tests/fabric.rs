//! A real memnode over the real tcp fabric: the data path, its access checks, and the
//! control path's allocation rules, as a client (fsd) sees them.

mod support;

use rmemfs_common::control::{self, ControlError};
use rmemfs_common::fabric::{Endpoint, RdmaOp, RemoteAddr};
use rmemfs_common::protocol::ErrorCode;
use support::*;

const MIB: u64 = 1 << 20;

#[test]
fn write_then_read_round_trips_byte_exact() {
    let node = start(16 * MIB);
    let ep = client(&node, 1);
    let a = alloc(&ep, 4 * MIB);
    let big = pattern(3, (4 * MIB) as usize);
    write_at(&ep, remote(&a, 0), &big).expect("a whole-chunk WRITE succeeds");
    assert_eq!(
        read_at(&ep, remote(&a, 0), big.len()).expect("READ"),
        big,
        "whole chunk"
    );
    let small = pattern(9, 1000);
    write_at(&ep, remote(&a, 12_345), &small).expect("an unaligned WRITE succeeds");
    assert_eq!(
        read_at(&ep, remote(&a, 12_345), 1000).expect("READ"),
        small,
        "an unaligned range must read back byte-exact"
    );
    assert_eq!(
        read_at(&ep, remote(&a, 12_345 + 1000), 16).expect("READ"),
        big[12_345 + 1000..12_345 + 1016],
        "bytes after the unaligned write must be unchanged"
    );
}

#[test]
fn a_batch_of_64_outstanding_ops_completes() {
    let node = start(16 * MIB);
    let ep = client(&node, 1);
    let a = alloc(&ep, 64 * 4096);
    let blocks: Vec<Vec<u8>> = (0..64).map(|i| pattern(i as u8, 4096)).collect();
    let mut writes: Vec<RdmaOp> = blocks
        .iter()
        .enumerate()
        .map(|(i, b)| RdmaOp::Write {
            local: b,
            remote: remote(&a, i as u64 * 4096),
        })
        .collect();
    let results = ep.execute(&mut writes);
    assert_eq!(results.len(), 64, "one completion per WRITE");
    assert!(
        results.iter().all(Result::is_ok),
        "all 64 WRITEs succeed: {results:?}"
    );
    let mut bufs = vec![vec![0u8; 4096]; 64];
    let mut reads: Vec<RdmaOp> = bufs
        .iter_mut()
        .enumerate()
        .map(|(i, b)| RdmaOp::Read {
            local: b,
            remote: remote(&a, i as u64 * 4096),
        })
        .collect();
    let results = ep.execute(&mut reads);
    assert!(
        results.iter().all(Result::is_ok),
        "all 64 READs succeed: {results:?}"
    );
    drop(reads);
    for (i, (got, want)) in bufs.iter().zip(&blocks).enumerate() {
        assert_eq!(got, want, "block {i} must read back what was written to it");
    }
}

#[test]
fn refused_accesses_fail_with_remote_access_and_leave_neighbours_untouched() {
    let node = start(16 * MIB);
    let owner = client(&node, 1);
    let stranger = client(&node, 2);
    let x = alloc(&owner, 4096);
    let y = alloc(&owner, 4096);
    assert_eq!(
        y.addr,
        x.addr + x.len,
        "first fit must place y right after x"
    );
    let (px, py) = (pattern(1, 4096), pattern(2, 4096));
    write_at(&owner, remote(&x, 0), &px).expect("owner writes x");
    write_at(&owner, remote(&y, 0), &py).expect("owner writes y");
    let x_end = x.addr + x.len;
    let cases: [(
        &str,
        &rmemfs_common::fabric::tcp::TcpEndpoint,
        RemoteAddr,
        usize,
    ); 6] = [
        (
            "a wrong rkey",
            &owner,
            RemoteAddr {
                addr: x.addr,
                rkey: x.rkey ^ 0x5a5a,
            },
            64,
        ),
        (
            "a range past the end",
            &owner,
            RemoteAddr {
                addr: x_end - 10,
                rkey: x.rkey,
            },
            20,
        ),
        (
            "a range starting at the end",
            &owner,
            RemoteAddr {
                addr: x_end,
                rkey: x.rkey,
            },
            1,
        ),
        (
            "a range before the start",
            &owner,
            RemoteAddr {
                addr: x.addr - 8,
                rkey: x.rkey,
            },
            16,
        ),
        (
            "addr + len overflowing",
            &owner,
            RemoteAddr {
                addr: u64::MAX - 5,
                rkey: x.rkey,
            },
            16,
        ),
        ("another client's chunk", &stranger, remote(&x, 0), 64),
    ];
    for (what, ep, at, len) in cases {
        let w = write_at(ep, at, &vec![0xee; len]);
        assert!(
            is_remote_access(&w),
            "WRITE with {what}: expected RemoteAccess, got {w:?}"
        );
        let r = read_at(ep, at, len);
        assert!(
            is_remote_access(&r),
            "READ with {what}: expected RemoteAccess, got {r:?}"
        );
    }
    assert_eq!(
        read_at(&owner, remote(&x, 0), 4096).expect("owner reads x"),
        px,
        "x unchanged"
    );
    assert_eq!(
        read_at(&owner, remote(&y, 0), 4096).expect("owner reads y"),
        py,
        "y unchanged"
    );
    assert!(
        owner.is_connected() && stranger.is_connected(),
        "refusals must not disconnect"
    );
}

#[test]
fn data_ops_and_control_before_hello_are_refused() {
    let node = start(16 * MIB);
    let owner = client(&node, 1);
    let a = alloc(&owner, 4096);
    let anon = connect(&node);
    let w = write_at(&anon, remote(&a, 0), b"sneaky");
    assert!(
        is_remote_access(&w),
        "WRITE before Hello: expected RemoteAccess, got {w:?}"
    );
    let r = read_at(&anon, remote(&a, 0), 6);
    assert!(
        is_remote_access(&r),
        "READ before Hello: expected RemoteAccess, got {r:?}"
    );
    match control::stat(&anon) {
        Err(ControlError::Refused {
            code: ErrorCode::NotAuthenticated,
            ..
        }) => {}
        other => panic!("Stat before Hello: expected NotAuthenticated, got {other:?}"),
    }
    wait_until("the memnode closes the unauthenticated connection", || {
        !anon.is_connected()
    });
    assert_eq!(
        read_at(&owner, remote(&a, 0), 6).expect("owner reads"),
        vec![0; 6]
    );
}

#[test]
fn a_wrong_token_is_refused_and_the_right_one_welcome() {
    let node = start_with_token(16 * MIB, Some(b"let-me-in-with-this-token"));
    let ep = connect(&node);
    match control::hello(&ep, 1, b"guess") {
        Err(ControlError::Refused {
            code: ErrorCode::AuthFailed,
            ..
        }) => {}
        other => panic!("Hello with a wrong token: expected AuthFailed, got {other:?}"),
    }
    let ep = connect(&node);
    let w =
        control::hello(&ep, 1, b"let-me-in-with-this-token").expect("the right token is welcome");
    assert_eq!(w.capacity, 16 * MIB);
}

#[test]
fn memory_handed_to_a_new_owner_after_free_reads_as_zero() {
    let node = start(MIB);
    let a = client(&node, 1);
    let first = alloc(&a, MIB);
    write_at(&a, remote(&first, 0), &vec![0xab; MIB as usize]).expect("write");
    control::free(&a, first.addr, first.rkey).expect("owner frees");
    let b = client(&node, 2);
    let second = alloc(&b, MIB);
    assert_eq!(
        second.addr, first.addr,
        "the whole region must be handed out again"
    );
    let back = read_at(&b, remote(&second, 0), MIB as usize).expect("new owner reads");
    assert!(
        back.iter().all(|&x| x == 0),
        "freed memory must read as zero for its next owner"
    );
}

#[test]
fn memory_reclaimed_from_a_departed_client_reads_as_zero() {
    let node = start(MIB);
    {
        let a = client(&node, 1);
        let c = alloc(&a, MIB);
        write_at(&a, remote(&c, 0), &vec![0xcd; MIB as usize]).expect("write");
    }
    wait_until("the departed client's memory is reclaimed", || {
        node.stats().used == 0
    });
    let b = client(&node, 2);
    let c = alloc(&b, MIB);
    let back = read_at(&b, remote(&c, 0), MIB as usize).expect("new owner reads");
    assert!(
        back.iter().all(|&x| x == 0),
        "reclaimed memory must read as zero"
    );
}

#[test]
fn alloc_beyond_capacity_is_no_space_and_earlier_allocations_stay_intact() {
    let node = start(MIB);
    let ep = client(&node, 1);
    let kept = alloc(&ep, MIB / 2);
    let data = pattern(7, (MIB / 2) as usize);
    write_at(&ep, remote(&kept, 0), &data).expect("write");
    for bytes in [MIB / 2 + 1, MIB, 1 << 40, u64::MAX] {
        match control::alloc(&ep, bytes) {
            Err(e) if e.is_no_space() => {}
            other => panic!("alloc({bytes}) beyond capacity: expected NoSpace, got {other:?}"),
        }
    }
    assert_eq!(
        read_at(&ep, remote(&kept, 0), data.len()).expect("read"),
        data,
        "a refused alloc must not disturb earlier allocations"
    );
    assert_eq!(
        node.stats().used,
        MIB / 2,
        "a refused alloc must not use memory"
    );
    let rest = alloc(&ep, MIB / 2);
    assert_eq!(
        rest.len,
        MIB / 2,
        "the remaining half can still be allocated"
    );
}

#[test]
fn stats_used_rises_on_alloc_and_falls_on_free() {
    let node = start(16 * MIB);
    let ep = client(&node, 1);
    let s0 = control::stat(&ep).expect("stat");
    assert_eq!(
        (s0.capacity, s0.used, s0.clients, s0.allocations),
        (16 * MIB, 0, 1, 0)
    );
    let a = alloc(&ep, MIB);
    let b = alloc(&ep, 3 * MIB);
    let s1 = control::stat(&ep).expect("stat");
    assert_eq!(
        (s1.used, s1.allocations),
        (4 * MIB, 2),
        "used must rise by what was allocated"
    );
    control::free(&ep, a.addr, a.rkey).expect("free");
    assert_eq!(
        control::stat(&ep).expect("stat").used,
        3 * MIB,
        "used must fall on free"
    );
    control::free(&ep, b.addr, b.rkey).expect("free");
    assert_eq!(
        node.stats(),
        control::stat(&ep).expect("stat"),
        "both views agree"
    );
    assert_eq!(node.stats().used, 0);
    match control::free(&ep, b.addr, b.rkey) {
        Err(ControlError::Refused {
            code: ErrorCode::NotFound,
            ..
        }) => {}
        other => panic!("a double free: expected NotFound, got {other:?}"),
    }
}

#[test]
fn a_disconnected_clients_allocations_are_freed_and_others_kept() {
    let node = start(16 * MIB);
    let stayer = client(&node, 2);
    let kept = alloc(&stayer, MIB);
    let leaver_a = client(&node, 1);
    let leaver_b = client(&node, 1);
    for _ in 0..3 {
        alloc(&leaver_a, MIB);
    }
    alloc(&leaver_b, MIB);
    assert_eq!(node.stats().used, 5 * MIB);
    drop(leaver_a);
    assert_eq!(
        node.stats().allocations,
        5,
        "client 1 still has a connection open"
    );
    drop(leaver_b);
    wait_until("client 1's allocations are freed", || {
        let s = node.stats();
        s.used == MIB && s.clients == 1 && s.allocations == 1
    });
    write_at(&stayer, remote(&kept, 0), b"still here").expect("the other client keeps its chunk");
}

#[test]
fn shutdown_disconnects_clients() {
    let mut node = start(16 * MIB);
    let ep = client(&node, 1);
    node.shutdown();
    wait_until("the client sees the connection close", || {
        !ep.is_connected()
    });
    node.shutdown(); // idempotent
}
