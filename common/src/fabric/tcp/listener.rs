//! The bound, not yet serving, passive side of the tcp backend.
//!
//! Binding first and serving later lets the memnode learn its address and build what
//! serves connections (its chunk pool and control service need the registry) before
//! any connection is accepted; connections arriving in between wait in the kernel's
//! accept queue.

use super::registry::TcpRegistry;
use super::server::TcpServer;
use crate::fabric::mapped::offer::{MapOffer, SharedRegion};
use crate::fabric::{
    ConnectionLimits, ControlHandler, FabricError, Listener, MemoryRegistry, Server,
};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// A bound tcp listening socket and the registry its connections will access.
#[derive(Debug)]
pub struct TcpListener {
    socket: std::net::TcpListener,
    addr: SocketAddr,
    registry: Arc<TcpRegistry>,
    poll: Duration,
    limits: ConnectionLimits,
}

impl TcpListener {
    /// Binds `listen` ("host:port"; port 0 picks a free port).
    pub fn bind(listen: &str) -> Result<TcpListener, FabricError> {
        let cannot =
            |e: std::io::Error| FabricError::Local(format!("cannot listen on {listen}: {e}"));
        let socket = std::net::TcpListener::bind(listen).map_err(cannot)?;
        let addr = socket.local_addr().map_err(cannot)?;
        Ok(TcpListener {
            socket,
            addr,
            registry: Arc::new(TcpRegistry::new()),
            poll: Duration::ZERO,
            limits: ConnectionLimits::default(),
        })
    }

    /// Makes each connection thread poll for up to `poll` for the client's next
    /// request before it sleeps (zero, the default, sleeps at once).
    pub fn with_poll(mut self, poll: Duration) -> TcpListener {
        self.poll = poll;
        self
    }

    /// Serves with the caps and deadlines `limits` instead of the defaults (tests
    /// give short deadlines).
    pub fn with_limits(mut self, limits: ConnectionLimits) -> TcpListener {
        self.limits = limits;
        self
    }

    /// Starts accepting and serving connections on background threads.
    pub fn start(self, control: Arc<dyn ControlHandler>) -> std::io::Result<TcpServer> {
        TcpServer::start(self.socket, self.registry, control, self.poll, self.limits)
    }
}

impl Listener for TcpListener {
    fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    fn share_region(&mut self, region: SharedRegion) -> Result<(), FabricError> {
        let offer = MapOffer::start(region)
            .map_err(|e| FabricError::Local(format!("cannot offer the region by mapping: {e}")))?;
        self.registry.share(offer)
    }

    fn registry(&self) -> Arc<dyn MemoryRegistry> {
        self.registry.clone()
    }

    fn serve(
        self: Box<Self>,
        control: Arc<dyn ControlHandler>,
    ) -> std::io::Result<Box<dyn Server>> {
        Ok(Box::new(self.start(control)?))
    }
}
