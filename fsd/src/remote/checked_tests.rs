use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

const CAP: u64 = 1 << 30;

fn chunk(addr: u64, len: u64) -> Allocation {
    Allocation { addr, len, rkey: 7 }
}

#[test]
fn a_chunk_that_is_empty_too_large_or_wrapping_is_refused_naming_it() {
    assert_eq!(check_chunk("Allocated", CAP, &chunk(0x1000, 4096)), Ok(()));
    assert_eq!(check_chunk("Allocated", CAP, &chunk(0, CAP)), Ok(()));
    let e = check_chunk("Allocated", CAP, &chunk(0x1000, 0)).unwrap_err();
    assert!(
        e.contains("Allocated") && e.contains("0x1000") && e.contains("length 0"),
        "{e}"
    );
    let e = check_chunk("VolumeChunks", CAP, &chunk(0x1000, CAP + 1)).unwrap_err();
    assert!(
        e.contains("VolumeChunks") && e.contains(&format!("{}", CAP + 1)),
        "{e}"
    );
    let e = check_chunk("VolumeChunks", u64::MAX, &chunk(u64::MAX - 4095, 8192)).unwrap_err();
    assert!(
        e.contains("wraps") && e.contains("0xfffffffffffff000"),
        "{e}"
    );
    // Up to the last byte of the address space is a range; one more is not.
    assert_eq!(
        check_chunk("x", u64::MAX, &chunk(u64::MAX - 4096, 4096)),
        Ok(())
    );
}

#[test]
fn an_allocation_holds_at_least_what_was_asked() {
    assert_eq!(check_allocated(CAP, 4096, &chunk(0x1000, 8192)), Ok(()));
    assert_eq!(check_allocated(CAP, 8192, &chunk(0x1000, 8192)), Ok(()));
    let e = check_allocated(CAP, 8193, &chunk(0x1000, 8192)).unwrap_err();
    assert!(e.contains("less than the 8193 bytes asked for"), "{e}");
    assert!(check_allocated(CAP, 1, &chunk(0x1000, 0)).is_err());
    assert!(check_volume_root(CAP, &chunk(0x1000, u64::MAX)).is_err());
}

#[test]
fn a_chunk_list_out_of_order_repeated_overlapping_or_too_wide_is_refused() {
    let root = chunk(0x10_0000, 4096);
    let ok = [
        chunk(0x1000, 4096),
        chunk(0x2000, 8192),
        chunk(0x20_0000, 4096),
    ];
    assert_eq!(
        check_chunk_list("VolumeChunks", CAP, Some(&root), &ok),
        Ok(())
    );
    assert_eq!(
        check_chunk_list("VolumeChunks", CAP, Some(&root), &[]),
        Ok(())
    );
    let refused = |list: &[Allocation], root: Option<&Allocation>, cap: u64, says: &str| {
        let e = check_chunk_list("VolumeChunks", cap, root, list).unwrap_err();
        assert!(e.starts_with("VolumeChunks: ") && e.contains(says), "{e}");
    };
    refused(
        &[chunk(0x2000, 4096), chunk(0x1000, 4096)],
        None,
        CAP,
        "out of address order",
    );
    refused(
        &[chunk(0x1000, 4096), chunk(0x1000, 4096)],
        None,
        CAP,
        "repeated",
    );
    refused(
        &[chunk(0x1000, 8192), chunk(0x2000, 4096)],
        None,
        CAP,
        "overlaps chunk at 0x1000",
    );
    refused(
        &[chunk(0x10_0800, 4096)],
        Some(&root),
        CAP,
        "overlaps the volume's root",
    );
    refused(
        &[chunk(0xf_f800, 4096)],
        Some(&root),
        CAP,
        "overlaps the volume's root",
    );
    // From 0x1000 to CAP + 0x1000 is exactly the capacity; a page more is not.
    let whole = [chunk(0x1000, 4096), chunk(CAP, 4096)];
    assert_eq!(check_chunk_list("VolumeChunks", CAP, None, &whole), Ok(()));
    refused(
        &[chunk(0x1000, 4096), chunk(CAP + 0x1000, 4096)],
        None,
        CAP,
        "span more than",
    );
    // The root counts in the span: the region holds it too.
    refused(
        &[chunk(CAP, 4096)],
        Some(&chunk(0, 4096)),
        CAP,
        "span more than",
    );
    refused(&[chunk(u64::MAX - 4095, 4096)], None, u64::MAX, "wraps");
}

#[test]
fn copies_and_stats_are_what_was_asked_and_possible() {
    assert_eq!(check_copied(4096, 4096), Ok(()));
    assert!(check_copied(4096, 8192).unwrap_err().contains("8192"));
    assert!(check_copied(4096, 0).is_err());
    let stats = |capacity, used| NodeStats {
        capacity,
        used,
        clients: 1,
        allocations: 1,
    };
    assert_eq!(check_stats(&stats(100, 100)), Ok(()));
    assert!(check_stats(&stats(100, 101)).unwrap_err().contains("101"));
}

/// A chunk anywhere, of any length, with the ends of the address space likely.
fn any_chunk() -> impl Strategy<Value = Allocation> {
    let addr = prop_oneof![
        0u64..1 << 24,
        Just(u64::MAX),
        (0u64..1 << 20).prop_map(|d| u64::MAX - d),
        any::<u64>()
    ];
    let len = prop_oneof![0u64..1 << 22, Just(u64::MAX), any::<u64>()];
    (addr, len).prop_map(|(addr, len)| chunk(addr, len))
}

proptest! {
    /// Whatever a memnode lists, a list that passes holds what fsd takes for granted
    /// (the loader's ranges, sums and maps over it cannot panic or wrap).
    #[test]
    fn a_list_that_passes_is_ordered_disjoint_and_within_capacity(
        list in proptest::collection::vec(any_chunk(), 0..8),
        root in proptest::option::of(any_chunk()),
        capacity in prop_oneof![Just(u64::MAX), 1u64..1 << 26],
    ) {
        let root = root.filter(|r| check_volume_root(capacity, r).is_ok());
        if check_chunk_list("VolumeChunks", capacity, root.as_ref(), &list).is_ok() {
            let mut total = 0u64;
            let mut used: BTreeMap<u64, u64> = BTreeMap::new();
            for (k, c) in list.iter().enumerate() {
                let end = c.addr.checked_add(c.len).expect("no chunk wraps");
                prop_assert!(c.len > 0 && c.len <= capacity);
                if k > 0 {
                    prop_assert!(list[k - 1].addr + list[k - 1].len <= c.addr);
                }
                if let Some(r) = &root {
                    prop_assert!(end <= r.addr || r.addr + r.len <= c.addr);
                }
                total = total.checked_add(c.len).expect("the lengths add up");
                used.insert(c.addr, c.len);
                let _ = used.range(c.addr..end).count();
            }
            prop_assert!(total <= capacity);
        }
    }

    /// What an honest memnode lists passes: disjoint chunks in address order inside
    /// one region of its capacity.
    #[test]
    fn an_honest_list_passes(
        base in 0u64..1 << 40,
        pieces in proptest::collection::vec((0u64..8, 1u64..8), 0..12),
    ) {
        let page = 4096;
        let mut at = base * page;
        let mut list = Vec::new();
        for (gap, len) in pieces {
            at += gap * page;
            list.push(chunk(at, len * page));
            at += len * page;
        }
        let capacity = at - base * page;
        prop_assert_eq!(check_chunk_list("VolumeChunks", capacity.max(1), None, &list), Ok(()));
    }
}
