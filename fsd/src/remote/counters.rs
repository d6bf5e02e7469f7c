//! Counters of remote traffic ([`RemoteCounters`]), for statistics, metrics and
//! benchmarks. Apart because every part of the store bumps them (allocation, I/O,
//! copies, repair) and the rest of fsd reads them.

use rmemfs_metrics::LatencyHistogram;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

/// Counters of remote traffic, for statistics and benchmarks.
#[derive(Debug, Default)]
pub struct RemoteCounters {
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
    pub writes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub chunk_allocs: AtomicU64,
    /// Chunk allocations a block allocation had to wait for (the pool ran dry before
    /// the allocation ahead arrived): control round trips on the write path.
    pub chunk_allocs_waited: AtomicU64,
    pub chunk_frees: AtomicU64,
    /// Copies written to replace copies lost with a memnode.
    pub copies_restored: AtomicU64,
    /// Reads whose bytes failed their checksum (one per copy read).
    pub checksum_failures: AtomicU64,
    /// Pages of copies rewritten from a good copy after failing their checksum.
    pub pages_repaired: AtomicU64,
    /// Bytes memnodes copied within their memory for fsd (copy_file_range).
    pub memnode_copy_bytes: AtomicU64,
    /// Remote operations sent again after their memnode was unreachable and came
    /// back (or that waited for it to come back before being sent).
    pub ops_retried: AtomicU64,
    /// Latency of counted READs and WRITEs: each operation of a batch posted on one
    /// connection is observed with the batch's time, from posting to its last
    /// completion (they complete together as far as fsd can tell).
    pub read_latency: LatencyHistogram,
    pub write_latency: LatencyHistogram,
}

impl RemoteCounters {
    /// Records the latency of a batch of `reads` READs and `writes` WRITEs.
    #[inline]
    pub(super) fn observe(&self, took: Duration, reads: u64, writes: u64) {
        if reads > 0 {
            self.read_latency.observe_many(took, reads);
        }
        if writes > 0 {
            self.write_latency.observe_many(took, writes);
        }
    }
}
