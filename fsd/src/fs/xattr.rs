//! Extended attributes, with the semantics of a local Linux filesystem.
//!
//! - Names live in the `user.`, `trusted.` and `security.` namespaces; any other name
//!   is EOPNOTSUPP, for get, set and remove alike, as on tmpfs. A namespace prefix
//!   with nothing after it is EINVAL.
//! - POSIX ACLs are the two `system.posix_acl_*` names, when the kernel enforces them
//!   on this mount (`FUSE_POSIX_ACL`; else they are EOPNOTSUPP like other `system.`
//!   names, since nothing would enforce them). Setting one is checked (EINVAL for a
//!   malformed ACL, EACCES for a default ACL on a non-directory), and an access ACL
//!   sets the mode as `acl.rs` says, clearing setgid when the caller is neither in the
//!   file's group nor holds `CAP_FSETID`, as `posix_acl_update_mode` does.
//!   The kernel checks who may touch which namespace, and the size limits (ERANGE
//!   for a name over 255 bytes, E2BIG for a value over 64 KiB) before calling us.
//! - A missing attribute is ENODATA; `XATTR_CREATE` on an existing one is EEXIST,
//!   `XATTR_REPLACE` on a missing one is ENODATA.
//! - The FUSE adapter answers size probes and ERANGE for a short buffer from the
//!   value or list returned here.
//! - Setting or removing an attribute changes ctime.

use super::{Caller, RmemFs};
use crate::acl::{self, Acl};
use crate::error::{FsError, FsResult};
use crate::inode::{FileKind, Ino, Meta};
use crate::privs;
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
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

/// Which ACL `name` is, if it is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AclName {
    Access,
    Default,
}

fn acl_name(name: &OsStr) -> Option<AclName> {
    match name.to_str()? {
        acl::ACCESS => Some(AclName::Access),
        acl::DEFAULT => Some(AclName::Default),
        _ => None,
    }
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
    /// The kernel enforces POSIX ACLs on this mount: from now on fsd keeps them.
    pub fn enable_posix_acl(&self) {
        self.posix_acl.store(true, Ordering::Relaxed);
    }

    pub(super) fn acls_enforced(&self) -> bool {
        self.posix_acl.load(Ordering::Relaxed)
    }

    /// Checks `name` for get, set and remove: `Some` if it is an ACL's.
    fn check_name(&self, name: &OsStr) -> FsResult<Option<AclName>> {
        match acl_name(name) {
            Some(which) if self.acls_enforced() => Ok(Some(which)),
            _ => check_namespace(name).map(|()| None),
        }
    }

    /// The mode bits and xattrs of a new `kind` inode created with `perm` in a
    /// directory whose default ACL is `default`: `perm` masked by the ACL, the ACL as
    /// the access ACL if it says more than those bits, and for a directory the default
    /// ACL itself. A stored ACL that does not decode (it was checked when set) counts
    /// as none, with the umask already gone: the safe side is the narrower ACL's
    /// absence, logged.
    pub(super) fn inherited_acls(
        &self,
        kind: FileKind,
        perm: u16,
        default: Vec<u8>,
    ) -> (u16, BTreeMap<OsString, Vec<u8>>) {
        let mut xattrs = BTreeMap::new();
        let mut acl = match Acl::decode(&default) {
            Ok(acl) => acl,
            Err(e) => {
                log::error!("a directory's default ACL does not decode ({e}): not inherited");
                return (perm, xattrs);
            }
        };
        let (perm, extended) = acl.inherit(perm);
        if extended {
            xattrs.insert(acl::ACCESS.into(), acl.encode());
        }
        if kind == FileKind::Dir {
            xattrs.insert(acl::DEFAULT.into(), default);
        }
        (perm, xattrs)
    }

    /// After a chmod of the inode `m` guards: its access ACL follows the new mode.
    pub(super) fn chmod_access_acl(&self, m: &mut Meta) {
        let perm = m.attr.perm;
        if let Some(stored) = m.xattrs.get_mut(OsStr::new(acl::ACCESS)) {
            match Acl::decode(stored) {
                Ok(mut acl) => {
                    acl.chmod(perm);
                    *stored = acl.encode();
                }
                Err(e) => log::error!("inode {}: access ACL does not decode: {e}", m.attr.ino),
            }
        }
    }

    pub fn setxattr(
        &self,
        ino: Ino,
        name: &OsStr,
        value: &[u8],
        mode: SetXattrMode,
        caller: Caller,
    ) -> FsResult<()> {
        let which = self.check_name(name)?;
        self.room_to_grow()?;
        let inode = self.ns.get(ino)?;
        let mut m = inode.meta();
        let exists = m.xattrs.contains_key(name);
        if mode.create && exists {
            return Err(FsError::Exists);
        }
        if mode.replace && !exists {
            return Err(FsError::NoAttribute);
        }
        match which {
            None => {
                m.xattrs.insert(name.to_os_string(), value.to_vec());
            }
            Some(which) => {
                let acl = Acl::decode(value).map_err(|e| {
                    log::debug!("inode {ino}: {e}");
                    FsError::Invalid
                })?;
                set_acl(&mut m, which, acl, caller)?;
            }
        }
        m.touch_ctime();
        drop(m);
        if let Some(v) = &self.volume {
            v.journal().grew((name.len() + value.len()) as u64 + 16);
        }
        self.changed(&inode);
        Ok(())
    }

    pub fn getxattr(&self, ino: Ino, name: &OsStr) -> FsResult<Vec<u8>> {
        self.counters.xattr_reads.fetch_add(1, Ordering::Relaxed);
        self.check_name(name)?;
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

    /// Removing an ACL the inode lacks succeeds, as a local filesystem's `set_acl`
    /// of none does (`tar --acls` and `setfacl -k` rely on it).
    pub fn removexattr(&self, ino: Ino, name: &OsStr) -> FsResult<()> {
        let acl = self.check_name(name)?;
        let inode = self.ns.get(ino)?;
        let mut m = inode.meta();
        if m.xattrs.remove(name).is_none() && acl.is_none() {
            return Err(FsError::NoAttribute);
        }
        m.touch_ctime();
        drop(m);
        self.changed(&inode);
        Ok(())
    }
}

/// Sets ACL `which` of the inode `m` guards to `acl`, set by `caller`.
fn set_acl(m: &mut Meta, which: AclName, acl: Acl, caller: Caller) -> FsResult<()> {
    let key = OsString::from(match which {
        AclName::Access => acl::ACCESS,
        AclName::Default => acl::DEFAULT,
    });
    if which == AclName::Default {
        if m.attr.kind != FileKind::Dir {
            return Err(FsError::AccessDenied);
        }
        m.xattrs.insert(key, acl.encode());
        return Ok(());
    }
    let (mut perm, extended) = acl.mode_bits(m.attr.perm);
    if perm & 0o2000 != 0 && !privs::may_keep_setgid(caller.pid, m.attr.gid) {
        perm &= !0o2000;
    }
    m.attr.perm = perm;
    if extended {
        m.xattrs.insert(key, acl.encode());
    } else {
        m.xattrs.remove(&key);
    }
    Ok(())
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
