//! POSIX ACLs: the kernel's xattr form of an ACL and the rules that tie an ACL to a
//! file's mode, as a local Linux filesystem applies them (`fs/posix_acl.c`).
//!
//! With `FUSE_POSIX_ACL` the kernel checks permissions against ACLs itself; it reads
//! them as the xattrs `system.posix_acl_access` and `system.posix_acl_default` and
//! leaves three jobs to the filesystem, which this module does the arithmetic of:
//! - setting an access ACL sets the mode's permission bits from it, and an ACL that
//!   says no more than the mode is not kept (`posix_acl_update_mode`);
//! - chmod rewrites the access ACL's owner, mask (or group) and other entries
//!   (`posix_acl_chmod`);
//! - a new inode in a directory with a default ACL gets that ACL, masked by the mode
//!   it was created with, instead of the umask; a new directory inherits the default
//!   ACL itself too (`posix_acl_create`).

use rmemfs_common::le;
use std::fmt;

/// The xattr names of the two ACLs.
pub const ACCESS: &str = "system.posix_acl_access";
pub const DEFAULT: &str = "system.posix_acl_default";

/// `POSIX_ACL_XATTR_VERSION`: the header of the xattr form.
const VERSION: u32 = 2;
/// The id of entries that name no user or group.
const UNDEFINED_ID: u32 = u32::MAX;

/// Entry tags, in the order a valid ACL lists them.
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;

const RWX: u16 = 0o7;
const PERM_BITS: u16 = 0o777;

/// One entry: whom it is about (`tag`, and `id` for a named user or group) and the
/// read/write/execute bits it grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    tag: u16,
    perm: u16,
    id: u32,
}

/// A valid ACL (see [`Acl::decode`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Entry>,
}

/// Why bytes are not an ACL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidAcl(&'static str);

impl fmt::Display for InvalidAcl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid POSIX ACL: {}", self.0)
    }
}

impl Acl {
    /// Decodes the xattr form and checks it as `posix_acl_valid` does: one owner,
    /// owning-group and other entry each; named users, then named groups, each in
    /// increasing id order without repeats; a mask, required when there are named
    /// entries; tags in that order; permissions within rwx.
    pub fn decode(bytes: &[u8]) -> Result<Acl, InvalidAcl> {
        let version = le::u32_at(bytes, 0).ok_or(InvalidAcl("shorter than its header"))?;
        let body = &bytes[4..];
        if version != VERSION {
            return Err(InvalidAcl("not version 2"));
        }
        if body.is_empty() || !body.len().is_multiple_of(8) {
            return Err(InvalidAcl("not a whole number of entries"));
        }
        let entries: Vec<Entry> = body
            .chunks_exact(8)
            .map(|e| Entry {
                tag: le::u16_at(e, 0).unwrap_or_default(),
                perm: le::u16_at(e, 2).unwrap_or_default(),
                id: le::u32_at(e, 4).unwrap_or_default(),
            })
            .collect();
        let mut previous: Option<Entry> = None;
        let mut named = false;
        let count = |tag: u16| entries.iter().filter(|e| e.tag == tag).count();
        if count(USER_OBJ) != 1 || count(GROUP_OBJ) != 1 || count(OTHER) != 1 {
            return Err(InvalidAcl("owner, group and other must appear once each"));
        }
        if count(MASK) > 1 {
            return Err(InvalidAcl("more than one mask"));
        }
        for e in &entries {
            if ![USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER].contains(&e.tag) {
                return Err(InvalidAcl("unknown tag"));
            }
            if e.perm & !RWX != 0 {
                return Err(InvalidAcl("permission beyond rwx"));
            }
            if let Some(p) = previous {
                let named_in_order = p.tag == e.tag && (e.tag == USER || e.tag == GROUP);
                if e.tag < p.tag || (e.tag == p.tag && !named_in_order) {
                    return Err(InvalidAcl("entries out of order"));
                }
                if named_in_order && e.id <= p.id {
                    return Err(InvalidAcl("named entries out of order or repeated"));
                }
            }
            named |= e.tag == USER || e.tag == GROUP;
            previous = Some(*e);
        }
        if named && count(MASK) == 0 {
            return Err(InvalidAcl("named entries without a mask"));
        }
        Ok(Acl { entries })
    }

    /// The xattr form.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + 8 * self.entries.len());
        le::put(&mut out, VERSION);
        for e in &self.entries {
            le::put(&mut out, e.tag);
            le::put(&mut out, e.perm);
            let id = if e.tag == USER || e.tag == GROUP {
                e.id
            } else {
                UNDEFINED_ID
            };
            le::put(&mut out, id);
        }
        out
    }

    /// The tag of the entry that stands for the group class: the mask if there is
    /// one, else the owning group's.
    fn group_class_tag(&self) -> u16 {
        if self.entries.iter().any(|e| e.tag == MASK) {
            MASK
        } else {
            GROUP_OBJ
        }
    }

    fn group_class(&mut self) -> &mut Entry {
        let tag = self.group_class_tag();
        self.entries
            .iter_mut()
            .find(|e| e.tag == tag)
            .expect("a valid ACL has a group entry")
    }

    /// The permission bits `perm` takes when this becomes the access ACL (its other
    /// bits, setuid, setgid and sticky, stay), and whether the ACL says more than
    /// those bits can (then it is kept; else it is dropped).
    pub fn mode_bits(&self, perm: u16) -> (u16, bool) {
        let mut bits = perm & !PERM_BITS;
        let mut extended = false;
        let group_class = self.group_class_tag();
        for e in &self.entries {
            match e.tag {
                USER_OBJ => bits |= e.perm << 6,
                OTHER => bits |= e.perm,
                t if t == group_class => bits |= e.perm << 3,
                _ => {}
            }
            extended |= [USER, GROUP, MASK].contains(&e.tag);
        }
        (bits, extended)
    }

    /// After a chmod to `perm`: the owner, group class and other entries take its
    /// bits; named entries stay.
    pub fn chmod(&mut self, perm: u16) {
        for e in &mut self.entries {
            match e.tag {
                USER_OBJ => e.perm = (perm >> 6) & RWX,
                OTHER => e.perm = perm & RWX,
                _ => {}
            }
        }
        self.group_class().perm = (perm >> 3) & RWX;
    }

    /// Turns a directory's default ACL into the access ACL of an inode created in it
    /// with `perm` (unmasked by any umask): each class keeps what both the ACL and
    /// `perm` grant, and `perm`'s bits shrink to match. Returns the new inode's
    /// permission bits and whether the ACL says more than they do (else the inode
    /// needs no access ACL).
    pub fn inherit(&mut self, perm: u16) -> (u16, bool) {
        let mut bits = perm;
        let mut extended = false;
        for e in &mut self.entries {
            match e.tag {
                USER_OBJ => {
                    e.perm &= (bits >> 6) & RWX;
                    bits &= !(0o700 & !(e.perm << 6));
                }
                OTHER => {
                    e.perm &= bits & RWX;
                    bits &= !(RWX & !e.perm);
                }
                USER | GROUP | MASK => extended = true,
                _ => {}
            }
        }
        let group = self.group_class();
        group.perm &= (bits >> 3) & RWX;
        bits &= !(0o070 & !(group.perm << 3));
        (bits, extended)
    }
}

#[cfg(test)]
#[path = "acl_tests.rs"]
mod tests;
