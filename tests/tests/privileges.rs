//! setuid and setgid through a real mount, cleared as tmpfs clears them on this
//! kernel: by a write, truncate, fallocate (every mode) or copy_file_range from a
//! user without `CAP_FSETID` (setuid always, setgid with group-execute or when the
//! user is not in the file's group), and by any chown (setuid always, setgid with
//! group-execute); never on directories. Each change is compared with tmpfs.
//! File capabilities (`security.capability`) go with any write.
//! fsd does the clearing itself (`FUSE_HANDLE_KILLPRIV_V2`), which lets the kernel
//! stop asking for `security.capability` before every write: the last test counts
//! those requests.
//!
//! Runs as root (scripts/test does): the unprivileged side is a child process that
//! drops to nobody (65534).

use rmemfs_tests::config::NOBODY;
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

/// The permission bits `stat -c %a` prints for `path` (octal).
fn mode_as_stat_shows(path: &Path) -> String {
    let out = Command::new("stat")
        .args(["-c", "%a"])
        .arg(path)
        .output()
        .expect("run stat");
    assert!(out.status.success(), "stat {} failed", path.display());
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A file at `path` with `perm` set by chmod (creation would apply the umask).
fn file_with_mode(path: &Path, perm: u32) {
    write_small(path, b"privileged");
    fs::set_permissions(path, Permissions::from_mode(perm)).expect("chmod");
    assert_eq!(mode(path), perm, "mode after chmod {perm:o}");
}

/// Runs `sh -c script` in `dir`, as nobody (in no other group) when `unprivileged`,
/// else as root; whether it succeeded.
fn try_sh(dir: &Path, unprivileged: bool, script: &str) -> bool {
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(script).current_dir(dir);
    if unprivileged {
        // (std drops root's supplementary groups when it sets the uid.)
        cmd.uid(NOBODY).gid(NOBODY);
    }
    cmd.output().expect("run sh").status.success()
}

/// As [`try_sh`], failing the test if the script fails.
fn sh(dir: &Path, unprivileged: bool, script: &str) {
    assert!(
        try_sh(dir, unprivileged, script),
        "`{script}` (as {}) failed",
        if unprivileged { "nobody" } else { "root" },
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

/// Every way of changing a file's data or size, as shell commands on `f` (with a
/// readable `src` beside it for copy_file_range).
const CHANGES: &[(&str, &str)] = &[
    ("write", "printf x >> f"),
    ("truncate", "truncate -s 1 f"),
    ("fallocate", "fallocate -l 64K f"),
    ("fallocate KEEP_SIZE", "fallocate -n -l 128K f"),
    ("fallocate PUNCH_HOLE", "fallocate -p -o 0 -l 4096 f"),
    ("fallocate ZERO_RANGE", "fallocate -z -o 0 -l 4096 f"),
    (
        "fallocate ZERO_RANGE|KEEP_SIZE",
        "fallocate -z -n -o 0 -l 4096 f",
    ),
    (
        "copy_file_range",
        "python3 -c \"import os; os.copy_file_range(os.open('src', os.O_RDONLY), \
         os.open('f', os.O_WRONLY), 5)\"",
    ),
];

/// Modes a user other than the owner can write to, with setuid and setgid in their
/// combinations (setgid with and without group-execute).
const MODES: &[u32] = &[0o6777, 0o6767, 0o2666, 0o2676, 0o4666, 0o0777];

/// The mode each change leaves on a file of each mode, done by nobody (not in the
/// file's group) or by root, in `dir`; `None` where the change itself fails there.
fn modes_after(dir: &Path, unprivileged: bool) -> Vec<(&'static str, u32, Option<u32>)> {
    write_small(&dir.join("src"), b"12345");
    let mut out = Vec::new();
    for &(what, script) in CHANGES {
        for &m in MODES {
            let f = dir.join("f");
            file_with_mode(&f, m);
            let done = try_sh(dir, unprivileged, script);
            out.push((what, m, done.then(|| mode(&f))));
            fs::remove_file(&f).expect("unlink");
        }
    }
    out
}

fn unprivileged_changes_clear_setuid_and_setgid(fsd_args: &[&str]) {
    let tmpfs = rmemfs_tests::TmpfsMount::start("16M");
    let (fsd, _memnode) = mount(fsd_args);
    let dir = fsd.path();
    for unprivileged in [true, false] {
        let who = if unprivileged { "nobody" } else { "root" };
        let expected = modes_after(tmpfs.path(), unprivileged);
        let found = modes_after(dir, unprivileged);
        for ((what, m, want), (_, _, got)) in expected.iter().zip(&found) {
            let got = got.unwrap_or_else(|| panic!("{what} by {who} failed on rmemfs"));
            match want {
                Some(want) => assert_eq!(
                    format!("{got:o}"),
                    format!("{want:o}"),
                    "mode {m:o} after a {what} by {who}: rmemfs against tmpfs"
                ),
                // tmpfs has no ZERO_RANGE: rmemfs must do what a hole punch does.
                None => {
                    let punch = expected
                        .iter()
                        .find(|(w, pm, _)| *w == "fallocate PUNCH_HOLE" && pm == m)
                        .and_then(|e| e.2)
                        .expect("tmpfs punches holes");
                    assert_eq!(
                        format!("{got:o}"),
                        format!("{punch:o}"),
                        "mode {m:o} after a {what} by {who}, as after a hole punch on tmpfs"
                    );
                }
            }
        }
    }
    // The rules, spelled out once: nobody is not in the files' group (root's).
    let by_nobody = modes_after(dir, true);
    let after = |what: &str, m: u32| {
        by_nobody
            .iter()
            .find(|(w, pm, _)| *w == what && *pm == m)
            .and_then(|e| e.2)
    };
    assert_eq!(after("write", 0o6777), Some(0o0777));
    assert_eq!(after("fallocate", 0o2666), Some(0o0666));
    assert_eq!(after("copy_file_range", 0o6767), Some(0o0767));
    let f = dir.join("f");
    file_with_mode(&f, 0o6777);
    sh(dir, true, "printf abc >> f");
    // stat(1) asks statx for the mode alone, which the kernel answers from the
    // attributes it holds unless fsd told it they changed (a write's reply carries
    // none); exec decides on those too.
    assert_eq!(
        mode_as_stat_shows(&f),
        "777",
        "the mode right after the write, as stat -c %a shows it"
    );
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
