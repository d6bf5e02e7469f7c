//! Checkpoints: the whole namespace written as the next generation, into the spares
//! (or fresh chunks) on up to R memnodes, then every member's superblock pointed at
//! it; the generation it replaces becomes the next spares (see "Why a log of states
//! plus checkpoints" and "Room for the next checkpoint" in `mod.rs`). Also when one
//! is due: a copy lost, the members changed, a member behind. Apart from the commit
//! path (`commit.rs`) because it rewrites where the metadata lives, not just the log.

use super::format::{self, encode_checkpoint, encode_records, Area, Superblock, SUPERBLOCK_SLOT};
use super::logged::encode_block;
use super::room::checkpoint_bound;
use super::{lock, Logged, MetaCopy, Spare, State, Volume, VolumeError, LOG_BYTES};
use crate::remote::{BlockLoc, RemoteError};
use rmemfs_common::fabric::RemoteAddr;
use rmemfs_common::size::format_size;

impl Volume {
    /// A checkpoint now (unmount: the next mount has no log to replay). The spares
    /// stay: the older superblock names them, and the next mount writes its
    /// checkpoint there.
    pub fn checkpoint(&self, ns: &impl Logged) -> Result<(), VolumeError> {
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

    /// True when the metadata has fewer copies than the memnodes up could hold, or a
    /// member that missed the last superblock is up again: a checkpoint catches up.
    pub(super) fn behind(&self, st: &State) -> bool {
        let want = self.remote.replicas().max(1);
        st.copies.len() < want.min(self.remote.nodes_up())
            || st.stale_supers.iter().any(|&n| self.remote.node_is_up(n))
    }

    /// True when a metadata copy's memnode went down or came back as another epoch,
    /// or a memnode now up is not a member: a checkpoint brings the copies and the
    /// member slots up to date.
    pub(super) fn membership_changed(&self, st: &State) -> bool {
        (0..self.remote.node_count())
            .any(|i| self.remote.node_identity(i) != st.members.get(i).copied().flatten())
    }

    /// Writes a checkpoint of generation + 1 to fresh chunks on the first R memnodes
    /// up, points every superblock at it, then frees the previous generation's chunks.
    /// With `may_defer` (the log can take the changes instead), a checkpoint that
    /// finds no room for its bound is `NoRoom` before it takes anything.
    pub(super) fn checkpoint_locked(
        &self,
        st: &mut State,
        ns: &impl Logged,
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
        // Why the others did not: the error when none did.
        let mut refusals = Vec::new();
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
                Err(e) => {
                    log::warn!(
                        "volume {}: no checkpoint copy on memnode {}: {e}",
                        self.name,
                        self.remote.node_name(node)
                    );
                    refusals.push(e.to_string());
                }
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
                "no memnode took a checkpoint of volume {}{}",
                self.name,
                if refusals.is_empty() {
                    String::new()
                } else {
                    format!(": {}", refusals.join("; "))
                }
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
}
