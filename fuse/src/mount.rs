//! Mounting a fuser filesystem the way fsd does, and serving it until it is unmounted
//! or signalled. Kept apart from fsd's startup so the benchmark's null filesystem
//! (`tools/nullfs`) mounts with exactly the same options and shutdown.
//!
//! - `options.rs`: the generic mount options (`-o nosuid,ro,...`) and their flags;
//! - `kernel.rs`: the mount(2) root makes itself, so the kernel records the type
//!   `fuse.SUBTYPE`, the source and every flag asked for;
//! - here: what a mount is asked for ([`MountSpec`]), mounting it (as root through
//!   `kernel.rs`, as another user through fuser and fusermount3), and serving it.

mod kernel;
pub mod options;

pub use options::{Atime, MountOptions, UnknownMountOption};

use crate::ring::{FuseTransport, RingLauncher};
use crate::{Classic, FuseOps, MAX_WRITE};
use anyhow::Context;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// What a mount is asked for.
#[derive(Debug, Clone)]
pub struct MountSpec {
    /// What `/proc/mounts` shows as the device (the mount's source).
    pub fsname: String,
    /// The type is `fuse.SUBTYPE`.
    pub subtype: String,
    pub options: MountOptions,
    /// Request loops on cloned /dev/fuse descriptors.
    pub threads: usize,
}

impl MountSpec {
    /// `name` as fsname and subtype, the default options (`nosuid,nodev`, as
    /// libfuse), `threads` request loops.
    pub fn new(name: &str, threads: usize) -> MountSpec {
        MountSpec {
            fsname: name.into(),
            subtype: name.into(),
            options: MountOptions::default(),
            threads,
        }
    }

    /// fuser's settings: the request loops, and for a mount through fusermount3
    /// (another user than root) the options in fuser's terms.
    fn config(&self, root: bool) -> fuser::Config {
        use fuser::MountOption as M;
        let mut config = fuser::Config::default();
        let o = &self.options;
        let flag = |on: bool, yes: M, no: M| if on { yes } else { no };
        config.mount_options = vec![
            M::FSName(self.fsname.clone()),
            M::Subtype(self.subtype.clone()),
            M::DefaultPermissions,
            flag(o.read_only, M::RO, M::RW),
            flag(o.suid, M::Suid, M::NoSuid),
            flag(o.dev, M::Dev, M::NoDev),
            flag(o.exec, M::Exec, M::NoExec),
        ];
        // fusermount3 knows these words; fuser has no flags for them.
        config.mount_options.push(match o.atime {
            Atime::Relatime => M::CUSTOM("relatime".into()),
            Atime::Strict => M::CUSTOM("strictatime".into()),
            Atime::Never => M::NoAtime,
        });
        if o.nodiratime {
            config.mount_options.push(M::CUSTOM("nodiratime".into()));
        }
        config.acl = self.acl(root);
        config.n_threads = Some(self.threads);
        config.clone_fd = true;
        config
    }

    /// Root's mounts are open to every user (the kernel checks permissions), as on a
    /// local filesystem; another user's only with `allow_other`.
    fn acl(&self, root: bool) -> fuser::SessionACL {
        if root || self.options.allow_other {
            fuser::SessionACL::All
        } else {
            fuser::SessionACL::Owner
        }
    }
}

/// A command line's `-o OPTIONS`, checked (a clap value parser).
pub fn options_arg(s: &str) -> Result<String, String> {
    MountOptions::parse(s)
        .map(|_| s.to_string())
        .map_err(|e| e.to_string())
}

/// A command line's fsname, checked (a clap value parser): mount(2) takes a C string.
pub fn fsname_arg(s: &str) -> Result<String, String> {
    if s.is_empty() || s.contains('\0') {
        return Err("an fsname is a non-empty string without NUL bytes".into());
    }
    Ok(s.to_string())
}

/// Unmounts a session's mount, whichever way it was made.
enum Unmounter {
    /// Made by fuser (through fusermount3).
    Fuser(fuser::SessionUnmounter),
    /// Made by `kernel::mount`: the canonical mountpoint and a duplicate of the
    /// connection's descriptor, to tell whether the mount is still this one.
    Kernel(PathBuf, OwnedFd),
}

impl Unmounter {
    fn unmount(&mut self) -> std::io::Result<()> {
        match self {
            Unmounter::Fuser(u) => u.unmount(),
            Unmounter::Kernel(path, device) => kernel::unmount(path, device.as_fd()),
        }
    }
}

/// Detaches the mount when fuser's own unmount fails (e.g. busy): the kernel lets
/// go of it once the last user does, and the session ends now.
fn lazy_unmount(mountpoint: &Path) {
    let status = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg("-z")
        .arg(mountpoint)
        .status();
    if !matches!(status, Ok(s) if s.success()) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(mountpoint)
            .status();
    }
}

/// How a mount is served: the transport asked for and the threads serving it.
#[derive(Clone, Copy, Debug)]
pub struct Serving {
    pub transport: FuseTransport,
    /// Request loops of the classic transport.
    pub threads: usize,
    /// Serving threads per CPU queue of the ring.
    pub ring_threads: usize,
}

/// The ring transport, when `serving` asks for it and this host can give it; logs
/// the one line that says which transport serves and why when it cannot. An
/// unavailable ring fails only a mount that insists on it.
fn prepare_ring<O: FuseOps>(
    ops: &Arc<O>,
    serving: Serving,
) -> anyhow::Result<Option<RingLauncher>> {
    let forced = match serving.transport {
        FuseTransport::Classic => {
            log::info!("FUSE transport: /dev/fuse (--fuse-transport classic)");
            return Ok(None);
        }
        FuseTransport::IoUring => true,
        FuseTransport::Auto => false,
    };
    match RingLauncher::prepare(
        ops.clone(),
        serving.ring_threads,
        MAX_WRITE as usize,
        forced,
    ) {
        Ok(ring) => Ok(Some(ring)),
        Err(e) if forced => Err(e.context("--fuse-transport io-uring")),
        Err(e) => {
            log::info!("FUSE transport: /dev/fuse: {e:#}");
            Ok(None)
        }
    }
}

/// Mounts `fs` and answers FUSE_INIT. As root through mount(2) (`kernel.rs`), so
/// the kernel gets the type, source and flags `spec` asks for; as another user
/// through fuser, which asks fusermount3.
fn open_session<O: FuseOps>(
    fs: Classic<O>,
    mountpoint: &Path,
    spec: &MountSpec,
) -> anyhow::Result<(fuser::Session<Classic<O>>, Unmounter)> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let config = spec.config(root);
    if !root {
        let mut session = fuser::Session::new(fs, mountpoint, &config)?;
        let unmounter = Unmounter::Fuser(session.unmount_callable());
        return Ok((session, unmounter));
    }
    // Resolved before mounting: afterwards resolving it would ask the mount.
    let canonical = std::fs::canonicalize(mountpoint)
        .with_context(|| format!("resolving {}", mountpoint.display()))?;
    let device = kernel::mount(
        &canonical,
        &spec.fsname,
        &spec.subtype,
        &spec.options,
        root || spec.options.allow_other,
    )
    .context("mount(2)")?;
    let watch = device
        .try_clone()
        .context("duplicating the /dev/fuse descriptor")?;
    match fuser::Session::from_fd(fs, device, spec.acl(root), config) {
        Ok(session) => Ok((session, Unmounter::Kernel(canonical, watch))),
        Err(e) => {
            // Nothing can have used a mount that never answered FUSE_INIT.
            kernel::detach(&canonical, &watch);
            Err(anyhow::Error::new(e).context("answering FUSE_INIT"))
        }
    }
}

/// A mounted filesystem, not yet serving, whose SIGINT/SIGTERM unmount it.
pub struct Mounted<O: FuseOps> {
    session: fuser::Session<Classic<O>>,
    session_over: Arc<AtomicBool>,
    unmount_asked: Arc<AtomicBool>,
    signal_handle: signal_hook::iterator::Handle,
    signal_thread: JoinHandle<()>,
}

impl<O: FuseOps> Mounted<O> {
    /// Mounts `ops` on `mountpoint` as `spec` asks, served as `serving` asks, and
    /// prints "`who` mounted MOUNTPOINT" on stdout. The first SIGINT or SIGTERM
    /// unmounts (lazily when busy: the session then ends when the last open file
    /// closes); a second one runs `last_resort` and exits.
    pub fn new(
        ops: Arc<O>,
        mountpoint: &Path,
        spec: &MountSpec,
        serving: Serving,
        who: &str,
        last_resort: impl FnOnce() + Send + 'static,
    ) -> anyhow::Result<Mounted<O>> {
        // Handlers go in before mounting: a SIGTERM that comes as soon as the mount
        // is visible (a script that mounts and stops at once) is queued for the
        // thread below instead of killing the process with the default action and
        // leaving the mount behind.
        let mut signals = signal_hook::iterator::Signals::new([
            signal_hook::consts::SIGINT,
            signal_hook::consts::SIGTERM,
        ])
        .context("installing signal handlers")?;
        let ring = prepare_ring(&ops, serving)?;
        let (session, mut unmounter) =
            open_session(Classic::new(ops.clone(), ring.clone()), mountpoint, spec)
                .with_context(|| format!("mounting on {}", mountpoint.display()))?;
        ops.attach_notifier(session.notifier());
        if let Some(ring) = &ring {
            let fd = session
                .as_fd()
                .try_clone_to_owned()
                .context("duplicating the /dev/fuse descriptor for the ring")?;
            ring.set_device(fd);
        }
        log::info!(
            "mounted {} on {} as fuse.{} ({})",
            spec.fsname,
            mountpoint.display(),
            spec.subtype,
            spec.options.to_list()
        );
        // Whoever started fsd may have stopped reading (a mount helper that gave
        // up): the line is then lost, which must not kill fsd as println! would.
        let mut stdout = std::io::stdout();
        let _ = writeln!(stdout, "{who} mounted {}", mountpoint.display());
        let _ = stdout.flush();

        let session_over = Arc::new(AtomicBool::new(false));
        let unmount_asked = Arc::new(AtomicBool::new(false));
        let signal_handle = signals.handle();
        let mountpoint: PathBuf = mountpoint.into();
        let signal_thread = {
            let session_over = session_over.clone();
            let unmount_asked = unmount_asked.clone();
            std::thread::spawn(move || {
                let mut signals = signals.forever();
                let Some(sig) = signals.next() else { return };
                if session_over.load(Ordering::SeqCst) {
                    return;
                }
                log::info!("signal {sig}: unmounting {}", mountpoint.display());
                unmount_asked.store(true, Ordering::SeqCst);
                if let Err(e) = unmounter.unmount() {
                    log::warn!(
                        "unmount failed ({e}); detached lazily, serving open files until \
                         they close (signal again to exit now)"
                    );
                    lazy_unmount(&mountpoint);
                }
                if signals.next().is_some() && !session_over.load(Ordering::SeqCst) {
                    log::warn!("second signal: exiting");
                    last_resort();
                    std::process::exit(0);
                }
            })
        };
        Ok(Mounted {
            session,
            session_over,
            unmount_asked,
            signal_handle,
            signal_thread,
        })
    }

    /// Serves requests until the filesystem is unmounted.
    pub fn run(self) -> anyhow::Result<()> {
        let result = match self.session.run() {
            // The kernel tears a detached mount's connection down when its last user
            // lets go, and may report that to the reader as an abort rather than as
            // the usual ENODEV: after an unmount fsd asked for, that is the end it
            // was waiting for. An abort nobody asked for stays an error.
            Err(e)
                if e.raw_os_error() == Some(libc::ECONNABORTED)
                    && self.unmount_asked.load(Ordering::SeqCst) =>
            {
                log::info!("the kernel ended the FUSE connection after the unmount");
                Ok(())
            }
            other => other,
        };
        self.session_over.store(true, Ordering::SeqCst);
        self.signal_handle.close();
        let _ = self.signal_thread.join();
        result.context("FUSE session")
    }
}
