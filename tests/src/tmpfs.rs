//! A tmpfs mounted for one test: the local filesystem the mount tests compare rmemfs
//! with, where a behaviour could differ. Unmounted (lazily if busy) on drop.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

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
