//! How the control service answers: a reply before encoding (and whether the
//! connection closes after it), and the error codes clients see for the pool's and
//! the volume table's refusals. One place, so every request maps the same failure
//! to the same code.

use crate::allocator::AllocError;
use crate::pool::PoolError;
use crate::volumes::VolumeError;
use rmemfs_common::protocol::{ErrorCode, Response};

/// A reply before encoding, and whether the connection closes after it.
pub(super) struct Answer {
    pub(super) response: Response,
    pub(super) close: bool,
}

pub(super) fn reply(response: Response) -> Answer {
    Answer {
        response,
        close: false,
    }
}

pub(super) fn refuse_and_close(code: ErrorCode, message: String) -> Answer {
    Answer {
        response: Response::error(code, message),
        close: true,
    }
}

pub(super) fn internal(what: &str) -> Response {
    log::error!("internal error: {what}");
    Response::error(ErrorCode::BadRequest, format!("internal error: {what}"))
}

pub(super) fn alloc_error(client: u64, bytes: u64, e: PoolError) -> Response {
    if let PoolError::Register { .. } = e {
        log::error!("client {client:#x}: alloc {bytes} failed: {e}");
    } else {
        log::debug!("client {client:#x}: alloc {bytes} refused: {e}");
    }
    Response::error(pool_error_code(&e), e.to_string())
}

pub(super) fn volume_error(e: &VolumeError) -> Response {
    let code = match e {
        VolumeError::NotFound(_) | VolumeError::NoChunk(_) => ErrorCode::NotFound,
        VolumeError::Busy { .. } => ErrorCode::Busy,
        VolumeError::Fenced => ErrorCode::Fenced,
        VolumeError::HoldsAnother { .. } | VolumeError::NotHeld | VolumeError::Root(_) => {
            ErrorCode::BadRequest
        }
    };
    Response::error(code, e.to_string())
}

pub(super) fn pool_error_code(e: &PoolError) -> ErrorCode {
    match e {
        // More than the capacity can never fit: for the client that is "no space".
        PoolError::Alloc(AllocError::NoSpace { .. } | AllocError::TooLarge { .. }) => {
            ErrorCode::NoSpace
        }
        // The memory exists but cannot be lent (e.g. the NIC cannot register more):
        // for the client that is no space here either, so it turns to another memnode.
        PoolError::Register { .. } => ErrorCode::NoSpace,
        PoolError::Alloc(AllocError::NotFound { .. })
        | PoolError::NotFound { .. }
        | PoolError::NotBooked { .. }
        | PoolError::Access { .. } => ErrorCode::NotFound,
        PoolError::Alloc(AllocError::ZeroSize) => ErrorCode::BadRequest,
    }
}
