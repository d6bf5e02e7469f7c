//! `rmemfs tenants --metrics HOST:PORT`: what each tenant of a memnode holds, against
//! its quota, read from the memnode's metrics endpoint (`memnode --metrics`).
//!
//! Why the metrics endpoint and not a control request: an administrator wants every
//! tenant, and a control connection is one tenant's, which must learn nothing of the
//! others; the endpoint already serves every tenant's figures to whoever runs the
//! host's monitoring, needs no tenant's token, and is what Prometheus alerts on too.
//! The figures are the memnode's own (`memnode::tenant_usage` reads the families the
//! memnode writes), so this command and a dashboard never disagree.

use rmemfs_common::size::format_size;
use serde::Serialize;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Longest answer read: a scrape is a few KiB per tenant and volume.
const MAX_ANSWER: u64 = 64 << 20;

/// One tenant of one memnode in `--json`.
#[derive(Serialize)]
struct Row<'a> {
    memnode: &'a str,
    tenant: &'a str,
    used_bytes: u64,
    quota_bytes: Option<u64>,
    volumes: u64,
    quota_volumes: Option<u64>,
    clients: u64,
    over_quota: u64,
    removed: bool,
}

/// Prints the tenants of each memnode whose metrics endpoint is in `endpoints`.
pub fn show(endpoints: &[String], json: bool, timeout: Duration) -> anyhow::Result<()> {
    let mut all = Vec::new();
    for ep in endpoints {
        let scrape = get_metrics(ep, timeout)?;
        let tenants = memnode::tenant_usage(&scrape)
            .map_err(|e| anyhow::anyhow!("the metrics of {ep}: {e}"))?;
        all.push((ep.as_str(), tenants));
    }
    let rows = all.iter().flat_map(|(ep, ts)| {
        ts.iter().map(move |t| Row {
            memnode: ep,
            tenant: &t.name,
            used_bytes: t.used_bytes,
            quota_bytes: t.quota_bytes,
            volumes: t.volumes,
            quota_volumes: t.quota_volumes,
            clients: t.clients,
            over_quota: t.over_quota,
            removed: t.removed,
        })
    });
    if json {
        let rows: Vec<Row> = rows.collect();
        println!("{}", serde_json::to_string(&rows)?);
        return Ok(());
    }
    println!(
        "{:<20} {:>10} {:>10} {:>5} {:>7} {:>7} {:>10}  MEMNODE",
        "TENANT", "USED", "QUOTA", "USE%", "VOLUMES", "CLIENTS", "REFUSED"
    );
    for r in rows {
        let quota = r.quota_bytes.map_or("-".into(), format_size);
        let share = match r.quota_bytes {
            Some(0) => "-".into(),
            Some(q) => format!("{}", r.used_bytes.saturating_mul(100) / q),
            None => "-".into(),
        };
        let volumes = match r.quota_volumes {
            Some(q) => format!("{}/{q}", r.volumes),
            None => r.volumes.to_string(),
        };
        let name = if r.removed {
            format!("{} (removed)", r.tenant)
        } else {
            r.tenant.to_string()
        };
        println!(
            "{name:<20} {:>10} {quota:>10} {share:>5} {volumes:>7} {:>7} {:>10}  {}",
            format_size(r.used_bytes),
            r.clients,
            r.over_quota,
            r.memnode
        );
    }
    Ok(())
}

/// `GET /metrics` of `addr` (HOST:PORT), its body; within `timeout` in all.
fn get_metrics(addr: &str, timeout: Duration) -> anyhow::Result<String> {
    use anyhow::Context;
    let what = || format!("reading the metrics of {addr}");
    let deadline = Instant::now() + timeout;
    let to = addr
        .to_socket_addrs()
        .with_context(what)?
        .next()
        .ok_or_else(|| anyhow::anyhow!("{addr} names no address"))?;
    let mut c = TcpStream::connect_timeout(&to, timeout).with_context(what)?;
    c.set_write_timeout(Some(timeout)).with_context(what)?;
    c.write_all(
        format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .with_context(what)?;
    // The endpoint answers one request and closes (`Connection: close`).
    let mut raw = Vec::new();
    let mut buf = [0u8; 64 << 10];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            anyhow::bail!("{}: no whole answer within {timeout:?}", what());
        }
        c.set_read_timeout(Some(left)).with_context(what)?;
        match c.read(&mut buf).with_context(what)? {
            0 => break,
            n if (raw.len() + n) as u64 > MAX_ANSWER => {
                anyhow::bail!("{}: the answer is over {}", what(), format_size(MAX_ANSWER))
            }
            n => raw.extend_from_slice(&buf[..n]),
        }
    }
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut head = httparse::Response::new(&mut headers);
    let body_at = match head.parse(&raw) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => anyhow::bail!("{}: the answer is cut short", what()),
        Err(e) => anyhow::bail!("{}: not an HTTP answer ({e})", what()),
    };
    if head.code != Some(200) {
        anyhow::bail!(
            "{}: HTTP {} {}",
            what(),
            head.code.unwrap_or(0),
            head.reason.unwrap_or("")
        );
    }
    String::from_utf8(raw[body_at..].to_vec())
        .map_err(|_| anyhow::anyhow!("{}: the body is not UTF-8", what()))
}
