//! Block allocation: a block gets copies on `replicas` distinct memnodes, each taken
//! from the node's [`BlockPool`](super::pool::BlockPool), nodes taken round-robin so
//! files spread over every memnode. A pool that runs dry gets a new chunk from its
//! memnode (usually already allocated ahead by the refill thread, `refill.rs`); a
//! block grows and shrinks in place where its pages allow, and freed pieces go back to
//! their pools (an emptied chunk back to its memnode, `chunks.rs`).

use super::error::RemoteError;
use super::placement::{BlockLoc, Replica, MAX_REPLICAS};
use super::pool::pages_for;
use super::{lock, RemoteStore};
use rmemfs_common::fabric::RemoteAddr;
use rmemfs_common::size::format_size;
use std::sync::atomic::Ordering;
use std::time::Instant;

impl RemoteStore {
    /// Allocates a new block's first `bytes` (rounded up to whole pages, at most a
    /// block): copies on as many distinct nodes as [`RemoteStore::copies_possible`].
    /// Fewer nodes with room is `NoSpace`.
    ///
    /// An allocation that fails while memnodes it could use are unreachable (or one
    /// became so during it: a connection broken under an Alloc) waits for them as an
    /// operation with no copy in reach does, then tries again.
    pub fn alloc_block(&self, bytes: u64) -> Result<BlockLoc, RemoteError> {
        let since = Instant::now();
        loop {
            let before = self.unreachable_events();
            let r = self.try_alloc_block(bytes);
            let cut_off = self.unreachable_events() != before;
            match r {
                Err(_) if (cut_off || self.any_unreachable()) && self.await_unreachable(since) => {
                    continue
                }
                r => return r,
            }
        }
    }

    fn try_alloc_block(&self, bytes: u64) -> Result<BlockLoc, RemoteError> {
        let mut loc = BlockLoc::new(pages_for(bytes).min(self.block_size));
        let want = self.copies_possible();
        if want == 0 {
            return Err(self.nodes[0].link().err().unwrap_or(RemoteError::Lost));
        }
        let added = self.add_copies(&mut loc, want);
        // A node may have gone down meanwhile: what is possible now is enough.
        if added == 0 || added < self.copies_possible().min(want) {
            self.free_blocks([loc]);
            return Err(RemoteError::NoSpace);
        }
        Ok(loc)
    }

    /// Drops the copies of `loc` that no longer exist or would miss a write
    /// ([`RemoteStore::prune_for_write`]), then allocates up to `want` new ones on up
    /// nodes that hold none, nodes taken in turn. Returns how many it added (fewer
    /// when fewer nodes have room).
    pub fn add_copies(&self, loc: &mut BlockLoc, want: usize) -> usize {
        self.prune_for_write(loc);
        let n = self.nodes.len();
        let start = self.next_node.fetch_add(1, Ordering::Relaxed);
        let mut added = 0;
        for i in 0..n {
            if added == want || loc.len() == MAX_REPLICAS {
                break;
            }
            let idx = (start + i) % n;
            if loc.has_node(idx as u16) {
                continue;
            }
            if let Ok(r) = self.alloc_on(idx, loc.bytes()) {
                loc.push(r);
                added += 1;
            }
        }
        added
    }

    /// One copy of `bytes` on node `idx`, from its pool (refilled from the memnode if
    /// no free extent is long enough).
    pub(super) fn alloc_on(&self, idx: usize, bytes: u64) -> Result<Replica, RemoteError> {
        let node = &self.nodes[idx];
        let link = node.link()?;
        let mut pool = lock(&node.pool);
        if pool.epoch != link.epoch {
            return Err(RemoteError::Lost);
        }
        let replica = |remote| Replica {
            node: idx as u16,
            epoch: link.epoch,
            remote,
        };
        if let Some(b) = pool.blocks.take(bytes) {
            if pool.blocks.free_bytes() < self.low_water && !node.full.load(Ordering::Relaxed) {
                node.refill.want();
            }
            return Ok(replica(b));
        }
        if node.full.load(Ordering::Relaxed) {
            return Err(RemoteError::NoSpace);
        }
        self.counters
            .chunk_allocs_waited
            .fetch_add(1, Ordering::Relaxed);
        // Refill: the preferred chunk size, then halves of it down to what is asked
        // for, so the last bytes of a nearly full memnode are still used.
        let least = pages_for(bytes);
        let mut size = self.chunk_size;
        loop {
            match node.alloc(&link, size) {
                Ok(a) => {
                    self.counters.chunk_allocs.fetch_add(1, Ordering::Relaxed);
                    log::debug!(
                        "memnode {}: new chunk {:#x}+{}",
                        node.name,
                        a.addr,
                        format_size(a.len)
                    );
                    if let Err(e) = node.pool_chunk(&mut pool.blocks, a) {
                        drop(pool);
                        return Err(node.failed(link.epoch, e));
                    }
                    return pool
                        .blocks
                        .take(bytes)
                        .map(replica)
                        .ok_or(RemoteError::NoSpace);
                }
                Err(RemoteError::NoSpace) if size > least => {
                    size = (size / 2).max(least);
                }
                Err(RemoteError::NoSpace) => {
                    // A tenant at its quota is, for this fsd, a memnode that is full:
                    // room comes back as it frees, or is found on other memnodes.
                    node.full.store(true, Ordering::Relaxed);
                    log::warn!("memnode {} has no room for this fsd", node.name);
                    return Err(RemoteError::NoSpace);
                }
                Err(e) => {
                    // Recorded without the pool's lock (see `Node::alloc`).
                    drop(pool);
                    return Err(node.failed(link.epoch, e));
                }
            }
        }
    }

    /// `loc` grown to `bytes` (whole pages, at most a block) where its copies lie, if
    /// the pages after every copy are free; else `None` and nothing changed.
    pub fn grow_in_place(&self, loc: &BlockLoc, bytes: u64) -> Option<BlockLoc> {
        let to = pages_for(bytes).min(self.block_size);
        let mut grown: Vec<&Replica> = Vec::new();
        for r in loc.replicas() {
            let ok = self.nodes.get(r.node as usize).is_some_and(|node| {
                let mut pool = lock(&node.pool);
                pool.epoch == r.epoch && pool.blocks.extend(r.remote, loc.bytes(), to)
            });
            if !ok {
                // Give back what was taken: each grown copy's pages past the old end.
                let grown = BlockLoc::from_replicas(to, grown.into_iter().copied());
                self.shrink_in_place(&grown, loc.bytes());
                return None;
            }
            grown.push(r);
        }
        Some(BlockLoc::from_replicas(to, loc.replicas().iter().copied()))
    }

    /// `loc` cut to its first `bytes` (whole pages): the pages past them go back to
    /// the pools. The caller makes sure nothing reads or writes them any more.
    pub fn shrink_in_place(&self, loc: &BlockLoc, bytes: u64) -> BlockLoc {
        let to = pages_for(bytes).min(loc.bytes());
        for r in loc.replicas() {
            if to < loc.bytes() {
                let tail = RemoteAddr {
                    addr: r.remote.addr + to,
                    rkey: r.remote.rkey,
                };
                self.free_copy(&Replica { remote: tail, ..*r }, loc.bytes() - to);
            }
        }
        BlockLoc::from_replicas(to, loc.replicas().iter().copied())
    }

    /// Gives blocks back to their pools; chunks that empty out go back to the memnode.
    /// Copies of an ended epoch are already gone and are skipped.
    pub fn free_blocks(&self, blocks: impl IntoIterator<Item = BlockLoc>) {
        for loc in blocks {
            for r in loc.replicas() {
                self.free_copy(r, loc.bytes());
            }
        }
    }

    fn free_copy(&self, r: &Replica, bytes: u64) {
        let Some(node) = self.nodes.get(r.node as usize) else {
            return;
        };
        let release = {
            let mut pool = lock(&node.pool);
            if pool.epoch != r.epoch {
                return;
            }
            let (known, release) = pool.blocks.put(r.remote, bytes);
            if !known {
                log::error!("freeing unknown block {r:?}");
                return;
            }
            release
        };
        node.full.store(false, Ordering::Relaxed);
        for chunk in release {
            self.free_chunk(node, r.epoch, chunk.addr, chunk.rkey);
        }
    }
}
