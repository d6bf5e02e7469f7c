//! FUSE over io_uring (Linux 6.14, `CONFIG_FUSE_IO_URING`, on when
//! `/sys/module/fuse/parameters/enable_uring` is Y): the kernel hands requests to
//! buffers the daemon registered, one queue per CPU, and the daemon answers a request
//! and fetches the next in one submission (COMMIT_AND_FETCH) instead of a write(2)
//! and a read(2) on /dev/fuse.
//!
//! How it fits beside fuser, which has no ring code (its issue #380): fuser still
//! mounts and runs its /dev/fuse loop. At FUSE_INIT, [`RingLauncher::negotiate`]
//! asks for FUSE_OVER_IO_URING; once every queue has an entry registered the kernel
//! sends every request there, except FORGET and INTERRUPT, which stay on /dev/fuse
//! with fuser (as do notifications). Both paths answer through the same
//! [`FuseOps`], so the filesystem is one.
//!
//! Threads: each owns one io_uring and a few ring entries (each a 288-byte header
//! buffer and a payload buffer as large as the largest request) and serves its queue
//! synchronously: wait, answer what has come, commit-and-fetch each. The reads among
//! requests that came together are read together, what they miss loaded in one
//! batch ([`FuseOps::read_together`]). Several threads per queue let requests that wait
//! on remote memory overlap. Each is pinned to its queue's CPU,
//! the CPU of the tasks whose requests it serves: fsd then served more on every job
//! measured (2 cores: 1 MiB reads 2.9 against 2.4-2.6 GB/s, 4 KiB random reads by 4
//! readers 47-49k against 36-42k, random writes 74-78k against 44-69k per second).
//! A server that does no I/O of its own pays for it with one reader: nullfs, pinned,
//! serves 33-36k random 4 KiB reads against 53-60k unpinned, as reader and server
//! then take turns on one CPU (its 1 MiB streams gain, 6.5-7.2 against 4.5-4.9 GB/s). The rings and buffers are made
//! before mounting: the kernel holds every request of a connection that negotiated
//! io_uring until the ring is ready, so fsd must not promise a ring it cannot build.
//!
//! Teardown: unmount (or fsd's exit) aborts the connection; the kernel completes
//! every registered entry with ENOTCONN, a commit after that fails the same way, and
//! the threads end. A request being answered then has no one to answer to, as on
//! /dev/fuse.

mod abi;
mod dispatch;

use super::ops::{FuseOps, ReadTogether};
use anyhow::{anyhow, bail, Context};
use fuser::{InitFlags, KernelConfig};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::alloc::Layout;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Requests answered through the ring since fsd started (statistics; the proof in
/// tests that the ring serves).
pub static RING_REQUESTS: AtomicU64 = AtomicU64::new(0);

const ENABLE_PARAM: &str = "/sys/module/fuse/parameters/enable_uring";
/// How long registration retries while the kernel finishes FUSE_INIT (EAGAIN).
const REGISTER_PATIENCE: Duration = Duration::from_secs(10);
/// Serving threads per queue unless told otherwise. One thread answers a request
/// that comes while it is busy as soon as it is done (COMMIT_AND_FETCH hands it
/// over at once), where a second thread would be woken for it: a sleep and a
/// wakeup per request saved, which is what the CPUs of a loaded host run short of.
/// On 2 cores, more readers than CPUs missing the cache ran 19-63% faster so (see
/// docs/reference.md, "FUSE transports"), as libfuse serves the ring too. The
/// price: a request that waits long holds up the others of its CPU's tasks until
/// it is answered (`--ring-threads` gives more).
pub const DEFAULT_THREADS_PER_QUEUE: usize = 1;
/// Ring entries each serving thread registers, at most. Requests that come while the
/// thread is busy wait in its other entries, and are answered together once it is
/// free: their reads that miss the cache then cost one round trip to remote memory
/// between them (the fabric alone served 2 x 4 KiB reads per round trip at twice the
/// reads a second of 1, 516k against 253k on 2 cores; fsd with 8 random readers
/// 139-142k against 122-123k with one entry).
const ENTRIES_PER_THREAD: usize = 4;
/// Ring entries of all queues together, at most: each holds a payload buffer as
/// large as the largest request, which stays resident once a large request used it.
const MAX_RING_ENTRIES: usize = 64;
/// Submission queue slots of a thread's ring: a command per entry at once.
const RING_SIZE: u32 = ENTRIES_PER_THREAD.next_power_of_two() as u32;
/// Serving threads of all queues together, at most (each holds a payload buffer
/// as large as the largest request).
const MAX_RING_THREADS: usize = 64;
/// How long stopping waits for the threads to see the connection end.
const STOP_PATIENCE: Duration = Duration::from_secs(5);

/// Which transport serves a mount (`--fuse-transport`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FuseTransport {
    /// io_uring when the kernel offers it, else /dev/fuse.
    Auto,
    /// io_uring, or fail to mount.
    #[value(name = "io-uring")]
    IoUring,
    /// fuser's /dev/fuse loop.
    Classic,
}

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

/// A buffer the kernel writes into while it is registered: page-aligned, never
/// moved or resized.
struct PinnedBuf {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: the buffer is owned by one thread at a time; the raw pointer is only a
// heap allocation's address.
unsafe impl Send for PinnedBuf {}

impl PinnedBuf {
    fn new(len: usize) -> anyhow::Result<PinnedBuf> {
        let layout = Layout::from_size_align(len.max(1), 4096)?;
        // SAFETY: layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            bail!("out of memory for a {len}-byte ring buffer");
        }
        Ok(PinnedBuf { ptr, layout })
    }

    fn slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr is a live allocation of layout.size() bytes owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for PinnedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in new() with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// The io_uring SQE128 of a FUSE ring command. io-uring's UringCmd80 has no `len`,
/// which REGISTER needs (the number of iovecs, 2), so it is set in the SQE's bytes.
fn ring_cmd(
    fd: i32,
    cmd_op: u32,
    qid: u16,
    commit_id: u64,
    iovecs: Option<&[libc::iovec; 2]>,
) -> squeue::Entry128 {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    let mut e = opcode::UringCmd80::new(types::Fd(fd), cmd_op).cmd(cmd);
    if let Some(iov) = iovecs {
        e = e.addr(Some(iov.as_ptr() as u64));
    }
    let e = e.build();
    match iovecs {
        Some(iov) => set_sqe_len(e, iov.len() as u32),
        None => e,
    }
}

/// Offset of `len` in `struct io_uring_sqe` (after opcode, flags, ioprio, fd, off,
/// addr).
const SQE_LEN_AT: usize = 24;

fn set_sqe_len(e: squeue::Entry128, len: u32) -> squeue::Entry128 {
    // SAFETY: Entry128 is a repr(C) 128-byte plain-data SQE (io-uring asserts its
    // size); every byte pattern is a valid value of it.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(e) };
    raw[SQE_LEN_AT..SQE_LEN_AT + 4].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: as above.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

type Ring = IoUring<squeue::Entry128, cqueue::Entry>;

/// A ring for one thread: single issuer with task work deferred to its own waits
/// (the kernel's recommended mode for a thread that only submits and waits), or a
/// plain one where the kernel lacks those flags.
fn new_ring() -> std::io::Result<Ring> {
    IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(RING_SIZE)
        .or_else(|_| IoUring::builder().build(RING_SIZE))
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

struct Shared {
    go: Mutex<Go>,
    go_cv: Condvar,
    /// Serving threads still running, and a way to wait for none.
    alive: Mutex<usize>,
    alive_cv: Condvar,
    forced: bool,
    describe: String,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
            alive = self
                .shared
                .alive_cv
                .wait_timeout(alive, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

fn is_connection_end(err: i32) -> bool {
    matches!(
        -err,
        libc::ENOTCONN | libc::ECONNABORTED | libc::ENODEV | libc::ECANCELED
    )
}

/// One ring entry: the buffers the kernel writes a request into and the daemon its
/// answer, registered once and reused for every request of the entry.
struct Entry {
    header: PinnedBuf,
    payload: PinnedBuf,
    iovecs: [libc::iovec; 2],
    /// Still registered: the kernel will complete it again.
    live: bool,
}

// SAFETY: the iovecs point into the entry's own buffers, owned with it by one thread.
unsafe impl Send for Entry {}

impl Entry {
    fn new(payload_len: usize) -> anyhow::Result<Entry> {
        let header = PinnedBuf::new(abi::HEADER_LEN)?;
        let payload = PinnedBuf::new(payload_len)?;
        let iovecs = [
            libc::iovec {
                iov_base: header.ptr.cast(),
                iov_len: abi::HEADER_LEN,
            },
            libc::iovec {
                iov_base: payload.ptr.cast(),
                iov_len: payload_len,
            },
        ];
        Ok(Entry {
            header,
            payload,
            iovecs,
            live: true,
        })
    }

    /// The request's header and payload, where its answer goes too.
    fn buffers(&mut self) -> (&mut [u8; abi::HEADER_LEN], &mut [u8]) {
        let header = self
            .header
            .slice()
            .try_into()
            .expect("a header buffer is HEADER_LEN bytes");
        (header, self.payload.slice())
    }
}

/// Pushes `e`, tagged with entry `n`, onto the ring's submission queue.
fn push(ring: &mut Ring, e: squeue::Entry128, n: usize) -> std::io::Result<()> {
    let e = e.user_data(n as u64);
    // SAFETY: the SQE's buffers (iovecs, header, payload) belong to the entry, which
    // the serving thread keeps until the thread ends, after the ring.
    unsafe { ring.submission().push(&e) }.map_err(|_| std::io::Error::other("ring SQ full"))
}

fn register(fd: i32, qid: u16, e: &Entry) -> squeue::Entry128 {
    ring_cmd(fd, abi::CMD_REGISTER, qid, 0, Some(&e.iovecs))
}

/// Adds to `ready` the entries whose request came (their CQEs are in), registers
/// again those the kernel was not ready for, and marks the others ended.
fn take_completions(
    ring: &mut Ring,
    entries: &mut [Entry],
    ready: &mut Vec<usize>,
    qid: u16,
    fd: i32,
    started: Instant,
) {
    let done: Vec<(usize, i32)> = ring
        .completion()
        .map(|c| (c.user_data() as usize, c.result()))
        .collect();
    for (n, r) in done {
        let Some(entry) = entries.get_mut(n) else {
            continue;
        };
        if r >= 0 {
            ready.push(n);
        } else if r == -libc::EAGAIN && started.elapsed() < REGISTER_PATIENCE {
            // Registration fails so until the kernel has taken fuser's INIT reply.
            std::thread::sleep(Duration::from_millis(1));
            if push(ring, register(fd, qid, entry), n).is_err() {
                entry.live = false;
            }
        } else {
            entry.live = false;
            if !is_connection_end(r) {
                log::warn!(
                    "FUSE ring queue {qid}: the kernel refused a command: {}; its \
                     requests go to the thread's other entries or /dev/fuse",
                    std::io::Error::from_raw_os_error(-r)
                );
            }
        }
    }
}

/// Whether a thread with one read to answer waits a little for company: it sleeps
/// on its ring for up to [`COMPANY_WAIT`], so that the tasks of its CPU its last
/// answers woke can send their next reads, then answers all that came, their
/// misses fetched together. On 2 cores with 4 random 4 KiB readers missing the
/// cache, a thread otherwise answers one read at a time: the others come while it
/// waits on remote memory. It sleeps rather than yields the CPU: a yield to a task
/// that computes gives it a whole time slice (4 readers beside a busy loop per CPU
/// fell from 12-23k to 2.1k reads a second), while a sleeper that wakes is soon run.
/// Where waits gather nothing to fetch (one reader, or reads the cache answers),
/// after [`COMPANY_PATIENCE`] such waits in a row it answers the next reads alone
/// at once, [`COMPANY_BACKOFF`] of them and twice as many each time that repeats,
/// so those pay for waiting rarely (a wait that times out costs far more than its
/// length when the CPU went idle meanwhile).
struct Company {
    enabled: bool,
    /// Waits in a row that gathered nothing to fetch.
    idle_waits: u32,
    /// Reads alone still to answer at once before waiting again.
    skip: u32,
    /// How many to answer at once after the next idle waits.
    backoff: u32,
}

/// How long a thread with one read to answer waits for others.
const COMPANY_WAIT: Duration = Duration::from_micros(5);
/// Waits in a row that gather nothing to fetch before the thread stops waiting for a
/// while: one alone is no sign (the reads it gathered happened to be in the cache).
const COMPANY_PATIENCE: u32 = 3;
/// Reads alone answered at once after [`COMPANY_PATIENCE`] idle waits, the first
/// time; doubled each time up to [`COMPANY_MAX_BACKOFF`], until a wait pays.
const COMPANY_BACKOFF: u32 = 64;
const COMPANY_MAX_BACKOFF: u32 = 4096;

impl Company {
    fn new(enabled: bool) -> Company {
        Company {
            enabled,
            idle_waits: 0,
            skip: 0,
            backoff: COMPANY_BACKOFF,
        }
    }

    fn worth_waiting(&mut self) -> bool {
        if !self.enabled {
            return false;
        }
        if self.skip > 0 {
            self.skip -= 1;
            return false;
        }
        true
    }

    /// After a wait: whether it gathered reads that fetched from remote memory
    /// together (company that was worth it).
    fn waited(&mut self, fetched_together: bool) {
        if fetched_together {
            self.idle_waits = 0;
            self.backoff = COMPANY_BACKOFF;
            return;
        }
        self.idle_waits += 1;
        if self.idle_waits >= COMPANY_PATIENCE {
            self.idle_waits = 0;
            self.skip = self.backoff;
            self.backoff = (self.backoff * 2).min(COMPANY_MAX_BACKOFF);
        }
    }
}

/// One serving thread: makes its ring, waits for the go, registers `entries` ring
/// entries on queue `qid`, then answers requests until the connection ends.
fn serve_queue<O: FuseOps + ?Sized>(
    ops: &O,
    qid: u16,
    entries: usize,
    payload_len: usize,
    shared: &Shared,
    ready: mpsc::Sender<anyhow::Result<()>>,
) {
    let made = new_ring()
        .context("io_uring is unavailable (kernel.io_uring_disabled?)")
        .and_then(|ring| {
            let entries = (0..entries)
                .map(|_| Entry::new(payload_len))
                .collect::<anyhow::Result<Vec<Entry>>>()?;
            Ok((entries, ring))
        });
    // The ring goes first (declared last): no entry's buffers are freed while it
    // may still fill them.
    let (mut entries, mut ring) = match made {
        Ok(m) => {
            let _ = ready.send(Ok(()));
            m
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    drop(ready);
    let fd = {
        let mut go = lock(&shared.go);
        loop {
            if go.cancelled {
                return;
            }
            if let (true, Some(fd)) = (go.negotiated, &go.device) {
                break fd.clone();
            }
            go = shared.go_cv.wait(go).unwrap_or_else(|e| e.into_inner());
        }
    };
    // Requests of tasks on this CPU come to this queue. Best effort: the kernel
    // routes requests whatever CPU serves them.
    crate::affinity::pin_current_thread(qid as usize);
    // The wait for company (`COMPANY_WAIT`) is microseconds: without this, the
    // kernel may let it run 50 µs over (the default timer slack).
    // SAFETY: PR_SET_TIMERSLACK takes a value and changes only this thread.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
    let raw = fd.as_raw_fd();
    for (n, e) in entries.iter().enumerate() {
        if let Err(err) = push(&mut ring, register(raw, qid, e), n) {
            log::warn!("FUSE ring queue {qid}: io_uring failed: {err}");
            return;
        }
    }
    // Entries whose request (or registration) completed: to answer now.
    let mut ready: Vec<usize> = Vec::with_capacity(entries.len());
    // Of a batch of reads answered together: the entry of each, and what each read.
    let mut order: Vec<usize> = Vec::with_capacity(entries.len());
    let mut answered: Vec<Option<usize>> = Vec::with_capacity(entries.len());
    let started = Instant::now();
    let mut company = Company::new(ops.gathers_reads());
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => {
                log::warn!("FUSE ring queue {qid}: io_uring failed: {e}");
                return;
            }
        }
        ready.clear();
        take_completions(&mut ring, &mut entries, &mut ready, qid, raw, started);
        // One read alone: give the tasks of this CPU that the answers just committed
        // woke a moment to ask for their next reads, to fetch together (`Company`).
        let alone = ready.len() == 1 && dispatch::read_of(entries[ready[0]].buffers().0).is_some();
        let waited = alone && company.worth_waiting();
        if waited {
            let ts = types::Timespec::from(COMPANY_WAIT);
            let args = types::SubmitArgs::new().timespec(&ts);
            match ring.submitter().submit_with_args(1, &args) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR)) => {}
                Err(e) => log::debug!("FUSE ring queue {qid}: waiting for company: {e}"),
            }
            take_completions(&mut ring, &mut entries, &mut ready, qid, raw, started);
        }
        if entries.iter().all(|e| !e.live) {
            return;
        }
        // Reads that came together are answered together: their misses go to
        // remote memory in one round trip (see `FuseOps::read_together`) instead of
        // one per read.
        let mut fetched = 0;
        answered.clear();
        answered.resize(entries.len(), None);
        if ready.len() > 1 {
            // In the order they came, as they would be answered one by one.
            let mut slots: Vec<Option<&mut Entry>> = entries.iter_mut().map(Some).collect();
            let mut reads: Vec<ReadTogether<'_>> = Vec::with_capacity(ready.len());
            for &n in &ready {
                let Some(e) = slots[n].take() else { continue };
                let (header, payload) = e.buffers();
                if let Some(at) = dispatch::read_of(header) {
                    let len = at.len.min(payload.len());
                    let buf = &mut payload[..len];
                    reads.push(ReadTogether {
                        at,
                        buf,
                        done: None,
                    });
                    order.push(n);
                }
            }
            if reads.len() > 1 {
                fetched = ops.read_together(&mut reads);
                for (r, &n) in reads.iter().zip(&order) {
                    answered[n] = r.done;
                }
            }
            order.clear();
        }
        if waited {
            company.waited(fetched > 0);
        }
        for &n in &ready {
            RING_REQUESTS.fetch_add(1, Ordering::Relaxed);
            let entry = &mut entries[n];
            let (header, payload) = entry.buffers();
            let commit_id = match answered[n] {
                Some(len) => dispatch::answered_read(header, len),
                None => dispatch::answer(ops, header, payload),
            };
            let Some(commit_id) = commit_id else {
                log::error!("FUSE ring queue {qid}: unreadable request header; entry given up");
                entry.live = false;
                continue;
            };
            let commit = ring_cmd(raw, abi::CMD_COMMIT_AND_FETCH, qid, commit_id, None);
            if let Err(e) = push(&mut ring, commit, n) {
                log::warn!("FUSE ring queue {qid}: io_uring failed: {e}");
                entry.live = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_register_command_carries_its_iovecs_and_their_count() {
        let iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 2];
        let e = ring_cmd(7, abi::CMD_REGISTER, 3, 99, Some(&iov));
        // SAFETY: as in set_sqe_len.
        let raw: [u8; 128] = unsafe { std::mem::transmute(e) };
        assert_eq!(raw[0], 46, "IORING_OP_URING_CMD");
        assert_eq!(i32::from_ne_bytes(raw[4..8].try_into().unwrap()), 7);
        assert_eq!(
            u32::from_ne_bytes(raw[8..12].try_into().unwrap()),
            abi::CMD_REGISTER
        );
        assert_eq!(
            u64::from_ne_bytes(raw[16..24].try_into().unwrap()),
            iov.as_ptr() as u64
        );
        assert_eq!(u32::from_ne_bytes(raw[24..28].try_into().unwrap()), 2);
        // The command area starts at byte 48: flags, commit_id, qid.
        assert_eq!(u64::from_ne_bytes(raw[56..64].try_into().unwrap()), 99);
        assert_eq!(u16::from_ne_bytes(raw[64..66].try_into().unwrap()), 3);
    }

    #[test]
    fn a_thread_stops_waiting_for_company_after_idle_waits_and_tries_again_later() {
        let mut c = Company::new(true);
        // Waits that gather reads to fetch together go on.
        for _ in 0..100 {
            assert!(c.worth_waiting());
            c.waited(true);
        }
        // Idle waits short of the patience, then a useful one: still waiting.
        for _ in 1..COMPANY_PATIENCE {
            assert!(c.worth_waiting());
            c.waited(false);
        }
        assert!(c.worth_waiting());
        c.waited(true);
        // Idle waits in a row: the next reads go at once, then it waits again.
        for _ in 0..COMPANY_PATIENCE {
            assert!(c.worth_waiting());
            c.waited(false);
        }
        for _ in 0..COMPANY_BACKOFF {
            assert!(!c.worth_waiting());
        }
        // Idle again: twice as long before the next wait.
        for _ in 0..COMPANY_PATIENCE {
            assert!(c.worth_waiting());
            c.waited(false);
        }
        for _ in 0..2 * COMPANY_BACKOFF {
            assert!(!c.worth_waiting());
        }
        // A wait that pays brings the first backoff back.
        assert!(c.worth_waiting());
        c.waited(true);
        for _ in 0..COMPANY_PATIENCE {
            assert!(c.worth_waiting());
            c.waited(false);
        }
        assert_eq!(
            (0..).take_while(|_| !c.worth_waiting()).count(),
            COMPANY_BACKOFF as usize
        );
        // A filesystem that gains nothing from reads together never waits.
        let mut off = Company::new(false);
        assert!((0..1000).all(|_| !off.worth_waiting()));
    }

    #[test]
    fn possible_cpus_reads_the_highest_cpu_id() {
        assert!(possible_cpus().unwrap() >= 1);
    }
}
