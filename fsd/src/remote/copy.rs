//! Copying blocks inside remote memory (for `copy_file_range(2)`): a new block gets
//! the bytes of an existing one without them passing through fsd's page cache.
//!
//! A copy of the new block on a memnode that also holds a copy of the old one, and
//! that serves `Copy` (`FEATURE_COPY` in its Welcome), is made by that memnode, which
//! copies within its own memory under the same rkey and bounds checks as a READ and a
//! WRITE: nothing crosses the network. Any other copy of the new block (another
//! memnode, an older memnode, a local copy that failed) is read from a copy of the
//! old block into a buffer, checked against the old block's page sums like any read,
//! and written: the data crosses fsd once, not twice through its cache and the
//! kernel. New copies are placed on the old block's memnodes where those have room,
//! so the first way is the usual one.

use super::batch::{CopyOp, Patience};
use super::error::RemoteError;
use super::io::BlockRead;
use super::placement::{BlockLoc, Replica, MAX_REPLICAS};
use super::RemoteStore;
use rmemfs_common::fabric::RdmaOp;
use rmemfs_common::protocol::{CopySpan, FEATURE_COPY, MAX_COPY_BYTES, MAX_COPY_SPANS};
use std::sync::atomic::Ordering;

/// One block to copy: the old block's copies and page sums, and the new block's
/// copies (of the same length).
pub struct BlockCopy<'a> {
    pub from: &'a BlockLoc,
    pub sums: &'a [Option<u32>],
    pub to: &'a BlockLoc,
}

impl RemoteStore {
    /// A new block of `like`'s length, its copies on `like`'s memnodes where they have
    /// room (so memnodes can make them, see the module docs), then on others, as many
    /// as [`RemoteStore::copies_possible`]. Fewer is `NoSpace`.
    pub fn alloc_block_beside(&self, like: &BlockLoc) -> Result<BlockLoc, RemoteError> {
        let want = self.copies_possible();
        let mut loc = BlockLoc::new(like.bytes());
        for r in like.replicas() {
            if loc.len() == want.min(MAX_REPLICAS) {
                break;
            }
            if self.holds(r) && !loc.has_node(r.node) {
                if let Ok(copy) = self.alloc_on(r.node as usize, like.bytes()) {
                    loc.push(copy);
                }
            }
        }
        let missing = want.saturating_sub(loc.len());
        let added = self.add_copies(&mut loc, missing);
        if want == 0 || added < missing {
            self.free_blocks([loc]);
            return Err(RemoteError::NoSpace);
        }
        Ok(loc)
    }

    /// Copies each block's bytes (its `from` length) into every copy of its `to`.
    /// One result per block: `Ok` once every copy of `to` holds them.
    pub fn copy_blocks(&self, blocks: &[BlockCopy<'_>]) -> Vec<Result<(), RemoteError>> {
        let mut results: Vec<Result<(), RemoteError>> = blocks.iter().map(|_| Ok(())).collect();
        // The copies of the new blocks each memnode can make: (block, source, target).
        let mut local: Vec<(usize, Replica, Replica)> = Vec::new();
        // The copies that go through fsd: (block, target).
        let mut through: Vec<(usize, Replica)> = Vec::new();
        for (b, c) in blocks.iter().enumerate() {
            for t in c.to.replicas() {
                let source = c
                    .from
                    .replicas()
                    .iter()
                    .find(|s| s.node == t.node && s.epoch == t.epoch && self.holds(s));
                match source {
                    Some(s) if self.serves_copy(t.node as usize) => local.push((b, *s, *t)),
                    _ => through.push((b, *t)),
                }
            }
        }
        for (b, t, r) in self.copy_on_memnodes(blocks, &local) {
            if let Err(e) = r {
                log::warn!(
                    "memnode {} could not copy a block ({e}); copying it through fsd",
                    self.node_name(t.node as usize)
                );
                through.push((b, t));
            }
        }
        if through.is_empty() {
            return results;
        }
        // Read each block that needs it once (checked against its sums), then write
        // it to those of its new copies.
        let mut needed: Vec<usize> = through.iter().map(|&(b, _)| b).collect();
        needed.sort_unstable();
        needed.dedup();
        let mut bufs: Vec<Vec<u8>> = needed
            .iter()
            .map(|&b| vec![0u8; blocks[b].from.bytes() as usize])
            .collect();
        let mut reads: Vec<BlockRead<'_>> = needed
            .iter()
            .zip(bufs.iter_mut())
            .map(|(&b, buf)| (blocks[b].from, 0, &mut buf[..], blocks[b].sums))
            .collect();
        let read = self.read_blocks(&mut reads);
        drop(reads);
        let mut ops = Vec::new();
        let mut which = Vec::new();
        for (k, &b) in needed.iter().enumerate() {
            if let Err(e) = &read[k] {
                results[b] = Err(e.clone());
                continue;
            }
            for &(_, t) in through.iter().filter(|(tb, _)| *tb == b) {
                ops.push(CopyOp {
                    replica: t,
                    op: RdmaOp::Write {
                        local: &bufs[k][..],
                        remote: t.remote,
                    },
                });
                which.push(b);
            }
        }
        for (b, r) in which.into_iter().zip(self.post(ops, Patience::Wait)) {
            if let (Err(e), true) = (r, results[b].is_ok()) {
                results[b] = Err(e);
            }
        }
        results
    }

    /// Whether node `idx`'s memnode copies within its memory.
    fn serves_copy(&self, idx: usize) -> bool {
        self.nodes
            .get(idx)
            .and_then(|n| n.link().ok())
            .is_some_and(|l| l.features & FEATURE_COPY != 0)
    }

    /// Asks each memnode to make the copies in `local` that are its own, in requests
    /// of at most [`MAX_COPY_SPANS`] spans and [`MAX_COPY_BYTES`] bytes (copies that
    /// continue one another merged into one span). Returns each copy's block, target
    /// and outcome.
    fn copy_on_memnodes(
        &self,
        blocks: &[BlockCopy<'_>],
        local: &[(usize, Replica, Replica)],
    ) -> Vec<(usize, Replica, Result<(), RemoteError>)> {
        let mut out = Vec::with_capacity(local.len());
        let mut nodes: Vec<u16> = local.iter().map(|(_, _, t)| t.node).collect();
        nodes.sort_unstable();
        nodes.dedup();
        for node in nodes {
            let mine: Vec<&(usize, Replica, Replica)> =
                local.iter().filter(|(_, _, t)| t.node == node).collect();
            // Copies that continue one another in both places go as one span (blocks
            // allocated in turn usually lie one after the other).
            let mut spans: Vec<(CopySpan, Vec<(usize, Replica)>)> = Vec::new();
            for &&(b, s, t) in &mine {
                let len = blocks[b].from.bytes();
                let span = CopySpan {
                    src_addr: s.remote.addr,
                    src_rkey: s.remote.rkey,
                    dst_addr: t.remote.addr,
                    dst_rkey: t.remote.rkey,
                    len: len as u32,
                };
                match spans.last_mut() {
                    Some((last, members))
                        if last.src_rkey == span.src_rkey
                            && last.dst_rkey == span.dst_rkey
                            && last.src_addr + last.len as u64 == span.src_addr
                            && last.dst_addr + last.len as u64 == span.dst_addr
                            && last.len as u64 + len <= MAX_COPY_BYTES =>
                    {
                        last.len += span.len;
                        members.push((b, t));
                    }
                    _ => spans.push((span, vec![(b, t)])),
                }
            }
            let mut start = 0;
            while start < spans.len() {
                let mut bytes = 0u64;
                let mut end = start;
                while end < spans.len() && end - start < MAX_COPY_SPANS {
                    let len = spans[end].0.len as u64;
                    if end > start && bytes + len > MAX_COPY_BYTES {
                        break;
                    }
                    bytes += len;
                    end += 1;
                }
                let batch = &spans[start..end];
                let request: Vec<CopySpan> = batch.iter().map(|(s, _)| *s).collect();
                let epoch = batch[0].1[0].1.epoch;
                let r = self.copy_spans(node as usize, epoch, &request, bytes);
                for (_, members) in batch {
                    out.extend(members.iter().map(|&(b, t)| (b, t, r.clone())));
                }
                start = end;
            }
        }
        out
    }

    /// One `Copy` request to node `idx` (on its link of `epoch`).
    fn copy_spans(
        &self,
        idx: usize,
        epoch: u32,
        spans: &[CopySpan],
        bytes: u64,
    ) -> Result<(), RemoteError> {
        let node = self.nodes.get(idx).ok_or(RemoteError::Lost)?;
        let link = node.link()?;
        if link.epoch != epoch {
            return Err(RemoteError::Lost);
        }
        let remapped: Vec<CopySpan>;
        let spans = if link.remap.is_some() {
            remapped = spans
                .iter()
                .map(|s| CopySpan {
                    src_rkey: link.rkey(s.src_addr, s.src_rkey),
                    dst_rkey: link.rkey(s.dst_addr, s.dst_rkey),
                    ..*s
                })
                .collect();
            &remapped
        } else {
            spans
        };
        node.copy(&link, spans, bytes)?;
        self.counters
            .memnode_copy_bytes
            .fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }
}
