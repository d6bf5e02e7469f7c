//! The record codec that the log and the checkpoint share: [`Writer`] appends a
//! record (type, body length, body) and [`Reader`] reads one back, checking every
//! field and that its body is consumed exactly. Separate from the record types (the
//! root) so the byte layout of each record reads in one place.

use super::{FormatError, Record, StoredAttr, StoredBlock, StoredCopy, Time, BLOCK_WRITTEN};
use rmemfs_common::le;

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
/// Appends little-endian fields.
#[derive(Default)]
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub(super) fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub(super) fn u16(&mut self, v: u16) {
        le::put(&mut self.buf, v);
    }
    pub(super) fn u32(&mut self, v: u32) {
        le::put(&mut self.buf, v);
    }
    pub(super) fn u64(&mut self, v: u64) {
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
    pub(super) r: le::Reader<'a>,
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

    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        Ok(self.r.take(n)?)
    }
    pub(super) fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.r.u8()?)
    }
    pub(super) fn u16(&mut self) -> Result<u16, FormatError> {
        Ok(self.r.u16()?)
    }
    pub(super) fn u32(&mut self) -> Result<u32, FormatError> {
        Ok(self.r.u32()?)
    }
    pub(super) fn u64(&mut self) -> Result<u64, FormatError> {
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
