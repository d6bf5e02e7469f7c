//! The two-sided path: control requests (SEND) from clients, answered with one reply
//! each. This is the only code that parses control frames; it never sees READ/WRITE.
//!
//! Sessions: a connection is anonymous until its `Hello` (checked against the token
//! with a constant-time compare when one is configured) names a client id; anything
//! else before that, a bad token, a frame in another protocol version or a frame that
//! does not decode is answered with an error and the connection is closed. After
//! Hello the connection may Alloc, Free and Stat; errors there are replies only.
//!
//! Ownership: chunks belong to a client id, not a connection, so one client (fsd) may
//! spread its traffic over several connections. The service counts live connections
//! per client id; when the last one closes, all of that client's chunks are revoked,
//! zeroed and freed.
//!
//! Lock order: `clients`, then the pool's chunk table and the registry (inside
//! `ChunkPool::revoke_all_of`). Hello and the last-connection revocation both run
//! under `clients`, so a client reconnecting while it is being reclaimed never loses
//! a chunk it allocates anew.

use crate::allocator::AllocError;
use crate::pool::{ChunkPool, PoolError};
use rmemfs_common::fabric::{ConnectionState, ControlHandler, ControlReply};
use rmemfs_common::protocol::{ErrorCode, NodeStats, ProtocolError, Request, Response};
use rmemfs_common::size::format_size;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

pub struct ControlService {
    pool: Arc<ChunkPool>,
    token: Option<Vec<u8>>,
    node_id: u64,
    /// Live authenticated connections per client id (entries are never zero).
    clients: Mutex<HashMap<u64, usize>>,
}

fn reply(resp: Response) -> ControlReply {
    ControlReply {
        frame: resp.encode(),
        close: false,
    }
}

fn refuse_and_close(code: ErrorCode, message: String) -> ControlReply {
    ControlReply {
        frame: Response::error(code, message).encode(),
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
    /// `token`: required in every Hello when set.
    pub fn new(pool: Arc<ChunkPool>, token: Option<Vec<u8>>, node_id: u64) -> ControlService {
        ControlService {
            pool,
            token,
            node_id,
            clients: Mutex::new(HashMap::new()),
        }
    }

    // Counts are updated in single statements, so poisoning is ignored.
    fn clients(&self) -> MutexGuard<'_, HashMap<u64, usize>> {
        self.clients.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn node_id(&self) -> u64 {
        self.node_id
    }

    pub fn stats(&self) -> NodeStats {
        let clients = self.clients().len();
        let usage = self.pool.usage();
        NodeStats {
            capacity: usage.capacity,
            used: usage.used,
            clients: u32::try_from(clients).unwrap_or(u32::MAX),
            allocations: u32::try_from(usage.chunks).unwrap_or(u32::MAX),
        }
    }

    fn hello(&self, conn: &mut ConnectionState, client_id: u64, token: &[u8]) -> ControlReply {
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
        *self.clients().entry(client_id).or_insert(0) += 1;
        conn.client = Some(client_id);
        log::info!(
            "client {client_id:#x} connected from {} (conn {})",
            conn.peer,
            conn.conn_id
        );
        reply(Response::Welcome {
            node_id: self.node_id,
            capacity: self.pool.capacity(),
        })
    }

    /// A request from an authenticated connection of `client`.
    fn serve(&self, client: u64, req: Request) -> Response {
        match req {
            Request::Hello { .. } => {
                Response::error(ErrorCode::BadRequest, "this connection already said hello")
            }
            Request::Alloc { bytes } => match self.pool.alloc(client, bytes) {
                Ok(c) => {
                    log::debug!(
                        "client {client:#x}: alloc {bytes} -> {:#x}+{:#x} rkey {:#x}",
                        c.addr,
                        c.len,
                        c.rkey
                    );
                    Response::Allocated(c.to_wire())
                }
                Err(e) => {
                    if let PoolError::Register { .. } = e {
                        log::error!("client {client:#x}: alloc {bytes} failed: {e}");
                    } else {
                        log::debug!("client {client:#x}: alloc {bytes} refused: {e}");
                    }
                    Response::error(pool_error_code(&e), e.to_string())
                }
            },
            Request::Free { addr, rkey } => match self.pool.free(client, addr, rkey) {
                Ok(c) => {
                    log::debug!("client {client:#x}: freed {:#x}+{:#x}", c.addr, c.len);
                    Response::Freed
                }
                Err(e) => Response::error(pool_error_code(&e), e.to_string()),
            },
            Request::Stat => Response::Stats(self.stats()),
        }
    }
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
        PoolError::Alloc(AllocError::NotFound { .. }) | PoolError::NotFound { .. } => {
            ErrorCode::NotFound
        }
        PoolError::Alloc(AllocError::ZeroSize) => ErrorCode::BadRequest,
    }
}

impl ControlHandler for ControlService {
    fn handle(&self, conn: &mut ConnectionState, frame: &[u8]) -> ControlReply {
        let req = match Request::decode(frame) {
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
            (None, Request::Hello { client_id, token }) => self.hello(conn, client_id, &token),
            (None, _) => refuse_and_close(
                ErrorCode::NotAuthenticated,
                "the first request on a connection must be Hello".into(),
            ),
            (Some(client), req) => reply(self.serve(client, req)),
        }
    }

    fn disconnected(&self, conn: &ConnectionState) {
        let Some(client) = conn.client else { return };
        let revoked = {
            let mut clients = self.clients();
            let count = clients.entry(client).or_insert(1);
            *count -= 1;
            if *count > 0 {
                log::info!(
                    "client {client:#x}: conn {} from {} closed",
                    conn.conn_id,
                    conn.peer
                );
                return;
            }
            clients.remove(&client);
            self.pool.revoke_all_of(client)
        };
        let bytes = self.pool.release_revoked(&revoked);
        log::info!(
            "client {client:#x} gone (last conn {} from {}): reclaimed {} chunks, {}",
            conn.conn_id,
            conn.peer,
            revoked.len(),
            format_size(bytes)
        );
    }
}

#[cfg(test)]
#[path = "control_tests.rs"]
mod tests;
