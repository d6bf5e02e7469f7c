//! Shared by memnode and fsd: the control protocol, the fabric trait and its backends.

pub mod admission;
pub mod auth;
pub mod control;
pub mod cpus;
pub mod crc32c;
pub mod fabric;
pub mod fdlimit;
pub mod le;
pub mod protocol;
pub mod reclaim;
pub mod size;
pub mod sync;
pub mod throttle;
pub mod token;
