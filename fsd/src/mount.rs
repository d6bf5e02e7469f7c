//! Mounting a fuser filesystem the way fsd does, and serving it until it is unmounted
//! or signalled. Kept apart from fsd's startup so the benchmark's null filesystem
//! (`tools/nullfs`) mounts with exactly the same options and shutdown.

use crate::fuse::ring::{FuseTransport, RingLauncher};
use crate::fuse::{Classic, FuseOps, MAX_WRITE};
use anyhow::Context;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// fsd's mount: `name` as fsname and subtype, permissions checked by the kernel,
/// `threads` request loops on cloned /dev/fuse descriptors; when mounted by root,
/// open to all users with setuid bits and device nodes working, as on a local
/// filesystem (FUSE mounts default to nosuid,nodev).
pub fn config(name: &str, threads: usize, root: bool) -> fuser::Config {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName(name.into()),
        fuser::MountOption::Subtype(name.into()),
        fuser::MountOption::DefaultPermissions,
    ];
    if root {
        config.acl = fuser::SessionACL::All;
        config
            .mount_options
            .extend([fuser::MountOption::Suid, fuser::MountOption::Dev]);
    }
    config.n_threads = Some(threads);
    config.clone_fd = true;
    config
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
    /// Request loops of the classic transport, and serving threads of the ring.
    pub threads: usize,
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
    match RingLauncher::prepare(ops.clone(), serving.threads, MAX_WRITE as usize, forced) {
        Ok(ring) => Ok(Some(ring)),
        Err(e) if forced => Err(e.context("--fuse-transport io-uring")),
        Err(e) => {
            log::info!("FUSE transport: /dev/fuse: {e:#}");
            Ok(None)
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
    /// Mounts `ops` on `mountpoint`, served as `serving` asks, and prints "`who`
    /// mounted MOUNTPOINT" on stdout. The first SIGINT or SIGTERM unmounts (lazily
    /// when busy: the session then ends when the last open file closes); a second
    /// one runs `last_resort` and exits.
    pub fn new(
        ops: Arc<O>,
        mountpoint: &Path,
        config: &fuser::Config,
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
        let mut session = fuser::Session::new(Classic::new(ops, ring.clone()), mountpoint, config)
            .with_context(|| format!("mounting on {}", mountpoint.display()))?;
        if let Some(ring) = &ring {
            let fd = session
                .as_fd()
                .try_clone_to_owned()
                .context("duplicating the /dev/fuse descriptor for the ring")?;
            ring.set_device(fd);
        }
        let mut unmounter = session.unmount_callable();
        println!("{who} mounted {}", mountpoint.display());
        let _ = std::io::stdout().flush();

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
