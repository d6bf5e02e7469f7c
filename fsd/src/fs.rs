//! The filesystem core: POSIX operations over the namespace, the page cache and
//! remote memory. Knows nothing of FUSE (see `fuse/adapter.rs` for the adapter), so it is
//! tested directly.
//!
//! Data path invariants:
//! - A block gets its remote copies when it is first written, before the write is
//!   acknowledged; so full remote memory fails the write with ENOSPC, and write-back
//!   (on eviction, fsync, flush or the periodic flusher) allocates only to replace
//!   copies lost with a memnode (`remote_io.rs`).
//! - A block that is in the block map holds, in remote memory or in a dirty page, the
//!   bytes of the file; bytes past end-of-file inside the last block are zero.
//! - A block freed (truncate, delete) is first dropped from the cache, waiting for any
//!   write-back of it in flight, then given back: no stale page can ever write into a
//!   block that has been reused.
//!
//! The operations by job, each an `impl RmemFs` of its own file: `names.rs` (lookup,
//! create, link, rename, unlink, open, release), `attr.rs` (getattr, setattr, atime),
//! `truncate.rs`, `read.rs`, `write.rs`, `room.rs` (ENOSPC and the volume's room to
//! grow), `sync.rs` (fsync, flush, commit, shutdown), `space.rs` (fallocate, lseek),
//! `copy.rs` (copy_file_range) and `xattr.rs`. Below them: `remote_io.rs` (the page
//! cache's loads and write-backs), `fit.rs` (growing a block's copies) and
//! `prefetch.rs` (readahead); beside them, in the background, `repair.rs`
//! (re-replication) and `scrub.rs`. This file keeps the filesystem's state and what
//! every part shares.

use crate::atime::AtimePolicy;
use crate::cache::PageCache;
use crate::error::{FsError, FsResult};
use crate::inode::{Attr, FileKind, Ino, Inode};
use crate::namespace::Namespace;
use crate::privs::KillPrivs;
use crate::remote::{BlockLoc, RemoteStore};
use crate::volume::Volume;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

/// Largest file size: a bound that keeps block-index arithmetic far from overflow.
pub const MAX_FILE_SIZE: u64 = 1 << 52;

/// How far ahead of a sequential reader blocks are loaded (at most a quarter of the
/// cache). Four 1 MiB requests' worth: with only the next request's worth queued, a
/// stream waited on each load as it finished, checksum included
/// (docs/benchmarks-history.md, "Prefetch: three threads and 4 MiB of read-ahead").
const READAHEAD_BYTES: u64 = 4 << 20;

/// Who is asking (from the FUSE request).
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// Its process, for the group and capability checks of `privs.rs` (0: unknown).
    pub pid: u32,
    /// Its umask, which fsd applies to new inodes, since with POSIX ACLs a parent's
    /// default ACL replaces it (the kernel then leaves it to the filesystem).
    pub umask: u32,
}

impl Caller {
    /// A caller with ids `uid` and `gid`, whose umask is 0.
    pub const fn with_ids(uid: u32, gid: u32) -> Caller {
        Caller {
            uid,
            gid,
            pid: 0,
            umask: 0,
        }
    }
}

/// A time to set: a given instant, or "now".
#[derive(Debug, Clone, Copy)]
pub enum SetTime {
    At(SystemTime),
    Now,
}

/// Attribute changes requested by setattr; `None` leaves a field alone.
#[derive(Debug, Clone, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    /// Whether to clear setuid/setgid first (a given `mode` still wins).
    pub kill_privs: KillPrivs,
}

/// Filesystem-wide figures for statfs.
#[derive(Debug, Clone, Copy)]
pub struct FsStats {
    pub block_size: u64,
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub inodes: u64,
}

/// What programs asked of fsd's files: reads and writes that reached fsd (the
/// kernel's page cache answers the others) and the bytes they returned or took. Set
/// against the remote counters they give the amplification of each way.
///
/// Every request of every thread bumps these: aligned to a cache-line pair of their own
/// so that they share no line with locks that threads take on the same requests (a
/// field added beside them once slowed small-file creates markedly:
/// docs/benchmarks-history.md, "Counters on a cache-line pair of their own").
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct FileCounters {
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
    pub writes: AtomicU64,
    pub write_bytes: AtomicU64,
    /// getxattr calls answered: with `S_NOSEC` inodes the kernel no longer asks for
    /// `security.capability` before each write (see `privs.rs`).
    pub xattr_reads: AtomicU64,
    /// copy_file_range requests fsd served and the bytes they copied, and the blocks
    /// of those copied inside remote memory (`fs/copy.rs`).
    pub copies: AtomicU64,
    pub copy_bytes: AtomicU64,
    pub copied_blocks: AtomicU64,
}

impl FileCounters {
    fn count(ops: &AtomicU64, bytes: &AtomicU64, n: usize) {
        ops.fetch_add(1, Ordering::Relaxed);
        bytes.fetch_add(n as u64, Ordering::Relaxed);
    }
}

pub struct RmemFs {
    ns: Namespace,
    pub counters: FileCounters,
    cache: PageCache,
    remote: Arc<RemoteStore>,
    block_size: u64,
    /// Blocks read ahead of a sequential reader.
    readahead_blocks: u64,
    prefetch: prefetch::Prefetcher,
    /// What the last maintenance pass counted (`repair.rs`).
    redundancy: std::sync::Mutex<Redundancy>,
    /// The durable volume the metadata is kept in (`None`: scratch, kept nowhere).
    volume: Option<Arc<Volume>>,
    atime: AtimePolicy,
    /// Whether the kernel enforces POSIX ACLs on this mount (`acl.rs`): then fsd keeps
    /// them as xattrs and applies their rules to modes.
    posix_acl: std::sync::atomic::AtomicBool,
    scrub_cursor: std::sync::Mutex<scrub::ScrubCursor>,
    pub scrub_counters: scrub::ScrubCounters,
}

/// The blocks from `first` to `last` that a sequential access ending at byte `end`
/// (inside block `last`, of `bs` bytes) has finished with: all of them if it ends
/// at the end of a block or of the file (`at_eof`), else all but the last.
fn finished_blocks(first: u64, last: u64, end: u64, bs: u64, at_eof: bool) -> std::ops::Range<u64> {
    if at_eof || end == (last + 1) * bs {
        first..last + 1
    } else {
        first..last
    }
}

impl RmemFs {
    /// A scratch filesystem: empty, its metadata in this process only.
    pub fn new(remote: Arc<RemoteStore>, cache_bytes: u64, owner: Caller) -> RmemFs {
        let ns = Namespace::new(owner.uid, owner.gid);
        RmemFs::with_namespace(remote, cache_bytes, ns, None)
    }

    /// The filesystem of a mounted durable volume (see `volume/mod.rs`).
    pub fn on_volume(
        remote: Arc<RemoteStore>,
        cache_bytes: u64,
        ns: Namespace,
        volume: Arc<Volume>,
    ) -> RmemFs {
        RmemFs::with_namespace(remote, cache_bytes, ns, Some(volume))
    }

    fn with_namespace(
        remote: Arc<RemoteStore>,
        cache_bytes: u64,
        ns: Namespace,
        volume: Option<Arc<Volume>>,
    ) -> RmemFs {
        let block_size = remote.block_size();
        let cache = PageCache::new(cache_bytes, block_size as usize);
        let readahead_blocks =
            (READAHEAD_BYTES / block_size).clamp(1, cache.capacity_pages() as u64 / 4 + 1);
        RmemFs {
            ns,
            counters: FileCounters::default(),
            cache,
            remote,
            block_size,
            readahead_blocks,
            prefetch: Default::default(),
            redundancy: Default::default(),
            volume,
            atime: AtimePolicy::default(),
            posix_acl: Default::default(),
            scrub_cursor: Default::default(),
            scrub_counters: Default::default(),
        }
    }

    /// Notes that `inode` changed, for the volume's next commit (after the change).
    fn changed(&self, inode: &Inode) {
        if let Some(v) = &self.volume {
            v.journal().touch(inode);
        }
    }

    /// Gives blocks back: at once in scratch mode, after the next commit on a volume
    /// (so a crash never finds them in two files).
    fn free_later(&self, blocks: impl IntoIterator<Item = BlockLoc>) {
        match &self.volume {
            Some(v) => v.defer_free(blocks),
            None => self.remote.free_blocks(blocks),
        }
    }

    /// The durable volume, if mounted on one.
    pub fn volume(&self) -> Option<&Arc<Volume>> {
        self.volume.as_ref()
    }

    pub fn cache(&self) -> &PageCache {
        &self.cache
    }

    pub fn remote(&self) -> &RemoteStore {
        &self.remote
    }

    fn attr_of(&self, inode: &Inode) -> Attr {
        let m = inode.meta();
        let mut a = m.attr.clone();
        a.allocated = m.allocated;
        a
    }

    fn file_inode(&self, ino: Ino) -> FsResult<Arc<Inode>> {
        let inode = self.ns.get(ino)?;
        let kind = inode.meta().attr.kind;
        match kind {
            FileKind::File => Ok(inode),
            FileKind::Dir => Err(FsError::IsDir),
            _ => Err(FsError::Invalid),
        }
    }

    pub fn statfs(&self) -> FsStats {
        let (total, free) = self.remote.space();
        FsStats {
            block_size: self.block_size,
            total_bytes: total,
            free_bytes: free,
            inodes: self.ns.inode_count(),
        }
    }
}

mod attr;
pub mod copy;
mod fit;
mod names;
mod prefetch;
mod read;
mod remote_io;
mod repair;
mod room;
mod scrub;
mod space;
mod sync;
mod truncate;
mod write;
mod xattr;

pub use read::ReadTogether;
pub use repair::Redundancy;
pub use space::{Allocate, Seek};
pub use xattr::SetXattrMode;

#[cfg(test)]
mod tests;
