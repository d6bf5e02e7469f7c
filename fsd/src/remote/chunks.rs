//! Whole chunks of remote memory, outside the block pools: the raw API volumes use
//! for their metadata (allocate, read and write at an address, list, adopt into a
//! pool, give back), and giving chunks back to their memnodes when a pool empties
//! one, the volume closes or fsd lets go of everything at unmount.

use super::batch::{CopyOp, Patience};
use super::error::RemoteError;
use super::node::Node;
use super::placement::Replica;
use super::{lock, RemoteStore};
use rmemfs_common::control;
use rmemfs_common::fabric::{RdmaOp, RemoteAddr, MAX_DATA_OP};
use rmemfs_common::protocol::Allocation;
use std::sync::atomic::Ordering;

impl RemoteStore {
    pub(super) fn free_chunk(&self, node: &Node, epoch: u32, addr: u64, rkey: u32) {
        let Ok(link) = node.link() else { return };
        if link.epoch != epoch {
            return;
        }
        let rkey = link.rkey(addr, rkey);
        link.forget_chunk(addr);
        match control::free(link.control(), addr, rkey) {
            Ok(()) => {
                self.counters.chunk_frees.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => log::warn!("{}", node.control_error(epoch, e)),
        }
    }

    /// The root chunk of the volume on node `idx`, while it is up.
    pub fn volume_root(&self, idx: usize) -> Option<Allocation> {
        let link = self.nodes.get(idx)?.link().ok()?;
        link.volume.map(|v| v.root)
    }

    /// Every chunk (but the root) of the volume on node `idx`.
    pub fn volume_chunks(&self, idx: usize) -> Result<Vec<Allocation>, RemoteError> {
        let node = self.nodes.get(idx).ok_or(RemoteError::Lost)?;
        let link = node.link()?;
        node.chunks(&link, true)
            .map_err(|e| node.failed(link.epoch, e))
    }

    /// A new chunk of `bytes` on node `idx`, outside the block pools (metadata).
    pub fn alloc_chunk(&self, idx: usize, bytes: u64) -> Result<Allocation, RemoteError> {
        let node = self.nodes.get(idx).ok_or(RemoteError::Lost)?;
        let link = node.link()?;
        let a = node
            .alloc(&link, bytes)
            .map_err(|e| node.failed(link.epoch, e))?;
        self.counters.chunk_allocs.fetch_add(1, Ordering::Relaxed);
        Ok(a)
    }

    /// Gives a chunk of node `idx` back to its memnode (in the node's current epoch).
    pub fn free_chunk_of(&self, idx: usize, chunk: Allocation) {
        if let Some(node) = self.nodes.get(idx) {
            if let Some((epoch, _)) = node.identity() {
                self.free_chunk(node, epoch, chunk.addr, chunk.rkey);
            }
        }
    }

    /// Gives back the volume's chunk at `addr` on node `idx`, whatever rkey it has
    /// now (a link of a later epoch opened the volume again and got new ones).
    pub fn free_volume_chunk_at(&self, idx: usize, addr: u64) {
        match self.volume_chunks(idx) {
            Ok(chunks) => {
                if let Some(c) = chunks.into_iter().find(|c| c.addr == addr) {
                    self.free_chunk_of(idx, c);
                }
            }
            Err(e) => log::warn!("cannot list the volume's chunks: {e}"),
        }
    }

    /// Hands a chunk of the volume to node `idx`'s block pool, with the pieces in
    /// `used` (start -> bytes) already taken.
    pub fn adopt_chunk(
        &self,
        idx: usize,
        chunk: Allocation,
        used: &std::collections::BTreeMap<u64, u64>,
    ) {
        if let Some(node) = self.nodes.get(idx) {
            lock(&node.pool).blocks.add_chunk_in_use(chunk, used);
        }
    }

    /// A copy at `remote` on node `idx`, of the node's current epoch.
    pub fn replica_at(&self, idx: usize, remote: RemoteAddr) -> Option<Replica> {
        let (epoch, _) = self.node_identity(idx)?;
        Some(Replica {
            node: u16::try_from(idx).ok()?,
            epoch,
            remote,
        })
    }

    /// Reads `buf.len()` bytes at `remote` on node `idx` (in pieces the fabric takes).
    pub fn read_at(
        &self,
        idx: usize,
        remote: RemoteAddr,
        buf: &mut [u8],
    ) -> Result<(), RemoteError> {
        let replica = self.replica_at(idx, remote).ok_or(RemoteError::Lost)?;
        let ops = buf
            .chunks_mut(MAX_DATA_OP)
            .enumerate()
            .map(|(k, piece)| CopyOp {
                replica,
                op: RdmaOp::Read {
                    local: piece,
                    remote: remote.offset(k * MAX_DATA_OP),
                },
            })
            .collect();
        self.post(ops, Patience::Wait).into_iter().collect()
    }

    /// Writes `buf` at `remote` on node `idx` (in pieces the fabric takes); while
    /// the node is unreachable, waits for it.
    pub fn write_at(&self, idx: usize, remote: RemoteAddr, buf: &[u8]) -> Result<(), RemoteError> {
        self.write_at_with(idx, remote, buf, Patience::Wait)
    }

    /// As [`RemoteStore::write_at`], but fails at once while the node is
    /// unreachable: for writes that another node's copy makes unnecessary.
    pub fn write_at_if_reachable(
        &self,
        idx: usize,
        remote: RemoteAddr,
        buf: &[u8],
    ) -> Result<(), RemoteError> {
        self.write_at_with(idx, remote, buf, Patience::FailFast)
    }

    fn write_at_with(
        &self,
        idx: usize,
        remote: RemoteAddr,
        buf: &[u8],
        patience: Patience,
    ) -> Result<(), RemoteError> {
        let replica = self.replica_at(idx, remote).ok_or(RemoteError::Lost)?;
        let ops = buf
            .chunks(MAX_DATA_OP)
            .enumerate()
            .map(|(k, piece)| CopyOp {
                replica,
                op: RdmaOp::Write {
                    local: piece,
                    remote: remote.offset(k * MAX_DATA_OP),
                },
            })
            .collect();
        self.post(ops, patience).into_iter().collect()
    }

    /// Releases the volume on every memnode that is up (unmount): its chunks stay,
    /// but for the entirely free ones the block pools held.
    pub fn close_volume(&self) {
        for node in &self.nodes {
            let Ok(link) = node.link() else { continue };
            if link.volume.is_none() {
                continue;
            }
            let (epoch, empty) = {
                let mut pool = lock(&node.pool);
                (pool.epoch, pool.blocks.take_empty_chunks())
            };
            for c in empty {
                self.free_chunk(node, epoch, c.addr, c.rkey);
            }
            if let Err(e) = control::volume_close(link.control()) {
                log::warn!("closing the volume: {}", node.control_error(link.epoch, e));
            }
        }
    }

    /// Gives every chunk back to the memnodes (at unmount).
    pub fn release_all(&self) {
        for node in &self.nodes {
            let (epoch, chunks) = {
                let mut pool = lock(&node.pool);
                (pool.epoch, pool.blocks.drain())
            };
            for c in chunks {
                self.free_chunk(node, epoch, c.addr, c.rkey);
            }
        }
    }
}
