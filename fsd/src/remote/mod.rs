//! Remote memory as fsd sees it: the memnodes, their chunks, and block I/O.
//!
//! [`RemoteStore`] places blocks on memnodes and moves their bytes:
//!
//! - placement: a block gets copies on `replicas` distinct memnodes (a [`BlockLoc`]).
//!   Copies come from per-node [`BlockPool`]s, nodes taken round-robin so files
//!   spread over all memnodes and capacity and bandwidth add up; a pool that runs dry
//!   gets a new chunk from its memnode (one control round trip per chunk, allocated
//!   ahead by a refill thread, so not on the write path). When too few memnodes have
//!   room the answer is [`RemoteError::NoSpace`].
//! - I/O: reads take one copy of each block and fail over to the next copy on error;
//!   writes go to every copy. Operations for one node are posted together on one of
//!   its connections, so a batch is outstanding at once.
//! - failure: a node whose connection breaks, or that does not answer an operation
//!   or its heartbeat in time, is **unreachable** (logged once), not lost: its copies
//!   still count, and a watch thread per node reconnects it and resumes its session
//!   with every copy. Only a node **lost** (a new instance answered, the dead time
//!   passed, an operator said so) loses its copies ([`node`]). Timeouts come from the
//!   fabric.
//! - while a node is unreachable, a read takes another copy that can be reached at
//!   once, and waits for the node only when there is none; a write goes to the copies
//!   that can be reached (the others are dropped from the block: they would hold old
//!   bytes) and waits only when none can. Waiting ends when the node is back (the
//!   operation is sent again: a one-sided WRITE is idempotent), when it is lost, or
//!   after `RemoteConfig::unreachable_timeout` when one is set (a soft mount), and
//!   then fails. Volume metadata is read and written the same patient way, so nothing
//!   about a merely unreachable node reaches a volume's log.
//!
//! The store's jobs, a file each: [`RemoteError`] (`error.rs`) and
//! [`RemoteCounters`] (`counters.rs`); the nodes' states as the store sees them and
//! the waiting for unreachable ones (`states.rs`); block allocation (`alloc.rs`);
//! batched one-sided operations (`batch.rs`) and block reads and writes with their
//! page sums (`io.rs`, `sums.rs`); copies inside remote memory (`copy.rs`); whole
//! chunks for volumes (`chunks.rs`). One memnode is a node (`node.rs`) with its
//! connections (`link.rs`, `remap.rs`), its pool (`pool.rs`) and its refill and
//! watch threads (`refill.rs`, `watch.rs`). Every length and address a memnode's
//! reply carries is checked where it enters (`checked.rs`): a memnode that says what
//! cannot be is refused, never believed.

mod alloc;
mod batch;
pub mod checked;
mod chunks;
mod copy;
mod counters;
mod error;
mod io;
mod link;
mod mapped;
mod node;
mod placement;
mod pool;
mod refill;
mod remap;
mod states;
pub mod sums;
mod watch;

pub use copy::BlockCopy;
pub use counters::RemoteCounters;
pub use error::RemoteError;
use error::{is_unreachable, thread_error};
pub use io::BlockRead;
use link::LinkConfig;
pub use link::VolumeSpec;
use node::Node;
pub use node::NodeState;
pub use placement::{BlockLoc, Replica, MAX_REPLICAS};
pub use pool::{pages_for, PAGE};
use rmemfs_common::fabric::{Endpoint, FabricError};
pub use states::NodeUsage;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Opens one connection to a memnode (backend-specific) for a client id; used for
/// every data and control connection.
pub type Connector = dyn Fn(&str, u64) -> Result<Box<dyn Endpoint>, FabricError> + Send + Sync;

use rmemfs_common::sync::lock;

/// Settings for [`RemoteStore::connect`].
#[derive(Clone)]
pub struct RemoteConfig {
    pub block_size: u64,
    /// Preferred chunk size; smaller chunks are tried when a node is nearly full.
    pub chunk_size: u64,
    /// Data connections per memnode.
    pub connections: usize,
    pub client_id: u64,
    pub token: Vec<u8>,
    /// Copies of every block, each on a different memnode (1..=MAX_REPLICAS).
    pub replicas: usize,
    /// How often each memnode gets a heartbeat (or, while down, a reconnect attempt).
    pub watch_interval: Duration,
    /// The durable volume to open on every memnode (`None`: scratch memory, given
    /// back when fsd disconnects).
    pub volume: Option<VolumeSpec>,
    /// How long a memnode may stay unreachable before its copies count as lost.
    pub dead_time: Duration,
    /// How long an operation that needs an unreachable memnode (no other copy can be
    /// reached) waits for it before failing; `None` waits until it is back or lost
    /// (a hard mount).
    pub unreachable_timeout: Option<Duration>,
}

/// Every memnode this fsd uses.
pub struct RemoteStore {
    nodes: Vec<Arc<Node>>,
    replicas: usize,
    block_size: u64,
    chunk_size: u64,
    /// A take that leaves a node's pool with fewer free bytes asks for a chunk ahead.
    low_water: u64,
    next_node: AtomicUsize,
    pub counters: Arc<RemoteCounters>,
    /// Each node's refill and watch threads, joined by [`RemoteStore::stop_background`].
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    unreachable_timeout: Option<Duration>,
}

impl RemoteStore {
    /// Connects to every memnode (all must answer), says hello on each connection,
    /// and starts each node's refill and watch threads.
    pub fn connect(
        memnodes: &[String],
        cfg: &RemoteConfig,
        connector: Arc<Connector>,
    ) -> Result<RemoteStore, RemoteError> {
        let link_cfg = Arc::new(LinkConfig {
            connections: cfg.connections.max(1),
            client_id: cfg.client_id,
            token: cfg.token.clone(),
            volume: cfg.volume.clone(),
            dead_time: cfg.dead_time,
        });
        let mut nodes = Vec::new();
        for name in memnodes {
            let node = match Node::connect(name, &link_cfg, connector.as_ref()) {
                Ok(node) => node,
                // A memnode away (its connection refused, broken or timed out) is
                // unreachable, as when one goes away later; the volume mount decides
                // whether it can do without it (`volume/quorum.rs`). (A refusal is
                // not: the volume is held by another fsd, or the token is wrong.)
                Err(e)
                    if cfg.volume.is_some()
                        && memnodes.len() > 1
                        && (matches!(e, RemoteError::Fabric { .. }) || is_unreachable(&e)) =>
                {
                    Node::unreachable(name, &link_cfg, e.to_string())
                }
                Err(e) => return Err(e),
            };
            nodes.push(Arc::new(node));
        }
        if !nodes.iter().any(|n| n.is_up()) {
            return Err(RemoteError::NodeDown {
                node: memnodes.join(", "),
                reason: "no memnode answered".into(),
            });
        }
        let chunk_size = cfg.chunk_size.max(cfg.block_size);
        // Half a chunk left: time to ask for the next chunk.
        let low_water = (chunk_size / 2).max(cfg.block_size);
        let counters = Arc::new(RemoteCounters::default());
        let mut threads = Vec::new();
        for node in &nodes {
            threads.push(
                refill::start(node, chunk_size, low_water, counters.clone())
                    .map_err(|e| thread_error(&node.name, "refill", e))?,
            );
            threads.push(
                watch::start(
                    node,
                    link_cfg.clone(),
                    connector.clone(),
                    cfg.watch_interval,
                )
                .map_err(|e| thread_error(&node.name, "watch", e))?,
            );
        }
        Ok(RemoteStore {
            nodes,
            replicas: cfg.replicas.clamp(1, MAX_REPLICAS),
            block_size: cfg.block_size,
            chunk_size,
            low_water,
            next_node: AtomicUsize::new(0),
            counters,
            threads: Mutex::new(threads),
            unreachable_timeout: cfg.unreachable_timeout,
        })
    }

    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// Copies each block should have.
    pub fn replicas(&self) -> usize {
        self.replicas
    }

    /// Tells every memnode in reach that this fsd is done, so they give its scratch
    /// memory back at once instead of keeping it for a reconnect (clean shutdown).
    pub fn end_sessions(&self) {
        for node in &self.nodes {
            node.end_session();
        }
    }
}

/// Shared handle used across fsd.
pub type SharedRemote = Arc<RemoteStore>;

impl RemoteStore {
    /// Stops and joins every node's refill and watch threads (shutdown, once the
    /// last write is done): a memnode cut off now is not reconnected, which would
    /// open the volume again after it was closed and leave it held until the lease
    /// runs out; waits for unreachable memnodes end.
    pub fn stop_background(&self) {
        for node in &self.nodes {
            node.refill.stop();
        }
        let threads = std::mem::take(&mut *lock(&self.threads));
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for RemoteStore {
    fn drop(&mut self) {
        self.stop_background();
    }
}

#[cfg(test)]
#[cfg(test)]
mod tests {
    use super::*;
    use rmemfs_common::fabric::tcp::TcpEndpoint;
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    const BS: u64 = 4096;
    const CHUNK: u64 = 16 * BS;

    fn store() -> (memnode::Memnode, RemoteStore) {
        let node = memnode::Memnode::start(memnode::MemnodeConfig {
            listen: "127.0.0.1:0".into(),
            size: 64 * CHUNK,
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
        let connect: Arc<Connector> = Arc::new(|peer: &str, _client: u64| {
            Ok(Box::new(TcpEndpoint::connect(peer, Duration::from_secs(5))?) as Box<dyn Endpoint>)
        });
        let remote = RemoteStore::connect(
            &[node.local_addr().to_string()],
            &RemoteConfig {
                block_size: BS,
                chunk_size: CHUNK,
                connections: 1,
                client_id: 7,
                token: Vec::new(),
                replicas: 1,
                watch_interval: Duration::from_secs(1),
                dead_time: Duration::from_secs(600),
                unreachable_timeout: None,
                volume: None,
            },
            connect,
        )
        .expect("connects");
        (node, remote)
    }

    fn allocs(r: &RemoteStore) -> (u64, u64) {
        (
            r.counters.chunk_allocs.load(Ordering::Relaxed),
            r.counters.chunk_allocs_waited.load(Ordering::Relaxed),
        )
    }

    #[test]
    fn a_copy_holds_whole_pages_and_the_bytes_past_them_read_as_zeros() {
        let (_node, r) = store();
        let loc = r.alloc_block(100).expect("a block of one page");
        assert_eq!(loc.bytes(), PAGE);
        let mut data = vec![0u8; 2 * PAGE as usize];
        data[..PAGE as usize].fill(0xab);
        let ok = r.write_copies(&[(&loc, 0, &data[..])]);
        assert!(ok[0].iter().all(|c| c.is_ok()), "{ok:?}");
        let mut back = vec![0xffu8; 2 * PAGE as usize];
        r.read_blocks(&mut [(&loc, 0, &mut back[..], &[])])[0]
            .clone()
            .expect("read");
        assert!(back == data, "the page back, then zeros");
        // A non-zero byte past the copy would be dropped: the write fails instead.
        data[PAGE as usize + 5] = 1;
        let refused = r.write_copies(&[(&loc, 0, &data[..])]);
        assert!(
            matches!(
                refused[0][..],
                [Err(RemoteError::PastAllocation { bytes: PAGE })]
            ),
            "{refused:?}"
        );
        r.free_blocks([loc]);
    }

    #[test]
    fn the_next_chunk_is_allocated_ahead_so_writes_do_not_wait_for_it() {
        let (_node, r) = store();
        // The first block has to wait for the first chunk.
        r.alloc_block(BS).expect("first block");
        assert_eq!(allocs(&r), (1, 1));
        // Take blocks until the pool is below its low-water mark (half a chunk).
        let blocks = CHUNK / BS;
        for _ in 1..blocks / 2 + 1 {
            r.alloc_block(BS).expect("block of the first chunk");
        }
        // The refill thread now brings the second chunk without anyone waiting.
        let deadline = Instant::now() + Duration::from_secs(10);
        while allocs(&r).0 < 2 {
            assert!(Instant::now() < deadline, "no chunk was allocated ahead");
            std::thread::sleep(Duration::from_millis(10));
        }
        // Several chunks' worth of blocks later, still only the first wait: each
        // chunk arrived ahead. (Between takes the test gives the refill thread the
        // time a real write's data transfer would.)
        for _ in 0..4 * blocks {
            r.alloc_block(BS).expect("block");
            let deadline = Instant::now() + Duration::from_secs(10);
            while lock(&r.nodes[0].pool).blocks.free_bytes() == 0 {
                assert!(Instant::now() < deadline, "the pool stayed empty");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let (made, waited) = allocs(&r);
        assert_eq!(waited, 1, "only the very first chunk is waited for");
        assert!(made >= 5, "chunks allocated: {made}");
    }
}
