//! copy_file_range in the core: whole blocks copied inside remote memory (by the
//! memnodes that hold the source), the ends through the cache, holes kept, sums
//! carried over; the copy reads back exactly from remote memory, not from the cache.

use super::replication::{Cluster, ME};
use super::*;
use crate::inode::ROOT_INO;

const BS: u64 = 64 << 10;

fn data(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn file(c: &Cluster, name: &str, bytes: &[u8]) -> Ino {
    let ino = c.fs.create(ROOT_INO, name.as_ref(), 0o644, ME).unwrap().ino;
    if !bytes.is_empty() {
        c.fs.write(ino, 0, bytes).unwrap();
    }
    ino
}

/// The whole file, read from remote memory (its pages dropped from the cache first).
fn remote_contents(c: &Cluster, ino: Ino) -> Vec<u8> {
    c.fs.cache().flush_inode(&c.fs, ino).unwrap();
    c.fs.cache().invalidate(ino, 0);
    let size = c.fs.getattr(ino).unwrap().size;
    c.fs.read(ino, 0, size as u32).unwrap()
}

fn copied_by_memnodes(c: &Cluster) -> u64 {
    c.fs.remote()
        .counters
        .memnode_copy_bytes
        .load(Ordering::Relaxed)
}

#[test]
fn whole_blocks_are_copied_by_the_memnodes_and_the_ends_through_the_cache() {
    let c = Cluster::with_block_size(2, 2, 8, BS);
    let src_bytes = data(20 * BS as usize + 1234, 3);
    let src = file(&c, "src", &src_bytes);
    let dst = file(&c, "dst", &data(3 * BS as usize, 4));
    // Offsets as far into their blocks (100 bytes), so blocks line up.
    let (off_in, off_out, len) = (BS + 100, 2 * BS + 100, 15 * BS + 50);
    let n = c.fs.copy_range(src, off_in, dst, off_out, len).unwrap();
    assert_eq!(n, len);
    let mut want = data(3 * BS as usize, 4);
    want.resize((off_out + len) as usize, 0);
    want[off_out as usize..].copy_from_slice(&src_bytes[off_in as usize..(off_in + len) as usize]);
    assert!(
        remote_contents(&c, dst) == want,
        "the copy reads back exactly"
    );
    assert!(
        remote_contents(&c, src) == src_bytes,
        "the source is untouched"
    );
    // 14 whole blocks, two copies each, every copy made by a memnode holding the source.
    assert_eq!(copied_by_memnodes(&c), 14 * 2 * BS);
    assert_eq!(c.fs.counters.copied_blocks.load(Ordering::Relaxed), 14);
    // Their sums came with them: a damaged copy of a copied block is caught.
    let inode = c.fs.ns.get(dst).unwrap();
    let e = inode.meta().blocks[&5].clone();
    assert_eq!(e.sums.known(), 16, "the source block's sums");
    let bad = e.loc.replicas()[0];
    let at = bad.remote.offset(777);
    c.fs.remote()
        .write_at(bad.node as usize, at, &[0xaa])
        .unwrap();
    c.fs.cache().invalidate(dst, 0);
    let got = c.fs.read(dst, 5 * BS, BS as u32).unwrap();
    assert!(
        got == want[5 * BS as usize..6 * BS as usize],
        "read past the bad copy"
    );
    assert_eq!(
        c.fs.remote()
            .counters
            .checksum_failures
            .load(Ordering::Relaxed),
        1
    );
}

#[test]
fn a_hole_in_the_source_becomes_one_in_the_destination() {
    let c = Cluster::with_block_size(1, 1, 8, BS);
    let src = file(&c, "src", &[]);
    c.fs.write(src, 0, &data(BS as usize, 5)).unwrap();
    c.fs.write(src, 3 * BS, &data(BS as usize, 6)).unwrap();
    let dst = file(&c, "dst", &vec![9u8; 4 * BS as usize]);
    assert_eq!(c.fs.copy_range(src, 0, dst, 0, 4 * BS).unwrap(), 4 * BS);
    let got = remote_contents(&c, dst);
    assert!(got[BS as usize..3 * BS as usize].iter().all(|&b| b == 0));
    assert!(got[3 * BS as usize..] == data(BS as usize, 6)[..]);
    let attr = c.fs.getattr(dst).unwrap();
    assert_eq!(attr.allocated, 2 * BS, "the hole holds no remote memory");
}

#[test]
fn offsets_not_as_far_into_their_blocks_copy_through_the_cache() {
    let c = Cluster::with_block_size(1, 1, 8, BS);
    let bytes = data(6 * BS as usize, 7);
    let src = file(&c, "src", &bytes);
    let dst = file(&c, "dst", &[]);
    assert_eq!(c.fs.copy_range(src, 10, dst, 0, 5 * BS).unwrap(), 5 * BS);
    assert!(remote_contents(&c, dst) == bytes[10..(10 + 5 * BS) as usize]);
    assert_eq!(copied_by_memnodes(&c), 0);
}

#[test]
fn the_copy_stops_at_the_end_of_the_source_and_refuses_overlap_within_a_file() {
    let c = Cluster::with_block_size(1, 1, 8, BS);
    let bytes = data(3 * BS as usize, 8);
    let src = file(&c, "src", &bytes);
    let dst = file(&c, "dst", &[]);
    assert_eq!(c.fs.copy_range(src, 0, dst, 0, u64::MAX).unwrap(), 3 * BS);
    assert_eq!(c.fs.copy_range(src, 3 * BS, dst, 0, 100).unwrap(), 0);
    assert!(remote_contents(&c, dst) == bytes);
    assert_eq!(
        c.fs.copy_range(src, 0, src, BS, 2 * BS),
        Err(FsError::Invalid)
    );
    // Within one file, apart: fine.
    assert_eq!(c.fs.copy_range(src, 0, src, 4 * BS, BS).unwrap(), BS);
    let got = remote_contents(&c, src);
    assert!(got[4 * BS as usize..] == bytes[..BS as usize]);
}

#[test]
fn dirty_source_pages_are_written_back_before_their_blocks_are_copied() {
    let c = Cluster::with_block_size(1, 1, 64, BS);
    let src = file(&c, "src", &data(4 * BS as usize, 9));
    c.fs.write(src, BS + 7, b"newer bytes").unwrap();
    let dst = file(&c, "dst", &[]);
    assert_eq!(c.fs.copy_range(src, 0, dst, 0, 4 * BS).unwrap(), 4 * BS);
    let got = remote_contents(&c, dst);
    assert_eq!(&got[(BS + 7) as usize..(BS + 18) as usize], b"newer bytes");
}

#[test]
fn a_new_copy_on_a_memnode_without_the_source_is_written_through_fsd() {
    let c = Cluster::with_block_size(2, 1, 8, BS);
    let bytes = data(BS as usize, 10);
    let src = file(&c, "src", &bytes);
    c.fs.cache().flush_inode(&c.fs, src).unwrap();
    let from = c.fs.ns.get(src).unwrap().meta().blocks[&0].clone();
    // A block on the other memnode (allocation takes memnodes in turn).
    let to = (0..4)
        .map(|_| c.fs.remote().alloc_block(BS).unwrap())
        .find(|l| l.replicas()[0].node != from.loc.replicas()[0].node)
        .expect("a block on the other memnode");
    let sums = from.sums.expected(0, BS as usize);
    let r = c.fs.remote().copy_blocks(&[crate::remote::BlockCopy {
        from: &from.loc,
        sums: &sums,
        to: &to,
    }]);
    assert_eq!(r, vec![Ok(())]);
    assert_eq!(copied_by_memnodes(&c), 0, "no memnode held both");
    let t = to.replicas()[0];
    let mut back = vec![0u8; BS as usize];
    c.fs.remote()
        .read_at(t.node as usize, t.remote, &mut back)
        .unwrap();
    assert!(back == bytes);
}
