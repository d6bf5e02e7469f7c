//! Responses on the wire: [`Response::encode`] and [`Response::decode`], field by
//! field over the frame and helpers of `wire.rs`. Pages (chunk lists, volume
//! listings) are cut to what one frame carries, and fields an older memnode does not
//! send read as their defaults.

use super::wire::*;
use super::{
    listing_fits, ErrorCode, NodeStats, ProtocolError, Response, VolumeInfo, VolumeSummary,
    MAX_CHUNKS_PER_REPLY, MAX_ERROR_MESSAGE,
};
use crate::auth::{Proof, WelcomeFacts};
use crate::le;

impl Response {
    /// A convenience constructor for error replies.
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Response {
        Response::Error {
            code,
            message: message.into(),
        }
    }

    /// A Welcome's facts, which its proof covers (`auth::server_proof`), and that
    /// proof; None for any other response.
    pub fn welcome_facts(&self) -> Option<(WelcomeFacts, Proof)> {
        match *self {
            Response::Welcome {
                node_id,
                capacity,
                features,
                resumed,
                boot,
                proof,
            } => Some((
                WelcomeFacts {
                    node_id,
                    capacity,
                    features,
                    resumed,
                    boot,
                },
                proof,
            )),
            _ => None,
        }
    }

    /// Encodes the response as one control frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::new();
        let kind = match self {
            Response::Challenge { nonce } => {
                body.extend_from_slice(nonce);
                K_CHALLENGE
            }
            Response::Welcome {
                node_id,
                capacity,
                features,
                resumed,
                boot,
                proof,
            } => {
                le::put(&mut body, node_id);
                le::put(&mut body, capacity);
                le::put(&mut body, features);
                body.push(*resumed as u8);
                le::put(&mut body, boot);
                body.extend_from_slice(proof);
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
            K_CHALLENGE => Response::Challenge { nonce: r.array()? },
            K_WELCOME => Response::Welcome {
                node_id: r.u64()?,
                capacity: r.u64()?,
                features: r.u32()?,
                resumed: r.flag("resumed")?,
                boot: r.u64()?,
                proof: r.array()?,
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
