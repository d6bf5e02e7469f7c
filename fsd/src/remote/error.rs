//! What can go wrong with remote memory: one error type ([`RemoteError`]) that every
//! part of the store returns and fsd's callers match on, and the questions asked of
//! one (was the volume taken over? could the node merely not be reached?). Apart so
//! the whole store shares one vocabulary of failure.

use rmemfs_common::control::ControlError;
use rmemfs_common::fabric::FabricError;
use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RemoteError {
    #[error("remote memory is full")]
    NoSpace,
    #[error("memnode {node} is down: {reason}")]
    NodeDown { node: String, reason: String },
    #[error("memnode {node}: {error}")]
    Fabric { node: String, error: FabricError },
    #[error("memnode {node}: {error}")]
    Control { node: String, error: ControlError },
    #[error("no copy of the block is left: the memnodes that held it were lost")]
    Lost,
    #[error("bytes past a block's allocation ({bytes} bytes) are not zero: fsd would drop them")]
    PastAllocation { bytes: u64 },
    #[error(
        "every copy of the block fails its checksum (the last on memnode {node} at {addr:#x})"
    )]
    Corrupt { node: String, addr: u64 },
    /// A memnode's reply that cannot be true: a length or address past its capacity,
    /// the address space or what was asked for (`checked.rs`). `what` names the
    /// reply, the field and its value.
    #[error("memnode {node} sent a reply fsd does not believe: {what}")]
    Untrusted { node: String, what: String },
}

impl RemoteError {
    /// True when a memnode refused this fsd because another one took its volume over:
    /// a control call answered `Fenced`, or a one-sided access was refused (the
    /// takeover revoked every rkey this fsd had).
    pub fn is_fenced(&self) -> bool {
        match self {
            RemoteError::Control { error, .. } => error.is_fenced(),
            RemoteError::Fabric { error, .. } => matches!(error, FabricError::RemoteAccess { .. }),
            _ => false,
        }
    }
}

/// True for an error that says the node could not be reached (rather than refused
/// the access or the bytes were bad): the operation may succeed once it is back.
pub(super) fn is_unreachable(e: &RemoteError) -> bool {
    match e {
        RemoteError::NodeDown { .. } => true,
        RemoteError::Fabric { error, .. } => {
            error.is_fatal() || matches!(error, FabricError::Timeout { .. })
        }
        RemoteError::Control {
            error: ControlError::Fabric(error),
            ..
        } => error.is_fatal() || matches!(error, FabricError::Timeout { .. }),
        _ => false,
    }
}

/// A background thread of a node's that could not be started, as an error of that node.
pub(super) fn thread_error(node: &str, what: &str, e: std::io::Error) -> RemoteError {
    RemoteError::Fabric {
        node: node.to_string(),
        error: FabricError::Local(format!("cannot start a {what} thread: {e}")),
    }
}
