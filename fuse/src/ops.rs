//! What a filesystem answers to FUSE requests, whatever carries them. Both transports
//! (`classic.rs`: fuser's /dev/fuse loop; `ring/`: FUSE over io_uring) decode a
//! request, call one of these methods and encode its answer; a filesystem (fsd's
//! `FuseAdapter`, the benchmark's nullfs) implements them once.
//!
//! Values are fuser's own types where it has them ([`FileAttr`], [`Errno`],
//! [`FileType`]), so the classic transport passes them through unchanged and the
//! ring encodes them as the kernel's structs. Methods a filesystem does not
//! implement answer ENOSYS, which tells the kernel not to ask again.

use fuser::{Errno, FileAttr, FileType, FopenFlags, KernelConfig, TimeOrNow};
use std::ffi::OsStr;
use std::path::Path;

/// Who asked: from the request's header.
#[derive(Clone, Copy, Debug, Default)]
pub struct Req {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// A SETATTR: each field set is a change asked for.
#[derive(Clone, Copy, Debug, Default)]
pub struct SetAttrIn {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeOrNow>,
    pub mtime: Option<TimeOrNow>,
}

/// What one READ request asks for: `len` bytes of file `ino` at `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadAt {
    pub ino: u64,
    pub offset: u64,
    pub len: usize,
}

/// A READ answered with others ([`FuseOps::read_together`]): what it asks for, the
/// buffer its bytes go to (as long as it asks), and how many it got once answered.
pub struct ReadTogether<'a> {
    pub at: ReadAt,
    pub buf: &'a mut [u8],
    pub done: Option<usize>,
}

/// An open file or directory: its handle and how the kernel is to treat it.
#[derive(Clone, Copy, Debug)]
pub struct Opened {
    pub fh: u64,
    pub flags: FopenFlags,
}

/// The answer to statfs, as `struct statvfs` counts it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Statfs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// Where readdir puts entries. `add` returns true when the reply is full and the
/// entry was not added; the kernel asks again from that entry's offset.
pub trait DirSink {
    fn add(&mut self, ino: u64, offset: u64, kind: FileType, name: &OsStr) -> bool;
}

/// An xattr answer: the caller's buffer size decides between the size alone and
/// the bytes (ERANGE when they do not fit), as getxattr(2) and listxattr(2) define.
pub fn xattr_answer(value: Vec<u8>, size: u32) -> Result<Xattr, Errno> {
    if size == 0 {
        Ok(Xattr::Size(value.len() as u32))
    } else if value.len() <= size as usize {
        Ok(Xattr::Data(value))
    } else {
        Err(Errno::ERANGE)
    }
}

/// See [`xattr_answer`].
#[derive(Debug)]
pub enum Xattr {
    Size(u32),
    Data(Vec<u8>),
}

/// Every request a FUSE filesystem here serves. `&self` everywhere: requests run
/// concurrently on the transport's threads.
#[allow(unused_variables)]
pub trait FuseOps: Send + Sync + 'static {
    /// Settings for the kernel at FUSE_INIT (max write, capabilities).
    fn configure(&self, config: &mut KernelConfig);
    /// The kernel let go of the filesystem (unmount): write back what is dirty.
    fn destroy(&self) {}
    /// Once mounted: how to tell the kernel about changes it did not ask for.
    fn attach_notifier(&self, _notifier: fuser::Notifier) {}

    fn lookup(&self, req: &Req, parent: u64, name: &OsStr) -> Result<FileAttr, Errno>;
    fn forget(&self, ino: u64, nlookup: u64) {}
    fn getattr(&self, req: &Req, ino: u64) -> Result<FileAttr, Errno>;
    fn setattr(&self, req: &Req, ino: u64, change: &SetAttrIn) -> Result<FileAttr, Errno> {
        Err(Errno::ENOSYS)
    }
    fn readlink(&self, req: &Req, ino: u64) -> Result<Vec<u8>, Errno> {
        Err(Errno::ENOSYS)
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
        Err(Errno::ENOSYS)
    }
    fn mkdir(
        &self,
        req: &Req,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
    ) -> Result<FileAttr, Errno> {
        Err(Errno::ENOSYS)
    }
    fn unlink(&self, req: &Req, parent: u64, name: &OsStr) -> Result<(), Errno> {
        Err(Errno::ENOSYS)
    }
    fn rmdir(&self, req: &Req, parent: u64, name: &OsStr) -> Result<(), Errno> {
        Err(Errno::ENOSYS)
    }
    fn symlink(
        &self,
        req: &Req,
        parent: u64,
        name: &OsStr,
        target: &Path,
    ) -> Result<FileAttr, Errno> {
        Err(Errno::ENOSYS)
    }
    /// `flags`: RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT as renameat2(2).
    fn rename(
        &self,
        req: &Req,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> Result<(), Errno> {
        Err(Errno::ENOSYS)
    }
    fn link(
        &self,
        req: &Req,
        ino: u64,
        newparent: u64,
        newname: &OsStr,
    ) -> Result<FileAttr, Errno> {
        Err(Errno::ENOSYS)
    }
    fn open(&self, req: &Req, ino: u64, flags: i32) -> Result<Opened, Errno> {
        Ok(Opened {
            fh: 0,
            flags: FopenFlags::empty(),
        })
    }
    /// Answers reads that came together, so that what they lack can be fetched in
    /// one round trip rather than one each: sets `done` of those it read into
    /// `buf` (each as [`FuseOps::read`] would). The others, all by default, are then
    /// answered one by one, which also reports any error. Returns how many blocks
    /// it fetched: none when the reads found all they needed at hand.
    fn read_together(&self, reads: &mut [ReadTogether<'_>]) -> usize {
        let _ = reads;
        0
    }
    /// Whether [`FuseOps::read_together`] gains from reads that come together, so
    /// that a transport should give them a chance to (see `ring/company.rs`, `Company`).
    fn gathers_reads(&self) -> bool {
        false
    }
    /// Reads into `buf` (as long as the request's size) and returns how many bytes
    /// are valid; fewer than asked only at the end of the file.
    fn read(
        &self,
        req: &Req,
        ino: u64,
        fh: u64,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, Errno>;
    /// `kill_suidgid`: the kernel asks the filesystem to clear setuid/setgid
    /// (FUSE_WRITE_KILL_SUIDGID, the writer lacks CAP_FSETID).
    fn write(
        &self,
        req: &Req,
        ino: u64,
        fh: u64,
        offset: u64,
        data: &[u8],
        kill_suidgid: bool,
    ) -> Result<u32, Errno>;
    fn flush(&self, req: &Req, ino: u64, fh: u64) -> Result<(), Errno> {
        Ok(())
    }
    fn release(&self, req: &Req, ino: u64, fh: u64) -> Result<(), Errno> {
        Ok(())
    }
    fn fsync(&self, req: &Req, ino: u64, fh: u64, datasync: bool) -> Result<(), Errno> {
        Ok(())
    }
    fn opendir(&self, req: &Req, ino: u64) -> Result<Opened, Errno> {
        Ok(Opened {
            fh: 0,
            flags: FopenFlags::empty(),
        })
    }
    fn readdir(&self, req: &Req, ino: u64, offset: u64, out: &mut dyn DirSink)
        -> Result<(), Errno>;
    fn releasedir(&self, req: &Req, ino: u64, fh: u64) -> Result<(), Errno> {
        Ok(())
    }
    fn fsyncdir(&self, req: &Req, ino: u64, datasync: bool) -> Result<(), Errno> {
        Ok(())
    }
    fn statfs(&self, req: &Req, ino: u64) -> Result<Statfs, Errno>;
    fn setxattr(
        &self,
        req: &Req,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> Result<(), Errno> {
        Err(Errno::ENOSYS)
    }
    fn getxattr(&self, req: &Req, ino: u64, name: &OsStr, size: u32) -> Result<Xattr, Errno> {
        Err(Errno::ENOSYS)
    }
    fn listxattr(&self, req: &Req, ino: u64, size: u32) -> Result<Xattr, Errno> {
        Err(Errno::ENOSYS)
    }
    fn removexattr(&self, req: &Req, ino: u64, name: &OsStr) -> Result<(), Errno> {
        Err(Errno::ENOSYS)
    }
    fn create(
        &self,
        req: &Req,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(FileAttr, Opened), Errno> {
        Err(Errno::ENOSYS)
    }
    fn fallocate(
        &self,
        req: &Req,
        ino: u64,
        fh: u64,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<(), Errno> {
        Err(Errno::ENOSYS)
    }
    fn lseek(&self, req: &Req, ino: u64, fh: u64, offset: i64, whence: i32) -> Result<i64, Errno> {
        Err(Errno::ENOSYS)
    }
    /// copy_file_range: bytes copied.
    fn copy_file_range(&self, req: &Req, copy: &CopyRange) -> Result<u32, Errno> {
        Err(Errno::ENOSYS)
    }
}

/// A copy_file_range request, as both transports decode it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyRange {
    pub ino_in: u64,
    pub fh_in: u64,
    pub off_in: u64,
    pub ino_out: u64,
    pub fh_out: u64,
    pub off_out: u64,
    pub len: u64,
    pub flags: u64,
}
