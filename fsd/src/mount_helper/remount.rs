//! `mount -o remount,ro DIR` (and `rw`, `noexec`, `noatime`, ...) on a live rmemfs
//! mount: mount(8) hands a remount to the helper too, and the helper changes the
//! existing mount with mount(2) `MS_REMOUNT` rather than starting a second fsd.
//!
//! `MS_REMOUNT` sets every per-mount flag from the call (all but the atime ones,
//! which the kernel keeps when none is named), so the flags start from the mount's
//! current options in `/proc/self/mountinfo` and the asked-for options are applied
//! over them: `remount,ro` keeps `nosuid,nodev,noexec` as they were.
//!
//! Going read-only fails with EBUSY while the kernel holds a file open for writing,
//! or an inode whose last name is gone. On FUSE the latter includes a file closed
//! and deleted a moment ago whose RELEASE fsd has not answered yet (the kernel sends
//! RELEASE asynchronously and keeps the inode until the answer), so a busy remount
//! is tried again for up to [`BUSY_RETRY`], as an administrator would; a file
//! really open for writing keeps it busy and it fails.

use super::{HelperError, FSTYPE, HELPER_NAME};
use crate::mount::MountOptions;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a busy remount is tried again.
pub const BUSY_RETRY: Duration = Duration::from_secs(2);

/// The parts of a mountinfo line a remount needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountLine {
    /// Per-mount options (`rw,nosuid,nodev,relatime`).
    pub options: String,
    pub fstype: String,
    pub source: String,
}

/// The mount on top at `dir` in a mountinfo text (the last line for it).
pub fn find_mount(mountinfo: &str, dir: &Path) -> Option<MountLine> {
    let want = dir.to_str()?;
    mountinfo.lines().rev().find_map(|line| {
        // id parent major:minor root MOUNTPOINT OPTIONS [optional...] - TYPE SOURCE SUPER
        let mut fields = line.split(' ');
        let point = crate::atime::unescape(fields.nth(4)?);
        let options = fields.next()?.to_string();
        let mut rest = fields.skip_while(|f| *f != "-").skip(1);
        let fstype = rest.next()?.to_string();
        let source = crate::atime::unescape(rest.next()?);
        (point == want).then_some(MountLine {
            options,
            fstype,
            source,
        })
    })
}

/// Remounts the rmemfs mount at `dir` with the generic `options` applied, in order,
/// over its current ones.
pub fn remount(dir: &Path, options: &[String], verbose: bool) -> Result<(), HelperError> {
    let dir = std::fs::canonicalize(dir)
        .map_err(|e| HelperError::Usage(format!("mount point {}: {e}", dir.display())))?;
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| HelperError::Failed(format!("reading /proc/self/mountinfo: {e}")))?;
    let Some(line) = find_mount(&info, &dir) else {
        return Err(HelperError::Usage(format!(
            "nothing is mounted on {}: a remount changes a live mount",
            dir.display()
        )));
    };
    if line.fstype != FSTYPE {
        return Err(HelperError::Usage(format!(
            "{} is a {} mount, not {FSTYPE}",
            dir.display(),
            line.fstype
        )));
    }
    let mut wanted = MountOptions::from_mountinfo(&line.options);
    wanted
        .apply_list(&options.join(","))
        .map_err(|e| HelperError::Usage(e.to_string()))?;
    if verbose {
        eprintln!(
            "{HELPER_NAME}: remounting {} ({}) as {}",
            dir.display(),
            line.options,
            wanted.to_list()
        );
    }
    let target = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| HelperError::Usage("the mount point contains a NUL byte".into()))?;
    let flags = libc::MS_REMOUNT | wanted.flags();
    let deadline = Instant::now() + BUSY_RETRY;
    loop {
        // SAFETY: a NUL-terminated path that outlives the call; a remount needs no
        // source, type or data (FUSE takes no option changes through them).
        let rc = unsafe {
            libc::mount(
                std::ptr::null(),
                target.as_ptr(),
                std::ptr::null(),
                flags,
                std::ptr::null(),
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        let hint = if err.raw_os_error() == Some(libc::EBUSY) {
            " (a file is open for writing, or was deleted while open)"
        } else {
            ""
        };
        return Err(HelperError::Failed(format!(
            "remounting {} {}: {err}{hint}",
            dir.display(),
            wanted.to_list()
        )));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
98 22 0:55 / /mnt/a\\040b rw,nosuid,nodev,relatime shared:50 - fuse.rmemfs a:1,b:2/v rw,user_id=0
99 22 0:56 / /mnt/t rw,relatime - tmpfs tmpfs rw
100 99 0:57 / /mnt/t ro,nosuid,nodev,noexec - fuse.rmemfs embedded rw,user_id=0
";

    #[test]
    fn the_mount_on_top_is_found_with_its_options() {
        assert_eq!(
            find_mount(INFO, Path::new("/mnt/a b")),
            Some(MountLine {
                options: "rw,nosuid,nodev,relatime".into(),
                fstype: "fuse.rmemfs".into(),
                source: "a:1,b:2/v".into(),
            })
        );
        let top = find_mount(INFO, Path::new("/mnt/t")).unwrap();
        assert_eq!(
            (top.fstype.as_str(), top.source.as_str()),
            ("fuse.rmemfs", "embedded")
        );
        assert_eq!(find_mount(INFO, Path::new("/mnt/none")), None);
    }

    #[test]
    fn a_remount_keeps_the_flags_it_does_not_name() {
        let mut o = MountOptions::from_mountinfo("rw,nosuid,nodev,noexec,noatime");
        o.apply_list("ro").unwrap();
        assert_eq!(o.to_list(), "ro,nosuid,nodev,noexec,noatime");
        let flags = o.flags();
        for f in [
            libc::MS_RDONLY,
            libc::MS_NOSUID,
            libc::MS_NODEV,
            libc::MS_NOEXEC,
            libc::MS_NOATIME,
        ] {
            assert_eq!(flags & f, f, "{f:#x} kept");
        }
    }
}
