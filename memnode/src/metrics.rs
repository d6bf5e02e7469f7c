//! memnode's metrics, read at scrape time from what the memnode keeps anyway: its
//! capacity and what it has handed out (the pool), the clients and connections it
//! serves, its volumes, each tenant's use and quota, and the control requests it
//! served and refused (`counters.rs`). The `memnode` binary serves them with
//! `--metrics`; fsd serves its embedded memnode's beside its own.
//!
//! [`tenant_usage`] reads the tenants' families back from a scrape: `rmemfs tenants`
//! shows them so, and keeping the reader beside the writer keeps the two in step.

use crate::control::{ControlService, TenantView};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
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
        let volumes = c.volumes_by_tenant();
        family::gauge(
            &mut enc,
            "memnode_volumes",
            "Durable volumes held in this memnode's memory.",
            None,
            volumes.len() as u64,
        )?;
        // By tenant and name: two tenants may each have a volume of one name.
        let tenants = c.tenant_views();
        {
            let mut family = enc.encode_descriptor(
                "memnode_volume",
                "Memory of each volume, by its tenant and name.",
                bytes,
                MetricType::Gauge,
            )?;
            for (tenant, v) in &volumes {
                let tenant = tenants.get(*tenant).map_or("?", |t| t.name.as_str());
                let name = String::from_utf8_lossy(&v.name);
                let labels = [("tenant", tenant), ("volume", name.as_ref())];
                ConstGauge::new(v.bytes).encode(family.encode_family(&labels)?)?;
            }
        }
        self.encode_tenants(&mut enc, &tenants)?;
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

impl MemnodeCollector {
    /// The `memnode_tenant_...` families, labelled `tenant`; a quota family has a
    /// sample for each tenant with that quota only.
    fn encode_tenants(
        &self,
        enc: &mut DescriptorEncoder,
        tenants: &[TenantView],
    ) -> Result<(), Error> {
        let bytes = Some(&Unit::Bytes);
        let each = |f: fn(&TenantView) -> Option<u64>| {
            tenants
                .iter()
                .filter_map(move |t| f(t).map(|v| (t.name.as_str(), v)))
        };
        family::gauges_by(
            enc,
            TENANT_USED,
            "Memory each tenant holds: its sessions' scratch chunks and its volumes.",
            bytes,
            "tenant",
            each(|t| Some(t.usage.bytes)),
        )?;
        family::gauges_by(
            enc,
            TENANT_QUOTA,
            "Memory each tenant with a quota may hold.",
            bytes,
            "tenant",
            each(|t| t.quota.bytes),
        )?;
        family::gauges_by(
            enc,
            TENANT_VOLUMES,
            "Volumes of each tenant.",
            None,
            "tenant",
            each(|t| Some(t.usage.volumes)),
        )?;
        family::gauges_by(
            enc,
            TENANT_QUOTA_VOLUMES,
            "Volumes each tenant with a quota of volumes may have.",
            None,
            "tenant",
            each(|t| t.quota.volumes),
        )?;
        family::gauges_by(
            enc,
            TENANT_CLIENTS,
            "Clients of each tenant connected (distinct client ids).",
            None,
            "tenant",
            each(|t| Some(t.clients)),
        )?;
        family::gauges_by(
            enc,
            TENANT_REMOVED,
            "1 for a tenant only this memnode's memory file names (not in its tenants file: its memory is kept, no client can use it).",
            None,
            "tenant",
            each(|t| Some(t.removed as u64)),
        )?;
        family::counters_by(
            enc,
            TENANT_OVER_QUOTA,
            "Requests of each tenant refused for its quota.",
            None,
            "tenant",
            each(|t| Some(t.usage.refused)),
        )
    }
}

const TENANT_USED: &str = "memnode_tenant_used";
const TENANT_QUOTA: &str = "memnode_tenant_quota";
const TENANT_VOLUMES: &str = "memnode_tenant_volumes";
const TENANT_QUOTA_VOLUMES: &str = "memnode_tenant_quota_volumes";
const TENANT_CLIENTS: &str = "memnode_tenant_clients";
const TENANT_REMOVED: &str = "memnode_tenant_removed";
const TENANT_OVER_QUOTA: &str = "memnode_tenant_over_quota";

/// One tenant as a memnode's metrics show it (read back by [`tenant_usage`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantUsage {
    pub name: String,
    pub used_bytes: u64,
    pub quota_bytes: Option<u64>,
    pub volumes: u64,
    pub quota_volumes: Option<u64>,
    pub clients: u64,
    pub removed: bool,
    pub over_quota: u64,
}

/// The tenants of a memnode's metrics scrape (the Prometheus text format), in the
/// order the scrape names them. An error when it has no tenant families (not a
/// memnode's scrape, or one from before tenants).
pub fn tenant_usage(scrape: &str) -> Result<Vec<TenantUsage>, String> {
    let mut tenants: Vec<TenantUsage> = Vec::new();
    let field = |family: &str| -> Option<fn(&mut TenantUsage, u64)> {
        Some(match family {
            f if f == format!("{TENANT_USED}_bytes") => |t, v| t.used_bytes = v,
            f if f == format!("{TENANT_QUOTA}_bytes") => |t, v| t.quota_bytes = Some(v),
            TENANT_VOLUMES => |t, v| t.volumes = v,
            TENANT_QUOTA_VOLUMES => |t, v| t.quota_volumes = Some(v),
            TENANT_CLIENTS => |t, v| t.clients = v,
            TENANT_REMOVED => |t, v| t.removed = v != 0,
            f if f == format!("{TENANT_OVER_QUOTA}_total") => |t, v| t.over_quota = v,
            _ => return None,
        })
    };
    for line in scrape.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Some((family, labels)) = series.split_once('{') else {
            continue;
        };
        let Some(set) = field(family) else {
            continue;
        };
        // Tenant names are letters, digits, '.', '_' and '-': nothing to unescape.
        let tenant = labels
            .strip_prefix("tenant=\"")
            .and_then(|l| l.strip_suffix("\"}"))
            .filter(|t| crate::tenants::valid_tenant_name(t))
            .ok_or_else(|| format!("{line:?}: not one tenant label"))?;
        let value = value
            .parse::<u64>()
            .map_err(|_| format!("{line:?}: the value is not a count"))?;
        let i = match tenants.iter().position(|t| t.name == tenant) {
            Some(i) => i,
            None => {
                tenants.push(TenantUsage {
                    name: tenant.to_string(),
                    ..TenantUsage::default()
                });
                tenants.len() - 1
            }
        };
        set(&mut tenants[i], value);
    }
    if tenants.is_empty() {
        return Err(
            "it has no memnode_tenant_* metrics: is it a memnode's, of a version with tenants?"
                .into(),
        );
    }
    Ok(tenants)
}
