//! setuid and setgid through a real mount, cleared as a local Linux filesystem clears
//! them: by a write, truncate or fallocate from a user without `CAP_FSETID`, and by
//! any chown; setuid always, setgid only with group-execute; never on directories.
//! File capabilities (`security.capability`) go with any write.
//! fsd does the clearing itself (`FUSE_HANDLE_KILLPRIV_V2`), which lets the kernel
//! stop asking for `security.capability` before every write: the last test counts
//! those requests.
//!
//! Runs as root (scripts/test does): the unprivileged side is a child process that
//! drops to nobody (65534).

use rmemfs_tests::data::write_small;
use rmemfs_tests::{FsdMount, MemnodeProc, StatsFile};
use std::ffi::CString;
use std::fs::{self, OpenOptions, Permissions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const NOBODY: u32 = 65534;

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    assert!(
        root,
        "this test changes file owners and runs programs as another user: it must run as \
         root (scripts/test does)"
    );
}

fn mount(args: &[&str]) -> (FsdMount, MemnodeProc) {
    require_root();
    let memnode = MemnodeProc::start("64M");
    let mut all = vec!["--cache", "2M"];
    all.extend_from_slice(args);
    let fsd = FsdMount::with_memnode(&memnode, &all);
    (fsd, memnode)
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path)
        .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
        .mode()
        & 0o7777
}

/// A file at `path` with `perm` set by chmod (creation would apply the umask).
fn file_with_mode(path: &Path, perm: u32) {
    write_small(path, b"privileged");
    fs::set_permissions(path, Permissions::from_mode(perm)).expect("chmod");
    assert_eq!(mode(path), perm, "mode after chmod {perm:o}");
}

/// Runs `sh -c script` in `dir`, as nobody when `unprivileged`, else as root.
fn sh(dir: &Path, unprivileged: bool, script: &str) {
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(script).current_dir(dir);
    if unprivileged {
        cmd.uid(NOBODY).gid(NOBODY);
    }
    let out = cmd.output().expect("run sh");
    assert!(
        out.status.success(),
        "`{script}` (as {}) failed: {}",
        if unprivileged { "nobody" } else { "root" },
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn writes_truncates_and_fallocates_by_unprivileged_users_clear_setuid_and_setgid() {
    unprivileged_changes_clear_setuid_and_setgid(&["--page-cache"]);
}

#[test]
fn on_a_direct_io_mount_too() {
    unprivileged_changes_clear_setuid_and_setgid(&["--direct-io"]);
}

fn unprivileged_changes_clear_setuid_and_setgid(fsd_args: &[&str]) {
    let (fsd, _memnode) = mount(fsd_args);
    let dir = fsd.path();
    for (what, script) in [
        ("write", "printf x >> f"),
        ("truncate", "truncate -s 1 f"),
        ("fallocate", "fallocate -l 64K f"),
    ] {
        let f = dir.join("f");
        file_with_mode(&f, 0o6777);
        sh(dir, true, script);
        assert_eq!(mode(&f), 0o0777, "after an unprivileged {what}");

        // setgid without group-execute marks mandatory locking, not a privilege.
        file_with_mode(&f, 0o6767);
        sh(dir, true, script);
        assert_eq!(mode(&f), 0o2767, "after an unprivileged {what}");

        // Root has CAP_FSETID: its changes keep both.
        file_with_mode(&f, 0o6777);
        sh(dir, false, script);
        assert_eq!(mode(&f), 0o6777, "after a {what} by root");
        fs::remove_file(&f).expect("unlink");
    }
    let f = dir.join("f");
    file_with_mode(&f, 0o6777);
    sh(dir, true, "printf abc >> f");
    assert_eq!(
        fs::read(&f).expect("read"),
        b"privilegedabc",
        "the write itself landed"
    );

    // File capabilities go with any write, root's too.
    for writer_is_nobody in [true, false] {
        set_file_capabilities(&f);
        sh(dir, writer_is_nobody, "printf d >> f");
        assert_eq!(
            xattr_names(&f),
            Vec::<String>::new(),
            "security.capability after a write (by nobody: {writer_is_nobody})"
        );
    }
    fsd.unmount();
}

/// Gives `path` file capabilities: a `security.capability` xattr holding a revision 2
/// `vfs_cap_data` that permits CAP_NET_BIND_SERVICE.
fn set_file_capabilities(path: &Path) {
    const VFS_CAP_REVISION_2: u32 = 0x0200_0000;
    let value: Vec<u8> = [VFS_CAP_REVISION_2, 1 << 10, 0, 0, 0]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    let p = CString::new(path.as_os_str().as_bytes()).expect("no NUL in the path");
    // SAFETY: NUL-terminated strings and a slice that outlive the call.
    let r = unsafe {
        libc::setxattr(
            p.as_ptr(),
            c"security.capability".as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(
        r,
        0,
        "setxattr security.capability: {}",
        io::Error::last_os_error()
    );
    assert_eq!(xattr_names(path), ["security.capability"]);
}

fn xattr_names(path: &Path) -> Vec<String> {
    let p = CString::new(path.as_os_str().as_bytes()).expect("no NUL in the path");
    let mut buf = vec![0u8; 4096];
    // SAFETY: a NUL-terminated path; `buf` has its length writable.
    let n = unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n >= 0, "listxattr: {}", io::Error::last_os_error());
    buf[..n as usize]
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

#[test]
fn chown_clears_setuid_and_setgid_on_files_but_not_directories() {
    let (fsd, _memnode) = mount(&[]);
    let f = fsd.join("f");
    file_with_mode(&f, 0o6777);
    std::os::unix::fs::chown(&f, Some(1234), Some(5678)).expect("chown");
    assert_eq!(mode(&f), 0o0777, "after chown to another owner");

    // chown(f, -1, -1) changes nothing but still clears them on Linux.
    file_with_mode(&f, 0o6555);
    std::os::unix::fs::chown(&f, None, None).expect("chown -1 -1");
    assert_eq!(mode(&f), 0o0555, "after chown(f, -1, -1)");

    let d = fsd.join("d");
    fs::create_dir(&d).expect("mkdir");
    fs::set_permissions(&d, Permissions::from_mode(0o6777)).expect("chmod dir");
    std::os::unix::fs::chown(&d, Some(1234), Some(5678)).expect("chown dir");
    assert_eq!(mode(&d), 0o6777, "a directory keeps them");
    fsd.unmount();
}

#[test]
fn repeated_writes_do_not_ask_fsd_for_security_capability_each_time() {
    const WRITES: u64 = 200;
    let stats = StatsFile::new();
    let (fsd, _memnode) = mount(&["--stats-file", stats.arg()]);
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(fsd.join("f"))
        .expect("create");
    let before = stats.current().value("xattr_reads");
    for i in 0..WRITES {
        f.write_all_at(&[i as u8; 4096], i * 4096).expect("write");
    }
    drop(f);
    let after = stats.wait_for(Duration::from_secs(10), "the writes", |s| {
        s.value("file_writes") >= WRITES
    });
    let asked = after.value("xattr_reads") - before;
    assert!(
        asked <= 2,
        "{WRITES} writes to a file without setuid, setgid or security xattrs made the \
         kernel ask fsd for an xattr {asked} times: it should mark the inode S_NOSEC \
         after the first (FUSE_HANDLE_KILLPRIV_V2 not negotiated?)"
    );
    fsd.unmount();
}
