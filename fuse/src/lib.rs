//! rmemfs's FUSE glue, apart from its core: what a filesystem answers to FUSE
//! requests and the ways they reach it, so that fsd and the benchmark's null
//! filesystem (`tools/nullfs`) serve through the same code without nullfs
//! depending on fsd, its memnode client or RDMA (as mountpoint-s3 keeps its fuser
//! glue apart from its core). Of fsd, only this crate and its adapter know fuser or
//! the kernel's FUSE protocol.
//!
//! - `ops.rs`: [`FuseOps`], what a filesystem answers, whatever carries the request;
//! - `classic.rs`: the classic transport, fuser's /dev/fuse loop;
//! - `ring/`: FUSE over io_uring (Linux 6.14), beside the classic loop; its threads
//!   are pinned to their queue's CPU with `rmemfs_common::cpus` (taken without the
//!   verbs fabric);
//! - `timing.rs`: latency histograms of a filesystem's handlers, by kind of request;
//! - `mount.rs` and `mount/`: the mount options, mount(2), and serving a mount until
//!   it is unmounted or signalled;
//! - here: the settings both transports share.
//!
//! fsd's side (its answers, `fsd::fuse::FuseAdapter`, and the one errno table) stays
//! in fsd, which re-exports this crate's modules under its old paths.

mod classic;
pub mod mount;
pub mod ops;
pub mod ring;
pub mod timing;

pub use classic::Classic;
pub use ops::FuseOps;

use fuser::{FopenFlags, InitFlags, KernelConfig};
use std::time::Duration;

/// How long the kernel may cache attributes and entries. Every change goes through
/// this mount, so the kernel's view cannot go stale behind its back.
pub const TTL: Duration = Duration::from_secs(1);
/// Largest write the kernel sends in one request.
pub const MAX_WRITE: u32 = 1 << 20;

/// What fsd asks of the kernel at init: requests of up to 1 MiB (the kernel may
/// grant less readahead), clearing setuid/setgid itself (`FUSE_HANDLE_KILLPRIV_V2`,
/// which spares a `security.capability` lookup per write; see fsd's `privs.rs`), with
/// [`CacheMode::Direct`] shared mappings of handles that bypass the page cache, and
/// with [`CacheMode::WriteBack`] the kernel's write-back cache.
pub fn configure_kernel(config: &mut KernelConfig, cache: CacheMode) {
    let _ = config.set_max_write(MAX_WRITE);
    let _ = config.set_max_readahead(MAX_WRITE);
    // File handles (name_to_handle_at, NFS re-export) of inodes the kernel no longer
    // has cached: it looks them up as "." and ".." (see fsd's `Namespace::lookup`).
    if config
        .add_capabilities(InitFlags::FUSE_EXPORT_SUPPORT)
        .is_err()
    {
        log::info!("this kernel lacks FUSE_EXPORT_SUPPORT: file handles go stale");
    }
    if config
        .add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2)
        .is_err()
    {
        log::info!(
            "this kernel lacks FUSE_HANDLE_KILLPRIV_V2 (Linux 5.11): it clears \
             setuid/setgid itself and asks for security.capability before each write"
        );
    }
    if cache == CacheMode::Direct
        && config
            .add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
            .is_err()
    {
        log::warn!(
            "this kernel cannot map files of a direct-I/O mount shared \
             (FUSE_DIRECT_IO_ALLOW_MMAP, Linux 6.6): mmap(MAP_SHARED) fails with ENODEV"
        );
    }
    if cache == CacheMode::WriteBack
        && config
            .add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE)
            .is_err()
    {
        log::warn!(
            "this kernel has no FUSE write-back cache (FUSE_WRITEBACK_CACHE, Linux \
             3.15): every write(2) goes to fsd as without --writeback-cache"
        );
    }
}

/// How file handles are served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheMode {
    /// Through the kernel's page cache (fsd --page-cache), O_DIRECT handles included:
    /// the kernel itself
    /// sends an O_DIRECT handle's reads and writes straight to fsd (its generic
    /// direct-I/O path), and with it gives what a local filesystem gives: dirty pages
    /// of the range written back before a direct read, cached pages dropped after a
    /// direct write, and shared mappings allowed. Reads the page cache holds never
    /// reach fsd.
    PageCache,
    /// Every handle bypasses the page cache (FOPEN_DIRECT_IO, fsd's default): each
    /// read and write is a request to fsd, of the size the program asked for. The
    /// data is cached once, in fsd's cache, rather than also in the kernel's, and
    /// streams cost less (no page cache to fill and drop); reads the page cache would
    /// have answered cost a round trip to fsd. Shared mappings need
    /// FUSE_DIRECT_IO_ALLOW_MMAP (Linux 6.6); without it the kernel refuses them with
    /// ENODEV.
    Direct,
    /// Through the page cache, written back by the kernel (FUSE_WRITEBACK_CACHE, fsd
    /// --writeback-cache): a `write(2)` returns once the kernel's page holds the data,
    /// and the kernel sends fsd the dirty pages later, in runs, as it writes back any
    /// file (after some seconds, under memory pressure, at fsync and at close). Small
    /// writes then cost no round trip to fsd, but fsd learns of a write only at
    /// write-back: a write-back that fails (a full remote memory: ENOSPC) is reported
    /// by the next fsync or close, not by the write; `st_blocks` and statfs count
    /// what fsd holds; and SEEK_DATA/SEEK_HOLE report the whole file as data (fsd
    /// answers FUSE_LSEEK with ENOSYS, as it cannot see the kernel's dirty pages).
    WriteBack,
}

impl CacheMode {
    /// The mode fsd's (and nullfs's) command-line flags choose: direct I/O unless
    /// `--page-cache` or `--writeback-cache` (the parsers reject two at once).
    pub fn from_flags(page_cache: bool, writeback_cache: bool) -> CacheMode {
        match (page_cache, writeback_cache) {
            (true, _) => CacheMode::PageCache,
            (false, true) => CacheMode::WriteBack,
            (false, false) => CacheMode::Direct,
        }
    }

    /// The flags of an open file's reply.
    pub fn fopen_flags(self) -> FopenFlags {
        match self {
            CacheMode::PageCache | CacheMode::WriteBack => FopenFlags::empty(),
            CacheMode::Direct => FopenFlags::FOPEN_DIRECT_IO,
        }
    }
}
