//! Sub-block validity end to end: 64 KiB blocks in 4 KiB sectors, a real memnode, and
//! fsd's remote traffic counters as the witness of what was read when.

use super::*;

const BIG: u64 = 64 << 10;
const SECTOR: u64 = 4096;

/// A rig with 64 KiB blocks and a cache of `pages` of them.
fn big_rig(pages: u64) -> Rig {
    rig_of(
        64 << 20,
        pages * BIG,
        1 << 20,
        BIG,
        Arc::new(Faults::default()),
    )
}

fn reads(fs: &RmemFs) -> (u64, u64) {
    let c = &fs.remote().counters;
    (
        c.reads.load(Ordering::Relaxed),
        c.read_bytes.load(Ordering::Relaxed),
    )
}

/// Pushes every page out of the cache: writes (and syncs) a fresh file of twice the
/// cache, so earlier dirty pages are written back on eviction.
fn evict_all(fs: &RmemFs) {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = format!("evictor{}", N.fetch_add(1, Ordering::Relaxed));
    let ino = new_file(fs, &name);
    let blocks = 2 * fs.cache().capacity_pages() as u64;
    fs.write(ino, 0, &vec![0x5a; (blocks * BIG) as usize])
        .unwrap();
    fs.fsync(ino).unwrap();
    assert_eq!(fs.cache().dirty_pages(), 0);
}

/// A file "f" of `len` bytes of pattern `seed`, written back and out of the cache.
fn file_in_remote_memory(fs: &RmemFs, len: u64, seed: u64) -> (Ino, Vec<u8>) {
    let ino = new_file(fs, "f");
    let data = pattern(len as usize, seed);
    fs.write(ino, 0, &data).unwrap();
    fs.fsync(ino).unwrap();
    evict_all(fs);
    (ino, data)
}

fn set_size(fs: &RmemFs, ino: Ino, size: u64) {
    fs.setattr(
        ino,
        &SetAttr {
            size: Some(size),
            ..SetAttr::default()
        },
    )
    .unwrap();
}

fn read_all(fs: &RmemFs, ino: Ino) -> Vec<u8> {
    let size = fs.getattr(ino).unwrap().size;
    fs.read(ino, 0, size as u32).unwrap()
}

#[test]
fn a_sector_write_to_an_uncached_block_reads_nothing_and_is_written_back_alone() {
    let r = big_rig(2);
    let (ino, old) = file_in_remote_memory(&r.fs, BIG, 1);

    let before = reads(&r.fs);
    let new = pattern(SECTOR as usize, 2);
    r.fs.write(ino, 3 * SECTOR, &new).unwrap();
    assert_eq!(
        reads(&r.fs),
        before,
        "the write read nothing from remote memory"
    );
    assert_eq!(
        r.fs.cache().counters.partial_writes.load(Ordering::Relaxed),
        1
    );

    // Eviction writes the page back: the block is in remote memory with all its
    // copies, so the dirty sector alone is written, and nothing is read.
    evict_all(&r.fs);
    assert_eq!(reads(&r.fs), before, "the write-back read nothing");
    assert_eq!(
        r.fs.cache().counters.partial_stores.load(Ordering::Relaxed),
        1
    );

    let mut want = old.clone();
    want[3 * SECTOR as usize..4 * SECTOR as usize].copy_from_slice(&new);
    assert!(read_all(&r.fs, ino) == want, "block read back differs");
}

#[test]
fn a_read_of_a_partial_dirty_page_gives_the_new_sectors_over_the_old_content() {
    let r = big_rig(4);
    let (ino, old) = file_in_remote_memory(&r.fs, 2 * BIG, 3);

    let new = pattern(2 * SECTOR as usize, 4);
    // Sectors 15 of block 0 and 0 of block 1: two partial pages.
    r.fs.write(ino, BIG - SECTOR, &new).unwrap();
    let mut want = old.clone();
    want[(BIG - SECTOR) as usize..(BIG + SECTOR) as usize].copy_from_slice(&new);
    let before = reads(&r.fs);
    assert!(r.fs.read(ino, 0, 2 * BIG as u32).unwrap() == want);
    let after = reads(&r.fs);
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (2, 2 * (BIG - SECTOR)),
        "each block's missing sectors read once, the new ones not at all"
    );
    // Now complete: the write-back reads nothing more.
    r.fs.fsync(ino).unwrap();
    assert_eq!(reads(&r.fs), after);
    evict_all(&r.fs);
    assert!(
        read_all(&r.fs, ino) == want,
        "after write-back and eviction"
    );
}

#[test]
fn a_sector_write_to_a_new_block_never_reads_and_never_shows_stale_bytes() {
    let r = big_rig(2);
    // A block that held 0xaa goes back to the pool, to be reused below.
    let old = new_file(&r.fs, "old");
    r.fs.write(old, 0, &vec![0xaa; BIG as usize]).unwrap();
    r.fs.fsync(old).unwrap();
    let zero = SetAttr {
        size: Some(0),
        ..SetAttr::default()
    };
    r.fs.setattr(old, &zero).unwrap();

    let ino = new_file(&r.fs, "new");
    let before = reads(&r.fs);
    let data = pattern(SECTOR as usize, 5);
    r.fs.write(ino, 2 * SECTOR, &data).unwrap();
    r.fs.fsync(ino).unwrap();
    assert_eq!(
        reads(&r.fs),
        before,
        "a block whose content never reached remote memory loads as zeros, unread"
    );
    let mut want = vec![0u8; 3 * SECTOR as usize];
    want[2 * SECTOR as usize..].copy_from_slice(&data);
    assert_eq!(read_all(&r.fs, ino), want);
    evict_all(&r.fs);
    assert_eq!(read_all(&r.fs, ino), want);
    // The block in remote memory holds zeros past EOF, not the old file's bytes.
    set_size(&r.fs, ino, BIG);
    want.resize(BIG as usize, 0);
    assert_eq!(read_all(&r.fs, ino), want);
}

#[test]
fn unaligned_writes_into_partial_and_uncached_blocks_stay_exact() {
    let r = big_rig(2);
    let (ino, mut want) = file_in_remote_memory(&r.fs, 3 * BIG, 6);
    // Aligned sector in block 0, then an unaligned write ending in a sector the page
    // lacks (loads, must keep the first), then one inside held sectors only.
    let writes: [(u64, usize, u64); 5] = [
        (SECTOR, SECTOR as usize, 7),
        (SECTOR + 100, 5000, 8),
        (SECTOR + 10, 20, 9),
        (BIG + 1, 3, 10),                   // unaligned into an uncached block
        (2 * BIG - 7, SECTOR as usize, 11), // across blocks 1 and 2, unaligned
    ];
    for (off, len, seed) in writes {
        let data = pattern(len, seed);
        r.fs.write(ino, off, &data).unwrap();
        want[off as usize..off as usize + len].copy_from_slice(&data);
    }
    assert!(read_all(&r.fs, ino) == want, "before write-back");
    evict_all(&r.fs);
    assert!(read_all(&r.fs, ino) == want, "after write-back");
}

#[test]
fn truncate_and_punch_on_partial_pages_keep_the_file_exact() {
    let r = big_rig(2);
    let (ino, mut want) = file_in_remote_memory(&r.fs, 3 * BIG, 12);

    // A partial dirty page, then a truncate at a sector boundary inside its block:
    // the zeroed tail is whole sectors, so the truncate reads nothing either.
    let s1 = pattern(SECTOR as usize, 13);
    r.fs.write(ino, SECTOR, &s1).unwrap();
    want[SECTOR as usize..2 * SECTOR as usize].copy_from_slice(&s1);
    let before = reads(&r.fs);
    let set_size = |size: u64| {
        set_size(&r.fs, ino, size);
    };
    set_size(2 * SECTOR);
    assert_eq!(reads(&r.fs), before, "an aligned truncate reads nothing");
    want.truncate(2 * SECTOR as usize);
    assert!(
        read_all(&r.fs, ino) == want,
        "sector 0 from remote memory, 1 new"
    );
    // Growing again shows zeros past the old end, before and after write-back.
    set_size(2 * BIG + 100);
    want.resize((2 * BIG + 100) as usize, 0);
    assert!(read_all(&r.fs, ino) == want);
    evict_all(&r.fs);
    assert!(read_all(&r.fs, ino) == want);

    // An unaligned truncate into a partial page: its tail sector is loaded.
    let s2 = pattern(SECTOR as usize, 14);
    r.fs.write(ino, 0, &s2).unwrap();
    want[..SECTOR as usize].copy_from_slice(&s2);
    set_size(SECTOR + 123);
    want.truncate((SECTOR + 123) as usize);
    set_size(BIG);
    want.resize(BIG as usize, 0);
    assert!(read_all(&r.fs, ino) == want);
    evict_all(&r.fs);
    assert!(read_all(&r.fs, ino) == want);

    // Punching sectors out of a partial page of a written block.
    let full = pattern(2 * BIG as usize, 15);
    r.fs.write(ino, BIG, &full).unwrap();
    want.extend_from_slice(&full);
    r.fs.fsync(ino).unwrap();
    evict_all(&r.fs);
    let s5 = pattern(SECTOR as usize, 16);
    r.fs.write(ino, BIG + 5 * SECTOR, &s5).unwrap();
    want[(BIG + 5 * SECTOR) as usize..(BIG + 6 * SECTOR) as usize].copy_from_slice(&s5);
    let before = reads(&r.fs);
    r.fs.fallocate(ino, BIG + SECTOR, 2 * SECTOR, Allocate::PunchHole)
        .unwrap();
    assert_eq!(reads(&r.fs), before, "an aligned punch reads nothing");
    want[(BIG + SECTOR) as usize..(BIG + 3 * SECTOR) as usize].fill(0);
    assert!(read_all(&r.fs, ino) == want);
    evict_all(&r.fs);
    assert!(read_all(&r.fs, ino) == want);

    // Punching the whole block of a partial dirty page frees it; the page never
    // writes into the block once it is reused.
    r.fs.write(ino, 2 * BIG + 7 * SECTOR, &s5).unwrap();
    r.fs.fallocate(ino, 2 * BIG, BIG, Allocate::PunchHole)
        .unwrap();
    want[2 * BIG as usize..3 * BIG as usize].fill(0);
    let other = new_file(&r.fs, "other");
    let other_data = pattern(4 * BIG as usize, 17);
    r.fs.write(other, 0, &other_data).unwrap();
    r.fs.fsync(other).unwrap();
    evict_all(&r.fs);
    assert!(
        read_all(&r.fs, ino) == want,
        "the punched block reads as zeros"
    );
    assert!(
        read_all(&r.fs, other) == other_data,
        "the reused block is intact"
    );
    // Block 0 was cut to the two pages its 4,219 bytes need; block 1 is whole.
    assert_eq!(r.fs.getattr(ino).unwrap().allocated, BIG + 2 * SECTOR);
}

#[test]
fn two_writers_racing_into_a_new_block_by_halves_both_land() {
    // As `two_writers_racing_into_a_new_block_...` with whole sectors: neither half
    // loads the block, and the second comes after the first went to remote memory.
    let r = big_rig(2);
    let ino = new_file(&r.fs, "racing");
    let inode = r.fs.ns.get(ino).unwrap();
    let half = (BIG / 2) as usize;
    let (a, b) = (pattern(half, 21), pattern(half, 22));
    assert_eq!(r.fs.allocate_blocks(&inode, 0..1).unwrap(), vec![0]);
    r.fs.write(ino, half as u64, &b).unwrap();
    evict_all(&r.fs);
    r.fs.write_allocated(&inode, 0, &a).unwrap();
    let got = r.fs.read(ino, 0, BIG as u32).unwrap();
    assert!(got[..half] == a[..], "writer A's half is in the block");
    assert!(
        got[half..] == b[..],
        "writer B's half survived A's late write"
    );
    evict_all(&r.fs);
    let got = r.fs.read(ino, 0, BIG as u32).unwrap();
    assert!(got[..half] == a[..] && got[half..] == b[..]);
}

/// A small xorshift for the model test.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn random_writes_truncates_and_punches_match_a_model() {
    let r = big_rig(3);
    let ino = new_file(&r.fs, "model");
    let mut model: Vec<u8> = Vec::new();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let span = 8 * BIG;
    for step in 0..600u64 {
        let aligned = rng.below(2) == 0;
        let pick = |rng: &mut Rng, max: u64| {
            let v = rng.below(max);
            if aligned {
                v / SECTOR * SECTOR
            } else {
                v
            }
        };
        match rng.below(10) {
            0..=5 => {
                let off = pick(&mut rng, span);
                let len = pick(&mut rng, 3 * BIG / 2).max(if aligned { SECTOR } else { 1 });
                let data = pattern(len as usize, step + 100);
                r.fs.write(ino, off, &data).unwrap();
                let end = (off + len) as usize;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[off as usize..end].copy_from_slice(&data);
            }
            6 => {
                let size = pick(&mut rng, span);
                set_size(&r.fs, ino, size);
                model.resize(size as usize, 0);
            }
            7 => {
                let off = pick(&mut rng, span);
                let len = pick(&mut rng, 2 * BIG).max(1);
                r.fs.fallocate(ino, off, len, Allocate::PunchHole).unwrap();
                let end = ((off + len) as usize).min(model.len());
                if (off as usize) < end {
                    model[off as usize..end].fill(0);
                }
            }
            8 => r.fs.fsync(ino).unwrap(),
            _ => {
                let off = rng.below(span);
                let len = rng.below(2 * BIG) + 1;
                let got = r.fs.read(ino, off, len as u32).unwrap();
                let from = (off as usize).min(model.len());
                let to = ((off + len) as usize).min(model.len());
                assert!(
                    got == model[from..to],
                    "step {step}: read {off}+{len} differs"
                );
            }
        }
    }
    assert!(read_all(&r.fs, ino) == model, "whole file before eviction");
    evict_all(&r.fs);
    assert!(read_all(&r.fs, ino) == model, "whole file after eviction");
    let c = &r.fs.cache().counters;
    assert!(c.partial_writes.load(Ordering::Relaxed) > 0);
    assert!(c.partial_fills.load(Ordering::Relaxed) > 0);
}

#[test]
fn a_random_4k_read_reads_4k_and_a_stream_reads_whole_blocks() {
    let r = big_rig(8);
    let (ino, data) = file_in_remote_memory(&r.fs, 4 * BIG, 5);

    // A 4 KiB read in the middle of block 2: one READ of one sector.
    let before = reads(&r.fs);
    let at = 2 * BIG + 5 * SECTOR;
    let got = r.fs.read(ino, at, SECTOR as u32).unwrap();
    assert!(got == data[at as usize..(at + SECTOR) as usize]);
    let after = reads(&r.fs);
    assert_eq!((after.0 - before.0, after.1 - before.1), (1, SECTOR));
    // An unaligned 100-byte read across a sector boundary: the two sectors it touches.
    let at = BIG + SECTOR - 50;
    let got = r.fs.read(ino, at, 100).unwrap();
    assert!(got == data[at as usize..(at + 100) as usize]);
    let later = reads(&r.fs);
    assert_eq!((later.0 - after.0, later.1 - after.1), (1, 2 * SECTOR));

    // A reader going on from where it stopped is a stream: whole blocks from then on
    // (block 1's missing sectors, then blocks 2 and 3 read ahead).
    let got = r.fs.read(ino, at + 100, SECTOR as u32).unwrap();
    let from = (at + 100) as usize;
    assert!(got == data[from..from + SECTOR as usize]);
    let streamed = reads(&r.fs);
    assert_eq!(
        streamed.1 - later.1,
        (BIG - 2 * SECTOR) + (BIG - SECTOR) + BIG,
        "the rest of blocks 1 and 2, and block 3"
    );
    assert!(read_all(&r.fs, ino) == data);
}
