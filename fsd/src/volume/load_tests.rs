use super::*;
use crate::volume::memory::{MemorySource, GENERATION};

/// Node `node`'s newest superblock, changed by `change` and written back with a
/// valid checksum (what a memnode that forges one does).
fn forge(src: &mut MemorySource, node: usize, change: impl FnOnce(&mut Superblock)) {
    let n = &mut src.nodes[node];
    let root = n.root.expect("a root");
    let at = root.addr + (GENERATION % 2) * SUPERBLOCK_SLOT as u64;
    let mut sb = Superblock::decode(&n.read(at, SUPERBLOCK_SLOT))
        .expect("decodes")
        .expect("written");
    change(&mut sb);
    n.write(at, &vec![0; SUPERBLOCK_SLOT]);
    n.write(at, &sb.encode());
}

fn refused(src: &MemorySource) -> String {
    match load(src, "v") {
        Err(e) => e.to_string(),
        Ok(l) => panic!("loaded generation {:?}", l.map(|l| l.generation)),
    }
}

#[test]
fn a_healthy_volume_loads_with_its_spares_and_nothing_leaked() {
    let src = MemorySource::volume(2, 5);
    let l = load(&src, "v").expect("loads").expect("has metadata");
    assert_eq!(l.generation, GENERATION);
    assert_eq!(l.log_entries, 1);
    assert_eq!(l.image.inodes.len(), 6);
    assert!(l.image.check().is_empty(), "{:?}", l.image.check());
    assert_eq!(l.spares.len(), 2, "the older slot's chunks on each node");
    assert!(l.leaked().is_empty(), "{:?}", l.leaked());
    assert_eq!(l.lost_blocks, 0);
    let ck = src.nodes[0].chunks[0];
    assert!(l.checkpoint_len > 0 && l.checkpoint_len < ck.len);
    let ns: crate::namespace::Namespace = l.into_namespace(&src, Arc::new(Journal::default()));
    assert_eq!(ns.inodes().len(), 6);
}

#[test]
fn a_forged_superblock_whose_areas_are_in_no_chunk_is_refused_naming_them() {
    let mut src = MemorySource::volume(1, 2);
    forge(&mut src, 0, |sb| {
        if let Some((ck, _)) = &mut sb.checkpoint {
            ck.len = u64::MAX - ck.addr;
        }
    });
    let e = refused(&src);
    assert!(
        e.contains("checkpoint at") && e.contains("in no chunk"),
        "{e}"
    );
    let mut src = MemorySource::volume(1, 2);
    forge(&mut src, 0, |sb| {
        sb.log = Some(Area {
            addr: 0x1000,
            len: 1 << 40,
        })
    });
    let e = refused(&src);
    assert!(
        e.contains("log at 0x1000") && e.contains("in no chunk"),
        "{e}"
    );
}

#[test]
fn an_area_longer_than_memory_holds_is_an_error_not_an_abort() {
    // A memnode that says it lends 4 EiB, lists a chunk of 2 EiB and names a
    // checkpoint filling it: everything adds up but the memory to read it into.
    let mut src = MemorySource::volume(1, 2);
    let n = &mut src.nodes[0];
    n.capacity = 1 << 62;
    let huge = Allocation {
        addr: n.root.expect("a root").addr + (16 << 20),
        len: 1 << 61,
        rkey: 9,
    };
    n.chunks.push(huge);
    forge(&mut src, 0, |sb| {
        sb.checkpoint = Some((
            Area {
                addr: huge.addr,
                len: huge.len,
            },
            0,
        ))
    });
    let e = refused(&src);
    assert!(e.contains("more than fsd can allocate"), "{e}");
}

#[test]
fn chunk_lists_and_roots_that_cannot_be_refuse_the_volume_naming_them() {
    let mut src = MemorySource::volume(1, 2);
    let last = src.nodes[0].chunks.len() - 1;
    src.nodes[0].chunks[last].addr = u64::MAX - 4095;
    let e = refused(&src);
    assert!(
        e.contains("memnode0") && e.contains("VolumeChunks") && e.contains("wraps"),
        "{e}"
    );
    let mut src = MemorySource::volume(1, 2);
    let c = src.nodes[0].chunks[0];
    src.nodes[0].chunks.insert(1, c);
    let e = refused(&src);
    assert!(e.contains("repeated"), "{e}");
    let mut src = MemorySource::volume(1, 2);
    src.nodes[0].chunks[0].len = src.nodes[0].capacity + 1;
    let e = refused(&src);
    assert!(e.contains("capacity"), "{e}");
    let mut src = MemorySource::volume(1, 2);
    src.nodes[0].root.as_mut().expect("a root").len = 1024;
    let e = refused(&src);
    assert!(e.contains("too small for the two superblock slots"), "{e}");
}

#[test]
fn counters_past_the_format_fall_back_to_the_older_slot() {
    let mut src = MemorySource::volume(1, 2);
    forge(&mut src, 0, |sb| sb.generation = u64::MAX);
    let l = load(&src, "v").expect("loads").expect("has metadata");
    assert_eq!(
        l.generation,
        GENERATION - 1,
        "the older slot is the newest valid"
    );
    let problem = l.copies[0].problem.clone().unwrap_or_default();
    assert!(problem.contains("generation"), "{problem}");
}

#[test]
fn the_checkpoint_length_the_mount_plans_for_is_one_that_was_read() {
    let mut src = MemorySource::volume(2, 3);
    forge(&mut src, 1, |sb| {
        if let Some((ck, _)) = &mut sb.checkpoint {
            ck.len = 1 << 40;
        }
    });
    let l = load(&src, "v")
        .expect("loads")
        .expect("from the other copy");
    assert!(l.checkpoint_len < 1 << 20, "{}", l.checkpoint_len);
    let problem = l.copies[1].problem.clone().unwrap_or_default();
    assert!(problem.contains("in no chunk"), "{problem}");
}
