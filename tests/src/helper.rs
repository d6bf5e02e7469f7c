//! rmemfs mounted as an administrator mounts it: installed by `scripts/install`,
//! mounted by mount(8) (an fstab line or `mount -t fuse.rmemfs`), which runs the
//! helper `mount.fuse.rmemfs`, which starts fsd.
//!
//! [`install`] runs `scripts/install --no-build` once per test binary with the
//! binaries under test (`$RMEMFS_BIN_DIR`), into a prefix beside them
//! (`<bin dir>/rmemfs-test-install`, also its sysconfdir, so no unit file or config
//! lands in `/etc`). The one thing outside that prefix is the link mount(8) needs,
//! `/sbin/mount.fuse.rmemfs` (libmount looks for helpers nowhere else): it points
//! into the prefix and stays after the tests, replacing any earlier one (run
//! `scripts/install` again to put a real installation's back).
//!
//! [`HelperMount`] is one mount made by mount(8) on a fresh directory; fsd is found
//! by its command line (`fsd DIR ...`). Its `Drop` detaches the mount and stops that
//! fsd, so a failing test leaves nothing behind. Every mount gets `transport=` (the
//! memnode's) and, as [`crate::FsdMount`] does, `fuse_transport=` and `op_timeout=`
//! from the environment unless the options name them, and `log=` a file beside its
//! directory unless the options name a `log=` (`log=default`: none, so the helper's
//! default applies).

use crate::binaries::{bin_dir, require_fuse};
use crate::command::{command_line, run_within};
use crate::fsd::{mount_entry, MountEntry};
use crate::poll_until;
use crate::transport::{self, Transport};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// The helper's name, where mount(8) finds it.
pub const SBIN_HELPER: &str = "/sbin/mount.fuse.rmemfs";
/// How long mount(8) may take (fsd connects and mounts within it).
const MOUNT_LIMIT: Duration = Duration::from_secs(60);
/// How long fsd may take to exit once its mount is gone.
const EXIT_LIMIT: Duration = Duration::from_secs(30);

/// Where [`install`] put rmemfs.
#[derive(Debug)]
pub struct Installed {
    pub prefix: PathBuf,
    /// The sysconfdir: `etc` under the prefix.
    pub sysconfdir: PathBuf,
}

/// `scripts/install` in the repository.
pub fn install_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/install")
}

/// Installs the binaries under test once (see the module docs) and checks that
/// mount(8) will run this installation's helper.
pub fn install() -> &'static Installed {
    static INSTALLED: OnceLock<Installed> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        // Normalized: systemd ignores unit paths with `..` in them.
        let bins = bin_dir()
            .canonicalize()
            .unwrap_or_else(|e| panic!("the binaries' directory {}: {e}", bin_dir().display()));
        let prefix = bins.join("rmemfs-test-install");
        let sysconfdir = prefix.join("etc");
        let mut cmd = Command::new("bash");
        cmd.arg(install_script())
            .arg("--no-build")
            .arg("--bin-dir")
            .arg(&bins)
            .arg("--prefix")
            .arg(&prefix)
            .arg("--sysconfdir")
            .arg(&sysconfdir);
        let out = run_within(&mut cmd, Duration::from_secs(120), "scripts/install");
        assert!(
            out.status.success(),
            "`{}` failed ({}):\n{}",
            command_line(&cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let helper = prefix.join("sbin/mount.fuse.rmemfs");
        let linked = std::fs::canonicalize(SBIN_HELPER).ok();
        assert_eq!(
            linked.as_deref(),
            Some(
                helper
                    .canonicalize()
                    .expect("the installed helper")
                    .as_path()
            ),
            "after scripts/install, {SBIN_HELPER} should lead to {}",
            helper.display()
        );
        println!(
            "installed into {} ({SBIN_HELPER} links there)",
            prefix.display()
        );
        Installed { prefix, sysconfdir }
    })
}

/// How mount(8) failed, and the mount that was not made (its directory, its fsd if
/// one were left: cleaned up when this is dropped).
pub struct MountFailure {
    pub mount: HelperMount,
    pub status: ExitStatus,
    pub stderr: String,
}

/// One mount made through mount(8) and the helper.
pub struct HelperMount {
    dir: PathBuf,
    source: String,
    options: String,
    log: Option<PathBuf>,
    fsd: Option<u32>,
}

/// How to call mount(8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// `mount --fstab FILE DIR` with the line `SOURCE DIR fuse.rmemfs OPTIONS 0 0`.
    Fstab,
    /// `mount -t fuse.rmemfs SOURCE DIR -o OPTIONS`.
    CommandLine,
    /// As `CommandLine`, with mount's stderr a file that `JOURNAL_STREAM` names, as
    /// systemd does for a unit whose output is the journal
    /// ([`HelperMount::journal_text`] reads it).
    UnderJournal,
}

impl HelperMount {
    /// Mounts `source` with `options` through mount(8) on a fresh directory, the
    /// memnodes being on `transport`; panics with mount's output if it fails.
    pub fn mount(via: Via, transport: Transport, source: &str, options: &str) -> HelperMount {
        match HelperMount::try_mount(via, transport, source, options) {
            Ok(m) => m,
            Err(f) => panic!(
                "mount {source} -o {} failed ({}): {}\nfsd's log:\n{}",
                f.mount.options,
                f.status,
                f.stderr,
                f.mount.log_text()
            ),
        }
    }

    /// As [`HelperMount::mount`], returning how mount(8) failed instead of
    /// panicking (the directory is cleaned up with the returned value).
    pub fn try_mount(
        via: Via,
        transport: Transport,
        source: &str,
        options: &str,
    ) -> Result<HelperMount, Box<MountFailure>> {
        require_fuse();
        install();
        transport::announce(transport, false, "mount.fuse.rmemfs");
        let dir = crate::fresh_dir("rmemfs-helper-mnt")
            .canonicalize()
            .expect("canonicalizing a fresh directory");
        let given = |name: &str| {
            options
                .split(',')
                .any(|o| o.split('=').next() == Some(name))
        };
        let mut all: Vec<String> = options
            .split(',')
            .filter(|o| !o.is_empty() && *o != "log=default")
            .map(str::to_string)
            .collect();
        if !given("transport") {
            all.push(format!("transport={transport}"));
        }
        if let Some(t) = transport::fuse_transport().filter(|_| !given("fuse_transport")) {
            all.push(format!("fuse_transport={t}"));
        }
        if let Some(t) = transport::op_timeout().filter(|_| !given("op_timeout")) {
            all.push(format!("op_timeout={t}"));
        }
        let log = if given("log") {
            None
        } else {
            let log = dir.with_extension("log");
            all.push(format!("log={}", log.display()));
            Some(log)
        };
        let options = all.join(",");
        let mut mount = HelperMount {
            dir,
            source: source.to_string(),
            options,
            log,
            fsd: None,
        };
        let out = mount.run_mount(via);
        mount.fsd = fsd_serving(&mount.dir).first().copied();
        if out.status.success() {
            let entry = mount.entry();
            assert!(
                entry.as_ref().is_some_and(MountEntry::is_rmemfs),
                "mount exited 0 but /proc/self/mountinfo has {entry:?} at {}",
                mount.dir.display()
            );
            assert!(
                mount.fsd.is_some(),
                "mount exited 0 but no fsd serves {}",
                mount.dir.display()
            );
            Ok(mount)
        } else {
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            Err(Box::new(MountFailure {
                mount,
                status: out.status,
                stderr,
            }))
        }
    }

    fn run_mount(&self, via: Via) -> Output {
        let mut cmd = Command::new("mount");
        match via {
            Via::Fstab => {
                let fstab = self.dir.with_extension("fstab");
                std::fs::write(
                    &fstab,
                    format!(
                        "# written by the rmemfs tests\n{} {} fuse.rmemfs {} 0 0\n",
                        fstab_escape(&self.source),
                        fstab_escape(&self.dir.to_string_lossy()),
                        self.options
                    ),
                )
                .expect("writing an fstab file");
                cmd.arg("--fstab").arg(&fstab).arg(&self.dir);
            }
            Via::CommandLine | Via::UnderJournal => {
                cmd.args(["-t", "fuse.rmemfs", &self.source])
                    .arg(&self.dir)
                    .args(["-o", &self.options]);
            }
        }
        if via != Via::UnderJournal {
            // fsd's stderr goes to the journal when the helper's is one: not here.
            cmd.env_remove("JOURNAL_STREAM");
            return run_within(&mut cmd, MOUNT_LIMIT, "mount");
        }
        let path = self.dir.with_extension("journal");
        let journal = std::fs::File::create(&path).expect("creating the stand-in journal");
        let meta = journal.metadata().expect("stat of the stand-in journal");
        cmd.env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(journal);
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("running `{}`: {e}", command_line(&cmd)));
        let status = poll_until(MOUNT_LIMIT, || child.try_wait().ok().flatten());
        let Some(status) = status else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`{}` did not finish within {MOUNT_LIMIT:?}",
                command_line(&cmd)
            );
        };
        Output {
            status,
            stdout: Vec::new(),
            stderr: std::fs::read(&path).unwrap_or_default(),
        }
    }

    /// What mount, the helper and fsd wrote to the stand-in journal of a mount made
    /// [`Via::UnderJournal`].
    pub fn journal_text(&self) -> String {
        std::fs::read_to_string(self.dir.with_extension("journal")).unwrap_or_default()
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    pub fn join(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.dir.join(rel)
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// The options mount(8) was given (with what the harness added).
    pub fn options(&self) -> &str {
        &self.options
    }

    /// The fstab file of a mount made [`Via::Fstab`].
    pub fn fstab_file(&self) -> Option<PathBuf> {
        let f = self.dir.with_extension("fstab");
        f.exists().then_some(f)
    }

    /// fsd's pid.
    pub fn fsd_pid(&self) -> u32 {
        self.fsd.expect("no fsd serves this mount")
    }

    /// fsd's command line after the program name.
    pub fn fsd_args(&self) -> Vec<String> {
        let pid = self.fsd_pid();
        let raw = std::fs::read(format!("/proc/{pid}/cmdline"))
            .unwrap_or_else(|e| panic!("reading fsd's command line (pid {pid}): {e}"));
        raw.split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .skip(1)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect()
    }

    /// What /proc/self/mountinfo has at the mount point.
    pub fn entry(&self) -> Option<MountEntry> {
        mount_entry(&self.dir)
    }

    /// The per-mount options in /proc/self/mountinfo (`rw,nosuid,nodev,relatime`).
    pub fn mount_options(&self) -> String {
        self.entry()
            .unwrap_or_else(|| panic!("{} is not in mountinfo", self.dir.display()))
            .options
    }

    /// fsd's log file (as the harness set it with `log=`).
    pub fn log_text(&self) -> String {
        self.log
            .as_ref()
            .map(|l| std::fs::read_to_string(l).unwrap_or_default())
            .unwrap_or_default()
    }

    /// `mount ARGS... DIR` (e.g. `-o remount,ro`): its exit status and stderr.
    pub fn mount_again(&self, args: &[&str]) -> (ExitStatus, String) {
        let mut cmd = Command::new("mount");
        cmd.args(args).arg(&self.dir);
        let out = run_within(&mut cmd, MOUNT_LIMIT, "mount");
        (
            out.status,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `umount TARGET` (the SOURCE or the directory); then the mount must be gone
    /// and fsd must exit within a bound.
    pub fn umount(mut self, target: &str) {
        let mut cmd = Command::new("umount");
        cmd.arg(target);
        let out = run_within(&mut cmd, MOUNT_LIMIT, "umount");
        assert!(
            out.status.success(),
            "umount {target} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            self.entry(),
            None,
            "after umount {target}, {} is still mounted",
            self.dir.display()
        );
        let pid = self.fsd.take().expect("no fsd serves this mount");
        let gone = poll_until(EXIT_LIMIT, || (!alive(pid)).then_some(()));
        if gone.is_none() {
            self.fsd = Some(pid);
            panic!("fsd (pid {pid}) still runs {EXIT_LIMIT:?} after its mount went away");
        }
    }
}

impl Drop for HelperMount {
    fn drop(&mut self) {
        if self.entry().is_some() {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
        if let Some(pid) = self.fsd.take() {
            stop(pid);
        }
        let _ = std::fs::remove_dir(&self.dir);
        let _ = std::fs::remove_file(self.dir.with_extension("fstab"));
        let _ = std::fs::remove_file(self.dir.with_extension("journal"));
        if let Some(log) = &self.log {
            let _ = std::fs::remove_file(log);
        }
    }
}

/// fstab separates fields by whitespace: spaces in them are written `\040`.
fn fstab_escape(s: &str) -> String {
    s.replace('\\', "\\134")
        .replace(' ', "\\040")
        .replace('\t', "\\011")
}

/// The pids of the fsd processes whose mount point is `dir` (`fsd DIR ...`).
pub fn fsd_serving(dir: &Path) -> Vec<u32> {
    let want = dir.to_string_lossy();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = procs
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let mut args = raw.split(|b| *b == 0).map(String::from_utf8_lossy);
            let prog = args.next().unwrap_or_default();
            (prog == "fsd" || prog.ends_with("/fsd")) && args.next().as_deref() == Some(&want)
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// True while process `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next().map(|st| st != "Z"))
        })
        .unwrap_or(false)
}

/// SIGTERM, a bounded wait, then SIGKILL: for an fsd the harness found, not started.
fn stop(pid: u32) {
    let Ok(p) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) on a pid of an fsd serving this test's mount.
    unsafe { libc::kill(p, libc::SIGTERM) };
    if poll_until(Duration::from_secs(10), || (!alive(pid)).then_some(())).is_none() {
        // SAFETY: as above.
        unsafe { libc::kill(p, libc::SIGKILL) };
    }
}
