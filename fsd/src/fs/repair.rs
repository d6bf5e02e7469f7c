//! Redundancy: counting the copies every block has, and bringing blocks that lost a
//! copy with a memnode back to `--replicas` copies in the background.
//!
//! Re-replication goes through the page cache: a degraded block is loaded (from a
//! copy that still exists), its page marked dirty, and the inode flushed. Write-back
//! then gives the block new copies on other memnodes (`remote_io.rs`). So it takes the
//! same locks as a reader and a writer, and can never race a write of the same block
//! into a stale copy. It is rate-limited by the caller (blocks per pass).

use super::RmemFs;
use crate::cache::Fill;
use crate::inode::{FileKind, Ino};
use rmemfs_common::sync::lock;

/// Blocks counted per hold of an inode's meta lock.
const SCAN_SLICE: usize = 4096;

/// What one pass over every block map found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Redundancy {
    /// Blocks whose content is in remote memory.
    pub blocks: u64,
    /// Blocks with at least one but fewer than `--replicas` copies.
    pub degraded: u64,
    /// Blocks with no copy left (their data is gone).
    pub lost: u64,
    /// Blocks whose every copy is on an unreachable memnode: out of reach now, back
    /// when it is (they count as lost only once it is).
    pub unreachable: u64,
    /// Copies on each memnode (command-line order), reachable or not.
    pub per_node: Vec<u64>,
}

impl RmemFs {
    /// Counts the copies of every block, then re-replicates up to `budget` blocks
    /// that have fewer copies than the cluster can hold now. Publishes and returns
    /// what the count found (before this pass's repairs).
    pub fn maintain(&self, budget: usize) -> Redundancy {
        let (found, todo) = self.count_copies(budget);
        let before = std::mem::replace(&mut *self.redundancy_slot(), found.clone());
        if before.degraded > 0 && found.degraded == 0 {
            log::warn!(
                "re-replication done: every block has {} copies again",
                self.remote.replicas()
            );
        }
        if !todo.is_empty() {
            let repaired = self.rereplicate(&todo);
            log::info!(
                "re-replication: {repaired} of {} degraded blocks given new copies this pass \
                 ({} lost, {} copies restored so far)",
                found.degraded,
                found.lost,
                self.remote
                    .counters
                    .copies_restored
                    .load(std::sync::atomic::Ordering::Relaxed)
            );
        }
        found
    }

    /// The last published count.
    pub fn redundancy(&self) -> Redundancy {
        self.redundancy_slot().clone()
    }

    fn redundancy_slot(&self) -> std::sync::MutexGuard<'_, Redundancy> {
        lock(&self.redundancy)
    }

    /// One pass over the block maps: the counts, and up to `budget` blocks to repair.
    fn count_copies(&self, budget: usize) -> (Redundancy, Vec<(Ino, u64)>) {
        let mut found = Redundancy {
            per_node: vec![0; self.remote.node_count()],
            ..Redundancy::default()
        };
        let replicas = self.remote.replicas();
        let possible = self.remote.copies_possible();
        let mut todo = Vec::new();
        for inode in self.ns.all() {
            if inode.meta().attr.kind != FileKind::File {
                continue;
            }
            // A slice of the block map at a time, so a large file's writers never
            // wait long for its meta lock.
            let mut from = 0;
            loop {
                let m = inode.meta();
                let mut seen = 0;
                for (&idx, entry) in m.blocks.range(from..).take(SCAN_SLICE) {
                    seen += 1;
                    from = idx + 1;
                    if !entry.written {
                        continue; // its content is in a dirty page, written back with R copies
                    }
                    found.blocks += 1;
                    // Copies on an unreachable memnode still count: re-made only
                    // once it is lost, so a blip starts no storm of copying.
                    let mut live = 0;
                    let mut reachable = 0;
                    for r in entry.loc.replicas() {
                        if self.remote.has_copy(r) {
                            live += 1;
                            found.per_node[r.node as usize] += 1;
                            reachable += self.remote.holds(r) as usize;
                        }
                    }
                    if live > 0 && reachable == 0 {
                        found.unreachable += 1;
                    }
                    if live == 0 {
                        found.lost += 1;
                    } else if live < replicas {
                        found.degraded += 1;
                        if live < possible && todo.len() < budget {
                            todo.push((inode.ino, idx));
                        }
                    }
                }
                if seen < SCAN_SLICE {
                    break;
                }
            }
        }
        (found, todo)
    }

    /// Loads each block, marks its page dirty, and flushes its inode, so write-back
    /// gives it new copies. Returns how many blocks were handled without error.
    fn rereplicate(&self, todo: &[(Ino, u64)]) -> usize {
        let mut done = 0;
        let mut start = 0;
        while start < todo.len() {
            let ino = todo[start].0;
            let end = start + todo[start..].iter().take_while(|t| t.0 == ino).count();
            let Ok(inode) = self.ns.get(ino) else {
                start = end;
                continue;
            };
            let _io = inode.io_shared();
            let mut dirtied = 0;
            for &(_, idx) in &todo[start..end] {
                // A block truncated away since the count is not brought back.
                if !inode.meta().blocks.contains_key(&idx) {
                    continue;
                }
                let marked = self.cache.access(
                    self,
                    ino,
                    idx..idx + 1,
                    |_| Fill::Load,
                    |_, _, dirty| {
                        *dirty = true;
                        Ok(())
                    },
                );
                match marked {
                    Ok(()) => dirtied += 1,
                    Err(e) => log::warn!("re-replicating block {idx} of inode {ino}: {e}"),
                }
            }
            match self.cache.flush_inode(self, ino) {
                Ok(()) => done += dirtied,
                Err(e) => log::warn!("re-replicating inode {ino}: write-back failed: {e}"),
            }
            start = end;
        }
        done
    }
}
