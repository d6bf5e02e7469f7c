//! Hello, the end of a connection, and the end of a session (its grace run out,
//! or `SessionEnd`), with what the memnode takes back then.
//!
//! Sessions: a client's connections belong to its session, which the first Hello of
//! a client id starts and answers with a random secret. Every later Hello naming that
//! client id must present the secret: it joins the session (fsd's several
//! connections) or resumes it (a reconnect after a network blip). A Hello that names
//! a client id with a session but not its secret is refused, so knowing a client id
//! (volume listings show holders) no longer lets one act as that client. The secret
//! is never logged (`SessionSecret`'s `Debug` hides it). A session is the tenant's
//! whose token its first Hello carried: a Hello of another tenant naming its client
//! id is refused as one without the secret is.
//!
//! Scratch memory: chunks of a client that holds no volume belong to its session, not
//! a connection. When the session's last connection closes, its memory is kept for
//! the grace period (`MemnodeConfig::session_grace`) so that a client that was cut off
//! finds every chunk when it reconnects; a session not resumed by then is reclaimed
//! ([`ControlService::reap_expired`]): its scratch chunks revoked, zeroed and freed,
//! its volume let go. A client that ends its session (`SessionEnd`, fsd's clean
//! shutdown) is reclaimed as soon as its last connection closes.

use super::reply::{refuse_and_close, reply, Answer};
use super::{show, ControlService, Session};
use crate::pool::Chunk;
use crate::tenants::TenantId;
use rmemfs_common::fabric::ConnectionState;
use rmemfs_common::protocol::{ErrorCode, Response, SessionSecret, FEATURE_COPY};
use rmemfs_common::size::format_size;
use std::time::Instant;

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

/// Compares in time that depends only on the lengths, not on where bytes differ.
pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() != b.len()) as u8;
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= std::hint::black_box(x ^ y);
    }
    diff == 0
}

impl ControlService {
    pub(super) fn hello(
        &self,
        conn: &mut ConnectionState,
        client_id: u64,
        token: &[u8],
        presented: SessionSecret,
    ) -> Answer {
        let Some(tenant) = self.tenants().find_by_token(token) else {
            log::warn!(
                "refusing {} (conn {}): wrong token",
                conn.peer,
                conn.conn_id
            );
            return refuse_and_close(ErrorCode::AuthFailed, "wrong token".into());
        };
        let (session, resumed) = {
            let mut clients = self.clients();
            match clients.get_mut(&client_id) {
                Some(s) => {
                    if s.tenant != tenant {
                        return self.refuse_foreign_session(conn, client_id, s.tenant, tenant);
                    }
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
                            tenant,
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
            "client {client_id:#x} of tenant {:?} connected from {} (conn {})",
            self.tenants().name(tenant),
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

    /// A connection ended. The session's last one starts its grace period, or ends
    /// the session at once when its client said `SessionEnd` (or there is no grace).
    pub(super) fn disconnect(&self, conn: &ConnectionState) {
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
        let tenant = session.tenant;
        clients.remove(&client);
        let revoked = self.end_session(client);
        drop(clients);
        let how = format!("last conn {} from {} closed", conn.conn_id, conn.peer);
        self.reclaim(client, tenant, &revoked, &how);
        self.save();
    }

    /// Ends every session that has had no connection for longer than the grace
    /// period; returns how many. The memnode calls it about once a second.
    pub fn reap_expired(&self) -> usize {
        let mut clients = self.clients();
        let expired: Vec<(u64, TenantId)> = clients
            .iter()
            .filter(|(_, s)| s.idle_since.is_some_and(|t| t.elapsed() >= self.grace))
            .map(|(&c, s)| (c, s.tenant))
            .collect();
        let mut ended = Vec::with_capacity(expired.len());
        for &(client, tenant) in &expired {
            clients.remove(&client);
            self.counters
                .sessions_expired
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            ended.push((client, tenant, self.end_session(client)));
        }
        drop(clients);
        let how = format!(
            "no reconnect within the {:.0}s grace period",
            self.grace.as_secs_f64()
        );
        for (client, tenant, revoked) in &ended {
            self.reclaim(*client, *tenant, revoked, &how);
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
        self.forget_tenant_of(client);
        revoked
    }

    /// Zeroes and frees the revoked chunks of an ended session of `tenant` (outside
    /// `clients`: zeroing takes time), and credits them to the tenant.
    fn reclaim(&self, client: u64, tenant: TenantId, revoked: &[Chunk], how: &str) {
        self.credit(tenant, revoked.iter().map(|c| c.len).sum(), 0);
        let bytes = self.pool.release_revoked(revoked);
        log::info!(
            "client {client:#x} gone ({how}): reclaimed {} chunks, {}",
            revoked.len(),
            format_size(bytes)
        );
    }
}
