//! What crosses the fabric for small random I/O through the mount, counted by fsd's
//! `--stats-file`: a 4 KiB read that misses fsd's cache moves 4 KiB from remote
//! memory (one READ), not its 64 KiB block, and a 4 KiB write to a block that remote
//! memory holds moves 4 KiB to it (one WRITE) and reads nothing. O_DIRECT keeps the
//! kernel's page cache out of the way, so every request reaches fsd as it was made.

use rmemfs_tests::config::{cache_of, BLOCK, BLOCK_SIZE};
use rmemfs_tests::kernel::AlignedBuf;
use rmemfs_tests::transport::Transport;
use rmemfs_tests::{heavy_test, FsdMount, FsdStats, MemnodeProc, Pattern, StatsFile, MIB};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::time::Duration;

const SECTOR: u64 = 4096;
/// The file: 64 MiB, through a 4 MiB cache.
const FILE: u64 = 64 * MIB;
const CACHE: u64 = 4 * MIB;
/// Requests per phase, each in a block of its own among the first 48 MiB.
const N: u64 = 200;

fn open_direct(path: &std::path::Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .unwrap_or_else(|e| panic!("open {} with O_DIRECT: {e}", path.display()))
}

/// N distinct blocks among the first 48 MiB, in a scattered order, with a sector
/// inside each (never the first, so no request starts where the previous one ended:
/// fsd would take that for a stream and read ahead).
fn scattered(seed: u64) -> Vec<u64> {
    let blocks = 48 * MIB / BLOCK;
    (0..N)
        .map(|i| {
            let block = (i * 97 + seed) % blocks;
            let sector = 1 + (i * 7 + seed) % (BLOCK / SECTOR - 1);
            block * BLOCK + sector * SECTOR
        })
        .collect()
}

/// The counters once fsd has counted `what` (remote_reads or remote_writes) up to
/// `at_least`, then once more a stats period later, so nothing still on its way is
/// missed.
fn settled(stats: &StatsFile, what: &str, at_least: u64) -> FsdStats {
    stats.wait_for(Duration::from_secs(10), what, |s| s.value(what) >= at_least);
    std::thread::sleep(Duration::from_millis(2500));
    stats.current()
}

/// A memnode and fsd on it with a `CACHE` cache of 64 KiB blocks, writing its
/// statistics.
fn mount_with_stats() -> (MemnodeProc, StatsFile, FsdMount) {
    let memnode = MemnodeProc::start("256M");
    let stats = StatsFile::new();
    let fsd = FsdMount::with_memnode(
        &memnode,
        &[
            "--cache",
            &CACHE.to_string(),
            "--block-size",
            BLOCK_SIZE,
            "--stats-file",
            stats.arg(),
        ],
    );
    (memnode, stats, fsd)
}

/// A `FILE`-byte file written with a pattern named `what`, in remote memory and out
/// of fsd's cache.
fn file_out_of_cache(fsd: &FsdMount, what: &str) -> (std::path::PathBuf, Pattern) {
    let path = fsd.join("f");
    let pattern = Pattern::for_test(what);
    pattern.write_file(&path, FILE);
    File::open(&path).and_then(|f| f.sync_all()).expect("fsync");
    fsd.push_out_of_cache(CACHE, BLOCK);
    (path, pattern)
}

#[test]
fn random_4k_direct_io_moves_4k_per_request_over_the_fabric() {
    let _serial = heavy_test();
    let (_memnode, stats, fsd) = mount_with_stats();
    let (path, pattern) = file_out_of_cache(&fsd, "remote traffic of 4 KiB direct I/O");
    let file = open_direct(&path);

    // Reads: each misses fsd's cache, which holds none of the file now.
    let before = settled(&stats, "remote_writes", 0);
    let mut buf = AlignedBuf::new(SECTOR as usize, SECTOR as usize);
    for &at in &scattered(1) {
        let n = file.read_at(buf.as_mut_slice(), at).expect("read");
        assert_eq!(n, SECTOR as usize);
        assert!(
            buf.as_slice() == pattern.bytes(at, SECTOR as usize),
            "4 KiB at {at} differs from what was written"
        );
    }
    let after = settled(&stats, "remote_reads", before.value("remote_reads") + N);
    let delta = |s: &FsdStats, b: &FsdStats, k: &str| s.value(k) - b.value(k);
    println!(
        "{N} reads: {} remote READs, {} bytes",
        delta(&after, &before, "remote_reads"),
        delta(&after, &before, "remote_read_bytes")
    );
    assert_eq!(delta(&after, &before, "remote_reads"), N);
    assert_eq!(delta(&after, &before, "remote_read_bytes"), N * SECTOR);
    // What fsd served, which the bench sets against the remote bytes.
    assert_eq!(delta(&after, &before, "file_reads"), N);
    assert_eq!(delta(&after, &before, "file_read_bytes"), N * SECTOR);
    assert_eq!(delta(&after, &before, "remote_writes"), 0);

    // Writes to other blocks: no READ, one 4 KiB WRITE each (at eviction or fsync).
    let writes = scattered(5);
    for &at in &writes {
        let data = AlignedBuf::from_slice(&vec![0xa5; SECTOR as usize], SECTOR as usize);
        let n = file.write_at(data.as_slice(), at).expect("write");
        assert_eq!(n, SECTOR as usize);
    }
    file.sync_all().expect("fsync");
    let written = settled(&stats, "remote_writes", after.value("remote_writes") + N);
    println!(
        "{N} writes: {} remote READs, {} WRITEs, {} bytes written",
        delta(&written, &after, "remote_reads"),
        delta(&written, &after, "remote_writes"),
        delta(&written, &after, "remote_write_bytes")
    );
    assert_eq!(delta(&written, &after, "remote_reads"), 0);
    assert_eq!(delta(&written, &after, "remote_writes"), N);
    assert_eq!(delta(&written, &after, "remote_write_bytes"), N * SECTOR);
    assert_eq!(delta(&written, &after, "file_writes"), N);
    assert_eq!(delta(&written, &after, "file_write_bytes"), N * SECTOR);

    // And the data is what it should be, read back from remote memory.
    drop(file);
    let reader = File::open(&path).expect("open");
    for &at in &writes {
        let mut got = vec![0; SECTOR as usize];
        reader.read_exact_at(&mut got, at).expect("read back");
        assert!(got.iter().all(|&b| b == 0xa5), "write at {at} lost");
    }
    drop(reader);
    fsd.unmount();
}

/// A cache smaller than the blocks that random reads touch still keeps what they
/// read: each read of one sector holds that sector, not its block (sector pages), so
/// reading the same sectors again moves nothing over the fabric. Over RDMA the cache
/// keeps whole blocks (its registered buffers are what the device pins), so there
/// every read goes to the memnode again.
#[test]
fn random_reads_are_cached_by_the_sector_not_by_the_block() {
    let _serial = heavy_test();
    let (memnode, stats, fsd) = mount_with_stats();
    let rdma = memnode.transport() == Transport::Verbs;
    let (path, pattern) = file_out_of_cache(&fsd, "random reads cached by the sector");
    let file = open_direct(&path);
    let offsets = scattered(3);
    // The blocks read must not fit in the cache, or this shows nothing.
    const _: () = assert!(N * BLOCK > 2 * CACHE);
    let mut buf = AlignedBuf::new(SECTOR as usize, SECTOR as usize);
    let mut read_all = |what: &str| {
        for &at in &offsets {
            let n = file.read_at(buf.as_mut_slice(), at).expect("read");
            assert_eq!(n, SECTOR as usize);
            assert!(
                buf.as_slice() == pattern.bytes(at, SECTOR as usize),
                "{what}: 4 KiB at {at} differs from what was written"
            );
        }
    };
    let before = settled(&stats, "remote_writes", 0);
    read_all("first pass");
    let first = settled(&stats, "remote_reads", before.value("remote_reads") + N);
    read_all("second pass");
    let second = settled(&stats, "file_reads", first.value("file_reads") + N);
    let delta = |s: &FsdStats, b: &FsdStats, k: &str| s.value(k) - b.value(k);
    println!(
        "{N} reads of 4 KiB in {N} blocks through a {} MiB cache: {} remote READs, then {} \
         reading them again",
        CACHE / MIB,
        delta(&first, &before, "remote_reads"),
        delta(&second, &first, "remote_reads")
    );
    assert_eq!(delta(&first, &before, "remote_reads"), N);
    if rdma {
        println!("over RDMA the cache keeps whole blocks: {N} blocks do not fit");
        assert_eq!(
            delta(&second, &first, "remote_reads"),
            N,
            "over RDMA no sector pages (they would pin memory beyond --cache)"
        );
    } else {
        assert_eq!(
            delta(&second, &first, "remote_reads"),
            0,
            "the sectors read were still in fsd's cache"
        );
    }
    drop(file);
    fsd.unmount();
}

/// fsd's memory stays what `--cache` gives it when the cache turns from whole blocks
/// (a stream writing a file larger than the cache) to sectors (random reads): the
/// memory of the block buffers the cache lets go is given back, as the sectors come
/// (the peak), not only once the reads are over.
#[test]
fn fsd_memory_stays_within_its_cache_when_streams_give_way_to_random_reads() {
    let _serial = heavy_test();
    let memnode = MemnodeProc::start("512M");
    let cache = 64 * MIB;
    let fsd = FsdMount::with_memnode(&memnode, &cache_of("64M"));
    let path = fsd.join("f");
    let len = 256 * MIB;
    let pattern = Pattern::for_test("memory of streams and random reads");
    pattern.write_file(&path, len);
    File::open(&path).and_then(|f| f.sync_all()).expect("fsync");
    let after_stream = fsd.rss_bytes();
    fsd.reset_peak_rss();
    // Enough random 4 KiB reads, each in a block of its own, to fill the cache with
    // sectors several times over.
    let file = open_direct(&path);
    let mut buf = AlignedBuf::new(SECTOR as usize, SECTOR as usize);
    let blocks = len / BLOCK;
    let reads = 3 * cache / SECTOR;
    for i in 0..reads {
        let block = (i * 2_654_435_761) % blocks;
        let at = block * BLOCK + (1 + i % (BLOCK / SECTOR - 1)) * SECTOR;
        file.read_at(buf.as_mut_slice(), at).expect("read");
        if i % 4096 == 0 {
            assert!(
                buf.as_slice() == pattern.bytes(at, SECTOR as usize),
                "4 KiB at {at} differs from what was written"
            );
        }
    }
    // fsd's cleaner gives back the memory of buffers the cache let go a few times a
    // second.
    let peak = fsd.peak_rss_bytes();
    std::thread::sleep(Duration::from_secs(1));
    let after_reads = fsd.rss_bytes();
    println!(
        "fsd RSS: {} MiB after writing {} MiB, {} MiB after {reads} random 4 KiB reads \
         (--cache {} MiB), {} MiB at most during them",
        after_stream / MIB,
        len / MIB,
        after_reads / MIB,
        cache / MIB,
        peak / MIB
    );
    assert!(
        peak < after_stream + cache / 4,
        "fsd grew from {} to {} MiB at its peak while random reads followed a stream with \
         a {} MiB cache: the memory of the block buffers let go should be given back as \
         sectors take their place",
        after_stream / MIB,
        peak / MIB,
        cache / MIB
    );
    assert!(
        after_reads < after_stream + cache / 4,
        "fsd grew from {} to {} MiB when random reads followed a stream with a {} MiB cache: \
         its block and sector buffers together should stay within the cache",
        after_stream / MIB,
        after_reads / MIB,
        cache / MIB
    );
    drop(file);
    fsd.unmount();
}
