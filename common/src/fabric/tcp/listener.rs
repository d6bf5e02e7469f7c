//! The bound, not yet serving, passive side of the tcp backend.
//!
//! Binding first and serving later lets the memnode learn its address and build what
//! serves connections (its chunk pool and control service need the registry) before
//! any connection is accepted; connections arriving in between wait in the kernel's
//! accept queue.

use super::registry::TcpRegistry;
use super::server::TcpServer;
use crate::fabric::{ControlHandler, FabricError, Listener, MemoryRegistry, Server};
use std::net::SocketAddr;
use std::sync::Arc;

/// A bound tcp listening socket and the registry its connections will access.
#[derive(Debug)]
pub struct TcpListener {
    socket: std::net::TcpListener,
    addr: SocketAddr,
    registry: Arc<TcpRegistry>,
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
        })
    }

    /// Starts accepting and serving connections on background threads.
    pub fn start(self, control: Arc<dyn ControlHandler>) -> std::io::Result<TcpServer> {
        TcpServer::start(self.socket, self.registry, control)
    }
}

impl Listener for TcpListener {
    fn local_addr(&self) -> SocketAddr {
        self.addr
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
