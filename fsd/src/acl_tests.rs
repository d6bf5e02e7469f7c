use super::*;

/// An ACL from getfacl's short text form, e.g. "u::rw-,u:7:r--,g::r--,m::rw-,o::---".
fn acl(text: &str) -> Acl {
    Acl::decode(&bytes(text)).unwrap_or_else(|e| panic!("{text}: {e}"))
}

/// The xattr form of `text`, checked or not.
fn bytes(text: &str) -> Vec<u8> {
    let mut out = VERSION.to_le_bytes().to_vec();
    for e in text.split(',') {
        let parts: Vec<&str> = e.split(':').collect();
        let tag = match (parts[0], parts[1].is_empty()) {
            ("u", true) => USER_OBJ,
            ("u", false) => USER,
            ("g", true) => GROUP_OBJ,
            ("g", false) => GROUP,
            ("m", _) => MASK,
            ("o", _) => OTHER,
            _ => panic!("bad tag in {e}"),
        };
        let id = parts[1].parse::<u32>().unwrap_or(UNDEFINED_ID);
        let perm = parts[2]
            .chars()
            .zip([4, 2, 1])
            .filter(|(c, _)| *c != '-')
            .map(|(_, b)| b)
            .sum::<u16>();
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&perm.to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
    }
    out
}

#[test]
fn valid_acls_round_trip() {
    for text in [
        "u::rw-,g::r--,o::r--",
        "u::rwx,u:7:r--,u:1000:rwx,g::r-x,g:5:-w-,m::rwx,o::---",
        "u::---,g::---,m::---,o::---",
    ] {
        assert_eq!(acl(text).encode(), bytes(text), "{text}");
    }
}

#[test]
fn invalid_acls_are_refused() {
    for (text, why) in [
        ("u::rw-,g::r--", "no other entry"),
        ("u::rw-,u::r--,g::r--,o::---", "two owners"),
        ("g::r--,u::rw-,o::---", "out of order"),
        ("u::rw-,u:7:r--,g::r--,o::---", "named user without mask"),
        ("u::rw-,u:7:r--,u:7:r--,g::r--,m::r--,o::---", "repeated id"),
        (
            "u::rw-,u:9:r--,u:7:r--,g::r--,m::r--,o::---",
            "ids out of order",
        ),
        ("u::rw-,g::r--,m::r--,m::r--,o::---", "two masks"),
    ] {
        assert!(Acl::decode(&bytes(text)).is_err(), "{why}: {text}");
    }
    let mut wide = bytes("u::rw-,g::r--,o::r--");
    wide[6] = 8; // the owner's permission: a bit beyond rwx
    assert!(Acl::decode(&wide).is_err(), "permission bit 8");
    let mut version = bytes("u::rw-,g::r--,o::r--");
    version[0] = 1;
    assert!(Acl::decode(&version).is_err(), "version 1");
    let whole = bytes("u::rw-,g::r--,o::r--");
    assert!(Acl::decode(&whole[..whole.len() - 1]).is_err(), "cut short");
    assert!(Acl::decode(&whole[..4]).is_err(), "no entries");
    assert!(Acl::decode(&[]).is_err(), "empty");
}

#[test]
fn an_access_acl_sets_the_mode_and_is_kept_only_when_it_says_more() {
    let minimal = acl("u::rwx,g::r--,o::---");
    assert_eq!(minimal.mode_bits(0o4777), (0o4740, false), "setuid stays");
    // With a mask, the group bits show the mask, not the owning group's entry.
    let named = acl("u::rw-,u:7:rwx,g::r--,m::rw-,o::---");
    assert_eq!(named.mode_bits(0o2000), (0o2660, true));
    assert_eq!(
        acl("u::rw-,g::r--,m::r--,o::---").mode_bits(0),
        (0o640, true)
    );
}

#[test]
fn chmod_rewrites_owner_group_class_and_other() {
    let mut a = acl("u::rw-,u:7:rwx,g::r--,m::rw-,o::---");
    a.chmod(0o2751);
    assert_eq!(a, acl("u::rwx,u:7:rwx,g::r--,m::r-x,o::--x"));
    let mut b = acl("u::rw-,g::r--,o::---");
    b.chmod(0o604);
    assert_eq!(b, acl("u::rw-,g::---,o::r--"));
}

#[test]
fn a_default_acl_masks_the_new_inode_mode_instead_of_the_umask() {
    // Equivalent to a mode: the new inode needs no ACL, just the narrower bits.
    let mut plain = acl("u::rwx,g::r-x,o::r-x");
    assert_eq!(plain.inherit(0o666), (0o644, false));
    assert_eq!(plain, acl("u::rw-,g::r--,o::r--"));
    // Named entries: kept, the mask narrowed by the creation mode.
    let mut named = acl("u::rwx,u:7:rwx,g::r-x,m::rwx,o::---");
    assert_eq!(named.inherit(0o666), (0o660, true));
    assert_eq!(named, acl("u::rw-,u:7:rwx,g::r-x,m::rw-,o::---"));
    let mut dir = acl("u::rwx,u:7:rwx,g::r-x,m::rwx,o::---");
    assert_eq!(dir.inherit(0o2777), (0o2770, true), "setgid stays");
    // A creation mode narrower than the ACL wins.
    let mut narrow = acl("u::rwx,g::rwx,o::rwx");
    assert_eq!(narrow.inherit(0o600), (0o600, false));
    assert_eq!(narrow, acl("u::rw-,g::---,o::---"));
}
