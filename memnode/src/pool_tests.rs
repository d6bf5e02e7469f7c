//! The pool against the tcp backend's registry, which plays the NIC: what the owner
//! reads and writes goes through the same checks a connection's READ and WRITE do.

use super::*;
use crate::region::system_page_size;
use rmemfs_common::fabric::tcp::TcpRegistry;
use rmemfs_common::fabric::AccessError;

fn pool(pages: u64) -> (ChunkPool, Arc<TcpRegistry>) {
    let region = Arc::new(Region::reserve(pages * system_page_size(), false).expect("reserve"));
    let registry = Arc::new(TcpRegistry::new());
    (ChunkPool::new(region, registry.clone()), registry)
}

#[test]
fn a_freed_chunk_reads_as_zero_for_its_next_owner() {
    let (p, nic) = pool(4);
    let cap = p.capacity();
    let a = p.alloc(1, cap).expect("whole region");
    nic.write(1, a.addr, a.rkey, &vec![0xab; cap as usize])
        .expect("owner writes");
    p.free(1, a.addr, a.rkey).expect("owner frees");
    let b = p.alloc(2, cap).expect("whole region again");
    assert_eq!(b.addr, a.addr, "the same memory must be handed out again");
    let mut back = vec![0xffu8; cap as usize];
    nic.read(2, b.addr, b.rkey, &mut back)
        .expect("new owner reads");
    assert!(
        back.iter().all(|&x| x == 0),
        "memory of a freed chunk must read as zero"
    );
}

#[test]
fn a_freed_rkey_no_longer_grants_access() {
    let (p, nic) = pool(4);
    let a = p.alloc(1, 1).expect("fits");
    p.free(1, a.addr, a.rkey).expect("frees");
    assert_eq!(
        nic.read(1, a.addr, a.rkey, &mut [0u8; 4]),
        Err(AccessError::UnknownKey)
    );
    assert_eq!(
        p.free(1, a.addr, a.rkey),
        Err(PoolError::NotFound {
            addr: a.addr,
            rkey: a.rkey
        }),
        "a second free must be NotFound"
    );
    assert!(nic.is_empty(), "nothing stays registered");
}

#[test]
fn only_the_owners_exact_chunk_can_be_freed() {
    let (p, nic) = pool(4);
    let a = p.alloc(1, 1).expect("fits");
    let cases = [
        ("another owner", 2, a.addr, a.rkey),
        ("another rkey", 1, a.addr, a.rkey ^ 1),
        ("an address inside", 1, a.addr + 8, a.rkey),
    ];
    for (what, owner, addr, rkey) in cases {
        assert_eq!(
            p.free(owner, addr, rkey),
            Err(PoolError::NotFound { addr, rkey }),
            "free with {what} must be NotFound"
        );
    }
    nic.write(1, a.addr, a.rkey, b"mine")
        .expect("the chunk is still registered");
    assert_eq!(p.usage().chunks, 1);
}

#[test]
fn a_failed_registration_gives_the_chunk_back() {
    let region = Arc::new(Region::reserve(4 * system_page_size(), false).expect("reserve"));
    let p = ChunkPool::new(region, Arc::new(TcpRegistry::with_keys(Box::new(|| None))));
    let got = p.alloc(1, 1);
    assert!(
        matches!(got, Err(PoolError::Register { .. })),
        "expected a registration error, got {got:?}"
    );
    assert_eq!(p.usage().used, 0, "the booking must be given back");
}

#[test]
fn revoking_and_releasing_an_owner_reclaims_only_its_chunks() {
    let (p, nic) = pool(8);
    let page = system_page_size();
    let mine = [
        p.alloc(1, page).expect("fits"),
        p.alloc(1, 2 * page).expect("fits"),
    ];
    let theirs = p.alloc(2, page).expect("fits");
    let revoked = p.revoke_all_of(1);
    assert_eq!(revoked.len(), 2);
    assert_eq!(p.release_revoked(&revoked), 3 * page, "3 pages reclaimed");
    assert_eq!(
        p.usage().used,
        page,
        "only the other owner's page stays used"
    );
    for c in mine {
        assert_eq!(
            nic.read(1, c.addr, c.rkey, &mut [0u8; 1]),
            Err(AccessError::UnknownKey)
        );
    }
    nic.write(2, theirs.addr, theirs.rkey, b"ok")
        .expect("other owner unaffected");
}

#[test]
fn dropping_the_pool_deregisters_every_chunk() {
    let (p, nic) = pool(4);
    p.alloc(1, 1).expect("fits");
    p.alloc(2, 1).expect("fits");
    assert_eq!(nic.len(), 2);
    drop(p);
    assert!(
        nic.is_empty(),
        "no registration may outlive the region's mapping"
    );
}

#[test]
fn frees_racing_with_accesses_never_expose_old_bytes() {
    let (p, nic) = pool(16);
    let p = Arc::new(p);
    let page = system_page_size() as usize;
    std::thread::scope(|s| {
        // Each owner checks a fresh chunk is zero, fills it with its id and frees it,
        // while the others do the same on neighbouring (and reused) memory.
        for owner in 1..=4u64 {
            let (p, nic) = (p.clone(), nic.clone());
            s.spawn(move || {
                for _ in 0..200 {
                    let Ok(c) = p.alloc(owner, page as u64) else {
                        continue;
                    };
                    let mut buf = vec![0xffu8; page];
                    nic.read(owner, c.addr, c.rkey, &mut buf)
                        .expect("owner reads");
                    assert!(buf.iter().all(|&b| b == 0), "fresh chunk must be zero");
                    nic.write(owner, c.addr, c.rkey, &vec![owner as u8; page])
                        .expect("owner writes");
                    p.free(owner, c.addr, c.rkey).expect("owner frees");
                }
            });
        }
    });
    assert_eq!(p.usage().used, 0);
    assert!(nic.is_empty());
}

#[test]
fn writes_racing_with_their_chunks_free_never_reach_the_next_owner() {
    let (p, nic) = pool(1);
    let page = system_page_size();
    for round in 0..50 {
        let c = p.alloc(1, page).expect("the only page");
        std::thread::scope(|s| {
            // Writes until the free's deregistration refuses them.
            s.spawn(|| {
                while nic
                    .write(1, c.addr, c.rkey, &vec![0xee; page as usize])
                    .is_ok()
                {}
            });
            p.free(1, c.addr, c.rkey).expect("owner frees");
        });
        let d = p.alloc(2, page).expect("the only page again");
        let mut back = vec![0xffu8; page as usize];
        nic.read(2, d.addr, d.rkey, &mut back)
            .expect("new owner reads");
        assert!(
            back.iter().all(|&b| b == 0),
            "round {round}: a write racing the free must not survive it"
        );
        p.free(2, d.addr, d.rkey).expect("frees");
    }
}

#[test]
fn a_volume_chunk_survives_revoking_the_client_it_is_registered_for() {
    let (p, nic) = pool(4);
    let v = p.alloc_for(Owner::Volume(1), 7, 1).expect("fits");
    let s = p.alloc(7, 1).expect("fits");
    assert!(
        p.has_scratch(7) && !p.has_scratch(1),
        "only client 7 has scratch"
    );
    let revoked = p.revoke_all_of(7);
    assert_eq!(revoked, vec![s], "only the scratch chunk is revoked");
    p.release_revoked(&revoked);
    assert!(!p.has_scratch(7));
    nic.write(7, v.addr, v.rkey, b"kept")
        .expect("the volume chunk is still registered for its holder");
    assert_eq!(p.usage().chunks, 1);
}

#[test]
fn a_deregistered_volume_chunk_stays_booked_and_registers_again_with_a_new_rkey() {
    let (p, nic) = pool(4);
    let v = p.alloc_for(Owner::Volume(1), 7, 1).expect("fits");
    nic.write(7, v.addr, v.rkey, b"data")
        .expect("holder writes");
    assert_eq!(p.deregister(v.rkey), Some(v));
    assert_eq!(p.deregister(v.rkey), None, "only once");
    assert_eq!(
        nic.read(7, v.addr, v.rkey, &mut [0u8; 4]),
        Err(AccessError::UnknownKey)
    );
    assert_eq!(p.usage().chunks, 1, "still booked");
    let again = p.register(Owner::Volume(1), 8, v.addr).expect("registers");
    assert_ne!(again.rkey, v.rkey, "a fresh rkey");
    assert_eq!((again.client, again.owner), (8, Owner::Volume(1)));
    let mut back = [0u8; 4];
    nic.read(8, again.addr, again.rkey, &mut back)
        .expect("the new holder reads");
    assert_eq!(&back, b"data", "the bytes stayed");
    assert_eq!(
        nic.read(7, again.addr, again.rkey, &mut back),
        Err(AccessError::NotOwner),
        "the old holder cannot use the new rkey"
    );
}

#[test]
fn register_needs_the_owners_booking() {
    let (p, _) = pool(4);
    let v = p.alloc_for(Owner::Volume(1), 7, 1).expect("fits");
    let s = p.alloc(7, 1).expect("fits");
    for (what, owner, addr) in [
        ("another volume", Owner::Volume(2), v.addr),
        ("a client of the same number", Owner::Client(1), v.addr),
        ("a scratch chunk as a volume's", Owner::Volume(7), s.addr),
        ("an address inside", Owner::Volume(1), v.addr + 8),
        ("a free address", Owner::Volume(1), s.addr + s.len),
    ] {
        assert_eq!(
            p.register(owner, 9, addr),
            Err(PoolError::NotBooked { owner, addr }),
            "register of {what}"
        );
    }
}

#[test]
fn volume_chunks_are_freed_only_as_the_volumes_by_its_holder() {
    let (p, nic) = pool(4);
    let v = p.alloc_for(Owner::Volume(1), 7, 1).expect("fits");
    for (what, owner, client) in [
        ("the holder's scratch", Owner::Client(7), 7),
        ("another client", Owner::Volume(1), 8),
        ("another volume", Owner::Volume(2), 7),
    ] {
        assert_eq!(
            p.free_as(owner, client, v.addr, v.rkey),
            Err(PoolError::NotFound {
                addr: v.addr,
                rkey: v.rkey
            }),
            "free as {what}"
        );
    }
    assert!(p.free(7, v.addr, v.rkey).is_err(), "a scratch free");
    nic.write(7, v.addr, v.rkey, b"x").expect("still there");
    p.free_as(Owner::Volume(1), 7, v.addr, v.rkey)
        .expect("the holder frees it");
    assert_eq!(p.usage().used, 0);
}

#[test]
fn releasing_unregistered_chunks_zeroes_them_and_leaves_registered_ones() {
    let (p, nic) = pool(4);
    let page = system_page_size();
    let a = p.alloc_for(Owner::Volume(1), 7, page).expect("fits");
    let b = p.alloc_for(Owner::Volume(1), 7, page).expect("fits");
    let other = p.alloc_for(Owner::Volume(2), 7, page).expect("fits");
    nic.write(7, a.addr, a.rkey, &vec![0xaa; page as usize])
        .expect("writes");
    p.deregister(a.rkey).expect("registered");
    // b is still registered and `other` is another volume's: both are left alone.
    assert_eq!(
        p.release_unregistered(Owner::Volume(1), &[a.addr, b.addr, other.addr]),
        page
    );
    assert_eq!(p.usage().chunks, 2);
    nic.write(7, b.addr, b.rkey, b"b").expect("b untouched");
    let c = p.alloc(9, page).expect("the freed page");
    assert_eq!(c.addr, a.addr);
    let mut back = vec![0xffu8; page as usize];
    nic.read(9, c.addr, c.rkey, &mut back).expect("reads");
    assert!(
        back.iter().all(|&x| x == 0),
        "a destroyed volume's chunk reads as zero"
    );
}

/// The copy of `client` from `a` to `b`, whole.
fn whole(a: &Chunk, b: &Chunk) -> CopySpan {
    CopySpan {
        src_addr: a.addr,
        src_rkey: a.rkey,
        dst_addr: b.addr,
        dst_rkey: b.rkey,
        len: a.len.min(b.len) as u32,
    }
}

#[test]
fn a_copy_in_flight_holds_no_lock_and_its_chunks_wait_for_it_to_end() {
    let (p, nic) = pool(8);
    let p = Arc::new(p);
    let page = system_page_size();
    let (a, b) = (p.alloc(1, page).unwrap(), p.alloc(1, page).unwrap());
    nic.write(1, a.addr, a.rkey, &vec![7u8; page as usize])
        .unwrap();
    // What a copy in flight holds once its spans are checked: its rkeys pinned.
    *lock(&p.pins).entry(b.rkey).or_default() += 1;
    // Another client's allocations and frees go on meanwhile (no lock is held).
    let other = p.alloc(2, page).expect("allocates during the copy");
    p.free(2, other.addr, other.rkey)
        .expect("frees during the copy");
    assert_eq!(
        p.copy(1, &[whole(&a, &b)]),
        Ok(page),
        "another copy of the same chunks"
    );
    // Freeing the pinned chunk waits for the copy to end: it must never be zeroed
    // and handed out while the copy still writes it.
    let (tx, rx) = std::sync::mpsc::channel();
    let freeing = {
        let p = p.clone();
        std::thread::spawn(move || {
            let r = p.free(1, b.addr, b.rkey);
            let _ = tx.send(());
            r
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(
        rx.try_recv().is_err(),
        "the free went ahead under a copy in flight"
    );
    assert_eq!(
        p.copy(1, &[whole(&a, &b)]),
        Err(PoolError::Access {
            addr: b.addr,
            len: page,
            rkey: b.rkey
        }),
        "a chunk being freed takes no new copy"
    );
    p.unpin(&[b.rkey]);
    freeing
        .join()
        .expect("the free returns")
        .expect("and frees the chunk");
    assert!(lock(&p.pins).is_empty(), "every pin was let go");
}

#[test]
fn a_refused_copy_pins_nothing() {
    let (p, _nic) = pool(4);
    let page = system_page_size();
    let (a, b) = (p.alloc(1, page).unwrap(), p.alloc(2, page).unwrap());
    assert!(p.copy(1, &[whole(&a, &b)]).is_err(), "b is not client 1's");
    assert!(lock(&p.pins).is_empty());
    p.free(1, a.addr, a.rkey).expect("frees at once");
}
