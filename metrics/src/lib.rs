//! Prometheus metrics for rmemfs's daemons (fsd, memnode).
//!
//! - [`histogram`]: [`LatencyHistogram`], a lock-free latency histogram for the data
//!   path (prometheus-client's own takes a lock per observation).
//! - [`family`]: helpers that write counters, gauges and histograms into a
//!   prometheus-client [`Collector`](prometheus_client::collector::Collector) at scrape
//!   time, so a daemon exposes the atomics it already keeps instead of counting twice.
//! - [`http`]: [`MetricsServer`], the `GET /metrics` endpoint, bounded against hostile
//!   clients.
//!
//! Metric names are the daemons' own (`rmemfs_...` for fsd, `memnode_...` for
//! memnode); docs/metrics.md lists them.

pub mod family;
pub mod histogram;
pub mod http;

pub use histogram::{LatencyHistogram, Timer};
pub use http::MetricsServer;
pub use prometheus_client;
