//! Extended attributes, with the semantics of a local Linux filesystem.
//!
//! - Names live in the `user.`, `trusted.` and `security.` namespaces; any other name
//!   (and `system.`, which would mean POSIX ACLs that the kernel would not enforce
//!   through this mount) is EOPNOTSUPP, for get, set and remove alike, as on tmpfs.
//!   A namespace prefix with nothing after it is EINVAL.
//!   The kernel checks who may touch which namespace, and the size limits (ERANGE
//!   for a name over 255 bytes, E2BIG for a value over 64 KiB) before calling us.
//! - A missing attribute is ENODATA; `XATTR_CREATE` on an existing one is EEXIST,
//!   `XATTR_REPLACE` on a missing one is ENODATA.
//! - The FUSE adapter answers size probes and ERANGE for a short buffer from the
//!   value or list returned here.
//! - Setting or removing an attribute changes ctime.

use super::RmemFs;
use crate::error::{FsError, FsResult};
use crate::inode::Ino;
use std::ffi::OsStr;
use std::sync::atomic::Ordering;

/// Namespaces a name may be in.
const NAMESPACES: [&[u8]; 3] = [b"user.", b"trusted.", b"security."];

/// How `setxattr` treats an existing or missing attribute (flags decoded at the
/// boundary).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SetXattrMode {
    /// `XATTR_CREATE`: fail with EEXIST if the attribute exists.
    pub create: bool,
    /// `XATTR_REPLACE`: fail with ENODATA if it does not.
    pub replace: bool,
}

fn check_namespace(name: &OsStr) -> FsResult<()> {
    let bytes = name.as_encoded_bytes();
    match NAMESPACES.iter().find(|ns| bytes.starts_with(ns)) {
        Some(ns) if bytes.len() == ns.len() => Err(FsError::Invalid), // "user." alone
        Some(_) => Ok(()),
        None => Err(FsError::NotSupported),
    }
}

impl RmemFs {
    pub fn setxattr(
        &self,
        ino: Ino,
        name: &OsStr,
        value: &[u8],
        mode: SetXattrMode,
    ) -> FsResult<()> {
        check_namespace(name)?;
        let inode = self.ns.get(ino)?;
        let mut m = inode.meta();
        let exists = m.xattrs.contains_key(name);
        if mode.create && exists {
            return Err(FsError::Exists);
        }
        if mode.replace && !exists {
            return Err(FsError::NoAttribute);
        }
        m.xattrs.insert(name.to_os_string(), value.to_vec());
        m.touch_ctime();
        drop(m);
        self.changed(&inode);
        Ok(())
    }

    pub fn getxattr(&self, ino: Ino, name: &OsStr) -> FsResult<Vec<u8>> {
        self.counters.xattr_reads.fetch_add(1, Ordering::Relaxed);
        check_namespace(name)?;
        let inode = self.ns.get(ino)?;
        let m = inode.meta();
        m.xattrs.get(name).cloned().ok_or(FsError::NoAttribute)
    }

    /// Attribute names, each followed by a NUL, as listxattr returns them.
    pub fn listxattr(&self, ino: Ino) -> FsResult<Vec<u8>> {
        let inode = self.ns.get(ino)?;
        let m = inode.meta();
        let mut out = Vec::new();
        for name in m.xattrs.keys() {
            out.extend_from_slice(name.as_encoded_bytes());
            out.push(0);
        }
        Ok(out)
    }

    pub fn removexattr(&self, ino: Ino, name: &OsStr) -> FsResult<()> {
        check_namespace(name)?;
        let inode = self.ns.get(ino)?;
        let mut m = inode.meta();
        m.xattrs.remove(name).ok_or(FsError::NoAttribute)?;
        m.touch_ctime();
        drop(m);
        self.changed(&inode);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::check_namespace;
    use crate::error::FsError;

    #[test]
    fn namespaces_of_a_local_filesystem_are_accepted_and_others_are_not() {
        for ok in ["user.a", "trusted.b", "security.selinux", "user.with.dots"] {
            assert_eq!(check_namespace(ok.as_ref()), Ok(()), "{ok}");
        }
        for unsupported in ["bogus.a", "a", "", "system.posix_acl_access", "USER.a"] {
            assert_eq!(
                check_namespace(unsupported.as_ref()),
                Err(FsError::NotSupported),
                "{unsupported}"
            );
        }
        for invalid in ["user.", "trusted.", "security."] {
            assert_eq!(
                check_namespace(invalid.as_ref()),
                Err(FsError::Invalid),
                "{invalid}"
            );
        }
    }
}
