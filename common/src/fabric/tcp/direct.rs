//! Moving payloads between a socket and registered memory with no staging copy, the
//! way a NIC DMAs them: the kernel copies straight into (WRITE) or out of (READ) the
//! region.
//!
//! The registry lets memory be touched only while its read lock is held, and a
//! holder must not block (a deregistration waits for it). So these calls never wait:
//! they move what the socket can take or give now and say how much that was; the
//! caller waits for the socket with the lock released, and checks the access again
//! before going on.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Receives up to `len` bytes into `dst` without waiting. Ok(0) means nothing is
/// there yet; an end of stream is an error (a frame was cut short).
///
/// # Safety
/// `dst` must be valid for writes of `len` bytes for the duration of the call.
pub unsafe fn recv_now(fd: BorrowedFd<'_>, dst: *mut u8, len: usize) -> io::Result<usize> {
    if len == 0 {
        return Ok(0);
    }
    loop {
        // SAFETY: the caller promises `dst` is writable for `len` bytes.
        let n = unsafe { libc::recv(fd.as_raw_fd(), dst.cast(), len, libc::MSG_DONTWAIT) };
        match n {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n if n > 0 => return Ok(n as usize),
            _ => match io::Error::last_os_error() {
                e if e.kind() == io::ErrorKind::Interrupted => continue,
                e if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
                e => return Err(e),
            },
        }
    }
}

/// Sends as much of `head` followed by the `len` bytes at `tail` as the socket takes
/// now, without waiting; Ok(0) when it takes nothing. `tail` is a raw pointer so no
/// reference to memory a peer may be writing is ever formed.
///
/// # Safety
/// `tail` must be valid for reads of `len` bytes for the duration of the call.
pub unsafe fn send_now(
    fd: BorrowedFd<'_>,
    head: &[&[u8]],
    tail: *const u8,
    len: usize,
) -> io::Result<usize> {
    let mut iov: Vec<libc::iovec> = head
        .iter()
        .map(|p| libc::iovec {
            iov_base: p.as_ptr() as *mut libc::c_void,
            iov_len: p.len(),
        })
        .collect();
    iov.push(libc::iovec {
        iov_base: tail as *mut libc::c_void,
        iov_len: len,
    });
    // SAFETY: a zeroed msghdr is valid (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len() as _;
    loop {
        // SAFETY: `msg` points at `iov`, whose entries are readable for their
        // lengths during the call (`head` by borrow, `tail` by the caller's promise);
        // sendmsg only reads them.
        let n = unsafe {
            libc::sendmsg(
                fd.as_raw_fd(),
                &msg,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        match io::Error::last_os_error() {
            e if e.kind() == io::ErrorKind::Interrupted => continue,
            e if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
            e => return Err(e),
        }
    }
}

/// Waits until `fd` is readable (or closed). Ok(false) when `timeout` passes first.
pub fn wait_readable(fd: BorrowedFd<'_>, timeout: Duration) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // Rounded up: a deadline's last fraction of a millisecond is waited out, not
    // cut short.
    let ms = libc::c_int::try_from(timeout.as_micros().div_ceil(1000)).unwrap_or(libc::c_int::MAX);
    loop {
        // SAFETY: one valid pollfd.
        match unsafe { libc::poll(&mut p, 1, ms) } {
            0 => return Ok(false),
            n if n > 0 => return Ok(true),
            _ => match io::Error::last_os_error() {
                e if e.kind() == io::ErrorKind::Interrupted => continue,
                e => return Err(e),
            },
        }
    }
}

/// How many threads of one side (callers waiting for completions, or connection
/// threads waiting for requests) may poll at once. Pollers yield to each other, but
/// more of them than CPUs to spare only take turns burning time that the threads
/// with work (fio, FUSE requests, the cleaner) need: with four fio jobs, four fsd
/// threads and four memnode threads polling on 2 cores, the 4-job random-read job
/// ran at about a third of its speed without polling.
///
/// A side also stops polling for [`QUIET`] when its pollers' yields keep giving
/// the CPU away for a time slice: the CPUs are busy (see [`poll_readable`]); and
/// for [`CROWDED`] when its requests keep changing connection (see
/// [`PollSlots::request_on`]).
pub struct PollSlots {
    busy: AtomicUsize,
    /// The connection the last request of this side came on (0: none yet); when
    /// (on [`clock`]) the current window of [`CROWD_WINDOW`] began and how many
    /// times requests changed connection in it; until when this side is crowded.
    /// See [`PollSlots::request_on`].
    last_conn: AtomicU64,
    window_start: AtomicU64,
    switches: AtomicUsize,
    crowded_until: AtomicU64,
    /// Until when (nanoseconds on [`clock`]) no thread of this side polls.
    quiet_until: AtomicU64,
    /// When (on [`clock`]) a poller of this side last had a long yield.
    last_long_yield: AtomicU64,
}

/// A yield that kept the poller off its CPU this long gave the CPU to a thread
/// with real work for a time slice, not to a thread that served a request and
/// slept again (a few microseconds).
pub const LONG_YIELD: Duration = Duration::from_micros(200);
/// How long a side sleeps at once, without polling, once its CPUs are seen busy.
pub const QUIET: Duration = Duration::from_millis(50);
/// Requests that change connection this often ([`CROWD_SWITCHES`] within
/// [`CROWD_WINDOW`], 8,000 a second) make a side crowded for [`CROWDED`] (see
/// [`PollSlots::request_on`]): four fio jobs through fsd change connection tens of
/// thousands of times a second, a reader beside idle mounts' scrubbers a few
/// thousand times at most.
pub const CROWD_SWITCHES: usize = 8;
pub const CROWD_WINDOW: Duration = Duration::from_millis(1);
pub const CROWDED: Duration = Duration::from_millis(1);
/// Two long yields this close make a side quiet: one alone may be chance (a
/// kernel thread, a burst of work), two mean the CPUs stay busy.
pub const LONG_YIELDS_WINDOW: Duration = Duration::from_millis(10);

impl PollSlots {
    pub const fn new() -> PollSlots {
        PollSlots {
            busy: AtomicUsize::new(0),
            last_conn: AtomicU64::new(0),
            window_start: AtomicU64::new(0),
            switches: AtomicUsize::new(0),
            crowded_until: AtomicU64::new(0),
            quiet_until: AtomicU64::new(0),
            last_long_yield: AtomicU64::new(0),
        }
    }

    /// True while this side does not poll: quiet, or crowded.
    fn quiet(&self) -> bool {
        let now = clock();
        self.quiet_at(now) || now < self.crowded_until.load(Ordering::Relaxed)
    }

    /// Notes a request on connection `conn` (non-zero). When requests change
    /// connection [`CROWD_SWITCHES`] times within [`CROWD_WINDOW`], several clients
    /// (or one client's several threads) are working at once, and this side is
    /// crowded, not polling, for [`CROWDED`].
    ///
    /// Why: polling pays where one client waits on one connection, each request
    /// sent as soon as the last was answered. Where requests come on several
    /// connections at once they come often enough that threads overlap their
    /// wakeups, and polling gains nothing but can cost much: a poller's yield gives
    /// its CPU only to threads of its own scheduling group, so a memnode in a
    /// session or cgroup of its own (as services and the bench run it) kept a CPU
    /// spinning while fsd's and fio's threads queued on the other. A rate rather
    /// than any change of connection: idle mounts' scrubbers send a few hundred
    /// requests a second each, and a lone reader beside them keeps its polling.
    /// Figures: docs/benchmarks-history.md, "Polling, and when it stops".
    pub fn request_on(&self, conn: u64) {
        let last = self.last_conn.swap(conn, Ordering::Relaxed);
        if last == 0 || last == conn {
            return;
        }
        let now = clock();
        let start = self.window_start.load(Ordering::Relaxed);
        if now.saturating_sub(start) >= CROWD_WINDOW.as_nanos() as u64 {
            self.window_start.store(now, Ordering::Relaxed);
            self.switches.store(1, Ordering::Relaxed);
            return;
        }
        if self.switches.fetch_add(1, Ordering::Relaxed) + 1 >= CROWD_SWITCHES {
            let until = now.saturating_add(CROWDED.as_nanos() as u64);
            self.crowded_until.fetch_max(until, Ordering::Relaxed);
        }
    }

    /// True while requests keep changing connection (see [`PollSlots::request_on`]).
    pub fn crowded(&self) -> bool {
        clock() < self.crowded_until.load(Ordering::Relaxed)
    }

    fn quiet_at(&self, now: u64) -> bool {
        now < self.quiet_until.load(Ordering::Relaxed)
    }

    /// Notes a long yield at `now` (on [`clock`]); a second one within
    /// [`LONG_YIELDS_WINDOW`] of the last makes the side quiet for [`QUIET`].
    fn long_yield_at(&self, now: u64) {
        // 0 stands for "none yet", so a time of 0 is stored as 1.
        let last = self.last_long_yield.swap(now.max(1), Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < LONG_YIELDS_WINDOW.as_nanos() as u64 {
            let until = now.saturating_add(QUIET.as_nanos() as u64);
            self.quiet_until.fetch_max(until, Ordering::Relaxed);
        }
    }

    /// At most half the CPUs, and at least one.
    fn limit() -> usize {
        (crate::cpus::process_cpus() / 2).max(1)
    }

    fn take(&self) -> Option<PollSlot<'_>> {
        if self.busy.fetch_add(1, Ordering::AcqRel) >= Self::limit() {
            self.busy.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(PollSlot(self))
    }
}

impl Default for PollSlots {
    fn default() -> Self {
        PollSlots::new()
    }
}

/// A slot taken from [`PollSlots`], given back on drop.
struct PollSlot<'a>(&'a PollSlots);

impl Drop for PollSlot<'_> {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Nanoseconds since the first call, on a monotonic clock.
fn clock() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Polls `fd` for up to `budget` without sleeping, giving the CPU to any other
/// runnable thread between looks; true as soon as it is readable (or closed), false
/// once the budget is spent, at once for a zero budget, when every slot of `slots`
/// is taken or while the side is quiet (the caller then sleeps in its read, as
/// without polling).
///
/// Why: on a host whose idle CPUs halt, waking a sleeping thread costs far more than
/// the loopback or LAN round trip it waited for (more than twice a polled round
/// trip on the VMs this is benchmarked on: docs/benchmarks-history.md, "Polling,
/// and when it stops").
/// Polling for a completion a little while before sleeping is what RDMA programs
/// do with their completion queues; here it keeps a memnode's connection thread
/// awake for the next request and fsd's thread awake for its completion, and keeps
/// the CPU out of its halt so a thread woken there runs at once.
///
/// Why a long yield ends it: a thread that yielded to one with a time slice of work
/// does not run again until that slice is over, however soon its data comes, while
/// a sleeping one runs as soon as its data wakes it. Where the CPUs have such work
/// (fio jobs reading from the page cache, or CPU-bound processes beside a reader)
/// a poller's yields each last many round trips, each a request served that much
/// later, and polling made such a reader many times slower. So a poll ends after a
/// yield of [`LONG_YIELD`] or more, and after two such within [`LONG_YIELDS_WINDOW`]
/// the side sleeps at once for [`QUIET`], while an idle host's one-job random reads
/// keep their polling gain (docs/benchmarks-history.md, "Polling, and when it stops").
pub fn poll_readable(fd: BorrowedFd<'_>, budget: Duration, slots: &PollSlots) -> bool {
    if budget.is_zero() || slots.quiet() {
        return false;
    }
    let Some(_slot) = slots.take() else {
        return false;
    };
    let start = Instant::now();
    loop {
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; a zero timeout never sleeps.
        if unsafe { libc::poll(&mut p, 1, 0) } != 0 {
            // Readable, closed, or an error the read that follows will report.
            return true;
        }
        if start.elapsed() >= budget {
            return false;
        }
        let yielded = Instant::now();
        // SAFETY: no arguments; it cannot fail on Linux.
        unsafe { libc::sched_yield() };
        if yielded.elapsed() >= LONG_YIELD {
            slots.long_yield_at(clock());
            return false;
        }
        if slots.quiet() {
            return false;
        }
    }
}

/// The parts of `parts` left after the first `sent` bytes.
pub fn after<'a>(parts: &[&'a [u8]], mut sent: usize) -> Vec<io::IoSlice<'a>> {
    let mut rest = Vec::with_capacity(parts.len());
    for p in parts {
        let skip = sent.min(p.len());
        sent -= skip;
        if skip < p.len() {
            rest.push(io::IoSlice::new(&p[skip..]));
        }
    }
    rest
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    #[test]
    fn after_skips_whole_and_partial_parts() {
        let parts: [&[u8]; 3] = [b"ab", b"cde", b"f"];
        let rest = |n| -> Vec<Vec<u8>> { after(&parts, n).iter().map(|s| s.to_vec()).collect() };
        assert_eq!(
            rest(0),
            vec![b"ab".to_vec(), b"cde".to_vec(), b"f".to_vec()]
        );
        assert_eq!(rest(3), vec![b"de".to_vec(), b"f".to_vec()]);
        assert_eq!(rest(5), vec![b"f".to_vec()]);
        assert!(rest(6).is_empty());
    }

    #[test]
    fn recv_now_returns_zero_when_empty_and_errors_at_end_of_stream() {
        let (mut a, b) = pair();
        let mut buf = [0u8; 8];
        let mut recv = || {
            // SAFETY: `buf` is writable for 8 bytes.
            unsafe { recv_now(b.as_fd(), buf.as_mut_ptr(), 8) }
        };
        assert_eq!(recv().unwrap(), 0);
        a.write_all(b"xyz").unwrap();
        assert!(wait_readable(b.as_fd(), Duration::from_secs(5)).unwrap());
        assert_eq!(recv().unwrap(), 3);
        drop(a);
        assert!(wait_readable(b.as_fd(), Duration::from_secs(5)).unwrap());
        assert_eq!(recv().unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(&buf[..3], b"xyz");
    }

    #[test]
    fn requests_on_two_connections_stop_polling_for_a_while() {
        let slots = PollSlots::new();
        let (mut a, b) = pair();
        a.write_all(b"x").unwrap();
        assert!(wait_readable(b.as_fd(), Duration::from_secs(5)).unwrap());
        for _ in 0..100 {
            slots.request_on(7);
        }
        assert!(!slots.quiet(), "requests on one connection do not crowd");
        assert!(poll_readable(b.as_fd(), Duration::from_secs(5), &slots));
        // A request on another connection now and then (a scrubber) does not crowd.
        slots.request_on(8);
        slots.request_on(7);
        assert!(!slots.quiet(), "one request elsewhere does not crowd");
        // Requests alternating between connections do, at once.
        for k in 0..4 * CROWD_SWITCHES as u64 {
            slots.request_on(7 + k % 2);
        }
        assert!(slots.quiet(), "requests on two connections at once crowd");
        assert!(
            !poll_readable(b.as_fd(), Duration::from_secs(5), &slots),
            "a crowded side does not poll, even for data that is there"
        );
        std::thread::sleep(CROWDED * 2);
        assert!(!slots.quiet(), "crowding ends after CROWDED");
        assert!(poll_readable(b.as_fd(), Duration::from_secs(5), &slots));
    }

    #[test]
    fn poll_readable_sees_data_and_gives_up_on_a_silent_socket() {
        let slots = PollSlots::new();
        let (mut a, b) = pair();
        let budget = Duration::from_millis(5);
        assert!(!poll_readable(b.as_fd(), Duration::ZERO, &slots));
        let start = Instant::now();
        assert!(!poll_readable(b.as_fd(), budget, &slots));
        // A long yield (this host busy) may end a poll early, never anything else.
        assert!(
            start.elapsed() >= budget || slots.last_long_yield.load(Ordering::SeqCst) != 0,
            "gave up before its budget"
        );
        // Data and a closed peer (the read then sees the end) are seen. On a busy
        // host a long yield may end a poll before loopback delivers, so each is
        // awaited first: what is tested is that polling reports it.
        slots.quiet_until.store(0, Ordering::SeqCst);
        a.write_all(b"x").unwrap();
        assert!(wait_readable(b.as_fd(), Duration::from_secs(5)).unwrap());
        assert!(poll_readable(b.as_fd(), Duration::from_secs(5), &slots));
        let (a2, b2) = pair();
        drop(a2);
        assert!(wait_readable(b2.as_fd(), Duration::from_secs(5)).unwrap());
        assert!(poll_readable(b2.as_fd(), Duration::from_secs(5), &slots));
        drop(a);
        assert_eq!(
            slots.busy.load(Ordering::SeqCst),
            0,
            "every slot given back"
        );
    }

    #[test]
    fn poll_readable_does_not_poll_when_every_slot_is_taken() {
        let slots = PollSlots::new();
        let taken: Vec<_> = (0..PollSlots::limit())
            .map(|_| slots.take().expect("a free slot"))
            .collect();
        let (mut a, b) = pair();
        a.write_all(b"x").unwrap();
        // Readable (give loopback its moment), yet no slot: returns false without
        // looking, and the caller sleeps in its read as it would without polling.
        assert!(wait_readable(b.as_fd(), Duration::from_secs(5)).unwrap());
        assert!(!poll_readable(b.as_fd(), Duration::from_secs(5), &slots));
        drop(taken);
        assert!(poll_readable(b.as_fd(), Duration::from_secs(5), &slots));
    }

    #[test]
    fn two_long_yields_close_together_make_a_side_quiet_for_a_while() {
        let slots = PollSlots::new();
        let ms = |m: u64| m * 1_000_000;
        let window = LONG_YIELDS_WINDOW.as_nanos() as u64;
        let quiet = QUIET.as_nanos() as u64;
        slots.long_yield_at(ms(1));
        assert!(!slots.quiet_at(ms(1)), "one long yield alone is chance");
        slots.long_yield_at(ms(1) + window + 1);
        assert!(!slots.quiet_at(ms(1) + window + 1), "two far apart too");
        let t = ms(1) + window + 1 + window / 2;
        slots.long_yield_at(t);
        assert!(slots.quiet_at(t) && slots.quiet_at(t + quiet - 1));
        assert!(!slots.quiet_at(t + quiet), "quiet ends after QUIET");
    }

    #[test]
    fn poll_readable_does_not_poll_while_the_side_is_quiet() {
        let slots = PollSlots::new();
        slots.quiet_until.store(u64::MAX, Ordering::SeqCst);
        let (mut a, b) = pair();
        a.write_all(b"x").unwrap();
        assert!(wait_readable(b.as_fd(), Duration::from_secs(5)).unwrap());
        assert!(!poll_readable(b.as_fd(), Duration::from_secs(5), &slots));
        slots.quiet_until.store(0, Ordering::SeqCst);
        assert!(poll_readable(b.as_fd(), Duration::from_secs(5), &slots));
    }

    #[test]
    fn wait_readable_times_out_on_a_silent_socket() {
        let (_a, b) = pair();
        assert!(!wait_readable(b.as_fd(), Duration::from_millis(20)).unwrap());
    }

    #[test]
    fn send_now_stops_when_the_peer_does_not_read_and_loses_nothing() {
        let (a, mut b) = pair();
        let chunk = vec![7u8; 1 << 20];
        let mut sent = 0;
        // A peer that reads nothing fills the socket buffers: the sends stop short.
        loop {
            // SAFETY: `chunk` is readable for its length.
            let n = unsafe { send_now(a.as_fd(), &[b"h"], chunk.as_ptr(), chunk.len()) }.unwrap();
            if n == 0 {
                break;
            }
            sent += n;
            assert!(sent < 256 << 20, "the socket never filled");
        }
        drop(a);
        let mut got = Vec::new();
        b.read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), sent);
        // Each send put "h" then bytes of the chunk, never the chunk short of its head.
        assert_eq!(got[0], b'h');
        assert!(got.iter().all(|&x| x == 7 || x == b'h'));
    }
}
