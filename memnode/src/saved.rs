//! What a memnode on a memory file saves of its books, so that a restart of the
//! process comes back as the same instance lending the same chunks: the sessions
//! (client id and secret), the volumes (id, name, root, holder), the fenced clients
//! and every booking of the region.
//!
//! Encoded as one record: `len u64 | crc32c u32 | body`, the CRC over the body, all
//! little-endian. A record that is cut short, fails its CRC or does not parse is
//! refused whole ([`SavedState::decode`] says why), never half read.

use crate::allocator::{Booking, Owner};
use rmemfs_common::crc32c::crc32c;
use rmemfs_common::le;
use rmemfs_common::protocol::{SessionSecret, SESSION_SECRET_LEN};

/// One session of the books.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedSession {
    pub client: u64,
    pub secret: SessionSecret,
}

/// One volume of the books (its chunks are the bookings owned by its id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedVolume {
    pub id: u64,
    pub name: Vec<u8>,
    pub root: u64,
    /// The client holding it (0: none).
    pub holder: u64,
}

/// The books of a memnode at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SavedState {
    /// Higher is newer: of two saved copies, the valid one with the higher wins.
    pub seq: u64,
    pub last_volume_id: u64,
    pub sessions: Vec<SavedSession>,
    pub volumes: Vec<SavedVolume>,
    pub fenced: Vec<u64>,
    pub bookings: Vec<Booking>,
}

const HEAD: usize = 8 + 4;
const OWNER_CLIENT: u8 = 1;
const OWNER_VOLUME: u8 = 2;

impl SavedState {
    /// The record: length, CRC, body.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; HEAD];
        le::put(&mut b, self.seq);
        le::put(&mut b, self.last_volume_id);
        le::put(&mut b, self.sessions.len() as u32);
        for s in &self.sessions {
            le::put(&mut b, s.client);
            b.extend_from_slice(&s.secret.0);
        }
        le::put(&mut b, self.volumes.len() as u32);
        for v in &self.volumes {
            le::put(&mut b, v.id);
            le::put(&mut b, v.root);
            le::put(&mut b, v.holder);
            le::put(&mut b, v.name.len() as u16);
            b.extend_from_slice(&v.name);
        }
        le::put(&mut b, self.fenced.len() as u32);
        for c in &self.fenced {
            le::put(&mut b, c);
        }
        le::put(&mut b, self.bookings.len() as u32);
        for k in &self.bookings {
            le::put(&mut b, k.addr);
            le::put(&mut b, k.len);
            let (kind, who) = match k.owner {
                Owner::Client(c) => (OWNER_CLIENT, c),
                Owner::Volume(v) => (OWNER_VOLUME, v),
            };
            le::put(&mut b, kind);
            le::put(&mut b, who);
        }
        let body_len = (b.len() - HEAD) as u64;
        let crc = crc32c(&b[HEAD..]);
        le::put_at(&mut b, 0, body_len);
        le::put_at(&mut b, 8, crc);
        b
    }

    /// Reads a record from the start of `bytes` (which may run on past it).
    pub fn decode(bytes: &[u8]) -> Result<SavedState, String> {
        let (Some(len), Some(crc)) = (le::u64_at(bytes, 0), le::u32_at(bytes, 8)) else {
            return Err("shorter than a record's header".into());
        };
        let body = usize::try_from(len)
            .ok()
            .and_then(|n| bytes.get(HEAD..HEAD.checked_add(n)?))
            .ok_or_else(|| format!("says it is {len} bytes long, more than there is"))?;
        if len == 0 {
            return Err("empty (never written)".into());
        }
        if crc32c(body) != crc {
            return Err("its checksum does not match".into());
        }
        let mut r = Reader(le::Reader::new(body));
        let mut s = SavedState {
            seq: r.u64()?,
            last_volume_id: r.u64()?,
            ..SavedState::default()
        };
        for _ in 0..r.count(8 + SESSION_SECRET_LEN)? {
            let client = r.u64()?;
            let mut secret = SessionSecret::NONE;
            secret.0.copy_from_slice(r.take(SESSION_SECRET_LEN)?);
            s.sessions.push(SavedSession { client, secret });
        }
        for _ in 0..r.count(8 + 8 + 8 + 2)? {
            let id = r.u64()?;
            let root = r.u64()?;
            let holder = r.u64()?;
            let n = r.0.u16().map_err(cut)?;
            let name = r.take(n as usize)?.to_vec();
            s.volumes.push(SavedVolume {
                id,
                name,
                root,
                holder,
            });
        }
        for _ in 0..r.count(8)? {
            s.fenced.push(r.u64()?);
        }
        for _ in 0..r.count(8 + 8 + 1 + 8)? {
            let addr = r.u64()?;
            let len = r.u64()?;
            let kind = r.0.u8().map_err(cut)?;
            let who = r.u64()?;
            let owner = match kind {
                OWNER_CLIENT => Owner::Client(who),
                OWNER_VOLUME => Owner::Volume(who),
                k => return Err(format!("a booking has owner kind {k}")),
            };
            s.bookings.push(Booking { owner, addr, len });
        }
        if !r.0.is_empty() {
            return Err(format!("{} bytes follow the last booking", r.0.remaining()));
        }
        Ok(s)
    }
}

fn cut(_: le::Truncated) -> String {
    "cut short".into()
}

/// The books' fields over [`le::Reader`], failing with the books' messages.
struct Reader<'a>(le::Reader<'a>);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        self.0.take(n).map_err(cut)
    }

    fn u64(&mut self) -> Result<u64, String> {
        self.0.u64().map_err(cut)
    }

    /// A count of items of at least `min` bytes each, checked against what is left.
    fn count(&mut self, min: usize) -> Result<usize, String> {
        let n = self.0.u32().map_err(cut)? as usize;
        if n.saturating_mul(min) > self.0.remaining() {
            return Err(format!("counts {n} items, more than the bytes left hold"));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> SavedState {
        SavedState {
            seq: 7,
            last_volume_id: 3,
            sessions: vec![SavedSession {
                client: 0x42,
                secret: SessionSecret([9; SESSION_SECRET_LEN]),
            }],
            volumes: vec![SavedVolume {
                id: 3,
                name: b"vol".to_vec(),
                root: 0x1000,
                holder: 0x42,
            }],
            fenced: vec![0x17],
            bookings: vec![
                Booking {
                    owner: Owner::Volume(3),
                    addr: 0x1000,
                    len: 0x1000,
                },
                Booking {
                    owner: Owner::Client(0x42),
                    addr: 0x2000,
                    len: 0x4000,
                },
            ],
        }
    }

    #[test]
    fn a_record_reads_back_as_written_even_with_bytes_after_it() {
        let s = sample();
        let mut rec = s.encode();
        rec.extend_from_slice(&[0xee; 100]);
        assert_eq!(SavedState::decode(&rec), Ok(s));
    }

    #[test]
    fn a_damaged_cut_or_unwritten_record_is_refused() {
        let rec = sample().encode();
        let mut flipped = rec.clone();
        flipped[30] ^= 1;
        assert!(SavedState::decode(&flipped)
            .unwrap_err()
            .contains("checksum"));
        assert!(SavedState::decode(&rec[..rec.len() - 1]).is_err());
        assert!(SavedState::decode(&[0u8; 64])
            .unwrap_err()
            .contains("empty"));
        assert!(SavedState::decode(&[]).is_err());
    }

    proptest! {
        #[test]
        fn any_bytes_decode_to_a_state_or_an_error_never_a_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..256)
        ) {
            let _ = SavedState::decode(&bytes);
        }

        #[test]
        fn any_state_round_trips(
            seq in any::<u64>(),
            clients in proptest::collection::vec(any::<u64>(), 0..8),
            name in proptest::collection::vec(any::<u8>(), 0..40),
        ) {
            let mut s = sample();
            s.seq = seq;
            s.fenced = clients.clone();
            s.volumes[0].name = name;
            s.sessions = clients
                .iter()
                .map(|&client| SavedSession { client, secret: SessionSecret([1; SESSION_SECRET_LEN]) })
                .collect();
            prop_assert_eq!(SavedState::decode(&s.encode()), Ok(s));
        }
    }
}
