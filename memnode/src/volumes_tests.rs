//! Unit tables and a random-operations proptest for [`VolumeTable`].

use super::*;
use proptest::prelude::*;

const LEASE: Duration = Duration::from_secs(10);
const PAGE: u64 = 4096;
/// The tenant of every volume here but where a test says otherwise.
const T: TenantId = 0;

fn ok(t: &VolumeTable) {
    if let Err(e) = t.check_invariants() {
        panic!("volume table invariant broken: {e}");
    }
}

fn holder(client: u64) -> Holder {
    Holder {
        client,
        peer: format!("10.0.0.{client}:4000"),
        since: Instant::now(),
    }
}

/// Everyone was heard from just now.
fn all_live(_: u64) -> Option<Duration> {
    Some(Duration::ZERO)
}

/// Nobody was heard from within the lease.
fn all_stale(_: u64) -> Option<Duration> {
    Some(LEASE + Duration::from_secs(1))
}

fn alloc(addr: u64, len: u64, rkey: u32) -> Allocation {
    Allocation { addr, len, rkey }
}

/// Creates `name` held by `client`, with its root at `root`.
fn create(t: &mut VolumeTable, client: u64, name: &[u8], root: u64) -> u64 {
    let id = match t.plan_open(client, T, name, true, false, LEASE, all_live) {
        Ok(OpenPlan::Create { id }) => id,
        other => panic!("creating {name:?}: expected a Create plan, got {other:?}"),
    };
    t.create(id, T, name, alloc(root, PAGE, root as u32), holder(client))
        .expect("the plan said create");
    ok(t);
    id
}

#[test]
fn a_created_volume_is_held_by_its_creator_with_its_root() {
    let mut t = VolumeTable::new();
    let id = create(&mut t, 7, b"home", 0x10000);
    let v = t.held_by(7).expect("the creator holds it");
    assert_eq!(v.id(), id);
    assert_eq!(
        v.info(true),
        Some(rmemfs_common::protocol::VolumeInfo {
            volume_id: id,
            created: true,
            root: alloc(0x10000, PAGE, 0x10000),
            chunks: 1,
            bytes: PAGE,
        })
    );
    assert_eq!(
        v.summary(),
        VolumeSummary {
            name: b"home".to_vec(),
            volume_id: id,
            bytes: PAGE,
            chunks: 1,
            holder: 7
        }
    );
    assert_eq!(
        v.chunks_after(0, 10),
        (vec![], false),
        "the root is not listed"
    );
    assert_eq!(t.bound(7).map(Volume::id), Ok(id));
    assert_eq!(t.bound(8).map(Volume::id), Err(VolumeError::NotHeld));
}

#[test]
fn opening_plans_follow_the_rules() {
    let mut t = VolumeTable::new();
    assert_eq!(
        t.plan_open(1, T, b"x", false, false, LEASE, all_live),
        Err(VolumeError::NotFound(b"x".to_vec())),
        "a missing volume without create"
    );
    let a = create(&mut t, 1, b"a", 0x1000);
    let b = create(&mut t, 2, b"b", 0x2000);
    assert_ne!(a, b, "ids are unique");
    assert_eq!(
        t.plan_open(1, T, b"a", false, false, LEASE, all_live),
        Ok(OpenPlan::AlreadyHeld),
        "the holder reopening its volume"
    );
    assert_eq!(
        t.plan_open(1, T, b"c", true, false, LEASE, all_live),
        Err(VolumeError::HoldsAnother {
            held: b"a".to_vec(),
            wanted: b"c".to_vec()
        }),
        "a holder opening a second volume"
    );
    match t.plan_open(3, T, b"a", true, false, LEASE, all_live) {
        Err(e @ VolumeError::Busy { .. }) => {
            let msg = e.to_string();
            for want in [
                "client 0x1",
                "10.0.0.1:4000",
                "last heard from 0.0s ago",
                "for ",
            ] {
                assert!(
                    msg.contains(want),
                    "Busy message {msg:?} must name {want:?}"
                );
            }
        }
        other => panic!("a live holder: expected Busy, got {other:?}"),
    }
    match t.plan_open(3, T, b"a", false, true, LEASE, all_live) {
        Ok(OpenPlan::Hold {
            id,
            fence: Some((h, TakeoverReason::Requested)),
        }) => assert_eq!((id, h.client), (a, 1)),
        other => panic!("a takeover: expected Hold fencing client 1, got {other:?}"),
    }
    for (what, heard) in [
        ("stale", all_stale as fn(u64) -> Option<Duration>),
        ("gone", |_| None),
    ] {
        match t.plan_open(3, T, b"a", false, false, LEASE, heard) {
            Ok(OpenPlan::Hold {
                fence: Some((h, TakeoverReason::LeaseExpired)),
                ..
            }) => assert_eq!(h.client, 1),
            other => panic!("a {what} holder: expected Hold fencing it, got {other:?}"),
        }
    }
    t.release(2).expect("client 2 holds b");
    assert_eq!(
        t.plan_open(3, T, b"b", false, false, LEASE, all_live),
        Ok(OpenPlan::Hold { id: b, fence: None }),
        "an unheld volume"
    );
    ok(&t);
}

#[test]
fn fencing_moves_the_volume_and_remembers_the_old_holder() {
    let mut t = VolumeTable::new();
    create(&mut t, 1, b"v", 0x1000);
    assert!(t.add_chunk(1, alloc(0x5000, 4 * PAGE, 55)));
    let (old, rkeys) = t.fence(T, b"v").expect("held");
    assert_eq!(old.client, 1);
    let mut rkeys = rkeys;
    rkeys.sort_unstable();
    assert_eq!(rkeys, vec![55, 0x1000], "every registration is handed back");
    ok(&t);
    assert!(t.is_fenced(1));
    assert_eq!(t.bound(1).map(Volume::id), Err(VolumeError::Fenced));
    assert_eq!(t.check_free(1, 0x5000), Err(VolumeError::Fenced));
    assert!(
        !t.add_chunk(1, alloc(0x9000, PAGE, 9)),
        "fenced adds nothing"
    );
    assert!(t.get(T, b"v").and_then(|v| v.info(false)).is_none());
    assert!(
        t.hold(T, b"v", holder(2), &[(0x1000, 101), (0x5000, 102)]),
        "the new holder takes it"
    );
    ok(&t);
    let v = t.held_by(2).expect("client 2 holds it");
    assert_eq!(v.info(false).map(|i| i.root.rkey), Some(101));
    assert_eq!(
        v.chunks_after(0, 10),
        (vec![alloc(0x5000, 4 * PAGE, 102)], false)
    );
    assert!(t.is_fenced(1), "still fenced until it goes or reopens");
    assert_eq!(t.client_gone(1), None, "a fenced client holds nothing");
    assert!(!t.is_fenced(1), "forgotten once gone");
}

#[test]
fn hold_refuses_what_would_break_the_books() {
    let mut t = VolumeTable::new();
    create(&mut t, 1, b"v", 0x1000);
    t.add_chunk(1, alloc(0x5000, PAGE, 5));
    assert!(
        !t.hold(T, b"v", holder(2), &[(0x1000, 1), (0x5000, 2)]),
        "held"
    );
    t.release(1);
    for (what, rkeys) in [
        ("missing a chunk", vec![(0x1000, 1)]),
        ("a chunk twice", vec![(0x1000, 1), (0x1000, 2)]),
        ("a stranger", vec![(0x1000, 1), (0x6000, 2)]),
        ("an extra", vec![(0x1000, 1), (0x5000, 2), (0x6000, 3)]),
    ] {
        assert!(!t.hold(T, b"v", holder(2), &rkeys), "rkeys {what}");
        ok(&t);
    }
    assert!(!t.hold(T, b"nope", holder(2), &[]), "a missing volume");
    create(&mut t, 3, b"w", 0x8000);
    assert!(
        !t.hold(T, b"v", holder(3), &[(0x1000, 1), (0x5000, 2)]),
        "a client already holding"
    );
    assert!(t.hold(T, b"v", holder(2), &[(0x5000, 2), (0x1000, 1)]));
    ok(&t);
}

#[test]
fn create_refuses_taken_names_ids_and_holders() {
    let mut t = VolumeTable::new();
    let id = create(&mut t, 1, b"v", 0x1000);
    assert!(t
        .create(id + 1, T, b"v", alloc(0x2000, PAGE, 2), holder(2))
        .is_none());
    assert!(t
        .create(id, T, b"w", alloc(0x2000, PAGE, 2), holder(2))
        .is_none());
    assert!(t
        .create(id + 1, T, b"w", alloc(0x2000, PAGE, 2), holder(1))
        .is_none());
    ok(&t);
    assert_eq!(t.summaries().len(), 1);
}

#[test]
fn chunks_come_and_go_but_the_root_stays() {
    let mut t = VolumeTable::new();
    create(&mut t, 1, b"v", 0x1000);
    assert!(t.add_chunk(1, alloc(0x3000, 2 * PAGE, 3)));
    assert!(
        !t.add_chunk(2, alloc(0x9000, PAGE, 9)),
        "client 2 holds nothing"
    );
    assert_eq!(
        t.get(T, b"v").map(|v| (v.bytes(), v.chunk_count())),
        Some((3 * PAGE, 2))
    );
    assert_eq!(t.check_free(1, 0x1000), Err(VolumeError::Root(0x1000)));
    assert_eq!(t.check_free(1, 0x7000), Err(VolumeError::NoChunk(0x7000)));
    assert_eq!(t.check_free(2, 0x3000), Err(VolumeError::NotHeld));
    assert!(t.check_free(1, 0x3000).is_ok());
    assert!(!t.remove_chunk(1, 0x1000), "the root cannot be removed");
    assert!(t.remove_chunk(1, 0x3000));
    assert!(!t.remove_chunk(1, 0x3000), "only once");
    assert_eq!(
        t.get(T, b"v").map(|v| (v.bytes(), v.chunk_count())),
        Some((PAGE, 1))
    );
    ok(&t);
}

#[test]
fn release_keeps_the_chunks_and_forgets_the_registrations() {
    let mut t = VolumeTable::new();
    create(&mut t, 1, b"v", 0x1000);
    t.add_chunk(1, alloc(0x3000, PAGE, 3));
    let (name, mut rkeys) = t.release(1).expect("held");
    rkeys.sort_unstable();
    assert_eq!((name.as_slice(), rkeys), (&b"v"[..], vec![3, 0x1000]));
    ok(&t);
    let v = t.get(T, b"v").expect("still there");
    assert_eq!((v.chunk_count(), v.holder(), v.rkeys()), (2, None, vec![]));
    assert_eq!(v.summary().holder, 0);
    assert_eq!(v.addrs(), vec![0x1000, 0x3000]);
    assert_eq!(t.release(1), None, "nothing more to release");
    assert!(!t.is_fenced(1), "a release is no fence");
}

#[test]
fn chunk_pages_are_in_address_order_and_say_when_more_follow() {
    let mut t = VolumeTable::new();
    create(&mut t, 1, b"v", 0x100_0000);
    // Chunks on both sides of the root.
    let addrs: Vec<u64> = (1..=25)
        .map(|i| i * 0x1_0000)
        .chain((1..=25).map(|i| 0x100_0000 + i * 0x1_0000))
        .collect();
    for (i, &a) in addrs.iter().enumerate() {
        t.add_chunk(1, alloc(a, PAGE, i as u32 + 1));
    }
    let v = t.held_by(1).expect("held");
    let mut after = 0;
    let mut seen = Vec::new();
    loop {
        let (page, more) = v.chunks_after(after, 7);
        assert!(page.len() <= 7);
        seen.extend(page.iter().map(|a| a.addr));
        if !more {
            break;
        }
        after = page
            .last()
            .expect("a page that says more is not empty")
            .addr;
    }
    assert_eq!(seen, addrs, "every chunk but the root, once, in order");
    assert_eq!(
        v.chunks_after(*addrs.last().unwrap_or(&0), 7),
        (vec![], false)
    );
    let (exact, more) = v.chunks_after(0, addrs.len());
    assert_eq!(
        (exact.len(), more),
        (addrs.len(), false),
        "an exact fit has no more"
    );
}

#[test]
fn destroy_plans_follow_the_rules() {
    let mut t = VolumeTable::new();
    let id = create(&mut t, 1, b"v", 0x1000);
    assert_eq!(
        t.plan_destroy(2, T, b"nope", LEASE, all_live),
        Err(VolumeError::NotFound(b"nope".to_vec()))
    );
    assert!(matches!(
        t.plan_destroy(2, T, b"v", LEASE, all_live),
        Err(VolumeError::Busy { client: 1, .. })
    ));
    assert_eq!(
        t.plan_destroy(1, T, b"v", LEASE, all_live),
        Ok(DestroyPlan { id, fence: None }),
        "the holder destroys its own volume"
    );
    match t.plan_destroy(2, T, b"v", LEASE, all_stale) {
        Ok(DestroyPlan { fence: Some(h), .. }) => assert_eq!(h.client, 1),
        other => panic!("a stale holder: expected its fence, got {other:?}"),
    }
    assert!(t.remove(T, b"v").is_none(), "a held volume is not removed");
    t.release(1);
    let v = t.remove(T, b"v").expect("an unheld volume is removed");
    assert_eq!(v.addrs(), vec![0x1000]);
    assert!(t.get(T, b"v").is_none());
    ok(&t);
    let again = create(&mut t, 1, b"v", 0x1000);
    assert!(again > id, "a new volume of the same name gets a new id");
}

#[test]
fn listing_is_in_name_order_after_the_given_name() {
    let mut t = VolumeTable::new();
    for (i, name) in [&b"m"[..], b"a", b"z", b"B", b"a.1"].iter().enumerate() {
        create(&mut t, i as u64 + 1, name, (i as u64 + 1) * 0x1000);
    }
    let names =
        |after: &[u8]| -> Vec<Vec<u8>> { t.after(T, after).map(|v| v.name().to_vec()).collect() };
    assert_eq!(
        names(b""),
        vec![
            b"B".to_vec(),
            b"a".to_vec(),
            b"a.1".to_vec(),
            b"m".to_vec(),
            b"z".to_vec()
        ]
    );
    assert_eq!(
        names(b"a"),
        vec![b"a.1".to_vec(), b"m".to_vec(), b"z".to_vec()]
    );
    assert_eq!(
        names(b"b"),
        vec![b"m".to_vec(), b"z".to_vec()],
        "after a name that does not exist"
    );
    assert!(names(b"z").is_empty());
    assert_eq!(t.summaries().len(), 5);
}

#[test]
fn names_are_per_tenant_and_a_tenant_never_finds_anothers_volume() {
    const B: TenantId = 1;
    let mut t = VolumeTable::new();
    let a = create(&mut t, 1, b"data", 0x1000);
    // Tenant B's client 2 does not see A's "data": it creates its own.
    let b = match t.plan_open(2, B, b"data", true, true, LEASE, all_live) {
        Ok(OpenPlan::Create { id }) => id,
        other => panic!("B opening \"data\": expected a Create plan, got {other:?}"),
    };
    assert!(t
        .create(b, B, b"data", alloc(0x2000, PAGE, 2), holder(2))
        .is_some());
    ok(&t);
    assert_ne!(a, b);
    assert_eq!(
        t.plan_open(3, B, b"only-a", false, true, LEASE, all_stale),
        Err(VolumeError::NotFound(b"only-a".to_vec()))
    );
    create(&mut t, 4, b"only-a", 0x3000);
    t.release(4);
    for (what, r) in [
        (
            "open",
            t.plan_open(3, B, b"only-a", false, false, LEASE, all_stale)
                .map(|_| ()),
        ),
        (
            "takeover",
            t.plan_open(3, B, b"only-a", false, true, LEASE, all_stale)
                .map(|_| ()),
        ),
        (
            "destroy",
            t.plan_destroy(3, B, b"only-a", LEASE, all_stale)
                .map(|_| ()),
        ),
    ] {
        assert_eq!(
            r,
            Err(VolumeError::NotFound(b"only-a".to_vec())),
            "B's {what} of A's volume"
        );
    }
    assert!(t.remove(B, b"only-a").is_none());
    assert!(
        t.fence(B, b"data").is_some_and(|(h, _)| h.client == 2),
        "B's own"
    );
    let list =
        |tenant| -> Vec<Vec<u8>> { t.after(tenant, b"").map(|v| v.name().to_vec()).collect() };
    assert_eq!(list(T), vec![b"data".to_vec(), b"only-a".to_vec()]);
    assert_eq!(list(B), vec![b"data".to_vec()]);
    assert!(list(2).is_empty());
    assert_eq!(t.usage_of(T), (2, 2 * PAGE));
    assert_eq!(t.usage_of(B), (1, PAGE));
    assert_eq!(t.get(B, b"data").map(Volume::tenant), Some(B));
    ok(&t);
}

/// Random sequences of what clients can do, applied the way the control service
/// applies them (fake rkeys, no pool): the books stay consistent throughout.
#[derive(Debug, Clone)]
enum Op {
    Open {
        client: u64,
        name: u8,
        create: bool,
        takeover: bool,
        live: bool,
    },
    Close {
        client: u64,
    },
    Gone {
        client: u64,
    },
    Alloc {
        client: u64,
    },
    Free {
        client: u64,
        pick: usize,
    },
    Destroy {
        client: u64,
        name: u8,
        live: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let client = 1u64..5;
    let name = 0u8..3;
    prop_oneof![
        4 => (client.clone(), name.clone(), any::<bool>(), any::<bool>(), any::<bool>())
            .prop_map(|(client, name, create, takeover, live)| Op::Open { client, name, create, takeover, live }),
        1 => client.clone().prop_map(|client| Op::Close { client }),
        1 => client.clone().prop_map(|client| Op::Gone { client }),
        3 => client.clone().prop_map(|client| Op::Alloc { client }),
        2 => (client.clone(), any::<usize>()).prop_map(|(client, pick)| Op::Free { client, pick }),
        1 => (client, name, any::<bool>()).prop_map(|(client, name, live)| Op::Destroy { client, name, live }),
    ]
}

proptest! {
    #[test]
    fn random_operations_keep_the_books_consistent(ops in proptest::collection::vec(op(), 1..120)) {
        let mut t = VolumeTable::new();
        let mut next = 1u64;
        let mut fresh = || { next += 1; next };
        for op in ops {
            match op {
                Op::Open { client, name, create, takeover, live } => {
                    let name = [b'a' + name];
                    let heard = move |_| Some(if live { Duration::ZERO } else { LEASE * 2 });
                    match t.plan_open(client, T, &name, create, takeover, LEASE, heard) {
                        Ok(OpenPlan::AlreadyHeld) => {
                            prop_assert_eq!(t.held_by(client).map(Volume::name), Some(&name[..]));
                        }
                        Ok(OpenPlan::Create { id }) => {
                            let root = fresh();
                            prop_assert!(t.create(id, T, &name, alloc(root << 12, PAGE, root as u32), holder(client)).is_some());
                        }
                        Ok(OpenPlan::Hold { fence, .. }) => {
                            if let Some((h, _)) = fence {
                                prop_assert!(h.client != client);
                                prop_assert!(t.fence(T, &name).is_some());
                                prop_assert!(t.is_fenced(h.client));
                            }
                            let addrs = t.get(T, &name).map(Volume::addrs).unwrap_or_default();
                            let rkeys: Vec<(u64, u32)> = addrs.into_iter().map(|a| (a, fresh() as u32)).collect();
                            prop_assert!(t.hold(T, &name, holder(client), &rkeys));
                            prop_assert!(!t.is_fenced(client));
                        }
                        Err(VolumeError::Busy { client: c, .. }) => prop_assert!(live && !takeover && c != client),
                        Err(_) => {}
                    }
                }
                Op::Close { client } => {
                    let before = t.held_by(client).map(|v| (v.name().to_vec(), v.chunk_count()));
                    let released = t.release(client);
                    prop_assert_eq!(released.is_some(), before.is_some());
                    if let Some((name, n)) = before {
                        prop_assert_eq!(t.get(T, &name).map(Volume::chunk_count), Some(n), "a close keeps every chunk");
                    }
                }
                Op::Gone { client } => {
                    t.client_gone(client);
                    prop_assert!(!t.is_fenced(client) && t.held_by(client).is_none());
                }
                Op::Alloc { client } => {
                    let a = fresh();
                    let holds = t.held_by(client).is_some();
                    prop_assert_eq!(t.bound(client).is_ok(), holds);
                    prop_assert_eq!(t.add_chunk(client, alloc(a << 12, PAGE, a as u32)), holds);
                }
                Op::Free { client, pick } => {
                    if let Ok(v) = t.bound(client) {
                        let addrs = v.addrs();
                        let addr = addrs[pick % addrs.len()];
                        let root = v.is_root(addr);
                        prop_assert_eq!(t.check_free(client, addr).is_ok(), !root);
                        prop_assert_eq!(t.remove_chunk(client, addr), !root);
                    }
                }
                Op::Destroy { client, name, live } => {
                    let name = [b'a' + name];
                    let heard = move |_| Some(if live { Duration::ZERO } else { LEASE * 2 });
                    if let Ok(plan) = t.plan_destroy(client, T, &name, LEASE, heard) {
                        if plan.fence.is_some() {
                            t.fence(T, &name);
                        } else if t.get(T, &name).and_then(Volume::holder).is_some() {
                            let holder = t.get(T, &name).and_then(Volume::holder).map(|h| h.client);
                            prop_assert_eq!(holder, Some(client));
                            t.release(client);
                        }
                        prop_assert!(t.remove(T, &name).is_some());
                    }
                }
            }
            if let Err(e) = t.check_invariants() {
                return Err(TestCaseError::fail(e));
            }
        }
    }
}
