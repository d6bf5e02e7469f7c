//! Rkeys after a memnode restart. A memnode restarted on its memory file
//! (`memnode --memory-file`) answers as the same instance and resumes the session with
//! every chunk, but its chunks are registered anew: their rkeys changed (its Welcome's
//! `boot` says so). fsd then lists the session's (or volume's) chunks once (`node.rs`,
//! on reconnect) and sends every operation on a chunk it held before under the chunk's
//! new rkey ([`RkeyRemap`], looked up by address), so no copy, block map or metadata
//! of fsd's has to change. Apart because it is the one piece of a link's state that
//! outlives the link.

use super::lock;
use rmemfs_common::protocol::Allocation;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// The current rkey of each chunk fsd held when its memnode restarted on its memory
/// file, by address: fsd's copies, pools and metadata keep the rkeys they were given,
/// and each operation is sent under the chunk's current one. A chunk allocated since
/// is not here (its rkey is current); a chunk freed is taken out, so a new chunk at
/// its address keeps its own.
pub(super) struct RkeyRemap {
    /// Chunk start -> (length, current rkey).
    chunks: Mutex<BTreeMap<u64, (u64, u32)>>,
}

impl RkeyRemap {
    pub(super) fn new(chunks: &[Allocation]) -> RkeyRemap {
        RkeyRemap {
            chunks: Mutex::new(chunks.iter().map(|c| (c.addr, (c.len, c.rkey))).collect()),
        }
    }

    /// The rkey to send an access at `addr` under, given the one fsd holds.
    pub(super) fn rkey(&self, addr: u64, held: u32) -> u32 {
        let chunks = lock(&self.chunks);
        match chunks.range(..=addr).next_back() {
            Some((&start, &(len, rkey))) if addr - start < len => rkey,
            _ => held,
        }
    }

    pub(super) fn forget(&self, addr: u64) {
        lock(&self.chunks).remove(&addr);
    }
}
