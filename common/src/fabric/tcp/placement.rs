//! Which CPUs a memnode's connection thread runs on.
//!
//! While the memnode is crowded (requests of several connections at once, see
//! [`super::direct::PollSlots::request_on`]), a connection's thread runs on the CPU
//! where the kernel receives that connection's packets (`SO_INCOMING_CPU`): the CPU of
//! the client thread that sends them on loopback, of the NIC queue that takes them
//! otherwise. Its wakeups and the socket's buffers then stay on that CPU, where on
//! any other each wakeup is an interrupt across CPUs (a costly one in a VM) and the
//! scheduler may stack the busy threads of several connections on one CPU. fsd's
//! FUSE ring threads, one per CPU, each send on connections of their own, so each
//! CPU serves its own requests end to end, and the slowest runs gain most
//! (docs/benchmarks-history.md, "Memnode connection threads on their packets'
//! CPU").
//!
//! Otherwise (one busy connection, or none) the thread may run on every CPU the
//! process may: a lone client's connection thread polls for its next request
//! (`direct::poll_readable`), which only pays on a CPU of its own; pinned beside
//! its client, it and the client take turns on one CPU and a lone job's reads fall
//! far (same entry).
//!
//! The CPU is looked up every [`RECHECK_EVERY`] requests (one `getsockopt`), and
//! the thread moved only when it changes. A CPU outside the process's own mask (a
//! memnode under `taskset` or a cpuset) is never taken.

use crate::cpus::CpuSet;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Requests between two looks at where the connection's packets arrive.
pub const RECHECK_EVERY: u32 = 64;

/// Where a connection thread should run: on `incoming` when the memnode is crowded
/// and that CPU is one the process may use, else anywhere (`None`).
pub fn target(crowded: bool, incoming: Option<usize>, allowed: &CpuSet) -> Option<usize> {
    incoming.filter(|&cpu| crowded && allowed.contains(cpu))
}

/// The CPU on which the kernel last received packets of the socket `fd`, if known.
fn incoming_cpu(fd: BorrowedFd<'_>) -> Option<usize> {
    let mut cpu: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a valid socket; the kernel writes at most `len` bytes into `cpu`.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_INCOMING_CPU,
            (&mut cpu as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    (r == 0)
        .then_some(cpu)
        .and_then(|c| usize::try_from(c).ok())
}

/// One connection thread's placement, kept by the thread itself.
pub struct Placement {
    /// What the thread could run on when it started; `None` turns placement off.
    home: Option<CpuSet>,
    /// The CPU it is pinned to now, if any.
    pinned: Option<usize>,
    requests: u32,
}

impl Placement {
    /// For the calling thread, as it is placed now.
    pub fn of_current_thread() -> Placement {
        Placement {
            home: CpuSet::of_current_thread(),
            pinned: None,
            requests: 0,
        }
    }

    /// Called for each request of the connection on `fd`: every [`RECHECK_EVERY`]
    /// requests, asks `crowded` and moves the thread to where [`target`] says.
    pub fn after_request(&mut self, fd: BorrowedFd<'_>, crowded: impl FnOnce() -> bool) {
        self.requests = self.requests.wrapping_add(1);
        if self.requests % RECHECK_EVERY != 1 {
            return;
        }
        let Some(home) = &self.home else { return };
        let crowded = crowded();
        let incoming = if crowded { incoming_cpu(fd) } else { None };
        let want = target(crowded, incoming, home);
        if want == self.pinned {
            return;
        }
        let moved = match want {
            Some(cpu) => CpuSet::only(cpu).apply(),
            None => home.apply(),
        };
        if moved {
            self.pinned = want;
        } else {
            // A CPU taken offline, a cpuset changed under us: stop placing.
            log::debug!("connection thread placement off: sched_setaffinity refused");
            self.home = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(cpus: &[usize]) -> CpuSet {
        cpus[1..]
            .iter()
            .fold(CpuSet::only(cpus[0]), |s, &c| s.with(c))
    }

    #[test]
    fn crowded_takes_the_incoming_cpu_if_the_process_may_use_it() {
        let allowed = set(&[0, 1, 3]);
        assert_eq!(target(true, Some(1), &allowed), Some(1));
        assert_eq!(target(true, Some(2), &allowed), None, "outside the mask");
        assert_eq!(target(true, None, &allowed), None, "unknown CPU");
        assert_eq!(target(false, Some(1), &allowed), None, "not crowded");
    }

    #[test]
    fn a_set_holds_what_was_put_in_and_nothing_beyond_its_size() {
        let s = set(&[2, 5]);
        assert!(s.contains(2) && s.contains(5));
        assert!(!s.contains(0) && !s.contains(3));
        assert!(!CpuSet::only(usize::MAX).contains(usize::MAX));
    }

    #[test]
    fn a_connection_thread_pins_while_crowded_and_goes_home_after() {
        use std::net::{TcpListener, TcpStream};
        use std::os::fd::AsFd;
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server, _) = l.accept().unwrap();
        std::thread::spawn(move || {
            use std::io::{Read, Write};
            client.write_all(b"x").unwrap();
            let mut b = [0u8; 1];
            let mut s = server.try_clone().unwrap();
            s.read_exact(&mut b).unwrap();
            let home = CpuSet::of_current_thread().unwrap();
            let mut p = Placement::of_current_thread();
            p.after_request(server.as_fd(), || true);
            let incoming = incoming_cpu(server.as_fd()).expect("loopback names the CPU");
            assert_eq!(p.pinned, Some(incoming));
            let now = CpuSet::of_current_thread().unwrap();
            assert!(now.contains(incoming));
            assert_eq!(now.count(), 1, "pinned to one CPU");
            // Not looked at again until RECHECK_EVERY more requests.
            for _ in 1..RECHECK_EVERY {
                p.after_request(server.as_fd(), || false);
            }
            assert_eq!(p.pinned, Some(incoming));
            p.after_request(server.as_fd(), || false);
            assert_eq!(p.pinned, None, "back home once not crowded");
            let back = CpuSet::of_current_thread().unwrap();
            assert_eq!(back.count(), home.count());
        })
        .join()
        .unwrap();
    }
}
