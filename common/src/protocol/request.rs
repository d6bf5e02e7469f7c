//! Requests on the wire: [`Request::encode`] and [`Request::decode`], field by field
//! over the frame and helpers of `wire.rs`. Decoding checks every field a memnode
//! would trust (names, flags, copy spans and their total) before building the value.

use super::wire::*;
use super::{
    valid_volume_name, CopySpan, ProtocolError, Request, MAX_COPY_BYTES, MAX_COPY_SPANS,
    MAX_VOLUME_NAME,
};
use crate::le;

impl Request {
    /// Encodes the request as one control frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::new();
        let kind = match self {
            Request::Hello {
                client_id,
                nonce,
                resume,
            } => {
                le::put(&mut body, client_id);
                body.extend_from_slice(nonce);
                body.push(*resume as u8);
                K_HELLO
            }
            Request::Prove { proof, session } => {
                body.extend_from_slice(proof);
                if let Some(s) = session {
                    body.extend_from_slice(s);
                }
                K_PROVE
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
                nonce: r.array()?,
                resume: r.flag("resume")?,
            },
            K_PROVE => Request::Prove {
                proof: r.array()?,
                // The session's proof is there or not: the body's length says which.
                session: if r.remaining() == 0 {
                    None
                } else {
                    Some(r.array()?)
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
