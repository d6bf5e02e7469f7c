//! The classic transport: fuser's loop, one read(2) of /dev/fuse and one write(2)
//! per request. It also serves what never goes through the ring when the ring is on:
//! FUSE_INIT (where the ring is negotiated), FORGET and INTERRUPT.

use super::ops::{CopyRange, DirSink, FuseOps, Req, SetAttrIn, Xattr};
use super::ring::RingLauncher;
use super::TTL;
use fuser::{
    CopyFileRangeFlags, Errno, FileHandle, FileType, Filesystem, Generation, INodeNo, KernelConfig,
    LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request,
    TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

/// A [`FuseOps`] filesystem served by fuser.
pub struct Classic<O: FuseOps> {
    ops: Arc<O>,
    ring: Option<RingLauncher>,
}

impl<O: FuseOps> Classic<O> {
    /// `ring`: the io_uring transport to offer at FUSE_INIT and start once the
    /// kernel accepts it; None serves everything here.
    pub fn new(ops: Arc<O>, ring: Option<RingLauncher>) -> Classic<O> {
        Classic { ops, ring }
    }
}

fn req_of(req: &Request) -> Req {
    Req {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

fn empty(r: Result<(), Errno>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

fn entry(r: Result<fuser::FileAttr, Errno>, reply: ReplyEntry) {
    match r {
        Ok(a) => reply.entry(&TTL, &a, Generation(0)),
        Err(e) => reply.error(e),
    }
}

fn attr(r: Result<fuser::FileAttr, Errno>, reply: ReplyAttr) {
    match r {
        Ok(a) => reply.attr(&TTL, &a),
        Err(e) => reply.error(e),
    }
}

fn xattr(r: Result<Xattr, Errno>, reply: ReplyXattr) {
    match r {
        Ok(Xattr::Size(n)) => reply.size(n),
        Ok(Xattr::Data(v)) => reply.data(&v),
        Err(e) => reply.error(e),
    }
}

impl DirSink for ReplyDirectory {
    fn add(&mut self, ino: u64, offset: u64, kind: FileType, name: &OsStr) -> bool {
        ReplyDirectory::add(self, INodeNo(ino), offset, kind, name)
    }
}

thread_local! {
    /// Each request loop's read buffer, reused from request to request.
    static READ_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl<O: FuseOps> Filesystem for Classic<O> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        self.ops.configure(config);
        if let Some(ring) = &self.ring {
            ring.negotiate(config);
        }
        Ok(())
    }

    fn destroy(&mut self) {
        // The ring's threads first: none may still be answering when the filesystem
        // writes back its last state.
        if let Some(ring) = self.ring.take() {
            ring.stop();
        }
        self.ops.destroy();
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        entry(self.ops.lookup(&req_of(req), parent.0, name), reply);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.ops.forget(ino.0, nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        attr(self.ops.getattr(&req_of(req), ino.0), reply);
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let change = SetAttrIn {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
        };
        attr(self.ops.setattr(&req_of(req), ino.0, &change), reply);
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.ops.readlink(&req_of(req), ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let r = self
            .ops
            .mknod(&req_of(req), parent.0, name, mode, umask, rdev);
        entry(r, reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        entry(
            self.ops.mkdir(&req_of(req), parent.0, name, mode, umask),
            reply,
        );
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(self.ops.unlink(&req_of(req), parent.0, name), reply);
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(self.ops.rmdir(&req_of(req), parent.0, name), reply);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        entry(
            self.ops.symlink(&req_of(req), parent.0, link_name, target),
            reply,
        );
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let r = self.ops.rename(
            &req_of(req),
            parent.0,
            name,
            newparent.0,
            newname,
            flags.bits(),
        );
        empty(r, reply);
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        entry(
            self.ops.link(&req_of(req), ino.0, newparent.0, newname),
            reply,
        );
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.ops.open(&req_of(req), ino.0, flags.0) {
            Ok(o) => reply.opened(FileHandle(o.fh), o.flags),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        READ_BUF.with_borrow_mut(|buf| {
            buf.resize(size as usize, 0);
            match self.ops.read(&req_of(req), ino.0, fh.0, offset, buf) {
                Ok(n) => reply.data(&buf[..n.min(buf.len())]),
                Err(e) => reply.error(e),
            }
        });
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        match self
            .ops
            .write(&req_of(req), ino.0, fh.0, offset, data, kill)
        {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        empty(self.ops.flush(&req_of(req), ino.0, fh.0), reply);
    }

    fn release(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        empty(self.ops.release(&req_of(req), ino.0, fh.0), reply);
    }

    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        empty(self.ops.fsync(&req_of(req), ino.0, fh.0, datasync), reply);
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.ops.opendir(&req_of(req), ino.0) {
            Ok(o) => reply.opened(FileHandle(o.fh), o.flags),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        match self.ops.readdir(&req_of(req), ino.0, offset, &mut reply) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        empty(self.ops.releasedir(&req_of(req), ino.0, fh.0), reply);
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        empty(self.ops.fsyncdir(&req_of(req), ino.0, datasync), reply);
    }

    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        match self.ops.statfs(&req_of(req), ino.0) {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        empty(
            self.ops.setxattr(&req_of(req), ino.0, name, value, flags),
            reply,
        );
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        xattr(self.ops.getxattr(&req_of(req), ino.0, name, size), reply);
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        xattr(self.ops.listxattr(&req_of(req), ino.0, size), reply);
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(self.ops.removexattr(&req_of(req), ino.0, name), reply);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        match self
            .ops
            .create(&req_of(req), parent.0, name, mode, umask, flags)
        {
            Ok((a, o)) => reply.created(&TTL, &a, Generation(0), FileHandle(o.fh), o.flags),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        empty(
            self.ops
                .fallocate(&req_of(req), ino.0, fh.0, offset, length, mode),
            reply,
        );
    }

    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let copy = CopyRange {
            ino_in: ino_in.0,
            fh_in: fh_in.0,
            off_in: offset_in,
            ino_out: ino_out.0,
            fh_out: fh_out.0,
            off_out: offset_out,
            len,
            flags: flags.bits(),
        };
        match self.ops.copy_file_range(&req_of(req), &copy) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn lseek(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        match self.ops.lseek(&req_of(req), ino.0, fh.0, offset, whence) {
            Ok(pos) => reply.offset(pos),
            Err(e) => reply.error(e),
        }
    }
}
