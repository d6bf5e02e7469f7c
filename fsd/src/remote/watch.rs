//! Failure detection and recovery: a thread per memnode that sends it a heartbeat
//! (a Stat call) while it is up, so a memnode that dies or stops answering is found
//! unreachable even when no file I/O touches it, and that reconnects it while it is
//! unreachable: first at once, then with a doubling backoff up to the watch interval,
//! so a blip costs a fraction of a second and a long outage costs no busy loop. Past
//! the dead time an unreachable node is declared lost (`node.rs`).

use super::link::LinkConfig;
use super::node::Node;
use super::Connector;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// The first reconnect delay after a node becomes unreachable.
const FIRST_RETRY: Duration = Duration::from_millis(50);

/// Starts the watch thread of `node`, checking it every `every` while it is up. It
/// ends when the node is stopped or dropped.
pub(super) fn start(
    node: &Arc<Node>,
    cfg: Arc<LinkConfig>,
    connector: Arc<Connector>,
    every: Duration,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let weak: Weak<Node> = Arc::downgrade(node);
    let step = Duration::from_millis(10);
    std::thread::Builder::new()
        .name(format!("watch {}", node.name))
        .spawn(move || {
            let mut backoff = FIRST_RETRY;
            loop {
                let wait = match weak.upgrade() {
                    Some(n) if n.is_up() => {
                        backoff = FIRST_RETRY;
                        every
                    }
                    Some(_) => backoff,
                    None => return,
                };
                let mut slept = Duration::ZERO;
                while slept < wait {
                    std::thread::sleep(step);
                    slept += step;
                    match weak.upgrade() {
                        // A node that just became unreachable is retried at once.
                        Some(n) if !n.refill.stop.load(Ordering::SeqCst) => {
                            if wait == every && !n.is_up() {
                                break;
                            }
                        }
                        _ => return,
                    }
                }
                let Some(node) = weak.upgrade() else { return };
                if node.is_up() {
                    // A failure is logged (once) where it makes the node unreachable.
                    let _ = node.heartbeat();
                    continue;
                }
                node.check_dead_time(cfg.dead_time);
                match node.reconnect(&cfg, connector.as_ref()) {
                    Ok(()) => backoff = FIRST_RETRY,
                    Err(e) => {
                        log::debug!("memnode {} is still unreachable: {e}", node.name);
                        backoff = (backoff * 2).min(every.max(FIRST_RETRY));
                    }
                }
            }
        })
}
