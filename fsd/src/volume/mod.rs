//! Durable volumes: the filesystem's metadata kept in the memnodes' memory beside its
//! data, so unmounting, restarting or killing fsd loses nothing that was synced.
//!
//! # Layout
//!
//! A volume is a named set of chunks on every memnode (the memnodes keep them across
//! disconnects until the volume is destroyed; see memnode's `volumes.rs`). Each
//! memnode's copy has a **root chunk** the memnode hands out when the volume is
//! opened: the well-known place. It holds two superblock slots, written alternately
//! (generation parity), so a torn superblock write leaves the other slot valid. A
//! superblock names the current **generation**, the memnode ids of the member slots
//! (a block's copies are stored as slot + address), and, on the R memnodes that hold
//! the metadata, where this memnode's **checkpoint** and **log** are.
//!
//! ```text
//!  root chunk: [superblock A | superblock B] -> checkpoint -> log -> data chunks
//! ```
//!
//! # Why a log of states plus checkpoints
//!
//! Rewriting the namespace per operation costs its size per operation; a log costs
//! what changed. The log is append-only, written with one-sided WRITEs at its tail on
//! every metadata copy. Its records are states ("inode 7's attributes are now X",
//! "block 3 of inode 7 is at these copies"), not deltas, except directory entries:
//! so the write path only marks an inode dirty (one atomic flag) and a commit writes
//! the dirty inodes' current state, while structural changes (create, rename, ...)
//! are appended whole, one entry each, under the namespace's tree lock: an entry is
//! replayed whole or not at all (crc32c and sequence number per entry). When the log
//! fills, and at every mount and unmount, a **checkpoint** writes the whole namespace
//! to fresh chunks and a new generation starts with an empty log; the old one's
//! chunks are freed once every superblock points at the new one.
//!
//! # What is durable when
//!
//! A commit (fsync, fdatasync, fsync of a directory, the periodic flusher, unmount)
//! first writes back the data (the cache), then writes the log: so a block the log
//! calls written holds its bytes. A block freed is reused only after the commit that
//! records it free (`journal.rs`): a crash can never bring back a file whose block now
//! holds another file's bytes. After a crash, mounting replays the newest generation's
//! longest valid log; inodes nobody names (deleted while open) are dropped, and
//! chunks nothing references are given back.
//!
//! The allocator's state is not logged: it is what the memnodes list as the volume's
//! chunks, less the blocks the namespace references, worked out at mount.
//!
//! # Room for the next checkpoint
//!
//! A checkpoint needs room for itself and a log before it can free anything, and
//! blocks freed by deletes are reused only after a commit records them (see above).
//! If the checkpoint had to ask the memnodes for fresh chunks, a volume whose memnodes
//! filled up would wedge for good: every commit a checkpoint that finds no room, so
//! no delete ever becomes durable and no space ever comes back. So the previous
//! generation's chunks are not given back but kept as **spares**, and the next
//! checkpoint is written into them. The spares are exactly what the older superblock
//! slot names, so the format needs nothing new: a mount (or fsck) takes the chunks the
//! older slot names for spares where they are still chunks of the volume that hold
//! nothing else, the mount's checkpoint goes into them, and a volume created anew
//! writes two checkpoints so it has spares from the start. Reusing a log is safe
//! because sequence numbers only grow: the entries left from two generations ago are
//! older than the superblock's `first_seq`, so a replay stops at them as at the end of
//! the log. A checkpoint chunk is allocated with room to grow by a full log and more
//! ([`checkpoint_room`]);
//! a checkpoint that outgrew its spare's needs a fresh chunk (what is left of a full
//! memnode may still hold it). The price is a second log of [`LOG_BYTES`] and
//! checkpoint area per metadata copy, for as long as the volume exists.
//!
//! # When no checkpoint fits
//!
//! The checkpoint grows with what the volume holds (a record per block), so one that
//! outgrew its spare needs a larger chunk, which a memnode full of data cannot give.
//! Two things keep that from wedging the volume:
//! - before a checkpoint takes anything from the journal, it makes sure it has
//!   somewhere to go: spares large enough for the checkpoint's bound (the last
//!   checkpoint plus the log since, or what a checkpoint that failed needed), grown
//!   while the memnodes have room. A commit grows a spare that the bound has
//!   outgrown, so the room grows with the log while data still leaves some;
//! - when no memnode has room, nothing was taken: the current generation's log
//!   takes the changes instead, for as long as it has room and every copy of it is
//!   whole. A mount that finds no room for its checkpoint goes on with the loaded
//!   generation's log the same way, so a volume that filled up mounts again and its
//!   deletes become durable (then their space comes back, and the next checkpoint
//!   finds room).
//!
//! # Room to grow
//!
//! Spares can only grow while the memnodes have room, and a volume whose memory is
//! full of data can still grow its metadata (empty files, directories, names): left
//! alone, its checkpoint would outgrow the spares, and once the log filled no commit
//! could make anything durable. So the metadata may grow only into room it has: the
//! journal counts what the checkpoint may have grown by since its size was last
//! measured ([`Journal::growth`]: every entry that adds a name, each new block's
//! record, blocks grown, extended attributes), and each commit works out the **headroom**,
//! the spares' room less the measured size (with every page's sum, as pages
//! written get them: [`checkpoint_bound`]) and a slack ([`room_slack`]). When the growth reaches
//! it, the next change that would grow the metadata commits first (which grows a
//! spare while the memnodes have room, and measures the checkpoint's size anew when
//! the bound is too near the room); if there is still none, that change fails with
//! ENOSPC, as creating a file on a full disk does. Deletes, truncates, overwrites
//! and renames go on, and the space they free brings the room back. The slack covers
//! what is not counted (longer names in renames, changes racing a commit).
//!
//! # Page sums in the log
//!
//! A block record carries the crc32c of each page of its copies that fsd knows
//! (`remote/sums.rs`), so a mounted volume checks what it reads as a running one
//! does. Pages are written in place, so a sum in the log is only as new as the
//! commit that wrote it; a crash after a later write-back would leave the page newer
//! than its sum, and a good page must never read as a bad one. So before a file
//! whose sums the log holds is written back again, fsd appends a
//! [`Record::SumsStale`] for it ([`Volume::sums_stale`]), durable before the data
//! moves; replaying it drops the file's sums until a later record gives them
//! again. A commit logs a file's blocks with sums only while none of its write-backs
//! is under way (`Meta::writebacks`), and notes that the log now holds sums
//! (`Meta::sums_logged`): the next write-back logs the next `SumsStale`. Both steps
//! run under the volume's state lock, so a `SumsStale` always lands after the
//! commit it undoes. One per file and commit interval, not per block, keeps the log
//! small under random writes to a large file; what a crash costs is that file's
//! sums until its pages are next written.
//!
//! # One writer
//!
//! The memnodes let one client hold a volume at a time (a lease kept alive by fsd's
//! heartbeats); taking it over re-registers every chunk under new rkeys, so the old
//! holder's WRITEs fail like a NIC's remote access errors: it is fenced.

pub mod admin;
pub mod format;
pub mod image;
pub mod journal;
mod load;
pub mod quorum;

use crate::inode::{BlockEntry, Ino};
use crate::namespace::Namespace;
use crate::remote::sums;
use crate::remote::{BlockLoc, RemoteError, RemoteStore};
use format::{
    encode_checkpoint, encode_entry, encode_records, Area, Record, StoredBlock, StoredCopy,
    Superblock, BLOCK_WRITTEN, SUPERBLOCK_SLOT,
};
use journal::Journal;
pub use load::{Loaded, VolumeError};
pub use quorum::MountPolicy;
use rmemfs_common::fabric::RemoteAddr;
use rmemfs_common::protocol::Allocation;
use rmemfs_common::size::format_size;
use std::sync::{Arc, Mutex, MutexGuard};

/// Bytes of each metadata copy's log: when a commit does not fit, a checkpoint
/// starts a new generation instead.
pub const LOG_BYTES: u64 = 8 << 20;
/// The end of the log that commits leave to [`Volume::sums_stale`], which can log
/// there without a checkpoint when commits have filled the rest.
const STALE_RESERVE: u64 = 1 << 20;

/// Where one memnode holds this generation's checkpoint and log.
#[derive(Debug, Clone, Copy)]
struct MetaCopy {
    node: usize,
    checkpoint: Allocation,
    log: Allocation,
}

/// A generation's chunks kept for a later checkpoint (see "Room for the next
/// checkpoint").
#[derive(Debug, Clone, Copy)]
struct Spare {
    copy: MetaCopy,
    /// The link (epoch, memnode id) whose rkeys the chunks carry.
    link: (u32, u64),
}

/// Bytes of the chunk a checkpoint of `len` bytes is written to: half again (at
/// least 1 MiB more), in whole MiB, so the checkpoints after it fit the same chunk
/// (it comes back as a spare) while the namespace grows.
pub fn checkpoint_room(len: u64) -> u64 {
    len.saturating_add((len / 2).max(1 << 20))
        .div_ceil(1 << 20)
        .saturating_mul(1 << 20)
}

struct State {
    generation: u64,
    /// Sequence number of the next log entry.
    next_seq: u64,
    /// Per node index: the (epoch, memnode id) that is its member slot this
    /// generation; copies on other epochs are not stored (they are lost copies).
    members: Vec<Option<(u32, u64)>>,
    copies: Vec<MetaCopy>,
    /// The previous generation's chunks, for the next checkpoint.
    spares: Vec<Spare>,
    /// Bytes of the log written this generation.
    tail: u64,
    /// A commit failed or a copy was lost: the next commit is a checkpoint.
    need_checkpoint: bool,
    /// The volume was read in an older format: the next checkpoint's superblock goes
    /// to both slots.
    upgrade: bool,
    /// Most bytes the checkpoint as last measured may take ([`checkpoint_bound`]):
    /// this generation's, or what one would take at a later measure (see "Room to
    /// grow").
    checkpoint_len: u64,
    /// Bytes the last checkpoint that found no room needed (0: none failed).
    checkpoint_wanted: u64,
    /// Every copy in `copies` holds every log entry up to `tail`, so the log can
    /// take more while no checkpoint finds room (see "When no checkpoint fits").
    log_whole: bool,
    /// Commits go to the log because no checkpoint found room (said once).
    no_room: bool,
    /// When a commit last failed to grow a spare: it tries again only after
    /// [`GROW_RETRY`], so commits on a full memnode do not each ask it for room.
    grow_failed: Option<std::time::Instant>,
    /// When the checkpoint's size was last measured without a checkpoint (see
    /// "Room to grow"): at most once per [`MEASURE_RETRY`].
    measured: Option<std::time::Instant>,
    /// Changes that grow the metadata fail for want of room.
    no_headroom: bool,
    /// When that was last said (once per [`NO_HEADROOM_REPEAT`] at most).
    no_headroom_said: Option<std::time::Instant>,
    /// Members (node indexes) the last checkpoint's superblock did not reach.
    stale_supers: Vec<usize>,
}

/// See `State::grow_failed`.
const GROW_RETRY: std::time::Duration = std::time::Duration::from_secs(1);
/// See `State::measured`: often enough that a file made right after deletes that
/// made room finds it, seldom enough that measuring (the whole namespace, as a
/// checkpoint reads it) stays a small share of the time.
const MEASURE_RETRY: std::time::Duration = std::time::Duration::from_millis(100);
/// See `State::no_headroom_said`.
const NO_HEADROOM_REPEAT: std::time::Duration = std::time::Duration::from_secs(60);

pub struct Volume {
    name: String,
    volume_id: u64,
    remote: Arc<RemoteStore>,
    journal: Arc<Journal>,
    state: Mutex<State>,
    closed: std::sync::atomic::AtomicBool,
    /// How much the checkpoint may grow by before the next commit must make room
    /// (see "Room to grow").
    headroom: std::sync::atomic::AtomicU64,
}

/// What the room for the next checkpoint keeps free beyond its bound: 256 KiB, or
/// a sixteenth of the checkpoint when that is more.
pub fn room_slack(checkpoint_len: u64) -> u64 {
    (checkpoint_len / 16).max(256 << 10)
}

/// What a checkpoint of `records` (`encoded` bytes) may come to hold without any
/// new record: every page of every block with its sum (sums become known as pages
/// are written).
fn checkpoint_bound(records: &[Record], encoded: u64) -> u64 {
    let unknown_sums: u64 = records
        .iter()
        .map(|r| match r {
            Record::Block(b) => {
                let pages = (b.alloc_len as u64).div_ceil(crate::remote::PAGE);
                let known = b.sums.iter().flatten().count() as u64;
                (5 * pages).saturating_sub(4 * known)
            }
            _ => 0,
        })
        .sum();
    encoded + unknown_sums
}

/// Most bytes a block's record takes in a checkpoint, with `pages` page sums and
/// `copies` copies.
pub fn block_record_bound(pages: u64, copies: u64) -> u64 {
    64 + 5 * pages + 12 * copies
}

/// How the volume's metadata fared at mount.
#[derive(Debug, Clone, Default)]
pub struct MountReport {
    pub created: bool,
    pub generation: u64,
    pub inodes: usize,
    pub log_entries: usize,
    pub orphans: usize,
    pub reclaimed_chunks: usize,
    pub lost_blocks: usize,
    /// Last blocks whose bytes past the end of file were zeroed again.
    pub tails_zeroed: usize,
    /// Mounted without a memnode that may hold newer metadata (`MountPolicy`).
    pub degraded: bool,
}

/// Where the loaded generation's log ends, if every copy of it (`st.copies`) replays
/// its log in full to that same end (`ends`: node, end) and the log has room left:
/// then the log can take more entries on every copy.
fn whole_tail(st: &State, ends: &[(usize, u64)]) -> Option<u64> {
    let tail = ends.iter().map(|&(_, end)| end).max()?;
    let whole = |c: &MetaCopy| ends.iter().any(|&(n, end)| n == c.node && end == tail);
    (!st.copies.is_empty() && st.copies.iter().all(whole) && tail < LOG_BYTES).then_some(tail)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A block entry as stored: its copies on this generation's members only, and its
/// page sums when `with_sums`.
fn encode_block(
    members: &[Option<(u32, u64)>],
    ino: Ino,
    index: u64,
    e: &BlockEntry,
    with_sums: bool,
) -> Record {
    let copies = e
        .loc
        .replicas()
        .iter()
        .filter(|r| {
            members
                .get(r.node as usize)
                .copied()
                .flatten()
                .is_some_and(|(epoch, _)| epoch == r.epoch)
        })
        .map(|r| StoredCopy {
            slot: r.node,
            addr: r.remote.addr,
        })
        .collect();
    Record::Block(StoredBlock {
        ino,
        index,
        flags: if e.written { BLOCK_WRITTEN } else { 0 },
        alloc_len: e.loc.bytes() as u32,
        sums: if with_sums && e.written {
            e.sums.stored()
        } else {
            Vec::new()
        },
        copies,
    })
}

/// Restores "bytes past the end of a file are zero" in remote memory after a crash
/// (mount). fsd relies on it when a file grows: the bytes between the old end and a
/// write past it are taken from the block. During a session it holds (truncate zeroes
/// the cut tail, new blocks are written whole), but a write past the end may reach
/// remote memory while its new size was never committed; after a crash the older,
/// smaller size comes back with those bytes beyond it. So each file's last block is
/// zeroed past the end, and blocks wholly past the end count as never written (they
/// then read as zeros and are written whole next time). Returns the blocks zeroed.
fn zero_past_eof(ns: &Namespace, remote: &RemoteStore) -> Result<usize, VolumeError> {
    const BATCH: usize = 256;
    let bs = remote.block_size();
    let zeros = vec![0u8; bs as usize];
    let mut tails: Vec<(BlockLoc, usize)> = Vec::new();
    for inode in ns.all() {
        let mut m = inode.meta();
        if m.attr.kind != crate::inode::FileKind::File {
            continue;
        }
        let size = m.attr.size;
        let first_past = size.div_ceil(bs);
        let beyond: Vec<u64> = m
            .blocks
            .range(first_past..)
            .filter(|(_, e)| e.written)
            .map(|(&i, _)| i)
            .collect();
        for i in beyond {
            if let Some(e) = m.blocks.get_mut(&i) {
                e.written = false;
            }
            m.block_changed(i);
        }
        if size % bs != 0 {
            if let Some(e) = m.blocks.get_mut(&(size / bs)).filter(|e| e.written) {
                let from = (size % bs) as usize;
                tails.push((e.loc.clone(), from));
                // The whole pages past the end are zeros now; the one the end is in
                // has no sum (load dropped it).
                e.sums.record(&sums::written(from, &zeros[from..]));
                e.sums.truncate(e.loc.bytes());
            }
        }
    }
    for batch in tails.chunks(BATCH) {
        let writes: Vec<(&BlockLoc, usize, &[u8])> = batch
            .iter()
            .map(|(loc, from)| (loc, *from, &zeros[*from..]))
            .collect();
        for copies in remote.write_copies(&writes) {
            // A copy that cannot be written now is lost: the checkpoint that follows
            // does not list it once its memnode is down.
            if let Some(Err(e)) = copies.into_iter().find(|r| r.is_err()) {
                return Err(VolumeError::Remote(e));
            }
        }
    }
    Ok(tails.len())
}

impl Volume {
    /// Opens the volume the memnodes of `remote` hold (it was opened on each by
    /// `RemoteStore::connect`): loads and replays its metadata, reclaims what nothing
    /// references, and starts a new generation. Returns the namespace to serve.
    ///
    /// With a memnode missing (see `quorum.rs`) it waits up to `policy.wait` for it,
    /// then refuses, unless `policy.degraded`: then it goes on from what answered.
    pub fn mount(
        name: &str,
        remote: Arc<RemoteStore>,
        owner: (u32, u32),
        policy: MountPolicy,
    ) -> Result<(Arc<Volume>, Namespace, MountReport), VolumeError> {
        let journal = Arc::new(Journal::default());
        quorum::await_memnodes(&remote, policy.wait);
        let mut loaded = load::load(&remote, name)?;
        let missing = quorum::missing_now(&remote, loaded.as_ref());
        let mut report = MountReport::default();
        if let Some(l) = loaded.as_mut().filter(|_| !missing.is_empty()) {
            let what = missing.describe();
            if !policy.degraded {
                return Err(VolumeError::Incomplete(format!(
                    "volume {name}: {what}. The newest metadata the others hold is \
                     generation {}, but a missing memnode may hold newer: mounting without \
                     it could roll the volume back. Bring it back, or mount with --degraded \
                     (mount option degraded) to go on from what answered and give up what \
                     only the missing memnodes hold",
                    l.generation
                )));
            }
            log::warn!(
                "volume {name}: mounting degraded: {what}; going on from generation {}. \
                 Whatever only the missing memnodes held is given up, and their copy of \
                 the volume is superseded",
                l.generation
            );
            l.generation += quorum::DEGRADED_JUMP;
            l.next_seq += quorum::DEGRADED_JUMP;
            report.degraded = true;
        }
        let mut upgrade = false;
        let mut loaded_copies = Vec::new();
        let mut loaded_spares = Vec::new();
        // Copies whose log replays in full (node, end) and whether this generation's
        // member slots are the nodes as numbered now (see `continue_loaded`).
        let mut loaded_ends = Vec::new();
        let mut same_members = false;
        let (mut loaded_tail, mut loaded_checkpoint_len) = (0, 0);
        let (ns, volume_id, generation, next_seq, old) = match loaded {
            None if remote.nodes_up() < remote.node_count() => {
                // The memnodes that answered hold no metadata of it; the ones away
                // may: a new empty volume here could hide the real one.
                return Err(VolumeError::NoCopy(format!(
                    "volume {name} has no metadata on the memnodes that answered and {} \
                     memnode(s) are down: not creating it anew",
                    remote.node_count() - remote.nodes_up()
                )));
            }
            None => {
                report.created = true;
                let ns = Namespace::new_logged(owner.0, owner.1, journal.clone());
                let id = rmemfs_common::control::random_id();
                (ns, id, 0, 1, Vec::new())
            }
            Some(l) => {
                report.generation = l.generation;
                report.log_entries = l.log_entries;
                report.orphans = l.orphans;
                report.lost_blocks = l.lost_blocks;
                report.reclaimed_chunks = l.reclaim(&remote);
                report.inodes = l.image.inodes.len();
                let old = l.metadata.clone();
                loaded_copies = l.current.clone();
                loaded_spares = l.spares.clone();
                loaded_ends = l.log_ends.clone();
                loaded_tail = loaded_ends.iter().map(|&(_, end)| end).max().unwrap_or(0);
                loaded_checkpoint_len = l
                    .copies
                    .iter()
                    .filter_map(|c| c.checkpoint.map(|a| a.len))
                    .max()
                    .unwrap_or(0);
                same_members = (0..remote.node_count().max(l.member_ids.len())).all(|i| {
                    let now = remote.node_identity(i).map_or(0, |(_, id)| id);
                    now == l.member_ids.get(i).copied().unwrap_or(0)
                });
                let (generation, next_seq, volume_id) = (l.generation, l.next_seq, l.volume_id);
                if l.version < format::FORMAT_VERSION {
                    log::info!(
                        "volume {name}: format version {} is rewritten as version {}",
                        l.version,
                        format::FORMAT_VERSION
                    );
                    upgrade = true;
                }
                let ns = l.into_namespace(&remote, journal.clone());
                report.tails_zeroed = zero_past_eof(&ns, &remote)?;
                (ns, volume_id, generation, next_seq, old)
            }
        };
        let volume = Arc::new(Volume {
            name: name.to_string(),
            volume_id,
            remote: remote.clone(),
            journal,
            state: Mutex::new(State {
                generation,
                next_seq,
                members: Vec::new(),
                copies: Vec::new(),
                spares: Vec::new(),
                tail: loaded_tail,
                need_checkpoint: true,
                upgrade,
                checkpoint_len: loaded_checkpoint_len,
                checkpoint_wanted: 0,
                log_whole: false,
                no_room: false,
                grow_failed: None,
                measured: None,
                no_headroom: false,
                no_headroom_said: None,
                stale_supers: Vec::new(),
            }),
            closed: Default::default(),
            headroom: Default::default(),
        });
        // A new generation at once: metadata back to R copies on the memnodes up
        // now and a fresh log, written into the spares the older superblocks name
        // where they are; the loaded generation's chunks become the next spares.
        {
            let mut st = lock(&volume.state);
            let link = |node: usize| remote.node_identity(node);
            st.members = (0..remote.node_count()).map(link).collect();
            st.copies = loaded_copies
                .iter()
                .map(|&(node, checkpoint, log)| MetaCopy {
                    node,
                    checkpoint,
                    log,
                })
                .collect();
            st.spares = loaded_spares
                .iter()
                .filter_map(|&(node, checkpoint, log)| {
                    Some(Spare {
                        copy: MetaCopy {
                            node,
                            checkpoint,
                            log,
                        },
                        link: link(node)?,
                    })
                })
                .collect();
            // A degraded mount's sequence numbers jumped: its entries cannot follow
            // the loaded log's.
            let continuable = !upgrade
                && !report.degraded
                && same_members
                && whole_tail(&st, &loaded_ends).is_some();
            match volume.checkpoint_locked(&mut st, &ns, Vec::new(), continuable) {
                Err(VolumeError::NoRoom(why)) if continuable => {
                    volume.continue_loaded(&mut st, &loaded_ends, why);
                }
                r => r?,
            }
            if report.created {
                // A second one, so the first one's chunks are spares at once.
                volume.checkpoint_locked(&mut st, &ns, Vec::new(), false)?;
            }
            report.generation = st.generation;
            // Metadata chunks of the loaded generation that are no copy (a
            // checkpoint and log in one chunk, say) are of no further use.
            let kept = |node: usize, addr: u64| {
                st.spares
                    .iter()
                    .map(|s| s.copy)
                    .chain(st.copies.clone())
                    .any(|c| c.node == node && (c.checkpoint.addr == addr || c.log.addr == addr))
            };
            for (node, area) in old {
                if !kept(node, area.addr) {
                    remote.free_chunk_of(node, area);
                }
            }
            volume.refresh_headroom(&mut st, &ns);
        }
        Ok((volume, ns, report))
    }

    /// True the first time only: the caller shuts the volume down.
    pub fn close(&self) -> bool {
        !self.closed.swap(true, std::sync::atomic::Ordering::SeqCst)
    }

    /// True once [`Volume::close`] has been called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn journal(&self) -> &Arc<Journal> {
        &self.journal
    }

    /// Blocks freed by the filesystem: given back after the next commit.
    pub fn defer_free(&self, blocks: impl IntoIterator<Item = BlockLoc>) {
        self.journal.defer_free(blocks);
    }

    /// Makes every change so far durable (the caller wrote the data back first).
    pub fn commit(&self, ns: &Namespace) -> Result<(), VolumeError> {
        let mut st = lock(&self.state);
        let frees = self.journal.take_frees();
        let r = if st.need_checkpoint || self.membership_changed(&st) || self.behind(&st) {
            self.checkpoint_or_log(&mut st, ns, frees)
        } else {
            self.log_changes(&mut st, ns, frees)
        };
        self.refresh_headroom(&mut st, ns);
        r
    }

    /// True while the metadata may grow (a file made, a block allocated) without a
    /// commit first; see "Room to grow".
    pub fn may_grow(&self) -> bool {
        self.journal.growth() < self.headroom.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The room the next checkpoint has: the largest checkpoint chunk among the
    /// spares on the memnodes' current links (0 with none).
    fn spare_room(&self, st: &State) -> u64 {
        st.spares
            .iter()
            .filter(|s| st.members.get(s.copy.node).copied().flatten() == Some(s.link))
            .map(|s| s.copy.checkpoint.len)
            .max()
            .unwrap_or(0)
    }

    /// Works out the headroom after a commit (see "Room to grow"): when the bound
    /// (the measured size and the growth since) comes within the slack of the
    /// spares' room, grows a spare if the memnodes have room (at most once per
    /// [`GROW_RETRY`]), else measures the checkpoint's size anew.
    fn refresh_headroom(&self, st: &mut State, ns: &Namespace) {
        let due = |t: Option<std::time::Instant>| t.is_none_or(|t| t.elapsed() >= GROW_RETRY);
        let bound = |st: &State| {
            let len = st.checkpoint_len.saturating_add(self.journal.growth());
            len.saturating_add(room_slack(len))
        };
        let mut room = self.spare_room(st);
        if bound(st) > room && due(st.grow_failed) {
            let members = st.members.clone();
            let grown = self.make_room(st, &members, room == 0, true);
            st.grow_failed = grown.is_err().then(std::time::Instant::now);
            room = self.spare_room(st);
        }
        let measure_due = st.measured.is_none_or(|t| t.elapsed() >= MEASURE_RETRY);
        if bound(st) > room && measure_due {
            let members = st.members.clone();
            let records = ns
                .checkpoint_preview(|| self.journal.measured(), &|ino, idx, e, sums| {
                    encode_block(&members, ino, idx, e, sums)
                });
            let encoded = encode_checkpoint(st.generation + 1, &encode_records(&records));
            st.checkpoint_len = checkpoint_bound(&records, encoded.len() as u64);
            st.measured = Some(std::time::Instant::now());
        }
        let len = st.checkpoint_len;
        let headroom = room.saturating_sub(len.saturating_add(room_slack(len)));
        self.headroom
            .store(headroom, std::sync::atomic::Ordering::Relaxed);
        let none = headroom <= self.journal.growth();
        let repeat = st
            .no_headroom_said
            .is_none_or(|t| t.elapsed() >= NO_HEADROOM_REPEAT);
        if none && !st.no_headroom && repeat {
            log::warn!(
                "volume {}: no room for more metadata (checkpoint of {}, room {}): \
                 files and blocks can be made again once deletes free memory",
                self.name,
                format_size(len),
                format_size(room)
            );
            st.no_headroom_said = Some(std::time::Instant::now());
        }
        if !none && st.no_headroom {
            log::debug!("volume {}: room for more metadata again", self.name);
        }
        st.no_headroom = none;
    }

    /// A checkpoint; when no memnode has room for one, the changes go to the log
    /// instead, if it can take them (see "When no checkpoint fits").
    fn checkpoint_or_log(
        &self,
        st: &mut State,
        ns: &Namespace,
        frees: Vec<BlockLoc>,
    ) -> Result<(), VolumeError> {
        let may_defer = st.log_whole && !self.membership_changed(st);
        match self.checkpoint_locked(st, ns, frees, may_defer) {
            Err(VolumeError::NoRoom(why)) if may_defer => {
                if !std::mem::replace(&mut st.no_room, true) {
                    log::warn!(
                        "volume {}: {why}; the log takes the changes until a checkpoint \
                         finds room",
                        self.name
                    );
                }
                // The checkpoint gave the frees back untouched.
                let frees = self.journal.take_frees();
                self.log_changes(st, ns, frees)
            }
            r => r,
        }
    }

    /// Appends what changed since the last commit to the log (a checkpoint instead
    /// when the log is full), then gives back the blocks it recorded free.
    fn log_changes(
        &self,
        st: &mut State,
        ns: &Namespace,
        frees: Vec<BlockLoc>,
    ) -> Result<(), VolumeError> {
        let members = st.members.clone();
        let (entries, dirty) = ns.commit_records(|| self.journal.take(), &|ino, idx, e, sums| {
            encode_block(&members, ino, idx, e, sums)
        });
        let mut bytes = Vec::new();
        let mut seq = st.next_seq;
        for e in entries.iter().map(encode_records) {
            bytes.extend(encode_entry(seq, &e));
            seq += 1;
        }
        if !dirty.is_empty() {
            bytes.extend(encode_entry(seq, &encode_records(&dirty)));
            seq += 1;
        }
        if bytes.is_empty() {
            self.remote.free_blocks(frees);
            return Ok(());
        }
        if st.tail + bytes.len() as u64 > LOG_BYTES - STALE_RESERVE {
            // The log is full: the checkpoint covers what these entries say.
            return self.checkpoint_locked(st, ns, frees, false);
        }
        if let Err(e) = self.append_locked(st, &bytes, seq) {
            self.journal.return_frees(frees);
            return Err(e);
        }
        // The room for the next checkpoint grows after this (`refresh_headroom`).
        self.remote.free_blocks(frees);
        Ok(())
    }

    /// Logs that the page sums the log holds for files `inos` may go stale: fsd is
    /// about to write their blocks back (see "Page sums in the log"). Returns once
    /// that is durable; when the log has no room, a checkpoint does it instead (it
    /// logs no sums for files being written back).
    pub fn sums_stale(&self, ns: &Namespace, inos: &[Ino]) -> Result<(), VolumeError> {
        let records: Vec<Record> = inos.iter().map(|&ino| Record::SumsStale { ino }).collect();
        let mut st = lock(&self.state);
        let bytes = encode_entry(st.next_seq, &encode_records(&records));
        if st.tail + bytes.len() as u64 > LOG_BYTES {
            return self.checkpoint_locked(&mut st, ns, Vec::new(), false);
        }
        if st.need_checkpoint || self.membership_changed(&st) {
            let may_defer = st.log_whole && !self.membership_changed(&st);
            match self.checkpoint_locked(&mut st, ns, Vec::new(), may_defer) {
                Err(VolumeError::NoRoom(_)) if may_defer => {}
                r => return r,
            }
        }
        let seq = st.next_seq + 1;
        self.append_locked(&mut st, &bytes, seq)
    }

    /// Writes `bytes` (whole log entries, numbered up to `next_seq`) at the log's
    /// tail on every metadata copy; durable once one copy took them.
    fn append_locked(
        &self,
        st: &mut State,
        bytes: &[u8],
        next_seq: u64,
    ) -> Result<(), VolumeError> {
        let mut written = 0;
        // A copy on an unreachable memnode is waited for only when no other copy can
        // take the entries: else it misses them, and the next commit is a checkpoint
        // that puts the metadata where it can be reached (the block copies on that
        // memnode stay recorded: it is only unreachable).
        let reachable: Vec<MetaCopy> = st
            .copies
            .iter()
            .filter(|c| self.remote.node_is_up(c.node))
            .copied()
            .collect();
        let targets = if reachable.is_empty() {
            st.copies.clone()
        } else {
            reachable
        };
        if targets.len() < st.copies.len() {
            st.need_checkpoint = true;
        }
        // Copies in reach are written without waiting: one whose memnode goes away
        // meanwhile misses the entries (as one out of reach does) rather than holding
        // the commit until it is back. Only with no copy in reach is one waited for.
        let patient = targets.iter().all(|c| !self.remote.node_is_up(c.node));
        for c in targets {
            let at = RemoteAddr {
                addr: c.log.addr + st.tail,
                rkey: c.log.rkey,
            };
            let result = if patient {
                self.remote.write_at(c.node, at, bytes)
            } else {
                self.remote.write_at_if_reachable(c.node, at, bytes)
            };
            match result {
                Ok(()) => written += 1,
                Err(e) if e.is_fenced() => {
                    log::error!(
                        "volume {}: memnode {} refused the log: another fsd took the volume \
                         over; this mount can no longer make anything durable",
                        self.name,
                        self.remote.node_name(c.node)
                    );
                    st.need_checkpoint = true;
                }
                Err(e) => {
                    log::warn!(
                        "volume {}: log copy on memnode {} failed: {e}",
                        self.name,
                        self.remote.node_name(c.node)
                    );
                    st.need_checkpoint = true;
                }
            }
        }
        if written < st.copies.len() {
            // A copy missed this entry: the log can take no more until a checkpoint.
            st.log_whole = false;
        }
        if written == 0 {
            // Nothing durable: the next commit writes everything as a checkpoint.
            st.need_checkpoint = true;
            return Err(VolumeError::NoCopy(format!(
                "no memnode took the log of volume {}",
                self.name
            )));
        }
        st.tail += bytes.len() as u64;
        st.next_seq = next_seq;
        Ok(())
    }

    /// True when the metadata has fewer copies than the memnodes up could hold, or a
    /// member that missed the last superblock is up again: a checkpoint catches up.
    fn behind(&self, st: &State) -> bool {
        let want = self.remote.replicas().max(1);
        st.copies.len() < want.min(self.remote.nodes_up())
            || st.stale_supers.iter().any(|&n| self.remote.node_is_up(n))
    }

    /// True when a metadata copy's memnode went down or came back as another epoch,
    /// or a memnode now up is not a member: a checkpoint brings the copies and the
    /// member slots up to date.
    fn membership_changed(&self, st: &State) -> bool {
        (0..self.remote.node_count())
            .any(|i| self.remote.node_identity(i) != st.members.get(i).copied().flatten())
    }

    /// Writes a checkpoint of generation + 1 to fresh chunks on the first R memnodes
    /// up, points every superblock at it, then frees the previous generation's chunks.
    /// With `may_defer` (the log can take the changes instead), a checkpoint that
    /// finds no room for its bound is `NoRoom` before it takes anything.
    fn checkpoint_locked(
        &self,
        st: &mut State,
        ns: &Namespace,
        mut frees: Vec<BlockLoc>,
        may_defer: bool,
    ) -> Result<(), VolumeError> {
        let nodes = self.remote.node_count();
        let members: Vec<Option<(u32, u64)>> =
            (0..nodes).map(|i| self.remote.node_identity(i)).collect();
        // Spares whose memnode is on another link now carry dead rkeys.
        let (fresh, stale): (Vec<Spare>, Vec<Spare>) = std::mem::take(&mut st.spares)
            .into_iter()
            .partition(|s| members.get(s.copy.node).copied().flatten() == Some(s.link));
        st.spares = fresh;
        for s in stale {
            self.free_copy(s.copy, false);
        }
        // Nothing is taken from the journal before the checkpoint has somewhere to go;
        // with nowhere else for the changes, a spare smaller than the bound may still
        // hold it, so it is tried.
        match self.make_room(st, &members, true, false) {
            Err(e) if may_defer => {
                self.journal.return_frees(frees);
                return Err(e);
            }
            _ => {}
        }
        frees.extend(self.journal.take_frees());
        let bs = self.remote.block_size();
        let records = ns.checkpoint_records(
            || {
                self.journal.take();
                self.journal.measured();
            },
            &|ino, idx, e, sums| encode_block(&members, ino, idx, e, sums),
        );
        let generation = st.generation + 1;
        let checkpoint = encode_checkpoint(generation, &encode_records(&records));
        let want = self.remote.replicas().max(1);
        let mut spares = std::mem::take(&mut st.spares);
        let mut copies = Vec::new();
        // Memnodes out of reach that took a copy (none in reach could).
        let mut waited_for = Vec::new();
        // Memnodes in reach first: an unreachable one is waited for only when too
        // few others can take a copy.
        let mut order: Vec<usize> = (0..nodes).filter(|&i| members[i].is_some()).collect();
        order.sort_by_key(|&i| !self.remote.node_is_up(i));
        for node in order {
            if copies.len() == want || (!copies.is_empty() && !self.remote.node_is_up(node)) {
                break;
            }
            let mut spare = spares
                .iter()
                .position(|s| s.copy.node == node)
                .map(|k| spares.swap_remove(k));
            // A memnode in reach is not waited for if it goes away meanwhile; one
            // out of reach is tried only when no other took a copy, and waited for.
            let patient = !self.remote.node_is_up(node);
            match self.write_copy(node, &checkpoint, &mut spare, patient) {
                Ok(c) => {
                    if patient {
                        waited_for.push(node);
                    }
                    copies.push(c);
                }
                Err(e) => log::warn!(
                    "volume {}: no checkpoint copy on memnode {}: {e}",
                    self.name,
                    self.remote.node_name(node)
                ),
            }
            spares.extend(spare);
        }
        if copies.is_empty() {
            st.spares = spares;
            st.need_checkpoint = true;
            // The journal was taken for it: the log no longer says everything.
            st.log_whole = false;
            st.checkpoint_wanted = checkpoint.len() as u64;
            self.journal.return_frees(frees);
            return Err(VolumeError::NoCopy(format!(
                "no memnode took a checkpoint of volume {}",
                self.name
            )));
        }
        let sb = |copy: Option<&MetaCopy>| Superblock {
            volume_id: self.volume_id,
            generation,
            block_size: bs as u32,
            first_seq: st.next_seq,
            checkpoint: copy.map(|c| {
                (
                    Area {
                        addr: c.checkpoint.addr,
                        len: checkpoint.len() as u64,
                    },
                    format::crc(&checkpoint),
                )
            }),
            log: copy.map(|c| Area {
                addr: c.log.addr,
                len: c.log.len,
            }),
            members: members.iter().map(|m| m.map_or(0, |(_, id)| id)).collect(),
            version: format::FORMAT_VERSION,
        };
        // Generations alternate between the slots; a volume of an older format gets
        // the new superblock in both, so an older fsd finds none it would take for
        // valid (the other slot would be an older generation, its chunks freed).
        let slots: &[usize] = if st.upgrade {
            &[(generation % 2) as usize, (generation as usize + 1) % 2]
        } else {
            &[(generation % 2) as usize]
        };
        let mut durable = Vec::new();
        // Members out of reach that hold no copy keep their older superblock (it
        // only tells a mount the generation) until a later checkpoint reaches them:
        // a commit does not wait for them.
        let mut stale = Vec::new();
        for node in (0..nodes).filter(|&i| members[i].is_some()) {
            let copy = copies.iter().find(|c| c.node == node);
            // Only a member out of reach is caught up later: one in reach that
            // failed would fail every commit's checkpoint again.
            let mut out_of_reach = || {
                if !self.remote.node_is_up(node) {
                    stale.push(node);
                }
            };
            let Some(root) = self.remote.volume_root(node) else {
                out_of_reach();
                continue;
            };
            let bytes = sb(copy).encode();
            let written = slots.iter().try_for_each(|slot| {
                let at = RemoteAddr {
                    addr: root.addr + (slot * SUPERBLOCK_SLOT) as u64,
                    rkey: root.rkey,
                };
                // Waited for only where the copy itself was (no memnode in reach).
                if copy.is_some_and(|c| waited_for.contains(&c.node)) {
                    self.remote.write_at(node, at, &bytes)
                } else {
                    self.remote.write_at_if_reachable(node, at, &bytes)
                }
            });
            match written {
                Ok(()) => {
                    if let Some(c) = copy {
                        durable.push(*c);
                    }
                }
                Err(e) => {
                    log::warn!(
                        "volume {}: superblock on memnode {} not written: {e}",
                        self.name,
                        self.remote.node_name(node)
                    );
                    out_of_reach();
                }
            }
        }
        st.stale_supers = stale;
        for c in copies
            .iter()
            .filter(|c| !durable.iter().any(|d| d.node == c.node))
        {
            self.free_copy(*c, true);
        }
        if durable.is_empty() {
            st.spares = spares;
            st.need_checkpoint = true;
            st.log_whole = false;
            self.journal.return_frees(frees);
            return Err(VolumeError::NoCopy(format!(
                "no memnode took the superblock of volume {}",
                self.name
            )));
        }
        // Spares on memnodes that hold no copy now are of no use.
        for s in spares {
            self.free_copy(s.copy, true);
        }
        // The generation just replaced: the spares of the next checkpoint.
        let old = std::mem::replace(&mut st.copies, durable);
        for c in old {
            match members.get(c.node).copied().flatten() {
                Some(link) if st.members.get(c.node).copied().flatten() == Some(link) => {
                    st.spares.push(Spare { copy: c, link });
                }
                // Its rkeys are of an older link to that memnode.
                _ => self.free_copy(c, false),
            }
        }
        log::info!(
            "volume {}: generation {generation}, checkpoint of {} ({} records) on {} memnode(s)",
            self.name,
            format_size(checkpoint.len() as u64),
            records.len(),
            st.copies.len()
        );
        st.generation = generation;
        st.members = members;
        st.tail = 0;
        st.upgrade = false;
        st.checkpoint_len = checkpoint_bound(&records, checkpoint.len() as u64);
        st.checkpoint_wanted = 0;
        st.log_whole = true;
        if std::mem::take(&mut st.no_room) {
            log::info!("volume {}: a checkpoint found room again", self.name);
        }
        st.need_checkpoint = st.copies.len() < want.min(self.remote.nodes_up());
        self.remote.free_blocks(frees);
        Ok(())
    }

    /// Writes `checkpoint` to one memnode with an empty log: into `spare`'s chunks
    /// (taken when used; a log reused holds only older entries, which a replay takes
    /// for the end of the log) or fresh ones. A spare whose checkpoint chunk is too
    /// small keeps its log and gets a larger checkpoint chunk.
    fn write_copy(
        &self,
        node: usize,
        checkpoint: &[u8],
        spare: &mut Option<Spare>,
        patient: bool,
    ) -> Result<MetaCopy, RemoteError> {
        let len = checkpoint.len() as u64;
        let reused = spare.map(|s| s.copy);
        let fits = reused.filter(|c| c.checkpoint.len >= len);
        let ck = match fits {
            Some(c) => c.checkpoint,
            None => self.checkpoint_chunk(node, len)?,
        };
        let log = match reused {
            Some(c) => c.log,
            None => match self.remote.alloc_chunk(node, LOG_BYTES) {
                Ok(l) => l,
                Err(e) => {
                    self.remote.free_chunk_of(node, ck);
                    return Err(e);
                }
            },
        };
        let at = RemoteAddr {
            addr: ck.addr,
            rkey: ck.rkey,
        };
        let written = if patient {
            self.remote.write_at(node, at, checkpoint)
        } else {
            self.remote.write_at_if_reachable(node, at, checkpoint)
        };
        if let Err(e) = written {
            // A spare stays one (what it held was of no use already); fresh chunks
            // go back.
            if fits.is_none() {
                self.remote.free_chunk_of(node, ck);
            }
            if reused.is_none() {
                self.remote.free_chunk_of(node, log);
            }
            return Err(e);
        }
        if let Some(c) = reused {
            if fits.is_none() {
                self.remote.free_chunk_of(node, c.checkpoint);
            }
        }
        *spare = None;
        Ok(MetaCopy {
            node,
            checkpoint: ck,
            log,
        })
    }

    /// A chunk for a checkpoint of `len` bytes on `node`: with room to grow by a full
    /// log and half again if the memnode has it, else just what this one needs. The
    /// chunk comes back as a spare. Sized for `len` alone, a volume whose memory
    /// filled within one commit interval (a fresh volume given many files, then data
    /// to the last byte) had no room for the checkpoint its full log called for, and
    /// not even the unmount's could make its changes durable.
    fn checkpoint_chunk(&self, node: usize, len: u64) -> Result<Allocation, RemoteError> {
        let sizes = [
            checkpoint_room(len.saturating_add(LOG_BYTES)),
            checkpoint_room(len),
            len.max(1),
        ];
        let mut r = Err(RemoteError::NoSpace);
        for size in sizes {
            r = self.remote.alloc_chunk(node, size);
            if !matches!(r, Err(RemoteError::NoSpace)) {
                break;
            }
        }
        r
    }

    /// Makes sure the next checkpoint has somewhere to go before anything is taken
    /// for it: on each memnode it would go to, a spare whose checkpoint chunk holds
    /// the checkpoint's bound, and the slack too with `slack` (grown when it does
    /// not, with the slack; with `create`, a new spare where there is none).
    /// `NoRoom` when no memnode has it and one said it is full; other failures are
    /// the checkpoint's to find and report.
    fn make_room(
        &self,
        st: &mut State,
        members: &[Option<(u32, u64)>],
        create: bool,
        slack: bool,
    ) -> Result<(), VolumeError> {
        // A checkpoint holds at most its measured size and the growth since; the
        // room keeps a slack beyond that (see "Room to grow").
        let len = st.checkpoint_len.saturating_add(self.journal.growth());
        let roomy = len
            .saturating_add(room_slack(len))
            .max(st.checkpoint_wanted);
        let need = match slack {
            true => roomy,
            false => len.max(st.checkpoint_wanted),
        }
        .max(1);
        let want = self.remote.replicas().max(1);
        let (mut ready, mut full) = (0, false);
        for (node, link) in members.iter().enumerate() {
            let Some(link) = *link else { continue };
            if ready == want {
                break;
            }
            let spare = st
                .spares
                .iter()
                .position(|s| s.copy.node == node && s.link == link);
            let made = match spare {
                Some(k) if st.spares[k].copy.checkpoint.len >= need => Ok(()),
                Some(k) => self.checkpoint_chunk(node, roomy).map(|ck| {
                    let old = std::mem::replace(&mut st.spares[k].copy.checkpoint, ck);
                    self.remote.free_chunk_of(node, old);
                }),
                None if !create => continue,
                None => self.new_copy(node, roomy).map(|copy| {
                    st.spares.push(Spare { copy, link });
                }),
            };
            match made {
                Ok(()) => ready += 1,
                Err(RemoteError::NoSpace) => full = true,
                Err(_) => {}
            }
        }
        if ready == 0 && full {
            return Err(VolumeError::NoRoom(format!(
                "no memnode has room for a checkpoint of volume {} ({})",
                self.name,
                format_size(need)
            )));
        }
        Ok(())
    }

    /// Fresh chunks for a checkpoint of `len` bytes and a log on `node`.
    /// The log first: the checkpoint chunk can make do with less room, the log not.
    fn new_copy(&self, node: usize, len: u64) -> Result<MetaCopy, RemoteError> {
        let log = self.remote.alloc_chunk(node, LOG_BYTES)?;
        match self.checkpoint_chunk(node, len) {
            Ok(checkpoint) => Ok(MetaCopy {
                node,
                checkpoint,
                log,
            }),
            Err(e) => {
                self.remote.free_chunk_of(node, log);
                Err(e)
            }
        }
    }

    /// At mount, when no memnode has room for the mount's checkpoint: goes on with
    /// the loaded generation, appending to its log where it ends (see
    /// [`whole_tail`]). The next commit tries a checkpoint again.
    fn continue_loaded(&self, st: &mut State, ends: &[(usize, u64)], why: String) {
        let tail = whole_tail(st, ends).unwrap_or(LOG_BYTES);
        log::warn!(
            "volume {}: {why}; it goes on with generation {} and its log until a \
             checkpoint finds room (free space: delete files)",
            self.name,
            st.generation
        );
        st.tail = tail;
        st.log_whole = true;
        st.need_checkpoint = true;
        st.no_room = true;
        // What the replayed log added to the checkpoint is not known: at most the log.
        self.journal.grew(tail);
    }

    /// Gives a copy's chunks back: on the link they were allocated on (`same_link`),
    /// or by address on the memnode's current link (their rkeys are of an older one).
    fn free_copy(&self, c: MetaCopy, same_link: bool) {
        for chunk in [c.checkpoint, c.log] {
            if same_link {
                self.remote.free_chunk_of(c.node, chunk);
            } else {
                self.remote.free_volume_chunk_at(c.node, chunk.addr);
            }
        }
    }

    /// A checkpoint now (unmount: the next mount has no log to replay). The spares
    /// stay: the older superblock names them, and the next mount writes its
    /// checkpoint there.
    pub fn checkpoint(&self, ns: &Namespace) -> Result<(), VolumeError> {
        let mut st = lock(&self.state);
        self.checkpoint_or_log(&mut st, ns, Vec::new())
    }

    /// Makes the next commit a checkpoint, as a full log or a failed commit does.
    #[cfg(test)]
    pub fn want_checkpoint(&self) {
        lock(&self.state).need_checkpoint = true;
    }

    /// Whether the metadata has fewer copies than it should (maintenance then
    /// commits, which checkpoints).
    pub fn needs_checkpoint(&self) -> bool {
        let st = lock(&self.state);
        st.need_checkpoint || self.membership_changed(&st) || self.behind(&st)
    }
}

#[cfg(test)]
#[path = "volume_tests.rs"]
mod tests;
