//! One memnode as fsd sees it: its current connections (a [`Link`]), whether it is
//! up, and the pool of blocks fsd holds there.
//!
//! A memnode is either up, with a link of some epoch, or down. It goes down when an
//! operation on it fails for good (the connection broke) or times out, or when its
//! heartbeat gets no answer: that is logged once, the link is dropped (its
//! connections close once in-flight operations finish, and the memnode then gives
//! that client's memory back), and every operation on the node fails at once.
//! Reconnecting makes a new link of the next epoch under a new client id, with an
//! empty pool: what the node held before is gone.

use super::placement::Replica;
use super::pool::BlockPool;
use super::refill::Refill;
use super::{lock, Connector, RemoteError};
use crate::affinity;
use rmemfs_common::control::{self, ControlError, VolumeInfo};
use rmemfs_common::cpus::process_cpus;
use rmemfs_common::fabric::{Endpoint, FabricError};
use rmemfs_common::protocol::NodeStats;
use rmemfs_common::size::format_size;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// What opening a link needs.
pub(super) struct LinkConfig {
    pub connections: usize,
    /// The client id of epoch 0; epoch `e` uses `client_id + e`, so a memnode never
    /// mistakes a new link for the old one whose memory it is reclaiming.
    pub client_id: u64,
    pub token: Vec<u8>,
    /// The durable volume every link opens (`None`: scratch memory).
    pub volume: Option<VolumeSpec>,
}

/// Which volume to open on each memnode, and how.
#[derive(Debug, Clone)]
pub struct VolumeSpec {
    pub name: String,
    /// Create it where it does not exist.
    pub create: bool,
    /// Take it over from a holder still alive (first link only).
    pub takeover: bool,
}

/// The connections of one epoch to a memnode.
pub(super) struct Link {
    pub epoch: u32,
    endpoints: Vec<Box<dyn Endpoint>>,
    next: AtomicUsize,
    /// The memnode's id (a memnode restarted empty has a new one).
    pub node_id: u64,
    /// The volume opened on this link, with its root chunk.
    pub volume: Option<VolumeInfo>,
    /// What the memnode serves beyond the first messages (`protocol::FEATURE_*`).
    pub features: u32,
}

impl Link {
    /// Connects `connections` times and says hello on each; returns the link and the
    /// capacity the memnode announced.
    fn open(
        name: &str,
        epoch: u32,
        cfg: &LinkConfig,
        connector: &Connector,
    ) -> Result<(Link, u64), RemoteError> {
        let client_id = cfg.client_id.wrapping_add(epoch as u64);
        let mut endpoints = Vec::new();
        let mut capacity = 0;
        let mut node_id = 0;
        let mut features = 0;
        for _ in 0..cfg.connections.max(1) {
            let ep = connector(name, client_id).map_err(|error| RemoteError::Fabric {
                node: name.to_string(),
                error,
            })?;
            let welcome = control::hello(ep.as_ref(), client_id, &cfg.token).map_err(|error| {
                RemoteError::Control {
                    node: name.to_string(),
                    error,
                }
            })?;
            capacity = welcome.capacity;
            node_id = welcome.node_id;
            features = welcome.features;
            endpoints.push(ep);
        }
        let volume = match &cfg.volume {
            None => None,
            Some(v) => {
                let takeover = v.takeover && epoch == 0;
                let control = endpoints[endpoints.len() - 1].as_ref();
                let info = control::volume_open(control, &v.name, v.create, takeover).map_err(
                    |error| RemoteError::Control {
                        node: name.to_string(),
                        error,
                    },
                )?;
                Some(info)
            }
        };
        let link = Link {
            epoch,
            endpoints,
            next: AtomicUsize::new(0),
            node_id,
            volume,
            features,
        };
        Ok((link, capacity))
    }

    /// A data connection: an idle one of the caller's CPU when it is pinned to one,
    /// else the lowest-numbered idle one (see [`choose`]).
    pub fn endpoint(&self) -> &dyn Endpoint {
        let k = choose(
            self.endpoints.len(),
            affinity::pinned_cpu().map(|cpu| (cpu, process_cpus())),
            || self.next.fetch_add(1, Ordering::Relaxed),
            |k| self.endpoints[k].is_busy(),
        );
        self.endpoints[k].as_ref()
    }

    /// The connection that carries control calls: the last, which data operations
    /// take only when all the others are busy.
    pub fn control(&self) -> &dyn Endpoint {
        self.endpoints[self.endpoints.len() - 1].as_ref()
    }
}

/// Which of `n` connections a data operation takes. A caller pinned to a CPU
/// (`pinned`: its CPU and how many the process has; the FUSE ring's serving threads)
/// first tries the connections of its CPU: the `k` with `k % s == cpu % s`, `s` the
/// lesser of `n` and the CPUs. Then every caller takes the lowest-numbered one that is
/// not `busy`, or, when all are, the next of a round-robin (`next`), so that waiters
/// spread out.
///
/// Why the lowest idle one rather than round-robin: over tcp, the memnode thread
/// that just served a connection polls that connection for its next request (as fsd's
/// caller polls for its completion), and only one or two of them poll at a time on a
/// small host. Round-robin sent a lone reader's next request to another connection,
/// whose thread was asleep: a wakeup per request (about 35 µs on the 2-core VMs
/// measured), while the polling thread spent a CPU on a connection that stayed
/// silent. With the lowest idle one, a lone stream stays on connection 0 and k
/// concurrent callers on the first k, whose threads are awake. One-job O_DIRECT 4 KiB
/// random reads went from 13-19k to 23-29k IOPS in 4 interleaved pairs (buffered:
/// 14-56k to 63-132k in 3); sequential jobs and random writes were within noise.
///
/// Why a CPU's own connections for pinned callers: the memnode thread of such a
/// connection is then woken from one CPU only, and the scheduler keeps it there,
/// taking turns with the caller without a wakeup across CPUs (a costly interrupt
/// in a VM). Shared by both CPUs' ring threads, connection 0's thread was woken
/// from either. 4 fio jobs of 4 KiB random reads over the ring (2 cores, 4
/// connections, 15 interleaved runs each): median 42.2k IOPS with the lowest idle
/// one, 46.2k with the CPU's own (runs reached 61k against 48k); one job stayed at
/// 33-38k. Giving each ring thread a connection of its own, whatever its CPU, gave
/// no gain (46.0k against 45.6k in 6).
/// The /dev/fuse loop's threads are not pinned, and a lone reader's requests come to
/// them in turn: they keep the lowest idle one (a connection per thread there took a
/// lone reader from 26-29k to 18k).
/// Verbs has no server threads; there the choice changes nothing.
fn choose(
    n: usize,
    pinned: Option<(usize, usize)>,
    next: impl FnOnce() -> usize,
    busy: impl Fn(usize) -> bool,
) -> usize {
    let own = pinned.and_then(|(cpu, cpus)| {
        let stride = n.min(cpus).max(1);
        (cpu % stride..n).step_by(stride).find(|&k| !busy(k))
    });
    own.or_else(|| (0..n).find(|&k| !busy(k)))
        .unwrap_or_else(|| next() % n)
}

struct State {
    /// `None` while down.
    link: Option<Arc<Link>>,
    /// The epoch of the current (or last) link.
    epoch: u32,
    /// Why the node is down, while it is.
    down: Option<String>,
}

/// The blocks fsd holds on a node, and the epoch they belong to.
pub(super) struct NodePool {
    pub epoch: u32,
    pub blocks: BlockPool,
}

/// [`Node::up_epoch`]'s bit for "up" (the epoch is the low 32 bits).
const UP: u64 = 1 << 32;

pub(super) struct Node {
    pub name: String,
    /// Written only by going down and by reconnecting; every operation reads it
    /// (its link), so readers do not exclude one another.
    state: RwLock<State>,
    /// The state's epoch, with [`UP`] while up: what [`Node::holds`] asks for each
    /// copy of each block read or written, without taking the state's lock. Changed
    /// with the state, under its write lock.
    up_epoch: AtomicU64,
    pub pool: Mutex<NodePool>,
    /// Set when the node refused an allocation for lack of space; cleared on a free.
    pub full: AtomicBool,
    pub refill: Refill,
    /// The memnode's memory as its last heartbeat answered (for status and metrics:
    /// the heartbeat's Stat costs no extra round trip).
    pub usage: Mutex<Option<NodeStats>>,
}

impl Node {
    /// Connects to `name` (epoch 0).
    pub fn connect(
        name: &str,
        cfg: &LinkConfig,
        connector: &Connector,
    ) -> Result<Node, RemoteError> {
        let (link, capacity) = Link::open(name, 0, cfg, connector)?;
        log::info!(
            "connected to memnode {name} ({} capacity, {} connections)",
            format_size(capacity),
            cfg.connections
        );
        Ok(Node {
            name: name.to_string(),
            state: RwLock::new(State {
                link: Some(Arc::new(link)),
                epoch: 0,
                down: None,
            }),
            up_epoch: AtomicU64::new(UP),
            pool: Mutex::new(NodePool {
                epoch: 0,
                blocks: BlockPool::new(),
            }),
            full: AtomicBool::new(false),
            refill: Refill::default(),
            usage: Mutex::new(None),
        })
    }

    /// A node that could not be reached: down from the start, reconnected by its
    /// watch thread when it answers (epoch 1 on).
    pub fn unreachable(name: &str, reason: String) -> Node {
        log::error!("memnode {name} is down: {reason}; its copies count as lost");
        Node {
            name: name.to_string(),
            state: RwLock::new(State {
                link: None,
                epoch: 0,
                down: Some(reason),
            }),
            up_epoch: AtomicU64::new(0),
            pool: Mutex::new(NodePool {
                epoch: 0,
                blocks: BlockPool::new(),
            }),
            full: AtomicBool::new(false),
            refill: Refill::default(),
            usage: Mutex::new(None),
        }
    }

    /// The link's epoch and memnode id while up.
    pub fn identity(&self) -> Option<(u32, u64)> {
        let s = self.read_state();
        match (&s.link, &s.down) {
            (Some(l), None) => Some((l.epoch, l.node_id)),
            _ => None,
        }
    }

    /// The current link, or why there is none.
    pub fn link(&self) -> Result<Arc<Link>, RemoteError> {
        let s = self.read_state();
        match (&s.link, &s.down) {
            (Some(l), None) => Ok(l.clone()),
            (_, reason) => Err(RemoteError::NodeDown {
                node: self.name.clone(),
                reason: reason.clone().unwrap_or_else(|| "not connected".into()),
            }),
        }
    }

    pub fn is_up(&self) -> bool {
        self.up_epoch.load(Ordering::Acquire) & UP != 0
    }

    /// True when `r` (a copy on this node) still exists: the node is up and `r` was
    /// allocated in its current epoch.
    pub fn holds(&self, r: &Replica) -> bool {
        self.up_epoch.load(Ordering::Acquire) == UP | r.epoch as u64
    }

    fn read_state(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_state(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a failure of an operation made on the link of `epoch`. A broken
    /// connection or an operation that got no answer in time puts the node down
    /// (logged once); other errors (a refused access) leave it up.
    pub fn note_failure(&self, epoch: u32, e: &FabricError) {
        if !(e.is_fatal() || matches!(e, FabricError::Timeout { .. })) {
            return;
        }
        let mut s = self.write_state();
        if s.epoch == epoch && s.down.is_none() {
            log::error!(
                "memnode {} is down: {e}; its copies are lost, reconnecting in the background",
                self.name
            );
            s.down = Some(e.to_string());
            s.link = None;
            self.up_epoch.store(epoch as u64, Ordering::Release);
        }
    }

    pub fn fabric_error(&self, epoch: u32, error: FabricError) -> RemoteError {
        self.note_failure(epoch, &error);
        RemoteError::Fabric {
            node: self.name.clone(),
            error,
        }
    }

    pub fn control_error(&self, epoch: u32, error: ControlError) -> RemoteError {
        if let ControlError::Fabric(f) = &error {
            self.note_failure(epoch, f);
        }
        RemoteError::Control {
            node: self.name.clone(),
            error,
        }
    }

    /// Connects again after the node went down. The new link has the next epoch and
    /// an empty pool: the memnode gave the old epoch's memory back (or is a new
    /// process that never had it).
    pub fn reconnect(&self, cfg: &LinkConfig, connector: &Connector) -> Result<(), RemoteError> {
        let epoch = self.read_state().epoch.wrapping_add(1);
        let (link, capacity) = Link::open(&self.name, epoch, cfg, connector)?;
        {
            let mut pool = lock(&self.pool);
            // Not freed: those chunks belonged to the old client id and are gone.
            pool.blocks.drain();
            pool.epoch = epoch;
        }
        self.full.store(false, Ordering::Relaxed);
        // The old usage was another process's or another epoch's.
        *lock(&self.usage) = None;
        let mut s = self.write_state();
        s.link = Some(Arc::new(link));
        s.epoch = epoch;
        s.down = None;
        self.up_epoch.store(UP | epoch as u64, Ordering::Release);
        log::warn!(
            "memnode {} is back ({} capacity, epoch {epoch}); it is used for new copies",
            self.name,
            format_size(capacity)
        );
        Ok(())
    }

    /// Asks the node for its statistics (kept in `usage`); a failure to answer puts
    /// it down.
    pub fn heartbeat(&self) -> Result<(), RemoteError> {
        let link = self.link()?;
        let stats = control::stat(link.control()).map_err(|e| self.control_error(link.epoch, e))?;
        *lock(&self.usage) = Some(stats);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::choose;
    use std::cell::Cell;

    #[test]
    fn data_operations_take_the_lowest_idle_connection_and_rotate_when_all_are_busy() {
        let no_rotation = || panic!("rotated while a connection was idle");
        assert_eq!(
            choose(4, None, no_rotation, |_| false),
            0,
            "a lone caller stays on 0"
        );
        assert_eq!(choose(4, None, no_rotation, |k| k < 2), 2);
        assert_eq!(choose(4, None, no_rotation, |k| k != 3), 3);
        let next = Cell::new(0);
        let rotate = || {
            next.set(next.get() + 1);
            next.get() - 1
        };
        let all_busy: Vec<usize> = (0..5).map(|_| choose(4, None, rotate, |_| true)).collect();
        assert_eq!(all_busy, vec![0, 1, 2, 3, 0], "waiters spread over all");
        assert_eq!(choose(1, None, no_rotation, |_| false), 0);
    }

    #[test]
    fn a_caller_pinned_to_a_cpu_takes_that_cpus_connections_first() {
        let no_rotation = || panic!("rotated while a connection was idle");
        // 2 CPUs, 4 connections: CPU 0 has 0 and 2, CPU 1 has 1 and 3.
        assert_eq!(choose(4, Some((1, 2)), no_rotation, |_| false), 1);
        assert_eq!(choose(4, Some((0, 2)), no_rotation, |k| k == 0), 2);
        assert_eq!(choose(4, Some((1, 2)), no_rotation, |k| k == 1), 3);
        // Its own all busy: the lowest idle one of any CPU.
        assert_eq!(choose(4, Some((1, 2)), no_rotation, |k| k % 2 == 1), 0);
        // More CPUs than connections: CPU c has connection c % n.
        assert_eq!(choose(2, Some((5, 8)), no_rotation, |_| false), 1);
        assert_eq!(choose(2, Some((5, 8)), no_rotation, |k| k == 1), 0);
        // CPU ids beyond the count (a process confined to CPUs 2 and 3).
        assert_eq!(choose(4, Some((3, 2)), no_rotation, |_| false), 1);
        let next = Cell::new(7);
        assert_eq!(choose(4, Some((0, 2)), || next.get(), |_| true), 3);
    }
}
