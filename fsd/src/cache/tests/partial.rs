//! Pages that hold part of their block: sector masks, writes of whole sectors and
//! of parts of them, random reads of some sectors, write-back of whole blocks or of
//! dirty sectors, and the cache with sectors against a plain map of blocks.

use super::*;
use proptest::prelude::*;
use std::collections::HashMap;

#[test]
fn sector_masks() {
    assert_eq!(bits(0, 0), 0);
    assert_eq!(bits(3, 2), 0);
    assert_eq!(bits(0, 64), u64::MAX);
    assert_eq!(bits(1, 3), 0b110);
    assert_eq!(bits(63, 64), 1 << 63);
    let s = Sectors::new(16, 4);
    assert_eq!(s.full, 0b1111);
    assert_eq!(s.of(0, 16), (0b1111, 0b1111));
    assert_eq!(s.of(4, 8), (0b0010, 0b0010));
    assert_eq!(s.of(5, 8), (0, 0b0010));
    assert_eq!(s.of(3, 13), (0b0110, 0b1111));
    assert_eq!(s.of(4, 5), (0, 0b0010));
    assert_eq!(s.of(12, 16), (0b1000, 0b1000));
    assert_eq!(sector_size(4096), 4096);
    assert_eq!(sector_size(64 << 10), 4096);
    assert_eq!(sector_size(1 << 20), 16 << 10);
    assert_eq!(sector_size(16 << 20), 256 << 10);
    assert_eq!(Sectors::new(16 << 20, sector_size(16 << 20)).full, u64::MAX);
}

#[test]
fn an_aligned_write_to_an_uncached_block_loads_nothing_and_a_read_merges() {
    let b = MemRemote::default();
    let c = sectored(4);
    lock(&b.blocks).insert((1, 0), vec![5; BS]);
    write_at(&c, &b, (1, 0), 4, &[9; 8]);
    assert_eq!(b.loads.load(Ordering::SeqCst), 0, "no load at write time");
    assert_eq!(c.counters.partial_writes.load(Ordering::SeqCst), 1);
    // A read of the partly valid, dirty page: the new sectors over the old block,
    // loading only the sectors the page lacks (two runs, in one batch).
    let want = block_of(&[5, 5, 5, 5, 9, 9, 9, 9, 9, 9, 9, 9, 5, 5, 5, 5]);
    assert_eq!(read_block(&c, &b, (1, 0)), want);
    assert_eq!(*lock(&b.loaded), vec![((1, 0), 0, 4), ((1, 0), 12, 4)]);
    assert_eq!(b.load_calls.load(Ordering::SeqCst), 1);
    assert_eq!(c.counters.partial_fills.load(Ordering::SeqCst), 1);
    // Now fully valid: no second load, and a write-back stores the merged block.
    assert_eq!(read_block(&c, &b, (1, 0)), want);
    c.flush_all(&b).unwrap();
    assert_eq!(b.loads.load(Ordering::SeqCst), 2);
    assert_eq!(lock(&b.blocks)[&(1, 0)], want);
}

#[test]
fn write_back_completes_partial_pages_in_one_load_batch_then_one_store() {
    let b = MemRemote::default();
    let c = sectored(8);
    for i in 0..4u64 {
        lock(&b.blocks).insert((1, i), vec![i as u8 + 1; BS]);
    }
    for i in 0..4u64 {
        write_at(&c, &b, (1, i), 8, &[0xa0 + i as u8; 4]);
    }
    write_block(&c, &b, (1, 4), 0x77); // full: needs no load
    assert_eq!(b.loads.load(Ordering::SeqCst), 0);
    c.flush_inode(&b, 1).unwrap();
    assert_eq!(b.load_calls.load(Ordering::SeqCst), 1, "one load batch");
    assert_eq!(
        b.loads.load(Ordering::SeqCst),
        8,
        "the four partial pages, each the runs around its valid sector"
    );
    assert_eq!(b.store_calls.load(Ordering::SeqCst), 1, "one store batch");
    assert_eq!(b.stores.load(Ordering::SeqCst), 5);
    let blocks = lock(&b.blocks);
    for i in 0..4u64 {
        let mut want = vec![i as u8 + 1; BS];
        want[8..12].fill(0xa0 + i as u8);
        assert_eq!(blocks[&(1, i)], want, "block {i}");
    }
    assert_eq!(blocks[&(1, 4)], vec![0x77; BS]);
}

#[test]
fn a_partial_page_evicted_and_read_back_is_the_merged_block() {
    // Write a block whole, evict it, write one sector, evict, read back.
    let b = MemRemote::default();
    let c = sectored(2);
    write_block(&c, &b, (1, 0), 3);
    for i in 0..4u64 {
        write_block(&c, &b, (2, i), 8);
    }
    assert_eq!(lock(&b.blocks)[&(1, 0)], vec![3; BS]);
    let loads = b.loads.load(Ordering::SeqCst);
    write_at(&c, &b, (1, 0), 12, &[4; 4]);
    assert_eq!(
        b.loads.load(Ordering::SeqCst),
        loads,
        "no load at write time"
    );
    for i in 0..4u64 {
        write_block(&c, &b, (2, i), 9);
    }
    let want = block_of(&[3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4]);
    assert_eq!(lock(&b.blocks)[&(1, 0)], want, "written back merged");
    assert_eq!(read_block(&c, &b, (1, 0)), want);
}

#[test]
fn a_write_ending_inside_a_missing_sector_keeps_its_bytes_there_without_a_load() {
    let b = MemRemote::default();
    let c = sectored(4);
    lock(&b.blocks).insert((1, 0), vec![1; BS]);
    // Sector 0 whole, then inside it: no load.
    write_at(&c, &b, (1, 0), 0, &[2; 4]);
    write_at(&c, &b, (1, 0), 1, &[3; 2]);
    // Ends inside sector 1, which the page lacks: bytes 4..6 become its part.
    write_at(&c, &b, (1, 0), 2, &[4; 4]);
    assert_eq!(b.loads.load(Ordering::SeqCst), 0);
    // A whole read loads around the part: bytes 6..16, one run.
    let want = block_of(&[2, 3, 4, 4, 4, 4, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
    assert_eq!(read_block(&c, &b, (1, 0)), want);
    assert_eq!(*lock(&b.loaded), vec![((1, 0), 6, 10)]);
    // A write that starts and ends inside missing sectors keeps both ends as parts.
    lock(&b.blocks).insert((1, 1), vec![6; BS]);
    write_at(&c, &b, (1, 1), 2, &[9; 12]);
    assert_eq!(b.loads.load(Ordering::SeqCst), 1);
    // A random read of one of them loads the rest of that sector only.
    assert_eq!(read_at(&c, &b, (1, 1), 12, 16), vec![9, 9, 6, 6]);
    assert_eq!(lock(&b.loaded).last(), Some(&((1, 1), 14, 2)));
    let want = block_of(&[6, 6, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 6, 6]);
    assert_eq!(read_block(&c, &b, (1, 1)), want);
    c.flush_all(&b).unwrap();
    assert_eq!(lock(&b.blocks)[&(1, 0)][..], read_block(&c, &b, (1, 0))[..]);
    assert_eq!(lock(&b.blocks)[&(1, 1)], want);
}

#[test]
fn a_write_split_inside_a_sector_completes_it_without_a_load() {
    // The kernel splits a direct write from a buffer that is not page-aligned at a
    // byte inside a sector; the two halves may come in either order.
    let b = MemRemote::default();
    let c = sectored(4);
    for (k, cut) in [(0u64, 6usize), (1, 9), (2, 15)] {
        lock(&b.blocks).insert((1, k), vec![1; BS]);
        let data: Vec<u8> = (0..BS as u8).map(|x| x + 10).collect();
        if k % 2 == 0 {
            write_at(&c, &b, (1, k), 0, &data[..cut]);
            write_at(&c, &b, (1, k), cut, &data[cut..]);
        } else {
            write_at(&c, &b, (1, k), cut, &data[cut..]);
            write_at(&c, &b, (1, k), 0, &data[..cut]);
        }
        assert_eq!(read_block(&c, &b, (1, k)), data, "block {k}");
    }
    assert_eq!(b.loads.load(Ordering::SeqCst), 0, "{:?}", lock(&b.loaded));
    c.flush_all(&b).unwrap();
    assert_eq!(b.loads.load(Ordering::SeqCst), 0);
    for k in 0..3u64 {
        let want: Vec<u8> = (0..BS as u8).map(|x| x + 10).collect();
        assert_eq!(lock(&b.blocks)[&(1, k)], want);
    }
}

#[test]
fn a_write_that_would_leave_a_gap_in_a_part_loads_around_the_part_first() {
    let b = MemRemote::default();
    let c = sectored(4);
    lock(&b.blocks).insert((1, 0), vec![8; BS]);
    write_at(&c, &b, (1, 0), 5, &[9]);
    assert_eq!(b.loads.load(Ordering::SeqCst), 0);
    // Byte 7 would leave byte 6 unknown between the part and it.
    write_at(&c, &b, (1, 0), 7, &[10]);
    assert_eq!(*lock(&b.loaded), vec![((1, 0), 4, 1), ((1, 0), 6, 2)]);
    assert_eq!(read_at(&c, &b, (1, 0), 4, 8), vec![8, 9, 8, 10]);
    assert_eq!(b.loads.load(Ordering::SeqCst), 2, "sector 1 is whole now");
    c.flush_all(&b).unwrap();
    let want = block_of(&[8, 8, 8, 8, 8, 9, 8, 10, 8, 8, 8, 8, 8, 8, 8, 8]);
    assert_eq!(lock(&b.blocks)[&(1, 0)], want);
}

#[test]
fn parts_are_written_back_as_they_are_when_the_block_can_be_stored_in_part() {
    let b = MemRemote::default();
    b.parts.store(true, Ordering::SeqCst);
    let c = sectored(4);
    lock(&b.blocks).insert((1, 0), vec![5; BS]);
    // Parts 2..4 and 12..14, sectors 1 and 2 whole.
    write_at(&c, &b, (1, 0), 2, &[6; 12]);
    c.flush_all(&b).unwrap();
    assert_eq!(b.loads.load(Ordering::SeqCst), 0);
    let mut stored = lock(&b.stored).clone();
    stored.sort();
    assert_eq!(
        stored,
        vec![((1, 0), 2, 2), ((1, 0), 4, 8), ((1, 0), 12, 2)]
    );
    let want = block_of(&[5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 5, 5]);
    assert_eq!(lock(&b.blocks)[&(1, 0)], want);
    assert_eq!(c.dirty_pages(), 0);
    // Clean now; the parts' bytes come back from the backing with the rest.
    assert_eq!(read_block(&c, &b, (1, 0)), want);
}

#[test]
fn only_what_a_write_touches_becomes_dirty_and_reads_dirty_nothing() {
    let b = MemRemote::default();
    b.parts.store(true, Ordering::SeqCst);
    let c = sectored(4);
    lock(&b.blocks).insert((1, 0), vec![5; BS]);
    // A page held whole, then one sector of it written, then read whole.
    assert_eq!(read_block(&c, &b, (1, 0)), vec![5; BS]);
    write_at(&c, &b, (1, 0), 9, &[7; 2]);
    assert_eq!(read_block(&c, &b, (1, 0))[8..12], [5, 7, 7, 5]);
    assert_eq!(read_at(&c, &b, (1, 0), 0, 16)[9], 7);
    c.flush_all(&b).unwrap();
    assert_eq!(*lock(&b.stored), vec![((1, 0), 8, 4)]);
}

#[test]
fn a_zero_fill_keeps_the_valid_sectors() {
    let b = MemRemote::default();
    let c = sectored(4);
    lock(&b.blocks).insert((1, 0), vec![1; BS]);
    write_at(&c, &b, (1, 0), 4, &[2; 4]);
    assert_eq!(
        view(&c, &b, (1, 0), Fill::Zero).unwrap(),
        block_of(&[0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0])
    );
    assert_eq!(b.loads.load(Ordering::SeqCst), 0);
}

#[test]
fn a_zero_fill_keeps_the_parts_and_makes_them_dirty_sectors() {
    let b = MemRemote::default();
    let c = sectored(4);
    write_at(&c, &b, (1, 0), 6, &[2; 4]);
    assert_eq!(
        view(&c, &b, (1, 0), Fill::Zero).unwrap(),
        block_of(&[0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0])
    );
    assert_eq!(b.loads.load(Ordering::SeqCst), 0);
    c.flush_all(&b).unwrap();
    assert_eq!(
        lock(&b.blocks)[&(1, 0)],
        block_of(&[0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0])
    );
}

#[test]
fn an_invalidated_partial_page_is_neither_loaded_nor_stored() {
    let b = MemRemote::default();
    let c = sectored(4);
    lock(&b.blocks).insert((1, 0), vec![1; BS]);
    write_at(&c, &b, (1, 0), 0, &[2; 4]);
    c.invalidate(1, 0);
    c.flush_all(&b).unwrap();
    assert_eq!(b.loads.load(Ordering::SeqCst), 0);
    assert_eq!(b.stores.load(Ordering::SeqCst), 0);
    assert_eq!(lock(&b.blocks)[&(1, 0)], vec![1; BS]);
    // The block as it is in the backing, not the dropped sector.
    assert_eq!(read_block(&c, &b, (1, 0)), vec![1; BS]);
}

#[test]
fn a_partial_page_that_cannot_be_completed_is_not_stored_and_the_error_is_recorded() {
    let b = MemRemote::default();
    let c = sectored(2);
    lock(&b.blocks).insert((1, 0), vec![1; BS]);
    lock(&b.failing).push((1, 0));
    write_at(&c, &b, (1, 0), 4, &[2; 4]);
    assert!(c.flush_inode(&b, 1).is_err(), "fsync reports it");
    assert_eq!(
        b.stores.load(Ordering::SeqCst),
        0,
        "no half-known block stored"
    );
    assert_eq!(*lock(&b.recorded), vec![(1, 0)]);
    assert_eq!(c.dirty_pages(), 1, "still dirty after a failed fsync");
    // A read fails too, and leaves the page's own sector alone.
    assert!(c
        .access(&b, 1, 0..1, |_| Fill::Load, |_, _, _| Ok(()))
        .is_err());
    lock(&b.failing).clear();
    let want = block_of(&[1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1]);
    assert_eq!(read_block(&c, &b, (1, 0)), want);
    c.flush_all(&b).unwrap();
    assert_eq!(lock(&b.blocks)[&(1, 0)], want);
    // Eviction: the write-back cannot complete the page; it is dropped, recorded.
    lock(&b.failing).push((1, 1));
    write_at(&c, &b, (1, 1), 0, &[3; 4]);
    for i in 0..4u64 {
        write_block(&c, &b, (2, i), 8);
    }
    assert_eq!(*lock(&b.recorded), vec![(1, 0), (1, 1)]);
    assert!(!lock(&b.blocks).contains_key(&(1, 1)));
}

#[derive(Debug, Clone)]
enum PartOp {
    /// Block, start, length (clamped to the block), byte.
    Write(u64, usize, usize, u8),
    /// One write in two pieces cut at any byte, the second piece first or not (as
    /// the kernel splits a direct write): block, start, length, cut, second first.
    SplitWrite(u64, usize, usize, usize, bool),
    Read(u64),
    /// Block, start, length (clamped to the block): a random read.
    ReadRange(u64, usize, usize),
    /// Block, sector, start in it, length (clamped to the sector): a random read of
    /// one sector as the filesystem reads it (sector pages).
    ReadSector(u64, usize, usize, usize),
    Flush,
    Truncate(u64),
}

fn part_op() -> impl Strategy<Value = PartOp> {
    prop_oneof![
        4 => (0..8u64, 0..BS, 1..=BS, any::<u8>()).prop_map(|(k, f, l, v)| PartOp::Write(k, f, l, v)),
        // Whole sectors.
        2 => (0..8u64, 0..BS / SECTOR, 1..=BS / SECTOR, any::<u8>())
            .prop_map(|(k, f, l, v)| PartOp::Write(k, f * SECTOR, l * SECTOR, v)),
        2 => (0..8u64, 0..BS, 1..=BS, 0..BS, any::<bool>())
            .prop_map(|(k, f, l, cut, rev)| PartOp::SplitWrite(k, f, l, cut, rev)),
        2 => (0..8u64).prop_map(PartOp::Read),
        2 => (0..8u64, 0..BS, 1..=BS).prop_map(|(k, f, l)| PartOp::ReadRange(k, f, l)),
        3 => (0..8u64, 0..BS / SECTOR, 0..SECTOR, 1..=SECTOR)
            .prop_map(|(k, s, f, l)| PartOp::ReadSector(k, s, f, l)),
        1 => Just(PartOp::Flush),
        1 => (0..8u64).prop_map(PartOp::Truncate),
    ]
}

proptest! {
    /// With sectors, partial writes of any alignment, evictions, flushes and
    /// truncation, the cache still behaves like a plain map from block to bytes.
    #[test]
    fn partial_writes_match_a_simple_model(
        ops in proptest::collection::vec(part_op(), 1..200),
        cap in 2usize..5,
        parts in any::<bool>(),
        sum_unit in prop_oneof![Just(2usize), Just(SECTOR)],
    ) {
        let b = MemRemote::default();
        b.parts.store(parts, Ordering::SeqCst);
        b.sum_unit.store(sum_unit, Ordering::SeqCst);
        let c = sectored(cap).with_sum_unit(sum_unit);
        let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
        for op in ops {
            match op {
                PartOp::Write(k, from, len, v) => {
                    let to = (from + len).min(BS);
                    write_at(&c, &b, (1, k), from, &vec![v; to - from]);
                    model.entry(k).or_insert_with(|| vec![0; BS])[from..to].fill(v);
                }
                PartOp::SplitWrite(k, from, len, cut, rev) => {
                    let to = (from + len).min(BS);
                    let cut = cut.clamp(from, to);
                    let data: Vec<u8> = (from..to).map(|x| x as u8 ^ (k as u8) << 4).collect();
                    let (a, b2) = ((from, &data[..cut - from]), (cut, &data[cut - from..]));
                    for (at, piece) in if rev { [b2, a] } else { [a, b2] } {
                        if !piece.is_empty() {
                            write_at(&c, &b, (1, k), at, piece);
                        }
                    }
                    model.entry(k).or_insert_with(|| vec![0; BS])[from..to].copy_from_slice(&data);
                }
                PartOp::Read(k) => {
                    let want = model.get(&k).cloned().unwrap_or_else(|| vec![0; BS]);
                    prop_assert_eq!(read_block(&c, &b, (1, k)), want);
                }
                PartOp::ReadRange(k, from, len) => {
                    let to = (from + len).min(BS);
                    let want = model.get(&k).cloned().unwrap_or_else(|| vec![0; BS]);
                    prop_assert_eq!(read_at(&c, &b, (1, k), from, to), want[from..to].to_vec());
                }
                PartOp::ReadSector(k, sector, from, len) => {
                    let at = sector * SECTOR;
                    let (from, to) = (at + from, (at + from + len).min(at + SECTOR));
                    let want = model.get(&k).cloned().unwrap_or_else(|| vec![0; BS]);
                    prop_assert_eq!(read_fs(&c, &b, (1, k), from, to), want[from..to].to_vec());
                }
                PartOp::Flush => c.flush_all(&b).unwrap(),
                PartOp::Truncate(from) => {
                    c.invalidate(1, from);
                    lock(&b.blocks).retain(|k, _| k.1 < from);
                    model.retain(|&k, _| k < from);
                }
            }
            // Sector pages: more pages than blocks fit, never more memory.
            prop_assert!(c.held_bytes() <= cap * BS, "{} bytes held", c.held_bytes());
        }
        c.flush_all(&b).unwrap();
        let blocks = lock(&b.blocks);
        for (k, want) in &model {
            prop_assert_eq!(blocks.get(&(1, *k)), Some(want), "block {}", k);
        }
    }
}

#[test]
fn concurrent_partial_writers_to_the_same_blocks_lose_nothing() {
    // Each thread owns one sector of every block; pages come and go under them.
    let b = Arc::new(MemRemote::default());
    let c = Arc::new(sectored(3));
    let threads: Vec<_> = (0..4usize)
        .map(|t| {
            let (b, c) = (b.clone(), c.clone());
            std::thread::spawn(move || {
                for round in 0..300usize {
                    let k = (round % 5) as u64;
                    let byte = (round % 251) as u8 + 1;
                    write_at(&c, b.as_ref(), (1, k), t * SECTOR, &[byte; SECTOR]);
                    let got = read_block(&c, b.as_ref(), (1, k));
                    assert_eq!(got[t * SECTOR..(t + 1) * SECTOR], [byte; SECTOR]);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("worker panicked");
    }
    c.flush_all(b.as_ref()).unwrap();
    let blocks = lock(&b.blocks);
    for k in 0..5u64 {
        let last = (0..300usize).filter(|r| r % 5 == k as usize).max().unwrap();
        let want = vec![(last % 251) as u8 + 1; BS];
        assert_eq!(blocks.get(&(1, k)), Some(&want), "block {k}");
    }
}

/// Reads bytes `from..to` of block `key` as a random read does.
fn read_at(c: &PageCache, b: &dyn RemoteIo, key: PageKey, from: usize, to: usize) -> Vec<u8> {
    let page = view(c, b, key, Fill::Read { from, to }).expect("read");
    page[from..to].to_vec()
}

#[test]
fn a_random_read_loads_only_the_sectors_it_reads() {
    let b = MemRemote::default();
    let c = sectored(4);
    let block: Vec<u8> = (0..BS as u8).collect();
    lock(&b.blocks).insert((1, 0), block.clone());
    // Bytes 5..7 are in sector 1: that sector is loaded, nothing else.
    assert_eq!(read_at(&c, &b, (1, 0), 5, 7), block[5..7]);
    assert_eq!(*lock(&b.loaded), vec![((1, 0), 4, 4)]);
    // Sector 1 again: a hit.
    assert_eq!(read_at(&c, &b, (1, 0), 4, 8), block[4..8]);
    assert_eq!(b.loads.load(Ordering::SeqCst), 1);
    // Bytes 2..14: sectors 0, 2 and 3 are missing, loaded as two runs.
    assert_eq!(read_at(&c, &b, (1, 0), 2, 14), block[2..14]);
    assert_eq!(
        lock(&b.loaded)[1..].to_vec(),
        vec![((1, 0), 0, 4), ((1, 0), 8, 8)]
    );
    // Now whole: a full read loads nothing more.
    assert_eq!(read_block(&c, &b, (1, 0)), block);
    assert_eq!(b.loads.load(Ordering::SeqCst), 3);
    // A partly read page that is written in part and written back stores the whole
    // block, its unread sectors loaded from the backing.
    assert_eq!(read_at(&c, &b, (1, 1), 0, 4), vec![0; 4]);
    lock(&b.blocks).insert((1, 1), vec![1; BS]);
    write_at(&c, &b, (1, 1), 8, &[2; 4]);
    c.flush_all(&b).unwrap();
    assert_eq!(
        lock(&b.blocks)[&(1, 1)],
        // Sector 0 was read as a hole before the block got content: the page holds
        // those zeros, which are what the write-back stores for it.
        block_of(&[0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 1, 1])
    );
}

#[test]
fn a_failed_random_read_leaves_its_sectors_invalid() {
    let b = MemRemote::default();
    let c = sectored(4);
    lock(&b.blocks).insert((1, 0), vec![3; BS]);
    lock(&b.failing).push((1, 0));
    assert!(view(&c, &b, (1, 0), Fill::Read { from: 4, to: 8 }).is_err());
    lock(&b.failing).clear();
    // What the failed load left in sector 1 is not taken as content.
    assert_eq!(read_at(&c, &b, (1, 0), 4, 8), vec![3; 4]);
    assert_eq!(read_block(&c, &b, (1, 0)), vec![3; BS]);
}

#[test]
fn a_block_the_backing_holds_is_written_back_as_its_dirty_sectors_only() {
    let b = MemRemote::default();
    b.parts.store(true, Ordering::SeqCst);
    let c = sectored(4);
    lock(&b.blocks).insert((1, 0), vec![1; BS]);
    // Sectors 0 and 2 and 3 written, sector 1 never loaded.
    write_at(&c, &b, (1, 0), 0, &[2; 4]);
    write_at(&c, &b, (1, 0), 8, &[3; 8]);
    c.flush_all(&b).unwrap();
    assert_eq!(
        b.loads.load(Ordering::SeqCst),
        0,
        "nothing loaded to complete it"
    );
    assert_eq!(
        *lock(&b.stored),
        vec![((1, 0), 0, 4), ((1, 0), 8, 8)],
        "one write per run of dirty sectors"
    );
    assert_eq!(c.counters.partial_stores.load(Ordering::SeqCst), 1);
    assert_eq!(
        lock(&b.blocks)[&(1, 0)],
        block_of(&[2, 2, 2, 2, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3])
    );
    // Clean now; a later write of one byte dirties its sector only.
    write_at(&c, &b, (1, 0), 13, &[4]);
    c.flush_all(&b).unwrap();
    assert_eq!(lock(&b.stored)[2..].to_vec(), vec![((1, 0), 12, 4)]);
    assert_eq!(
        lock(&b.blocks)[&(1, 0)],
        block_of(&[2, 2, 2, 2, 1, 1, 1, 1, 3, 3, 3, 3, 3, 4, 3, 3])
    );
    // A block the backing cannot take in part is completed and stored whole.
    write_at(&c, &b, (1, 1), 4, &[5; 4]);
    c.flush_all(&b).unwrap();
    assert_eq!(lock(&b.stored)[3..].to_vec(), vec![((1, 1), 0, BS)]);
    assert_eq!(
        lock(&b.blocks)[&(1, 1)],
        block_of(&[0, 0, 0, 0, 5, 5, 5, 5, 0, 0, 0, 0, 0, 0, 0, 0])
    );
}

#[test]
fn a_write_whose_callback_fails_leaves_the_sectors_it_would_fill_unread() {
    // A write of a whole sector does not load it (it is about to be overwritten);
    // when the write then fails (fsd: its block could not grow, memory being full),
    // the sector holds whatever the buffer held, so it must not count as content: a
    // read after it loads the sector, and nothing of it is written back.
    let b = MemRemote::default();
    let key = (1, 0);
    lock(&b.blocks).insert(key, vec![0xab; BS]);
    let c = sectored(4);
    let refused = c.access(
        &b,
        key.0,
        key.1..key.1 + 1,
        |_| Fill::Write {
            from: SECTOR,
            to: 2 * SECTOR,
        },
        |_, _, _| Err(FsError::NoSpace),
    );
    assert_eq!(refused, Err(FsError::NoSpace));
    assert_eq!(read_block(&c, &b, key), vec![0xab; BS]);
    c.flush_all(&b).unwrap();
    assert_eq!(lock(&b.blocks)[&key], vec![0xab; BS]);
}
