//! Page checksums end to end in the core: bytes changed in a copy behind fsd's back
//! are caught on load, repaired from a good copy, or fail with EIO when no good copy
//! is left; never returned as data. The copy is damaged through the fabric at its
//! remote address, as a stray write on the memnode's host would.

use super::replication::{Cluster, BS, ME};
use super::*;
use crate::inode::ROOT_INO;

/// A file of two 4 KiB blocks written back, out of the cache; its blocks' copies.
fn written_file(c: &Cluster) -> (Ino, Vec<u8>, Vec<Vec<crate::remote::Replica>>) {
    let ino = c.fs.create(ROOT_INO, "f".as_ref(), 0o644, ME).unwrap().ino;
    let data: Vec<u8> = (0..2 * BS).map(|i| (i * 7 % 251) as u8).collect();
    c.fs.write(ino, 0, &data).unwrap();
    c.fs.fsync(ino).unwrap();
    c.fs.cache().invalidate(ino, 0);
    let inode = c.fs.ns.get(ino).unwrap();
    let m = inode.meta();
    let copies = (0..2)
        .map(|b| m.blocks[&b].loc.replicas().to_vec())
        .collect();
    (ino, data, copies)
}

fn damage(c: &Cluster, copy: &crate::remote::Replica, at: usize) -> Vec<u8> {
    let remote = copy.remote.offset(at);
    let mut byte = [0u8; 1];
    c.fs.remote()
        .read_at(copy.node as usize, remote, &mut byte)
        .unwrap();
    let good = byte.to_vec();
    byte[0] ^= 0x40;
    c.fs.remote()
        .write_at(copy.node as usize, remote, &byte)
        .unwrap();
    good
}

fn counter(c: &Cluster, f: impl Fn(&crate::remote::RemoteCounters) -> &AtomicU64) -> u64 {
    f(&c.fs.remote().counters).load(Ordering::Relaxed)
}

#[test]
fn a_damaged_copy_is_read_past_and_repaired_from_a_good_one() {
    let c = Cluster::new(2, 2, 4);
    let (ino, data, copies) = written_file(&c);
    let first = copies[1][0];
    let good = damage(&c, &first, 100);
    assert_eq!(c.fs.read(ino, 0, data.len() as u32).unwrap(), data);
    assert_eq!(counter(&c, |k| &k.checksum_failures), 1);
    assert_eq!(counter(&c, |k| &k.pages_repaired), 1);
    let mut back = [0u8; 1];
    let at = first.remote.offset(100);
    c.fs.remote()
        .read_at(first.node as usize, at, &mut back)
        .unwrap();
    assert_eq!(
        back.to_vec(),
        good,
        "the bad copy holds the good byte again"
    );
    c.fs.cache().invalidate(ino, 0);
    assert_eq!(c.fs.read(ino, 0, data.len() as u32).unwrap(), data);
    assert_eq!(
        counter(&c, |k| &k.checksum_failures),
        1,
        "nothing bad the second time"
    );
}

#[test]
fn with_no_good_copy_the_read_fails_and_returns_nothing() {
    let c = Cluster::new(1, 1, 4);
    let (ino, data, copies) = written_file(&c);
    damage(&c, &copies[0][0], BS as usize - 1);
    match c.fs.read(ino, 0, data.len() as u32) {
        Err(FsError::Io(msg)) => assert!(msg.contains("checksum"), "{msg}"),
        other => panic!("read of a damaged block: {other:?}"),
    }
    assert_eq!(counter(&c, |k| &k.checksum_failures), 1);
    assert_eq!(counter(&c, |k| &k.pages_repaired), 0);
    // The other block is intact and still reads.
    let second = c.fs.read(ino, BS, BS as u32).unwrap();
    assert_eq!(second, data[BS as usize..]);
}

#[test]
fn pages_keep_their_sums_when_a_block_grows_and_moves() {
    // 64 KiB blocks, so a small file's block holds one page and grows.
    let c = Cluster::with_block_size(1, 1, 8, 64 << 10);
    let ino = c.fs.create(ROOT_INO, "g".as_ref(), 0o644, ME).unwrap().ino;
    c.fs.write(ino, 0, &[1u8; 3000]).unwrap();
    c.fs.fsync(ino).unwrap();
    // A neighbour right after it, so the block must move to grow.
    let other = c.fs.create(ROOT_INO, "h".as_ref(), 0o644, ME).unwrap().ino;
    c.fs.write(other, 0, &[2u8; 100]).unwrap();
    c.fs.fsync(other).unwrap();
    c.fs.cache().invalidate(ino, 0);
    c.fs.write(ino, 20_000, &[3u8; 10]).unwrap();
    c.fs.fsync(ino).unwrap();
    c.fs.cache().invalidate(ino, 0);
    let got = c.fs.read(ino, 0, 20_010).unwrap();
    assert!(got[..3000].iter().all(|&b| b == 1));
    assert!(got[3000..20_000].iter().all(|&b| b == 0));
    assert!(got[20_000..].iter().all(|&b| b == 3));
    assert_eq!(counter(&c, |k| &k.checksum_failures), 0);
    // The first page was written whole, pages 1-3 are zeros the move put there; the
    // last got 10 bytes written into a page the cache did not hold (no sum).
    let inode = c.fs.ns.get(ino).unwrap();
    let sums = inode.meta().blocks[&0].sums.clone();
    let known = sums.expected(0, 5 * 4096);
    assert_eq!(
        known.iter().take(4).filter(|s| s.is_some()).count(),
        4,
        "{known:?}"
    );
    assert_eq!(sums.expected(0, 64 << 10).len(), 16);
}

#[test]
fn the_scrubber_repairs_a_copy_nobody_reads() {
    let c = Cluster::new(2, 2, 4);
    let (_ino, _data, copies) = written_file(&c);
    let second = copies[0][1];
    let good = damage(&c, &second, 5);
    // Budget for one block's two copies per call: the damage is in the first block.
    let mut passes = 0;
    while c.fs.scrub_counters.passes.load(Ordering::Relaxed) == 0 {
        c.fs.scrub(2 * BS);
        passes += 1;
        assert!(passes < 100, "the scrubber never finished a pass");
    }
    assert_eq!(counter(&c, |k| &k.checksum_failures), 1);
    assert_eq!(counter(&c, |k| &k.pages_repaired), 1);
    assert_eq!(c.fs.scrub_counters.bad_pages.load(Ordering::Relaxed), 1);
    let mut back = [0u8; 1];
    let at = second.remote.offset(5);
    c.fs.remote()
        .read_at(second.node as usize, at, &mut back)
        .unwrap();
    assert_eq!(back.to_vec(), good, "the scrubber rewrote the bad copy");
    // A second pass finds nothing more.
    c.fs.scrub(u64::MAX);
    assert_eq!(counter(&c, |k| &k.checksum_failures), 1);
}

#[test]
fn the_scrubber_gives_pages_without_a_sum_the_sum_their_copies_agree_on() {
    // 64 KiB blocks: a write of part of a page the cache never held leaves it unsummed.
    let c = Cluster::with_block_size(2, 2, 8, 64 << 10);
    let ino = c.fs.create(ROOT_INO, "u".as_ref(), 0o644, ME).unwrap().ino;
    c.fs.write(ino, 0, &[4u8; 3 * 4096]).unwrap();
    c.fs.fsync(ino).unwrap();
    c.fs.cache().invalidate(ino, 0);
    c.fs.write(ino, 4096 + 10, &[5u8; 100]).unwrap();
    c.fs.fsync(ino).unwrap();
    c.fs.cache().invalidate(ino, 0);
    let sums = |c: &Cluster| c.fs.ns.get(ino).unwrap().meta().blocks[&0].sums.clone();
    assert_eq!(sums(&c).known(), 2, "page 1 was written in part");
    c.fs.scrub(u64::MAX);
    assert_eq!(sums(&c).known(), 3, "both copies agree on page 1");
    assert_eq!(c.fs.scrub_counters.adopted_pages.load(Ordering::Relaxed), 1);
    // From now on page 1 is checked like any other.
    let copy = c.fs.ns.get(ino).unwrap().meta().blocks[&0].loc.replicas()[1];
    damage(&c, &copy, 4096 + 50);
    c.fs.scrub(u64::MAX);
    assert_eq!(c.fs.scrub_counters.bad_pages.load(Ordering::Relaxed), 1);
    assert_eq!(counter(&c, |k| &k.pages_repaired), 1);
    let got = c.fs.read(ino, 0, 3 * 4096).unwrap();
    assert!(got[4096 + 10..4096 + 110].iter().all(|&b| b == 5));
    assert_eq!(got.iter().filter(|&&b| b == 4).count(), 3 * 4096 - 100);
}

#[test]
fn copies_that_differ_in_a_page_without_a_sum_are_left_alone_and_counted() {
    let c = Cluster::with_block_size(2, 2, 8, 64 << 10);
    let ino = c.fs.create(ROOT_INO, "v".as_ref(), 0o644, ME).unwrap().ino;
    c.fs.write(ino, 0, &[4u8; 2 * 4096]).unwrap();
    c.fs.fsync(ino).unwrap();
    c.fs.cache().invalidate(ino, 0);
    c.fs.write(ino, 10, &[5u8; 10]).unwrap();
    c.fs.fsync(ino).unwrap();
    c.fs.cache().invalidate(ino, 0);
    let copy = c.fs.ns.get(ino).unwrap().meta().blocks[&0].loc.replicas()[0];
    damage(&c, &copy, 2000);
    c.fs.scrub(u64::MAX);
    assert_eq!(
        c.fs.scrub_counters.unsettled_pages.load(Ordering::Relaxed),
        1
    );
    assert_eq!(c.fs.scrub_counters.adopted_pages.load(Ordering::Relaxed), 0);
    let inode = c.fs.ns.get(ino).unwrap();
    assert_eq!(
        inode.meta().blocks[&0].sums.known(),
        1,
        "page 0 stays unsummed"
    );
}

#[test]
fn a_page_written_back_in_runs_keeps_every_runs_sums_when_a_copy_fails() {
    // A page with two separate dirty sectors of a written block is written back as
    // two writes to the same two copies. With one copy's memnode gone (fsd not yet
    // aware), both fail there: the first to finish drops that copy, and the second
    // must still record its sums on the copy left, or that copy's page fails its
    // checksum on the next read (found by fsx when a memnode died under it).
    const BIG: u64 = 64 << 10;
    let mut c = Cluster::with_watch(3, 2, 4, BIG, std::time::Duration::from_secs(3600));
    let ino = c.fs.create(ROOT_INO, "f".as_ref(), 0o644, ME).unwrap().ino;
    let mut want: Vec<u8> = (0..BIG).map(|i| (i * 7 % 251) as u8).collect();
    c.fs.write(ino, 0, &want).unwrap();
    c.fs.fsync(ino).unwrap();
    for (sector, byte) in [(1u64, 0xa1u8), (3, 0xa3)] {
        let at = (sector * 4096) as usize;
        want[at..at + 4096].fill(byte);
        c.fs.write(ino, at as u64, &want[at..at + 4096]).unwrap();
    }
    let gone = c.fs.ns.get(ino).unwrap().meta().blocks[&0].loc.replicas()[1].node as usize;
    c.shut_down(gone);
    assert!(
        c.fs.remote().node_is_up(gone),
        "fsd must not know yet that the memnode is gone"
    );
    c.fs.fsync(ino).unwrap();
    assert!(
        !c.fs.remote().node_is_up(gone),
        "the write-back found it gone"
    );
    c.fs.cache().invalidate(ino, 0);
    let back =
        c.fs.read(ino, 0, BIG as u32)
            .expect("the copy left reads back");
    assert!(back == want, "the copy left holds other bytes");
    assert_eq!(counter(&c, |k| &k.checksum_failures), 0);
}
