//! Frame headers of the tcp backend. Little-endian, fixed size, checked on receipt.

use crate::le;

/// Marks a request header; anything else on the stream is garbage and closes it.
pub const REQUEST_MAGIC: u16 = 0x524d; // "RM"
pub const REQUEST_HEADER_LEN: usize = 32;
pub const COMPLETION_HEADER_LEN: usize = 16;

pub const OP_READ: u8 = 1;
pub const OP_WRITE: u8 = 2;
pub const OP_SEND: u8 = 3;
/// After the Hello: asks for the memnode's mapped region (the mapped backend); the
/// completion carries a [`crate::fabric::mapped::offer::Offer`], or an error when
/// none is offered.
pub const OP_MAP: u8 = 4;

pub const STATUS_OK: u8 = 0;
pub const STATUS_REMOTE_ACCESS: u8 = 1;
pub const STATUS_BAD_REQUEST: u8 = 2;

/// `{magic u16, op u8, _pad u8, len u32, wr_id u64, addr u64, rkey u32, _pad u32}`
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub op: u8,
    pub len: u32,
    pub wr_id: u64,
    pub addr: u64,
    pub rkey: u32,
}

impl RequestHeader {
    pub fn encode(&self) -> [u8; REQUEST_HEADER_LEN] {
        let mut b = [0u8; REQUEST_HEADER_LEN];
        le::put_at(&mut b, 0, REQUEST_MAGIC);
        b[2] = self.op;
        le::put_at(&mut b, 4, self.len);
        le::put_at(&mut b, 8, self.wr_id);
        le::put_at(&mut b, 16, self.addr);
        le::put_at(&mut b, 24, self.rkey);
        b
    }

    /// None when the magic is wrong: the stream is not speaking this protocol.
    pub fn decode(b: &[u8; REQUEST_HEADER_LEN]) -> Option<RequestHeader> {
        if le::u16_at(b, 0)? != REQUEST_MAGIC {
            return None;
        }
        Some(RequestHeader {
            op: b[2],
            len: le::u32_at(b, 4)?,
            wr_id: le::u64_at(b, 8)?,
            addr: le::u64_at(b, 16)?,
            rkey: le::u32_at(b, 24)?,
        })
    }
}

/// `{wr_id u64, status u8, _pad [u8; 3], len u32}`
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompletionHeader {
    pub wr_id: u64,
    pub status: u8,
    pub len: u32,
}

impl CompletionHeader {
    pub fn encode(&self) -> [u8; COMPLETION_HEADER_LEN] {
        let mut b = [0u8; COMPLETION_HEADER_LEN];
        le::put_at(&mut b, 0, self.wr_id);
        b[8] = self.status;
        le::put_at(&mut b, 12, self.len);
        b
    }

    pub fn decode(b: &[u8; COMPLETION_HEADER_LEN]) -> CompletionHeader {
        // The header's size is fixed: every field is inside it.
        CompletionHeader {
            wr_id: le::u64_at(b, 0).unwrap_or_default(),
            status: b[8],
            len: le::u32_at(b, 12).unwrap_or_default(),
        }
    }
}

/// Reads and drops `len` bytes with `read_exact`, a small piece at a time, so a
/// large payload is never buffered whole.
pub fn skip<E>(
    mut len: usize,
    mut read_exact: impl FnMut(&mut [u8]) -> Result<(), E>,
) -> Result<(), E> {
    let mut scratch = [0u8; 4096];
    while len > 0 {
        let n = len.min(scratch.len());
        read_exact(&mut scratch[..n])?;
        len -= n;
    }
    Ok(())
}

/// Writes every byte of `bufs` with vectored writes (std's `write_all_vectored` is
/// not stable yet).
pub fn write_all_vectored<W: std::io::Write>(
    w: &mut W,
    mut bufs: &mut [std::io::IoSlice<'_>],
) -> std::io::Result<()> {
    while !bufs.is_empty() {
        match w.write_vectored(bufs) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => std::io::IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_header_round_trips() {
        let h = RequestHeader {
            op: OP_WRITE,
            len: 65536,
            wr_id: u64::MAX - 3,
            addr: 0x1234_5678_9abc,
            rkey: 0xfeed_f00d,
        };
        assert_eq!(RequestHeader::decode(&h.encode()), Some(h));
    }

    #[test]
    fn request_header_with_wrong_magic_is_refused() {
        let mut b = RequestHeader {
            op: OP_READ,
            len: 1,
            wr_id: 1,
            addr: 0,
            rkey: 0,
        }
        .encode();
        b[0] ^= 0xff;
        assert_eq!(RequestHeader::decode(&b), None);
    }

    #[test]
    fn completion_header_round_trips() {
        let h = CompletionHeader {
            wr_id: 42,
            status: STATUS_REMOTE_ACCESS,
            len: 7,
        };
        assert_eq!(CompletionHeader::decode(&h.encode()), h);
    }
}
