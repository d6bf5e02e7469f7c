//! FUSE: fsd's side of it. The transports, [`FuseOps`] and the settings both
//! transports share live in the `rmemfs-fuse` crate (shared with the benchmark's
//! nullfs, which needs nothing else of fsd) and are re-exported here under their
//! old paths (`fuse::ops`, `fuse::ring`, `fuse::timing`, [`CacheMode`], ...).
//!
//! - `adapter.rs`: fsd's answers, calls into the core ([`crate::fs::RmemFs`]);
//! - here: what fsd asks of the kernel beyond the shared settings (POSIX ACLs) and
//!   the one errno table.

mod adapter;

pub use adapter::{FuseAdapter, MountChoices};
pub use rmemfs_fuse::{configure_kernel, ops, ring, timing};
pub use rmemfs_fuse::{CacheMode, Classic, FuseOps, MAX_WRITE, TTL};

use crate::error::FsError;
use fuser::{Errno, InitFlags, KernelConfig};

/// Asks the kernel to enforce POSIX ACLs, which fsd keeps as xattrs (`acl.rs`), and
/// to leave the umask to fsd, since a directory's default ACL replaces it
/// (`FUSE_DONT_MASK`); whether the kernel offers both.
pub fn enable_posix_acl(config: &mut KernelConfig) -> bool {
    let asked = InitFlags::FUSE_POSIX_ACL | InitFlags::FUSE_DONT_MASK;
    match config.add_capabilities(asked) {
        Ok(()) => true,
        Err(missing) => {
            log::warn!("this kernel lacks {missing:?}: no POSIX ACLs on this mount");
            false
        }
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
        FsError::AccessDenied => Errno::EACCES,
        FsError::NoAttribute => Errno::ENODATA,
        FsError::Range => Errno::ERANGE,
        FsError::NotSupported => Errno::EOPNOTSUPP,
        FsError::NoSuchOffset => Errno::ENXIO,
        FsError::NoSpace => Errno::ENOSPC,
        FsError::Io(_) => Errno::EIO,
    }
}
