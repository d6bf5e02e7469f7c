//! The control service's volume rules, fed frames directly (no sockets).

use super::*;

const LONG: Duration = Duration::from_secs(600);

fn open_req(name: &str, create: bool, takeover: bool) -> Request {
    Request::VolumeOpen {
        name: name.as_bytes().to_vec(),
        create,
        takeover,
    }
}

thread_local! {
    /// The session secret of each (service, client) this test's connections said
    /// Hello as, so a client's later connections join its session.
    static SESSIONS: std::cell::RefCell<HashMap<(usize, u64), SessionSecret>> =
        std::cell::RefCell::new(HashMap::new());
}

/// A connection `conn_id` that said Hello as `client` (in the client's session).
fn client(s: &ControlService, conn_id: u64, client: u64) -> ConnectionState {
    let key = (s as *const ControlService as usize, client);
    let known = SESSIONS.with(|m| m.borrow().get(&key).copied());
    let mut c = conn(conn_id);
    let (_, _, secret) = greet(s, &mut c, client, b"", known.unwrap_or(SessionSecret::NONE));
    SESSIONS.with(|m| m.borrow_mut().insert(key, secret));
    c
}

fn opened(resp: Response) -> VolumeInfo {
    match resp {
        Response::VolumeOpened(info) => info,
        other => panic!("expected VolumeOpened, got {other:?}"),
    }
}

fn open(s: &ControlService, c: &mut ConnectionState, name: &str, create: bool) -> VolumeInfo {
    opened(ask(s, c, &open_req(name, create, false)).0)
}

fn allocated(resp: Response) -> Allocation {
    match resp {
        Response::Allocated(a) => a,
        other => panic!("expected Allocated, got {other:?}"),
    }
}

fn alloc(s: &ControlService, c: &mut ConnectionState, bytes: u64) -> Allocation {
    allocated(ask(s, c, &Request::Alloc { bytes }).0)
}

fn refused(resp: &Response, want: ErrorCode, what: &str) -> String {
    match resp {
        Response::Error { code, message } if *code == want => message.clone(),
        other => panic!("{what}: expected {want:?}, got {other:?}"),
    }
}

/// Every chunk of the held volume, paging as a client does.
fn all_chunks(s: &ControlService, c: &mut ConnectionState) -> (Vec<Allocation>, usize) {
    let (mut all, mut pages, mut after) = (Vec::new(), 0, 0);
    loop {
        let (resp, _) = ask(s, c, &Request::VolumeChunks { after });
        let Response::ChunkList { chunks, more } = resp else {
            panic!("expected ChunkList, got {resp:?}")
        };
        pages += 1;
        assert!(chunks.len() <= MAX_CHUNKS_PER_REPLY);
        all.extend(chunks.iter().copied());
        if !more {
            return (all, pages);
        }
        after = chunks
            .last()
            .expect("a page that says more is not empty")
            .addr;
    }
}

fn write(nic: &TcpRegistry, client: u64, a: &Allocation, data: &[u8]) -> Result<(), AccessError> {
    nic.write(client, a.addr, a.rkey, data)
}

fn read(
    nic: &TcpRegistry,
    client: u64,
    a: &Allocation,
    len: usize,
) -> Result<Vec<u8>, AccessError> {
    let mut buf = vec![0xffu8; len];
    nic.read(client, a.addr, a.rkey, &mut buf)?;
    Ok(buf)
}

#[test]
fn creating_a_volume_gives_its_creator_a_zeroed_root_page() {
    let (s, nic) = service_with(16, LONG);
    let page = system_page_size();
    let mut a = client(&s, 1, 1);
    let info = open(&s, &mut a, "home", true);
    assert!(info.created);
    assert_eq!((info.root.len, info.chunks, info.bytes), (page, 1, page));
    assert_eq!(
        read(&nic, 1, &info.root, page as usize),
        Ok(vec![0; page as usize]),
        "the root reads as zero for its creator"
    );
    assert_eq!(
        read(&nic, 2, &info.root, 1),
        Err(AccessError::NotOwner),
        "nobody else reaches it"
    );
    let st = s.stats();
    assert_eq!((st.used, st.allocations), (page, 1), "the root is counted");
    assert_eq!(
        ask(&s, &mut a, &Request::VolumeList { after: vec![] }).0,
        Response::VolumeListing {
            volumes: vec![VolumeSummary {
                name: b"home".to_vec(),
                volume_id: info.volume_id,
                bytes: page,
                chunks: 1,
                holder: 1
            }],
            more: false
        }
    );
    assert_eq!(s.volumes_summary().len(), 1);
}

#[test]
fn opening_a_missing_volume_without_create_is_not_found() {
    let (s, _) = service_with(16, LONG);
    let mut a = client(&s, 1, 1);
    refused(
        &ask(&s, &mut a, &open_req("nope", false, true)).0,
        ErrorCode::NotFound,
        "open without create",
    );
    assert_eq!(s.stats().used, 0);
    assert!(s.volumes_summary().is_empty());
}

#[test]
fn reopening_the_held_volume_changes_nothing() {
    let (s, nic) = service_with(16, LONG);
    let mut a = client(&s, 1, 1);
    let first = open(&s, &mut a, "v", true);
    let mut a2 = client(&s, 2, 1); // another connection of the same client
    let again = open(&s, &mut a2, "v", true);
    assert_eq!(
        again,
        VolumeInfo {
            created: false,
            ..first
        },
        "same volume, same root rkey"
    );
    write(&nic, 1, &first.root, b"still valid").expect("the first rkey still works");
    assert_eq!(s.stats().allocations, 1);
}

#[test]
fn a_client_holds_one_volume_and_opens_it_before_allocating() {
    let (s, _) = service_with(16, LONG);
    let mut a = client(&s, 1, 1);
    open(&s, &mut a, "one", true);
    refused(
        &ask(&s, &mut a, &open_req("two", true, false)).0,
        ErrorCode::BadRequest,
        "a second volume",
    );
    let mut b = client(&s, 2, 2);
    alloc(&s, &mut b, 1);
    refused(
        &ask(&s, &mut b, &open_req("two", true, false)).0,
        ErrorCode::BadRequest,
        "an open after scratch allocations",
    );
    let names: Vec<Vec<u8>> = s.volumes_summary().into_iter().map(|v| v.name).collect();
    assert_eq!(names, vec![b"one".to_vec()]);
}

#[test]
fn a_bound_clients_allocations_and_frees_are_the_volumes() {
    let (s, nic) = service_with(16, LONG);
    let page = system_page_size();
    let mut a = client(&s, 1, 1);
    let info = open(&s, &mut a, "v", true);
    let x = alloc(&s, &mut a, 2 * page);
    let y = alloc(&s, &mut a, 1);
    let (chunks, _) = all_chunks(&s, &mut a);
    let mut want = vec![x, y];
    want.sort_by_key(|c| c.addr);
    assert_eq!(chunks, want, "the volume's chunks, root excluded");
    let v = &s.volumes_summary()[0];
    assert_eq!((v.chunks, v.bytes), (3, 4 * page));
    refused(
        &ask(
            &s,
            &mut a,
            &Request::Free {
                addr: info.root.addr,
                rkey: info.root.rkey,
            },
        )
        .0,
        ErrorCode::BadRequest,
        "freeing the root",
    );
    refused(
        &ask(
            &s,
            &mut a,
            &Request::Free {
                addr: x.addr,
                rkey: x.rkey ^ 1,
            },
        )
        .0,
        ErrorCode::NotFound,
        "a free with a wrong rkey",
    );
    write(&nic, 1, &y, b"gone soon").expect("writes");
    assert_eq!(
        ask(
            &s,
            &mut a,
            &Request::Free {
                addr: y.addr,
                rkey: y.rkey
            }
        )
        .0,
        Response::Freed
    );
    assert_eq!(write(&nic, 1, &y, b"x"), Err(AccessError::UnknownKey));
    assert_eq!(all_chunks(&s, &mut a).0, vec![x]);
    assert_eq!(s.stats().used, 3 * page);
    // The scratch pool of the client is untouched by all this.
    s.disconnected(&a);
    assert_eq!(s.stats().used, 3 * page, "volume chunks outlive the client");
    // The freed chunk was zeroed.
    let mut b = client(&s, 2, 2);
    let z = alloc(&s, &mut b, 1);
    assert_eq!(z.addr, y.addr);
    assert_eq!(read(&nic, 2, &z, 9), Ok(vec![0; 9]));
}

#[test]
fn a_live_holder_makes_others_busy_and_the_message_names_it() {
    let (s, _) = service_with(16, LONG);
    let mut a = client(&s, 1, 0xa1);
    open(&s, &mut a, "v", true);
    let mut b = client(&s, 2, 0xb2);
    for create in [false, true] {
        let msg = refused(
            &ask(&s, &mut b, &open_req("v", create, false)).0,
            ErrorCode::Busy,
            "an open of a held volume",
        );
        for want in ["client 0xa1", "test-peer-1", "held", "last heard from"] {
            assert!(
                msg.contains(want),
                "Busy message {msg:?} must contain {want:?}"
            );
        }
    }
    let msg = refused(
        &ask(
            &s,
            &mut b,
            &Request::VolumeDestroy {
                name: b"v".to_vec(),
            },
        )
        .0,
        ErrorCode::Busy,
        "a destroy of a held volume",
    );
    assert!(msg.contains("client 0xa1"), "{msg:?}");
    assert_eq!(s.volumes_summary()[0].holder, 0xa1);
}

#[test]
fn a_takeover_fences_the_old_holder() {
    let (s, nic) = service_with(16, LONG);
    let mut a = client(&s, 1, 1);
    let root_a = open(&s, &mut a, "v", true).root;
    let x = alloc(&s, &mut a, 1);
    write(&nic, 1, &x, b"from a").expect("a writes");
    let mut b = client(&s, 2, 2);
    let info = opened(ask(&s, &mut b, &open_req("v", false, true)).0);
    assert!(!info.created);
    assert_ne!(
        info.root.rkey, root_a.rkey,
        "fresh rkeys for the new holder"
    );
    for (what, chunk) in [("root", root_a), ("chunk", x)] {
        assert_eq!(
            write(&nic, 1, &chunk, b"late"),
            Err(AccessError::UnknownKey),
            "the old holder's {what} rkey is revoked"
        );
    }
    let (chunks, _) = all_chunks(&s, &mut b);
    assert_eq!(chunks.len(), 1);
    assert_eq!(read(&nic, 2, &chunks[0], 6), Ok(b"from a".to_vec()));
    for req in [
        Request::Alloc { bytes: 1 },
        Request::Free {
            addr: x.addr,
            rkey: x.rkey,
        },
        Request::VolumeChunks { after: 0 },
        Request::VolumeClose,
    ] {
        refused(
            &ask(&s, &mut a, &req).0,
            ErrorCode::Fenced,
            &format!("{req:?} by the fenced client"),
        );
    }
    assert!(
        matches!(ask(&s, &mut a, &Request::Stat).0, Response::Stats(_)),
        "Stat still works"
    );
    assert_eq!(s.stats().used, 2 * system_page_size(), "nothing was freed");
    // The fenced client going away changes nothing for the new holder.
    s.disconnected(&a);
    assert_eq!(read(&nic, 2, &chunks[0], 6), Ok(b"from a".to_vec()));
    assert_eq!(s.volumes_summary()[0].holder, 2);
}

#[test]
fn an_expired_lease_lets_another_client_in_without_takeover() {
    let lease = Duration::from_millis(150);
    let (s, nic) = service_with(16, lease);
    let mut a = client(&s, 1, 1);
    let root_a = open(&s, &mut a, "v", true).root;
    std::thread::sleep(lease * 2);
    let mut b = client(&s, 2, 2);
    let info = opened(ask(&s, &mut b, &open_req("v", false, false)).0);
    assert_eq!(write(&nic, 1, &root_a, b"x"), Err(AccessError::UnknownKey));
    write(&nic, 2, &info.root, b"mine").expect("the new holder writes");
    refused(
        &ask(&s, &mut a, &Request::Alloc { bytes: 1 }).0,
        ErrorCode::Fenced,
        "the expired holder's Alloc",
    );
}

#[test]
fn a_holder_that_keeps_talking_keeps_its_lease() {
    let lease = Duration::from_millis(400);
    let (s, _) = service_with(16, lease);
    let mut a = client(&s, 1, 1);
    open(&s, &mut a, "v", true);
    let mut b = client(&s, 2, 2);
    let start = Instant::now();
    while start.elapsed() < lease * 3 {
        ask(&s, &mut a, &Request::Stat);
        std::thread::sleep(Duration::from_millis(20));
    }
    refused(
        &ask(&s, &mut b, &open_req("v", false, false)).0,
        ErrorCode::Busy,
        "an open while the holder heartbeats",
    );
}

#[test]
fn the_holders_last_disconnect_releases_the_lease_and_keeps_the_chunks() {
    let (s, nic) = service_with(16, LONG);
    let page = system_page_size();
    let (mut a1, mut a2) = (client(&s, 1, 1), client(&s, 2, 1));
    let info = open(&s, &mut a1, "v", true);
    let x = alloc(&s, &mut a2, page);
    write(&nic, 1, &x, b"durable").expect("writes");
    s.disconnected(&a1);
    assert_eq!(s.volumes_summary()[0].holder, 1, "a connection is left");
    write(&nic, 1, &x, b"durable").expect("still registered");
    s.disconnected(&a2);
    let v = &s.volumes_summary()[0];
    assert_eq!((v.holder, v.chunks), (0, 2), "released, chunks kept");
    assert_eq!(s.stats().used, 2 * page, "nothing freed");
    assert!(
        nic.is_empty(),
        "nothing stays registered for a departed holder"
    );
    // Another client opens it at once (no takeover, long lease) and finds the data.
    let mut b = client(&s, 3, 2);
    let again = open(&s, &mut b, "v", false);
    assert_eq!(
        (again.volume_id, again.chunks, again.created),
        (info.volume_id, 2, false)
    );
    let (chunks, _) = all_chunks(&s, &mut b);
    assert_eq!(read(&nic, 2, &chunks[0], 7), Ok(b"durable".to_vec()));
}

#[test]
fn close_releases_the_volume_and_unbinds_the_client() {
    let (s, nic) = service_with(16, LONG);
    let page = system_page_size();
    let mut a = client(&s, 1, 1);
    let info = open(&s, &mut a, "v", true);
    assert_eq!(
        ask(&s, &mut a, &Request::VolumeClose).0,
        Response::VolumeClosed
    );
    assert_eq!(
        write(&nic, 1, &info.root, b"x"),
        Err(AccessError::UnknownKey)
    );
    refused(
        &ask(&s, &mut a, &Request::VolumeClose).0,
        ErrorCode::BadRequest,
        "a second close",
    );
    refused(
        &ask(&s, &mut a, &Request::VolumeChunks { after: 0 }).0,
        ErrorCode::BadRequest,
        "chunks of no volume",
    );
    // Unbound: a new allocation is scratch, reclaimed when the client goes.
    alloc(&s, &mut a, 1);
    assert_eq!(s.volumes_summary()[0].chunks, 1);
    s.disconnected(&a);
    assert_eq!(
        s.stats().used,
        page,
        "the scratch chunk went, the volume stayed"
    );
}

#[test]
fn destroy_frees_and_zeroes_every_chunk() {
    let (s, nic) = service_with(16, LONG);
    let page = system_page_size();
    let mut a = client(&s, 1, 1);
    let root = open(&s, &mut a, "v", true).root;
    let x = alloc(&s, &mut a, 3 * page);
    write(&nic, 1, &root, &vec![0xaa; page as usize]).expect("writes");
    write(&nic, 1, &x, &vec![0xbb; 3 * page as usize]).expect("writes");
    ask(&s, &mut a, &Request::VolumeClose);
    let mut b = client(&s, 2, 2);
    refused(
        &ask(
            &s,
            &mut b,
            &Request::VolumeDestroy {
                name: b"w".to_vec(),
            },
        )
        .0,
        ErrorCode::NotFound,
        "destroy of a missing volume",
    );
    assert_eq!(
        ask(
            &s,
            &mut b,
            &Request::VolumeDestroy {
                name: b"v".to_vec()
            }
        )
        .0,
        Response::VolumeDestroyed { bytes: 4 * page }
    );
    assert_eq!(s.stats().used, 0);
    assert!(s.volumes_summary().is_empty());
    let all = alloc(&s, &mut b, 16 * page);
    assert_eq!(
        read(&nic, 2, &all, 16 * page as usize),
        Ok(vec![0; 16 * page as usize])
    );
}

#[test]
fn the_holder_may_destroy_its_own_volume_and_is_unbound() {
    let (s, nic) = service_with(16, LONG);
    let page = system_page_size();
    let mut a = client(&s, 1, 1);
    let root = open(&s, &mut a, "v", true).root;
    alloc(&s, &mut a, 1);
    assert_eq!(
        ask(
            &s,
            &mut a,
            &Request::VolumeDestroy {
                name: b"v".to_vec()
            }
        )
        .0,
        Response::VolumeDestroyed { bytes: 2 * page }
    );
    assert_eq!(write(&nic, 1, &root, b"x"), Err(AccessError::UnknownKey));
    assert_eq!(s.stats().used, 0);
    alloc(&s, &mut a, 1);
    s.disconnected(&a);
    assert_eq!(
        s.stats().used,
        0,
        "after the destroy its allocations were scratch"
    );
}

#[test]
fn a_destroy_past_a_stale_holder_fences_it() {
    let lease = Duration::from_millis(100);
    let (s, nic) = service_with(16, lease);
    let mut a = client(&s, 1, 1);
    let root = open(&s, &mut a, "v", true).root;
    std::thread::sleep(lease * 2);
    let mut b = client(&s, 2, 2);
    assert!(matches!(
        ask(
            &s,
            &mut b,
            &Request::VolumeDestroy {
                name: b"v".to_vec()
            }
        )
        .0,
        Response::VolumeDestroyed { .. }
    ));
    assert_eq!(write(&nic, 1, &root, b"x"), Err(AccessError::UnknownKey));
    refused(
        &ask(&s, &mut a, &Request::Alloc { bytes: 1 }).0,
        ErrorCode::Fenced,
        "the stale holder's Alloc",
    );
    assert_eq!(s.stats().used, 0);
}

#[test]
fn listing_pages_through_many_volumes_in_name_order() {
    let (s, _) = service_with(128, LONG);
    let mut names: Vec<Vec<u8>> = (0..100u64)
        .map(|i| format!("{i:03}-{}", "x".repeat(58)).into_bytes())
        .collect();
    for (i, name) in names.iter().enumerate().rev() {
        let mut c = client(&s, i as u64 + 1, i as u64 + 1);
        let name = String::from_utf8(name.clone()).expect("ascii");
        open(&s, &mut c, &name, true);
        if i % 2 == 0 {
            ask(&s, &mut c, &Request::VolumeClose);
        }
    }
    names.sort();
    let mut lister = client(&s, 1000, 1000);
    let (mut seen, mut pages, mut after) = (Vec::new(), 0, Vec::new());
    loop {
        let (resp, _) = ask(
            &s,
            &mut lister,
            &Request::VolumeList {
                after: after.clone(),
            },
        );
        let Response::VolumeListing { volumes, more } = resp else {
            panic!("expected VolumeListing, got {resp:?}")
        };
        pages += 1;
        assert!(!volumes.is_empty(), "page {pages} is empty");
        seen.extend(volumes.iter().map(|v| (v.name.clone(), v.holder)));
        if !more {
            break;
        }
        after = volumes.last().map(|v| v.name.clone()).unwrap_or_default();
    }
    assert!(pages >= 10, "100 long names take many pages, not {pages}");
    assert_eq!(
        seen.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(),
        names
    );
    for (i, (_, holder)) in seen.iter().enumerate() {
        let want = if i % 2 == 0 { 0 } else { i as u64 + 1 };
        assert_eq!(*holder, want, "holder of volume {i}");
    }
}

#[test]
fn chunk_lists_page_past_one_reply() {
    let (s, _) = service_with(128, LONG);
    let mut a = client(&s, 1, 1);
    let root = open(&s, &mut a, "v", true).root;
    let n = 2 * MAX_CHUNKS_PER_REPLY + 5;
    let mut made: Vec<Allocation> = (0..n).map(|_| alloc(&s, &mut a, 1)).collect();
    made.sort_by_key(|c| c.addr);
    let (chunks, pages) = all_chunks(&s, &mut a);
    assert_eq!(pages, 3);
    assert_eq!(
        chunks, made,
        "every chunk once, in address order, without the root"
    );
    assert!(chunks.iter().all(|c| c.addr != root.addr));
    let (resp, _) = ask(&s, &mut a, &Request::VolumeChunks { after: u64::MAX });
    assert_eq!(
        resp,
        Response::ChunkList {
            chunks: vec![],
            more: false
        }
    );
}

#[test]
fn scratch_allocations_racing_an_open_never_sit_beside_a_volume() {
    let (s, _) = service_with(64, LONG);
    for round in 0..200u64 {
        let id = 100 + round;
        let (mut c1, mut c2) = (client(&s, 2 * id, id), client(&s, 2 * id + 1, id));
        let name = format!("v{round}");
        std::thread::scope(|t| {
            t.spawn(|| {
                ask(&s, &mut c1, &Request::Alloc { bytes: 1 });
            });
            t.spawn(|| {
                ask(&s, &mut c2, &open_req(&name, true, false));
            });
        });
        let holds = s.volumes().held_by(id).is_some();
        assert!(
            !(holds && s.pool.has_scratch(id)),
            "round {round}: client holds a volume and has scratch chunks"
        );
        s.disconnected(&c1);
        s.disconnected(&c2);
        if holds {
            let mut d = client(&s, 1, 1);
            ask(
                &s,
                &mut d,
                &Request::VolumeDestroy {
                    name: name.into_bytes(),
                },
            );
            s.disconnected(&d);
        }
        assert_eq!(s.stats().used, 0, "round {round}: everything went back");
    }
}
