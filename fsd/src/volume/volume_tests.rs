// End-to-end tests of the volume core without a mount live in fsd/src/fs/tests
// (they need the whole filesystem); this file holds the pure helpers' tests.
use super::*;
use crate::remote::Replica;

#[test]
fn a_block_stores_only_the_copies_of_this_generations_members() {
    let members = vec![Some((0, 11)), None, Some((3, 13))];
    let rep = |node: u16, epoch: u32, addr: u64| Replica {
        node,
        epoch,
        remote: RemoteAddr { addr, rkey: 1 },
    };
    let e = BlockEntry {
        loc: BlockLoc::from_replicas(
            65536,
            [rep(0, 0, 4096), rep(1, 0, 8192), rep(2, 2, 0), rep(2, 3, 0)],
        ),
        written: true,
        sums: Default::default(),
    };
    let Record::Block(b) = encode_block(&members, 5, 9, &e, true) else {
        panic!("not a block record");
    };
    assert_eq!(b.flags, BLOCK_WRITTEN);
    // node 1 is no member; node 2's copy of epoch 2 is of an older link.
    assert_eq!(
        b.copies,
        vec![
            StoredCopy {
                slot: 0,
                addr: 4096
            },
            StoredCopy { slot: 2, addr: 0 }
        ]
    );
}

#[test]
fn a_block_stores_its_known_page_sums_only_when_asked_and_when_written() {
    let loc = BlockLoc::from_replicas(
        16384,
        [Replica {
            node: 0,
            epoch: 0,
            remote: RemoteAddr { addr: 0, rkey: 1 },
        }],
    );
    let mut sums = crate::remote::sums::Sums::default();
    sums.record(&crate::remote::sums::written(4096, &[7u8; 4096]));
    let mut e = BlockEntry {
        loc,
        written: true,
        sums,
    };
    let members = vec![Some((0, 11))];
    let stored = |e: &BlockEntry, with: bool| match encode_block(&members, 5, 0, e, with) {
        Record::Block(b) => b.sums,
        _ => panic!("not a block record"),
    };
    let one = crc32c::crc32c(&[7u8; 4096]);
    assert_eq!(stored(&e, true), vec![None, Some(one)]);
    assert!(
        stored(&e, false).is_empty(),
        "no sums while a write-back may change the pages"
    );
    e.written = false;
    assert!(
        stored(&e, true).is_empty(),
        "an unwritten block has no bytes to sum"
    );
}
