//! Room for the metadata: the chunks a checkpoint is given and how large, the
//! spares grown before a checkpoint takes anything, and the headroom each commit
//! leaves the metadata to grow into (see "Room for the next checkpoint", "When no
//! checkpoint fits" and "Room to grow" in `mod.rs`). Apart from the checkpoint
//! because it is accounting that every commit does, so a full volume never wedges.

use super::format::{encode_checkpoint, encode_records, Record};
use super::logged::encode_block;
use super::{Logged, MetaCopy, Spare, State, Volume, VolumeError, LOG_BYTES};
use crate::remote::RemoteError;
use rmemfs_common::protocol::Allocation;
use rmemfs_common::size::format_size;

/// Bytes of the chunk a checkpoint of `len` bytes is written to: half again (at
/// least 1 MiB more), in whole MiB, so the checkpoints after it fit the same chunk
/// (it comes back as a spare) while the namespace grows.
pub fn checkpoint_room(len: u64) -> u64 {
    len.saturating_add((len / 2).max(1 << 20))
        .div_ceil(1 << 20)
        .saturating_mul(1 << 20)
}

/// See `State::grow_failed`.
pub(super) const GROW_RETRY: std::time::Duration = std::time::Duration::from_secs(1);
/// See `State::measured`: often enough that a file made right after deletes that
/// made room finds it, seldom enough that measuring (the whole namespace, as a
/// checkpoint reads it) stays a small share of the time.
pub(super) const MEASURE_RETRY: std::time::Duration = std::time::Duration::from_millis(100);
/// See `State::no_headroom_said`.
pub(super) const NO_HEADROOM_REPEAT: std::time::Duration = std::time::Duration::from_secs(60);

/// What the room for the next checkpoint keeps free beyond its bound: 256 KiB, or
/// a sixteenth of the checkpoint when that is more.
pub fn room_slack(checkpoint_len: u64) -> u64 {
    (checkpoint_len / 16).max(256 << 10)
}

/// What a checkpoint of `records` (`encoded` bytes) may come to hold without any
/// new record: every page of every block with its sum (sums become known as pages
/// are written).
pub(super) fn checkpoint_bound(records: &[Record], encoded: u64) -> u64 {
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

impl Volume {
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
    pub(super) fn refresh_headroom(&self, st: &mut State, ns: &impl Logged) {
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

    /// Makes sure the next checkpoint has somewhere to go before anything is taken
    /// for it: on each memnode it would go to, a spare whose checkpoint chunk holds
    /// the checkpoint's bound, and the slack too with `slack` (grown when it does
    /// not, with the slack; with `create`, a new spare where there is none).
    /// `NoRoom` when no memnode has it and one said it is full; other failures are
    /// the checkpoint's to find and report.
    pub(super) fn make_room(
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

    /// A chunk for a checkpoint of `len` bytes on `node`: with room to grow by a full
    /// log and half again if the memnode has it, else just what this one needs. The
    /// chunk comes back as a spare. Sized for `len` alone, a volume whose memory
    /// filled within one commit interval (a fresh volume given many files, then data
    /// to the last byte) had no room for the checkpoint its full log called for, and
    /// not even the unmount's could make its changes durable.
    pub(super) fn checkpoint_chunk(
        &self,
        node: usize,
        len: u64,
    ) -> Result<Allocation, RemoteError> {
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
}
