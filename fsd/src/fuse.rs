//! The FUSE adapter: the only module that knows fuser. Each handler calls the core
//! ([`RmemFs`]) and turns its result into a reply; errno mapping happens here and
//! nowhere else.

use crate::error::FsError;
use crate::fs::{Allocate, Caller, RmemFs, Seek, SetAttr, SetTime, SetXattrMode};
use crate::inode::{Attr, FileKind};
use crate::namespace::RenameMode;
use crate::privs::KillPrivs;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// How long the kernel may cache attributes and entries. Every change goes through
/// this mount, so the kernel's view cannot go stale behind its back.
pub const TTL: Duration = Duration::from_secs(1);
/// Largest write the kernel sends in one request.
const MAX_WRITE: u32 = 1 << 20;

/// What fsd asks of the kernel at init: requests of up to 1 MiB (the kernel may
/// grant less readahead), clearing setuid/setgid itself (`FUSE_HANDLE_KILLPRIV_V2`,
/// which spares a `security.capability` lookup per write; see `privs.rs`), with
/// [`CacheMode::Direct`] shared mappings of handles that bypass the page cache, and
/// with [`CacheMode::WriteBack`] the kernel's write-back cache.
pub fn configure_kernel(config: &mut KernelConfig, cache: CacheMode) {
    let _ = config.set_max_write(MAX_WRITE);
    let _ = config.set_max_readahead(MAX_WRITE);
    if config
        .add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2)
        .is_err()
    {
        log::info!(
            "this kernel lacks FUSE_HANDLE_KILLPRIV_V2 (Linux 5.11): it clears \
             setuid/setgid itself and asks for security.capability before each write"
        );
    }
    if cache == CacheMode::Direct
        && config
            .add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
            .is_err()
    {
        log::warn!(
            "this kernel cannot map files of a direct-I/O mount shared \
             (FUSE_DIRECT_IO_ALLOW_MMAP, Linux 6.6): mmap(MAP_SHARED) fails with ENODEV"
        );
    }
    if cache == CacheMode::WriteBack
        && config
            .add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE)
            .is_err()
    {
        log::warn!(
            "this kernel has no FUSE write-back cache (FUSE_WRITEBACK_CACHE, Linux \
             3.15): every write(2) goes to fsd as without --writeback-cache"
        );
    }
}

/// The one errno table.
pub fn errno(e: &FsError) -> Errno {
    match e {
        FsError::NotFound => Errno::ENOENT,
        FsError::Exists => Errno::EEXIST,
        FsError::NotDir => Errno::ENOTDIR,
        FsError::IsDir => Errno::EISDIR,
        FsError::NotEmpty => Errno::ENOTEMPTY,
        FsError::Invalid => Errno::EINVAL,
        FsError::NameTooLong => Errno::ENAMETOOLONG,
        FsError::TooLarge => Errno::EFBIG,
        FsError::TooManyLinks => Errno::EMLINK,
        FsError::NotPermitted => Errno::EPERM,
        FsError::NoAttribute => Errno::ENODATA,
        FsError::Range => Errno::ERANGE,
        FsError::NotSupported => Errno::EOPNOTSUPP,
        FsError::NoSuchOffset => Errno::ENXIO,
        FsError::NoSpace => Errno::ENOSPC,
        FsError::Io(_) => Errno::EIO,
    }
}

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

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
    }
}

fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::SpecificTime(t) => SetTime::At(t),
        TimeOrNow::Now => SetTime::Now,
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
}

impl FuseAdapter {
    pub fn new(fs: Arc<RmemFs>, choices: MountChoices) -> FuseAdapter {
        let block_size = fs.remote().block_size().min(u32::MAX as u64) as u32;
        FuseAdapter {
            fs,
            block_size,
            choices,
        }
    }

    fn entry(&self, r: Result<Attr, FsError>, reply: ReplyEntry) {
        match r {
            Ok(a) => reply.entry(&TTL, &file_attr(&a, self.block_size), Generation(0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn attr(&self, r: Result<Attr, FsError>, reply: ReplyAttr) {
        match r {
            Ok(a) => reply.attr(&TTL, &file_attr(&a, self.block_size)),
            Err(e) => reply.error(errno(&e)),
        }
    }
}

fn empty(r: Result<(), FsError>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

/// How file handles are served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheMode {
    /// Through the kernel's page cache, O_DIRECT handles included: the kernel itself
    /// sends an O_DIRECT handle's reads and writes straight to fsd (its generic
    /// direct-I/O path), and with it gives what a local filesystem gives: dirty pages
    /// of the range written back before a direct read, cached pages dropped after a
    /// direct write, and shared mappings allowed. Reads the page cache holds never
    /// reach fsd.
    PageCache,
    /// Every handle bypasses the page cache (FOPEN_DIRECT_IO, fsd --direct-io): each
    /// read and write is a request to fsd, of the size the program asked for. The
    /// data is cached once, in fsd's cache, rather than also in the kernel's, and
    /// streams cost less (no page cache to fill and drop); reads the page cache would
    /// have answered cost a round trip to fsd. Shared mappings need
    /// FUSE_DIRECT_IO_ALLOW_MMAP (Linux 6.6); without it the kernel refuses them with
    /// ENODEV.
    Direct,
    /// Through the page cache, written back by the kernel (FUSE_WRITEBACK_CACHE, fsd
    /// --writeback-cache): a `write(2)` returns once the kernel's page holds the data,
    /// and the kernel sends fsd the dirty pages later, in runs, as it writes back any
    /// file (after some seconds, under memory pressure, at fsync and at close). Small
    /// writes then cost no round trip to fsd, but fsd learns of a write only at
    /// write-back: a write-back that fails (a full remote memory: ENOSPC) is reported
    /// by the next fsync or close, not by the write; `st_blocks` and statfs count
    /// what fsd holds; and SEEK_DATA/SEEK_HOLE report the whole file as data (fsd
    /// answers FUSE_LSEEK with ENOSYS, as it cannot see the kernel's dirty pages).
    WriteBack,
}

impl CacheMode {
    /// The mode fsd's (and nullfs's) command-line flags choose; the parsers reject
    /// both at once.
    pub fn from_flags(direct_io: bool, writeback_cache: bool) -> CacheMode {
        match (direct_io, writeback_cache) {
            (true, _) => CacheMode::Direct,
            (false, true) => CacheMode::WriteBack,
            (false, false) => CacheMode::PageCache,
        }
    }

    /// The flags of an open file's reply.
    pub fn fopen_flags(self) -> FopenFlags {
        match self {
            CacheMode::PageCache | CacheMode::WriteBack => FopenFlags::empty(),
            CacheMode::Direct => FopenFlags::FOPEN_DIRECT_IO,
        }
    }
}

fn xattr_reply(r: Result<Vec<u8>, FsError>, size: u32, reply: ReplyXattr) {
    match r {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() <= size as usize => reply.data(&v),
        Ok(_) => reply.error(Errno::ERANGE),
        Err(e) => reply.error(errno(&e)),
    }
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

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        configure_kernel(config, self.choices.cache);
        Ok(())
    }

    fn destroy(&mut self) {
        self.fs.shutdown();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.entry(self.fs.lookup(parent.0, name), reply);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.attr(self.fs.getattr(ino.0), reply);
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
        // With FUSE_HANDLE_KILLPRIV_V2 the kernel leaves setuid/setgid to us. fuser
        // hides the request's FATTR_KILL_SUIDGID bit, so it is rebuilt from what the
        // kernel sends: a chown clears them; a truncate clears them unless the caller
        // has CAP_FSETID; a SETATTR that sets nothing is chown(f, -1, -1) or the
        // kernel's file_remove_privs for an unprivileged write, fallocate or
        // copy_file_range, and clears them too. A `mode` given alongside still wins.
        let kill_privs = if uid.is_some() || gid.is_some() {
            KillPrivs::Yes
        } else if size.is_some() {
            KillPrivs::UnlessCallerHasFsetid(req.pid())
        } else if mode.is_none() && atime.is_none() && mtime.is_none() {
            KillPrivs::Yes
        } else {
            KillPrivs::No
        };
        let change = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
            kill_privs,
        };
        self.attr(self.fs.setattr(ino.0, &change), reply);
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(ino.0) {
            Ok(t) => reply.data(t.as_os_str().as_encoded_bytes()),
            Err(e) => reply.error(errno(&e)),
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
        let kind = match mode & libc::S_IFMT {
            libc::S_IFREG | 0 => FileKind::File,
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFSOCK => FileKind::Socket,
            libc::S_IFCHR => FileKind::CharDevice,
            libc::S_IFBLK => FileKind::BlockDevice,
            _ => return reply.error(Errno::EINVAL),
        };
        let r = self
            .fs
            .mknod(parent.0, name, kind, mode & !umask, rdev, caller(req));
        self.entry(r, reply);
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
        self.entry(
            self.fs.mkdir(parent.0, name, mode & !umask, caller(req)),
            reply,
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(self.fs.unlink(parent.0, name), reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(self.fs.rmdir(parent.0, name), reply);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.entry(
            self.fs.symlink(parent.0, link_name, target, caller(req)),
            reply,
        );
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            return reply.error(Errno::EINVAL);
        }
        let mode = RenameMode {
            no_replace: flags.contains(RenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(RenameFlags::RENAME_EXCHANGE),
        };
        empty(
            self.fs.rename(parent.0, name, newparent.0, newname, mode),
            reply,
        );
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.entry(self.fs.link(ino.0, newparent.0, newname), reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.open(ino.0) {
            Ok(_) => reply.opened(FileHandle(0), self.choices.cache.fopen_flags()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.fs.read(ino.0, offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // The kernel has checked the writer's CAP_FSETID (FUSE_HANDLE_KILLPRIV_V2).
        if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            if let Err(e) = self.fs.kill_privs(ino.0) {
                return reply.error(errno(&e));
            }
        }
        match self.fs.write(ino.0, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        empty(self.fs.fsync(ino.0), reply);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        empty(self.fs.release(ino.0), reply);
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        empty(self.fs.fsync_durable(ino.0), reply);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        // Enough entries to fill a reply buffer; the kernel asks again for more.
        match self.fs.readdir(ino.0, offset, 512) {
            Ok(entries) => {
                for e in entries {
                    if reply.add(INodeNo(e.ino), e.offset, file_type(e.kind), &e.name) {
                        break; // buffer full
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // On a volume, a directory's entries become durable with the next commit.
        empty(self.fs.commit(), reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.fs.statfs();
        let bs = s.block_size;
        // Inodes are limited only by fsd's memory; report a large, honest-enough pool.
        let files = 1u64 << 32;
        reply.statfs(
            s.total_bytes / bs,
            s.free_bytes / bs,
            s.free_bytes / bs,
            files,
            files.saturating_sub(s.inodes),
            bs as u32,
            crate::namespace::MAX_NAME as u32,
            bs as u32,
        );
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let known = libc::XATTR_CREATE | libc::XATTR_REPLACE;
        if flags & !known != 0 {
            return reply.error(Errno::EINVAL);
        }
        let mode = SetXattrMode {
            create: flags & libc::XATTR_CREATE != 0,
            replace: flags & libc::XATTR_REPLACE != 0,
        };
        if !self.choices.xattrs {
            return reply.error(Errno::ENOSYS);
        }
        empty(self.fs.setxattr(ino.0, name, value, mode), reply);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        if !self.choices.xattrs {
            return reply.error(Errno::ENOSYS);
        }
        xattr_reply(self.fs.getxattr(ino.0, name), size, reply);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        if !self.choices.xattrs {
            return reply.error(Errno::ENOSYS);
        }
        xattr_reply(self.fs.listxattr(ino.0), size, reply);
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if !self.choices.xattrs {
            return reply.error(Errno::ENOSYS);
        }
        empty(self.fs.removexattr(ino.0, name), reply);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        match self.fs.create(parent.0, name, mode & !umask, caller(req)) {
            Ok(a) => reply.created(
                &TTL,
                &file_attr(&a, self.block_size),
                Generation(0),
                FileHandle(0),
                self.choices.cache.fopen_flags(),
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        match allocate_mode(mode) {
            Ok(how) => empty(self.fs.fallocate(ino.0, offset, length, how), reply),
            Err(e) => reply.error(e),
        }
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        // fsd cannot see the pages the kernel has not written back, so it cannot
        // tell data from holes: ENOSYS makes the kernel answer from then on as for
        // a file without holes (the whole file is data), which is never wrong.
        if self.choices.cache == CacheMode::WriteBack {
            return reply.error(Errno::ENOSYS);
        }
        // The kernel forwards only SEEK_DATA and SEEK_HOLE; it does the others itself.
        let what = match whence {
            libc::SEEK_DATA => Seek::Data,
            libc::SEEK_HOLE => Seek::Hole,
            _ => return reply.error(Errno::EINVAL),
        };
        let Ok(offset) = u64::try_from(offset) else {
            return reply.error(Errno::ENXIO);
        };
        match self.fs.seek(ino.0, offset, what) {
            Ok(pos) => reply.offset(pos as i64),
            Err(e) => reply.error(errno(&e)),
        }
    }
}
