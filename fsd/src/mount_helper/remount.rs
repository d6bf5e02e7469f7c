//! `mount -o remount,ro DIR` (and `rw`, `noexec`, `noatime`, ...) on a live rmemfs
//! mount: mount(8) hands a remount to the helper too, and the helper changes the
//! existing mount with mount(2) `MS_REMOUNT` rather than starting a second fsd.
//!
//! `MS_REMOUNT` sets every per-mount flag from the call (all but the atime ones,
//! which the kernel keeps when none is named), and mount(8) documents a remount's
//! options as replacing the old ones: they describe the whole mount. What mount(8)
//! hands the helper is one of two things, and the flags start from a different base
//! for each ([`remount_flags`]):
//!
//! - for `mount -o remount,ro DIR` of a mount not in fstab, the mount's options in
//!   `/proc/self/mountinfo` merged with the new ones. mountinfo names every flag that
//!   is on (`nosuid`, `noexec`, ...) and mount(8) drops the words for flags that are
//!   off (`suid`, `dev`, `exec`, `atime`), so the base is the kernel's: no flags.
//!   Such a list carries the FUSE module's own options (`user_id=`, `group_id=`),
//!   which is how the helper tells it apart;
//! - otherwise the mount's fstab options (or, with both SOURCE and DIR given, the
//!   command line's), which describe an rmemfs mount as its first mount did: the base
//!   is rmemfs's defaults, `nosuid,nodev`, so `allow_suid` / `allow_dev` must be in
//!   them for a mount that has those.
//!
//! Going read-only fails with EBUSY while the kernel holds a file open for writing,
//! or an inode whose last name is gone. On FUSE the latter includes a file closed
//! and deleted a moment ago whose RELEASE fsd has not answered yet (the kernel sends
//! RELEASE asynchronously and keeps the inode until the answer), so a busy remount
//! is tried again for up to [`BUSY_RETRY`], as an administrator would; a file
//! really open for writing keeps it busy and it fails.

use super::{HelperError, FSTYPE, HELPER_NAME};
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

/// The atime flags: one of them at most.
const ATIME: libc::c_ulong = libc::MS_NOATIME | libc::MS_RELATIME | libc::MS_STRICTATIME;

/// The mount(2) flags (without `MS_REMOUNT`) of a remount whose generic options are
/// `words`, in order: over the kernel's base when the list was merged from
/// mountinfo, else over rmemfs's (see the module docs). No atime word leaves the
/// mount's atime as it is.
pub fn remount_flags(words: &[String], merged_from_mountinfo: bool) -> libc::c_ulong {
    let mut flags = if merged_from_mountinfo {
        0
    } else {
        libc::MS_NOSUID | libc::MS_NODEV
    };
    for word in words {
        let (set, clear) = match word.as_str() {
            "ro" => (libc::MS_RDONLY, 0),
            "rw" => (0, libc::MS_RDONLY),
            "nosuid" => (libc::MS_NOSUID, 0),
            "suid" => (0, libc::MS_NOSUID),
            "nodev" => (libc::MS_NODEV, 0),
            "dev" => (0, libc::MS_NODEV),
            "noexec" => (libc::MS_NOEXEC, 0),
            "exec" => (0, libc::MS_NOEXEC),
            "noatime" => (libc::MS_NOATIME, ATIME),
            "relatime" => (libc::MS_RELATIME, ATIME),
            "strictatime" => (libc::MS_STRICTATIME, ATIME),
            "atime" => (0, libc::MS_NOATIME),
            "nodiratime" => (libc::MS_NODIRATIME, 0),
            "diratime" => (0, libc::MS_NODIRATIME),
            // allow_other, default_permissions: the FUSE module's, fixed at mount.
            _ => (0, 0),
        };
        flags = (flags & !clear) | set;
    }
    flags
}

/// Describes remount flags for messages (`ro,nosuid,nodev,noatime`).
fn describe(flags: libc::c_ulong) -> String {
    let mut words = vec![if flags & libc::MS_RDONLY != 0 {
        "ro"
    } else {
        "rw"
    }];
    for (flag, word) in [
        (libc::MS_NOSUID, "nosuid"),
        (libc::MS_NODEV, "nodev"),
        (libc::MS_NOEXEC, "noexec"),
        (libc::MS_NOATIME, "noatime"),
        (libc::MS_RELATIME, "relatime"),
        (libc::MS_STRICTATIME, "strictatime"),
        (libc::MS_NODIRATIME, "nodiratime"),
    ] {
        if flags & flag != 0 {
            words.push(word);
        }
    }
    words.join(",")
}

/// Remounts the rmemfs mount at `dir` with the generic options `words` (see
/// [`remount_flags`]).
pub fn remount(
    dir: &Path,
    words: &[String],
    merged_from_mountinfo: bool,
    verbose: bool,
) -> Result<(), HelperError> {
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
    let flags = remount_flags(words, merged_from_mountinfo);
    if verbose {
        eprintln!(
            "{HELPER_NAME}: remounting {} ({}) as {}",
            dir.display(),
            line.options,
            describe(flags)
        );
    }
    let target = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| HelperError::Usage("the mount point contains a NUL byte".into()))?;
    let flags = libc::MS_REMOUNT | flags;
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
            describe(flags)
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

    fn flags(words: &str, merged: bool) -> String {
        let words: Vec<String> = words.split(',').map(str::to_string).collect();
        describe(remount_flags(&words, merged))
    }

    #[test]
    fn a_list_merged_from_mountinfo_names_every_flag_that_is_on() {
        let table = [
            // mount -o remount,ro of a default mount
            (
                "ro,nosuid,nodev,relatime,allow_other",
                "ro,nosuid,nodev,relatime",
            ),
            // remount,exec of a noexec mount: mount(8) dropped noexec and said no exec
            ("rw,nosuid,nodev", "rw,nosuid,nodev"),
            // a mount with suid and dev: nothing says nosuid or nodev
            (
                "ro,noexec,noatime,nodiratime",
                "ro,noexec,noatime,nodiratime",
            ),
            ("rw,noatime,relatime", "rw,relatime"),
            ("rw,nodiratime,diratime,strictatime", "rw,strictatime"),
        ];
        for (words, want) in table {
            assert_eq!(flags(words, true), want, "merged {words}");
        }
    }

    #[test]
    fn an_fstab_or_command_line_list_starts_from_rmemfs_defaults() {
        let table = [
            ("ro", "ro,nosuid,nodev"),
            ("rw,_netdev_is_filtered_before", "rw,nosuid,nodev"),
            ("ro,suid", "ro,nodev"),
            ("rw,suid,dev,noexec", "rw,noexec"),
            ("rw,noatime,atime", "rw,nosuid,nodev"),
        ];
        for (words, want) in table {
            assert_eq!(flags(words, false), want, "from fstab {words}");
        }
    }
}
