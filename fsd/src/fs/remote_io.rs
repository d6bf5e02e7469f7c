//! Remote I/O: where the page cache's loads and write-backs ([`crate::cache::RemoteIo`],
//! which `RmemFs` implements here) become reads of blocks from remote memory and writes
//! of them to every copy.
//!
//! Write-back is also where a block regains copies lost with a memnode: a block that
//! is short of copies is written back whole (the cache completes a partly valid page
//! from the block's current copies first), so before writing it fsd drops the copies
//! that no longer exist and allocates new ones up to `--replicas` on other memnodes
//! (as many as are up and have room). A block with all its copies, whose content is in
//! remote memory, may be written back in part (the page's dirty sectors), to the
//! copies it has. A copy whose write fails is dropped and the write-back tries again
//! (with a replacement, for a whole block), so a write-back only counts as done once
//! every copy the block has was written.
//!
//! A copy on an unreachable memnode is not a lost copy: a block with another copy in
//! reach drops it (it would miss this write) and writes the others; a block with none
//! in reach waits for its memnode, and a write cut off by a dropped connection is
//! sent again once the memnode is back (`remote/mod.rs`).
//!
//! Every page written back gets its checksum recorded once all its copies took it,
//! and every page loaded is checked against it (`remote/sums.rs`). On a durable
//! volume whose log holds a file's sums, the log first learns that they may go
//! stale (`volume/mod.rs`, "Page sums in the log").

use super::RmemFs;
use crate::cache::{PageKey, RemoteIo, Store};
use crate::error::FsError;
use crate::inode::{Inode, Meta};
use crate::remote::sums;
use crate::remote::{BlockLoc, RemoteError};
use std::sync::atomic::Ordering;

/// The copies one write-back of a block writes.
#[derive(Clone)]
struct Target {
    loc: BlockLoc,
    /// Copies added to replace lost ones (the block had content in remote memory).
    restored: usize,
    /// The volume's log holds sums of this file that the write-back makes stale.
    stales_sums: bool,
}

impl RmemFs {
    /// The copies block `key` is to be written to: those that still exist, plus, for
    /// a `whole` block, new ones up to the copies the cluster can hold now. `None`: the
    /// block no longer exists (truncated or deleted since the page was dirtied).
    /// A target returned counts as a write-back under way (`Meta::writebacks`) until
    /// [`RmemFs::writeback_done`] or [`RmemFs::writeback_dropped`].
    fn writeback_target(&self, key: PageKey, whole: bool) -> Option<Result<Target, FsError>> {
        let inode = self.ns.get(key.0).ok()?;
        // A block whose copies all sit on unreachable memnodes waits for one (outside
        // the meta lock) rather than losing them: unreachable is not lost.
        let copies = inode.meta().blocks.get(&key.1).map(|e| e.loc.clone());
        if let Some(loc) = copies {
            self.remote.await_reachable(&loc);
        }
        let mut m = inode.meta();
        let target = self.choose_copies(&inode, &mut m, key, whole)?;
        if let Ok(t) = &target {
            m.writebacks += 1;
            if self.volume.is_some() && m.sums_logged {
                m.sums_logged = false;
                return Some(Ok(Target {
                    stales_sums: true,
                    ..t.clone()
                }));
            }
        }
        Some(target)
    }

    /// The copies of [`RmemFs::writeback_target`] (`m` is `inode`'s locked meta).
    fn choose_copies(
        &self,
        inode: &Inode,
        m: &mut Meta,
        key: PageKey,
        whole: bool,
    ) -> Option<Result<Target, FsError>> {
        let entry = m.blocks.get_mut(&key.1)?;
        if !whole {
            // Part of a block goes to the copies it has: a new copy would need the rest.
            // Copies out of reach are dropped when others can take the write, and
            // waited for when none can (`write_copies`).
            self.remote.prune_for_write(&mut entry.loc);
            if !entry.written || entry.loc.is_empty() {
                // (The cache asks for parts only of written blocks: see stores_in_part.)
                return Some(Err(FsError::from(RemoteError::Lost)));
            }
            return Some(Ok(Target {
                loc: entry.loc.clone(),
                restored: 0,
                stales_sums: false,
            }));
        }
        let live = self.remote.live_copies(&entry.loc);
        let want = self.remote.copies_possible();
        let mut restored = 0;
        let mut changed = false;
        if live < want || live < entry.loc.len() {
            let added = self
                .remote
                .add_copies(&mut entry.loc, want.saturating_sub(live));
            if entry.written {
                restored = added;
            }
            changed = true;
        }
        if changed {
            m.block_changed(key.1);
            self.changed(inode);
        }
        let entry = m.blocks.get_mut(&key.1)?;
        if entry.loc.is_empty() {
            return Some(Err(FsError::from(if self.remote.nodes_up() == 0 {
                RemoteError::Lost
            } else {
                RemoteError::NoSpace
            })));
        }
        Some(Ok(Target {
            loc: entry.loc.clone(),
            restored,
            stales_sums: false,
        }))
    }

    /// A write-back whose target was chosen did not happen: no longer under way, and
    /// if it was to log that the file's sums go stale, the next one must.
    fn writeback_dropped(&self, key: PageKey, target: &Target) {
        if let Ok(inode) = self.ns.get(key.0) {
            let mut m = inode.meta();
            m.writebacks = m.writebacks.saturating_sub(1);
            m.sums_logged |= target.stales_sums;
        }
    }

    /// After a write-back to `loc` that left the page sums `written`: drops the copies whose write failed from block `key` (if it still
    /// has exactly those copies), or, if none failed, records that remote memory
    /// holds the block's content and the pages' sums. Returns true when done.
    fn writeback_done(
        &self,
        key: PageKey,
        loc: &BlockLoc,
        written: &sums::Written,
        outcome: &[Result<(), RemoteError>],
    ) -> bool {
        let Ok(inode) = self.ns.get(key.0) else {
            return true;
        };
        let mut m = inode.meta();
        m.writebacks = m.writebacks.saturating_sub(1);
        let Some(entry) = m.blocks.get_mut(&key.1) else {
            return true;
        };
        // The block's copies now are those this write-back went to, less any that
        // failed: a page written back in part sends one write per dirty run, all to
        // the same copies, and the first of them to finish here drops a copy that
        // failed for all (the others must still record their sums, or the copies left
        // hold their bytes under older sums and fail their checksum). A copy this
        // write-back did not go to, or copies of another size, mean a truncate,
        // punch or delete replaced the block meanwhile: nothing more to do.
        let same_block = entry.loc.bytes() == loc.bytes()
            && entry
                .loc
                .replicas()
                .iter()
                .all(|r| loc.replicas().contains(r));
        if !same_block {
            return true;
        }
        let failed: Vec<_> = loc
            .replicas()
            .iter()
            .zip(outcome)
            .filter(|(_, r)| r.is_err())
            .map(|(rep, _)| *rep)
            .collect();
        // A failed copy holds unknown bytes: it is no copy. Its block is not freed (a
        // late write could still land in it); it goes with its memnode's epoch.
        entry.loc.retain(|r| !failed.contains(r));
        // The copies left hold these bytes now, whether or not the write-back must go
        // round again for the others: their sums follow, or a later read of a page
        // they hold would find it "bad" (a write-back that never completes, say on
        // eviction, keeps what reached them).
        if !entry.loc.is_empty() {
            entry.written = true;
            entry.sums.record(written);
            // A whole block's write carries zeros past its copies: not remote pages.
            entry.sums.truncate(entry.loc.bytes());
        }
        // The log learns of every write-back (its sums) and of lost copies.
        m.block_changed(key.1);
        self.changed(&inode);
        failed.is_empty()
    }
}

impl RmemFs {
    /// Logs that the files whose sums these write-backs make stale have stale sums
    /// (durable before their bytes move).
    fn log_sums_stale(
        &self,
        writes: &[Store<'_>],
        targets: &[(usize, Target)],
    ) -> Result<(), FsError> {
        let Some(volume) = &self.volume else {
            return Ok(());
        };
        let mut inos: Vec<u64> = targets
            .iter()
            .filter(|(_, t)| t.stales_sums)
            .map(|(n, _)| writes[*n].key.0)
            .collect();
        if inos.is_empty() {
            return Ok(());
        }
        inos.sort_unstable();
        inos.dedup();
        volume.sums_stale(&self.ns, &inos).map_err(|e| {
            log::error!("write-back held back: {e}");
            FsError::Io(e.to_string())
        })
    }
}

impl RemoteIo for RmemFs {
    fn load(&self, reads: &mut [(PageKey, usize, &mut [u8])]) -> Vec<Result<(), FsError>> {
        // Holes, and blocks whose content never reached remote memory, read as zeros.
        let locs: Vec<Option<(BlockLoc, Vec<Option<u32>>)>> = reads
            .iter()
            .map(|((ino, idx), offset, buf)| {
                let inode = self.ns.get(*ino).ok()?;
                let m = inode.meta();
                let entry = m.blocks.get(idx).filter(|e| e.written)?;
                Some((entry.loc.clone(), entry.sums.expected(*offset, buf.len())))
            })
            .collect();
        let mut results: Vec<Result<(), FsError>> = reads.iter().map(|_| Ok(())).collect();
        let mut remote_reads = Vec::new();
        let mut which = Vec::new();
        for (n, ((_, offset, buf), loc)) in reads.iter_mut().zip(&locs).enumerate() {
            match loc {
                Some((l, expected)) => {
                    remote_reads.push((l, *offset, &mut buf[..], &expected[..]));
                    which.push(n);
                }
                None => buf.fill(0),
            }
        }
        for (n, r) in which
            .into_iter()
            .zip(self.remote.read_blocks(&mut remote_reads))
        {
            results[n] = r.map_err(FsError::from);
        }
        results
    }

    fn store(&self, writes: &[Store<'_>]) -> Vec<Result<(), FsError>> {
        let whole =
            |n: usize| writes[n].offset == 0 && writes[n].bytes.len() as u64 == self.block_size;
        let mut results: Vec<Result<(), FsError>> = writes.iter().map(|_| Ok(())).collect();
        let mut pending: Vec<usize> = (0..writes.len()).collect();
        // Each round that fails drops at least one copy; a failed copy's memnode is
        // then down or refused the access, so rounds are bounded by the copies the
        // cluster can give.
        let rounds = self.remote.node_count() + 2;
        // The sums of the pages each write carries (those past the block's copies are
        // of zeros, which are not written but read so: see `write_copies`); the cache
        // gives those it took when the bytes were written.
        let written: Vec<sums::Written> = writes
            .iter()
            .map(|w| sums::written_with(w.offset, w.bytes, w.sums))
            .collect();
        for _ in 0..rounds {
            let mut targets = Vec::new();
            for &n in &pending {
                match self.writeback_target(writes[n].key, whole(n)) {
                    None => {}
                    Some(Ok(t)) => targets.push((n, t)),
                    Some(Err(e)) => results[n] = Err(e),
                }
            }
            if let Err(e) = self.log_sums_stale(writes, &targets) {
                for (n, t) in &targets {
                    self.writeback_dropped(writes[*n].key, t);
                    results[*n] = Err(e.clone());
                }
                break;
            }
            let copies: Vec<(&BlockLoc, usize, &[u8])> = targets
                .iter()
                .map(|(n, t)| (&t.loc, writes[*n].offset, writes[*n].bytes))
                .collect();
            let outcomes = self.remote.write_copies(&copies);
            pending.clear();
            for ((n, target), outcome) in targets.iter().zip(outcomes) {
                let key = writes[*n].key;
                if self.writeback_done(key, &target.loc, &written[*n], &outcome) {
                    results[*n] = Ok(());
                    let restored = target.restored as u64;
                    self.remote
                        .counters
                        .copies_restored
                        .fetch_add(restored, Ordering::Relaxed);
                } else {
                    let e = outcome.into_iter().find_map(Result::err);
                    results[*n] = Err(FsError::from(e.unwrap_or(RemoteError::Lost)));
                    pending.push(*n);
                }
            }
            if pending.is_empty() {
                break;
            }
        }
        for (n, r) in results.iter().enumerate() {
            if let Err(e) = r {
                self.record_write_error(writes[n].key, e);
            }
        }
        results
    }

    fn stores_in_part(&self, key: PageKey) -> bool {
        let Ok(inode) = self.ns.get(key.0) else {
            return false;
        };
        let m = inode.meta();
        m.blocks.get(&key.1).is_some_and(|entry| {
            entry.written && self.remote.live_copies(&entry.loc) >= self.remote.copies_possible()
        })
    }

    fn record_write_error(&self, key: PageKey, e: &FsError) {
        if let Ok(inode) = self.ns.get(key.0) {
            let mut m = inode.meta();
            if m.write_error.is_none() {
                m.write_error = Some(e.clone());
            }
        }
    }
}
