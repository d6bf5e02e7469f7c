//! The filesystem core: POSIX operations over the namespace, the page cache and
//! remote memory. Knows nothing of FUSE (see `fuse.rs` for the adapter), so it is
//! tested directly.
//!
//! Data path invariants:
//! - A block gets its remote copies when it is first written, before the write is
//!   acknowledged; so full remote memory fails the write with ENOSPC, and write-back
//!   (on eviction, fsync, flush or the periodic flusher) allocates only to replace
//!   copies lost with a memnode (`backing.rs`).
//! - A block that is in the block map holds, in remote memory or in a dirty page, the
//!   bytes of the file; bytes past end-of-file inside the last block are zero.
//! - A block freed (truncate, delete) is first dropped from the cache, waiting for any
//!   write-back of it in flight, then given back: no stale page can ever write into a
//!   block that has been reused.

use crate::acl;
use crate::atime::AtimePolicy;
use crate::cache::{Fill, PageCache};
use crate::error::{FsError, FsResult};
use crate::inode::{Attr, BlockEntry, FileKind, Ino, Inode};
use crate::namespace::{DirEntry, Namespace, NewInode, RenameMode};
use crate::privs::{self, KillPrivs};
use crate::remote::{BlockLoc, RemoteStore};
use crate::volume::Volume;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

/// Largest file size: a bound that keeps block-index arithmetic far from overflow.
pub const MAX_FILE_SIZE: u64 = 1 << 52;

/// How far ahead of a sequential reader blocks are loaded (at most a quarter of the
/// cache). Four 1 MiB requests' worth: with only the next request's worth queued, a
/// stream waited on each load as it finished, checksum included (2.5 against 3.0
/// GB/s here; docs/benchmarks-history.md, "Page checksums: what they cost").
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
/// field added beside them once cost small-file writes 20%).
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

/// A read that came with others (see [`RmemFs::read_together`]): `dst.len()` bytes
/// of file `ino` at `offset`, and once answered how many of them it read (fewer
/// only at the end of the file).
pub struct ReadTogether<'a> {
    pub ino: Ino,
    pub offset: u64,
    pub dst: &'a mut [u8],
    pub done: Option<usize>,
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

/// How far from where the last write to a file ended a large write may start and
/// still count as the same stream. With `--writeback-cache` the kernel sends a
/// stream as runs of up to 1 MiB, several at a time, which fsd's request loops
/// finish in any order: an exact match missed most of them, and their blocks
/// waited to be evicted instead of being written behind.
const STREAM_REORDER: u64 = 8 << 20;

/// The smallest write [`STREAM_REORDER`] applies to: random small writes within a
/// few MiB of each other (a small file's updates) are not a stream.
const MIN_REORDERED_RUN: u64 = 256 << 10;

/// Whether a write of `len` bytes at `offset`, after one that ended at `prev_end`,
/// continues a stream.
fn continues_stream(prev_end: u64, offset: u64, len: u64) -> bool {
    offset > 0
        && (prev_end == offset
            || (len >= MIN_REORDERED_RUN && prev_end.abs_diff(offset) <= STREAM_REORDER))
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

    /// The filesystem of a mounted durable volume (see `volume.rs`).
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

    /// Makes everything written so far durable on the volume (a no-op in scratch
    /// mode): fsync and fsyncdir, after the data is written back.
    pub fn commit(&self) -> FsResult<()> {
        match &self.volume {
            Some(v) => v.commit(&self.ns).map_err(|e| {
                log::error!("commit failed: {e}");
                match e {
                    // Neither a checkpoint nor the log has room: ENOSPC, as on a full disk.
                    crate::volume::VolumeError::NoRoom(_) => FsError::NoSpace,
                    e => FsError::Io(e.to_string()),
                }
            }),
            None => Ok(()),
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

    pub fn lookup(&self, parent: Ino, name: &OsStr) -> FsResult<Attr> {
        let inode = self.ns.lookup(parent, name)?;
        Ok(self.attr_of(&inode))
    }

    pub fn forget(&self, ino: Ino, n: u64) {
        if let Some(inode) = self.ns.forget(ino, n) {
            self.release_data_if_unreferenced(&inode);
        }
    }

    pub fn getattr(&self, ino: Ino) -> FsResult<Attr> {
        let inode = self.ns.get(ino)?;
        Ok(self.attr_of(&inode))
    }

    pub fn setattr(&self, ino: Ino, req: &SetAttr) -> FsResult<Attr> {
        let inode = self.ns.get(ino)?;
        if let Some(size) = req.size {
            self.truncate(&inode, size)?;
        }
        let mut m = inode.meta();
        if m.attr.kind != FileKind::Dir {
            m.attr.perm = req.kill_privs.perm_after(m.attr.perm, m.attr.gid);
        }
        let now = SystemTime::now();
        let resolve = |t: SetTime| match t {
            SetTime::At(t) => t,
            SetTime::Now => now,
        };
        if let Some(mode) = req.mode {
            m.attr.perm = (mode & 0o7777) as u16;
            self.chmod_access_acl(&mut m);
        }
        if let Some(uid) = req.uid {
            m.attr.uid = uid;
        }
        if let Some(gid) = req.gid {
            m.attr.gid = gid;
        }
        if let Some(t) = req.atime {
            m.attr.atime = resolve(t);
        }
        if let Some(t) = req.mtime {
            m.attr.mtime = resolve(t);
        }
        m.attr.ctime = now;
        drop(m);
        self.changed(&inode);
        Ok(self.attr_of(&inode))
    }

    /// Creates an inode of `kind` with `mode`, less the caller's umask or as the
    /// parent's default ACL has it (`acl.rs`).
    fn new_inode(
        &self,
        parent: Ino,
        name: &OsStr,
        (kind, mode, rdev): (FileKind, u32, u32),
        target: Option<PathBuf>,
        caller: Caller,
    ) -> FsResult<Attr> {
        self.room_to_grow()?;
        let p = self.ns.get(parent)?;
        let (parent_gid, parent_sgid, default_acl) = {
            let m = p.meta();
            let default_acl = m.xattrs.get(OsStr::new(acl::DEFAULT)).cloned();
            (m.attr.gid, m.attr.perm & 0o2000 != 0, default_acl)
        };
        // BSD group semantics under a setgid directory; subdirectories inherit setgid.
        let gid = if parent_sgid { parent_gid } else { caller.gid };
        // Symlinks are always rwxrwxrwx.
        let (mut perm, xattrs) = match default_acl {
            _ if kind == FileKind::Symlink => (0o777, Default::default()),
            Some(default) if self.acls_enforced() => {
                self.inherited_acls(kind, (mode & 0o7777) as u16, default)
            }
            _ => ((mode & !caller.umask & 0o7777) as u16, Default::default()),
        };
        if parent_sgid && kind == FileKind::Dir {
            perm |= 0o2000;
        }
        let inode = self.ns.create(
            parent,
            name,
            NewInode {
                kind,
                perm,
                uid: caller.uid,
                gid,
                rdev,
                target,
                xattrs,
            },
        )?;
        Ok(self.attr_of(&inode))
    }

    pub fn mknod(
        &self,
        parent: Ino,
        name: &OsStr,
        kind: FileKind,
        mode: u32,
        rdev: u32,
        caller: Caller,
    ) -> FsResult<Attr> {
        if kind == FileKind::Dir || kind == FileKind::Symlink {
            return Err(FsError::Invalid);
        }
        self.new_inode(parent, name, (kind, mode, rdev), None, caller)
    }

    pub fn mkdir(&self, parent: Ino, name: &OsStr, mode: u32, caller: Caller) -> FsResult<Attr> {
        self.new_inode(parent, name, (FileKind::Dir, mode, 0), None, caller)
    }

    pub fn symlink(
        &self,
        parent: Ino,
        name: &OsStr,
        target: &Path,
        caller: Caller,
    ) -> FsResult<Attr> {
        if target.as_os_str().len() > 4095 {
            return Err(FsError::NameTooLong);
        }
        let t = Some(target.to_path_buf());
        self.new_inode(parent, name, (FileKind::Symlink, 0o777, 0), t, caller)
    }

    /// Creates and opens a regular file.
    pub fn create(&self, parent: Ino, name: &OsStr, mode: u32, caller: Caller) -> FsResult<Attr> {
        let attr = self.new_inode(parent, name, (FileKind::File, mode, 0), None, caller)?;
        self.ns.get(attr.ino)?.meta().opens += 1;
        Ok(attr)
    }

    pub fn readlink(&self, ino: Ino) -> FsResult<PathBuf> {
        self.ns
            .get(ino)?
            .meta()
            .target
            .clone()
            .ok_or(FsError::Invalid)
    }

    pub fn link(&self, ino: Ino, new_parent: Ino, new_name: &OsStr) -> FsResult<Attr> {
        self.room_to_grow()?;
        let inode = self.ns.link(ino, new_parent, new_name)?;
        Ok(self.attr_of(&inode))
    }

    pub fn unlink(&self, parent: Ino, name: &OsStr) -> FsResult<()> {
        let inode = self.ns.unlink(parent, name)?;
        self.release_data_if_unreferenced(&inode);
        Ok(())
    }

    pub fn rmdir(&self, parent: Ino, name: &OsStr) -> FsResult<()> {
        self.ns.rmdir(parent, name).map(|_| ())
    }

    pub fn rename(
        &self,
        parent: Ino,
        name: &OsStr,
        new_parent: Ino,
        new_name: &OsStr,
        mode: RenameMode,
    ) -> FsResult<()> {
        if let Some(replaced) = self.ns.rename(parent, name, new_parent, new_name, mode)? {
            self.release_data_if_unreferenced(&replaced);
        }
        Ok(())
    }

    pub fn readdir(&self, ino: Ino, offset: u64, max: usize) -> FsResult<Vec<DirEntry>> {
        let entries = self.ns.readdir(ino, offset, max)?;
        if let Ok(dir) = self.ns.get(ino) {
            self.accessed(&dir);
        }
        Ok(entries)
    }

    /// The atime rules of the mount (see `atime.rs`).
    pub fn atime_policy(&self) -> &AtimePolicy {
        &self.atime
    }

    /// Updates `inode`'s atime for an access now, if the mount's rules say so.
    fn accessed(&self, inode: &Inode) {
        let now = SystemTime::now();
        let mut m = inode.meta();
        let a = &m.attr;
        let is_dir = a.kind == FileKind::Dir;
        if self
            .atime
            .needs_update(is_dir, a.atime, a.mtime, a.ctime, now)
        {
            m.attr.atime = now;
            drop(m);
            self.changed(inode);
        }
    }

    pub fn open(&self, ino: Ino) -> FsResult<Attr> {
        let inode = self.ns.get(ino)?;
        inode.meta().opens += 1;
        Ok(self.attr_of(&inode))
    }

    /// Closes a handle: the file's data goes back once nothing refers to it.
    pub fn release(&self, ino: Ino) -> FsResult<()> {
        let inode = self.ns.get(ino)?;
        {
            let mut m = inode.meta();
            m.opens = m.opens.saturating_sub(1);
        }
        self.release_data_if_unreferenced(&inode);
        Ok(())
    }

    /// Gives a deleted file's blocks back once no name and no handle refer to it.
    fn release_data_if_unreferenced(&self, inode: &Inode) {
        {
            let m = inode.meta();
            if !m.is_unreferenced() || m.released || m.attr.kind != FileKind::File {
                return;
            }
        }
        let _io = inode.io_exclusive();
        let blocks = {
            let mut m = inode.meta();
            if m.released || !m.is_unreferenced() {
                return;
            }
            m.released = true;
            let blocks = std::mem::take(&mut m.blocks);
            m.allocated = 0;
            for &i in blocks.keys() {
                m.block_changed(i);
            }
            blocks
        };
        self.changed(inode);
        // Drop cached pages first (waiting out any write-back in flight), then free.
        self.cache.invalidate(inode.ino, 0);
        self.free_later(blocks.into_values().map(|e| e.loc));
    }

    fn truncate(&self, inode: &Inode, size: u64) -> FsResult<()> {
        if size > MAX_FILE_SIZE {
            return Err(FsError::TooLarge);
        }
        let _io = inode.io_exclusive();
        let old = {
            let m = inode.meta();
            match m.attr.kind {
                FileKind::File => {}
                FileKind::Dir => return Err(FsError::IsDir),
                _ => return Err(FsError::Invalid),
            }
            m.attr.size
        };
        if size < old {
            let bs = self.block_size;
            let first_gone = size.div_ceil(bs);
            self.cache.invalidate(inode.ino, first_gone);
            let tail = size % bs;
            let last = size / bs;
            let last_exists = inode.meta().blocks.contains_key(&last);
            if tail != 0 && last_exists {
                // Keep "bytes past EOF in the last block are zero" true.
                let (from, to) = (tail as usize, bs as usize);
                self.cache.access(
                    self,
                    inode.ino,
                    last..last + 1,
                    |_| Fill::Write { from, to },
                    |_, buf, dirty| {
                        buf[tail as usize..].fill(0);
                        *dirty = true;
                        // The pages past the new end hold nothing any more.
                        self.shrink_block(inode, last, tail);
                        Ok(())
                    },
                )?;
                if self.volume.is_some() {
                    // On a volume the smaller size may be committed (by anyone's
                    // fsync) before this page is written back; after a crash the old
                    // bytes past the new end would then come back when the file
                    // grows again. So the zeros reach remote memory first.
                    self.cache.flush_inode(self, inode.ino)?;
                }
            }
            let freed = {
                let mut m = inode.meta();
                let freed = m.blocks.split_off(&first_gone);
                m.recount_allocated();
                for &i in freed.keys() {
                    m.block_changed(i);
                }
                m.attr.size = size;
                m.touch_mtime();
                freed
            };
            // Marked before the free is queued: the commit that releases the blocks
            // is then one that records them gone (see `volume/journal.rs`).
            self.changed(inode);
            self.free_later(freed.into_values().map(|e| e.loc));
        }
        let mut m = inode.meta();
        m.attr.size = size;
        m.touch_mtime();
        drop(m);
        self.changed(inode);
        Ok(())
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

    /// Up to `len` bytes at `offset` (fewer at the end of the file).
    pub fn read(&self, ino: Ino, offset: u64, len: u32) -> FsResult<Vec<u8>> {
        let mut out = vec![0u8; len as usize];
        let n = self.read_into(ino, offset, &mut out)?;
        out.truncate(n);
        Ok(out)
    }

    /// Reads into `dst` the bytes at `offset..offset + dst.len()` and returns how many
    /// it read (fewer at the end of the file): straight from the cache's pages into
    /// the caller's buffer (the FUSE ring's payload), with no copy in between.
    pub fn read_into(&self, ino: Ino, offset: u64, dst: &mut [u8]) -> FsResult<usize> {
        let len = dst.len();
        let inode = self.file_inode(ino)?;
        let _io = inode.io_shared();
        self.accessed(&inode);
        let size = inode.meta().attr.size;
        if offset >= size || len == 0 {
            FileCounters::count(&self.counters.reads, &self.counters.read_bytes, 0);
            return Ok(0);
        }
        let end = size.min(offset.saturating_add(len as u64));
        let bs = self.block_size;
        let first = offset / bs;
        let last = (end - 1) / bs;
        // A sequential reader gets the following blocks read ahead: by the prefetch
        // thread when one runs, else in this request's own batch.
        let sequential = inode.next_read.swap(end, Ordering::Relaxed) == offset && offset > 0;
        let last_block_of_file = (size - 1) / bs;
        let readahead_end = (last + 1 + self.readahead_blocks).min(last_block_of_file + 1);
        let load_end = if !sequential {
            inode.readahead_to.store(0, Ordering::Relaxed);
            last + 1
        } else if self.prefetch.is_running() {
            // Queue the blocks past what is queued already, to load while this
            // request is answered.
            let queued = inode.readahead_to.load(Ordering::Relaxed);
            // Beyond the window: left by an earlier pass over the file.
            let from = if queued > readahead_end {
                last + 1
            } else {
                queued.max(last + 1)
            };
            if from < readahead_end {
                inode.readahead_to.store(readahead_end, Ordering::Relaxed);
                self.prefetch.push(ino, from..readahead_end);
            }
            last + 1
        } else {
            readahead_end
        };
        // The bytes of block `i` this read returns.
        let wanted = |i: u64| {
            let block_start = i * bs;
            let from = offset.max(block_start) - block_start;
            let to = end.min(block_start + bs) - block_start;
            from as usize..to as usize
        };
        let mut done = 0usize;
        self.cache.read(
            self,
            ino,
            first..load_end,
            |i| {
                if !inode.meta().blocks.contains_key(&i) {
                    Fill::Zero
                } else if sequential {
                    // A stream: whole blocks, and the next ones read ahead.
                    Fill::Load
                } else {
                    // A random read loads what it reads, not the whole block.
                    let r = wanted(i);
                    Fill::Read {
                        from: r.start,
                        to: r.end,
                    }
                }
            },
            |i, base, buf| {
                if i <= last {
                    // A sector page's buffer starts at its sector (`base`).
                    let r = wanted(i);
                    let part = &buf[r.start - base..r.end - base];
                    dst[done..done + part.len()].copy_from_slice(part);
                    done += part.len();
                }
                Ok(())
            },
        )?;
        if sequential {
            // The stream is done with the blocks this read ends: they go first when
            // the cache needs room (see `PageCache::drop_behind`).
            self.cache
                .drop_behind(ino, finished_blocks(first, last, end, bs, end == size));
        }
        let c = &self.counters;
        FileCounters::count(&c.reads, &c.read_bytes, done);
        Ok(done)
    }

    /// Answers random reads that came together, what they miss loaded in one round
    /// trip per file (`PageCache::read_together`), under the file's I/O lock as
    /// [`RmemFs::read_into`] takes it. It leaves to `read_into` (their `done` stays
    /// None) the reads that continue a stream, the file's last read or one of the
    /// batch (the stream's read-ahead is there), that span blocks, read a hole or
    /// start at or past the end of the file, those of files it cannot read (the read
    /// reports why), and those whose load failed (the read loads again and reports
    /// the error). Returns how many blocks it loaded.
    pub fn read_together(&self, reads: &mut [ReadTogether<'_>]) -> usize {
        let mut order: Vec<usize> = (0..reads.len()).collect();
        order.sort_unstable_by_key(|&n| (reads[n].ino, reads[n].offset, n));
        let bs = self.block_size;
        let mut loaded = 0;
        let inos: Vec<Ino> = reads.iter().map(|r| r.ino).collect();
        for file in order.chunk_by(|&a, &b| inos[a] == inos[b]) {
            let ino = reads[file[0]].ino;
            let Ok(inode) = self.file_inode(ino) else {
                continue;
            };
            let _io = inode.io_shared();
            // The reads answered here, by offset: (block, its bytes they read, read).
            let mut wanted: Vec<(u64, std::ops::Range<usize>, usize)> =
                Vec::with_capacity(file.len());
            {
                let meta = inode.meta();
                let size = meta.attr.size;
                let next_read = inode.next_read.load(Ordering::Relaxed);
                let end_of = |r: &ReadTogether<'_>| r.offset.saturating_add(r.dst.len() as u64);
                for &n in file {
                    let (offset, len) = (reads[n].offset, reads[n].dst.len() as u64);
                    if offset >= size
                        || len == 0
                        || offset == next_read
                        || file.iter().any(|&m| end_of(&reads[m]) == offset)
                    {
                        continue;
                    }
                    let end = size.min(offset.saturating_add(len));
                    let i = offset / bs;
                    if (end - 1) / bs != i || !meta.blocks.contains_key(&i) {
                        continue;
                    }
                    let start = i * bs;
                    wanted.push((i, (offset - start) as usize..(end - start) as usize, n));
                }
            }
            if wanted.is_empty() {
                continue;
            }
            self.accessed(&inode);
            // One range per block: all that its reads want.
            let mut blocks: Vec<(u64, std::ops::Range<usize>)> = Vec::with_capacity(wanted.len());
            for (i, r, _) in &wanted {
                match blocks.last_mut() {
                    Some((j, all)) if j == i => all.end = all.end.max(r.end),
                    _ => blocks.push((*i, r.clone())),
                }
            }
            let read = self
                .cache
                .read_together(self, ino, &blocks, |i, base, buf| {
                    for (_, r, n) in wanted.iter().filter(|w| w.0 == i) {
                        // A sector page's buffer starts at its sector (`base`).
                        let part = &buf[r.start - base..r.end - base];
                        reads[*n].dst[..part.len()].copy_from_slice(part);
                        reads[*n].done = Some(part.len());
                    }
                    Ok(())
                });
            match read {
                Ok(n) => loaded += n,
                Err(e) => log::debug!("reads that came together: {e}; each is read alone"),
            }
            let c = &self.counters;
            for &(_, _, n) in &wanted {
                if let Some(done) = reads[n].done {
                    FileCounters::count(&c.reads, &c.read_bytes, done);
                }
            }
            // The file's next read continues a stream if it follows the last read
            // answered, as after reads answered one by one; when reads of it are left
            // to `read_into`, they set that as they are answered.
            if file.iter().all(|&n| reads[n].done.is_some()) {
                let last = file.iter().max().map(|&n| &reads[n]);
                if let Some(r) = last {
                    inode.readahead_to.store(0, Ordering::Relaxed);
                    let end = r.offset + r.done.unwrap_or(0) as u64;
                    inode.next_read.store(end, Ordering::Relaxed);
                }
            }
        }
        loaded
    }

    pub fn write(&self, ino: Ino, offset: u64, data: &[u8]) -> FsResult<u32> {
        if data.is_empty() {
            return Ok(0);
        }
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or(FsError::TooLarge)?;
        let inode = self.file_inode(ino)?;
        let _io = inode.io_shared();
        self.retry_when_full(|| self.allocate_blocks(&inode, offset..end))?;
        self.write_allocated(&inode, offset, data)
    }

    /// Whether the metadata may grow now: a volume keeps it within the room its next
    /// checkpoint has (see "Room to grow" in `volume/mod.rs`); scratch mode always.
    pub(crate) fn may_grow(&self) -> bool {
        self.volume.as_ref().is_none_or(|v| v.may_grow())
    }

    /// Before a change that makes the metadata larger (a new inode, name or
    /// extended attribute): ENOSPC when the volume has no room for it even after a
    /// commit, which grows the room while the memnodes have some and gives back what
    /// deletes freed. The caller holds no inode's meta lock (commits take them).
    pub(crate) fn room_to_grow(&self) -> FsResult<()> {
        if self.may_grow() {
            return Ok(());
        }
        self.commit().map_err(|_| FsError::NoSpace)?;
        match self.may_grow() {
            true => Ok(()),
            false => Err(FsError::NoSpace),
        }
    }

    /// Counts `count` new blocks' records as the checkpoint's growth.
    pub(crate) fn grew_blocks(&self, count: usize) {
        if let Some(v) = &self.volume {
            let pages = self.block_size.div_ceil(crate::remote::PAGE);
            let copies = self.remote.replicas().max(1) as u64;
            v.journal()
                .grew(count as u64 * crate::volume::block_record_bound(pages, copies));
        }
    }

    /// Counts a block grown by `bytes` (their pages' sums) as the checkpoint's growth.
    pub(crate) fn grew_pages(&self, bytes: u64) {
        if let Some(v) = &self.volume {
            v.journal().grew(5 * bytes.div_ceil(crate::remote::PAGE));
        }
    }

    /// Runs `alloc`; when it finds remote memory full on a volume whose freed blocks
    /// wait for a commit (deletes, truncates: see `volume/journal.rs`), commits now
    /// and runs it once more, as ext4 commits its journal before it answers ENOSPC.
    /// Without this, a file deleted to make room gives it back only at the next
    /// periodic commit. The caller holds no inode's meta lock (commits take them).
    /// Also when the volume had no room for the blocks' records (see
    /// [`RmemFs::room_to_grow`]).
    fn retry_when_full<T>(&self, mut alloc: impl FnMut() -> FsResult<T>) -> FsResult<T> {
        match alloc() {
            Err(FsError::NoSpace)
                if self
                    .volume
                    .as_ref()
                    .is_some_and(|v| v.journal().has_frees() || !v.may_grow()) =>
            {
                self.commit().map_err(|_| FsError::NoSpace)?;
                alloc()
            }
            r => r,
        }
    }

    /// Clears setuid/setgid of a file as `how` says, before a write or fallocate
    /// (see `privs.rs`); true when that changed its mode.
    pub fn kill_privs(&self, ino: Ino, how: KillPrivs) -> FsResult<bool> {
        let inode = self.file_inode(ino)?;
        let mut m = inode.meta();
        let perm = how.perm_after(m.attr.perm, m.attr.gid);
        if perm == m.attr.perm {
            return Ok(false);
        }
        m.attr.perm = perm;
        m.touch_ctime();
        drop(m);
        self.changed(&inode);
        Ok(true)
    }

    /// The second half of [`RmemFs::write`]: `data` into blocks that have locations,
    /// under the caller's io lock. Writers hold that lock shared, so another write may
    /// have filled a block this one allocated, and the page may even have gone to
    /// remote memory since: the rest of a partly written block is therefore always
    /// taken from the block (now, or when the page is completed before a read or a
    /// write-back, see `cache.rs`), never assumed empty because this writer allocated
    /// it. Loading a block whose content never reached remote memory yields zeros
    /// without a remote read (`written`).
    fn write_allocated(&self, inode: &Inode, offset: u64, data: &[u8]) -> FsResult<u32> {
        let end = offset + data.len() as u64;
        let bs = self.block_size;
        let first = offset / bs;
        let last = (end - 1) / bs;
        self.cache.access(
            self,
            inode.ino,
            first..last + 1,
            |i| {
                let block_start = i * bs;
                if offset <= block_start && end >= block_start + bs {
                    Fill::Overwrite
                } else {
                    Fill::Write {
                        from: (offset.max(block_start) - block_start) as usize,
                        to: (end.min(block_start + bs) - block_start) as usize,
                    }
                }
            },
            |i, buf, dirty| {
                let block_start = i * bs;
                let from = offset.max(block_start);
                let to = end.min(block_start + bs);
                // The page is locked: no write-back or load of the block is under
                // way while its copies change size.
                self.fit_block(inode, i, to - block_start)?;
                let src = &data[(from - offset) as usize..(to - offset) as usize];
                buf[(from - block_start) as usize..(to - block_start) as usize]
                    .copy_from_slice(src);
                *dirty = true;
                Ok(())
            },
        )?;
        let mut m = inode.meta();
        if end > m.attr.size {
            m.attr.size = end;
        }
        m.touch_mtime();
        // A write drops file capabilities, as on a local filesystem. The kernel asks
        // for that itself before writes through its page cache, not direct-I/O ones.
        m.xattrs.remove(OsStr::new(privs::FILE_CAPABILITIES));
        drop(m);
        self.changed(inode);
        let prev_end = inode.next_write.swap(end, Ordering::Relaxed);
        if continues_stream(prev_end, offset, end - offset) {
            // A stream: what it has finished goes to remote memory now, behind it
            // (see `PageCache::write_behind`).
            self.cache
                .write_behind(inode.ino, finished_blocks(first, last, end, bs, false));
        }
        let c = &self.counters;
        FileCounters::count(&c.writes, &c.write_bytes, data.len());
        Ok(data.len() as u32)
    }

    /// Gives every block that bytes `range` of the file touch and that has none a
    /// remote location, of the block's bytes up to the range's end (in whole pages).
    /// On failure the blocks allocated by this call are given back, so nothing
    /// half-made remains. Returns the blocks that are new (their remote content is
    /// undefined). Blocks that have a smaller location keep it: see
    /// [`RmemFs::fit_block`].
    fn allocate_blocks(&self, inode: &Inode, range: std::ops::Range<u64>) -> FsResult<Vec<u64>> {
        let bs = self.block_size;
        let mut m = inode.meta();
        let mut fresh = Vec::new();
        for i in range.start / bs..(range.end - 1) / bs + 1 {
            if m.blocks.contains_key(&i) {
                continue;
            }
            let alloc = match self.may_grow() {
                true => self
                    .remote
                    .alloc_block(range.end.min((i + 1) * bs) - i * bs),
                false => Err(crate::remote::RemoteError::NoSpace),
            };
            match alloc {
                Ok(loc) => {
                    m.insert_block(i, BlockEntry::unwritten(loc));
                    m.block_changed(i);
                    fresh.push(i);
                }
                Err(e) => {
                    let undo: Vec<BlockLoc> = fresh
                        .iter()
                        .filter_map(|&i| m.remove_block(i))
                        .map(|e| e.loc)
                        .collect();
                    drop(m);
                    // Never committed (the meta lock was held throughout): free now.
                    self.remote.free_blocks(undo);
                    return Err(e.into());
                }
            }
        }
        drop(m);
        if !fresh.is_empty() {
            self.grew_blocks(fresh.len());
            self.changed(inode);
        }
        Ok(fresh)
    }

    /// Writes back the file's dirty pages and reports any write-back failure since the
    /// last report (fsync, flush on close).
    pub fn fsync(&self, ino: Ino) -> FsResult<()> {
        let inode = self.ns.get(ino)?;
        if inode.meta().attr.kind != FileKind::File {
            return Ok(());
        }
        let _io = inode.io_shared();
        let flushed = self.cache.flush_inode(self, ino);
        if let Some(e) = inode.meta().write_error.take() {
            return Err(e);
        }
        flushed
    }

    /// fsync(2): the file's data written back, then (on a volume) every change so
    /// far made durable.
    pub fn fsync_durable(&self, ino: Ino) -> FsResult<()> {
        self.fsync(ino)?;
        self.commit()
    }

    /// Writes back everything, then commits (periodic flusher, unmount).
    pub fn flush_all(&self) -> FsResult<()> {
        let flushed = self.cache.flush_all(self);
        let committed = self.commit();
        flushed.and(committed)
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

    /// Flushes everything; on a volume writes a last checkpoint and lets go of the
    /// volume (its memory stays on the memnodes), else gives all remote memory back
    /// (unmount). On a volume only the first call does anything: once the volume is
    /// let go there is nothing to flush to (the FUSE session's end and the daemon's
    /// both call it).
    pub fn shutdown(&self) {
        if self.volume.as_ref().is_some_and(|v| v.is_closed()) {
            return;
        }
        if let Err(e) = self.flush_all() {
            log::error!("flush at unmount failed: {e}");
        }
        match &self.volume {
            Some(v) if !v.close() => {}
            Some(v) => {
                match v.checkpoint(&self.ns) {
                    Ok(()) => log::info!("volume {}: everything is durable", v.name()),
                    Err(e) => log::error!("volume {}: last checkpoint failed: {e}", v.name()),
                }
                self.remote.stop_background();
                self.remote.close_volume();
                self.remote.end_sessions();
            }
            None => {
                self.remote.stop_background();
                self.remote.release_all();
                self.remote.end_sessions();
            }
        }
    }
}

mod backing;
pub mod copy;
mod fit;
mod prefetch;
mod repair;
mod scrub;

pub use repair::Redundancy;
mod space;
mod xattr;

pub use space::{Allocate, Seek};
pub use xattr::SetXattrMode;

#[cfg(test)]
mod tests;
