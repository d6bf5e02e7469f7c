//! POSIX ACLs in the core: kept as xattrs only when the kernel enforces them, tied to
//! the mode on set and chmod, inherited from a directory's default ACL.

use super::*;
use crate::acl::{self, Acl};

/// The xattr form of an ACL of owner, group (or mask with a named user 7) and other.
fn acl_bytes(owner: u16, named: Option<(u16, u16)>, group: u16, other: u16) -> Vec<u8> {
    let mut out = 2u32.to_le_bytes().to_vec();
    let mut entry = |tag: u16, perm: u16, id: u32| {
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&perm.to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
    };
    entry(0x01, owner, u32::MAX);
    if let Some((user, mask)) = named {
        entry(0x02, user, 7);
        entry(0x04, group, u32::MAX);
        entry(0x10, mask, u32::MAX);
    } else {
        entry(0x04, group, u32::MAX);
    }
    entry(0x20, other, u32::MAX);
    out
}

fn acl_rig() -> Rig {
    let r = rig(16 << 20, 4 * BS, 1 << 20);
    r.fs.enable_posix_acl();
    r
}

fn perm(r: &Rig, ino: Ino) -> u16 {
    r.fs.getattr(ino).unwrap().perm
}

fn get(r: &Rig, ino: Ino, name: &str) -> FsResult<Vec<u8>> {
    r.fs.getxattr(ino, name.as_ref())
}

fn set(r: &Rig, ino: Ino, name: &str, value: &[u8]) -> FsResult<()> {
    r.fs.setxattr(ino, name.as_ref(), value, Default::default(), ME)
}

#[test]
fn acls_are_refused_unless_the_kernel_enforces_them() {
    let r = rig(16 << 20, 4 * BS, 1 << 20);
    let f = r.fs.create(ROOT_INO, "f".as_ref(), 0o644, ME).unwrap().ino;
    let value = acl_bytes(6, Some((4, 6)), 4, 0);
    assert_eq!(set(&r, f, acl::ACCESS, &value), Err(FsError::NotSupported));
    assert_eq!(get(&r, f, acl::ACCESS), Err(FsError::NotSupported));
}

#[test]
fn an_access_acl_sets_the_mode_and_only_an_extended_one_is_kept() {
    let r = acl_rig();
    let f = r.fs.create(ROOT_INO, "f".as_ref(), 0o2644, ME).unwrap().ino;
    let extended = acl_bytes(6, Some((4, 6)), 4, 0);
    // This test runs as root, in the file's group 0.
    let me = Caller {
        pid: std::process::id(),
        ..ME
    };
    r.fs.setxattr(f, acl::ACCESS.as_ref(), &extended, Default::default(), me)
        .unwrap();
    assert_eq!(
        perm(&r, f),
        0o2660,
        "a group member keeps setgid; group bits show the mask"
    );
    assert_eq!(get(&r, f, acl::ACCESS).unwrap(), extended);
    // An ACL a mode can say is dropped: only the mode is left.
    // Set by a caller fsd cannot see (pid 0): in no group, so setgid goes.
    set(&r, f, acl::ACCESS, &acl_bytes(7, None, 5, 4)).unwrap();
    assert_eq!(perm(&r, f), 0o754);
    assert_eq!(get(&r, f, acl::ACCESS), Err(FsError::NoAttribute));
    // Malformed: refused, nothing changes.
    let mut bad = extended.clone();
    bad.truncate(bad.len() - 8); // no "other" entry
    assert_eq!(set(&r, f, acl::ACCESS, &bad), Err(FsError::Invalid));
    assert_eq!(perm(&r, f), 0o754);
    // Removing an ACL that is not there succeeds (a default ACL of a file included).
    r.fs.removexattr(f, acl::ACCESS.as_ref()).unwrap();
    r.fs.removexattr(f, acl::DEFAULT.as_ref()).unwrap();
    // A default ACL is for directories.
    assert_eq!(
        set(&r, f, acl::DEFAULT, &extended),
        Err(FsError::AccessDenied)
    );
}

#[test]
fn chmod_rewrites_the_access_acl() {
    let r = acl_rig();
    let f = r.fs.create(ROOT_INO, "f".as_ref(), 0o600, ME).unwrap().ino;
    set(&r, f, acl::ACCESS, &acl_bytes(6, Some((7, 6)), 4, 0)).unwrap();
    let chmod = SetAttr {
        mode: Some(0o751),
        ..Default::default()
    };
    r.fs.setattr(f, &chmod).unwrap();
    assert_eq!(perm(&r, f), 0o751);
    let after = Acl::decode(&get(&r, f, acl::ACCESS).unwrap()).unwrap();
    let want = Acl::decode(&acl_bytes(7, Some((7, 5)), 4, 1)).unwrap();
    assert_eq!(
        after, want,
        "owner rwx, mask r-x, other --x; named user and group stay"
    );
}

#[test]
fn new_inodes_take_the_default_acl_instead_of_the_umask() {
    let r = acl_rig();
    let umask_022 = Caller { umask: 0o022, ..ME };
    let plain =
        r.fs.mkdir(ROOT_INO, "plain".as_ref(), 0o777, umask_022)
            .unwrap();
    assert_eq!(plain.perm, 0o755, "no default ACL: the umask applies");

    let d = r.fs.mkdir(ROOT_INO, "d".as_ref(), 0o777, ME).unwrap().ino;
    let default = acl_bytes(7, Some((7, 7)), 5, 0);
    set(&r, d, acl::DEFAULT, &default).unwrap();
    let f = r.fs.create(d, "f".as_ref(), 0o666, umask_022).unwrap();
    assert_eq!(f.perm, 0o660, "masked by the ACL, not by the umask");
    let inherited = Acl::decode(&get(&r, f.ino, acl::ACCESS).unwrap()).unwrap();
    assert_eq!(
        inherited,
        Acl::decode(&acl_bytes(6, Some((7, 6)), 5, 0)).unwrap()
    );
    assert_eq!(get(&r, f.ino, acl::DEFAULT), Err(FsError::NoAttribute));

    let sub = r.fs.mkdir(d, "sub".as_ref(), 0o777, umask_022).unwrap();
    assert_eq!(sub.perm, 0o770);
    assert_eq!(
        get(&r, sub.ino, acl::DEFAULT).unwrap(),
        default,
        "a directory passes it on"
    );
    let deeper =
        r.fs.create(sub.ino, "g".as_ref(), 0o640, umask_022)
            .unwrap();
    assert_eq!(deeper.perm, 0o640);

    let link =
        r.fs.symlink(d, "l".as_ref(), "f".as_ref(), umask_022)
            .unwrap();
    assert_eq!(link.perm, 0o777, "symlinks take no ACL");
    assert_eq!(get(&r, link.ino, acl::ACCESS), Err(FsError::NoAttribute));
}
