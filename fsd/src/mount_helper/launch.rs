//! Starting fsd for a mount and waiting until the filesystem is live.
//!
//! fsd runs detached: its own session (`setsid`, so no terminal's hangup reaches it),
//! `/` as its directory (so it keeps no directory busy), stdin from `/dev/null`,
//! and `RMEMFS_TOKEN` removed from its environment (the token comes from
//! `token_file=` or nowhere). Its stderr, where it logs, goes to a log file
//! ([`LogTarget`]: `/var/log/rmemfs/<mount>.log` unless `log=` says otherwise), or
//! stays the helper's when that is the journal (under systemd, a mount unit's
//! output), where fsd's lines then land too.
//!
//! Its stdout is a pipe to the helper, which waits for fsd's one line there, `fsd
//! mounted <DIR>`, printed once the kernel has the mount and FUSE_INIT is answered:
//! then the helper exits 0 and `mount` returns with the filesystem live. fsd writes
//! nothing else to stdout, so the pipe losing its reader later costs nothing. If fsd
//! exits first, the helper prints fsd's error (its last `fsd: ` line in the log) and
//! exits 32; if neither happens within the mount timeout, it stops fsd (SIGTERM,
//! which unmounts should fsd have mounted meanwhile) and fails.

use super::{HelperError, HELPER_NAME};
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Where fsd's log files go by default.
pub const LOG_DIR: &str = "/var/log/rmemfs";

/// How long a stopped fsd may take to unmount and exit before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Where fsd's stderr goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogTarget {
    /// Appended to this file.
    File(PathBuf),
    /// The helper's own stderr, which is the journal.
    Journal,
}

impl LogTarget {
    /// `log=` if given; else the journal when the helper's stderr is one; else
    /// `/var/log/rmemfs/<mount>.log`, `<mount>` being the mount point escaped as
    /// systemd names mount units (`/mnt/rmemfs` -> `mnt-rmemfs`).
    pub fn choose(asked: Option<&Path>, dir: &Path) -> LogTarget {
        LogTarget::choose_for(asked, dir, stderr_is_journal())
    }

    /// [`LogTarget::choose`] with whether stderr is the journal given.
    fn choose_for(asked: Option<&Path>, dir: &Path, journal: bool) -> LogTarget {
        match asked {
            Some(p) => LogTarget::File(p.to_path_buf()),
            None if journal => LogTarget::Journal,
            None => LogTarget::File(Path::new(LOG_DIR).join(format!("{}.log", escape_path(dir)))),
        }
    }
}

/// True when stderr is the journal's stream: systemd sets `JOURNAL_STREAM` to its
/// `DEVICE:INODE` (inherited by children, so the pair is compared with stderr's).
fn stderr_is_journal() -> bool {
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = stream.to_str().and_then(|s| s.split_once(':')) else {
        return false;
    };
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else {
        return false;
    };
    dev.parse() == Ok(meta.dev()) && ino.parse() == Ok(meta.ino())
}

/// A path as systemd escapes it for a unit name: no leading or trailing `/`, `/`
/// becomes `-`, and bytes other than ASCII letters, digits, `:`, `_` and `.` (and
/// a leading `.`) become `\xNN`; `/` itself is `-`.
pub fn escape_path(path: &Path) -> String {
    let s = path.to_string_lossy();
    let trimmed = s.trim_matches('/');
    if trimmed.is_empty() {
        return "-".into();
    }
    let mut out = String::new();
    for (i, b) in trimmed.bytes().enumerate() {
        match b {
            b'/' => out.push('-'),
            b'.' if i == 0 => out.push_str("\\x2e"),
            b if b.is_ascii_alphanumeric() || matches!(b, b':' | b'_' | b'.') => {
                out.push(b as char)
            }
            b => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out
}

/// fsd, found where the installation put it: beside the helper (after following
/// the symlink mount(8) ran it through), in `../bin` from it, or on PATH.
pub fn find_fsd() -> Result<PathBuf, HelperError> {
    let mut looked = Vec::new();
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        looked.push(dir.join("fsd"));
        looked.push(dir.join("../bin/fsd"));
    }
    if let Some(path) = std::env::var_os("PATH") {
        looked.extend(std::env::split_paths(&path).map(|d| d.join("fsd")));
    }
    looked
        .iter()
        .find(|p| is_executable(p))
        .cloned()
        .ok_or_else(|| {
            HelperError::Failed(format!(
                "cannot find fsd (looked in {}); install rmemfs with scripts/install",
                looked
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The log file opened for appending (its directory made, mode 0750, if missing),
/// and where this start's lines begin in it.
fn open_log(path: &Path) -> Result<(File, u64), HelperError> {
    let fail = |what: &str, e: std::io::Error| {
        HelperError::Failed(format!("{what} the log file {}: {e}", path.display()))
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(dir)
            .map_err(|e| fail("making the directory of", e))?;
    }
    let file = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .open(path)
        .map_err(|e| fail("opening", e))?;
    let start = file.metadata().map(|m| m.len()).unwrap_or(0);
    Ok((file, start))
}

/// Starts `fsd ARGS` for the mount on `dir` and waits until it is mounted (then
/// returns its pid) or has failed.
pub fn start(
    fsd: &Path,
    args: &[OsString],
    dir: &Path,
    log: &LogTarget,
    timeout: Duration,
    verbose: bool,
) -> Result<u32, HelperError> {
    let (stderr, log_start) = match log {
        LogTarget::File(path) => {
            let (file, start) = open_log(path)?;
            (Stdio::from(file), Some((path.as_path(), start)))
        }
        LogTarget::Journal => (Stdio::inherit(), None),
    };
    if verbose {
        let line: Vec<String> = args.iter().map(|a| a.to_string_lossy().into()).collect();
        eprintln!(
            "{HELPER_NAME}: starting {} {}",
            fsd.display(),
            line.join(" ")
        );
        match log {
            LogTarget::File(p) => eprintln!("{HELPER_NAME}: fsd logs to {}", p.display()),
            LogTarget::Journal => eprintln!("{HELPER_NAME}: fsd logs to the journal"),
        }
    }
    let mut cmd = Command::new(fsd);
    cmd.args(args)
        .current_dir("/")
        .env_remove("RMEMFS_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr);
    // SAFETY: setsid is async-signal-safe and touches no memory of this process;
    // the child is a fresh fork that only calls it before exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| HelperError::Failed(format!("starting {}: {e}", fsd.display())))?;
    let lines = stdout_lines(&mut child);
    let announced = wait_for_mount(&mut child, &lines, dir, timeout);
    match announced {
        Outcome::Mounted => Ok(child.id()),
        Outcome::Exited(status) => Err(HelperError::Failed(failure_message(status, log_start))),
        Outcome::TimedOut => {
            stop(&mut child);
            Err(HelperError::Failed(format!(
                "fsd did not mount {} within {}s (mount_timeout=); it was stopped{}",
                dir.display(),
                timeout.as_secs(),
                log_start
                    .map(|(p, _)| format!("; its log is {}", p.display()))
                    .unwrap_or_default()
            )))
        }
    }
}

/// fsd's stdout, line by line, from a thread (the channel ends when fsd closes it).
fn stdout_lines(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    if let Some(out) = child.stdout.take() {
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
    }
    rx
}

enum Outcome {
    Mounted,
    Exited(ExitStatus),
    TimedOut,
}

fn wait_for_mount(
    child: &mut Child,
    lines: &mpsc::Receiver<String>,
    dir: &Path,
    timeout: Duration,
) -> Outcome {
    let deadline = Instant::now() + timeout;
    let want = format!("fsd mounted {}", dir.display());
    loop {
        match lines.recv_timeout(Duration::from_millis(100)) {
            Ok(line) if line == want => return Outcome::Mounted,
            Ok(_) => continue,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // stdout closed: fsd is exiting; wait for it (bounded).
                if let Some(status) = wait_exit(child, deadline) {
                    return Outcome::Exited(status);
                }
                return Outcome::TimedOut;
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            // Exited: take any line it printed just before.
            while let Ok(line) = lines.try_recv() {
                if line == want {
                    return Outcome::Mounted;
                }
            }
            return Outcome::Exited(status);
        }
        if Instant::now() >= deadline {
            return Outcome::TimedOut;
        }
    }
}

fn wait_exit(child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SIGTERM (fsd unmounts and exits), then SIGKILL if it does not exit in time.
fn stop(child: &mut Child) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill has no memory effects; the pid is our unreaped child.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    if wait_exit(child, Instant::now() + STOP_GRACE).is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// What to tell the administrator about an fsd that exited before mounting: its
/// error line from the log (fsd ends with `fsd: <error>`; clap with `error: ...`).
fn failure_message(status: ExitStatus, log: Option<(&Path, u64)>) -> String {
    let Some((path, start)) = log else {
        return format!("fsd exited ({status}) before mounting; its messages are above");
    };
    let text = read_from(path, start).unwrap_or_default();
    let said = text
        .lines()
        .rev()
        .find(|l| l.starts_with("fsd: ") || l.starts_with("error: "))
        .map(|l| l.strip_prefix("fsd: ").unwrap_or(l).to_string());
    match said {
        Some(err) => format!("fsd failed to mount: {err} (log: {})", path.display()),
        None => {
            let tail: Vec<&str> = text.lines().rev().take(5).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            format!(
                "fsd exited ({status}) before mounting; the end of its log ({}):\n{}",
                path.display(),
                tail.join("\n")
            )
        }
    }
}

/// The log file's text from byte `start` (at most the last 64 KiB of it).
fn read_from(path: &Path, start: u64) -> std::io::Result<String> {
    let mut f = File::open(path)?;
    let len = f.metadata()?.len();
    let from = start.max(len.saturating_sub(64 << 10));
    f.seek(SeekFrom::Start(from))?;
    let mut buf = Vec::new();
    f.read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_escape_as_systemd_names_units() {
        for (path, want) in [
            ("/mnt/rmemfs", "mnt-rmemfs"),
            ("/mnt/rmemfs/", "mnt-rmemfs"),
            ("/", "-"),
            ("/srv/a-b c", "srv-a\\x2db\\x20c"),
            ("/home/.cache", "home-.cache"),
            ("/.hidden", "\\x2ehidden"),
        ] {
            assert_eq!(escape_path(Path::new(path)), want, "{path}");
        }
    }

    #[test]
    fn the_log_goes_where_asked_else_to_the_journal_else_to_var_log() {
        let dir = Path::new("/mnt/a");
        let asked = Path::new("/tmp/x.log");
        for journal in [false, true] {
            assert_eq!(
                LogTarget::choose_for(Some(asked), dir, journal),
                LogTarget::File(asked.into()),
                "log= wins (journal: {journal})"
            );
        }
        assert_eq!(LogTarget::choose_for(None, dir, true), LogTarget::Journal);
        assert_eq!(
            LogTarget::choose_for(None, dir, false),
            LogTarget::File("/var/log/rmemfs/mnt-a.log".into())
        );
    }

    #[test]
    fn the_failure_message_is_fsds_last_error_line() {
        let path = std::env::temp_dir().join(format!("rmemfs-helper-log-{}", std::process::id()));
        std::fs::write(&path, "old run\nfsd: an old error\n").unwrap();
        let start = std::fs::metadata(&path).unwrap().len();
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        std::io::Write::write_all(
            &mut f,
            b"[INFO] connecting\nfsd: connecting to memnodes: memnode 10.0.0.9:7070: refused\n",
        )
        .unwrap();
        let status = std::process::Command::new("false").status().unwrap();
        let msg = failure_message(status, Some((&path, start)));
        assert!(
            msg.starts_with("fsd failed to mount: connecting to memnodes: memnode 10.0.0.9:7070"),
            "{msg}"
        );
        // Nothing that looks like an error: the end of the log, not an older run's.
        std::fs::write(&path, "fsd: an old error\n[INFO] a\n").unwrap();
        let msg = failure_message(status, Some((&path, 18)));
        assert!(
            msg.contains("[INFO] a") && !msg.contains("old error"),
            "{msg}"
        );
        let _ = std::fs::remove_file(&path);
    }
}
