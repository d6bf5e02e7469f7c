//! Frame headers of the tcp backend. Little-endian, fixed size, checked on receipt.

/// Marks a request header; anything else on the stream is garbage and closes it.
pub const REQUEST_MAGIC: u16 = 0x524d; // "RM"
pub const REQUEST_HEADER_LEN: usize = 32;
pub const COMPLETION_HEADER_LEN: usize = 16;

pub const OP_READ: u8 = 1;
pub const OP_WRITE: u8 = 2;
pub const OP_SEND: u8 = 3;

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
        b[0..2].copy_from_slice(&REQUEST_MAGIC.to_le_bytes());
        b[2] = self.op;
        b[4..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..16].copy_from_slice(&self.wr_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.addr.to_le_bytes());
        b[24..28].copy_from_slice(&self.rkey.to_le_bytes());
        b
    }

    /// None when the magic is wrong: the stream is not speaking this protocol.
    pub fn decode(b: &[u8; REQUEST_HEADER_LEN]) -> Option<RequestHeader> {
        if u16::from_le_bytes([b[0], b[1]]) != REQUEST_MAGIC {
            return None;
        }
        Some(RequestHeader {
            op: b[2],
            len: u32::from_le_bytes(b[4..8].try_into().ok()?),
            wr_id: u64::from_le_bytes(b[8..16].try_into().ok()?),
            addr: u64::from_le_bytes(b[16..24].try_into().ok()?),
            rkey: u32::from_le_bytes(b[24..28].try_into().ok()?),
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
        b[0..8].copy_from_slice(&self.wr_id.to_le_bytes());
        b[8] = self.status;
        b[12..16].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; COMPLETION_HEADER_LEN]) -> CompletionHeader {
        let mut id = [0u8; 8];
        id.copy_from_slice(&b[0..8]);
        CompletionHeader {
            wr_id: u64::from_le_bytes(id),
            status: b[8],
            len: u32::from_le_bytes([b[12], b[13], b[14], b[15]]),
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
