use super::*;
use crate::family;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Debug)]
struct One;

impl Collector for One {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        family::counter(&mut enc, "test_requests", "Requests.", None, 42)
    }
}

fn server() -> MetricsServer {
    let mut reg = Registry::default();
    reg.register_collector(Box::new(One));
    MetricsServer::start("127.0.0.1:0", reg).expect("binds a free port")
}

/// Sends `bytes` and returns everything the server answers until it closes.
fn exchange(s: &MetricsServer, bytes: &[u8]) -> String {
    let mut c = TcpStream::connect(s.local_addr()).expect("connects");
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(bytes).expect("sends");
    let mut out = Vec::new();
    c.read_to_end(&mut out)
        .expect("reads the answer to its end");
    String::from_utf8(out).expect("the answer is UTF-8")
}

fn status_line(answer: &str) -> &str {
    answer.split("\r\n").next().unwrap_or("")
}

#[test]
fn get_metrics_answers_the_prometheus_text_format_by_default() {
    let s = server();
    let a = exchange(&s, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status_line(&a), "HTTP/1.1 200 OK", "{a}");
    assert!(a.contains("Content-Type: text/plain; version=0.0.4"), "{a}");
    assert!(a.contains("\r\n\r\n"), "{a}");
    let body = a.split_once("\r\n\r\n").unwrap().1;
    assert!(
        body.lines().any(|l| l == "test_requests_total 42"),
        "{body}"
    );
    assert!(!body.contains("# EOF"), "{body}");
    let len = format!("Content-Length: {}\r\n", body.len());
    assert!(a.contains(&len), "{a}");
}

#[test]
fn openmetrics_is_served_to_a_scraper_that_asks_for_it() {
    let s = server();
    let a = exchange(
        &s,
        b"GET /metrics?x=1 HTTP/1.0\r\nAccept: application/openmetrics-text;version=1.0.0,text/plain;q=0.5\r\n\r\n",
    );
    assert_eq!(status_line(&a), "HTTP/1.1 200 OK", "{a}");
    assert!(
        a.contains("Content-Type: application/openmetrics-text"),
        "{a}"
    );
    assert!(a.ends_with("# EOF\n"), "{a}");
}

#[test]
fn the_root_points_to_the_metrics_and_other_paths_are_not_found() {
    let s = server();
    let a = exchange(&s, b"GET / HTTP/1.1\r\n\r\n");
    assert_eq!(status_line(&a), "HTTP/1.1 200 OK", "{a}");
    assert!(a.contains("/metrics"), "{a}");
    for path in ["/metricsx", "/metrics/", "/../etc/passwd", "*"] {
        let a = exchange(&s, format!("GET {path} HTTP/1.1\r\n\r\n").as_bytes());
        assert_eq!(status_line(&a), "HTTP/1.1 404 Not Found", "{path}: {a}");
    }
}

#[test]
fn other_methods_are_refused() {
    let s = server();
    for method in ["POST", "HEAD", "PUT", "DELETE", "OPTIONS"] {
        let a = exchange(
            &s,
            format!("{method} /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc").as_bytes(),
        );
        assert_eq!(
            status_line(&a),
            "HTTP/1.1 405 Method Not Allowed",
            "{method}: {a}"
        );
        assert!(a.contains("Allow: GET\r\n"), "{a}");
    }
}

#[test]
fn malformed_requests_get_400_and_the_server_keeps_serving() {
    let s = server();
    for garbage in [
        &b"\x00\x01\x02\xff\xfe garbage\r\n\r\n"[..],
        b"GET\r\n\r\n",
        b"GET /metrics HTTP/9.9\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nBad Header\r\n\r\n",
        b"GET /met rics HTTP/1.1\r\n\r\n",
    ] {
        let a = exchange(&s, garbage);
        assert_eq!(
            status_line(&a),
            "HTTP/1.1 400 Bad Request",
            "{garbage:?}: {a}"
        );
    }
    let a = exchange(&s, b"GET /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(status_line(&a), "HTTP/1.1 200 OK", "{a}");
}

#[test]
fn an_oversized_head_or_too_many_headers_get_431() {
    let s = server();
    let mut long = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
    long.resize(MAX_HEAD * 4, b'a');
    let a = exchange(&s, &long);
    assert_eq!(
        status_line(&a),
        "HTTP/1.1 431 Request Header Fields Too Large",
        "{}",
        &a[..a.len().min(200)]
    );
    let mut many = b"GET /metrics HTTP/1.1\r\n".to_vec();
    for i in 0..MAX_HEADERS + 1 {
        many.extend_from_slice(format!("X{i}: y\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    let a = exchange(&s, &many);
    assert_eq!(
        status_line(&a),
        "HTTP/1.1 431 Request Header Fields Too Large",
        "{a}"
    );
}

#[test]
fn a_silent_client_does_not_stop_scrapes() {
    let s = server();
    // One worker waits on a client that sends half a request and then nothing.
    let mut silent = TcpStream::connect(s.local_addr()).unwrap();
    silent.write_all(b"GET /metr").unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    let a = exchange(&s, b"GET /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(status_line(&a), "HTTP/1.1 200 OK", "{a}");
    assert!(
        started.elapsed() < REQUEST_DEADLINE,
        "the scrape waited for the silent client"
    );
}

#[test]
fn a_flood_of_idle_connections_closes_the_oldest_and_a_scrape_answers_at_once() {
    let s = server();
    // Twice as many idle connections as one address may hold: its oldest are closed.
    let mut idle: Vec<TcpStream> = (0..2 * MAX_PER_SOURCE)
        .map(|_| TcpStream::connect(s.local_addr()).expect("connects"))
        .collect();
    let a = exchange(&s, b"GET /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(status_line(&a), "HTTP/1.1 200 OK", "{a}");
    idle[0]
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut sink = Vec::new();
    assert!(
        matches!(idle[0].read_to_end(&mut sink), Ok(0) | Err(_)),
        "the oldest idle connection was closed, unanswered"
    );
}

/// A connection to `s` from the loopback address `from` (127.0.0.x).
fn connect_from(from: &str, s: SocketAddr) -> io::Result<TcpStream> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    let local: SocketAddr = format!("{from}:0").parse().expect("an address");
    socket.bind(&local.into())?;
    socket.connect(&s.into())?;
    Ok(socket.into())
}

/// Until `stop`: connects from `from`, sends `request` and reads what comes back a
/// byte every 20 ms until the server closes the connection, then does it again.
fn slow_client(addr: SocketAddr, from: String, request: &'static [u8], stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::SeqCst) {
        let Ok(mut c) = connect_from(&from, addr) else {
            continue;
        };
        let _ = c.set_read_timeout(Some(Duration::from_millis(20)));
        let _ = c.write_all(request);
        let mut byte = [0u8; 1];
        while !stop.load(Ordering::SeqCst) {
            match c.read(&mut byte) {
                Ok(0) => break,
                Ok(_) => std::thread::sleep(Duration::from_millis(20)),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break,
            }
        }
    }
}

#[test]
fn slow_clients_that_keep_reconnecting_do_not_stop_scrapes() {
    let mut reg = Registry::default();
    reg.register_collector(Box::new(One));
    // Deadlines short enough that the slow clients are closed and come back many
    // times during the test.
    let s = MetricsServer::start_with(
        "127.0.0.1:0",
        reg,
        Limits {
            request_deadline: Duration::from_millis(200),
            answer_deadline: Duration::from_millis(200),
            ..Limits::default()
        },
    )
    .expect("binds a free port");
    let stop = Arc::new(AtomicBool::new(false));
    // Far more than the two workers and sixteen queued connections of old, from the
    // scraper's own address and from another: half-requests that never end, and
    // whole ones whose answers are read a byte at a time.
    let clients: Vec<_> = (0..48)
        .map(|i| {
            let from = format!("127.0.0.{}", 1 + i % 2);
            let request: &'static [u8] = if i % 3 == 0 {
                b"GET /metrics HTTP/1.1\r\n\r\n"
            } else {
                b"GET /metr"
            };
            let (addr, stop) = (s.local_addr(), stop.clone());
            std::thread::spawn(move || slow_client(addr, from, request, stop))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..20 {
        let a = exchange(&s, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert_eq!(status_line(&a), "HTTP/1.1 200 OK", "{a}");
    }
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.join().expect("a slow client");
    }
}

#[test]
fn dropping_the_server_stops_listening() {
    let s = server();
    let addr = s.local_addr();
    drop(s);
    // The port is closed: a connection is refused (or, at worst, never answered).
    if let Ok(mut c) = TcpStream::connect(addr) {
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let _ = c.write_all(b"GET /metrics HTTP/1.1\r\n\r\n");
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        assert!(!out.starts_with("HTTP/1.1 200"), "still served: {out}");
    }
}
