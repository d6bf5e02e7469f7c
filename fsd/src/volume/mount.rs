//! Mounting: the metadata read back (`load.rs`) becomes the namespace to serve,
//! what a crash left past the end of files is zeroed again, and a new generation
//! starts at once (or, with no room for its checkpoint, the loaded generation's log
//! goes on: see "When no checkpoint fits" in `mod.rs`). Apart from `load.rs`, which
//! the offline check shares: this is what only a mounting fsd does.

use super::format;
use super::journal::Journal;
use super::load;
use super::quorum;
use super::{lock, Logged, MetaCopy, MountPolicy, Spare, State, Volume, VolumeError, LOG_BYTES};
use crate::remote::sums;
use crate::remote::{BlockLoc, RemoteStore};
use std::sync::{Arc, Mutex};

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

/// Restores "bytes past the end of a file are zero" in remote memory after a crash
/// (mount). fsd relies on it when a file grows: the bytes between the old end and a
/// write past it are taken from the block. During a session it holds (truncate zeroes
/// the cut tail, new blocks are written whole), but a write past the end may reach
/// remote memory while its new size was never committed; after a crash the older,
/// smaller size comes back with those bytes beyond it. So each file's last block is
/// zeroed past the end, and blocks wholly past the end count as never written (they
/// then read as zeros and are written whole next time). Returns the blocks zeroed.
fn zero_past_eof(ns: &impl Logged, remote: &RemoteStore) -> Result<usize, VolumeError> {
    const BATCH: usize = 256;
    let bs = remote.block_size();
    let zeros = vec![0u8; bs as usize];
    let mut tails: Vec<(BlockLoc, usize)> = Vec::new();
    for inode in ns.inodes() {
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
    pub fn mount<N: Logged>(
        name: &str,
        remote: Arc<RemoteStore>,
        owner: (u32, u32),
        policy: MountPolicy,
    ) -> Result<(Arc<Volume>, N, MountReport), VolumeError> {
        let journal = Arc::new(Journal::default());
        quorum::await_memnodes(&remote, policy.wait);
        let mut loaded = load::load(remote.as_ref(), name)?;
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
                let ns = N::new_logged(owner.0, owner.1, journal.clone());
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
                loaded_checkpoint_len = l.checkpoint_len;
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
                let ns = l.into_namespace(remote.as_ref(), journal.clone());
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
}
