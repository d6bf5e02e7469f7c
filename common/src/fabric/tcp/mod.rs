//! The tcp backend: RC-queue-pair semantics over one TCP stream per connection.
//!
//! Every operation is a fixed 32-byte request header ([`wire`]) followed, for WRITE
//! and SEND, by its payload. The passive side answers each request, in order, with a
//! 16-byte completion header followed, for READ and RECV, by its payload. Requests carry
//! a work-request id, so many can be outstanding: the client writes a whole batch,
//! then a reader thread matches completions to waiters.

pub mod client;
pub mod server;
pub mod wire;

pub use client::TcpEndpoint;
pub use server::TcpServer;
