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

use rmemfs_common::crc32c::{crc32c, crc32c_of};
use rmemfs_common::le;
use thiserror::Error;

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

const R_ATTR: u8 = 1;
const R_TARGET: u8 = 2;
const R_XATTRS: u8 = 3;
const R_BLOCK: u8 = 4;
const R_BLOCK_GONE: u8 = 5;
const R_INODE_GONE: u8 = 6;
const R_DIR: u8 = 7;
const R_DIR_ADD: u8 = 8;
const R_DIR_REMOVE: u8 = 9;
const R_DIR_NEXT_COOKIE: u8 = 10;
const R_NEXT_INO: u8 = 11;
const R_SUMS_STALE: u8 = 12;

/// Longest name, target, xattr name or value a record may hold.
const MAX_FIELD: usize = 1 << 20;
/// Most copies a block record may list.
const MAX_COPIES: usize = 16;

pub fn crc(bytes: &[u8]) -> u32 {
    crc32c(bytes)
}

/// Appends little-endian fields.
#[derive(Default)]
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    fn u16(&mut self, v: u16) {
        le::put(&mut self.buf, v);
    }
    fn u32(&mut self, v: u32) {
        le::put(&mut self.buf, v);
    }
    fn u64(&mut self, v: u64) {
        le::put(&mut self.buf, v);
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.buf.extend_from_slice(b);
    }
    fn time(&mut self, t: Time) {
        self.u64(t.secs as u64);
        self.u32(t.nanos);
    }
    /// Page sums: a bitmap of the known ones (bit k of byte k / 8), then those sums.
    fn page_sums(&mut self, sums: &[Option<u32>]) {
        let mut bits = vec![0u8; sums.len().div_ceil(8)];
        for (k, s) in sums.iter().enumerate() {
            if s.is_some() {
                bits[k / 8] |= 1 << (k % 8);
            }
        }
        self.buf.extend_from_slice(&bits);
        for s in sums.iter().flatten() {
            self.u32(*s);
        }
    }

    /// Appends one record: type, body length, body.
    pub fn record(&mut self, r: &Record) {
        let start = self.buf.len();
        self.u8(0);
        self.u32(0);
        let body = self.buf.len();
        let kind = match r {
            Record::Attr(a) => {
                self.u64(a.ino);
                self.u8(a.kind);
                self.u16(a.perm);
                self.u32(a.nlink);
                self.u32(a.uid);
                self.u32(a.gid);
                self.u32(a.rdev);
                self.u64(a.size);
                self.time(a.atime);
                self.time(a.mtime);
                self.time(a.ctime);
                R_ATTR
            }
            Record::Target { ino, target } => {
                self.u64(*ino);
                self.bytes(target);
                R_TARGET
            }
            Record::Xattrs { ino, xattrs } => {
                self.u64(*ino);
                self.u32(xattrs.len() as u32);
                for (n, v) in xattrs {
                    self.bytes(n);
                    self.bytes(v);
                }
                R_XATTRS
            }
            Record::Block(b) => {
                self.u64(b.ino);
                self.u64(b.index);
                self.u8(b.flags);
                self.u32(b.alloc_len);
                // Trailing unknown sums say nothing: not stored.
                let summed = b
                    .sums
                    .iter()
                    .rposition(Option::is_some)
                    .map_or(0, |p| p + 1);
                self.u32(summed as u32);
                self.u8(b.copies.len() as u8);
                for c in &b.copies {
                    self.u16(c.slot);
                    self.u64(c.addr);
                }
                self.page_sums(&b.sums[..summed]);
                R_BLOCK
            }
            Record::SumsStale { ino } => {
                self.u64(*ino);
                R_SUMS_STALE
            }
            Record::BlockGone { ino, index } => {
                self.u64(*ino);
                self.u64(*index);
                R_BLOCK_GONE
            }
            Record::InodeGone { ino } => {
                self.u64(*ino);
                R_INODE_GONE
            }
            Record::Dir { ino, parent } => {
                self.u64(*ino);
                self.u64(*parent);
                R_DIR
            }
            Record::DirAdd {
                dir,
                cookie,
                ino,
                name,
            } => {
                self.u64(*dir);
                self.u64(*cookie);
                self.u64(*ino);
                self.bytes(name);
                R_DIR_ADD
            }
            Record::DirRemove { dir, name } => {
                self.u64(*dir);
                self.bytes(name);
                R_DIR_REMOVE
            }
            Record::DirNextCookie { dir, next } => {
                self.u64(*dir);
                self.u64(*next);
                R_DIR_NEXT_COOKIE
            }
            Record::NextIno { next } => {
                self.u64(*next);
                R_NEXT_INO
            }
        };
        let len = (self.buf.len() - body) as u32;
        self.buf[start] = kind;
        le::put_at(&mut self.buf, start + 1, len);
    }
}

impl From<le::Truncated> for FormatError {
    fn from(t: le::Truncated) -> Self {
        FormatError::Truncated {
            needed: t.needed,
            have: t.have,
        }
    }
}

/// Reads the format's fields over [`le::Reader`], failing instead of panicking.
pub struct Reader<'a> {
    r: le::Reader<'a>,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader {
            r: le::Reader::new(buf),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.r.is_empty()
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        Ok(self.r.take(n)?)
    }
    fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.r.u8()?)
    }
    fn u16(&mut self) -> Result<u16, FormatError> {
        Ok(self.r.u16()?)
    }
    fn u32(&mut self) -> Result<u32, FormatError> {
        Ok(self.r.u32()?)
    }
    fn u64(&mut self) -> Result<u64, FormatError> {
        Ok(self.r.u64()?)
    }
    fn bytes(&mut self, field: &'static str) -> Result<Vec<u8>, FormatError> {
        let n = self.u32()? as usize;
        if n > MAX_FIELD {
            return Err(FormatError::BadField(field));
        }
        Ok(self.take(n)?.to_vec())
    }
    fn time(&mut self) -> Result<Time, FormatError> {
        let secs = self.u64()? as i64;
        let nanos = self.u32()?;
        if nanos >= 1_000_000_000 {
            return Err(FormatError::BadField("nanoseconds"));
        }
        Ok(Time { secs, nanos })
    }
    /// `n` page sums as [`Writer::page_sums`] lays them out; the last must be known
    /// (one encoding per list, so a record re-encodes to its own bytes).
    fn page_sums(&mut self, n: usize) -> Result<Vec<Option<u32>>, FormatError> {
        let bits = self.take(n.div_ceil(8))?;
        let known = |k: usize| bits[k / 8] & (1 << (k % 8)) != 0;
        // Bits past the n-th must be clear.
        let spare = match (n % 8, bits.last()) {
            (0, _) | (_, None) => 0,
            (used, Some(last)) => last >> used,
        };
        if n > 0 && (!known(n - 1) || spare != 0) {
            return Err(FormatError::BadField("page sums"));
        }
        (0..n)
            .map(|k| {
                if known(k) {
                    self.u32().map(Some)
                } else {
                    Ok(None)
                }
            })
            .collect()
    }

    /// Reads one record; its body must be consumed exactly.
    pub fn record(&mut self) -> Result<Record, FormatError> {
        let kind = self.u8()?;
        let len = self.u32()? as usize;
        let body = self.take(len)?;
        let mut r = Reader::new(body);
        let rec = match kind {
            R_ATTR => {
                let ino = r.u64()?;
                let kind = r.u8()?;
                if !(1..=7).contains(&kind) {
                    return Err(FormatError::BadField("file kind"));
                }
                Record::Attr(StoredAttr {
                    ino,
                    kind,
                    perm: r.u16()?,
                    nlink: r.u32()?,
                    uid: r.u32()?,
                    gid: r.u32()?,
                    rdev: r.u32()?,
                    size: r.u64()?,
                    atime: r.time()?,
                    mtime: r.time()?,
                    ctime: r.time()?,
                })
            }
            R_TARGET => Record::Target {
                ino: r.u64()?,
                target: r.bytes("symlink target")?,
            },
            R_XATTRS => {
                let ino = r.u64()?;
                let n = r.u32()? as usize;
                // Each pair takes at least 8 bytes: a count beyond that is a lie.
                if n > body.len() / 8 {
                    return Err(FormatError::BadField("xattr count"));
                }
                let mut xattrs = Vec::with_capacity(n);
                for _ in 0..n {
                    xattrs.push((r.bytes("xattr name")?, r.bytes("xattr value")?));
                }
                Record::Xattrs { ino, xattrs }
            }
            R_BLOCK => {
                let ino = r.u64()?;
                let index = r.u64()?;
                let flags = r.u8()?;
                if flags & !BLOCK_WRITTEN != 0 {
                    return Err(FormatError::BadField("block flags"));
                }
                let alloc_len = r.u32()?;
                // Whole 4 KiB pages of a block (blocks are at most 16 MiB).
                if alloc_len == 0 || alloc_len % 4096 != 0 || alloc_len > 16 << 20 {
                    return Err(FormatError::BadField("block allocation length"));
                }
                let summed = r.u32()? as usize;
                if summed > alloc_len as usize / 4096 {
                    return Err(FormatError::BadField("page sums"));
                }
                let n = r.u8()? as usize;
                if n > MAX_COPIES {
                    return Err(FormatError::BadField("copies"));
                }
                let mut copies = Vec::with_capacity(n);
                for _ in 0..n {
                    copies.push(StoredCopy {
                        slot: r.u16()?,
                        addr: r.u64()?,
                    });
                }
                let sums = r.page_sums(summed)?;
                Record::Block(StoredBlock {
                    ino,
                    index,
                    flags,
                    alloc_len,
                    sums,
                    copies,
                })
            }
            R_SUMS_STALE => Record::SumsStale { ino: r.u64()? },
            R_BLOCK_GONE => Record::BlockGone {
                ino: r.u64()?,
                index: r.u64()?,
            },
            R_INODE_GONE => Record::InodeGone { ino: r.u64()? },
            R_DIR => Record::Dir {
                ino: r.u64()?,
                parent: r.u64()?,
            },
            R_DIR_ADD => Record::DirAdd {
                dir: r.u64()?,
                cookie: r.u64()?,
                ino: r.u64()?,
                name: r.bytes("name")?,
            },
            R_DIR_REMOVE => Record::DirRemove {
                dir: r.u64()?,
                name: r.bytes("name")?,
            },
            R_DIR_NEXT_COOKIE => Record::DirNextCookie {
                dir: r.u64()?,
                next: r.u64()?,
            },
            R_NEXT_INO => Record::NextIno { next: r.u64()? },
            other => return Err(FormatError::RecordType(other)),
        };
        if !r.is_empty() {
            return Err(FormatError::BadField("record length"));
        }
        Ok(rec)
    }
}

/// Decodes a run of records (a log entry's or a checkpoint's body).
pub fn decode_records(body: &[u8]) -> Result<Vec<Record>, FormatError> {
    let mut r = Reader::new(body);
    let mut out = Vec::new();
    while !r.is_empty() {
        out.push(r.record()?);
    }
    Ok(out)
}

pub fn encode_records<'a>(records: impl IntoIterator<Item = &'a Record>) -> Vec<u8> {
    let mut w = Writer::default();
    for r in records {
        w.record(r);
    }
    w.buf
}

/// Frames one log entry: header (magic, body length, sequence number, crc over
/// sequence, length and body), the body, zero padding to [`ENTRY_ALIGN`].
pub fn encode_entry(seq: u64, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ENTRY_HEADER + body.len() + ENTRY_ALIGN);
    le::put(&mut out, ENTRY_MAGIC);
    le::put(&mut out, body.len() as u32);
    le::put(&mut out, seq);
    le::put(&mut out, entry_crc(seq, body));
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(body);
    while !out.len().is_multiple_of(ENTRY_ALIGN) {
        out.push(0);
    }
    out
}

fn entry_crc(seq: u64, body: &[u8]) -> u32 {
    let mut head = [0u8; 12];
    le::put_at(&mut head, 0, seq);
    le::put_at(&mut head, 8, body.len() as u32);
    crc32c_of(&[&head, body])
}

/// One valid log entry found in a log area.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<'a> {
    pub seq: u64,
    pub body: &'a [u8],
    /// Offset just past the entry (and its padding).
    pub end: usize,
}

/// The entry at `offset` of `log`, if one is there whole and valid.
pub fn entry_at(log: &[u8], offset: usize) -> Option<Entry<'_>> {
    let head = log.get(offset..offset.checked_add(ENTRY_HEADER)?)?;
    let word = |i: usize| le::u32_at(head, i).unwrap_or_default();
    if word(0) != ENTRY_MAGIC {
        return None;
    }
    let len = word(4) as usize;
    let seq = le::u64_at(head, 8)?;
    let start = offset + ENTRY_HEADER;
    let body = log.get(start..start.checked_add(len)?)?;
    if entry_crc(seq, body) != word(16) {
        return None;
    }
    let end = (start + len).next_multiple_of(ENTRY_ALIGN);
    Some(Entry { seq, body, end })
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

pub fn scan_log(log: &[u8], first_seq: u64) -> LogScan<'_> {
    let mut entries = Vec::new();
    let mut at = 0;
    let mut seq = first_seq;
    while let Some(e) = entry_at(log, at) {
        if e.seq != seq {
            break;
        }
        seq += 1;
        at = e.end;
        entries.push(e);
    }
    // A torn tail has nothing valid after it; a valid later entry means the bytes at
    // `at` were damaged after they were written.
    let mut damaged_at = None;
    let mut probe = at + ENTRY_ALIGN;
    while probe + ENTRY_HEADER <= log.len() {
        if let Some(e) = entry_at(log, probe) {
            if e.seq > seq {
                damaged_at = Some(at);
                break;
            }
        }
        probe += ENTRY_ALIGN;
    }
    LogScan {
        entries,
        end: at,
        damaged_at,
    }
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

impl Superblock {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.buf.extend_from_slice(SUPERBLOCK_MAGIC);
        w.u32(FORMAT_VERSION);
        w.u64(self.volume_id);
        w.u64(self.generation);
        w.u32(self.block_size);
        w.u64(self.first_seq);
        let (ck, ck_crc) = self.checkpoint.unwrap_or_default();
        w.u8(self.checkpoint.is_some() as u8);
        w.u64(ck.addr);
        w.u64(ck.len);
        w.u32(ck_crc);
        let log = self.log.unwrap_or_default();
        w.u8(self.log.is_some() as u8);
        w.u64(log.addr);
        w.u64(log.len);
        w.u16(self.members.len().min(MAX_MEMBERS) as u16);
        for m in self.members.iter().take(MAX_MEMBERS) {
            w.u64(*m);
        }
        let c = crc(&w.buf);
        w.u32(c);
        w.buf
    }

    /// Decodes one slot; an all-zero slot (never written) is `Ok(None)`.
    pub fn decode(slot: &[u8]) -> Result<Option<Superblock>, FormatError> {
        if slot.iter().all(|&b| b == 0) {
            return Ok(None);
        }
        let mut r = Reader::new(slot);
        if r.take(8)? != SUPERBLOCK_MAGIC {
            return Err(FormatError::Magic);
        }
        let version = r.u32()?;
        let volume_id = r.u64()?;
        let generation = r.u64()?;
        let block_size = r.u32()?;
        let first_seq = r.u64()?;
        let has_ck = r.u8()?;
        let ck = Area {
            addr: r.u64()?,
            len: r.u64()?,
        };
        let ck_crc = r.u32()?;
        let has_log = r.u8()?;
        let log = Area {
            addr: r.u64()?,
            len: r.u64()?,
        };
        let n = r.u16()? as usize;
        if n > MAX_MEMBERS {
            return Err(FormatError::BadField("members"));
        }
        let mut members = Vec::with_capacity(n);
        for _ in 0..n {
            members.push(r.u64()?);
        }
        let covered = r.r.position();
        let stored = r.u32()?;
        if crc(&slot[..covered]) != stored {
            return Err(FormatError::Checksum);
        }
        check_version(version)?;
        Ok(Some(Superblock {
            volume_id,
            generation,
            block_size,
            first_seq,
            checkpoint: (has_ck != 0).then_some((ck, ck_crc)),
            log: (has_log != 0).then_some(log),
            members,
            version,
        }))
    }
}

fn check_version(version: u32) -> Result<(), FormatError> {
    if (OLDEST_READABLE_VERSION..=FORMAT_VERSION).contains(&version) {
        Ok(())
    } else {
        Err(FormatError::Version(version))
    }
}

/// A checkpoint: a header (magic, version, generation, body length, crc of the body)
/// and records that rebuild the whole namespace.
pub fn encode_checkpoint(generation: u64, body: &[u8]) -> Vec<u8> {
    let mut w = Writer::default();
    w.buf.extend_from_slice(CHECKPOINT_MAGIC);
    w.u32(FORMAT_VERSION);
    w.u32(0);
    w.u64(generation);
    w.u64(body.len() as u64);
    w.u32(crc(body));
    while w.buf.len() < CHECKPOINT_HEADER - 4 {
        w.u8(0);
    }
    let head_crc = crc(&w.buf);
    w.u32(head_crc);
    w.buf.extend_from_slice(body);
    w.buf
}

/// The records of a checkpoint of `generation`, checked whole.
pub fn decode_checkpoint(bytes: &[u8], generation: u64) -> Result<Vec<Record>, FormatError> {
    let head = bytes
        .get(..CHECKPOINT_HEADER)
        .ok_or(FormatError::Truncated {
            needed: CHECKPOINT_HEADER,
            have: bytes.len(),
        })?;
    let mut r = Reader::new(head);
    if r.take(8)? != CHECKPOINT_MAGIC {
        return Err(FormatError::Magic);
    }
    let stored_head_crc = le::u32_at(head, CHECKPOINT_HEADER - 4).unwrap_or_default();
    if crc(&head[..CHECKPOINT_HEADER - 4]) != stored_head_crc {
        return Err(FormatError::Checksum);
    }
    check_version(r.u32()?)?;
    r.u32()?;
    if r.u64()? != generation {
        return Err(FormatError::BadField("checkpoint generation"));
    }
    let len = r.u64()? as usize;
    let body_crc = r.u32()?;
    let body = bytes
        .get(CHECKPOINT_HEADER..CHECKPOINT_HEADER.saturating_add(len))
        .ok_or(FormatError::Truncated {
            needed: CHECKPOINT_HEADER.saturating_add(len),
            have: bytes.len(),
        })?;
    if crc(body) != body_crc {
        return Err(FormatError::Checksum);
    }
    decode_records(body)
}

#[cfg(test)]
#[path = "format_tests.rs"]
mod tests;
