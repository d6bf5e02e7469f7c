//! Active side of the tcp backend.
//!
//! The caller completes its own work, as a thread polling an RDMA completion queue
//! does: [`Endpoint::execute`] takes the connection, writes a run of requests with
//! one vectored write, then reads their completions itself, each READ's payload
//! straight into the caller's buffer. There is no reader thread to wake and no
//! intermediate buffer, so a remote READ costs the peer's wakeup and the caller's
//! only. Threads that call at once queue for the connection (fsd spreads its calls
//! over several connections).
//!
//! Runs: a batch is sent as runs of one kind (READs, or WRITEs) of at most
//! [`MAX_RUN`] operations, each run's completions read before the next run is sent,
//! so order is kept and neither side can block the other: a READ run's requests
//! (32 bytes each) fit in the peer's receive buffer while its completions come back,
//! and a WRITE run's completions (16 bytes each) fit in ours while its payloads go
//! out.
//!
//! Requests: the operations of a run that continue one another in remote memory go
//! as one request, their local buffers gathered (WRITE) or scattered (READ) in
//! order ([`requests_of`]); such a request that the peer refuses is sent again one
//! operation per request, so every operation still gets its own outcome.
//!
//! Completions are matched by work-request id. An id outside the run, a length
//! beyond the limits or a stream that ends mid-completion breaks the connection.
//!
//! Deadlines: every read is bounded by the call's deadline (the socket's receive
//! timeout is lowered to what is left when it would overshoot that by more than a
//! small slack, at most 50 ms). A call that misses its
//! deadline leaves the stream mid-frame, so the connection is closed then, as a
//! queue pair goes to the error state when its retries run out; every later call
//! fails at once with `Disconnected`. A thread queued behind a stalled call waits for
//! that call's deadline first.

use super::direct;
use super::wire::*;
use crate::fabric::{Endpoint, FabricError, RdmaOp, MAX_DATA_OP};
use crate::protocol::MAX_CONTROL_FRAME;
use crate::sync::{get_mut, lock};
use std::io::{BufReader, IoSlice, IoSliceMut, Read};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

/// Most operations sent before their completions are read (see the module docs).
pub const MAX_RUN: usize = 1024;
/// Receive buffer: a small completion (a 4 KiB READ's) arrives with its header in
/// one read; most of a large payload bypasses it and lands in the caller's buffer.
const RX_BUFFER: usize = 16 << 10;
/// Most a read may end after its call's deadline (an eighth of the timeout when
/// that is less); see [`Io::arm`].
const MAX_DEADLINE_SLACK: Duration = Duration::from_millis(50);
/// The callers of this process that may poll for completions at once.
static POLLERS: direct::PollSlots = direct::PollSlots::new();
/// Most of an error completion's message that is kept.
const MAX_MESSAGE: usize = 4096;

/// Why reading a completion failed; each ends the connection.
enum RxError {
    Timeout,
    Broken(String),
}

/// The connection's stream, owned by one caller at a time.
struct Io {
    r: BufReader<TcpStream>,
    w: TcpStream,
    next_wr_id: u64,
    /// The socket's receive timeout now.
    read_timeout: Duration,
    /// How long to poll for a completion before sleeping in the read.
    poll: Duration,
    /// How far past a call's deadline a read may end (see [`Io::arm`]).
    slack: Duration,
}

impl Io {
    /// Lowers the socket's receive timeout to what is left until `deadline`, when
    /// the timeout set now would let a read block past it by more than `slack`. A
    /// call's reads then cost no `setsockopt` each (a streamed READ makes several;
    /// only a call that has run longer than `slack` lowers it), and none of them
    /// ends more than `slack` after the deadline.
    fn arm(&mut self, deadline: Instant) -> Result<(), RxError> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(RxError::Timeout);
        }
        if left + self.slack < self.read_timeout {
            self.set_read_timeout(left)?;
        }
        Ok(())
    }

    fn set_read_timeout(&mut self, t: Duration) -> Result<(), RxError> {
        self.w
            .set_read_timeout(Some(t))
            .map_err(|e| RxError::Broken(format!("setting the receive timeout: {e}")))?;
        self.read_timeout = t;
        Ok(())
    }

    /// Fills `buf` from the stream by `deadline`.
    fn read_exact_by(&mut self, buf: &mut [u8], deadline: Instant) -> Result<(), RxError> {
        let mut done = 0;
        while done < buf.len() {
            if self.r.buffer().is_empty() {
                self.arm(deadline)?;
            }
            match self.r.read(&mut buf[done..]) {
                Ok(0) => return Err(RxError::Broken("peer closed the connection".into())),
                Ok(n) => done += n,
                Err(e) => Self::read_error(e)?,
            }
        }
        Ok(())
    }

    /// Fills the buffers `bufs` in order from the stream by `deadline`, with as few
    /// reads as the data's arrival allows (a merged READ's payload lands in all its
    /// pages at once rather than a read per page).
    fn scatter_by(
        &mut self,
        mut bufs: &mut [IoSliceMut<'_>],
        deadline: Instant,
    ) -> Result<(), RxError> {
        IoSliceMut::advance_slices(&mut bufs, 0);
        while !bufs.is_empty() {
            if self.r.buffer().is_empty() {
                self.arm(deadline)?;
            }
            match self.r.read_vectored(bufs) {
                Ok(0) => return Err(RxError::Broken("peer closed the connection".into())),
                Ok(n) => IoSliceMut::advance_slices(&mut bufs, n),
                Err(e) => Self::read_error(e)?,
            }
        }
        Ok(())
    }

    /// What a failed read means: nothing for an interrupted one, else why the call
    /// ends.
    fn read_error(e: std::io::Error) -> Result<(), RxError> {
        match e.kind() {
            std::io::ErrorKind::Interrupted => Ok(()),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Err(RxError::Timeout),
            _ => Err(RxError::Broken(format!("read failed: {e}"))),
        }
    }

    /// Reads and drops `len` bytes.
    fn skip_by(&mut self, len: usize, deadline: Instant) -> Result<(), RxError> {
        skip(len, |b| self.read_exact_by(b, deadline))
    }

    /// Reads a completion's payload as an error message, keeping its start.
    fn message_by(&mut self, len: usize, deadline: Instant) -> Result<String, RxError> {
        let keep = len.min(MAX_MESSAGE);
        let mut msg = vec![0u8; keep];
        self.read_exact_by(&mut msg, deadline)?;
        self.skip_by(len - keep, deadline)?;
        Ok(String::from_utf8_lossy(&msg).into_owned())
    }

    fn header_by(&mut self, deadline: Instant) -> Result<CompletionHeader, RxError> {
        if self.r.buffer().is_empty() {
            // Waiting for the peer to answer: poll before sleeping (see
            // `direct::poll_readable`). The payload that follows a header comes
            // with it or right after, so only headers are polled for.
            direct::poll_readable(self.w.as_fd(), self.poll, &POLLERS);
        }
        let mut b = [0u8; COMPLETION_HEADER_LEN];
        self.read_exact_by(&mut b, deadline)?;
        let h = CompletionHeader::decode(&b);
        if h.len as usize > MAX_DATA_OP.max(MAX_CONTROL_FRAME) {
            return Err(RxError::Broken(format!(
                "completion claims {} bytes: stream corrupt",
                h.len
            )));
        }
        Ok(h)
    }

    /// Writes requests (header and payload pieces each, none for a READ) back to back.
    fn send(&mut self, requests: &[(RequestHeader, Vec<&[u8]>)]) -> std::io::Result<()> {
        let headers: Vec<[u8; REQUEST_HEADER_LEN]> =
            requests.iter().map(|(h, _)| h.encode()).collect();
        let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(2 * requests.len());
        for (h, (_, payload)) in headers.iter().zip(requests) {
            slices.push(IoSlice::new(h));
            slices.extend(payload.iter().map(|p| IoSlice::new(p)));
        }
        write_all_vectored(&mut self.w, &mut slices)
    }
}

/// One tcp connection to a memnode.
pub struct TcpEndpoint {
    /// Unique in this process (from 1), to tell [`POLLERS`] which connection a
    /// call is on.
    id: u64,
    peer: String,
    timeout: Duration,
    io: Mutex<Io>,
    /// The stream, to close it and to probe it while another thread owns `io`.
    stream: TcpStream,
    /// Why the connection died, once it has.
    dead: Mutex<Option<String>>,
}

impl TcpEndpoint {
    /// Connects to `peer` ("host:port"). `timeout` bounds the connect and every later
    /// operation.
    pub fn connect(peer: &str, timeout: Duration) -> Result<TcpEndpoint, FabricError> {
        let err = |reason: String| FabricError::Connect {
            peer: peer.to_string(),
            reason,
        };
        let addrs: Vec<_> = peer
            .to_socket_addrs()
            .map_err(|e| err(e.to_string()))?
            .collect();
        let mut last = String::from("no address");
        let mut stream = None;
        for a in addrs {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = e.to_string(),
            }
        }
        let stream = stream.ok_or_else(|| err(last))?;
        stream.set_nodelay(true).map_err(|e| err(e.to_string()))?;
        // A peer that stops reading or answering must not block a caller forever.
        stream
            .set_write_timeout(Some(timeout))
            .map_err(|e| err(e.to_string()))?;
        stream
            .set_read_timeout(Some(timeout))
            .map_err(|e| err(e.to_string()))?;
        let read_half = stream.try_clone().map_err(|e| err(e.to_string()))?;
        let write_half = stream.try_clone().map_err(|e| err(e.to_string()))?;
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Ok(TcpEndpoint {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            peer: peer.to_string(),
            timeout,
            io: Mutex::new(Io {
                r: BufReader::with_capacity(RX_BUFFER, read_half),
                w: write_half,
                next_wr_id: 1,
                read_timeout: timeout,
                poll: Duration::ZERO,
                slack: (timeout / 8).min(MAX_DEADLINE_SLACK),
            }),
            stream,
            dead: Mutex::new(None),
        })
    }

    /// Makes a caller poll for up to `poll` for its completions before it sleeps
    /// (zero, the default, sleeps at once): lower latency for CPU time.
    pub fn with_poll(mut self, poll: Duration) -> TcpEndpoint {
        get_mut(&mut self.io).poll = poll;
        self
    }

    fn disconnected(&self) -> Option<FabricError> {
        lock(&self.dead)
            .as_ref()
            .map(|reason| FabricError::Disconnected {
                peer: self.peer.clone(),
                reason: reason.clone(),
            })
    }

    /// Marks the connection dead and closes it: the stream's position is unknown.
    fn kill(&self, reason: String) -> FabricError {
        {
            let mut dead = lock(&self.dead);
            if dead.is_none() {
                log::warn!("connection to {} lost: {}", self.peer, reason);
                *dead = Some(reason);
            }
        }
        let _ = self.stream.shutdown(Shutdown::Both);
        self.disconnected().expect("marked dead just above")
    }

    /// The connection for one call, with the receive timeout back at its full
    /// length; the error when the connection is dead.
    ///
    /// Calls that keep changing connection (several threads calling at once) stop
    /// this process's callers from polling for a while
    /// ([`direct::PollSlots::request_on`]): a poller would keep a CPU from the
    /// memnode threads that must answer the other calls, which its yields do not
    /// reach when the memnode runs in a scheduling group of its own
    /// (docs/benchmarks-history.md, "Polling, and when it stops").
    fn take_io(&self) -> Result<MutexGuard<'_, Io>, FabricError> {
        let mut io = lock(&self.io);
        POLLERS.request_on(self.id);
        if let Some(e) = self.disconnected() {
            return Err(e);
        }
        if io.read_timeout != self.timeout {
            if let Err(RxError::Broken(why)) = io.set_read_timeout(self.timeout) {
                return Err(self.kill(why));
            }
        }
        Ok(io)
    }

    /// Turns a failed read into the caller's error, ending the connection.
    fn rx_failed(&self, e: RxError) -> FabricError {
        match e {
            RxError::Timeout => {
                self.kill(format!("no completion within {:?}", self.timeout));
                FabricError::Timeout {
                    peer: self.peer.clone(),
                    after: self.timeout,
                }
            }
            RxError::Broken(why) => self.kill(why),
        }
    }

    /// Reads the `len`-byte payload of an error completion with `status` and returns
    /// the operation's error: `refused` for a remote access error, the peer's message
    /// otherwise. Err when the connection broke meanwhile.
    fn failed_op(
        &self,
        io: &mut Io,
        status: u8,
        len: usize,
        refused: FabricError,
        deadline: Instant,
    ) -> Result<FabricError, FabricError> {
        if status == STATUS_REMOTE_ACCESS {
            io.skip_by(len, deadline).map_err(|e| self.rx_failed(e))?;
            return Ok(refused);
        }
        let msg = io
            .message_by(len, deadline)
            .map_err(|e| self.rx_failed(e))?;
        Ok(FabricError::BadRequest(msg))
    }

    /// Sends one run of operations of one kind and reads their completions into
    /// `results`. With `merge`, operations that continue one another go as one
    /// request (see [`requests_of`]); one such request that fails is sent again as its
    /// operations, one request each, so each gets its own outcome.
    fn run(
        &self,
        io: &mut Io,
        ops: &mut [RdmaOp<'_>],
        results: &mut [Option<Result<(), FabricError>>],
        deadline: Instant,
        merge: bool,
    ) -> Result<(), FabricError> {
        let spans = if merge {
            requests_of(ops)
        } else {
            (0..ops.len()).map(|i| i..i + 1).collect()
        };
        let first = io.next_wr_id;
        io.next_wr_id += spans.len() as u64;
        let requests: Vec<(RequestHeader, Vec<&[u8]>)> = spans
            .iter()
            .enumerate()
            .map(|(k, span)| {
                let members = &ops[span.clone()];
                let remote = members[0].remote();
                let mut code = OP_READ;
                let mut payload = Vec::new();
                for op in members {
                    if let RdmaOp::Write { local, .. } = op {
                        code = OP_WRITE;
                        payload.push(&local[..]);
                    }
                }
                let h = RequestHeader {
                    op: code,
                    len: members.iter().map(RdmaOp::len).sum::<usize>() as u32,
                    wr_id: first + k as u64,
                    addr: remote.addr,
                    rkey: remote.rkey,
                };
                (h, payload)
            })
            .collect();
        if let Err(e) = io.send(&requests) {
            return Err(self.kill(format!("write failed: {e}")));
        }
        drop(requests);
        let mut answered = vec![false; spans.len()];
        let mut again = Vec::new();
        for _ in 0..spans.len() {
            let h = io.header_by(deadline).map_err(|e| self.rx_failed(e))?;
            let k = h.wr_id.wrapping_sub(first) as usize;
            if k >= spans.len() || answered[k] {
                return Err(self.kill(format!("completion for unknown work request {}", h.wr_id)));
            }
            answered[k] = true;
            let span = spans[k].clone();
            let len = h.len as usize;
            let want: usize = ops[span.clone()].iter().map(RdmaOp::len).sum();
            let is_read = matches!(ops[span.start], RdmaOp::Read { .. });
            let r = match h.status {
                STATUS_OK if is_read && len == want => {
                    let mut locals: Vec<IoSliceMut<'_>> = ops[span.clone()]
                        .iter_mut()
                        .filter_map(|op| match op {
                            RdmaOp::Read { local, .. } => Some(IoSliceMut::new(local)),
                            RdmaOp::Write { .. } => None,
                        })
                        .collect();
                    io.scatter_by(&mut locals, deadline)
                        .map_err(|e| self.rx_failed(e))?;
                    Ok(())
                }
                STATUS_OK if is_read => {
                    io.skip_by(len, deadline).map_err(|e| self.rx_failed(e))?;
                    Err(FabricError::BadRequest(format!(
                        "READ returned {len} bytes, asked for {want}"
                    )))
                }
                STATUS_OK => {
                    io.skip_by(len, deadline).map_err(|e| self.rx_failed(e))?;
                    Ok(())
                }
                // The completion only says "refused"; name what was refused.
                status => {
                    let remote = ops[span.start].remote();
                    let refused = FabricError::RemoteAccess {
                        addr: remote.addr,
                        rkey: remote.rkey,
                        len: want,
                    };
                    let e = self.failed_op(io, status, len, refused, deadline)?;
                    if span.len() > 1 {
                        // Nothing of a refused request was moved: which of its
                        // operations the peer would refuse is for them alone to say.
                        again.push(span);
                        continue;
                    }
                    Err(e)
                }
            };
            for slot in &mut results[span] {
                *slot = Some(r.clone());
            }
        }
        for span in again {
            self.run(
                io,
                &mut ops[span.clone()],
                &mut results[span],
                deadline,
                false,
            )?;
        }
        Ok(())
    }
}

/// Splits a run into requests: each operation continues the previous one's request
/// when its remote range starts where that request's ends under the same rkey and
/// the request stays within [`MAX_DATA_OP`]. A sequential stream of blocks that
/// remote memory holds side by side thus costs the peer one request (one header,
/// one wakeup, one system call a side) instead of one per block, as one RDMA work
/// request with a scatter-gather list would. Each operation keeps its own local
/// buffer; the payload is split among them in order.
fn requests_of(ops: &[RdmaOp<'_>]) -> Vec<std::ops::Range<usize>> {
    let mut spans: Vec<std::ops::Range<usize>> = Vec::new();
    let mut end_addr = 0u64;
    let mut bytes = 0usize;
    for (i, op) in ops.iter().enumerate() {
        let remote = op.remote();
        let continues = spans.last().is_some_and(|s| {
            let prev = ops[s.start].remote();
            prev.rkey == remote.rkey && end_addr == remote.addr && bytes + op.len() <= MAX_DATA_OP
        });
        match spans.last_mut() {
            Some(s) if continues => {
                s.end = i + 1;
                bytes += op.len();
            }
            _ => {
                spans.push(i..i + 1);
                bytes = op.len();
            }
        }
        end_addr = remote.addr.wrapping_add(op.len() as u64);
    }
    spans
}

impl TcpEndpoint {
    /// Sends one two-sided request of kind `op` (a control frame, or the fabric's
    /// own `OP_MAP`) and returns the peer's reply.
    pub(crate) fn request(&self, op: u8, frame: &[u8]) -> Result<Vec<u8>, FabricError> {
        if frame.len() > MAX_CONTROL_FRAME {
            return Err(FabricError::Invalid(format!(
                "control frame of {} bytes exceeds {MAX_CONTROL_FRAME}",
                frame.len()
            )));
        }
        let mut io = self.take_io()?;
        let deadline = Instant::now() + self.timeout;
        let wr_id = io.next_wr_id;
        io.next_wr_id += 1;
        let h = RequestHeader {
            op,
            len: frame.len() as u32,
            wr_id,
            addr: 0,
            rkey: 0,
        };
        if let Err(e) = io.send(&[(h, vec![frame])]) {
            return Err(self.kill(format!("write failed: {e}")));
        }
        let c = io.header_by(deadline).map_err(|e| self.rx_failed(e))?;
        if c.wr_id != wr_id {
            return Err(self.kill(format!("completion for unknown work request {}", c.wr_id)));
        }
        let len = c.len as usize;
        match c.status {
            STATUS_OK if len <= MAX_CONTROL_FRAME => {
                let mut reply = vec![0u8; len];
                io.read_exact_by(&mut reply, deadline)
                    .map_err(|e| self.rx_failed(e))?;
                Ok(reply)
            }
            STATUS_OK => Err(self.kill(format!(
                "control reply of {len} bytes exceeds {MAX_CONTROL_FRAME}"
            ))),
            status => {
                let refused = FabricError::RemoteAccess {
                    addr: 0,
                    rkey: 0,
                    len: frame.len(),
                };
                Err(self.failed_op(&mut io, status, len, refused, deadline)?)
            }
        }
    }

    /// Sends `ops` as runs of one kind, one run after another, filling `results`;
    /// the error that ended the connection, if one did.
    fn execute_runs(
        &self,
        ops: &mut [RdmaOp<'_>],
        results: &mut [Option<Result<(), FabricError>>],
    ) -> Result<(), FabricError> {
        let mut io = self.take_io()?;
        let deadline = Instant::now() + self.timeout;
        let mut start = 0;
        while start < ops.len() {
            let is_read = matches!(ops[start], RdmaOp::Read { .. });
            let len = ops[start..]
                .iter()
                .take(MAX_RUN)
                .take_while(|op| matches!(op, RdmaOp::Read { .. }) == is_read)
                .count();
            let end = start + len;
            self.run(
                &mut io,
                &mut ops[start..end],
                &mut results[start..end],
                deadline,
                true,
            )?;
            start = end;
        }
        Ok(())
    }
}

impl Endpoint for TcpEndpoint {
    fn execute(&self, ops: &mut [RdmaOp<'_>]) -> Vec<Result<(), FabricError>> {
        if let Some(op) = ops.iter().find(|op| op.len() > MAX_DATA_OP) {
            let e = FabricError::Invalid(format!(
                "operation of {} bytes exceeds {MAX_DATA_OP}",
                op.len()
            ));
            return ops.iter().map(|_| Err(e.clone())).collect();
        }
        let mut results: Vec<Option<Result<(), FabricError>>> = vec![None; ops.len()];
        let failure = self.execute_runs(ops, &mut results);
        results
            .into_iter()
            .map(|r| match (r, &failure) {
                (Some(r), _) => r,
                (None, Err(e)) => Err(e.clone()),
                (None, Ok(())) => unreachable!("every operation of a finished batch completed"),
            })
            .collect()
    }

    fn call(&self, frame: &[u8]) -> Result<Vec<u8>, FabricError> {
        self.request(OP_SEND, frame)
    }

    fn peer(&self) -> &str {
        &self.peer
    }

    fn is_busy(&self) -> bool {
        matches!(self.io.try_lock(), Err(TryLockError::WouldBlock))
    }

    /// No thread watches an idle connection, so this looks at the socket: a peer
    /// that closed shows as an end of stream once every byte it sent has been read.
    fn is_connected(&self) -> bool {
        if lock(&self.dead).is_some() {
            return false;
        }
        let mut byte = 0u8;
        // SAFETY: the descriptor is this endpoint's open socket and `byte` is a valid
        // one-byte buffer; MSG_PEEK leaves the stream as it is for the owner of `io`.
        let n = unsafe {
            libc::recv(
                self.stream.as_raw_fd(),
                (&mut byte as *mut u8).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        let why = match n {
            0 => "peer closed the connection".to_string(),
            n if n > 0 => return true,
            _ => {
                let e = std::io::Error::last_os_error();
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) {
                    return true;
                }
                format!("connection failed: {e}")
            }
        };
        self.kill(why);
        false
    }
}

impl Drop for TcpEndpoint {
    fn drop(&mut self) {
        // Closing our own end is not a lost connection: say so before anything could
        // see the stream end, so nothing is logged as a failure.
        lock(&self.dead).get_or_insert_with(|| "closed by this side".to_string());
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

#[cfg(test)]
#[path = "client_tests.rs"]
mod tests;
