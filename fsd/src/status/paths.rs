//! Where status files live, and how a mountpoint names its file.
//!
//! fsd writes to the first directory of: `$RMEMFS_RUNTIME_DIR`; `/run/rmemfs` when
//! it runs as root; `$XDG_RUNTIME_DIR/rmemfs` otherwise. `rmemfs status` looks in
//! all of them (a user may ask about root's mount), in that order.
//!
//! The file is named after the mountpoint as `systemd-escape --path` names a mount
//! unit: slashes at both ends dropped, each inner `/` written `-`, and every byte
//! other than ASCII letters, digits, `:`, `_` and `.` (and a leading `.`) written
//! `\xNN`; the root is `-`. So `/mnt/rmemfs` is `mnt-rmemfs.json`, and no two
//! mountpoints share a file.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Overrides where fsd writes status files and where `rmemfs status` looks first.
pub const RUNTIME_DIR_ENV: &str = "RMEMFS_RUNTIME_DIR";
/// Where a root fsd writes status files.
pub const SYSTEM_RUNTIME_DIR: &str = "/run/rmemfs";

fn env_dir(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The directory fsd writes its status file to; `None` when there is none (not
/// root, no `$XDG_RUNTIME_DIR`, no override).
pub fn runtime_dir(root: bool) -> Option<PathBuf> {
    env_dir(RUNTIME_DIR_ENV).or_else(|| {
        if root {
            Some(PathBuf::from(SYSTEM_RUNTIME_DIR))
        } else {
            env_dir("XDG_RUNTIME_DIR").map(|d| d.join("rmemfs"))
        }
    })
}

/// Every directory `rmemfs status` looks in, in order, without repeats.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for d in [
        env_dir(RUNTIME_DIR_ENV),
        Some(PathBuf::from(SYSTEM_RUNTIME_DIR)),
        env_dir("XDG_RUNTIME_DIR").map(|d| d.join("rmemfs")),
    ]
    .into_iter()
    .flatten()
    {
        if !dirs.contains(&d) {
            dirs.push(d);
        }
    }
    dirs
}

/// The mountpoint escaped as `systemd-escape --path` does (see the module's doc).
pub fn escape_path(path: &Path) -> String {
    let parts: Vec<&OsStr> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(p) => Some(p),
            _ => None,
        })
        .collect();
    if parts.is_empty() {
        return "-".into();
    }
    let mut out = String::new();
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            out.push('-');
        }
        for (j, &b) in part.as_bytes().iter().enumerate() {
            let plain = b.is_ascii_alphanumeric() || b == b':' || b == b'_' || b == b'.';
            if plain && !(b == b'.' && i == 0 && j == 0) {
                out.push(b as char);
            } else {
                out.push_str(&format!("\\x{b:02x}"));
            }
        }
    }
    out
}

/// The status file's name for `mountpoint` (an absolute path).
pub fn file_name(mountpoint: &Path) -> String {
    format!("{}.json", escape_path(mountpoint))
}

/// `path` made absolute and free of `.` and `..` without asking the filesystem about
/// the path itself (a hung mount would hang the caller): only its parent directory is
/// resolved (symlinks included), which is not on the mount.
pub fn absolute_mountpoint(path: &Path) -> std::io::Result<PathBuf> {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()?.join(path)
    };
    let mut clean = PathBuf::from("/");
    for c in abs.components() {
        match c {
            Component::Normal(p) => clean.push(p),
            Component::ParentDir => {
                clean.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    match (clean.parent(), clean.file_name()) {
        (Some(parent), Some(name)) => {
            let parent = std::fs::canonicalize(parent).unwrap_or_else(|_| parent.to_path_buf());
            Ok(parent.join(name))
        }
        _ => Ok(clean),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountpoints_are_escaped_as_systemd_escape_path_does() {
        for (path, escaped) in [
            ("/mnt/rmemfs", "mnt-rmemfs"),
            ("/", "-"),
            ("/mnt/rmemfs/", "mnt-rmemfs"),
            ("//mnt//a", "mnt-a"),
            ("/tmp/rmemfs-mnt-12.3", "tmp-rmemfs\\x2dmnt\\x2d12.3"),
            ("/a b/c\\d", "a\\x20b-c\\x5cd"),
            ("/.hidden/x.y", "\\x2ehidden-x.y"),
            ("/srv/é", "srv-\\xc3\\xa9"),
        ] {
            assert_eq!(escape_path(Path::new(path)), escaped, "{path}");
        }
        assert_eq!(file_name(Path::new("/mnt/x")), "mnt-x.json");
    }

    #[test]
    fn different_mountpoints_get_different_names() {
        let names: std::collections::BTreeSet<String> =
            ["/a-b", "/a/b", "/a_b", "/a\\x2db", "/a.b"]
                .iter()
                .map(|p| escape_path(Path::new(p)))
                .collect();
        assert_eq!(names.len(), 5, "{names:?}");
    }

    #[test]
    fn a_relative_mountpoint_is_made_absolute_without_resolving_it() {
        let cwd = std::fs::canonicalize(std::env::current_dir().unwrap()).unwrap();
        let p = absolute_mountpoint(Path::new("./no-such-dir/../mnt")).unwrap();
        assert_eq!(p, cwd.join("mnt"));
        let p = absolute_mountpoint(Path::new("/x/./y/../z")).unwrap();
        assert_eq!(p, Path::new("/x/z"));
    }

    #[test]
    fn the_search_holds_the_system_dir_once() {
        let dirs = search_dirs();
        assert!(dirs.contains(&PathBuf::from(SYSTEM_RUNTIME_DIR)));
        let unique: std::collections::BTreeSet<_> = dirs.iter().collect();
        assert_eq!(unique.len(), dirs.len());
    }
}
