//! Copies on several memnodes: losing one, re-replication, a memnode coming back.
//! In-process memnodes over tcp on loopback; "losing" one shuts it down, which closes
//! its connections as a killed process's would. fsd's dead time is short here
//! ([`DEAD_TIME`]): a memnode that stays away is lost within a moment, which is what
//! these tests are about (the fault tests show that a short absence loses nothing).

use super::*;
use crate::inode::ROOT_INO;
use crate::remote::{Connector, RemoteConfig};
use rmemfs_common::fabric::tcp::TcpEndpoint;
use rmemfs_common::fabric::{Endpoint, Transport};
use std::time::{Duration, Instant};

pub(super) const BS: u64 = 4096;
pub(super) const ME: Caller = Caller::with_ids(0, 0);
const NODE_SIZE: u64 = 4 << 20;
/// How long a memnode may be unreachable before fsd counts its copies as lost.
pub(super) const DEAD_TIME: Duration = Duration::from_millis(300);

fn start_node(listen: &str) -> memnode::Memnode {
    memnode::Memnode::start(memnode::MemnodeConfig {
        listen: listen.into(),
        size: NODE_SIZE,
        token: None,
        tenants: None,
        huge_pages: false,
        transport: Transport::Tcp,
        poll: std::time::Duration::ZERO,
        lease: memnode::DEFAULT_LEASE,
        session_grace: memnode::DEFAULT_SESSION_GRACE,
        memory_file: None,
        connections: rmemfs_common::fabric::ConnectionLimits::default(),
    })
    .expect("memnode starts")
}

pub(super) struct Cluster {
    nodes: Vec<Option<memnode::Memnode>>,
    addrs: Vec<String>,
    pub(super) fs: RmemFs,
}

impl Cluster {
    pub(super) fn new(count: usize, replicas: usize, cache_blocks: u64) -> Cluster {
        Cluster::with_block_size(count, replicas, cache_blocks, BS)
    }

    pub(super) fn with_block_size(
        count: usize,
        replicas: usize,
        cache_blocks: u64,
        bs: u64,
    ) -> Cluster {
        Cluster::with_watch(
            count,
            replicas,
            cache_blocks,
            bs,
            Duration::from_millis(100),
        )
    }

    /// As [`Cluster::with_block_size`], with fsd probing its memnodes every `watch`.
    pub(super) fn with_watch(
        count: usize,
        replicas: usize,
        cache_blocks: u64,
        bs: u64,
        watch: Duration,
    ) -> Cluster {
        let nodes: Vec<_> = (0..count)
            .map(|_| Some(start_node("127.0.0.1:0")))
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| n.as_ref().unwrap().local_addr().to_string())
            .collect();
        let connect: Arc<Connector> = Arc::new(|peer: &str, _client: u64| {
            Ok(Box::new(TcpEndpoint::connect(peer, Duration::from_secs(2))?) as Box<dyn Endpoint>)
        });
        let remote = RemoteStore::connect(
            &addrs,
            &RemoteConfig {
                block_size: bs,
                chunk_size: 16 * bs,
                connections: 2,
                client_id: 9,
                token: Vec::new(),
                replicas,
                watch_interval: watch,
                dead_time: DEAD_TIME,
                unreachable_timeout: None,
                volume: None,
            },
            connect,
        )
        .expect("connects");
        let fs = RmemFs::new(Arc::new(remote), cache_blocks * bs, ME);
        Cluster { nodes, addrs, fs }
    }

    /// Shuts memnode `i` down and waits until fsd counts it lost (unreachable past
    /// the dead time).
    fn kill(&mut self, i: usize) {
        self.nodes[i].take().expect("node running").shutdown();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !matches!(
            self.fs.remote().node_state(i),
            Some(crate::remote::NodeState::Down { .. })
        ) {
            assert!(Instant::now() < deadline, "memnode {i} was not marked lost");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Shuts memnode `i` down without waiting for fsd to notice: fsd learns of it
    /// from the next operation that goes there (or its next probe).
    pub(super) fn shut_down(&mut self, i: usize) {
        self.nodes[i].take().expect("node running").shutdown();
    }

    fn restart(&mut self, i: usize) {
        self.nodes[i] = Some(start_node(&self.addrs[i]));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.fs.remote().node_is_up(i) {
            assert!(Instant::now() < deadline, "memnode {i} was not reconnected");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs maintenance passes until no block is degraded; returns the last count.
    fn repair(&self) -> Redundancy {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            self.fs.maintain(1 << 20);
            let found = self.fs.maintain(1 << 20);
            if found.degraded == 0 {
                return found;
            }
            assert!(Instant::now() < deadline, "still degraded: {found:?}");
        }
    }

    fn used(&self, i: usize) -> u64 {
        self.nodes[i].as_ref().map_or(0, |n| n.stats().used)
    }
}

fn content(file: u64) -> Vec<u8> {
    (0..BS)
        .map(|i| (i as u8) ^ (file as u8).wrapping_mul(31))
        .collect()
}

/// `n` one-block files, written back.
fn write_files(fs: &RmemFs, n: u64) -> Vec<Ino> {
    (0..n)
        .map(|f| {
            let ino = fs
                .create(ROOT_INO, format!("f{f}").as_ref(), 0o644, ME)
                .unwrap()
                .ino;
            fs.write(ino, 0, &content(f)).unwrap();
            fs.fsync(ino).unwrap();
            ino
        })
        .collect()
}

/// Makes sure no page of `files` is in fsd's cache, by reading enough of another file.
fn cycle_cache(fs: &RmemFs, blocks: u64) {
    static CYCLES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = format!("cycle{}", CYCLES.fetch_add(1, Ordering::Relaxed));
    let ino = fs.create(ROOT_INO, name.as_ref(), 0o644, ME).unwrap().ino;
    let data = vec![0x5a; (blocks * BS) as usize];
    fs.write(ino, 0, &data).unwrap();
    fs.fsync(ino).unwrap();
    assert_eq!(fs.read(ino, 0, data.len() as u32).unwrap(), data);
}

#[test]
fn with_two_copies_a_lost_memnode_loses_nothing_and_its_copies_are_restored() {
    let mut c = Cluster::new(3, 2, 8);
    let files = write_files(&c.fs, 48);
    let found = c.repair();
    assert_eq!((found.blocks, found.degraded, found.lost), (48, 0, 0));
    assert_eq!(
        found.per_node.iter().sum::<u64>(),
        96,
        "two copies each: {found:?}"
    );
    assert!(found.per_node.iter().all(|&n| n > 0), "spread: {found:?}");
    for i in 0..3 {
        assert!(
            c.used(i) >= found.per_node[i] * BS,
            "memnode {i} holds its copies"
        );
    }

    c.kill(1);
    cycle_cache(&c.fs, 16);
    let found = c.fs.maintain(0);
    assert!(
        found.degraded > 0 && found.lost == 0,
        "after the loss: {found:?}"
    );
    for (f, &ino) in files.iter().enumerate() {
        assert_eq!(
            c.fs.read(ino, 0, BS as u32).unwrap(),
            content(f as u64),
            "file {f}"
        );
    }
    let found = c.repair();
    assert_eq!(found.lost, 0);
    assert_eq!(
        found.per_node[1], 0,
        "nothing on the lost memnode: {found:?}"
    );
    assert_eq!(found.per_node[0] + found.per_node[2], 2 * found.blocks);
    let restored =
        c.fs.remote()
            .counters
            .copies_restored
            .load(Ordering::Relaxed);
    assert!(restored > 0, "copies restored: {restored}");

    // Every block has both copies on the survivors: losing one more loses nothing.
    c.kill(0);
    cycle_cache(&c.fs, 16);
    for (f, &ino) in files.iter().enumerate() {
        assert_eq!(
            c.fs.read(ino, 0, BS as u32).unwrap(),
            content(f as u64),
            "file {f}"
        );
    }
    let found = c.fs.maintain(0);
    assert_eq!(found.lost, 0, "{found:?}");
}

#[test]
fn with_one_copy_a_lost_memnode_fails_exactly_its_blocks_with_eio() {
    let mut c = Cluster::new(2, 1, 8);
    let files = write_files(&c.fs, 32);
    let before = c.fs.maintain(0);
    assert_eq!(before.per_node.iter().sum::<u64>(), 32);
    assert!(
        before.per_node[1] > 0 && before.per_node[0] > 0,
        "{before:?}"
    );

    c.kill(1);
    // New data goes to the survivor (and pushes the old pages out of the cache).
    cycle_cache(&c.fs, 16);
    let mut failed = 0;
    for (f, &ino) in files.iter().enumerate() {
        match c.fs.read(ino, 0, BS as u32) {
            Ok(data) => assert_eq!(data, content(f as u64), "file {f}"),
            Err(FsError::Io(_)) => failed += 1,
            Err(e) => panic!("file {f}: {e:?} instead of EIO"),
        }
    }
    assert_eq!(
        failed, before.per_node[1],
        "failed reads = blocks the lost memnode held"
    );
    let after = c.fs.maintain(0);
    assert_eq!(after.lost, before.per_node[1], "{after:?}");
}

#[test]
fn a_memnode_that_comes_back_is_used_again_for_the_missing_copies() {
    let mut c = Cluster::new(2, 2, 8);
    let files = write_files(&c.fs, 16);
    c.kill(1);
    assert_eq!(c.fs.maintain(0).degraded, 16, "one copy left of each");
    // A write while degraded succeeds with the one copy possible.
    c.fs.write(files[0], 0, &content(100)).unwrap();
    c.fs.fsync(files[0]).unwrap();

    c.restart(1);
    let found = c.repair();
    assert_eq!(found.per_node, vec![16, 16], "{found:?}");
    assert!(c.used(1) >= 16 * BS, "the new memnode holds the copies");
    c.kill(0);
    cycle_cache(&c.fs, 16);
    assert_eq!(c.fs.read(files[0], 0, BS as u32).unwrap(), content(100));
    for (f, &ino) in files.iter().enumerate().skip(1) {
        assert_eq!(
            c.fs.read(ino, 0, BS as u32).unwrap(),
            content(f as u64),
            "file {f}"
        );
    }
}

#[test]
fn full_memnodes_with_two_copies_give_enospc_and_keep_what_was_written() {
    let c = Cluster::new(2, 2, 8);
    let first =
        c.fs.create(ROOT_INO, "first".as_ref(), 0o644, ME)
            .unwrap()
            .ino;
    let data: Vec<u8> = (0..NODE_SIZE / 2).map(|i| (i % 251) as u8).collect();
    c.fs.write(first, 0, &data).unwrap();
    c.fs.fsync(first).unwrap();
    let second =
        c.fs.create(ROOT_INO, "second".as_ref(), 0o644, ME)
            .unwrap()
            .ino;
    let chunk = vec![7u8; BS as usize];
    let mut off = 0;
    let err = loop {
        match c.fs.write(second, off, &chunk) {
            Ok(_) => off += BS,
            Err(e) => break e,
        }
        assert!(
            off <= NODE_SIZE,
            "wrote more than one memnode holds with two copies each"
        );
    };
    assert_eq!(err, FsError::NoSpace);
    assert!(
        off >= NODE_SIZE / 4,
        "only {off} bytes fitted besides the first file"
    );
    let back = c.fs.read(first, 0, data.len() as u32).unwrap();
    assert!(back == data, "the first file changed when memory ran out");
    let found = c.fs.maintain(0);
    assert_eq!((found.degraded, found.lost), (0, 0), "{found:?}");
}

#[test]
fn a_partial_page_written_back_after_a_loss_gives_the_new_copy_the_whole_block() {
    // 64 KiB blocks in 4 KiB sectors: a one-sector write leaves the page partly valid.
    // Its write-back adds a copy on a survivor, which needs all of the block, so the
    // page is completed from the copy that is left before anything is stored.
    const BIG: u64 = 64 << 10;
    let mut c = Cluster::with_block_size(3, 2, 2, BIG);
    let ino = c.fs.create(ROOT_INO, "f".as_ref(), 0o644, ME).unwrap().ino;
    let old: Vec<u8> = (0..4 * BIG).map(|i| (i % 253) as u8).collect();
    c.fs.write(ino, 0, &old).unwrap();
    c.fs.fsync(ino).unwrap();
    c.kill(1);
    let evict = |c: &Cluster| {
        let tmp =
            c.fs.create(ROOT_INO, "tmp".as_ref(), 0o644, ME)
                .unwrap()
                .ino;
        c.fs.write(tmp, 0, &vec![1u8; 4 * BIG as usize]).unwrap();
        c.fs.fsync(tmp).unwrap();
        c.fs.unlink(ROOT_INO, "tmp".as_ref()).unwrap();
        c.fs.release(tmp).unwrap();
    };
    evict(&c);
    let mut want = old.clone();
    for b in 0..4u64 {
        let at = b * BIG + (b + 3) * 4096;
        let sector = vec![0xe0 + b as u8; 4096];
        c.fs.write(ino, at, &sector).unwrap();
        want[at as usize..at as usize + 4096].copy_from_slice(&sector);
    }
    assert_eq!(
        c.fs.cache().counters.partial_writes.load(Ordering::Relaxed),
        4
    );
    c.fs.fsync(ino).unwrap();
    let found = c.fs.maintain(0);
    assert_eq!(
        found.degraded, 0,
        "write-back restored the copies: {found:?}"
    );
    // Only the copies written by that write-back are left for the blocks that had
    // one on memnode 1.
    c.kill(0);
    evict(&c);
    let back = c.fs.read(ino, 0, 4 * BIG as u32).unwrap();
    assert!(
        back == want,
        "a copy made from a partial page lacks the old sectors"
    );
}
