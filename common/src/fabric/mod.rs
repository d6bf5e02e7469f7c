//! The fabric: a transport shaped like an RDMA RC queue pair.
//!
//! An [`Endpoint`] is the active (client) side of one connection to a memnode. It offers
//! exactly what a reliable-connected queue pair offers and nothing more:
//!
//! - one-sided `READ`/`WRITE` against `(remote addr, rkey)` ([`RdmaOp`]); many may be
//!   outstanding on one connection at once ([`Endpoint::execute`] posts a whole batch
//!   before waiting), and each completes with success or a remote access error;
//! - two-sided `SEND`/`RECV` for small control frames ([`Endpoint::call`]).
//!
//! Every operation has a deadline: a peer that stops answering turns into
//! [`FabricError::Timeout`], a peer that goes away into [`FabricError::Disconnected`];
//! nothing waits forever.
//!
//! Backends: [`tcp`] (this module tree) runs the same semantics over TCP for hosts
//! without RDMA; the memnode side executes READ/WRITE against its region through a
//! [`MemoryTarget`] that makes the rkey and bounds checks a NIC makes.

use std::time::Duration;
use thiserror::Error;

pub mod fault;
pub mod tcp;

/// A location in a memnode's memory: an address inside an allocation, and the rkey
/// that allocation was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteAddr {
    pub addr: u64,
    pub rkey: u32,
}

/// One one-sided operation. `Read` fills `local` from remote memory; `Write` copies
/// `local` to remote memory. The length is the local buffer's length.
#[derive(Debug)]
pub enum RdmaOp<'a> {
    Read {
        local: &'a mut [u8],
        remote: RemoteAddr,
    },
    Write {
        local: &'a [u8],
        remote: RemoteAddr,
    },
}

impl RdmaOp<'_> {
    pub fn len(&self) -> usize {
        match self {
            RdmaOp::Read { local, .. } => local.len(),
            RdmaOp::Write { local, .. } => local.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn remote(&self) -> RemoteAddr {
        match self {
            RdmaOp::Read { remote, .. } | RdmaOp::Write { remote, .. } => *remote,
        }
    }
}

/// Largest single READ or WRITE a backend accepts.
pub const MAX_DATA_OP: usize = 16 << 20;

/// Why a fabric operation failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum FabricError {
    /// The remote side refused the access: unknown rkey, an address outside the
    /// allocation, or an allocation that is not the caller's. Like a NIC's remote
    /// access error, nothing was read or written.
    #[error("remote access error at {addr:#x} (rkey {rkey:#x}, {len} bytes)")]
    RemoteAccess { addr: u64, rkey: u32, len: usize },
    /// The remote side refused the request as malformed (e.g. too long).
    #[error("remote rejected the request: {0}")]
    BadRequest(String),
    /// No completion arrived within the deadline.
    #[error("no completion from {peer} within {after:?}")]
    Timeout { peer: String, after: Duration },
    /// The connection is gone; every outstanding and later operation fails with this.
    #[error("connection to {peer} lost: {reason}")]
    Disconnected { peer: String, reason: String },
    /// Connection setup failed.
    #[error("cannot connect to {peer}: {reason}")]
    Connect { peer: String, reason: String },
    /// A local argument was out of range (e.g. an operation larger than MAX_DATA_OP).
    #[error("invalid operation: {0}")]
    Invalid(String),
}

impl FabricError {
    /// True for errors after which the connection cannot be used again.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            FabricError::Disconnected { .. } | FabricError::Connect { .. }
        )
    }
}

/// The active side of one connection to a memnode (an RC queue pair's worth of
/// semantics). Implementations are thread-safe: several threads may post at once.
pub trait Endpoint: Send + Sync {
    /// Posts every operation in `ops` (all outstanding together), waits for all of
    /// their completions and returns one result per operation, in order.
    fn execute(&self, ops: &mut [RdmaOp<'_>]) -> Vec<Result<(), FabricError>>;

    /// SENDs one control frame and RECVs the peer's reply frame.
    fn call(&self, frame: &[u8]) -> Result<Vec<u8>, FabricError>;

    /// The peer's address, for messages.
    fn peer(&self) -> &str;

    /// False once the connection is known to be gone.
    fn is_connected(&self) -> bool;
}

/// Why the passive side refused a one-sided access.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum AccessError {
    #[error("no allocation has this rkey")]
    UnknownKey,
    #[error("the allocation belongs to another client")]
    NotOwner,
    #[error("the range is outside the allocation")]
    OutOfBounds,
    #[error("the connection has not said hello")]
    NotAuthenticated,
}

/// What the passive side exposes to a backend's one-sided path: the memory a NIC
/// would serve, with the checks a NIC makes (rkey known, range inside the allocation,
/// allocation owned by the connection's client).
pub trait MemoryTarget: Send + Sync {
    fn read(&self, client: u64, addr: u64, rkey: u32, dst: &mut [u8]) -> Result<(), AccessError>;
    fn write(&self, client: u64, addr: u64, rkey: u32, src: &[u8]) -> Result<(), AccessError>;
}

/// Per-connection state the control handler keeps on the passive side.
#[derive(Debug)]
pub struct ConnectionState {
    /// Unique per accepted connection.
    pub conn_id: u64,
    /// Set by a successful Hello; one-sided access is refused until then.
    pub client: Option<u64>,
    /// The peer's address, for logs.
    pub peer: String,
}

/// What the control handler wants done after a request.
pub struct ControlReply {
    pub frame: Vec<u8>,
    /// Close the connection after sending `frame` (bad version, failed auth, ...).
    pub close: bool,
}

/// The passive side's two-sided path: handles control frames (SEND) and answers them.
/// It never sees one-sided traffic.
pub trait ControlHandler: Send + Sync {
    fn handle(&self, conn: &mut ConnectionState, frame: &[u8]) -> ControlReply;
    /// Called once when a connection ends, however it ends.
    fn disconnected(&self, conn: &ConnectionState);
}
