//! Volume administration without a mount: listing and destroying volumes on
//! memnodes, and the offline check (`fsck`). The `rmemfs` command's core.

use super::load::{self, Loaded};
use super::VolumeError;
use crate::remote::RemoteStore;
use rmemfs_common::control::{self, VolumeSummary};
use rmemfs_common::fabric::Endpoint;

/// Every volume on the memnode behind `ep`.
pub fn list(ep: &dyn Endpoint) -> Result<Vec<VolumeSummary>, control::ControlError> {
    control::volume_list(ep)
}

/// Destroys `name` on the memnode behind `ep`; returns the bytes given back.
pub fn destroy(ep: &dyn Endpoint, name: &str) -> Result<u64, control::ControlError> {
    control::volume_destroy(ep, name)
}

/// What the offline check found.
#[derive(Debug, Default)]
pub struct FsckReport {
    pub generation: u64,
    pub inodes: usize,
    pub log_entries: usize,
    /// Inodes no entry names (deleted while open when fsd stopped; a mount
    /// reclaims them).
    pub orphans: usize,
    pub problems: Vec<String>,
    pub leaked_chunks: usize,
    pub leaked_bytes: u64,
    pub lost_blocks: usize,
    /// Per memnode: name, superblock, checkpoint and log areas (address, length).
    pub metadata: Vec<MetadataPlace>,
    /// Memnodes of the volume that did not answer (or answered as another
    /// instance): a mount would refuse, and this check may not have seen the newest
    /// metadata (`quorum.rs`).
    pub missing: Option<String>,
}

#[derive(Debug)]
pub struct MetadataPlace {
    pub memnode: String,
    pub superblock: (u64, u64),
    pub checkpoint: Option<(u64, u64)>,
    pub log: Option<(u64, u64)>,
    pub problem: Option<String>,
}

/// Walks the volume `remote` has open (read only): replays it and checks the
/// namespace, the block references and the chunks. `None`: the volume holds no
/// metadata yet.
pub fn fsck(remote: &RemoteStore, volume: &str) -> Result<Option<FsckReport>, VolumeError> {
    let Some(loaded) = load::load(remote, volume)? else {
        return Ok(None);
    };
    Ok(Some(report(remote, &loaded)))
}

fn report(remote: &RemoteStore, l: &Loaded) -> FsckReport {
    let mut problems = l.image.check();
    // Copies that point nowhere: a member slot no configured memnode answers to is
    // a lost copy (reported as lost blocks), but an address outside every chunk of
    // a memnode that is there is damage.
    for (ino, index, c) in l.image.copies() {
        if let Some(&node) = l.slots.get(&c.slot) {
            let inside = l.chunks[node]
                .range(..=c.addr)
                .next_back()
                .is_some_and(|(_, ch)| c.addr < ch.addr + ch.len);
            if !inside {
                problems.push(format!(
                    "block {index} of inode {ino}: copy at {:#x} on memnode {} is in no chunk \
                     of the volume",
                    c.addr,
                    remote.node_name(node)
                ));
            }
        }
    }
    let leaked = l.leaked();
    FsckReport {
        generation: l.generation,
        inodes: l.image.inodes.len(),
        log_entries: l.log_entries,
        orphans: l.orphans,
        problems,
        leaked_chunks: leaked.len(),
        leaked_bytes: leaked
            .iter()
            .fold(0u64, |n, (_, c)| n.saturating_add(c.len)),
        lost_blocks: l.lost_blocks,
        missing: Some(super::quorum::missing_now(remote, Some(l)))
            .filter(|m| !m.is_empty())
            .map(|m| m.describe()),
        metadata: l
            .copies
            .iter()
            .map(|c| MetadataPlace {
                memnode: remote.node_name(c.node).to_string(),
                superblock: (c.superblock.addr, c.superblock.len),
                checkpoint: c.checkpoint.map(|a| (a.addr, a.len)),
                log: c.log.map(|a| (a.addr, a.len)),
                problem: c.problem.clone(),
            })
            .collect(),
    }
}
