//! An inode's attributes as programs ask for and change them: getattr and setattr
//! (a size change goes through `truncate.rs`), the mount's atime rules applied on
//! access, and clearing setuid/setgid before a write. The data path sets size and
//! mtime itself, as it writes.

use super::{RmemFs, SetAttr, SetTime};
use crate::atime::AtimePolicy;
use crate::error::FsResult;
use crate::inode::{Attr, FileKind, Ino, Inode};
use crate::privs::KillPrivs;
use std::time::SystemTime;

impl RmemFs {
    pub fn getattr(&self, ino: Ino) -> FsResult<Attr> {
        let inode = self.ns.get(ino)?;
        Ok(self.attr_of(&inode))
    }

    pub fn setattr(&self, ino: Ino, req: &SetAttr) -> FsResult<Attr> {
        let inode = self.ns.get(ino)?;
        if let Some(size) = req.size {
            self.truncate(&inode, size)?;
        }
        let mut m = inode.meta();
        if m.attr.kind != FileKind::Dir {
            m.attr.perm = req.kill_privs.perm_after(m.attr.perm, m.attr.gid);
        }
        let now = SystemTime::now();
        let resolve = |t: SetTime| match t {
            SetTime::At(t) => t,
            SetTime::Now => now,
        };
        if let Some(mode) = req.mode {
            m.attr.perm = (mode & 0o7777) as u16;
            self.chmod_access_acl(&mut m);
        }
        if let Some(uid) = req.uid {
            m.attr.uid = uid;
        }
        if let Some(gid) = req.gid {
            m.attr.gid = gid;
        }
        if let Some(t) = req.atime {
            m.attr.atime = resolve(t);
        }
        if let Some(t) = req.mtime {
            m.attr.mtime = resolve(t);
        }
        m.attr.ctime = now;
        drop(m);
        self.changed(&inode);
        Ok(self.attr_of(&inode))
    }

    /// The atime rules of the mount (see `atime.rs`).
    pub fn atime_policy(&self) -> &AtimePolicy {
        &self.atime
    }

    /// Updates `inode`'s atime for an access now, if the mount's rules say so.
    pub(super) fn accessed(&self, inode: &Inode) {
        let now = SystemTime::now();
        let mut m = inode.meta();
        let a = &m.attr;
        let is_dir = a.kind == FileKind::Dir;
        if self
            .atime
            .needs_update(is_dir, a.atime, a.mtime, a.ctime, now)
        {
            m.attr.atime = now;
            drop(m);
            self.changed(inode);
        }
    }

    /// Clears setuid/setgid of a file as `how` says, before a write or fallocate
    /// (see `privs.rs`); true when that changed its mode.
    pub fn kill_privs(&self, ino: Ino, how: KillPrivs) -> FsResult<bool> {
        let inode = self.file_inode(ino)?;
        let mut m = inode.meta();
        let perm = how.perm_after(m.attr.perm, m.attr.gid);
        if perm == m.attr.perm {
            return Ok(false);
        }
        m.attr.perm = perm;
        m.touch_ctime();
        drop(m);
        self.changed(&inode);
        Ok(true)
    }
}
