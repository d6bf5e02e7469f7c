//! What the store knows of its memnodes' states (see `node.rs` for the states
//! themselves): which copies can be reached now and which still exist, the waiting
//! for an unreachable memnode that operations with no copy in reach do, and each
//! node's state, events and memory for status, metrics and `statfs`. Apart from the
//! I/O and allocation that ask these questions, so the rules of reachability are
//! read in one place.

use super::node::{Node, NodeState};
use super::placement::{BlockLoc, Replica};
use super::{lock, RemoteStore};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How often a caller waiting for an unreachable memnode looks again.
pub(super) const WAIT_STEP: Duration = Duration::from_millis(5);

/// A memnode's memory, as [`RemoteStore::node_usage`] reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeUsage {
    /// Bytes the memnode lends in all.
    pub capacity: u64,
    /// Bytes it has handed out, to this fsd and to others.
    pub used: u64,
    /// Clients connected to it.
    pub clients: u32,
    /// Bytes of this fsd's chunks there that hold no block yet.
    pub held_free: u64,
}

impl RemoteStore {
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub fn nodes_up(&self) -> usize {
        self.nodes.iter().filter(|n| n.is_up()).count()
    }

    /// Whether node `idx` is up.
    pub fn node_is_up(&self, idx: usize) -> bool {
        self.nodes.get(idx).is_some_and(|n| n.is_up())
    }

    /// True when the copy `r` can be reached now (its node is up, in the epoch of
    /// the copy).
    pub fn holds(&self, r: &Replica) -> bool {
        self.nodes.get(r.node as usize).is_some_and(|n| n.holds(r))
    }

    /// True when the copy `r` still exists, reachable or not (its node is not lost
    /// since the copy was made).
    pub fn has_copy(&self, r: &Replica) -> bool {
        self.nodes
            .get(r.node as usize)
            .is_some_and(|n| n.has_copy(r))
    }

    /// How many copies of `loc` can be reached now.
    pub fn live_copies(&self, loc: &BlockLoc) -> usize {
        loc.replicas().iter().filter(|r| self.holds(r)).count()
    }

    /// Readies `loc` for a write: drops the copies that were lost and, when at least
    /// one copy can be reached, the unreachable ones too (they would miss this write
    /// and hold old bytes). With no copy in reach, the unreachable ones stay: the
    /// write waits for them. A copy dropped out of reach is not given back to its
    /// pool (a write sent before its memnode went away might still land in it): its
    /// pages stay taken until fsd lets go of the memnode's memory, or, on a volume,
    /// until the next mount finds them referenced by nothing.
    pub fn prune_for_write(&self, loc: &mut BlockLoc) {
        loc.retain(|r| self.has_copy(r));
        if self.live_copies(loc) > 0 {
            loc.retain(|r| self.holds(r));
        }
    }

    /// Waits while `loc` has copies that exist but none that can be reached (its
    /// memnodes are unreachable): until one is back, none exists any more (lost), or
    /// the unreachable timeout passes. Returns at once otherwise.
    pub fn await_reachable(&self, loc: &BlockLoc) {
        let deadline = self.unreachable_timeout.map(|t| Instant::now() + t);
        let mut waited = false;
        while self.live_copies(loc) == 0 && loc.replicas().iter().any(|r| self.has_copy(r)) {
            if deadline.is_some_and(|d| Instant::now() >= d) || self.stopping() {
                break;
            }
            waited = true;
            std::thread::sleep(WAIT_STEP);
        }
        if waited {
            self.counters.ops_retried.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Waits for node `node` to be up again in `epoch`; false when it was lost, the
    /// unreachable timeout passed (from `since`) or fsd is stopping.
    pub(super) fn await_node(&self, node: &Node, epoch: u32, since: Instant) -> bool {
        loop {
            if node.epoch() != epoch {
                return false;
            }
            if node.is_up() {
                return true;
            }
            if self
                .unreachable_timeout
                .is_some_and(|t| since.elapsed() >= t)
                || self.stopping()
            {
                return false;
            }
            std::thread::sleep(WAIT_STEP);
        }
    }

    /// True once fsd is shutting the store down (no more waiting for memnodes).
    pub(super) fn stopping(&self) -> bool {
        self.nodes
            .first()
            .is_some_and(|n| n.refill.stop.load(Ordering::SeqCst))
    }

    /// Each node's state (by index), for status and metrics.
    pub fn node_state(&self, idx: usize) -> Option<NodeState> {
        Some(self.nodes.get(idx)?.state())
    }

    /// Node `idx`'s counts: times unreachable, sessions resumed, times lost.
    pub fn node_events(&self, idx: usize) -> Option<(u64, u64, u64)> {
        let e = &self.nodes.get(idx)?.events;
        Some((
            e.unreachable.load(Ordering::Relaxed),
            e.resumed.load(Ordering::Relaxed),
            e.lost.load(Ordering::Relaxed),
        ))
    }

    /// Declares node `idx` lost now if it is unreachable (an operator's word): its
    /// copies are re-made from other copies. False when it is up (or not a node).
    pub fn declare_lost(&self, idx: usize) -> bool {
        let Some(node) = self.nodes.get(idx) else {
            return false;
        };
        node.declare_lost(node.epoch(), "declared lost by the operator")
    }

    /// The copies a block can have now: `replicas`, or fewer while fewer nodes are up.
    pub fn copies_possible(&self) -> usize {
        self.replicas.min(self.nodes_up())
    }

    /// Times any node became unreachable.
    pub(super) fn unreachable_events(&self) -> u64 {
        self.nodes
            .iter()
            .map(|n| n.events.unreachable.load(Ordering::Relaxed))
            .sum()
    }

    /// True when some node is unreachable (its copies kept, not lost).
    pub(super) fn any_unreachable(&self) -> bool {
        self.nodes
            .iter()
            .any(|n| matches!(n.state(), NodeState::Unreachable { .. }))
    }

    /// Waits until no node is unreachable (each is up or lost): true then (at once
    /// when none is); false after the unreachable timeout (from `since`) or when fsd
    /// stops.
    pub(super) fn await_unreachable(&self, since: Instant) -> bool {
        let mut waited = false;
        while self.any_unreachable() {
            if self
                .unreachable_timeout
                .is_some_and(|t| since.elapsed() >= t)
                || self.stopping()
            {
                return false;
            }
            waited = true;
            std::thread::sleep(WAIT_STEP);
        }
        if waited {
            self.counters.ops_retried.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// Usable capacity and free bytes, given that each block takes `replicas` copies:
    /// over every node that is up, memory the memnodes have not handed out plus
    /// blocks free in fsd's own chunks, divided by the copies per block.
    pub fn space(&self) -> (u64, u64) {
        let mut total = 0;
        let mut free = 0;
        for node in &self.nodes {
            let Ok(link) = node.link() else { continue };
            let local_free = lock(&node.pool).blocks.free_bytes();
            match node.stat(&link) {
                // Sums of what several memnodes say: saturating, as a capacity near
                // the largest u64 is one they may say.
                Ok(s) => {
                    total = s.capacity.saturating_add(total);
                    free = (s.capacity - s.used)
                        .saturating_add(local_free)
                        .saturating_add(free);
                }
                Err(e) => log::warn!("{e}"),
            }
        }
        let r = self.replicas as u64;
        (total / r, free / r)
    }

    /// Node `idx`'s memory as its last heartbeat (once a second) reported it, and
    /// the bytes fsd holds there unused (in its block pool; the memnode counts them
    /// as used). `None` while the node is down and before the first heartbeat of its
    /// link answered.
    pub fn node_usage(&self, idx: usize) -> Option<NodeUsage> {
        let node = self.nodes.get(idx).filter(|n| n.is_up())?;
        let stats = (*lock(&node.usage))?;
        Some(NodeUsage {
            capacity: stats.capacity,
            used: stats.used,
            clients: stats.clients,
            held_free: lock(&node.pool).blocks.free_bytes(),
        })
    }

    /// The memnode name of node `idx` (as given on the command line).
    pub fn node_name(&self, idx: usize) -> &str {
        self.nodes.get(idx).map_or("?", |n| n.name.as_str())
    }

    /// Node `idx`'s link epoch and memnode id, while it is up.
    pub fn node_identity(&self, idx: usize) -> Option<(u32, u64)> {
        self.nodes.get(idx)?.identity()
    }
}

#[cfg(test)]
#[path = "states_tests.rs"]
mod tests;
