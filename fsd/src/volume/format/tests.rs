use super::*;
use proptest::prelude::*;

fn attr(ino: u64) -> StoredAttr {
    StoredAttr {
        ino,
        kind: 1,
        perm: 0o4755,
        nlink: 2,
        uid: 1000,
        gid: 100,
        rdev: 0,
        size: 1 << 40,
        atime: Time { secs: -5, nanos: 7 },
        mtime: Time {
            secs: 1_700_000_000,
            nanos: 999_999_999,
        },
        ctime: Time::default(),
    }
}

fn every_record() -> Vec<Record> {
    vec![
        Record::Attr(attr(7)),
        Record::Target {
            ino: 7,
            target: b"../x/y".to_vec(),
        },
        Record::Xattrs {
            ino: 7,
            xattrs: vec![
                (b"user.a".to_vec(), vec![0, 1, 2]),
                (b"user.b".to_vec(), vec![]),
            ],
        },
        Record::Block(StoredBlock {
            ino: 7,
            index: 3,
            flags: BLOCK_WRITTEN,
            alloc_len: 65536,
            sums: vec![
                Some(0xdead_beef),
                None,
                None,
                Some(7),
                None,
                None,
                None,
                None,
                Some(0),
            ],
            copies: vec![
                StoredCopy {
                    slot: 0,
                    addr: 1 << 30,
                },
                StoredCopy {
                    slot: 2,
                    addr: 4096,
                },
            ],
        }),
        Record::SumsStale { ino: 7 },
        Record::BlockGone { ino: 7, index: 9 },
        Record::InodeGone { ino: 8 },
        Record::Dir { ino: 2, parent: 1 },
        Record::DirAdd {
            dir: 1,
            cookie: 3,
            ino: 2,
            name: b"d".to_vec(),
        },
        Record::DirRemove {
            dir: 1,
            name: b"d".to_vec(),
        },
        Record::DirNextCookie { dir: 1, next: 4 },
        Record::NextIno { next: 9 },
    ]
}

#[test]
fn every_record_round_trips() {
    let recs = every_record();
    assert_eq!(decode_records(&encode_records(&recs)), Ok(recs));
}

#[test]
fn every_truncation_of_a_record_run_is_an_error() {
    let bytes = encode_records(&every_record());
    let mut ok_cuts = 0;
    for cut in 0..bytes.len() {
        // A cut on a record boundary decodes as the records before it; any other
        // cut must fail.
        if let Ok(r) = decode_records(&bytes[..cut]) {
            ok_cuts += 1;
            assert_eq!(encode_records(&r), bytes[..cut].to_vec());
        }
    }
    assert_eq!(ok_cuts, every_record().len(), "only boundaries decode");
}

#[test]
fn a_log_replays_in_sequence_and_stops_at_a_torn_tail() {
    let mut log = vec![0u8; 4096];
    let mut at = 0;
    for seq in 10..14 {
        let e = encode_entry(seq, &encode_records(&[Record::NextIno { next: seq }]));
        log[at..at + e.len()].copy_from_slice(&e);
        at += e.len();
    }
    let scan = scan_log(&log, 10);
    assert_eq!(scan.entries.len(), 4);
    assert_eq!(scan.end, at);
    assert_eq!(scan.damaged_at, None);
    // Tear the last entry: three remain, and nothing valid follows.
    let last_start = scan.entries[2].end;
    log[last_start + ENTRY_HEADER + 1] ^= 0xff;
    let scan = scan_log(&log, 10);
    assert_eq!(scan.entries.len(), 3);
    assert_eq!(scan.end, last_start);
    assert_eq!(scan.damaged_at, None);
    // A log from another start is not replayed at all.
    assert!(scan_log(&log, 11).entries.is_empty());
}

#[test]
fn damage_in_the_middle_of_a_log_is_told_from_a_torn_tail() {
    let mut log = vec![0u8; 4096];
    let mut at = 0;
    let mut starts = Vec::new();
    for seq in 1..6 {
        let e = encode_entry(seq, &encode_records(&[Record::InodeGone { ino: seq }]));
        starts.push(at);
        log[at..at + e.len()].copy_from_slice(&e);
        at += e.len();
    }
    log[starts[1] + ENTRY_HEADER] ^= 1;
    let scan = scan_log(&log, 1);
    assert_eq!(scan.entries.len(), 1);
    assert_eq!(scan.damaged_at, Some(starts[1]));
}

#[test]
fn a_superblock_with_counters_past_the_format_or_wrapping_areas_is_refused() {
    let good = Superblock {
        volume_id: 1,
        generation: MAX_COUNTER,
        block_size: 65536,
        first_seq: MAX_COUNTER,
        checkpoint: Some((
            Area {
                addr: 4096,
                len: 64,
            },
            0,
        )),
        log: Some(Area {
            addr: u64::MAX - 4096,
            len: 4096,
        }),
        members: vec![3],
        version: FORMAT_VERSION,
    };
    let decode = |sb: &Superblock| {
        let mut slot = sb.encode();
        slot.resize(SUPERBLOCK_SLOT, 0);
        Superblock::decode(&slot)
    };
    assert_eq!(decode(&good), Ok(Some(good.clone())));
    let refused = |sb: Superblock, field: &'static str| {
        assert_eq!(decode(&sb), Err(FormatError::BadField(field)), "{sb:?}");
    };
    refused(
        Superblock {
            generation: MAX_COUNTER + 1,
            ..good.clone()
        },
        "generation",
    );
    refused(
        Superblock {
            first_seq: u64::MAX,
            ..good.clone()
        },
        "first sequence number",
    );
    refused(
        Superblock {
            checkpoint: Some((
                Area {
                    addr: 4096,
                    len: u64::MAX,
                },
                0,
            )),
            ..good.clone()
        },
        "checkpoint area",
    );
    refused(
        Superblock {
            log: Some(Area {
                addr: u64::MAX - 4096,
                len: 4097,
            }),
            ..good
        },
        "log area",
    );
}

#[test]
fn a_superblock_round_trips_and_any_flipped_byte_is_caught() {
    let sb = Superblock {
        volume_id: 42,
        generation: 7,
        block_size: 65536,
        first_seq: 100,
        checkpoint: Some((
            Area {
                addr: 8192,
                len: 300,
            },
            0x1234,
        )),
        log: Some(Area {
            addr: 1 << 20,
            len: 8 << 20,
        }),
        members: vec![11, 0, 13],
        version: FORMAT_VERSION,
    };
    let mut slot = sb.encode();
    slot.resize(SUPERBLOCK_SLOT, 0);
    assert_eq!(Superblock::decode(&slot), Ok(Some(sb.clone())));
    assert_eq!(Superblock::decode(&vec![0; SUPERBLOCK_SLOT]), Ok(None));
    let used = sb.encode().len();
    for i in 0..used {
        let mut bad = slot.clone();
        bad[i] ^= 0x40;
        assert!(Superblock::decode(&bad).is_err(), "flip at {i} went unseen");
    }
}

#[test]
fn a_checkpoint_checks_its_generation_and_every_byte() {
    let body = encode_records(&every_record());
    let ck = encode_checkpoint(5, &body);
    assert_eq!(decode_checkpoint(&ck, 5), Ok(every_record()));
    assert!(decode_checkpoint(&ck, 6).is_err());
    for i in (0..ck.len()).step_by(7) {
        let mut bad = ck.clone();
        bad[i] ^= 0x01;
        assert!(
            decode_checkpoint(&bad, 5).is_err(),
            "flip at {i} went unseen"
        );
    }
    assert!(decode_checkpoint(&ck[..ck.len() - 1], 5).is_err());
}

/// A version 1 block record: the checksum word that version always wrote as zero.
fn v1_block_record() -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&7u64.to_le_bytes());
    body.extend_from_slice(&3u64.to_le_bytes());
    body.push(BLOCK_WRITTEN);
    body.extend_from_slice(&65536u32.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes());
    body.push(1);
    body.extend_from_slice(&2u16.to_le_bytes());
    body.extend_from_slice(&4096u64.to_le_bytes());
    let mut rec = vec![4u8];
    rec.extend_from_slice(&(body.len() as u32).to_le_bytes());
    rec.extend_from_slice(&body);
    rec
}

#[test]
fn a_version_1_block_record_reads_as_one_without_sums() {
    let decoded = decode_records(&v1_block_record()).expect("a version 1 record decodes");
    assert_eq!(
        decoded,
        vec![Record::Block(StoredBlock {
            ino: 7,
            index: 3,
            flags: BLOCK_WRITTEN,
            alloc_len: 65536,
            sums: Vec::new(),
            copies: vec![StoredCopy {
                slot: 2,
                addr: 4096
            }],
        })]
    );
    assert_eq!(
        encode_records(&decoded),
        v1_block_record(),
        "and is written the same"
    );
}

#[test]
fn page_sums_are_checked_against_the_allocation_and_their_bitmap() {
    let block = |alloc_len: u32, sums: Vec<Option<u32>>| {
        encode_records(&[Record::Block(StoredBlock {
            ino: 1,
            index: 0,
            flags: BLOCK_WRITTEN,
            alloc_len,
            sums,
            copies: Vec::new(),
        })])
    };
    // Trailing unknown sums are not stored.
    let trimmed = decode_records(&block(16384, vec![Some(1), None, None])).unwrap();
    assert!(matches!(&trimmed[0], Record::Block(b) if b.sums == vec![Some(1)]));
    // More sums than pages.
    assert_eq!(
        decode_records(&block(4096, vec![Some(1), Some(2)])),
        Err(FormatError::BadField("page sums"))
    );
    // A bitmap bit past the count, and a count whose last sum is not known.
    let good = block(65536, vec![Some(1), None, Some(3)]);
    let bits_at = good.len() - 9;
    let mut bad = good.clone();
    bad[bits_at] |= 0x80;
    assert!(decode_records(&bad).is_err());
    let mut bad = good.clone();
    bad[bits_at] &= !0x04;
    assert!(decode_records(&bad).is_err());
}

#[test]
fn versions_1_and_2_are_read_and_others_refused() {
    let mut sb = Superblock {
        volume_id: 1,
        generation: 2,
        block_size: 65536,
        first_seq: 1,
        checkpoint: None,
        log: None,
        members: vec![5],
        version: FORMAT_VERSION,
    };
    let encoded = sb.encode();
    let with_version = |v: u32| {
        let mut bytes = encoded.clone();
        bytes[8..12].copy_from_slice(&v.to_le_bytes());
        let len = bytes.len() - 4;
        let c = crc(&bytes[..len]);
        bytes[len..].copy_from_slice(&c.to_le_bytes());
        bytes
    };
    sb.version = 1;
    assert_eq!(Superblock::decode(&with_version(1)), Ok(Some(sb.clone())));
    assert_eq!(
        Superblock::decode(&with_version(3)),
        Err(FormatError::Version(3))
    );
    assert_eq!(
        Superblock::decode(&with_version(0)),
        Err(FormatError::Version(0))
    );
    let mut ck = encode_checkpoint(4, &v1_block_record());
    ck[8..12].copy_from_slice(&1u32.to_le_bytes());
    let head_crc = crc(&ck[..CHECKPOINT_HEADER - 4]);
    ck[CHECKPOINT_HEADER - 4..CHECKPOINT_HEADER].copy_from_slice(&head_crc.to_le_bytes());
    assert_eq!(decode_checkpoint(&ck, 4).map(|r| r.len()), Ok(1));
}

proptest! {
    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let _ = decode_records(&bytes);
        let _ = scan_log(&bytes, 0);
        let _ = Superblock::decode(&bytes);
        let _ = decode_checkpoint(&bytes, 1);
    }

    #[test]
    fn garbage_behind_a_valid_record_header_never_panics(
        kind in 0u8..16,
        body in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        let mut b = vec![kind];
        b.extend_from_slice(&(body.len() as u32).to_le_bytes());
        b.extend_from_slice(&body);
        let _ = decode_records(&b);
    }
}
