use super::*;
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

const BS: usize = 16;

/// An in-memory backing that counts loads and stores.
#[derive(Default)]
struct MemBacking {
    blocks: Mutex<HashMap<PageKey, Vec<u8>>>,
    /// Ranges loaded (one per run of sectors) and blocks stored.
    loads: AtomicUsize,
    stores: AtomicUsize,
    /// Every range loaded: block, first byte, length.
    loaded: Mutex<Vec<(PageKey, usize, usize)>>,
    /// Every range stored: block, first byte, length.
    stored: Mutex<Vec<(PageKey, usize, usize)>>,
    /// Whether blocks it holds may be stored in part.
    parts: std::sync::atomic::AtomicBool,
    /// Bytes per checksum of the cache under test (none checked when 0).
    sum_unit: AtomicUsize,
    /// Checksums the cache handed over, all checked against their bytes.
    sums_checked: AtomicUsize,
    /// Calls of `load` and of `store` (batches).
    load_calls: AtomicUsize,
    store_calls: AtomicUsize,
    /// Loads of these keys fail.
    failing: Mutex<Vec<PageKey>>,
    /// Errors recorded by `record_write_error`.
    recorded: Mutex<Vec<PageKey>>,
}

impl Backing for MemBacking {
    fn load(&self, reads: &mut [(PageKey, usize, &mut [u8])]) -> Vec<Result<(), FsError>> {
        self.load_calls.fetch_add(1, Ordering::SeqCst);
        let blocks = lock(&self.blocks);
        let failing = lock(&self.failing);
        reads
            .iter_mut()
            .map(|(k, off, buf)| {
                self.loads.fetch_add(1, Ordering::SeqCst);
                lock(&self.loaded).push((*k, *off, buf.len()));
                if failing.contains(k) {
                    buf.fill(0xee); // what a failed read may leave behind
                    return Err(FsError::Io("injected".into()));
                }
                match blocks.get(k) {
                    Some(b) => buf.copy_from_slice(&b[*off..*off + buf.len()]),
                    None => buf.fill(0),
                }
                Ok(())
            })
            .collect()
    }

    fn store(&self, writes: &[Store<'_>]) -> Vec<Result<(), FsError>> {
        self.store_calls.fetch_add(1, Ordering::SeqCst);
        let mut blocks = lock(&self.blocks);
        writes
            .iter()
            .map(|w| {
                let (k, off, buf) = (&w.key, &w.offset, w.bytes);
                // Every checksum the cache hands over is that of the bytes beside it.
                let unit = self.sum_unit.load(Ordering::SeqCst);
                for (p, sum) in w.sums.iter().enumerate() {
                    let Some(sum) = sum else { continue };
                    let page = buf.get(p * unit..(p + 1) * unit).filter(|_| unit > 0);
                    if let Some(page) = page {
                        assert_eq!(
                            crate::remote::sums::page_sum(page),
                            *sum,
                            "the cache's sum of page {p} of a store of {k:?} at {off}"
                        );
                        self.sums_checked.fetch_add(1, Ordering::SeqCst);
                    }
                }
                self.stores.fetch_add(1, Ordering::SeqCst);
                lock(&self.stored).push((*k, *off, buf.len()));
                if buf.len() == BS {
                    blocks.insert(*k, buf.to_vec());
                } else {
                    let block = blocks
                        .get_mut(k)
                        .expect("a part of a block it does not hold");
                    block[*off..*off + buf.len()].copy_from_slice(buf);
                }
                Ok(())
            })
            .collect()
    }

    fn stores_in_part(&self, key: PageKey) -> bool {
        self.parts.load(Ordering::SeqCst) && lock(&self.blocks).contains_key(&key)
    }

    fn record_write_error(&self, key: PageKey, _e: &FsError) {
        lock(&self.recorded).push(key);
    }
}

fn write_block(c: &PageCache, b: &dyn Backing, key: PageKey, byte: u8) {
    c.access(
        b,
        key.0,
        key.1..key.1 + 1,
        |_| Fill::Overwrite,
        |_, buf, dirty| {
            buf.fill(byte);
            *dirty = true;
            Ok(())
        },
    )
    .expect("write");
}

/// The bytes of block `key`'s page as the callback of an access with `fill` sees them.
fn view(c: &PageCache, b: &dyn Backing, key: PageKey, fill: Fill) -> Result<Vec<u8>, FsError> {
    let mut out = Vec::new();
    c.access(
        b,
        key.0,
        key.1..key.1 + 1,
        |_| fill,
        |_, buf, _| {
            out = buf.to_vec();
            Ok(())
        },
    )
    .map(|()| out)
}

fn read_block(c: &PageCache, b: &dyn Backing, key: PageKey) -> Vec<u8> {
    view(c, b, key, Fill::Load).expect("read")
}

#[test]
fn a_hit_does_not_load_again() {
    let b = MemBacking::default();
    let c = PageCache::new((4 * BS) as u64, BS);
    read_block(&c, &b, (1, 0));
    read_block(&c, &b, (1, 0));
    assert_eq!(b.loads.load(Ordering::SeqCst), 1);
}

#[test]
fn dirty_pages_are_written_back_on_eviction_and_read_back_after() {
    let b = MemBacking::default();
    let c = PageCache::new((2 * BS) as u64, BS);
    for i in 0..10u64 {
        write_block(&c, &b, (1, i), i as u8 + 1);
    }
    assert!(
        c.cached_pages() <= 2,
        "cache holds {} pages",
        c.cached_pages()
    );
    for i in 0..10u64 {
        assert_eq!(
            read_block(&c, &b, (1, i)),
            vec![i as u8 + 1; BS],
            "block {i}"
        );
    }
}

#[test]
fn flush_writes_each_dirty_page_once_and_leaves_it_clean() {
    let b = MemBacking::default();
    let c = PageCache::new((8 * BS) as u64, BS);
    for i in 0..4u64 {
        write_block(&c, &b, (3, i), 9);
    }
    write_block(&c, &b, (4, 0), 9);
    c.flush_inode(&b, 3).unwrap();
    assert_eq!(b.stores.load(Ordering::SeqCst), 4);
    assert_eq!(c.dirty_pages(), 1, "inode 4's page is still dirty");
    c.flush_inode(&b, 3).unwrap();
    assert_eq!(
        b.stores.load(Ordering::SeqCst),
        4,
        "clean pages are not stored"
    );
    c.flush_all(&b).unwrap();
    assert_eq!(c.dirty_pages(), 0);
}

#[test]
fn invalidated_pages_are_dropped_without_write_back() {
    let b = MemBacking::default();
    let c = PageCache::new((8 * BS) as u64, BS);
    for i in 0..4u64 {
        write_block(&c, &b, (5, i), 7);
    }
    c.invalidate(5, 2);
    c.flush_all(&b).unwrap();
    let blocks = lock(&b.blocks);
    assert!(blocks.contains_key(&(5, 0)) && blocks.contains_key(&(5, 1)));
    assert!(!blocks.contains_key(&(5, 2)) && !blocks.contains_key(&(5, 3)));
}

#[test]
fn zero_and_overwrite_fills_do_not_load() {
    let b = MemBacking::default();
    let c = PageCache::new((4 * BS) as u64, BS);
    lock(&b.blocks).insert((1, 0), vec![5; BS]);
    assert_eq!(view(&c, &b, (1, 0), Fill::Zero).unwrap(), vec![0; BS]);
    assert_eq!(b.loads.load(Ordering::SeqCst), 0);
}

#[test]
fn concurrent_writers_and_readers_never_lose_a_write() {
    let b = Arc::new(MemBacking::default());
    let c = Arc::new(PageCache::new((4 * BS) as u64, BS));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (b, c) = (b.clone(), c.clone());
            std::thread::spawn(move || {
                for round in 0..200u64 {
                    let key = (t, round % 7);
                    let byte = (round % 251) as u8;
                    write_block(&c, b.as_ref(), key, byte);
                    assert_eq!(read_block(&c, b.as_ref(), key), vec![byte; BS]);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("worker panicked");
    }
    c.flush_all(b.as_ref()).unwrap();
    // Each thread's last write to each key must be what remote memory holds.
    let blocks = lock(&b.blocks);
    for t in 0..4u64 {
        for k in 0..7u64 {
            let last_round = (0..200u64).filter(|r| r % 7 == k).max().unwrap();
            let want = vec![(last_round % 251) as u8; BS];
            assert_eq!(blocks.get(&(t, k)), Some(&want), "thread {t} key {k}");
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Write(u64, u8),
    Read(u64),
    Flush,
    Truncate(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..12u64, any::<u8>()).prop_map(|(k, v)| Op::Write(k, v)),
        (0..12u64).prop_map(Op::Read),
        Just(Op::Flush),
        (0..12u64).prop_map(Op::Truncate),
    ]
}

proptest! {
    /// The cache behaves like a plain map from block to bytes, however small it is.
    #[test]
    fn cache_matches_a_simple_model(ops in proptest::collection::vec(op(), 1..200), cap in 2usize..6) {
        let b = MemBacking::default();
        b.sum_unit.store(4, Ordering::SeqCst);
        let c = PageCache::new((cap * BS) as u64, BS).with_sum_unit(4);
        let mut model: HashMap<u64, u8> = HashMap::new();
        for op in ops {
            match op {
                Op::Write(k, v) => {
                    write_block(&c, &b, (1, k), v);
                    model.insert(k, v);
                }
                Op::Read(k) => {
                    let want = vec![model.get(&k).copied().unwrap_or(0); BS];
                    prop_assert_eq!(read_block(&c, &b, (1, k)), want);
                }
                Op::Flush => c.flush_all(&b).unwrap(),
                Op::Truncate(from) => {
                    // As the filesystem does: drop pages, then forget the blocks.
                    c.invalidate(1, from);
                    lock(&b.blocks).retain(|k, _| k.1 < from);
                    model.retain(|&k, _| k < from);
                }
            }
            prop_assert!(c.cached_pages() <= cap);
        }
    }
}

// Sub-block validity: blocks of 16 bytes in 4 sectors of 4.

const SECTOR: usize = 4;

fn sectored(blocks: usize) -> PageCache {
    PageCache::with_sector_size((blocks * BS) as u64, BS, SECTOR)
}

/// Writes `data` at byte `from` of block `key`, as the filesystem's write does.
fn write_at(c: &PageCache, b: &dyn Backing, key: PageKey, from: usize, data: &[u8]) {
    let to = from + data.len();
    c.access(
        b,
        key.0,
        key.1..key.1 + 1,
        |_| {
            if from == 0 && to == BS {
                Fill::Overwrite
            } else {
                Fill::Write { from, to }
            }
        },
        |_, buf, dirty| {
            buf[from..to].copy_from_slice(data);
            *dirty = true;
            Ok(())
        },
    )
    .expect("write");
}

fn block_of(bytes: &[u8]) -> Vec<u8> {
    assert_eq!(bytes.len(), BS);
    bytes.to_vec()
}

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
    let b = MemBacking::default();
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
    let b = MemBacking::default();
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
    let b = MemBacking::default();
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
    let b = MemBacking::default();
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
    let b = MemBacking::default();
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
    let b = MemBacking::default();
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
    let b = MemBacking::default();
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
    let b = MemBacking::default();
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
    let b = MemBacking::default();
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
    let b = MemBacking::default();
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
    let b = MemBacking::default();
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
    let b = MemBacking::default();
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
        let b = MemBacking::default();
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
    let b = Arc::new(MemBacking::default());
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

/// Reads bytes `from..to` of block `key` as the filesystem's random read does
/// ([`PageCache::read`], sector pages).
fn read_fs(c: &PageCache, b: &dyn Backing, key: PageKey, from: usize, to: usize) -> Vec<u8> {
    let mut out = Vec::new();
    c.read(
        b,
        key.0,
        key.1..key.1 + 1,
        |_| Fill::Read { from, to },
        |_, base, bytes| {
            out.extend_from_slice(&bytes[from - base..to - base]);
            Ok(())
        },
    )
    .expect("read");
    out
}

#[test]
fn random_reads_of_one_sector_hold_sectors_not_blocks() {
    let b = MemBacking::default();
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
    b: &MemBacking,
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
    let b = MemBacking::default();
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
    let b = MemBacking::default();
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
    let b = MemBacking::default();
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
    let b = MemBacking::default();
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
    let b = MemBacking::default();
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
    let b = Arc::new(MemBacking::default());
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

/// Reads bytes `from..to` of block `key` as a random read does.
fn read_at(c: &PageCache, b: &dyn Backing, key: PageKey, from: usize, to: usize) -> Vec<u8> {
    let page = view(c, b, key, Fill::Read { from, to }).expect("read");
    page[from..to].to_vec()
}

#[test]
fn a_random_read_loads_only_the_sectors_it_reads() {
    let b = MemBacking::default();
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
    let b = MemBacking::default();
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
    let b = MemBacking::default();
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
fn the_cleaner_writes_back_the_coldest_dirty_pages_and_eviction_then_stores_nothing() {
    let b = MemBacking::default();
    let c = PageCache::new((4 * BS) as u64, BS);
    assert!(
        !c.wait_for_work(Duration::from_millis(1)),
        "nothing evicted yet"
    );
    for i in 0..4u64 {
        write_block(&c, &b, (1, i), i as u8 + 1);
    }
    // The two coldest (blocks 0 and 1) are written back and stay cached, clean.
    assert_eq!(c.clean_cold(&b, 2), 2);
    assert_eq!(*lock(&b.stored), vec![((1, 0), 0, BS), ((1, 1), 0, BS)]);
    assert_eq!(c.cached_pages(), 4);
    assert_eq!(c.dirty_pages(), 2);
    // Evicting them now writes nothing more; the cache says it evicted.
    write_block(&c, &b, (1, 4), 5);
    write_block(&c, &b, (1, 5), 6);
    assert_eq!(b.stores.load(Ordering::SeqCst), 2);
    assert!(c.wait_for_work(Duration::from_millis(1)));
    assert_eq!(read_block(&c, &b, (1, 0)), vec![1; BS]);
    // Clean pages cost nothing to the cleaner.
    c.flush_all(&b).unwrap();
    assert_eq!(c.clean_cold(&b, 4), 0);
}

#[test]
fn only_evictions_that_meet_dirty_pages_wake_the_cleaner() {
    let b = MemBacking::default();
    let c = PageCache::new((2 * BS) as u64, BS);
    // A cache that only reads: its evictions give the cleaner nothing to do.
    for i in 0..4u64 {
        read_block(&c, &b, (1, i));
    }
    assert!(
        !c.wait_for_work(Duration::from_millis(1)),
        "evicting clean pages woke the cleaner"
    );
    // Written pages reach the cold end: evicting the first of them wakes it.
    write_block(&c, &b, (1, 10), 1);
    write_block(&c, &b, (1, 11), 2);
    assert!(!c.wait_for_work(Duration::from_millis(1)));
    read_block(&c, &b, (1, 0));
    assert!(c.wait_for_work(Duration::from_millis(1)), "a dirty victim");
    // While its rounds find dirty pages, every eviction wakes it, clean victims too.
    assert_eq!(c.clean_cold(&b, 2), 1);
    read_block(&c, &b, (1, 1));
    assert!(
        c.wait_for_work(Duration::from_millis(1)),
        "the cleaner had work"
    );
    // A round that finds none lets it sleep again.
    assert_eq!(c.clean_cold(&b, 2), 0);
    read_block(&c, &b, (1, 2));
    assert!(!c.wait_for_work(Duration::from_millis(1)));
}

#[test]
fn pages_dropped_behind_go_first_unless_dirty() {
    let b = MemBacking::default();
    let c = PageCache::new(4 * BS as u64, BS);
    for i in 0..4 {
        write_block(&c, &b, (1, i), i as u8 + 1);
    }
    c.flush_all(&b).unwrap();
    // Block 0 is the least recently used; 2 is dirty again.
    write_block(&c, &b, (1, 2), 9);
    c.drop_behind(1, 1..3);
    let loads = b.loads.load(Ordering::SeqCst);
    // A fifth block evicts block 1 (dropped behind, clean), not block 0.
    read_block(&c, &b, (2, 0));
    assert_eq!(read_block(&c, &b, (1, 0)), vec![1u8; BS], "block 0 stayed");
    assert_eq!(
        read_block(&c, &b, (1, 2)),
        vec![9u8; BS],
        "dirty block 2 stayed"
    );
    assert_eq!(
        b.loads.load(Ordering::SeqCst),
        loads + 1,
        "only the new block was loaded"
    );
    assert_eq!(read_block(&c, &b, (1, 1)), vec![2u8; BS]);
    assert_eq!(
        b.loads.load(Ordering::SeqCst),
        loads + 2,
        "block 1 was the one evicted"
    );
}

#[test]
fn blocks_written_behind_are_stored_by_the_cleaner_and_then_go_first() {
    let b = MemBacking::default();
    let c = PageCache::new((8 * BS) as u64, BS);
    for i in 0..8u64 {
        write_block(&c, &b, (1, i), i as u8 + 1);
    }
    c.write_behind(1, 6..8);
    assert!(
        c.wait_for_work(Duration::from_millis(1)),
        "the cleaner is woken"
    );
    // Blocks 6 and 7 go to the backing in one batch, the others stay dirty.
    assert_eq!(c.clean_behind(&b), 2);
    assert_eq!(b.store_calls.load(Ordering::SeqCst), 1);
    assert_eq!(*lock(&b.stored), vec![((1, 6), 0, BS), ((1, 7), 0, BS)]);
    assert_eq!(c.dirty_pages(), 6);
    assert_eq!(c.clean_behind(&b), 0, "the queue is empty now");
    // They are the next to go, the last first: a new block evicts block 7 and
    // writes nothing back.
    write_block(&c, &b, (2, 0), 9);
    assert_eq!(b.stores.load(Ordering::SeqCst), 2);
    let loads = b.loads.load(Ordering::SeqCst);
    assert_eq!(read_block(&c, &b, (1, 6)), vec![7; BS]);
    assert_eq!(b.loads.load(Ordering::SeqCst), loads, "block 6 stayed");
    assert_eq!(read_block(&c, &b, (1, 7)), vec![8; BS]);
    assert_eq!(
        b.loads.load(Ordering::SeqCst),
        loads + 1,
        "block 7 was evicted, and reads back from the backing"
    );
}

#[test]
fn a_queued_write_behind_of_a_dropped_page_writes_nothing() {
    let b = MemBacking::default();
    let c = PageCache::new((4 * BS) as u64, BS);
    write_block(&c, &b, (1, 0), 1);
    c.write_behind(1, 0..1);
    c.invalidate(1, 0);
    assert_eq!(c.clean_behind(&b), 0);
    assert_eq!(
        b.stores.load(Ordering::SeqCst),
        0,
        "a truncated block is not stored"
    );
}

#[test]
fn a_page_in_use_when_its_write_behind_comes_is_written_at_the_next_round() {
    let b = MemBacking::default();
    let c = PageCache::new((8 * BS) as u64, BS);
    write_block(&c, &b, (1, 0), 1);
    c.write_behind(1, 0..1);
    let page = lock(&c.index).lru.peek(&(1, 0)).cloned().expect("cached");
    let held = lock(&page.state);
    assert_eq!(c.clean_behind(&b), 0, "skipped while in use");
    drop(held);
    assert_eq!(c.clean_behind(&b), 1, "written at the next round");
    assert_eq!(*lock(&b.stored), vec![((1, 0), 0, BS)]);
    assert_eq!(c.dirty_pages(), 0);
}

/// A backing that, while it stores, looks whether another page is locked.
#[derive(Default)]
struct Probe {
    inner: MemBacking,
    watched: Mutex<Option<Arc<Page>>>,
    /// Whether the watched page was free at each store.
    free_at_store: Mutex<Vec<bool>>,
}

impl Backing for Probe {
    fn load(&self, reads: &mut [(PageKey, usize, &mut [u8])]) -> Vec<Result<(), FsError>> {
        self.inner.load(reads)
    }

    fn store(&self, writes: &[Store<'_>]) -> Vec<Result<(), FsError>> {
        if let Some(p) = lock(&self.watched).as_ref() {
            let free = p.state.try_lock().is_ok();
            lock(&self.free_at_store).push(free);
        }
        self.inner.store(writes)
    }

    fn stores_in_part(&self, key: PageKey) -> bool {
        self.inner.stores_in_part(key)
    }

    fn record_write_error(&self, key: PageKey, e: &FsError) {
        self.inner.record_write_error(key, e)
    }
}

#[test]
fn the_cleaner_leaves_clean_pages_unlocked_while_it_writes_back() {
    let b = Probe::default();
    let c = PageCache::new((8 * BS) as u64, BS);
    write_block(&c, &b, (1, 0), 1);
    write_block(&c, &b, (1, 1), 2);
    c.flush_all(&b).unwrap();
    write_block(&c, &b, (1, 0), 3);
    // Block 1 is clean: an eviction meanwhile must be able to take it.
    *lock(&b.watched) = lock(&c.index).lru.peek(&(1, 1)).cloned();
    assert_eq!(c.clean_cold(&b, 8), 1);
    assert_eq!(*lock(&b.free_at_store), vec![true]);
}

#[test]
fn a_write_hands_the_sums_of_the_pages_it_filled_to_the_write_back() {
    let b = MemBacking::default();
    b.sum_unit.store(4, Ordering::SeqCst);
    let c = sectored(4).with_sum_unit(4);
    // Whole block, then a write of bytes 5..13: pages 2 (8..12) whole, 1 and 3 in part.
    write_at(&c, &b, (1, 0), 0, &[1; BS]);
    write_at(&c, &b, (1, 0), 5, &[2; 8]);
    c.flush_all(&b).unwrap();
    assert_eq!(
        b.sums_checked.load(Ordering::SeqCst),
        2,
        "pages 0 and 2 keep the sums of their writes; 1 and 3 were written in part"
    );
    assert_eq!(
        lock(&b.blocks)[&(1, 0)][4..14],
        [1, 2, 2, 2, 2, 2, 2, 2, 2, 1]
    );
}

#[test]
fn a_change_the_cache_cannot_see_forgets_the_sums() {
    let b = MemBacking::default();
    b.sum_unit.store(4, Ordering::SeqCst);
    let c = sectored(4).with_sum_unit(4);
    write_at(&c, &b, (1, 0), 0, &[1; BS]);
    // A caller that loads the block and changes a byte of it as it likes.
    c.access(
        &b,
        1,
        0..1,
        |_| Fill::Load,
        |_, buf, dirty| {
            buf[9] = 7;
            *dirty = true;
            Ok(())
        },
    )
    .unwrap();
    c.flush_all(&b).unwrap();
    assert_eq!(
        b.sums_checked.load(Ordering::SeqCst),
        0,
        "no sum survives it"
    );
    assert_eq!(lock(&b.blocks)[&(1, 0)][9], 7);
}

#[test]
fn a_write_whose_callback_fails_leaves_the_sectors_it_would_fill_unread() {
    // A write of a whole sector does not load it (it is about to be overwritten);
    // when the write then fails (fsd: its block could not grow, memory being full),
    // the sector holds whatever the buffer held, so it must not count as content: a
    // read after it loads the sector, and nothing of it is written back.
    let b = MemBacking::default();
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
