use super::*;
use proptest::prelude::*;

const BS: u64 = 16 * PAGE;

fn chunk(addr: u64, pages: u64, rkey: u32) -> Allocation {
    Allocation {
        addr,
        len: pages * PAGE,
        rkey,
    }
}

#[test]
fn hands_out_whole_blocks_of_a_chunk_once_then_runs_dry() {
    let mut p = BlockPool::new();
    p.add_chunk(chunk(1 << 20, 64, 7));
    let got: Vec<_> = (0..4).map(|_| p.take(BS).expect("a block")).collect();
    let addrs: Vec<u64> = got.iter().map(|b| b.addr).collect();
    assert_eq!(
        addrs,
        vec![
            1 << 20,
            (1 << 20) + BS,
            (1 << 20) + 2 * BS,
            (1 << 20) + 3 * BS
        ]
    );
    assert!(got.iter().all(|b| b.rkey == 7));
    assert_eq!(p.take(PAGE), None);
    assert_eq!(p.free_bytes(), 0);
}

#[test]
fn a_chunk_over_memory_the_pool_holds_is_not_added() {
    let mut p = BlockPool::new();
    let held = chunk(1 << 20, 16, 7);
    assert_eq!(p.add_chunk(held), None);
    for (addr, pages) in [
        (1 << 20, 16),
        ((1 << 20) + 15 * PAGE, 4),
        ((1 << 20) - PAGE, 2),
    ] {
        assert_eq!(
            p.add_chunk(chunk(addr, pages, 8)),
            Some(held),
            "{addr:#x}+{pages}"
        );
    }
    assert_eq!(p.free_bytes(), 16 * PAGE, "nothing of them was added");
    // Right before and right after it is memory of its own.
    assert_eq!(p.add_chunk(chunk((1 << 20) - PAGE, 1, 8)), None);
    assert_eq!(p.add_chunk(chunk((1 << 20) + 16 * PAGE, 1, 9)), None);
    // One that wraps is never added (it is refused where it enters).
    assert_eq!(p.add_chunk(chunk(u64::MAX - PAGE + 1, 2, 9)), None);
    assert_eq!(p.free_bytes(), 18 * PAGE);
}

#[test]
fn small_pieces_take_whole_pages_and_only_those() {
    let mut p = BlockPool::new();
    p.add_chunk(chunk(0, 16, 1));
    let a = p.take(1).unwrap();
    let b = p.take(PAGE + 1).unwrap();
    let c = p.take(3 * PAGE).unwrap();
    assert_eq!((a.addr, b.addr, c.addr), (0, PAGE, 3 * PAGE));
    assert_eq!(p.free_bytes(), 10 * PAGE);
    // Freeing the middle piece leaves a 2-page hole a 2-page request fills exactly.
    assert!(p.put(b, PAGE + 1).0);
    assert_eq!(p.take(2 * PAGE).unwrap().addr, PAGE);
}

#[test]
fn best_fit_keeps_long_runs_for_whole_blocks() {
    let mut p = BlockPool::new();
    p.add_chunk(chunk(0, 32, 1));
    let pieces: Vec<_> = (0..32).map(|_| p.take(PAGE).unwrap()).collect();
    // Free one page at 5 and the 16 pages 16..32: a 1-page request takes page 5.
    assert!(p.put(pieces[5], PAGE).0);
    for piece in &pieces[16..] {
        assert!(p.put(*piece, PAGE).0);
    }
    assert_eq!(p.take(PAGE).unwrap().addr, 5 * PAGE);
    assert_eq!(p.take(BS).unwrap().addr, 16 * PAGE, "the run coalesced");
}

#[test]
fn a_piece_grows_in_place_only_into_free_pages_of_its_chunk() {
    let mut p = BlockPool::new();
    p.add_chunk(chunk(0, 8, 1));
    p.add_chunk(chunk(8 * PAGE, 8, 2));
    let a = p.take(PAGE).unwrap();
    let b = p.take(2 * PAGE).unwrap();
    assert!(!p.extend(a, PAGE, 2 * PAGE), "b lies right after a");
    assert!(p.extend(b, 2 * PAGE, 7 * PAGE));
    assert_eq!(p.free_bytes(), 8 * PAGE);
    assert!(
        !p.extend(b, 7 * PAGE, 9 * PAGE),
        "never into the next chunk"
    );
    assert!(p.put(b, 7 * PAGE).0, "the grown piece frees whole");
    assert_eq!(p.free_bytes(), 15 * PAGE);
}

#[test]
fn extents_never_coalesce_across_chunks() {
    let mut p = BlockPool::new();
    // Two chunks that touch in address space, with different rkeys.
    p.add_chunk(chunk(0, 8, 1));
    p.add_chunk(chunk(8 * PAGE, 8, 2));
    assert_eq!(p.take(BS), None, "no 16-page run spans the two");
    let x = p.take(8 * PAGE).unwrap();
    let y = p.take(8 * PAGE).unwrap();
    assert_ne!(x.rkey, y.rkey);
}

#[test]
fn an_emptied_chunk_is_returned_unless_it_is_the_spare() {
    let mut p = BlockPool::new();
    p.add_chunk(chunk(0, 32, 1));
    p.add_chunk(chunk(1 << 20, 32, 2));
    let blocks: Vec<_> = (0..4).map(|_| p.take(BS).unwrap()).collect();
    assert_eq!(p.put(blocks[0], BS), (true, vec![]));
    assert_eq!(p.put(blocks[1], BS), (true, vec![]));
    assert_eq!(p.put(blocks[2], BS), (true, vec![]));
    assert_eq!(p.put(blocks[3], BS), (true, vec![chunk(1 << 20, 32, 2)]));
    assert_eq!(p.free_bytes(), 32 * PAGE);
}

#[test]
fn unknown_pieces_are_refused() {
    let mut p = BlockPool::new();
    p.add_chunk(chunk(8192, 2, 3));
    let at = |addr, rkey| RemoteAddr { addr, rkey };
    for (piece, len) in [
        (at(8192, 4), PAGE),
        (at(8193, 3), PAGE),
        (at(8192 + 2 * PAGE, 3), PAGE),
        (at(0, 3), PAGE),
        (at(8192, 3), 3 * PAGE),
    ] {
        assert!(!p.put(piece, len).0, "{piece:?}+{len} should be refused");
    }
}

#[test]
fn a_second_free_is_refused_so_nothing_is_handed_out_twice() {
    let mut p = BlockPool::new();
    p.add_chunk(chunk(0, 4, 1));
    let b = p.take(2 * PAGE).unwrap();
    assert!(p.put(b, 2 * PAGE).0);
    assert!(!p.put(b, 2 * PAGE).0, "double free accepted");
    assert!(!p.put(b, PAGE).0, "free of a part of a free piece accepted");
    let handed: Vec<u64> = std::iter::from_fn(|| p.take(PAGE))
        .map(|b| b.addr)
        .collect();
    assert_eq!(handed, vec![0, PAGE, 2 * PAGE, 3 * PAGE]);
}

#[test]
fn an_adopted_chunk_hands_out_only_what_is_not_in_use() {
    let mut p = BlockPool::new();
    let used: BTreeMap<u64, u64> = [(PAGE, PAGE), (3 * PAGE, 100)].into_iter().collect();
    p.add_chunk_in_use(chunk(0, 4, 1), &used);
    assert_eq!(p.free_bytes(), 2 * PAGE);
    let mut got: Vec<u64> = std::iter::from_fn(|| p.take(PAGE))
        .map(|b| b.addr)
        .collect();
    got.sort_unstable();
    assert_eq!(got, vec![0, 2 * PAGE]);
    assert!(
        p.put(
            RemoteAddr {
                addr: PAGE,
                rkey: 1
            },
            PAGE
        )
        .0
    );
    assert!(
        !p.put(
            RemoteAddr {
                addr: PAGE,
                rkey: 1
            },
            PAGE
        )
        .0
    );
}

#[test]
fn a_partial_trailing_page_of_a_chunk_is_not_used() {
    let mut p = BlockPool::new();
    p.add_chunk(Allocation {
        addr: 0,
        len: PAGE + 100,
        rkey: 1,
    });
    assert!(p.take(PAGE).is_some());
    assert!(p.take(1).is_none());
}

#[derive(Debug, Clone)]
enum Op {
    Take(u64),
    Put(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u64..=BS).prop_map(Op::Take),
        (0usize..64).prop_map(Op::Put),
    ]
}

proptest! {
    /// Against a model (a set of taken pages): pieces never overlap, stay inside
    /// their chunk, free bytes add up, and a request fails only when no run of free
    /// pages in one chunk is long enough.
    #[test]
    fn pieces_never_overlap_and_space_is_never_lost(ops in proptest::collection::vec(op(), 1..200)) {
        let chunks = [chunk(0, 24, 1), chunk(24 * PAGE, 40, 2)];
        let total: u64 = chunks.iter().map(|c| c.len).sum();
        let mut p = BlockPool::new();
        for c in chunks {
            p.add_chunk(c);
        }
        let mut taken: Vec<(RemoteAddr, u64)> = Vec::new();
        let mut pages = BTreeSet::new();
        for op in ops {
            match op {
                Op::Take(bytes) => match p.take(bytes) {
                    Some(piece) => {
                        let len = pages_for(bytes);
                        let c = chunks.iter().find(|c| c.rkey == piece.rkey).unwrap();
                        prop_assert!(piece.addr >= c.addr && piece.addr + len <= c.addr + c.len);
                        for pg in (piece.addr..piece.addr + len).step_by(PAGE as usize) {
                            prop_assert!(pages.insert(pg), "page {pg:#x} handed out twice");
                        }
                        taken.push((piece, len));
                    }
                    None => {
                        let need = pages_for(bytes) / PAGE;
                        // (A chunk handed back as the second empty one is gone.)
                        for c in chunks.iter().filter(|c| p.chunks.contains_key(&c.addr)) {
                            let mut run = 0;
                            for pg in (c.addr..c.addr + c.len).step_by(PAGE as usize) {
                                run = if pages.contains(&pg) { 0 } else { run + 1 };
                                prop_assert!(run < need, "a free run of {need} pages was refused");
                            }
                        }
                    }
                },
                Op::Put(i) if !taken.is_empty() => {
                    let (piece, len) = taken.swap_remove(i % taken.len());
                    prop_assert!(p.put(piece, len).0);
                    for pg in (piece.addr..piece.addr + len).step_by(PAGE as usize) {
                        pages.remove(&pg);
                    }
                }
                Op::Put(_) => {}
            }
            let held: u64 = p.chunks.values().map(|c| c.usable).sum();
            prop_assert!(held <= total);
            prop_assert_eq!(p.free_bytes() + pages.len() as u64 * PAGE, held);
        }
    }
}
