//! mmap of files on the mount, checked against what a local filesystem does (each
//! scenario also runs on a tmpfs, where the two could differ): stores into a shared
//! writable mapping reach the file (read() through another descriptor sees them at
//! once, and after msync, munmap and a dropped page cache the file holds them byte for
//! byte), stores into a private mapping never do, write() is seen by a mapping, a
//! mapping much larger than fsd's cache round-trips, and stores past the end of the
//! file in its last page neither extend it nor are kept (the kernel sends fsd only the
//! bytes below the size, as ext4 writes back only those; tmpfs, whose page cache is
//! its storage, keeps them in the page and is not asserted on for that).

use rmemfs_tests::config::cache_of;
use rmemfs_tests::data::{assert_bytes_eq, create};
use rmemfs_tests::kernel::{drop_page_cache, page_size, Mapping};
use rmemfs_tests::tmpfs::on_tmpfs_and_small_cache_rmemfs;
use rmemfs_tests::{heavy_test, FsdMount, MemnodeProc, Pattern, UncachedReader, MIB};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

fn rmemfs(cache: &str) -> (FsdMount, MemnodeProc) {
    let memnode = MemnodeProc::start("256M");
    let fsd = FsdMount::with_memnode(&memnode, &cache_of(cache));
    (fsd, memnode)
}

fn open_rw(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

fn read_all(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

#[test]
fn shared_mapping_stores_reach_the_file_byte_exact() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("shared mapping");
    on_tmpfs_and_small_cache_rmemfs(|dir, fs| {
        let path = dir.join("shared");
        let len = 3 * MIB as usize + 123;
        let before = pattern.bytes(0, len);
        let after = pattern.derive(1).bytes(0, len);
        create(&path)
            .write_all_at(&before, 0)
            .expect("write the file");
        let file = open_rw(&path);
        let mut map = Mapping::shared(&file, len).expect("mmap MAP_SHARED read-write");
        assert_bytes_eq(
            &before,
            map.as_slice(),
            0,
            &format!("{fs}: the mapping shows the file"),
        );
        map.as_mut_slice().copy_from_slice(&after);
        assert_bytes_eq(
            &after,
            &read_all(&path),
            0,
            &format!("{fs}: read() through another descriptor sees the stores before msync"),
        );
        map.sync().expect("msync MS_SYNC");
        drop(map);
        drop(file);
        drop_page_cache();
        assert_eq!(
            std::fs::metadata(&path).expect("stat").len(),
            len as u64,
            "{fs}: the size is unchanged"
        );
        assert_bytes_eq(
            &after,
            &read_all(&path),
            0,
            &format!("{fs}: the file after msync, munmap and drop_caches"),
        );
        if fs == "rmemfs" {
            let mut r = UncachedReader::open(&path).expect("O_DIRECT open");
            let got = r.read_at(0, len).expect("O_DIRECT read");
            assert_bytes_eq(&after, &got, 0, "rmemfs: O_DIRECT read of what fsd holds");
        }
    });
}

#[test]
fn private_mapping_stores_never_reach_the_file() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("private mapping");
    on_tmpfs_and_small_cache_rmemfs(|dir, fs| {
        let path = dir.join("private");
        let len = MIB as usize + 4097;
        let original = pattern.bytes(0, len);
        create(&path)
            .write_all_at(&original, 0)
            .expect("write the file");
        let file = open_rw(&path);
        let mut map = Mapping::private(&file, len).expect("mmap MAP_PRIVATE read-write");
        let stores = pattern.derive(2).bytes(0, len);
        map.as_mut_slice().copy_from_slice(&stores);
        assert_bytes_eq(
            &stores,
            map.as_slice(),
            0,
            &format!("{fs}: the private mapping holds its stores"),
        );
        assert_bytes_eq(
            &original,
            &read_all(&path),
            0,
            &format!("{fs}: read() does not see private stores"),
        );
        map.sync()
            .expect("msync of a private mapping succeeds and writes nothing");
        drop(map);
        file.sync_all().expect("fsync");
        drop(file);
        drop_page_cache();
        assert_bytes_eq(
            &original,
            &read_all(&path),
            0,
            &format!("{fs}: the file after munmap and drop_caches"),
        );
    });
}

#[test]
fn writes_through_a_descriptor_show_in_a_shared_mapping() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("write into a mapped file");
    on_tmpfs_and_small_cache_rmemfs(|dir, fs| {
        let path = dir.join("coherent");
        let len = 2 * MIB as usize;
        create(&path)
            .write_all_at(&pattern.bytes(0, len), 0)
            .expect("write the file");
        let file = open_rw(&path);
        let map = Mapping::shared(&file, len).expect("mmap MAP_SHARED");
        // Touch every page so the mapping holds them before the write.
        let _ = map
            .as_slice()
            .iter()
            .step_by(page_size())
            .fold(0u8, |a, b| a ^ b);
        let other = open_rw(&path);
        let patch = pattern.derive(3).bytes(0, 200_000);
        other
            .write_all_at(&patch, 65_000)
            .expect("pwrite through another descriptor");
        assert_bytes_eq(
            &patch,
            &map.as_slice()[65_000..265_000],
            65_000,
            &format!("{fs}: the mapping shows the write"),
        );
    });
}

#[test]
fn a_shared_mapping_far_larger_than_the_cache_round_trips() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("large shared mapping");
    let (fsd, _memnode) = rmemfs("4M");
    let path = fsd.join("large");
    let len = 48 * MIB;
    let file = create(&path);
    file.set_len(len).expect("ftruncate to 48 MiB");
    let t = Instant::now();
    let mut map = Mapping::shared(&file, len as usize).expect("mmap 48 MiB shared");
    for (i, chunk) in map.as_mut_slice().chunks_mut(MIB as usize).enumerate() {
        pattern.fill(i as u64 * MIB, chunk);
    }
    map.sync().expect("msync MS_SYNC");
    drop(map);
    drop(file);
    println!(
        "48 MiB stored through a mapping and msync'd in {:?} (fsd cache 4 MiB)",
        t.elapsed()
    );
    drop_page_cache();
    pattern.verify_file(&path, len);
    fsd.unmount();
}

#[test]
fn stores_past_the_end_of_the_file_in_its_last_page_are_not_kept() {
    let _serial = heavy_test();
    let page = page_size();
    on_tmpfs_and_small_cache_rmemfs(|dir, fs| {
        let path = dir.join("tail");
        let len = 10_000usize; // ends inside the third 4 KiB page
        create(&path)
            .write_all_at(&vec![b'a'; len], 0)
            .expect("write the file");
        let span = len.div_ceil(page) * page;
        let file = open_rw(&path);
        let mut map = Mapping::shared(&file, span).expect("mmap the whole last page");
        map.as_mut_slice()[len..].fill(b'z');
        map.sync().expect("msync");
        drop(map);
        drop(file);
        assert_eq!(
            std::fs::metadata(&path).expect("stat").len(),
            len as u64,
            "{fs}: stores past the end do not extend the file"
        );
        drop_page_cache();
        assert_eq!(read_all(&path), vec![b'a'; len], "{fs}: the file's bytes");
        if fs == "rmemfs" {
            // Extending the file shows what is stored past the old end: zeros.
            let f = open_rw(&path);
            f.set_len(span as u64).expect("extend to the page end");
            let mut tail = vec![1u8; span - len];
            f.read_exact_at(&mut tail, len as u64)
                .expect("read the extension");
            assert!(
                tail.iter().all(|b| *b == 0),
                "rmemfs: bytes stored past the end through a mapping must not be kept (ext4 \
                 zeroes them at write-back), so an extension reads zeros"
            );
        }
    });
}
