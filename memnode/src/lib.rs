//! memnode: lends one region of this host's memory to rmemfs clients (fsd).
//!
//! A [`Memnode`] reserves the region (`region`), keeps the books of who owns which
//! chunk of it (`allocator`, `pool`), and serves two paths over the fabric:
//!
//! - the one-sided path, what a NIC does: READ/WRITE straight against registered
//!   chunks after the rkey, owner and bounds checks. The memnode only registers each
//!   chunk with the fabric's memory registry (for its owner) and deregisters it on
//!   free; the backend does the rest (the NIC with verbs, the tcp server with tcp);
//! - the two-sided path (`control`): Hello, Alloc, Free, Stat and the volume
//!   requests, counted for the metrics (`counters`, `metrics`).
//!
//! Chunks are scratch memory of the client that allocated them (reclaimed when its
//! last connection closes) unless the client opened a **volume** (`volumes`): a
//! named set of chunks that belongs to the volume, survives disconnects, and is held
//! by one client at a time under a lease ([`MemnodeConfig::lease`]).
//!
//! Clients are of **tenants** (`tenants`, [`MemnodeConfig::tenants`]): a tenant's
//! sessions, memory and volumes are its own, within its quota (`quota`).
//!
//! Everything a client sends is checked before use; a misbehaving client is refused or
//! disconnected and cannot see or disturb another client's memory. Memory that is free
//! always reads as zero.
//!
//! fsd embeds a memnode in-process through this API; the `memnode` binary is the same
//! thing behind a command line.

mod allocator;
mod control;
mod counters;
#[cfg(feature = "test-support")]
pub mod liar;
mod memfile;
mod metrics;
mod pool;
mod quota;
mod reaper;
mod region;
mod saved;
pub mod tenants;
mod volumes;

pub use memfile::{MemoryFileConfig, MemoryFileError};
pub use metrics::{tenant_usage, MemnodeCollector, TenantUsage};
pub use region::RegionError;

use rmemfs_common::fabric::{self, ControlHandler, FabricError, Server, Transport};
use rmemfs_common::protocol::{NodeStats, VolumeSummary, MAX_TOKEN_LEN, MIN_TOKEN_LEN};
use rmemfs_common::size::format_size;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

/// The default [`MemnodeConfig::lease`] (the `memnode` binary's `--lease-secs`).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);

/// The default [`MemnodeConfig::session_grace`] (the `memnode` binary's
/// `--session-grace`): 15 minutes, longer than fsd's default dead time (10 minutes,
/// Ceph's `mon_osd_down_out_interval`), so an fsd that still counts on its copies
/// never finds them reclaimed; a client that died for good holds its memory that long.
pub const DEFAULT_SESSION_GRACE: Duration = Duration::from_secs(900);

/// How to start a memnode.
#[derive(Debug, Clone)]
pub struct MemnodeConfig {
    /// "host:port" to listen on; port 0 picks a free port (see [`Memnode::local_addr`]).
    pub listen: String,
    /// Bytes to lend, rounded down to whole pages.
    pub size: u64,
    /// When set, every client must prove it knows this token (`rmemfs_common::auth`):
    /// one tenant, "default". `None` (and no tenants file): no authentication (the
    /// binary allows that beyond loopback only with `--insecure`). Empty or shorter
    /// than `MIN_TOKEN_LEN`: refused.
    pub token: Option<Vec<u8>>,
    /// A tenants file (`--tenants`, see `tenants.rs`): each tenant's token and
    /// quota. Not with `token`.
    pub tenants: Option<std::path::PathBuf>,
    /// Try 2 MiB huge pages (falls back to normal pages with a warning).
    pub huge_pages: bool,
    /// The fabric backend to serve on (`Auto`: verbs when there is an RDMA device).
    pub transport: Transport,
    /// How long a tcp connection thread polls for a client's next request before it
    /// sleeps ([`rmemfs_common::fabric::bind`]).
    pub poll: std::time::Duration,
    /// How long a volume's holder keeps it against other clients without sending a
    /// request (fsd's heartbeat is a Stat a second). After that another client's
    /// open takes the volume over and fences the holder. [`DEFAULT_LEASE`] is 10 s.
    pub lease: Duration,
    /// How long a client's session (its scratch memory, its hold on a volume) is kept
    /// after its last connection closed, for the client to reconnect and resume it
    /// (a network blip is not a departure). Zero: reclaimed at once.
    /// [`DEFAULT_SESSION_GRACE`] is 15 minutes.
    pub session_grace: Duration,
    /// Keep the region and the books in this file (`--memory-file`), so that a
    /// restart of the process comes back as the same instance with every chunk,
    /// session and volume (see `memfile.rs`). `None`: anonymous memory, a restart
    /// is a new instance.
    pub memory_file: Option<MemoryFileConfig>,
    /// Caps and deadlines of the fabric's connections (`--hello-timeout`,
    /// `--frame-timeout`): what keeps anyone who reaches the port from shutting the
    /// clients out. [`fabric::ConnectionLimits::default`] for a memnode.
    pub connections: fabric::ConnectionLimits,
}

/// Why a memnode could not start.
#[derive(Debug, Error)]
pub enum MemnodeError {
    #[error("the token is {len} bytes; at most {MAX_TOKEN_LEN} are taken")]
    TokenTooLong { len: usize },
    /// An empty token would mean no authentication while looking like one.
    #[error("the token is empty; give one of at least {MIN_TOKEN_LEN} bytes (an empty RMEMFS_TOKEN counts), or none")]
    TokenEmpty,
    #[error("the token is {len} bytes; a token of fewer than {MIN_TOKEN_LEN} is too easily guessed (e.g. head -c 32 /dev/urandom | base64)")]
    TokenTooShort { len: usize },
    /// The tenants file cannot be used (the message names it, the tenant, the field).
    #[error("{0}")]
    Tenants(String),
    #[error(transparent)]
    Region(#[from] RegionError),
    #[error(transparent)]
    MemoryFile(#[from] MemoryFileError),
    /// The books a memory file saved do not fit its region.
    #[error("memory file {path}: its books do not fit its region ({why}); refusing to serve from it (--memory-file-reset starts it empty, losing what it held)")]
    Books { path: String, why: String },
    /// The transport asked for cannot be used here (verbs without an RDMA device).
    #[error("cannot use the {transport} transport: {error}")]
    Transport {
        transport: Transport,
        error: FabricError,
    },
    /// The fabric could not bind the listen address (the message names it).
    #[error("{0}")]
    Bind(FabricError),
    #[error("cannot start serving: {0}")]
    Serve(std::io::Error),
    #[error("no randomness for the node id: {0}")]
    Random(String),
}

/// A running memnode: listening, serving connections on background threads.
/// Shut down by [`Memnode::shutdown`] or on drop.
pub struct Memnode {
    server: Box<dyn Server>,
    control: Arc<control::ControlService>,
    transport: Transport,
    transport_choice: String,
    reaper: Option<reaper::Reaper>,
}

impl std::fmt::Debug for Memnode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memnode")
            .field("addr", &self.server.local_addr())
            .field("transport", &self.transport)
            .field("node_id", &self.control.node_id())
            .finish_non_exhaustive()
    }
}

impl Memnode {
    /// Picks the transport, binds the listener, reserves the region and starts
    /// serving in the background.
    pub fn start(cfg: MemnodeConfig) -> Result<Memnode, MemnodeError> {
        Memnode::start_wrapped(cfg, |control| control)
    }

    /// As [`Memnode::start`], serving control frames through what `wrap` makes of
    /// the control service: a test's memnode that tells its clients what cannot be
    /// (`liar.rs`).
    pub fn start_wrapped(
        cfg: MemnodeConfig,
        wrap: impl FnOnce(Arc<dyn ControlHandler>) -> Arc<dyn ControlHandler>,
    ) -> Result<Memnode, MemnodeError> {
        let token = cfg.token;
        if let Some(t) = &token {
            if t.is_empty() {
                return Err(MemnodeError::TokenEmpty);
            }
            if t.len() < MIN_TOKEN_LEN {
                return Err(MemnodeError::TokenTooShort { len: t.len() });
            }
            if t.len() > MAX_TOKEN_LEN {
                return Err(MemnodeError::TokenTooLong { len: t.len() });
            }
        }
        let tenants = match (&cfg.tenants, &token) {
            (Some(_), Some(_)) => {
                return Err(MemnodeError::Tenants(
                    "a tenants file and a token cannot be used together: the file gives each tenant its token".into(),
                ))
            }
            (Some(path), None) => tenants::Tenants::load(path).map_err(MemnodeError::Tenants)?,
            (None, Some(t)) => tenants::Tenants::single(t),
            (None, None) => tenants::Tenants::open(),
        };
        let transport = cfg
            .transport
            .resolve()
            .map_err(|error| MemnodeError::Transport {
                transport: cfg.transport,
                error,
            })?;
        let mut transport_choice = transport.describe_choice();
        log::info!("transport {transport_choice}");
        let mut listener = fabric::bind_with(transport, &cfg.listen, cfg.poll, cfg.connections)
            .map_err(MemnodeError::Bind)?;
        let share = sharing(cfg.transport, transport, cfg.tenants.is_some())?;
        let (region, file) = match &cfg.memory_file {
            None if share => (
                region::Region::reserve_shareable(cfg.size, cfg.huge_pages)?,
                None,
            ),
            None => (region::Region::reserve(cfg.size, cfg.huge_pages)?, None),
            Some(mf) => {
                if cfg.huge_pages {
                    log::warn!("--huge-pages is ignored with a memory file: its filesystem decides the pages (hugetlbfs: huge)");
                }
                // The address bound, not the one asked for: a memnode asked for port 0
                // made its clients hold memory of the port it got.
                let bound = listener.local_addr().to_string();
                let opened = memfile::MemoryFile::open(mf, cfg.size, &bound)?;
                (
                    opened.region,
                    Some((opened.file, opened.node_id, opened.boot, opened.saved)),
                )
            }
        };
        if share && share_region(listener.as_mut(), &region, cfg.transport)? {
            transport_choice.push_str(", its region mapped by clients on this host");
        }
        let region = Arc::new(region);
        let pool = Arc::new(pool::ChunkPool::new(region.clone(), listener.registry()));
        let node_id = match &file {
            Some((_, id, _, _)) => *id,
            None => random_node_id()?,
        };
        let tenant_count = tenants.len();
        let open = tenants.is_open();
        let mut control = control::ControlService::new(
            pool,
            Arc::new(tenants),
            node_id,
            cfg.lease,
            cfg.session_grace,
        );
        if let Some((mf, _, boot, saved)) = file {
            let path = mf.path().display().to_string();
            control = control.with_memory_file(mf, boot);
            match saved {
                None => log::info!("memory file {path}: made anew, empty"),
                Some(saved) => {
                    let r = control.restore(&saved).map_err(|why| MemnodeError::Books {
                        path: path.clone(),
                        why,
                    })?;
                    log::info!(
                        "memory file {path}: restarted as the same memnode (start {boot}): {} sessions, {} volumes, {} chunks ({}) kept{}",
                        r.sessions,
                        r.volumes,
                        r.chunks,
                        format_size(r.bytes),
                        if r.freed > 0 {
                            format!(", {} chunks of ended sessions freed", r.freed)
                        } else {
                            String::new()
                        }
                    );
                }
            }
        }
        let control = Arc::new(control);
        let reaper = reaper::Reaper::start(control.clone()).map_err(MemnodeError::Serve)?;
        let server = listener
            .serve(wrap(control.clone()))
            .map_err(MemnodeError::Serve)?;
        log::info!(
            "memnode {node_id:016x} lending {} ({} pages{}) on {} over {transport}{}",
            format_size(region.len()),
            format_size(region.granularity()),
            if region.huge_pages() { ", huge" } else { "" },
            server.local_addr(),
            match (open, cfg.tenants.is_some()) {
                (true, _) => ", NO TOKEN: any client that reaches it is let in".to_string(),
                (false, false) => ", token required".into(),
                (false, true) => format!(", {tenant_count} tenants"),
            }
        );
        Ok(Memnode {
            server,
            control,
            transport,
            transport_choice,
            reaper: Some(reaper),
        })
    }

    /// The address actually listened on.
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// The backend actually serving (never `Auto`).
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// The backend and why it was chosen, e.g. `tcp (no RDMA device: ...)`.
    pub fn transport_choice(&self) -> &str {
        &self.transport_choice
    }

    /// Capacity and current usage.
    pub fn stats(&self) -> NodeStats {
        self.control.stats()
    }

    /// Every volume, in name order.
    pub fn volumes(&self) -> Vec<VolumeSummary> {
        self.control.volumes_summary()
    }

    /// The memnode's metrics (`memnode_...`), read whenever they are scraped.
    pub fn collector(&self) -> MemnodeCollector {
        MemnodeCollector {
            control: self.control.clone(),
        }
    }

    /// Sessions kept through their grace period, with no connection now.
    pub fn idle_sessions(&self) -> usize {
        self.control.idle_sessions()
    }

    /// Stops accepting and closes every connection. Idempotent.
    pub fn shutdown(&mut self) {
        self.server.shutdown();
        self.reaper.take();
    }
}

impl Drop for Memnode {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A random non-zero node id.
pub(crate) fn random_node_id() -> Result<u64, MemnodeError> {
    loop {
        match getrandom::u64() {
            Ok(0) => continue,
            Ok(id) => return Ok(id),
            Err(e) => return Err(MemnodeError::Random(e.to_string())),
        }
    }
}

/// Whether the region is shared by mapping with clients on this host: always with
/// `--transport mapped` (refused with a tenants file), by default when `auto` came
/// down to tcp and no tenants file divides the region, never with `tcp` or `verbs`.
///
/// The trust boundary: a client given the region's descriptor can reach all of it
/// (the grants it checks are kept by its own code), so only processes of the
/// memnode's own user, or root, get it; they could read the memnode's memory
/// through /proc anyway. Tenants are kept apart by rkeys, which a mapping does not
/// enforce, so a memnode with a tenants file shares nothing.
fn sharing(asked: Transport, resolved: Transport, tenants: bool) -> Result<bool, MemnodeError> {
    match (asked, resolved) {
        (Transport::Mapped, _) if tenants => Err(MemnodeError::Transport {
            transport: asked,
            error: FabricError::Invalid(
                "a mapping reaches the whole region, so it cannot keep tenants apart; \
                 use tcp with a tenants file"
                    .into(),
            ),
        }),
        (Transport::Mapped, _) => Ok(true),
        (Transport::Auto, Transport::Tcp) => Ok(!tenants),
        _ => Ok(false),
    }
}

/// Offers `region` by mapping on `listener`; whether it is. Fatal with `--transport
/// mapped`; with `auto`, a warning, and clients on this host use tcp.
fn share_region(
    listener: &mut dyn fabric::Listener,
    region: &region::Region,
    asked: Transport,
) -> Result<bool, MemnodeError> {
    let shared = match region.shared_file() {
        Some(Ok((fd, offset))) => listener.share_region(fabric::mapped::offer::SharedRegion {
            fd,
            offset,
            base: region.base(),
            len: region.len(),
        }),
        Some(Err(e)) => Err(FabricError::Local(format!(
            "cannot share the region's file: {e}"
        ))),
        None => Err(FabricError::Local("the region is not a file".into())),
    };
    match shared {
        Ok(()) => {
            log::info!("clients of this user on this host map the region (the mapped fabric)");
            Ok(true)
        }
        Err(error) if asked == Transport::Mapped => Err(MemnodeError::Transport {
            transport: asked,
            error,
        }),
        Err(e) => {
            log::warn!("the region is not shared by mapping ({e}); clients on this host use tcp");
            Ok(false)
        }
    }
}
