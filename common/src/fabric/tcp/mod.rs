//! The tcp backend: RC-queue-pair semantics over one TCP stream per connection.
//!
//! Every operation is a fixed 32-byte request header ([`wire`]) followed, for WRITE
//! and SEND, by its payload. The passive side answers each request, in order, with a
//! 16-byte completion header followed, for READ and RECV, by its payload. Requests carry
//! a work-request id, so many can be outstanding: the client writes a whole batch,
//! then the calling thread reads the completions itself, READ payloads straight into
//! its buffers ([`client`]).
//!
//! The passive side plays the NIC: a [`TcpListener`] is bound together with its
//! [`TcpRegistry`] (the table of memory registrations, with the NIC's access checks),
//! then serves as a [`TcpServer`], whose connection threads execute READ and WRITE
//! against the registry and hand SENDs to the control handler. Payloads move between
//! the socket and registered memory with no staging copy ([`direct`]).

pub mod client;
mod direct;
pub mod listener;
mod placement;
pub mod registry;
pub mod server;
pub mod wire;

pub use client::TcpEndpoint;
pub use listener::TcpListener;
pub use registry::TcpRegistry;
pub use server::TcpServer;
