//! The client side of the control protocol: typed calls over an [`Endpoint`]'s
//! SEND/RECV.

use crate::auth;
use crate::fabric::{Endpoint, FabricError};
use crate::protocol::{
    valid_volume_name, Allocation, CopySpan, ErrorCode, NodeStats, ProtocolError, Request,
    Response, SessionSecret,
};
use thiserror::Error;

pub use crate::protocol::{VolumeInfo, VolumeSummary};

/// Why a control call failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ControlError {
    #[error(transparent)]
    Fabric(#[from] FabricError),
    #[error("malformed reply: {0}")]
    Protocol(#[from] ProtocolError),
    #[error("memnode refused: {code:?}: {message}")]
    Refused { code: ErrorCode, message: String },
    #[error("the memnode did not prove it knows the token (it has another token or none, or something else answers on its address)")]
    NotProven,
    #[error("unexpected reply to {request}: {reply}")]
    Unexpected {
        request: &'static str,
        reply: String,
    },
}

impl ControlError {
    /// True when the memnode has no room for the allocation: it is full, or this
    /// client's tenant holds its quota (either way, room is elsewhere or later).
    pub fn is_no_space(&self) -> bool {
        self.is_refused(ErrorCode::NoSpace) || self.is_over_quota()
    }

    /// True when the memnode refused because this client's tenant holds its quota.
    pub fn is_over_quota(&self) -> bool {
        self.is_refused(ErrorCode::OverQuota)
    }

    /// True when the memnode refused because another live client holds the volume.
    pub fn is_busy(&self) -> bool {
        self.is_refused(ErrorCode::Busy)
    }

    /// True when this client's hold on its volume was taken over by another client.
    pub fn is_fenced(&self) -> bool {
        self.is_refused(ErrorCode::Fenced)
    }

    /// True when the memnode has no such volume (or allocation).
    pub fn is_not_found(&self) -> bool {
        self.is_refused(ErrorCode::NotFound)
    }

    fn is_refused(&self, want: ErrorCode) -> bool {
        matches!(self, ControlError::Refused { code, .. } if *code == want)
    }
}

/// A random 64-bit id, for a client id or a token. Without the system's randomness it
/// falls back to time and pid: a client id only needs to differ between the clients
/// of one memnode.
pub fn random_id() -> u64 {
    match getrandom::u64() {
        Ok(v) => v,
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            t ^ ((std::process::id() as u64) << 32)
        }
    }
}

/// What a memnode said in reply to Hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Welcome {
    pub node_id: u64,
    pub capacity: u64,
    /// `protocol::FEATURE_*` bits.
    pub features: u32,
    /// The session's secret, for the Hello of every later connection of the session.
    pub session: SessionSecret,
    /// The session existed before this Hello (see `Response::Welcome`).
    pub resumed: bool,
    /// The memnode's restarts on its memory file (see `Response::Welcome`).
    pub boot: u64,
}

/// Sends one request and decodes the reply, turning error replies into `Refused`.
fn call(ep: &dyn Endpoint, req: &Request) -> Result<Response, ControlError> {
    let reply = Response::decode(&ep.call(&req.encode())?)?;
    match reply {
        Response::Error { code, message } => Err(ControlError::Refused { code, message }),
        other => Ok(other),
    }
}

fn unexpected(request: &'static str, reply: Response) -> ControlError {
    ControlError::Unexpected {
        request,
        reply: format!("{reply:?}"),
    }
}

pub fn hello(ep: &dyn Endpoint, client_id: u64, token: &[u8]) -> Result<Welcome, ControlError> {
    hello_in_session(ep, client_id, token, SessionSecret::NONE)
}

/// The handshake of a connection of the session `session` (or of a new one: `NONE`),
/// as `auth.rs` describes: Hello, the memnode's Challenge, Prove, and a Welcome whose
/// proof shows the memnode knows the token too. `token` empty: the client has none
/// (only a memnode without a token then lets it in).
pub fn hello_in_session(
    ep: &dyn Endpoint,
    client_id: u64,
    token: &[u8],
    session: SessionSecret,
) -> Result<Welcome, ControlError> {
    let client_nonce = auth::new_nonce().ok_or_else(|| {
        ControlError::Fabric(FabricError::Local(
            "no randomness for the handshake's nonce".into(),
        ))
    })?;
    let resume = !session.is_none();
    let hello = Request::Hello {
        client_id,
        nonce: client_nonce,
        resume,
    };
    let server_nonce = match call(ep, &hello)? {
        Response::Challenge { nonce } => nonce,
        other => return Err(unexpected("Hello", other)),
    };
    let t = auth::Transcript {
        client_id,
        client_nonce,
        server_nonce,
    };
    let key = auth::token_key(token);
    let prove = Request::Prove {
        proof: auth::client_proof(&key, &t),
        session: resume.then(|| auth::session_proof(&session, &t)),
    };
    let reply = call(ep, &prove)?;
    let Some((facts, proof)) = reply.welcome_facts() else {
        return Err(unexpected("Prove", reply));
    };
    if !auth::proofs_match(&proof, &auth::server_proof(&key, &t, &facts)) {
        return Err(ControlError::NotProven);
    }
    // Only now, with both sides proven, may the fabric ask for more (a mapping).
    ep.after_hello()?;
    Ok(Welcome {
        node_id: facts.node_id,
        capacity: facts.capacity,
        features: facts.features,
        session: if facts.resumed {
            session
        } else {
            auth::session_secret(&key, &t)
        },
        resumed: facts.resumed,
        boot: facts.boot,
    })
}

/// Tells the memnode the session is done (a clean shutdown): its scratch memory goes
/// back as soon as its last connection closes.
pub fn session_end(ep: &dyn Endpoint) -> Result<(), ControlError> {
    match call(ep, &Request::SessionEnd)? {
        Response::SessionEnding => Ok(()),
        other => Err(unexpected("SessionEnd", other)),
    }
}

pub fn alloc(ep: &dyn Endpoint, bytes: u64) -> Result<Allocation, ControlError> {
    match call(ep, &Request::Alloc { bytes })? {
        Response::Allocated(a) => Ok(a),
        other => Err(unexpected("Alloc", other)),
    }
}

pub fn free(ep: &dyn Endpoint, addr: u64, rkey: u32) -> Result<(), ControlError> {
    match call(ep, &Request::Free { addr, rkey })? {
        Response::Freed => Ok(()),
        other => Err(unexpected("Free", other)),
    }
}

/// Copies `spans` inside the memnode's memory (see `Request::Copy`); the bytes copied.
pub fn copy(ep: &dyn Endpoint, spans: &[CopySpan]) -> Result<u64, ControlError> {
    match call(
        ep,
        &Request::Copy {
            spans: spans.to_vec(),
        },
    )? {
        Response::Copied { bytes } => Ok(bytes),
        other => Err(unexpected("Copy", other)),
    }
}

pub fn stat(ep: &dyn Endpoint) -> Result<NodeStats, ControlError> {
    match call(ep, &Request::Stat)? {
        Response::Stats(s) => Ok(s),
        other => Err(unexpected("Stat", other)),
    }
}

/// The name as the protocol carries it, or the error a memnode would answer it with.
fn volume_name(name: &str) -> Result<Vec<u8>, ControlError> {
    if !valid_volume_name(name.as_bytes()) {
        return Err(ControlError::Protocol(ProtocolError::BadField(
            "volume name",
        )));
    }
    Ok(name.as_bytes().to_vec())
}

/// Opens (holds) the volume `name`: creates it when `create` and it does not exist
/// (missing and not `create`: `Refused NotFound`), takes it from a live holder when
/// `takeover` (otherwise that is `Refused Busy`). From then on this client's `alloc`
/// and `free` are the volume's.
pub fn volume_open(
    ep: &dyn Endpoint,
    name: &str,
    create: bool,
    takeover: bool,
) -> Result<VolumeInfo, ControlError> {
    let req = Request::VolumeOpen {
        name: volume_name(name)?,
        create,
        takeover,
    };
    match call(ep, &req)? {
        Response::VolumeOpened(info) => Ok(info),
        other => Err(unexpected("VolumeOpen", other)),
    }
}

/// Every chunk of the held volume except the root, paging with VolumeChunks.
pub fn volume_chunks(ep: &dyn Endpoint) -> Result<Vec<Allocation>, ControlError> {
    chunk_pages(ep, "VolumeChunks", |after| Request::VolumeChunks { after })
}

/// The caller's scratch chunks (those of its session), in address order: after a
/// reconnect, the chunks whose Alloc reply was lost with the connection show here.
pub fn session_chunks(ep: &dyn Endpoint) -> Result<Vec<Allocation>, ControlError> {
    chunk_pages(ep, "SessionChunks", |after| Request::SessionChunks {
        after,
    })
}

/// Every page of a chunk listing, asked for with `ask(after)`.
fn chunk_pages(
    ep: &dyn Endpoint,
    what: &'static str,
    ask: impl Fn(u64) -> Request,
) -> Result<Vec<Allocation>, ControlError> {
    let mut all = Vec::new();
    let mut after = 0u64;
    loop {
        let (chunks, more) = match call(ep, &ask(after))? {
            Response::ChunkList { chunks, more } => (chunks, more),
            other => return Err(unexpected(what, other)),
        };
        // Pages come in address order, each after the last: anything else would
        // loop or repeat, so it is refused.
        let mut last = after;
        for c in &chunks {
            if c.addr <= last {
                return Err(ControlError::Unexpected {
                    request: what,
                    reply: format!("chunk {:#x} out of order after {last:#x}", c.addr),
                });
            }
            last = c.addr;
        }
        all.extend(chunks);
        if !more {
            return Ok(all);
        }
        if last == after {
            return Err(ControlError::Unexpected {
                request: what,
                reply: "an empty page that says more follow".into(),
            });
        }
        after = last;
    }
}

/// Lets go of the held volume: its chunks stay on the memnode, unreachable until it
/// is opened again, and this client's later allocations are scratch again.
pub fn volume_close(ep: &dyn Endpoint) -> Result<(), ControlError> {
    match call(ep, &Request::VolumeClose)? {
        Response::VolumeClosed => Ok(()),
        other => Err(unexpected("VolumeClose", other)),
    }
}

/// Every volume, paging with VolumeList.
pub fn volume_list(ep: &dyn Endpoint) -> Result<Vec<VolumeSummary>, ControlError> {
    let mut all: Vec<VolumeSummary> = Vec::new();
    // Empty sorts before every name: the first page starts at the beginning.
    let mut after: Vec<u8> = Vec::new();
    loop {
        let req = Request::VolumeList {
            after: after.clone(),
        };
        let (volumes, more) = match call(ep, &req)? {
            Response::VolumeListing { volumes, more } => (volumes, more),
            other => return Err(unexpected("VolumeList", other)),
        };
        // Pages come in name order, each after the last: anything else would loop
        // or repeat, so it is refused.
        let mut last = after.as_slice();
        for v in &volumes {
            if v.name.as_slice() <= last {
                return Err(ControlError::Unexpected {
                    request: "VolumeList",
                    reply: format!("volume {:?} out of order", String::from_utf8_lossy(&v.name)),
                });
            }
            last = &v.name;
        }
        let next = last.to_vec();
        if more && volumes.is_empty() {
            return Err(ControlError::Unexpected {
                request: "VolumeList",
                reply: "an empty page that says more follow".into(),
            });
        }
        all.extend(volumes);
        if !more {
            return Ok(all);
        }
        after = next;
    }
}

/// Frees every chunk of the volume `name` and forgets it; returns the bytes freed.
/// Refused with Busy while another live client holds it.
pub fn volume_destroy(ep: &dyn Endpoint, name: &str) -> Result<u64, ControlError> {
    let req = Request::VolumeDestroy {
        name: volume_name(name)?,
    };
    match call(ep, &req)? {
        Response::VolumeDestroyed { bytes } => Ok(bytes),
        other => Err(unexpected("VolumeDestroy", other)),
    }
}

#[cfg(test)]
#[path = "control_tests.rs"]
mod tests;
