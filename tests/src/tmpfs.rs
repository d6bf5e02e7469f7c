//! A tmpfs mounted for one test: the local filesystem the mount tests compare rmemfs
//! with, where a behaviour could differ. Unmounted (lazily if busy) on drop.

use crate::config::SMALL_CACHE;
use crate::{FsdMount, MemnodeProc};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Runs `scenario` on a fresh tmpfs of `tmpfs_size`, then on rmemfs (a memnode of
/// `memnode_size`, fsd started with `fsd_args`), passing each mount's path and name
/// (`tmpfs`, `rmemfs`), so a test asserts the same behaviour on both.
pub fn on_tmpfs_and_rmemfs(
    tmpfs_size: &str,
    memnode_size: &str,
    fsd_args: &[&str],
    scenario: impl Fn(&Path, &str),
) {
    let tmpfs = TmpfsMount::start(tmpfs_size);
    scenario(tmpfs.path(), "tmpfs");
    drop(tmpfs);
    let memnode = MemnodeProc::start(memnode_size);
    let fsd = FsdMount::with_memnode(&memnode, fsd_args);
    scenario(fsd.path(), "rmemfs");
    fsd.unmount();
}

/// [`on_tmpfs_and_rmemfs`] for files of a few MiB: a 64 MiB tmpfs, then a 256 MiB
/// memnode under fsd with a [`SMALL_CACHE`], so rmemfs's data goes through the memnode.
pub fn on_tmpfs_and_small_cache_rmemfs(scenario: impl Fn(&Path, &str)) {
    on_tmpfs_and_rmemfs("64M", "256M", &SMALL_CACHE, scenario);
}

pub struct TmpfsMount {
    path: PathBuf,
}

impl TmpfsMount {
    /// A tmpfs of `size` (`64M`) on a fresh temporary directory; panics if it cannot
    /// be mounted (the tests run as root).
    pub fn start(size: &str) -> TmpfsMount {
        let path = crate::fresh_dir("rmemfs-tmpfs");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "rmemfs-test"])
            .arg(&path)
            .stdin(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("running mount for a tmpfs: {e}"));
        assert!(
            status.success(),
            "mount -t tmpfs on {} failed ({status}): the tests run as root",
            path.display()
        );
        TmpfsMount { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn join(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.path.join(rel)
    }
}

impl Drop for TmpfsMount {
    fn drop(&mut self) {
        let quiet = |args: &[&str]| {
            Command::new("umount")
                .args(args)
                .arg(&self.path)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if !quiet(&[]) {
            quiet(&["-l"]);
        }
        let _ = std::fs::remove_dir(&self.path);
    }
}
