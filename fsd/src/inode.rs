//! Inodes: attributes, block maps, and the per-inode locks.
//!
//! Each inode has two locks:
//! - `io` (RwLock): data operations (read, write, flush) hold it shared; operations
//!   that change which blocks exist (truncate, releasing a deleted file's data) hold it
//!   exclusively, so no read or write ever sees a block disappear under it.
//! - `meta` (Mutex): attributes and the block map. Held briefly, never across remote
//!   I/O except to allocate a block; it is the innermost lock of the data path
//!   (io -> page -> meta).

use crate::error::FsError;
use crate::remote::sums::Sums;
use crate::remote::BlockLoc;
use rmemfs_common::sync::{lock, read, write};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Mutex, MutexGuard, RwLock};
use std::time::SystemTime;

pub type Ino = u64;
pub const ROOT_INO: Ino = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

/// The attributes `stat` shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub kind: FileKind,
    pub size: u64,
    /// Bytes of remote memory held: the pages of its blocks, one copy each.
    pub allocated: u64,
    /// Permission bits, including setuid, setgid and sticky (mode & 0o7777).
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
}

/// One block of a file: where its copies live, and whether remote memory holds its
/// content.
///
/// A block gets its location when first written, but its remote bytes are undefined
/// (a reused block holds whatever was there) until its page is written back. Until
/// then `written` is false and loading the block yields zeros, never remote bytes: a
/// reader racing the first writer must not pull stale data into the cache.
///
/// `sums` has the checksum of each page of the copies that fsd knows (see
/// `remote/sums.rs`): set when the page is written back, or zeroed when the copies
/// grow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockEntry {
    pub loc: BlockLoc,
    pub written: bool,
    pub sums: Sums,
}

impl BlockEntry {
    /// A block whose copies at `loc` hold nothing yet.
    pub fn unwritten(loc: BlockLoc) -> BlockEntry {
        BlockEntry {
            loc,
            written: false,
            sums: Sums::default(),
        }
    }
}

/// Everything about an inode that `meta` protects.
#[derive(Debug)]
pub struct Meta {
    pub attr: Attr,
    /// Regular files: block index -> remote location. Holes are absent.
    pub blocks: BTreeMap<u64, BlockEntry>,
    /// Bytes of remote memory `blocks` hold, one copy each (`st_blocks`). Kept by
    /// [`Meta::insert_block`], [`Meta::remove_block`], [`Meta::resize_block`], and
    /// [`Meta::recount_allocated`] after changing `blocks` wholesale.
    pub allocated: u64,
    /// Symlinks: the target.
    pub target: Option<PathBuf>,
    /// Extended attributes.
    pub xattrs: BTreeMap<OsString, Vec<u8>>,
    /// References the kernel holds (lookup count, decremented by forget).
    pub lookups: u64,
    /// Open file handles.
    pub opens: u64,
    /// First write-back failure since the last fsync/flush reported one.
    pub write_error: Option<FsError>,
    /// True once the data of a deleted file was given back.
    pub released: bool,
    /// On a durable volume: blocks whose entry changed since the last commit (the
    /// commit records their state). `None` in scratch mode, where nothing is logged.
    pub dirty_blocks: Option<BTreeSet<u64>>,
    /// On a durable volume: the log may hold page sums of this file's blocks that a
    /// write-back would make stale, so one must log [`Record::SumsStale`] first
    /// (`volume/mod.rs`, "Page sums in the log").
    ///
    /// [`Record::SumsStale`]: crate::volume::format::Record::SumsStale
    pub sums_logged: bool,
    /// Write-backs of this file's blocks under way (between choosing their copies and
    /// recording their outcome): while any is, a commit logs no sums for it.
    pub writebacks: u32,
}

pub struct Inode {
    pub ino: Ino,
    pub io: RwLock<()>,
    pub meta: Mutex<Meta>,
    /// Byte offset just past the last read, for sequential-read detection.
    pub next_read: AtomicU64,
    /// Block index up to which a sequential reader's readahead has been queued.
    pub readahead_to: AtomicU64,
    /// Byte offset just past the last write, for sequential-write detection.
    pub next_write: AtomicU64,
    /// Set while the inode waits in the volume journal's dirty set.
    pub journal_dirty: AtomicBool,
}

impl Inode {
    pub fn new(attr: Attr, target: Option<PathBuf>) -> Inode {
        Inode {
            ino: attr.ino,
            io: RwLock::new(()),
            meta: Mutex::new(Meta {
                attr,
                blocks: BTreeMap::new(),
                allocated: 0,
                target,
                xattrs: BTreeMap::new(),
                lookups: 0,
                opens: 0,
                write_error: None,
                released: false,
                dirty_blocks: None,
                sums_logged: false,
                writebacks: 0,
            }),
            next_read: AtomicU64::new(0),
            readahead_to: AtomicU64::new(0),
            next_write: AtomicU64::new(0),
            journal_dirty: AtomicBool::new(false),
        }
    }

    pub fn meta(&self) -> MutexGuard<'_, Meta> {
        lock(&self.meta)
    }

    pub fn io_shared(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        read(&self.io)
    }

    pub fn io_exclusive(&self) -> std::sync::RwLockWriteGuard<'_, ()> {
        write(&self.io)
    }
}

impl Meta {
    pub fn insert_block(&mut self, index: u64, entry: BlockEntry) {
        self.allocated += entry.loc.bytes();
        if let Some(old) = self.blocks.insert(index, entry) {
            self.allocated -= old.loc.bytes();
        }
    }

    pub fn remove_block(&mut self, index: u64) -> Option<BlockEntry> {
        let e = self.blocks.remove(&index)?;
        self.allocated -= e.loc.bytes();
        Some(e)
    }

    /// Gives block `index` the copies `loc` (of another size); returns the old ones.
    pub fn resize_block(&mut self, index: u64, loc: BlockLoc) -> Option<BlockLoc> {
        let e = self.blocks.get_mut(&index)?;
        self.allocated = self.allocated + loc.bytes() - e.loc.bytes();
        Some(std::mem::replace(&mut e.loc, loc))
    }

    pub fn recount_allocated(&mut self) {
        self.allocated = self.blocks.values().map(|e| e.loc.bytes()).sum();
    }

    /// True when nothing refers to the file's data any more: no name, no open handle.
    pub fn is_unreferenced(&self) -> bool {
        self.attr.nlink == 0 && self.opens == 0
    }

    pub fn touch_mtime(&mut self) {
        let now = SystemTime::now();
        self.attr.mtime = now;
        self.attr.ctime = now;
    }

    /// Notes that block `index`'s entry changed (a durable volume logs it).
    pub fn block_changed(&mut self, index: u64) {
        if let Some(d) = &mut self.dirty_blocks {
            d.insert(index);
        }
    }

    pub fn touch_ctime(&mut self) {
        self.attr.ctime = SystemTime::now();
    }
}
