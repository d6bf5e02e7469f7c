//! Whole-block pages: hits, write-back on eviction, flush, invalidation, and the
//! cache against a plain map of blocks (a model, and concurrent writers).

use super::*;
use proptest::prelude::*;
use std::collections::HashMap;

#[test]
fn a_hit_does_not_load_again() {
    let b = MemRemote::default();
    let c = PageCache::new((4 * BS) as u64, BS);
    read_block(&c, &b, (1, 0));
    read_block(&c, &b, (1, 0));
    assert_eq!(b.loads.load(Ordering::SeqCst), 1);
}

#[test]
fn dirty_pages_are_written_back_on_eviction_and_read_back_after() {
    let b = MemRemote::default();
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
    let b = MemRemote::default();
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
    let b = MemRemote::default();
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
    let b = MemRemote::default();
    let c = PageCache::new((4 * BS) as u64, BS);
    lock(&b.blocks).insert((1, 0), vec![5; BS]);
    assert_eq!(view(&c, &b, (1, 0), Fill::Zero).unwrap(), vec![0; BS]);
    assert_eq!(b.loads.load(Ordering::SeqCst), 0);
}

#[test]
fn concurrent_writers_and_readers_never_lose_a_write() {
    let b = Arc::new(MemRemote::default());
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
        let b = MemRemote::default();
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
