//! The daemons' Prometheus endpoints (`--metrics 127.0.0.1:0`), end to end: a
//! memnode and an fsd announce where they serve, every scrape parses strictly in
//! both text formats, the counters move as the test writes and reads a file through
//! the mount, and requests no scraper would send get an error while the daemons keep
//! serving.

use rmemfs_tests::binaries::binary;
use rmemfs_tests::config::BLOCK;
use rmemfs_tests::exposition::{Exposition, Format};
use rmemfs_tests::metrics::{exchange, scrape};
use rmemfs_tests::{poll_until, FsdMount, MemnodeProc, Pattern, MIB};
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

const CACHE: u64 = 8 * MIB;
/// Four times the cache: most of it must leave the cache for remote memory.
const FILE: u64 = 32 * MIB;
const PIECE: usize = MIB as usize;

/// Both formats of one endpoint, parsed; the OpenMetrics one is returned.
#[track_caller]
fn scrape_both(addr: &str) -> Exposition {
    let prom = scrape(addr, Format::Prometheus);
    assert!(!prom.families.is_empty(), "{addr} serves no metrics");
    scrape(addr, Format::OpenMetrics)
}

fn fuse_count(e: &Exposition, kind: &str) -> f64 {
    e.get("rmemfs_fuse_request_seconds_count", &[("kind", kind)])
}

fn remote(e: &Exposition, what: &str, op: &str) -> f64 {
    e.get(what, &[("op", op)])
}

#[test]
fn counters_move_with_traffic_and_every_scrape_parses() {
    let memnode = MemnodeProc::start_with("256M", &["--metrics", "127.0.0.1:0"]);
    let cache = CACHE.to_string();
    let fsd = FsdMount::with_memnode(
        &memnode,
        &[
            "--metrics",
            "127.0.0.1:0",
            "--cache",
            &cache,
            "--chunk-size",
            "4M",
        ],
    );
    let (fa, ma) = (
        fsd.metrics_addr().to_string(),
        memnode.metrics_addr().to_string(),
    );
    println!("fsd metrics on {fa}, memnode metrics on {ma}");

    let f0 = scrape_both(&fa);
    let m0 = scrape_both(&ma);
    assert_eq!(
        f0.get("rmemfs_memnode_up", &[("memnode", memnode.addr())]),
        1.0,
        "fsd shows its memnode up"
    );
    assert_eq!(
        f0.get("rmemfs_cache_capacity_pages", &[]),
        (CACHE / BLOCK) as f64
    );
    assert_eq!(
        m0.get("memnode_capacity_bytes", &[]),
        memnode.capacity() as f64
    );

    // Write a file four times the cache, in 1 MiB write(2)s.
    let pattern = Pattern::for_test("metrics");
    let path = fsd.join("data");
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
    let pieces = FILE / PIECE as u64;
    for i in 0..pieces {
        file.write_all(&pattern.bytes(i * PIECE as u64, PIECE))
            .unwrap_or_else(|e| panic!("writing piece {i} of {}: {e}", path.display()));
    }
    // What the cache cannot hold has been written back to remote memory by now.
    let f1 = scrape_both(&fa);
    let written = remote(&f1, "rmemfs_remote_bytes_total", "write")
        - remote(&f0, "rmemfs_remote_bytes_total", "write");
    assert!(
        written >= (FILE - CACHE) as f64,
        "after writing {FILE} bytes through a cache of {CACHE}, at least {} must have gone \
         to remote memory, but fsd counts {written}",
        FILE - CACHE
    );
    let fuse_writes = fuse_count(&f1, "write") - fuse_count(&f0, "write");
    assert!(
        fuse_writes >= pieces as f64,
        "{pieces} write(2)s reached fsd as at least as many FUSE writes, but the histogram \
         counts {fuse_writes}"
    );

    // Everything to remote memory, then read it all back.
    file.sync_all().expect("fsync");
    drop(file);
    let mut back = std::fs::File::open(&path).expect("open for reading");
    let mut buf = vec![0u8; PIECE];
    for i in 0..pieces {
        back.read_exact(&mut buf)
            .unwrap_or_else(|e| panic!("reading piece {i}: {e}"));
        assert!(
            buf == pattern.bytes(i * PIECE as u64, PIECE),
            "piece {i} reads back other bytes"
        );
    }
    drop(back);

    let f2 = scrape_both(&fa);
    let written = remote(&f2, "rmemfs_remote_bytes_total", "write")
        - remote(&f0, "rmemfs_remote_bytes_total", "write");
    assert!(
        written >= FILE as f64,
        "after fsync the whole file ({FILE} bytes) was written to remote memory, but fsd \
         counts {written}"
    );
    for kind in ["read", "sync", "open", "modify"] {
        let grew = fuse_count(&f2, kind) - fuse_count(&f0, kind);
        assert!(grew >= 1.0, "no FUSE request of kind {kind} was timed");
    }
    assert!(
        fuse_count(&f2, "read") - fuse_count(&f0, "read") >= pieces as f64,
        "{pieces} read(2)s of 1 MiB reached fsd as at least as many FUSE reads"
    );
    assert!(f2.get("rmemfs_fuse_request_seconds_sum", &[("kind", "write")]) > 0.0);
    assert!(f2.get("rmemfs_file_bytes_total", &[("op", "write")]) >= FILE as f64);
    assert!(f2.get("rmemfs_cache_writebacks_total", &[]) > 0.0);
    assert!(f2.get("rmemfs_blocks", &[]) >= 0.0);

    // Each remote operation is timed once: at rest the latency histogram counts
    // exactly the operations the traffic counter does.
    let settled = poll_until(Duration::from_secs(10), || {
        let e = scrape(&fa, Format::OpenMetrics);
        let ops = remote(&e, "rmemfs_remote_operations_total", "write");
        let timed = remote(&e, "rmemfs_remote_operation_seconds_count", "write");
        (ops == timed && ops > 0.0).then_some(())
    });
    assert!(
        settled.is_some(),
        "the remote WRITE histogram's count never matched the WRITE counter"
    );

    // The memnode lent memory for the file, and fsd learns of it from its heartbeat.
    let m2 = scrape_both(&ma);
    let used0 = m0.get("memnode_used_bytes", &[]);
    let used2 = m2.get("memnode_used_bytes", &[]);
    assert!(
        used2 >= used0 + FILE as f64,
        "the memnode's used bytes should grow by the file's {FILE} bytes, from {used0} to \
         {used2}"
    );
    let allocs = |e: &Exposition| e.get("memnode_control_requests_total", &[("request", "alloc")]);
    assert!(allocs(&m2) > allocs(&m0), "no Alloc reached the memnode");
    let seen = poll_until(Duration::from_secs(10), || {
        let e = scrape(&fa, Format::Prometheus);
        let used = e.value("rmemfs_memnode_used_bytes", &[("memnode", memnode.addr())])?;
        (used >= FILE as f64).then_some(())
    });
    assert!(
        seen.is_some(),
        "fsd never showed the memnode's memory in use"
    );

    // Requests no scraper sends: an error each, and the endpoints keep serving.
    for addr in [&fa, &ma] {
        for (request, status) in [
            (
                &b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n"[..],
                400,
            ),
            (b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n", 400),
            (b"GET /nothing HTTP/1.1\r\n\r\n", 404),
            (
                b"POST /metrics HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi",
                405,
            ),
        ] {
            let a = exchange(addr, request);
            assert_eq!(
                a.status, status,
                "{addr} answered {request:?} with {}",
                a.head
            );
        }
        // A client that sends half a request and then nothing does not stop a scrape.
        let mut silent = TcpStream::connect(addr.as_str()).expect("connects");
        silent.write_all(b"GET /met").expect("sends");
        scrape_both(addr);
        drop(silent);
    }
    assert!(
        scrape_both(&fa).get("rmemfs_file_bytes_total", &[("op", "read")]) >= FILE as f64,
        "fsd still serves its metrics after the bad requests"
    );
    fsd.unmount();
}

#[test]
fn an_embedded_memnode_s_metrics_come_with_fsd_s() {
    let fsd = FsdMount::start(&["--metrics", "127.0.0.1:0", "--embedded-size", "64M"]);
    let e = scrape_both(fsd.metrics_addr());
    assert_eq!(e.get("memnode_capacity_bytes", &[]), (64 * MIB) as f64);
    assert!(e.value("rmemfs_replicas", &[]) == Some(1.0));
    fsd.unmount();
}

#[test]
fn both_daemons_document_the_metrics_flag() {
    for daemon in ["fsd", "memnode"] {
        let out = Command::new(binary(daemon))
            .arg("--help")
            .output()
            .unwrap_or_else(|e| panic!("running {daemon} --help: {e}"));
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(
            help.contains("--metrics <HOST:PORT>"),
            "{daemon} --help does not list --metrics:\n{help}"
        );
    }
}
