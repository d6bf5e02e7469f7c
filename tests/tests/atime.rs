//! Access times as on tmpfs, for each atime option of the mount: `relatime` (the
//! default: the first read after a change updates atime, later ones do not),
//! `strictatime` (every read), `noatime` (none) and `nodiratime` (listings leave a
//! directory's atime). The options change with a bind remount, as an administrator
//! changes them, and the same scenario runs on a tmpfs and on rmemfs.

use rmemfs_tests::{FsdMount, MemnodeProc, TmpfsMount};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

/// fsd reads the mount's options once a second.
const SETTLE: Duration = Duration::from_millis(1500);

fn remount(dir: &Path, flags: libc::c_ulong) {
    let target = CString::new(dir.as_os_str().as_bytes()).expect("path");
    // SAFETY: a NUL-terminated path; null source, type and data are allowed for a
    // bind remount, which changes only the mount's own flags.
    let rc = unsafe {
        libc::mount(
            std::ptr::null(),
            target.as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | libc::MS_BIND | flags,
            std::ptr::null(),
        )
    };
    assert_eq!(
        rc,
        0,
        "bind remount of {} with flags {flags:#x}: {}",
        dir.display(),
        std::io::Error::last_os_error()
    );
    std::thread::sleep(SETTLE);
}

fn atime(path: &Path) -> i64 {
    std::fs::metadata(path).expect("stat").atime()
}

/// Sets `path`'s atime `secs` seconds from its mtime, leaving mtime.
fn set_atime_from_mtime(path: &Path, secs: i64) {
    let m = std::fs::metadata(path).expect("stat");
    let times = [
        libc::timespec {
            tv_sec: m.mtime() + secs,
            tv_nsec: 0,
        },
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
    ];
    let p = CString::new(path.as_os_str().as_bytes()).expect("path");
    // SAFETY: a NUL-terminated path and two timespecs, as utimensat wants.
    let rc = unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), times.as_ptr(), 0) };
    assert_eq!(rc, 0, "utimensat: {}", std::io::Error::last_os_error());
}

fn read(path: &Path) {
    std::fs::read(path).expect("read");
}

fn list(dir: &Path) {
    std::fs::read_dir(dir).expect("opendir").for_each(drop);
}

/// The scenario; `fs` names the filesystem in messages.
fn atime_rules(mount: &Path, fs: &str) {
    let f = mount.join("f");
    std::fs::write(&f, b"data").expect("write");
    let d = mount.join("d");
    std::fs::create_dir(&d).expect("mkdir");

    // relatime: an atime before mtime is updated by a read, to now.
    set_atime_from_mtime(&f, -100);
    let old = atime(&f);
    read(&f);
    let updated = atime(&f);
    assert!(
        updated >= old + 100,
        "{fs}: relatime read after a write: {old} -> {updated}"
    );
    // ... and one after mtime and ctime, not a day old, is left alone.
    set_atime_from_mtime(&f, 1000);
    let future = atime(&f);
    read(&f);
    assert_eq!(atime(&f), future, "{fs}: relatime read of a fresh atime");

    // strictatime: every read.
    remount(mount, libc::MS_STRICTATIME);
    read(&f);
    assert!(
        atime(&f) < future,
        "{fs}: strictatime read sets atime to now"
    );

    // noatime: no read, no listing.
    remount(mount, libc::MS_NOATIME);
    set_atime_from_mtime(&f, -100);
    let old = atime(&f);
    read(&f);
    assert_eq!(atime(&f), old, "{fs}: noatime read");

    // relatime with nodiratime: files yes, directories no.
    remount(mount, libc::MS_RELATIME | libc::MS_NODIRATIME);
    set_atime_from_mtime(&d, -100);
    let old_dir = atime(&d);
    list(&d);
    assert_eq!(atime(&d), old_dir, "{fs}: nodiratime listing");
    read(&f);
    assert!(atime(&f) > old, "{fs}: relatime read with nodiratime");

    // Plain relatime again: a listing updates the directory.
    remount(mount, libc::MS_RELATIME);
    list(&d);
    assert!(atime(&d) > old_dir, "{fs}: relatime listing");
}

#[test]
fn atime_follows_the_mount_options_as_on_tmpfs() {
    let tmpfs = TmpfsMount::start("16M");
    atime_rules(tmpfs.path(), "tmpfs");
    drop(tmpfs);
    let memnode = MemnodeProc::start("64M");
    let fsd = FsdMount::with_memnode(&memnode, &[]);
    atime_rules(fsd.path(), "rmemfs");
    fsd.unmount();
}
