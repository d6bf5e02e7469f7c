//! Extended attributes through a real mount, with the errno a local Linux filesystem
//! (tmpfs, ext4) gives for each case: ENODATA for a missing attribute, ERANGE for a
//! buffer too small, EEXIST / ENODATA for XATTR_CREATE / XATTR_REPLACE, EOPNOTSUPP for
//! a namespace the filesystem does not have, and ctime updated by a change.

use rmemfs_tests::data::create;
use rmemfs_tests::{assert_errno, FsdMount, MemnodeProc};
use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

fn mount() -> (FsdMount, MemnodeProc) {
    let memnode = MemnodeProc::start("64M");
    let fsd = FsdMount::with_memnode(&memnode, &["--cache", "2M"]);
    (fsd, memnode)
}

fn c(s: &[u8]) -> CString {
    CString::new(s).expect("no NUL inside")
}

fn path_c(p: &Path) -> CString {
    c(p.as_os_str().as_bytes())
}

fn setxattr(p: &Path, name: &str, value: &[u8], flags: i32) -> io::Result<()> {
    let (p, n) = (path_c(p), c(name.as_bytes()));
    // SAFETY: NUL-terminated strings and a slice that outlive the call.
    let r = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// getxattr with a buffer of `cap` bytes (0: ask for the size). Returns the length the
/// call returned and the bytes it filled.
fn getxattr(p: &Path, name: &str, cap: usize) -> io::Result<(usize, Vec<u8>)> {
    let (p, n) = (path_c(p), c(name.as_bytes()));
    let mut buf = vec![0u8; cap];
    // SAFETY: NUL-terminated strings; `buf` has `cap` writable bytes.
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), cap) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate((r as usize).min(cap));
    Ok((r as usize, buf))
}

fn listxattr(p: &Path, cap: usize) -> io::Result<(usize, Vec<u8>)> {
    let p = path_c(p);
    let mut buf = vec![0u8; cap];
    // SAFETY: a NUL-terminated string; `buf` has `cap` writable bytes.
    let r = unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), cap) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate((r as usize).min(cap));
    Ok((r as usize, buf))
}

fn removexattr(p: &Path, name: &str) -> io::Result<()> {
    let (p, n) = (path_c(p), c(name.as_bytes()));
    // SAFETY: NUL-terminated strings that outlive the call.
    let r = unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[test]
fn xattrs_set_get_list_and_remove_with_local_errnos() {
    let (fsd, _memnode) = mount();
    let f = fsd.join("f");
    create(&f);

    assert_errno(
        getxattr(&f, "user.a", 64),
        libc::ENODATA,
        "get of a missing attribute",
    );
    assert_errno(
        removexattr(&f, "user.a"),
        libc::ENODATA,
        "remove of a missing attribute",
    );
    assert_eq!(
        listxattr(&f, 0).expect("list size").0,
        0,
        "a new file lists no attributes"
    );

    setxattr(&f, "user.a", b"alpha", 0).expect("set user.a");
    setxattr(&f, "user.empty", b"", 0).expect("set an empty value");
    assert_eq!(
        getxattr(&f, "user.a", 0).expect("size probe").0,
        5,
        "size probe"
    );
    assert_eq!(getxattr(&f, "user.a", 64).expect("get").1, b"alpha");
    assert_eq!(getxattr(&f, "user.empty", 64).expect("get empty").0, 0);
    assert_errno(
        getxattr(&f, "user.a", 4),
        libc::ERANGE,
        "get into a 4-byte buffer",
    );

    let names = b"user.a\0user.empty\0";
    let (len, _) = listxattr(&f, 0).expect("list size probe");
    assert_eq!(len, names.len(), "list size probe");
    let (_, list) = listxattr(&f, 256).expect("list");
    let mut got: Vec<&[u8]> = list.split(|&b| b == 0).filter(|s| !s.is_empty()).collect();
    got.sort();
    assert_eq!(
        got,
        vec![&b"user.a"[..], &b"user.empty"[..]],
        "listed names"
    );
    assert_errno(listxattr(&f, 3), libc::ERANGE, "list into a 3-byte buffer");

    removexattr(&f, "user.a").expect("remove user.a");
    assert_errno(
        getxattr(&f, "user.a", 64),
        libc::ENODATA,
        "get after remove",
    );
}

#[test]
fn xattr_create_and_replace_flags() {
    let (fsd, _memnode) = mount();
    let f = fsd.join("f");
    create(&f);
    assert_errno(
        setxattr(&f, "user.x", b"1", libc::XATTR_REPLACE),
        libc::ENODATA,
        "XATTR_REPLACE of a missing attribute",
    );
    setxattr(&f, "user.x", b"1", libc::XATTR_CREATE).expect("XATTR_CREATE of a new one");
    assert_errno(
        setxattr(&f, "user.x", b"2", libc::XATTR_CREATE),
        libc::EEXIST,
        "XATTR_CREATE of an existing attribute",
    );
    assert_eq!(getxattr(&f, "user.x", 8).expect("get").1, b"1", "unchanged");
    setxattr(&f, "user.x", b"22", libc::XATTR_REPLACE).expect("XATTR_REPLACE");
    assert_eq!(getxattr(&f, "user.x", 8).expect("get").1, b"22", "replaced");
}

#[test]
fn xattr_namespaces_and_limits_are_those_of_a_local_filesystem() {
    let (fsd, _memnode) = mount();
    let f = fsd.join("f");
    create(&f);
    // Root may use trusted.* and security.*.
    setxattr(&f, "trusted.t", b"1", 0).expect("set trusted.t as root");
    setxattr(&f, "security.s", b"1", 0).expect("set security.s as root");
    for name in ["bogus.x", "noprefix", "system.rmemfs"] {
        assert_errno(
            setxattr(&f, name, b"1", 0),
            libc::EOPNOTSUPP,
            &format!("set of {name:?}"),
        );
        assert_errno(
            getxattr(&f, name, 8),
            libc::EOPNOTSUPP,
            &format!("get of {name:?}"),
        );
    }
    assert_errno(
        setxattr(&f, "user.", b"1", 0),
        libc::EINVAL,
        "a bare prefix",
    );
    let long = format!("user.{}", "n".repeat(250));
    setxattr(&f, &long, b"v", 0).expect("a 255-byte name");
    assert_errno(
        setxattr(&f, &format!("{long}n"), b"v", 0),
        libc::ERANGE,
        "a 256-byte name",
    );
    setxattr(&f, "user.big", &vec![7; 65536], 0).expect("a 64 KiB value");
    assert_eq!(getxattr(&f, "user.big", 65536).expect("get").1.len(), 65536);
    assert_errno(
        setxattr(&f, "user.big", &vec![7; 65537], 0),
        libc::E2BIG,
        "a value over 64 KiB",
    );
    // user.* is for regular files and directories only.
    let fifo = fsd.join("fifo");
    let cpath = path_c(&fifo);
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(cpath.as_ptr(), 0o644) }, 0, "mkfifo");
    assert_errno(
        setxattr(&fifo, "user.x", b"1", 0),
        libc::EPERM,
        "user.* on a fifo",
    );
}

#[test]
fn xattr_changes_update_ctime_and_keep_mtime() {
    let (fsd, _memnode) = mount();
    let f = fsd.join("f");
    create(&f);
    let before = fs::metadata(&f).expect("stat");
    std::thread::sleep(Duration::from_millis(20));
    setxattr(&f, "user.t", b"1", 0).expect("set");
    let after = fs::metadata(&f).expect("stat");
    assert!(
        (after.ctime(), after.ctime_nsec()) > (before.ctime(), before.ctime_nsec()),
        "setxattr must change ctime"
    );
    assert_eq!(
        (after.mtime(), after.mtime_nsec()),
        (before.mtime(), before.mtime_nsec()),
        "setxattr must not change mtime"
    );
    std::thread::sleep(Duration::from_millis(20));
    removexattr(&f, "user.t").expect("remove");
    let removed = fs::metadata(&f).expect("stat");
    assert!(
        (removed.ctime(), removed.ctime_nsec()) > (after.ctime(), after.ctime_nsec()),
        "removexattr must change ctime"
    );
}

#[test]
fn with_no_xattrs_every_xattr_call_fails_with_eopnotsupp_and_files_still_work() {
    let memnode = MemnodeProc::start("64M");
    let fsd = FsdMount::with_memnode(&memnode, &["--cache", "2M", "--no-xattrs"]);
    let f = fsd.join("f");
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(&f, &data).expect("write");
    // Twice each: the second call is answered by the kernel, which remembers.
    for _ in 0..2 {
        assert_errno(setxattr(&f, "user.a", b"1", 0), libc::EOPNOTSUPP, "set");
        assert_errno(getxattr(&f, "user.a", 64), libc::EOPNOTSUPP, "get");
        assert_errno(listxattr(&f, 64), libc::EOPNOTSUPP, "list");
        assert_errno(removexattr(&f, "user.a"), libc::EOPNOTSUPP, "remove");
    }
    fs::write(&f, &data[..1000]).expect("rewrite");
    assert!(
        fs::read(&f).expect("read") == data[..1000],
        "the data reads back"
    );
}
