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
    Hello { client_id: u64, token: Vec<u8> },
    /// Allocate `bytes` of remote memory (rounded up to the memnode's page size).
    Alloc { bytes: u64 },
    /// Give back a whole allocation, named by its start address and rkey.
    Free { addr: u64, rkey: u32 },
    /// Report capacity and usage.
    Stat,
}

/// Replies a memnode sends back (the client RECVs them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// Hello accepted; `node_id` names the memnode, `capacity` is its region size.
    Welcome { node_id: u64, capacity: u64 },
    /// A new allocation, readable and writable with `rkey` by its owner only.
    Allocated(Allocation),
    /// The allocation was freed and its rkey revoked.
    Freed,
    /// Usage figures.
    Stats(NodeStats),
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
            c => ErrorCode::Unknown(c),
        }
    }
}

// Message kinds on the wire. Requests have the high bit clear, responses set.
const K_HELLO: u16 = 0x0001;
const K_ALLOC: u16 = 0x0002;
const K_FREE: u16 = 0x0003;
const K_STAT: u16 = 0x0004;
const K_WELCOME: u16 = 0x8001;
const K_ALLOCATED: u16 = 0x8002;
const K_FREED: u16 = 0x8003;
const K_STATS: u16 = 0x8004;
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
    let version = u16::from_le_bytes([frame[0], frame[1]]);
    let kind = u16::from_le_bytes([frame[2], frame[3]]);
    let body_len = u32::from_le_bytes([frame[4], frame[5], frame[6], frame[7]]) as usize;
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
    out.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// A cursor over a body that fails with `Truncated` instead of panicking.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtocolError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        match end {
            Some(end) => {
                let s = &self.buf[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(ProtocolError::Truncated {
                needed: self.pos.saturating_add(n),
                have: self.buf.len(),
            }),
        }
    }

    fn u16(&mut self) -> Result<u16, ProtocolError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, ProtocolError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, ProtocolError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// Length-prefixed (u16) bytes, at most `max` long.
    fn bytes(&mut self, max: usize, field: &'static str) -> Result<&'a [u8], ProtocolError> {
        let n = self.u16()? as usize;
        if n > max {
            return Err(ProtocolError::BadField(field));
        }
        self.take(n)
    }

    /// The whole body must be consumed: trailing bytes are an error.
    fn finish(self, kind: u16) -> Result<(), ProtocolError> {
        if self.pos != self.buf.len() {
            return Err(ProtocolError::BodyLength {
                kind,
                len: self.buf.len(),
                expected: self.pos,
            });
        }
        Ok(())
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u16).to_le_bytes());
    out.extend_from_slice(b);
}

impl Request {
    /// Encodes the request as one control frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::new();
        let kind = match self {
            Request::Hello { client_id, token } => {
                body.extend_from_slice(&client_id.to_le_bytes());
                put_bytes(&mut body, &token[..token.len().min(MAX_TOKEN_LEN)]);
                K_HELLO
            }
            Request::Alloc { bytes } => {
                body.extend_from_slice(&bytes.to_le_bytes());
                K_ALLOC
            }
            Request::Free { addr, rkey } => {
                body.extend_from_slice(&addr.to_le_bytes());
                body.extend_from_slice(&rkey.to_le_bytes());
                K_FREE
            }
            Request::Stat => K_STAT,
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
            },
            K_ALLOC => Request::Alloc { bytes: r.u64()? },
            K_FREE => Request::Free {
                addr: r.u64()?,
                rkey: r.u32()?,
            },
            K_STAT => Request::Stat,
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
            Response::Welcome { node_id, capacity } => {
                body.extend_from_slice(&node_id.to_le_bytes());
                body.extend_from_slice(&capacity.to_le_bytes());
                K_WELCOME
            }
            Response::Allocated(a) => {
                body.extend_from_slice(&a.addr.to_le_bytes());
                body.extend_from_slice(&a.len.to_le_bytes());
                body.extend_from_slice(&a.rkey.to_le_bytes());
                K_ALLOCATED
            }
            Response::Freed => K_FREED,
            Response::Stats(s) => {
                body.extend_from_slice(&s.capacity.to_le_bytes());
                body.extend_from_slice(&s.used.to_le_bytes());
                body.extend_from_slice(&s.clients.to_le_bytes());
                body.extend_from_slice(&s.allocations.to_le_bytes());
                K_STATS
            }
            Response::Error { code, message } => {
                body.extend_from_slice(&code.to_wire().to_le_bytes());
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
            },
            K_ALLOCATED => Response::Allocated(Allocation {
                addr: r.u64()?,
                len: r.u64()?,
                rkey: r.u32()?,
            }),
            K_FREED => Response::Freed,
            K_STATS => Response::Stats(NodeStats {
                capacity: r.u64()?,
                used: r.u64()?,
                clients: r.u32()?,
                allocations: r.u32()?,
            }),
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
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn all_requests() -> Vec<Request> {
        vec![
            Request::Hello {
                client_id: 0xdead_beef_0123_4567,
                token: b"secret".to_vec(),
            },
            Request::Hello {
                client_id: 0,
                token: vec![],
            },
            Request::Alloc { bytes: 64 << 20 },
            Request::Free {
                addr: 1 << 40,
                rkey: 0xabcd_ef01,
            },
            Request::Stat,
        ]
    }

    fn all_responses() -> Vec<Response> {
        vec![
            Response::Welcome {
                node_id: 7,
                capacity: 4 << 30,
            },
            Response::Allocated(Allocation {
                addr: 4096,
                len: 1 << 26,
                rkey: 99,
            }),
            Response::Freed,
            Response::Stats(NodeStats {
                capacity: 1 << 30,
                used: 1 << 20,
                clients: 3,
                allocations: 9,
            }),
            Response::error(ErrorCode::NoSpace, "out of memory"),
            Response::error(ErrorCode::Unknown(0x4242), ""),
        ]
    }

    #[test]
    fn every_request_round_trips() {
        for req in all_requests() {
            assert_eq!(Request::decode(&req.encode()), Ok(req));
        }
    }

    #[test]
    fn every_response_round_trips() {
        for resp in all_responses() {
            assert_eq!(Response::decode(&resp.encode()), Ok(resp));
        }
    }

    #[test]
    fn every_truncation_of_a_valid_frame_is_an_error() {
        for req in all_requests() {
            let f = req.encode();
            for cut in 0..f.len() {
                assert!(Request::decode(&f[..cut]).is_err(), "{req:?} cut at {cut}");
            }
        }
        for resp in all_responses() {
            let f = resp.encode();
            for cut in 0..f.len() {
                assert!(
                    Response::decode(&f[..cut]).is_err(),
                    "{resp:?} cut at {cut}"
                );
            }
        }
    }

    #[test]
    fn trailing_bytes_are_rejected() {
        let mut f = Request::Alloc { bytes: 1 }.encode();
        f.push(0);
        f[4] += 1; // body length now covers the extra byte
        assert!(matches!(
            Request::decode(&f),
            Err(ProtocolError::BodyLength { .. })
        ));
    }

    #[test]
    fn oversized_body_length_is_rejected_before_reading_the_body() {
        let mut f = Request::Stat.encode();
        f[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            Request::decode(&f),
            Err(ProtocolError::TooLong(u32::MAX as usize))
        );
    }

    #[test]
    fn wrong_version_is_rejected() {
        let mut f = Request::Stat.encode();
        f[0..2].copy_from_slice(&2u16.to_le_bytes());
        assert_eq!(Request::decode(&f), Err(ProtocolError::Version { got: 2 }));
    }

    #[test]
    fn unknown_kind_is_rejected() {
        let mut f = Request::Stat.encode();
        f[2..4].copy_from_slice(&0x7777u16.to_le_bytes());
        assert_eq!(Request::decode(&f), Err(ProtocolError::UnknownKind(0x7777)));
        // A response kind is not a request.
        assert!(Request::decode(&Response::Freed.encode()).is_err());
    }

    #[test]
    fn token_longer_than_the_limit_is_rejected() {
        let mut body = Vec::new();
        body.extend_from_slice(&1u64.to_le_bytes());
        body.extend_from_slice(&((MAX_TOKEN_LEN + 1) as u16).to_le_bytes());
        body.extend(std::iter::repeat_n(b'x', MAX_TOKEN_LEN + 1));
        assert_eq!(
            Request::decode(&frame(K_HELLO, &body)),
            Err(ProtocolError::BadField("token"))
        );
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = Request::decode(&bytes);
            let _ = Response::decode(&bytes);
        }

        #[test]
        fn garbage_after_a_valid_header_never_panics(
            kind in any::<u16>(),
            body in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let f = frame(kind, &body);
            let _ = Request::decode(&f);
            let _ = Response::decode(&f);
        }

        #[test]
        fn hello_round_trips(client_id in any::<u64>(), token in proptest::collection::vec(any::<u8>(), 0..MAX_TOKEN_LEN)) {
            let req = Request::Hello { client_id, token };
            prop_assert_eq!(Request::decode(&req.encode()), Ok(req));
        }
    }
}
