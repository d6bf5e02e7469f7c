//! The way in: every control frame goes through `ControlService::answer`, which
//! decodes it, lets only `Hello` through before a connection has a client, refuses
//! what would grow full books, routes each request to its handler and saves the
//! books after a change before the reply goes out. This is the only code that
//! parses control frames.

use super::reply::{pool_error_code, refuse_and_close, reply, volume_error, Answer};
use super::saved_books::{changes_books, grows_books};
use super::ControlService;
use crate::pool::Chunk;
use crate::tenants::TenantId;
use rmemfs_common::fabric::{ConnectionState, ControlHandler, ControlReply};
use rmemfs_common::protocol::{
    listing_fits, ErrorCode, ProtocolError, Request, Response, VolumeSummary, MAX_CHUNKS_PER_REPLY,
    MAX_CONTROL_BODY,
};
use std::time::Instant;

// The smallest summary in a VolumeListing body: a one-byte name.
const MIN_SUMMARY: usize = 2 + 1 + 8 + 8 + 4 + 8;

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
                    nonce,
                    resume,
                },
            ) => self.challenge(conn, client_id, nonce, resume),
            (None, Request::Prove { proof, session }) => {
                let answer = self.prove(conn, proof, session);
                if let Response::Welcome { resumed: false, .. } = answer.response {
                    self.save();
                }
                answer
            }
            (None, _) => refuse_and_close(
                ErrorCode::NotAuthenticated,
                "a connection must say Hello and Prove before anything else".into(),
            ),
            (Some(client), req) => {
                let Some(tenant) = self.tenant_of(client) else {
                    return refuse_and_close(
                        ErrorCode::NotAuthenticated,
                        "this connection's session is gone".into(),
                    );
                };
                self.heard().insert(client, Instant::now());
                let changes = changes_books(&req);
                if changes && self.books_full() && grows_books(&req) {
                    return reply(Response::error(
                        ErrorCode::NoSpace,
                        "this memnode's memory file has no room for more bookkeeping",
                    ));
                }
                let response = self.serve(client, tenant, &conn.peer, req);
                if changes {
                    self.save();
                }
                reply(response)
            }
        }
    }

    /// A request from an authenticated connection of `client` of `tenant` from
    /// `peer`.
    fn serve(&self, client: u64, tenant: TenantId, peer: &str, req: Request) -> Response {
        match req {
            Request::Hello { .. } | Request::Prove { .. } => {
                Response::error(ErrorCode::BadRequest, "this connection already said hello")
            }
            Request::Alloc { bytes } => self.alloc(client, tenant, bytes),
            Request::Free { addr, rkey } => self.free(client, tenant, addr, rkey),
            Request::Stat => Response::Stats(self.stats()),
            Request::VolumeOpen {
                name,
                create,
                takeover,
            } => self.volume_open(client, tenant, peer, &name, create, takeover),
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
                // by the count: `more` is then exact. The tenant's own only.
                let candidates: Vec<VolumeSummary> = vols
                    .after(tenant, &after)
                    .take(MAX_CONTROL_BODY / MIN_SUMMARY + 1)
                    .map(|v| v.summary())
                    .collect();
                let n = listing_fits(&candidates);
                let more = n < candidates.len();
                let mut volumes = candidates;
                volumes.truncate(n);
                Response::VolumeListing { volumes, more }
            }
            Request::VolumeDestroy { name } => self.volume_destroy(client, tenant, &name),
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
}
