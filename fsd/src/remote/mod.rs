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

mod copy;
mod link;
mod node;
mod placement;
mod pool;
mod refill;
mod remap;
pub mod sums;
mod watch;

pub use copy::BlockCopy;
use link::LinkConfig;
pub use link::VolumeSpec;
use node::Node;
pub use node::NodeState;
pub use placement::{BlockLoc, Replica, MAX_REPLICAS};
pub use pool::{pages_for, PAGE};
use rmemfs_common::control::{self, ControlError};
use rmemfs_common::fabric::{Endpoint, FabricError, RdmaOp, RemoteAddr, MAX_DATA_OP};
use rmemfs_common::protocol::Allocation;
use rmemfs_common::size::format_size;
use rmemfs_metrics::LatencyHistogram;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RemoteError {
    #[error("remote memory is full")]
    NoSpace,
    #[error("memnode {node} is down: {reason}")]
    NodeDown { node: String, reason: String },
    #[error("memnode {node}: {error}")]
    Fabric { node: String, error: FabricError },
    #[error("memnode {node}: {error}")]
    Control { node: String, error: ControlError },
    #[error("no copy of the block is left: the memnodes that held it were lost")]
    Lost,
    #[error("bytes past a block's allocation ({bytes} bytes) are not zero: fsd would drop them")]
    PastAllocation { bytes: u64 },
    #[error(
        "every copy of the block fails its checksum (the last on memnode {node} at {addr:#x})"
    )]
    Corrupt { node: String, addr: u64 },
}

impl RemoteError {
    /// True when a memnode refused this fsd because another one took its volume over:
    /// a control call answered `Fenced`, or a one-sided access was refused (the
    /// takeover revoked every rkey this fsd had).
    pub fn is_fenced(&self) -> bool {
        match self {
            RemoteError::Control { error, .. } => error.is_fenced(),
            RemoteError::Fabric { error, .. } => matches!(error, FabricError::RemoteAccess { .. }),
            _ => false,
        }
    }
}

/// Opens one connection to a memnode (backend-specific) for a client id; used for
/// every data and control connection.
pub type Connector = dyn Fn(&str, u64) -> Result<Box<dyn Endpoint>, FabricError> + Send + Sync;

/// Counters of remote traffic, for statistics and benchmarks.
#[derive(Debug, Default)]
pub struct RemoteCounters {
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
    pub writes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub chunk_allocs: AtomicU64,
    /// Chunk allocations a block allocation had to wait for (the pool ran dry before
    /// the allocation ahead arrived): control round trips on the write path.
    pub chunk_allocs_waited: AtomicU64,
    pub chunk_frees: AtomicU64,
    /// Copies written to replace copies lost with a memnode.
    pub copies_restored: AtomicU64,
    /// Reads whose bytes failed their checksum (one per copy read).
    pub checksum_failures: AtomicU64,
    /// Pages of copies rewritten from a good copy after failing their checksum.
    pub pages_repaired: AtomicU64,
    /// Bytes memnodes copied within their memory for fsd (copy_file_range).
    pub memnode_copy_bytes: AtomicU64,
    /// Remote operations sent again after their memnode was unreachable and came
    /// back (or that waited for it to come back before being sent).
    pub ops_retried: AtomicU64,
    /// Latency of counted READs and WRITEs: each operation of a batch posted on one
    /// connection is observed with the batch's time, from posting to its last
    /// completion (they complete together as far as fsd can tell).
    pub read_latency: LatencyHistogram,
    pub write_latency: LatencyHistogram,
}

impl RemoteCounters {
    /// Records the latency of a batch of `reads` READs and `writes` WRITEs.
    #[inline]
    fn observe(&self, took: Duration, reads: u64, writes: u64) {
        if reads > 0 {
            self.read_latency.observe_many(took, reads);
        }
        if writes > 0 {
            self.write_latency.observe_many(took, writes);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How often a caller waiting for an unreachable memnode looks again.
const WAIT_STEP: Duration = Duration::from_millis(5);

/// A memnode's memory, as [`RemoteStore::node_usage`] reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeUsage {
    /// Bytes the memnode lends in all.
    pub capacity: u64,
    /// Bytes it has handed out, to this fsd and to others.
    pub used: u64,
    /// Clients connected to it.
    pub clients: u32,
    /// Bytes of this fsd's chunks there that hold no block yet.
    pub held_free: u64,
}

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

/// Whether an operation on an unreachable node waits for it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Patience {
    /// Fail at once: the caller has another copy to turn to.
    FailFast,
    /// Wait for the node (bounded by `unreachable_timeout`, or until it is lost), then
    /// send the operation again.
    Wait,
}

/// How many of the `len` bytes at `offset` of a block lie in its allocation.
fn held_part(loc: &BlockLoc, offset: usize, len: usize) -> usize {
    (loc.bytes() as usize).saturating_sub(offset).min(len)
}

/// One read of [`RemoteStore::read_blocks`]: a block's copies, the byte offset in the
/// block, the buffer, and the expected sums of the whole pages the range holds.
pub type BlockRead<'a> = (&'a BlockLoc, usize, &'a mut [u8], &'a [Option<u32>]);

/// One remote operation on one copy, as [`RemoteStore::post`] takes them.
struct CopyOp<'a> {
    replica: Replica,
    op: RdmaOp<'a>,
}

/// True for an error that says the node could not be reached (rather than refused
/// the access or the bytes were bad): the operation may succeed once it is back.
fn is_unreachable(e: &RemoteError) -> bool {
    match e {
        RemoteError::NodeDown { .. } => true,
        RemoteError::Fabric { error, .. } => {
            error.is_fatal() || matches!(error, FabricError::Timeout { .. })
        }
        RemoteError::Control {
            error: ControlError::Fabric(error),
            ..
        } => error.is_fatal() || matches!(error, FabricError::Timeout { .. }),
        _ => false,
    }
}

fn thread_error(node: &str, what: &str, e: std::io::Error) -> RemoteError {
    RemoteError::Fabric {
        node: node.to_string(),
        error: FabricError::Local(format!("cannot start a {what} thread: {e}")),
    }
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

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub fn nodes_up(&self) -> usize {
        self.nodes.iter().filter(|n| n.is_up()).count()
    }

    /// Whether node `idx` is up.
    pub fn node_is_up(&self, idx: usize) -> bool {
        self.nodes.get(idx).is_some_and(|n| n.is_up())
    }

    /// True when the copy `r` can be reached now (its node is up, in the epoch of
    /// the copy).
    pub fn holds(&self, r: &Replica) -> bool {
        self.nodes.get(r.node as usize).is_some_and(|n| n.holds(r))
    }

    /// True when the copy `r` still exists, reachable or not (its node is not lost
    /// since the copy was made).
    pub fn has_copy(&self, r: &Replica) -> bool {
        self.nodes
            .get(r.node as usize)
            .is_some_and(|n| n.has_copy(r))
    }

    /// How many copies of `loc` can be reached now.
    pub fn live_copies(&self, loc: &BlockLoc) -> usize {
        loc.replicas().iter().filter(|r| self.holds(r)).count()
    }

    /// Readies `loc` for a write: drops the copies that were lost and, when at least
    /// one copy can be reached, the unreachable ones too (they would miss this write
    /// and hold old bytes). With no copy in reach, the unreachable ones stay: the
    /// write waits for them. A copy dropped out of reach is not given back to its
    /// pool (a write sent before its memnode went away might still land in it): its
    /// pages stay taken until fsd lets go of the memnode's memory, or, on a volume,
    /// until the next mount finds them referenced by nothing.
    pub fn prune_for_write(&self, loc: &mut BlockLoc) {
        loc.retain(|r| self.has_copy(r));
        if self.live_copies(loc) > 0 {
            loc.retain(|r| self.holds(r));
        }
    }

    /// Waits while `loc` has copies that exist but none that can be reached (its
    /// memnodes are unreachable): until one is back, none exists any more (lost), or
    /// the unreachable timeout passes. Returns at once otherwise.
    pub fn await_reachable(&self, loc: &BlockLoc) {
        let deadline = self.unreachable_timeout.map(|t| Instant::now() + t);
        let mut waited = false;
        while self.live_copies(loc) == 0 && loc.replicas().iter().any(|r| self.has_copy(r)) {
            if deadline.is_some_and(|d| Instant::now() >= d) || self.stopping() {
                break;
            }
            waited = true;
            std::thread::sleep(WAIT_STEP);
        }
        if waited {
            self.counters.ops_retried.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Waits for node `node` to be up again in `epoch`; false when it was lost, the
    /// unreachable timeout passed (from `since`) or fsd is stopping.
    fn await_node(&self, node: &Node, epoch: u32, since: Instant) -> bool {
        loop {
            if node.epoch() != epoch {
                return false;
            }
            if node.is_up() {
                return true;
            }
            if self
                .unreachable_timeout
                .is_some_and(|t| since.elapsed() >= t)
                || self.stopping()
            {
                return false;
            }
            std::thread::sleep(WAIT_STEP);
        }
    }

    /// True once fsd is shutting the store down (no more waiting for memnodes).
    fn stopping(&self) -> bool {
        self.nodes
            .first()
            .is_some_and(|n| n.refill.stop.load(Ordering::SeqCst))
    }

    /// Each node's state (by index), for status and metrics.
    pub fn node_state(&self, idx: usize) -> Option<NodeState> {
        Some(self.nodes.get(idx)?.state())
    }

    /// Node `idx`'s counts: times unreachable, sessions resumed, times lost.
    pub fn node_events(&self, idx: usize) -> Option<(u64, u64, u64)> {
        let e = &self.nodes.get(idx)?.events;
        Some((
            e.unreachable.load(Ordering::Relaxed),
            e.resumed.load(Ordering::Relaxed),
            e.lost.load(Ordering::Relaxed),
        ))
    }

    /// Declares node `idx` lost now if it is unreachable (an operator's word): its
    /// copies are re-made from other copies. False when it is up (or not a node).
    pub fn declare_lost(&self, idx: usize) -> bool {
        let Some(node) = self.nodes.get(idx) else {
            return false;
        };
        node.declare_lost(node.epoch(), "declared lost by the operator")
    }

    /// The copies a block can have now: `replicas`, or fewer while fewer nodes are up.
    pub fn copies_possible(&self) -> usize {
        self.replicas.min(self.nodes_up())
    }

    /// Allocates a new block's first `bytes` (rounded up to whole pages, at most a
    /// block): copies on as many distinct nodes as [`RemoteStore::copies_possible`].
    /// Fewer nodes with room is `NoSpace`.
    ///
    /// An allocation that fails while memnodes it could use are unreachable (or one
    /// became so during it: a connection broken under an Alloc) waits for them as an
    /// operation with no copy in reach does, then tries again.
    pub fn alloc_block(&self, bytes: u64) -> Result<BlockLoc, RemoteError> {
        let since = Instant::now();
        loop {
            let before = self.unreachable_events();
            let r = self.try_alloc_block(bytes);
            let cut_off = self.unreachable_events() != before;
            match r {
                Err(_) if (cut_off || self.any_unreachable()) && self.await_unreachable(since) => {
                    continue
                }
                r => return r,
            }
        }
    }

    /// Times any node became unreachable.
    fn unreachable_events(&self) -> u64 {
        self.nodes
            .iter()
            .map(|n| n.events.unreachable.load(Ordering::Relaxed))
            .sum()
    }

    /// True when some node is unreachable (its copies kept, not lost).
    fn any_unreachable(&self) -> bool {
        self.nodes
            .iter()
            .any(|n| matches!(n.state(), NodeState::Unreachable { .. }))
    }

    /// Waits until no node is unreachable (each is up or lost): true then (at once
    /// when none is); false after the unreachable timeout (from `since`) or when fsd
    /// stops.
    fn await_unreachable(&self, since: Instant) -> bool {
        let mut waited = false;
        while self.any_unreachable() {
            if self
                .unreachable_timeout
                .is_some_and(|t| since.elapsed() >= t)
                || self.stopping()
            {
                return false;
            }
            waited = true;
            std::thread::sleep(WAIT_STEP);
        }
        if waited {
            self.counters.ops_retried.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    fn try_alloc_block(&self, bytes: u64) -> Result<BlockLoc, RemoteError> {
        let mut loc = BlockLoc::new(pages_for(bytes).min(self.block_size));
        let want = self.copies_possible();
        if want == 0 {
            return Err(self.nodes[0].link().err().unwrap_or(RemoteError::Lost));
        }
        let added = self.add_copies(&mut loc, want);
        // A node may have gone down meanwhile: what is possible now is enough.
        if added == 0 || added < self.copies_possible().min(want) {
            self.free_blocks([loc]);
            return Err(RemoteError::NoSpace);
        }
        Ok(loc)
    }

    /// Drops the copies of `loc` that no longer exist or would miss a write
    /// ([`RemoteStore::prune_for_write`]), then allocates up to `want` new ones on up
    /// nodes that hold none, nodes taken in turn. Returns how many it added (fewer
    /// when fewer nodes have room).
    pub fn add_copies(&self, loc: &mut BlockLoc, want: usize) -> usize {
        self.prune_for_write(loc);
        let n = self.nodes.len();
        let start = self.next_node.fetch_add(1, Ordering::Relaxed);
        let mut added = 0;
        for i in 0..n {
            if added == want || loc.len() == MAX_REPLICAS {
                break;
            }
            let idx = (start + i) % n;
            if loc.has_node(idx as u16) {
                continue;
            }
            if let Ok(r) = self.alloc_on(idx, loc.bytes()) {
                loc.push(r);
                added += 1;
            }
        }
        added
    }

    /// One copy of `bytes` on node `idx`, from its pool (refilled from the memnode if
    /// no free extent is long enough).
    fn alloc_on(&self, idx: usize, bytes: u64) -> Result<Replica, RemoteError> {
        let node = &self.nodes[idx];
        let link = node.link()?;
        let mut pool = lock(&node.pool);
        if pool.epoch != link.epoch {
            return Err(RemoteError::Lost);
        }
        let replica = |remote| Replica {
            node: idx as u16,
            epoch: link.epoch,
            remote,
        };
        if let Some(b) = pool.blocks.take(bytes) {
            if pool.blocks.free_bytes() < self.low_water && !node.full.load(Ordering::Relaxed) {
                node.refill.want();
            }
            return Ok(replica(b));
        }
        if node.full.load(Ordering::Relaxed) {
            return Err(RemoteError::NoSpace);
        }
        self.counters
            .chunk_allocs_waited
            .fetch_add(1, Ordering::Relaxed);
        // Refill: the preferred chunk size, then halves of it down to what is asked
        // for, so the last bytes of a nearly full memnode are still used.
        let least = pages_for(bytes);
        let mut size = self.chunk_size;
        loop {
            match control::alloc(link.control(), size) {
                Ok(a) => {
                    self.counters.chunk_allocs.fetch_add(1, Ordering::Relaxed);
                    log::debug!(
                        "memnode {}: new chunk {:#x}+{}",
                        node.name,
                        a.addr,
                        format_size(a.len)
                    );
                    pool.blocks.add_chunk(a);
                    return pool
                        .blocks
                        .take(bytes)
                        .map(replica)
                        .ok_or(RemoteError::NoSpace);
                }
                Err(e) if e.is_no_space() && size > least => {
                    size = (size / 2).max(least);
                }
                Err(e) if e.is_no_space() => {
                    node.full.store(true, Ordering::Relaxed);
                    log::warn!("memnode {} is full", node.name);
                    return Err(RemoteError::NoSpace);
                }
                Err(e) => return Err(node.control_error(link.epoch, e)),
            }
        }
    }

    /// `loc` grown to `bytes` (whole pages, at most a block) where its copies lie, if
    /// the pages after every copy are free; else `None` and nothing changed.
    pub fn grow_in_place(&self, loc: &BlockLoc, bytes: u64) -> Option<BlockLoc> {
        let to = pages_for(bytes).min(self.block_size);
        let mut grown: Vec<&Replica> = Vec::new();
        for r in loc.replicas() {
            let ok = self.nodes.get(r.node as usize).is_some_and(|node| {
                let mut pool = lock(&node.pool);
                pool.epoch == r.epoch && pool.blocks.extend(r.remote, loc.bytes(), to)
            });
            if !ok {
                // Give back what was taken: each grown copy's pages past the old end.
                let grown = BlockLoc::from_replicas(to, grown.into_iter().copied());
                self.shrink_in_place(&grown, loc.bytes());
                return None;
            }
            grown.push(r);
        }
        Some(BlockLoc::from_replicas(to, loc.replicas().iter().copied()))
    }

    /// `loc` cut to its first `bytes` (whole pages): the pages past them go back to
    /// the pools. The caller makes sure nothing reads or writes them any more.
    pub fn shrink_in_place(&self, loc: &BlockLoc, bytes: u64) -> BlockLoc {
        let to = pages_for(bytes).min(loc.bytes());
        for r in loc.replicas() {
            if to < loc.bytes() {
                let tail = RemoteAddr {
                    addr: r.remote.addr + to,
                    rkey: r.remote.rkey,
                };
                self.free_copy(&Replica { remote: tail, ..*r }, loc.bytes() - to);
            }
        }
        BlockLoc::from_replicas(to, loc.replicas().iter().copied())
    }

    /// Gives blocks back to their pools; chunks that empty out go back to the memnode.
    /// Copies of an ended epoch are already gone and are skipped.
    pub fn free_blocks(&self, blocks: impl IntoIterator<Item = BlockLoc>) {
        for loc in blocks {
            for r in loc.replicas() {
                self.free_copy(r, loc.bytes());
            }
        }
    }

    fn free_copy(&self, r: &Replica, bytes: u64) {
        let Some(node) = self.nodes.get(r.node as usize) else {
            return;
        };
        let release = {
            let mut pool = lock(&node.pool);
            if pool.epoch != r.epoch {
                return;
            }
            let (known, release) = pool.blocks.put(r.remote, bytes);
            if !known {
                log::error!("freeing unknown block {r:?}");
                return;
            }
            release
        };
        node.full.store(false, Ordering::Relaxed);
        for chunk in release {
            self.free_chunk(node, r.epoch, chunk.addr, chunk.rkey);
        }
    }

    fn free_chunk(&self, node: &Node, epoch: u32, addr: u64, rkey: u32) {
        let Ok(link) = node.link() else { return };
        if link.epoch != epoch {
            return;
        }
        let rkey = link.rkey(addr, rkey);
        link.forget_chunk(addr);
        match control::free(link.control(), addr, rkey) {
            Ok(()) => {
                self.counters.chunk_frees.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => log::warn!("{}", node.control_error(epoch, e)),
        }
    }

    /// Posts `ops`; all operations for one node go together on one of its
    /// connections. Returns one result per operation, in order.
    fn post(&self, ops: Vec<CopyOp<'_>>, patience: Patience) -> Vec<Result<(), RemoteError>> {
        self.post_counted(ops, patience, true)
    }

    /// As [`RemoteStore::post`]; `counted` false leaves the traffic counters alone
    /// (the scrubber's reads, which it counts itself, are not the data path's). With
    /// [`Patience::Wait`], operations that found their node unreachable (before or
    /// while they were sent) wait for it and are sent again.
    fn post_counted(
        &self,
        ops: Vec<CopyOp<'_>>,
        patience: Patience,
        counted: bool,
    ) -> Vec<Result<(), RemoteError>> {
        let mut results: Vec<Result<(), RemoteError>> = ops.iter().map(|_| Ok(())).collect();
        let mut nodes: Vec<u16> = ops.iter().map(|o| o.replica.node).collect();
        nodes.sort_unstable();
        nodes.dedup();
        let mut ops: Vec<Option<CopyOp<'_>>> = ops.into_iter().map(Some).collect();
        for node_idx in nodes {
            let members: Vec<usize> = (0..ops.len())
                .filter(|&i| ops[i].as_ref().is_some_and(|o| o.replica.node == node_idx))
                .collect();
            let mut batch: Vec<(usize, CopyOp<'_>)> = members
                .into_iter()
                .filter_map(|i| Some((i, ops[i].take()?)))
                .collect();
            let Some(node) = self.nodes.get(node_idx as usize) else {
                for (i, _) in batch {
                    results[i] = Err(RemoteError::Lost);
                }
                continue;
            };
            let since = Instant::now();
            loop {
                let outcomes = self.execute_on(node, &mut batch, counted);
                let mut again = Vec::new();
                for ((i, op), outcome) in batch.into_iter().zip(outcomes) {
                    let retry = patience == Patience::Wait
                        && outcome.as_ref().is_err_and(is_unreachable)
                        && node.has_copy(&op.replica);
                    results[i] = outcome;
                    if retry {
                        again.push((i, op));
                    }
                }
                if again.is_empty() || !self.await_node(node, again[0].1.replica.epoch, since) {
                    break;
                }
                self.counters
                    .ops_retried
                    .fetch_add(again.len() as u64, Ordering::Relaxed);
                batch = again;
            }
        }
        results
    }

    /// Sends `batch` (operations on copies of `node`) on one of its connections;
    /// one result per operation.
    fn execute_on(
        &self,
        node: &Node,
        batch: &mut [(usize, CopyOp<'_>)],
        counted: bool,
    ) -> Vec<Result<(), RemoteError>> {
        let link = match node.link() {
            Ok(l) => l,
            Err(e) => return batch.iter().map(|_| Err(e.clone())).collect(),
        };
        let mut results: Vec<Result<(), RemoteError>> = batch.iter().map(|_| Ok(())).collect();
        let mut posted = Vec::with_capacity(batch.len());
        let mut rdma: Vec<RdmaOp<'_>> = Vec::with_capacity(batch.len());
        let mut reads = 0;
        for (k, (_, CopyOp { replica, op })) in batch.iter_mut().enumerate() {
            if replica.epoch != link.epoch {
                results[k] = Err(RemoteError::Lost);
                continue;
            }
            let (count, bytes, len, is_read) = match op {
                RdmaOp::Read { local, .. } => (
                    &self.counters.reads,
                    &self.counters.read_bytes,
                    local.len(),
                    true,
                ),
                RdmaOp::Write { local, .. } => (
                    &self.counters.writes,
                    &self.counters.write_bytes,
                    local.len(),
                    false,
                ),
            };
            if counted {
                count.fetch_add(1, Ordering::Relaxed);
                bytes.fetch_add(len as u64, Ordering::Relaxed);
            }
            reads += is_read as u64;
            posted.push(k);
            rdma.push(op.reborrow());
        }
        if link.remap.is_some() {
            for op in &mut rdma {
                let (RdmaOp::Read { remote, .. } | RdmaOp::Write { remote, .. }) = op;
                remote.rkey = link.rkey(remote.addr, remote.rkey);
            }
        }
        let started = Instant::now();
        let outcomes = link.endpoint().execute(&mut rdma);
        if counted {
            let writes = rdma.len() as u64 - reads;
            self.counters.observe(started.elapsed(), reads, writes);
        }
        for (k, outcome) in posted.into_iter().zip(outcomes) {
            results[k] = outcome.map_err(|e| node.fabric_error(link.epoch, e));
        }
        results
    }

    /// Reads bytes `offset..offset + buffer length` of each block into its buffer from
    /// one of its copies, trying the next copy when one fails; bytes past the
    /// block's allocation read as zeros. Each read's pages are checked against its
    /// expected sums (`sums.rs`; one per page of the range): a copy that fails is
    /// logged and counted, the next copy is read, and once one passes the copies
    /// that failed are rewritten from it (read repair). A block with no copy left
    /// fails with [`RemoteError::Lost`], one whose every copy fails its checksum
    /// with [`RemoteError::Corrupt`]. Copies that can be reached are tried first; a
    /// block none of whose copies could be read but that has copies on unreachable
    /// memnodes waits for one of them ([`RemoteStore::await_reachable`]'s bounds)
    /// and is read again.
    pub fn read_blocks(&self, reads: &mut [BlockRead<'_>]) -> Vec<Result<(), RemoteError>> {
        let mut results: Vec<Result<(), RemoteError>> =
            reads.iter().map(|_| Err(RemoteError::Lost)).collect();
        // The next copy to try, per block; `None` once a block is done.
        let mut next: Vec<Option<usize>> = reads.iter().map(|_| Some(0)).collect();
        // Bytes of each buffer the block's allocation holds; the rest is zeros.
        let held: Vec<usize> = reads
            .iter_mut()
            .map(|(loc, offset, buf, _)| {
                let n = held_part(loc, *offset, buf.len());
                buf[n..].fill(0);
                n
            })
            .collect();
        // The copies of each block whose bytes failed their checksum.
        let mut bad: Vec<Vec<Replica>> = vec![Vec::new(); reads.len()];
        for (i, (loc, _, _, _)) in reads.iter().enumerate() {
            if held[i] == 0 && loc.replicas().iter().any(|r| self.has_copy(r)) {
                results[i] = Ok(());
                next[i] = None;
            }
        }
        let since = Instant::now();
        loop {
            self.read_reachable_copies(reads, &held, &mut next, &mut results, &mut bad);
            // Blocks still unread whose other copies exist but are out of reach.
            let waiting: Vec<usize> = (0..reads.len())
                .filter(|&i| {
                    results[i].is_err()
                        && reads[i]
                            .0
                            .replicas()
                            .iter()
                            .any(|r| self.has_copy(r) && !self.holds(r))
                })
                .collect();
            if waiting.is_empty() {
                break;
            }
            if !self.await_any(reads, &waiting, since) {
                // Out of reach, not lost: say which memnode it waits for.
                for &i in &waiting {
                    if let Err(RemoteError::Lost) = results[i] {
                        let away = reads[i].0.replicas().iter().find_map(|r| {
                            let node = self.nodes.get(r.node as usize)?;
                            node.has_copy(r).then(|| node.link().err()).flatten()
                        });
                        if let Some(e) = away {
                            results[i] = Err(e);
                        }
                    }
                }
                break;
            }
            self.counters
                .ops_retried
                .fetch_add(waiting.len() as u64, Ordering::Relaxed);
            for i in waiting {
                next[i] = Some(0);
            }
        }
        for (i, bad) in bad.iter().enumerate() {
            if results[i].is_ok() && !bad.is_empty() {
                let (_, offset, buf, _) = &reads[i];
                self.rewrite_copies(bad, *offset, &buf[..held[i]]);
            }
        }
        results
    }

    /// Waits until one of the blocks `which` of `reads` has a copy in reach (true),
    /// or none of them has a copy left, or the unreachable timeout (from `since`)
    /// passes, or fsd stops (false).
    fn await_any(&self, reads: &[BlockRead<'_>], which: &[usize], since: Instant) -> bool {
        loop {
            if which.iter().any(|&i| self.live_copies(reads[i].0) > 0) {
                return true;
            }
            let none_left = which
                .iter()
                .all(|&i| !reads[i].0.replicas().iter().any(|r| self.has_copy(r)));
            let timed_out = self
                .unreachable_timeout
                .is_some_and(|t| since.elapsed() >= t);
            if none_left || timed_out || self.stopping() {
                return false;
            }
            std::thread::sleep(WAIT_STEP);
        }
    }

    /// One pass of [`RemoteStore::read_blocks`]: for each block not done (`next`),
    /// reads the copies in reach in turn until one passes its checksum.
    fn read_reachable_copies(
        &self,
        reads: &mut [BlockRead<'_>],
        held: &[usize],
        next: &mut [Option<usize>],
        results: &mut [Result<(), RemoteError>],
        bad: &mut [Vec<Replica>],
    ) {
        loop {
            let mut chosen: Vec<Option<Replica>> = vec![None; reads.len()];
            for (i, (loc, _, _, _)) in reads.iter().enumerate() {
                let Some(from) = next[i] else { continue };
                let pick = loc.replicas()[from.min(loc.len())..]
                    .iter()
                    .position(|r| self.holds(r));
                match pick {
                    Some(p) => {
                        chosen[i] = Some(loc.replicas()[from + p]);
                        next[i] = Some(from + p + 1);
                    }
                    None => next[i] = None,
                }
            }
            let mut which = Vec::new();
            let mut ops = Vec::new();
            for (i, (_, offset, buf, _)) in reads.iter_mut().enumerate() {
                if let Some(replica) = chosen[i] {
                    which.push(i);
                    ops.push(CopyOp {
                        replica,
                        op: RdmaOp::Read {
                            local: &mut buf[..held[i]],
                            remote: replica.remote.offset(*offset),
                        },
                    });
                }
            }
            if ops.is_empty() {
                break;
            }
            for (i, r) in which.into_iter().zip(self.post(ops, Patience::FailFast)) {
                let (_, offset, buf, expected) = &reads[i];
                let replica = chosen[i].expect("a read was posted for it");
                results[i] =
                    r.and_then(|()| self.check_sums(replica, *offset, &buf[..held[i]], expected));
                match &results[i] {
                    Ok(()) => next[i] = None,
                    Err(RemoteError::Corrupt { .. }) => bad[i].push(replica),
                    Err(_) => {}
                }
            }
        }
    }

    /// Checks `data`, just read from `replica` at `offset`, against `expected`.
    fn check_sums(
        &self,
        replica: Replica,
        offset: usize,
        data: &[u8],
        expected: &[Option<u32>],
    ) -> Result<(), RemoteError> {
        let Some(page) = sums::first_mismatch(offset, data, expected) else {
            return Ok(());
        };
        // What was found, for whoever reads the log: the sums and whether the page
        // held nothing at all (memory that was never written, or was given back).
        let at = page - offset;
        let bytes = &data[at..at + PAGE as usize];
        let want = expected[(page - offset.next_multiple_of(PAGE as usize)) / PAGE as usize];
        log::error!(
            "page {} of a block copy: sum {:#010x} expected {:#010x}{}",
            page / PAGE as usize,
            sums::page_sum(bytes),
            want.unwrap_or(0),
            if bytes.iter().all(|&b| b == 0) {
                " (all zeros)"
            } else {
                ""
            }
        );
        let (node, addr) = self.note_checksum_failure(replica, page);
        Err(RemoteError::Corrupt { node, addr })
    }

    /// Counts and logs that the copy `replica` failed its checksum in the page at
    /// byte `page` of its block; its memnode and address.
    pub fn note_checksum_failure(&self, replica: Replica, page: usize) -> (String, u64) {
        self.counters
            .checksum_failures
            .fetch_add(1, Ordering::Relaxed);
        let node = self.node_name(replica.node as usize).to_string();
        let addr = replica.remote.offset(page).addr;
        log::error!(
            "checksum mismatch: the copy on memnode {node} has bad bytes in the page at {addr:#x}"
        );
        (node, addr)
    }

    /// Reads bytes `offset..offset + buf.len()` of one copy, unchecked and uncounted
    /// in the traffic counters (the scrubber checks and counts them itself).
    pub fn read_copy(
        &self,
        replica: Replica,
        offset: usize,
        buf: &mut [u8],
    ) -> Result<(), RemoteError> {
        let op = CopyOp {
            replica,
            op: RdmaOp::Read {
                local: buf,
                remote: replica.remote.offset(offset),
            },
        };
        self.post_counted(vec![op], Patience::FailFast, false)
            .remove(0)
    }

    /// Rewrites `data` at `offset` of the copies in `bad`, whose bytes there failed
    /// their checksum while another copy's passed (read repair, and the scrubber's).
    pub fn rewrite_copies(&self, bad: &[Replica], offset: usize, data: &[u8]) {
        let ops = bad
            .iter()
            .map(|replica| CopyOp {
                replica: *replica,
                op: RdmaOp::Write {
                    local: data,
                    remote: replica.remote.offset(offset),
                },
            })
            .collect();
        for (replica, r) in bad.iter().zip(self.post(ops, Patience::FailFast)) {
            let node = self.node_name(replica.node as usize);
            match r {
                Ok(()) => {
                    let pages = data.len().div_ceil(PAGE as usize) as u64;
                    self.counters
                        .pages_repaired
                        .fetch_add(pages, Ordering::Relaxed);
                    log::warn!(
                        "repaired {pages} page(s) of the copy on memnode {node} at {:#x} \
                         from a good copy",
                        replica.remote.offset(offset).addr
                    );
                }
                Err(e) => log::error!("repairing the copy on memnode {node}: {e}"),
            }
        }
    }

    /// Writes each buffer to bytes `offset..offset + buffer length` of every copy of
    /// its block. Returns, per block, one result per copy (in the order of
    /// `loc.replicas()`). Bytes past the block's allocation are not written; they
    /// must be zeros (what reading them gives), else the block's write fails.
    pub fn write_copies(
        &self,
        writes: &[(&BlockLoc, usize, &[u8])],
    ) -> Vec<Vec<Result<(), RemoteError>>> {
        // (block, copy, bytes, where): each write of a copy, to post and maybe post again.
        let mut ops: Vec<(usize, Replica, &[u8], RemoteAddr)> = Vec::new();
        let mut refused = Vec::with_capacity(writes.len());
        for (b, (loc, offset, buf)) in writes.iter().enumerate() {
            let n = held_part(loc, *offset, buf.len());
            let fits = buf[n..].iter().all(|&b| b == 0);
            refused.push(!fits);
            if !fits {
                log::error!(
                    "a write of {} bytes at {offset} reaches past its block's {} allocated bytes",
                    buf.len(),
                    loc.bytes()
                );
                continue;
            }
            for r in loc.replicas() {
                if n == 0 {
                    continue;
                }
                ops.push((b, *r, &buf[..n], r.remote.offset(*offset)));
            }
        }
        let mut outcomes = self.post_writes(&ops).into_iter();
        writes
            .iter()
            .zip(refused)
            .map(|((loc, offset, buf), refused)| {
                if refused {
                    let e = RemoteError::PastAllocation { bytes: loc.bytes() };
                    vec![Err(e); loc.len()]
                } else if held_part(loc, *offset, buf.len()) == 0 {
                    vec![Ok(()); loc.len()]
                } else {
                    outcomes.by_ref().take(loc.len()).collect()
                }
            })
            .collect()
    }

    /// Posts the writes `ops` (block, copy, bytes, where) at once to every copy. A
    /// block none of whose copies took its write, for want of a memnode in reach, is
    /// written again to those copies once one is back (waiting as
    /// [`Patience::Wait`] does): a block with a copy written needs no other, as the
    /// copies that missed it are dropped by the caller.
    fn post_writes(
        &self,
        ops: &[(usize, Replica, &[u8], RemoteAddr)],
    ) -> Vec<Result<(), RemoteError>> {
        let as_ops = |which: &[usize]| -> Vec<CopyOp<'_>> {
            which
                .iter()
                .map(|&k| {
                    let (_, replica, local, remote) = ops[k];
                    CopyOp {
                        replica,
                        op: RdmaOp::Write { local, remote },
                    }
                })
                .collect()
        };
        let all: Vec<usize> = (0..ops.len()).collect();
        let mut results = self.post(as_ops(&all), Patience::FailFast);
        let written: std::collections::HashSet<usize> = ops
            .iter()
            .zip(&results)
            .filter(|(_, r)| r.is_ok())
            .map(|(op, _)| op.0)
            .collect();
        let again: Vec<usize> = (0..ops.len())
            .filter(|&k| {
                !written.contains(&ops[k].0)
                    && results[k].as_ref().is_err_and(is_unreachable)
                    && self.has_copy(&ops[k].1)
            })
            .collect();
        if !again.is_empty() {
            for (k, r) in again.iter().zip(self.post(as_ops(&again), Patience::Wait)) {
                results[*k] = r;
            }
        }
        results
    }

    /// Usable capacity and free bytes, given that each block takes `replicas` copies:
    /// over every node that is up, memory the memnodes have not handed out plus
    /// blocks free in fsd's own chunks, divided by the copies per block.
    pub fn space(&self) -> (u64, u64) {
        let mut total = 0;
        let mut free = 0;
        for node in &self.nodes {
            let Ok(link) = node.link() else { continue };
            let local_free = lock(&node.pool).blocks.free_bytes();
            match control::stat(link.control()) {
                Ok(s) => {
                    total += s.capacity;
                    free += s.capacity.saturating_sub(s.used) + local_free;
                }
                Err(e) => {
                    log::warn!("{}", node.control_error(link.epoch, e));
                }
            }
        }
        let r = self.replicas as u64;
        (total / r, free / r)
    }

    /// Node `idx`'s memory as its last heartbeat (once a second) reported it, and
    /// the bytes fsd holds there unused (in its block pool; the memnode counts them
    /// as used). `None` while the node is down and before the first heartbeat of its
    /// link answered.
    pub fn node_usage(&self, idx: usize) -> Option<NodeUsage> {
        let node = self.nodes.get(idx).filter(|n| n.is_up())?;
        let stats = (*lock(&node.usage))?;
        Some(NodeUsage {
            capacity: stats.capacity,
            used: stats.used,
            clients: stats.clients,
            held_free: lock(&node.pool).blocks.free_bytes(),
        })
    }

    /// The memnode name of node `idx` (as given on the command line).
    pub fn node_name(&self, idx: usize) -> &str {
        self.nodes.get(idx).map_or("?", |n| n.name.as_str())
    }

    /// Node `idx`'s link epoch and memnode id, while it is up.
    pub fn node_identity(&self, idx: usize) -> Option<(u32, u64)> {
        self.nodes.get(idx)?.identity()
    }

    /// The root chunk of the volume on node `idx`, while it is up.
    pub fn volume_root(&self, idx: usize) -> Option<Allocation> {
        let link = self.nodes.get(idx)?.link().ok()?;
        link.volume.map(|v| v.root)
    }

    /// Every chunk (but the root) of the volume on node `idx`.
    pub fn volume_chunks(&self, idx: usize) -> Result<Vec<Allocation>, RemoteError> {
        let node = self.nodes.get(idx).ok_or(RemoteError::Lost)?;
        let link = node.link()?;
        control::volume_chunks(link.control()).map_err(|e| node.control_error(link.epoch, e))
    }

    /// A new chunk of `bytes` on node `idx`, outside the block pools (metadata).
    pub fn alloc_chunk(&self, idx: usize, bytes: u64) -> Result<Allocation, RemoteError> {
        let node = self.nodes.get(idx).ok_or(RemoteError::Lost)?;
        let link = node.link()?;
        let a = control::alloc(link.control(), bytes).map_err(|e| {
            if e.is_no_space() {
                RemoteError::NoSpace
            } else {
                node.control_error(link.epoch, e)
            }
        })?;
        self.counters.chunk_allocs.fetch_add(1, Ordering::Relaxed);
        Ok(a)
    }

    /// Gives a chunk of node `idx` back to its memnode (in the node's current epoch).
    pub fn free_chunk_of(&self, idx: usize, chunk: Allocation) {
        if let Some(node) = self.nodes.get(idx) {
            if let Some((epoch, _)) = node.identity() {
                self.free_chunk(node, epoch, chunk.addr, chunk.rkey);
            }
        }
    }

    /// Gives back the volume's chunk at `addr` on node `idx`, whatever rkey it has
    /// now (a link of a later epoch opened the volume again and got new ones).
    pub fn free_volume_chunk_at(&self, idx: usize, addr: u64) {
        match self.volume_chunks(idx) {
            Ok(chunks) => {
                if let Some(c) = chunks.into_iter().find(|c| c.addr == addr) {
                    self.free_chunk_of(idx, c);
                }
            }
            Err(e) => log::warn!("cannot list the volume's chunks: {e}"),
        }
    }

    /// Hands a chunk of the volume to node `idx`'s block pool, with the pieces in
    /// `used` (start -> bytes) already taken.
    pub fn adopt_chunk(
        &self,
        idx: usize,
        chunk: Allocation,
        used: &std::collections::BTreeMap<u64, u64>,
    ) {
        if let Some(node) = self.nodes.get(idx) {
            lock(&node.pool).blocks.add_chunk_in_use(chunk, used);
        }
    }

    /// A copy at `remote` on node `idx`, of the node's current epoch.
    pub fn replica_at(&self, idx: usize, remote: RemoteAddr) -> Option<Replica> {
        let (epoch, _) = self.node_identity(idx)?;
        Some(Replica {
            node: u16::try_from(idx).ok()?,
            epoch,
            remote,
        })
    }

    /// Reads `buf.len()` bytes at `remote` on node `idx` (in pieces the fabric takes).
    pub fn read_at(
        &self,
        idx: usize,
        remote: RemoteAddr,
        buf: &mut [u8],
    ) -> Result<(), RemoteError> {
        let replica = self.replica_at(idx, remote).ok_or(RemoteError::Lost)?;
        let ops = buf
            .chunks_mut(MAX_DATA_OP)
            .enumerate()
            .map(|(k, piece)| CopyOp {
                replica,
                op: RdmaOp::Read {
                    local: piece,
                    remote: remote.offset(k * MAX_DATA_OP),
                },
            })
            .collect();
        self.post(ops, Patience::Wait).into_iter().collect()
    }

    /// Writes `buf` at `remote` on node `idx` (in pieces the fabric takes); while
    /// the node is unreachable, waits for it.
    pub fn write_at(&self, idx: usize, remote: RemoteAddr, buf: &[u8]) -> Result<(), RemoteError> {
        self.write_at_with(idx, remote, buf, Patience::Wait)
    }

    /// As [`RemoteStore::write_at`], but fails at once while the node is
    /// unreachable: for writes that another node's copy makes unnecessary.
    pub fn write_at_if_reachable(
        &self,
        idx: usize,
        remote: RemoteAddr,
        buf: &[u8],
    ) -> Result<(), RemoteError> {
        self.write_at_with(idx, remote, buf, Patience::FailFast)
    }

    fn write_at_with(
        &self,
        idx: usize,
        remote: RemoteAddr,
        buf: &[u8],
        patience: Patience,
    ) -> Result<(), RemoteError> {
        let replica = self.replica_at(idx, remote).ok_or(RemoteError::Lost)?;
        let ops = buf
            .chunks(MAX_DATA_OP)
            .enumerate()
            .map(|(k, piece)| CopyOp {
                replica,
                op: RdmaOp::Write {
                    local: piece,
                    remote: remote.offset(k * MAX_DATA_OP),
                },
            })
            .collect();
        self.post(ops, patience).into_iter().collect()
    }

    /// Releases the volume on every memnode that is up (unmount): its chunks stay,
    /// but for the entirely free ones the block pools held.
    pub fn close_volume(&self) {
        for node in &self.nodes {
            let Ok(link) = node.link() else { continue };
            if link.volume.is_none() {
                continue;
            }
            let (epoch, empty) = {
                let mut pool = lock(&node.pool);
                (pool.epoch, pool.blocks.take_empty_chunks())
            };
            for c in empty {
                self.free_chunk(node, epoch, c.addr, c.rkey);
            }
            if let Err(e) = control::volume_close(link.control()) {
                log::warn!("closing the volume: {}", node.control_error(link.epoch, e));
            }
        }
    }

    /// Tells every memnode in reach that this fsd is done, so they give its scratch
    /// memory back at once instead of keeping it for a reconnect (clean shutdown).
    pub fn end_sessions(&self) {
        for node in &self.nodes {
            node.end_session();
        }
    }

    /// Gives every chunk back to the memnodes (at unmount).
    pub fn release_all(&self) {
        for node in &self.nodes {
            let (epoch, chunks) = {
                let mut pool = lock(&node.pool);
                (pool.epoch, pool.blocks.drain())
            };
            for c in chunks {
                self.free_chunk(node, epoch, c.addr, c.rkey);
            }
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
#[path = "states_tests.rs"]
mod states_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use rmemfs_common::fabric::tcp::TcpEndpoint;
    use std::time::{Duration, Instant};

    const BS: u64 = 4096;
    const CHUNK: u64 = 16 * BS;

    fn store() -> (memnode::Memnode, RemoteStore) {
        let node = memnode::Memnode::start(memnode::MemnodeConfig {
            listen: "127.0.0.1:0".into(),
            size: 64 * CHUNK,
            token: None,
            huge_pages: false,
            transport: rmemfs_common::fabric::Transport::Tcp,
            poll: std::time::Duration::ZERO,
            lease: memnode::DEFAULT_LEASE,
            session_grace: memnode::DEFAULT_SESSION_GRACE,
            memory_file: None,
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
