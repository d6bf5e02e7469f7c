//! The end-to-end harness: real `memnode` and `fsd` processes, a real FUSE mount, used
//! the way a program would use it.
//!
//! - [`binaries`] finds the binaries under test (`$RMEMFS_BIN_DIR`, else the target
//!   directory of the running test executable) and panics with a build hint when they
//!   are missing: a missing binary is a failure, never a skipped test.
//! - [`transport`] reads `RMEMFS_TRANSPORT` (`tcp` when unset, `verbs`, `auto`): every
//!   memnode and fsd the harness starts gets `--transport` with it, so the same tests
//!   run over both fabric backends (scripts/softroce/e2e.sh runs them over verbs in a
//!   Soft-RoCE guest). Each test prints which transport it used.
//! - [`config`] names the settings many tests share (fsd's block size, a small
//!   cache, fsd's op timeout and dead time, the bound on failing instead of hanging).
//! - [`MemnodeProc`] starts a memnode on a free port (of `127.0.0.1` unless
//!   `RMEMFS_TEST_HOST` or the transport says otherwise), reads its real address from its one stdout
//!   line, asks it for stats over the control protocol, kills it; `start_at` brings a
//!   memnode back on a killed one's address.
//! - [`FsdMount`] mounts fsd on a fresh temporary directory (with one memnode, several,
//!   or fsd's embedded one), waits for the mount to be live, and unmounts with a check
//!   that fsd exits 0. Its `Drop` detaches the mount and kills fsd, so a failing test
//!   never leaves a mount behind. `FsdMount::refused` runs fsd with arguments it must
//!   reject before mounting.
//! - [`fault_proxy`] is a TCP proxy to put between fsd and a memnode (fsd gets its
//!   address as `--memnode`) that makes transient network faults happen on demand,
//!   reproducibly: every connection reset at once, a stall, a black hole, a refused
//!   port.
//! - [`helper`] installs rmemfs with `scripts/install` and mounts it through mount(8)
//!   and the `mount.fuse.rmemfs` helper ([`HelperMount`]), as an administrator does.
//! - [`swap`] sets up swap on a mount (`scripts/swap`), a memory cgroup to push a
//!   process into it and a hog that leaves the machine short of memory.
//! - [`stats`] reads fsd's `--stats-file` and waits, bounded, for its counters to
//!   reach a state.
//! - [`metrics`] talks HTTP to the daemons' `--metrics` endpoints, raw or as a scrape
//!   parsed strictly by [`exposition`]; [`status`] runs `rmemfs status` on a mount.
//! - [`within`] runs a closure under a time limit: it proves "fails in bounded time"
//!   rather than hanging the suite.
//! - [`command`] runs the real programs the tests use on a mount (tar, git, sqlite3,
//!   cargo) with a time limit, failing with their output; [`tree`] generates a
//!   reproducible source tree for them; [`kernel`] drops the page cache and counts a
//!   file's cached pages; [`TmpfsMount`] is the local filesystem tests compare with.
//! - [`data`] makes reproducible pseudorandom file contents from a printed seed, reads
//!   files around the kernel page cache (`O_DIRECT`) and reports the first differing
//!   offset of a miscompare.
//! - [`volume`] runs the `rmemfs` tool on durable volumes (`volume list`, `volume
//!   destroy`, `fsck`, with `--json` parsed) and mounts a volume again after its fsd
//!   was killed ([`FsdMount::kill9`]); [`snapshot`] records a whole tree (lstat,
//!   xattrs, contents digests) to compare before and after a remount; [`procmem`]
//!   reads and damages a memnode's memory through `/proc/PID/mem`; [`fileset`] keeps
//!   files of known contents to check after every remount.
//! - [`wireguard`] makes a second "host" (a network namespace) joined to the test's by
//!   a veth pair with a WireGuard tunnel over it ([`MemnodeProc::start_in_netns`] runs
//!   a memnode there), and [`capture`] records the raw frames of an interface, for the
//!   test that proves what crosses the wire (tests/tests/wireguard.rs).
//!
//! Every wait is bounded by a deadline; nothing synchronises with a bare sleep.

pub mod binaries;
pub mod capture;
pub mod command;
pub mod config;
pub mod data;
pub mod exposition;
pub mod fault_proxy;
pub mod fileset;
pub mod fsd;
pub mod helper;
pub mod kernel;
pub mod memnode;
pub mod metrics;
mod output;
pub mod procinfo;
pub mod procmem;
pub mod snapshot;
pub mod stats;
pub mod status;
pub mod swap;
pub mod tmpfs;
pub mod transport;
pub mod tree;
pub mod volume;
pub mod wireguard;

pub use data::{Pattern, UncachedReader, MIB};
pub use fsd::{mount_entry, FsdMount, MountEntry, Refusal};
pub use helper::{HelperMount, Via};
pub use memnode::MemnodeProc;
pub use stats::{FsdStats, StatsFile};
pub use tmpfs::TmpfsMount;
pub use transport::Transport;

use rmemfs_common::sync::lock;
use std::io;
use std::sync::{mpsc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Runs `f` on its own thread and returns its result, or panics if it has not finished
/// within `limit`: a hang becomes a test failure naming `what`. A panic inside `f` is
/// passed on unchanged. (A thread stuck in a syscall on a dead mount is left behind;
/// the mount's `Drop` detaches the mount, which ends the syscall.)
pub fn within<T, F>(limit: Duration, what: &str, f: F) -> T
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::Builder::new()
        .name(format!("within {what}"))
        .spawn(move || {
            let _ = tx.send(f());
        })
        .expect("spawning a thread for a time-limited operation");
    match rx.recv_timeout(limit) {
        Ok(v) => {
            let _ = handle.join();
            v
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => unreachable!("the closure returned without sending its result"),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what} did not finish within {limit:?}: it hangs instead of failing")
        }
    }
}

/// Polls `check` until it returns `Some` or `limit` passes; `None` on timeout. For
/// conditions another process makes true in its own time (memory given back, a mount
/// going away); the poll interval is short and the deadline is the bound.
pub fn poll_until<T>(limit: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

static HEAVY: Mutex<()> = Mutex::new(());

/// Serialises heavy tests (hundreds of MiB through a mount) inside one test binary:
/// the CI machine has 2 cores. Hold the guard for the whole test.
pub fn heavy_test() -> MutexGuard<'static, ()> {
    lock(&HEAVY)
}

/// The errno's symbolic name, for failure messages (EWOULDBLOCK is EAGAIN on Linux).
pub fn errno_name(code: i32) -> &'static str {
    match code {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::E2BIG => "E2BIG",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EEXIST => "EEXIST",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::ERANGE => "ERANGE",
        libc::EDEADLK => "EDEADLK",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOLCK => "ENOLCK",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ENOSYS => "ENOSYS",
        libc::ENODATA => "ENODATA",
        libc::ENOTCONN => "ENOTCONN",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ECONNABORTED => "ECONNABORTED",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        _ => "another errno",
    }
}

/// Describes a result's errno for messages: `ok`, or `EIO (5): ...`.
pub fn describe<T>(r: &io::Result<T>) -> String {
    match r {
        Ok(_) => "success".to_string(),
        Err(e) => match e.raw_os_error() {
            Some(code) => format!("{} ({code}): {e}", errno_name(code)),
            None => format!("a non-OS error: {e}"),
        },
    }
}

/// Asserts that `r` failed with exactly `errno`.
#[track_caller]
pub fn assert_errno<T>(r: io::Result<T>, errno: i32, what: &str) {
    let got = r.as_ref().err().and_then(io::Error::raw_os_error);
    assert_eq!(
        got,
        Some(errno),
        "{what}: expected {} ({errno}), got {}",
        errno_name(errno),
        describe(&r)
    );
}

/// A fresh, unique directory under the system temp dir (removed by its owner).
pub fn fresh_dir(prefix: &str) -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir =
            std::env::temp_dir().join(format!("{prefix}-{}-{n}-{nanos:08x}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => return dir,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => panic!("cannot create a temporary directory {}: {e}", dir.display()),
        }
    }
}

/// The names in directory `dir` (without "." and ".."), panicking with the path on error.
pub fn dir_names(dir: &std::path::Path) -> std::collections::BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("readdir {}: {e}", dir.display()))
        .map(|e| {
            e.unwrap_or_else(|e| panic!("readdir entry in {}: {e}", dir.display()))
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::errno_name;

    #[test]
    fn errno_names_cover_the_errnos_the_tests_assert() {
        for (code, name) in [
            (libc::ENODATA, "ENODATA"),
            (libc::ERANGE, "ERANGE"),
            (libc::ENXIO, "ENXIO"),
            (libc::E2BIG, "E2BIG"),
            (libc::ENAMETOOLONG, "ENAMETOOLONG"),
            (libc::EWOULDBLOCK, "EAGAIN"),
            (libc::EDEADLK, "EDEADLK"),
            (libc::ENOLCK, "ENOLCK"),
        ] {
            assert_eq!(errno_name(code), name, "name of errno {code}");
        }
        assert_eq!(errno_name(-1), "another errno");
    }
}
