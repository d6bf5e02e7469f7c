//! The control protocol's wire layout shared by requests and responses: the message
//! kinds and flag bits, the frame header (built and checked), and the body's field
//! helpers (a [`Reader`] that fails instead of panicking, the `put_*` writers). Kept
//! apart from the messages so each direction's codec reads as its fields only.

use super::{
    valid_volume_name, Allocation, ProtocolError, HEADER_LEN, MAX_CONTROL_BODY, MAX_VOLUME_NAME,
    PROTOCOL_VERSION,
};
use crate::le;

// Message kinds on the wire. Requests have the high bit clear, responses set.
pub(super) const K_HELLO: u16 = 0x0001;
pub(super) const K_ALLOC: u16 = 0x0002;
pub(super) const K_FREE: u16 = 0x0003;
pub(super) const K_STAT: u16 = 0x0004;
pub(super) const K_VOLUME_OPEN: u16 = 0x0005;
pub(super) const K_VOLUME_CHUNKS: u16 = 0x0006;
pub(super) const K_VOLUME_CLOSE: u16 = 0x0007;
pub(super) const K_VOLUME_LIST: u16 = 0x0008;
pub(super) const K_VOLUME_DESTROY: u16 = 0x0009;
pub(super) const K_COPY: u16 = 0x000a;
pub(super) const K_SESSION_END: u16 = 0x000b;
pub(super) const K_SESSION_CHUNKS: u16 = 0x000c;
pub(super) const K_PROVE: u16 = 0x000d;
pub(super) const K_WELCOME: u16 = 0x8001;
pub(super) const K_ALLOCATED: u16 = 0x8002;
pub(super) const K_FREED: u16 = 0x8003;
pub(super) const K_STATS: u16 = 0x8004;
pub(super) const K_VOLUME_OPENED: u16 = 0x8005;
pub(super) const K_CHUNK_LIST: u16 = 0x8006;
pub(super) const K_VOLUME_CLOSED: u16 = 0x8007;
pub(super) const K_VOLUME_LISTING: u16 = 0x8008;
pub(super) const K_VOLUME_DESTROYED: u16 = 0x8009;
pub(super) const K_COPIED: u16 = 0x800a;
pub(super) const K_SESSION_ENDING: u16 = 0x800b;
pub(super) const K_CHALLENGE: u16 = 0x800c;
pub(super) const K_ERROR: u16 = 0x80ff;

// VolumeOpen's flag bits; any other bit set is a bad field.
pub(super) const OPEN_CREATE: u8 = 0x01;
pub(super) const OPEN_TAKEOVER: u8 = 0x02;

/// Checks a frame header and returns `(kind, body)`, refusing a wrong version or a body
/// length beyond the limit before looking further.
pub(super) fn split_frame(frame: &[u8]) -> Result<(u16, &[u8]), ProtocolError> {
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

pub(super) fn frame(kind: u16, body: &[u8]) -> Vec<u8> {
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
pub(super) struct Reader<'a> {
    r: le::Reader<'a>,
}

impl<'a> Reader<'a> {
    pub(super) fn new(buf: &'a [u8]) -> Self {
        Reader {
            r: le::Reader::new(buf),
        }
    }

    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], ProtocolError> {
        Ok(self.r.take(n)?)
    }

    pub(super) fn u8(&mut self) -> Result<u8, ProtocolError> {
        Ok(self.r.u8()?)
    }

    pub(super) fn remaining(&self) -> usize {
        self.r.remaining()
    }

    /// A byte that must be 0 or 1.
    pub(super) fn flag(&mut self, field: &'static str) -> Result<bool, ProtocolError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(ProtocolError::BadField(field)),
        }
    }

    pub(super) fn u16(&mut self) -> Result<u16, ProtocolError> {
        Ok(self.r.u16()?)
    }

    pub(super) fn u32(&mut self) -> Result<u32, ProtocolError> {
        Ok(self.r.u32()?)
    }

    pub(super) fn u64(&mut self) -> Result<u64, ProtocolError> {
        Ok(self.r.u64()?)
    }

    /// Length-prefixed (u16) bytes, at most `max` long.
    pub(super) fn bytes(
        &mut self,
        max: usize,
        field: &'static str,
    ) -> Result<&'a [u8], ProtocolError> {
        let n = self.u16()? as usize;
        if n > max {
            return Err(ProtocolError::BadField(field));
        }
        self.take(n)
    }

    /// A length-prefixed volume name that [`valid_volume_name`] accepts.
    pub(super) fn volume_name(&mut self) -> Result<Vec<u8>, ProtocolError> {
        let name = self.bytes(MAX_VOLUME_NAME, "volume name")?;
        if !valid_volume_name(name) {
            return Err(ProtocolError::BadField("volume name"));
        }
        Ok(name.to_vec())
    }

    /// A fixed-size field: a nonce or a proof.
    pub(super) fn array<const N: usize>(&mut self) -> Result<[u8; N], ProtocolError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    pub(super) fn allocation(&mut self) -> Result<Allocation, ProtocolError> {
        Ok(Allocation {
            addr: self.u64()?,
            len: self.u64()?,
            rkey: self.u32()?,
        })
    }

    /// The whole body must be consumed: trailing bytes are an error.
    pub(super) fn finish(self, kind: u16) -> Result<(), ProtocolError> {
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

pub(super) fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    le::put(out, b.len() as u16);
    out.extend_from_slice(b);
}

/// A volume name as sent. A name longer than the limit is cut to one byte over it,
/// so the frame stays small and the peer still refuses it: cutting it to the limit
/// could turn it into another, valid, name.
pub(super) fn put_name(out: &mut Vec<u8>, name: &[u8]) {
    put_bytes(out, &name[..name.len().min(MAX_VOLUME_NAME + 1)]);
}

pub(super) fn put_allocation(out: &mut Vec<u8>, a: &Allocation) {
    le::put(out, a.addr);
    le::put(out, a.len);
    le::put(out, a.rkey);
}
