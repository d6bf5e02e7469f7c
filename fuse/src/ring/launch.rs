//! Launching the ring transport of one mount: the serving threads, each with its
//! ring and entries made before mounting (so fsd never promises a ring it cannot
//! build), the go they wait for (the kernel's yes at FUSE_INIT and the /dev/fuse
//! descriptor), and waiting for them to end once the connection ends.

use super::entry::ENTRIES_PER_THREAD;
use super::serve::serve_queue;
use crate::ops::FuseOps;
use anyhow::{anyhow, bail, Context};
use fuser::{InitFlags, KernelConfig};
use rmemfs_common::sync::{lock, wait, wait_timeout};
use std::os::fd::OwnedFd;
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

const ENABLE_PARAM: &str = "/sys/module/fuse/parameters/enable_uring";
/// Ring entries of all queues together, at most: each holds a payload buffer as
/// large as the largest request, which stays resident once a large request used it.
const MAX_RING_ENTRIES: usize = 64;
/// Serving threads of all queues together, at most (each holds a payload buffer
/// as large as the largest request).
const MAX_RING_THREADS: usize = 64;
/// How long stopping waits for the threads to see the connection end.
const STOP_PATIENCE: Duration = Duration::from_secs(5);

/// The kernel's number of FUSE queues: one per possible CPU (`nr_cpu_ids`), which
/// `/sys/devices/system/cpu/possible` ("0-1", "0-3,6") tells by its highest id.
fn possible_cpus() -> anyhow::Result<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .context("reading /sys/devices/system/cpu/possible")?;
    let last = text
        .trim()
        .rsplit([',', '-'])
        .next()
        .and_then(|s| s.parse::<usize>().ok())
        .ok_or_else(|| anyhow!("cannot parse possible CPUs {text:?}"))?;
    Ok(last + 1)
}

/// Why the kernel would not serve FUSE over io_uring, from its module parameter.
fn kernel_refusal() -> Option<String> {
    match std::fs::read_to_string(ENABLE_PARAM) {
        Err(_) => Some(format!(
            "this kernel has no FUSE over io_uring ({ENABLE_PARAM} is missing: \
             CONFIG_FUSE_IO_URING, Linux 6.14)"
        )),
        Ok(v) if v.trim() != "Y" => Some(format!(
            "FUSE over io_uring is off ({ENABLE_PARAM} is {}; as root: echo Y > {ENABLE_PARAM})",
            v.trim()
        )),
        Ok(_) => None,
    }
}

/// What the serving threads wait for: the kernel's yes at FUSE_INIT and the
/// /dev/fuse descriptor, which fuser hands over only once FUSE_INIT is done (its
/// Session::new performs the handshake).
#[derive(Default)]
struct Go {
    negotiated: bool,
    device: Option<Arc<OwnedFd>>,
    cancelled: bool,
}

/// What a mount's launcher and its serving threads share.
pub(super) struct Shared {
    go: Mutex<Go>,
    go_cv: Condvar,
    /// Serving threads still running, and a way to wait for none.
    alive: Mutex<usize>,
    alive_cv: Condvar,
    forced: bool,
    describe: String,
}

impl Shared {
    /// Waits for the go: the /dev/fuse descriptor once the kernel said yes at
    /// FUSE_INIT and fuser handed it over; None when the ring was called off.
    pub(super) fn wait_for_go(&self) -> Option<Arc<OwnedFd>> {
        let mut go = lock(&self.go);
        loop {
            if go.cancelled {
                return None;
            }
            if let (true, Some(fd)) = (go.negotiated, &go.device) {
                return Some(fd.clone());
            }
            go = wait(&self.go_cv, go);
        }
    }
}

/// The ring transport of one mount, from before mounting until its threads end.
#[derive(Clone)]
pub struct RingLauncher {
    shared: Arc<Shared>,
}

impl RingLauncher {
    /// Makes the rings and buffers for `threads` serving threads on each of the
    /// kernel's per-CPU queues (fewer when that would pass [`MAX_RING_THREADS`], at least
    /// one), or says why it cannot. The threads wait for
    /// [`negotiate`](Self::negotiate).
    pub fn prepare<O: FuseOps>(
        ops: Arc<O>,
        threads: usize,
        payload_len: usize,
        forced: bool,
    ) -> anyhow::Result<RingLauncher> {
        if let Some(why) = kernel_refusal() {
            bail!(why);
        }
        let queues = possible_cpus()?;
        if queues > u16::MAX as usize {
            bail!("{queues} CPUs: more FUSE queues than a ring command can name");
        }
        // Each queue gets `threads` entries (a request waits for a free entry of its
        // CPU's queue, however idle the others), within a bound on all of them.
        let per_queue = threads.min(MAX_RING_THREADS / queues).max(1);
        let entries = (MAX_RING_ENTRIES / (queues * per_queue)).clamp(1, ENTRIES_PER_THREAD);
        let shared = Arc::new(Shared {
            go: Mutex::new(Go::default()),
            go_cv: Condvar::new(),
            alive: Mutex::new(0),
            alive_cv: Condvar::new(),
            forced,
            describe: format!("{queues} queues x {per_queue} threads x {entries} entries"),
        });
        let (ready_tx, ready_rx) = mpsc::channel();
        for t in 0..queues * per_queue {
            let qid = (t % queues) as u16;
            let (ops, mine, ready_tx) = (ops.clone(), shared.clone(), ready_tx.clone());
            *lock(&shared.alive) += 1;
            let spawned = std::thread::Builder::new()
                .name(format!("fuse-ring-{qid}"))
                .spawn(move || {
                    serve_queue(&*ops, qid, entries, payload_len, &mine, ready_tx);
                    let mut alive = lock(&mine.alive);
                    *alive -= 1;
                    mine.alive_cv.notify_all();
                });
            if let Err(e) = spawned {
                // The threads already started must not wait for a go that never comes.
                *lock(&shared.alive) -= 1;
                RingLauncher { shared }.cancel();
                return Err(e).context("starting a FUSE ring thread");
            }
        }
        drop(ready_tx);
        let launcher = RingLauncher { shared };
        for r in ready_rx.iter().take(queues * per_queue) {
            if let Err(e) = r {
                launcher.cancel();
                return Err(e);
            }
        }
        Ok(launcher)
    }

    /// The mount's /dev/fuse descriptor, which ring commands go to.
    pub fn set_device(&self, fd: OwnedFd) {
        lock(&self.shared.go).device = Some(Arc::new(fd));
        self.shared.go_cv.notify_all();
    }

    /// At FUSE_INIT: asks for FUSE_OVER_IO_URING and lets the threads register once
    /// the kernel has it; logs which transport serves the mount and why.
    pub fn negotiate(&self, config: &mut KernelConfig) {
        let offered = config
            .add_capabilities(InitFlags::FUSE_OVER_IO_URING)
            .is_ok();
        if offered {
            log::info!(
                "FUSE transport: io_uring ({}), the kernel offered it at FUSE_INIT",
                self.shared.describe
            );
            lock(&self.shared.go).negotiated = true;
            self.shared.go_cv.notify_all();
        } else {
            let why = "the kernel did not offer FUSE_OVER_IO_URING at FUSE_INIT";
            if self.shared.forced {
                log::error!("--fuse-transport io-uring: {why}; requests go to /dev/fuse");
            } else {
                log::info!("FUSE transport: /dev/fuse: {why}");
            }
            self.cancel();
        }
    }

    fn cancel(&self) {
        lock(&self.shared.go).cancelled = true;
        self.shared.go_cv.notify_all();
    }

    /// Waits (a while) for the threads to end, after the connection ended.
    pub fn stop(&self) {
        self.cancel();
        let deadline = Instant::now() + STOP_PATIENCE;
        let mut alive = lock(&self.shared.alive);
        while *alive > 0 {
            let now = Instant::now();
            if now >= deadline {
                log::warn!("{} FUSE ring threads still running at shutdown", *alive);
                return;
            }
            alive = wait_timeout(&self.shared.alive_cv, alive, deadline - now).0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn possible_cpus_reads_the_highest_cpu_id() {
        assert!(possible_cpus().unwrap() >= 1);
    }
}
