//! File space through a real mount: fallocate (reserve, keep size, punch hole, zero
//! range, unsupported modes) and lseek SEEK_DATA / SEEK_HOLE, each checked against
//! what a local Linux filesystem answers. rmemfs works in blocks (`--block-size`, 64K
//! here), so holes and data are found at block boundaries, as a local filesystem finds
//! them at its own block or page boundaries.

use rmemfs_tests::config::{BLOCK, SMALL_CACHE};
use rmemfs_tests::data::{assert_bytes_eq, create};
use rmemfs_tests::{assert_errno, describe, FsdMount, MemnodeProc, Pattern, MIB};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};

fn mount(memnode_size: &str) -> (FsdMount, MemnodeProc) {
    let memnode = MemnodeProc::start(memnode_size);
    let fsd = FsdMount::with_memnode(
        &memnode,
        &[&SMALL_CACHE[..], &["--chunk-size", "1M"]].concat(),
    );
    (fsd, memnode)
}

fn fallocate(f: &File, mode: i32, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: plain syscall on an open descriptor; no memory is passed.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, offset as i64, len as i64) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn seek(f: &File, offset: i64, whence: i32) -> io::Result<u64> {
    // SAFETY: plain syscall on an open descriptor; no memory is passed.
    let r = unsafe { libc::lseek(f.as_raw_fd(), offset, whence) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as u64)
    }
}

#[track_caller]
fn assert_seek(f: &File, offset: i64, whence: i32, expected: u64, what: &str) {
    let r = seek(f, offset, whence);
    assert_eq!(
        r.as_ref().ok(),
        Some(&expected),
        "{what}: expected offset {expected}, got {}",
        match &r {
            Ok(v) => v.to_string(),
            Err(_) => describe(&r),
        }
    );
}

fn open_rw(path: &std::path::Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

#[test]
fn fallocate_reserves_space_and_extends_the_size_unless_keep_size() {
    let (fsd, _memnode) = mount("64M");
    let path = fsd.join("f");
    let f = create(&path);
    fallocate(&f, 0, 0, MIB).expect("fallocate mode 0 of 1 MiB");
    let m = f.metadata().expect("fstat");
    assert_eq!(m.len(), MIB, "mode 0 sets the size to the end of the range");
    assert_eq!(m.blocks() * 512, MIB, "1 MiB is reserved (st_blocks)");
    assert_eq!(
        f.read_at(&mut [1u8; 4096], 4096).expect("read"),
        4096,
        "reserved bytes are readable"
    );
    let mut buf = vec![1u8; MIB as usize];
    f.read_exact_at(&mut buf, 0).expect("read back");
    assert!(buf.iter().all(|&b| b == 0), "reserved bytes read as zeros");

    fallocate(&f, libc::FALLOC_FL_KEEP_SIZE, MIB, 3 * MIB).expect("fallocate KEEP_SIZE");
    let m = f.metadata().expect("fstat");
    assert_eq!(m.len(), MIB, "KEEP_SIZE leaves the size alone");
    assert_eq!(m.blocks() * 512, 4 * MIB, "4 MiB reserved in all");

    // Writing into reserved space, then growing over it, keeps zeros around the data.
    f.write_all_at(b"data", 2 * MIB + 10)
        .expect("write into reserved space");
    assert_eq!(
        f.metadata().expect("fstat").len(),
        2 * MIB + 14,
        "the write extends"
    );
    f.set_len(3 * MIB)
        .expect("ftruncate over the rest of the reserved space");
    let mut around = [9u8; 20];
    f.read_exact_at(&mut around, 2 * MIB).expect("read");
    assert_eq!(&around[..10], &[0; 10], "reserved bytes before the write");
    assert_eq!(&around[10..14], b"data");
    assert_eq!(&around[14..], &[0; 6], "reserved bytes after the write");

    assert_errno(
        fallocate(&f, 0, 0, 0),
        libc::EINVAL,
        "fallocate of length 0",
    );
}

#[test]
fn fallocate_to_full_remote_memory_is_enospc_and_reserves_nothing() {
    let (fsd, _memnode) = mount("8M");
    let f = create(&fsd.join("f"));
    f.write_all_at(b"kept", 0).expect("write");
    assert_errno(
        fallocate(&f, 0, 0, 64 * MIB),
        libc::ENOSPC,
        "fallocate of 64 MiB in an 8 MiB memnode",
    );
    let m = f.metadata().expect("fstat");
    assert_eq!(m.len(), 4, "a failed fallocate leaves the size alone");
    assert_eq!(
        m.blocks() * 512,
        4096,
        "a failed fallocate reserves nothing: the 4-byte file keeps its one page"
    );
    let mut back = [0u8; 4];
    f.read_exact_at(&mut back, 0).expect("read");
    assert_eq!(&back, b"kept");
}

#[test]
fn punch_hole_zeros_the_range_keeps_the_size_and_frees_remote_memory() {
    let (fsd, memnode) = mount("64M");
    let path = fsd.join("f");
    let pattern = Pattern::for_test("punch hole");
    let len = 16 * MIB;
    pattern.write_file(&path, len);
    let f = open_rw(&path);
    f.sync_all().expect("fsync");
    let used_before = memnode.stats().used;
    assert!(used_before >= len, "memnode holds the file: {used_before}");

    // Unaligned at both ends: the edge blocks keep their other bytes.
    let (start, end) = (100, 15 * MIB + 100);
    fallocate(
        &f,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        start,
        end - start,
    )
    .expect("punch hole");
    let m = f.metadata().expect("fstat");
    assert_eq!(m.len(), len, "punching keeps the size");
    assert_eq!(
        m.blocks() * 512,
        len - (end / BLOCK - start.div_ceil(BLOCK)) * BLOCK,
        "st_blocks drops by the blocks the hole covers whole"
    );
    let mut all = vec![0u8; len as usize];
    f.read_exact_at(&mut all, 0).expect("read back");
    let mut expected = pattern.bytes(0, len as usize);
    expected[start as usize..end as usize].fill(0);
    assert_bytes_eq(&expected, &all, 0, "file after punching a hole");

    let used_after = memnode.stats().used;
    assert!(
        used_after + 13 * MIB <= used_before,
        "punching 15 MiB should give back at least 13 MiB of 1 MiB chunks to the memnode: \
         it held {used_before} bytes before and {used_after} after"
    );

    assert_errno(
        fallocate(&f, libc::FALLOC_FL_PUNCH_HOLE, 0, BLOCK),
        libc::EOPNOTSUPP,
        "PUNCH_HOLE without KEEP_SIZE",
    );
}

#[test]
fn zero_range_zeros_bytes_and_keeps_them_reserved() {
    let (fsd, _memnode) = mount("64M");
    let path = fsd.join("f");
    let f = create(&path);
    f.write_all_at(&vec![0xaa; 4 * BLOCK as usize], 0)
        .expect("write");
    fallocate(&f, libc::FALLOC_FL_ZERO_RANGE, 10, 2 * BLOCK).expect("zero range");
    let mut all = vec![0u8; 4 * BLOCK as usize];
    f.read_exact_at(&mut all, 0).expect("read back");
    let mut expected = vec![0xaa; 4 * BLOCK as usize];
    expected[10..(10 + 2 * BLOCK) as usize].fill(0);
    assert_bytes_eq(&expected, &all, 0, "file after zeroing a range");
    let m = f.metadata().expect("fstat");
    assert_eq!(m.len(), 4 * BLOCK, "the range was inside the file");
    assert_eq!(m.blocks() * 512, 4 * BLOCK, "zeroed blocks stay reserved");

    fallocate(&f, libc::FALLOC_FL_ZERO_RANGE, 4 * BLOCK, BLOCK).expect("zero past EOF");
    assert_eq!(f.metadata().expect("fstat").len(), 5 * BLOCK, "size grows");
}

#[test]
fn fallocate_modes_a_local_filesystem_lacks_are_eopnotsupp() {
    let (fsd, _memnode) = mount("64M");
    let f = create(&fsd.join("f"));
    f.write_all_at(&vec![1; 4 * BLOCK as usize], 0)
        .expect("write");
    for (mode, name) in [
        (libc::FALLOC_FL_COLLAPSE_RANGE, "COLLAPSE_RANGE"),
        (libc::FALLOC_FL_INSERT_RANGE, "INSERT_RANGE"),
    ] {
        assert_errno(fallocate(&f, mode, 0, BLOCK), libc::EOPNOTSUPP, name);
    }
}

#[test]
fn seek_data_and_seek_hole_find_the_written_blocks() {
    let (fsd, _memnode) = mount("64M");
    let path = fsd.join("sparse");
    let f = create(&path);
    // Data in block 16 and in blocks 48..50; 4 MiB of file.
    f.write_all_at(&[1; 4096], 16 * BLOCK).expect("write");
    f.write_all_at(&vec![2; 2 * BLOCK as usize], 48 * BLOCK)
        .expect("write");
    f.set_len(4 * MIB).expect("ftruncate to 4 MiB");
    let size = 4 * MIB;
    assert_seek(&f, 0, libc::SEEK_DATA, 16 * BLOCK, "SEEK_DATA from 0");
    assert_seek(&f, 0, libc::SEEK_HOLE, 0, "SEEK_HOLE from 0 (a hole)");
    assert_seek(
        &f,
        (16 * BLOCK + 7) as i64,
        libc::SEEK_DATA,
        16 * BLOCK + 7,
        "SEEK_DATA inside data",
    );
    assert_seek(
        &f,
        (16 * BLOCK) as i64,
        libc::SEEK_HOLE,
        17 * BLOCK,
        "SEEK_HOLE from data",
    );
    assert_seek(
        &f,
        (17 * BLOCK) as i64,
        libc::SEEK_DATA,
        48 * BLOCK,
        "SEEK_DATA from a hole",
    );
    assert_seek(
        &f,
        (48 * BLOCK) as i64,
        libc::SEEK_HOLE,
        50 * BLOCK,
        "SEEK_HOLE after two blocks",
    );
    assert_errno(
        seek(&f, (50 * BLOCK) as i64, libc::SEEK_DATA),
        libc::ENXIO,
        "SEEK_DATA in the trailing hole",
    );
    assert_seek(
        &f,
        (50 * BLOCK) as i64,
        libc::SEEK_HOLE,
        50 * BLOCK,
        "SEEK_HOLE in the trailing hole",
    );
    assert_errno(
        seek(&f, size as i64, libc::SEEK_DATA),
        libc::ENXIO,
        "SEEK_DATA at EOF",
    );
    assert_errno(
        seek(&f, size as i64, libc::SEEK_HOLE),
        libc::ENXIO,
        "SEEK_HOLE at EOF",
    );
    assert_errno(
        seek(&f, -1, libc::SEEK_DATA),
        libc::ENXIO,
        "SEEK_DATA before 0",
    );

    // A file without holes: its only hole is at end of file.
    let full = create(&fsd.join("full"));
    full.write_all_at(&[3; 100_000], 0).expect("write");
    assert_seek(&full, 0, libc::SEEK_DATA, 0, "SEEK_DATA of a dense file");
    assert_seek(
        &full,
        10,
        libc::SEEK_HOLE,
        100_000,
        "SEEK_HOLE of a dense file is EOF",
    );

    // A punched hole is a hole.
    fallocate(
        &full,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        0,
        BLOCK,
    )
    .expect("punch the first block");
    assert_seek(&full, 0, libc::SEEK_HOLE, 0, "SEEK_HOLE at a punched block");
    assert_seek(
        &full,
        0,
        libc::SEEK_DATA,
        BLOCK,
        "SEEK_DATA skips a punched block",
    );
}
