//! Block I/O: reads take one copy of each block, check its pages against their sums
//! and fail over to the next copy (rewriting the copies that failed from the good one);
//! writes go to every copy. Bytes past a block's allocation read as zeros and must be
//! zeros when written. The operations themselves go out in batches (`batch.rs`).

use super::batch::{CopyOp, Patience};
use super::error::{is_unreachable, RemoteError};
use super::placement::{BlockLoc, Replica};
use super::pool::PAGE;
use super::states::WAIT_STEP;
use super::{sums, RemoteStore};
use rmemfs_common::fabric::{RdmaOp, RemoteAddr};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// How many of the `len` bytes at `offset` of a block lie in its allocation.
pub(super) fn held_part(loc: &BlockLoc, offset: usize, len: usize) -> usize {
    (loc.bytes() as usize).saturating_sub(offset).min(len)
}

/// One read of [`RemoteStore::read_blocks`]: a block's copies, the byte offset in the
/// block, the buffer, and the expected sums of the whole pages the range holds.
pub type BlockRead<'a> = (&'a BlockLoc, usize, &'a mut [u8], &'a [Option<u32>]);

impl RemoteStore {
    /// Reads bytes `offset..offset + buffer length` of each block into its buffer from
    /// one of its copies, trying the next copy when one fails; bytes past the
    /// block's allocation read as zeros. Each read's pages are checked against its
    /// expected sums (`sums.rs`; one per page of the range): a copy that fails is
    /// logged and counted, the next copy is read, and once one passes the copies
    /// that failed are rewritten from it (read repair). A block with no copy left
    /// fails with [`RemoteError::Lost`], one whose every copy fails its checksum
    /// with [`RemoteError::Corrupt`]. Copies that can be reached are tried first; a
    /// block none of whose copies could be read but that has copies on unreachable
    /// memnodes waits for one of them ([`RemoteStore::await_reachable`]'s bounds)
    /// and is read again.
    pub fn read_blocks(&self, reads: &mut [BlockRead<'_>]) -> Vec<Result<(), RemoteError>> {
        let mut results: Vec<Result<(), RemoteError>> =
            reads.iter().map(|_| Err(RemoteError::Lost)).collect();
        // The next copy to try, per block; `None` once a block is done.
        let mut next: Vec<Option<usize>> = reads.iter().map(|_| Some(0)).collect();
        // Bytes of each buffer the block's allocation holds; the rest is zeros.
        let held: Vec<usize> = reads
            .iter_mut()
            .map(|(loc, offset, buf, _)| {
                let n = held_part(loc, *offset, buf.len());
                buf[n..].fill(0);
                n
            })
            .collect();
        // The copies of each block whose bytes failed their checksum.
        let mut bad: Vec<Vec<Replica>> = vec![Vec::new(); reads.len()];
        for (i, (loc, _, _, _)) in reads.iter().enumerate() {
            if held[i] == 0 && loc.replicas().iter().any(|r| self.has_copy(r)) {
                results[i] = Ok(());
                next[i] = None;
            }
        }
        let since = Instant::now();
        loop {
            self.read_reachable_copies(reads, &held, &mut next, &mut results, &mut bad);
            // Blocks still unread whose other copies exist but are out of reach.
            let waiting: Vec<usize> = (0..reads.len())
                .filter(|&i| {
                    results[i].is_err()
                        && reads[i]
                            .0
                            .replicas()
                            .iter()
                            .any(|r| self.has_copy(r) && !self.holds(r))
                })
                .collect();
            if waiting.is_empty() {
                break;
            }
            if !self.await_any(reads, &waiting, since) {
                // Out of reach, not lost: say which memnode it waits for.
                for &i in &waiting {
                    if let Err(RemoteError::Lost) = results[i] {
                        let away = reads[i].0.replicas().iter().find_map(|r| {
                            let node = self.nodes.get(r.node as usize)?;
                            node.has_copy(r).then(|| node.link().err()).flatten()
                        });
                        if let Some(e) = away {
                            results[i] = Err(e);
                        }
                    }
                }
                break;
            }
            self.counters
                .ops_retried
                .fetch_add(waiting.len() as u64, Ordering::Relaxed);
            for i in waiting {
                next[i] = Some(0);
            }
        }
        for (i, bad) in bad.iter().enumerate() {
            if results[i].is_ok() && !bad.is_empty() {
                let (_, offset, buf, _) = &reads[i];
                self.rewrite_copies(bad, *offset, &buf[..held[i]]);
            }
        }
        results
    }

    /// Waits until one of the blocks `which` of `reads` has a copy in reach (true),
    /// or none of them has a copy left, or the unreachable timeout (from `since`)
    /// passes, or fsd stops (false).
    fn await_any(&self, reads: &[BlockRead<'_>], which: &[usize], since: Instant) -> bool {
        loop {
            if which.iter().any(|&i| self.live_copies(reads[i].0) > 0) {
                return true;
            }
            let none_left = which
                .iter()
                .all(|&i| !reads[i].0.replicas().iter().any(|r| self.has_copy(r)));
            let timed_out = self
                .unreachable_timeout
                .is_some_and(|t| since.elapsed() >= t);
            if none_left || timed_out || self.stopping() {
                return false;
            }
            std::thread::sleep(WAIT_STEP);
        }
    }

    /// One pass of [`RemoteStore::read_blocks`]: for each block not done (`next`),
    /// reads the copies in reach in turn until one passes its checksum.
    fn read_reachable_copies(
        &self,
        reads: &mut [BlockRead<'_>],
        held: &[usize],
        next: &mut [Option<usize>],
        results: &mut [Result<(), RemoteError>],
        bad: &mut [Vec<Replica>],
    ) {
        loop {
            let mut chosen: Vec<Option<Replica>> = vec![None; reads.len()];
            for (i, (loc, _, _, _)) in reads.iter().enumerate() {
                let Some(from) = next[i] else { continue };
                let pick = loc.replicas()[from.min(loc.len())..]
                    .iter()
                    .position(|r| self.holds(r));
                match pick {
                    Some(p) => {
                        chosen[i] = Some(loc.replicas()[from + p]);
                        next[i] = Some(from + p + 1);
                    }
                    None => next[i] = None,
                }
            }
            let mut which = Vec::new();
            let mut ops = Vec::new();
            for (i, (_, offset, buf, _)) in reads.iter_mut().enumerate() {
                if let Some(replica) = chosen[i] {
                    which.push(i);
                    ops.push(CopyOp {
                        replica,
                        op: RdmaOp::Read {
                            local: &mut buf[..held[i]],
                            remote: replica.remote.offset(*offset),
                        },
                    });
                }
            }
            if ops.is_empty() {
                break;
            }
            for (i, r) in which.into_iter().zip(self.post(ops, Patience::FailFast)) {
                let (_, offset, buf, expected) = &reads[i];
                let replica = chosen[i].expect("a read was posted for it");
                results[i] =
                    r.and_then(|()| self.check_sums(replica, *offset, &buf[..held[i]], expected));
                match &results[i] {
                    Ok(()) => next[i] = None,
                    Err(RemoteError::Corrupt { .. }) => bad[i].push(replica),
                    Err(_) => {}
                }
            }
        }
    }

    /// Checks `data`, just read from `replica` at `offset`, against `expected`.
    fn check_sums(
        &self,
        replica: Replica,
        offset: usize,
        data: &[u8],
        expected: &[Option<u32>],
    ) -> Result<(), RemoteError> {
        let Some(page) = sums::first_mismatch(offset, data, expected) else {
            return Ok(());
        };
        // What was found, for whoever reads the log: the sums and whether the page
        // held nothing at all (memory that was never written, or was given back).
        let at = page - offset;
        let bytes = &data[at..at + PAGE as usize];
        let want = expected[(page - offset.next_multiple_of(PAGE as usize)) / PAGE as usize];
        log::error!(
            "page {} of a block copy: sum {:#010x} expected {:#010x}{}",
            page / PAGE as usize,
            sums::page_sum(bytes),
            want.unwrap_or(0),
            if bytes.iter().all(|&b| b == 0) {
                " (all zeros)"
            } else {
                ""
            }
        );
        let (node, addr) = self.note_checksum_failure(replica, page);
        Err(RemoteError::Corrupt { node, addr })
    }

    /// Counts and logs that the copy `replica` failed its checksum in the page at
    /// byte `page` of its block; its memnode and address.
    pub fn note_checksum_failure(&self, replica: Replica, page: usize) -> (String, u64) {
        self.counters
            .checksum_failures
            .fetch_add(1, Ordering::Relaxed);
        let node = self.node_name(replica.node as usize).to_string();
        let addr = replica.remote.offset(page).addr;
        log::error!(
            "checksum mismatch: the copy on memnode {node} has bad bytes in the page at {addr:#x}"
        );
        (node, addr)
    }

    /// Reads bytes `offset..offset + buf.len()` of one copy, unchecked and uncounted
    /// in the traffic counters (the scrubber checks and counts them itself).
    pub fn read_copy(
        &self,
        replica: Replica,
        offset: usize,
        buf: &mut [u8],
    ) -> Result<(), RemoteError> {
        let op = CopyOp {
            replica,
            op: RdmaOp::Read {
                local: buf,
                remote: replica.remote.offset(offset),
            },
        };
        self.post_counted(vec![op], Patience::FailFast, false)
            .remove(0)
    }

    /// Rewrites `data` at `offset` of the copies in `bad`, whose bytes there failed
    /// their checksum while another copy's passed (read repair, and the scrubber's).
    pub fn rewrite_copies(&self, bad: &[Replica], offset: usize, data: &[u8]) {
        let ops = bad
            .iter()
            .map(|replica| CopyOp {
                replica: *replica,
                op: RdmaOp::Write {
                    local: data,
                    remote: replica.remote.offset(offset),
                },
            })
            .collect();
        for (replica, r) in bad.iter().zip(self.post(ops, Patience::FailFast)) {
            let node = self.node_name(replica.node as usize);
            match r {
                Ok(()) => {
                    let pages = data.len().div_ceil(PAGE as usize) as u64;
                    self.counters
                        .pages_repaired
                        .fetch_add(pages, Ordering::Relaxed);
                    log::warn!(
                        "repaired {pages} page(s) of the copy on memnode {node} at {:#x} \
                         from a good copy",
                        replica.remote.offset(offset).addr
                    );
                }
                Err(e) => log::error!("repairing the copy on memnode {node}: {e}"),
            }
        }
    }

    /// Writes each buffer to bytes `offset..offset + buffer length` of every copy of
    /// its block. Returns, per block, one result per copy (in the order of
    /// `loc.replicas()`). Bytes past the block's allocation are not written; they
    /// must be zeros (what reading them gives), else the block's write fails.
    pub fn write_copies(
        &self,
        writes: &[(&BlockLoc, usize, &[u8])],
    ) -> Vec<Vec<Result<(), RemoteError>>> {
        // (block, copy, bytes, where): each write of a copy, to post and maybe post again.
        let mut ops: Vec<(usize, Replica, &[u8], RemoteAddr)> = Vec::new();
        let mut refused = Vec::with_capacity(writes.len());
        for (b, (loc, offset, buf)) in writes.iter().enumerate() {
            let n = held_part(loc, *offset, buf.len());
            let fits = buf[n..].iter().all(|&b| b == 0);
            refused.push(!fits);
            if !fits {
                log::error!(
                    "a write of {} bytes at {offset} reaches past its block's {} allocated bytes",
                    buf.len(),
                    loc.bytes()
                );
                continue;
            }
            for r in loc.replicas() {
                if n == 0 {
                    continue;
                }
                ops.push((b, *r, &buf[..n], r.remote.offset(*offset)));
            }
        }
        let mut outcomes = self.post_writes(&ops).into_iter();
        writes
            .iter()
            .zip(refused)
            .map(|((loc, offset, buf), refused)| {
                if refused {
                    let e = RemoteError::PastAllocation { bytes: loc.bytes() };
                    vec![Err(e); loc.len()]
                } else if held_part(loc, *offset, buf.len()) == 0 {
                    vec![Ok(()); loc.len()]
                } else {
                    outcomes.by_ref().take(loc.len()).collect()
                }
            })
            .collect()
    }

    /// Posts the writes `ops` (block, copy, bytes, where) at once to every copy. A
    /// block none of whose copies took its write, for want of a memnode in reach, is
    /// written again to those copies once one is back (waiting as
    /// [`Patience::Wait`] does): a block with a copy written needs no other, as the
    /// copies that missed it are dropped by the caller.
    fn post_writes(
        &self,
        ops: &[(usize, Replica, &[u8], RemoteAddr)],
    ) -> Vec<Result<(), RemoteError>> {
        let as_ops = |which: &[usize]| -> Vec<CopyOp<'_>> {
            which
                .iter()
                .map(|&k| {
                    let (_, replica, local, remote) = ops[k];
                    CopyOp {
                        replica,
                        op: RdmaOp::Write { local, remote },
                    }
                })
                .collect()
        };
        let all: Vec<usize> = (0..ops.len()).collect();
        let mut results = self.post(as_ops(&all), Patience::FailFast);
        let written: std::collections::HashSet<usize> = ops
            .iter()
            .zip(&results)
            .filter(|(_, r)| r.is_ok())
            .map(|(op, _)| op.0)
            .collect();
        let again: Vec<usize> = (0..ops.len())
            .filter(|&k| {
                !written.contains(&ops[k].0)
                    && results[k].as_ref().is_err_and(is_unreachable)
                    && self.has_copy(&ops[k].1)
            })
            .collect();
        if !again.is_empty() {
            for (k, r) in again.iter().zip(self.post(as_ops(&again), Patience::Wait)) {
                results[*k] = r;
            }
        }
        results
    }
}
