//! Core tests over a real in-process memnode and the tcp fabric (no FUSE mount).

use super::*;
use crate::inode::ROOT_INO;
use crate::remote::{Connector, RemoteConfig};
use rmemfs_common::fabric::fault::{Faults, FaultyEndpoint};
use rmemfs_common::fabric::tcp::TcpEndpoint;
use rmemfs_common::fabric::Endpoint;
use std::time::{Duration, Instant};

const BS: u64 = 4096;
const ME: Caller = Caller::with_ids(0, 0);

struct Rig {
    node: memnode::Memnode,
    fs: RmemFs,
}

fn rig(memnode_size: u64, cache: u64, chunk: u64) -> Rig {
    rig_of(memnode_size, cache, chunk, BS, Arc::new(Faults::default()))
}

/// A rig whose connections fail as `faults` say. Injected failures are broken
/// connections, which fsd waits out (the memnode is only unreachable): this rig is a
/// soft mount ([`SOFT_TIMEOUT`]), so an operation that keeps failing fails.
fn rig_with_faults(memnode_size: u64, cache: u64, chunk: u64, faults: Arc<Faults>) -> Rig {
    rig_soft(memnode_size, cache, chunk, BS, faults, Some(SOFT_TIMEOUT))
}

/// How long the fault rig's operations wait for a memnode that keeps failing them.
const SOFT_TIMEOUT: Duration = Duration::from_millis(300);

fn rig_of(memnode_size: u64, cache: u64, chunk: u64, block: u64, faults: Arc<Faults>) -> Rig {
    rig_soft(memnode_size, cache, chunk, block, faults, None)
}

fn rig_soft(
    memnode_size: u64,
    cache: u64,
    chunk: u64,
    block: u64,
    faults: Arc<Faults>,
    soft: Option<Duration>,
) -> Rig {
    let node = memnode::Memnode::start(memnode::MemnodeConfig {
        listen: "127.0.0.1:0".into(),
        size: memnode_size,
        token: None,
        tenants: None,
        huge_pages: false,
        transport: rmemfs_common::fabric::Transport::Tcp,
        poll: std::time::Duration::ZERO,
        lease: memnode::DEFAULT_LEASE,
        session_grace: memnode::DEFAULT_SESSION_GRACE,
        memory_file: None,
        connections: rmemfs_common::fabric::ConnectionLimits::default(),
    })
    .expect("memnode starts");
    let addr = node.local_addr().to_string();
    let connect: Arc<Connector> = Arc::new(move |peer: &str, _client: u64| {
        let tcp = TcpEndpoint::connect(peer, Duration::from_secs(2))?;
        Ok(Box::new(FaultyEndpoint::new(Box::new(tcp), faults.clone())) as Box<dyn Endpoint>)
    });
    let remote = RemoteStore::connect(
        &[addr],
        &RemoteConfig {
            block_size: block,
            chunk_size: chunk,
            connections: 2,
            client_id: 42,
            token: Vec::new(),
            replicas: 1,
            watch_interval: Duration::from_secs(1),
            // A memnode shut down is lost a second later (the tests of a lost one).
            dead_time: Duration::from_secs(1),
            unreachable_timeout: soft,
            volume: None,
        },
        connect,
    )
    .expect("connects");
    let fs = RmemFs::new(Arc::new(remote), cache, ME);
    Rig { node, fs }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
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

fn new_file(fs: &RmemFs, name: &str) -> Ino {
    fs.create(ROOT_INO, name.as_ref(), 0o644, ME).unwrap().ino
}

#[test]
fn data_larger_than_the_cache_reads_back_exactly() {
    let r = rig(64 << 20, 8 * BS, 1 << 20);
    let ino = new_file(&r.fs, "f");
    let data = pattern(1 << 20, 7);
    // Unaligned pieces, so partial blocks are read-modified-written.
    for (i, piece) in data.chunks(10_000).enumerate() {
        r.fs.write(ino, (i * 10_000) as u64, piece).unwrap();
    }
    let mut back = Vec::new();
    while back.len() < data.len() {
        let chunk = r.fs.read(ino, back.len() as u64, 7_777).unwrap();
        assert!(!chunk.is_empty(), "short read at {}", back.len());
        back.extend(chunk);
    }
    assert!(back == data, "data read back differs");
    // With a cache of 8 blocks, most of the file must have gone to remote memory.
    let written = r.fs.remote().counters.write_bytes.load(Ordering::Relaxed);
    assert!(
        written >= (1 << 20) - 8 * BS,
        "only {written} bytes reached the memnode"
    );
}

#[test]
fn holes_read_as_zeros_and_hold_no_remote_memory() {
    let r = rig(16 << 20, 16 * BS, 1 << 20);
    let ino = new_file(&r.fs, "sparse");
    r.fs.write(ino, 100 * BS + 5, b"tail").unwrap();
    let attr = r.fs.getattr(ino).unwrap();
    assert_eq!(attr.size, 100 * BS + 9);
    assert_eq!(attr.allocated, BS, "only the written block is allocated");
    assert_eq!(r.fs.read(ino, 50 * BS, 10).unwrap(), vec![0; 10]);
    assert_eq!(r.fs.read(ino, 100 * BS, 9).unwrap(), b"\0\0\0\0\0tail");
}

#[test]
fn truncate_down_then_up_reads_zeros_past_the_old_end() {
    let r = rig(16 << 20, 4 * BS, 1 << 20);
    let ino = new_file(&r.fs, "t");
    r.fs.write(ino, 0, &vec![0xaa; 3 * BS as usize]).unwrap();
    let shrink = SetAttr {
        size: Some(BS + 10),
        ..SetAttr::default()
    };
    r.fs.setattr(ino, &shrink).unwrap();
    assert_eq!(r.fs.getattr(ino).unwrap().allocated, 2 * BS);
    let grow = SetAttr {
        size: Some(3 * BS),
        ..SetAttr::default()
    };
    r.fs.setattr(ino, &grow).unwrap();
    let all = r.fs.read(ino, 0, 3 * BS as u32).unwrap();
    assert!(all[..(BS + 10) as usize].iter().all(|&b| b == 0xaa));
    assert!(
        all[(BS + 10) as usize..].iter().all(|&b| b == 0),
        "bytes past the truncation point must read as zero"
    );
}

#[test]
fn full_remote_memory_is_enospc_and_keeps_what_was_written() {
    let r = rig(1 << 20, 4 * BS, 256 << 10);
    let first = new_file(&r.fs, "first");
    let data = pattern(512 << 10, 3);
    r.fs.write(first, 0, &data).unwrap();
    r.fs.fsync(first).unwrap();
    let second = new_file(&r.fs, "second");
    let mut off = 0;
    let err = loop {
        match r.fs.write(second, off, &[1u8; BS as usize]) {
            Ok(n) => off += n as u64,
            Err(e) => break e,
        }
        assert!(off <= 1 << 20, "wrote more than the memnode holds");
    };
    assert_eq!(err, FsError::NoSpace);
    assert_eq!(r.fs.read(first, 0, 512 << 10).unwrap(), data);
}

#[test]
fn unlink_gives_remote_memory_back() {
    let r = rig(64 << 20, 4 * BS, 1 << 20);
    let ino = new_file(&r.fs, "big");
    r.fs.write(ino, 0, &vec![5u8; 8 << 20]).unwrap();
    r.fs.release(ino).unwrap();
    let used_before = r.node.stats().used;
    assert!(
        used_before >= 8 << 20,
        "memnode holds the file: {used_before}"
    );
    r.fs.unlink(ROOT_INO, "big".as_ref()).unwrap();
    let used_after = r.node.stats().used;
    assert!(
        used_after <= 1 << 20,
        "after unlink the memnode still holds {used_after} bytes (at most one spare chunk expected)"
    );
}

#[test]
fn an_open_unlinked_file_keeps_its_data_until_closed() {
    let r = rig(16 << 20, 4 * BS, 1 << 20);
    let ino = new_file(&r.fs, "f");
    let data = pattern(64 * BS as usize, 9);
    r.fs.write(ino, 0, &data).unwrap();
    r.fs.unlink(ROOT_INO, "f".as_ref()).unwrap();
    assert_eq!(r.fs.read(ino, 0, data.len() as u32).unwrap(), data);
    r.fs.release(ino).unwrap();
    assert_eq!(r.fs.getattr(ino).unwrap().allocated, 0);
}

#[test]
fn a_lost_memnode_turns_uncached_reads_into_eio_quickly() {
    let mut r = rig(16 << 20, 4 * BS, 1 << 20);
    let ino = new_file(&r.fs, "f");
    r.fs.write(ino, 0, &vec![1u8; 64 * BS as usize]).unwrap();
    r.fs.fsync(ino).unwrap();
    r.node.shutdown();
    let start = Instant::now();
    let err = r.fs.read(ino, 0, BS as u32).unwrap_err();
    assert!(
        matches!(err, FsError::Io(_)),
        "expected an I/O error, got {err:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    // Metadata still works.
    assert_eq!(r.fs.getattr(ino).unwrap().size, 64 * BS);
    assert!(r.fs.readdir(ROOT_INO, 0, 10).is_ok());
}

#[test]
fn a_failed_write_back_is_reported_by_fsync() {
    let faults = Arc::new(Faults::default());
    let r = rig_with_faults(16 << 20, 4 * BS, 1 << 20, faults.clone());
    let ino = new_file(&r.fs, "f");
    r.fs.write(ino, 0, &vec![3u8; 2 * BS as usize]).unwrap();
    faults.fail_writes.store(true, Ordering::SeqCst);
    let err = r.fs.fsync(ino).unwrap_err();
    assert!(matches!(err, FsError::Io(_)), "expected EIO, got {err:?}");
}

#[test]
fn a_failed_eviction_write_back_surfaces_at_the_next_fsync() {
    let faults = Arc::new(Faults::default());
    let r = rig_with_faults(16 << 20, 4 * BS, 1 << 20, faults.clone());
    let victim = new_file(&r.fs, "victim");
    r.fs.write(victim, 0, &vec![3u8; BS as usize]).unwrap();
    faults.fail_writes.store(true, Ordering::SeqCst);
    // Push the victim's dirty page out of the 4-page cache; its write-back fails.
    let other = new_file(&r.fs, "other");
    for i in 0..8 {
        let _ = r.fs.write(other, i * BS, &vec![1u8; BS as usize]);
    }
    faults.fail_writes.store(false, Ordering::SeqCst);
    let err = r.fs.fsync(victim).unwrap_err();
    assert!(matches!(err, FsError::Io(_)), "expected EIO, got {err:?}");
}

#[test]
fn a_reader_racing_the_first_write_of_a_reused_block_sees_zeros_not_stale_bytes() {
    // The interleaving fsx found: a writer has given a block its (reused) remote
    // location but not yet filled its page, and a reader loads that block first.
    let r = rig(16 << 20, 4 * BS, 1 << 20);
    let old = new_file(&r.fs, "old");
    r.fs.write(old, 0, &vec![0xaa; BS as usize]).unwrap();
    r.fs.fsync(old).unwrap();
    // Free the block: its remote memory still holds 0xaa and goes back to the pool.
    let zero = SetAttr {
        size: Some(0),
        ..SetAttr::default()
    };
    r.fs.setattr(old, &zero).unwrap();

    let new = new_file(&r.fs, "new");
    let inode = r.fs.ns.get(new).unwrap();
    // Extend the file over block 0, then step the writer only as far as allocation.
    r.fs.setattr(
        new,
        &SetAttr {
            size: Some(BS),
            ..SetAttr::default()
        },
    )
    .unwrap();
    let fresh = r.fs.allocate_blocks(&inode, 0..1).unwrap();
    assert_eq!(fresh, vec![0], "block 0 is newly allocated");
    let seen = r.fs.read(new, 0, BS as u32).unwrap();
    assert!(
        seen.iter().all(|&b| b == 0),
        "a block whose content never reached remote memory must read as zeros"
    );
}

#[test]
fn punching_a_hole_frees_whole_blocks_zeros_edges_and_keeps_the_size() {
    let r = rig(16 << 20, 4 * BS, 1 << 20);
    let ino = new_file(&r.fs, "p");
    let data = pattern(16 * BS as usize, 11);
    r.fs.write(ino, 0, &data).unwrap();
    // Dirty pages of doomed blocks are in the cache (4 pages) and in write-back.
    r.fs.fallocate(ino, BS + 10, 10 * BS, Allocate::PunchHole)
        .unwrap();
    let attr = r.fs.getattr(ino).unwrap();
    assert_eq!(attr.size, 16 * BS, "punching keeps the size");
    assert_eq!(attr.allocated, 7 * BS, "blocks 2..=10 are freed, 7 remain");
    r.fs.fsync(ino).unwrap();
    let mut expected = data.clone();
    expected[(BS + 10) as usize..(11 * BS + 10) as usize].fill(0);
    assert_eq!(r.fs.read(ino, 0, 16 * BS as u32).unwrap(), expected);
    // After eviction too: nothing stale was written back into the freed blocks.
    let other = new_file(&r.fs, "other");
    r.fs.write(other, 0, &pattern(32 * BS as usize, 12))
        .unwrap();
    r.fs.fsync(other).unwrap();
    assert_eq!(r.fs.read(ino, 0, 16 * BS as u32).unwrap(), expected);
}

#[test]
fn reserving_allocates_zero_blocks_and_keep_size_leaves_the_size() {
    let r = rig(16 << 20, 4 * BS, 1 << 20);
    let ino = new_file(&r.fs, "r");
    let how = Allocate::Reserve { keep_size: true };
    r.fs.fallocate(ino, 0, 8 * BS, how).unwrap();
    let attr = r.fs.getattr(ino).unwrap();
    assert_eq!((attr.size, attr.allocated), (0, 8 * BS));
    let how = Allocate::Reserve { keep_size: false };
    r.fs.fallocate(ino, 0, 3 * BS + 1, how).unwrap();
    assert_eq!(r.fs.getattr(ino).unwrap().size, 3 * BS + 1);
    assert_eq!(
        r.fs.read(ino, 0, 4 * BS as u32).unwrap(),
        vec![0; 3 * BS as usize + 1]
    );
    assert_eq!(
        r.fs.fallocate(ino, 0, 0, how),
        Err(FsError::Invalid),
        "length 0"
    );
    assert_eq!(
        r.fs.fallocate(ino, MAX_FILE_SIZE, 1, how),
        Err(FsError::TooLarge),
        "past the largest file size"
    );
}

#[test]
fn seek_data_and_hole_follow_the_block_map() {
    let r = rig(16 << 20, 4 * BS, 1 << 20);
    let ino = new_file(&r.fs, "s");
    r.fs.write(ino, 2 * BS, b"x").unwrap();
    r.fs.write(ino, 3 * BS, b"y").unwrap();
    r.fs.write(ino, 9 * BS + 5, b"z").unwrap(); // size 9 BS + 6
    let size = 9 * BS + 6;
    let cases = [
        (0, Seek::Data, Ok(2 * BS)),
        (0, Seek::Hole, Ok(0)),
        (2 * BS + 1, Seek::Data, Ok(2 * BS + 1)),
        (2 * BS, Seek::Hole, Ok(4 * BS)),
        (4 * BS, Seek::Data, Ok(9 * BS)),
        (9 * BS, Seek::Hole, Ok(size)),
        (size - 1, Seek::Hole, Ok(size)),
        (size, Seek::Data, Err(FsError::NoSuchOffset)),
        (size, Seek::Hole, Err(FsError::NoSuchOffset)),
    ];
    for (offset, what, expected) in cases {
        assert_eq!(
            r.fs.seek(ino, offset, what),
            expected,
            "{what:?} from {offset}"
        );
    }
    // Blocks reserved past end of file are not data of the file.
    let keep = Allocate::Reserve { keep_size: true };
    r.fs.fallocate(ino, 20 * BS, BS, keep).unwrap();
    r.fs.fallocate(ino, 4 * BS, BS, Allocate::PunchHole)
        .unwrap();
    r.fs.fallocate(ino, 2 * BS, 2 * BS, Allocate::PunchHole)
        .unwrap();
    assert_eq!(r.fs.seek(ino, 0, Seek::Data), Ok(9 * BS));
}

#[test]
fn two_writers_racing_into_a_new_block_both_land_even_if_it_is_evicted_between_them() {
    // The kernel sends write-back of a shared mapping as concurrent WRITEs; two of them
    // can cover different parts of the same new block. Writer A gives the block its
    // location, then writer B (seeing the block exists) writes the second half, the
    // page is evicted to remote memory, and only then does A write the first half.
    let r = rig(16 << 20, 2 * BS, 1 << 20);
    let ino = new_file(&r.fs, "racing");
    let inode = r.fs.ns.get(ino).unwrap();
    let half = (BS / 2) as usize;
    let (a, b) = (pattern(half, 21), pattern(half, 22));
    let fresh = r.fs.allocate_blocks(&inode, 0..1).unwrap();
    assert_eq!(fresh, vec![0], "writer A allocated block 0");
    r.fs.write(ino, half as u64, &b).unwrap();
    let other = new_file(&r.fs, "evictor");
    r.fs.write(other, 0, &pattern(8 * BS as usize, 23)).unwrap();
    r.fs.fsync(other).unwrap();
    assert_eq!(
        r.fs.cache.cached_pages(),
        2,
        "the cache holds the evictor's pages only"
    );
    r.fs.write_allocated(&inode, 0, &a).unwrap();
    let got = r.fs.read(ino, 0, BS as u32).unwrap();
    assert!(got[..half] == a[..], "writer A's half is in the block");
    let lost = got[half..].iter().zip(&b).position(|(g, w)| g != w);
    assert_eq!(
        lost, None,
        "writer B's half must survive A's late fill (first lost byte at {lost:?} of it)"
    );
}

#[test]
fn chown_and_unprivileged_writes_clear_setuid_and_group_executable_setgid() {
    let r = rig(16 << 20, 4 * BS, 1 << 20);
    let perm = |ino| r.fs.getattr(ino).unwrap().perm;
    let set = |ino, change: SetAttr| r.fs.setattr(ino, &change).unwrap().perm;
    let f = r.fs.create(ROOT_INO, "f".as_ref(), 0o6777, ME).unwrap().ino;
    let chown = SetAttr {
        uid: Some(7),
        kill_privs: KillPrivs::Yes,
        ..SetAttr::default()
    };
    assert_eq!(set(f, chown.clone()), 0o0777);

    // A mode given with the change wins over the clearing.
    let chown_and_chmod = SetAttr {
        mode: Some(0o6755),
        ..chown.clone()
    };
    assert_eq!(set(f, chown_and_chmod), 0o6755);
    assert_eq!(
        set(f, SetAttr::default()),
        0o6755,
        "KillPrivs::No keeps them"
    );

    // What a write by a caller without CAP_FSETID does; this test process is in
    // the files' group (its own, as they were created with ME's).
    let writer = KillPrivs::CallerLacksFsetid(std::process::id());
    r.fs.kill_privs(f, writer).unwrap();
    assert_eq!(perm(f), 0o0755);

    // setgid without group-execute stays for a member of the file's group, and
    // goes for anyone else (pid 0: a caller fsd cannot see, in no group).
    let g = r.fs.create(ROOT_INO, "g".as_ref(), 0o6767, ME).unwrap().ino;
    r.fs.kill_privs(g, writer).unwrap();
    assert_eq!(perm(g), 0o2767);
    r.fs.kill_privs(g, KillPrivs::CallerLacksFsetid(0)).unwrap();
    assert_eq!(perm(g), 0o0767);

    let d = r.fs.mkdir(ROOT_INO, "d".as_ref(), 0o6777, ME).unwrap().ino;
    assert_eq!(set(d, chown), 0o6777, "directories keep them");
    assert_eq!(r.fs.kill_privs(d, writer), Err(FsError::IsDir));
}

/// A file of `blocks` blocks of pattern `seed`, written back and out of the cache
/// from block 0 on (the cache holds only its last blocks).
fn file_mostly_in_remote_memory(r: &Rig, blocks: u64, seed: u64) -> (Ino, Vec<u8>) {
    let ino = new_file(&r.fs, "seq");
    let data = pattern((blocks * BS) as usize, seed);
    r.fs.write(ino, 0, &data).unwrap();
    r.fs.flush_all().unwrap();
    (ino, data)
}

#[test]
fn a_sequential_reader_finds_its_next_blocks_loaded_in_the_background() {
    let r = rig(16 << 20, 64 * BS, 1 << 20);
    let (ino, data) = file_mostly_in_remote_memory(&r, 200, 3);
    let reads = || r.fs.remote().counters.reads.load(Ordering::Relaxed);
    // Turns background readahead on (no job is queued yet).
    r.fs.prefetch_next(Duration::ZERO);
    let chunk = 4 * BS as usize;
    assert_eq!(r.fs.read(ino, 0, chunk as u32).unwrap(), data[..chunk]);
    let before = reads();
    // A stream now: this read loads only its own blocks and queues the next ones.
    let second = r.fs.read(ino, chunk as u64, chunk as u32).unwrap();
    assert_eq!(second, data[chunk..2 * chunk]);
    let own = reads() - before;
    assert!(own >= 1, "the second read loads its own blocks");
    r.fs.prefetch_next(Duration::from_secs(5));
    let prefetched = reads() - before - own;
    assert!(prefetched >= 1, "the queued readahead was loaded");
    let before = reads();
    let third = r.fs.read(ino, 2 * chunk as u64, 2 * chunk as u32).unwrap();
    assert_eq!(third, data[2 * chunk..4 * chunk]);
    assert_eq!(reads(), before, "the next reads hit what was read ahead");
}

#[test]
fn reads_stay_exact_while_prefetch_threads_race_writes_and_truncates() {
    let r = rig(32 << 20, 48 * BS, 1 << 20);
    let (ino, mut data) = file_mostly_in_remote_memory(&r, 300, 5);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        // Several, as fsd runs: their loads of one stream overlap in time.
        for _ in 0..3 {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    r.fs.prefetch_next(Duration::from_millis(5));
                }
            });
        }
        for pass in 0..6u64 {
            // Change the file between passes: overwrite a stretch, then cut it
            // short and grow it back (the tail reads as zeros).
            let at = (pass * 37 % 250) * BS + 123;
            let piece = pattern(5 * BS as usize, 100 + pass);
            r.fs.write(ino, at, &piece).unwrap();
            data[at as usize..at as usize + piece.len()].copy_from_slice(&piece);
            let cut = data.len() - (pass as usize * 7 + 1) * 1000;
            let req = SetAttr {
                size: Some(cut as u64),
                ..Default::default()
            };
            r.fs.setattr(ino, &req).unwrap();
            let req = SetAttr {
                size: Some(data.len() as u64),
                ..Default::default()
            };
            r.fs.setattr(ino, &req).unwrap();
            data[cut..].fill(0);
            let mut back = Vec::with_capacity(data.len());
            while back.len() < data.len() {
                let got =
                    r.fs.read(ino, back.len() as u64, 3 * BS as u32 + 100)
                        .unwrap();
                assert!(!got.is_empty(), "pass {pass}: short read at {}", back.len());
                back.extend(got);
            }
            assert!(back == data, "pass {pass}: data read back differs");
        }
        stop.store(true, Ordering::Relaxed);
    });
}

#[test]
fn a_stream_longer_than_the_cache_leaves_the_rest_of_the_cache_alone() {
    let r = rig(16 << 20, 64 * BS, 1 << 20);
    let (stream, data) = file_mostly_in_remote_memory(&r, 200, 11);
    let hot = new_file(&r.fs, "hot");
    let hot_data = pattern(8 * BS as usize, 12);
    r.fs.write(hot, 0, &hot_data).unwrap();
    r.fs.flush_all().unwrap();
    assert_eq!(r.fs.read(hot, 0, hot_data.len() as u32).unwrap(), hot_data);
    // Three times the cache, read sequentially.
    let mut back = Vec::new();
    while back.len() < data.len() {
        back.extend(r.fs.read(stream, back.len() as u64, 4 * BS as u32).unwrap());
    }
    assert!(back == data, "the stream reads back exactly");
    let reads = r.fs.remote().counters.reads.load(Ordering::Relaxed);
    assert_eq!(r.fs.read(hot, 0, hot_data.len() as u32).unwrap(), hot_data);
    assert_eq!(
        r.fs.remote().counters.reads.load(Ordering::Relaxed),
        reads,
        "the other file is still cached"
    );
}

#[test]
fn a_stream_whose_runs_arrive_out_of_order_is_still_written_behind() {
    // As the kernel's write-back sends them, finished by several request loops:
    // 256 KiB runs, each within a few MiB of where the last one ended.
    let r = rig(64 << 20, 1024 * BS, 1 << 20);
    let ino = new_file(&r.fs, "w");
    let run = 64 * BS as usize;
    let data = pattern(6 * run, 5);
    for n in [0, 2, 1, 4, 3, 5] {
        r.fs.write(ino, (n * run) as u64, &data[n * run..(n + 1) * run])
            .unwrap();
    }
    let written = r.fs.cache().clean_behind(&r.fs);
    assert_eq!(written, 5 * 64, "every run but the first is written behind");
    assert_eq!(r.fs.cache().dirty_pages(), 64);
    assert_eq!(r.fs.read(ino, 0, data.len() as u32).unwrap(), data);
}

#[test]
fn small_writes_near_each_other_but_not_in_a_row_are_not_a_stream() {
    // A small file's random updates: whole pages, never where the last one ended.
    let r = rig(16 << 20, 64 * BS, 1 << 20);
    let ino = new_file(&r.fs, "w");
    let page = pattern(BS as usize, 9);
    for n in [3u64, 1, 6, 2, 5] {
        r.fs.write(ino, n * BS, &page).unwrap();
    }
    assert_eq!(r.fs.cache().clean_behind(&r.fs), 0);
    assert_eq!(
        r.fs.cache().dirty_pages(),
        5,
        "left to the usual write-back"
    );
}

#[test]
fn a_sequential_writer_has_its_finished_blocks_written_behind_it() {
    let r = rig(16 << 20, 64 * BS, 1 << 20);
    let ino = new_file(&r.fs, "w");
    let data = pattern(10 * BS as usize + 100, 13);
    let writes = || r.fs.remote().counters.writes.load(Ordering::Relaxed);
    // Four writes in a row; the first is not known to be a stream yet.
    let piece = data.len() / 4 + 1;
    for (n, chunk) in data.chunks(piece).enumerate() {
        r.fs.write(ino, (n * piece) as u64, chunk).unwrap();
    }
    assert_eq!(writes(), 0, "nothing is written back by the requests");
    let written = r.fs.cache().clean_behind(&r.fs);
    // The blocks the three later writes finished: from the second write's first
    // block to the last whole block.
    let (from, to) = (piece as u64 / BS, data.len() as u64 / BS);
    assert_eq!(written as u64, to - from);
    assert!(writes() >= 1, "they went to remote memory");
    assert_eq!(r.fs.cache().dirty_pages() as u64, 11 - (to - from));
    assert_eq!(r.fs.read(ino, 0, data.len() as u32).unwrap(), data);
    r.fs.flush_all().unwrap();
    assert_eq!(r.fs.cache().dirty_pages(), 0);
}

/// Random reads that came together are answered together, with the bytes written,
/// from remote memory; those `read_together` leaves alone (a stream's next read, a
/// read across blocks, of a hole, past the end, of a file that is none) are then
/// answered by `read_into` as ever.
#[test]
fn reads_together_answer_random_reads_and_leave_the_rest_to_read_into() {
    const BLOCK: u64 = 64 << 10;
    let r = rig_of(
        64 << 20,
        8 * BLOCK,
        1 << 20,
        BLOCK,
        Arc::new(Faults::default()),
    );
    let (f, g) = (new_file(&r.fs, "f"), new_file(&r.fs, "g"));
    let data = pattern(32 * BLOCK as usize, 3);
    // g first: f's blocks then push it out of the cache. Block 25 of f stays a hole.
    r.fs.write(g, 0, &data[..BLOCK as usize]).unwrap();
    r.fs.write(f, 0, &data[..25 * BLOCK as usize]).unwrap();
    r.fs.write(f, 26 * BLOCK, &data[26 * BLOCK as usize..])
        .unwrap();
    // A stream: the read after this one continues it.
    r.fs.read(f, 30 * BLOCK, 4096).unwrap();
    // (file, offset, length, answered together)
    let asks: [(Ino, u64, usize, bool); 10] = [
        (f, 3 * BLOCK + 100, 4096, true),
        (f, 10 * BLOCK + 8192, 4096, true),
        (f, 10 * BLOCK + 20000, 3000, true), // the same block as the one before
        (g, 512, 1000, true),
        (f, 3 * BLOCK + 100 + 4096, 4096, false), // continues the first
        (f, 30 * BLOCK + 4096, 4096, false),      // continues the stream
        (f, 21 * BLOCK - 2048, 4096, false),      // across two blocks
        (f, 25 * BLOCK + 4096, 4096, false),      // a hole
        (f, 32 * BLOCK, 4096, false),             // at the end
        (9999, 0, 4096, false),                   // no such file
    ];
    let mut bufs: Vec<Vec<u8>> = asks.iter().map(|a| vec![0xee; a.2]).collect();
    let remote_before = r.fs.remote().counters.read_bytes.load(Ordering::Relaxed);
    let mut reads: Vec<ReadTogether<'_>> = asks
        .iter()
        .zip(bufs.iter_mut())
        .map(|(&(ino, offset, _, _), dst)| ReadTogether {
            ino,
            offset,
            dst,
            done: None,
        })
        .collect();
    let loaded = r.fs.read_together(&mut reads);
    let done: Vec<Option<usize>> = reads.iter().map(|r| r.done).collect();
    drop(reads);
    assert!(
        loaded >= 3,
        "the blocks of f and g were not cached: {loaded} loaded"
    );
    assert!(
        r.fs.remote().counters.read_bytes.load(Ordering::Relaxed) > remote_before,
        "read from remote memory"
    );
    for ((&(ino, offset, len, together), buf), done) in asks.iter().zip(&bufs).zip(&done) {
        if !together {
            assert_eq!(*done, None, "left alone: {offset}");
            continue;
        }
        assert_eq!(*done, Some(len), "{ino} {offset}");
        let at = offset as usize;
        assert!(buf[..] == data[at..at + len], "bytes of {ino} at {offset}");
    }
    // What it left, read_into answers as before.
    assert_eq!(
        r.fs.read(f, 25 * BLOCK + 4096, 4096).unwrap(),
        vec![0; 4096],
        "the hole"
    );
    let across = (21 * BLOCK - 2048) as usize;
    assert!(r.fs.read(f, across as u64, 4096).unwrap() == data[across..across + 4096]);
    assert!(r.fs.read(f, 32 * BLOCK, 4096).unwrap().is_empty());
    assert!(r.fs.read(9999, 0, 4096).is_err());
}

// The tests of one subject each, on the rigs above (`replication.rs` has its own,
// of several memnodes, which `checksum.rs` and `copy.rs` share).
mod acl;
mod checksum;
mod copy;
mod replication;
mod small;
mod subblock;
mod volume;
