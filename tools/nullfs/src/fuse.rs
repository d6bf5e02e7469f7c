//! The FUSE glue: each answer asks the [`Namespace`]. The settings that shape the
//! FUSE traffic (init, TTL, open flags) and both transports are fsd's own (the
//! `rmemfs-fuse` crate), so both see the same requests from the kernel.

use crate::namespace::{Attr, Error, Kind, Namespace, SetAttr, MAX_NAME, ROOT_INO};
use fuser::{Errno, FileAttr, FileType, FopenFlags, INodeNo, KernelConfig, TimeOrNow};
use rmemfs_common::sync::lock;
use rmemfs_fuse::ops::{DirSink, Opened, Req, SetAttrIn, Statfs, Xattr};
use rmemfs_fuse::{CacheMode, FuseOps};
use std::ffi::OsStr;
use std::sync::{Mutex, MutexGuard};
use std::time::SystemTime;

/// st_blksize, fsd's default block size (what tools that size their I/O by it see).
const BLKSIZE: u32 = 64 << 10;
/// statfs: 1 TiB free in 4 KiB blocks, and 4 Gi inodes.
const STATFS_BLOCK: u64 = 4096;
const STATFS_BYTES: u64 = 1 << 40;
const STATFS_FILES: u64 = 1 << 32;

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

fn attr(r: Result<Attr, Error>) -> Result<FileAttr, Errno> {
    r.map(|a| file_attr(&a)).map_err(errno)
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
        lock(&self.ns)
    }

    /// A new regular file owned by the caller (mknod and create).
    fn create_file(&self, req: &Req, parent: u64, name: &OsStr, perm: u32) -> Result<Attr, Error> {
        self.ns()
            .create(parent, name, perm, req.uid, req.gid, SystemTime::now())
    }

    fn opened(&self) -> Opened {
        Opened {
            fh: 0,
            flags: self.cache.fopen_flags(),
        }
    }
}

impl FuseOps for NullFs {
    fn configure(&self, config: &mut KernelConfig) {
        rmemfs_fuse::configure_kernel(config, self.cache);
    }

    fn lookup(&self, _req: &Req, parent: u64, name: &OsStr) -> Result<FileAttr, Errno> {
        attr(self.ns().lookup(parent, name))
    }

    fn forget(&self, ino: u64, nlookup: u64) {
        self.ns().forget(ino, nlookup);
    }

    fn getattr(&self, _req: &Req, ino: u64) -> Result<FileAttr, Errno> {
        attr(self.ns().getattr(ino))
    }

    fn setattr(&self, _req: &Req, ino: u64, c: &SetAttrIn) -> Result<FileAttr, Errno> {
        let now = SystemTime::now();
        let change = SetAttr {
            mode: c.mode,
            uid: c.uid,
            gid: c.gid,
            size: c.size,
            atime: c.atime.map(|t| time(t, now)),
            mtime: c.mtime.map(|t| time(t, now)),
        };
        attr(self.ns().setattr(ino, &change, now))
    }

    fn mknod(
        &self,
        req: &Req,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
    ) -> Result<FileAttr, Errno> {
        if !matches!(mode & libc::S_IFMT, libc::S_IFREG | 0) {
            return Err(Errno::EPERM); // regular files only
        }
        attr(self.create_file(req, parent, name, mode & !umask))
    }

    fn mkdir(
        &self,
        _req: &Req,
        _parent: u64,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
    ) -> Result<FileAttr, Errno> {
        Err(Errno::EPERM) // one flat directory
    }

    fn unlink(&self, _req: &Req, parent: u64, name: &OsStr) -> Result<(), Errno> {
        self.ns()
            .unlink(parent, name, SystemTime::now())
            .map_err(errno)
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
        let a = attr(self.create_file(req, parent, name, mode & !umask))?;
        Ok((a, self.opened()))
    }

    fn open(&self, _req: &Req, ino: u64, _flags: i32) -> Result<Opened, Errno> {
        self.ns().getattr(ino).map_err(errno)?;
        Ok(self.opened())
    }

    fn read(
        &self,
        _req: &Req,
        ino: u64,
        _fh: u64,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, Errno> {
        let size = buf.len().min(u32::MAX as usize) as u32;
        // Nothing is written into `buf`: a read costs nullfs nothing, and returns
        // what the transport's buffer holds (zeros on /dev/fuse, whose buffer
        // nullfs never writes; on the ring, bytes of an earlier request).
        let len = self.ns().read_len(ino, offset, size).map_err(errno)?;
        Ok((len as usize).min(buf.len()))
    }

    fn write(
        &self,
        _req: &Req,
        ino: u64,
        _fh: u64,
        offset: u64,
        data: &[u8],
        _kill_suidgid: bool,
    ) -> Result<u32, Errno> {
        let len = data.len() as u32;
        self.ns()
            .write(ino, offset, len, SystemTime::now())
            .map_err(errno)
    }

    fn opendir(&self, _req: &Req, ino: u64) -> Result<Opened, Errno> {
        if ino == ROOT_INO {
            Ok(Opened {
                fh: 0,
                flags: FopenFlags::empty(),
            })
        } else {
            Err(Errno::ENOTDIR)
        }
    }

    fn readdir(
        &self,
        _req: &Req,
        ino: u64,
        offset: u64,
        out: &mut dyn DirSink,
    ) -> Result<(), Errno> {
        // Enough entries to fill a reply buffer; the kernel asks again for more.
        let entries = self.ns().readdir(ino, offset, 512).map_err(errno)?;
        for e in entries {
            if out.add(e.ino, e.next, file_type(e.kind), &e.name) {
                break; // buffer full
            }
        }
        Ok(())
    }

    /// No file has extended attributes, but the answer is ENODATA as from fsd, not
    /// ENOSYS: after ENOSYS the kernel stops asking. On kernels without
    /// FUSE_HANDLE_KILLPRIV_V2 (before Linux 5.11) both then answer a
    /// getxattr("security.capability") before every write(2), FUSE's cost there.
    fn getxattr(&self, _req: &Req, ino: u64, _name: &OsStr, _size: u32) -> Result<Xattr, Errno> {
        self.ns().getattr(ino).map_err(errno)?;
        Err(Errno::ENODATA)
    }

    fn listxattr(&self, _req: &Req, ino: u64, size: u32) -> Result<Xattr, Errno> {
        self.ns().getattr(ino).map_err(errno)?;
        Ok(if size == 0 {
            Xattr::Size(0)
        } else {
            Xattr::Data(Vec::new())
        })
    }

    /// The modes fsd implements, so fio and friends take the same path on both.
    fn fallocate(
        &self,
        _req: &Req,
        ino: u64,
        _fh: u64,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<(), Errno> {
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let keep_size = match mode & !libc::FALLOC_FL_KEEP_SIZE {
            0 | libc::FALLOC_FL_ZERO_RANGE => keep_size,
            libc::FALLOC_FL_PUNCH_HOLE if keep_size => true,
            _ => return Err(Errno::EOPNOTSUPP),
        };
        self.ns()
            .allocate(ino, offset, length, keep_size, SystemTime::now())
            .map_err(errno)
    }

    fn statfs(&self, _req: &Req, _ino: u64) -> Result<Statfs, Errno> {
        let blocks = STATFS_BYTES / STATFS_BLOCK;
        let files = self.ns().file_count();
        Ok(Statfs {
            blocks,
            bfree: blocks,
            bavail: blocks,
            files: STATFS_FILES,
            ffree: STATFS_FILES.saturating_sub(files),
            bsize: STATFS_BLOCK as u32,
            namelen: MAX_NAME as u32,
            frsize: STATFS_BLOCK as u32,
        })
    }
}
