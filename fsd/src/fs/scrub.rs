//! Scrubbing: every copy of every block read over time and checked against its page
//! sums (`remote/sums.rs`), so damage in a block nobody reads is found and repaired
//! while another copy is still good, not when the last one goes.
//!
//! The maintainer calls [`RmemFs::scrub`] once a second with a byte budget
//! (`--scrub-rate`); a cursor remembers where it stopped, and a pass ends when it has
//! walked every file's blocks. A first look at a copy reads it without locks: a
//! write-back racing that read can make good bytes look bad, so a mismatch is only
//! a reason to look again with the block's page locked (no write-back, load or move
//! of the block then), where every copy is read, and the bad ones are rewritten from
//! a good one. A block whose every copy is bad is logged; its next read fails (EIO).

use super::RmemFs;
use crate::cache::Fill;
use crate::inode::{FileKind, Ino, Inode};
use crate::remote::sums;
use crate::remote::{BlockLoc, Replica, PAGE};
use rmemfs_common::sync::lock;
use std::sync::atomic::{AtomicU64, Ordering};

/// Where the scrubber stands.
#[derive(Debug, Default)]
pub struct ScrubCursor {
    /// The next block to check: inode, then block index.
    next: (Ino, u64),
    /// Blocks checked in the pass under way.
    pass_blocks: u64,
}

/// The scrubber's progress, for statistics.
#[derive(Debug, Default)]
pub struct ScrubCounters {
    /// Passes over every block completed.
    pub passes: AtomicU64,
    /// Blocks checked in the pass under way.
    pub pass_blocks: AtomicU64,
    /// Bytes of copies read, in all.
    pub bytes: AtomicU64,
    /// Pages of copies found bad with the block locked.
    pub bad_pages: AtomicU64,
    /// Pages without a sum that got one (every copy held the same bytes).
    pub adopted_pages: AtomicU64,
    /// Pages without a sum whose copies differ: neither can be judged.
    pub unsettled_pages: AtomicU64,
}

/// A block to check: its copies and the sums of its pages, as of the look.
struct Look {
    loc: BlockLoc,
    expected: Vec<Option<u32>>,
}

impl Look {
    /// Whether a page of the copies has no sum yet.
    fn lacks_sums(&self) -> bool {
        self.expected.iter().any(Option::is_none)
    }
}

fn look(entry: &crate::inode::BlockEntry) -> Option<Look> {
    entry.written.then(|| Look {
        loc: entry.loc.clone(),
        expected: entry.sums.expected(0, entry.loc.bytes() as usize),
    })
}

impl RmemFs {
    /// Checks copies worth up to `budget` bytes, from where the last call stopped.
    /// Returns the bytes read.
    pub fn scrub(&self, budget: u64) -> u64 {
        let mut cursor = lock(&self.scrub_cursor);
        let mut inodes: Vec<_> = self
            .ns
            .all()
            .into_iter()
            .filter(|i| i.ino >= cursor.next.0)
            .collect();
        inodes.sort_by_key(|i| i.ino);
        let mut spent = 0;
        // One buffer for every block of this call: a block's copies are read whole
        // into it (a fresh zeroed one per block cost a 64 KiB memset each).
        let mut buf = Vec::new();
        for inode in inodes {
            if inode.meta().attr.kind != FileKind::File {
                continue;
            }
            let from = if inode.ino == cursor.next.0 {
                cursor.next.1
            } else {
                0
            };
            let mut idx = from;
            loop {
                let next = {
                    let m = inode.meta();
                    m.blocks.range(idx..).next().map(|(&i, e)| (i, look(e)))
                };
                let Some((i, look)) = next else { break };
                idx = i + 1;
                if let Some(look) = look {
                    spent += self.scrub_block(&inode, i, &look, &mut buf);
                    cursor.pass_blocks += 1;
                    self.scrub_counters
                        .pass_blocks
                        .store(cursor.pass_blocks, Ordering::Relaxed);
                }
                if spent >= budget {
                    cursor.next = (inode.ino, idx);
                    return spent;
                }
            }
        }
        let done = self.scrub_counters.passes.fetch_add(1, Ordering::Relaxed) + 1;
        log::debug!("scrub pass {done} done: {} blocks", cursor.pass_blocks);
        *cursor = ScrubCursor::default();
        self.scrub_counters.pass_blocks.store(0, Ordering::Relaxed);
        spent
    }

    /// Reads each copy of block `idx` of `inode` into `buf` and checks it; looks again
    /// with the block locked if one seems bad. Returns the bytes read.
    fn scrub_block(&self, inode: &Inode, idx: u64, look: &Look, buf: &mut Vec<u8>) -> u64 {
        let mut spent = 0;
        let mut suspect = false;
        buf.resize(look.loc.bytes() as usize, 0);
        for r in look.loc.replicas().iter().filter(|r| self.remote.holds(r)) {
            spent += buf.len() as u64;
            if self.remote.read_copy(*r, 0, buf).is_ok()
                && sums::first_mismatch(0, buf, &look.expected).is_some()
            {
                suspect = true;
                break;
            }
        }
        self.scrub_counters
            .bytes
            .fetch_add(spent, Ordering::Relaxed);
        if suspect || look.lacks_sums() {
            let locked = self.cache.access(
                self,
                inode.ino,
                idx..idx + 1,
                |_| Fill::Read { from: 0, to: 0 },
                |_, _, _| {
                    self.check_copies_locked(inode, idx);
                    Ok(())
                },
            );
            if let Err(e) = locked {
                log::warn!("scrub: cannot lock block {idx} of inode {}: {e}", inode.ino);
            }
        }
        spent
    }

    /// With block `idx`'s page locked: reads every copy, rewrites those whose pages
    /// fail their sums from one that passes, and gives pages without a sum the sum of
    /// the bytes every copy holds alike.
    fn check_copies_locked(&self, inode: &Inode, idx: u64) {
        let Some(look) = inode.meta().blocks.get(&idx).and_then(look) else {
            return;
        };
        let len = look.loc.bytes() as usize;
        let mut good: Option<Vec<u8>> = None;
        // Bad copies, with the offsets of their bad pages.
        let mut bad: Vec<(Replica, Vec<usize>)> = Vec::new();
        // Every copy read whole, for pages without a sum.
        let mut read: Vec<Vec<u8>> = Vec::new();
        for r in look.loc.replicas().iter().filter(|r| self.remote.holds(r)) {
            let mut buf = vec![0u8; len];
            if let Err(e) = self.remote.read_copy(*r, 0, &mut buf) {
                // A block freed meanwhile (its file deleted or cut) is no longer the
                // scrubber's business; a copy of one still in place that cannot be
                // read is worth a warning.
                let same = inode.meta().blocks.get(&idx).map(|e| e.loc.clone());
                if same.as_ref() == Some(&look.loc) {
                    log::warn!("scrub: reading block {idx} of inode {}: {e}", inode.ino);
                } else {
                    log::debug!(
                        "scrub: block {idx} of inode {} went while read: {e}",
                        inode.ino
                    );
                }
                return; // a copy unread: pages without a sum wait for a full look
            }
            let pages = sums::mismatches(0, &buf, &look.expected);
            match pages.first() {
                None => good = good.or(Some(buf.clone())),
                Some(&at) => {
                    self.remote.note_checksum_failure(*r, at);
                    self.scrub_counters
                        .bad_pages
                        .fetch_add(pages.len() as u64, Ordering::Relaxed);
                    bad.push((*r, pages));
                }
            }
            read.push(buf);
        }
        match (&good, bad.is_empty()) {
            (_, true) => {}
            (Some(data), false) => {
                for (r, pages) in &bad {
                    for &at in pages {
                        let page = &data[at..at + PAGE as usize];
                        self.remote.rewrite_copies(&[*r], at, page);
                    }
                }
            }
            (None, false) => log::error!(
                "scrub: every copy of block {idx} of inode {} fails its checksum: \
                 its reads fail with EIO",
                inode.ino
            ),
        }
        if bad.is_empty() && look.lacks_sums() {
            self.adopt_sums(inode, idx, &look, &read);
        }
    }

    /// Gives each page of block `idx` without a sum the sum of its bytes, where every
    /// copy in `read` (all of them, none bad) holds the same bytes.
    fn adopt_sums(&self, inode: &Inode, idx: u64, look: &Look, read: &[Vec<u8>]) {
        let Some(first) = read.first() else { return };
        let p = PAGE as usize;
        let mut adopted = Vec::new();
        let mut unsettled = 0;
        for (k, _) in look
            .expected
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_none())
        {
            let page = &first[k * p..(k + 1) * p];
            if read[1..].iter().all(|c| &c[k * p..(k + 1) * p] == page) {
                adopted.push((k * p, page));
            } else {
                unsettled += 1;
            }
        }
        if unsettled > 0 {
            log::warn!(
                "scrub: the copies of block {idx} of inode {} differ in {unsettled} page(s) \
                 that have no checksum: neither can be judged",
                inode.ino
            );
            self.scrub_counters
                .unsettled_pages
                .fetch_add(unsettled, Ordering::Relaxed);
        }
        if adopted.is_empty() {
            return;
        }
        let mut m = inode.meta();
        let Some(entry) = m.blocks.get_mut(&idx).filter(|e| e.loc == look.loc) else {
            return;
        };
        for (offset, page) in &adopted {
            entry.sums.record(&sums::written(*offset, page));
        }
        m.block_changed(idx);
        drop(m);
        self.changed(inode);
        self.scrub_counters
            .adopted_pages
            .fetch_add(adopted.len() as u64, Ordering::Relaxed);
    }
}
