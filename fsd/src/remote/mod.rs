//! Remote memory as fsd sees it: the memnodes, their chunks, and block I/O.
//!
//! [`RemoteStore`] places blocks on memnodes and moves their bytes:
//!
//! - placement: blocks come from per-node [`BlockPool`]s; nodes are tried round-robin so
//!   files spread over all memnodes; a pool that runs dry gets a new chunk from its
//!   memnode (one control round trip per chunk, not per block). When every node is full
//!   the answer is [`RemoteError::NoSpace`].
//! - I/O: [`RemoteStore::execute`] takes a batch of block reads and writes, groups it
//!   by node and posts each group on one of that node's data connections, so a batch
//!   is outstanding at once.
//! - failure: a node whose connection breaks is marked down (logged once); every later
//!   operation on it fails at once instead of waiting. Timeouts come from the fabric.
//!
//! A block's location is a [`BlockLoc`]: which node, which address, which rkey.

mod pool;
mod refill;

use pool::BlockPool;
use rmemfs_common::control::{self, ControlError};
use rmemfs_common::fabric::{Endpoint, FabricError, RdmaOp, RemoteAddr};
use rmemfs_common::size::format_size;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use thiserror::Error;

/// Where one block lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockLoc {
    pub node: u16,
    pub remote: RemoteAddr,
}

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
}

/// Opens one connection to a memnode (backend-specific); used for every data and
/// control connection.
pub type Connector = dyn Fn(&str) -> Result<Box<dyn Endpoint>, FabricError> + Send + Sync;

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
}

/// One memnode: its connections, its chunks, whether it is alive.
struct Node {
    name: String,
    /// Data connections; operations are spread over them round-robin. The first also
    /// carries control calls.
    endpoints: Vec<Box<dyn Endpoint>>,
    next_endpoint: AtomicUsize,
    pool: Mutex<BlockPool>,
    capacity: u64,
    /// Set when the node refused an allocation for lack of space; cleared on a free.
    full: AtomicBool,
    down: Mutex<Option<String>>,
    refill: refill::Refill,
}

impl Node {
    fn endpoint(&self) -> &dyn Endpoint {
        let i = self.next_endpoint.fetch_add(1, Ordering::Relaxed) % self.endpoints.len();
        self.endpoints[i].as_ref()
    }

    fn control(&self) -> &dyn Endpoint {
        self.endpoints[0].as_ref()
    }

    fn down_error(&self) -> Option<RemoteError> {
        lock(&self.down)
            .as_ref()
            .map(|reason| RemoteError::NodeDown {
                node: self.name.clone(),
                reason: reason.clone(),
            })
    }

    /// Records a fatal fabric error: the node is down from now on.
    fn note_failure(&self, e: &FabricError) {
        if e.is_fatal() {
            let mut down = lock(&self.down);
            if down.is_none() {
                log::error!("memnode {} is down: {e}", self.name);
                *down = Some(e.to_string());
            }
        }
    }

    fn fabric_error(&self, e: FabricError) -> RemoteError {
        self.note_failure(&e);
        RemoteError::Fabric {
            node: self.name.clone(),
            error: e,
        }
    }

    fn control_error(&self, e: ControlError) -> RemoteError {
        if let ControlError::Fabric(f) = &e {
            self.note_failure(f);
        }
        RemoteError::Control {
            node: self.name.clone(),
            error: e,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Settings for [`RemoteStore::connect`].
pub struct RemoteConfig {
    pub block_size: u64,
    /// Preferred chunk size; smaller chunks are tried when a node is nearly full.
    pub chunk_size: u64,
    /// Data connections per memnode.
    pub connections: usize,
    pub client_id: u64,
    pub token: Vec<u8>,
}

/// Every memnode this fsd uses.
pub struct RemoteStore {
    nodes: Vec<Arc<Node>>,
    block_size: u64,
    chunk_size: u64,
    /// A take that leaves a node's pool with fewer free blocks asks for a chunk ahead.
    low_water: u64,
    next_node: AtomicUsize,
    pub counters: Arc<RemoteCounters>,
    refillers: Vec<std::thread::JoinHandle<()>>,
}

/// One block operation in a batch given to [`RemoteStore::execute`].
pub enum BlockIo<'a> {
    Read(BlockLoc, &'a mut [u8]),
    Write(BlockLoc, &'a [u8]),
}

impl BlockIo<'_> {
    fn node(&self) -> u16 {
        match self {
            BlockIo::Read(l, _) | BlockIo::Write(l, _) => l.node,
        }
    }
}

impl RemoteStore {
    /// Connects to every memnode (all must answer) and says hello on each connection.
    pub fn connect(
        memnodes: &[String],
        cfg: &RemoteConfig,
        connector: &Connector,
    ) -> Result<RemoteStore, RemoteError> {
        let mut nodes = Vec::new();
        for name in memnodes {
            let mut endpoints = Vec::new();
            let mut capacity = 0;
            for _ in 0..cfg.connections.max(1) {
                let ep = connector(name).map_err(|e| RemoteError::Fabric {
                    node: name.clone(),
                    error: e,
                })?;
                let welcome =
                    control::hello(ep.as_ref(), cfg.client_id, &cfg.token).map_err(|e| {
                        RemoteError::Control {
                            node: name.clone(),
                            error: e,
                        }
                    })?;
                capacity = welcome.capacity;
                endpoints.push(ep);
            }
            log::info!(
                "connected to memnode {name} ({} capacity, {} connections)",
                format_size(capacity),
                endpoints.len()
            );
            nodes.push(Arc::new(Node {
                name: name.clone(),
                endpoints,
                next_endpoint: AtomicUsize::new(0),
                pool: Mutex::new(BlockPool::new(cfg.block_size)),
                capacity,
                full: AtomicBool::new(false),
                down: Mutex::new(None),
                refill: refill::Refill::default(),
            }));
        }
        let chunk_size = cfg.chunk_size.max(cfg.block_size);
        // Half a chunk's worth of blocks left: time to ask for the next chunk.
        let low_water = (chunk_size / cfg.block_size / 2).max(1);
        let counters = Arc::new(RemoteCounters::default());
        let mut refillers = Vec::new();
        for node in &nodes {
            let t = refill::start(node, chunk_size, low_water, counters.clone()).map_err(|e| {
                RemoteError::Fabric {
                    node: node.name.clone(),
                    error: FabricError::Local(format!("cannot start a refill thread: {e}")),
                }
            })?;
            refillers.push(t);
        }
        Ok(RemoteStore {
            nodes,
            block_size: cfg.block_size,
            chunk_size,
            low_water,
            next_node: AtomicUsize::new(0),
            counters,
            refillers,
        })
    }

    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// Allocates one block, on the next node in turn that has room.
    pub fn alloc_block(&self) -> Result<BlockLoc, RemoteError> {
        let n = self.nodes.len();
        let start = self.next_node.fetch_add(1, Ordering::Relaxed);
        let mut last_err = RemoteError::NoSpace;
        for i in 0..n {
            let idx = (start + i) % n;
            match self.alloc_on(idx) {
                Ok(remote) => {
                    return Ok(BlockLoc {
                        node: idx as u16,
                        remote,
                    })
                }
                Err(RemoteError::NoSpace) => {}
                Err(e) => last_err = e,
            }
        }
        // Full everywhere reachable; if a node was unreachable say so only when no node
        // could have taken it for lack of space.
        match last_err {
            RemoteError::NoSpace => Err(RemoteError::NoSpace),
            e if self.nodes.iter().all(|n| n.down_error().is_some()) => Err(e),
            _ => Err(RemoteError::NoSpace),
        }
    }

    fn alloc_on(&self, idx: usize) -> Result<RemoteAddr, RemoteError> {
        let node = &self.nodes[idx];
        if let Some(e) = node.down_error() {
            return Err(e);
        }
        let mut pool = lock(&node.pool);
        if let Some(b) = pool.take() {
            if pool.free_blocks() < self.low_water && !node.full.load(Ordering::Relaxed) {
                node.refill.want();
            }
            return Ok(b);
        }
        if node.full.load(Ordering::Relaxed) {
            return Err(RemoteError::NoSpace);
        }
        self.counters
            .chunk_allocs_waited
            .fetch_add(1, Ordering::Relaxed);
        // Refill: the preferred chunk size, then halves of it down to one block, so the
        // last bytes of a nearly full memnode are still used.
        let mut size = self.chunk_size;
        loop {
            match control::alloc(node.control(), size) {
                Ok(a) => {
                    self.counters.chunk_allocs.fetch_add(1, Ordering::Relaxed);
                    log::debug!(
                        "memnode {}: new chunk {:#x}+{}",
                        node.name,
                        a.addr,
                        format_size(a.len)
                    );
                    pool.add_chunk(a);
                    return pool.take().ok_or(RemoteError::NoSpace);
                }
                Err(e) if e.is_no_space() && size > self.block_size => {
                    size = (size / 2).max(self.block_size);
                }
                Err(e) if e.is_no_space() => {
                    node.full.store(true, Ordering::Relaxed);
                    log::warn!("memnode {} is full", node.name);
                    return Err(RemoteError::NoSpace);
                }
                Err(e) => return Err(node.control_error(e)),
            }
        }
    }

    /// Gives blocks back to their pools; chunks that empty out go back to the memnode.
    pub fn free_blocks(&self, blocks: impl IntoIterator<Item = BlockLoc>) {
        for b in blocks {
            let Some(node) = self.nodes.get(b.node as usize) else {
                continue;
            };
            let (known, release) = lock(&node.pool).put(b.remote);
            if !known {
                log::error!("freeing unknown block {b:?}");
                continue;
            }
            node.full.store(false, Ordering::Relaxed);
            for chunk in release {
                self.free_chunk(node, chunk.addr, chunk.rkey);
            }
        }
    }

    fn free_chunk(&self, node: &Node, addr: u64, rkey: u32) {
        if node.down_error().is_some() {
            return;
        }
        match control::free(node.control(), addr, rkey) {
            Ok(()) => {
                self.counters.chunk_frees.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => log::warn!("{}", node.control_error(e)),
        }
    }

    /// Runs a batch of block reads and writes; all operations for one node are posted
    /// together. Returns one result per operation, in order.
    pub fn execute(&self, ios: &mut [BlockIo<'_>]) -> Vec<Result<(), RemoteError>> {
        let mut results: Vec<Result<(), RemoteError>> = ios.iter().map(|_| Ok(())).collect();
        let mut nodes: Vec<u16> = ios.iter().map(BlockIo::node).collect();
        nodes.sort_unstable();
        nodes.dedup();
        for node_idx in nodes {
            let Some(node) = self.nodes.get(node_idx as usize) else {
                continue;
            };
            let members: Vec<usize> = (0..ios.len())
                .filter(|&i| ios[i].node() == node_idx)
                .collect();
            if let Some(e) = node.down_error() {
                for &i in &members {
                    results[i] = Err(e.clone());
                }
                continue;
            }
            let mut ops: Vec<RdmaOp<'_>> = Vec::with_capacity(members.len());
            for io in ios.iter_mut().filter(|io| io.node() == node_idx) {
                let (ops_counter, bytes_counter) = match io {
                    BlockIo::Read(..) => (&self.counters.reads, &self.counters.read_bytes),
                    BlockIo::Write(..) => (&self.counters.writes, &self.counters.write_bytes),
                };
                ops_counter.fetch_add(1, Ordering::Relaxed);
                ops.push(match io {
                    BlockIo::Read(loc, buf) => {
                        bytes_counter.fetch_add(buf.len() as u64, Ordering::Relaxed);
                        RdmaOp::Read {
                            local: buf,
                            remote: loc.remote,
                        }
                    }
                    BlockIo::Write(loc, buf) => {
                        bytes_counter.fetch_add(buf.len() as u64, Ordering::Relaxed);
                        RdmaOp::Write {
                            local: buf,
                            remote: loc.remote,
                        }
                    }
                });
            }
            let outcomes = node.endpoint().execute(&mut ops);
            for (&i, outcome) in members.iter().zip(outcomes) {
                results[i] = outcome.map_err(|e| node.fabric_error(e));
            }
        }
        results
    }

    /// Capacity and free bytes over every node that is up: memory the memnodes have
    /// not handed out, plus blocks free in fsd's own chunks.
    pub fn space(&self) -> (u64, u64) {
        let mut total = 0;
        let mut free = 0;
        for node in &self.nodes {
            if node.down_error().is_some() {
                continue;
            }
            let local_free = lock(&node.pool).free_blocks() * self.block_size;
            match control::stat(node.control()) {
                Ok(s) => {
                    total += s.capacity;
                    free += s.capacity.saturating_sub(s.used) + local_free;
                }
                Err(e) => {
                    log::warn!("{}", node.control_error(e));
                }
            }
        }
        (total, free)
    }

    /// Total capacity as announced at hello, over all nodes.
    pub fn announced_capacity(&self) -> u64 {
        self.nodes.iter().map(|n| n.capacity).sum()
    }

    /// Gives every chunk back to the memnodes (at unmount).
    pub fn release_all(&self) {
        for node in &self.nodes {
            let chunks = lock(&node.pool).drain();
            for c in chunks {
                self.free_chunk(node, c.addr, c.rkey);
            }
        }
    }
}

/// Shared handle used across fsd.
pub type SharedRemote = Arc<RemoteStore>;

impl Drop for RemoteStore {
    fn drop(&mut self) {
        for node in &self.nodes {
            node.refill.stop();
        }
        for t in self.refillers.drain(..) {
            let _ = t.join();
        }
    }
}

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
        })
        .expect("memnode starts");
        let connect = |peer: &str| {
            Ok(Box::new(TcpEndpoint::connect(peer, Duration::from_secs(5))?) as Box<dyn Endpoint>)
        };
        let remote = RemoteStore::connect(
            &[node.local_addr().to_string()],
            &RemoteConfig {
                block_size: BS,
                chunk_size: CHUNK,
                connections: 1,
                client_id: 7,
                token: Vec::new(),
            },
            &connect,
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
    fn the_next_chunk_is_allocated_ahead_so_writes_do_not_wait_for_it() {
        let (_node, r) = store();
        // The first block has to wait for the first chunk.
        r.alloc_block().expect("first block");
        assert_eq!(allocs(&r), (1, 1));
        // Take blocks until the pool is below its low-water mark (half a chunk).
        let blocks = CHUNK / BS;
        for _ in 1..blocks / 2 + 1 {
            r.alloc_block().expect("block of the first chunk");
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
            r.alloc_block().expect("block");
            let deadline = Instant::now() + Duration::from_secs(10);
            while lock(&r.nodes[0].pool).free_blocks() == 0 {
                assert!(Instant::now() < deadline, "the pool stayed empty");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let (made, waited) = allocs(&r);
        assert_eq!(waited, 1, "only the very first chunk is waited for");
        assert!(made >= 5, "chunks allocated: {made}");
    }
}
