use super::*;
use crate::family;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

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
fn a_flood_of_connections_is_shed_and_serving_resumes() {
    let s = server();
    // Far more idle connections than workers and queue: the surplus is closed.
    let idle: Vec<TcpStream> = (0..4 * (WORKERS + QUEUE))
        .filter_map(|_| TcpStream::connect(s.local_addr()).ok())
        .collect();
    assert!(!idle.is_empty());
    drop(idle);
    let deadline = Instant::now() + 3 * REQUEST_DEADLINE;
    loop {
        let mut c = TcpStream::connect(s.local_addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = c.write_all(b"GET /metrics HTTP/1.1\r\n\r\n");
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        if out.starts_with("HTTP/1.1 200 OK") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no scrape answered after the flood"
        );
        std::thread::sleep(Duration::from_millis(50));
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
