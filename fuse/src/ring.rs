//! FUSE over io_uring (Linux 6.14, `CONFIG_FUSE_IO_URING`, on when
//! `/sys/module/fuse/parameters/enable_uring` is Y): the kernel hands requests to
//! buffers the daemon registered, one queue per CPU, and the daemon answers a request
//! and fetches the next in one submission (COMMIT_AND_FETCH) instead of a write(2)
//! and a read(2) on /dev/fuse.
//!
//! How it fits beside fuser, which has no ring code (its issue #380): fuser still
//! mounts and runs its /dev/fuse loop. At FUSE_INIT, [`RingLauncher::negotiate`]
//! asks for FUSE_OVER_IO_URING; once every queue has an entry registered the kernel
//! sends every request there, except FORGET and INTERRUPT, which stay on /dev/fuse
//! with fuser (as do notifications). Both paths answer through the same
//! [`FuseOps`](crate::FuseOps), so the filesystem is one.
//!
//! Threads: each owns one io_uring and a few ring entries (each a 288-byte header
//! buffer and a payload buffer as large as the largest request) and serves its queue
//! synchronously: wait, answer what has come, commit-and-fetch each. The reads among
//! requests that came together are read together, what they miss loaded in one
//! batch ([`FuseOps::read_together`](crate::FuseOps::read_together)). Several
//! threads per queue let requests that wait on remote memory overlap. Each is pinned
//! to its queue's CPU, the CPU of the tasks whose requests it serves: its wakeups
//! stay on that CPU, and fsd, pinned, served more on every job measured. A server
//! that does no I/O of its own (nullfs) pays for it with one reader, as reader and
//! server then take turns on one CPU, while its streams gain
//! (docs/benchmarks-history.md, "Ring threads pinned to their queue's CPU").
//!
//! The rings and buffers are made before mounting: the kernel holds every request of
//! a connection that negotiated io_uring until the ring is ready, so fsd must not
//! promise a ring it cannot build.
//!
//! Teardown: unmount (or fsd's exit) aborts the connection; the kernel completes
//! every registered entry with ENOTCONN, a commit after that fails the same way, and
//! the threads end. A request being answered then has no one to answer to, as on
//! /dev/fuse.
//!
//! - `launch.rs`: [`RingLauncher`], from before mounting (the threads, their rings
//!   and buffers) through FUSE_INIT (the go) to the end of the connection;
//! - `entry.rs`: one ring entry (its registered buffers) and the ring commands that
//!   carry it;
//! - `serve.rs`: a serving thread, from its go to the end of the connection;
//! - `company.rs`: when a thread with one read waits a moment for others;
//! - `dispatch.rs` and `abi.rs`: one request, decoded and answered in its entry's
//!   buffers, as the kernel lays them out.

mod abi;
mod company;
mod dispatch;
mod entry;
mod launch;
mod serve;

pub use launch::RingLauncher;

use std::sync::atomic::AtomicU64;

/// Requests answered through the ring since fsd started (statistics; the proof in
/// tests that the ring serves).
pub static RING_REQUESTS: AtomicU64 = AtomicU64::new(0);

/// Serving threads per queue unless told otherwise. One thread answers a request
/// that comes while it is busy as soon as it is done (COMMIT_AND_FETCH hands it
/// over at once), where a second thread would be woken for it: a sleep and a
/// wakeup per request saved, which is what the CPUs of a loaded host run short of.
/// More readers than CPUs missing the cache are served faster so
/// (docs/benchmarks-history.md, "One serving thread per ring queue"), as libfuse
/// serves the ring too. The price: a request that waits long holds up the others of
/// its CPU's tasks until it is answered (`--ring-threads` gives more).
pub const DEFAULT_THREADS_PER_QUEUE: usize = 1;

/// Which transport serves a mount (`--fuse-transport`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FuseTransport {
    /// io_uring when the kernel offers it, else /dev/fuse.
    Auto,
    /// io_uring, or fail to mount.
    #[value(name = "io-uring")]
    IoUring,
    /// fuser's /dev/fuse loop.
    Classic,
}
