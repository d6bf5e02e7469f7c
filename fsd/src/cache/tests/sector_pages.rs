//! Sector pages: random reads of one sector held in sector buffers, reads that came
//! together, the slabs' memory as sectors replace blocks, and promotion to a buffer
//! of the whole block.

use super::*;

#[test]
fn random_reads_of_one_sector_hold_sectors_not_blocks() {
    let b = MemRemote::default();
    // Room for 2 blocks: 8 sectors.
    let c = sectored(2);
    for k in 0..8u64 {
        lock(&b.blocks).insert((1, k), vec![k as u8 + 1; BS]);
    }
    for k in 0..8u64 {
        assert_eq!(read_fs(&c, &b, (1, k), 4, 8), vec![k as u8 + 1; 4]);
    }
    assert_eq!(b.loads.load(Ordering::SeqCst), 8);
    assert_eq!(c.cached_pages(), 8, "a page per block read");
    assert_eq!(c.held_bytes(), 2 * BS, "a sector of memory per page");
    // All still cached: read again, nothing is loaded.
    for k in 0..8u64 {
        assert_eq!(read_fs(&c, &b, (1, k), 5, 7), vec![k as u8 + 1; 2]);
    }
    assert_eq!(b.loads.load(Ordering::SeqCst), 8);
    // A ninth makes room by evicting the coldest.
    lock(&b.blocks).insert((1, 8), vec![9; BS]);
    assert_eq!(read_fs(&c, &b, (1, 8), 0, 4), vec![9; 4]);
    assert_eq!(c.held_bytes(), 2 * BS);
    assert_eq!(c.cached_pages(), 8);
}

/// What `read_together` gives each block: (block, base, bytes).
fn read_all_together(
    c: &PageCache,
    b: &MemRemote,
    ino: u64,
    blocks: &[(u64, Range<usize>)],
) -> Result<Vec<(u64, usize, Vec<u8>)>, FsError> {
    let mut got = Vec::new();
    c.read_together(b, ino, blocks, |i, base, bytes| {
        got.push((i, base, bytes.to_vec()));
        Ok(())
    })?;
    Ok(got)
}

/// Reads that came together: one load batch fetches what all of them lack, whether
/// they read one sector or more, and each block's bytes reach the callback, the
/// buffer of a sector page starting at its sector. A miss each, counted as batched;
/// reading them again loads nothing and counts hits.
#[test]
fn reads_together_load_what_they_lack_in_one_batch() {
    let b = MemRemote::default();
    // Groups of 4 pages: a batch holds the 3 blocks.
    let c = sectored(16);
    for (key, byte) in [((1, 0), 1u8), ((1, 3), 2), ((1, 5), 3)] {
        let bytes: Vec<u8> = (0..BS as u8).map(|i| byte * 16 + i).collect();
        lock(&b.blocks).insert(key, bytes);
    }
    // A sector, two sectors (a whole-block page), the whole block.
    let blocks = [(0, SECTOR..2 * SECTOR), (3, 2..SECTOR + 2), (5, 0..BS)];
    let got = read_all_together(&c, &b, 1, &blocks).unwrap();
    assert_eq!(b.load_calls.load(Ordering::SeqCst), 1, "one batch");
    assert_eq!(got.len(), 3);
    for ((i, base, bytes), (want_i, range)) in got.iter().zip(&blocks) {
        assert_eq!(i, want_i);
        let block = &lock(&b.blocks)[&(1, *i)];
        assert_eq!(
            &bytes[range.start - base..range.end - base],
            &block[range.clone()]
        );
    }
    assert_eq!(
        got[0].1, SECTOR,
        "a sector page's buffer starts at its sector"
    );
    assert_eq!(
        c.counters.misses.load(Ordering::SeqCst),
        3,
        "a miss per block"
    );
    assert_eq!(c.counters.batched_misses.load(Ordering::SeqCst), 3);
    assert_eq!(c.counters.hits.load(Ordering::SeqCst), 0);
    read_all_together(&c, &b, 1, &blocks).unwrap();
    assert_eq!(
        b.load_calls.load(Ordering::SeqCst),
        1,
        "then the cache has them"
    );
    assert_eq!(c.counters.hits.load(Ordering::SeqCst), 3);
    assert_eq!(c.counters.misses.load(Ordering::SeqCst), 3);
}

/// A block whose load fails fails the batch before any bytes reach the callback;
/// the other block of the batch keeps what it loaded, and the failed one is loaded
/// again by the next read, which gets it once it can.
#[test]
fn a_failed_load_fails_reads_together_and_leaves_the_rest_loaded() {
    let b = MemRemote::default();
    let c = sectored(8);
    lock(&b.blocks).insert((1, 0), vec![7; BS]);
    lock(&b.blocks).insert((1, 1), vec![8; BS]);
    lock(&b.failing).push((1, 1));
    let blocks = [(0, 0..4), (1, 0..4)];
    let mut called = false;
    let failed = c.read_together(&b, 1, &blocks, |_, _, _| {
        called = true;
        Ok(())
    });
    assert!(failed.is_err(), "the failed load is reported");
    assert!(!called, "no bytes of a failed batch are given");
    let loads = b.load_calls.load(Ordering::SeqCst);
    assert_eq!(read_fs(&c, &b, (1, 0), 0, 4), vec![7; 4]);
    assert_eq!(
        b.load_calls.load(Ordering::SeqCst),
        loads,
        "the good block stayed"
    );
    lock(&b.failing).clear();
    assert_eq!(
        read_fs(&c, &b, (1, 1), 0, 4),
        vec![8; 4],
        "and the failed one loads once it can"
    );
}

/// When random reads of sectors follow a stream of whole blocks, the memory of the
/// blocks the cache lets go is given back as the sectors come, by the requests
/// themselves (no cleaner runs here): the two slabs never hold much more than the
/// budget, where keeping both would hold it twice.
#[test]
fn sectors_after_blocks_take_the_memory_the_blocks_let_go() {
    const BLOCK: usize = 64 << 10;
    const SECTOR: usize = 4 << 10;
    let b = MemRemote::default();
    let c = PageCache::new(4 << 20, BLOCK);
    let resident = || c.slab.resident_bytes() + c.sector_slab.resident_bytes();
    // A stream over twice the cache.
    for k in 0..128u64 {
        c.access(&b, 1, k..k + 1, |_| Fill::Load, |_, _, _| Ok(()))
            .expect("load");
    }
    assert_eq!(resident(), c.budget, "the stream's blocks fill the cache");
    // Random sectors of other blocks (of the same file, never read whole).
    let mut most = 0;
    for i in 0..4096u64 {
        let k = 1000 + (i * 2_654_435_761) % 256;
        let from = (i as usize / 256 % (BLOCK / SECTOR)) * SECTOR;
        assert_eq!(
            read_fs(&c, &b, (1, k), from, from + SECTOR),
            vec![0; SECTOR]
        );
        most = most.max(resident());
    }
    assert!(
        c.sector_slab.resident_bytes() > c.budget / 2,
        "sectors took the cache's place: {} bytes",
        c.sector_slab.resident_bytes()
    );
    assert!(
        most <= c.resident_limit() + SECTOR,
        "the slabs held {most} bytes at most, over {} (budget {})",
        c.resident_limit(),
        c.budget
    );
}

#[test]
fn a_sector_page_takes_in_one_sector_reads_and_gets_the_whole_block_for_more() {
    let b = MemRemote::default();
    let c = sectored(4);
    let block: Vec<u8> = (0..BS as u8).collect();
    lock(&b.blocks).insert((1, 0), block.clone());
    assert_eq!(read_fs(&c, &b, (1, 0), 12, 16), block[12..16]);
    assert_eq!(read_fs(&c, &b, (1, 0), 1, 3), block[1..3]);
    assert_eq!(read_fs(&c, &b, (1, 0), 9, 10), block[9..10]);
    assert_eq!(
        c.held_bytes(),
        3 * SECTOR,
        "three sectors, three sector buffers"
    );
    // A read of two sectors: the page gets the whole block, what it held copied in,
    // the sector it lacks loaded; nothing is loaded twice.
    assert_eq!(read_fs(&c, &b, (1, 0), 3, 6), block[3..6]);
    assert_eq!(c.held_bytes(), BS, "the block's buffer alone");
    assert_eq!(read_block(&c, &b, (1, 0)), block);
    assert_eq!(
        *lock(&b.loaded),
        vec![
            ((1, 0), 12, 4),
            ((1, 0), 0, 4),
            ((1, 0), 8, 4),
            ((1, 0), 4, 4)
        ]
    );
}

#[test]
fn a_write_to_a_sector_page_keeps_what_it_read_and_stores_the_merged_block() {
    let b = MemRemote::default();
    b.parts.store(true, Ordering::SeqCst);
    let c = sectored(4);
    lock(&b.blocks).insert((1, 0), vec![1; BS]);
    assert_eq!(read_fs(&c, &b, (1, 0), 0, 4), vec![1; 4]);
    // The backing changes under the cache (as only a test can): what the page
    // holds, not the backing, is what the write merges with.
    lock(&b.blocks).insert((1, 0), vec![7; BS]);
    write_at(&c, &b, (1, 0), 6, &[2; 4]);
    let got = read_block(&c, &b, (1, 0));
    assert_eq!(
        got,
        block_of(&[1, 1, 1, 1, 7, 7, 2, 2, 2, 2, 7, 7, 7, 7, 7, 7])
    );
    c.flush_all(&b).unwrap();
    assert_eq!(
        lock(&b.blocks)[&(1, 0)][4..12],
        [7, 7, 2, 2, 2, 2, 7, 7],
        "the dirty sectors were stored"
    );
}

#[test]
fn concurrent_sector_readers_and_writers_lose_nothing() {
    // Each thread owns one sector of every block: it writes it, then reads it back
    // as a random read of one sector, while the others' reads make, grow and promote
    // sector pages of the same blocks in a cache too small for them.
    let b = Arc::new(MemRemote::default());
    let c = Arc::new(sectored(2));
    let threads: Vec<_> = (0..4usize)
        .map(|t| {
            let (b, c) = (b.clone(), c.clone());
            std::thread::spawn(move || {
                for round in 0..400usize {
                    let k = (round % 7) as u64;
                    let byte = (round % 251) as u8 + 1;
                    let at = t * SECTOR;
                    write_at(&c, b.as_ref(), (1, k), at, &[byte; SECTOR]);
                    let got = read_fs(&c, b.as_ref(), (1, (k + 3) % 7), at, at + SECTOR);
                    let mine = read_fs(&c, b.as_ref(), (1, k), at + 1, at + SECTOR);
                    assert_eq!(mine, [byte; SECTOR - 1], "round {round}: {got:?}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("worker panicked");
    }
    c.flush_all(b.as_ref()).unwrap();
    for k in 0..7u64 {
        let last = (0..400usize).filter(|r| r % 7 == k as usize).max().unwrap();
        let want = vec![(last % 251) as u8 + 1; BS];
        assert_eq!(lock(&b.blocks).get(&(1, k)), Some(&want), "block {k}");
    }
    // Evictions skip pages in use, so the last shrink of a thread may have left some
    // overshoot: the next access (with nothing else in use) evicts it. It may load
    // from the backing, so no lock on the backing's blocks is held across it.
    read_fs(&c, b.as_ref(), (1, 0), 0, 1);
    assert!(c.held_bytes() <= 2 * BS, "{} bytes held", c.held_bytes());
}
