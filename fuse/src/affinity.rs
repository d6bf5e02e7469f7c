//! Which CPU a thread is pinned to, for the code that picks resources by CPU.
//!
//! The FUSE ring's serving threads are pinned to their queue's CPU (`ring/serve.rs`);
//! fsd's remote store then gives each CPU connections of its own
//! (`fsd/src/remote/link.rs`, through fsd's re-export `fsd::affinity`, so both ask
//! the same thread-local). Other threads are not pinned and take any connection.
//!
//! Here rather than beside the CPU count in `rmemfs-common` (`cpus.rs`): that crate
//! pulls in rdma-sys (its verbs fabric), which this crate's users, nullfs among
//! them, must not need.

use std::cell::Cell;

thread_local! {
    static PINNED: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Pins the calling thread to `cpu` and remembers it for [`pinned_cpu`]. False
/// (and nothing remembered) when the kernel refuses: a CPU outside the process's
/// affinity mask or offline.
pub fn pin_current_thread(cpu: usize) -> bool {
    if cpu >= libc::CPU_SETSIZE as usize {
        return false;
    }
    // SAFETY: cpu_set_t is plain data; CPU_SET stays in bounds for cpu < CPU_SETSIZE;
    // sched_setaffinity reads the set it is given, of the size given.
    let pinned = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    };
    if pinned {
        PINNED.with(|p| p.set(Some(cpu)));
    }
    pinned
}

/// The CPU the calling thread was pinned to by [`pin_current_thread`], if it was.
pub fn pinned_cpu() -> Option<usize> {
    PINNED.with(|p| p.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_thread_knows_its_cpu_and_others_have_none() {
        assert_eq!(pinned_cpu(), None, "the test thread was never pinned");
        // SAFETY: sched_getcpu has no preconditions.
        let here = unsafe { libc::sched_getcpu() };
        assert!(here >= 0);
        let here = here as usize;
        let seen = std::thread::spawn(move || {
            let ok = pin_current_thread(here);
            // SAFETY: as above.
            (ok, pinned_cpu(), unsafe { libc::sched_getcpu() })
        })
        .join()
        .unwrap();
        assert_eq!(seen, (true, Some(here), here as i32));
        assert_eq!(pinned_cpu(), None, "pinning is per thread");
    }

    #[test]
    fn a_refused_pin_is_not_remembered() {
        let seen = std::thread::spawn(|| (pin_current_thread(usize::MAX), pinned_cpu()))
            .join()
            .unwrap();
        assert_eq!(seen, (false, None));
    }
}
