//! The headers at fixed places: a superblock slot (which generation is current, where
//! this memnode's checkpoint and log are, the member table) and a checkpoint's header
//! over its records, each checked by magic, version and crc32c before anything in it
//! is believed.

use super::{
    crc, decode_records, Area, FormatError, Reader, Record, Superblock, Writer, CHECKPOINT_HEADER,
    CHECKPOINT_MAGIC, FORMAT_VERSION, MAX_COUNTER, MAX_MEMBERS, OLDEST_READABLE_VERSION,
    SUPERBLOCK_MAGIC,
};
use rmemfs_common::le;

impl Superblock {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.buf.extend_from_slice(SUPERBLOCK_MAGIC);
        w.u32(FORMAT_VERSION);
        w.u64(self.volume_id);
        w.u64(self.generation);
        w.u32(self.block_size);
        w.u64(self.first_seq);
        let (ck, ck_crc) = self.checkpoint.unwrap_or_default();
        w.u8(self.checkpoint.is_some() as u8);
        w.u64(ck.addr);
        w.u64(ck.len);
        w.u32(ck_crc);
        let log = self.log.unwrap_or_default();
        w.u8(self.log.is_some() as u8);
        w.u64(log.addr);
        w.u64(log.len);
        w.u16(self.members.len().min(MAX_MEMBERS) as u16);
        for m in self.members.iter().take(MAX_MEMBERS) {
            w.u64(*m);
        }
        let c = crc(&w.buf);
        w.u32(c);
        w.buf
    }

    /// Decodes one slot; an all-zero slot (never written) is `Ok(None)`.
    pub fn decode(slot: &[u8]) -> Result<Option<Superblock>, FormatError> {
        if slot.iter().all(|&b| b == 0) {
            return Ok(None);
        }
        let mut r = Reader::new(slot);
        if r.take(8)? != SUPERBLOCK_MAGIC {
            return Err(FormatError::Magic);
        }
        let version = r.u32()?;
        let volume_id = r.u64()?;
        let generation = r.u64()?;
        let block_size = r.u32()?;
        let first_seq = r.u64()?;
        let has_ck = r.u8()?;
        let ck = Area {
            addr: r.u64()?,
            len: r.u64()?,
        };
        let ck_crc = r.u32()?;
        let has_log = r.u8()?;
        let log = Area {
            addr: r.u64()?,
            len: r.u64()?,
        };
        let n = r.u16()? as usize;
        if n > MAX_MEMBERS {
            return Err(FormatError::BadField("members"));
        }
        let mut members = Vec::with_capacity(n);
        for _ in 0..n {
            members.push(r.u64()?);
        }
        let covered = r.r.position();
        let stored = r.u32()?;
        if crc(&slot[..covered]) != stored {
            return Err(FormatError::Checksum);
        }
        check_version(version)?;
        if generation > MAX_COUNTER {
            return Err(FormatError::BadField("generation"));
        }
        if first_seq > MAX_COUNTER {
            return Err(FormatError::BadField("first sequence number"));
        }
        // Ranges of remote memory: none wraps past the end of the address space.
        if has_ck != 0 && ck.addr.checked_add(ck.len).is_none() {
            return Err(FormatError::BadField("checkpoint area"));
        }
        if has_log != 0 && log.addr.checked_add(log.len).is_none() {
            return Err(FormatError::BadField("log area"));
        }
        Ok(Some(Superblock {
            volume_id,
            generation,
            block_size,
            first_seq,
            checkpoint: (has_ck != 0).then_some((ck, ck_crc)),
            log: (has_log != 0).then_some(log),
            members,
            version,
        }))
    }
}

fn check_version(version: u32) -> Result<(), FormatError> {
    if (OLDEST_READABLE_VERSION..=FORMAT_VERSION).contains(&version) {
        Ok(())
    } else {
        Err(FormatError::Version(version))
    }
}

/// A checkpoint: a header (magic, version, generation, body length, crc of the body)
/// and records that rebuild the whole namespace.
pub fn encode_checkpoint(generation: u64, body: &[u8]) -> Vec<u8> {
    let mut w = Writer::default();
    w.buf.extend_from_slice(CHECKPOINT_MAGIC);
    w.u32(FORMAT_VERSION);
    w.u32(0);
    w.u64(generation);
    w.u64(body.len() as u64);
    w.u32(crc(body));
    while w.buf.len() < CHECKPOINT_HEADER - 4 {
        w.u8(0);
    }
    let head_crc = crc(&w.buf);
    w.u32(head_crc);
    w.buf.extend_from_slice(body);
    w.buf
}

/// The records of a checkpoint of `generation`, checked whole.
pub fn decode_checkpoint(bytes: &[u8], generation: u64) -> Result<Vec<Record>, FormatError> {
    let head = bytes
        .get(..CHECKPOINT_HEADER)
        .ok_or(FormatError::Truncated {
            needed: CHECKPOINT_HEADER,
            have: bytes.len(),
        })?;
    let mut r = Reader::new(head);
    if r.take(8)? != CHECKPOINT_MAGIC {
        return Err(FormatError::Magic);
    }
    let stored_head_crc = le::u32_at(head, CHECKPOINT_HEADER - 4).unwrap_or_default();
    if crc(&head[..CHECKPOINT_HEADER - 4]) != stored_head_crc {
        return Err(FormatError::Checksum);
    }
    check_version(r.u32()?)?;
    r.u32()?;
    if r.u64()? != generation {
        return Err(FormatError::BadField("checkpoint generation"));
    }
    let len = r.u64()? as usize;
    let body_crc = r.u32()?;
    let body = bytes
        .get(CHECKPOINT_HEADER..CHECKPOINT_HEADER.saturating_add(len))
        .ok_or(FormatError::Truncated {
            needed: CHECKPOINT_HEADER.saturating_add(len),
            have: bytes.len(),
        })?;
    if crc(body) != body_crc {
        return Err(FormatError::Checksum);
    }
    decode_records(body)
}
