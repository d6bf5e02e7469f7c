//! fsd's statistics: counters of remote traffic and of the page cache, written as a
//! small JSON object to the file `--stats-file` names (replaced atomically once a
//! second and at exit), so benchmarks and operators can read per-interval deltas
//! without any control traffic to the memnodes. It also shows redundancy: which
//! memnodes are up, how many copies each holds, and how many blocks are degraded
//! (fewer copies than `--replicas`) or lost.
//!
//! The object is flat and every value an unsigned integer: scripts subtract one
//! reading from the next key by key (scripts/bench-lib/report.py) and the tests'
//! parser takes nothing else (tests/src/stats.rs). The keys are [`Snapshot`]'s field
//! names (`copies_restored` is written `rereplicated_blocks`), then the derived ones
//! of [`Snapshot::to_json`]. `rmemfs status` reads the same object, with more beside
//! it, from fsd's status file (`status.rs`).

use crate::fs::{Redundancy, RmemFs};
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::Ordering;

/// One reading of every counter.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Snapshot {
    pub file_reads: u64,
    pub file_read_bytes: u64,
    pub file_writes: u64,
    pub file_write_bytes: u64,
    pub xattr_reads: u64,
    /// copy_file_range requests served, bytes they copied, blocks copied inside
    /// remote memory, and bytes memnodes copied within their own memory.
    pub file_copies: u64,
    pub file_copy_bytes: u64,
    pub copied_blocks: u64,
    pub memnode_copy_bytes: u64,
    pub remote_reads: u64,
    pub remote_read_bytes: u64,
    pub remote_writes: u64,
    pub remote_write_bytes: u64,
    pub chunk_allocs: u64,
    pub chunk_allocs_waited: u64,
    pub chunk_frees: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub cache_evictions: u64,
    pub cache_writebacks: u64,
    pub cache_partial_writes: u64,
    pub cache_partial_fills: u64,
    pub cache_partial_stores: u64,
    pub cache_batched_misses: u64,
    pub cache_pages: u64,
    pub cache_capacity_pages: u64,
    pub block_size: u64,
    /// Copies written to bring degraded blocks back to `--replicas` copies.
    #[serde(rename = "rereplicated_blocks")]
    pub copies_restored: u64,
    /// Copies whose bytes failed their page checksum when read.
    pub checksum_failures: u64,
    /// Pages of such copies rewritten from a good copy.
    pub pages_repaired: u64,
    /// Scrubber: passes over every block done, blocks checked in the pass under way,
    /// bytes of copies read, and bad pages found.
    pub scrub_passes: u64,
    pub scrub_pass_blocks: u64,
    pub scrub_bytes: u64,
    pub scrub_bad_pages: u64,
    /// Pages without a sum that the scrubber gave one, and such pages whose copies
    /// differ (neither can be judged).
    pub scrub_adopted_pages: u64,
    pub scrub_unsettled_pages: u64,
    pub replicas: u64,
    /// FUSE requests answered through the io_uring transport (0 when /dev/fuse
    /// serves the mount).
    pub fuse_ring_requests: u64,
    /// Remote operations that waited for an unreachable memnode and were sent again.
    pub remote_ops_retried: u64,
    /// Times a memnode became unreachable, times a reconnect resumed its session
    /// with every copy, and times a memnode's copies were declared lost (all
    /// memnodes together).
    pub memnode_unreachable_events: u64,
    pub memnode_sessions_resumed: u64,
    pub memnode_losses: u64,
    /// Per memnode, in command-line order.
    #[serde(skip)]
    pub node_up: Vec<bool>,
    /// As of the last maintenance pass (once a second).
    #[serde(skip)]
    pub redundancy: Redundancy,
}

/// The stats object: the counters, then what derives from the memnodes' states and
/// the copy count.
#[derive(Serialize)]
pub struct StatsRecord<'a> {
    #[serde(flatten)]
    counters: &'a Snapshot,
    #[serde(flatten)]
    derived: Derived<'a>,
}

/// `nodes_up`, `nodes_down`, `blocks`, `blocks_degraded`, `blocks_lost`,
/// `blocks_unreachable` (every copy on an unreachable memnode), and per
/// memnode `i` `node{i}_up` (1 or 0) and `node{i}_blocks` (copies it holds).
struct Derived<'a>(&'a Snapshot);

impl Serialize for Derived<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let snap = self.0;
        let up = snap.node_up.iter().filter(|&&u| u).count() as u64;
        let rd = &snap.redundancy;
        let mut map = s.serialize_map(Some(6 + 2 * snap.node_up.len()))?;
        map.serialize_entry("nodes_up", &up)?;
        map.serialize_entry("nodes_down", &(snap.node_up.len() as u64 - up))?;
        map.serialize_entry("blocks", &rd.blocks)?;
        map.serialize_entry("blocks_degraded", &rd.degraded)?;
        map.serialize_entry("blocks_lost", &rd.lost)?;
        map.serialize_entry("blocks_unreachable", &rd.unreachable)?;
        for (i, &u) in snap.node_up.iter().enumerate() {
            map.serialize_entry(&format!("node{i}_up"), &(u as u64))?;
            let copies = rd.per_node.get(i).copied().unwrap_or(0);
            map.serialize_entry(&format!("node{i}_blocks"), &copies)?;
        }
        map.end()
    }
}

/// A sum over the memnodes of one of their event counts.
fn node_events(fs: &RmemFs, pick: impl Fn((u64, u64, u64)) -> u64) -> u64 {
    let remote = fs.remote();
    (0..remote.node_count())
        .filter_map(|i| remote.node_events(i))
        .map(pick)
        .sum()
}

impl Snapshot {
    pub fn of(fs: &RmemFs) -> Snapshot {
        let r = &fs.remote().counters;
        let c = &fs.cache().counters;
        let f = &fs.counters;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        Snapshot {
            file_reads: get(&f.reads),
            file_read_bytes: get(&f.read_bytes),
            file_writes: get(&f.writes),
            file_write_bytes: get(&f.write_bytes),
            xattr_reads: get(&f.xattr_reads),
            file_copies: get(&f.copies),
            file_copy_bytes: get(&f.copy_bytes),
            copied_blocks: get(&f.copied_blocks),
            memnode_copy_bytes: get(&r.memnode_copy_bytes),
            remote_reads: get(&r.reads),
            remote_read_bytes: get(&r.read_bytes),
            remote_writes: get(&r.writes),
            remote_write_bytes: get(&r.write_bytes),
            chunk_allocs: get(&r.chunk_allocs),
            chunk_allocs_waited: get(&r.chunk_allocs_waited),
            chunk_frees: get(&r.chunk_frees),
            cache_hits: get(&c.hits),
            cache_misses: get(&c.misses),
            cache_evictions: get(&c.evictions),
            cache_writebacks: get(&c.writebacks),
            cache_partial_writes: get(&c.partial_writes),
            cache_partial_fills: get(&c.partial_fills),
            cache_partial_stores: get(&c.partial_stores),
            cache_batched_misses: get(&c.batched_misses),
            cache_pages: fs.cache().held_blocks() as u64,
            cache_capacity_pages: fs.cache().capacity_pages() as u64,
            block_size: fs.remote().block_size(),
            copies_restored: get(&r.copies_restored),
            checksum_failures: get(&r.checksum_failures),
            pages_repaired: get(&r.pages_repaired),
            scrub_passes: get(&fs.scrub_counters.passes),
            scrub_pass_blocks: get(&fs.scrub_counters.pass_blocks),
            scrub_bytes: get(&fs.scrub_counters.bytes),
            scrub_bad_pages: get(&fs.scrub_counters.bad_pages),
            scrub_adopted_pages: get(&fs.scrub_counters.adopted_pages),
            scrub_unsettled_pages: get(&fs.scrub_counters.unsettled_pages),
            replicas: fs.remote().replicas() as u64,
            fuse_ring_requests: get(&crate::fuse::ring::RING_REQUESTS),
            remote_ops_retried: get(&r.ops_retried),
            memnode_unreachable_events: node_events(fs, |e| e.0),
            memnode_sessions_resumed: node_events(fs, |e| e.1),
            memnode_losses: node_events(fs, |e| e.2),
            node_up: (0..fs.remote().node_count())
                .map(|i| fs.remote().node_is_up(i))
                .collect(),
            redundancy: fs.redundancy(),
        }
    }

    /// The stats object of this snapshot, to serialize alone or inside another.
    pub fn record(&self) -> StatsRecord<'_> {
        StatsRecord {
            counters: self,
            derived: Derived(self),
        }
    }

    /// The snapshot as one flat JSON object of counters (see the module's doc), one
    /// per line.
    pub fn to_json(&self) -> String {
        // Serializing plain integers and strings into memory cannot fail.
        let mut text = serde_json::to_string_pretty(&self.record()).unwrap_or_default();
        text.push('\n');
        text
    }

    /// Replaces `path` with this snapshot (write to a temporary file, then rename, so
    /// a reader never sees half a file).
    pub fn write_to(&self, path: &Path) -> std::io::Result<()> {
        replace_file(path, self.to_json().as_bytes())
    }
}

/// Replaces `path` with `bytes`: written to `path` + `.tmp`, then renamed over it.
pub fn replace_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    drop(f);
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_names_every_counter_with_its_value() {
        let s = Snapshot {
            file_reads: 5,
            file_read_bytes: 20480,
            remote_reads: 3,
            remote_read_bytes: 196608,
            chunk_allocs: 1,
            block_size: 65536,
            replicas: 2,
            node_up: vec![true, false],
            redundancy: Redundancy {
                blocks: 10,
                degraded: 4,
                lost: 1,
                unreachable: 0,
                per_node: vec![9, 0],
            },
            ..Snapshot::default()
        };
        let json = s.to_json();
        for line in [
            "\"replicas\": 2,",
            "\"nodes_up\": 1,",
            "\"nodes_down\": 1,",
            "\"blocks\": 10,",
            "\"blocks_degraded\": 4,",
            "\"blocks_lost\": 1,",
            "\"node0_up\": 1,",
            "\"node0_blocks\": 9,",
            "\"node1_up\": 0,",
            "\"node1_blocks\": 0\n",
        ] {
            assert!(json.contains(line), "{line} in {json}");
        }
        assert!(json.starts_with('{') && json.trim_end().ends_with('}'));
        assert!(json.contains("\"file_reads\": 5,"), "{json}");
        assert!(json.contains("\"file_read_bytes\": 20480,"), "{json}");
        assert!(json.contains("\"remote_reads\": 3,"), "{json}");
        assert!(json.contains("\"remote_read_bytes\": 196608,"), "{json}");
        assert!(json.contains("\"chunk_allocs\": 1,"), "{json}");
        assert!(json.contains("\"block_size\": 65536,"), "{json}");
        // Every key scripts and tests read, and no other: the keys fsd has always
        // written, and for each memnode its two.
        let parsed: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&json).expect("the stats are one JSON object");
        let mut keys: Vec<&str> = parsed.keys().map(String::as_str).collect();
        keys.sort_unstable();
        let mut expected: Vec<&str> = KEYS
            .iter()
            .copied()
            .chain(["node0_up", "node0_blocks", "node1_up", "node1_blocks"])
            .collect();
        expected.sort_unstable();
        assert_eq!(keys, expected);
        assert!(
            parsed.values().all(|v| v.is_u64()),
            "every value is an unsigned integer: {json}"
        );
    }

    /// The keys of the stats object before it was written with serde, in their order
    /// then.
    const KEYS: [&str; 48] = [
        "file_reads",
        "file_read_bytes",
        "file_writes",
        "file_write_bytes",
        "xattr_reads",
        "file_copies",
        "file_copy_bytes",
        "copied_blocks",
        "memnode_copy_bytes",
        "remote_reads",
        "remote_read_bytes",
        "remote_writes",
        "remote_write_bytes",
        "chunk_allocs",
        "chunk_allocs_waited",
        "chunk_frees",
        "cache_hits",
        "cache_misses",
        "cache_evictions",
        "cache_writebacks",
        "cache_partial_writes",
        "cache_partial_fills",
        "cache_partial_stores",
        "cache_batched_misses",
        "cache_pages",
        "cache_capacity_pages",
        "block_size",
        "replicas",
        "fuse_ring_requests",
        "nodes_up",
        "nodes_down",
        "blocks",
        "blocks_degraded",
        "blocks_lost",
        "rereplicated_blocks",
        "checksum_failures",
        "pages_repaired",
        "scrub_passes",
        "scrub_pass_blocks",
        "scrub_bytes",
        "scrub_bad_pages",
        "scrub_adopted_pages",
        "scrub_unsettled_pages",
        "remote_ops_retried",
        "memnode_unreachable_events",
        "memnode_sessions_resumed",
        "memnode_losses",
        "blocks_unreachable",
    ];

    #[test]
    fn writing_replaces_the_file_whole() {
        let dir = std::env::temp_dir().join(format!("fsd-stats-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("stats.json");
        for n in [1u64, 22] {
            let s = Snapshot {
                remote_writes: n,
                ..Snapshot::default()
            };
            s.write_to(&path).expect("write");
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(text.contains(&format!("\"remote_writes\": {n},")), "{text}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
