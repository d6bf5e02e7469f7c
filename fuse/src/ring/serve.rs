//! A serving thread of the ring, from its ring and entries (made before mounting)
//! through the go to the end of the connection. Each turn of its loop waits for
//! requests, gathers those that came (giving a read that came alone a moment's
//! company, `company.rs`), reads the reads among them together, and answers each
//! with a COMMIT_AND_FETCH that hands its entry back for the next request.

use super::company::{Company, COMPANY_WAIT};
use super::entry::{new_ring, push, register, ring_cmd, Entry, Ring};
use super::launch::Shared;
use super::{abi, dispatch, RING_REQUESTS};
use crate::ops::{FuseOps, ReadTogether};
use anyhow::Context;
use io_uring::types;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long registration retries while the kernel finishes FUSE_INIT (EAGAIN).
const REGISTER_PATIENCE: Duration = Duration::from_secs(10);

/// One serving thread: makes its ring, waits for the go, registers `entries` ring
/// entries on queue `qid`, then answers requests until the connection ends.
pub(super) fn serve_queue<O: FuseOps + ?Sized>(
    ops: &O,
    qid: u16,
    entries: usize,
    payload_len: usize,
    shared: &Shared,
    ready: mpsc::Sender<anyhow::Result<()>>,
) {
    let queue = match Queue::new(entries, payload_len) {
        Ok(q) => {
            let _ = ready.send(Ok(()));
            q
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    drop(ready);
    let Some(fd) = shared.wait_for_go() else {
        return;
    };
    settle_on(qid);
    let Some(mut server) = Server::start(ops, queue, qid, fd.as_raw_fd()) else {
        return;
    };
    server.run();
}

/// A thread's ring and its entries. The ring goes first (fields drop in the order
/// declared): no entry's buffers are freed while it may still fill them.
struct Queue {
    ring: Ring,
    entries: Vec<Entry>,
}

impl Queue {
    fn new(entries: usize, payload_len: usize) -> anyhow::Result<Queue> {
        let ring = new_ring().context("io_uring is unavailable (kernel.io_uring_disabled?)")?;
        let entries = (0..entries)
            .map(|_| Entry::new(payload_len))
            .collect::<anyhow::Result<Vec<Entry>>>()?;
        Ok(Queue { ring, entries })
    }
}

/// Once the go came: pins the thread to its queue's CPU and shortens its timer
/// slack.
fn settle_on(qid: u16) {
    // Requests of tasks on this CPU come to this queue. Best effort: the kernel
    // routes requests whatever CPU serves them.
    rmemfs_common::cpus::pin_current_thread(qid as usize);
    // The wait for company (`COMPANY_WAIT`) is microseconds: without this, the
    // kernel may let it run 50 µs over (the default timer slack).
    // SAFETY: PR_SET_TIMERSLACK takes a value and changes only this thread.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
}

/// A serving thread whose entries are registered, and what its loop keeps from one
/// turn to the next.
struct Server<'o, O: ?Sized> {
    ops: &'o O,
    queue: Queue,
    qid: u16,
    /// The mount's /dev/fuse descriptor, which ring commands go to (the go's, kept
    /// open by `serve_queue` while the server runs).
    fd: i32,
    /// When the entries were registered: a registration the kernel was not ready
    /// for is retried until [`REGISTER_PATIENCE`] after.
    started: Instant,
    /// Entries whose request (or registration) completed: to answer now.
    ready: Vec<usize>,
    /// Of a batch of reads answered together: the entry of each, and what each read.
    order: Vec<usize>,
    answered: Vec<Option<usize>>,
    company: Company,
}

impl<'o, O: FuseOps + ?Sized> Server<'o, O> {
    /// Registers every entry of `queue` on queue `qid`; None (logged) when io_uring
    /// fails.
    fn start(ops: &'o O, mut queue: Queue, qid: u16, fd: i32) -> Option<Server<'o, O>> {
        for (n, e) in queue.entries.iter().enumerate() {
            if let Err(err) = push(&mut queue.ring, register(fd, qid, e), n) {
                log::warn!("FUSE ring queue {qid}: io_uring failed: {err}");
                return None;
            }
        }
        let entries = queue.entries.len();
        Some(Server {
            ops,
            queue,
            qid,
            fd,
            ready: Vec::with_capacity(entries),
            order: Vec::with_capacity(entries),
            answered: Vec::with_capacity(entries),
            started: Instant::now(),
            company: Company::new(ops.gathers_reads()),
        })
    }

    /// Answers requests until the connection ends (no entry left registered) or
    /// io_uring fails.
    fn run(&mut self) {
        loop {
            if !self.wait() {
                return;
            }
            let waited = self.gather();
            if self.queue.entries.iter().all(|e| !e.live) {
                return;
            }
            let fetched = self.read_together();
            if waited {
                self.company.waited(fetched > 0);
            }
            self.answer_ready();
        }
    }

    /// Submits what is queued (answers, registrations) and waits for a completion;
    /// false (logged) when io_uring fails.
    fn wait(&mut self) -> bool {
        loop {
            match self.queue.ring.submit_and_wait(1) {
                Ok(_) => return true,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => {
                    log::warn!("FUSE ring queue {}: io_uring failed: {e}", self.qid);
                    return false;
                }
            }
        }
    }

    /// Collects in `ready` the requests that came; with one read alone, first gives
    /// the tasks of this CPU that the answers just committed woke a moment to ask for
    /// their next reads, to fetch together ([`Company`]). Whether it waited so.
    fn gather(&mut self) -> bool {
        self.ready.clear();
        self.take_completions();
        let alone = self.ready.len() == 1
            && dispatch::read_of(self.queue.entries[self.ready[0]].buffers().0).is_some();
        let waited = alone && self.company.worth_waiting();
        if waited {
            let ts = types::Timespec::from(COMPANY_WAIT);
            let args = types::SubmitArgs::new().timespec(&ts);
            match self.queue.ring.submitter().submit_with_args(1, &args) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR)) => {}
                Err(e) => log::debug!("FUSE ring queue {}: waiting for company: {e}", self.qid),
            }
            self.take_completions();
        }
        waited
    }

    /// Adds to `ready` the entries whose request came (their CQEs are in), registers
    /// again those the kernel was not ready for, and marks the others ended.
    fn take_completions(&mut self) {
        let (qid, fd) = (self.qid, self.fd);
        let ring = &mut self.queue.ring;
        let done: Vec<(usize, i32)> = ring
            .completion()
            .map(|c| (c.user_data() as usize, c.result()))
            .collect();
        for (n, r) in done {
            let Some(entry) = self.queue.entries.get_mut(n) else {
                continue;
            };
            if r >= 0 {
                self.ready.push(n);
            } else if r == -libc::EAGAIN && self.started.elapsed() < REGISTER_PATIENCE {
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

    /// Reads that came together are answered together: their misses go to remote
    /// memory in one round trip (see `FuseOps::read_together`) instead of one per
    /// read. Notes in `answered` what each read so answered got; returns how many
    /// blocks were fetched.
    fn read_together(&mut self) -> usize {
        let mut fetched = 0;
        self.answered.clear();
        self.answered.resize(self.queue.entries.len(), None);
        if self.ready.len() > 1 {
            // In the order they came, as they would be answered one by one.
            let mut slots: Vec<Option<&mut Entry>> =
                self.queue.entries.iter_mut().map(Some).collect();
            let mut reads: Vec<ReadTogether<'_>> = Vec::with_capacity(self.ready.len());
            for &n in &self.ready {
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
                    self.order.push(n);
                }
            }
            if reads.len() > 1 {
                fetched = self.ops.read_together(&mut reads);
                for (r, &n) in reads.iter().zip(&self.order) {
                    self.answered[n] = r.done;
                }
            }
            self.order.clear();
        }
        fetched
    }

    /// Answers each ready request in its entry's buffers (a read answered together
    /// already holds its bytes) and commits it, which also fetches the entry's next
    /// request.
    fn answer_ready(&mut self) {
        let qid = self.qid;
        for &n in &self.ready {
            RING_REQUESTS.fetch_add(1, Ordering::Relaxed);
            let entry = &mut self.queue.entries[n];
            let (header, payload) = entry.buffers();
            let commit_id = match self.answered[n] {
                Some(len) => dispatch::answered_read(header, len),
                None => dispatch::answer(self.ops, header, payload),
            };
            let Some(commit_id) = commit_id else {
                log::error!("FUSE ring queue {qid}: unreadable request header; entry given up");
                entry.live = false;
                continue;
            };
            let commit = ring_cmd(self.fd, abi::CMD_COMMIT_AND_FETCH, qid, commit_id, None);
            if let Err(e) = push(&mut self.queue.ring, commit, n) {
                log::warn!("FUSE ring queue {qid}: io_uring failed: {e}");
                entry.live = false;
            }
        }
    }
}

fn is_connection_end(err: i32) -> bool {
    matches!(
        -err,
        libc::ENOTCONN | libc::ECONNABORTED | libc::ENODEV | libc::ECANCELED
    )
}
