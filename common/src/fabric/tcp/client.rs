//! Active side of the tcp backend.
//!
//! Posting: a caller registers one completion slot per operation in the pending map,
//! then writes all request headers and payloads under the writer lock (a batch goes
//! out back to back), then waits on its slots with a deadline.
//!
//! Completing: one reader thread per connection reads completion headers, removes the
//! matching slot from the pending map and fills it. A READ's payload is handed over as
//! a buffer that the waiting caller copies into its own memory, so no thread ever
//! writes into memory a caller may already have given up on after a timeout.
//!
//! When the stream breaks, the reader fails every pending slot with `Disconnected` and
//! marks the endpoint dead; later posts fail at once.
//!
//! Lock order: `pending` is never held while taking `writer` or a slot's lock.

use super::wire::*;
use crate::fabric::{Endpoint, FabricError, RdmaOp, MAX_DATA_OP};
use crate::protocol::MAX_CONTROL_FRAME;
use std::collections::HashMap;
use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

type Completion = Result<Vec<u8>, FabricError>;

#[derive(Default)]
struct Slot {
    result: Mutex<Option<Completion>>,
    ready: Condvar,
}

impl Slot {
    fn complete(&self, c: Completion) {
        *lock(&self.result) = Some(c);
        self.ready.notify_all();
    }

    fn wait(&self, deadline: Instant) -> Option<Completion> {
        let mut guard = lock(&self.result);
        loop {
            if let Some(c) = guard.take() {
                return Some(c);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            guard = self
                .ready
                .wait_timeout(guard, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// Locks a mutex, carrying on if a panicking thread poisoned it: the data behind
/// these locks stays consistent at every unlock point.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Shared {
    peer: String,
    pending: Mutex<HashMap<u64, Arc<Slot>>>,
    /// Why the connection died, once it has.
    dead: Mutex<Option<String>>,
}

impl Shared {
    fn disconnected(&self) -> Option<FabricError> {
        lock(&self.dead)
            .as_ref()
            .map(|reason| FabricError::Disconnected {
                peer: self.peer.clone(),
                reason: reason.clone(),
            })
    }

    /// Marks the connection dead and fails everything outstanding.
    fn kill(&self, reason: String) {
        {
            let mut dead = lock(&self.dead);
            if dead.is_none() {
                log::warn!("connection to {} lost: {}", self.peer, reason);
                *dead = Some(reason.clone());
            }
        }
        let slots: Vec<_> = lock(&self.pending).drain().map(|(_, s)| s).collect();
        for s in slots {
            s.complete(Err(FabricError::Disconnected {
                peer: self.peer.clone(),
                reason: reason.clone(),
            }));
        }
    }
}

/// One tcp connection to a memnode.
pub struct TcpEndpoint {
    shared: Arc<Shared>,
    writer: Mutex<BufWriter<TcpStream>>,
    stream: TcpStream,
    next_wr_id: AtomicU64,
    timeout: Duration,
    reader: Option<JoinHandle<()>>,
}

impl TcpEndpoint {
    /// Connects to `peer` ("host:port"). `timeout` bounds the connect and every later
    /// operation.
    pub fn connect(peer: &str, timeout: Duration) -> Result<TcpEndpoint, FabricError> {
        let err = |reason: String| FabricError::Connect {
            peer: peer.to_string(),
            reason,
        };
        let addrs: Vec<_> = peer
            .to_socket_addrs()
            .map_err(|e| err(e.to_string()))?
            .collect();
        let mut last = String::from("no address");
        let mut stream = None;
        for a in addrs {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = e.to_string(),
            }
        }
        let stream = stream.ok_or_else(|| err(last))?;
        stream.set_nodelay(true).map_err(|e| err(e.to_string()))?;
        // A peer that stops reading must not block a writer forever.
        stream
            .set_write_timeout(Some(timeout))
            .map_err(|e| err(e.to_string()))?;
        let shared = Arc::new(Shared {
            peer: peer.to_string(),
            pending: Mutex::new(HashMap::new()),
            dead: Mutex::new(None),
        });
        let read_half = stream.try_clone().map_err(|e| err(e.to_string()))?;
        let write_half = stream.try_clone().map_err(|e| err(e.to_string()))?;
        let reader_shared = shared.clone();
        let reader = std::thread::Builder::new()
            .name(format!("fabric-rx {peer}"))
            .spawn(move || {
                let reason = read_completions(read_half, &reader_shared);
                reader_shared.kill(reason);
            })
            .map_err(|e| err(e.to_string()))?;
        Ok(TcpEndpoint {
            shared,
            writer: Mutex::new(BufWriter::with_capacity(256 << 10, write_half)),
            stream,
            next_wr_id: AtomicU64::new(1),
            timeout,
            reader: Some(reader),
        })
    }

    /// Writes requests (header and optional payload each) back to back, then flushes.
    /// A failed write leaves the stream unusable, so it kills the connection.
    fn post(&self, requests: &[(RequestHeader, Option<&[u8]>)]) -> Result<(), FabricError> {
        let mut w = lock(&self.writer);
        let result = (|| -> std::io::Result<()> {
            for (h, payload) in requests {
                w.write_all(&h.encode())?;
                if let Some(p) = payload {
                    w.write_all(p)?;
                }
            }
            w.flush()
        })();
        drop(w);
        result.map_err(|e| {
            let reason = format!("write failed: {e}");
            self.shared.kill(reason.clone());
            FabricError::Disconnected {
                peer: self.shared.peer.clone(),
                reason,
            }
        })
    }

    fn register(&self, n: usize) -> Result<Vec<(u64, Arc<Slot>)>, FabricError> {
        if let Some(e) = self.shared.disconnected() {
            return Err(e);
        }
        let first = self.next_wr_id.fetch_add(n as u64, Ordering::Relaxed);
        let slots: Vec<_> = (0..n as u64)
            .map(|i| (first + i, Arc::new(Slot::default())))
            .collect();
        let mut pending = lock(&self.shared.pending);
        for (id, s) in &slots {
            pending.insert(*id, s.clone());
        }
        drop(pending);
        // The connection may have died between the check and the insert; its kill
        // drained the map before our insert, so check again and undo.
        if let Some(e) = self.shared.disconnected() {
            self.forget(&slots);
            return Err(e);
        }
        Ok(slots)
    }

    fn forget(&self, slots: &[(u64, Arc<Slot>)]) {
        let mut pending = lock(&self.shared.pending);
        for (id, _) in slots {
            pending.remove(id);
        }
    }

    fn wait(&self, id: u64, slot: &Slot, deadline: Instant) -> Completion {
        match slot.wait(deadline) {
            Some(c) => c,
            None => {
                lock(&self.shared.pending).remove(&id);
                // The completion may have landed between the timeout and the removal.
                if let Some(c) = lock(&slot.result).take() {
                    return c;
                }
                Err(FabricError::Timeout {
                    peer: self.shared.peer.clone(),
                    after: self.timeout,
                })
            }
        }
    }
}

impl Endpoint for TcpEndpoint {
    fn execute(&self, ops: &mut [RdmaOp<'_>]) -> Vec<Result<(), FabricError>> {
        if let Some(op) = ops.iter().find(|op| op.len() > MAX_DATA_OP) {
            let e = FabricError::Invalid(format!(
                "operation of {} bytes exceeds {MAX_DATA_OP}",
                op.len()
            ));
            return ops.iter().map(|_| Err(e.clone())).collect();
        }
        let slots = match self.register(ops.len()) {
            Ok(s) => s,
            Err(e) => return ops.iter().map(|_| Err(e.clone())).collect(),
        };
        let requests: Vec<(RequestHeader, Option<&[u8]>)> = ops
            .iter()
            .zip(&slots)
            .map(|(op, (id, _))| {
                let remote = op.remote();
                let (code, payload) = match op {
                    RdmaOp::Read { .. } => (OP_READ, None),
                    RdmaOp::Write { local, .. } => (OP_WRITE, Some(&local[..])),
                };
                let h = RequestHeader {
                    op: code,
                    len: op.len() as u32,
                    wr_id: *id,
                    addr: remote.addr,
                    rkey: remote.rkey,
                };
                (h, payload)
            })
            .collect();
        if let Err(e) = self.post(&requests) {
            self.forget(&slots);
            return ops.iter().map(|_| Err(e.clone())).collect();
        }
        let deadline = Instant::now() + self.timeout;
        ops.iter_mut()
            .zip(&slots)
            .map(|(op, (id, slot))| {
                let remote = op.remote();
                let len = op.len();
                let data = self.wait(*id, slot, deadline).map_err(|e| match e {
                    // The completion only says "refused"; name what was refused.
                    FabricError::RemoteAccess { .. } => FabricError::RemoteAccess {
                        addr: remote.addr,
                        rkey: remote.rkey,
                        len,
                    },
                    other => other,
                })?;
                if let RdmaOp::Read { local, .. } = op {
                    if data.len() != local.len() {
                        return Err(FabricError::BadRequest(format!(
                            "READ returned {} bytes, asked for {}",
                            data.len(),
                            local.len()
                        )));
                    }
                    local.copy_from_slice(&data);
                }
                Ok(())
            })
            .collect()
    }

    fn call(&self, frame: &[u8]) -> Result<Vec<u8>, FabricError> {
        if frame.len() > MAX_CONTROL_FRAME {
            return Err(FabricError::Invalid(format!(
                "control frame of {} bytes exceeds {MAX_CONTROL_FRAME}",
                frame.len()
            )));
        }
        let slots = self.register(1)?;
        let (id, slot) = &slots[0];
        let h = RequestHeader {
            op: OP_SEND,
            len: frame.len() as u32,
            wr_id: *id,
            addr: 0,
            rkey: 0,
        };
        if let Err(e) = self.post(&[(h, Some(frame))]) {
            self.forget(&slots);
            return Err(e);
        }
        self.wait(*id, slot, Instant::now() + self.timeout)
    }

    fn peer(&self) -> &str {
        &self.shared.peer
    }

    fn is_connected(&self) -> bool {
        lock(&self.shared.dead).is_none()
    }
}

impl Drop for TcpEndpoint {
    fn drop(&mut self) {
        // Closing our own end is not a lost connection: say so before the reader sees
        // the stream end, so nothing is logged as a failure.
        lock(&self.shared.dead).get_or_insert_with(|| "closed by this side".to_string());
        // Unblocks the reader thread, which then fails whatever is still pending.
        let _ = self.stream.shutdown(Shutdown::Both);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

/// The reader thread's loop. Returns why it stopped.
fn read_completions(stream: TcpStream, shared: &Shared) -> String {
    let mut r = BufReader::with_capacity(256 << 10, stream);
    let mut header = [0u8; COMPLETION_HEADER_LEN];
    loop {
        if let Err(e) = r.read_exact(&mut header) {
            return if e.kind() == std::io::ErrorKind::UnexpectedEof {
                "peer closed the connection".to_string()
            } else {
                format!("read failed: {e}")
            };
        }
        let h = CompletionHeader::decode(&header);
        if h.len as usize > MAX_DATA_OP.max(MAX_CONTROL_FRAME) {
            return format!("completion claims {} bytes: stream corrupt", h.len);
        }
        let mut payload = vec![0u8; h.len as usize];
        if let Err(e) = r.read_exact(&mut payload) {
            return format!("read failed mid-completion: {e}");
        }
        let slot = lock(&shared.pending).remove(&h.wr_id);
        let Some(slot) = slot else {
            // The waiter timed out and left; drop the late completion.
            continue;
        };
        let completion = match h.status {
            STATUS_OK => Ok(payload),
            STATUS_REMOTE_ACCESS => Err(FabricError::RemoteAccess {
                addr: 0,
                rkey: 0,
                len: 0,
            }),
            _ => Err(FabricError::BadRequest(
                String::from_utf8_lossy(&payload).into_owned(),
            )),
        };
        slot.complete(completion);
    }
}
