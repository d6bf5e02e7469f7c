//! Files that take only the 4 KiB pages they use: 64 KiB blocks, a real memnode, and
//! `st_blocks`, statfs and the remote traffic counters as witnesses.

use super::*;
use crate::remote::PAGE;

const BIG: u64 = 64 << 10;

fn small_rig(memnode: u64) -> Rig {
    rig_of(memnode, 16 * BIG, 1 << 20, BIG, Arc::new(Faults::default()))
}

fn allocated(fs: &RmemFs, ino: Ino) -> u64 {
    fs.getattr(ino).unwrap().allocated
}

fn read_all(fs: &RmemFs, ino: Ino, len: u64) -> Vec<u8> {
    fs.read(ino, 0, len as u32).unwrap()
}

/// Pushes every page of `ino` out of the cache after writing it back.
fn write_back_and_drop(fs: &RmemFs, ino: Ino) {
    fs.fsync(ino).unwrap();
    fs.cache().invalidate(ino, 0);
}

fn remote_reads(fs: &RmemFs) -> u64 {
    fs.remote().counters.reads.load(Ordering::Relaxed)
}

#[test]
fn files_take_the_pages_they_use_and_statfs_sees_exactly_that() {
    let r = small_rig(16 << 20);
    let free_before = r.fs.statfs().free_bytes;
    let tiny = new_file(&r.fs, "tiny");
    r.fs.write(tiny, 0, &pattern(300, 1)).unwrap();
    assert_eq!(allocated(&r.fs, tiny), PAGE);
    let medium = new_file(&r.fs, "medium");
    let data = pattern(70 << 10, 2);
    r.fs.write(medium, 0, &data).unwrap();
    // A whole 64 KiB block, then the 6 KiB tail in two pages.
    assert_eq!(allocated(&r.fs, medium), BIG + 2 * PAGE);
    let free_after = r.fs.statfs().free_bytes;
    assert_eq!(free_before - free_after, BIG + 3 * PAGE);
    write_back_and_drop(&r.fs, tiny);
    write_back_and_drop(&r.fs, medium);
    assert!(read_all(&r.fs, tiny, 300) == pattern(300, 1));
    assert!(read_all(&r.fs, medium, 70 << 10) == data);
}

#[test]
fn appending_in_small_writes_grows_the_block_without_remote_traffic() {
    let r = small_rig(16 << 20);
    let ino = new_file(&r.fs, "log");
    let data = pattern(40 << 10, 3);
    let reads = remote_reads(&r.fs);
    for (i, piece) in data.chunks(PAGE as usize).enumerate() {
        r.fs.write(ino, i as u64 * PAGE, piece).unwrap();
        assert_eq!(allocated(&r.fs, ino), (i as u64 + 1) * PAGE);
    }
    assert_eq!(remote_reads(&r.fs), reads, "the block grew without reading");
    write_back_and_drop(&r.fs, ino);
    assert!(read_all(&r.fs, ino, 40 << 10) == data);
}

#[test]
fn appending_to_a_written_block_grows_it_in_place_when_the_next_pages_are_free() {
    let r = small_rig(16 << 20);
    let ino = new_file(&r.fs, "grown");
    let mut data = pattern(5000, 4);
    r.fs.write(ino, 0, &data).unwrap();
    write_back_and_drop(&r.fs, ino);
    assert_eq!(allocated(&r.fs, ino), 2 * PAGE);
    let reads = remote_reads(&r.fs);
    let more = pattern(5000, 5);
    r.fs.write(ino, 5000, &more).unwrap();
    assert_eq!(allocated(&r.fs, ino), 3 * PAGE);
    // The written part stayed where it was: nothing was read to move it (the write
    // itself reads the rest of the page it ends in, at most).
    assert!(remote_reads(&r.fs) - reads <= 1);
    data.extend(&more);
    write_back_and_drop(&r.fs, ino);
    assert!(read_all(&r.fs, ino, 10_000) == data);
}

#[test]
fn appending_to_a_hemmed_in_written_block_moves_it_to_copies_twice_as_large() {
    let r = small_rig(16 << 20);
    let ino = new_file(&r.fs, "grown");
    let mut data = pattern(5000, 4);
    r.fs.write(ino, 0, &data).unwrap();
    // Another file's page right after this one's two.
    let neighbour = new_file(&r.fs, "neighbour");
    r.fs.write(neighbour, 0, b"next door").unwrap();
    write_back_and_drop(&r.fs, ino);
    write_back_and_drop(&r.fs, neighbour);
    // 10,000 bytes need three pages; a written block that must move doubles to four.
    let more = pattern(5000, 5);
    r.fs.write(ino, 5000, &more).unwrap();
    assert_eq!(allocated(&r.fs, ino), 4 * PAGE);
    data.extend(&more);
    write_back_and_drop(&r.fs, ino);
    assert!(read_all(&r.fs, ino, 10_000) == data);
    assert_eq!(read_all(&r.fs, neighbour, 100), b"next door");
    // Up to the whole block, never past it.
    let rest = pattern((BIG - 10_000) as usize, 6);
    r.fs.write(ino, 10_000, &rest).unwrap();
    data.extend(&rest);
    assert_eq!(allocated(&r.fs, ino), BIG);
    write_back_and_drop(&r.fs, ino);
    assert!(read_all(&r.fs, ino, BIG) == data);
    assert_eq!(read_all(&r.fs, neighbour, 100), b"next door");
}

#[test]
fn a_reservation_grows_a_small_block_to_what_it_covers() {
    let r = small_rig(16 << 20);
    let ino = new_file(&r.fs, "reserved");
    r.fs.write(ino, 0, b"head").unwrap();
    write_back_and_drop(&r.fs, ino);
    let how = Allocate::Reserve { keep_size: false };
    r.fs.fallocate(ino, 0, BIG + 1, how).unwrap();
    assert_eq!(allocated(&r.fs, ino), BIG + PAGE);
    write_back_and_drop(&r.fs, ino);
    let back = read_all(&r.fs, ino, BIG + 1);
    assert_eq!(&back[..4], b"head");
    assert!(back[4..].iter().all(|&b| b == 0));
}

#[test]
fn growth_into_full_memory_fails_with_enospc_and_keeps_what_was_written() {
    let r = small_rig(2 << 20);
    let small = new_file(&r.fs, "small");
    r.fs.write(small, 0, b"keep me").unwrap();
    write_back_and_drop(&r.fs, small);
    // Fill remote memory with one-page files, so no free page is left anywhere
    // (a growing file would leave gaps smaller than its next size). A refused page
    // is tried again after a pause, for a chunk the refill thread was still
    // bringing in.
    let mut n = 0;
    let mut refused = 0;
    while refused < 3 {
        let f = new_file(&r.fs, &format!("page{n}"));
        match r.fs.write(f, 0, &[7u8; PAGE as usize]) {
            Ok(_) => refused = 0,
            Err(FsError::NoSpace) => {
                refused += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("filling: {e}"),
        }
        n += 1;
    }
    assert_eq!(
        r.fs.write(small, 7, &[1u8; 8000]).unwrap_err(),
        FsError::NoSpace
    );
    r.fs.cache().invalidate(small, 0);
    assert_eq!(read_all(&r.fs, small, 100), b"keep me");
    assert_eq!(allocated(&r.fs, small), PAGE);
}

#[test]
fn truncating_into_a_block_gives_back_the_pages_past_the_new_end() {
    let r = small_rig(16 << 20);
    let ino = new_file(&r.fs, "cut");
    let data = pattern((BIG + 5000) as usize, 7);
    r.fs.write(ino, 0, &data).unwrap();
    write_back_and_drop(&r.fs, ino);
    let free_before = r.fs.statfs().free_bytes;
    let cut = SetAttr {
        size: Some(100),
        ..SetAttr::default()
    };
    r.fs.setattr(ino, &cut).unwrap();
    assert_eq!(allocated(&r.fs, ino), PAGE);
    assert_eq!(r.fs.statfs().free_bytes - free_before, BIG + PAGE);
    // Growing again reads zeros past the cut, from the cache and from remote memory.
    r.fs.write(ino, 9000, b"end").unwrap();
    let mut want = data[..100].to_vec();
    want.resize(9000, 0);
    want.extend(b"end");
    assert!(read_all(&r.fs, ino, 9003) == want);
    write_back_and_drop(&r.fs, ino);
    assert!(read_all(&r.fs, ino, 9003) == want);
}
