//! The daemons' metrics endpoints (`--metrics`) as a test sees them: raw HTTP
//! exchanges over TCP (so a test can send what no HTTP client would) and scrapes
//! parsed strictly ([`crate::exposition`]). Every exchange is bounded by a timeout.

use crate::exposition::{self, Exposition, Format};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// How long one exchange may take.
const HTTP_LIMIT: Duration = Duration::from_secs(20);

/// An HTTP answer: status code, head (status line and headers) and body.
#[derive(Debug, Clone)]
pub struct HttpAnswer {
    pub status: u16,
    pub head: String,
    pub body: String,
}

/// Sends `request` as it is to `addr` and reads the answer until the server closes.
#[track_caller]
pub fn exchange(addr: &str, request: &[u8]) -> HttpAnswer {
    let mut c = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    c.set_read_timeout(Some(HTTP_LIMIT))
        .expect("a read timeout");
    c.set_write_timeout(Some(HTTP_LIMIT))
        .expect("a write timeout");
    c.write_all(request)
        .unwrap_or_else(|e| panic!("sending a request to {addr}: {e}"));
    let mut raw = Vec::new();
    c.read_to_end(&mut raw)
        .unwrap_or_else(|e| panic!("reading the answer of {addr}: {e}"));
    let text =
        String::from_utf8(raw).unwrap_or_else(|e| panic!("the answer of {addr} is not UTF-8: {e}"));
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("the answer of {addr} has no end of head: {text:?}"));
    let status = head
        .strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("the answer of {addr} has no HTTP/1.1 status line: {head:?}"));
    HttpAnswer {
        status,
        head: head.to_string(),
        body: body.to_string(),
    }
}

/// `GET /metrics` in `format` (OpenMetrics when asked for it in `Accept`), checked
/// (200, the format's content type, a body of the announced length) and parsed
/// strictly; panics showing the text when any of that fails.
#[track_caller]
pub fn scrape(addr: &str, format: Format) -> Exposition {
    let accept = match format {
        Format::OpenMetrics => "application/openmetrics-text;version=1.0.0,text/plain;q=0.5",
        Format::Prometheus => "text/plain",
    };
    let req = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nAccept: {accept}\r\n\r\n");
    let a = exchange(addr, req.as_bytes());
    assert_eq!(
        a.status, 200,
        "GET /metrics of {addr}: {}\n{}",
        a.head, a.body
    );
    let content_type = match format {
        Format::OpenMetrics => "Content-Type: application/openmetrics-text; version=1.0.0",
        Format::Prometheus => "Content-Type: text/plain; version=0.0.4",
    };
    assert!(a.head.contains(content_type), "{addr}: {}", a.head);
    let length = format!("Content-Length: {}\r\n", a.body.len());
    assert!(
        format!("{}\r\n", a.head).contains(&length),
        "{addr}: the body is not as long as announced: {}",
        a.head
    );
    exposition::parse(&a.body, format).unwrap_or_else(|e| {
        panic!(
            "the metrics of {addr} do not parse as {format:?}: {e}\n{}",
            a.body
        )
    })
}
