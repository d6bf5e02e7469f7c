//! Unit tables and a model-based proptest for [`ChunkAllocator`].

use super::*;
use proptest::prelude::*;

const PAGE: u64 = 4096;
const BASE: u64 = 0x7f00_0000_0000;

fn books(pages: u64) -> ChunkAllocator {
    ChunkAllocator::new(BASE, pages * PAGE, PAGE)
}

fn ok(a: &ChunkAllocator) {
    if let Err(e) = a.check_invariants() {
        panic!("allocator invariant broken: {e}");
    }
}

#[test]
fn sizes_are_rounded_up_to_whole_pages() {
    for (bytes, want) in [
        (1, PAGE),
        (PAGE - 1, PAGE),
        (PAGE, PAGE),
        (PAGE + 1, 2 * PAGE),
    ] {
        let mut a = books(8);
        let c = a.alloc(Owner::Client(1), bytes).expect("fits");
        assert_eq!(c.len, want, "alloc({bytes}) should take {want} bytes");
        assert_eq!(a.used(), want);
        ok(&a);
    }
}

#[test]
fn degenerate_sizes_are_refused() {
    let mut a = books(8);
    assert_eq!(a.alloc(Owner::Client(1), 0), Err(AllocError::ZeroSize));
    for bytes in [8 * PAGE + 1, u64::MAX] {
        assert_eq!(
            a.alloc(Owner::Client(1), bytes),
            Err(AllocError::TooLarge {
                bytes,
                capacity: 8 * PAGE
            }),
            "alloc({bytes}) must be TooLarge"
        );
    }
    assert_eq!(a.used(), 0, "failed allocations must not use memory");
    ok(&a);
}

#[test]
fn capacity_is_whole_pages_and_all_of_it_can_be_allocated() {
    let mut a = ChunkAllocator::new(BASE, 8 * PAGE + 100, PAGE);
    assert_eq!(a.capacity(), 8 * PAGE);
    let c = a
        .alloc(Owner::Client(1), 8 * PAGE)
        .expect("the whole region fits");
    assert_eq!((c.addr, c.len), (BASE, 8 * PAGE));
    assert_eq!(
        a.alloc(Owner::Client(1), 1),
        Err(AllocError::NoSpace {
            need: PAGE,
            free: 0
        })
    );
    ok(&a);
}

#[test]
fn first_fit_reuses_the_lowest_hole_that_fits() {
    let mut a = books(16);
    let x = a.alloc(Owner::Client(1), PAGE).expect("fits");
    let y = a.alloc(Owner::Client(1), 2 * PAGE).expect("fits");
    let z = a.alloc(Owner::Client(1), PAGE).expect("fits");
    assert_eq!(
        (x.addr, y.addr, z.addr),
        (BASE, BASE + PAGE, BASE + 3 * PAGE)
    );
    a.free(Owner::Client(1), y.addr).expect("owner frees");
    let big = a.alloc(Owner::Client(1), 3 * PAGE).expect("fits after z");
    assert_eq!(
        big.addr,
        BASE + 4 * PAGE,
        "a 3-page chunk cannot use the 2-page hole"
    );
    let small = a.alloc(Owner::Client(2), PAGE).expect("fits in the hole");
    assert_eq!(
        small.addr,
        BASE + PAGE,
        "a 1-page chunk takes the lowest hole"
    );
    ok(&a);
}

#[test]
fn freeing_coalesces_with_both_neighbours() {
    let mut a = books(4);
    let c: Vec<Booking> = (0..4)
        .map(|_| a.alloc(Owner::Client(7), PAGE).expect("fits"))
        .collect();
    for i in [0, 2, 1, 3] {
        a.free(Owner::Client(7), c[i].addr).expect("owner frees");
        ok(&a);
    }
    assert_eq!(a.free_extents().collect::<Vec<_>>(), vec![(BASE, 4 * PAGE)]);
    assert_eq!(a.used(), 0);
    assert_eq!(a.count(), 0);
}

#[test]
fn fragmented_free_space_is_no_space_for_a_larger_chunk() {
    let mut a = books(4);
    let c: Vec<Booking> = (0..4)
        .map(|_| a.alloc(Owner::Client(1), PAGE).expect("fits"))
        .collect();
    a.free(Owner::Client(1), c[0].addr).expect("frees");
    a.free(Owner::Client(1), c[2].addr).expect("frees");
    assert_eq!(
        a.alloc(Owner::Client(1), 2 * PAGE),
        Err(AllocError::NoSpace {
            need: 2 * PAGE,
            free: 2 * PAGE
        }),
        "two separate free pages cannot hold a two-page chunk"
    );
    ok(&a);
}

#[test]
fn free_of_anything_but_the_owners_exact_chunk_is_not_found() {
    let mut a = books(8);
    let c = a.alloc(Owner::Client(1), PAGE).expect("fits");
    let cases = [
        ("another owner", Owner::Client(2), c.addr),
        ("a volume of the same number", Owner::Volume(1), c.addr),
        ("an address inside", Owner::Client(1), c.addr + 8),
        ("the next address", Owner::Client(1), c.addr + PAGE),
    ];
    for (what, owner, addr) in cases {
        assert_eq!(
            a.free(owner, addr),
            Err(AllocError::NotFound { addr }),
            "free with {what} must be NotFound"
        );
        assert_eq!(
            a.get(c.addr),
            Some(&c),
            "free with {what} must change nothing"
        );
    }
    assert_eq!(a.free(Owner::Client(1), c.addr), Ok(c));
    assert_eq!(
        a.free(Owner::Client(1), c.addr),
        Err(AllocError::NotFound { addr: c.addr }),
        "a double free must be NotFound"
    );
    ok(&a);
}

#[test]
fn used_rises_on_alloc_and_falls_on_free() {
    let mut a = books(8);
    let x = a.alloc(Owner::Client(1), 3 * PAGE).expect("fits");
    let y = a.alloc(Owner::Client(2), 1).expect("fits");
    assert_eq!(a.used(), 4 * PAGE);
    a.free(Owner::Client(1), x.addr).expect("frees");
    assert_eq!(a.used(), PAGE);
    a.free(Owner::Client(2), y.addr).expect("frees");
    assert_eq!(a.used(), 0);
}

#[derive(Debug, Clone)]
enum Op {
    Alloc { owner: Owner, bytes: u64 },
    Free { pick: usize },
    FreeAsStranger { pick: usize, flip_kind: bool },
}

/// A few owners, clients and volumes with the same numbers among them.
fn owner() -> impl Strategy<Value = Owner> {
    prop_oneof![
        (0u64..3).prop_map(Owner::Client),
        (0u64..3).prop_map(Owner::Volume)
    ]
}

/// Someone who is not `o`: the other kind of owner with the same number, or another
/// number.
fn stranger(o: Owner, flip_kind: bool) -> Owner {
    match (o, flip_kind) {
        (Owner::Client(n), true) => Owner::Volume(n),
        (Owner::Volume(n), true) => Owner::Client(n),
        (Owner::Client(n), false) => Owner::Client(n + 100),
        (Owner::Volume(n), false) => Owner::Volume(n + 100),
    }
}

fn op(capacity: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (owner(), 0..=capacity + PAGE).prop_map(|(owner, bytes)| Op::Alloc { owner, bytes }),
        1 => (owner(), 1..=4 * PAGE).prop_map(|(owner, bytes)| Op::Alloc { owner, bytes }),
        2 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        1 => (any::<usize>(), any::<bool>())
            .prop_map(|(pick, flip_kind)| Op::FreeAsStranger { pick, flip_kind }),
    ]
}

/// The model: live chunks only. First fit is the lowest gap between them that fits.
fn first_fit(live: &[Booking], capacity: u64, need: u64) -> Option<u64> {
    let mut sorted: Vec<&Booking> = live.iter().collect();
    sorted.sort_by_key(|c| c.addr);
    let mut at = BASE;
    for c in sorted {
        if c.addr - at >= need {
            return Some(at);
        }
        at = c.addr + c.len;
    }
    (BASE + capacity - at >= need).then_some(at)
}

proptest! {
    #[test]
    fn allocator_matches_a_first_fit_model(ops in proptest::collection::vec(op(32 * PAGE), 1..200)) {
        let capacity = 32 * PAGE;
        let mut a = books(32);
        let mut live: Vec<Booking> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc { owner, bytes } => {
                    let got = a.alloc(owner, bytes);
                    let need = bytes.div_ceil(PAGE) * PAGE;
                    if bytes == 0 {
                        prop_assert_eq!(got, Err(AllocError::ZeroSize));
                    } else if bytes > capacity {
                        prop_assert_eq!(got, Err(AllocError::TooLarge { bytes, capacity }));
                    } else {
                        match first_fit(&live, capacity, need) {
                            Some(addr) => {
                                let c = got.expect("the model found room");
                                prop_assert_eq!((c.owner, c.addr, c.len), (owner, addr, need));
                                live.push(c);
                            }
                            None => prop_assert!(
                                matches!(got, Err(AllocError::NoSpace { .. })),
                                "expected NoSpace, got {:?}", got
                            ),
                        }
                    }
                }
                Op::Free { pick } if !live.is_empty() => {
                    let c = live.swap_remove(pick % live.len());
                    prop_assert_eq!(a.free(c.owner, c.addr), Ok(c));
                }
                Op::FreeAsStranger { pick, flip_kind } if !live.is_empty() => {
                    let c = live[pick % live.len()];
                    prop_assert_eq!(
                        a.free(stranger(c.owner, flip_kind), c.addr),
                        Err(AllocError::NotFound { addr: c.addr })
                    );
                }
                Op::Free { .. } | Op::FreeAsStranger { .. } => {}
            }
            prop_assert_eq!(a.used(), live.iter().map(|c| c.len).sum::<u64>());
            prop_assert_eq!(a.count(), live.len());
            if let Err(e) = a.check_invariants() {
                return Err(TestCaseError::fail(e));
            }
        }
    }
}
