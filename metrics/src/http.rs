//! The metrics endpoint: a minimal HTTP/1.1 server that answers `GET /metrics` with
//! the registry in a Prometheus text format, `GET /` with a pointer to it, and
//! anything else with an error. It is hand-written around `httparse` (the request
//! parser of the hyper project) rather than a server crate because the daemons are
//! synchronous, serve one scrape every few seconds, and must not be harmed by
//! whoever can reach the port; the small server crates (tiny_http) start a thread per
//! connection without bound and read a request line of any length, which this one
//! must not do.
//!
//! One thread serves every connection at once, with non-blocking sockets and
//! poll(2): each connection moves on as its bytes come and go, so a slow one delays
//! no other. (Two worker threads, each served one connection at a time, behind a
//! queue of sixteen: eighteen slow clients that kept reconnecting held every worker
//! and every place in the queue, and scrapes were closed unanswered, issue 54.) What
//! a hostile or broken client can do, and what it costs the daemon:
//!
//! - at most [`MAX_CONNECTIONS`] connections are open, at most [`MAX_PER_SOURCE`]
//!   from one address (an IPv6 /64); a new one past either cap closes the oldest of
//!   its address, or of all, preferring one already answered, then one still sending
//!   its request, and only then one whose answer is going out. Idle or slow
//!   connections, however many, cost a descriptor and at most [`MAX_HEAD`] bytes
//!   each, and a scrape finds room at once;
//! - a request head (request line and headers) must arrive whole within
//!   [`REQUEST_DEADLINE`] of the connection's accept, whatever the pace of its bytes,
//!   and the answer must be taken whole within [`ANSWER_DEADLINE`] of its start;
//!   past either the connection is closed. A head longer than [`MAX_HEAD`] is
//!   answered 431;
//! - anything `httparse` rejects is answered 400; a method other than GET 405; a path
//!   other than `/metrics` or `/` 404. A request body is never read;
//! - answering (encoding the registry) happens on this one thread, a request at a
//!   time, so a flood of requests costs at most one CPU.
//!
//! So a client can neither delay scrapes by more than the time to answer the
//! requests ahead of them, nor grow the daemon's threads or memory beyond the caps;
//! it never touches the daemon's data path, whose threads this server does not share.
//!
//! Format: OpenMetrics 1.0 text when the request's `Accept` asks for
//! `application/openmetrics-text` (as Prometheus does), else the Prometheus text
//! format 0.0.4 (what `curl` and older scrapers read).

use prometheus_client::encoding::{prometheus_text, text};
use prometheus_client::registry::Registry;
use rmemfs_common::admission::Source;
use rmemfs_common::throttle::{and_more, Throttle, LOG_EVERY};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most connections open at once.
pub const MAX_CONNECTIONS: usize = 256;
/// Most connections open at once from one address (an IPv6 /64).
pub const MAX_PER_SOURCE: usize = 32;
/// Largest request head (request line and headers) read.
pub const MAX_HEAD: usize = 8192;
/// Most headers a request may carry.
pub const MAX_HEADERS: usize = 64;
/// Time a client has from connecting to send its whole request head.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// Time a client has to take the whole answer.
pub const ANSWER_DEADLINE: Duration = Duration::from_secs(5);
/// After answering, how long unread bytes of the client's are read and dropped, so
/// that closing does not reset the connection before the client has the answer.
const LINGER: Duration = Duration::from_millis(200);
/// How long accepting pauses after it failed (out of descriptors and the like), so
/// that a listener that stays readable does not spin the loop.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);
/// The longest poll(2) wait, so a stop is noticed even if its wake-up connection is
/// not.
const TICK: Duration = Duration::from_secs(1);

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The caps and deadlines of a server (the constants above; tests shorten them).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub connections: usize,
    pub per_source: usize,
    pub request_deadline: Duration,
    pub answer_deadline: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            connections: MAX_CONNECTIONS,
            per_source: MAX_PER_SOURCE,
            request_deadline: REQUEST_DEADLINE,
            answer_deadline: ANSWER_DEADLINE,
        }
    }
}

/// A running metrics endpoint; stops when dropped.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Listens on `listen` (`HOST:PORT`; port 0 picks a free port, see
    /// [`MetricsServer::local_addr`]) and serves `registry` from a background thread.
    pub fn start(listen: &str, registry: Registry) -> io::Result<MetricsServer> {
        MetricsServer::start_with(listen, registry, Limits::default())
    }

    pub(crate) fn start_with(
        listen: &str,
        registry: Registry,
        limits: Limits,
    ) -> io::Result<MetricsServer> {
        let listener = TcpListener::bind(listen)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        // Beside whatever else the process holds (the fabric server asks for its own).
        rmemfs_common::fdlimit::ensure(
            limits.connections + 256,
            &format!("up to {} metrics connections", limits.connections),
        );
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            let mut server = EventLoop {
                listener,
                registry,
                limits,
                conns: Vec::new(),
                accept_paused_until: None,
                evictions: Throttle::new(LOG_EVERY),
                accept_failures: Throttle::new(LOG_EVERY),
            };
            std::thread::Builder::new()
                .name("metrics http".into())
                .spawn(move || server.run(&stop))?
        };
        Ok(MetricsServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The address actually listened on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the thread with a connection of our own (else it notices within a
        // tick); it closes every connection as it ends.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Where a connection is.
enum Phase {
    /// Its request head arriving.
    Reading(Vec<u8>),
    /// Its answer going out: the bytes and how many are sent.
    Writing(Vec<u8>, usize),
    /// Answered: what the client still sends is dropped until it closes or the
    /// linger ends.
    Lingering,
}

impl Phase {
    /// Which connection makes room first: one already answered, then one still
    /// sending its request, then one whose answer is going out.
    fn eviction_rank(&self) -> u8 {
        match self {
            Phase::Lingering => 0,
            Phase::Reading(_) => 1,
            Phase::Writing(..) => 2,
        }
    }
}

struct Conn {
    stream: TcpStream,
    source: Source,
    since: Instant,
    phase: Phase,
    /// When the current phase must be over.
    deadline: Instant,
}

/// The serving thread's state.
struct EventLoop {
    listener: TcpListener,
    registry: Registry,
    limits: Limits,
    /// In accept order: the first is the oldest.
    conns: Vec<Conn>,
    accept_paused_until: Option<Instant>,
    evictions: Throttle,
    accept_failures: Throttle,
}

impl EventLoop {
    fn run(&mut self, stop: &AtomicBool) {
        let mut fds: Vec<libc::pollfd> = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            let now = Instant::now();
            self.conns.retain(|c| c.deadline > now);
            if self.accept_paused_until.is_some_and(|t| t <= now) {
                self.accept_paused_until = None;
            }
            fds.clear();
            fds.push(libc::pollfd {
                fd: self.listener.as_raw_fd(),
                events: if self.accept_paused_until.is_some() {
                    0
                } else {
                    libc::POLLIN
                },
                revents: 0,
            });
            fds.extend(self.conns.iter().map(|c| libc::pollfd {
                fd: c.stream.as_raw_fd(),
                events: match c.phase {
                    Phase::Writing(..) => libc::POLLOUT,
                    _ => libc::POLLIN,
                },
                revents: 0,
            }));
            let next = self
                .conns
                .iter()
                .map(|c| c.deadline)
                .chain(self.accept_paused_until)
                .min()
                .map_or(TICK, |t| t.saturating_duration_since(now).min(TICK));
            let ms = next.as_micros().div_ceil(1000) as libc::c_int;
            // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()`
            // pollfds for the duration of the call.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    log::warn!("metrics: poll failed: {e}");
                    std::thread::sleep(ACCEPT_PAUSE);
                }
                continue;
            }
            if stop.load(Ordering::SeqCst) {
                break;
            }
            // The connections first (`fds[1..]` are theirs, in order), then the
            // newcomers, so that a request already here is answered before room is
            // made for them.
            let mut i = 0;
            let registry = &self.registry;
            let answer_deadline = self.limits.answer_deadline;
            self.conns.retain_mut(|c| {
                i += 1;
                fds[i].revents == 0 || c.progress(registry, answer_deadline)
            });
            if fds[0].revents != 0 {
                self.accept_all();
            }
        }
    }

    /// Accepts every connection waiting, making room for each.
    fn accept_all(&mut self) {
        loop {
            let (stream, peer) = match self.listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    if let Some(n) = self.accept_failures.check() {
                        log::warn!("metrics: accept failed: {e}{}", and_more(n));
                    }
                    self.accept_paused_until = Some(Instant::now() + ACCEPT_PAUSE);
                    return;
                }
            };
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let source = Source::of(peer.ip());
            self.make_room(source, peer);
            let now = Instant::now();
            self.conns.push(Conn {
                stream,
                source,
                since: now,
                phase: Phase::Reading(Vec::new()),
                deadline: now + self.limits.request_deadline,
            });
        }
    }

    /// Closes a connection when a new one from `source` would pass a cap.
    fn make_room(&mut self, source: Source, peer: SocketAddr) {
        let from_source = self.conns.iter().filter(|c| c.source == source).count();
        let (cap, what) = if from_source >= self.limits.per_source {
            (self.limits.per_source, "per address")
        } else if self.conns.len() >= self.limits.connections {
            (self.limits.connections, "in all")
        } else {
            return;
        };
        let victim = self
            .conns
            .iter()
            .enumerate()
            .filter(|(_, c)| what == "in all" || c.source == source)
            .min_by_key(|(i, c)| (c.phase.eviction_rank(), *i))
            .map(|(i, _)| i);
        let Some(victim) = victim else { return };
        let old = self.conns.remove(victim);
        if let Some(n) = self.evictions.check() {
            log::warn!(
                "metrics: closed a connection from {} open {:.1?} for a newer one from \
                 {peer} (at most {cap} {what}){}",
                old.source,
                old.since.elapsed(),
                and_more(n)
            );
        }
        old.close();
    }
}

impl Conn {
    /// Moves the connection on as far as its socket allows. false when it is done
    /// (closed by the client, failed, or answered and let go).
    fn progress(&mut self, registry: &Registry, answer_deadline: Duration) -> bool {
        loop {
            match &mut self.phase {
                Phase::Reading(head) => {
                    let mut chunk = [0u8; 2048];
                    let room = (MAX_HEAD - head.len()).min(chunk.len());
                    match self.stream.read(&mut chunk[..room]) {
                        // Closed before a whole request: nothing to answer.
                        Ok(0) => return false,
                        Ok(n) => head.extend_from_slice(&chunk[..n]),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => {
                            log::debug!("metrics: reading a request: {e}");
                            return false;
                        }
                    }
                    let answer = match parse_and_answer(head, registry) {
                        Some(a) => a,
                        None if head.len() == MAX_HEAD => {
                            Answer::error(431, "Request Header Fields Too Large")
                        }
                        None => continue,
                    };
                    self.phase = Phase::Writing(answer.render(), 0);
                    self.deadline = Instant::now() + answer_deadline;
                }
                Phase::Writing(out, sent) => match self.stream.write(&out[*sent..]) {
                    Ok(n) => {
                        *sent += n;
                        if *sent == out.len() {
                            // Then drop what the client still sends for a moment, so
                            // the close is not a reset that could cut the answer off
                            // on its side.
                            let _ = self.stream.shutdown(Shutdown::Write);
                            self.phase = Phase::Lingering;
                            self.deadline = Instant::now() + LINGER;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        log::debug!("metrics: writing an answer: {e}");
                        return false;
                    }
                },
                Phase::Lingering => {
                    let mut sink = [0u8; 4096];
                    match self.stream.read(&mut sink) {
                        Ok(0) => return false,
                        Ok(_) => {}
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => return false,
                    }
                }
            }
        }
    }

    /// Closes the connection to make room; an answered one's unread bytes are
    /// dropped first, so that its answer is not cut off by a reset.
    fn close(mut self) {
        if matches!(self.phase, Phase::Lingering) {
            let mut sink = [0u8; 4096];
            while matches!(self.stream.read(&mut sink), Ok(n) if n > 0) {}
        }
    }
}

/// An answer: status, extra header lines, content type and body.
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    status: u16,
    reason: &'static str,
    headers: &'static str,
    content_type: &'static str,
    body: String,
}

impl Answer {
    fn error(status: u16, reason: &'static str) -> Answer {
        Answer {
            status,
            reason,
            headers: "",
            content_type: "text/plain; charset=utf-8",
            body: format!("{status} {reason}\n"),
        }
    }

    /// The whole answer as sent: status line, headers and body.
    fn render(&self) -> Vec<u8> {
        let mut out = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{}Connection: close\r\n\r\n",
            self.status,
            self.reason,
            self.content_type,
            self.body.len(),
            self.headers
        )
        .into_bytes();
        out.extend_from_slice(self.body.as_bytes());
        out
    }
}

/// The answer to the request head in `bytes`, or `None` while it is incomplete.
fn parse_and_answer(bytes: &[u8], registry: &Registry) -> Option<Answer> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(bytes) {
        Ok(httparse::Status::Partial) => None,
        Ok(httparse::Status::Complete(_)) => Some(answer(&req, registry)),
        Err(httparse::Error::TooManyHeaders) => {
            Some(Answer::error(431, "Request Header Fields Too Large"))
        }
        Err(_) => Some(Answer::error(400, "Bad Request")),
    }
}

fn answer(req: &httparse::Request<'_, '_>, registry: &Registry) -> Answer {
    let path = req.path.unwrap_or("");
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    if req.method != Some("GET") {
        let mut a = Answer::error(405, "Method Not Allowed");
        a.headers = "Allow: GET\r\n";
        return a;
    }
    match path {
        "/metrics" => {
            let openmetrics = req.headers.iter().any(|h| {
                h.name.eq_ignore_ascii_case("accept")
                    && String::from_utf8_lossy(h.value).contains("application/openmetrics-text")
            });
            let mut body = String::new();
            let (encoded, content_type) = if openmetrics {
                (text::encode(&mut body, registry), OPENMETRICS)
            } else {
                (
                    prometheus_text::encode(&mut body, registry),
                    prometheus_text::CONTENT_TYPE,
                )
            };
            match encoded {
                Ok(()) => Answer {
                    status: 200,
                    reason: "OK",
                    headers: "",
                    content_type,
                    body,
                },
                Err(_) => Answer::error(500, "Internal Server Error"),
            }
        }
        "/" => Answer {
            status: 200,
            reason: "OK",
            headers: "",
            content_type: "text/plain; charset=utf-8",
            body: "rmemfs metrics: GET /metrics\n".into(),
        },
        _ => Answer::error(404, "Not Found"),
    }
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
