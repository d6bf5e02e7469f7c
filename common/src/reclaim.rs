//! Keeping a daemon out of the memory reclaim it serves.
//!
//! A swap device on an rmemfs mount (a file on the mount behind a loop device) makes
//! fsd and the memnodes part of the kernel's reclaim path: swapping a page out is a
//! write to the mount, so fsd and memnode must be able to serve it while the
//! machine is short of memory, without needing reclaim themselves:
//!
//! - their memory is locked (`mlockall(MCL_CURRENT | MCL_FUTURE)`): none of their
//!   pages is swapped out (to the very device they serve), and every page they map
//!   later is faulted in at once, so a memnode's region and fsd's cache are resident
//!   from the start, not allocated under pressure, and memory the allocator frees
//!   and reuses on the write path stays resident;
//! - their threads are I/O flushers (`PR_SET_IO_FLUSHER`, Linux 5.6): the kernel
//!   then never makes their own allocations wait for I/O (which could be the swap-out
//!   they are serving) and throttles them by their own backing device only. The flag
//!   is per thread and inherited by threads created after it is set, so it is set
//!   before any other thread starts;
//! - the OOM killer picks them last (`oom_score_adj` -1000).
//!
//! Locking is required (it needs CAP_IPC_LOCK, or a memlock limit above the daemon's
//! size): a daemon that cannot lock its memory fails to start, naming why. The other
//! two need CAP_SYS_RESOURCE, which root lacks in some containers; without it each is
//! left as it is, "as low as allowed", and [`Protection::refused`] says so for the
//! daemon to warn.

use std::io;

/// `PR_SET_IO_FLUSHER` (linux/prctl.h), missing from some libc versions.
const PR_SET_IO_FLUSHER: libc::c_int = 57;

/// What [`protect_from_reclaim`] did and what the kernel refused.
#[derive(Debug, Default)]
pub struct Protection {
    pub done: Vec<&'static str>,
    pub refused: Vec<String>,
}

/// Locks the process's memory, now and from now on; then, where allowed, makes this
/// thread (and every thread it starts afterwards) an I/O flusher and sets the OOM
/// score adjustment to its minimum. Call before starting threads or mapping large
/// buffers. Fails only when the memory cannot be locked.
pub fn protect_from_reclaim() -> io::Result<Protection> {
    let mut p = Protection::default();
    // SAFETY: mlockall takes flags only and changes no memory contents.
    if unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) } != 0 {
        let e = io::Error::last_os_error();
        let hint = match e.raw_os_error() {
            Some(libc::EPERM) => " (needs root or CAP_IPC_LOCK)",
            Some(libc::ENOMEM) => {
                " (RLIMIT_MEMLOCK too low: raise it, e.g. LimitMEMLOCK=infinity in a unit)"
            }
            _ => "",
        };
        return Err(io::Error::new(e.kind(), format!("mlockall: {e}{hint}")));
    }
    p.done.push("memory locked (mlockall)");
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(PR_SET_IO_FLUSHER, 1 as libc::c_ulong, 0, 0, 0) } == 0 {
        p.done.push("threads are I/O flushers (PR_SET_IO_FLUSHER)");
    } else {
        p.refused
            .push(refusal("PR_SET_IO_FLUSHER", &io::Error::last_os_error()));
    }
    match std::fs::write("/proc/self/oom_score_adj", b"-1000") {
        Ok(()) => p.done.push("oom_score_adj -1000"),
        Err(e) => p.refused.push(refusal("oom_score_adj -1000", &e)),
    }
    Ok(p)
}

fn refusal(what: &str, e: &io::Error) -> String {
    let hint = match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => " (needs CAP_SYS_RESOURCE)",
        Some(libc::EINVAL) => " (needs Linux 5.6)",
        _ => "",
    };
    format!("{what}: {e}{hint}")
}

impl Protection {
    /// Logs what was done (info) and each refusal (warning), prefixed by `flag`.
    pub fn log(&self, flag: &str) {
        log::info!("{flag}: {}", self.done.join(", "));
        for r in &self.refused {
            log::warn!("{flag}: not set, left as it was: {r}");
        }
    }
}
