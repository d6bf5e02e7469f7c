//! Random reads over the mapped fabric go around fsd's page cache (`read_mapped` in
//! fsd/src/fs/read.rs): a read of whole pages whose block the cache holds no page of
//! is one copy from the memnode's mapped region into the reader's buffer, checked
//! against the page sums, and keeps no page. These tests run on the mapped fabric
//! whatever RMEMFS_TRANSPORT says (the memnode shares its region, fsd maps it), on
//! the FUSE transport the stage gives: the ring's reads that come together and the
//! classic transport's reads one at a time take the same way around.

use rmemfs_tests::{heavy_test, FsdMount, MemnodeProc, Pattern, StatsFile, Transport, MIB};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const PAGE: u64 = 4096;
const LIMIT: Duration = Duration::from_secs(60);

fn mapped_mount(stats: &StatsFile) -> (FsdMount, MemnodeProc) {
    let memnode = MemnodeProc::start_on(Transport::Mapped, "256M", &[]);
    let fsd = FsdMount::with_memnode(&memnode, &["--cache", "16M", "--stats-file", stats.arg()]);
    // fsd logs it before it mounts; its stderr is read by a thread of the harness,
    // so the line may arrive a moment after the mount.
    let mapped = rmemfs_tests::poll_until(Duration::from_secs(10), || {
        fsd.stderr()
            .contains("connections map its region")
            .then_some(())
    });
    assert!(
        mapped.is_some(),
        "fsd should map the memnode's region; stderr:\n{}",
        fsd.stderr()
    );
    (fsd, memnode)
}

/// A little generator of page numbers, the same every run of a test.
fn pages(seed: u64, count: u64) -> impl Iterator<Item = u64> {
    let mut x = seed | 1;
    std::iter::from_fn(move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        Some(x % count)
    })
}

/// Four readers read random pages of a file no longer in fsd's cache: every page is
/// what was written, it came from the memnode (remote reads, no cache hit: nothing
/// was kept), and no page failed its sum.
#[test]
fn random_reads_go_around_the_cache_and_return_what_was_written() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("mapped random reads");
    let stats = StatsFile::new();
    let (fsd, _memnode) = mapped_mount(&stats);
    let size = 64 * MIB;
    let path = fsd.join("data");
    pattern.write_file(&path, size);
    fsd.push_out_of_cache(16 * MIB, 64 * 1024);
    // fsd writes its stats once a second: a reading from after the push-out.
    std::thread::sleep(Duration::from_millis(2500));
    let before = stats.current();
    const READS: u64 = 2000;
    let readers: Vec<_> = (0..4u64)
        .map(|t| {
            let path = path.clone();
            std::thread::spawn(move || {
                let file = std::fs::File::open(&path).expect("open the file");
                let mut buf = vec![0u8; PAGE as usize];
                for p in pages(0x9e37_79b9 + t, size / PAGE).take(READS as usize) {
                    file.read_exact_at(&mut buf, p * PAGE)
                        .unwrap_or_else(|e| panic!("reading page {p}: {e}"));
                    rmemfs_tests::data::assert_bytes_eq(
                        &pattern.bytes(p * PAGE, PAGE as usize),
                        &buf,
                        p * PAGE,
                        "a random read over the mapped fabric",
                    );
                }
            })
        })
        .collect();
    for r in readers {
        r.join().expect("a reader failed");
    }
    let reads = 4 * READS;
    let after = stats.wait_for(LIMIT, "the reads in the stats", |s| {
        s.value("file_reads") >= before.value("file_reads") + reads
    });
    println!("before {before}\nafter {after}");
    let grew = |k: &str| after.value(k) - before.value(k);
    // Through the cache, each read would leave its page there, and the reads of the
    // same pages that follow would hit it; around it only the blocks the cache still
    // held are hit.
    assert!(
        grew("cache_hits") * 10 <= reads,
        "reads around the cache keep no page: {} hits for {reads} reads",
        grew("cache_hits")
    );
    assert!(
        grew("remote_reads") * 10 >= reads * 9,
        "the pages came from the memnode: {} remote reads for {reads} reads",
        grew("remote_reads")
    );
    assert_eq!(
        after.value("checksum_failures"),
        0,
        "no page failed its sum"
    );
    fsd.unmount();
}

/// Reads around the cache race write-backs of the same blocks: a writer rewrites
/// random pages of a file four times the cache (each page all one stamp: its number
/// and the round), so blocks are written back and leave the cache while readers copy
/// them. A read that a write-back tore fails its sum check and is read again through
/// the cache, so every page read is whole, one stamp of that page, no read fails and
/// no sum failure is counted; at the end every page holds its last stamp.
#[test]
fn reads_around_the_cache_racing_write_backs_see_whole_pages() {
    let _serial = heavy_test();
    let stats = StatsFile::new();
    let (fsd, _memnode) = mapped_mount(&stats);
    let size = 64 * MIB;
    let count = size / PAGE;
    let stamp = |p: u64, round: u64| (p << 32) | round;
    let page_of = |s: u64| -> Vec<u8> {
        std::iter::repeat_n(s.to_le_bytes(), PAGE as usize / 8)
            .flatten()
            .collect()
    };
    let path = fsd.join("stamped");
    {
        let file = std::fs::File::create(&path).expect("create the file");
        for p in 0..count {
            file.write_all_at(&page_of(stamp(p, 0)), p * PAGE)
                .expect("write the first stamps");
        }
        file.sync_all().expect("fsync");
    }
    fsd.push_out_of_cache(16 * MIB, 64 * 1024);
    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..3u64)
        .map(|t| {
            let (path, done) = (path.clone(), done.clone());
            std::thread::spawn(move || {
                let file = std::fs::File::open(&path).expect("open the file");
                let mut buf = vec![0u8; PAGE as usize];
                let mut reads = 0u64;
                for p in pages(0x5151 + t, count) {
                    if done.load(Ordering::Relaxed) {
                        break;
                    }
                    file.read_exact_at(&mut buf, p * PAGE)
                        .unwrap_or_else(|e| panic!("reading page {p} while it is rewritten: {e}"));
                    let first = u64::from_le_bytes(buf[..8].try_into().unwrap());
                    assert_eq!(
                        first >> 32,
                        p,
                        "page {p} holds another page's stamp {first:#x}"
                    );
                    assert!(
                        buf.chunks_exact(8).all(|w| w == first.to_le_bytes()),
                        "page {p} is torn: it starts with stamp {first:#x} but is not all of it"
                    );
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    let mut last = vec![0u64; count as usize];
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open for writing");
    for (n, p) in pages(0xabcd, count).take(30_000).enumerate() {
        let round = n as u64 + 1;
        file.write_all_at(&page_of(stamp(p, round)), p * PAGE)
            .unwrap_or_else(|e| panic!("rewriting page {p}: {e}"));
        last[p as usize] = round;
        if n % 5000 == 4999 {
            file.sync_all().expect("fsync while readers read");
        }
    }
    file.sync_all().expect("fsync");
    done.store(true, Ordering::Relaxed);
    let reads: u64 = readers
        .into_iter()
        .map(|r| r.join().expect("a reader failed"))
        .sum();
    println!("{reads} reads raced the writes");
    let reader = std::fs::File::open(&path).expect("open to verify");
    let mut buf = vec![0u8; PAGE as usize];
    for p in 0..count {
        reader
            .read_exact_at(&mut buf, p * PAGE)
            .unwrap_or_else(|e| panic!("reading page {p} at the end: {e}"));
        assert_eq!(
            buf,
            page_of(stamp(p, last[p as usize])),
            "page {p} should hold its last stamp (round {})",
            last[p as usize]
        );
    }
    drop((file, reader));
    let s = stats.current();
    println!("stats {s}");
    assert_eq!(
        s.value("checksum_failures"),
        0,
        "a torn read is read again, not a failure"
    );
    fsd.unmount();
}
