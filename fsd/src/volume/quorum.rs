//! Whether a mount can know it reads a volume's newest metadata.
//!
//! Commits go to the metadata copies in reach (a memnode that is only unreachable
//! misses them and catches up at the next checkpoint), so the newest generation, or
//! the longest log of it, may be on one memnode only. A mount that reads the others
//! and goes on from there rolls the volume back, and once the away memnode returns
//! the two histories have diverged. So a mount needs every memnode of the volume to
//! answer as the instance the metadata names: every `--memnode`, and every member
//! memnode of the newest generation it reads (one that came back empty is a new
//! instance and answers with another id). It waits for them for a while
//! ([`MountPolicy::wait`]), then refuses, unless the operator mounts `degraded`
//! (btrfs's `-o degraded` is the model): then the volume goes on from what answered,
//! and what only the missing memnodes held is given up.
//!
//! Why every member and not a majority: a majority read finds the newest only if
//! every commit reached a majority, and then a commit at R=2 would wait whenever
//! one memnode is away, which is what replication is there to avoid.

use super::load::Loaded;
use crate::remote::RemoteStore;
use std::time::{Duration, Instant};

/// How a volume mount treats memnodes that do not answer.
#[derive(Debug, Clone, Copy)]
pub struct MountPolicy {
    /// How long to wait for every `--memnode` to answer before deciding.
    pub wait: Duration,
    /// Mount from the memnodes that answered even when one that did not may hold
    /// newer metadata.
    pub degraded: bool,
}

impl Default for MountPolicy {
    fn default() -> MountPolicy {
        MountPolicy {
            wait: Duration::from_secs(30),
            degraded: false,
        }
    }
}

/// Added to the generation and sequence numbers a degraded mount goes on with, so
/// that a missing memnode's copy, however far its history went on, is older than
/// the history the mount writes from now on: the next checkpoint's superblock
/// supersedes it, and the entries of its log can never pass for this history's.
/// (A history moves on by one generation per checkpoint and one sequence number
/// per log entry: 2^32 of either is beyond any volume's life.)
pub const DEGRADED_JUMP: u64 = 1 << 32;

/// Waits up to `wait` for every memnode of `remote` to be up; true when all are.
pub fn await_memnodes(remote: &RemoteStore, wait: Duration) -> bool {
    let deadline = Instant::now() + wait;
    let mut said = false;
    loop {
        let up = remote.nodes_up();
        if up == remote.node_count() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        if !std::mem::replace(&mut said, true) {
            log::info!(
                "{} of {} memnodes answered; waiting up to {} s for the others",
                up,
                remote.node_count(),
                wait.as_secs_f64()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What the mount cannot read: `--memnode`s that did not answer, and member
/// memnodes of the loaded generation that no memnode answered as.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Missing {
    /// Names of the configured memnodes that are not up.
    pub away: Vec<String>,
    /// Memnode ids the loaded generation names that no memnode up has.
    pub gone: Vec<u64>,
}

impl Missing {
    pub fn is_empty(&self) -> bool {
        self.away.is_empty() && self.gone.is_empty()
    }

    /// Says which, for an error or a warning.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.away.is_empty() {
            parts.push(format!(
                "memnode(s) {} did not answer",
                self.away.join(", ")
            ));
        }
        // A memnode that did not answer accounts for one member not found.
        if self.gone.len() > self.away.len() {
            let ids: Vec<String> = self.gone.iter().map(|id| format!("{id:#x}")).collect();
            parts.push(format!(
                "{} of the member memnodes {} of the volume answered as none of the \
                 --memnode list (restarted without their memory, or left out of it)",
                self.gone.len() - self.away.len(),
                ids.join(", ")
            ));
        }
        parts.join("; ")
    }
}

/// Finds what is missing: `up` are the memnode ids of the nodes up (None: not up),
/// `members` the loaded generation's member ids (0: an empty slot).
pub fn missing(names: &[&str], up: &[Option<u64>], members: &[u64]) -> Missing {
    Missing {
        away: names
            .iter()
            .zip(up)
            .filter(|(_, id)| id.is_none())
            .map(|(name, _)| name.to_string())
            .collect(),
        gone: members
            .iter()
            .copied()
            .filter(|&m| m != 0 && !up.contains(&Some(m)))
            .collect(),
    }
}

/// [`missing`] for `remote` as it is now and the generation `loaded`.
pub fn missing_now(remote: &RemoteStore, loaded: Option<&Loaded>) -> Missing {
    let n = remote.node_count();
    let names: Vec<&str> = (0..n).map(|i| remote.node_name(i)).collect();
    let up: Vec<Option<u64>> = (0..n)
        .map(|i| {
            remote
                .node_is_up(i)
                .then(|| remote.node_identity(i).map(|(_, id)| id))
                .flatten()
        })
        .collect();
    missing(&names, &up, loaded.map_or(&[], |l| &l.member_ids))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_memnode_answering_as_the_members_misses_nothing() {
        let m = missing(&["a:1", "b:1"], &[Some(7), Some(9)], &[7, 9]);
        assert!(m.is_empty(), "{m:?}");
        // A memnode added to the list since the last checkpoint is no member yet.
        let m = missing(
            &["a:1", "b:1", "c:1"],
            &[Some(7), Some(9), Some(4)],
            &[7, 9, 0],
        );
        assert!(m.is_empty(), "{m:?}");
    }

    #[test]
    fn a_memnode_that_does_not_answer_is_away() {
        let m = missing(&["a:1", "b:1"], &[Some(7), None], &[7, 9]);
        assert_eq!(m.away, vec!["b:1".to_string()]);
        assert_eq!(m.gone, vec![9], "its member id is not up either");
        assert!(
            m.describe().contains("b:1 did not answer"),
            "{}",
            m.describe()
        );
    }

    #[test]
    fn a_member_that_came_back_empty_is_gone() {
        // b answers, but as a new instance (id 11, not the member 9).
        let m = missing(&["a:1", "b:1"], &[Some(7), Some(11)], &[7, 9]);
        assert!(m.away.is_empty());
        assert_eq!(m.gone, vec![9]);
        assert!(m.describe().contains("0x9"), "{}", m.describe());
        // A member not found beside a memnode away: that one may be it.
        let m = missing(&["a:1", "b:1"], &[None, Some(11)], &[7, 9]);
        assert!(
            m.describe().contains("1 of the member memnodes 0x7, 0x9"),
            "{}",
            m.describe()
        );
    }
}
