//! The two-sided path: control requests (SEND) from clients, answered with one reply
//! each. This is the only code that parses control frames; it never sees READ/WRITE.
//!
//! Sessions: a connection is anonymous until its `Hello` (its token finds its tenant,
//! see `tenants.rs`; no token at all admits anyone as the one open tenant) names a
//! client id; anything
//! else before that, a bad token, a frame in another protocol version or a frame that
//! does not decode is answered with an error and the connection is closed. After
//! Hello the connection may Alloc, Free, Stat and use volumes; errors there are
//! replies only. Every request of an authenticated connection counts as hearing from
//! its client (the lease of a volume holder, see `volumes.rs`).
//!
//! Tenants: a session is its tenant's, and so are its scratch chunks and the volumes
//! it makes; a tenant sees, opens, takes over and destroys its own volumes only. What
//! each tenant holds is charged against its quota before memory is booked
//! (`tenancy.rs`).
//!
//! The jobs are in the submodules: `dispatch` (the way in: decoding, the Hello gate,
//! routing, saving the books), `session` (Hello, sessions and their reclaim),
//! `alloc` (Alloc and Free), `volume` (the volume requests), `reply` (answers and
//! error codes), `tenancy` (quotas and usage per tenant) and `saved_books` (the
//! books on a memory file). This file holds the service's state and what reads it.
//!
//! Lock order: `clients` (the sessions), then `volumes`, then `heard`; the pool's locks and the
//! registry (inside pool calls) come after any of them. `heard`, `client_tenants`
//! and `ledger` are leaves: nothing is called while one is held. Hello and the last-connection reclaim both run under
//! `clients`, so a client reconnecting while it is being reclaimed never loses a
//! chunk it allocates anew. Every volume change (and a bound client's Alloc and Free)
//! runs under `volumes`, so the volume table and the pool's registrations of volume
//! chunks change together. A scratch Alloc runs outside `volumes` and checks again
//! under it afterwards, so a chunk that raced a VolumeOpen of the same client is
//! taken back rather than left beside the volume.

mod alloc;
mod dispatch;
mod reply;
mod saved_books;
mod session;
mod tenancy;
mod volume;

pub use tenancy::TenantView;

use crate::counters::ControlCounters;
use crate::memfile::MemoryFile;
use crate::pool::ChunkPool;
use crate::quota::Ledger;
use crate::tenants::{TenantId, Tenants};
use crate::volumes::VolumeTable;
use rmemfs_common::protocol::{NodeStats, SessionSecret, VolumeSummary};
use rmemfs_common::sync::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub struct ControlService {
    pool: Arc<ChunkPool>,
    /// Who may connect, and each one's quota.
    tenants: Arc<Tenants>,
    /// What each tenant holds (see `tenancy.rs`).
    ledger: Mutex<Ledger>,
    node_id: u64,
    /// How long a volume holder stays live without being heard from.
    lease: Duration,
    /// How long a session whose connections all closed keeps its memory.
    grace: Duration,
    /// The sessions, by client id: connected ones and those in their grace period.
    clients: Mutex<HashMap<u64, Session>>,
    volumes: Mutex<VolumeTable>,
    /// When each connected client last sent a request.
    heard: Mutex<HashMap<u64, Instant>>,
    /// The tenant of each client with a session, as every request reads it: a leaf,
    /// filled from `clients` on first use (see `tenancy.rs`).
    client_tenants: Mutex<HashMap<u64, TenantId>>,
    /// Requests served and refused (metrics).
    pub counters: ControlCounters,
    /// The memory file the books are saved to after every change (`None`: memory
    /// only). See `saved_books.rs`.
    store: Option<Mutex<MemoryFile>>,
    /// How many times this instance started before on its memory file (0 without
    /// one): a client that resumes a session sees its chunks' rkeys changed when it
    /// differs from the boot it knew.
    boot: u64,
    /// The books fill most of their slot in the memory file: what would grow them is
    /// refused (an atomic, read without the store's lock).
    books_full: std::sync::atomic::AtomicBool,
}

/// What the memnode knows of one client between its connections.
struct Session {
    secret: SessionSecret,
    /// The tenant whose token started it; every later Hello of it must be too.
    tenant: TenantId,
    /// Live authenticated connections.
    connections: usize,
    /// When the last connection closed (`None` while one is open): the grace period
    /// runs from here.
    idle_since: Option<Instant>,
    /// The client said `SessionEnd`: no grace period.
    ending: bool,
    /// Put back by a restart on the memory file: its chunks are registered when
    /// its first Hello comes (see `saved_books.rs`).
    unregistered: bool,
}

/// A volume name for logs.
fn show(name: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(name))
}

impl ControlService {
    /// `tenants`: whose token a Hello must carry, and their quotas. `lease`: how long
    /// a volume holder that sends nothing keeps its volume against other clients.
    /// `grace`: how long a session whose connections all closed keeps its memory for
    /// a reconnect.
    pub fn new(
        pool: Arc<ChunkPool>,
        tenants: Arc<Tenants>,
        node_id: u64,
        lease: Duration,
        grace: Duration,
    ) -> ControlService {
        ControlService {
            pool,
            ledger: Mutex::new(Ledger::new(tenants.len())),
            tenants,
            node_id,
            lease,
            grace,
            clients: Mutex::new(HashMap::new()),
            volumes: Mutex::new(VolumeTable::new()),
            heard: Mutex::new(HashMap::new()),
            client_tenants: Mutex::new(HashMap::new()),
            counters: ControlCounters::default(),
            store: None,
            boot: 0,
            books_full: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Saves the books to `file` after every change from now on; `boot` is what
    /// Welcome says.
    pub fn with_memory_file(mut self, file: MemoryFile, boot: u64) -> ControlService {
        self.store = Some(Mutex::new(file));
        self.boot = boot;
        self
    }

    // Sessions are updated in single statements, so poisoning is ignored.
    fn clients(&self) -> MutexGuard<'_, HashMap<u64, Session>> {
        lock(&self.clients)
    }

    // The table's methods leave it consistent at every return, and the pool calls
    // made under this lock do not panic on client input; poisoning is ignored.
    fn volumes(&self) -> MutexGuard<'_, VolumeTable> {
        lock(&self.volumes)
    }

    fn heard(&self) -> MutexGuard<'_, HashMap<u64, Instant>> {
        lock(&self.heard)
    }

    /// How long ago `client` last sent a request; `None` when it is not connected.
    fn last_heard(&self, client: u64) -> Option<Duration> {
        self.heard().get(&client).map(Instant::elapsed)
    }

    /// Every volume of every tenant, by tenant and name.
    pub fn volumes_summary(&self) -> Vec<VolumeSummary> {
        self.volumes()
            .summaries()
            .into_iter()
            .map(|(_, v)| v)
            .collect()
    }

    /// Every volume with its tenant, by tenant and name.
    pub fn volumes_by_tenant(&self) -> Vec<(TenantId, VolumeSummary)> {
        self.volumes().summaries()
    }

    /// Authenticated connections open now.
    pub fn connections(&self) -> usize {
        self.clients().values().map(|s| s.connections).sum()
    }

    /// Sessions with no connection, kept through their grace period.
    pub fn idle_sessions(&self) -> usize {
        self.clients()
            .values()
            .filter(|s| s.connections == 0)
            .count()
    }

    pub fn node_id(&self) -> u64 {
        self.node_id
    }

    pub fn stats(&self) -> NodeStats {
        let clients = self
            .clients()
            .values()
            .filter(|s| s.connections > 0)
            .count();
        let usage = self.pool.usage();
        NodeStats {
            capacity: usage.capacity,
            used: usage.used,
            clients: u32::try_from(clients).unwrap_or(u32::MAX),
            allocations: u32::try_from(usage.chunks).unwrap_or(u32::MAX),
        }
    }
}

#[cfg(test)]
mod tests;
