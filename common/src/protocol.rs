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

use crate::le;
use thiserror::Error;

/// The protocol version this build speaks. A peer with another version is refused.
pub const PROTOCOL_VERSION: u16 = 1;
/// Bytes in a control frame header.
pub const HEADER_LEN: usize = 8;
/// Largest control body accepted. Control messages are tiny; anything larger is hostile.
pub const MAX_CONTROL_BODY: usize = 1024;
/// Largest whole control frame (header + body).
pub const MAX_CONTROL_FRAME: usize = HEADER_LEN + MAX_CONTROL_BODY;
/// Longest auth token a Hello may carry.
pub const MAX_TOKEN_LEN: usize = 256;
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

/// The secret that binds a client's connections to its session on a memnode: handed
/// out in the `Welcome` of the session's first Hello, presented in the Hello of every
/// later connection (a reconnect resumes the session only with it). All zeros: no
/// session yet. Its `Debug` never shows the bytes, so no log line carries it.
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
    /// First message on every connection: who the client is and its credentials.
    /// `session` is the secret of the client's session, to resume it (or join it with
    /// another connection), or [`SessionSecret::NONE`] to start one. A Hello without
    /// the field (an older client) starts a session too.
    Hello {
        client_id: u64,
        token: Vec<u8>,
        session: SessionSecret,
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
    /// Hello accepted; `node_id` names the memnode, `capacity` is its region size,
    /// `features` what it serves beyond the first messages (`FEATURE_*`; an older
    /// memnode's Welcome has no such field, read as none).
    /// `session` is the session's secret; `resumed` is true when the session existed
    /// before this Hello (a reconnect found its memory, or another connection of the
    /// same session), false when this Hello started it. An older memnode sends neither
    /// (read as no secret, not resumed).
    /// `boot` counts the restarts of this memnode instance on its memory file (0
    /// without one, or from an older memnode): a session resumed under another boot
    /// than the client last saw kept every chunk, but under new rkeys.
    Welcome {
        node_id: u64,
        capacity: u64,
        features: u32,
        session: SessionSecret,
        resumed: bool,
        boot: u64,
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
    /// Hello carried a wrong token.
    AuthFailed,
    /// The peer speaks another protocol version.
    VersionMismatch,
    /// A request other than Hello arrived before Hello.
    NotAuthenticated,
    /// The volume is held by another live client (the message names it).
    Busy,
    /// This client's hold on its volume was taken over by another client.
    Fenced,
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
            c => ErrorCode::Unknown(c),
        }
    }
}

// Message kinds on the wire. Requests have the high bit clear, responses set.
const K_HELLO: u16 = 0x0001;
const K_ALLOC: u16 = 0x0002;
const K_FREE: u16 = 0x0003;
const K_STAT: u16 = 0x0004;
const K_VOLUME_OPEN: u16 = 0x0005;
const K_VOLUME_CHUNKS: u16 = 0x0006;
const K_VOLUME_CLOSE: u16 = 0x0007;
const K_VOLUME_LIST: u16 = 0x0008;
const K_VOLUME_DESTROY: u16 = 0x0009;
const K_COPY: u16 = 0x000a;
const K_SESSION_END: u16 = 0x000b;
const K_SESSION_CHUNKS: u16 = 0x000c;
const K_WELCOME: u16 = 0x8001;
const K_ALLOCATED: u16 = 0x8002;
const K_FREED: u16 = 0x8003;
const K_STATS: u16 = 0x8004;
const K_VOLUME_OPENED: u16 = 0x8005;
const K_CHUNK_LIST: u16 = 0x8006;
const K_VOLUME_CLOSED: u16 = 0x8007;
const K_VOLUME_LISTING: u16 = 0x8008;
const K_VOLUME_DESTROYED: u16 = 0x8009;
const K_COPIED: u16 = 0x800a;
const K_SESSION_ENDING: u16 = 0x800b;

// VolumeOpen's flag bits; any other bit set is a bad field.
const OPEN_CREATE: u8 = 0x01;
const OPEN_TAKEOVER: u8 = 0x02;
const K_ERROR: u16 = 0x80ff;

/// Checks a frame header and returns `(kind, body)`, refusing a wrong version or a body
/// length beyond the limit before looking further.
fn split_frame(frame: &[u8]) -> Result<(u16, &[u8]), ProtocolError> {
    if frame.len() < HEADER_LEN {
        return Err(ProtocolError::Truncated {
            needed: HEADER_LEN,
            have: frame.len(),
        });
    }
    let mut head = le::Reader::new(frame);
    let version = head.u16()?;
    let kind = head.u16()?;
    let body_len = head.u32()? as usize;
    if version != PROTOCOL_VERSION {
        return Err(ProtocolError::Version { got: version });
    }
    if body_len > MAX_CONTROL_BODY {
        return Err(ProtocolError::TooLong(body_len));
    }
    let body = &frame[HEADER_LEN..];
    if body.len() != body_len {
        return Err(ProtocolError::BodyLength {
            kind,
            len: body.len(),
            expected: body_len,
        });
    }
    Ok((kind, body))
}

fn frame(kind: u16, body: &[u8]) -> Vec<u8> {
    debug_assert!(body.len() <= MAX_CONTROL_BODY);
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    le::put(&mut out, PROTOCOL_VERSION);
    le::put(&mut out, kind);
    le::put(&mut out, body.len() as u32);
    out.extend_from_slice(body);
    out
}

impl From<le::Truncated> for ProtocolError {
    fn from(t: le::Truncated) -> Self {
        ProtocolError::Truncated {
            needed: t.needed,
            have: t.have,
        }
    }
}

/// A cursor over a body ([`le::Reader`]) that fails with `Truncated` instead of
/// panicking, and knows the protocol's compound fields.
struct Reader<'a> {
    r: le::Reader<'a>,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader {
            r: le::Reader::new(buf),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtocolError> {
        Ok(self.r.take(n)?)
    }

    fn u8(&mut self) -> Result<u8, ProtocolError> {
        Ok(self.r.u8()?)
    }

    fn remaining(&self) -> usize {
        self.r.remaining()
    }

    /// A byte that must be 0 or 1.
    fn flag(&mut self, field: &'static str) -> Result<bool, ProtocolError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(ProtocolError::BadField(field)),
        }
    }

    fn u16(&mut self) -> Result<u16, ProtocolError> {
        Ok(self.r.u16()?)
    }

    fn u32(&mut self) -> Result<u32, ProtocolError> {
        Ok(self.r.u32()?)
    }

    fn u64(&mut self) -> Result<u64, ProtocolError> {
        Ok(self.r.u64()?)
    }

    /// Length-prefixed (u16) bytes, at most `max` long.
    fn bytes(&mut self, max: usize, field: &'static str) -> Result<&'a [u8], ProtocolError> {
        let n = self.u16()? as usize;
        if n > max {
            return Err(ProtocolError::BadField(field));
        }
        self.take(n)
    }

    /// A length-prefixed volume name that [`valid_volume_name`] accepts.
    fn volume_name(&mut self) -> Result<Vec<u8>, ProtocolError> {
        let name = self.bytes(MAX_VOLUME_NAME, "volume name")?;
        if !valid_volume_name(name) {
            return Err(ProtocolError::BadField("volume name"));
        }
        Ok(name.to_vec())
    }

    fn session(&mut self) -> Result<SessionSecret, ProtocolError> {
        let mut s = SessionSecret::NONE;
        s.0.copy_from_slice(self.take(SESSION_SECRET_LEN)?);
        Ok(s)
    }

    fn allocation(&mut self) -> Result<Allocation, ProtocolError> {
        Ok(Allocation {
            addr: self.u64()?,
            len: self.u64()?,
            rkey: self.u32()?,
        })
    }

    /// The whole body must be consumed: trailing bytes are an error.
    fn finish(self, kind: u16) -> Result<(), ProtocolError> {
        if !self.r.is_empty() {
            return Err(ProtocolError::BodyLength {
                kind,
                len: self.r.len(),
                expected: self.r.position(),
            });
        }
        Ok(())
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    le::put(out, b.len() as u16);
    out.extend_from_slice(b);
}

/// A volume name as sent. A name longer than the limit is cut to one byte over it,
/// so the frame stays small and the peer still refuses it: cutting it to the limit
/// could turn it into another, valid, name.
fn put_name(out: &mut Vec<u8>, name: &[u8]) {
    put_bytes(out, &name[..name.len().min(MAX_VOLUME_NAME + 1)]);
}

fn put_allocation(out: &mut Vec<u8>, a: &Allocation) {
    le::put(out, a.addr);
    le::put(out, a.len);
    le::put(out, a.rkey);
}

impl Request {
    /// Encodes the request as one control frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::new();
        let kind = match self {
            Request::Hello {
                client_id,
                token,
                session,
            } => {
                le::put(&mut body, client_id);
                put_bytes(&mut body, &token[..token.len().min(MAX_TOKEN_LEN)]);
                body.extend_from_slice(&session.0);
                K_HELLO
            }
            Request::Alloc { bytes } => {
                le::put(&mut body, bytes);
                K_ALLOC
            }
            Request::Free { addr, rkey } => {
                le::put(&mut body, addr);
                le::put(&mut body, rkey);
                K_FREE
            }
            Request::Stat => K_STAT,
            Request::VolumeOpen {
                name,
                create,
                takeover,
            } => {
                put_name(&mut body, name);
                let mut flags = 0u8;
                if *create {
                    flags |= OPEN_CREATE;
                }
                if *takeover {
                    flags |= OPEN_TAKEOVER;
                }
                body.push(flags);
                K_VOLUME_OPEN
            }
            Request::VolumeChunks { after } => {
                le::put(&mut body, after);
                K_VOLUME_CHUNKS
            }
            Request::VolumeClose => K_VOLUME_CLOSE,
            Request::VolumeList { after } => {
                put_name(&mut body, after);
                K_VOLUME_LIST
            }
            Request::VolumeDestroy { name } => {
                put_name(&mut body, name);
                K_VOLUME_DESTROY
            }
            Request::Copy { spans } => {
                // More than a frame carries: the first ones (the memnode then copies
                // fewer than asked, which the caller sees in `Copied`).
                let n = spans.len().min(MAX_COPY_SPANS);
                body.push(n as u8);
                for s in &spans[..n] {
                    le::put(&mut body, s.src_addr);
                    le::put(&mut body, s.src_rkey);
                    le::put(&mut body, s.dst_addr);
                    le::put(&mut body, s.dst_rkey);
                    le::put(&mut body, s.len);
                }
                K_COPY
            }
            Request::SessionEnd => K_SESSION_END,
            Request::SessionChunks { after } => {
                le::put(&mut body, after);
                K_SESSION_CHUNKS
            }
        };
        frame(kind, &body)
    }

    /// Decodes one control frame holding a request.
    pub fn decode(frame: &[u8]) -> Result<Request, ProtocolError> {
        let (kind, body) = split_frame(frame)?;
        let mut r = Reader::new(body);
        let req = match kind {
            K_HELLO => Request::Hello {
                client_id: r.u64()?,
                token: r.bytes(MAX_TOKEN_LEN, "token")?.to_vec(),
                // An older client ends here.
                session: if r.remaining() == 0 {
                    SessionSecret::NONE
                } else {
                    r.session()?
                },
            },
            K_SESSION_END => Request::SessionEnd,
            K_SESSION_CHUNKS => Request::SessionChunks { after: r.u64()? },
            K_ALLOC => Request::Alloc { bytes: r.u64()? },
            K_FREE => Request::Free {
                addr: r.u64()?,
                rkey: r.u32()?,
            },
            K_STAT => Request::Stat,
            K_VOLUME_OPEN => {
                let name = r.volume_name()?;
                let flags = r.u8()?;
                if flags & !(OPEN_CREATE | OPEN_TAKEOVER) != 0 {
                    return Err(ProtocolError::BadField("volume open flags"));
                }
                Request::VolumeOpen {
                    name,
                    create: flags & OPEN_CREATE != 0,
                    takeover: flags & OPEN_TAKEOVER != 0,
                }
            }
            K_VOLUME_CHUNKS => Request::VolumeChunks { after: r.u64()? },
            K_VOLUME_CLOSE => Request::VolumeClose,
            K_VOLUME_LIST => {
                // Empty (from the start) or a volume name.
                let after = r.bytes(MAX_VOLUME_NAME, "volume name")?;
                if !after.is_empty() && !valid_volume_name(after) {
                    return Err(ProtocolError::BadField("volume name"));
                }
                Request::VolumeList {
                    after: after.to_vec(),
                }
            }
            K_VOLUME_DESTROY => Request::VolumeDestroy {
                name: r.volume_name()?,
            },
            K_COPY => {
                let n = r.u8()? as usize;
                if !(1..=MAX_COPY_SPANS).contains(&n) {
                    return Err(ProtocolError::BadField("copy spans"));
                }
                let mut spans = Vec::with_capacity(n);
                let mut total = 0u64;
                for _ in 0..n {
                    let s = CopySpan {
                        src_addr: r.u64()?,
                        src_rkey: r.u32()?,
                        dst_addr: r.u64()?,
                        dst_rkey: r.u32()?,
                        len: r.u32()?,
                    };
                    total += s.len as u64;
                    if s.len == 0 || total > MAX_COPY_BYTES {
                        return Err(ProtocolError::BadField("copy length"));
                    }
                    spans.push(s);
                }
                Request::Copy { spans }
            }
            other => return Err(ProtocolError::UnknownKind(other)),
        };
        r.finish(kind)?;
        Ok(req)
    }
}

impl Response {
    /// A convenience constructor for error replies.
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Response {
        Response::Error {
            code,
            message: message.into(),
        }
    }

    /// Encodes the response as one control frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::new();
        let kind = match self {
            Response::Welcome {
                node_id,
                capacity,
                features,
                session,
                resumed,
                boot,
            } => {
                le::put(&mut body, node_id);
                le::put(&mut body, capacity);
                le::put(&mut body, features);
                body.extend_from_slice(&session.0);
                body.push(*resumed as u8);
                le::put(&mut body, boot);
                K_WELCOME
            }
            Response::Allocated(a) => {
                put_allocation(&mut body, a);
                K_ALLOCATED
            }
            Response::Freed => K_FREED,
            Response::Stats(s) => {
                le::put(&mut body, s.capacity);
                le::put(&mut body, s.used);
                le::put(&mut body, s.clients);
                le::put(&mut body, s.allocations);
                K_STATS
            }
            Response::VolumeOpened(v) => {
                le::put(&mut body, v.volume_id);
                body.push(v.created as u8);
                put_allocation(&mut body, &v.root);
                le::put(&mut body, v.chunks);
                le::put(&mut body, v.bytes);
                K_VOLUME_OPENED
            }
            Response::ChunkList { chunks, more } => {
                // More than a reply carries: send the first ones and say there are
                // more, so a client paging by the last address still sees them all.
                let n = chunks.len().min(MAX_CHUNKS_PER_REPLY);
                le::put(&mut body, n as u16);
                for a in &chunks[..n] {
                    put_allocation(&mut body, a);
                }
                body.push((*more || n < chunks.len()) as u8);
                K_CHUNK_LIST
            }
            Response::VolumeClosed => K_VOLUME_CLOSED,
            Response::SessionEnding => K_SESSION_ENDING,
            Response::VolumeListing { volumes, more } => {
                // As for ChunkList: what does not fit is left for the next page.
                let n = listing_fits(volumes);
                le::put(&mut body, n as u16);
                for v in &volumes[..n] {
                    put_name(&mut body, &v.name);
                    le::put(&mut body, v.volume_id);
                    le::put(&mut body, v.bytes);
                    le::put(&mut body, v.chunks);
                    le::put(&mut body, v.holder);
                }
                body.push((*more || n < volumes.len()) as u8);
                K_VOLUME_LISTING
            }
            Response::Copied { bytes } => {
                le::put(&mut body, bytes);
                K_COPIED
            }
            Response::VolumeDestroyed { bytes } => {
                le::put(&mut body, bytes);
                K_VOLUME_DESTROYED
            }
            Response::Error { code, message } => {
                le::put(&mut body, code.to_wire());
                let mut end = message.len().min(MAX_ERROR_MESSAGE);
                while !message.is_char_boundary(end) {
                    end -= 1;
                }
                put_bytes(&mut body, &message.as_bytes()[..end]);
                K_ERROR
            }
        };
        frame(kind, &body)
    }

    /// Decodes one control frame holding a response.
    pub fn decode(frame: &[u8]) -> Result<Response, ProtocolError> {
        let (kind, body) = split_frame(frame)?;
        let mut r = Reader::new(body);
        let resp = match kind {
            K_WELCOME => Response::Welcome {
                node_id: r.u64()?,
                capacity: r.u64()?,
                // An older memnode ends here.
                features: if r.remaining() == 0 { 0 } else { r.u32()? },
                // And an older one still here.
                session: if r.remaining() == 0 {
                    SessionSecret::NONE
                } else {
                    r.session()?
                },
                resumed: if r.remaining() == 0 {
                    false
                } else {
                    r.flag("resumed")?
                },
                boot: if r.remaining() == 0 { 0 } else { r.u64()? },
            },
            K_SESSION_ENDING => Response::SessionEnding,
            K_ALLOCATED => Response::Allocated(r.allocation()?),
            K_FREED => Response::Freed,
            K_STATS => Response::Stats(NodeStats {
                capacity: r.u64()?,
                used: r.u64()?,
                clients: r.u32()?,
                allocations: r.u32()?,
            }),
            K_VOLUME_OPENED => Response::VolumeOpened(VolumeInfo {
                volume_id: r.u64()?,
                created: r.flag("created")?,
                root: r.allocation()?,
                chunks: r.u32()?,
                bytes: r.u64()?,
            }),
            K_CHUNK_LIST => {
                let n = r.u16()? as usize;
                if n > MAX_CHUNKS_PER_REPLY {
                    return Err(ProtocolError::BadField("chunk count"));
                }
                let mut chunks = Vec::with_capacity(n);
                for _ in 0..n {
                    chunks.push(r.allocation()?);
                }
                Response::ChunkList {
                    chunks,
                    more: r.flag("more")?,
                }
            }
            K_VOLUME_CLOSED => Response::VolumeClosed,
            K_VOLUME_LISTING => {
                // No capacity from the count: each entry is read (and bounded by the
                // body) before it is kept.
                let n = r.u16()? as usize;
                let mut volumes = Vec::new();
                for _ in 0..n {
                    volumes.push(VolumeSummary {
                        name: r.volume_name()?,
                        volume_id: r.u64()?,
                        bytes: r.u64()?,
                        chunks: r.u32()?,
                        holder: r.u64()?,
                    });
                }
                Response::VolumeListing {
                    volumes,
                    more: r.flag("more")?,
                }
            }
            K_VOLUME_DESTROYED => Response::VolumeDestroyed { bytes: r.u64()? },
            K_COPIED => Response::Copied { bytes: r.u64()? },
            K_ERROR => Response::Error {
                code: ErrorCode::from_wire(r.u16()?),
                message: String::from_utf8_lossy(r.bytes(MAX_ERROR_MESSAGE, "message")?)
                    .into_owned(),
            },
            other => return Err(ProtocolError::UnknownKind(other)),
        };
        r.finish(kind)?;
        Ok(resp)
    }
}

#[cfg(test)]
#[path = "protocol_tests.rs"]
mod tests;
