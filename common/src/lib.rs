//! Shared by memnode and fsd: the control protocol, the fabric trait and its backends.

pub mod auth;
pub mod control;
pub mod cpus;
pub mod crc32c;
pub mod fabric;
pub mod le;
pub mod protocol;
pub mod reclaim;
pub mod size;
pub mod sync;
pub mod token;
