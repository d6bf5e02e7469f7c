//! Finding the binaries under test, and the other programs the tests need.
//!
//! `$RMEMFS_BIN_DIR` wins when set (scripts/test points it at `target/release`; a
//! relative path is taken from the workspace root).
//! Otherwise the binaries are looked for next to the running test executable's
//! profile directory: a test runs as `target/<profile>/deps/<name>-<hash>`, and cargo
//! puts `memnode` and `fsd` in `target/<profile>/`. A missing binary panics with the
//! path looked at and the command that builds it.

use std::path::{Path, PathBuf};

/// The directory holding `memnode` and `fsd`.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("RMEMFS_BIN_DIR") {
        // cargo runs tests in the package directory (tests/), which is not where a
        // user typing a relative path stands: take it relative to the workspace root.
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        return workspace.join(dir);
    }
    let exe = std::env::current_exe().expect("cannot find the running test executable");
    // target/<profile>/deps/<test> -> target/<profile>
    let deps = exe
        .parent()
        .expect("the test executable has no parent directory");
    let profile_dir = if deps.file_name().is_some_and(|n| n == "deps") {
        deps.parent().unwrap_or(deps)
    } else {
        deps
    };
    profile_dir.to_path_buf()
}

/// The path of binary `name` (`memnode`, `fsd`); panics if it is not there.
pub fn binary(name: &str) -> PathBuf {
    let dir = bin_dir();
    let path = dir.join(name);
    if !is_executable(&path) {
        let profile = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let flag = if profile == "release" {
            " --release"
        } else {
            ""
        };
        panic!(
            "the {name} binary is missing at {}: build it with `cargo build{flag} -p memnode -p fsd` \
             (or set RMEMFS_BIN_DIR to the directory that holds memnode and fsd)",
            path.display()
        );
    }
    path
}

/// `fsx` from PATH; panics with the install command if it is not there.
pub fn fsx() -> PathBuf {
    find_on_path("fsx").unwrap_or_else(|| {
        panic!(
            "fsx is not on PATH: install it with `cargo install fsx --locked` \
             (scripts/test does this) and put its directory on PATH"
        )
    })
}

/// A program the tests run on a mount (`tar`, `git`, `sqlite3`), from PATH; panics
/// naming the Debian package that provides it: a missing program fails the test, it
/// does not skip it.
pub fn program(name: &str, package: &str) -> PathBuf {
    find_on_path(name).unwrap_or_else(|| {
        panic!("{name} is not on PATH: install it (`apt-get install {package}`)")
    })
}

/// The cargo that runs these tests (`$CARGO`, which cargo sets for its children), else
/// the first one on PATH.
pub fn cargo() -> PathBuf {
    std::env::var_os("CARGO")
        .map(PathBuf::from)
        .filter(|p| is_executable(p))
        .or_else(|| find_on_path("cargo"))
        .unwrap_or_else(|| panic!("no cargo: neither $CARGO nor PATH names one"))
}

/// The first executable called `name` on PATH.
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Panics unless this machine can mount FUSE filesystems.
pub fn require_fuse() {
    if !Path::new("/dev/fuse").exists() {
        panic!(
            "/dev/fuse does not exist: these tests mount a FUSE filesystem. Load the module \
             (`modprobe fuse`) or give the container the device (`--device /dev/fuse \
             --cap-add SYS_ADMIN`)"
        );
    }
}
