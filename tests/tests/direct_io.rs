//! O_DIRECT on a `--page-cache` mount, checked against what a local filesystem does: aligned direct
//! writes and reads round-trip byte for byte, leave nothing in the kernel's page cache
//! (mincore), replace what the page cache held for the range, see stores of a shared
//! mapping not yet written back (a local filesystem writes the range back before a
//! direct read), and a file open with O_DIRECT can still be mapped shared.
//!
//! Each scenario that a local filesystem defines also runs on a tmpfs. tmpfs has no
//! storage below its page cache, so "bypasses the page cache" is asserted on rmemfs
//! only. Unaligned direct I/O is refused by ext4 and xfs (EINVAL) but accepted by tmpfs
//! and by FUSE, which has no alignment rule: it is asserted exact, not refused.

use rmemfs_tests::config::SMALL_CACHE;
use rmemfs_tests::data::{assert_bytes_eq, create};
use rmemfs_tests::kernel::{drop_page_cache, resident_pages, AlignedBuf, Mapping};
use rmemfs_tests::tmpfs::on_tmpfs_and_small_cache_rmemfs;
use rmemfs_tests::{heavy_test, FsdMount, MemnodeProc, Pattern, MIB};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

const ALIGN: usize = 4096;

/// A mount through the kernel's page cache, where O_DIRECT handles are the ones that
/// bypass it (on the default --direct-io mount every handle does).
fn rmemfs() -> (FsdMount, MemnodeProc) {
    let memnode = MemnodeProc::start("256M");
    let fsd = FsdMount::with_memnode(&memnode, &[&SMALL_CACHE[..], &["--page-cache"]].concat());
    (fsd, memnode)
}

fn open_direct(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .unwrap_or_else(|e| panic!("open {} with O_DIRECT: {e}", path.display()))
}

fn open_rw(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

fn direct_read(f: &File, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = AlignedBuf::new(len, ALIGN);
    f.read_exact_at(buf.as_mut_slice(), offset)
        .unwrap_or_else(|e| panic!("O_DIRECT read of {len} at {offset}: {e}"));
    buf.as_slice().to_vec()
}

fn direct_write(f: &File, offset: u64, data: &[u8]) {
    let buf = AlignedBuf::from_slice(data, ALIGN);
    f.write_all_at(buf.as_slice(), offset)
        .unwrap_or_else(|e| panic!("O_DIRECT write of {} at {offset}: {e}", data.len()));
}

#[test]
fn aligned_direct_writes_and_reads_round_trip_byte_exact() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("O_DIRECT round trip");
    on_tmpfs_and_small_cache_rmemfs(|dir, fs| {
        let path = dir.join("direct");
        let f = open_direct(&path);
        // (offset, length): within a 64 KiB block, across block boundaries, large.
        let writes: [(u64, usize); 5] = [
            (0, 4096),
            (61_440, 8192),
            (4 * MIB, MIB as usize),
            (65_536 * 3, 65_536 * 2),
            (MIB + 4096, 3 * 65_536 + 4096),
        ];
        let end = writes.iter().map(|(o, l)| o + *l as u64).max().unwrap_or(0) as usize;
        let mut model = vec![0u8; end];
        for (i, (off, len)) in writes.iter().enumerate() {
            let data = pattern.derive(i as u64).bytes(0, *len);
            direct_write(&f, *off, &data);
            model[*off as usize..*off as usize + len].copy_from_slice(&data);
            assert_bytes_eq(
                &data,
                &direct_read(&f, *off, *len),
                *off,
                &format!("{fs}: O_DIRECT read right after the write"),
            );
        }
        assert_eq!(
            f.metadata().expect("fstat").len(),
            end as u64,
            "{fs}: size after direct writes"
        );
        assert_bytes_eq(
            &model,
            &direct_read(&f, 0, end),
            0,
            &format!("{fs}: the whole file through O_DIRECT"),
        );
        drop(f);
        drop_page_cache();
        let buffered = std::fs::read(&path).expect("buffered read");
        assert_bytes_eq(
            &model,
            &buffered,
            0,
            &format!("{fs}: the whole file through the page cache"),
        );
    });
}

#[test]
fn direct_io_leaves_the_page_cache_empty() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("O_DIRECT bypasses the page cache");
    let (fsd, _memnode) = rmemfs();
    let path = fsd.join("bypass");
    let len = 2 * MIB as usize;
    let f = open_direct(&path);
    // mincore looks through a mapping of a plain descriptor (mapping never reads).
    let plain = File::open(&path).expect("open without O_DIRECT");
    direct_write(&f, 0, &pattern.bytes(0, len));
    assert_eq!(
        resident_pages(&plain, len).expect("mincore"),
        0,
        "no page of the file is cached after O_DIRECT writes"
    );
    let got = direct_read(&f, 0, len);
    assert_bytes_eq(&pattern.bytes(0, len), &got, 0, "O_DIRECT read");
    assert_eq!(
        resident_pages(&plain, len).expect("mincore"),
        0,
        "no page of the file is cached after O_DIRECT reads"
    );
    // The measure works: a buffered read fills the cache.
    let mut buf = vec![0u8; len];
    plain.read_exact_at(&mut buf, 0).expect("buffered read");
    assert!(
        resident_pages(&plain, len).expect("mincore") > 0,
        "a buffered read caches pages (mincore sees them)"
    );
    drop((f, plain));
    fsd.unmount();
}

#[test]
fn a_direct_write_replaces_what_the_page_cache_held() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("O_DIRECT write over cached pages");
    on_tmpfs_and_small_cache_rmemfs(|dir, fs| {
        let path = dir.join("replace");
        let len = MIB as usize;
        create(&path)
            .write_all_at(&pattern.bytes(0, len), 0)
            .expect("write the file");
        let plain = open_rw(&path);
        let mut old = vec![0u8; len];
        plain
            .read_exact_at(&mut old, 0)
            .expect("buffered read: the pages are cached now");
        let new = pattern.derive(7).bytes(0, 256 << 10);
        direct_write(&open_direct(&path), 128 << 10, &new);
        let mut got = vec![0u8; new.len()];
        plain
            .read_exact_at(&mut got, 128 << 10)
            .expect("buffered read after the direct write");
        assert_bytes_eq(
            &new,
            &got,
            128 << 10,
            &format!("{fs}: a buffered read after an O_DIRECT write sees the new bytes"),
        );
    });
}

#[test]
fn a_direct_read_sees_stores_of_a_shared_mapping_not_yet_written_back() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("O_DIRECT read of dirty mapped pages");
    on_tmpfs_and_small_cache_rmemfs(|dir, fs| {
        let path = dir.join("dirty");
        let len = MIB as usize;
        create(&path)
            .write_all_at(&pattern.bytes(0, len), 0)
            .expect("write the file");
        let file = open_rw(&path);
        let mut map = Mapping::shared(&file, len).expect("mmap MAP_SHARED");
        let stores = pattern.derive(8).bytes(0, len);
        map.as_mut_slice().copy_from_slice(&stores);
        // No msync: the pages are dirty in the page cache only.
        let got = direct_read(&open_direct(&path), 0, len);
        assert_bytes_eq(&stores, &got, 0, &format!("{fs}: an O_DIRECT read sees the mapping's stores (a local filesystem writes the range back first)"));
        drop(map);
    });
}

#[test]
fn a_file_open_with_o_direct_can_be_mapped_shared() {
    let _serial = heavy_test();
    on_tmpfs_and_small_cache_rmemfs(|dir, fs| {
        let path = dir.join("mapped-direct");
        create(&path)
            .write_all_at(&[b'x'; 8192], 0)
            .expect("write the file");
        let f = open_direct(&path);
        let mut map = Mapping::shared(&f, 8192)
            .unwrap_or_else(|e| panic!("{fs}: mmap MAP_SHARED of an O_DIRECT descriptor should work, as on a local filesystem: {e}"));
        map.as_mut_slice()[..4].copy_from_slice(b"mmap");
        map.sync().expect("msync");
        drop(map);
        assert_eq!(
            direct_read(&f, 0, 4096)[..4],
            *b"mmap",
            "{fs}: the store reached the file"
        );
    });
}

#[test]
fn unaligned_direct_io_is_accepted_and_exact_as_on_tmpfs() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("unaligned O_DIRECT");
    on_tmpfs_and_small_cache_rmemfs(|dir, fs| {
        let path = dir.join("unaligned");
        let f = open_direct(&path);
        let data = pattern.bytes(0, 10_001);
        f.write_all_at(&data, 333)
            .unwrap_or_else(|e| panic!("{fs}: unaligned O_DIRECT write: {e}"));
        let mut got = vec![0u8; data.len()];
        f.read_exact_at(&mut got, 333)
            .unwrap_or_else(|e| panic!("{fs}: unaligned O_DIRECT read: {e}"));
        assert_bytes_eq(
            &data,
            &got,
            333,
            &format!("{fs}: unaligned O_DIRECT round trip"),
        );
        assert_eq!(f.metadata().expect("fstat").len(), 10_334, "{fs}: size");
    });
}
