//! Round trips, truncations, bad fields and garbage for every control message.

use super::wire::*;
use super::*;
use proptest::prelude::*;

fn all_requests() -> Vec<Request> {
    vec![
        Request::Hello {
            client_id: 0xdead_beef_0123_4567,
            nonce: [0x5a; crate::auth::NONCE_LEN],
            resume: true,
        },
        Request::Hello {
            client_id: 0,
            nonce: [0; crate::auth::NONCE_LEN],
            resume: false,
        },
        Request::Prove {
            proof: [0x33; crate::auth::PROOF_LEN],
            session: None,
        },
        Request::Prove {
            proof: [0x33; crate::auth::PROOF_LEN],
            session: Some([0x44; crate::auth::PROOF_LEN]),
        },
        Request::SessionEnd,
        Request::SessionChunks { after: 1 << 30 },
        Request::Alloc { bytes: 64 << 20 },
        Request::Free {
            addr: 1 << 40,
            rkey: 0xabcd_ef01,
        },
        Request::Stat,
        Request::VolumeOpen {
            name: b"home".to_vec(),
            create: true,
            takeover: false,
        },
        Request::VolumeOpen {
            name: vec![b'v'; MAX_VOLUME_NAME],
            create: false,
            takeover: true,
        },
        Request::VolumeOpen {
            name: b"a.b-c_D9".to_vec(),
            create: true,
            takeover: true,
        },
        Request::VolumeChunks { after: 0 },
        Request::VolumeChunks { after: u64::MAX },
        Request::VolumeClose,
        Request::VolumeList { after: vec![] },
        Request::VolumeList {
            after: b"scratch.2".to_vec(),
        },
        Request::VolumeDestroy {
            name: b"...".to_vec(),
        },
        Request::Copy {
            spans: vec![span(1, 4096)],
        },
        Request::Copy {
            spans: (0..MAX_COPY_SPANS as u64)
                .map(|i| span(i, (MAX_COPY_BYTES / MAX_COPY_SPANS as u64) as u32))
                .collect(),
        },
    ]
}

fn span(i: u64, len: u32) -> CopySpan {
    CopySpan {
        src_addr: (1 << 40) + (i << 20),
        src_rkey: 7 + i as u32,
        dst_addr: (2 << 40) + (i << 20),
        dst_rkey: 0xffff_0000 | i as u32,
        len,
    }
}

fn summary(name: &[u8], id: u64) -> VolumeSummary {
    VolumeSummary {
        name: name.to_vec(),
        volume_id: id,
        bytes: id << 20,
        chunks: id as u32 + 1,
        holder: id.wrapping_mul(0x9e37_79b9_7f4a_7c15),
    }
}

fn chunk(i: u64) -> Allocation {
    Allocation {
        addr: (1 << 40) + (i << 26),
        len: 1 << 26,
        rkey: 0x1000 + i as u32,
    }
}

fn all_responses() -> Vec<Response> {
    vec![
        Response::Challenge {
            nonce: [0x11; crate::auth::NONCE_LEN],
        },
        Response::Welcome {
            node_id: 7,
            capacity: 4 << 30,
            features: FEATURE_COPY,
            resumed: true,
            boot: 3,
            proof: [0xa5; crate::auth::PROOF_LEN],
        },
        Response::Welcome {
            node_id: 7,
            capacity: 4 << 30,
            features: 0,
            resumed: false,
            boot: 0,
            proof: [0; crate::auth::PROOF_LEN],
        },
        Response::SessionEnding,
        Response::Copied { bytes: 1 << 24 },
        Response::Allocated(Allocation {
            addr: 4096,
            len: 1 << 26,
            rkey: 99,
        }),
        Response::Freed,
        Response::Stats(NodeStats {
            capacity: 1 << 30,
            used: 1 << 20,
            clients: 3,
            allocations: 9,
        }),
        Response::error(ErrorCode::NoSpace, "out of memory"),
        Response::error(ErrorCode::Unknown(0x4242), ""),
        Response::error(ErrorCode::Busy, "held by client 0x1"),
        Response::error(ErrorCode::Fenced, "taken over"),
        Response::error(ErrorCode::OverQuota, "tenant \"a\" is over its quota"),
        Response::VolumeOpened(VolumeInfo {
            volume_id: 3,
            created: true,
            root: chunk(0),
            chunks: 1,
            bytes: 4096,
        }),
        Response::VolumeOpened(VolumeInfo {
            volume_id: u64::MAX,
            created: false,
            root: chunk(7),
            chunks: u32::MAX,
            bytes: u64::MAX,
        }),
        Response::ChunkList {
            chunks: vec![],
            more: false,
        },
        Response::ChunkList {
            chunks: (0..MAX_CHUNKS_PER_REPLY as u64).map(chunk).collect(),
            more: true,
        },
        Response::VolumeClosed,
        Response::VolumeListing {
            volumes: vec![],
            more: false,
        },
        Response::VolumeListing {
            volumes: vec![summary(b"a", 1), summary(&[b'z'; MAX_VOLUME_NAME], 2)],
            more: true,
        },
        Response::VolumeDestroyed { bytes: 1 << 30 },
    ]
}

/// Names the protocol must refuse.
fn bad_names() -> Vec<Vec<u8>> {
    vec![
        vec![],
        b".".to_vec(),
        b"..".to_vec(),
        b"a/b".to_vec(),
        b"/".to_vec(),
        b"a b".to_vec(),
        b"a\0b".to_vec(),
        vec![b'a', 0, b'b'],
        "h\u{e9}".as_bytes().to_vec(),
        vec![0xff],
        vec![b'x'; MAX_VOLUME_NAME + 1],
    ]
}

/// A VolumeOpen body with any name bytes (bypassing the encoder's cut).
fn open_frame(name: &[u8], flags: u8) -> Vec<u8> {
    let mut body = Vec::new();
    put_bytes(&mut body, name);
    body.push(flags);
    frame(K_VOLUME_OPEN, &body)
}

#[test]
fn every_request_round_trips() {
    for req in all_requests() {
        assert_eq!(Request::decode(&req.encode()), Ok(req));
    }
}

#[test]
fn every_response_round_trips() {
    for resp in all_responses() {
        assert_eq!(Response::decode(&resp.encode()), Ok(resp));
    }
}

#[test]
fn every_truncation_of_a_valid_frame_is_an_error() {
    for req in all_requests() {
        let f = req.encode();
        for cut in 0..f.len() {
            assert!(Request::decode(&f[..cut]).is_err(), "{req:?} cut at {cut}");
        }
    }
    for resp in all_responses() {
        let f = resp.encode();
        for cut in 0..f.len() {
            assert!(
                Response::decode(&f[..cut]).is_err(),
                "{resp:?} cut at {cut}"
            );
        }
    }
}

#[test]
fn trailing_bytes_are_rejected() {
    let mut f = Request::Alloc { bytes: 1 }.encode();
    f.push(0);
    f[4] += 1; // body length now covers the extra byte
    assert!(matches!(
        Request::decode(&f),
        Err(ProtocolError::BodyLength { .. })
    ));
}

#[test]
fn oversized_body_length_is_rejected_before_reading_the_body() {
    let mut f = Request::Stat.encode();
    f[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(
        Request::decode(&f),
        Err(ProtocolError::TooLong(u32::MAX as usize))
    );
}

#[test]
fn wrong_version_is_rejected() {
    let mut f = Request::Stat.encode();
    f[0..2].copy_from_slice(&3u16.to_le_bytes());
    assert_eq!(Request::decode(&f), Err(ProtocolError::Version { got: 3 }));
}

#[test]
fn unknown_kind_is_rejected() {
    let mut f = Request::Stat.encode();
    f[2..4].copy_from_slice(&0x7777u16.to_le_bytes());
    assert_eq!(Request::decode(&f), Err(ProtocolError::UnknownKind(0x7777)));
    // A response kind is not a request.
    assert!(Request::decode(&Response::Freed.encode()).is_err());
}

#[test]
fn volume_names_follow_the_rules() {
    for good in [
        &b"a"[..],
        b"...",
        b".hidden",
        b"a..b",
        b"Vol-1_x.y",
        &[b'9'; MAX_VOLUME_NAME],
    ] {
        assert!(valid_volume_name(good), "{good:?} must be valid");
    }
    for bad in bad_names() {
        assert!(!valid_volume_name(&bad), "{bad:?} must be invalid");
    }
}

#[test]
fn bad_volume_names_are_rejected_everywhere() {
    for bad in bad_names() {
        assert_eq!(
            Request::decode(&open_frame(&bad, OPEN_CREATE)),
            Err(ProtocolError::BadField("volume name")),
            "VolumeOpen of {bad:?}"
        );
        let mut body = Vec::new();
        put_bytes(&mut body, &bad);
        assert_eq!(
            Request::decode(&frame(K_VOLUME_DESTROY, &body)),
            Err(ProtocolError::BadField("volume name")),
            "VolumeDestroy of {bad:?}"
        );
        if !bad.is_empty() {
            assert_eq!(
                Request::decode(&frame(K_VOLUME_LIST, &body)),
                Err(ProtocolError::BadField("volume name")),
                "VolumeList after {bad:?}"
            );
        }
        let mut body = Vec::new();
        body.extend_from_slice(&1u16.to_le_bytes());
        put_bytes(&mut body, &bad);
        body.extend_from_slice(&[0; 28]);
        body.push(0);
        assert_eq!(
            Response::decode(&frame(K_VOLUME_LISTING, &body)),
            Err(ProtocolError::BadField("volume name")),
            "a listing naming {bad:?}"
        );
    }
}

#[test]
fn an_overlong_name_is_never_cut_into_a_valid_one() {
    let long = [b'a'; 3 * MAX_VOLUME_NAME];
    for req in [
        Request::VolumeOpen {
            name: long.to_vec(),
            create: true,
            takeover: false,
        },
        Request::VolumeDestroy {
            name: long.to_vec(),
        },
        Request::VolumeList {
            after: long.to_vec(),
        },
    ] {
        assert_eq!(
            Request::decode(&req.encode()),
            Err(ProtocolError::BadField("volume name")),
            "{req:?} must not decode as a shorter name"
        );
    }
}

#[test]
fn unknown_open_flags_and_non_boolean_flags_are_rejected() {
    for flags in [0x04u8, 0x80, 0xff, 0x07] {
        assert_eq!(
            Request::decode(&open_frame(b"v", flags)),
            Err(ProtocolError::BadField("volume open flags")),
            "flags {flags:#x}"
        );
    }
    for flags in 0..=3u8 {
        assert!(Request::decode(&open_frame(b"v", flags)).is_ok());
    }
    let mut opened = Response::VolumeOpened(VolumeInfo {
        volume_id: 1,
        created: true,
        root: chunk(0),
        chunks: 1,
        bytes: 1,
    })
    .encode();
    opened[HEADER_LEN + 8] = 2;
    assert_eq!(
        Response::decode(&opened),
        Err(ProtocolError::BadField("created"))
    );
    let mut list = Response::ChunkList {
        chunks: vec![],
        more: false,
    }
    .encode();
    *list.last_mut().expect("non-empty") = 2;
    assert_eq!(
        Response::decode(&list),
        Err(ProtocolError::BadField("more"))
    );
}

#[test]
fn a_chunk_count_over_the_limit_is_rejected_before_reading_on() {
    let mut body = Vec::new();
    body.extend_from_slice(&(MAX_CHUNKS_PER_REPLY as u16 + 1).to_le_bytes());
    assert_eq!(
        Response::decode(&frame(K_CHUNK_LIST, &body)),
        Err(ProtocolError::BadField("chunk count"))
    );
    let mut body = Vec::new();
    body.extend_from_slice(&u16::MAX.to_le_bytes());
    assert!(Response::decode(&frame(K_VOLUME_LISTING, &body)).is_err());
}

#[test]
fn full_pages_fit_in_one_frame() {
    let full = Response::ChunkList {
        chunks: (0..MAX_CHUNKS_PER_REPLY as u64).map(chunk).collect(),
        more: true,
    };
    assert!(full.encode().len() <= MAX_CONTROL_FRAME);
    let longest: Vec<VolumeSummary> = (0..100)
        .map(|i| summary(&[b'a' + (i % 26) as u8; MAX_VOLUME_NAME], i))
        .collect();
    let n = listing_fits(&longest);
    assert!(n >= 10, "only {n} longest-name summaries fit in a reply");
    let page = Response::VolumeListing {
        volumes: longest[..n].to_vec(),
        more: false,
    };
    assert!(page.encode().len() <= MAX_CONTROL_FRAME);
    assert_eq!(Response::decode(&page.encode()), Ok(page));
}

#[test]
fn oversized_pages_are_cut_and_marked_as_having_more() {
    let chunks: Vec<Allocation> = (0..100).map(chunk).collect();
    let f = Response::ChunkList {
        chunks: chunks.clone(),
        more: false,
    }
    .encode();
    assert!(f.len() <= MAX_CONTROL_FRAME);
    assert_eq!(
        Response::decode(&f),
        Ok(Response::ChunkList {
            chunks: chunks[..MAX_CHUNKS_PER_REPLY].to_vec(),
            more: true
        })
    );
    let volumes: Vec<VolumeSummary> = (0..200).map(|i| summary(b"vol", i)).collect();
    let n = listing_fits(&volumes);
    assert!(n > 0 && n < volumes.len());
    let f = Response::VolumeListing {
        volumes: volumes.clone(),
        more: false,
    }
    .encode();
    assert!(f.len() <= MAX_CONTROL_FRAME);
    assert_eq!(
        Response::decode(&f),
        Ok(Response::VolumeListing {
            volumes: volumes[..n].to_vec(),
            more: true
        })
    );
}

fn volume_name() -> impl Strategy<Value = Vec<u8>> {
    "[A-Za-z0-9._-]{1,64}"
        .prop_filter("not . or ..", |s| s != "." && s != "..")
        .prop_map(String::into_bytes)
}

fn allocation() -> impl Strategy<Value = Allocation> {
    (any::<u64>(), any::<u64>(), any::<u32>()).prop_map(|(addr, len, rkey)| Allocation {
        addr,
        len,
        rkey,
    })
}

fn volume_summary() -> impl Strategy<Value = VolumeSummary> {
    (
        volume_name(),
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
        any::<u64>(),
    )
        .prop_map(|(name, volume_id, bytes, chunks, holder)| VolumeSummary {
            name,
            volume_id,
            bytes,
            chunks,
            holder,
        })
}

/// Every valid frame this module knows how to build, requests and responses.
fn valid_frames() -> Vec<Vec<u8>> {
    all_requests()
        .iter()
        .map(Request::encode)
        .chain(all_responses().iter().map(Response::encode))
        .collect()
}

proptest! {
    #[test]
    fn volume_requests_round_trip(
        name in volume_name(),
        create in any::<bool>(),
        takeover in any::<bool>(),
        after in any::<u64>(),
        list_from_start in any::<bool>(),
    ) {
        let list_after = if list_from_start { vec![] } else { name.clone() };
        for req in [
            Request::VolumeOpen { name: name.clone(), create, takeover },
            Request::VolumeChunks { after },
            Request::VolumeList { after: list_after },
            Request::VolumeDestroy { name: name.clone() },
        ] {
            prop_assert_eq!(Request::decode(&req.encode()), Ok(req));
        }
    }

    #[test]
    fn volume_responses_round_trip(
        volume_id in any::<u64>(),
        created in any::<bool>(),
        root in allocation(),
        chunks in proptest::collection::vec(allocation(), 0..=MAX_CHUNKS_PER_REPLY),
        volumes in proptest::collection::vec(volume_summary(), 0..10),
        more in any::<bool>(),
        n in any::<u32>(),
        bytes in any::<u64>(),
    ) {
        for resp in [
            Response::VolumeOpened(VolumeInfo { volume_id, created, root, chunks: n, bytes }),
            Response::ChunkList { chunks, more },
            Response::VolumeListing { volumes, more },
            Response::VolumeDestroyed { bytes },
        ] {
            prop_assert_eq!(Response::decode(&resp.encode()), Ok(resp));
        }
    }

    #[test]
    fn every_listing_encodes_within_the_limit(
        volumes in proptest::collection::vec(volume_summary(), 0..40),
        more in any::<bool>(),
    ) {
        let n = listing_fits(&volumes);
        let f = Response::VolumeListing { volumes: volumes.clone(), more }.encode();
        prop_assert!(f.len() <= MAX_CONTROL_FRAME);
        let want = Response::VolumeListing {
            volumes: volumes[..n].to_vec(),
            more: more || n < volumes.len(),
        };
        prop_assert_eq!(Response::decode(&f), Ok(want));
    }

    #[test]
    fn volume_kinds_with_garbage_bodies_never_panic(
        kind in proptest::sample::select(vec![
            K_VOLUME_OPEN, K_VOLUME_CHUNKS, K_VOLUME_CLOSE, K_VOLUME_LIST,
            K_VOLUME_DESTROY, K_VOLUME_OPENED, K_CHUNK_LIST, K_VOLUME_CLOSED,
            K_VOLUME_LISTING, K_VOLUME_DESTROYED,
        ]),
        body in proptest::collection::vec(any::<u8>(), 0..=MAX_CONTROL_BODY),
    ) {
        let f = frame(kind, &body);
        let _ = Request::decode(&f);
        let _ = Response::decode(&f);
    }

    #[test]
    fn mutated_valid_frames_never_panic(
        which in any::<proptest::sample::Index>(),
        flips in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let frames = valid_frames();
        let mut f = frames[which.index(frames.len())].clone();
        for (at, x) in flips {
            let i = at.index(f.len());
            f[i] ^= x;
        }
        let _ = Request::decode(&f);
        let _ = Response::decode(&f);
    }

    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = Request::decode(&bytes);
        let _ = Response::decode(&bytes);
    }

    #[test]
    fn garbage_after_a_valid_header_never_panics(
        kind in any::<u16>(),
        body in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let f = frame(kind, &body);
        let _ = Request::decode(&f);
        let _ = Response::decode(&f);
    }

    #[test]
    fn hello_round_trips(client_id in any::<u64>(), nonce in any::<[u8; 32]>(), resume in any::<bool>()) {
        let req = Request::Hello { client_id, nonce, resume };
        prop_assert_eq!(Request::decode(&req.encode()), Ok(req));
    }
}

#[test]
fn a_version_1_frame_is_refused_as_another_version() {
    // Version 1's Hello carried the token in clear; its frames are not read at all.
    let mut old = Request::Stat.encode();
    old[0..2].copy_from_slice(&1u16.to_le_bytes());
    assert_eq!(
        Request::decode(&old),
        Err(ProtocolError::Version { got: 1 })
    );
}

#[test]
fn a_copy_of_no_span_too_many_bytes_or_an_empty_span_is_refused() {
    let decode = |spans: Vec<CopySpan>| {
        // Encoded by hand past the encoder's own limit.
        let mut body = vec![spans.len() as u8];
        for s in &spans {
            body.extend_from_slice(&s.src_addr.to_le_bytes());
            body.extend_from_slice(&s.src_rkey.to_le_bytes());
            body.extend_from_slice(&s.dst_addr.to_le_bytes());
            body.extend_from_slice(&s.dst_rkey.to_le_bytes());
            body.extend_from_slice(&s.len.to_le_bytes());
        }
        Request::decode(&frame(0x000a, &body))
    };
    assert_eq!(decode(vec![]), Err(ProtocolError::BadField("copy spans")));
    assert_eq!(
        decode(vec![span(0, 0)]),
        Err(ProtocolError::BadField("copy length"))
    );
    let max = MAX_COPY_BYTES as u32;
    assert!(decode(vec![span(0, max)]).is_ok());
    assert_eq!(
        decode(vec![span(0, max), span(1, 1)]),
        Err(ProtocolError::BadField("copy length"))
    );
    assert_eq!(
        decode((0..=MAX_COPY_SPANS as u64).map(|i| span(i, 1)).collect()),
        Err(ProtocolError::BadField("copy spans"))
    );
    // The encoder never sends more spans than a frame carries.
    let many = Request::Copy {
        spans: (0..40).map(|i| span(i, 1)).collect(),
    };
    match Request::decode(&many.encode()) {
        Ok(Request::Copy { spans }) => assert_eq!(spans.len(), MAX_COPY_SPANS),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_prove_with_a_proof_cut_short_or_a_hello_with_a_bad_flag_is_refused() {
    let prove = Request::Prove {
        proof: [7; crate::auth::PROOF_LEN],
        session: Some([8; crate::auth::PROOF_LEN]),
    }
    .encode();
    // One byte short of the session proof: an error, not a shorter proof.
    let body = &prove[HEADER_LEN..prove.len() - 1];
    assert!(Request::decode(&frame(K_PROVE, body)).is_err());
    // Only the token's proof, cut short.
    assert!(Request::decode(&frame(K_PROVE, &[7; crate::auth::PROOF_LEN - 1])).is_err());
    let mut hello = Request::Hello {
        client_id: 1,
        nonce: [0; crate::auth::NONCE_LEN],
        resume: false,
    }
    .encode();
    *hello.last_mut().unwrap() = 2;
    assert_eq!(
        Request::decode(&hello),
        Err(ProtocolError::BadField("resume"))
    );
}

#[test]
fn a_session_secret_never_shows_in_debug_output() {
    let secret = SessionSecret([0x42; SESSION_SECRET_LEN]);
    let shown = format!("{secret:?}");
    assert!(!shown.contains("66"), "{shown}");
    assert!(shown.contains("SessionSecret(..)"), "{shown}");
}
