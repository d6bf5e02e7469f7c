//! The client side of the control protocol: typed calls over an [`Endpoint`]'s
//! SEND/RECV.

use crate::fabric::{Endpoint, FabricError};
use crate::protocol::{
    Allocation, ErrorCode, NodeStats, ProtocolError, Request, Response, MAX_TOKEN_LEN,
};
use thiserror::Error;

/// Why a control call failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ControlError {
    #[error(transparent)]
    Fabric(#[from] FabricError),
    #[error("malformed reply: {0}")]
    Protocol(#[from] ProtocolError),
    #[error("memnode refused: {code:?}: {message}")]
    Refused { code: ErrorCode, message: String },
    #[error("unexpected reply to {request}: {reply}")]
    Unexpected {
        request: &'static str,
        reply: String,
    },
}

impl ControlError {
    /// True when the memnode said it has no room for the allocation.
    pub fn is_no_space(&self) -> bool {
        matches!(
            self,
            ControlError::Refused {
                code: ErrorCode::NoSpace,
                ..
            }
        )
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
    if token.len() > MAX_TOKEN_LEN {
        // The frame cannot carry it; refuse rather than send a token cut short.
        return Err(ControlError::Protocol(ProtocolError::BadField("token")));
    }
    let req = Request::Hello {
        client_id,
        token: token.to_vec(),
    };
    match call(ep, &req)? {
        Response::Welcome { node_id, capacity } => Ok(Welcome { node_id, capacity }),
        other => Err(unexpected("Hello", other)),
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

pub fn stat(ep: &dyn Endpoint) -> Result<NodeStats, ControlError> {
    match call(ep, &Request::Stat)? {
        Response::Stats(s) => Ok(s),
        other => Err(unexpected("Stat", other)),
    }
}
