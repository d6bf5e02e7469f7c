//! fsd's Prometheus metrics (`--metrics HOST:PORT`): the counters fsd keeps anyway
//! ([`Snapshot::of`]: file and remote traffic, cache, redundancy, integrity, scrub),
//! read when scraped, and the latency histograms of FUSE requests
//! ([`FuseTiming`]) and of remote READs and WRITEs (`RemoteCounters`). Nothing here
//! runs on the data path: a scrape reads atomics, the last copy count and each
//! memnode's last heartbeat answer, and counts the cache's dirty pages (a walk of
//! the cache's index, once per scrape).
//!
//! With an embedded memnode its `memnode_...` metrics are served beside fsd's.
//! docs/metrics.md lists every metric.

use crate::fs::RmemFs;
use crate::fuse::timing::{FuseKind, FuseTiming};
use crate::stats::Snapshot;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;
use rmemfs_metrics::family::{self, Unit};
use rmemfs_metrics::MetricsServer;
use std::fmt::Error;
use std::sync::Arc;

/// fsd's metrics, `rmemfs_...`.
pub struct FsdCollector {
    fs: Arc<RmemFs>,
    fuse: Arc<FuseTiming>,
}

impl std::fmt::Debug for FsdCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FsdCollector").finish_non_exhaustive()
    }
}

impl FsdCollector {
    pub fn new(fs: Arc<RmemFs>, fuse: Arc<FuseTiming>) -> FsdCollector {
        FsdCollector { fs, fuse }
    }
}

/// Starts the endpoint on `listen`: fsd's metrics, and `memnode`'s (the embedded
/// memnode) when given.
pub fn serve(
    listen: &str,
    fsd: FsdCollector,
    memnode: Option<memnode::MemnodeCollector>,
) -> std::io::Result<MetricsServer> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(fsd));
    if let Some(m) = memnode {
        registry.register_collector(Box::new(m));
    }
    MetricsServer::start(listen, registry)
}

impl Collector for FsdCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), Error> {
        let fs = &self.fs;
        let s = Snapshot::of(fs);
        let remote = fs.remote();
        let bytes = Some(&Unit::Bytes);
        let e = &mut enc;

        // Traffic: what programs asked of the mount, and what reached the memnodes.
        family::histograms_by(
            e,
            "rmemfs_fuse_request",
            "Time fsd took to answer FUSE requests, by kind.",
            "kind",
            FuseKind::ALL
                .iter()
                .map(|&k| (k.name(), self.fuse.histogram(k))),
        )?;
        family::counter(
            e,
            "rmemfs_fuse_ring_requests",
            "FUSE requests answered through io_uring.",
            None,
            s.fuse_ring_requests,
        )?;
        let rw = |r: u64, w: u64| [("read", r), ("write", w)];
        family::counters_by(
            e,
            "rmemfs_file_operations",
            "Reads and writes of files that reached fsd.",
            None,
            "op",
            rw(s.file_reads, s.file_writes),
        )?;
        family::counters_by(
            e,
            "rmemfs_file",
            "Bytes of file reads and writes that reached fsd.",
            bytes,
            "op",
            rw(s.file_read_bytes, s.file_write_bytes),
        )?;
        family::counter(
            e,
            "rmemfs_xattr_reads",
            "getxattr requests.",
            None,
            s.xattr_reads,
        )?;
        family::counters_by(
            e,
            "rmemfs_remote_operations",
            "Remote READs and WRITEs posted to memnodes (scrubber reads not included).",
            None,
            "op",
            rw(s.remote_reads, s.remote_writes),
        )?;
        family::counters_by(
            e,
            "rmemfs_remote",
            "Bytes moved by remote READs and WRITEs.",
            bytes,
            "op",
            rw(s.remote_read_bytes, s.remote_write_bytes),
        )?;
        let rc = &remote.counters;
        family::histograms_by(
            e,
            "rmemfs_remote_operation",
            "Time of remote READs and WRITEs, from posting a batch on a connection to its \
             last completion.",
            "op",
            [("read", &rc.read_latency), ("write", &rc.write_latency)],
        )?;
        family::counter(
            e,
            "rmemfs_chunk_allocations",
            "Chunks of remote memory allocated from memnodes.",
            None,
            s.chunk_allocs,
        )?;
        family::counter(
            e,
            "rmemfs_chunk_allocation_waits",
            "Chunk allocations a write had to wait for.",
            None,
            s.chunk_allocs_waited,
        )?;
        family::counter(
            e,
            "rmemfs_chunk_frees",
            "Chunks given back to memnodes.",
            None,
            s.chunk_frees,
        )?;

        // The page cache.
        for (name, help, v) in [
            (
                "rmemfs_cache_hits",
                "Block lookups the cache answered.",
                s.cache_hits,
            ),
            (
                "rmemfs_cache_misses",
                "Block lookups that loaded from remote memory.",
                s.cache_misses,
            ),
            (
                "rmemfs_cache_evictions",
                "Blocks evicted from the cache.",
                s.cache_evictions,
            ),
            (
                "rmemfs_cache_writebacks",
                "Dirty blocks written back to remote memory.",
                s.cache_writebacks,
            ),
            (
                "rmemfs_cache_partial_writes",
                "Sectors written into a block without reading it.",
                s.cache_partial_writes,
            ),
            (
                "rmemfs_cache_partial_fills",
                "Loads of part of a block.",
                s.cache_partial_fills,
            ),
            (
                "rmemfs_cache_partial_stores",
                "Write-backs of a block's dirty sectors only.",
                s.cache_partial_stores,
            ),
            (
                "rmemfs_cache_batched_misses",
                "Misses of reads that came together, loaded in one batch.",
                s.cache_batched_misses,
            ),
        ] {
            family::counter(e, name, help, None, v)?;
        }
        family::gauge(
            e,
            "rmemfs_cache_pages",
            "The cache's memory in use, in blocks (a sector page counts as its sector).",
            None,
            s.cache_pages,
        )?;
        family::gauge(
            e,
            "rmemfs_cache_dirty_pages",
            "Blocks in the cache not yet written back.",
            None,
            fs.cache().dirty_pages() as u64,
        )?;
        family::gauge(
            e,
            "rmemfs_cache_capacity_pages",
            "Blocks the cache holds at most.",
            None,
            s.cache_capacity_pages,
        )?;
        family::gauge(
            e,
            "rmemfs_block_size",
            "The unit of caching and remote I/O.",
            bytes,
            s.block_size,
        )?;

        // Memnodes and redundancy.
        let names: Vec<&str> = (0..remote.node_count())
            .map(|i| remote.node_name(i))
            .collect();
        family::gauges_by(
            e,
            "rmemfs_memnode_up",
            "Whether each memnode is up (1) or down (0).",
            None,
            "memnode",
            names.iter().zip(&s.node_up).map(|(n, &u)| (*n, u as u64)),
        )?;
        family::gauges_by(
            e,
            "rmemfs_memnode_copies",
            "Block copies each memnode holds, as of the last count (once a second).",
            None,
            "memnode",
            names
                .iter()
                .enumerate()
                .map(|(i, n)| (*n, s.redundancy.per_node.get(i).copied().unwrap_or(0))),
        )?;
        let usage: Vec<_> = (0..names.len()).map(|i| remote.node_usage(i)).collect();
        family::gauges_by(
            e,
            "rmemfs_memnode_capacity",
            "Memory each memnode lends, as its last heartbeat answered.",
            bytes,
            "memnode",
            names
                .iter()
                .zip(&usage)
                .filter_map(|(n, u)| u.map(|u| (*n, u.capacity))),
        )?;
        family::gauges_by(
            e,
            "rmemfs_memnode_used",
            "Memory each memnode has handed out (to every client), as its last heartbeat \
             answered.",
            bytes,
            "memnode",
            names
                .iter()
                .zip(&usage)
                .filter_map(|(n, u)| u.map(|u| (*n, u.used))),
        )?;
        family::gauge(
            e,
            "rmemfs_replicas",
            "Copies each block should have (--replicas).",
            None,
            s.replicas,
        )?;
        let rd = &s.redundancy;
        for (name, help, v) in [
            (
                "rmemfs_blocks",
                "Blocks whose content is in remote memory.",
                rd.blocks,
            ),
            (
                "rmemfs_blocks_degraded",
                "Blocks with fewer copies than --replicas.",
                rd.degraded,
            ),
            ("rmemfs_blocks_lost", "Blocks with no copy left.", rd.lost),
            (
                "rmemfs_blocks_unreachable",
                "Blocks whose every copy is on an unreachable memnode (kept; readable again when it is back).",
                rd.unreachable,
            ),
        ] {
            family::gauge(e, name, help, None, v)?;
        }
        family::counter(
            e,
            "rmemfs_copies_restored",
            "Copies written by re-replication to replace copies lost with a memnode.",
            None,
            s.copies_restored,
        )?;

        // Integrity.
        family::counter(
            e,
            "rmemfs_checksum_failures",
            "Copies read whose bytes failed their page checksum.",
            None,
            s.checksum_failures,
        )?;
        family::counter(
            e,
            "rmemfs_pages_repaired",
            "Pages of bad copies rewritten from a good copy.",
            None,
            s.pages_repaired,
        )?;
        family::counter(
            e,
            "rmemfs_scrub_passes",
            "Scrubber passes over every block completed.",
            None,
            s.scrub_passes,
        )?;
        family::gauge(
            e,
            "rmemfs_scrub_pass_blocks",
            "Blocks checked in the scrub pass under way (0 between passes).",
            None,
            s.scrub_pass_blocks,
        )?;
        family::counter(
            e,
            "rmemfs_scrub",
            "Bytes of copies the scrubber read.",
            bytes,
            s.scrub_bytes,
        )?;
        family::counter(
            e,
            "rmemfs_scrub_bad_pages",
            "Bad pages the scrubber found.",
            None,
            s.scrub_bad_pages,
        )?;
        family::counter(
            e,
            "rmemfs_scrub_adopted_pages",
            "Pages without a checksum that the scrubber gave one.",
            None,
            s.scrub_adopted_pages,
        )?;
        family::counter(
            e,
            "rmemfs_scrub_unsettled_pages",
            "Pages without a checksum whose copies differ.",
            None,
            s.scrub_unsettled_pages,
        )
    }
}
