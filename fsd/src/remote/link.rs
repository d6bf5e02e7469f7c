//! The connections of one epoch to a memnode (a [`Link`]): opening them as a session
//! (Hello on each, then the volume), choosing one for each data operation, and the
//! rkey to send an operation under. Apart from `node.rs`, which decides when a link
//! is opened and dropped (the node's states); a link itself knows nothing of them.

use super::error::RemoteError;
use super::remap::RkeyRemap;
use super::Connector;
use rmemfs_common::control::{self, VolumeInfo};
use rmemfs_common::cpus::{pinned_cpu, process_cpus};
use rmemfs_common::fabric::Endpoint;
use rmemfs_common::protocol::SessionSecret;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What opening a link needs.
pub(super) struct LinkConfig {
    pub connections: usize,
    /// The client id of epoch 0; epoch `e` uses `client_id + e`, so a memnode never
    /// mistakes a new link for the old one whose memory it is reclaiming.
    pub client_id: u64,
    pub token: Vec<u8>,
    /// The durable volume every link opens (`None`: scratch memory).
    pub volume: Option<VolumeSpec>,
    /// How long a node may stay unreachable before its copies count as lost.
    pub dead_time: Duration,
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
    /// The memnode's restarts on its memory file, as its Welcome said.
    pub boot: u64,
    /// Bytes the memnode lends, as its Welcome said: no chunk it names is larger.
    pub capacity: u64,
    /// The rkeys of the chunks fsd held before the memnode restarted on its memory
    /// file (`None`: it never did while fsd held them).
    pub remap: Option<Arc<RkeyRemap>>,
}

/// Who a link says it is: the client id and its session on the memnode.
#[derive(Clone, Copy)]
pub(super) struct Session {
    pub client: u64,
    pub secret: SessionSecret,
}

/// What the memnode said when a link opened.
pub(super) struct Opened {
    pub link: Link,
    pub capacity: u64,
    /// The session's secret (the memnode's, from the first Hello).
    pub secret: SessionSecret,
    /// The session existed before: the memnode kept its memory.
    pub resumed: bool,
}

impl Link {
    /// Connects `connections` times as `session` and says hello on each (the first
    /// Hello starts or resumes the session, the others join it).
    pub(super) fn open(
        name: &str,
        epoch: u32,
        session: Session,
        cfg: &LinkConfig,
        connector: &Connector,
    ) -> Result<Opened, RemoteError> {
        let client_id = session.client;
        let mut secret = session.secret;
        let mut resumed = None;
        let mut endpoints = Vec::new();
        let mut capacity = 0;
        let mut node_id = 0;
        let mut features = 0;
        let mut boot = 0;
        for _ in 0..cfg.connections.max(1) {
            let ep = connector(name, client_id).map_err(|error| RemoteError::Fabric {
                node: name.to_string(),
                error,
            })?;
            let welcome = control::hello_in_session(ep.as_ref(), client_id, &cfg.token, secret)
                .map_err(|error| RemoteError::Control {
                    node: name.to_string(),
                    error,
                })?;
            if node_id != 0 && welcome.node_id != node_id {
                // Another process answered on the same address between two of our
                // connections: nothing said on this link can be trusted.
                return Err(RemoteError::NodeDown {
                    node: name.to_string(),
                    reason: "the memnode changed while fsd connected".into(),
                });
            }
            capacity = welcome.capacity;
            node_id = welcome.node_id;
            features = welcome.features;
            boot = welcome.boot;
            if !welcome.session.is_none() {
                secret = welcome.session;
            }
            resumed.get_or_insert(welcome.resumed);
            endpoints.push(ep);
        }
        let mapped = endpoints.iter().filter(|ep| ep.is_mapped()).count();
        if mapped > 0 {
            log::info!(
                "memnode {name}: {mapped} of {} connections map its region (READ and WRITE are copies)",
                endpoints.len()
            );
        }
        let volume = match &cfg.volume {
            None => None,
            Some(v) => {
                let takeover = v.takeover && epoch == 0;
                let control = endpoints[endpoints.len() - 1].as_ref();
                let info = control::volume_open(control, &v.name, v.create, takeover).map_err(
                    |error| {
                        // Nothing of this session is worth keeping for a reconnect.
                        let _ = control::session_end(control);
                        RemoteError::Control {
                            node: name.to_string(),
                            error,
                        }
                    },
                )?;
                Some(super::checked::volume_opened(
                    name, control, capacity, info,
                )?)
            }
        };
        let link = Link {
            epoch,
            endpoints,
            next: AtomicUsize::new(0),
            node_id,
            volume,
            features,
            boot,
            capacity,
            remap: None,
        };
        Ok(Opened {
            link,
            capacity,
            secret,
            resumed: resumed.unwrap_or(false),
        })
    }

    /// A data connection: an idle one of the caller's CPU when it is pinned to one,
    /// else the lowest-numbered idle one (see [`choose`]).
    pub fn endpoint(&self) -> &dyn Endpoint {
        let k = choose(
            self.endpoints.len(),
            pinned_cpu().map(|cpu| (cpu, process_cpus())),
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

    /// The rkey to access `addr` under, given the one fsd holds for it: the same
    /// unless the memnode restarted on its memory file since fsd got it.
    pub fn rkey(&self, addr: u64, held: u32) -> u32 {
        match &self.remap {
            None => held,
            Some(m) => m.rkey(addr, held),
        }
    }

    /// The chunk at `addr` is being freed: a later chunk there has its own rkey.
    pub fn forget_chunk(&self, addr: u64) {
        if let Some(m) = &self.remap {
            m.forget(addr);
        }
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
/// whose thread was asleep: a wakeup per request, while the polling thread spent a
/// CPU on a connection that stayed silent. With the lowest idle one, a lone stream
/// stays on connection 0 and k concurrent callers on the first k, whose threads are
/// awake (docs/benchmarks-history.md, "Which connection a call takes").
///
/// Why a CPU's own connections for pinned callers: the memnode thread of such a
/// connection is then woken from one CPU only, and the scheduler keeps it there,
/// taking turns with the caller without a wakeup across CPUs (a costly interrupt
/// in a VM). Shared by both CPUs' ring threads, connection 0's thread was woken
/// from either. A connection of its own for each ring thread, whatever its CPU,
/// gained nothing over this.
/// The /dev/fuse loop's threads are not pinned, and a lone reader's requests come to
/// them in turn: they keep the lowest idle one (a connection per thread there served
/// a lone reader worse). Figures for both: docs/benchmarks-history.md, "Which
/// connection a call takes".
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
