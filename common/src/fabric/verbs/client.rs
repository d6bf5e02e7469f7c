//! Active side of the verbs backend: one RC queue pair to a memnode.
//!
//! Setup is rdma_cm's: resolve address and route, create the QP in the process's
//! shared protection domain for the device ([`super::local`]), post the receive slots,
//! connect with private data naming the client (the memnode puts its end of the QP in
//! that client's protection domain).
//!
//! Posting: [`VerbsEndpoint::execute`] posts a whole batch of READ/WRITE work requests
//! (each signalled, chained into as few `ibv_post_send` calls as send-queue credits
//! allow) and then sleeps until all have completed. A poller thread sleeps on the
//! completion channel, records each completion under its work-request id and wakes
//! the waiters; it also watches the connection's rdma_cm events for a disconnect.
//!
//! Buffers are used in place: an RDMA READ lands directly in the caller's buffer. The
//! caller's borrow therefore must not end while the device can still touch it, so a
//! batch that times out first moves the QP to the error state, which flushes every
//! outstanding work request, and returns only after its requests have completed
//! (flushed). After any error completion an RC QP is in the error state: the endpoint
//! is then dead and later operations fail with `Disconnected`.

use super::local::{local_pd, LocalPd};
use super::messages::{Messages, RECV_DEPTH, RECV_TAG, SEND_TAG};
use super::sys::*;
use super::PRIVATE_MAGIC;
use crate::fabric::{Endpoint, FabricError, RdmaOp, MAX_DATA_OP};
use crate::sync::{lock, wait_timeout};
use rdma_sys::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Send-queue depth asked for (capped by the device).
const SEND_DEPTH: u32 = 256;
/// How often the poller looks at the rdma_cm channel and the stop flag.
const POLL_TICK: Duration = Duration::from_millis(50);

/// How one work request completed.
#[derive(Clone, Copy, Debug)]
enum Completion {
    Ok,
    Failed(ibv_wc_status::Type),
}

struct State {
    next_wr: u64,
    /// One-sided operations posted and not yet collected: wr_id -> completion.
    pending: HashMap<u64, Option<Completion>>,
    /// Send-queue slots free for one-sided operations.
    credits: usize,
    /// The reply to the control call in progress.
    reply: Option<Vec<u8>>,
    /// Why the connection is unusable, once it is.
    dead: Option<String>,
}

struct Inner {
    peer: String,
    timeout: Duration,
    state: Mutex<State>,
    cond: Condvar,
    /// One control call at a time (one send slot, one reply awaited).
    call_lock: Mutex<()>,
    stop: AtomicBool,
    // Verbs objects in drop order: the QP (inside the id) first, then its CQ, the
    // message buffers, the id's event channel, the protection domain.
    id: CmId,
    cq: Mutex<Cq>,
    msgs: Mutex<Messages>,
    channel: EventChannel,
    pd: Arc<LocalPd>,
}

/// A verbs connection to one memnode.
pub struct VerbsEndpoint {
    inner: Arc<Inner>,
    poller: Option<JoinHandle<()>>,
}

/// Destroys a connection's QP on early return from setup, before the CQ and the
/// buffers it uses are dropped.
struct QpGuard<'a>(&'a CmId);

impl Drop for QpGuard<'_> {
    fn drop(&mut self) {
        if !self.0.qp().is_null() {
            // SAFETY: the QP was created on this id and nothing else uses it yet;
            // rdma_destroy_qp clears id->qp, so CmId's drop does not destroy it twice.
            unsafe { rdma_destroy_qp(self.0 .0) };
        }
    }
}

/// Waits for the next rdma_cm event on `channel` and checks it is `want`.
fn expect_event(
    channel: &EventChannel,
    want: rdma_cm_event_type::Type,
    deadline: Instant,
) -> Result<CmEvent, String> {
    let left = deadline.saturating_duration_since(Instant::now());
    match channel.next(left).map_err(|e| e.to_string())? {
        None => Err(format!("no {} within the timeout", event_text(want))),
        Some(ev) if ev.event == want => Ok(ev),
        Some(ev) if ev.event == rdma_cm_event_type::RDMA_CM_EVENT_REJECTED => Err(format!(
            "rejected by the memnode{}",
            if ev.status == 28 {
                " (the peer has no listener on that port, or refused the client)".to_string()
            } else {
                format!(" (status {})", ev.status)
            }
        )),
        Some(ev) => Err(format!(
            "expected {}, got {}",
            event_text(want),
            ev.describe()
        )),
    }
}

impl VerbsEndpoint {
    /// Connects to the memnode at `peer` ("host:port") as `client_id`.
    pub fn connect(
        peer: &str,
        client_id: u64,
        timeout: Duration,
    ) -> Result<Box<dyn Endpoint>, FabricError> {
        let err = |reason: String| FabricError::Connect {
            peer: peer.to_string(),
            reason,
        };
        let deadline = Instant::now() + timeout;
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        let mut dst = to_sockaddr(&resolve(peer).map_err(err)?);
        let channel = EventChannel::new()?;
        let id = CmId::new(&channel)?;
        // SAFETY: valid id; dst is a valid socket address of the right family.
        if unsafe { rdma_resolve_addr(id.0, std::ptr::null_mut(), &mut dst as *mut _ as _, ms) }
            != 0
        {
            return Err(err(format!("rdma_resolve_addr: {}", errno_text())));
        }
        expect_event(
            &channel,
            rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED,
            deadline,
        )
        .map_err(err)?;
        // SAFETY: valid id with a resolved address.
        if unsafe { rdma_resolve_route(id.0, ms) } != 0 {
            return Err(err(format!("rdma_resolve_route: {}", errno_text())));
        }
        expect_event(
            &channel,
            rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_RESOLVED,
            deadline,
        )
        .map_err(err)?;
        let ctx = id.verbs();
        let limits = device_limits(ctx)?;
        let pd = local_pd(ctx)?;
        let depth = SEND_DEPTH.min(limits.max_qp_wr);
        let cq = Cq::new(ctx, (depth as usize + RECV_DEPTH) as i32)?;
        id.create_qp(&pd.pd, &cq, depth, RECV_DEPTH as u32)?;
        let msgs = Messages::new(&pd.pd)?;
        let guard = QpGuard(&id);
        msgs.post_all_recvs(id.qp())?;

        let mut private = [0u8; 12];
        private[..4].copy_from_slice(PRIVATE_MAGIC);
        private[4..].copy_from_slice(&client_id.to_le_bytes());
        // SAFETY: all-zero is a valid rdma_conn_param; the fields used are set.
        let mut param: rdma_conn_param = unsafe { std::mem::zeroed() };
        param.private_data = private.as_ptr() as *const _;
        param.private_data_len = private.len() as u8;
        param.initiator_depth = limits.max_rd_atomic;
        param.responder_resources = limits.max_rd_atomic;
        param.retry_count = 7;
        param.rnr_retry_count = 7;
        // SAFETY: valid id with a QP; param and its private data live across the call.
        if unsafe { rdma_connect(id.0, &mut param) } != 0 {
            return Err(err(format!("rdma_connect: {}", errno_text())));
        }
        expect_event(
            &channel,
            rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED,
            deadline,
        )
        .map_err(err)?;
        std::mem::forget(guard);

        let inner = Arc::new(Inner {
            peer: peer.to_string(),
            timeout,
            state: Mutex::new(State {
                next_wr: 1,
                pending: HashMap::new(),
                // Two send-queue slots stay free for control SENDs (one may still be
                // completing when the next is posted).
                credits: depth.saturating_sub(2).max(1) as usize,
                reply: None,
                dead: None,
            }),
            cond: Condvar::new(),
            call_lock: Mutex::new(()),
            stop: AtomicBool::new(false),
            id,
            cq: Mutex::new(cq),
            msgs: Mutex::new(msgs),
            channel,
            pd,
        });
        let i = inner.clone();
        let poller = std::thread::Builder::new()
            .name(format!("verbs-cq {peer}"))
            .spawn(move || poll_loop(&i))
            .map_err(|e| err(format!("cannot start the completion thread: {e}")))?;
        log::debug!("verbs connection to {peer} established");
        Ok(Box::new(VerbsEndpoint {
            inner,
            poller: Some(poller),
        }))
    }
}

impl Inner {
    /// Marks the connection dead (first reason wins) and flushes the QP so every
    /// outstanding work request completes.
    fn kill(&self, st: &mut State, reason: String) {
        if st.dead.is_none() {
            // Flushes after this side closed are expected, not news.
            if !self.stop.load(Ordering::SeqCst) {
                log::warn!("verbs connection to {}: {reason}", self.peer);
            }
            st.dead = Some(reason);
            self.id.fail_qp();
        }
        self.cond.notify_all();
    }

    fn disconnected(&self, st: &State) -> FabricError {
        FabricError::Disconnected {
            peer: self.peer.clone(),
            reason: st.dead.clone().unwrap_or_else(|| "closed".into()),
        }
    }

    fn on_completion(&self, wc: &Wc) {
        let mut st = lock(&self.state);
        let ok = wc.status == ibv_wc_status::IBV_WC_SUCCESS;
        if wc.wr_id & RECV_TAG != 0 {
            if !ok {
                let why = format!("receive failed: {}", wc_status_text(wc.status));
                self.kill(&mut st, why);
                return;
            }
            let slot = (wc.wr_id & !RECV_TAG) as usize;
            let msgs = lock(&self.msgs);
            st.reply = Some(msgs.received(slot, wc.byte_len as usize).to_vec());
            if let Err(e) = msgs.post_recv(self.id.qp(), slot) {
                drop(msgs);
                self.kill(&mut st, format!("cannot repost a receive: {e}"));
            }
        } else if wc.wr_id == SEND_TAG {
            if !ok {
                let why = format!("SEND failed: {}", wc_status_text(wc.status));
                self.kill(&mut st, why);
            }
        } else if let Some(slot) = st.pending.get_mut(&wc.wr_id) {
            *slot = Some(if ok {
                Completion::Ok
            } else {
                Completion::Failed(wc.status)
            });
            st.credits += 1;
            if !ok && wc.status != ibv_wc_status::IBV_WC_WR_FLUSH_ERR {
                // Any error completion leaves an RC QP in the error state.
                let why = format!(
                    "queue pair in error state after {}",
                    wc_status_text(wc.status)
                );
                self.kill(&mut st, why);
            }
        }
        self.cond.notify_all();
    }

    fn wait_until<'a>(
        &self,
        mut st: MutexGuard<'a, State>,
        deadline: Instant,
        done: impl Fn(&State) -> bool,
    ) -> (MutexGuard<'a, State>, bool) {
        loop {
            if done(&st) {
                return (st, true);
            }
            let now = Instant::now();
            if now >= deadline {
                return (st, false);
            }
            let (g, _) = wait_timeout(&self.cond, st, deadline - now);
            st = g;
        }
    }
}

fn poll_loop(inner: &Inner) {
    let mut wcs = Vec::new();
    while !inner.stop.load(Ordering::SeqCst) {
        let r = lock(&inner.cq).wait(&mut wcs, POLL_TICK);
        if let Err(e) = r {
            let mut st = lock(&inner.state);
            inner.kill(&mut st, format!("completion queue failed: {e}"));
            drop(st);
            std::thread::sleep(POLL_TICK);
            continue;
        }
        for wc in &wcs {
            inner.on_completion(wc);
        }
        match inner.channel.next(Duration::ZERO) {
            Ok(Some(ev)) => {
                drain_before_disconnect(inner, &mut wcs);
                let mut st = lock(&inner.state);
                inner.kill(&mut st, format!("connection event {}", ev.describe()));
            }
            Ok(None) => {}
            Err(e) => log::debug!("rdma_cm channel of {}: {e}", inner.peer),
        }
    }
}

/// How long completions are still taken in once the peer's disconnect is seen.
const DISCONNECT_GRACE: Duration = Duration::from_millis(50);

/// Takes in the completions that came before the peer's disconnect: a reply the
/// memnode sent just before it closed must reach its call, not be lost to the
/// disconnect. The connection event comes on its own channel, so it can be seen
/// before the receive's completion is polled (Soft-RoCE did so now and then);
/// polls until a look finds nothing after [`DISCONNECT_GRACE`] / 5, at most for
/// [`DISCONNECT_GRACE`].
fn drain_before_disconnect(inner: &Inner, wcs: &mut Vec<Wc>) {
    let start = Instant::now();
    let tick = DISCONNECT_GRACE / 5;
    while start.elapsed() < DISCONNECT_GRACE {
        if lock(&inner.cq).wait(wcs, tick).is_err() {
            return;
        }
        if wcs.is_empty() && start.elapsed() >= tick {
            return;
        }
        for wc in wcs.iter() {
            inner.on_completion(wc);
        }
    }
}

/// Maps an error completion of a one-sided operation to the fabric's error.
fn op_error(inner: &Inner, status: ibv_wc_status::Type, op: &RdmaOp<'_>) -> FabricError {
    let remote = op.remote();
    match status {
        // A bad rkey, range or protection domain is a remote access error; a queue
        // pair that grants no remote access yet (no Hello) answers with an invalid
        // request error. Both mean the memnode refused the access and touched nothing.
        ibv_wc_status::IBV_WC_REM_ACCESS_ERR | ibv_wc_status::IBV_WC_REM_INV_REQ_ERR => {
            FabricError::RemoteAccess {
                addr: remote.addr,
                rkey: remote.rkey,
                len: op.len(),
            }
        }
        ibv_wc_status::IBV_WC_RETRY_EXC_ERR => FabricError::Disconnected {
            peer: inner.peer.clone(),
            reason: "transport retries exceeded: the memnode does not answer".into(),
        },
        ibv_wc_status::IBV_WC_WR_FLUSH_ERR => FabricError::Disconnected {
            peer: inner.peer.clone(),
            reason: "work request flushed: the queue pair is in the error state".into(),
        },
        s => FabricError::Disconnected {
            peer: inner.peer.clone(),
            reason: format!("work completion error: {}", wc_status_text(s)),
        },
    }
}

impl Endpoint for VerbsEndpoint {
    fn execute(&self, ops: &mut [RdmaOp<'_>]) -> Vec<Result<(), FabricError>> {
        let inner = &*self.inner;
        let deadline = Instant::now() + inner.timeout;
        let mut results: Vec<Option<Result<(), FabricError>>> = ops.iter().map(|_| None).collect();
        // Scatter entries and, for buffers outside registered memory, the
        // registrations made for this batch (kept until every completion is in).
        let mut sges: Vec<ibv_sge> = Vec::with_capacity(ops.len());
        let mut adhoc: Vec<Mr> = Vec::new();
        let mut to_post: Vec<usize> = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter_mut().enumerate() {
            // A WRITE's source may be read-only memory (a constant): the device only
            // reads it, so it is registered without local write access.
            let (ptr, len, access) = match op {
                RdmaOp::Read { local, .. } => (local.as_mut_ptr(), local.len(), LOCAL_ONLY),
                RdmaOp::Write { local, .. } => (local.as_ptr() as *mut u8, local.len(), 0),
            };
            let mut sge = ibv_sge {
                addr: ptr as u64,
                length: len as u32,
                lkey: 0,
            };
            if len > MAX_DATA_OP {
                results[i] = Some(Err(FabricError::Invalid(format!(
                    "operation of {len} bytes exceeds {MAX_DATA_OP}"
                ))));
            } else if len > 0 {
                match inner.pd.lkey_for(ptr, len) {
                    Some(lkey) => sge.lkey = lkey,
                    // SAFETY: the buffer is borrowed for this whole call, and the
                    // registration is dropped before the call returns, after the
                    // operation's completion.
                    None => match unsafe { Mr::register(&inner.pd.pd, ptr, len, access) } {
                        Ok(mr) => {
                            sge.lkey = mr.lkey();
                            adhoc.push(mr);
                        }
                        Err(e) => results[i] = Some(Err(e)),
                    },
                }
            }
            sges.push(sge);
            if results[i].is_none() {
                to_post.push(i);
            }
        }

        let mut posted: Vec<(usize, u64)> = Vec::with_capacity(to_post.len());
        let mut st = lock(&inner.state);
        let mut timed_out = false;
        let mut next = 0;
        while next < to_post.len() {
            let (g, ok) = inner.wait_until(st, deadline, |s| s.credits > 0 || s.dead.is_some());
            st = g;
            if st.dead.is_some() {
                break;
            }
            if !ok {
                timed_out = true;
                break;
            }
            let n = st.credits.min(to_post.len() - next);
            // SAFETY: all-zero is a valid ibv_send_wr; the fields used are set.
            let mut wrs: Vec<ibv_send_wr> = (0..n).map(|_| unsafe { std::mem::zeroed() }).collect();
            for k in 0..n {
                let i = to_post[next + k];
                let wr_id = st.next_wr;
                st.next_wr += 1;
                let remote = ops[i].remote();
                let wr = &mut wrs[k];
                wr.wr_id = wr_id;
                wr.sg_list = &mut sges[i];
                wr.num_sge = if ops[i].is_empty() { 0 } else { 1 };
                wr.opcode = match ops[i] {
                    RdmaOp::Read { .. } => ibv_wr_opcode::IBV_WR_RDMA_READ,
                    RdmaOp::Write { .. } => ibv_wr_opcode::IBV_WR_RDMA_WRITE,
                };
                wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
                wr.wr.rdma = rdma_t {
                    remote_addr: remote.addr,
                    rkey: remote.rkey,
                };
                posted.push((i, wr_id));
                st.pending.insert(wr_id, None);
            }
            for k in 0..n.saturating_sub(1) {
                let next_wr: *mut ibv_send_wr = &mut wrs[k + 1];
                wrs[k].next = next_wr;
            }
            st.credits -= n;
            let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
            // SAFETY: valid QP; the chain, its scatter entries and the buffers they
            // name (registered) stay alive until every completion is collected below.
            let rc = unsafe { ibv_post_send(inner.id.qp(), wrs.as_mut_ptr(), &mut bad) };
            if rc != 0 {
                // Requests from `bad` on were not posted: they will never complete.
                let first_bad = if bad.is_null() {
                    0
                } else {
                    (bad as usize - wrs.as_ptr() as usize) / std::mem::size_of::<ibv_send_wr>()
                };
                for wr in &wrs[first_bad..] {
                    st.pending.remove(&wr.wr_id);
                    st.credits += 1;
                }
                let kept = posted.len() - (n - first_bad);
                posted.truncate(kept);
                let why = format!(
                    "ibv_post_send failed: {}",
                    std::io::Error::from_raw_os_error(rc)
                );
                inner.kill(&mut st, why);
                break;
            }
            next += n;
        }

        // Collect: every posted request completes, by success, error or flush.
        let all_in = |s: &State| {
            posted
                .iter()
                .all(|(_, id)| matches!(s.pending.get(id), Some(Some(_))))
        };
        let (g, ok) = inner.wait_until(st, deadline, all_in);
        st = g;
        if !ok {
            timed_out = true;
            let why = format!("no completion within {:?}", inner.timeout);
            inner.kill(&mut st, why);
            // The device may still write into our buffers until the flush is in, so
            // wait for it; but not forever. Soft-RoCE (rdma_rxe of Linux 6.1) was seen
            // to leave a batch neither completed nor flushed after a refused
            // operation, and this call then never returned. A queue pair in the reset
            // state no longer touches any buffer, so after another timeout's worth
            // the queue pair is reset and the missing ones fail like the rest.
            let (g, flushed) = inner.wait_until(st, Instant::now() + inner.timeout, all_in);
            st = g;
            if !flushed {
                log::warn!(
                    "verbs connection to {}: work requests neither completed nor flushed \
                     within {:?}; resetting the queue pair",
                    inner.peer,
                    inner.timeout
                );
                inner.id.reset_qp();
            }
        }
        let mut completions: HashMap<usize, Completion> = HashMap::with_capacity(posted.len());
        for (i, id) in &posted {
            if let Some(Some(c)) = st.pending.remove(id) {
                completions.insert(*i, c);
            }
        }
        let dead = st.dead.is_some().then(|| inner.disconnected(&st));
        drop(st);
        drop(adhoc);

        let timeout_err = FabricError::Timeout {
            peer: inner.peer.clone(),
            after: inner.timeout,
        };
        results
            .into_iter()
            .enumerate()
            .map(|(i, r)| match r {
                Some(r) => r,
                None => match completions.get(&i) {
                    Some(Completion::Ok) => Ok(()),
                    Some(Completion::Failed(ibv_wc_status::IBV_WC_WR_FLUSH_ERR)) if timed_out => {
                        Err(timeout_err.clone())
                    }
                    Some(Completion::Failed(s)) => Err(op_error(inner, *s, &ops[i])),
                    None if timed_out => Err(timeout_err.clone()),
                    None => Err(dead.clone().unwrap_or_else(|| timeout_err.clone())),
                },
            })
            .collect()
    }

    fn call(&self, frame: &[u8]) -> Result<Vec<u8>, FabricError> {
        let inner = &*self.inner;
        let _one_at_a_time = lock(&inner.call_lock);
        let deadline = Instant::now() + inner.timeout;
        let mut st = lock(&inner.state);
        if st.dead.is_some() {
            return Err(inner.disconnected(&st));
        }
        st.reply = None;
        if let Err(e) = lock(&inner.msgs).post_send(inner.id.qp(), frame) {
            if matches!(e, FabricError::Invalid(_)) {
                return Err(e);
            }
            inner.kill(&mut st, e.to_string());
            return Err(inner.disconnected(&st));
        }
        let (mut st, ok) =
            inner.wait_until(st, deadline, |s| s.reply.is_some() || s.dead.is_some());
        if let Some(reply) = st.reply.take() {
            return Ok(reply);
        }
        if !ok {
            // A late reply would be taken for the next call's: the connection is
            // unusable from here on.
            let why = format!("no reply to a control request within {:?}", inner.timeout);
            inner.kill(&mut st, why);
            return Err(FabricError::Timeout {
                peer: inner.peer.clone(),
                after: inner.timeout,
            });
        }
        Err(inner.disconnected(&st))
    }

    fn peer(&self) -> &str {
        &self.inner.peer
    }

    fn is_connected(&self) -> bool {
        lock(&self.inner.state).dead.is_none()
    }
}

impl Drop for VerbsEndpoint {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        // SAFETY: valid connected (or failed) id; tells the memnode at once.
        unsafe { rdma_disconnect(self.inner.id.0) };
        {
            let mut st = lock(&self.inner.state);
            if st.dead.is_none() {
                st.dead = Some("closed by this side".into());
            }
        }
        if let Some(p) = self.poller.take() {
            let _ = p.join();
        }
    }
}
