//! Readahead in the background: a sequential reader's next blocks are loaded by
//! prefetch threads while the reader's request returns, so the next request finds
//! them in the cache (or waits only for what is still in flight: it blocks on the
//! pages the prefetch holds locked while loading them). Each queued job is one
//! request's worth of blocks; several threads take jobs in turn, so the loads of one
//! stream overlap instead of each waiting out the previous one's round trip.
//!
//! Without a prefetch thread (tests that drive the core directly), the read loads
//! its readahead in its own batch instead.

use super::RmemFs;
use crate::cache::Fill;
use crate::inode::Ino;
use rmemfs_common::sync::{lock, wait_timeout_while};
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Most jobs waiting: readahead is a hint, so a reader that outruns the thread
/// drops new jobs instead of queueing without bound.
const MAX_QUEUED: usize = 64;

#[derive(Default)]
pub(super) struct Prefetcher {
    /// Set once a thread runs [`RmemFs::prefetch_next`].
    running: AtomicBool,
    queue: Mutex<VecDeque<(Ino, Range<u64>)>>,
    queued: Condvar,
}

impl Prefetcher {
    pub fn is_running(&self) -> bool {
        self.running.load(Ordering::Relaxed)
    }

    /// Queues the loading of blocks `blocks` of `ino`.
    pub fn push(&self, ino: Ino, blocks: Range<u64>) {
        let mut q = lock(&self.queue);
        if q.len() < MAX_QUEUED {
            q.push_back((ino, blocks));
            self.queued.notify_one();
        }
    }

    fn pop(&self, wait: Duration) -> Option<(Ino, Range<u64>)> {
        let q = lock(&self.queue);
        let (mut q, _) = wait_timeout_while(&self.queued, q, wait, |q| q.is_empty());
        q.pop_front()
    }
}

impl RmemFs {
    /// Runs one queued prefetch, waiting up to `wait` for one. Called in a loop by
    /// the prefetch thread; the first call turns background readahead on.
    pub fn prefetch_next(&self, wait: Duration) {
        self.prefetch.running.store(true, Ordering::Relaxed);
        let Some((ino, blocks)) = self.prefetch.pop(wait) else {
            return;
        };
        // The file may be gone or cut short meanwhile: load what still exists. A
        // failure is the next read's to report.
        let Ok(inode) = self.file_inode(ino) else {
            return;
        };
        let _io = inode.io_shared();
        let size = inode.meta().attr.size;
        let end = blocks.end.min(size.div_ceil(self.block_size));
        if blocks.start >= end {
            return;
        }
        let r = self.cache.access(
            self,
            ino,
            blocks.start..end,
            |i| {
                if inode.meta().blocks.contains_key(&i) {
                    Fill::Load
                } else {
                    Fill::Zero
                }
            },
            |_, _, _| Ok(()),
        );
        if let Err(e) = r {
            log::debug!("readahead of inode {ino} blocks {blocks:?}: {e}");
        }
    }
}
