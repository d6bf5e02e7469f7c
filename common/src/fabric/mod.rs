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
//! On the passive side (memnode) a backend is bound first ([`bind`] gives a
//! [`Listener`]), which yields the [`MemoryRegistry`]: what the memnode registers its
//! chunks with, so that one-sided access under each chunk's rkey becomes possible (and
//! stops again when the chunk is deregistered). Serving then starts with a
//! [`ControlHandler`] for the two-sided path.
//!
//! Backends ([`Transport`]): `verbs` (rdma-sys: RC queue pairs, memory regions, the NIC
//! does the one-sided path) and `tcp`, the same semantics over TCP for hosts without
//! RDMA (the server thread plays the NIC, with the same rkey, owner and bounds checks).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

pub mod fault;
pub mod mapped;
pub mod tcp;
#[cfg(feature = "verbs")]
pub mod verbs;

/// A location in a memnode's memory: an address inside an allocation, and the rkey
/// that allocation was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteAddr {
    pub addr: u64,
    pub rkey: u32,
}

impl RemoteAddr {
    /// The address `bytes` further on, in the same region.
    pub fn offset(self, bytes: usize) -> RemoteAddr {
        RemoteAddr {
            addr: self.addr + bytes as u64,
            rkey: self.rkey,
        }
    }
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
    /// The same operation on the same buffer, borrowed for a shorter time (to post it
    /// again after a failed attempt).
    pub fn reborrow(&mut self) -> RdmaOp<'_> {
        match self {
            RdmaOp::Read { local, remote } => RdmaOp::Read {
                local,
                remote: *remote,
            },
            RdmaOp::Write { local, remote } => RdmaOp::Write {
                local,
                remote: *remote,
            },
        }
    }

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
    /// The verbs backend was asked for but this host has no usable RDMA device.
    #[error("no RDMA device: {0}")]
    NoDevice(String),
    /// A local verbs resource (protection domain, memory registration, queue pair,
    /// completion queue) could not be set up.
    #[error("{0}")]
    Local(String),
}

impl FabricError {
    /// True for errors after which the connection cannot be used again.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            FabricError::Disconnected { .. }
                | FabricError::Connect { .. }
                | FabricError::NoDevice(_)
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

    /// A hint, true while another caller has the connection to itself, so a caller
    /// with several connections can pick an idle one. Backends whose connections
    /// take calls from many threads at once are never busy.
    fn is_busy(&self) -> bool {
        false
    }

    /// Called once the Hello on this connection has succeeded (the peer proved
    /// itself): the mapped backend asks for the memnode's region here. Others have
    /// nothing to do.
    fn after_hello(&self) -> Result<(), FabricError> {
        Ok(())
    }

    /// True when READ and WRITE are copies into a mapping of the memnode's region
    /// (the mapped backend, once [`Endpoint::after_hello`] mapped it).
    fn is_mapped(&self) -> bool {
        false
    }
}

/// The passive side's memory registration, what `ibv_reg_mr` is on a NIC: a range of
/// this process's memory becomes reachable by one-sided READ/WRITE from the
/// connections of one client (`owner`, the id its Hello carried), under a fresh rkey.
pub trait MemoryRegistry: Send + Sync {
    /// Registers `[addr, addr + len)` for remote READ and WRITE by `owner`'s
    /// connections and returns its rkey.
    ///
    /// # Safety
    /// The range must be memory of this process, mapped readable and writable, and
    /// stay so until [`MemoryRegistry::deregister`] of the returned rkey has returned:
    /// the backend reads and writes it at any time until then.
    unsafe fn register(&self, owner: u64, addr: u64, len: u64) -> Result<u32, FabricError>;

    /// Revokes a registration. When it returns no access under `rkey` is in flight and
    /// none can start. Unknown rkeys are ignored.
    fn deregister(&self, rkey: u32);
}

/// A bound passive side: its address is taken and its memory registry exists, but no
/// connection is served until [`Listener::serve`].
pub trait Listener: Send {
    fn local_addr(&self) -> SocketAddr;
    fn registry(&self) -> Arc<dyn MemoryRegistry>;
    /// Offers `region` (memory of this process that is a shared mapping of a file)
    /// to clients on this host, by mapping (the mapped backend). Before anything is
    /// registered. Backends that cannot say so.
    fn share_region(&mut self, region: mapped::offer::SharedRegion) -> Result<(), FabricError> {
        let _ = region;
        Err(FabricError::Invalid(
            "this transport cannot share memory by mapping".into(),
        ))
    }
    /// Starts accepting and serving connections on background threads.
    fn serve(self: Box<Self>, control: Arc<dyn ControlHandler>)
        -> std::io::Result<Box<dyn Server>>;
}

/// A serving passive side. Dropping it shuts it down.
pub trait Server: Send {
    fn local_addr(&self) -> SocketAddr;
    /// Stops accepting, closes every connection and waits until every connection's
    /// disconnect callback has run. Idempotent.
    fn shutdown(&mut self);
}

/// Which backend carries the fabric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// verbs when this host has an RDMA device (and the peer is not on loopback);
    /// otherwise tcp, mapped where the memnode is on this host and shares its region.
    Auto,
    Tcp,
    Verbs,
    /// tcp for control, READ and WRITE as copies into the region of a memnode on this
    /// host (`mapped`); a memnode that cannot be mapped is an error.
    Mapped,
}

impl std::str::FromStr for Transport {
    type Err = String;
    fn from_str(s: &str) -> Result<Transport, String> {
        match s {
            "auto" => Ok(Transport::Auto),
            "tcp" => Ok(Transport::Tcp),
            "verbs" => Ok(Transport::Verbs),
            "mapped" => Ok(Transport::Mapped),
            _ => Err(format!(
                "unknown transport {s:?}: expected auto, verbs, tcp or mapped"
            )),
        }
    }
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::Auto => "auto",
            Transport::Tcp => "tcp",
            Transport::Verbs => "verbs",
            Transport::Mapped => "mapped",
        })
    }
}

impl Transport {
    /// Picks the concrete backend: `Auto` becomes `Verbs` when an RDMA device exists
    /// and `Tcp` otherwise; `Verbs` without a device is an error naming what is
    /// missing.
    pub fn resolve(self) -> Result<Transport, FabricError> {
        match self {
            Transport::Tcp => Ok(Transport::Tcp),
            Transport::Mapped => Ok(Transport::Mapped),
            Transport::Verbs => {
                verbs_device()?;
                Ok(Transport::Verbs)
            }
            Transport::Auto => Ok(match verbs_device() {
                Ok(_) => Transport::Verbs,
                Err(_) => Transport::Tcp,
            }),
        }
    }

    /// Why `auto` picked what it picked, for the log line saying which was chosen.
    pub fn describe_choice(self) -> String {
        if self == Transport::Mapped {
            return self.to_string();
        }
        match verbs_device() {
            Ok(dev) => format!("{self} (RDMA device {dev})"),
            Err(e) => format!("{self} ({e})"),
        }
    }
}

/// The name of the first RDMA device, or why there is none.
pub fn verbs_device() -> Result<String, FabricError> {
    #[cfg(feature = "verbs")]
    {
        verbs::first_device_name()
    }
    #[cfg(not(feature = "verbs"))]
    {
        Err(FabricError::NoDevice(
            "this build has no verbs support (built without the `verbs` feature)".into(),
        ))
    }
}

/// True when `hostport` names a loopback address: RoCE (Soft-RoCE included) cannot
/// route to loopback, so verbs needs the RDMA interface's own address instead.
fn is_loopback(hostport: &str) -> bool {
    use std::net::ToSocketAddrs;
    hostport
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .is_some_and(|a| a.ip().is_loopback())
}

/// The backend for a connection to or a listener on `hostport`: like
/// [`Transport::resolve`], except that `auto` uses tcp for loopback addresses (which
/// RoCE cannot reach), and `verbs` on a loopback address is an error saying so.
pub fn resolve_for(transport: Transport, hostport: &str) -> Result<Transport, FabricError> {
    match transport {
        Transport::Auto if is_loopback(hostport) => Ok(Transport::Tcp),
        Transport::Verbs if is_loopback(hostport) => {
            verbs_device()?;
            Err(FabricError::Invalid(format!(
                "{hostport} is a loopback address, which RDMA over Ethernet cannot reach; \
                 use the address of the RDMA device's network interface{}",
                local_host(Transport::Verbs)
                    .map(|h| format!(" ({h})"))
                    .unwrap_or_default()
            )))
        }
        t => t.resolve(),
    }
}

/// An address of this host that `transport` can reach itself on (for the embedded
/// memnode): loopback for tcp, the RDMA interface's IPv4 address for verbs.
pub fn local_host(transport: Transport) -> Option<String> {
    match transport {
        #[cfg(feature = "verbs")]
        Transport::Verbs => verbs::device_ipv4().map(|ip| ip.to_string()),
        _ => Some("127.0.0.1".into()),
    }
}

/// Opens the active side of one connection to `peer` ("host:port") as client
/// `client_id` (verbs puts the queue pair in that client's protection domain on the
/// memnode; the Hello that follows must name the same client). Over tcp a caller
/// polls for up to `poll` for its completions before it sleeps; verbs sleeps on its
/// completion channel whatever `poll` is.
pub fn connect(
    transport: Transport,
    peer: &str,
    client_id: u64,
    timeout: Duration,
    poll: Duration,
) -> Result<Box<dyn Endpoint>, FabricError> {
    match resolve_for(transport, peer)? {
        #[cfg(feature = "verbs")]
        Transport::Verbs => verbs::VerbsEndpoint::connect(peer, client_id, timeout),
        Transport::Mapped => Ok(Box::new(mapped::MappedEndpoint::connect(
            peer, client_id, timeout, poll, true,
        )?)),
        // auto without verbs: tcp, mapped where the memnode turns out to be on this
        // host and shares its region.
        _ if transport == Transport::Auto => Ok(Box::new(mapped::MappedEndpoint::connect(
            peer, client_id, timeout, poll, false,
        )?)),
        _ => Ok(Box::new(
            tcp::TcpEndpoint::connect(peer, timeout)?.with_poll(poll),
        )),
    }
}

/// Binds the passive side to `listen` ("host:port"; port 0 picks a free port), with
/// the default [`ConnectionLimits`]. Over tcp each connection thread polls for up to
/// `poll` for the next request before it sleeps; over verbs the NIC serves one-sided
/// requests and `poll` is unused.
pub fn bind(
    transport: Transport,
    listen: &str,
    poll: Duration,
) -> Result<Box<dyn Listener>, FabricError> {
    bind_with(transport, listen, poll, ConnectionLimits::default())
}

/// As [`bind`], with the connection caps and deadlines `limits`.
pub fn bind_with(
    transport: Transport,
    listen: &str,
    poll: Duration,
    limits: ConnectionLimits,
) -> Result<Box<dyn Listener>, FabricError> {
    match resolve_for(transport, listen)? {
        #[cfg(feature = "verbs")]
        Transport::Verbs => verbs::VerbsListener::bind(listen, limits),
        _ => Ok(Box::new(
            tcp::TcpListener::bind(listen)?
                .with_poll(poll)
                .with_limits(limits),
        )),
    }
}

/// Most connections past their Hello that a server keeps; more are refused, so that
/// clients cannot exhaust its threads.
pub const MAX_CONNECTIONS: usize = 1024;
/// Most connections that have not completed their Hello, from every address
/// together: when full, the oldest of them is closed for a new one (see
/// [`crate::admission`]).
pub const MAX_PENDING: usize = 256;
/// Most connections that have not completed their Hello from one address (an IPv6
/// /64): when full, that address's oldest is closed for its new one.
pub const MAX_PENDING_PER_SOURCE: usize = 16;
/// How long a connection has from accept to complete its Hello (memnode's
/// `--hello-timeout`); then it is closed. A client's Hello takes two round trips.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Once a frame has begun, the whole of it must arrive within this time (memnode's
/// `--frame-timeout`), or the connection is closed: a client that sends half a frame,
/// or a byte now and then, cannot pin a thread. Between frames an authenticated
/// connection may idle as long as it likes.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(10);

/// The caps and deadlines of a fabric server's connections: what keeps anyone who
/// can reach its port, token or not, from shutting its clients out
/// ([`crate::admission`] says how the caps work).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections past their Hello ([`MAX_CONNECTIONS`]).
    pub authenticated: usize,
    /// Connections before their Hello, in all ([`MAX_PENDING`]).
    pub pending: usize,
    /// Connections before their Hello, per address ([`MAX_PENDING_PER_SOURCE`]).
    pub pending_per_source: usize,
    /// From accept to the end of the Hello ([`HELLO_TIMEOUT`]).
    pub hello_timeout: Duration,
    /// From a frame's start to its end, over tcp ([`FRAME_TIMEOUT`]).
    pub frame_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> ConnectionLimits {
        ConnectionLimits {
            authenticated: MAX_CONNECTIONS,
            pending: MAX_PENDING,
            pending_per_source: MAX_PENDING_PER_SOURCE,
            hello_timeout: HELLO_TIMEOUT,
            frame_timeout: FRAME_TIMEOUT,
        }
    }
}

impl ConnectionLimits {
    /// The caps of the server's [`crate::admission::Admission`].
    pub fn caps(&self) -> crate::admission::Caps {
        crate::admission::Caps {
            authenticated: self.authenticated,
            pending: self.pending,
            pending_per_source: self.pending_per_source,
        }
    }
}

/// What a fabric server's pending connections are, in its log lines.
pub(crate) const PENDING_MEANS: &str = "without completing its Hello";

/// The default for `poll` in [`connect`] and [`bind`] (fsd's and memnode's
/// `--poll-us`): a few loopback or LAN round trips, so a thread waiting for a
/// completion, or a memnode waiting for the next request of a client that is
/// working, rarely sleeps, while an idle one stops polling soon.
pub const DEFAULT_POLL: Duration = Duration::from_micros(100);
/// The largest `--poll-us` either binary takes: a second (beyond that, polling is
/// just a busy loop).
pub const MAX_POLL_US: u64 = 1_000_000;

/// Tells the fabric that `[ptr, ptr + len)` will serve as local buffers of many
/// operations (fsd's page cache): verbs registers it once with every protection
/// domain it uses, so READs land in it and WRITEs send from it without a copy or a
/// per-operation registration. tcp needs nothing. Buffers outside registered memory
/// still work (verbs registers them for the one operation).
///
/// # Safety
/// The memory must stay mapped for the rest of the process's life.
pub unsafe fn register_local(ptr: *mut u8, len: usize) -> Result<(), FabricError> {
    #[cfg(feature = "verbs")]
    {
        // SAFETY: forwarded contract.
        unsafe { verbs::register_local(ptr, len) }
    }
    #[cfg(not(feature = "verbs"))]
    {
        let _ = (ptr, len);
        Ok(())
    }
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

/// Per-connection state the control handler keeps on the passive side.
#[derive(Debug)]
pub struct ConnectionState {
    /// Unique per accepted connection.
    pub conn_id: u64,
    /// Set by a successful Hello; one-sided access is refused until then.
    pub client: Option<u64>,
    /// The peer's address, for logs.
    pub peer: String,
    /// Between the Hello and the Prove: what the proofs must cover.
    pub challenged: Option<crate::auth::Challenged>,
}

impl ConnectionState {
    /// A connection just accepted: no client yet.
    pub fn new(conn_id: u64, peer: String) -> ConnectionState {
        ConnectionState {
            conn_id,
            client: None,
            peer,
            challenged: None,
        }
    }
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
