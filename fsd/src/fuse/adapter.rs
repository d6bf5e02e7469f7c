//! fsd's answers to FUSE requests: each calls the core ([`RmemFs`]) and maps its
//! error with [`errno`], whichever transport carried the request. Each handler
//! starts with a timer of its kind of request (`timing`, rmemfs-fuse's
//! `fuse/src/timing.rs`): an `Instant::now()` at each end and two atomic additions.

use super::ops::{
    xattr_answer, CopyRange, DirSink, FuseOps, Opened, ReadTogether, Req, SetAttrIn, Statfs, Xattr,
};
use super::timing::{FuseKind, FuseTiming};
use super::{configure_kernel, enable_posix_acl, errno, CacheMode};
use crate::error::FsError;
use crate::fs::{Allocate, Caller, RmemFs, Seek, SetAttr, SetTime, SetXattrMode};
use crate::inode::{Attr, FileKind};
use crate::namespace::RenameMode;
use crate::privs::KillPrivs;
use fuser::{Errno, FileAttr, FileType, INodeNo, KernelConfig, TimeOrNow};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

fn file_type(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
    }
}

fn file_attr(a: &Attr, block_size: u32) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.allocated / 512,
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: a.ctime,
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: block_size,
        flags: 0,
    }
}

/// The caller of `req`; `umask` is the one a creating request carries.
fn caller_with_umask(req: &Req, umask: u32) -> Caller {
    Caller {
        uid: req.uid,
        gid: req.gid,
        pid: req.pid,
        umask,
    }
}

fn caller(req: &Req) -> Caller {
    caller_with_umask(req, 0)
}

fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::SpecificTime(t) => SetTime::At(t),
        TimeOrNow::Now => SetTime::Now,
    }
}

fn mapped<T>(r: Result<T, FsError>) -> Result<T, Errno> {
    r.map_err(|e| errno(&e))
}

/// The `fallocate` modes rmemfs implements; anything else is EOPNOTSUPP, as on a
/// local filesystem that lacks the mode.
fn allocate_mode(mode: i32) -> Result<Allocate, Errno> {
    let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
    match mode & !libc::FALLOC_FL_KEEP_SIZE {
        0 => Ok(Allocate::Reserve { keep_size }),
        libc::FALLOC_FL_PUNCH_HOLE if keep_size => Ok(Allocate::PunchHole),
        libc::FALLOC_FL_ZERO_RANGE => Ok(Allocate::ZeroRange { keep_size }),
        _ => Err(Errno::EOPNOTSUPP),
    }
}

/// What fsd's command line chooses about the mount.
#[derive(Clone, Copy, Debug)]
pub struct MountChoices {
    /// False answers every xattr request ENOSYS, which the kernel takes as "no
    /// extended attributes here": it stops sending them (the getxattr before every
    /// write included) and fails the calls with EOPNOTSUPP.
    pub xattrs: bool,
    pub cache: CacheMode,
}

pub struct FuseAdapter {
    fs: Arc<RmemFs>,
    block_size: u32,
    choices: MountChoices,
    /// How long the handlers take, by kind (`--metrics`).
    timing: Arc<FuseTiming>,
    /// Set once mounted.
    notifier: std::sync::OnceLock<fuser::Notifier>,
}

impl FuseAdapter {
    pub fn new(fs: Arc<RmemFs>, choices: MountChoices) -> FuseAdapter {
        let block_size = fs.remote().block_size().min(u32::MAX as u64) as u32;
        FuseAdapter {
            fs,
            block_size,
            choices,
            timing: Arc::default(),
            notifier: std::sync::OnceLock::new(),
        }
    }

    /// Clears setuid/setgid before a write, fallocate or copy into `ino`. The
    /// replies to those carry no attributes, so when the mode changed the kernel is
    /// told to forget the one it holds (else `stat` would show the old mode, and
    /// exec honour it, until the attribute timeout).
    fn kill_privs(&self, ino: u64, how: KillPrivs) -> Result<(), Errno> {
        if mapped(self.fs.kill_privs(ino, how))? {
            if let Some(n) = self.notifier.get() {
                // Attributes only (offset -1). An error means the mount is going away.
                let _ = n.inval_inode(fuser::INodeNo(ino), -1, 0);
            }
        }
        Ok(())
    }

    /// The latency histograms of the handlers, for the metrics endpoint.
    pub fn timing(&self) -> Arc<FuseTiming> {
        self.timing.clone()
    }

    fn attr(&self, r: Result<Attr, FsError>) -> Result<FileAttr, Errno> {
        mapped(r).map(|a| file_attr(&a, self.block_size))
    }

    fn opened(&self) -> Opened {
        Opened {
            fh: 0,
            flags: self.choices.cache.fopen_flags(),
        }
    }

    fn xattrs_on(&self) -> Result<(), Errno> {
        if self.choices.xattrs {
            Ok(())
        } else {
            Err(Errno::ENOSYS)
        }
    }
}

impl FuseOps for FuseAdapter {
    fn configure(&self, config: &mut KernelConfig) {
        configure_kernel(config, self.choices.cache);
        if self.choices.xattrs && enable_posix_acl(config) {
            self.fs.enable_posix_acl();
        }
    }

    fn attach_notifier(&self, notifier: fuser::Notifier) {
        let _ = self.notifier.set(notifier);
    }

    fn destroy(&self) {
        self.fs.shutdown();
    }

    fn lookup(&self, _req: &Req, parent: u64, name: &OsStr) -> Result<FileAttr, Errno> {
        let _t = self.timing.start(FuseKind::Lookup);
        self.attr(self.fs.lookup(parent, name))
    }

    fn forget(&self, ino: u64, nlookup: u64) {
        self.fs.forget(ino, nlookup);
    }

    fn getattr(&self, _req: &Req, ino: u64) -> Result<FileAttr, Errno> {
        let _t = self.timing.start(FuseKind::Lookup);
        self.attr(self.fs.getattr(ino))
    }

    fn setattr(&self, req: &Req, ino: u64, c: &SetAttrIn) -> Result<FileAttr, Errno> {
        let _t = self.timing.start(FuseKind::Modify);
        // With FUSE_HANDLE_KILLPRIV_V2 the kernel leaves setuid/setgid to us. fuser
        // hides the request's FATTR_KILL_SUIDGID bit, so both transports rebuild it
        // from what the kernel sends: a chown clears them; a truncate clears them
        // unless the caller has CAP_FSETID; a SETATTR that sets nothing is
        // chown(f, -1, -1) or the kernel's file_remove_privs for an unprivileged
        // write, fallocate or copy_file_range, and clears them too. A `mode` given
        // alongside still wins.
        let kill_privs = if c.uid.is_some() || c.gid.is_some() {
            KillPrivs::Yes
        } else if c.size.is_some() {
            KillPrivs::UnlessCallerHasFsetid(req.pid)
        } else if c.mode.is_none() && c.atime.is_none() && c.mtime.is_none() {
            KillPrivs::KernelAsked(req.pid)
        } else {
            KillPrivs::No
        };
        let change = SetAttr {
            mode: c.mode,
            uid: c.uid,
            gid: c.gid,
            size: c.size,
            atime: c.atime.map(set_time),
            mtime: c.mtime.map(set_time),
            kill_privs,
        };
        self.attr(self.fs.setattr(ino, &change))
    }

    fn readlink(&self, _req: &Req, ino: u64) -> Result<Vec<u8>, Errno> {
        let _t = self.timing.start(FuseKind::Lookup);
        mapped(self.fs.readlink(ino)).map(|t| t.into_os_string().into_encoded_bytes())
    }

    fn mknod(
        &self,
        req: &Req,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<FileAttr, Errno> {
        let _t = self.timing.start(FuseKind::Modify);
        let kind = match mode & libc::S_IFMT {
            libc::S_IFREG | 0 => FileKind::File,
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFSOCK => FileKind::Socket,
            libc::S_IFCHR => FileKind::CharDevice,
            libc::S_IFBLK => FileKind::BlockDevice,
            _ => return Err(Errno::EINVAL),
        };
        self.attr(self.fs.mknod(
            parent,
            name,
            kind,
            mode,
            rdev,
            caller_with_umask(req, umask),
        ))
    }

    fn mkdir(
        &self,
        req: &Req,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
    ) -> Result<FileAttr, Errno> {
        let _t = self.timing.start(FuseKind::Modify);
        let caller = caller_with_umask(req, umask);
        self.attr(self.fs.mkdir(parent, name, mode, caller))
    }

    fn unlink(&self, _req: &Req, parent: u64, name: &OsStr) -> Result<(), Errno> {
        let _t = self.timing.start(FuseKind::Modify);
        mapped(self.fs.unlink(parent, name))
    }

    fn rmdir(&self, _req: &Req, parent: u64, name: &OsStr) -> Result<(), Errno> {
        let _t = self.timing.start(FuseKind::Modify);
        mapped(self.fs.rmdir(parent, name))
    }

    fn symlink(
        &self,
        req: &Req,
        parent: u64,
        name: &OsStr,
        target: &Path,
    ) -> Result<FileAttr, Errno> {
        let _t = self.timing.start(FuseKind::Modify);
        self.attr(self.fs.symlink(parent, name, target, caller(req)))
    }

    fn rename(
        &self,
        req: &Req,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> Result<(), Errno> {
        let _t = self.timing.start(FuseKind::Modify);
        let known = libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE | libc::RENAME_WHITEOUT;
        if flags & !known != 0 {
            return Err(Errno::EINVAL); // anything newer
        }
        // (The kernel has checked CAP_MKNOD for a whiteout.)
        let mode = RenameMode {
            no_replace: flags & libc::RENAME_NOREPLACE != 0,
            exchange: flags & libc::RENAME_EXCHANGE != 0,
            whiteout: (flags & libc::RENAME_WHITEOUT != 0).then_some((req.uid, req.gid)),
        };
        mapped(self.fs.rename(parent, name, newparent, newname, mode))
    }

    fn link(
        &self,
        _req: &Req,
        ino: u64,
        newparent: u64,
        newname: &OsStr,
    ) -> Result<FileAttr, Errno> {
        let _t = self.timing.start(FuseKind::Modify);
        self.attr(self.fs.link(ino, newparent, newname))
    }

    fn open(&self, _req: &Req, ino: u64, _flags: i32) -> Result<Opened, Errno> {
        let _t = self.timing.start(FuseKind::Open);
        mapped(self.fs.open(ino)).map(|_| self.opened())
    }

    fn read(
        &self,
        _req: &Req,
        ino: u64,
        _fh: u64,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, Errno> {
        let _t = self.timing.start(FuseKind::Read);
        mapped(self.fs.read_into(ino, offset, buf))
    }

    fn read_together(&self, reads: &mut [ReadTogether<'_>]) -> usize {
        let started = Instant::now();
        let mut together: Vec<crate::fs::ReadTogether<'_>> = reads
            .iter_mut()
            .map(|r| crate::fs::ReadTogether {
                ino: r.at.ino,
                offset: r.at.offset,
                dst: &mut *r.buf,
                done: None,
            })
            .collect();
        let loaded = self.fs.read_together(&mut together);
        let done: Vec<Option<usize>> = together.iter().map(|t| t.done).collect();
        drop(together);
        let mut answered = 0;
        for (r, done) in reads.iter_mut().zip(done) {
            r.done = done;
            answered += done.is_some() as u64;
        }
        let latency = self.timing.histogram(FuseKind::Read);
        latency.observe_many(started.elapsed(), answered);
        loaded
    }

    fn gathers_reads(&self) -> bool {
        true
    }

    fn write(
        &self,
        req: &Req,
        ino: u64,
        _fh: u64,
        offset: u64,
        data: &[u8],
        kill_suidgid: bool,
    ) -> Result<u32, Errno> {
        let _t = self.timing.start(FuseKind::Write);
        // The kernel has checked the writer's CAP_FSETID (FUSE_HANDLE_KILLPRIV_V2).
        if kill_suidgid {
            self.kill_privs(ino, KillPrivs::CallerLacksFsetid(req.pid))?;
        }
        mapped(self.fs.write(ino, offset, data))
    }

    fn flush(&self, _req: &Req, ino: u64, _fh: u64) -> Result<(), Errno> {
        let _t = self.timing.start(FuseKind::Sync);
        mapped(self.fs.fsync(ino))
    }

    fn release(&self, _req: &Req, ino: u64, _fh: u64) -> Result<(), Errno> {
        let _t = self.timing.start(FuseKind::Open);
        mapped(self.fs.release(ino))
    }

    fn fsync(&self, _req: &Req, ino: u64, _fh: u64, _datasync: bool) -> Result<(), Errno> {
        let _t = self.timing.start(FuseKind::Sync);
        mapped(self.fs.fsync_durable(ino))
    }

    fn readdir(
        &self,
        _req: &Req,
        ino: u64,
        offset: u64,
        out: &mut dyn DirSink,
    ) -> Result<(), Errno> {
        let _t = self.timing.start(FuseKind::Readdir);
        // Enough entries to fill a reply buffer; the kernel asks again for more.
        for e in mapped(self.fs.readdir(ino, offset, 512))? {
            if out.add(e.ino, e.offset, file_type(e.kind), &e.name) {
                break; // buffer full
            }
        }
        Ok(())
    }

    fn fsyncdir(&self, _req: &Req, _ino: u64, _datasync: bool) -> Result<(), Errno> {
        let _t = self.timing.start(FuseKind::Sync);
        // On a volume, a directory's entries become durable with the next commit.
        mapped(self.fs.commit())
    }

    fn statfs(&self, _req: &Req, _ino: u64) -> Result<Statfs, Errno> {
        let _t = self.timing.start(FuseKind::Lookup);
        let s = self.fs.statfs();
        let bs = s.block_size;
        // Inodes are limited only by fsd's memory; report a large, honest-enough pool.
        let files = 1u64 << 32;
        Ok(Statfs {
            blocks: s.total_bytes / bs,
            bfree: s.free_bytes / bs,
            bavail: s.free_bytes / bs,
            files,
            ffree: files.saturating_sub(s.inodes),
            bsize: bs as u32,
            namelen: crate::namespace::MAX_NAME as u32,
            frsize: bs as u32,
        })
    }

    fn setxattr(
        &self,
        req: &Req,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> Result<(), Errno> {
        let _t = self.timing.start(FuseKind::Modify);
        let known = libc::XATTR_CREATE | libc::XATTR_REPLACE;
        if flags & !known != 0 {
            return Err(Errno::EINVAL);
        }
        self.xattrs_on()?;
        let mode = SetXattrMode {
            create: flags & libc::XATTR_CREATE != 0,
            replace: flags & libc::XATTR_REPLACE != 0,
        };
        mapped(self.fs.setxattr(ino, name, value, mode, caller(req)))
    }

    fn getxattr(&self, _req: &Req, ino: u64, name: &OsStr, size: u32) -> Result<Xattr, Errno> {
        let _t = self.timing.start(FuseKind::Lookup);
        self.xattrs_on()?;
        xattr_answer(mapped(self.fs.getxattr(ino, name))?, size)
    }

    fn listxattr(&self, _req: &Req, ino: u64, size: u32) -> Result<Xattr, Errno> {
        let _t = self.timing.start(FuseKind::Lookup);
        self.xattrs_on()?;
        xattr_answer(mapped(self.fs.listxattr(ino))?, size)
    }

    fn removexattr(&self, _req: &Req, ino: u64, name: &OsStr) -> Result<(), Errno> {
        let _t = self.timing.start(FuseKind::Modify);
        self.xattrs_on()?;
        mapped(self.fs.removexattr(ino, name))
    }

    fn create(
        &self,
        req: &Req,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
    ) -> Result<(FileAttr, Opened), Errno> {
        let _t = self.timing.start(FuseKind::Modify);
        let caller = caller_with_umask(req, umask);
        let a = self.attr(self.fs.create(parent, name, mode, caller))?;
        Ok((a, self.opened()))
    }

    fn fallocate(
        &self,
        req: &Req,
        ino: u64,
        _fh: u64,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<(), Errno> {
        let _t = self.timing.start(FuseKind::Modify);
        let how = allocate_mode(mode)?;
        // Like a write, whatever the mode (the kernel asks only for some of them).
        self.kill_privs(ino, KillPrivs::UnlessCallerHasFsetid(req.pid))?;
        mapped(self.fs.fallocate(ino, offset, length, how))
    }

    fn copy_file_range(&self, req: &Req, c: &CopyRange) -> Result<u32, Errno> {
        let _t = self.timing.start(FuseKind::Write);
        if c.flags != 0 {
            return Err(Errno::EINVAL);
        }
        // Like a write into the destination.
        self.kill_privs(c.ino_out, KillPrivs::UnlessCallerHasFsetid(req.pid))?;
        let n = mapped(
            self.fs
                .copy_range(c.ino_in, c.off_in, c.ino_out, c.off_out, c.len),
        )?;
        // (At most COPY_MAX, far below u32::MAX.)
        Ok(n as u32)
    }

    fn lseek(
        &self,
        _req: &Req,
        ino: u64,
        _fh: u64,
        offset: i64,
        whence: i32,
    ) -> Result<i64, Errno> {
        let _t = self.timing.start(FuseKind::Lookup);
        // fsd cannot see the pages the kernel has not written back, so it cannot
        // tell data from holes: ENOSYS makes the kernel answer from then on as for
        // a file without holes (the whole file is data), which is never wrong.
        if self.choices.cache == CacheMode::WriteBack {
            return Err(Errno::ENOSYS);
        }
        // The kernel forwards only SEEK_DATA and SEEK_HOLE; it does the others itself.
        let what = match whence {
            libc::SEEK_DATA => Seek::Data,
            libc::SEEK_HOLE => Seek::Hole,
            _ => return Err(Errno::EINVAL),
        };
        let Ok(offset) = u64::try_from(offset) else {
            return Err(Errno::ENXIO);
        };
        mapped(self.fs.seek(ino, offset, what)).map(|pos| pos as i64)
    }
}
