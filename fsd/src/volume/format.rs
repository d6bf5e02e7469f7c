//! The on-remote-memory format of a volume's metadata: records, log entries,
//! checkpoints and superblocks. Pure encoding and decoding, no I/O.
//!
//! Everything is little-endian. One record codec serves both the log and the
//! checkpoint: a checkpoint is the records that rebuild the whole namespace, a log
//! entry is the records of one change (or of one commit's dirty inodes). Records are
//! *states*, not deltas ("inode 7's attributes are now X", "block 3 of inode 7 is at
//! these copies"), so applying one twice, or a later state over an earlier one, is
//! harmless; only directory entries are deltas, and those are applied in log order.
//!
//! Every log entry and every checkpoint carries a crc32c over its bytes, and every log
//! entry a sequence number that must be exactly the next one: a torn, stale or
//! corrupted entry is never applied as valid. Decoding never panics on any input: the
//! bytes come from remote memory that a bug or another process may have scribbled on.
//!
//! A block record carries the length of its remote allocation (whole 4 KiB pages, as
//! small files take them) and the crc32c of each of its pages that fsd knows
//! (`remote/sums.rs`). Version 1 had one 32-bit checksum slot per block, always
//! zero; version 2 reads that word as the number of page sums after the copies, so a
//! version 1 record is a version 2 record with no sums, and fsd reads both. A page's
//! logged sum is only as new as the commit that wrote it: before a block whose sums
//! are in the log is written again, fsd logs [`Record::SumsStale`] for it (see
//! `volume/mod.rs`), so after a crash its pages are taken as unchecked, never as bad.

use rmemfs_common::crc32c::crc32c;
use thiserror::Error;

// How the types below are laid out: the record codec (shared by log and checkpoint),
// log entries, and the superblock and checkpoint headers.
mod checkpoint;
mod log;
mod records;

pub use checkpoint::{decode_checkpoint, encode_checkpoint};
pub use log::{encode_entry, entry_at, scan_log};
pub use records::{decode_records, encode_records, Reader, Writer};

/// Bumped whenever a layout below changes. This fsd writes this version.
pub const FORMAT_VERSION: u32 = 2;
/// The oldest version this fsd reads (a mount rewrites it as [`FORMAT_VERSION`]).
pub const OLDEST_READABLE_VERSION: u32 = 1;

const SUPERBLOCK_MAGIC: &[u8; 8] = b"RMEMFSSB";
const CHECKPOINT_MAGIC: &[u8; 8] = b"RMEMFSCP";
const ENTRY_MAGIC: u32 = 0x454c_4d52; // "RMLE"

/// Bytes before a log entry's records.
pub const ENTRY_HEADER: usize = 24;
/// Log entries start at multiples of this, so a reader can look for the next one.
pub const ENTRY_ALIGN: usize = 8;
/// Bytes of one superblock copy; the root chunk holds two (written alternately).
pub const SUPERBLOCK_SLOT: usize = 2048;
/// Most memnodes a superblock's member table names.
pub const MAX_MEMBERS: usize = 64;
/// Bytes before a checkpoint's records.
pub const CHECKPOINT_HEADER: usize = 48;
/// The largest generation and log sequence number a superblock may hold. fsd adds to
/// both (a checkpoint one, a degraded mount 2^32, each log entry one): a superblock
/// near the end of u64 was made up, not counted to (2^62 checkpoints at one per
/// nanosecond take 146 years), and is refused so that no sum wraps.
pub const MAX_COUNTER: u64 = 1 << 62;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum FormatError {
    #[error("truncated: need {needed} bytes, have {have}")]
    Truncated { needed: usize, have: usize },
    #[error("bad magic")]
    Magic,
    #[error(
        "format version {0} is not supported (this fsd reads versions \
         {OLDEST_READABLE_VERSION} to {FORMAT_VERSION})"
    )]
    Version(u32),
    #[error("checksum mismatch")]
    Checksum,
    #[error("unknown record type {0}")]
    RecordType(u8),
    #[error("field {0} is out of range")]
    BadField(&'static str),
}

/// A time as seconds and nanoseconds since the epoch (may be before it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Time {
    pub secs: i64,
    pub nanos: u32,
}

/// An inode's attributes as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredAttr {
    pub ino: u64,
    /// 1 file, 2 dir, 3 symlink, 4 fifo, 5 socket, 6 char device, 7 block device.
    pub kind: u8,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub size: u64,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
}

/// One copy of a block: a member slot (index into the superblock's member table)
/// and the remote address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredCopy {
    pub slot: u16,
    pub addr: u64,
}

/// The block record's flags.
pub const BLOCK_WRITTEN: u8 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBlock {
    pub ino: u64,
    pub index: u64,
    pub flags: u8,
    /// Bytes of the remote allocation each copy has.
    pub alloc_len: u32,
    /// crc32c of each page of the copies from the first (`None`: not known); at most
    /// one per page of `alloc_len`, and none past the last known one.
    pub sums: Vec<Option<u32>>,
    pub copies: Vec<StoredCopy>,
}

/// One metadata record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// Creates the inode or replaces its attributes.
    Attr(StoredAttr),
    /// A symlink's target.
    Target {
        ino: u64,
        target: Vec<u8>,
    },
    /// The whole set of an inode's extended attributes.
    Xattrs {
        ino: u64,
        xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    },
    Block(StoredBlock),
    /// The pages of file `ino` may hold bytes newer than the sums the log gave them
    /// (fsd is about to write some back): none of its blocks' sums so far count.
    SumsStale {
        ino: u64,
    },
    BlockGone {
        ino: u64,
        index: u64,
    },
    /// The inode and everything it held are gone.
    InodeGone {
        ino: u64,
    },
    /// `ino` is a directory whose ".." is `parent` (created, or moved).
    Dir {
        ino: u64,
        parent: u64,
    },
    DirAdd {
        dir: u64,
        cookie: u64,
        ino: u64,
        name: Vec<u8>,
    },
    DirRemove {
        dir: u64,
        name: Vec<u8>,
    },
    /// The next readdir cookie a directory hands out (checkpoints).
    DirNextCookie {
        dir: u64,
        next: u64,
    },
    /// The next inode number the volume hands out.
    NextIno {
        next: u64,
    },
}

pub fn crc(bytes: &[u8]) -> u32 {
    crc32c(bytes)
}

/// One valid log entry found in a log area.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<'a> {
    pub seq: u64,
    pub body: &'a [u8],
    /// Offset just past the entry (and its padding).
    pub end: usize,
}

/// What a log area holds: its valid entries from the start, in sequence from
/// `first_seq`, and whether anything valid follows the first gap (which means
/// damage in the middle of the log, not a torn tail).
#[derive(Debug)]
pub struct LogScan<'a> {
    pub entries: Vec<Entry<'a>>,
    /// Offset just past the last valid entry: where the next one would go.
    pub end: usize,
    /// Offset of a valid entry with a later sequence number found after the gap.
    pub damaged_at: Option<usize>,
}

/// A range of remote memory on the same memnode as the superblock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Area {
    pub addr: u64,
    pub len: u64,
}

/// One superblock copy: which generation of metadata is current, where this
/// memnode's copy of it lives, and which memnodes the volume's member slots are.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Superblock {
    pub volume_id: u64,
    /// Bumped by every checkpoint; the highest valid one wins.
    pub generation: u64,
    pub block_size: u32,
    /// The sequence number of the first entry of this generation's log.
    pub first_seq: u64,
    /// Where this memnode holds the checkpoint and log (absent: it holds none).
    pub checkpoint: Option<(Area, u32)>,
    pub log: Option<Area>,
    /// Member slot -> memnode id (0: no memnode in that slot this generation).
    pub members: Vec<u64>,
    /// The format version it was written in (encoding always writes
    /// [`FORMAT_VERSION`]).
    pub version: u32,
}

#[cfg(test)]
mod tests;
