//! Passive side of the tcp backend: what a NIC and a control loop do on a memnode.
//!
//! Each accepted connection gets a thread that reads request headers and dispatches:
//! READ and WRITE go straight to the [`TcpRegistry`] (the one-sided path, which makes
//! the NIC's rkey, owner and bounds checks), SEND goes to the [`ControlHandler`] (the
//! two-sided path). The two never meet: control logic never touches data requests.
//!
//! Everything read from the socket is hostile until checked: a header with a wrong
//! magic or unknown op, or a length beyond the limits, closes the connection (the
//! stream cannot be trusted to resynchronise), an access the registry refuses gets an
//! error completion. Nothing a client sends can panic the server or touch another
//! client's memory.
//!
//! Nor can anyone who reaches the port keep clients out ([`ConnectionLimits`]): a
//! connection is capped with the others that have not completed their Hello (in all
//! and per address, the oldest closed to make room, see [`crate::admission`]) until
//! the control handler has set its client, has [`ConnectionLimits::hello_timeout`]
//! from accept to get there, and every frame, once begun, must arrive whole within
//! [`ConnectionLimits::frame_timeout`] of its start.

use super::direct;
use super::placement::Placement;
use super::registry::TcpRegistry;
use super::wire::*;
use crate::admission::{Admission, Ticket};
use crate::fabric::{
    AccessError, ConnectionLimits, ConnectionState, ControlHandler, Server, MAX_DATA_OP,
    PENDING_MEANS,
};
use crate::protocol::MAX_CONTROL_FRAME;
use crate::sync::lock;
use crate::throttle::{and_more, Throttle, LOG_EVERY};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a new connection waits at the ceiling for the threads of connections
/// closed to make room to end (see `crate::admission`).
const CEILING_WAIT: Duration = Duration::from_secs(1);
/// Descriptors a connection holds: its socket, and the clone that lets shutdown
/// and eviction close it from another thread.
const FDS_PER_CONNECTION: usize = 2;
/// Descriptors kept beside the connections' for the rest of the process (the
/// region or memory file, the listener, logs, the metrics endpoint).
const FDS_BESIDE: usize = 512;
/// Stream buffers: small frames (headers, 4 KiB payloads) are gathered in them, so
/// pipelined requests share reads and their completions share writes, while most of
/// a large payload bypasses them (one copy less each way).
const STREAM_BUFFER: usize = 16 << 10;
/// READ payloads from this size on go from registered memory straight to the
/// socket; smaller ones are gathered with other completions (a copy that small
/// costs less than a syscall of its own).
const DIRECT_PAYLOAD: usize = 8 << 10;

/// The connection threads of this process that may poll for requests at once.
static POLLERS: direct::PollSlots = direct::PollSlots::new();

struct Services {
    registry: Arc<TcpRegistry>,
    /// How long a connection thread polls for the next request before sleeping.
    poll: Duration,
    control: Arc<dyn ControlHandler>,
    limits: ConnectionLimits,
    /// The connection slots, before and after the Hello.
    admission: Arc<Admission>,
    next_conn_id: AtomicU64,
    stopping: AtomicBool,
    /// Clones of live streams by connection id, so shutdown and eviction can close
    /// them.
    streams: Mutex<HashMap<u64, TcpStream>>,
    /// Connection threads, so shutdown can wait for their disconnect callbacks.
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Connections closed before their Hello for what they did (or did not do):
    /// anyone can make many, so their lines are throttled.
    pre_hello_closes: Throttle,
    /// Failed accepts (out of descriptors and the like), which repeat while it lasts.
    accept_failures: Throttle,
}

/// A serving tcp fabric server (started by [`super::TcpListener`]). Dropping it (or
/// calling [`Server::shutdown`]) stops accepting and closes every connection.
pub struct TcpServer {
    addr: SocketAddr,
    services: Arc<Services>,
    acceptor: Option<JoinHandle<()>>,
}

impl TcpServer {
    /// Starts serving connections accepted on `listener` (already bound).
    pub(super) fn start(
        listener: TcpListener,
        registry: Arc<TcpRegistry>,
        control: Arc<dyn ControlHandler>,
        poll: Duration,
        limits: ConnectionLimits,
    ) -> std::io::Result<TcpServer> {
        let addr = listener.local_addr()?;
        let caps = limits.caps();
        crate::fdlimit::ensure(
            caps.ceiling() * FDS_PER_CONNECTION + FDS_BESIDE,
            &format!(
                "up to {} fabric connections ({} past their Hello, {} before it, as many \
                 again closing)",
                caps.ceiling(),
                caps.authenticated,
                caps.pending
            ),
        );
        let services = Arc::new(Services {
            registry,
            poll,
            control,
            limits,
            admission: Admission::new(caps, "fabric", PENDING_MEANS),
            next_conn_id: AtomicU64::new(1),
            stopping: AtomicBool::new(false),
            streams: Mutex::new(HashMap::new()),
            threads: Mutex::new(Vec::new()),
            pre_hello_closes: Throttle::new(LOG_EVERY),
            accept_failures: Throttle::new(LOG_EVERY),
        });
        let s = services.clone();
        let acceptor = std::thread::Builder::new()
            .name("fabric-accept".into())
            .spawn(move || accept_loop(listener, s))?;
        Ok(TcpServer {
            addr,
            services,
            acceptor: Some(acceptor),
        })
    }

    /// How many connections are before and after their Hello, and alive in all.
    pub fn connection_counts(&self) -> crate::admission::Counts {
        self.services.admission.counts()
    }
}

impl Server for TcpServer {
    fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    fn shutdown(&mut self) {
        if self.services.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        // Wake the acceptor with a connection of our own (to loopback when the
        // listener is bound to every address).
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        let _ = TcpStream::connect(wake);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        for (_, s) in lock(&self.services.streams).drain() {
            let _ = s.shutdown(Shutdown::Both);
        }
        let threads = std::mem::take(&mut *lock(&self.services.threads));
        for t in threads {
            let _ = t.join();
        }
        if let Some(offer) = self.services.registry.offer() {
            offer.shutdown();
        }
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        Server::shutdown(self);
    }
}

fn accept_loop(listener: TcpListener, services: Arc<Services>) {
    for stream in listener.incoming() {
        if services.stopping.load(Ordering::SeqCst) {
            return;
        }
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors and the like: back off instead of spinning.
                if let Some(n) = services.accept_failures.check() {
                    log::warn!("accept failed: {e}{}", and_more(n));
                }
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let accepted = Instant::now();
        // A peer already gone leaves nothing to serve.
        let Ok(peer_addr) = stream.peer_addr() else {
            continue;
        };
        let Ok(clone) = stream.try_clone() else {
            if let Some(n) = services.accept_failures.check() {
                log::warn!(
                    "closing a connection from {peer_addr}: no descriptor to spare{}",
                    and_more(n)
                );
            }
            continue;
        };
        let conn_id = services.next_conn_id.fetch_add(1, Ordering::Relaxed);
        let weak = Arc::downgrade(&services);
        let close = Box::new(move || {
            if let Some(s) = weak.upgrade() {
                if let Some(stream) = lock(&s.streams).get(&conn_id) {
                    let _ = stream.shutdown(Shutdown::Both);
                }
            }
        });
        // Admitted (or refused, logged there) before anything is spent on it; the
        // stream's clone is in `streams` before another admission can evict it (the
        // admissions are all this thread's).
        let Ok(ticket) = services
            .admission
            .admit_within(peer_addr.ip(), close, CEILING_WAIT)
        else {
            continue;
        };
        lock(&services.streams).insert(conn_id, clone);
        let peer = peer_addr.to_string();
        let s = services.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("fabric-conn {peer}"))
            .spawn(move || {
                let mut ticket = ticket;
                let mut conn = ConnectionState::new(conn_id, peer);
                let served = serve(stream, &mut conn, &s, &mut ticket, accepted);
                log_end(&conn, &ticket, served, &s);
                if let Some(offer) = s.registry.offer() {
                    offer.connection_closed(conn_id);
                }
                s.control.disconnected(&conn);
                lock(&s.streams).remove(&conn_id);
                drop(ticket);
            });
        match spawned {
            Ok(handle) => {
                let mut threads = lock(&services.threads);
                threads.retain(|t| !t.is_finished());
                threads.push(handle);
            }
            Err(e) => {
                // The closure, with the stream and the ticket, is gone with the error.
                if let Some(n) = services.accept_failures.check() {
                    log::warn!("cannot spawn a connection thread: {e}{}", and_more(n));
                }
                lock(&services.streams).remove(&conn_id);
            }
        }
    }
}

/// Logs how a connection ended: once a connection per line after its Hello; before
/// it, where anyone can make many, throttled (and not at all for one closed to make
/// room, which the admission logged).
fn log_end(conn: &ConnectionState, ticket: &Ticket, served: Result<(), String>, s: &Services) {
    match served {
        Ok(()) => log::debug!("connection {} from {} closed", conn.conn_id, conn.peer),
        Err(why) if ticket.is_authenticated() => {
            log::info!("closing connection from {}: {}", conn.peer, why)
        }
        Err(why) if ticket.was_evicted() => {
            log::debug!("connection from {} closed to make room: {why}", conn.peer)
        }
        Err(why) => {
            log::debug!(
                "closing connection from {} before its Hello: {why}",
                conn.peer
            );
            if let Some(n) = s.pre_hello_closes.check() {
                log::info!(
                    "closing connection from {} before its Hello: {why}{}",
                    conn.peer,
                    and_more(n)
                );
            }
        }
    }
}

fn access_status(e: AccessError) -> u8 {
    match e {
        AccessError::UnknownKey
        | AccessError::NotOwner
        | AccessError::OutOfBounds
        | AccessError::NotAuthenticated => STATUS_REMOTE_ACCESS,
    }
}

/// Reads the parts of one frame, each frame whole within its deadline, and the
/// first frames within the Hello's.
///
/// Waiting mid-frame is done with poll(2) against the deadline, never with a socket
/// timeout (which restarts with every read, so that a byte now and then would hold
/// the connection for ever), and only when the buffered bytes run out mid-frame: a
/// frame that is there whole costs no clock reading and no extra syscall.
struct FrameReader<'a> {
    r: BufReader<&'a TcpStream>,
    /// How long to poll for the next request before sleeping.
    poll: Duration,
    frame_timeout: Duration,
    /// When the frame being read must be whole: set when the frame first has to be
    /// waited for (so, give or take the microseconds this server spent on its first
    /// bytes, from its first byte), cleared at the next frame.
    frame_deadline: Option<Instant>,
    /// Until the Hello is done: when it must be.
    hello_deadline: Option<Instant>,
    hello_timeout: Duration,
}

impl FrameReader<'_> {
    /// Waits for the first byte of the next frame: without a deadline once the
    /// Hello is done, until the Hello's deadline before. Ok(false) on a clean end of
    /// stream.
    fn next_frame(&mut self) -> Result<bool, String> {
        self.frame_deadline = None;
        let fd = self.r.get_ref().as_fd();
        match self.hello_deadline {
            // A client that just got its completion often sends its next request at
            // once: poll a while before sleeping (see `direct::poll_readable`).
            None if self.r.buffer().is_empty() => {
                direct::poll_readable(fd, self.poll, &POLLERS);
            }
            None => {}
            // Checked at every frame, not only when the buffer runs dry: requests
            // that keep coming must not keep a connection past its Hello's deadline.
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero()
                    || self.r.buffer().is_empty()
                        && !direct::wait_readable(fd, left)
                            .map_err(|e| format!("waiting for the Hello: {e}"))?
                {
                    return Err(self.hello_late());
                }
            }
        }
        match self.r.fill_buf() {
            Ok(b) => Ok(!b.is_empty()),
            Err(e) => Err(format!("read failed: {e}")),
        }
    }

    fn hello_late(&self) -> String {
        format!("no Hello within {:?} of connecting", self.hello_timeout)
    }

    /// Waits until more of a frame already begun can be read, within the frame's
    /// deadline (and the Hello's, before it is done).
    fn wait_rest(&mut self, what: &str) -> Result<(), String> {
        let now = Instant::now();
        let frame_end = *self
            .frame_deadline
            .get_or_insert_with(|| now + self.frame_timeout);
        let (end, hello_first) = match self.hello_deadline {
            Some(hello_end) if hello_end < frame_end => (hello_end, true),
            _ => (frame_end, false),
        };
        let left = end.saturating_duration_since(now);
        if !left.is_zero()
            && direct::wait_readable(self.r.get_ref().as_fd(), left)
                .map_err(|e| format!("truncated {what}: {e}"))?
        {
            return Ok(());
        }
        Err(if hello_first {
            self.hello_late()
        } else {
            format!(
                "{what} not whole within {:?} of its start",
                self.frame_timeout
            )
        })
    }

    /// Reads and discards `len` bytes of a frame already begun, without buffering
    /// them whole.
    fn skip(&mut self, len: usize, what: &str) -> Result<(), String> {
        skip(len, |b| self.rest(b, what))
    }

    /// Reads bytes of a frame already begun; they must come within the deadline.
    fn rest(&mut self, buf: &mut [u8], what: &str) -> Result<(), String> {
        let mut got = 0;
        while got < buf.len() {
            if self.r.buffer().is_empty() {
                self.wait_rest(what)?;
            }
            match self.r.read(&mut buf[got..]) {
                Ok(0) => return Err(format!("truncated {what}: the connection closed")),
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("truncated {what}: {e}")),
            }
        }
        Ok(())
    }

    /// Moves up to `len` bytes of a frame already begun to `dst` without waiting:
    /// first what is buffered, then straight from the socket. Ok(0) when nothing
    /// has arrived yet.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes for the duration of the call.
    unsafe fn payload_now(&mut self, dst: *mut u8, len: usize) -> std::io::Result<usize> {
        let buffered = self.r.buffer();
        if !buffered.is_empty() {
            let n = buffered.len().min(len);
            // SAFETY: `buffered` holds `n` bytes and the caller promises `dst` is
            // writable for `len >= n` bytes; a stream buffer never overlaps it.
            unsafe { std::ptr::copy_nonoverlapping(buffered.as_ptr(), dst, n) };
            self.r.consume(n);
            return Ok(n);
        }
        // SAFETY: as promised by the caller.
        unsafe { direct::recv_now(self.r.get_ref().as_fd(), dst, len) }
    }

    /// WRITE: the `len`-byte payload of a frame already begun, straight from the
    /// socket into registered memory. Each piece is moved under the registry's
    /// checks, with the registry never held while waiting for the client; a
    /// registration that goes away part way stops the copy and the rest of the
    /// payload is drained. Ok(the completion status).
    fn write_payload(
        &mut self,
        registry: &TcpRegistry,
        client: u64,
        h: &RequestHeader,
        len: usize,
    ) -> Result<u8, String> {
        let truncated = |e: std::io::Error| format!("truncated WRITE payload: {e}");
        let mut done = 0;
        loop {
            let addr = h.addr.wrapping_add(done as u64);
            let moved = registry.access(client, addr, h.rkey, len - done, |dst| {
                // SAFETY: `access` passes the start of `len - done` registered,
                // writable bytes that stay registered during this call.
                unsafe { self.payload_now(dst, len - done) }
            });
            let n = match moved {
                Err(e) => {
                    self.skip(len - done, "WRITE payload")?;
                    return Ok(access_status(e));
                }
                Ok(r) => r.map_err(truncated)?,
            };
            done += n;
            if done == len {
                return Ok(STATUS_OK);
            }
            if n == 0 {
                self.wait_rest("WRITE payload")?;
            }
        }
    }
}

/// Completions on their way to the client. Small ones gather in `pending` and go
/// out together; a large READ payload goes from registered memory straight to the
/// socket.
struct Outbox<'a> {
    stream: &'a TcpStream,
    pending: Vec<u8>,
    /// The part of a READ payload the socket did not take at once.
    spill: Vec<u8>,
    /// Until the Hello is done: when it must be. A client that does not read its
    /// completions must not hold the connection past it by filling the socket.
    hello_deadline: Option<Instant>,
}

impl Outbox<'_> {
    fn flush(&mut self) -> Result<(), String> {
        if !self.pending.is_empty() {
            match self.hello_deadline {
                None => {
                    let mut w = self.stream;
                    w.write_all(&self.pending)
                        .map_err(|e| format!("write failed: {e}"))?;
                }
                Some(deadline) => write_all_by(self.stream, &self.pending, deadline)?,
            }
            self.pending.clear();
        }
        Ok(())
    }

    /// The Hello is done: writes wait for the client as long as it takes again.
    fn hello_done(&mut self) -> Result<(), String> {
        self.hello_deadline = None;
        self.stream
            .set_write_timeout(None)
            .map_err(|e| format!("clearing the write timeout: {e}"))
    }

    /// Queues a completion with a small payload.
    fn complete(&mut self, wr_id: u64, status: u8, payload: &[u8]) -> Result<(), String> {
        let h = CompletionHeader {
            wr_id,
            status,
            len: payload.len() as u32,
        };
        self.pending.extend_from_slice(&h.encode());
        self.pending.extend_from_slice(payload);
        if self.pending.len() >= STREAM_BUFFER {
            self.flush()?;
        }
        Ok(())
    }

    /// READ: the completion and `len` bytes of registered memory. The bytes are
    /// taken under the registry's checks, in one go: what the socket takes at once
    /// comes straight from the region, the rest is copied aside under the same
    /// check and sent after (the registry is never held while the client is slow).
    fn complete_read(
        &mut self,
        registry: &TcpRegistry,
        client: u64,
        h: &RequestHeader,
        len: usize,
    ) -> Result<(), String> {
        let header = CompletionHeader {
            wr_id: h.wr_id,
            status: STATUS_OK,
            len: len as u32,
        }
        .encode();
        if len < DIRECT_PAYLOAD {
            // Copied once, into the pending completions.
            let start = self.pending.len();
            self.pending.extend_from_slice(&header);
            self.pending.resize(start + header.len() + len, 0);
            let dst = &mut self.pending[start + header.len()..];
            if let Err(e) = registry.read(client, h.addr, h.rkey, dst) {
                self.pending.truncate(start);
                return self.complete(h.wr_id, access_status(e), &[]);
            }
            return if self.pending.len() >= STREAM_BUFFER {
                self.flush()
            } else {
                Ok(())
            };
        }
        let (pending, spill, stream) = (&self.pending, &mut self.spill, &self.stream);
        let sent = registry.access(client, h.addr, h.rkey, len, |src| {
            let head: [&[u8]; 2] = [pending, &header];
            // SAFETY: `access` passes the start of `len` registered, readable bytes
            // that stay registered during this call.
            let sent = unsafe { direct::send_now(stream.as_fd(), &head, src, len) }?;
            let payload_sent = sent.saturating_sub(pending.len() + header.len());
            let unsent = len - payload_sent;
            spill.clear();
            spill.reserve(unsent);
            // SAFETY: as above for `src`; `spill` has room for `unsent` bytes, which
            // the copy initialises before `set_len` exposes them.
            unsafe {
                std::ptr::copy(src.add(payload_sent), spill.as_mut_ptr(), unsent);
                spill.set_len(unsent);
            }
            Ok::<usize, std::io::Error>(sent)
        });
        let sent = match sent {
            Err(e) => return self.complete(h.wr_id, access_status(e), &[]),
            Ok(r) => r.map_err(|e| format!("write failed: {e}"))?,
        };
        // `spill` holds exactly the payload's unsent part, so it counts as unsent.
        let sent_head = sent.min(self.pending.len() + header.len());
        let mut rest = direct::after(&[&self.pending, &header, &self.spill], sent_head);
        let mut w = self.stream;
        write_all_vectored(&mut w, &mut rest).map_err(|e| format!("write failed: {e}"))?;
        self.pending.clear();
        Ok(())
    }
}

/// Writes all of `bytes` by `deadline` (each write's socket timeout is what is left).
fn write_all_by(stream: &TcpStream, bytes: &[u8], deadline: Instant) -> Result<(), String> {
    let mut w = stream;
    let mut done = 0;
    while done < bytes.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("the Hello's deadline passed with replies unsent".into());
        }
        w.set_write_timeout(Some(left))
            .map_err(|e| format!("setting the write timeout: {e}"))?;
        match w.write(&bytes[done..]) {
            Ok(0) => return Err("write failed: the connection closed".into()),
            Ok(n) => done += n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(format!("write failed: {e}")),
        }
    }
    Ok(())
}

/// Serves one connection until it closes (Ok) or misbehaves (Err with the reason).
/// `ticket` is its slot, moved from the pending connections to the authenticated
/// ones once the control handler has set its client.
fn serve(
    stream: TcpStream,
    conn: &mut ConnectionState,
    s: &Services,
    ticket: &mut Ticket,
    accepted: Instant,
) -> Result<(), String> {
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let hello_deadline = Some(accepted + s.limits.hello_timeout);
    let mut r = FrameReader {
        r: BufReader::with_capacity(STREAM_BUFFER, &stream),
        poll: s.poll,
        frame_timeout: s.limits.frame_timeout,
        frame_deadline: None,
        hello_deadline,
        hello_timeout: s.limits.hello_timeout,
    };
    let mut out = Outbox {
        stream: &stream,
        pending: Vec::with_capacity(STREAM_BUFFER),
        spill: Vec::new(),
        hello_deadline,
    };
    let mut buf: Vec<u8> = Vec::new();
    let mut header = [0u8; REQUEST_HEADER_LEN];
    let mut placement = Placement::of_current_thread();
    loop {
        // Send completions out before blocking for more requests, so pipelined
        // requests share writes but nothing sits in the buffer while we wait.
        if r.r.buffer().is_empty() {
            out.flush()?;
        }
        if !r.next_frame()? {
            return Ok(());
        }
        POLLERS.request_on(conn.conn_id);
        placement.after_request(r.r.get_ref().as_fd(), || POLLERS.crowded());
        r.rest(&mut header, "request header")?;
        let h = RequestHeader::decode(&header).ok_or("bad magic: not an rmemfs client")?;
        let len = h.len as usize;
        match h.op {
            OP_READ => {
                if len > MAX_DATA_OP {
                    let msg = format!("READ of {len} bytes exceeds {MAX_DATA_OP}");
                    out.complete(h.wr_id, STATUS_BAD_REQUEST, msg.as_bytes())?;
                    continue;
                }
                // Nothing is allocated for a connection that has not said hello.
                match client_of(conn) {
                    Ok(c) => out.complete_read(&s.registry, c, &h, len)?,
                    Err(e) => out.complete(h.wr_id, access_status(e), &[])?,
                }
            }
            OP_WRITE => {
                if len > MAX_DATA_OP {
                    // The payload cannot be skipped safely: close.
                    return Err(format!("WRITE of {len} bytes exceeds {MAX_DATA_OP}"));
                }
                let status = match client_of(conn) {
                    Ok(c) => r.write_payload(&s.registry, c, &h, len)?,
                    Err(e) => {
                        // Not said hello: drain the payload in small pieces, refuse.
                        r.skip(len, "WRITE payload")?;
                        access_status(e)
                    }
                };
                out.complete(h.wr_id, status, &[])?;
            }
            OP_MAP => {
                if len != 0 {
                    return Err(format!("map request with a {len}-byte payload"));
                }
                let offer = s.registry.offer();
                let (status, reply) = match (client_of(conn), offer) {
                    (Err(e), _) => (access_status(e), Vec::new()),
                    (Ok(_), None) => (
                        STATUS_BAD_REQUEST,
                        b"this memnode shares no memory by mapping".to_vec(),
                    ),
                    (Ok(c), Some(offer)) => match offer.issue(c, conn.conn_id) {
                        Ok(reply) => (STATUS_OK, reply),
                        Err(e) => (STATUS_BAD_REQUEST, e.into_bytes()),
                    },
                };
                out.complete(h.wr_id, status, &reply)?;
            }
            OP_SEND => {
                if len > MAX_CONTROL_FRAME {
                    return Err(format!(
                        "control frame of {len} bytes exceeds {MAX_CONTROL_FRAME}"
                    ));
                }
                buf.resize(len, 0);
                r.rest(&mut buf[..len], "control frame")?;
                let reply = s.control.handle(conn, &buf[..len]);
                if conn.client.is_some() && !ticket.is_authenticated() {
                    // Refused when the authenticated connections are at their cap
                    // (logged there): closed without its Welcome.
                    ticket
                        .authenticate()
                        .map_err(|e| format!("refused after its Hello: {e}"))?;
                    r.hello_deadline = None;
                    out.hello_done()?;
                }
                out.complete(h.wr_id, STATUS_OK, &reply.frame)?;
                if reply.close {
                    let _ = out.flush();
                    return Err("control handler closed the connection".into());
                }
            }
            other => return Err(format!("unknown op {other}")),
        }
    }
}

fn client_of(conn: &ConnectionState) -> Result<u64, AccessError> {
    conn.client.ok_or(AccessError::NotAuthenticated)
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
