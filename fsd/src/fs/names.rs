//! The namespace operations: looking names up, creating, linking, renaming and
//! removing them, listing directories, and opening and closing files. The names
//! themselves live in `namespace.rs`; here fsd adds what only the filesystem knows:
//! the caller's umask or the parent's default ACL for a new inode's mode, the room
//! the volume has for new metadata, and giving a deleted file's blocks back once
//! nothing refers to it.

use super::{Caller, RmemFs};
use crate::acl;
use crate::error::{FsError, FsResult};
use crate::inode::{Attr, FileKind, Ino, Inode};
use crate::namespace::{DirEntry, NewInode, RenameMode};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

impl RmemFs {
    pub fn lookup(&self, parent: Ino, name: &OsStr) -> FsResult<Attr> {
        let inode = self.ns.lookup(parent, name)?;
        Ok(self.attr_of(&inode))
    }

    pub fn forget(&self, ino: Ino, n: u64) {
        if let Some(inode) = self.ns.forget(ino, n) {
            self.release_data_if_unreferenced(&inode);
        }
    }

    /// Creates an inode of `kind` with `mode`, less the caller's umask or as the
    /// parent's default ACL has it (`acl.rs`).
    fn new_inode(
        &self,
        parent: Ino,
        name: &OsStr,
        (kind, mode, rdev): (FileKind, u32, u32),
        target: Option<PathBuf>,
        caller: Caller,
    ) -> FsResult<Attr> {
        self.room_to_grow()?;
        let p = self.ns.get(parent)?;
        let (parent_gid, parent_sgid, default_acl) = {
            let m = p.meta();
            let default_acl = m.xattrs.get(OsStr::new(acl::DEFAULT)).cloned();
            (m.attr.gid, m.attr.perm & 0o2000 != 0, default_acl)
        };
        // BSD group semantics under a setgid directory; subdirectories inherit setgid.
        let gid = if parent_sgid { parent_gid } else { caller.gid };
        // Symlinks are always rwxrwxrwx.
        let (mut perm, xattrs) = match default_acl {
            _ if kind == FileKind::Symlink => (0o777, Default::default()),
            Some(default) if self.acls_enforced() => {
                self.inherited_acls(kind, (mode & 0o7777) as u16, default)
            }
            _ => ((mode & !caller.umask & 0o7777) as u16, Default::default()),
        };
        if parent_sgid && kind == FileKind::Dir {
            perm |= 0o2000;
        }
        let inode = self.ns.create(
            parent,
            name,
            NewInode {
                kind,
                perm,
                uid: caller.uid,
                gid,
                rdev,
                target,
                xattrs,
            },
        )?;
        Ok(self.attr_of(&inode))
    }

    pub fn mknod(
        &self,
        parent: Ino,
        name: &OsStr,
        kind: FileKind,
        mode: u32,
        rdev: u32,
        caller: Caller,
    ) -> FsResult<Attr> {
        if kind == FileKind::Dir || kind == FileKind::Symlink {
            return Err(FsError::Invalid);
        }
        self.new_inode(parent, name, (kind, mode, rdev), None, caller)
    }

    pub fn mkdir(&self, parent: Ino, name: &OsStr, mode: u32, caller: Caller) -> FsResult<Attr> {
        self.new_inode(parent, name, (FileKind::Dir, mode, 0), None, caller)
    }

    pub fn symlink(
        &self,
        parent: Ino,
        name: &OsStr,
        target: &Path,
        caller: Caller,
    ) -> FsResult<Attr> {
        if target.as_os_str().len() > 4095 {
            return Err(FsError::NameTooLong);
        }
        let t = Some(target.to_path_buf());
        self.new_inode(parent, name, (FileKind::Symlink, 0o777, 0), t, caller)
    }

    /// Creates and opens a regular file.
    pub fn create(&self, parent: Ino, name: &OsStr, mode: u32, caller: Caller) -> FsResult<Attr> {
        let attr = self.new_inode(parent, name, (FileKind::File, mode, 0), None, caller)?;
        self.ns.get(attr.ino)?.meta().opens += 1;
        Ok(attr)
    }

    pub fn readlink(&self, ino: Ino) -> FsResult<PathBuf> {
        self.ns
            .get(ino)?
            .meta()
            .target
            .clone()
            .ok_or(FsError::Invalid)
    }

    pub fn link(&self, ino: Ino, new_parent: Ino, new_name: &OsStr) -> FsResult<Attr> {
        self.room_to_grow()?;
        let inode = self.ns.link(ino, new_parent, new_name)?;
        Ok(self.attr_of(&inode))
    }

    pub fn unlink(&self, parent: Ino, name: &OsStr) -> FsResult<()> {
        let inode = self.ns.unlink(parent, name)?;
        self.release_data_if_unreferenced(&inode);
        Ok(())
    }

    pub fn rmdir(&self, parent: Ino, name: &OsStr) -> FsResult<()> {
        self.ns.rmdir(parent, name).map(|_| ())
    }

    pub fn rename(
        &self,
        parent: Ino,
        name: &OsStr,
        new_parent: Ino,
        new_name: &OsStr,
        mode: RenameMode,
    ) -> FsResult<()> {
        if let Some(replaced) = self.ns.rename(parent, name, new_parent, new_name, mode)? {
            self.release_data_if_unreferenced(&replaced);
        }
        Ok(())
    }

    pub fn readdir(&self, ino: Ino, offset: u64, max: usize) -> FsResult<Vec<DirEntry>> {
        let entries = self.ns.readdir(ino, offset, max)?;
        if let Ok(dir) = self.ns.get(ino) {
            self.accessed(&dir);
        }
        Ok(entries)
    }

    pub fn open(&self, ino: Ino) -> FsResult<Attr> {
        let inode = self.ns.get(ino)?;
        inode.meta().opens += 1;
        Ok(self.attr_of(&inode))
    }

    /// Closes a handle: the file's data goes back once nothing refers to it.
    pub fn release(&self, ino: Ino) -> FsResult<()> {
        let inode = self.ns.get(ino)?;
        {
            let mut m = inode.meta();
            m.opens = m.opens.saturating_sub(1);
        }
        self.release_data_if_unreferenced(&inode);
        Ok(())
    }

    /// Gives a deleted file's blocks back once no name and no handle refer to it.
    fn release_data_if_unreferenced(&self, inode: &Inode) {
        {
            let m = inode.meta();
            if !m.is_unreferenced() || m.released || m.attr.kind != FileKind::File {
                return;
            }
        }
        let _io = inode.io_exclusive();
        let blocks = {
            let mut m = inode.meta();
            if m.released || !m.is_unreferenced() {
                return;
            }
            m.released = true;
            let blocks = std::mem::take(&mut m.blocks);
            m.allocated = 0;
            for &i in blocks.keys() {
                m.block_changed(i);
            }
            blocks
        };
        self.changed(inode);
        // Drop cached pages first (waiting out any write-back in flight), then free.
        self.cache.invalidate(inode.ino, 0);
        self.free_later(blocks.into_values().map(|e| e.loc));
    }
}
