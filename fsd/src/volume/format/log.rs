//! Log entries: framing a body of records with its magic, length, sequence number and
//! crc32c ([`encode_entry`]), finding a whole valid entry at an offset ([`entry_at`]),
//! and scanning a log area to tell a torn tail from damage in the middle
//! ([`scan_log`]).

use super::{Entry, LogScan, ENTRY_ALIGN, ENTRY_HEADER, ENTRY_MAGIC};
use rmemfs_common::crc32c::crc32c_of;
use rmemfs_common::le;

/// Frames one log entry: header (magic, body length, sequence number, crc over
/// sequence, length and body), the body, zero padding to [`ENTRY_ALIGN`].
pub fn encode_entry(seq: u64, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ENTRY_HEADER + body.len() + ENTRY_ALIGN);
    le::put(&mut out, ENTRY_MAGIC);
    le::put(&mut out, body.len() as u32);
    le::put(&mut out, seq);
    le::put(&mut out, entry_crc(seq, body));
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(body);
    while !out.len().is_multiple_of(ENTRY_ALIGN) {
        out.push(0);
    }
    out
}

fn entry_crc(seq: u64, body: &[u8]) -> u32 {
    let mut head = [0u8; 12];
    le::put_at(&mut head, 0, seq);
    le::put_at(&mut head, 8, body.len() as u32);
    crc32c_of(&[&head, body])
}
/// The entry at `offset` of `log`, if one is there whole and valid.
pub fn entry_at(log: &[u8], offset: usize) -> Option<Entry<'_>> {
    let head = log.get(offset..offset.checked_add(ENTRY_HEADER)?)?;
    let word = |i: usize| le::u32_at(head, i).unwrap_or_default();
    if word(0) != ENTRY_MAGIC {
        return None;
    }
    let len = word(4) as usize;
    let seq = le::u64_at(head, 8)?;
    let start = offset + ENTRY_HEADER;
    let body = log.get(start..start.checked_add(len)?)?;
    if entry_crc(seq, body) != word(16) {
        return None;
    }
    let end = (start + len).next_multiple_of(ENTRY_ALIGN);
    Some(Entry { seq, body, end })
}
pub fn scan_log(log: &[u8], first_seq: u64) -> LogScan<'_> {
    let mut entries = Vec::new();
    let mut at = 0;
    let mut seq = first_seq;
    while let Some(e) = entry_at(log, at) {
        if e.seq != seq {
            break;
        }
        seq += 1;
        at = e.end;
        entries.push(e);
    }
    // A torn tail has nothing valid after it; a valid later entry means the bytes at
    // `at` were damaged after they were written.
    let mut damaged_at = None;
    let mut probe = at + ENTRY_ALIGN;
    while probe + ENTRY_HEADER <= log.len() {
        if let Some(e) = entry_at(log, probe) {
            if e.seq > seq {
                damaged_at = Some(at);
                break;
            }
        }
        probe += ENTRY_ALIGN;
    }
    LogScan {
        entries,
        end: at,
        damaged_at,
    }
}
