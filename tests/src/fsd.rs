//! An `fsd` process and its mount.
//!
//! Start: a fresh temporary mountpoint, `fsd MOUNTPOINT ARGS...`, then wait (bounded)
//! for fsd's `fsd mounted <MOUNTPOINT>` line and for the mount to show in
//! `/proc/self/mountinfo` as an rmemfs mount ([`MountEntry::is_rmemfs`]). If fsd exits first, the failure carries
//! its exit status and stderr.
//!
//! Stop: [`FsdMount::unmount`] is the clean path a test asserts on (SIGTERM, exit 0,
//! mount gone). `Drop` is the safety net for failing tests: a lazy `fusermount3 -u -z`,
//! SIGKILL, and removal of the mountpoint, so no mount outlives its test.

use crate::binaries::{binary, require_fuse};
use crate::memnode::MemnodeProc;
use crate::output::{self, Announce, Tail};
use crate::poll_until;
use crate::transport::{self, Transport};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

/// How long fsd may take to connect and mount.
const MOUNT_LIMIT: Duration = Duration::from_secs(30);
/// How long fsd may take to flush and exit after SIGTERM.
const UNMOUNT_LIMIT: Duration = Duration::from_secs(60);
/// The filesystem type fsd's mounts carry.
pub const FSTYPE: &str = "fuse.rmemfs";

/// A live fsd mount.
pub struct FsdMount {
    child: Option<Child>,
    mountpoint: PathBuf,
    args: Vec<String>,
    stderr: Tail,
    /// The metrics endpoint's address, when fsd was started with `--metrics`.
    metrics: Option<String>,
}

impl FsdMount {
    /// `fsd MOUNTPOINT --transport T ARGS...` on a fresh temporary mountpoint, T being
    /// what `RMEMFS_TRANSPORT` names (it also carries fsd's embedded memnode when ARGS
    /// name no `--memnode`). `--op-timeout $RMEMFS_TEST_OP_TIMEOUT` is added when that
    /// is set and ARGS have no `--op-timeout`, and likewise `--fuse-transport
    /// $RMEMFS_FUSE_TRANSPORT`.
    pub fn start(args: &[&str]) -> FsdMount {
        FsdMount::launch(transport::transport(), false, args)
    }

    /// As [`FsdMount::start`] on `transport` whatever `RMEMFS_TRANSPORT` says.
    pub fn start_on(transport: Transport, args: &[&str]) -> FsdMount {
        FsdMount::launch(transport, true, args)
    }

    fn launch(transport: Transport, fixed: bool, test_args: &[&str]) -> FsdMount {
        let (mount, announced) = FsdMount::spawn(transport, fixed, test_args);
        match announced {
            Announce::Line(line) => {
                let named = line.trim_start_matches("fsd mounted ").trim();
                assert_eq!(
                    Path::new(named),
                    mount.mountpoint,
                    "fsd announced a mount on {named:?}, not on the mountpoint it was given"
                );
            }
            Announce::Exited(status) => panic!(
                "fsd {} exited ({status}) before mounting; stderr:\n{}",
                mount.describe(),
                mount.stderr.final_text()
            ),
            Announce::TimedOut => panic!(
                "fsd {} printed no `fsd mounted` line within {MOUNT_LIMIT:?}; stderr:\n{}",
                mount.describe(),
                mount.stderr()
            ),
        }
        let entry = poll_until(MOUNT_LIMIT, || mount_entry(&mount.mountpoint));
        assert!(
            entry.as_ref().is_some_and(MountEntry::is_rmemfs),
            "after `fsd mounted`, /proc/self/mountinfo should list {} as {FSTYPE}, \
             but has {entry:?}; stderr:\n{}",
            mount.mountpoint.display(),
            mount.stderr()
        );
        mount
    }

    /// Starts fsd on a fresh mountpoint and waits (bounded) for its `fsd mounted` line
    /// or its exit. From the moment fsd runs, the returned mount's `Drop` cleans up
    /// whatever happened.
    fn spawn(transport: Transport, fixed: bool, test_args: &[&str]) -> (FsdMount, Announce) {
        require_fuse();
        let given = |flag: &str| {
            test_args
                .iter()
                .any(|a| *a == flag || a.starts_with(&format!("{flag}=")))
        };
        assert!(
            !given("--transport"),
            "pass the transport to FsdMount::start_on, not as an argument"
        );
        transport::announce(transport, fixed, "fsd");
        let bin = binary("fsd");
        let dir = crate::fresh_dir("rmemfs-mnt");
        let mountpoint = dir
            .canonicalize()
            .unwrap_or_else(|e| panic!("canonicalizing {}: {e}", dir.display()));
        let mut args: Vec<String> = vec!["--transport".to_string(), transport.to_string()];
        if let Some(t) = transport::op_timeout().filter(|_| !given("--op-timeout")) {
            args.extend(["--op-timeout".to_string(), t]);
        }
        if let Some(t) = transport::fuse_transport().filter(|_| !given("--fuse-transport")) {
            args.extend(["--fuse-transport".to_string(), t]);
        }
        args.extend(test_args.iter().map(|a| a.to_string()));
        let argv: Vec<String> = std::iter::once(mountpoint.to_string_lossy().into_owned())
            .chain(args.iter().cloned())
            .collect();
        let (mut child, stdout, stderr) = output::spawn_daemon(&bin, &argv, "fsd");
        // With --metrics, `fsd metrics on <ADDR>` comes before the mounted line.
        let metrics = std::cell::RefCell::new(None::<String>);
        let announced = output::wait_for_line(&mut child, &stdout, MOUNT_LIMIT, |l| {
            if let Some(a) = l.strip_prefix("fsd metrics on ") {
                *metrics.borrow_mut() = Some(a.trim().to_string());
            }
            l.starts_with("fsd mounted ")
        });
        let mount = FsdMount {
            child: Some(child),
            mountpoint,
            args,
            stderr,
            metrics: metrics.into_inner(),
        };
        (mount, announced)
    }

    /// `fsd MOUNTPOINT --transport T --memnode ADDR ARGS...`, T being the memnode's
    /// own transport.
    pub fn with_memnode(memnode: &MemnodeProc, args: &[&str]) -> FsdMount {
        FsdMount::with_memnodes(&[memnode], args)
    }

    /// `fsd MOUNTPOINT --transport T --memnode ADDR0 --memnode ADDR1 ... ARGS...`, in
    /// the order given (fsd numbers its memnodes 0, 1, ... by their position on the
    /// command line), T being the memnodes' transport (they must share one).
    pub fn with_memnodes(memnodes: &[&MemnodeProc], args: &[&str]) -> FsdMount {
        let (t, all) = memnode_args(memnodes, args);
        FsdMount::launch(t, t != transport::transport(), &all)
    }

    /// Runs fsd as [`FsdMount::with_memnodes`] does, with arguments it must refuse: fsd
    /// has to exit before mounting, within the mount deadline. Returns how it exited
    /// and its stderr. Panics if it mounts (the mount is then taken down) or neither
    /// mounts nor exits.
    pub fn refused(memnodes: &[&MemnodeProc], args: &[&str]) -> Refusal {
        let (t, all) = memnode_args(memnodes, args);
        FsdMount::refused_as(t, t != transport::transport(), &all)
    }

    /// As [`FsdMount::refused`], for fsd on `transport` with `args` as they are
    /// (memnodes behind a fault proxy, say).
    pub fn refused_on(transport: Transport, args: &[&str]) -> Refusal {
        FsdMount::refused_as(transport, true, args)
    }

    fn refused_as(t: Transport, fixed: bool, all: &[&str]) -> Refusal {
        let (mut mount, announced) = FsdMount::spawn(t, fixed, all);
        match announced {
            Announce::Exited(status) => {
                // fsd is gone: Drop only has to remove the mountpoint.
                mount.child = None;
                let stderr = mount.stderr.final_text();
                let mounted = mount_entry(&mount.mountpoint);
                assert!(
                    mounted.is_none(),
                    "fsd {} exited ({status}) but left {} mounted ({mounted:?}); stderr:\n{stderr}",
                    mount.describe(),
                    mount.mountpoint.display()
                );
                Refusal { status, stderr }
            }
            Announce::Line(line) => panic!(
                "fsd {} should have refused its arguments before mounting, but printed \
                 {line:?}; stderr:\n{}",
                mount.describe(),
                mount.stderr()
            ),
            Announce::TimedOut => panic!(
                "fsd {} should have refused its arguments before mounting, but neither \
                 mounted nor exited within {MOUNT_LIMIT:?}; stderr:\n{}",
                mount.describe(),
                mount.stderr()
            ),
        }
    }

    /// As [`FsdMount::with_memnodes`], but fsd may refuse to mount: `Ok` with the live
    /// mount when it mounted, `Err` with how it exited (and its stderr) when it exited
    /// first. For tests where either outcome can be right (a volume whose metadata was
    /// damaged: refused with a clear message, or mounted with intact files). Panics if
    /// fsd neither mounts nor exits within the mount deadline.
    pub fn try_with_memnodes(
        memnodes: &[&MemnodeProc],
        args: &[&str],
    ) -> Result<FsdMount, Refusal> {
        let (t, all) = memnode_args(memnodes, args);
        let (mut mount, announced) = FsdMount::spawn(t, t != transport::transport(), &all);
        match announced {
            Announce::Line(_) => {
                let entry = poll_until(MOUNT_LIMIT, || mount_entry(&mount.mountpoint));
                assert!(
                    entry.as_ref().is_some_and(MountEntry::is_rmemfs),
                    "after `fsd mounted`, /proc/self/mountinfo should list {} as {FSTYPE}, \
                     but has {entry:?}; stderr:\n{}",
                    mount.mountpoint.display(),
                    mount.stderr()
                );
                Ok(mount)
            }
            Announce::Exited(status) => {
                mount.child = None;
                let stderr = mount.stderr.final_text();
                let mounted = mount_entry(&mount.mountpoint);
                assert!(
                    mounted.is_none(),
                    "fsd {} exited ({status}) but left {} mounted ({mounted:?}); stderr:\n{stderr}",
                    mount.describe(),
                    mount.mountpoint.display()
                );
                Err(Refusal { status, stderr })
            }
            Announce::TimedOut => panic!(
                "fsd {} neither mounted nor exited within {MOUNT_LIMIT:?}; stderr:\n{}",
                mount.describe(),
                mount.stderr()
            ),
        }
    }

    /// `kill -9` of fsd, as a crash would end it: SIGKILL, reap, then detach the dead
    /// mount (`fusermount3 -u -z`, else `umount -l`) and wait (bounded) until it is no
    /// longer listed. Files still open on it fail with ENOTCONN from the moment fsd
    /// dies. Returns the end of fsd's stderr.
    pub fn kill9(mut self) -> String {
        let mut child = self.child.take().expect("fsd already stopped");
        let status = output::kill_and_reap(&mut child);
        assert!(
            status.is_some(),
            "fsd (pid {}) survived SIGKILL for 10 s",
            child.id()
        );
        detach(&self.mountpoint);
        let gone = poll_until(Duration::from_secs(10), || {
            mount_entry(&self.mountpoint).is_none().then_some(())
        });
        assert!(
            gone.is_some(),
            "fsd was killed and its mount detached, but {} is still mounted",
            self.mountpoint.display()
        );
        self.stderr.final_text()
        // Drop removes the mountpoint directory.
    }

    /// A lenient stop, for an fsd whose exit status is not the point (one that was
    /// fenced off its volume, say): SIGTERM unless it already exited, a bounded wait,
    /// and the mount detached if it is still there. Returns its exit status, or `None`
    /// if it did not exit within the unmount deadline (it is then killed).
    pub fn terminate(mut self) -> Option<ExitStatus> {
        let mut child = self.child.take().expect("fsd already stopped");
        let status = match child.try_wait() {
            Ok(Some(status)) => Some(status),
            _ => {
                output::signal(child.id(), libc::SIGTERM);
                output::wait_exit(&mut child, UNMOUNT_LIMIT)
            }
        };
        if status.is_none() {
            detach(&self.mountpoint);
            output::kill_and_reap(&mut child);
        }
        if mount_entry(&self.mountpoint).is_some() {
            detach(&self.mountpoint);
        }
        status
    }

    /// fsd's exit status if it has exited on its own, without waiting.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// The arguments fsd was started with after the mountpoint (transport included).
    pub fn args(&self) -> &[String] {
        &self.args
    }

    /// What /proc/self/mountinfo shows at the mountpoint; panics if nothing.
    pub fn entry(&self) -> MountEntry {
        mount_entry(&self.mountpoint)
            .unwrap_or_else(|| panic!("{} is not mounted", self.mountpoint.display()))
    }

    /// The address of fsd's metrics endpoint (`--metrics`, announced on stdout);
    /// panics when fsd was started without one.
    pub fn metrics_addr(&self) -> &str {
        self.metrics.as_deref().unwrap_or_else(|| {
            panic!(
                "fsd {} announced no metrics endpoint (started without --metrics?)",
                self.describe()
            )
        })
    }

    /// The mountpoint.
    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    /// A path inside the mount.
    pub fn join(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.mountpoint.join(rel)
    }

    /// Pushes every block cached so far out of fsd's cache of `cache` bytes, so that
    /// reads of them go to remote memory: writes a file of three times the cache, one
    /// `block`-byte piece at a time from its end back to its start (fsd sees no
    /// stream, so these pages age like any data, and a stream's pages, which fsd
    /// evicts first, cannot shield older ones; the third cache's worth covers a page
    /// that an eviction found in use and put back), then deletes it.
    pub fn push_out_of_cache(&self, cache: u64, block: u64) {
        use std::os::unix::fs::FileExt;
        let path = self.join(".push-out-of-cache");
        let file = std::fs::File::create(&path)
            .unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        let piece = vec![0x5au8; block as usize];
        for i in (0..3 * cache / block).rev() {
            file.write_all_at(&piece, i * block)
                .unwrap_or_else(|e| panic!("writing {} at {}: {e}", path.display(), i * block));
        }
        drop(file);
        std::fs::remove_file(&path).unwrap_or_else(|e| panic!("removing {}: {e}", path.display()));
    }

    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .map(Child::id)
            .expect("fsd already stopped")
    }

    /// What fsd wrote to stderr so far (the end of it).
    pub fn stderr(&self) -> String {
        self.stderr.text()
    }

    /// fsd's stderr once it holds `needle`, waiting up to 10 s for it: some lines
    /// come after `fsd mounted` (the transport's comes at FUSE_INIT, which the kernel
    /// sends after the mount), and a reader thread copies them. Without it, all of
    /// stderr so far; the caller's assert names what was missing.
    pub fn stderr_with(&self, needle: &str) -> String {
        poll_until(Duration::from_secs(10), || {
            let text = self.stderr();
            text.contains(needle).then_some(text)
        })
        .unwrap_or_else(|| self.stderr())
    }

    /// fsd's own resident memory, in bytes: its resident set (VmRSS in
    /// /proc/PID/status) less the shared memory in it (RssShmem). Over the mapped
    /// fabric fsd maps the memnode's region, whose pages count in both processes'
    /// resident sets but are the memnode's memory, not fsd's.
    pub fn rss_bytes(&self) -> u64 {
        self.status_bytes("VmRSS:")
            .saturating_sub(self.status_bytes("RssShmem:"))
    }

    /// The most fsd's resident set has been (VmHWM) since it started or since
    /// [`FsdMount::reset_peak_rss`], in bytes.
    pub fn peak_rss_bytes(&self) -> u64 {
        self.status_bytes("VmHWM:")
    }

    /// Sets fsd's peak resident set size to what it is now (Linux 4.0).
    pub fn reset_peak_rss(&self) {
        let path = format!("/proc/{}/clear_refs", self.pid());
        std::fs::write(&path, "5").unwrap_or_else(|e| panic!("writing 5 to {path}: {e}"));
    }

    /// A size line of /proc/PID/status (`field` with its colon), in bytes.
    fn status_bytes(&self, field: &str) -> u64 {
        let path = format!("/proc/{}/status", self.pid());
        let status = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {path}: {e} (did fsd die?)"));
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib * 1024)
            .unwrap_or_else(|| panic!("no {field} line in {path}"))
    }

    /// True while fsd runs.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// The clean stop a user makes: SIGTERM, then fsd must flush, unmount and exit 0
    /// within a deadline, and the mount must be gone.
    pub fn unmount(mut self) {
        let mut child = self.child.take().expect("fsd already stopped");
        output::signal(child.id(), libc::SIGTERM);
        let status = output::wait_exit(&mut child, UNMOUNT_LIMIT);
        let Some(status) = status else {
            // Put it back so Drop detaches the mount and kills fsd.
            self.child = Some(child);
            panic!(
                "fsd did not exit within {UNMOUNT_LIMIT:?} of SIGTERM; stderr:\n{}",
                self.stderr()
            );
        };
        assert!(
            status.success(),
            "fsd should exit 0 after SIGTERM, but exited with {status}; stderr:\n{}",
            self.stderr.final_text()
        );
        let gone = poll_until(Duration::from_secs(10), || {
            mount_entry(&self.mountpoint).is_none().then_some(())
        });
        assert!(
            gone.is_some(),
            "fsd exited 0 but {} is still mounted",
            self.mountpoint.display()
        );
        // Drop removes the mountpoint directory.
    }

    fn describe(&self) -> String {
        format!("{} {}", self.mountpoint.display(), self.args.join(" "))
    }
}

/// How fsd exited when it refused its arguments ([`FsdMount::refused`]).
#[derive(Debug)]
pub struct Refusal {
    pub status: ExitStatus,
    pub stderr: String,
}

/// The memnodes' shared transport, and `--memnode ADDR` for each of them in order,
/// followed by `args`.
fn memnode_args<'a>(memnodes: &[&'a MemnodeProc], args: &[&'a str]) -> (Transport, Vec<&'a str>) {
    let first = memnodes
        .first()
        .expect("an fsd with memnodes needs at least one memnode");
    let t = first.transport();
    for m in memnodes {
        assert_eq!(
            m.transport(),
            t,
            "memnode {} runs on {} but memnode {} on {t}: one fsd uses one transport",
            m.addr(),
            m.transport(),
            first.addr()
        );
    }
    let mut all = Vec::with_capacity(2 * memnodes.len() + args.len());
    for m in memnodes {
        all.extend(["--memnode", m.addr()]);
    }
    all.extend_from_slice(args);
    (t, all)
}

impl Drop for FsdMount {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Detach first: it also aborts requests stuck in the mount.
            detach(&self.mountpoint);
            output::kill_and_reap(&mut child);
        }
        if mount_entry(&self.mountpoint).is_some() {
            detach(&self.mountpoint);
        }
        let _ = std::fs::remove_dir(&self.mountpoint);
    }
}

/// Best-effort lazy unmount.
fn detach(mountpoint: &Path) {
    let quiet = |cmd: &mut Command| {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !quiet(
        Command::new("fusermount3")
            .arg("-u")
            .arg("-z")
            .arg(mountpoint),
    ) {
        quiet(Command::new("umount").arg("-l").arg(mountpoint));
    }
}

/// One line of /proc/self/mountinfo, the parts the tests look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub fstype: String,
    pub source: String,
    /// The per-mount options (`rw,nosuid,nodev,relatime`).
    pub options: String,
    /// The filesystem's own options (`rw,user_id=0,...,allow_other`).
    pub super_options: String,
}

impl MountEntry {
    /// True for an fsd mount: fsd as root mounts with mount(2) itself, so the
    /// kernel records the type `fuse.rmemfs` (fuser's own mount dropped the subtype).
    pub fn is_rmemfs(&self) -> bool {
        self.fstype == FSTYPE
    }

    /// True if the per-mount options include `word` (`nosuid`, `ro`, ...).
    pub fn has_option(&self, word: &str) -> bool {
        self.options.split(',').any(|o| o == word)
    }
}

/// What is mounted at `mountpoint` per /proc/self/mountinfo (the last mount there
/// wins), or None if nothing is.
pub fn mount_entry(mountpoint: &Path) -> Option<MountEntry> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = mountpoint.to_string_lossy();
    info.lines().rev().find_map(|line| {
        // id parent major:minor root MOUNTPOINT options [optional...] - FSTYPE SOURCE superopts
        let mut fields = line.split(' ');
        let point = unescape_mountinfo(fields.nth(4)?);
        let options = fields.next()?.to_string();
        let mut rest = fields.skip_while(|f| *f != "-").skip(1);
        let fstype = rest.next()?.to_string();
        let source = unescape_mountinfo(rest.next()?);
        let super_options = rest.next().unwrap_or_default().to_string();
        (point == want).then_some(MountEntry {
            fstype,
            source,
            options,
            super_options,
        })
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space, ...).
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 4 <= b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = b[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
            out.push(v as u8);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::unescape_mountinfo;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape_mountinfo("/tmp/a\\040b"), "/tmp/a b");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
        assert_eq!(unescape_mountinfo("/odd\\"), "/odd\\");
    }
}
