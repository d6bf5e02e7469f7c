//! CPUs and affinity, the one place rmemfs asks the kernel about them: how many CPUs
//! the process may run on, sets of CPUs (`cpu_set_t`), and pinning a thread to one.
//!
//! Threads pinned with [`pin_current_thread`] remember their CPU ([`pinned_cpu`]) for
//! the code that picks resources by CPU: the FUSE ring's serving threads are pinned
//! to their queue's CPU (`fuse/src/ring/serve.rs`), and fsd's remote store then gives
//! each CPU connections of its own (`fsd/src/remote/link.rs`). Other threads are not
//! pinned and take any connection. The tcp fabric's memnode threads follow their
//! connection's packets with [`CpuSet`] (`fabric/tcp/placement.rs`).
//!
//! Needs nothing but libc, so crates that must not pull in the verbs fabric (the FUSE
//! crate, and nullfs through it) use it with this crate's default features off.

use std::cell::Cell;
use std::sync::OnceLock;

/// CPUs this process may run on: those its main thread may run on, counted once.
///
/// Not `std::thread::available_parallelism`, which answers for the calling thread:
/// asked first from a thread pinned to one CPU (fsd's FUSE ring threads), it said 1
/// for the whole process. It also reads cgroup files on every call, too slow for the
/// per-request paths that ask.
pub fn process_cpus() -> usize {
    static CPUS: OnceLock<usize> = OnceLock::new();
    *CPUS.get_or_init(|| main_thread_cpus().unwrap_or(1))
}

/// The CPUs in the main thread's affinity mask (the thread whose id is the process
/// id), or `available_parallelism` where that cannot be read.
fn main_thread_cpus() -> Option<usize> {
    // SAFETY: getpid cannot fail.
    let main = unsafe { libc::getpid() };
    CpuSet::of_thread(main)
        .map(|set| set.count())
        .filter(|&n| n > 0)
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
}

/// A set of CPUs (`cpu_set_t`).
#[derive(Clone)]
pub struct CpuSet(libc::cpu_set_t);

impl CpuSet {
    /// The CPUs the calling thread may run on; `None` when the kernel will not say.
    pub fn of_current_thread() -> Option<CpuSet> {
        CpuSet::of_thread(0)
    }

    /// The CPUs thread `tid` (0: the caller) may run on.
    fn of_thread(tid: libc::pid_t) -> Option<CpuSet> {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity writes
        // at most its size into it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            (libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0)
                .then_some(CpuSet(set))
        }
    }

    /// The set of `cpu` alone (empty for a CPU beyond what a set holds).
    pub fn only(cpu: usize) -> CpuSet {
        // SAFETY: a zeroed cpu_set_t is a valid empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        if cpu < libc::CPU_SETSIZE as usize {
            // SAFETY: cpu < CPU_SETSIZE, so the bit is inside the set.
            unsafe { libc::CPU_SET(cpu, &mut set) };
        }
        CpuSet(set)
    }

    /// The set with `cpu` added (unchanged for a CPU beyond what a set holds).
    pub fn with(mut self, cpu: usize) -> CpuSet {
        if cpu < libc::CPU_SETSIZE as usize {
            // SAFETY: cpu < CPU_SETSIZE, so the bit is inside the set.
            unsafe { libc::CPU_SET(cpu, &mut self.0) };
        }
        self
    }

    pub fn contains(&self, cpu: usize) -> bool {
        // SAFETY: CPU_ISSET reads one bit inside the set for cpu < CPU_SETSIZE.
        cpu < libc::CPU_SETSIZE as usize && unsafe { libc::CPU_ISSET(cpu, &self.0) }
    }

    /// How many CPUs the set holds.
    pub fn count(&self) -> usize {
        // SAFETY: CPU_COUNT reads the set, a valid cpu_set_t.
        unsafe { libc::CPU_COUNT(&self.0) as usize }
    }

    /// Makes the calling thread run on these CPUs only; false when the kernel refuses
    /// (an empty set, CPUs outside the process's cpuset, or offline).
    pub fn apply(&self) -> bool {
        // SAFETY: sched_setaffinity reads the set it is given, of the size given.
        unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.0) == 0 }
    }
}

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
    let pinned = CpuSet::only(cpu).apply();
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

    fn current_cpu() -> usize {
        // SAFETY: sched_getcpu has no preconditions.
        let here = unsafe { libc::sched_getcpu() };
        assert!(here >= 0);
        here as usize
    }

    #[test]
    fn a_thread_pinned_to_one_cpu_still_counts_the_process_cpus() {
        let whole = main_thread_cpus().unwrap();
        let seen = std::thread::spawn(|| {
            assert!(pin_current_thread(current_cpu()));
            process_cpus()
        })
        .join()
        .unwrap();
        assert_eq!(seen, whole);
        assert!(whole >= 1);
    }

    #[test]
    fn a_pinned_thread_knows_its_cpu_and_others_have_none() {
        assert_eq!(pinned_cpu(), None, "the test thread was never pinned");
        let here = current_cpu();
        let seen = std::thread::spawn(move || {
            let ok = pin_current_thread(here);
            (ok, pinned_cpu(), current_cpu())
        })
        .join()
        .unwrap();
        assert_eq!(seen, (true, Some(here), here));
        assert_eq!(pinned_cpu(), None, "pinning is per thread");
    }

    #[test]
    fn a_refused_pin_is_not_remembered() {
        let seen = std::thread::spawn(|| (pin_current_thread(usize::MAX), pinned_cpu()))
            .join()
            .unwrap();
        assert_eq!(seen, (false, None));
    }

    #[test]
    fn a_set_of_one_cpu() {
        let one = CpuSet::only(1);
        assert!(one.contains(1) && !one.contains(0) && !one.contains(usize::MAX));
        assert_eq!(one.count(), 1);
        assert_eq!(CpuSet::only(usize::MAX).count(), 0);
        assert_eq!(one.with(3).with(usize::MAX).count(), 2);
        let mine = CpuSet::of_current_thread().unwrap();
        assert!(mine.contains(current_cpu()));
    }
}
