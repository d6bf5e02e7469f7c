//! Where the volume loader (`load.rs`) reads a volume from: the few questions it asks
//! of the memnodes ([`VolumeSource`]), answered by the [`RemoteStore`] in fsd and by
//! memory made up of hostile bytes in the loader's fuzz target
//! (`fuzz/fuzz_targets/volume_load.rs`), which needs no network. A source hands out
//! what the memnodes said as fsd's remote layer checked it (`remote/checked.rs`:
//! chunks that do not wrap, lists in order without overlaps, within capacity);
//! everything read from remote memory (superblocks, checkpoints, logs) is the
//! loader's to check.
//!
//! Also the one place the loader turns a length read from remote memory into an
//! allocation ([`read_area`]): bounded by the chunk that holds it and allocated
//! fallibly, so a length no memory can hold is an error, never an abort.

use super::format::Area;
use crate::remote::{RemoteError, RemoteStore, Replica};
use rmemfs_common::fabric::RemoteAddr;
use rmemfs_common::protocol::Allocation;

/// What loading a volume reads from its memnodes (numbered `0..node_count()`).
pub trait VolumeSource {
    fn node_count(&self) -> usize;
    /// The memnode's name, for messages.
    fn node_name(&self, node: usize) -> &str;
    fn block_size(&self) -> u64;
    /// The link epoch and memnode id whose copies count on `node`.
    fn node_identity(&self, node: usize) -> Option<(u32, u64)>;
    /// The volume's root chunk on `node`, while it is up.
    fn volume_root(&self, node: usize) -> Option<Allocation>;
    /// Every chunk of the volume on `node` but the root, in address order.
    fn volume_chunks(&self, node: usize) -> Result<Vec<Allocation>, RemoteError>;
    /// Reads `buf.len()` bytes at `at` on `node`.
    fn read_at(&self, node: usize, at: RemoteAddr, buf: &mut [u8]) -> Result<(), RemoteError>;
    /// A block copy at `at` on `node` (in its current epoch).
    fn replica_at(&self, node: usize, at: RemoteAddr) -> Option<Replica>;
}

impl VolumeSource for RemoteStore {
    fn node_count(&self) -> usize {
        RemoteStore::node_count(self)
    }
    fn node_name(&self, node: usize) -> &str {
        RemoteStore::node_name(self, node)
    }
    fn block_size(&self) -> u64 {
        RemoteStore::block_size(self)
    }
    fn node_identity(&self, node: usize) -> Option<(u32, u64)> {
        RemoteStore::node_identity(self, node)
    }
    fn volume_root(&self, node: usize) -> Option<Allocation> {
        RemoteStore::volume_root(self, node)
    }
    fn volume_chunks(&self, node: usize) -> Result<Vec<Allocation>, RemoteError> {
        RemoteStore::volume_chunks(self, node)
    }
    fn read_at(&self, node: usize, at: RemoteAddr, buf: &mut [u8]) -> Result<(), RemoteError> {
        RemoteStore::read_at(self, node, at, buf)
    }
    fn replica_at(&self, node: usize, at: RemoteAddr) -> Option<Replica> {
        RemoteStore::replica_at(self, node, at)
    }
}

/// The end of chunk `c`. Chunks from a source do not wrap (`remote/checked.rs`);
/// saturating keeps the loader's sums safe without relying on it.
pub(super) fn end(c: &Allocation) -> u64 {
    c.addr.saturating_add(c.len)
}

/// Reads the first `at_most` bytes of `area` (the `what` of a superblock on
/// `node`), which must lie inside one of the volume's chunks there: a superblock
/// names the area, but only the chunk bounds how much there is to read. The buffer
/// is allocated fallibly, so a length fsd's memory cannot hold is an error.
pub(super) fn read_area(
    source: &impl VolumeSource,
    node: usize,
    area: Area,
    at_most: u64,
    what: &str,
) -> Result<Vec<u8>, String> {
    let chunk = source
        .volume_chunks(node)
        .map_err(|e| e.to_string())?
        .into_iter()
        .find(|c| {
            c.addr <= area.addr && area.addr.checked_add(area.len).is_some_and(|e| e <= end(c))
        })
        .ok_or(format!(
            "the {what} at {:#x} (length {}) is in no chunk of the volume",
            area.addr, area.len
        ))?;
    let len = usize::try_from(area.len.min(at_most))
        .map_err(|_| format!("the {what} length {} is out of range", area.len))?;
    let mut buf = Vec::new();
    buf.try_reserve_exact(len).map_err(|e| {
        format!(
            "the {what} at {:#x} is {len} bytes, more than fsd can allocate: {e}",
            area.addr
        )
    })?;
    buf.resize(len, 0);
    let at = RemoteAddr {
        addr: area.addr,
        rkey: chunk.rkey,
    };
    source
        .read_at(node, at, &mut buf)
        .map_err(|e| format!("reading the {what}: {e}"))?;
    Ok(buf)
}
