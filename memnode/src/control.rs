//! The two-sided path: control requests (SEND) from clients, answered with one reply
//! each. This is the only code that parses control frames; it never sees READ/WRITE.
//!
//! Sessions: a connection is anonymous until its `Hello` (checked against the token
//! with a constant-time compare when one is configured) names a client id; anything
//! else before that, a bad token, a frame in another protocol version or a frame that
//! does not decode is answered with an error and the connection is closed. After
//! Hello the connection may Alloc, Free, Stat and use volumes; errors there are
//! replies only. Every request of an authenticated connection counts as hearing from
//! its client (the lease of a volume holder, see `volumes.rs`).
//!
//! Sessions: a client's connections belong to its session, which the first Hello of
//! a client id starts and answers with a random secret. Every later Hello naming that
//! client id must present the secret: it joins the session (fsd's several
//! connections) or resumes it (a reconnect after a network blip). A Hello that names
//! a client id with a session but not its secret is refused, so knowing a client id
//! (volume listings show holders) no longer lets one act as that client. The secret
//! is never logged (`SessionSecret`'s `Debug` hides it).
//!
//! Scratch memory: chunks of a client that holds no volume belong to its session, not
//! a connection. When the session's last connection closes, its memory is kept for
//! the grace period (`MemnodeConfig::session_grace`) so that a client that was cut off
//! finds every chunk when it reconnects; a session not resumed by then is reclaimed
//! ([`ControlService::reap_expired`]): its scratch chunks revoked, zeroed and freed,
//! its volume let go. A client that ends its session (`SessionEnd`, fsd's clean
//! shutdown) is reclaimed as soon as its last connection closes.
//!
//! Volumes: a client that opens a volume becomes its holder and is bound to it: its
//! Alloc books chunks to the volume and its Free frees volume chunks. The volume's
//! chunks are registered for the holder only, and deregistered (never freed) when
//! it closes the volume, its last connection closes, or another client takes the
//! volume over (fencing it). Only VolumeDestroy frees them. The bookkeeping and its
//! rules are in `volumes.rs`; this module applies them to the pool.
//!
//! Lock order: `clients` (the sessions), then `volumes`, then `heard`; the pool's locks and the
//! registry (inside pool calls) come after any of them. `heard` is a leaf: nothing
//! is called while it is held. Hello and the last-connection reclaim both run under
//! `clients`, so a client reconnecting while it is being reclaimed never loses a
//! chunk it allocates anew. Every volume change (and a bound client's Alloc and Free)
//! runs under `volumes`, so the volume table and the pool's registrations of volume
//! chunks change together. A scratch Alloc runs outside `volumes` and checks again
//! under it afterwards, so a chunk that raced a VolumeOpen of the same client is
//! taken back rather than left beside the volume.

use crate::allocator::{AllocError, Owner};
use crate::counters::ControlCounters;
use crate::memfile::MemoryFile;
use crate::pool::{Chunk, ChunkPool, PoolError};
use crate::volumes::{Holder, OpenPlan, TakeoverReason, VolumeError, VolumeTable};
use rmemfs_common::fabric::{ConnectionState, ControlHandler, ControlReply};
use rmemfs_common::protocol::{
    listing_fits, ErrorCode, NodeStats, ProtocolError, Request, Response, SessionSecret,
    VolumeSummary, FEATURE_COPY, MAX_CHUNKS_PER_REPLY, MAX_CONTROL_BODY,
};
use rmemfs_common::size::format_size;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub struct ControlService {
    pool: Arc<ChunkPool>,
    token: Option<Vec<u8>>,
    node_id: u64,
    /// How long a volume holder stays live without being heard from.
    lease: Duration,
    /// How long a session whose connections all closed keeps its memory.
    grace: Duration,
    /// The sessions, by client id: connected ones and those in their grace period.
    clients: Mutex<HashMap<u64, Session>>,
    volumes: Mutex<VolumeTable>,
    /// When each connected client last sent a request.
    heard: Mutex<HashMap<u64, Instant>>,
    /// Requests served and refused (metrics).
    pub counters: ControlCounters,
    /// The memory file the books are saved to after every change (`None`: memory
    /// only). See `control_saved.rs`.
    store: Option<Mutex<MemoryFile>>,
    /// How many times this instance started before on its memory file (0 without
    /// one): a client that resumes a session sees its chunks' rkeys changed when it
    /// differs from the boot it knew.
    boot: u64,
    /// The books fill most of their slot in the memory file: what would grow them is
    /// refused (an atomic, read without the store's lock).
    books_full: std::sync::atomic::AtomicBool,
}

/// What the memnode knows of one client between its connections.
struct Session {
    secret: SessionSecret,
    /// Live authenticated connections.
    connections: usize,
    /// When the last connection closed (`None` while one is open): the grace period
    /// runs from here.
    idle_since: Option<Instant>,
    /// The client said `SessionEnd`: no grace period.
    ending: bool,
    /// Put back by a restart on the memory file: its chunks are registered when
    /// its first Hello comes (see `control_saved.rs`).
    unregistered: bool,
}

/// A new random session secret (never all zeros, which means "none").
fn new_secret() -> Option<SessionSecret> {
    let mut s = SessionSecret::NONE;
    for _ in 0..4 {
        getrandom::fill(&mut s.0).ok()?;
        if !s.is_none() {
            return Some(s);
        }
    }
    None
}

/// A volume name for logs.
fn show(name: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(name))
}

// The smallest summary in a VolumeListing body: a one-byte name.
const MIN_SUMMARY: usize = 2 + 1 + 8 + 8 + 4 + 8;

/// A reply before encoding, and whether the connection closes after it.
struct Answer {
    response: Response,
    close: bool,
}

fn reply(response: Response) -> Answer {
    Answer {
        response,
        close: false,
    }
}

fn refuse_and_close(code: ErrorCode, message: String) -> Answer {
    Answer {
        response: Response::error(code, message),
        close: true,
    }
}

/// Compares in time that depends only on the lengths, not on where bytes differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() != b.len()) as u8;
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= std::hint::black_box(x ^ y);
    }
    diff == 0
}

impl ControlService {
    /// `token`: required in every Hello when set. `lease`: how long a volume holder
    /// that sends nothing keeps its volume against other clients. `grace`: how long
    /// a session whose connections all closed keeps its memory for a reconnect.
    pub fn new(
        pool: Arc<ChunkPool>,
        token: Option<Vec<u8>>,
        node_id: u64,
        lease: Duration,
        grace: Duration,
    ) -> ControlService {
        ControlService {
            pool,
            token,
            node_id,
            lease,
            grace,
            clients: Mutex::new(HashMap::new()),
            volumes: Mutex::new(VolumeTable::new()),
            heard: Mutex::new(HashMap::new()),
            counters: ControlCounters::default(),
            store: None,
            boot: 0,
            books_full: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Saves the books to `file` after every change from now on; `boot` is what
    /// Welcome says.
    pub fn with_memory_file(mut self, file: MemoryFile, boot: u64) -> ControlService {
        self.store = Some(Mutex::new(file));
        self.boot = boot;
        self
    }

    // Sessions are updated in single statements, so poisoning is ignored.
    fn clients(&self) -> MutexGuard<'_, HashMap<u64, Session>> {
        self.clients.lock().unwrap_or_else(|e| e.into_inner())
    }

    // The table's methods leave it consistent at every return, and the pool calls
    // made under this lock do not panic on client input; poisoning is ignored.
    fn volumes(&self) -> MutexGuard<'_, VolumeTable> {
        self.volumes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn heard(&self) -> MutexGuard<'_, HashMap<u64, Instant>> {
        self.heard.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long ago `client` last sent a request; `None` when it is not connected.
    fn last_heard(&self, client: u64) -> Option<Duration> {
        self.heard().get(&client).map(Instant::elapsed)
    }

    /// Every volume, in name order.
    pub fn volumes_summary(&self) -> Vec<VolumeSummary> {
        self.volumes().summaries()
    }

    /// Authenticated connections open now.
    pub fn connections(&self) -> usize {
        self.clients().values().map(|s| s.connections).sum()
    }

    /// Sessions with no connection, kept through their grace period.
    pub fn idle_sessions(&self) -> usize {
        self.clients()
            .values()
            .filter(|s| s.connections == 0)
            .count()
    }

    pub fn node_id(&self) -> u64 {
        self.node_id
    }

    pub fn stats(&self) -> NodeStats {
        let clients = self
            .clients()
            .values()
            .filter(|s| s.connections > 0)
            .count();
        let usage = self.pool.usage();
        NodeStats {
            capacity: usage.capacity,
            used: usage.used,
            clients: u32::try_from(clients).unwrap_or(u32::MAX),
            allocations: u32::try_from(usage.chunks).unwrap_or(u32::MAX),
        }
    }

    fn hello(
        &self,
        conn: &mut ConnectionState,
        client_id: u64,
        token: &[u8],
        presented: SessionSecret,
    ) -> Answer {
        if let Some(expected) = &self.token {
            if !constant_time_eq(expected, token) {
                log::warn!(
                    "refusing {} (conn {}): wrong token",
                    conn.peer,
                    conn.conn_id
                );
                return refuse_and_close(ErrorCode::AuthFailed, "wrong token".into());
            }
        }
        let (session, resumed) = {
            let mut clients = self.clients();
            match clients.get_mut(&client_id) {
                Some(s) => {
                    if !constant_time_eq(&s.secret.0, &presented.0) {
                        log::warn!(
                            "refusing {} (conn {}): client {client_id:#x} has a session and this Hello did not present its secret",
                            conn.peer,
                            conn.conn_id
                        );
                        return refuse_and_close(
                            ErrorCode::AuthFailed,
                            "this client id belongs to a session whose secret the Hello did not carry"
                                .into(),
                        );
                    }
                    if s.unregistered {
                        if let Err(e) = self.register_restored(client_id) {
                            log::error!(
                                "client {client_id:#x}: cannot register its chunks again after the restart: {e}"
                            );
                            return refuse_and_close(
                                ErrorCode::NoSpace,
                                format!(
                                    "the memnode cannot register this session's memory again: {e}"
                                ),
                            );
                        }
                        s.unregistered = false;
                    }
                    s.connections += 1;
                    if let Some(since) = s.idle_since.take() {
                        self.counters
                            .sessions_resumed
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        log::info!(
                            "client {client_id:#x} resumed its session from {} after {:.1}s without a connection",
                            conn.peer,
                            since.elapsed().as_secs_f64()
                        );
                    }
                    (s.secret, true)
                }
                None => {
                    if self.books_full() {
                        return refuse_and_close(
                            ErrorCode::NoSpace,
                            "this memnode's memory file has no room for another session".into(),
                        );
                    }
                    let Some(secret) = new_secret() else {
                        log::error!("no randomness for a session secret");
                        return refuse_and_close(
                            ErrorCode::BadRequest,
                            "the memnode cannot make a session secret now".into(),
                        );
                    };
                    if !presented.is_none() {
                        log::info!(
                            "client {client_id:#x} asked to resume a session this memnode does not have (it expired, or this is a new memnode instance): a new session starts"
                        );
                    }
                    clients.insert(
                        client_id,
                        Session {
                            secret,
                            connections: 1,
                            idle_since: None,
                            ending: false,
                            unregistered: false,
                        },
                    );
                    (secret, false)
                }
            }
        };
        self.heard().insert(client_id, Instant::now());
        conn.client = Some(client_id);
        log::info!(
            "client {client_id:#x} connected from {} (conn {})",
            conn.peer,
            conn.conn_id
        );
        reply(Response::Welcome {
            node_id: self.node_id,
            capacity: self.pool.capacity(),
            features: FEATURE_COPY,
            session,
            resumed,
            boot: self.boot,
        })
    }

    /// A request from an authenticated connection of `client` from `peer`.
    fn serve(&self, client: u64, peer: &str, req: Request) -> Response {
        match req {
            Request::Hello { .. } => {
                Response::error(ErrorCode::BadRequest, "this connection already said hello")
            }
            Request::Alloc { bytes } => self.alloc(client, bytes),
            Request::Free { addr, rkey } => self.free(client, addr, rkey),
            Request::Stat => Response::Stats(self.stats()),
            Request::VolumeOpen {
                name,
                create,
                takeover,
            } => self.volume_open(client, peer, &name, create, takeover),
            Request::VolumeChunks { after } => {
                let vols = self.volumes();
                match vols.bound(client) {
                    Ok(v) => {
                        let (chunks, more) = v.chunks_after(after, MAX_CHUNKS_PER_REPLY);
                        Response::ChunkList { chunks, more }
                    }
                    Err(e) => volume_error(&e),
                }
            }
            Request::VolumeClose => self.volume_close(client),
            Request::VolumeList { after } => {
                let vols = self.volumes();
                // Enough candidates that the page is always cut by the frame, not
                // by the count: `more` is then exact.
                let candidates: Vec<VolumeSummary> = vols
                    .after(&after)
                    .take(MAX_CONTROL_BODY / MIN_SUMMARY + 1)
                    .map(|v| v.summary())
                    .collect();
                let n = listing_fits(&candidates);
                let more = n < candidates.len();
                let mut volumes = candidates;
                volumes.truncate(n);
                Response::VolumeListing { volumes, more }
            }
            Request::VolumeDestroy { name } => self.volume_destroy(client, &name),
            Request::Copy { spans } => match self.pool.copy(client, &spans) {
                Ok(bytes) => Response::Copied { bytes },
                Err(e) => Response::error(pool_error_code(&e), e.to_string()),
            },
            Request::SessionChunks { after } => {
                let (chunks, more) = self.pool.scratch_after(client, after, MAX_CHUNKS_PER_REPLY);
                Response::ChunkList {
                    chunks: chunks.into_iter().map(Chunk::to_wire).collect(),
                    more,
                }
            }
            Request::SessionEnd => {
                if let Some(s) = self.clients().get_mut(&client) {
                    s.ending = true;
                }
                Response::SessionEnding
            }
        }
    }

    fn alloc(&self, client: u64, bytes: u64) -> Response {
        {
            let mut vols = self.volumes();
            match vols.bound(client) {
                Ok(v) => {
                    let id = v.id();
                    return match self.pool.alloc_for(Owner::Volume(id), client, bytes) {
                        Ok(c) => {
                            vols.add_chunk(client, c.to_wire());
                            log::debug!(
                                "client {client:#x}: volume {id} alloc {bytes} -> {:#x}+{:#x} rkey {:#x}",
                                c.addr,
                                c.len,
                                c.rkey
                            );
                            Response::Allocated(c.to_wire())
                        }
                        Err(e) => alloc_error(client, bytes, e),
                    };
                }
                Err(VolumeError::NotHeld) => {}
                Err(e) => return volume_error(&e),
            }
        }
        let c = match self.pool.alloc(client, bytes) {
            Ok(c) => c,
            Err(e) => return alloc_error(client, bytes, e),
        };
        // Another connection of this client may have opened a volume meanwhile; the
        // chunk is filed already, so that open either saw it (and was refused) or
        // bound the client before this check.
        let vols = self.volumes();
        if vols.held_by(client).is_some() || vols.is_fenced(client) {
            if let Err(e) = self.pool.free(client, c.addr, c.rkey) {
                log::error!("client {client:#x}: cannot take back chunk {c:?}: {e}");
            }
            return Response::error(
                ErrorCode::BadRequest,
                "a volume was opened by this client while the allocation ran; allocate again",
            );
        }
        log::debug!(
            "client {client:#x}: alloc {bytes} -> {:#x}+{:#x} rkey {:#x}",
            c.addr,
            c.len,
            c.rkey
        );
        Response::Allocated(c.to_wire())
    }

    fn free(&self, client: u64, addr: u64, rkey: u32) -> Response {
        {
            let mut vols = self.volumes();
            match vols.bound(client) {
                Ok(_) => {
                    let id = match vols.check_free(client, addr) {
                        Ok(id) => id,
                        Err(e) => return volume_error(&e),
                    };
                    return match self.pool.free_as(Owner::Volume(id), client, addr, rkey) {
                        Ok(c) => {
                            vols.remove_chunk(client, addr);
                            log::debug!(
                                "client {client:#x}: volume {id} freed {:#x}+{:#x}",
                                c.addr,
                                c.len
                            );
                            Response::Freed
                        }
                        Err(e) => Response::error(pool_error_code(&e), e.to_string()),
                    };
                }
                Err(VolumeError::NotHeld) => {}
                Err(e) => return volume_error(&e),
            }
        }
        match self.pool.free(client, addr, rkey) {
            Ok(c) => {
                log::debug!("client {client:#x}: freed {:#x}+{:#x}", c.addr, c.len);
                Response::Freed
            }
            Err(e) => Response::error(pool_error_code(&e), e.to_string()),
        }
    }

    fn volume_open(
        &self,
        client: u64,
        peer: &str,
        name: &[u8],
        create: bool,
        takeover: bool,
    ) -> Response {
        let mut vols = self.volumes();
        let plan = vols.plan_open(client, name, create, takeover, self.lease, |c| {
            self.last_heard(c)
        });
        let plan = match plan {
            Ok(OpenPlan::AlreadyHeld) => {
                return match vols.held_by(client).and_then(|v| v.info(false)) {
                    Some(info) => Response::VolumeOpened(info),
                    None => internal("the held volume has no registered root"),
                };
            }
            Ok(plan) => plan,
            Err(e) => {
                log::info!(
                    "client {client:#x}: open of volume {} refused: {e}",
                    show(name)
                );
                return volume_error(&e);
            }
        };
        if self.pool.has_scratch(client) {
            return Response::error(
                ErrorCode::BadRequest,
                "this client has scratch chunks; a client opens its volume before it allocates",
            );
        }
        let holder = Holder {
            client,
            peer: peer.to_string(),
            since: Instant::now(),
        };
        match plan {
            OpenPlan::AlreadyHeld => internal("unreachable open plan"),
            OpenPlan::Create { id } => {
                let root = match self
                    .pool
                    .alloc_for(Owner::Volume(id), client, self.pool.page())
                {
                    Ok(c) => c,
                    Err(e) => return alloc_error(client, self.pool.page(), e),
                };
                match vols
                    .create(id, name, root.to_wire(), holder)
                    .and_then(|v| v.info(true))
                {
                    Some(info) => {
                        log::info!(
                            "client {client:#x} from {peer} created volume {} (id {id})",
                            show(name)
                        );
                        Response::VolumeOpened(info)
                    }
                    None => {
                        let _ = self
                            .pool
                            .free_as(Owner::Volume(id), client, root.addr, root.rkey);
                        internal("the volume table refused a planned create")
                    }
                }
            }
            OpenPlan::Hold { id, fence } => {
                if let Some((old, why)) = fence {
                    self.fence(&mut vols, name, &old, client, "takes it over", &why);
                }
                let addrs = vols.get(name).map(|v| v.addrs()).unwrap_or_default();
                let mut rkeys = Vec::with_capacity(addrs.len());
                for addr in addrs {
                    match self.pool.register(Owner::Volume(id), client, addr) {
                        Ok(c) => rkeys.push((addr, c.rkey)),
                        Err(e) => {
                            log::error!(
                                "client {client:#x}: cannot register chunk {addr:#x} of volume {}: {e}",
                                show(name)
                            );
                            for (_, rkey) in rkeys {
                                self.pool.deregister(rkey);
                            }
                            return Response::error(pool_error_code(&e), e.to_string());
                        }
                    }
                }
                if !vols.hold(name, holder, &rkeys) {
                    for (_, rkey) in rkeys {
                        self.pool.deregister(rkey);
                    }
                    return internal("the volume table refused a planned hold");
                }
                match vols.held_by(client).and_then(|v| v.info(false)) {
                    Some(info) => {
                        log::info!(
                            "client {client:#x} from {peer} opened volume {} (id {id}, {} chunks, {})",
                            show(name),
                            info.chunks,
                            format_size(info.bytes)
                        );
                        Response::VolumeOpened(info)
                    }
                    None => internal("the held volume has no registered root"),
                }
            }
        }
    }

    /// Takes volume `name` from `old` for `by` (who then does `action`): every
    /// registration of `old` is revoked (its READs and WRITEs fail from now on) and
    /// `old` is fenced.
    fn fence(
        &self,
        vols: &mut VolumeTable,
        name: &[u8],
        old: &Holder,
        by: u64,
        action: &str,
        why: &TakeoverReason,
    ) {
        let Some((_, rkeys)) = vols.fence(name) else {
            return;
        };
        for rkey in &rkeys {
            self.pool.deregister(*rkey);
        }
        let heard = match self.last_heard(old.client) {
            Some(d) => format!("last heard {:.1}s ago", d.as_secs_f64()),
            None => "no longer connected".into(),
        };
        log::warn!(
            "volume {}: client {by:#x} {action}, fencing client {:#x} ({}, held for {:.1}s from {}, {heard}); {} chunks revoked",
            show(name),
            old.client,
            match why {
                TakeoverReason::Requested => "takeover requested",
                TakeoverReason::LeaseExpired => "lease expired",
            },
            old.since.elapsed().as_secs_f64(),
            old.peer,
            rkeys.len()
        );
    }

    fn volume_close(&self, client: u64) -> Response {
        let mut vols = self.volumes();
        if let Err(e) = vols.bound(client) {
            return volume_error(&e);
        }
        let Some((name, rkeys)) = vols.release(client) else {
            return volume_error(&VolumeError::NotHeld);
        };
        for rkey in &rkeys {
            self.pool.deregister(*rkey);
        }
        log::info!(
            "client {client:#x} closed volume {} ({} chunks kept)",
            show(&name),
            rkeys.len()
        );
        Response::VolumeClosed
    }

    fn volume_destroy(&self, client: u64, name: &[u8]) -> Response {
        let mut vols = self.volumes();
        let plan = match vols.plan_destroy(client, name, self.lease, |c| self.last_heard(c)) {
            Ok(p) => p,
            Err(e) => {
                log::info!(
                    "client {client:#x}: destroy of volume {} refused: {e}",
                    show(name)
                );
                return volume_error(&e);
            }
        };
        if let Some(old) = &plan.fence {
            self.fence(
                &mut vols,
                name,
                old,
                client,
                "destroys it",
                &TakeoverReason::LeaseExpired,
            );
        } else if vols.held_by(client).is_some_and(|v| v.name() == name) {
            for rkey in vols.release(client).map(|(_, r)| r).unwrap_or_default() {
                self.pool.deregister(rkey);
            }
        }
        let Some(v) = vols.remove(name) else {
            return internal("the volume table refused a planned destroy");
        };
        let bytes = self
            .pool
            .release_unregistered(Owner::Volume(plan.id), &v.addrs());
        log::info!(
            "client {client:#x} destroyed volume {} (id {}): {} chunks, {} freed",
            show(name),
            plan.id,
            v.chunk_count(),
            format_size(bytes)
        );
        Response::VolumeDestroyed { bytes }
    }
}

fn internal(what: &str) -> Response {
    log::error!("internal error: {what}");
    Response::error(ErrorCode::BadRequest, format!("internal error: {what}"))
}

fn alloc_error(client: u64, bytes: u64, e: PoolError) -> Response {
    if let PoolError::Register { .. } = e {
        log::error!("client {client:#x}: alloc {bytes} failed: {e}");
    } else {
        log::debug!("client {client:#x}: alloc {bytes} refused: {e}");
    }
    Response::error(pool_error_code(&e), e.to_string())
}

fn volume_error(e: &VolumeError) -> Response {
    let code = match e {
        VolumeError::NotFound(_) | VolumeError::NoChunk(_) => ErrorCode::NotFound,
        VolumeError::Busy { .. } => ErrorCode::Busy,
        VolumeError::Fenced => ErrorCode::Fenced,
        VolumeError::HoldsAnother { .. } | VolumeError::NotHeld | VolumeError::Root(_) => {
            ErrorCode::BadRequest
        }
    };
    Response::error(code, e.to_string())
}

fn pool_error_code(e: &PoolError) -> ErrorCode {
    match e {
        // More than the capacity can never fit: for the client that is "no space".
        PoolError::Alloc(AllocError::NoSpace { .. } | AllocError::TooLarge { .. }) => {
            ErrorCode::NoSpace
        }
        // The memory exists but cannot be lent (e.g. the NIC cannot register more):
        // for the client that is no space here either, so it turns to another memnode.
        PoolError::Register { .. } => ErrorCode::NoSpace,
        PoolError::Alloc(AllocError::NotFound { .. })
        | PoolError::NotFound { .. }
        | PoolError::NotBooked { .. }
        | PoolError::Access { .. } => ErrorCode::NotFound,
        PoolError::Alloc(AllocError::ZeroSize) => ErrorCode::BadRequest,
    }
}

impl ControlHandler for ControlService {
    fn handle(&self, conn: &mut ConnectionState, frame: &[u8]) -> ControlReply {
        let answer = self.answer(conn, frame);
        if let Response::Error { code, .. } = &answer.response {
            self.counters.refused(*code);
        }
        ControlReply {
            frame: answer.response.encode(),
            close: answer.close,
        }
    }

    fn disconnected(&self, conn: &ConnectionState) {
        self.disconnect(conn);
    }
}

impl ControlService {
    /// The answer to one control frame.
    fn answer(&self, conn: &mut ConnectionState, frame: &[u8]) -> Answer {
        let decoded = Request::decode(frame);
        self.counters.request(decoded.as_ref().ok());
        let req = match decoded {
            Ok(r) => r,
            Err(e @ ProtocolError::Version { .. }) => {
                log::info!("refusing {} (conn {}): {e}", conn.peer, conn.conn_id);
                return refuse_and_close(ErrorCode::VersionMismatch, e.to_string());
            }
            Err(e) => {
                log::info!("malformed control frame from {}: {e}", conn.peer);
                return refuse_and_close(ErrorCode::BadRequest, e.to_string());
            }
        };
        match (conn.client, req) {
            (
                None,
                Request::Hello {
                    client_id,
                    token,
                    session,
                },
            ) => {
                let answer = self.hello(conn, client_id, &token, session);
                if let Response::Welcome { resumed: false, .. } = answer.response {
                    self.save();
                }
                answer
            }
            (None, _) => refuse_and_close(
                ErrorCode::NotAuthenticated,
                "the first request on a connection must be Hello".into(),
            ),
            (Some(client), req) => {
                self.heard().insert(client, Instant::now());
                let changes = changes_books(&req);
                if changes && self.books_full() && grows_books(&req) {
                    return reply(Response::error(
                        ErrorCode::NoSpace,
                        "this memnode's memory file has no room for more bookkeeping",
                    ));
                }
                let response = self.serve(client, &conn.peer, req);
                if changes {
                    self.save();
                }
                reply(response)
            }
        }
    }

    /// A connection ended. The session's last one starts its grace period, or ends
    /// the session at once when its client said `SessionEnd` (or there is no grace).
    fn disconnect(&self, conn: &ConnectionState) {
        let Some(client) = conn.client else { return };
        let mut clients = self.clients();
        let Some(session) = clients.get_mut(&client) else {
            return;
        };
        session.connections = session.connections.saturating_sub(1);
        if session.connections > 0 {
            log::info!(
                "client {client:#x}: conn {} from {} closed",
                conn.conn_id,
                conn.peer
            );
            return;
        }
        if !session.ending && !self.grace.is_zero() {
            session.idle_since = Some(Instant::now());
            log::info!(
                "client {client:#x}: last conn {} from {} closed; its session and memory are kept {:.0}s for a reconnect",
                conn.conn_id,
                conn.peer,
                self.grace.as_secs_f64()
            );
            return;
        }
        clients.remove(&client);
        let revoked = self.end_session(client);
        drop(clients);
        let how = format!("last conn {} from {} closed", conn.conn_id, conn.peer);
        self.reclaim(client, &revoked, &how);
        self.save();
    }

    /// Ends every session that has had no connection for longer than the grace
    /// period; returns how many. The memnode calls it about once a second.
    pub fn reap_expired(&self) -> usize {
        let mut clients = self.clients();
        let expired: Vec<u64> = clients
            .iter()
            .filter(|(_, s)| s.idle_since.is_some_and(|t| t.elapsed() >= self.grace))
            .map(|(&c, _)| c)
            .collect();
        let mut ended = Vec::with_capacity(expired.len());
        for &client in &expired {
            clients.remove(&client);
            self.counters
                .sessions_expired
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            ended.push((client, self.end_session(client)));
        }
        drop(clients);
        let how = format!(
            "no reconnect within the {:.0}s grace period",
            self.grace.as_secs_f64()
        );
        for (client, revoked) in &ended {
            self.reclaim(*client, revoked, &how);
        }
        if !expired.is_empty() {
            self.save();
        }
        expired.len()
    }

    /// Takes back what the ended session of `client` held: its scratch chunks are
    /// revoked (returned, for [`ControlService::reclaim`]), its volume let go (kept,
    /// unreachable until the next open). The caller holds `clients` and has removed
    /// the session, so a new session of the same client id never loses a chunk it
    /// allocates anew.
    fn end_session(&self, client: u64) -> Vec<Chunk> {
        let revoked = self.pool.revoke_all_of(client);
        if let Some((name, rkeys)) = self.volumes().client_gone(client) {
            for rkey in &rkeys {
                self.pool.deregister(*rkey);
            }
            log::info!(
                "client {client:#x} gone: volume {} released ({} chunks kept)",
                show(&name),
                rkeys.len()
            );
        }
        self.heard().remove(&client);
        revoked
    }

    /// Zeroes and frees the revoked chunks of an ended session (outside `clients`:
    /// zeroing takes time).
    fn reclaim(&self, client: u64, revoked: &[Chunk], how: &str) {
        let bytes = self.pool.release_revoked(revoked);
        log::info!(
            "client {client:#x} gone ({how}): reclaimed {} chunks, {}",
            revoked.len(),
            format_size(bytes)
        );
    }
}

#[path = "control_saved.rs"]
mod saved_books;
pub use saved_books::{changes_books, grows_books};

#[cfg(test)]
#[path = "control_tests.rs"]
mod tests;
