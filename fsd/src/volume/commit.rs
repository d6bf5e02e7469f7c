//! Commits: what changed since the last commit is appended to the log, at its tail
//! on every metadata copy; a full log, a lost copy or changed members make the
//! commit a checkpoint instead (`checkpoint.rs`), and when no checkpoint finds room
//! the log takes the changes after all (see "When no checkpoint fits" in `mod.rs`).
//! Also the `SumsStale` entries a write-back logs first ("Page sums in the log").
//! Apart from the checkpoint because this is the path every fsync takes: it writes
//! only what changed.

use super::format::{encode_entry, encode_records, Record};
use super::logged::encode_block;
use super::{lock, Logged, MetaCopy, State, Volume, VolumeError};
use crate::inode::Ino;
use crate::remote::BlockLoc;
use rmemfs_common::fabric::RemoteAddr;

/// Bytes of each metadata copy's log: when a commit does not fit, a checkpoint
/// starts a new generation instead.
pub const LOG_BYTES: u64 = 8 << 20;
/// The end of the log that commits leave to [`Volume::sums_stale`], which can log
/// there without a checkpoint when commits have filled the rest.
const STALE_RESERVE: u64 = 1 << 20;

impl Volume {
    /// Makes every change so far durable (the caller wrote the data back first).
    pub fn commit(&self, ns: &impl Logged) -> Result<(), VolumeError> {
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

    /// Logs that the page sums the log holds for files `inos` may go stale: fsd is
    /// about to write their blocks back (see "Page sums in the log"). Returns once
    /// that is durable; when the log has no room, a checkpoint does it instead (it
    /// logs no sums for files being written back).
    pub fn sums_stale(&self, ns: &impl Logged, inos: &[Ino]) -> Result<(), VolumeError> {
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

    /// A checkpoint; when no memnode has room for one, the changes go to the log
    /// instead, if it can take them (see "When no checkpoint fits").
    pub(super) fn checkpoint_or_log(
        &self,
        st: &mut State,
        ns: &impl Logged,
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
        ns: &impl Logged,
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
}
