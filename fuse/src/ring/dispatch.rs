//! One ring request: decoded from the entry's buffers, answered by [`FuseOps`], the
//! answer encoded back into the same buffers for COMMIT_AND_FETCH. Pure code over
//! byte slices, tested without a kernel.
//!
//! The ring splits a request as the kernel's `fuse_args` are split: the opcode's
//! fixed struct (`in_args[0]`) in `op_in`, everything after it (names, link targets,
//! xattr values, write data) in the payload. A reply is the out header in `in_out`
//! and every reply argument, fixed structs included, in the payload.

use super::abi::{self, fattr, op, Fields, InHeader, Put};
use crate::ops::{CopyRange, DirSink, FuseOps, Opened, ReadAt, Req, SetAttrIn, Xattr};
use crate::TTL;
use fuser::{Errno, FileAttr, FileType, TimeOrNow};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Answers the request in `header` and `payload` in place. Returns the commit id to
/// send back, or None when the header itself is unreadable (never from a sane
/// kernel; the entry is then given up).
pub fn answer<O: FuseOps + ?Sized>(
    ops: &O,
    header: &mut [u8; abi::HEADER_LEN],
    payload: &mut [u8],
) -> Option<u64> {
    let h = InHeader::parse(&header[..abi::IN_OUT_LEN])?;
    let mut ent = Fields::new(&header[abi::COMMIT_ID_AT..]);
    let commit_id = ent.u64()?;
    let payload_in = (ent.u32()? as usize).min(payload.len());
    let mut op_in = [0u8; abi::OP_IN_LEN];
    op_in.copy_from_slice(&header[abi::OP_IN_AT..abi::ENT_AT]);

    let result = request(ops, &h, &op_in, payload, payload_in);
    put_reply(header, &h, result);
    Some(commit_id)
}

/// Encodes the answer to a READ that [`FuseOps::read_together`] answered: `len`
/// bytes, already in the payload. Returns the commit id, or None as [`answer`] does.
pub fn answered_read(header: &mut [u8; abi::HEADER_LEN], len: usize) -> Option<u64> {
    let h = InHeader::parse(&header[..abi::IN_OUT_LEN])?;
    let commit_id = Fields::new(&header[abi::COMMIT_ID_AT..]).u64()?;
    put_reply(header, &h, Ok(len));
    Some(commit_id)
}

/// The reply's out header (its error, or its length in the payload).
fn put_reply(header: &mut [u8; abi::HEADER_LEN], h: &InHeader, result: Result<usize, Errno>) {
    let (error, len) = match result {
        Ok(len) => (0, len),
        Err(e) => (-e.code(), 0),
    };
    abi::put_out_header(&mut header[..abi::IN_OUT_LEN], error, h.unique, len);
    Put::new(&mut header[abi::PAYLOAD_SZ_AT..abi::PAYLOAD_SZ_AT + 4]).u32(len as u32);
}

/// The file, offset and length a READ request in `header` asks for, or None for any
/// other request: what a batch of requests gives [`FuseOps::read_together`].
pub fn read_of(header: &[u8; abi::HEADER_LEN]) -> Option<ReadAt> {
    let h = InHeader::parse(&header[..abi::IN_OUT_LEN])?;
    if h.opcode != op::READ {
        return None;
    }
    let (_fh, offset, size) = read_in(&mut Fields::new(&header[abi::OP_IN_AT..abi::ENT_AT]))?;
    Some(ReadAt {
        ino: h.nodeid,
        offset,
        len: size,
    })
}

fn name(b: &[u8]) -> &OsStr {
    OsStr::from_bytes(b)
}

/// Decodes, calls and encodes one request; Ok is the reply's length in `payload`.
fn request<O: FuseOps + ?Sized>(
    ops: &O,
    h: &InHeader,
    op_in: &[u8],
    payload: &mut [u8],
    payload_in: usize,
) -> Result<usize, Errno> {
    let req = Req {
        uid: h.uid,
        gid: h.gid,
        pid: h.pid,
    };
    let ino = h.nodeid;
    let mut arg = Fields::new(op_in);
    let mut data = Fields::new(&payload[..payload_in]);
    let bad = Errno::EINVAL;
    match h.opcode {
        op::LOOKUP => {
            let n = data.cstr().ok_or(bad)?;
            let a = ops.lookup(&req, ino, name(n))?;
            Ok(put_entry(payload, &a))
        }
        op::GETATTR => {
            let a = ops.getattr(&req, ino)?;
            Ok(put_attr_out(payload, &a))
        }
        op::SETATTR => {
            let change = setattr_in(&mut arg).ok_or(bad)?;
            let a = ops.setattr(&req, ino, &change)?;
            Ok(put_attr_out(payload, &a))
        }
        op::READLINK => {
            let t = ops.readlink(&req, ino)?;
            put_bytes(payload, &t)
        }
        op::SYMLINK => {
            let n = data.cstr().ok_or(bad)?;
            let target = data.cstr().ok_or(bad)?;
            let a = ops.symlink(&req, ino, name(n), Path::new(name(target)))?;
            Ok(put_entry(payload, &a))
        }
        op::MKNOD => {
            let (mode, rdev, umask) = (arg.u32(), arg.u32(), arg.u32());
            let (mode, rdev, umask) = (mode.ok_or(bad)?, rdev.ok_or(bad)?, umask.ok_or(bad)?);
            let n = data.cstr().ok_or(bad)?;
            let a = ops.mknod(&req, ino, name(n), mode, umask, rdev)?;
            Ok(put_entry(payload, &a))
        }
        op::MKDIR => {
            let (mode, umask) = (arg.u32().ok_or(bad)?, arg.u32().ok_or(bad)?);
            let n = data.cstr().ok_or(bad)?;
            let a = ops.mkdir(&req, ino, name(n), mode, umask)?;
            Ok(put_entry(payload, &a))
        }
        op::UNLINK => {
            let n = data.cstr().ok_or(bad)?;
            ops.unlink(&req, ino, name(n)).map(|()| 0)
        }
        op::RMDIR => {
            let n = data.cstr().ok_or(bad)?;
            ops.rmdir(&req, ino, name(n)).map(|()| 0)
        }
        op::RENAME | op::RENAME2 => {
            let newdir = arg.u64().ok_or(bad)?;
            let flags = if h.opcode == op::RENAME2 {
                arg.u32().ok_or(bad)?
            } else {
                0
            };
            let old = data.cstr().ok_or(bad)?;
            let new = data.cstr().ok_or(bad)?;
            ops.rename(&req, ino, name(old), newdir, name(new), flags)
                .map(|()| 0)
        }
        op::LINK => {
            let old = arg.u64().ok_or(bad)?;
            let n = data.cstr().ok_or(bad)?;
            let a = ops.link(&req, old, ino, name(n))?;
            Ok(put_entry(payload, &a))
        }
        op::OPEN | op::OPENDIR => {
            let flags = arg.u32().ok_or(bad)? as i32;
            let o = if h.opcode == op::OPEN {
                ops.open(&req, ino, flags)?
            } else {
                ops.opendir(&req, ino)?
            };
            Ok(put_open(payload, &o))
        }
        op::READ => {
            let (fh, offset, size) = read_in(&mut arg).ok_or(bad)?;
            let size = size.min(payload.len());
            let n = ops.read(&req, ino, fh, offset, &mut payload[..size])?;
            Ok(n.min(size))
        }
        op::WRITE => {
            let (fh, offset, size) = read_in(&mut arg).ok_or(bad)?;
            let write_flags = arg.u32().ok_or(bad)?;
            let bytes = data.rest();
            let bytes = bytes.get(..size).ok_or(bad)?;
            let kill = write_flags & abi::WRITE_KILL_SUIDGID != 0;
            let n = ops.write(&req, ino, fh, offset, bytes, kill)?;
            let mut p = Put::new(payload);
            p.u32(n).u32(0);
            Ok(p.len())
        }
        op::STATFS => {
            let s = ops.statfs(&req, ino)?;
            let mut p = Put::new(payload);
            p.u64(s.blocks)
                .u64(s.bfree)
                .u64(s.bavail)
                .u64(s.files)
                .u64(s.ffree);
            p.u32(s.bsize).u32(s.namelen).u32(s.frsize).u32(0);
            p.bytes(&[0u8; 24]); // spare[6]
            Ok(p.len())
        }
        op::RELEASE | op::RELEASEDIR => {
            let fh = arg.u64().ok_or(bad)?;
            let r = if h.opcode == op::RELEASE {
                ops.release(&req, ino, fh)
            } else {
                ops.releasedir(&req, ino, fh)
            };
            r.map(|()| 0)
        }
        op::FSYNC | op::FSYNCDIR => {
            let fh = arg.u64().ok_or(bad)?;
            let datasync = arg.u32().ok_or(bad)? & abi::FSYNC_FDATASYNC != 0;
            let r = if h.opcode == op::FSYNC {
                ops.fsync(&req, ino, fh, datasync)
            } else {
                ops.fsyncdir(&req, ino, datasync)
            };
            r.map(|()| 0)
        }
        op::FLUSH => {
            let fh = arg.u64().ok_or(bad)?;
            ops.flush(&req, ino, fh).map(|()| 0)
        }
        op::SETXATTR => {
            // fuse_setxattr_in without FUSE_SETXATTR_EXT (not negotiated): size, flags.
            let size = arg.u32().ok_or(bad)? as usize;
            let flags = arg.u32().ok_or(bad)? as i32;
            let n = data.cstr().ok_or(bad)?;
            let value = data.rest().get(..size).ok_or(bad)?;
            ops.setxattr(&req, ino, name(n), value, flags).map(|()| 0)
        }
        op::GETXATTR => {
            let size = arg.u32().ok_or(bad)?;
            let n = data.cstr().ok_or(bad)?;
            let x = ops.getxattr(&req, ino, name(n), size)?;
            put_xattr(payload, x)
        }
        op::LISTXATTR => {
            let size = arg.u32().ok_or(bad)?;
            let x = ops.listxattr(&req, ino, size)?;
            put_xattr(payload, x)
        }
        op::REMOVEXATTR => {
            let n = data.cstr().ok_or(bad)?;
            ops.removexattr(&req, ino, name(n)).map(|()| 0)
        }
        op::READDIR => {
            let (_fh, offset, size) = read_in(&mut arg).ok_or(bad)?;
            let size = size.min(payload.len());
            let mut sink = Dirents {
                buf: &mut payload[..size],
                at: 0,
            };
            ops.readdir(&req, ino, offset, &mut sink)?;
            Ok(sink.at)
        }
        op::CREATE => {
            let flags = arg.u32().ok_or(bad)? as i32;
            let mode = arg.u32().ok_or(bad)?;
            let umask = arg.u32().ok_or(bad)?;
            let n = data.cstr().ok_or(bad)?;
            let (a, o) = ops.create(&req, ino, name(n), mode, umask, flags)?;
            let len = put_entry(payload, &a);
            Ok(len + put_open(&mut payload[len..], &o))
        }
        op::FALLOCATE => {
            let fh = arg.u64().ok_or(bad)?;
            let offset = arg.u64().ok_or(bad)?;
            let length = arg.u64().ok_or(bad)?;
            let mode = arg.u32().ok_or(bad)? as i32;
            ops.fallocate(&req, ino, fh, offset, length, mode)
                .map(|()| 0)
        }
        op::LSEEK => {
            let fh = arg.u64().ok_or(bad)?;
            let offset = arg.u64().ok_or(bad)? as i64;
            let whence = arg.u32().ok_or(bad)? as i32;
            let pos = ops.lseek(&req, ino, fh, offset, whence)?;
            let mut p = Put::new(payload);
            p.u64(pos as u64);
            Ok(p.len())
        }
        op::COPY_FILE_RANGE => {
            let copy = CopyRange {
                ino_in: ino,
                fh_in: arg.u64().ok_or(bad)?,
                off_in: arg.u64().ok_or(bad)?,
                ino_out: arg.u64().ok_or(bad)?,
                fh_out: arg.u64().ok_or(bad)?,
                off_out: arg.u64().ok_or(bad)?,
                len: arg.u64().ok_or(bad)?,
                flags: arg.u64().ok_or(bad)?,
            };
            let n = ops.copy_file_range(&req, &copy)?;
            let mut p = Put::new(payload);
            p.u32(n).u32(0);
            Ok(p.len())
        }
        // Locks, ioctl, poll, bmap, ...: not implemented, as the classic loop
        // answers them (fuser's defaults).
        _ => Err(Errno::ENOSYS),
    }
}

/// `fuse_read_in` (also READDIR's and the head of `fuse_write_in`): fh, offset, size.
fn read_in(f: &mut Fields) -> Option<(u64, u64, usize)> {
    let fh = f.u64()?;
    let offset = f.u64()?;
    let size = f.u32()? as usize;
    Some((fh, offset, size))
}

fn time_of(secs: u64, nsec: u32) -> SystemTime {
    let secs = secs as i64;
    let nsec = nsec.min(999_999_999);
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsec)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + Duration::from_nanos(nsec as u64)
    }
}

/// `struct fuse_setattr_in`.
fn setattr_in(f: &mut Fields) -> Option<SetAttrIn> {
    let valid = f.u32()?;
    f.skip(4 + 8)?; // padding, fh
    let size = f.u64()?;
    f.skip(8)?; // lock_owner
    let atime = f.u64()?;
    let mtime = f.u64()?;
    f.skip(8)?; // ctime
    let atimensec = f.u32()?;
    let mtimensec = f.u32()?;
    f.skip(4)?; // ctimensec
    let mode = f.u32()?;
    f.skip(4)?;
    let uid = f.u32()?;
    let gid = f.u32()?;
    let when = |set: u32, now: u32, secs: u64, nsec: u32| {
        if valid & now != 0 {
            Some(TimeOrNow::Now)
        } else if valid & set != 0 {
            Some(TimeOrNow::SpecificTime(time_of(secs, nsec)))
        } else {
            None
        }
    };
    Some(SetAttrIn {
        mode: (valid & fattr::MODE != 0).then_some(mode),
        uid: (valid & fattr::UID != 0).then_some(uid),
        gid: (valid & fattr::GID != 0).then_some(gid),
        size: (valid & fattr::SIZE != 0).then_some(size),
        atime: when(fattr::ATIME, fattr::ATIME_NOW, atime, atimensec),
        mtime: when(fattr::MTIME, fattr::MTIME_NOW, mtime, mtimensec),
    })
}

fn secs_nsec(t: SystemTime) -> (u64, u32) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs(), d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            let (s, n) = (d.as_secs() as i64, d.subsec_nanos());
            if n == 0 {
                ((-s) as u64, 0)
            } else {
                ((-s - 1) as u64, 1_000_000_000 - n)
            }
        }
    }
}

fn type_bits(k: FileType) -> u32 {
    match k {
        FileType::NamedPipe => libc::S_IFIFO,
        FileType::CharDevice => libc::S_IFCHR,
        FileType::BlockDevice => libc::S_IFBLK,
        FileType::Directory => libc::S_IFDIR,
        FileType::RegularFile => libc::S_IFREG,
        FileType::Symlink => libc::S_IFLNK,
        FileType::Socket => libc::S_IFSOCK,
    }
}

/// `struct fuse_attr`.
fn put_fuse_attr(p: &mut Put, a: &FileAttr) {
    let (at, atn) = secs_nsec(a.atime);
    let (mt, mtn) = secs_nsec(a.mtime);
    let (ct, ctn) = secs_nsec(a.ctime);
    p.u64(a.ino.0).u64(a.size).u64(a.blocks);
    p.u64(at).u64(mt).u64(ct).u32(atn).u32(mtn).u32(ctn);
    p.u32(type_bits(a.kind) | a.perm as u32);
    p.u32(a.nlink)
        .u32(a.uid)
        .u32(a.gid)
        .u32(a.rdev)
        .u32(a.blksize);
    p.u32(0); // flags
}

/// `struct fuse_entry_out`: node id, generation, entry and attribute validity, attr.
fn put_entry(payload: &mut [u8], a: &FileAttr) -> usize {
    let mut p = Put::new(&mut payload[..abi::ENTRY_OUT_LEN]);
    p.u64(a.ino.0).u64(0);
    p.u64(TTL.as_secs()).u64(TTL.as_secs());
    p.u32(TTL.subsec_nanos()).u32(TTL.subsec_nanos());
    put_fuse_attr(&mut p, a);
    p.len()
}

/// `struct fuse_attr_out`.
fn put_attr_out(payload: &mut [u8], a: &FileAttr) -> usize {
    let mut p = Put::new(&mut payload[..abi::ATTR_OUT_LEN]);
    p.u64(TTL.as_secs()).u32(TTL.subsec_nanos()).u32(0);
    put_fuse_attr(&mut p, a);
    p.len()
}

/// `struct fuse_open_out`.
fn put_open(payload: &mut [u8], o: &Opened) -> usize {
    let mut p = Put::new(&mut payload[..abi::OPEN_OUT_LEN]);
    p.u64(o.fh).u32(o.flags.bits()).u32(0);
    p.len()
}

fn put_bytes(payload: &mut [u8], b: &[u8]) -> Result<usize, Errno> {
    let dst = payload.get_mut(..b.len()).ok_or(Errno::ERANGE)?;
    dst.copy_from_slice(b);
    Ok(b.len())
}

fn put_xattr(payload: &mut [u8], x: Xattr) -> Result<usize, Errno> {
    match x {
        Xattr::Size(n) => {
            // struct fuse_getxattr_out
            let mut p = Put::new(&mut payload[..8]);
            p.u32(n).u32(0);
            Ok(p.len())
        }
        Xattr::Data(v) => put_bytes(payload, &v),
    }
}

/// READDIR's reply: `struct fuse_dirent`s, each padded to 8 bytes, while they fit.
struct Dirents<'a> {
    buf: &'a mut [u8],
    at: usize,
}

fn dirent_type(k: FileType) -> u32 {
    type_bits(k) >> 12
}

impl DirSink for Dirents<'_> {
    fn add(&mut self, ino: u64, offset: u64, kind: FileType, name: &OsStr) -> bool {
        let name = name.as_bytes();
        let len = (abi::DIRENT_LEN + name.len()).next_multiple_of(8);
        let Some(dst) = self.buf.get_mut(self.at..self.at + len) else {
            return true;
        };
        dst.fill(0);
        let mut p = Put::new(dst);
        p.u64(ino)
            .u64(offset)
            .u32(name.len() as u32)
            .u32(dirent_type(kind));
        p.bytes(name);
        self.at += len;
        false
    }
}

#[cfg(test)]
#[path = "dispatch_tests.rs"]
mod tests;
