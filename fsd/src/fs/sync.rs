//! Durability: writing dirty pages back (fsync, flush on close, the periodic
//! flusher), committing the metadata to the volume, and the last flush and
//! checkpoint at unmount.

use super::RmemFs;
use crate::error::{FsError, FsResult};
use crate::inode::{FileKind, Ino};

impl RmemFs {
    /// Makes everything written so far durable on the volume (a no-op in scratch
    /// mode): fsync and fsyncdir, after the data is written back.
    pub fn commit(&self) -> FsResult<()> {
        match &self.volume {
            Some(v) => v.commit(&self.ns).map_err(|e| {
                log::error!("commit failed: {e}");
                match e {
                    // Neither a checkpoint nor the log has room: ENOSPC, as on a full disk.
                    crate::volume::VolumeError::NoRoom(_) => FsError::NoSpace,
                    e => FsError::Io(e.to_string()),
                }
            }),
            None => Ok(()),
        }
    }

    /// Writes back the file's dirty pages and reports any write-back failure since the
    /// last report (fsync, flush on close).
    pub fn fsync(&self, ino: Ino) -> FsResult<()> {
        let inode = self.ns.get(ino)?;
        if inode.meta().attr.kind != FileKind::File {
            return Ok(());
        }
        let _io = inode.io_shared();
        let flushed = self.cache.flush_inode(self, ino);
        if let Some(e) = inode.meta().write_error.take() {
            return Err(e);
        }
        flushed
    }

    /// fsync(2): the file's data written back, then (on a volume) every change so
    /// far made durable.
    pub fn fsync_durable(&self, ino: Ino) -> FsResult<()> {
        self.fsync(ino)?;
        self.commit()
    }

    /// Writes back everything, then commits (periodic flusher, unmount).
    pub fn flush_all(&self) -> FsResult<()> {
        let flushed = self.cache.flush_all(self);
        let committed = self.commit();
        flushed.and(committed)
    }

    /// Flushes everything; on a volume writes a last checkpoint and lets go of the
    /// volume (its memory stays on the memnodes), else gives all remote memory back
    /// (unmount). On a volume only the first call does anything: once the volume is
    /// let go there is nothing to flush to (the FUSE session's end and the daemon's
    /// both call it).
    pub fn shutdown(&self) {
        if self.volume.as_ref().is_some_and(|v| v.is_closed()) {
            return;
        }
        if let Err(e) = self.flush_all() {
            log::error!("flush at unmount failed: {e}");
        }
        match &self.volume {
            Some(v) if !v.close() => {}
            Some(v) => {
                match v.checkpoint(&self.ns) {
                    Ok(()) => log::info!("volume {}: everything is durable", v.name()),
                    Err(e) => log::error!("volume {}: last checkpoint failed: {e}", v.name()),
                }
                self.remote.stop_background();
                self.remote.close_volume();
                self.remote.end_sessions();
            }
            None => {
                self.remote.stop_background();
                self.remote.release_all();
                self.remote.end_sessions();
            }
        }
    }
}
