//! The control protocol carried by SEND/RECV between fsd and a memnode.
//!
//! Control messages are small, fixed-layout and little-endian. Every frame starts with
//! an 8-byte header `{version: u16, kind: u16, body_len: u32}`; the body length is
//! checked against [`MAX_CONTROL_BODY`] before anything is allocated, and a body must
//! be consumed exactly (no trailing bytes). Data never travels here: it moves with
//! one-sided READ/WRITE on the fabric.
//!
//! A decode error is always a value ([`ProtocolError`]), never a panic: frames come
//! from the network and may be hostile.

use crate::auth::{Nonce, Proof};
use thiserror::Error;

/// The protocol version this build speaks. A peer with another version is refused.
/// Version 2 replaced version 1's Hello, which carried the token and the session's
/// secret in clear, with the challenge-response of `auth.rs`.
pub const PROTOCOL_VERSION: u16 = 2;
/// Bytes in a control frame header.
pub const HEADER_LEN: usize = 8;
/// Largest control body accepted. Control messages are tiny; anything larger is hostile.
pub const MAX_CONTROL_BODY: usize = 1024;
/// Largest whole control frame (header + body).
pub const MAX_CONTROL_FRAME: usize = HEADER_LEN + MAX_CONTROL_BODY;
/// Longest token a client or memnode takes (it never crosses the network: only
/// proofs made with it do).
pub const MAX_TOKEN_LEN: usize = 256;
/// Shortest token accepted: a guessable token is no secret.
pub const MIN_TOKEN_LEN: usize = 16;
/// Longest error message a reply may carry.
pub const MAX_ERROR_MESSAGE: usize = 512;
/// Longest volume name (see [`valid_volume_name`]).
pub const MAX_VOLUME_NAME: usize = 64;
/// Most chunks one `ChunkList` reply carries (2 + 48 * 20 + 1 bytes of body).
pub const MAX_CHUNKS_PER_REPLY: usize = 48;
/// Most spans one `Copy` carries (1 + 32 * 28 bytes of body).
pub const MAX_COPY_SPANS: usize = 32;
/// Most bytes one `Copy` moves in all: the memnode copies them while holding off
/// frees of the chunks involved, so one request stays short (about 2 ms).
pub const MAX_COPY_BYTES: u64 = 16 << 20;

/// Bits of `Welcome::features`: what a memnode does beyond this protocol version's
/// first messages. A memnode that sends none (an older one) has none of them.
/// `Copy` is served.
pub const FEATURE_COPY: u32 = 1;

/// The secret that binds a client's connections to its session on a memnode: derived
/// by both sides from the handshake that starts the session (`auth::session_secret`),
/// proven, never sent, by every later connection (a reconnect resumes the session
/// only with it). All zeros: no session yet. Its `Debug` never shows the bytes, so no
/// log line carries it.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct SessionSecret(pub [u8; SESSION_SECRET_LEN]);

/// Bytes of a [`SessionSecret`].
pub const SESSION_SECRET_LEN: usize = 16;

impl SessionSecret {
    /// No session: what a client's first Hello presents.
    pub const NONE: SessionSecret = SessionSecret([0; SESSION_SECRET_LEN]);

    pub fn is_none(&self) -> bool {
        *self == SessionSecret::NONE
    }
}

impl std::fmt::Debug for SessionSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_none() {
            "SessionSecret(none)"
        } else {
            "SessionSecret(..)"
        })
    }
}

/// True for a volume name this protocol carries: 1..=[`MAX_VOLUME_NAME`] bytes of
/// `[A-Za-z0-9._-]`, and not `.` or `..`. Anything else is refused at decode.
pub fn valid_volume_name(name: &[u8]) -> bool {
    (1..=MAX_VOLUME_NAME).contains(&name.len())
        && name
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && name != b"."
        && name != b".."
}

/// Errors found while decoding a control frame.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ProtocolError {
    #[error("frame truncated: need {needed} bytes, have {have}")]
    Truncated { needed: usize, have: usize },
    #[error("control body of {0} bytes exceeds the limit of {MAX_CONTROL_BODY}")]
    TooLong(usize),
    #[error("protocol version {got} not supported (this side speaks {PROTOCOL_VERSION})")]
    Version { got: u16 },
    #[error("unknown message kind {0:#06x}")]
    UnknownKind(u16),
    #[error("body of message kind {kind:#06x} is {len} bytes, expected {expected}")]
    BodyLength {
        kind: u16,
        len: usize,
        expected: usize,
    },
    #[error("field {0} is out of range")]
    BadField(&'static str),
}

/// Requests a client sends (SEND) to a memnode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// First message on every connection: who the client says it is and its nonce.
    /// `resume`: the client has a session under this id and will prove it knows its
    /// secret (to resume it after a blip, or join it with another connection); false
    /// starts a session. The memnode answers with a `Challenge`.
    Hello {
        client_id: u64,
        nonce: Nonce,
        resume: bool,
    },
    /// Second message on every connection, after the `Challenge`: `proof` shows the
    /// client knows the token (`auth::client_proof`), `session` that it knows the
    /// secret of the session it resumes (`auth::session_proof`; only when the Hello
    /// said `resume`). The memnode answers with `Welcome` or refuses and closes.
    Prove {
        proof: Proof,
        session: Option<Proof>,
    },
    /// Allocate `bytes` of remote memory (rounded up to the memnode's page size).
    Alloc { bytes: u64 },
    /// Give back a whole allocation, named by its start address and rkey.
    Free { addr: u64, rkey: u32 },
    /// Report capacity and usage.
    Stat,
    /// Open (hold) the volume `name`, creating it when `create` and it does not exist;
    /// `takeover` takes it from a live holder (which is fenced).
    VolumeOpen {
        name: Vec<u8>,
        create: bool,
        takeover: bool,
    },
    /// The chunks of the caller's held volume with `addr > after` (root excluded).
    VolumeChunks { after: u64 },
    /// Let go of the held volume: its chunks stay, unreachable until the next open.
    VolumeClose,
    /// Volumes whose name sorts after `after` (empty: from the start).
    VolumeList { after: Vec<u8> },
    /// Free every chunk of the volume `name` and forget it.
    VolumeDestroy { name: Vec<u8> },
    /// Copy bytes inside the memnode's memory, from one allocation of the caller's to
    /// another (or the same), as if READ from `src` and WRITTEN to `dst` with their
    /// rkeys: the same owner and bounds checks, no data on the wire. At most
    /// [`MAX_COPY_SPANS`] spans and [`MAX_COPY_BYTES`] bytes; all are checked before
    /// any is copied. Only where `Welcome::features` has [`FEATURE_COPY`].
    Copy { spans: Vec<CopySpan> },
    /// The caller's scratch chunks with `addr > after` (a `ChunkList`): what its
    /// session holds, to find chunks whose Alloc reply a broken connection lost.
    SessionChunks { after: u64 },
    /// The client is done with its session (a clean shutdown): when its last
    /// connection closes, its scratch memory is reclaimed at once instead of being
    /// kept through the grace period for a reconnect.
    SessionEnd,
}

/// One span of a `Copy`: `len` bytes from `src_addr` (under `src_rkey`) to `dst_addr`
/// (under `dst_rkey`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopySpan {
    pub src_addr: u64,
    pub src_rkey: u32,
    pub dst_addr: u64,
    pub dst_rkey: u32,
    pub len: u32,
}

/// Replies a memnode sends back (the client RECVs them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// The answer to Hello: the memnode's nonce, for the client's `Prove`.
    Challenge { nonce: Nonce },
    /// The client's proofs were accepted; `node_id` names the memnode, `capacity` is
    /// its region size, `features` what it serves beyond the first messages
    /// (`FEATURE_*`). `resumed` is true when the session existed before this
    /// connection (a reconnect found its memory, or another connection of the same
    /// session), false when this one started it (both sides then derive its secret).
    /// `boot` counts the restarts of this memnode instance on its memory file (0
    /// without one): a session resumed under another boot than the client last saw
    /// kept every chunk, but under new rkeys. `proof` is the memnode's
    /// (`auth::server_proof`, over all of the above): the client trusts nothing of a
    /// memnode that cannot make it.
    Welcome {
        node_id: u64,
        capacity: u64,
        features: u32,
        resumed: bool,
        boot: u64,
        proof: Proof,
    },
    /// A new allocation, readable and writable with `rkey` by its owner only.
    Allocated(Allocation),
    /// The allocation was freed and its rkey revoked.
    Freed,
    /// Usage figures.
    Stats(NodeStats),
    /// The volume is now held by the caller.
    VolumeOpened(VolumeInfo),
    /// A page of the held volume's chunks, in address order; `more` when later ones
    /// exist (ask again with `after` = the last address).
    ChunkList { chunks: Vec<Allocation>, more: bool },
    /// The volume is no longer held by the caller.
    VolumeClosed,
    /// A page of volumes in name order; `more` when later ones exist (ask again with
    /// `after` = the last name).
    VolumeListing {
        volumes: Vec<VolumeSummary>,
        more: bool,
    },
    /// The volume is gone; `bytes` were freed.
    VolumeDestroyed { bytes: u64 },
    /// Every span of a `Copy` was copied: `bytes` in all.
    Copied { bytes: u64 },
    /// The session ends when its last connection closes.
    SessionEnding,
    /// The request failed.
    Error { code: ErrorCode, message: String },
}

/// One allocation: a remote address range and the key that grants access to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Allocation {
    pub addr: u64,
    pub len: u64,
    pub rkey: u32,
}

/// A memnode's usage as reported by `Stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeStats {
    pub capacity: u64,
    pub used: u64,
    pub clients: u32,
    pub allocations: u32,
}

/// What `VolumeOpen` returns: the volume, its root chunk (with an rkey valid for the
/// caller) and its size, root included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeInfo {
    pub volume_id: u64,
    /// True when this open created the volume (its root chunk is all zeroes).
    pub created: bool,
    pub root: Allocation,
    /// Chunks of the volume, root included.
    pub chunks: u32,
    /// Bytes of the volume, root included.
    pub bytes: u64,
}

/// One volume as `VolumeList` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeSummary {
    pub name: Vec<u8>,
    pub volume_id: u64,
    pub bytes: u64,
    pub chunks: u32,
    /// The client holding it, 0 when none does.
    pub holder: u64,
}

impl VolumeSummary {
    /// Bytes this summary takes in a `VolumeListing` body.
    pub fn wire_len(&self) -> usize {
        2 + self.name.len().min(MAX_VOLUME_NAME + 1) + 8 + 8 + 4 + 8
    }
}

/// How many of `volumes`, from the first, fit in one `VolumeListing` reply.
pub fn listing_fits(volumes: &[VolumeSummary]) -> usize {
    // The body: a u16 count, the summaries, a u8 `more` flag.
    let mut room = MAX_CONTROL_BODY - 3;
    let mut n = 0;
    for v in volumes.iter().take(u16::MAX as usize) {
        match room.checked_sub(v.wire_len()) {
            Some(r) => room = r,
            None => break,
        }
        n += 1;
    }
    n
}

/// Why a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// Not enough free memory for the allocation.
    NoSpace,
    /// The request was malformed or made no sense (zero size, ...).
    BadRequest,
    /// Free named an allocation that does not exist or is not the caller's.
    NotFound,
    /// The client's proof did not match a token (or a session) of the memnode.
    AuthFailed,
    /// The peer speaks another protocol version.
    VersionMismatch,
    /// A request other than Hello arrived before Hello.
    NotAuthenticated,
    /// The volume is held by another live client (the message names it).
    Busy,
    /// This client's hold on its volume was taken over by another client.
    Fenced,
    /// The client's tenant holds its quota of memory or of volumes (the message
    /// names the tenant, its quota and its use). For the client, as `NoSpace`.
    OverQuota,
    /// A code this build does not know (a newer peer).
    Unknown(u16),
}

impl ErrorCode {
    fn to_wire(self) -> u16 {
        match self {
            ErrorCode::NoSpace => 1,
            ErrorCode::BadRequest => 2,
            ErrorCode::NotFound => 3,
            ErrorCode::AuthFailed => 4,
            ErrorCode::VersionMismatch => 5,
            ErrorCode::NotAuthenticated => 6,
            ErrorCode::Busy => 7,
            ErrorCode::Fenced => 8,
            ErrorCode::OverQuota => 9,
            ErrorCode::Unknown(c) => c,
        }
    }

    fn from_wire(code: u16) -> Self {
        match code {
            1 => ErrorCode::NoSpace,
            2 => ErrorCode::BadRequest,
            3 => ErrorCode::NotFound,
            4 => ErrorCode::AuthFailed,
            5 => ErrorCode::VersionMismatch,
            6 => ErrorCode::NotAuthenticated,
            7 => ErrorCode::Busy,
            8 => ErrorCode::Fenced,
            9 => ErrorCode::OverQuota,
            c => ErrorCode::Unknown(c),
        }
    }
}

// The wire layout: the frame header and field helpers shared by both directions, then
// each direction's messages.
mod request;
mod response;
mod wire;

#[cfg(test)]
mod tests;
