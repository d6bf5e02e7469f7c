//! One memnode as fsd sees it: its current connections (a [`Link`]), whether it is
//! reachable, and the pool of blocks fsd holds there.
//!
//! A memnode is in one of three states, as a Ceph OSD is "down" long before it is
//! "out":
//!
//! ```text
//!  up --(connection breaks, op or heartbeat times out)--> unreachable --(same instance
//!   ^                                                        |     resumes the session)--> up
//!   |                                                        |
//!   +---- new epoch <---- lost <---(a new instance answers, the dead time passes, or
//!                                   an operator says so)
//! ```
//!
//! - **up**: operations go to the link.
//! - **unreachable**: the link is dropped (its connections close once in-flight
//!   operations finish) and operations on the node fail at once or wait for it (the
//!   callers choose: see `RemoteStore`), but its copies still count: nothing is
//!   dropped or re-replicated because of it. The watch thread reconnects with backoff
//!   as the same client, presenting the session's secret; a memnode keeps a
//!   session's memory for its grace period, so when the same instance (the memnode
//!   id of the Welcome) answers and resumes the session, the node is up again with
//!   every copy it had, in the same epoch.
//! - **lost**: the epoch ends and its copies with it (`holds` and `has_copy` say no
//!   for them from then on): the pool is emptied and the callers re-make copies
//!   elsewhere. A node becomes lost when it answers as a new instance or without its
//!   session (it restarted empty, or the grace ran out), when it stays unreachable
//!   past the dead time ([`LinkConfig::dead_time`]), or when [`Node::declare_lost`] is
//!   called. The next link of a lost node starts a new session under a new client id
//!   (`client_id + epoch`), so fsd never resumes memory it has given up on.
//!
//! A memnode restarted on its memory file keeps its chunks under new rkeys: the
//! link's [`RkeyRemap`] (`remap.rs`) sends each operation under the current one.

use super::error::RemoteError;
use super::link::{Link, LinkConfig, Session};
use super::placement::Replica;
use super::pool::BlockPool;
use super::remap::RkeyRemap;
use super::Connector;
use rmemfs_common::control::{self, ControlError};
use rmemfs_common::fabric::FabricError;
use rmemfs_common::protocol::Allocation;
use rmemfs_common::protocol::{NodeStats, SessionSecret};
use rmemfs_common::size::format_size;
use rmemfs_common::sync::{lock, read, wait_timeout, write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

struct State {
    /// `None` while unreachable.
    link: Option<Arc<Link>>,
    /// The epoch of the current (or last) link: copies of another epoch are lost.
    epoch: u32,
    /// While unreachable: why, and since when.
    away: Option<(String, Instant)>,
    /// The client id and session this epoch's links use.
    session: Session,
    /// The memnode instance whose memory holds this epoch's copies (0: none yet).
    node_id: u64,
    /// Its restarts on its memory file when fsd last had a link to it.
    boot: u64,
    /// The rkeys of this epoch's chunks from before the memnode restarted, kept
    /// while unreachable for the next link of the same boot.
    remap: Option<Arc<RkeyRemap>>,
}

/// The blocks fsd holds on a node, and the epoch they belong to.
pub(super) struct NodePool {
    pub epoch: u32,
    pub blocks: BlockPool,
}

/// [`Node::up_epoch`]'s bit for "up" (the epoch is the low 32 bits).
const UP: u64 = 1 << 32;

/// How a node is doing, for status and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeState {
    Up,
    /// Its copies are kept but out of reach: since how long, and why.
    Unreachable {
        for_: Duration,
        reason: String,
    },
    /// Not connected and holding no copies of this fsd (lost, or never reached).
    Down {
        reason: String,
    },
}

/// Counts of a node's changes of state (for status and metrics).
#[derive(Debug, Default)]
pub struct NodeEvents {
    /// Times it became unreachable.
    pub unreachable: AtomicU64,
    /// Times a reconnect resumed its session with every copy.
    pub resumed: AtomicU64,
    /// Times its copies were declared lost.
    pub lost: AtomicU64,
}

/// The signal between the write path and a node's refill thread (`refill.rs`). Part
/// of the node, so the thread depends on the node and not the other way round.
#[derive(Default)]
pub(super) struct Refill {
    wanted: Mutex<bool>,
    cv: Condvar,
    pub(super) stop: AtomicBool,
}

impl Refill {
    /// Asks for a chunk ahead of need (cheap; repeated asks coalesce).
    pub(super) fn want(&self) {
        *lock(&self.wanted) = true;
        self.cv.notify_one();
    }

    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.cv.notify_one();
    }

    /// Waits up to `d` for a request; true if there was one (and takes it).
    pub(super) fn take_request(&self, d: Duration) -> bool {
        let mut wanted = lock(&self.wanted);
        if !*wanted {
            wanted = wait_timeout(&self.cv, wanted, d).0;
        }
        std::mem::take(&mut *wanted)
    }
}

pub(super) struct Node {
    pub name: String,
    /// Written only by changes of state; every operation reads it (its link), so
    /// readers do not exclude one another.
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
    pub events: NodeEvents,
    /// The client id of epoch 0 (`LinkConfig::client_id`).
    base_client: u64,
}

impl Node {
    /// Connects to `name` (epoch 0).
    pub fn connect(
        name: &str,
        cfg: &LinkConfig,
        connector: &Connector,
    ) -> Result<Node, RemoteError> {
        let session = Session {
            client: cfg.client_id,
            secret: SessionSecret::NONE,
        };
        let opened = Link::open(name, 0, session, cfg, connector)?;
        log::info!(
            "connected to memnode {name} ({} capacity, {} connections)",
            format_size(opened.capacity),
            cfg.connections
        );
        let node_id = opened.link.node_id;
        let boot = opened.link.boot;
        Ok(Node::with_state(
            name,
            cfg,
            State {
                link: Some(Arc::new(opened.link)),
                epoch: 0,
                away: None,
                session: Session {
                    secret: opened.secret,
                    ..session
                },
                node_id,
                boot,
                remap: None,
            },
        ))
    }

    /// A node that could not be reached at mount: it holds nothing of this fsd, so
    /// it starts lost (epoch 0 has no copies) and its watch thread connects it as
    /// epoch 1 when it answers.
    pub fn unreachable(name: &str, cfg: &LinkConfig, reason: String) -> Node {
        log::error!("memnode {name} is unreachable: {reason}; it is used once it answers");
        Node::with_state(
            name,
            cfg,
            State {
                link: None,
                epoch: 0,
                away: Some((reason, Instant::now())),
                session: Session {
                    client: cfg.client_id,
                    secret: SessionSecret::NONE,
                },
                node_id: 0,
                boot: 0,
                remap: None,
            },
        )
    }

    fn with_state(name: &str, cfg: &LinkConfig, state: State) -> Node {
        let up = if state.link.is_some() { UP } else { 0 };
        Node {
            name: name.to_string(),
            up_epoch: AtomicU64::new(up | state.epoch as u64),
            pool: Mutex::new(NodePool {
                epoch: state.epoch,
                blocks: BlockPool::new(),
            }),
            state: RwLock::new(state),
            full: AtomicBool::new(false),
            refill: Refill::default(),
            usage: Mutex::new(None),
            events: NodeEvents::default(),
            base_client: cfg.client_id,
        }
    }

    /// The epoch and memnode id whose copies still count (up or unreachable); `None`
    /// while the node holds no copies of this fsd (it was lost and has not answered
    /// since).
    pub fn identity(&self) -> Option<(u32, u64)> {
        let s = self.read_state();
        (s.node_id != 0 && s.link.as_ref().is_none_or(|l| l.epoch == s.epoch))
            .then_some((s.epoch, s.node_id))
    }

    /// The current link, or why there is none.
    pub fn link(&self) -> Result<Arc<Link>, RemoteError> {
        let s = self.read_state();
        match (&s.link, &s.away) {
            (Some(l), None) => Ok(l.clone()),
            (_, away) => Err(RemoteError::NodeDown {
                node: self.name.clone(),
                reason: away
                    .as_ref()
                    .map_or_else(|| "not connected".into(), |(r, _)| r.clone()),
            }),
        }
    }

    pub fn is_up(&self) -> bool {
        self.up_epoch.load(Ordering::Acquire) & UP != 0
    }

    /// The epoch whose copies count now.
    pub fn epoch(&self) -> u32 {
        self.up_epoch.load(Ordering::Acquire) as u32
    }

    /// True when `r` (a copy on this node) can be reached now: the node is up and
    /// `r` was allocated in its current epoch.
    pub fn holds(&self, r: &Replica) -> bool {
        self.up_epoch.load(Ordering::Acquire) == UP | r.epoch as u64
    }

    /// True when `r` still exists, reachable or not: it is of the current epoch.
    pub fn has_copy(&self, r: &Replica) -> bool {
        self.epoch() == r.epoch
    }

    /// Up, or unreachable since when and why.
    pub fn state(&self) -> NodeState {
        let s = self.read_state();
        match &s.away {
            None => NodeState::Up,
            Some((reason, _)) if s.node_id == 0 => NodeState::Down {
                reason: reason.clone(),
            },
            Some((reason, since)) => NodeState::Unreachable {
                for_: since.elapsed(),
                reason: reason.clone(),
            },
        }
    }

    fn read_state(&self) -> RwLockReadGuard<'_, State> {
        read(&self.state)
    }

    fn write_state(&self) -> RwLockWriteGuard<'_, State> {
        write(&self.state)
    }

    /// Records a failure of an operation made on the link of `epoch`. A broken
    /// connection or an operation that got no answer in time makes the node
    /// unreachable (logged once); other errors (a refused access) leave it up.
    pub fn note_failure(&self, epoch: u32, e: &FabricError) {
        if !(e.is_fatal() || matches!(e, FabricError::Timeout { .. })) {
            return;
        }
        self.set_unreachable(epoch, e.to_string());
    }

    /// Makes the node unreachable for `why` (logged once): its link is dropped, its
    /// copies are kept, and the watch thread reconnects it.
    fn set_unreachable(&self, epoch: u32, why: String) {
        let mut s = self.write_state();
        if s.epoch == epoch && s.away.is_none() {
            log::error!(
                "memnode {} is unreachable: {why}; its copies are kept, reconnecting in the background",
                self.name
            );
            s.away = Some((why, Instant::now()));
            s.link = None;
            self.up_epoch.store(epoch as u64, Ordering::Release);
            self.events.unreachable.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records that an operation on the link of `epoch` failed with `e`, and returns
    /// `e`: a broken connection or a timeout makes the node unreachable (as
    /// [`Node::note_failure`]), and so does a reply that cannot be true
    /// ([`RemoteError::Untrusted`]): nothing more said on that link is believed, as
    /// after a failure; a later link asks again.
    pub fn failed(&self, epoch: u32, e: RemoteError) -> RemoteError {
        match &e {
            RemoteError::Control {
                error: ControlError::Fabric(f),
                ..
            }
            | RemoteError::Fabric { error: f, .. } => self.note_failure(epoch, f),
            RemoteError::Untrusted { what, .. } => {
                self.set_unreachable(epoch, format!("a reply fsd does not believe: {what}"))
            }
            _ => {}
        }
        e
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

    /// Ends the current epoch: its copies are lost (logged with `why`). Does nothing
    /// when the node is up, or already lost with no link since (`epoch` is not the
    /// current one). The next link starts a new session under a new client id.
    pub fn declare_lost(&self, epoch: u32, why: &str) -> bool {
        let mut s = self.write_state();
        if s.epoch != epoch || s.away.is_none() || s.node_id == 0 {
            return false;
        }
        self.end_epoch(&mut s, why);
        true
    }

    /// Moves `s` to the next epoch, with an empty pool and no node id: the copies of
    /// the old one are lost.
    fn end_epoch(&self, s: &mut State, why: &str) {
        let old = s.epoch;
        let held = {
            let mut pool = lock(&self.pool);
            // Not freed: those chunks are out of reach, or gone.
            let n = pool.blocks.drain().len();
            pool.epoch = old.wrapping_add(1);
            n
        };
        s.epoch = old.wrapping_add(1);
        s.node_id = 0;
        s.remap = None;
        s.session = Session {
            client: self.base_client.wrapping_add(s.epoch as u64),
            secret: SessionSecret::NONE,
        };
        if s.link.is_some() {
            s.link = None;
            s.away = Some((why.to_string(), Instant::now()));
        }
        self.up_epoch.store(s.epoch as u64, Ordering::Release);
        self.full.store(false, Ordering::Relaxed);
        *lock(&self.usage) = None;
        self.events.lost.fetch_add(1, Ordering::Relaxed);
        log::error!(
            "memnode {}: {why}; the copies it held ({held} chunks) are lost and are re-made from other copies where there are any",
            self.name
        );
    }

    /// While unreachable: declares the node lost once it has been away for the dead
    /// time. Returns true when it did.
    pub fn check_dead_time(&self, dead_time: Duration) -> bool {
        let (epoch, away) = {
            let s = self.read_state();
            (s.epoch, s.away.as_ref().map(|(_, since)| since.elapsed()))
        };
        match away {
            Some(d) if d >= dead_time => self.declare_lost(
                epoch,
                &format!(
                    "unreachable for {:.0}s, past the dead time ({:.0}s)",
                    d.as_secs_f64(),
                    dead_time.as_secs_f64()
                ),
            ),
            _ => false,
        }
    }

    /// Connects again while unreachable, as the current session. The same memnode
    /// instance resuming the session brings the node back up in the same epoch with
    /// every copy; any other answer (a new instance, a session the memnode no longer
    /// has, or a node already lost) starts a new epoch with an empty pool.
    pub fn reconnect(&self, cfg: &LinkConfig, connector: &Connector) -> Result<(), RemoteError> {
        let (epoch, session, node_id) = {
            let s = self.read_state();
            (s.epoch, s.session, s.node_id)
        };
        let opened = match Link::open(&self.name, epoch, session, cfg, connector) {
            Ok(o) => o,
            Err(e) => {
                // Another fsd took the volume over while this one was away (over
                // verbs the fencing itself breaks the connection): nothing it held
                // there comes back, so waiting for it would only hang its callers.
                if let RemoteError::Control { error, .. } = &e {
                    if error.is_fenced() || error.is_busy() {
                        self.declare_lost(epoch, &format!("refused the volume: {error}"));
                    }
                }
                return Err(e);
            }
        };
        let mut s = self.write_state();
        if s.epoch != epoch || s.away.is_none() {
            // Declared lost (or reconnected) meanwhile: the next round starts over.
            return Err(RemoteError::NodeDown {
                node: self.name.clone(),
                reason: "its state changed while reconnecting".into(),
            });
        }
        let away = s
            .away
            .as_ref()
            .map_or(0.0, |(_, t)| t.elapsed().as_secs_f64());
        let same = node_id != 0 && opened.link.node_id == node_id && opened.resumed;
        let mut link = opened.link;
        if !same {
            if node_id != 0 {
                let why = if link.node_id != node_id {
                    format!(
                        "answered as a new instance ({:#018x}, was {node_id:#018x}): it restarted without its memory",
                        link.node_id
                    )
                } else {
                    "answered without the session (its grace period ran out)".to_string()
                };
                self.end_epoch(&mut s, &why);
            }
            // The session the link opened is a fresh one on this instance: it is the
            // new epoch's.
            link.epoch = s.epoch;
            s.node_id = link.node_id;
            s.boot = link.boot;
            s.remap = None;
            s.session = Session {
                client: session.client,
                secret: opened.secret,
            };
            {
                let mut pool = lock(&self.pool);
                pool.blocks.drain();
                pool.epoch = s.epoch;
            }
        } else {
            s.session.secret = opened.secret;
            // Before the link is published, so no allocation of fsd's own can be
            // under way on it.
            let restarted = link.boot != s.boot;
            if restarted {
                // Every chunk's rkey changed: without the list, nothing is reachable.
                let chunks = match self.held_chunks(&link, cfg) {
                    Ok(c) => c,
                    Err(e) => {
                        drop(s);
                        return Err(e);
                    }
                };
                log::warn!(
                    "memnode {} restarted on its memory file (start {}, was {}): its {} chunks are kept under new rkeys",
                    self.name,
                    link.boot,
                    s.boot,
                    chunks.len()
                );
                s.remap = Some(Arc::new(RkeyRemap::new(&chunks)));
                s.boot = link.boot;
            }
            link.remap = s.remap.clone();
            if cfg.volume.is_none() {
                self.free_orphan_chunks(&link, cfg);
            }
            self.events.resumed.fetch_add(1, Ordering::Relaxed);
        }
        let epoch = s.epoch;
        s.link = Some(Arc::new(link));
        s.away = None;
        self.up_epoch.store(UP | epoch as u64, Ordering::Release);
        self.full.store(false, Ordering::Relaxed);
        drop(s);
        if same {
            log::warn!(
                "memnode {} is back after {away:.1}s: its session resumed with every copy it held",
                self.name
            );
        } else {
            *lock(&self.usage) = None;
            log::warn!(
                "memnode {} is back ({} capacity, epoch {epoch}, empty); it is used for new copies",
                self.name,
                format_size(opened.capacity)
            );
        }
        Ok(())
    }

    /// The chunks the resumed session can reach, with their current rkeys: its
    /// scratch chunks, or its volume's (the root among them).
    fn held_chunks(&self, link: &Link, cfg: &LinkConfig) -> Result<Vec<Allocation>, RemoteError> {
        let mut chunks = self.chunks(link, cfg.volume.is_some())?;
        chunks.extend(link.volume.map(|v| v.root));
        Ok(chunks)
    }

    /// Gives back the scratch chunks the resumed session holds that the pool does not
    /// know: an Alloc the memnode served while the connection broke, whose reply
    /// never came. (A volume's such chunk is found unreferenced at its next mount.)
    fn free_orphan_chunks(&self, link: &Link, cfg: &LinkConfig) {
        let chunks = match self.held_chunks(link, cfg) {
            Ok(c) => c,
            Err(e) => {
                log::warn!("memnode {}: listing the session's chunks: {e}", self.name);
                return;
            }
        };
        let orphans: Vec<_> = {
            let pool = lock(&self.pool);
            chunks
                .into_iter()
                .filter(|c| !pool.blocks.has_chunk(c.addr))
                .collect()
        };
        for c in &orphans {
            link.forget_chunk(c.addr);
            match control::free(link.control(), c.addr, c.rkey) {
                Ok(()) => log::info!(
                    "memnode {}: gave back chunk {:#x} ({}), allocated while the connection broke",
                    self.name,
                    c.addr,
                    format_size(c.len)
                ),
                Err(e) => log::warn!("memnode {}: freeing chunk {:#x}: {e}", self.name, c.addr),
            }
        }
    }

    /// Asks the node for its statistics (kept in `usage`); a failure to answer makes
    /// it unreachable.
    pub fn heartbeat(&self) -> Result<(), RemoteError> {
        let link = self.link()?;
        let stats = self.stat(&link)?;
        *lock(&self.usage) = Some(stats);
        Ok(())
    }

    /// Tells the memnode this fsd is done (clean shutdown), so it gives the scratch
    /// memory back at once rather than keeping it through the session's grace.
    pub fn end_session(&self) {
        if let Ok(link) = self.link() {
            if let Err(e) = control::session_end(link.control()) {
                log::debug!("memnode {}: ending the session: {e}", self.name);
            }
        }
    }
}
