//! The metrics endpoint: a minimal HTTP/1.1 server that answers `GET /metrics` with
//! the registry in a Prometheus text format, `GET /` with a pointer to it, and
//! anything else with an error. It is hand-written around `httparse` (the request
//! parser of the hyper project) rather than a server crate because the daemons are
//! synchronous, serve one scrape every few seconds, and must not be harmed by
//! whoever can reach the port; the small server crates (tiny_http) start a thread per
//! connection without bound and read a request line of any length, which this one
//! must not do.
//!
//! What a hostile or broken client can do, and what it costs the daemon:
//!
//! - connections are served by [`WORKERS`] threads, one request each (`Connection:
//!   close`); the accept thread hands them over through a queue of [`QUEUE`] and
//!   closes any connection that finds it full, so connections never make threads or
//!   memory grow;
//! - a request head (request line and headers) is read into a fixed buffer of
//!   [`MAX_HEAD`] bytes within [`REQUEST_DEADLINE`] in all, whatever the pace of its
//!   bytes; a longer head is answered 431, a slower one is closed unanswered;
//! - anything `httparse` rejects is answered 400; a method other than GET 405; a path
//!   other than `/metrics` or `/` 404. A request body is never read.
//!
//! So at worst a client that holds every worker delays scrapes by the deadline; it
//! never touches the daemon's data path, whose threads this server does not share.
//!
//! Format: OpenMetrics 1.0 text when the request's `Accept` asks for
//! `application/openmetrics-text` (as Prometheus does), else the Prometheus text
//! format 0.0.4 (what `curl` and older scrapers read).

use prometheus_client::encoding::{prometheus_text, text};
use prometheus_client::registry::Registry;
use rmemfs_common::sync::lock;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Threads serving requests.
pub const WORKERS: usize = 2;
/// Accepted connections waiting for a worker; more are closed at once.
pub const QUEUE: usize = 16;
/// Largest request head (request line and headers) read.
pub const MAX_HEAD: usize = 8192;
/// Most headers a request may carry.
pub const MAX_HEADERS: usize = 64;
/// Time a client has to send its whole request head, and for each write of the answer.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// After answering, how long unread bytes of the client's are read and dropped, so
/// that closing does not reset the connection before the client has the answer.
const LINGER: Duration = Duration::from_millis(200);

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A running metrics endpoint; stops accepting when dropped.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Listens on `listen` (`HOST:PORT`; port 0 picks a free port, see
    /// [`MetricsServer::local_addr`]) and serves `registry` from background threads.
    pub fn start(listen: &str, registry: Registry) -> io::Result<MetricsServer> {
        let listener = TcpListener::bind(listen)?;
        let addr = listener.local_addr()?;
        let registry = Arc::new(registry);
        let (tx, rx) = mpsc::sync_channel::<TcpStream>(QUEUE);
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..WORKERS {
            let rx = rx.clone();
            let registry = registry.clone();
            std::thread::Builder::new()
                .name(format!("metrics http {i}"))
                .spawn(move || work(&rx, &registry))?;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let accept = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("metrics accept".into())
                .spawn(move || accept_loop(&listener, &tx, &stop))?
        };
        Ok(MetricsServer {
            addr,
            stop,
            accept: Some(accept),
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
        // Wake the accept thread with a connection of our own; if that fails the
        // thread is left to end with the process rather than waited for.
        let woke = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1)).is_ok();
        if let Some(t) = self.accept.take() {
            if woke {
                let _ = t.join();
            }
        }
        // The workers end once the queue's sender (the accept thread's) is gone and
        // their connection, if any, is done; they are not waited for.
    }
}

fn accept_loop(listener: &TcpListener, queue: &SyncSender<TcpStream>, stop: &AtomicBool) {
    loop {
        let conn = listener.accept();
        if stop.load(Ordering::SeqCst) {
            return;
        }
        match conn {
            Ok((stream, _)) => match queue.try_send(stream) {
                Ok(()) => {}
                Err(TrySendError::Full(stream)) => {
                    log::debug!("metrics: every worker is busy, closing a connection");
                    drop(stream);
                }
                Err(TrySendError::Disconnected(_)) => return,
            },
            Err(e) => {
                // Out of descriptors and the like: do not spin on it.
                log::debug!("metrics: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

fn work(queue: &Mutex<Receiver<TcpStream>>, registry: &Registry) {
    loop {
        let next = lock(queue).recv();
        let Ok(stream) = next else { return };
        if let Err(e) = serve(stream, registry) {
            log::debug!("metrics: {e}");
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
}

/// Reads one request from `stream` and answers it.
fn serve(mut stream: TcpStream, registry: &Registry) -> io::Result<()> {
    stream.set_write_timeout(Some(REQUEST_DEADLINE))?;
    let deadline = Instant::now() + REQUEST_DEADLINE;
    let mut buf = vec![0u8; MAX_HEAD];
    let mut len = 0;
    let answer = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "a client sent no whole request in time",
            ));
        }
        stream.set_read_timeout(Some(left))?;
        let n = stream.read(&mut buf[len..])?;
        if n == 0 {
            return Ok(()); // closed before a whole request: nothing to answer
        }
        len += n;
        if let Some(answer) = parse_and_answer(&buf[..len], registry) {
            break answer;
        }
        if len == buf.len() {
            break Answer::error(431, "Request Header Fields Too Large");
        }
    };
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{}Connection: close\r\n\r\n",
        answer.status,
        answer.reason,
        answer.content_type,
        answer.body.len(),
        answer.headers
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(answer.body.as_bytes())?;
    stream.flush()?;
    stream.shutdown(Shutdown::Write)?;
    // Drop what the client still sends for a moment, so the close is not a reset
    // that could cut the answer off on its side.
    stream.set_read_timeout(Some(LINGER))?;
    let mut sink = [0u8; 4096];
    let until = Instant::now() + LINGER;
    while Instant::now() < until {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    Ok(())
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
