//! Checksums a write computes and hands to the write-back, and those a change the
//! cache cannot see makes it forget.

use super::*;

#[test]
fn a_write_hands_the_sums_of_the_pages_it_filled_to_the_write_back() {
    let b = MemRemote::default();
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
    let b = MemRemote::default();
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
