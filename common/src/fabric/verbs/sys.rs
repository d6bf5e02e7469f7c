//! Owning wrappers around the verbs and rdma_cm objects the backend uses, each released
//! on Drop, plus the few helpers (errno text, socket addresses, waiting on a channel's
//! file descriptor) that every part of the backend needs.
//!
//! Drop order is the caller's duty and is fixed by field order in the structs that hold
//! these (a queue pair before its completion queue, a completion queue before its
//! channel, memory regions and queue pairs before their protection domain, everything
//! before the cm id). Each wrapper holds an `Arc` to what it must not outlive where that
//! can be shared (a memory region keeps its protection domain alive).

use crate::fabric::FabricError;
use rdma_sys::*;
use std::ffi::CStr;
use std::net::SocketAddr;
use std::os::raw::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The last OS error as text, for messages.
pub fn errno_text() -> String {
    std::io::Error::last_os_error().to_string()
}

/// A local verbs failure with what was being done.
pub fn local_err(what: &str) -> FabricError {
    FabricError::Local(format!("{what}: {}", errno_text()))
}

/// Text of a work completion status.
pub fn wc_status_text(status: ibv_wc_status::Type) -> String {
    // SAFETY: ibv_wc_status_str returns a pointer to a static string for any value
    // (an "unknown" string for values it does not know).
    unsafe { CStr::from_ptr(ibv_wc_status_str(status)) }
        .to_string_lossy()
        .into_owned()
}

/// Text of an rdma_cm event type.
pub fn event_text(event: rdma_cm_event_type::Type) -> String {
    // SAFETY: rdma_event_str returns a pointer to a static string for any value.
    unsafe { CStr::from_ptr(rdma_event_str(event)) }
        .to_string_lossy()
        .into_owned()
}

/// A socket address in the form rdma_cm takes (`sockaddr_storage`, large enough for
/// IPv4 and IPv6).
pub fn to_sockaddr(addr: &SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for
            // sockaddr_in; the write stays inside `storage`.
            unsafe { std::ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in, sin) };
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in6, sin6) };
        }
    }
    storage
}

/// Resolves "host:port" to the first socket address (numeric or by name).
pub fn resolve(hostport: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    hostport
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {hostport}: {e}"))?
        .next()
        .ok_or_else(|| format!("{hostport} resolves to no address"))
}

/// Waits until `fd` is readable or `timeout` passes; Ok(false) on timeout. EINTR is
/// treated as a spurious wake-up (Ok(false)) so callers re-check their deadlines.
pub fn wait_readable(fd: i32, timeout: Duration) -> Result<bool, String> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd, count 1.
    let n = unsafe { libc::poll(&mut pfd, 1, ms) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(format!("poll: {e}"));
    }
    Ok(n > 0)
}

/// Makes `fd` non-blocking, so a read that finds nothing fails with EAGAIN instead of
/// sleeping until something comes.
fn set_nonblocking(fd: i32, what: &str) -> Result<(), FabricError> {
    // SAFETY: fcntl on a valid fd with integer arguments.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(local_err(what));
    }
    Ok(())
}

/// Whether the last OS error says a non-blocking read found nothing.
fn would_block() -> bool {
    std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock
}

/// Names of the RDMA devices on this host; an empty list when there are none (also
/// when the kernel has no RDMA support at all, where libibverbs fails with ENOSYS).
pub fn device_names() -> Vec<String> {
    let mut n = 0;
    // SAFETY: ibv_get_device_list writes the count and returns NULL or an array of
    // `n` device pointers, freed below with ibv_free_device_list.
    let list = unsafe { ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Vec::new();
    }
    let mut names = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: i < n, so the entry is a valid device pointer; its name is a
        // NUL-terminated string owned by the device list.
        let name = unsafe { CStr::from_ptr(ibv_get_device_name(*list.add(i))) };
        names.push(name.to_string_lossy().into_owned());
    }
    // SAFETY: `list` came from ibv_get_device_list and is freed once.
    unsafe { ibv_free_device_list(list) };
    names
}

/// An rdma_cm event channel (a file descriptor rdma_cm reports connection events on).
pub struct EventChannel(pub *mut rdma_event_channel);

// SAFETY: rdma_cm event channels may be used from any thread; the backend reads each
// channel from one thread at a time.
unsafe impl Send for EventChannel {}
// SAFETY: see Send; shared references only read the fd.
unsafe impl Sync for EventChannel {}

impl EventChannel {
    /// A new channel whose fd does not block (see [`EventChannel::next`]).
    pub fn new() -> Result<EventChannel, FabricError> {
        // SAFETY: no arguments; NULL on failure.
        let ch = unsafe { rdma_create_event_channel() };
        if ch.is_null() {
            return Err(local_err("rdma_create_event_channel"));
        }
        let ch = EventChannel(ch);
        set_nonblocking(ch.fd(), "making the rdma_cm channel non-blocking")?;
        Ok(ch)
    }

    pub fn fd(&self) -> i32 {
        // SAFETY: the channel is valid while self lives.
        unsafe { (*self.0).fd }
    }

    /// The next event, if one arrives within `timeout`. The event is acknowledged
    /// before returning; what callers need from it is copied into [`CmEvent`].
    ///
    /// The fd being readable does not promise an event: destroying an id takes its
    /// unread events off the channel (the kernel's ucma does so), so a listener
    /// whose connection thread destroyed its id between the poll and the read found
    /// nothing, and a blocking read then slept forever (seen under Soft-RoCE: a
    /// listener that never finished shutting down). The fd is non-blocking, so such
    /// a read fails with EAGAIN and the wait goes on until `timeout`.
    pub fn next(&self, timeout: Duration) -> Result<Option<CmEvent>, FabricError> {
        let deadline = Instant::now() + timeout;
        let mut ev: *mut rdma_cm_event = std::ptr::null_mut();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if !wait_readable(self.fd(), left).map_err(FabricError::Local)? {
                return Ok(None);
            }
            // SAFETY: the channel is valid; its fd is non-blocking.
            if unsafe { rdma_get_cm_event(self.0, &mut ev) } == 0 {
                break;
            }
            if !would_block() {
                return Err(local_err("rdma_get_cm_event"));
            }
            if left.is_zero() {
                return Ok(None);
            }
        }
        // SAFETY: rdma_get_cm_event succeeded, so `ev` points to a valid event until
        // it is acknowledged below; for connection events `param.conn` is the
        // active member and its private data (if any) lives as long as the event.
        let out = unsafe {
            let e = &*ev;
            let conn = &e.param.conn;
            let private = if conn.private_data.is_null() || conn.private_data_len == 0 {
                Vec::new()
            } else {
                std::slice::from_raw_parts(
                    conn.private_data as *const u8,
                    conn.private_data_len as usize,
                )
                .to_vec()
            };
            CmEvent {
                id: e.id,
                event: e.event,
                status: e.status,
                private,
                initiator_depth: conn.initiator_depth,
                responder_resources: conn.responder_resources,
            }
        };
        // SAFETY: every event is acknowledged exactly once.
        unsafe { rdma_ack_cm_event(ev) };
        Ok(Some(out))
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: created by rdma_create_event_channel; every id using it has been
        // destroyed first (the owners' field order guarantees it).
        unsafe { rdma_destroy_event_channel(self.0) };
    }
}

/// What the backend keeps of an rdma_cm event after acknowledging it.
pub struct CmEvent {
    pub id: *mut rdma_cm_id,
    pub event: rdma_cm_event_type::Type,
    pub status: i32,
    pub private: Vec<u8>,
    pub initiator_depth: u8,
    pub responder_resources: u8,
}

impl CmEvent {
    pub fn describe(&self) -> String {
        format!("{} (status {})", event_text(self.event), self.status)
    }
}

/// An rdma_cm id (one connection, or a listener), destroyed on drop together with the
/// queue pair created on it.
pub struct CmId(pub *mut rdma_cm_id);

// SAFETY: rdma_cm ids may be used from any thread; the backend serialises the calls
// that need it (posting goes through the QP, which verbs makes thread-safe).
unsafe impl Send for CmId {}
// SAFETY: see Send.
unsafe impl Sync for CmId {}

impl CmId {
    pub fn new(channel: &EventChannel) -> Result<CmId, FabricError> {
        let mut id = std::ptr::null_mut();
        // SAFETY: valid channel; `id` receives the new id.
        let rc = unsafe {
            rdma_create_id(
                channel.0,
                &mut id,
                std::ptr::null_mut(),
                rdma_port_space::RDMA_PS_TCP,
            )
        };
        if rc != 0 {
            return Err(local_err("rdma_create_id"));
        }
        Ok(CmId(id))
    }

    /// The device context this id is bound to (NULL before address resolution).
    pub fn verbs(&self) -> *mut ibv_context {
        // SAFETY: the id is valid while self lives.
        unsafe { (*self.0).verbs }
    }

    pub fn qp(&self) -> *mut ibv_qp {
        // SAFETY: as above.
        unsafe { (*self.0).qp }
    }

    /// Creates the RC queue pair of this connection in `pd`, both queues on `cq`;
    /// rdma_cm owns it and moves it through its states.
    pub fn create_qp(
        &self,
        pd: &Pd,
        cq: &Cq,
        send_depth: u32,
        recv_depth: u32,
    ) -> Result<(), FabricError> {
        let mut attr = rc_qp_init_attr(cq, send_depth, recv_depth);
        // SAFETY: id, pd and cq are valid and on the same device context (the
        // callers create pd and cq from this id's context).
        if unsafe { rdma_create_qp(self.0, pd.0, &mut attr) } != 0 {
            return Err(local_err("rdma_create_qp"));
        }
        Ok(())
    }

    /// Moves the queue pair to the reset state: its work requests are dropped without
    /// completions, and the device no longer touches the buffers they named. For
    /// a queue pair whose flush never came (see `VerbsEndpoint::execute`).
    pub fn reset_qp(&self) {
        self.set_qp_state(ibv_qp_state::IBV_QPS_RESET);
    }

    /// Moves the queue pair to the error state: every outstanding work request
    /// completes (flushed) and the peer can no longer reach local memory through it.
    pub fn fail_qp(&self) {
        self.set_qp_state(ibv_qp_state::IBV_QPS_ERR);
    }

    fn set_qp_state(&self, state: ibv_qp_state::Type) {
        let qp = self.qp();
        if qp.is_null() {
            return;
        }
        // SAFETY: all-zero is a valid ibv_qp_attr; only qp_state is used (mask).
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = state;
        // SAFETY: valid QP; moving to ERR or RESET is allowed from every state.
        unsafe { ibv_modify_qp(qp, &mut attr, ibv_qp_attr_mask::IBV_QP_STATE.0 as i32) };
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: the QP (if any) is destroyed before the id; both were created on
        // this id; every event of the id has been acknowledged (EventChannel::next
        // acknowledges at once).
        unsafe {
            if !(*self.0).qp.is_null() {
                rdma_destroy_qp(self.0);
            }
            rdma_destroy_id(self.0);
        }
    }
}

/// The attributes of an RC queue pair with both queues on `cq`, one scatter entry
/// per work request, completions only for signalled requests.
fn rc_qp_init_attr(cq: &Cq, send_depth: u32, recv_depth: u32) -> ibv_qp_init_attr {
    // SAFETY: all-zero is a valid ibv_qp_init_attr; the fields that matter are set.
    let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    attr.send_cq = cq.cq;
    attr.recv_cq = cq.cq;
    attr.qp_type = ibv_qp_type::IBV_QPT_RC;
    attr.cap.max_send_wr = send_depth;
    attr.cap.max_recv_wr = recv_depth;
    attr.cap.max_send_sge = 1;
    attr.cap.max_recv_sge = 1;
    attr.sq_sig_all = 0;
    attr
}

/// An RC queue pair the passive side owns and moves through its states itself,
/// destroyed on drop (before the CQ it uses and its protection domain: owners' field
/// order).
///
/// Why not rdma_cm's own queue pair: `rdma_accept` takes such a QP through INIT, RTR
/// and RTS with the access the kernel's CM hands out, which always includes remote
/// WRITE (and READ when the peer asked for responder resources), and sends its
/// answer in the same call. The peer can post a WRITE the moment it sees the
/// connection established, before this side could take the access back. A QP made
/// here reaches RTS with no remote access at all, before the answer goes out.
pub struct Qp(pub *mut ibv_qp);

// SAFETY: see Pd; verbs QPs may be posted to and modified from any thread.
unsafe impl Send for Qp {}

impl Qp {
    /// A queue pair in `pd` on `cq` for the connection request of `id`, ready to
    /// send and receive (RTS) but granting no remote access. `responder_resources`
    /// and `initiator_depth` are what this side will put in its `rdma_accept`, whose
    /// `qp_num` must be this QP's.
    pub fn for_connection_request(
        id: &CmId,
        pd: &Pd,
        cq: &Cq,
        depths: (u32, u32),
        responder_resources: u8,
        initiator_depth: u8,
    ) -> Result<Qp, FabricError> {
        let mut init = rc_qp_init_attr(cq, depths.0, depths.1);
        // SAFETY: pd and cq are valid and on the same device context.
        let qp = unsafe { ibv_create_qp(pd.0, &mut init) };
        if qp.is_null() {
            return Err(local_err("ibv_create_qp"));
        }
        let qp = Qp(qp);
        qp.modify_from_cm(id, ibv_qp_state::IBV_QPS_INIT, |attr| {
            attr.qp_access_flags = 0
        })?;
        qp.modify_from_cm(id, ibv_qp_state::IBV_QPS_RTR, |attr| {
            attr.max_dest_rd_atomic = responder_resources
        })?;
        qp.modify_from_cm(id, ibv_qp_state::IBV_QPS_RTS, |attr| {
            attr.max_rd_atomic = initiator_depth
        })?;
        Ok(qp)
    }

    /// Moves the QP to `state` with the attributes rdma_cm computes for `id` (path,
    /// peer QP number, PSNs, ...), after `adjust` changed what this side decides.
    fn modify_from_cm(
        &self,
        id: &CmId,
        state: ibv_qp_state::Type,
        adjust: impl FnOnce(&mut ibv_qp_attr),
    ) -> Result<(), FabricError> {
        // SAFETY: all-zero is a valid ibv_qp_attr to be filled.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = state;
        let mut mask = 0;
        // SAFETY: valid id with a connection request; attr and mask are out values.
        if unsafe { rdma_init_qp_attr(id.0, &mut attr, &mut mask) } != 0 {
            return Err(local_err("rdma_init_qp_attr"));
        }
        // Bits 21-24 are reserved in the kernel's mask: old kernels put RoCE fields
        // there that ibv_modify_qp does not take. librdmacm clears 21-23, and only on
        // an InfiniBand link; clearing 21-24 always is safe, as no current kernel sets
        // them on any link.
        mask &= !0x01e0_0000;
        adjust(&mut attr);
        self.modify(&mut attr, mask, &format!("to state {state}"))
    }

    /// Grants remote READ and WRITE (the QP was made without any, see
    /// [`Qp::for_connection_request`]).
    pub fn grant_remote_access(&self) -> Result<(), FabricError> {
        // SAFETY: all-zero is a valid ibv_qp_attr; only the access flags are used.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_access_flags = ibv_access_flags::IBV_ACCESS_REMOTE_READ.0
            | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        let mask = ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS.0 as i32;
        // Changing only the access flags is allowed in RTS.
        self.modify(&mut attr, mask, "access flags")
    }

    fn modify(&self, attr: &mut ibv_qp_attr, mask: i32, what: &str) -> Result<(), FabricError> {
        // SAFETY: valid QP; the caller's attributes and mask suit its state.
        let rc = unsafe { ibv_modify_qp(self.0, attr, mask) };
        if rc != 0 {
            return Err(FabricError::Local(format!(
                "ibv_modify_qp({what}): {}",
                std::io::Error::from_raw_os_error(rc)
            )));
        }
        Ok(())
    }

    /// This QP's number, for `rdma_conn_param::qp_num`.
    pub fn num(&self) -> u32 {
        // SAFETY: valid QP.
        unsafe { (*self.0).qp_num }
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_qp and destroyed once.
        unsafe { ibv_destroy_qp(self.0) };
    }
}

/// A protection domain.
pub struct Pd(pub *mut ibv_pd);

// SAFETY: verbs objects are thread-safe to use and to free from any thread.
unsafe impl Send for Pd {}
// SAFETY: see Send.
unsafe impl Sync for Pd {}

impl Pd {
    pub fn new(ctx: *mut ibv_context) -> Result<Arc<Pd>, FabricError> {
        // SAFETY: ctx is a valid open device context (from an rdma_cm id).
        let pd = unsafe { ibv_alloc_pd(ctx) };
        if pd.is_null() {
            return Err(local_err("ibv_alloc_pd"));
        }
        Ok(Arc::new(Pd(pd)))
    }

    pub fn context(&self) -> *mut ibv_context {
        // SAFETY: valid PD.
        unsafe { (*self.0).context }
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: every MR and QP of this PD holds an Arc to it (or is owned by a
        // struct that drops it first), so none is left when the last Arc goes.
        unsafe { ibv_dealloc_pd(self.0) };
    }
}

/// Access a memory region grants.
pub const LOCAL_ONLY: u32 = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
pub const REMOTE_RW: u32 = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
    | ibv_access_flags::IBV_ACCESS_REMOTE_READ.0
    | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;

/// A registered memory region; deregistered on drop (after which the device no
/// longer touches the memory).
pub struct Mr {
    mr: *mut ibv_mr,
    _pd: Arc<Pd>,
}

// SAFETY: see Pd.
unsafe impl Send for Mr {}
// SAFETY: see Pd.
unsafe impl Sync for Mr {}

impl Mr {
    /// Registers `[addr, addr + len)`.
    ///
    /// # Safety
    /// The memory must stay mapped until the Mr is dropped.
    pub unsafe fn register(
        pd: &Arc<Pd>,
        addr: *mut u8,
        len: usize,
        access: u32,
    ) -> Result<Mr, FabricError> {
        // SAFETY: valid PD; the memory contract is the caller's.
        let mr = unsafe { ibv_reg_mr(pd.0, addr as *mut c_void, len, access as i32) };
        if mr.is_null() {
            return Err(FabricError::Local(format!(
                "cannot register {len} bytes at {addr:p} with the RDMA device: {} \
                 (is `ulimit -l` large enough?)",
                errno_text()
            )));
        }
        Ok(Mr {
            mr,
            _pd: pd.clone(),
        })
    }

    pub fn lkey(&self) -> u32 {
        // SAFETY: valid MR.
        unsafe { (*self.mr).lkey }
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: valid MR.
        unsafe { (*self.mr).rkey }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered by ibv_reg_mr, deregistered once; queue pairs that
        // might still use it are the owners' concern (they drop first).
        unsafe { ibv_dereg_mr(self.mr) };
    }
}

/// What the backend keeps of a work completion (`ibv_wc` is not `Clone`).
#[derive(Debug, Clone, Copy)]
pub struct Wc {
    pub wr_id: u64,
    pub status: ibv_wc_status::Type,
    pub byte_len: u32,
}

/// A completion queue with its own completion channel, so a thread can sleep until
/// completions arrive (or a deadline passes) instead of spinning.
pub struct Cq {
    pub cq: *mut ibv_cq,
    channel: *mut ibv_comp_channel,
    /// Completion events received and not yet acknowledged (acknowledged in batches
    /// and before destruction, as ibv_destroy_cq requires).
    unacked: u32,
}

// SAFETY: see Pd; each Cq is polled from one thread at a time (its owner's).
unsafe impl Send for Cq {}

impl Cq {
    pub fn new(ctx: *mut ibv_context, depth: i32) -> Result<Cq, FabricError> {
        // SAFETY: valid context.
        let channel = unsafe { ibv_create_comp_channel(ctx) };
        if channel.is_null() {
            return Err(local_err("ibv_create_comp_channel"));
        }
        // SAFETY: valid context and channel.
        let cq = unsafe { ibv_create_cq(ctx, depth, std::ptr::null_mut(), channel, 0) };
        if cq.is_null() {
            let e = local_err("ibv_create_cq");
            // SAFETY: the channel has no CQ yet.
            unsafe { ibv_destroy_comp_channel(channel) };
            return Err(e);
        }
        let cq = Cq {
            cq,
            channel,
            unacked: 0,
        };
        // Only this CQ's owner reads the channel, so a readable fd has an event; the
        // fd does not block all the same, so that could never turn into a sleep
        // without a deadline.
        set_nonblocking(cq.fd(), "making the completion channel non-blocking")?;
        cq.arm()?;
        Ok(cq)
    }

    fn arm(&self) -> Result<(), FabricError> {
        // SAFETY: valid CQ.
        if unsafe { ibv_req_notify_cq(self.cq, 0) } != 0 {
            return Err(local_err("ibv_req_notify_cq"));
        }
        Ok(())
    }

    pub fn fd(&self) -> i32 {
        // SAFETY: valid channel.
        unsafe { (*self.channel).fd }
    }

    /// Takes every completion available now into `out` (cleared first), sleeping up
    /// to `timeout` for the first one. Re-arms notification before the final poll,
    /// so no completion can slip between a poll and the sleep.
    pub fn wait(&mut self, out: &mut Vec<Wc>, timeout: Duration) -> Result<(), FabricError> {
        out.clear();
        self.drain(out)?;
        if !out.is_empty() {
            return Ok(());
        }
        if wait_readable(self.fd(), timeout).map_err(FabricError::Local)? {
            let mut cq = std::ptr::null_mut();
            let mut ctx = std::ptr::null_mut();
            // SAFETY: valid channel with a non-blocking fd; an event names our CQ
            // (the channel serves one CQ). Nothing read (EAGAIN) is a spurious
            // wake-up: the polls around it find what there is.
            if unsafe { ibv_get_cq_event(self.channel, &mut cq, &mut ctx) } == 0 {
                self.unacked += 1;
                if self.unacked >= 64 {
                    // SAFETY: acknowledging events this CQ received.
                    unsafe { ibv_ack_cq_events(self.cq, self.unacked) };
                    self.unacked = 0;
                }
            }
            self.arm()?;
        }
        self.drain(out)
    }

    fn drain(&mut self, out: &mut Vec<Wc>) -> Result<(), FabricError> {
        loop {
            // SAFETY: all-zero is a valid ibv_wc to be overwritten.
            let mut wcs: [ibv_wc; 32] = unsafe { std::mem::zeroed() };
            // SAFETY: valid CQ; the array holds 32 entries.
            let n = unsafe { ibv_poll_cq(self.cq, wcs.len() as i32, wcs.as_mut_ptr()) };
            if n < 0 {
                return Err(local_err("ibv_poll_cq"));
            }
            out.extend(wcs[..n as usize].iter().map(|wc| Wc {
                wr_id: wc.wr_id,
                status: wc.status,
                byte_len: wc.byte_len,
            }));
            if (n as usize) < wcs.len() {
                return Ok(());
            }
        }
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: the QP using this CQ is destroyed first (owners' field order);
        // outstanding events are acknowledged before the CQ is destroyed, and the
        // channel after its CQ.
        unsafe {
            if self.unacked > 0 {
                ibv_ack_cq_events(self.cq, self.unacked);
            }
            ibv_destroy_cq(self.cq);
            ibv_destroy_comp_channel(self.channel);
        }
    }
}

/// Limits of a device that connection setup needs.
pub struct DeviceLimits {
    /// RDMA READs one QP may have outstanding as initiator / serve as responder.
    pub max_rd_atomic: u8,
    pub max_qp_wr: u32,
}

pub fn device_limits(ctx: *mut ibv_context) -> Result<DeviceLimits, FabricError> {
    // SAFETY: all-zero is a valid ibv_device_attr to be filled.
    let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
    // SAFETY: valid context and out pointer.
    if unsafe { ibv_query_device(ctx, &mut attr) } != 0 {
        return Err(local_err("ibv_query_device"));
    }
    let rd = attr
        .max_qp_rd_atom
        .min(attr.max_qp_init_rd_atom)
        .clamp(1, 16);
    Ok(DeviceLimits {
        max_rd_atomic: rd as u8,
        max_qp_wr: attr.max_qp_wr.max(1) as u32,
    })
}
