//! The cleaner and streams: cold dirty pages written back ahead of eviction, and
//! the blocks of streams dropped behind and written behind.

use super::*;
use std::time::Duration;

#[test]
fn the_cleaner_writes_back_the_coldest_dirty_pages_and_eviction_then_stores_nothing() {
    let b = MemRemote::default();
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
    let b = MemRemote::default();
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
    let b = MemRemote::default();
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
    let b = MemRemote::default();
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
    let b = MemRemote::default();
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
    let b = MemRemote::default();
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
    inner: MemRemote,
    watched: Mutex<Option<Arc<Page>>>,
    /// Whether the watched page was free at each store.
    free_at_store: Mutex<Vec<bool>>,
}

impl RemoteIo for Probe {
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
