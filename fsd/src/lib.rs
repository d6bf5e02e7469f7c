//! fsd: a POSIX filesystem whose file data lives in remote memory (memnodes).
//!
//! - [`fs`]: the filesystem core (operations, data path); no FUSE in it.
//! - [`namespace`], [`inode`]: directories, inodes and their locks.
//! - [`privs`]: clearing setuid/setgid on write, truncate and chown.
//! - [`acl`]: POSIX ACLs: their xattr form and how they tie to the mode.
//! - [`cache`]: the LRU page cache with write-back.
//! - [`remote`]: memnode connections, block placement and batched block I/O.
//! - [`fuse`]: the thin fuser adapter, the only place errno appears.
//! - [`stats`]: counters of remote traffic and of the cache, written for benchmarks.
//! - [`mount`]: the mount options, mount(2), and serving until unmounted or signalled.
//! - [`mount_helper`]: `mount.fuse.rmemfs`, what mount(8) and fstab run: SOURCE and
//!   option parsing, starting fsd detached, remounts.
//! - [`metrics`]: the same counters and latency histograms for Prometheus (`--metrics`).
//! - [`status`]: the status file a running fsd keeps for `rmemfs status`.
//! - [`daemon`]: startup, periodic flushing, write-back and shutdown.
//! - [`volume`]: durable volumes: the metadata kept in remote memory.
//!
//! The FUSE transports and mounting are the `rmemfs-fuse` crate's, shared with
//! nullfs; [`fuse`] and [`mount`] re-export them here. CPU pinning is
//! `rmemfs_common::cpus`.

pub mod acl;
pub mod atime;
pub mod cache;
pub mod daemon;
pub mod error;
pub mod fs;
pub mod fuse;
pub mod inode;
pub mod metrics;
pub mod mount;
pub mod mount_helper;
pub mod namespace;
pub mod privs;
pub mod remote;
pub mod stats;
pub mod status;
pub mod volume;
