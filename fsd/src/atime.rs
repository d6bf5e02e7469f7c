//! Access times, as the mount's options ask for them.
//!
//! The kernel leaves a FUSE file's atime to the filesystem (its inodes are
//! `S_NOATIME`) and drops its cached atime after each read, so fsd updates atime on
//! reads of files and listings of directories itself, by the rules of the VFS
//! (`atime_needs_update`, `relatime_need_update`) for the options the mount has now:
//! - `relatime` (the default): when atime is not after mtime or ctime (the first
//!   read after a change), or is a day old;
//! - `strictatime`: on every access; `noatime`: never;
//! - `nodiratime`: never for directories (`noatime` implies it).
//!
//! The options are per mount and change with `mount -o remount,...`, which fsd is
//! not told of: [`AtimePolicy::refresh`] reads them from `/proc/self/mountinfo`
//! (fsd calls it once a second).

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, SystemTime};

/// How often atime is updated on a mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtimeMode {
    Relatime = 0,
    Strict = 1,
    Never = 2,
}

/// relatime updates an atime at least this old, whatever mtime and ctime say.
const RELATIME_AGE: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug)]
pub struct AtimePolicy {
    mode: AtomicU8,
    nodiratime: AtomicBool,
}

impl Default for AtimePolicy {
    /// What a mount gets without atime options: relatime.
    fn default() -> Self {
        AtimePolicy {
            mode: AtomicU8::new(AtimeMode::Relatime as u8),
            nodiratime: AtomicBool::new(false),
        }
    }
}

impl AtimePolicy {
    pub fn mode(&self) -> AtimeMode {
        match self.mode.load(Ordering::Relaxed) {
            1 => AtimeMode::Strict,
            2 => AtimeMode::Never,
            _ => AtimeMode::Relatime,
        }
    }

    pub fn set(&self, mode: AtimeMode, nodiratime: bool) {
        self.mode.store(mode as u8, Ordering::Relaxed);
        self.nodiratime.store(nodiratime, Ordering::Relaxed);
    }

    /// Whether an access at `now` to an inode with these times updates its atime.
    pub fn needs_update(
        &self,
        is_dir: bool,
        atime: SystemTime,
        mtime: SystemTime,
        ctime: SystemTime,
        now: SystemTime,
    ) -> bool {
        if is_dir && self.nodiratime.load(Ordering::Relaxed) {
            return false;
        }
        match self.mode() {
            AtimeMode::Never => false,
            AtimeMode::Strict => true,
            AtimeMode::Relatime => {
                atime <= mtime
                    || atime <= ctime
                    || now.duration_since(atime).is_ok_and(|d| d >= RELATIME_AGE)
            }
        }
    }

    /// Takes the options of the mount at `mountpoint` from `/proc/self/mountinfo`;
    /// keeps the current ones if it is not found there (being unmounted).
    pub fn refresh(&self, mountpoint: &Path) {
        let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
            return;
        };
        if let Some((mode, nodiratime)) = options_of(&info, mountpoint) {
            self.set(mode, nodiratime);
        }
    }
}

/// The atime options of the last mount at `mountpoint` in a mountinfo text (the
/// last one is on top).
fn options_of(mountinfo: &str, mountpoint: &Path) -> Option<(AtimeMode, bool)> {
    let want = mountpoint.to_str()?;
    let mut found = None;
    for line in mountinfo.lines() {
        let mut fields = line.split(' ');
        let (Some(point), Some(options)) = (fields.nth(4), fields.next()) else {
            continue;
        };
        if unescape(point) != want {
            continue;
        }
        let opts: Vec<&str> = options.split(',').collect();
        let mode = if opts.contains(&"noatime") {
            AtimeMode::Never
        } else if opts.contains(&"relatime") {
            AtimeMode::Relatime
        } else {
            AtimeMode::Strict
        };
        found = Some((mode, opts.contains(&"nodiratime")));
    }
    found
}

/// mountinfo writes space, tab, newline and backslash as `\` and three octal digits.
pub(crate) fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
98 22 0:55 / /mnt/a\\040b rw,nosuid,nodev,relatime shared:50 - fuse.rmemfs rmemfs rw
99 22 0:56 / /mnt/s rw,nosuid,nodev shared:51 - fuse.rmemfs rmemfs rw
100 22 0:57 / /mnt/n rw,noatime shared:52 - fuse.rmemfs rmemfs rw
101 22 0:58 / /mnt/d rw,nodiratime,relatime shared:53 - fuse.rmemfs rmemfs rw
102 22 0:58 / /mnt/d rw,nosuid,noatime shared:53 - fuse.rmemfs rmemfs rw
";

    #[test]
    fn mount_options_name_the_atime_mode() {
        let of = |p: &str| options_of(INFO, Path::new(p));
        assert_eq!(of("/mnt/a b"), Some((AtimeMode::Relatime, false)));
        assert_eq!(of("/mnt/s"), Some((AtimeMode::Strict, false)));
        assert_eq!(of("/mnt/n"), Some((AtimeMode::Never, false)));
        assert_eq!(
            of("/mnt/d"),
            Some((AtimeMode::Never, false)),
            "the mount on top"
        );
        assert_eq!(of("/mnt/x"), None);
    }

    #[test]
    fn relatime_updates_the_first_access_after_a_change_or_a_day() {
        let p = AtimePolicy::default();
        let t = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        let now = t(1_000_000);
        // atime before mtime, or equal to ctime: updated.
        assert!(p.needs_update(false, t(10), t(20), t(5), now));
        assert!(p.needs_update(false, t(30), t(20), t(30), now));
        // Newer than both, and recent: not updated; a day old: updated.
        assert!(!p.needs_update(false, now - Duration::from_secs(60), t(20), t(20), now));
        assert!(p.needs_update(false, t(100_000), t(20), t(20), now));
        p.set(AtimeMode::Strict, true);
        assert!(p.needs_update(false, now, t(20), t(20), now));
        assert!(
            !p.needs_update(true, t(10), t(20), t(20), now),
            "nodiratime"
        );
        p.set(AtimeMode::Never, false);
        assert!(!p.needs_update(false, t(10), t(20), t(20), now));
    }
}
