//! Allocation ahead: a thread per memnode that asks it for the next chunk while the
//! current one still has blocks left, so writes find blocks in the local pool and the
//! write path makes no control round trip in the steady state.
//!
//! The write path signals [`Refill::want`](super::node::Refill::want) when a take
//! leaves the node's pool below its low-water mark; the thread then allocates one
//! chunk of the preferred size. A refusal for lack of space is left to the write
//! path, which retries with smaller chunks and marks the node full. The signal is
//! part of the node (`node.rs`): this thread depends on the node, not the other way.

use super::counters::RemoteCounters;
use super::error::RemoteError;
use super::lock;
use super::node::Node;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Starts the refill thread of `node`. It holds the node only while working, and ends
/// when the node is stopped or dropped.
pub(super) fn start(
    node: &Arc<Node>,
    chunk_size: u64,
    low_water: u64,
    counters: Arc<RemoteCounters>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let weak: Weak<Node> = Arc::downgrade(node);
    std::thread::Builder::new()
        .name(format!("refill {}", node.name))
        .spawn(move || loop {
            let Some(node) = weak.upgrade() else { return };
            if node.refill.stop.load(Ordering::SeqCst) {
                return;
            }
            if !node.refill.take_request(Duration::from_millis(500)) {
                continue;
            }
            let Ok(link) = node.link() else { continue };
            if node.refill.stop.load(Ordering::SeqCst)
                || node.full.load(Ordering::Relaxed)
                || lock(&node.pool).blocks.free_bytes() >= low_water
            {
                continue;
            }
            match node.alloc(&link, chunk_size) {
                Ok(a) => {
                    counters.chunk_allocs.fetch_add(1, Ordering::Relaxed);
                    log::debug!("memnode {}: chunk {:#x} allocated ahead", node.name, a.addr);
                    let mut pool = lock(&node.pool);
                    // A chunk of an epoch that ended meanwhile went with it.
                    if pool.epoch == link.epoch {
                        let added = node.pool_chunk(&mut pool.blocks, a);
                        drop(pool);
                        if let Err(e) = added {
                            log::warn!("allocating ahead: {}", node.failed(link.epoch, e));
                        }
                    }
                }
                Err(RemoteError::NoSpace) => {}
                Err(e) => log::warn!("allocating ahead: {}", node.failed(link.epoch, e)),
            }
        })
}
