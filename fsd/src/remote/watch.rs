//! Failure detection and recovery: a thread per memnode that sends it a heartbeat
//! (a Stat call) while it is up, so a memnode that dies or stops answering is marked
//! down even when no file I/O touches it, and that tries to reconnect while it is
//! down, so a memnode that comes back (empty) is used again.

use super::node::{LinkConfig, Node};
use super::Connector;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Starts the watch thread of `node`, checking it every `every`. It ends when the
/// node is stopped or dropped.
pub(super) fn start(
    node: &Arc<Node>,
    cfg: Arc<LinkConfig>,
    connector: Arc<Connector>,
    every: Duration,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let weak: Weak<Node> = Arc::downgrade(node);
    let step = Duration::from_millis(50);
    std::thread::Builder::new()
        .name(format!("watch {}", node.name))
        .spawn(move || loop {
            let mut slept = Duration::ZERO;
            while slept < every {
                std::thread::sleep(step);
                slept += step;
                match weak.upgrade() {
                    Some(n) if !n.refill.stop.load(Ordering::SeqCst) => {}
                    _ => return,
                }
            }
            let Some(node) = weak.upgrade() else { return };
            if node.is_up() {
                // A failure is logged (once) where it puts the node down.
                let _ = node.heartbeat();
            } else if let Err(e) = node.reconnect(&cfg, connector.as_ref()) {
                log::debug!("memnode {} is still down: {e}", node.name);
            }
        })
}
