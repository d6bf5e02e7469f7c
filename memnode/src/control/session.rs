//! Hello, the end of a connection, and the end of a session (its grace run out,
//! or `SessionEnd`), with what the memnode takes back then.
//!
//! The handshake (`rmemfs_common::auth` has its arithmetic): a connection's Hello
//! names a client id and brings a nonce; the memnode answers with a Challenge (its
//! own nonce); the client's Prove shows it knows the token, and the memnode's Welcome
//! shows the memnode does. Neither the token nor a session's secret crosses the
//! network.
//!
//! Sessions: a client's connections belong to its session, which the first
//! connection of a client id starts; both sides derive its secret from that
//! handshake. Every later connection naming that client id must prove it knows the
//! secret: it joins the session (fsd's several connections) or resumes it (a
//! reconnect after a network blip). One that names a client id with a session but
//! does not prove its secret is refused, so knowing a client id (volume listings show
//! holders) does not let one act as that client. The secret is never logged
//! (`SessionSecret`'s `Debug` hides it). A session is the tenant's whose token its
//! first connection proved: a connection of another tenant naming its client id is
//! refused as one without the secret is.
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
use rmemfs_common::auth::{self, Challenged, Key, Nonce, Proof, Transcript, WelcomeFacts};
use rmemfs_common::fabric::ConnectionState;
use rmemfs_common::protocol::{ErrorCode, Response, FEATURE_COPY};
use rmemfs_common::size::format_size;
use std::time::Instant;

impl ControlService {
    /// A Hello: the memnode's Challenge, remembered on the connection for its Prove.
    pub(super) fn challenge(
        &self,
        conn: &mut ConnectionState,
        client_id: u64,
        client_nonce: Nonce,
        resume: bool,
    ) -> Answer {
        if conn.challenged.is_some() {
            return refuse_and_close(
                ErrorCode::BadRequest,
                "this connection already said hello".into(),
            );
        }
        let Some(server_nonce) = auth::new_nonce() else {
            log::error!("no randomness for a handshake's nonce");
            return refuse_and_close(
                ErrorCode::BadRequest,
                "the memnode cannot make a nonce now".into(),
            );
        };
        conn.challenged = Some(Challenged {
            transcript: Transcript {
                client_id,
                client_nonce,
                server_nonce,
            },
            resume,
        });
        reply(Response::Challenge {
            nonce: server_nonce,
        })
    }

    /// The tenant whose token the client proof `proof` was made with, for the
    /// connection's transcript, and that token's key (`None`: the proof matches no
    /// tenant's token). A memnode without a token takes any proof (its one tenant)
    /// and proves itself with the key of no token. Every tenant's key is tried, each
    /// in full, so the time taken says nothing of which one matched.
    fn authenticate(&self, t: &Transcript, proof: &Proof) -> Option<(TenantId, Key)> {
        let tenants = self.tenants();
        if tenants.is_open() {
            // Its one tenant, "default".
            return Some((0, auth::token_key(b"")));
        }
        let mut found = None;
        for (id, key) in tenants.keys() {
            if auth::proofs_match(&auth::client_proof(key, t), proof) && found.is_none() {
                found = Some((id, *key));
            }
        }
        found
    }

    /// A Prove, after the Challenge: the client is let in (Welcome, with the memnode's
    /// own proof) when its proof matches the token and, to resume a session, its
    /// session proof matches that session's secret.
    pub(super) fn prove(
        &self,
        conn: &mut ConnectionState,
        proof: Proof,
        session_proof: Option<Proof>,
    ) -> Answer {
        let Some(Challenged {
            transcript: t,
            resume,
        }) = conn.challenged.take()
        else {
            return refuse_and_close(
                ErrorCode::NotAuthenticated,
                "Prove came before Hello".into(),
            );
        };
        let client_id = t.client_id;
        let Some((tenant, key)) = self.authenticate(&t, &proof) else {
            log::warn!(
                "refusing {} (conn {}): its proof matches no token of this memnode",
                conn.peer,
                conn.conn_id
            );
            return refuse_and_close(ErrorCode::AuthFailed, "wrong token".into());
        };
        let resumed = {
            let mut clients = self.clients();
            match clients.get_mut(&client_id) {
                Some(s) => {
                    if s.tenant != tenant {
                        return self.refuse_foreign_session(conn, client_id, s.tenant, tenant);
                    }
                    let proven = resume
                        && session_proof.is_some_and(|p| {
                            auth::proofs_match(&auth::session_proof(&s.secret, &t), &p)
                        });
                    if !proven {
                        log::warn!(
                            "refusing {} (conn {}): client {client_id:#x} has a session and this connection did not prove its secret",
                            conn.peer,
                            conn.conn_id
                        );
                        return refuse_and_close(
                            ErrorCode::AuthFailed,
                            "this client id belongs to a session whose secret this connection did not prove"
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
                    true
                }
                None => {
                    if self.books_full() {
                        return refuse_and_close(
                            ErrorCode::NoSpace,
                            "this memnode's memory file has no room for another session".into(),
                        );
                    }
                    if resume {
                        log::info!(
                            "client {client_id:#x} asked to resume a session this memnode does not have (it expired, or this is a new memnode instance): a new session starts"
                        );
                    }
                    clients.insert(
                        client_id,
                        Session {
                            secret: auth::session_secret(&key, &t),
                            tenant,
                            connections: 1,
                            idle_since: None,
                            ending: false,
                            unregistered: false,
                        },
                    );
                    false
                }
            }
        };
        self.heard().insert(client_id, Instant::now());
        conn.client = Some(client_id);
        log::info!(
            "client {client_id:#x} of tenant {:?} connected from {} (conn {}){}",
            self.tenants().name(tenant),
            conn.peer,
            conn.conn_id,
            if self.tenants().is_open() {
                " with no token: this memnode checks none"
            } else {
                ""
            }
        );
        let facts = WelcomeFacts {
            node_id: self.node_id,
            capacity: self.pool.capacity(),
            features: FEATURE_COPY,
            resumed,
            boot: self.boot,
        };
        reply(Response::Welcome {
            node_id: facts.node_id,
            capacity: facts.capacity,
            features: facts.features,
            resumed,
            boot: facts.boot,
            proof: auth::server_proof(&key, &t, &facts),
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
