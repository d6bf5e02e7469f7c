//! Room to grow: whether the volume's next checkpoint has room for more metadata,
//! counting what new blocks add to it, and ENOSPC only once a commit could not make
//! room (in remote memory, by giving back what deletes freed, or in the volume).

use super::RmemFs;
use crate::error::{FsError, FsResult};

impl RmemFs {
    /// Whether the metadata may grow now: a volume keeps it within the room its next
    /// checkpoint has (see "Room to grow" in `volume/mod.rs`); scratch mode always.
    pub(crate) fn may_grow(&self) -> bool {
        self.volume.as_ref().is_none_or(|v| v.may_grow())
    }

    /// Before a change that makes the metadata larger (a new inode, name or
    /// extended attribute): ENOSPC when the volume has no room for it even after a
    /// commit, which grows the room while the memnodes have some and gives back what
    /// deletes freed. The caller holds no inode's meta lock (commits take them).
    pub(crate) fn room_to_grow(&self) -> FsResult<()> {
        if self.may_grow() {
            return Ok(());
        }
        self.commit().map_err(|_| FsError::NoSpace)?;
        match self.may_grow() {
            true => Ok(()),
            false => Err(FsError::NoSpace),
        }
    }

    /// Counts `count` new blocks' records as the checkpoint's growth.
    pub(crate) fn grew_blocks(&self, count: usize) {
        if let Some(v) = &self.volume {
            let pages = self.block_size.div_ceil(crate::remote::PAGE);
            let copies = self.remote.replicas().max(1) as u64;
            v.journal()
                .grew(count as u64 * crate::volume::block_record_bound(pages, copies));
        }
    }

    /// Counts a block grown by `bytes` (their pages' sums) as the checkpoint's growth.
    pub(crate) fn grew_pages(&self, bytes: u64) {
        if let Some(v) = &self.volume {
            v.journal().grew(5 * bytes.div_ceil(crate::remote::PAGE));
        }
    }

    /// Runs `alloc`; when it finds remote memory full on a volume whose freed blocks
    /// wait for a commit (deletes, truncates: see `volume/journal.rs`), commits now
    /// and runs it once more, as ext4 commits its journal before it answers ENOSPC.
    /// Without this, a file deleted to make room gives it back only at the next
    /// periodic commit. The caller holds no inode's meta lock (commits take them).
    /// Also when the volume had no room for the blocks' records (see
    /// [`RmemFs::room_to_grow`]).
    pub(super) fn retry_when_full<T>(&self, mut alloc: impl FnMut() -> FsResult<T>) -> FsResult<T> {
        match alloc() {
            Err(FsError::NoSpace)
                if self
                    .volume
                    .as_ref()
                    .is_some_and(|v| v.journal().has_frees() || !v.may_grow()) =>
            {
                self.commit().map_err(|_| FsError::NoSpace)?;
                alloc()
            }
            r => r,
        }
    }
}
