//! Passive side of the verbs backend (memnode): listen with rdma_cm, give each client
//! its own protection domain, and answer control frames. The one-sided path is the
//! NIC's: a READ or WRITE under a chunk's rkey is served by the device without this
//! process seeing it, within the memory region registered for that chunk.
//!
//! - [`VerbsRegistry`] is the [`MemoryRegistry`]: one memory region per chunk,
//!   registered in the owning client's protection domain with remote read/write
//!   access, deregistered when the chunk is freed (the rkey dies with it). Another
//!   client's queue pairs live in another protection domain, so the device refuses
//!   them even with the right rkey, as the tcp backend refuses a `NotOwner` access.
//! - A connection request must carry the client id in its private data (the QP is
//!   created in that client's domain); the Hello that follows must name the same
//!   client. Until the Hello succeeded the QP grants no remote access at all.
//! - One thread reads rdma_cm events (connect requests, disconnects); each connection
//!   has a thread sleeping on its completion channel that answers control frames
//!   with the [`ControlHandler`], one at a time.
//! - Connections are capped as over tcp ([`ConnectionLimits`], [`crate::admission`]):
//!   the ones that have not completed their Hello in all and per address (the oldest
//!   closed to make room), the others apart; a connection has
//!   [`ConnectionLimits::hello_timeout`] from accept to complete its Hello.
//!
//! What a connection costs before its Hello, and why it is not deferred: rdma_cm
//! must answer a connection request with a queue pair, and a queue pair is created
//! in its protection domain for good, with its completion queue, and cannot take a
//! SEND (the Hello itself) without receive buffers posted in a registered region.
//! So the PD (the one the request names, shared with the client's other
//! connections), a CQ with its completion channel, the QP and 9 KiB of message
//! buffers come with the accept; what is cheap to check (the private data's magic,
//! the caps) is checked first, and the caps bound the rest: at most
//! [`ConnectionLimits::pending`] connections hold them before their Hello, for at
//! most the Hello deadline each, and a connection past its cap is rejected before
//! anything is allocated. The thread could be deferred only by serving every
//! pre-Hello connection from one thread; its stack is virtual memory mostly, and the
//! same caps bound it. None of it grants remote access: the QP gets that only once
//! the Hello has succeeded.

use super::messages::{Messages, RECV_DEPTH, RECV_TAG, SEND_TAG};
use super::sys::*;
use super::PRIVATE_MAGIC;
use crate::admission::{Admission, Ticket};
use crate::fabric::{
    ConnectionLimits, ConnectionState, ControlHandler, FabricError, Listener, MemoryRegistry,
    Server, PENDING_MEANS,
};
use crate::sync::lock;
use crate::throttle::{and_more, Throttle, LOG_EVERY};
use rdma_sys::*;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Send-queue depth of a memnode's connection: it only ever SENDs replies, one at a
/// time.
const SEND_DEPTH: u32 = 4;
const TICK: Duration = Duration::from_millis(100);

/// Memory registration of a verbs memnode: one MR per chunk in its owner's PD.
#[derive(Default)]
pub struct VerbsRegistry {
    /// Each client's protection domain, alive while a connection or a registration
    /// of the client holds it.
    pds: Mutex<HashMap<u64, Weak<Pd>>>,
    mrs: Mutex<HashMap<u32, Mr>>,
}

impl VerbsRegistry {
    /// The protection domain of `client` on device `ctx`, created on first use.
    fn pd_for(&self, client: u64, ctx: *mut ibv_context) -> Result<Arc<Pd>, FabricError> {
        let mut pds = lock(&self.pds);
        if let Some(pd) = pds.get(&client).and_then(Weak::upgrade) {
            if pd.context() != ctx {
                return Err(FabricError::Local(format!(
                    "client {client:016x} is already connected through another RDMA device"
                )));
            }
            return Ok(pd);
        }
        let pd = Pd::new(ctx)?;
        pds.retain(|_, w| w.strong_count() > 0);
        pds.insert(client, Arc::downgrade(&pd));
        Ok(pd)
    }
}

impl MemoryRegistry for VerbsRegistry {
    unsafe fn register(&self, owner: u64, addr: u64, len: u64) -> Result<u32, FabricError> {
        let pd = lock(&self.pds)
            .get(&owner)
            .and_then(Weak::upgrade)
            .ok_or_else(|| FabricError::Local(format!("client {owner:016x} has no connection")))?;
        let len = usize::try_from(len).map_err(|_| FabricError::Invalid("length".into()))?;
        // SAFETY: forwarded from this function's contract: the memory stays mapped
        // until deregister(rkey), which drops the Mr.
        let mr = unsafe { Mr::register(&pd, addr as *mut u8, len, REMOTE_RW)? };
        let rkey = mr.rkey();
        let mut mrs = lock(&self.mrs);
        if mrs.contains_key(&rkey) {
            // A device never hands out a live rkey twice; refuse rather than lose
            // track of a registration.
            return Err(FabricError::Local(format!(
                "the device reused live rkey {rkey:#x}"
            )));
        }
        mrs.insert(rkey, mr);
        Ok(rkey)
    }

    fn deregister(&self, rkey: u32) {
        let mr = lock(&self.mrs).remove(&rkey);
        // ibv_dereg_mr returns once the device no longer accesses the region.
        drop(mr);
    }
}

/// A bound, listening rdma_cm id.
pub struct VerbsListener {
    // Field order: the id before its event channel. The id is only held: it is
    // what listens.
    _id: CmId,
    channel: EventChannel,
    addr: SocketAddr,
    registry: Arc<VerbsRegistry>,
    limits: ConnectionLimits,
}

impl VerbsListener {
    /// Binds rdma_cm to `listen` ("host:port"; port 0 picks a free port); its
    /// connections will be capped and timed by `limits`.
    pub fn bind(listen: &str, limits: ConnectionLimits) -> Result<Box<dyn Listener>, FabricError> {
        super::first_device_name()?;
        let err = |why: String| FabricError::Local(format!("cannot listen on {listen}: {why}"));
        let addr = resolve(listen).map_err(err)?;
        let channel = EventChannel::new()?;
        let id = CmId::new(&channel)?;
        let mut sa = to_sockaddr(&addr);
        // SAFETY: valid id and socket address.
        if unsafe { rdma_bind_addr(id.0, &mut sa as *mut _ as *mut _) } != 0 {
            return Err(err(format!("rdma_bind_addr: {}", errno_text())));
        }
        // SAFETY: valid bound id.
        if unsafe { rdma_listen(id.0, 64) } != 0 {
            return Err(err(format!("rdma_listen: {}", errno_text())));
        }
        // SAFETY: valid bound id.
        let port = u16::from_be(unsafe { rdma_get_src_port(id.0) });
        let addr = SocketAddr::new(addr.ip(), port);
        Ok(Box::new(VerbsListener {
            _id: id,
            channel,
            addr,
            registry: Arc::new(VerbsRegistry::default()),
            limits,
        }))
    }
}

impl Listener for VerbsListener {
    fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    fn registry(&self) -> Arc<dyn MemoryRegistry> {
        self.registry.clone()
    }

    fn serve(
        self: Box<Self>,
        control: Arc<dyn ControlHandler>,
    ) -> std::io::Result<Box<dyn Server>> {
        let addr = self.addr;
        let caps = self.limits.caps();
        // A connection holds its completion channel's descriptor.
        crate::fdlimit::ensure(
            caps.ceiling() + 256,
            &format!("up to {} verbs connections", caps.ceiling()),
        );
        let shared = Arc::new(Shared {
            control,
            registry: self.registry.clone(),
            limits: self.limits,
            admission: Admission::new(caps, "verbs fabric", PENDING_MEANS),
            stopping: AtomicBool::new(false),
            closing: Mutex::new(HashMap::new()),
            threads: Mutex::new(Vec::new()),
            next_conn_id: AtomicU64::new(1),
            pre_hello_closes: Throttle::new(LOG_EVERY),
            refusals: Throttle::new(LOG_EVERY),
        });
        let s = shared.clone();
        let events = std::thread::Builder::new()
            .name("verbs-cm".into())
            .spawn(move || event_loop(*self, &s))?;
        Ok(Box::new(VerbsServer {
            addr,
            shared,
            events: Some(events),
        }))
    }
}

struct Shared {
    control: Arc<dyn ControlHandler>,
    registry: Arc<VerbsRegistry>,
    limits: ConnectionLimits,
    /// The connection slots, before and after the Hello.
    admission: Arc<Admission>,
    stopping: AtomicBool,
    /// Live connections by cm id: the flag that tells its thread to close.
    closing: Mutex<HashMap<usize, Arc<AtomicBool>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    next_conn_id: AtomicU64,
    /// Connections closed before their Hello for what they did (or did not do):
    /// anyone can make many, so their lines are throttled.
    pre_hello_closes: Throttle,
    /// Connection requests refused before anything was allocated.
    refusals: Throttle,
}

/// A serving verbs memnode endpoint.
pub struct VerbsServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    events: Option<JoinHandle<()>>,
}

impl Server for VerbsServer {
    fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    fn shutdown(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        if let Some(t) = self.events.take() {
            let _ = t.join();
        }
    }
}

impl Drop for VerbsServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn event_loop(listener: VerbsListener, s: &Arc<Shared>) {
    while !s.stopping.load(Ordering::SeqCst) {
        let ev = match listener.channel.next(TICK) {
            Ok(Some(ev)) => ev,
            Ok(None) => continue,
            Err(e) => {
                log::warn!("rdma_cm events: {e}");
                std::thread::sleep(TICK);
                continue;
            }
        };
        match ev.event {
            rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST => {
                // The new id is ours from here on: accepted, or rejected and destroyed.
                let id = CmId(ev.id);
                if let Err(why) = accept(id, &ev, s) {
                    if let Some(n) = s.refusals.check() {
                        log::info!("refused a verbs connection: {why}{}", and_more(n));
                    }
                }
            }
            rdma_cm_event_type::RDMA_CM_EVENT_DISCONNECTED
            | rdma_cm_event_type::RDMA_CM_EVENT_DEVICE_REMOVAL => {
                if let Some(flag) = lock(&s.closing).get(&(ev.id as usize)) {
                    flag.store(true, Ordering::SeqCst);
                }
            }
            other => log::debug!("rdma_cm event {}", event_text(other)),
        }
    }
    // Stopping: close every connection and wait for their threads (which destroy
    // their ids) before the listener's id and channel go.
    for flag in lock(&s.closing).values() {
        flag.store(true, Ordering::SeqCst);
    }
    let threads = std::mem::take(&mut *lock(&s.threads));
    for t in threads {
        let _ = t.join();
    }
    drop(listener);
}

/// The peer's address of a connection id: Err(a description) for an address family
/// other than IPv4 and IPv6.
fn peer_of(id: &CmId) -> Result<SocketAddr, String> {
    // SAFETY: valid id; rdma_get_peer_addr returns a reference into it, read here
    // according to its family.
    unsafe {
        let sa = rdma_get_peer_addr(&*id.0) as *const libc::sockaddr;
        match (*sa).sa_family as i32 {
            libc::AF_INET => {
                let sin = &*(sa as *const libc::sockaddr_in);
                let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                Ok(SocketAddr::new(ip.into(), u16::from_be(sin.sin_port)))
            }
            libc::AF_INET6 => {
                let sin6 = &*(sa as *const libc::sockaddr_in6);
                let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                Ok(SocketAddr::new(ip.into(), u16::from_be(sin6.sin6_port)))
            }
            f => Err(format!("(address family {f})")),
        }
    }
}

/// One accepted connection, owned by its thread. Field order is drop order: the QP
/// before its CQ and buffers, the PD last.
struct ServerConn {
    qp: Qp,
    id: CmId,
    cq: Cq,
    msgs: Messages,
    /// The client the connection request named (its QP is in this client's PD).
    client: u64,
    _pd: Arc<Pd>,
}

fn reject(id: &CmId, why: &str) -> String {
    // SAFETY: valid id of an unanswered connection request.
    unsafe { rdma_reject(id.0, std::ptr::null(), 0) };
    why.to_string()
}

fn accept(id: CmId, ev: &CmEvent, s: &Arc<Shared>) -> Result<(), String> {
    let accepted = Instant::now();
    let peer_addr = match peer_of(&id) {
        Ok(a) => a,
        Err(family) => return Err(reject(&id, &format!("a peer of {family}"))),
    };
    let peer = peer_addr.to_string();
    if ev.private.len() < 12 || &ev.private[..4] != PRIVATE_MAGIC {
        return Err(reject(&id, &format!("{peer} is not an rmemfs client")));
    }
    // Capped before anything is allocated for it (refusals are logged there).
    let closing = Arc::new(AtomicBool::new(false));
    let flag = closing.clone();
    let ticket = match s.admission.admit(
        peer_addr.ip(),
        Box::new(move || flag.store(true, Ordering::SeqCst)),
    ) {
        Ok(t) => t,
        Err(e) => return Err(reject(&id, &format!("{peer}: {e}"))),
    };
    let mut client_bytes = [0u8; 8];
    client_bytes.copy_from_slice(&ev.private[4..12]);
    let client = u64::from_le_bytes(client_bytes);
    let setup = || -> Result<(Qp, Cq, Messages, Arc<Pd>), FabricError> {
        let ctx = id.verbs();
        let limits = device_limits(ctx)?;
        let pd = s.registry.pd_for(client, ctx)?;
        let cq = Cq::new(ctx, (SEND_DEPTH as usize + RECV_DEPTH) as i32)?;
        let responder_resources = ev.initiator_depth.min(limits.max_rd_atomic).max(1);
        let initiator_depth = ev.responder_resources.min(limits.max_rd_atomic);
        // No one-sided access before the Hello has authenticated the client: the QP
        // is ready, with no remote access, before the answer goes out.
        let qp = Qp::for_connection_request(
            &id,
            &pd,
            &cq,
            (SEND_DEPTH, RECV_DEPTH as u32),
            responder_resources,
            initiator_depth,
        )?;
        let msgs = Messages::new(&pd)?;
        msgs.post_all_recvs(qp.0)?;
        // SAFETY: all-zero is a valid rdma_conn_param; the fields used are set.
        let mut param: rdma_conn_param = unsafe { std::mem::zeroed() };
        param.responder_resources = responder_resources;
        param.initiator_depth = initiator_depth;
        param.retry_count = 7;
        param.rnr_retry_count = 7;
        param.qp_num = qp.num();
        // SAFETY: valid id answering its connection request; no QP is attached to
        // it, so rdma_cm leaves `qp` (named by qp_num) alone.
        if unsafe { rdma_accept(id.0, &mut param) } != 0 {
            return Err(local_err("rdma_accept"));
        }
        Ok((qp, cq, msgs, pd))
    };
    let (qp, cq, msgs, pd) = match setup() {
        Ok(parts) => parts,
        Err(e) => return Err(reject(&id, &format!("{peer}: {e}"))),
    };
    let mut conn = ServerConn {
        qp,
        id,
        cq,
        msgs,
        client,
        _pd: pd,
    };

    let conn_id = s.next_conn_id.fetch_add(1, Ordering::Relaxed);
    let key = conn.id.0 as usize;
    lock(&s.closing).insert(key, closing.clone());
    let sh = s.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("verbs-conn {peer}"))
        .spawn(move || {
            let mut ticket = ticket;
            let mut state = ConnectionState::new(conn_id, peer);
            let hello_deadline = accepted + sh.limits.hello_timeout;
            let served = serve(
                &mut conn,
                &mut state,
                &closing,
                &sh,
                &mut ticket,
                hello_deadline,
            );
            log_end(&state, &ticket, served, &sh);
            // SAFETY: valid id; tells the client at once (harmless if it already left).
            unsafe { rdma_disconnect(conn.id.0) };
            sh.control.disconnected(&state);
            lock(&sh.closing).remove(&key);
            drop(conn);
            drop(ticket);
        });
    match spawned {
        Ok(t) => {
            let mut threads = lock(&s.threads);
            threads.retain(|t| !t.is_finished());
            threads.push(t);
            Ok(())
        }
        Err(e) => {
            // The closure, with the connection and its ticket, is gone with the error.
            lock(&s.closing).remove(&key);
            Err(format!("cannot spawn a connection thread: {e}"))
        }
    }
}

/// Logs how a connection ended: a line per connection after its Hello; before it,
/// where anyone can make many, throttled (and none for one closed to make room,
/// which the admission logged).
fn log_end(state: &ConnectionState, ticket: &Ticket, served: Result<(), String>, s: &Shared) {
    match served {
        Ok(()) => log::debug!("verbs connection from {} closed", state.peer),
        Err(why) if ticket.is_authenticated() => {
            log::info!("closing verbs connection from {}: {why}", state.peer)
        }
        Err(why) if ticket.was_evicted() => {
            log::debug!(
                "verbs connection from {} closed to make room: {why}",
                state.peer
            )
        }
        Err(why) => {
            log::debug!(
                "closing verbs connection from {} before its Hello: {why}",
                state.peer
            );
            if let Some(n) = s.pre_hello_closes.check() {
                log::info!(
                    "closing verbs connection from {} before its Hello: {why}{}",
                    state.peer,
                    and_more(n)
                );
            }
        }
    }
}

/// Answers control frames until the connection closes (Ok) or fails (Err with why).
/// `ticket` is its slot, moved from the pending connections to the authenticated
/// ones at the Hello, which must be done by `hello_deadline`.
fn serve(
    conn: &mut ServerConn,
    state: &mut ConnectionState,
    closing: &AtomicBool,
    s: &Shared,
    ticket: &mut Ticket,
    hello_deadline: Instant,
) -> Result<(), String> {
    let mut wcs = Vec::new();
    // Received frames not yet answered (a client may send before our previous
    // reply's SEND has completed; the single send slot is reused only after that).
    let mut queued: VecDeque<usize> = VecDeque::new();
    let mut lens = [0usize; RECV_DEPTH];
    let mut sending = false;
    let mut authenticated = false;
    loop {
        if closing.load(Ordering::SeqCst) || s.stopping.load(Ordering::SeqCst) {
            return Ok(());
        }
        // Checked every tick at most: the wait below is a tick long.
        if !authenticated && Instant::now() >= hello_deadline {
            return Err(format!(
                "no Hello within {:?} of connecting",
                s.limits.hello_timeout
            ));
        }
        conn.cq.wait(&mut wcs, TICK).map_err(|e| e.to_string())?;
        for wc in &wcs {
            if wc.status != ibv_wc_status::IBV_WC_SUCCESS {
                return Err(format!(
                    "work completion error ({}): the queue pair is in the error state",
                    wc_status_text(wc.status)
                ));
            }
            if wc.wr_id & RECV_TAG != 0 {
                let slot = (wc.wr_id & !RECV_TAG) as usize;
                if slot < RECV_DEPTH {
                    lens[slot] = wc.byte_len as usize;
                    queued.push_back(slot);
                }
            } else if wc.wr_id == SEND_TAG {
                sending = false;
            }
        }
        while !sending {
            let Some(slot) = queued.pop_front() else {
                break;
            };
            let frame = conn.msgs.received(slot, lens[slot]).to_vec();
            conn.msgs
                .post_recv(conn.qp.0, slot)
                .map_err(|e| e.to_string())?;
            let reply = s.control.handle(state, &frame);
            match state.client {
                Some(c) if c != conn.client => {
                    return Err(format!(
                        "Hello names client {c:016x} but the connection request named {:016x}",
                        conn.client
                    ));
                }
                Some(_) if !authenticated => {
                    // Refused when the authenticated connections are at their cap
                    // (logged there): closed without its Welcome, before any remote
                    // access is granted.
                    ticket
                        .authenticate()
                        .map_err(|e| format!("refused after its Hello: {e}"))?;
                    conn.qp.grant_remote_access().map_err(|e| e.to_string())?;
                    authenticated = true;
                }
                _ => {}
            }
            conn.msgs
                .post_send(conn.qp.0, &reply.frame)
                .map_err(|e| e.to_string())?;
            sending = true;
            if reply.close {
                // Let the reply go out before the connection closes.
                let deadline = std::time::Instant::now() + Duration::from_secs(2);
                while sending && std::time::Instant::now() < deadline {
                    conn.cq.wait(&mut wcs, TICK).map_err(|e| e.to_string())?;
                    sending = !wcs.iter().any(|wc| wc.wr_id == SEND_TAG);
                }
                return Err("control handler closed the connection".into());
            }
        }
    }
}
