//! The FUSE glue: each handler asks the [`Namespace`] and turns the answer into a
//! reply. The settings that shape the FUSE traffic (init, TTL, open flags) are
//! fsd's own (`fsd::fuse`), so both see the same requests from the kernel.

use crate::namespace::{Attr, Error, Kind, Namespace, SetAttr, MAX_NAME, ROOT_INO};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};
use std::ffi::OsStr;
use std::sync::{Mutex, MutexGuard};
use std::time::SystemTime;

use fsd::fuse::{CacheMode, TTL};

/// st_blksize, fsd's default block size (what tools that size their I/O by it see).
const BLKSIZE: u32 = 64 << 10;
/// statfs: 1 TiB free in 4 KiB blocks, and 4 Gi inodes.
const STATFS_BLOCK: u64 = 4096;
const STATFS_BYTES: u64 = 1 << 40;
const STATFS_FILES: u64 = 1 << 32;

/// What every read returns: zeros, from one buffer as large as any read the kernel
/// sends (at most max_pages, which fsd's settings make 1 MiB).
static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

fn errno(e: Error) -> Errno {
    match e {
        Error::NotFound => Errno::ENOENT,
        Error::NotDir => Errno::ENOTDIR,
        Error::IsDir => Errno::EISDIR,
        Error::Exists => Errno::EEXIST,
        Error::NameTooLong => Errno::ENAMETOOLONG,
        Error::Invalid => Errno::EINVAL,
        Error::TooLarge => Errno::EFBIG,
    }
}

fn file_type(k: Kind) -> FileType {
    match k {
        Kind::Dir => FileType::Directory,
        Kind::File => FileType::RegularFile,
    }
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: 0, // nothing is stored
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: a.ctime,
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: BLKSIZE,
        flags: 0,
    }
}

fn time(t: TimeOrNow, now: SystemTime) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => now,
    }
}

fn entry(r: Result<Attr, Error>, reply: ReplyEntry) {
    match r {
        Ok(a) => reply.entry(&TTL, &file_attr(&a), Generation(0)),
        Err(e) => reply.error(errno(e)),
    }
}

fn attr(r: Result<Attr, Error>, reply: ReplyAttr) {
    match r {
        Ok(a) => reply.attr(&TTL, &file_attr(&a)),
        Err(e) => reply.error(errno(e)),
    }
}

pub struct NullFs {
    ns: Mutex<Namespace>,
    cache: CacheMode,
}

impl NullFs {
    /// An empty root directory owned by `uid:gid`, its files served as fsd serves
    /// them with the same `cache` mode.
    pub fn new(uid: u32, gid: u32, cache: CacheMode) -> NullFs {
        NullFs {
            ns: Mutex::new(Namespace::new(uid, gid, SystemTime::now())),
            cache,
        }
    }

    fn ns(&self) -> MutexGuard<'_, Namespace> {
        self.ns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new regular file owned by the caller (mknod and create).
    fn create_file(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        perm: u32,
    ) -> Result<Attr, Error> {
        let (uid, gid) = (req.uid(), req.gid());
        self.ns()
            .create(parent.0, name, perm, uid, gid, SystemTime::now())
    }
}

impl Filesystem for NullFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        fsd::fuse::configure_kernel(config, self.cache);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        entry(self.ns().lookup(parent.0, name), reply);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.ns().forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        attr(self.ns().getattr(ino.0), reply);
    }

    fn setattr(
        &self,
        _req: &Request,
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
        let now = SystemTime::now();
        let req = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(|t| time(t, now)),
            mtime: mtime.map(|t| time(t, now)),
        };
        attr(self.ns().setattr(ino.0, &req, now), reply);
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if !matches!(mode & libc::S_IFMT, libc::S_IFREG | 0) {
            return reply.error(Errno::EPERM); // regular files only
        }
        let r = self.create_file(req, parent, name, mode & !umask);
        entry(r, reply);
    }

    fn mkdir(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EPERM); // one flat directory
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.ns().unlink(parent.0, name, SystemTime::now()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
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
        let r = self.create_file(req, parent, name, mode & !umask);
        match r {
            Ok(a) => reply.created(
                &TTL,
                &file_attr(&a),
                Generation(0),
                FileHandle(0),
                self.cache.fopen_flags(),
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.ns().getattr(ino.0) {
            Ok(_) => reply.opened(FileHandle(0), self.cache.fopen_flags()),
            Err(e) => reply.error(errno(e)),
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
        // The lock is dropped before the reply is copied to the kernel.
        let len = self.ns().read_len(ino.0, offset, size);
        match len {
            Ok(n) => reply.data(&ZEROS[..(n as usize).min(ZEROS.len())]),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let len = data.len() as u32;
        let r = self.ns().write(ino.0, offset, len, SystemTime::now());
        match r {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if ino.0 == ROOT_INO {
            reply.opened(FileHandle(0), FopenFlags::empty());
        } else {
            reply.error(Errno::ENOTDIR);
        }
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
        let entries = self.ns().readdir(ino.0, offset, 512);
        match entries {
            Ok(entries) => {
                for e in entries {
                    if reply.add(INodeNo(e.ino), e.next, file_type(e.kind), &e.name) {
                        break; // buffer full
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    /// No file has extended attributes, but the answer is ENODATA as from fsd, not
    /// ENOSYS: after ENOSYS the kernel stops asking. On kernels without
    /// FUSE_HANDLE_KILLPRIV_V2 (before Linux 5.11) both then answer a
    /// getxattr("security.capability") before every write(2), FUSE's cost there.
    fn getxattr(&self, _req: &Request, ino: INodeNo, _name: &OsStr, _size: u32, reply: ReplyXattr) {
        match self.ns().getattr(ino.0) {
            Ok(_) => reply.error(Errno::ENODATA),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.ns().getattr(ino.0) {
            Ok(_) if size == 0 => reply.size(0),
            Ok(_) => reply.data(&[]),
            Err(e) => reply.error(errno(e)),
        }
    }

    /// The modes fsd implements, so fio and friends take the same path on both.
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
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let keep_size = match mode & !libc::FALLOC_FL_KEEP_SIZE {
            0 | libc::FALLOC_FL_ZERO_RANGE => keep_size,
            libc::FALLOC_FL_PUNCH_HOLE if keep_size => true,
            _ => return reply.error(Errno::EOPNOTSUPP),
        };
        let r = self
            .ns()
            .allocate(ino.0, offset, length, keep_size, SystemTime::now());
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let blocks = STATFS_BYTES / STATFS_BLOCK;
        let files = self.ns().file_count();
        reply.statfs(
            blocks,
            blocks,
            blocks,
            STATFS_FILES,
            STATFS_FILES.saturating_sub(files),
            STATFS_BLOCK as u32,
            MAX_NAME as u32,
            STATFS_BLOCK as u32,
        );
    }
}
