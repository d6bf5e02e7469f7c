//! How long fsd takes to answer FUSE requests, by kind: one [`LatencyHistogram`] per
//! [`FuseKind`], fed by a guard at the top of each of fsd's `FuseAdapter`'s
//! handlers, so both transports (classic and io_uring) are timed alike. What is timed
//! is the handler (the core's work and its waits on remote memory), not the
//! transport's decoding and reply, which cost the same for every request.
//!
//! Few kinds, so the exposition stays small: a handful of label values rather than
//! one per opcode.

use rmemfs_metrics::{LatencyHistogram, Timer};

/// A group of FUSE requests timed together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FuseKind {
    /// READ.
    Read,
    /// WRITE.
    Write,
    /// Questions that change nothing: LOOKUP, GETATTR, READLINK, STATFS, GETXATTR,
    /// LISTXATTR, LSEEK.
    Lookup,
    /// READDIR.
    Readdir,
    /// Changes to the namespace or to attributes: SETATTR, MKNOD, MKDIR, UNLINK,
    /// RMDIR, SYMLINK, RENAME, LINK, CREATE, SETXATTR, REMOVEXATTR, FALLOCATE.
    Modify,
    /// OPEN and RELEASE.
    Open,
    /// FLUSH, FSYNC and FSYNCDIR (they write back).
    Sync,
}

impl FuseKind {
    /// Every kind, in the order of the exposition.
    pub const ALL: [FuseKind; 7] = [
        FuseKind::Read,
        FuseKind::Write,
        FuseKind::Lookup,
        FuseKind::Readdir,
        FuseKind::Modify,
        FuseKind::Open,
        FuseKind::Sync,
    ];

    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            FuseKind::Read => "read",
            FuseKind::Write => "write",
            FuseKind::Lookup => "lookup",
            FuseKind::Readdir => "readdir",
            FuseKind::Modify => "modify",
            FuseKind::Open => "open",
            FuseKind::Sync => "sync",
        }
    }
}

/// One histogram per kind.
#[derive(Debug, Default)]
pub struct FuseTiming {
    by_kind: [LatencyHistogram; FuseKind::ALL.len()],
}

impl FuseTiming {
    /// Times a request of `kind` until the guard is dropped.
    #[inline]
    pub fn start(&self, kind: FuseKind) -> Timer<'_> {
        self.by_kind[kind as usize].start_timer()
    }

    /// The histogram of `kind`.
    pub fn histogram(&self, kind: FuseKind) -> &LatencyHistogram {
        &self.by_kind[kind as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_its_own_histogram_and_name() {
        let t = FuseTiming::default();
        drop(t.start(FuseKind::Write));
        drop(t.start(FuseKind::Write));
        drop(t.start(FuseKind::Sync));
        let counts: Vec<u64> = FuseKind::ALL
            .iter()
            .map(|&k| t.histogram(k).read().count)
            .collect();
        assert_eq!(counts, vec![0, 2, 0, 0, 0, 0, 1]);
        let names: std::collections::BTreeSet<_> = FuseKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(names.len(), FuseKind::ALL.len(), "names are distinct");
    }
}
