//! Reading a volume's metadata back from the memnodes: the newest superblock, the
//! best copy of its checkpoint and log, the replayed [`Image`], and which chunks and
//! blocks it references. Used by mount and by the offline check.
//!
//! Which copy: among the memnodes whose superblock names the newest generation, the
//! one whose checkpoint is intact and whose log replays furthest. A log whose valid
//! entries stop before a later valid entry was damaged after it was written (a torn
//! tail has nothing valid after it): that copy is not used. With no usable copy the
//! mount fails with an error that says what is wrong with each.

use super::format::{
    decode_checkpoint, decode_records, scan_log, Area, Superblock, BLOCK_WRITTEN, SUPERBLOCK_SLOT,
};
use super::image::Image;
use super::journal::Journal;
use super::logged::Logged;
use super::source::{end, read_area, VolumeSource};
use super::LOG_BYTES;
use crate::inode::BlockEntry;
use crate::remote::sums::Sums;
use crate::remote::{BlockLoc, RemoteError, RemoteStore};
use rmemfs_common::fabric::RemoteAddr;
use rmemfs_common::protocol::Allocation;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum VolumeError {
    #[error("volume {volume}: {what}")]
    Damaged { volume: String, what: String },
    #[error(
        "volume {volume} was made with {stored}-byte blocks; mount it with --block-size {stored}"
    )]
    BlockSize { volume: String, stored: u32 },
    #[error(transparent)]
    Remote(#[from] RemoteError),
    #[error("{0}")]
    NoCopy(String),
    /// No memnode has room for the next checkpoint; nothing was taken for it, so
    /// the current generation's log can still take the changes.
    #[error("{0}")]
    NoRoom(String),
    /// A memnode that may hold newer metadata is missing (`quorum.rs`).
    #[error("{0}")]
    Incomplete(String),
}

/// A volume's metadata as read back.
pub struct Loaded {
    pub volume: String,
    pub volume_id: u64,
    pub generation: u64,
    /// The format version of its newest superblock.
    pub version: u32,
    /// Sequence number the next log entry takes.
    pub next_seq: u64,
    pub image: Image,
    pub log_entries: usize,
    pub orphans: usize,
    /// Written blocks none of whose copies is left.
    pub lost_blocks: usize,
    /// Member slot -> node index.
    pub slots: HashMap<u16, usize>,
    /// The memnode id of each member slot of the loaded generation (0: none).
    pub member_ids: Vec<u64>,
    /// Per node index: the volume's chunks (root excluded), by address.
    pub chunks: Vec<BTreeMap<u64, Allocation>>,
    /// The longest checkpoint of the loaded generation's copies that were read
    /// whole: a length from remote memory only once it was read.
    pub checkpoint_len: u64,
    /// Chunks holding the loaded generation's metadata (node, chunk).
    pub metadata: Vec<(usize, Allocation)>,
    /// The loaded generation's copies: (node, checkpoint chunk, log chunk).
    pub current: Vec<(usize, Allocation, Allocation)>,
    /// Per node whose copy of the loaded generation replays in full (to
    /// `next_seq`): where its log's next entry goes (see [`Loaded::log_tail`]).
    pub log_ends: Vec<(usize, u64)>,
    /// The previous generation's chunks, which the older superblock slot names and
    /// nothing else uses: the spares of the next checkpoint (node, checkpoint chunk,
    /// log chunk).
    pub spares: Vec<(usize, Allocation, Allocation)>,
    /// What each memnode's copy looked like (for fsck): node, superblock area,
    /// checkpoint and log areas, and what was wrong with it.
    pub copies: Vec<CopyReport>,
}

#[derive(Debug, Clone)]
pub struct CopyReport {
    pub node: usize,
    pub superblock: Area,
    pub checkpoint: Option<Area>,
    pub log: Option<Area>,
    pub problem: Option<String>,
}

fn damaged(volume: &str, what: impl Into<String>) -> VolumeError {
    VolumeError::Damaged {
        volume: volume.to_string(),
        what: what.into(),
    }
}

/// What a root chunk's two superblock slots hold: the newest valid superblock (or
/// what is wrong with it), what is wrong with a slot that did not decode, and the
/// older superblock when both are valid (it names the spare metadata chunks: see
/// "Room for the next checkpoint" in `mod.rs`).
struct RootRead {
    newest: Result<Option<Superblock>, String>,
    damage: Option<String>,
    older: Option<Superblock>,
}

/// Reads both superblock slots of a root chunk. A damaged slot beside a valid one is
/// what a torn superblock write leaves; it is also what damage to the newest one
/// looks like, so it is reported either way.
fn read_superblock(remote: &impl VolumeSource, node: usize, root: Allocation) -> RootRead {
    if root.len < 2 * SUPERBLOCK_SLOT as u64 {
        return RootRead {
            newest: Err(format!(
                "the root chunk at {:#x} has length {}, too small for the two superblock \
                 slots ({} bytes)",
                root.addr,
                root.len,
                2 * SUPERBLOCK_SLOT
            )),
            damage: None,
            older: None,
        };
    }
    let mut buf = vec![0u8; 2 * SUPERBLOCK_SLOT];
    let at = RemoteAddr {
        addr: root.addr,
        rkey: root.rkey,
    };
    if let Err(e) = remote.read_at(node, at, &mut buf) {
        return RootRead {
            newest: Err(e.to_string()),
            damage: None,
            older: None,
        };
    }
    let a = Superblock::decode(&buf[..SUPERBLOCK_SLOT]);
    let b = Superblock::decode(&buf[SUPERBLOCK_SLOT..]);
    let damage = |slot: usize, e: &super::format::FormatError| {
        format!(
            "superblock slot {slot} (at {:#x}) is damaged: {e}",
            root.addr + (slot * SUPERBLOCK_SLOT) as u64
        )
    };
    // A slot that is whole but of a format this fsd does not know was written by a
    // newer fsd: the other slot is older, not a fallback.
    for (slot, r) in [(0, &a), (1, &b)] {
        if let Err(e @ super::format::FormatError::Version(_)) = r {
            return RootRead {
                newest: Err(format!(
                    "superblock slot {slot} was written by another fsd version: {e}"
                )),
                damage: None,
                older: None,
            };
        }
    }
    let (newest, damage, older) = match (a, b) {
        (Ok(Some(a)), Ok(Some(b))) => {
            let (newest, older) = if a.generation >= b.generation {
                (a, b)
            } else {
                (b, a)
            };
            (Ok(Some(newest)), None, Some(older))
        }
        (Ok(a), Ok(b)) => (Ok(a.or(b)), None, None),
        (Ok(Some(s)), Err(e)) => (Ok(Some(s)), Some(damage(1, &e)), None),
        (Err(e), Ok(Some(s))) => (Ok(Some(s)), Some(damage(0, &e)), None),
        (Err(e), _) => (Err(damage(0, &e)), None, None),
        (_, Err(e)) => (Err(damage(1, &e)), None, None),
    };
    RootRead {
        newest,
        damage,
        older,
    }
}

/// Finds the chunk of `chunks` holding `[addr, addr + len)`.
fn chunk_of(chunks: &BTreeMap<u64, Allocation>, addr: u64, len: u64) -> Option<Allocation> {
    let (_, c) = chunks.range(..=addr).next_back()?;
    (addr.checked_add(len)? <= end(c)).then_some(*c)
}

/// Reads the volume's metadata; `None` for a volume that was never written (no
/// superblock anywhere).
pub fn load(remote: &impl VolumeSource, volume: &str) -> Result<Option<Loaded>, VolumeError> {
    let nodes = remote.node_count();
    let mut supers: Vec<(usize, Superblock)> = Vec::new();
    let mut olders: Vec<(usize, Superblock)> = Vec::new();
    let mut copies = Vec::new();
    let mut damaged_supers = Vec::new();
    for node in 0..nodes {
        let Some(root) = remote.volume_root(node) else {
            continue;
        };
        let area = Area {
            addr: root.addr,
            len: 2 * SUPERBLOCK_SLOT as u64,
        };
        let RootRead {
            newest: read,
            damage: slot_damage,
            older,
        } = read_superblock(remote, node, root);
        olders.extend(older.map(|o| (node, o)));
        if let Some(d) = &slot_damage {
            log::warn!("volume {volume}: memnode {}: {d}", remote.node_name(node));
            damaged_supers.push(format!("memnode {}: {d}", remote.node_name(node)));
        }
        match read {
            Ok(Some(sb)) => {
                copies.push(CopyReport {
                    node,
                    superblock: area,
                    checkpoint: sb.checkpoint.map(|(a, _)| a),
                    log: sb.log,
                    problem: slot_damage.clone(),
                });
                supers.push((node, sb));
            }
            Ok(None) => {}
            Err(e) => {
                damaged_supers.push(format!("memnode {}: {e}", remote.node_name(node)));
                copies.push(CopyReport {
                    node,
                    superblock: area,
                    checkpoint: None,
                    log: None,
                    problem: Some(e),
                });
            }
        }
    }
    let Some(newest) = supers.iter().map(|(_, s)| s.generation).max() else {
        if damaged_supers.is_empty() {
            return Ok(None);
        }
        return Err(damaged(volume, damaged_supers.join("; ")));
    };
    let head = supers
        .iter()
        .find(|(_, s)| s.generation == newest)
        .map(|(_, s)| s.clone())
        .unwrap_or_default();
    if head.block_size as u64 != remote.block_size() {
        return Err(VolumeError::BlockSize {
            volume: volume.to_string(),
            stored: head.block_size,
        });
    }
    // Member slots to the nodes configured now, by memnode id.
    let mut slots = HashMap::new();
    for (slot, &id) in head.members.iter().enumerate() {
        if id == 0 {
            continue;
        }
        if let Some(node) =
            (0..nodes).find(|&n| remote.node_identity(n).is_some_and(|(_, nid)| nid == id))
        {
            slots.insert(slot as u16, node);
        }
    }
    // Every copy of the newest generation, best first.
    let mut best: Option<(usize, Image, u64, usize)> = None;
    let mut checkpoint_len = 0;
    let mut replayed = Vec::new();
    let mut problems = damaged_supers;
    for (node, sb) in supers.iter().filter(|(_, s)| s.generation == newest) {
        let (Some((ck, ck_crc)), Some(log)) = (sb.checkpoint, sb.log) else {
            continue;
        };
        match read_copy(remote, *node, ck, ck_crc, log, sb) {
            Ok((image, next_seq, entries, end)) => {
                replayed.push((*node, next_seq, end));
                checkpoint_len = checkpoint_len.max(ck.len);
                if best.as_ref().is_none_or(|b| next_seq > b.2) {
                    best = Some((*node, image, next_seq, entries));
                }
            }
            Err(e) => {
                log::warn!(
                    "volume {volume}: the metadata copy on memnode {} is not usable: {e}",
                    remote.node_name(*node)
                );
                if let Some(c) = copies.iter_mut().find(|c| c.node == *node) {
                    c.problem = Some(e.clone());
                }
                problems.push(format!("memnode {}: {e}", remote.node_name(*node)));
            }
        }
    }
    let Some((from, mut image, next_seq, log_entries)) = best else {
        return Err(damaged(
            volume,
            format!(
                "no usable copy of its metadata (generation {newest}): {}",
                if problems.is_empty() {
                    "the memnodes that held it are gone".to_string()
                } else {
                    problems.join("; ")
                }
            ),
        ));
    };
    log::info!(
        "volume {volume}: generation {newest} from memnode {}, {log_entries} log entries",
        remote.node_name(from)
    );
    let mut chunks = vec![BTreeMap::new(); nodes];
    for (node, list) in chunks.iter_mut().enumerate() {
        if remote.volume_root(node).is_none() {
            continue;
        }
        for c in remote.volume_chunks(node)? {
            list.insert(c.addr, c);
        }
    }
    let mut metadata = Vec::new();
    let mut current = Vec::new();
    for (node, sb) in supers.iter().filter(|(_, s)| s.generation == newest) {
        for area in sb.checkpoint.map(|(a, _)| a).into_iter().chain(sb.log) {
            if let Some(c) = chunk_of(&chunks[*node], area.addr, area.len) {
                metadata.push((*node, c));
            }
        }
        current.extend(metadata_chunks(&chunks[*node], sb).map(|(ck, log)| (*node, ck, log)));
    }
    let orphans = image.drop_orphans();
    let problems = image.check();
    if !problems.is_empty() {
        // Served as it is (each file reads what its blocks hold); fsck lists them all.
        log::error!(
            "volume {volume}: {} inconsistencies in its metadata, e.g. {}",
            problems.len(),
            problems[..problems.len().min(3)].join("; ")
        );
    }
    let mut loaded = Loaded {
        volume: volume.to_string(),
        volume_id: head.volume_id,
        generation: newest,
        version: head.version,
        next_seq,
        image,
        log_entries,
        orphans,
        lost_blocks: 0,
        slots,
        member_ids: head.members.clone(),
        chunks,
        checkpoint_len,
        metadata,
        current,
        log_ends: replayed
            .into_iter()
            .filter(|&(_, seq, _)| seq == next_seq)
            .map(|(node, _, end)| (node, end))
            .collect(),
        spares: Vec::new(),
        copies,
    };
    loaded.lost_blocks = loaded.count_lost();
    loaded.find_spares(&olders);
    Ok(Some(loaded))
}

/// The chunks holding a superblock's checkpoint and log, when both are whole chunks
/// of the volume and distinct.
fn metadata_chunks(
    chunks: &BTreeMap<u64, Allocation>,
    sb: &Superblock,
) -> Option<(Allocation, Allocation)> {
    let (ck, _) = sb.checkpoint?;
    let log = sb.log?;
    let ck = chunk_of(chunks, ck.addr, ck.len)?;
    let log = chunk_of(chunks, log.addr, log.len)?;
    (ck.addr != log.addr).then_some((ck, log))
}

/// One memnode's checkpoint and log, replayed: the image, the next sequence number,
/// how many log entries were applied and the offset in the log just past them.
fn read_copy(
    remote: &impl VolumeSource,
    node: usize,
    ck: Area,
    ck_crc: u32,
    log: Area,
    sb: &Superblock,
) -> Result<(Image, u64, usize, u64), String> {
    let ck_bytes = read_area(remote, node, ck, u64::MAX, "checkpoint")?;
    if super::format::crc(&ck_bytes) != ck_crc {
        return Err("checkpoint checksum mismatch".into());
    }
    let records =
        decode_checkpoint(&ck_bytes, sb.generation).map_err(|e| format!("checkpoint: {e}"))?;
    let mut image = Image::default();
    for r in records {
        image.apply(r);
    }
    // No commit writes past LOG_BYTES (`commit.rs`): a longer log area (its chunk
    // rounded up by the memnode, or a length made up) holds nothing more to replay.
    let log_bytes = read_area(remote, node, log, LOG_BYTES, "log")?;
    let scan = scan_log(&log_bytes, sb.first_seq);
    if let Some(at) = scan.damaged_at {
        return Err(format!(
            "log damaged at offset {at}: valid entries follow an invalid one"
        ));
    }
    let entries = scan.entries.len();
    for e in &scan.entries {
        let records = decode_records(e.body).map_err(|err| {
            format!(
                "log entry {} has a valid checksum but does not decode: {err}",
                e.seq
            )
        })?;
        for r in records {
            image.apply(r);
        }
    }
    Ok((
        image,
        sb.first_seq + entries as u64,
        entries,
        scan.end as u64,
    ))
}

impl Loaded {
    /// Resolves a stored block's copies on the memnodes configured now: a copy
    /// whose member is gone, or whose address is in no chunk of the volume there,
    /// is a lost copy.
    fn resolve(&self, remote: &impl VolumeSource, b: &super::format::StoredBlock) -> BlockLoc {
        let mut loc = BlockLoc::new(b.alloc_len as u64);
        if b.alloc_len as u64 > remote.block_size() {
            // Not a copy this volume's blocks can have: none of its copies is used.
            return loc;
        }
        for c in &b.copies {
            let Some(&node) = self.slots.get(&c.slot) else {
                continue;
            };
            let Some(chunk) = chunk_of(&self.chunks[node], c.addr, b.alloc_len as u64) else {
                continue;
            };
            let remote_addr = RemoteAddr {
                addr: c.addr,
                rkey: chunk.rkey,
            };
            if let Some(r) = remote.replica_at(node, remote_addr) {
                loc.push(r);
            }
        }
        loc
    }

    fn count_lost(&self) -> usize {
        self.image
            .inodes
            .values()
            .flat_map(|i| i.blocks.values())
            .filter(|b| {
                b.flags & BLOCK_WRITTEN != 0
                    && !b.copies.iter().any(|c| {
                        self.slots.get(&c.slot).is_some_and(|&n| {
                            chunk_of(&self.chunks[n], c.addr, b.alloc_len as u64).is_some()
                        })
                    })
            })
            .count()
    }

    /// Block copies in use, per node: start address -> bytes.
    pub fn used(&self) -> Vec<BTreeMap<u64, u64>> {
        let mut used = vec![BTreeMap::new(); self.chunks.len()];
        let blocks = self.image.inodes.values().flat_map(|i| i.blocks.values());
        for b in blocks {
            for c in &b.copies {
                if let Some(&node) = self.slots.get(&c.slot) {
                    used[node].insert(c.addr, b.alloc_len as u64);
                }
            }
        }
        used
    }

    /// Whether chunk `c` of node `node` holds the loaded generation's metadata or is
    /// a spare.
    fn is_metadata(&self, node: usize, c: &Allocation) -> bool {
        let spare = |&(n, ck, log): &(usize, Allocation, Allocation)| {
            n == node && (ck.addr == c.addr || log.addr == c.addr)
        };
        self.metadata
            .iter()
            .any(|(n, m)| *n == node && m.addr == c.addr)
            || self.spares.iter().any(spare)
    }

    /// Takes as spares the chunks an older superblock names (`olders`: node, its
    /// older valid slot) where they are still chunks of the volume that hold no
    /// block in use and no metadata of the loaded generation. A volume written by an
    /// fsd that gave those chunks back may have reused their memory: such chunks
    /// hold blocks, or are no longer there, and are not taken.
    fn find_spares(&mut self, olders: &[(usize, Superblock)]) {
        let used = self.used();
        let mut spares = Vec::new();
        for (node, sb) in olders {
            if sb.generation >= self.generation {
                continue;
            }
            let Some(chunks) = self.chunks.get(*node) else {
                continue;
            };
            let Some((ck, log)) = metadata_chunks(chunks, sb) else {
                continue;
            };
            let free = |c: &Allocation| {
                used[*node].range(c.addr..end(c)).next().is_none() && !self.is_metadata(*node, c)
            };
            if free(&ck) && free(&log) {
                spares.push((*node, ck, log));
            }
        }
        self.spares = spares;
    }

    /// Chunks of the volume that hold neither metadata nor a block in use.
    pub fn leaked(&self) -> Vec<(usize, Allocation)> {
        let used = self.used();
        let mut out = Vec::new();
        for (node, chunks) in self.chunks.iter().enumerate() {
            for c in chunks.values() {
                let holds = used[node].range(c.addr..end(c)).next().is_some();
                if !self.is_metadata(node, c) && !holds {
                    out.push((node, *c));
                }
            }
        }
        out
    }

    /// Gives back the chunks nothing references and hands the others to the block
    /// pools (mount). Returns how many chunks were given back.
    pub fn reclaim(&self, remote: &RemoteStore) -> usize {
        let leaked = self.leaked();
        for &(node, c) in &leaked {
            remote.free_chunk_of(node, c);
        }
        let used = self.used();
        for (node, chunks) in self.chunks.iter().enumerate() {
            for c in chunks.values() {
                let is_leaked = leaked.iter().any(|(n, l)| *n == node && l.addr == c.addr);
                if self.is_metadata(node, c) || is_leaked {
                    continue;
                }
                remote.adopt_chunk(node, *c, &used[node]);
            }
        }
        leaked.len()
    }

    /// The live namespace (after [`Loaded::reclaim`]).
    pub fn into_namespace<N: Logged>(self, remote: &impl VolumeSource, journal: Arc<Journal>) -> N {
        // A written block with no copy left keeps its entry: reading it fails (EIO)
        // rather than returning zeros as if it were a hole. Pages from a file's end
        // on keep no sum: the mount zeroes them (`zero_past_eof`).
        let bs = remote.block_size();
        let sizes: HashMap<u64, u64> = self
            .image
            .inodes
            .iter()
            .map(|(&ino, i)| (ino, i.attr.size))
            .collect();
        N::from_image(self.image.clone(), journal, &|b| {
            let mut sums = Sums::from_stored(b.sums.clone());
            let end = sizes.get(&b.ino).copied().unwrap_or(0);
            let start = b.index.saturating_mul(bs);
            if end < start.saturating_add(bs) {
                sums.truncate(end.saturating_sub(start));
            }
            Some(BlockEntry {
                loc: self.resolve(remote, b),
                written: b.flags & BLOCK_WRITTEN != 0,
                sums,
            })
        })
    }
}

#[cfg(test)]
#[path = "load_tests.rs"]
mod tests;
