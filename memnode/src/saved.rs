//! What a memnode on a memory file saves of its books, so that a restart of the
//! process comes back as the same instance lending the same chunks: the sessions
//! (client id, secret, tenant), the volumes (id, tenant, name, root, holder), the
//! fenced clients and every booking of the region.
//!
//! Encoded as one record: `len u64 | crc32c u32 | body`, the CRC over the body, all
//! little-endian. A record that is cut short, fails its CRC or does not parse is
//! refused whole ([`SavedState::decode`] says why), never half read.
//!
//! Tenants are named, never numbered (a tenant's number is its place in the tenants
//! file, which may change between starts), in a section after the bookings: a tag,
//! the tenant names, then each session's and each volume's tenant as an index into
//! them. A record of the format before tenants ends at its bookings; it reads with
//! every session and volume the tenant "default"'s, which is what a memnode with
//! one token (or none) calls its one tenant, so such a memnode restarts on it as it
//! was. (A memnode of before tenants refuses a record with the section.)

use crate::allocator::{Booking, Owner};
use crate::tenants::DEFAULT_TENANT;
use rmemfs_common::crc32c::crc32c;
use rmemfs_common::le;
use rmemfs_common::protocol::{SessionSecret, SESSION_SECRET_LEN};

/// One session of the books.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedSession {
    pub client: u64,
    pub secret: SessionSecret,
    /// Its tenant's name.
    pub tenant: String,
}

/// One volume of the books (its chunks are the bookings owned by its id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedVolume {
    pub id: u64,
    /// Its tenant's name.
    pub tenant: String,
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
/// Starts the section of tenants after the bookings.
const TENANTS: u8 = b'T';

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
        self.encode_tenants(&mut b);
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
            s.sessions.push(SavedSession {
                client,
                secret,
                tenant: DEFAULT_TENANT.into(),
            });
        }
        for _ in 0..r.count(8 + 8 + 8 + 2)? {
            let id = r.u64()?;
            let root = r.u64()?;
            let holder = r.u64()?;
            let n = r.0.u16().map_err(cut)?;
            let name = r.take(n as usize)?.to_vec();
            s.volumes.push(SavedVolume {
                id,
                tenant: DEFAULT_TENANT.into(),
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
            s.decode_tenants(&mut r)?;
        }
        if !r.0.is_empty() {
            return Err(format!(
                "{} bytes follow the tenants of the sessions and volumes",
                r.0.remaining()
            ));
        }
        Ok(s)
    }

    /// The section of tenants: tag, names (`u32` count, each `u16` length and
    /// bytes), then a `u32` index into them per session and per volume, in order.
    fn encode_tenants(&self, b: &mut Vec<u8>) {
        let mut names: Vec<&str> = Vec::new();
        let mut of = Vec::with_capacity(self.sessions.len() + self.volumes.len());
        let tenants = self.sessions.iter().map(|s| s.tenant.as_str());
        for name in tenants.chain(self.volumes.iter().map(|v| v.tenant.as_str())) {
            let i = names.iter().position(|n| *n == name).unwrap_or_else(|| {
                names.push(name);
                names.len() - 1
            });
            of.push(i as u32);
        }
        le::put(b, TENANTS);
        le::put(b, names.len() as u32);
        for n in &names {
            // Tenant names are at most 64 bytes (`tenants.rs`).
            let n = &n.as_bytes()[..n.len().min(u16::MAX as usize)];
            le::put(b, n.len() as u16);
            b.extend_from_slice(n);
        }
        for i in of {
            le::put(b, i);
        }
    }

    fn decode_tenants(&mut self, r: &mut Reader<'_>) -> Result<(), String> {
        let tag = r.0.u8().map_err(cut)?;
        if tag != TENANTS {
            return Err(format!("the bookings are followed by section {tag:#x}"));
        }
        let mut names = Vec::new();
        for _ in 0..r.count(2)? {
            let n = r.0.u16().map_err(cut)?;
            let name = std::str::from_utf8(r.take(n as usize)?)
                .map_err(|_| "a tenant's name is not UTF-8".to_string())?;
            names.push(name.to_string());
        }
        let mut next = || -> Result<String, String> {
            let i = r.0.u32().map_err(cut)?;
            names
                .get(i as usize)
                .cloned()
                .ok_or_else(|| format!("tenant {i} of {} named", names.len()))
        };
        for s in &mut self.sessions {
            s.tenant = next()?;
        }
        for v in &mut self.volumes {
            v.tenant = next()?;
        }
        Ok(())
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
                tenant: "alice".into(),
            }],
            volumes: vec![SavedVolume {
                id: 3,
                tenant: "bob".into(),
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

    #[test]
    fn a_record_of_before_tenants_reads_with_everything_the_default_tenants() {
        let s = sample();
        let mut section = Vec::new();
        s.encode_tenants(&mut section);
        // The format before tenants is this one without the section.
        let mut old = s.encode();
        old.truncate(old.len() - section.len());
        let body_len = (old.len() - HEAD) as u64;
        let crc = crc32c(&old[HEAD..]);
        le::put_at(&mut old, 0, body_len);
        le::put_at(&mut old, 8, crc);
        let read = SavedState::decode(&old).expect("an old record reads");
        assert_eq!(read.sessions[0].tenant, DEFAULT_TENANT);
        assert_eq!(read.volumes[0].tenant, DEFAULT_TENANT);
        let mut want = s.clone();
        want.sessions[0].tenant = DEFAULT_TENANT.into();
        want.volumes[0].tenant = DEFAULT_TENANT.into();
        assert_eq!(read, want, "all else as it was");
    }

    #[test]
    fn a_tenant_index_past_the_names_is_refused() {
        let s = sample();
        let mut rec = s.encode();
        // The last u32 is the volume's tenant index.
        let at = rec.len() - 4;
        le::put_at(&mut rec, at, 7u32);
        let body_len = (rec.len() - HEAD) as u64;
        let crc = crc32c(&rec[HEAD..]);
        le::put_at(&mut rec, 0, body_len);
        le::put_at(&mut rec, 8, crc);
        let err = SavedState::decode(&rec).unwrap_err();
        assert!(err.contains("tenant 7 of 2"), "{err}");
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
                .enumerate()
                .map(|(i, &client)| SavedSession {
                    client,
                    secret: SessionSecret([1; SESSION_SECRET_LEN]),
                    tenant: format!("t{}", i % 3),
                })
                .collect();
            prop_assert_eq!(SavedState::decode(&s.encode()), Ok(s));
        }
    }
}
