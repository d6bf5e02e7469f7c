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

use super::direct;
use super::placement::Placement;
use super::registry::TcpRegistry;
use super::wire::*;
use crate::fabric::{AccessError, ConnectionState, ControlHandler, Server, MAX_DATA_OP};
use crate::protocol::MAX_CONTROL_FRAME;
use crate::sync::lock;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Most connections served at once; more are refused so a flood cannot exhaust threads.
pub const MAX_CONNECTIONS: usize = 1024;
/// Once a frame has begun, the rest of it must arrive within this time, or the
/// connection is closed: a client that sends half a frame and stalls cannot pin a
/// thread forever. Between frames a connection may idle as long as it likes.
pub const FRAME_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
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
    poll: std::time::Duration,
    control: Arc<dyn ControlHandler>,
    live: AtomicUsize,
    next_conn_id: AtomicU64,
    stopping: AtomicBool,
    /// Clones of live streams, so shutdown can close them.
    streams: Mutex<Vec<(u64, TcpStream)>>,
    /// Connection threads, so shutdown can wait for their disconnect callbacks.
    threads: Mutex<Vec<JoinHandle<()>>>,
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
        poll: std::time::Duration,
    ) -> std::io::Result<TcpServer> {
        let addr = listener.local_addr()?;
        let services = Arc::new(Services {
            registry,
            poll,
            control,
            live: AtomicUsize::new(0),
            next_conn_id: AtomicU64::new(1),
            stopping: AtomicBool::new(false),
            streams: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
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
        for (_, s) in lock(&self.services.streams).drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
        let threads = std::mem::take(&mut *lock(&self.services.threads));
        for t in threads {
            let _ = t.join();
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
                log::warn!("accept failed: {e}");
                std::thread::sleep(std::time::Duration::from_millis(50));
                continue;
            }
        };
        if services.live.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
            log::warn!("refusing connection: {MAX_CONNECTIONS} already open");
            continue;
        }
        let peer = stream
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "?".into());
        let conn_id = services.next_conn_id.fetch_add(1, Ordering::Relaxed);
        if let Ok(clone) = stream.try_clone() {
            lock(&services.streams).push((conn_id, clone));
        }
        services.live.fetch_add(1, Ordering::SeqCst);
        let s = services.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("fabric-conn {peer}"))
            .spawn(move || {
                let mut conn = ConnectionState::new(conn_id, peer);
                match serve(stream, &mut conn, &s) {
                    Ok(()) => log::debug!("connection {} from {} closed", conn_id, conn.peer),
                    Err(why) => log::info!("closing connection from {}: {}", conn.peer, why),
                }
                s.control.disconnected(&conn);
                lock(&s.streams).retain(|(id, _)| *id != conn_id);
                s.live.fetch_sub(1, Ordering::SeqCst);
            });
        match spawned {
            Ok(handle) => {
                let mut threads = lock(&services.threads);
                threads.retain(|t| !t.is_finished());
                threads.push(handle);
            }
            Err(e) => {
                log::warn!("cannot spawn a connection thread: {e}");
                services.live.fetch_sub(1, Ordering::SeqCst);
                lock(&services.streams).retain(|(id, _)| *id != conn_id);
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

/// Reads the parts of one frame, with [`FRAME_TIMEOUT`] armed on the socket only
/// while a frame is incomplete (arming costs a syscall, so it happens only when the
/// buffered bytes run out mid-frame).
struct FrameReader {
    r: BufReader<TcpStream>,
    armed: bool,
    /// How long to poll for the next request before sleeping.
    poll: std::time::Duration,
}

impl FrameReader {
    fn set_armed(&mut self, armed: bool) -> Result<(), String> {
        if self.armed != armed {
            let t = armed.then_some(FRAME_TIMEOUT);
            self.r
                .get_ref()
                .set_read_timeout(t)
                .map_err(|e| format!("setting the read timeout: {e}"))?;
            self.armed = armed;
        }
        Ok(())
    }

    /// Waits, without a deadline, for the first byte of the next frame.
    /// Ok(false) on a clean end of stream.
    fn next_frame(&mut self) -> Result<bool, String> {
        if self.r.buffer().is_empty() {
            self.set_armed(false)?;
            // A client that just got its completion often sends its next request
            // at once: poll a while before sleeping (see `direct::poll_readable`).
            direct::poll_readable(self.r.get_ref().as_fd(), self.poll, &POLLERS);
        }
        match self.r.fill_buf() {
            Ok(b) => Ok(!b.is_empty()),
            Err(e) => Err(format!("read failed: {e}")),
        }
    }

    /// Reads and discards `len` bytes of a frame already begun, without buffering
    /// them whole.
    fn skip(&mut self, len: usize, what: &str) -> Result<(), String> {
        skip(len, |b| self.rest(b, what))
    }

    /// Reads bytes of a frame already begun; they must come within the deadline.
    fn rest(&mut self, buf: &mut [u8], what: &str) -> Result<(), String> {
        if self.r.buffer().len() < buf.len() {
            self.set_armed(true)?;
        }
        self.r.read_exact(buf).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                format!("{what} stalled for {FRAME_TIMEOUT:?}")
            }
            _ => format!("truncated {what}: {e}"),
        })
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
            if n == 0
                && !direct::wait_readable(self.r.get_ref().as_fd(), FRAME_TIMEOUT)
                    .map_err(truncated)?
            {
                return Err(format!("WRITE payload stalled for {FRAME_TIMEOUT:?}"));
            }
        }
    }
}

/// Completions on their way to the client. Small ones gather in `pending` and go
/// out together; a large READ payload goes from registered memory straight to the
/// socket.
struct Outbox {
    stream: TcpStream,
    pending: Vec<u8>,
    /// The part of a READ payload the socket did not take at once.
    spill: Vec<u8>,
}

impl Outbox {
    fn flush(&mut self) -> Result<(), String> {
        if !self.pending.is_empty() {
            self.stream
                .write_all(&self.pending)
                .map_err(|e| format!("write failed: {e}"))?;
            self.pending.clear();
        }
        Ok(())
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
        write_all_vectored(&mut &self.stream, &mut rest)
            .map_err(|e| format!("write failed: {e}"))?;
        self.pending.clear();
        Ok(())
    }
}

/// Serves one connection until it closes (Ok) or misbehaves (Err with the reason).
fn serve(stream: TcpStream, conn: &mut ConnectionState, s: &Services) -> Result<(), String> {
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let write_half = stream.try_clone().map_err(|e| e.to_string())?;
    let mut r = FrameReader {
        r: BufReader::with_capacity(STREAM_BUFFER, stream),
        armed: false,
        poll: s.poll,
    };
    let mut out = Outbox {
        stream: write_half,
        pending: Vec::with_capacity(STREAM_BUFFER),
        spill: Vec::new(),
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
            OP_SEND => {
                if len > MAX_CONTROL_FRAME {
                    return Err(format!(
                        "control frame of {len} bytes exceeds {MAX_CONTROL_FRAME}"
                    ));
                }
                buf.resize(len, 0);
                r.rest(&mut buf[..len], "control frame")?;
                let reply = s.control.handle(conn, &buf[..len]);
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
