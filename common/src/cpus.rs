//! How many CPUs this process may run on.

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
    // SAFETY: a zeroed cpu_set_t is a valid (empty) set; sched_getaffinity writes at
    // most its size into it; getpid cannot fail.
    let counted = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(
            libc::getpid(),
            std::mem::size_of::<libc::cpu_set_t>(),
            &mut set,
        ) == 0
        {
            Some(libc::CPU_COUNT(&set) as usize)
        } else {
            None
        }
    };
    counted
        .filter(|&n| n > 0)
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_pinned_to_one_cpu_still_counts_the_process_cpus() {
        let whole = main_thread_cpus().unwrap();
        let seen = std::thread::spawn(|| {
            // SAFETY: plain-data set; pins this thread only; sched_getcpu has no
            // preconditions.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(libc::sched_getcpu() as usize, &mut set);
                assert_eq!(
                    libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
                    0
                );
            }
            process_cpus()
        })
        .join()
        .unwrap();
        assert_eq!(seen, whole);
        assert!(whole >= 1);
    }
}
