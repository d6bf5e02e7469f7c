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
//!
//! [`checkpoint_bound`]: room::checkpoint_bound
//! [`Record::SumsStale`]: format::Record::SumsStale

pub mod admin;
mod checkpoint;
mod commit;
pub mod format;
pub mod image;
pub mod journal;
mod load;
mod logged;
#[cfg(any(test, feature = "test-support"))]
pub mod memory;
mod mount;
pub mod quorum;
mod room;
mod source;

pub use commit::LOG_BYTES;
pub use load::{load, Loaded, VolumeError};
pub use logged::{BlockEncoder, Logged};
pub use mount::MountReport;
pub use quorum::MountPolicy;
pub use room::{block_record_bound, checkpoint_room, room_slack};
pub use source::VolumeSource;

use crate::remote::{BlockLoc, RemoteStore};
use journal::Journal;
use rmemfs_common::protocol::Allocation;
use std::sync::{Arc, Mutex};

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
    ///
    /// [`checkpoint_bound`]: room::checkpoint_bound
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
    ///
    /// [`GROW_RETRY`]: room::GROW_RETRY
    grow_failed: Option<std::time::Instant>,
    /// When the checkpoint's size was last measured without a checkpoint (see
    /// "Room to grow"): at most once per [`MEASURE_RETRY`].
    ///
    /// [`MEASURE_RETRY`]: room::MEASURE_RETRY
    measured: Option<std::time::Instant>,
    /// Changes that grow the metadata fail for want of room.
    no_headroom: bool,
    /// When that was last said (once per [`NO_HEADROOM_REPEAT`] at most).
    ///
    /// [`NO_HEADROOM_REPEAT`]: room::NO_HEADROOM_REPEAT
    no_headroom_said: Option<std::time::Instant>,
    /// Members (node indexes) the last checkpoint's superblock did not reach.
    stale_supers: Vec<usize>,
}

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

use rmemfs_common::sync::lock;

impl Volume {
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
}

// The volume's end-to-end tests need the whole filesystem: they are in
// `fs/tests/volume.rs`. The files here test their pure helpers.
