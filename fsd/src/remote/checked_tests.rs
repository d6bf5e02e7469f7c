use super::*;
use proptest::prelude::*;
use rmemfs_common::protocol::Response;
use std::collections::BTreeMap;

const CAP: u64 = 1 << 30;

fn chunk(addr: u64, len: u64) -> Allocation {
    Allocation { addr, len, rkey: 7 }
}

#[test]
fn a_chunk_that_is_empty_too_large_or_wrapping_is_refused_naming_it() {
    assert_eq!(check_chunk("Allocated", CAP, &chunk(0x1000, 4096)), Ok(()));
    assert_eq!(check_chunk("Allocated", CAP, &chunk(0, CAP)), Ok(()));
    let e = check_chunk("Allocated", CAP, &chunk(0x1000, 0)).unwrap_err();
    assert!(
        e.contains("Allocated") && e.contains("0x1000") && e.contains("length 0"),
        "{e}"
    );
    let e = check_chunk("VolumeChunks", CAP, &chunk(0x1000, CAP + 1)).unwrap_err();
    assert!(
        e.contains("VolumeChunks") && e.contains(&format!("{}", CAP + 1)),
        "{e}"
    );
    let e = check_chunk("VolumeChunks", u64::MAX, &chunk(u64::MAX - 4095, 8192)).unwrap_err();
    assert!(
        e.contains("wraps") && e.contains("0xfffffffffffff000"),
        "{e}"
    );
    // Up to the last byte of the address space is a range; one more is not.
    assert_eq!(
        check_chunk("x", u64::MAX, &chunk(u64::MAX - 4096, 4096)),
        Ok(())
    );
}

#[test]
fn an_allocation_holds_at_least_what_was_asked() {
    assert_eq!(check_allocated(CAP, 4096, &chunk(0x1000, 8192)), Ok(()));
    assert_eq!(check_allocated(CAP, 8192, &chunk(0x1000, 8192)), Ok(()));
    let e = check_allocated(CAP, 8193, &chunk(0x1000, 8192)).unwrap_err();
    assert!(e.contains("less than the 8193 bytes asked for"), "{e}");
    assert!(check_allocated(CAP, 1, &chunk(0x1000, 0)).is_err());
    assert!(check_volume_root(CAP, &chunk(0x1000, u64::MAX)).is_err());
}

#[test]
fn a_chunk_list_out_of_order_repeated_overlapping_or_too_wide_is_refused() {
    let root = chunk(0x10_0000, 4096);
    let ok = [
        chunk(0x1000, 4096),
        chunk(0x2000, 8192),
        chunk(0x20_0000, 4096),
    ];
    assert_eq!(
        check_chunk_list("VolumeChunks", CAP, Some(&root), &ok),
        Ok(())
    );
    assert_eq!(
        check_chunk_list("VolumeChunks", CAP, Some(&root), &[]),
        Ok(())
    );
    let refused = |list: &[Allocation], root: Option<&Allocation>, cap: u64, says: &str| {
        let e = check_chunk_list("VolumeChunks", cap, root, list).unwrap_err();
        assert!(e.starts_with("VolumeChunks: ") && e.contains(says), "{e}");
    };
    refused(
        &[chunk(0x2000, 4096), chunk(0x1000, 4096)],
        None,
        CAP,
        "out of address order",
    );
    refused(
        &[chunk(0x1000, 4096), chunk(0x1000, 4096)],
        None,
        CAP,
        "repeated",
    );
    refused(
        &[chunk(0x1000, 8192), chunk(0x2000, 4096)],
        None,
        CAP,
        "overlaps chunk at 0x1000",
    );
    refused(
        &[chunk(0x10_0800, 4096)],
        Some(&root),
        CAP,
        "overlaps the volume's root",
    );
    refused(
        &[chunk(0xf_f800, 4096)],
        Some(&root),
        CAP,
        "overlaps the volume's root",
    );
    // From 0x1000 to CAP + 0x1000 is exactly the capacity; a page more is not.
    let whole = [chunk(0x1000, 4096), chunk(CAP, 4096)];
    assert_eq!(check_chunk_list("VolumeChunks", CAP, None, &whole), Ok(()));
    refused(
        &[chunk(0x1000, 4096), chunk(CAP + 0x1000, 4096)],
        None,
        CAP,
        "span more than",
    );
    // The root counts in the span: the region holds it too.
    refused(
        &[chunk(CAP, 4096)],
        Some(&chunk(0, 4096)),
        CAP,
        "span more than",
    );
    refused(&[chunk(u64::MAX - 4095, 4096)], None, u64::MAX, "wraps");
}

#[test]
fn copies_and_stats_are_what_was_asked_and_possible() {
    assert_eq!(check_copied(4096, 4096), Ok(()));
    assert!(check_copied(4096, 8192).unwrap_err().contains("8192"));
    assert!(check_copied(4096, 0).is_err());
    let stats = |capacity, used| NodeStats {
        capacity,
        used,
        clients: 1,
        allocations: 1,
    };
    assert_eq!(check_stats(&stats(100, 100)), Ok(()));
    assert!(check_stats(&stats(100, 101)).unwrap_err().contains("101"));
}

/// A chunk anywhere, of any length, with the ends of the address space likely.
fn any_chunk() -> impl Strategy<Value = Allocation> {
    let addr = prop_oneof![
        0u64..1 << 24,
        Just(u64::MAX),
        (0u64..1 << 20).prop_map(|d| u64::MAX - d),
        any::<u64>()
    ];
    let len = prop_oneof![0u64..1 << 22, Just(u64::MAX), any::<u64>()];
    (addr, len).prop_map(|(addr, len)| chunk(addr, len))
}

proptest! {
    /// Whatever a memnode lists, a list that passes holds what fsd takes for granted
    /// (the loader's ranges, sums and maps over it cannot panic or wrap).
    #[test]
    fn a_list_that_passes_is_ordered_disjoint_and_within_capacity(
        list in proptest::collection::vec(any_chunk(), 0..8),
        root in proptest::option::of(any_chunk()),
        capacity in prop_oneof![Just(u64::MAX), 1u64..1 << 26],
    ) {
        let root = root.filter(|r| check_volume_root(capacity, r).is_ok());
        if check_chunk_list("VolumeChunks", capacity, root.as_ref(), &list).is_ok() {
            let mut total = 0u64;
            let mut used: BTreeMap<u64, u64> = BTreeMap::new();
            for (k, c) in list.iter().enumerate() {
                let end = c.addr.checked_add(c.len).expect("no chunk wraps");
                prop_assert!(c.len > 0 && c.len <= capacity);
                if k > 0 {
                    prop_assert!(list[k - 1].addr + list[k - 1].len <= c.addr);
                }
                if let Some(r) = &root {
                    prop_assert!(end <= r.addr || r.addr + r.len <= c.addr);
                }
                total = total.checked_add(c.len).expect("the lengths add up");
                used.insert(c.addr, c.len);
                let _ = used.range(c.addr..end).count();
            }
            prop_assert!(total <= capacity);
        }
    }

    /// What an honest memnode lists passes: disjoint chunks in address order inside
    /// one region of its capacity.
    #[test]
    fn an_honest_list_passes(
        base in 0u64..1 << 40,
        pieces in proptest::collection::vec((0u64..8, 1u64..8), 0..12),
    ) {
        let page = 4096;
        let mut at = base * page;
        let mut list = Vec::new();
        for (gap, len) in pieces {
            at += gap * page;
            list.push(chunk(at, len * page));
            at += len * page;
        }
        let capacity = at - base * page;
        prop_assert_eq!(check_chunk_list("VolumeChunks", capacity.max(1), None, &list), Ok(()));
    }
}

/// fsd's store on a memnode in this process that lies when told to.
mod liar {
    use crate::remote::{Connector, RemoteConfig, RemoteStore, VolumeSpec};
    use memnode::liar::{Liar, Lie};
    use rmemfs_common::fabric::tcp::TcpEndpoint;
    use rmemfs_common::fabric::Endpoint;
    use std::sync::Arc;
    use std::time::Duration;

    pub struct Rig {
        pub node: memnode::Memnode,
        liar: Liar,
    }

    impl Rig {
        pub fn start() -> Rig {
            let (node, liar) = Liar::start(memnode::MemnodeConfig {
                listen: "127.0.0.1:0".into(),
                size: 64 << 20,
                token: None,
                tenants: None,
                connections: rmemfs_common::fabric::ConnectionLimits::default(),
                huge_pages: false,
                transport: rmemfs_common::fabric::Transport::Tcp,
                poll: Duration::ZERO,
                lease: memnode::DEFAULT_LEASE,
                session_grace: memnode::DEFAULT_SESSION_GRACE,
                memory_file: None,
            })
            .expect("memnode starts");
            Rig { node, liar }
        }

        pub fn tell(&self, lie: Option<Lie>) {
            self.liar.tell(lie);
        }

        /// fsd's store on this memnode, holding volume "v" (created).
        pub fn connect(&self) -> Result<RemoteStore, crate::remote::RemoteError> {
            let connect: Arc<Connector> = Arc::new(|peer: &str, _client: u64| {
                Ok(
                    Box::new(TcpEndpoint::connect(peer, Duration::from_secs(5))?)
                        as Box<dyn Endpoint>,
                )
            });
            RemoteStore::connect(
                &[self.node.local_addr().to_string()],
                &RemoteConfig {
                    block_size: 64 << 10,
                    chunk_size: 1 << 20,
                    connections: 1,
                    client_id: rmemfs_common::control::random_id(),
                    token: Vec::new(),
                    replicas: 1,
                    watch_interval: Duration::from_millis(50),
                    dead_time: Duration::from_secs(600),
                    unreachable_timeout: Some(Duration::from_millis(300)),
                    volume: Some(VolumeSpec {
                        name: "v".into(),
                        create: true,
                        takeover: false,
                    }),
                },
                connect,
            )
        }
    }
}

fn untrusted(e: &RemoteError, says: &str) -> bool {
    matches!(e, RemoteError::Untrusted { what, .. } if what.contains(says))
}

#[test]
fn a_volume_root_that_cannot_be_refuses_the_connection_naming_it() {
    let rig = liar::Rig::start();
    rig.tell(Some(|r| match r {
        Response::VolumeOpened(mut info) => {
            info.root.len = u64::MAX;
            Response::VolumeOpened(info)
        }
        r => r,
    }));
    let e = rig.connect().err().expect("refused");
    assert!(untrusted(&e, "VolumeOpened root"), "{e}");
    let said = e.to_string();
    assert!(
        said.contains(&rig.node.local_addr().to_string()) && said.contains(&u64::MAX.to_string()),
        "the memnode and the value are named: {said}"
    );
    // The same memnode telling the truth is used.
    rig.tell(None);
    rig.connect().expect("an honest root is taken");
}

#[test]
fn a_lying_reply_after_mount_is_an_error_of_that_node_which_is_then_reconnected() {
    let rig = liar::Rig::start();
    let remote = rig.connect().expect("connects");
    let unreachable = || remote.node_events(0).expect("node 0").0;
    // The watch thread reconnects a node dropped for a lie (every 50 ms here).
    let back = || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !remote.node_is_up(0) {
            assert!(
                std::time::Instant::now() < deadline,
                "the node was not reconnected"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    };
    // Allocated: an empty chunk, then one that wraps.
    rig.tell(Some(|r| match r {
        Response::Allocated(mut a) => {
            a.len = 0;
            Response::Allocated(a)
        }
        r => r,
    }));
    let e = remote.alloc_chunk(0, 4096).expect_err("an empty chunk");
    assert!(untrusted(&e, "length 0"), "{e}");
    assert!(remote.alloc_block(4096).is_err(), "no block from a liar");
    assert!(
        unreachable() >= 1,
        "the node that lied is dropped as failed"
    );
    rig.tell(Some(|r| match r {
        Response::Allocated(mut a) => {
            a.addr = u64::MAX - 4095;
            Response::Allocated(a)
        }
        r => r,
    }));
    back();
    let e = remote.alloc_chunk(0, 4096).err();
    assert!(e.as_ref().is_some_and(|e| untrusted(e, "wraps")), "{e:?}");
    // VolumeChunks: a chunk that wraps.
    rig.tell(None);
    back();
    let c = remote
        .alloc_chunk(0, 4096)
        .expect("the node is back and honest");
    rig.tell(Some(|r| match r {
        Response::ChunkList { mut chunks, more } => {
            chunks.push(Allocation {
                addr: u64::MAX - 4095,
                len: 8192,
                rkey: 1,
            });
            Response::ChunkList { chunks, more }
        }
        r => r,
    }));
    let e = remote.volume_chunks(0).expect_err("a wrapping chunk");
    assert!(untrusted(&e, "VolumeChunks"), "{e}");
    rig.tell(None);
    back();
    let root = remote.volume_root(0).expect("root");
    // (The chunks of the refused replies are there too: the memnode did allocate
    // them, and fsd, not believing where, leaves them to the next mount's reclaim.)
    let listed = remote.volume_chunks(0).expect("an honest list");
    assert!(listed.contains(&c), "{listed:?}");
    // Stats: more used than there is, found by the heartbeat.
    let before = unreachable();
    rig.tell(Some(|r| match r {
        Response::Stats(mut s) => {
            s.used = s.capacity + 1;
            Response::Stats(s)
        }
        r => r,
    }));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while unreachable() == before {
        assert!(
            std::time::Instant::now() < deadline,
            "the heartbeat believed it"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    rig.tell(None);
    back();
    assert_eq!(remote.volume_root(0).map(|r| r.addr), Some(root.addr));
}
