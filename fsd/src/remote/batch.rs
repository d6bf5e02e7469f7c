//! Batched one-sided operations: every READ and WRITE fsd sends to remote memory goes
//! through [`RemoteStore::post`], which posts the operations for one memnode together
//! on one of its connections (so a batch is outstanding at once), sends each under its
//! chunk's current rkey, counts the traffic, and, when asked to be patient, waits for
//! an unreachable memnode and sends again. Apart because block I/O, copies and the
//! volumes' raw chunk access all share it.

use super::error::{is_unreachable, RemoteError};
use super::node::Node;
use super::placement::Replica;
use super::RemoteStore;
use rmemfs_common::fabric::RdmaOp;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Whether an operation on an unreachable node waits for it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Patience {
    /// Fail at once: the caller has another copy to turn to.
    FailFast,
    /// Wait for the node (bounded by `unreachable_timeout`, or until it is lost), then
    /// send the operation again.
    Wait,
}

/// One remote operation on one copy, as [`RemoteStore::post`] takes them.
pub(super) struct CopyOp<'a> {
    pub replica: Replica,
    pub op: RdmaOp<'a>,
}

impl RemoteStore {
    /// Posts `ops`; all operations for one node go together on one of its
    /// connections. Returns one result per operation, in order.
    pub(super) fn post(
        &self,
        ops: Vec<CopyOp<'_>>,
        patience: Patience,
    ) -> Vec<Result<(), RemoteError>> {
        self.post_counted(ops, patience, true)
    }

    /// As [`RemoteStore::post`]; `counted` false leaves the traffic counters alone
    /// (the scrubber's reads, which it counts itself, are not the data path's). With
    /// [`Patience::Wait`], operations that found their node unreachable (before or
    /// while they were sent) wait for it and are sent again.
    pub(super) fn post_counted(
        &self,
        ops: Vec<CopyOp<'_>>,
        patience: Patience,
        counted: bool,
    ) -> Vec<Result<(), RemoteError>> {
        let mut results: Vec<Result<(), RemoteError>> = ops.iter().map(|_| Ok(())).collect();
        let mut nodes: Vec<u16> = ops.iter().map(|o| o.replica.node).collect();
        nodes.sort_unstable();
        nodes.dedup();
        let mut ops: Vec<Option<CopyOp<'_>>> = ops.into_iter().map(Some).collect();
        for node_idx in nodes {
            let members: Vec<usize> = (0..ops.len())
                .filter(|&i| ops[i].as_ref().is_some_and(|o| o.replica.node == node_idx))
                .collect();
            let mut batch: Vec<(usize, CopyOp<'_>)> = members
                .into_iter()
                .filter_map(|i| Some((i, ops[i].take()?)))
                .collect();
            let Some(node) = self.nodes.get(node_idx as usize) else {
                for (i, _) in batch {
                    results[i] = Err(RemoteError::Lost);
                }
                continue;
            };
            let since = Instant::now();
            loop {
                let outcomes = self.execute_on(node, &mut batch, counted);
                let mut again = Vec::new();
                for ((i, op), outcome) in batch.into_iter().zip(outcomes) {
                    let retry = patience == Patience::Wait
                        && outcome.as_ref().is_err_and(is_unreachable)
                        && node.has_copy(&op.replica);
                    results[i] = outcome;
                    if retry {
                        again.push((i, op));
                    }
                }
                if again.is_empty() || !self.await_node(node, again[0].1.replica.epoch, since) {
                    break;
                }
                self.counters
                    .ops_retried
                    .fetch_add(again.len() as u64, Ordering::Relaxed);
                batch = again;
            }
        }
        results
    }

    /// Sends `batch` (operations on copies of `node`) on one of its connections;
    /// one result per operation.
    pub(super) fn execute_on(
        &self,
        node: &Node,
        batch: &mut [(usize, CopyOp<'_>)],
        counted: bool,
    ) -> Vec<Result<(), RemoteError>> {
        let link = match node.link() {
            Ok(l) => l,
            Err(e) => return batch.iter().map(|_| Err(e.clone())).collect(),
        };
        let mut results: Vec<Result<(), RemoteError>> = batch.iter().map(|_| Ok(())).collect();
        let mut posted = Vec::with_capacity(batch.len());
        let mut rdma: Vec<RdmaOp<'_>> = Vec::with_capacity(batch.len());
        let mut reads = 0;
        for (k, (_, CopyOp { replica, op })) in batch.iter_mut().enumerate() {
            if replica.epoch != link.epoch {
                results[k] = Err(RemoteError::Lost);
                continue;
            }
            let (count, bytes, len, is_read) = match op {
                RdmaOp::Read { local, .. } => (
                    &self.counters.reads,
                    &self.counters.read_bytes,
                    local.len(),
                    true,
                ),
                RdmaOp::Write { local, .. } => (
                    &self.counters.writes,
                    &self.counters.write_bytes,
                    local.len(),
                    false,
                ),
            };
            if counted {
                count.fetch_add(1, Ordering::Relaxed);
                bytes.fetch_add(len as u64, Ordering::Relaxed);
            }
            reads += is_read as u64;
            posted.push(k);
            rdma.push(op.reborrow());
        }
        if link.remap.is_some() {
            for op in &mut rdma {
                let (RdmaOp::Read { remote, .. } | RdmaOp::Write { remote, .. }) = op;
                remote.rkey = link.rkey(remote.addr, remote.rkey);
            }
        }
        let started = Instant::now();
        let outcomes = link.endpoint().execute(&mut rdma);
        if counted {
            let writes = rdma.len() as u64 - reads;
            self.counters.observe(started.elapsed(), reads, writes);
        }
        for (k, outcome) in posted.into_iter().zip(outcomes) {
            results[k] = outcome.map_err(|e| node.fabric_error(link.epoch, e));
        }
        results
    }
}
