//! memnode: lends one region of this host's memory to rmemfs clients (fsd).
//!
//! A [`Memnode`] reserves the region (`region`), keeps the books of who owns which
//! chunk of it (`allocator`, `pool`), and serves two paths over the fabric:
//!
//! - the one-sided path (`access`), what a NIC does: READ/WRITE straight against
//!   the region after the rkey, owner and bounds checks;
//! - the two-sided path (`control`): Hello, Alloc, Free and Stat.
//!
//! The paths share only the grant table (rkey -> chunk). Everything a client sends is
//! checked before use; a misbehaving client is refused or disconnected and cannot see
//! or disturb another client's memory. Memory that is free always reads as zero.
//!
//! fsd embeds a memnode in-process through this API; the `memnode` binary is the same
//! thing behind a command line.

#![deny(clippy::undocumented_unsafe_blocks)]

mod access;
mod allocator;
mod control;
mod pool;
mod region;

pub use region::RegionError;

use rmemfs_common::fabric::tcp::TcpServer;
use rmemfs_common::protocol::{NodeStats, MAX_TOKEN_LEN};
use rmemfs_common::size::format_size;
use std::net::SocketAddr;
use std::sync::Arc;
use thiserror::Error;

/// How to start a memnode.
#[derive(Debug, Clone)]
pub struct MemnodeConfig {
    /// "host:port" to listen on; port 0 picks a free port (see [`Memnode::local_addr`]).
    pub listen: String,
    /// Bytes to lend, rounded down to whole pages.
    pub size: u64,
    /// When set, every client's Hello must carry this token.
    pub token: Option<Vec<u8>>,
    /// Try 2 MiB huge pages (falls back to normal pages with a warning).
    pub huge_pages: bool,
}

/// Why a memnode could not start.
#[derive(Debug, Error)]
pub enum MemnodeError {
    #[error("the token is {len} bytes; the protocol carries at most {MAX_TOKEN_LEN}")]
    TokenTooLong { len: usize },
    #[error(transparent)]
    Region(#[from] RegionError),
    #[error("cannot listen on {listen}: {source}")]
    Listen {
        listen: String,
        #[source]
        source: std::io::Error,
    },
    #[error("no randomness for the node id: {0}")]
    Random(String),
}

/// A running memnode: listening, serving connections on background threads.
/// Shut down by [`Memnode::shutdown`] or on drop.
pub struct Memnode {
    server: TcpServer,
    control: Arc<control::ControlService>,
}

impl std::fmt::Debug for Memnode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memnode")
            .field("addr", &self.server.local_addr())
            .field("node_id", &self.control.node_id())
            .finish_non_exhaustive()
    }
}

impl Memnode {
    /// Reserves the region, binds the listener and starts serving in the background.
    pub fn start(cfg: MemnodeConfig) -> Result<Memnode, MemnodeError> {
        let token = cfg.token.filter(|t| !t.is_empty());
        if let Some(t) = &token {
            if t.len() > MAX_TOKEN_LEN {
                return Err(MemnodeError::TokenTooLong { len: t.len() });
            }
        }
        let region = Arc::new(region::Region::reserve(cfg.size, cfg.huge_pages)?);
        let grants = Arc::new(access::GrantTable::default());
        let target = Arc::new(access::RegionTarget::new(region.clone(), grants.clone()));
        let pool = Arc::new(pool::ChunkPool::new(region.clone(), grants));
        let node_id = random_node_id()?;
        let control = Arc::new(control::ControlService::new(pool, token.clone(), node_id));
        let server = TcpServer::start(&cfg.listen, target, control.clone()).map_err(|source| {
            MemnodeError::Listen {
                listen: cfg.listen.clone(),
                source,
            }
        })?;
        log::info!(
            "memnode {node_id:016x} lending {} ({} pages{}) on {}{}",
            format_size(region.len()),
            format_size(region.granularity()),
            if region.huge_pages() { ", huge" } else { "" },
            server.local_addr(),
            if token.is_some() {
                ", token required"
            } else {
                ""
            }
        );
        Ok(Memnode { server, control })
    }

    /// The address actually listened on.
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// Capacity and current usage.
    pub fn stats(&self) -> NodeStats {
        self.control.stats()
    }

    /// Stops accepting and closes every connection. Idempotent.
    pub fn shutdown(&mut self) {
        self.server.shutdown();
    }
}

impl Drop for Memnode {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A random non-zero node id.
fn random_node_id() -> Result<u64, MemnodeError> {
    loop {
        match getrandom::u64() {
            Ok(0) => continue,
            Ok(id) => return Ok(id),
            Err(e) => return Err(MemnodeError::Random(e.to_string())),
        }
    }
}
