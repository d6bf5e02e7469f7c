//! memnode's metrics, read at scrape time from what the memnode keeps anyway: its
//! capacity and what it has handed out (the pool), the clients and connections it
//! serves, its volumes, and the control requests it served and refused
//! (`counters.rs`). The `memnode` binary serves them with `--metrics`; fsd serves
//! its embedded memnode's beside its own.

use crate::control::ControlService;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use rmemfs_metrics::family::{self, Unit};
use std::fmt::Error;
use std::sync::Arc;

/// The memnode's metrics, `memnode_...`.
pub struct MemnodeCollector {
    pub(crate) control: Arc<ControlService>,
}

impl std::fmt::Debug for MemnodeCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemnodeCollector")
            .field("node_id", &self.control.node_id())
            .finish_non_exhaustive()
    }
}

impl Collector for MemnodeCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), Error> {
        let c = &self.control;
        let stats = c.stats();
        let bytes = Some(&Unit::Bytes);
        family::gauge(
            &mut enc,
            "memnode_capacity",
            "Memory this memnode lends.",
            bytes,
            stats.capacity,
        )?;
        family::gauge(
            &mut enc,
            "memnode_used",
            "Memory handed out to clients and volumes.",
            bytes,
            stats.used,
        )?;
        family::gauge(
            &mut enc,
            "memnode_chunks",
            "Chunks handed out.",
            None,
            stats.allocations.into(),
        )?;
        family::gauge(
            &mut enc,
            "memnode_clients",
            "Clients connected (distinct client ids).",
            None,
            stats.clients.into(),
        )?;
        family::gauge(
            &mut enc,
            "memnode_connections",
            "Authenticated connections.",
            None,
            c.connections() as u64,
        )?;
        family::gauge(
            &mut enc,
            "memnode_sessions_idle",
            "Client sessions with no connection, kept through their grace period for a reconnect.",
            None,
            c.idle_sessions() as u64,
        )?;
        family::counter(
            &mut enc,
            "memnode_sessions_resumed",
            "Sessions resumed by a reconnecting client after all their connections had closed.",
            None,
            c.counters
                .sessions_resumed
                .load(std::sync::atomic::Ordering::Relaxed),
        )?;
        family::counter(
            &mut enc,
            "memnode_sessions_expired",
            "Sessions whose client did not come back within the grace period (memory reclaimed).",
            None,
            c.counters
                .sessions_expired
                .load(std::sync::atomic::Ordering::Relaxed),
        )?;
        let volumes = c.volumes_summary();
        family::gauge(
            &mut enc,
            "memnode_volumes",
            "Durable volumes held in this memnode's memory.",
            None,
            volumes.len() as u64,
        )?;
        let names: Vec<(String, u64)> = volumes
            .iter()
            .map(|v| (String::from_utf8_lossy(&v.name).into_owned(), v.bytes))
            .collect();
        family::gauges_by(
            &mut enc,
            "memnode_volume",
            "Memory of each volume.",
            bytes,
            "volume",
            names.iter().map(|(n, b)| (n.as_str(), *b)),
        )?;
        family::counters_by(
            &mut enc,
            "memnode_control_requests",
            "Control requests received, by kind (malformed: frames that did not decode).",
            None,
            "request",
            c.counters.requests(),
        )?;
        family::counters_by(
            &mut enc,
            "memnode_control_refused",
            "Control requests answered with an error, by reason.",
            None,
            "reason",
            c.counters.refusals(),
        )
    }
}
