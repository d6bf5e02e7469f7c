//! Counts of control requests, for the metrics endpoint: each request served, by
//! kind, and each error reply, by its code. Control is the two-sided path only
//! (allocations, volumes, heartbeats), never READ or WRITE, so these are a few
//! relaxed atomic additions per control round trip.

use rmemfs_common::protocol::{ErrorCode, Request};
use std::sync::atomic::{AtomicU64, Ordering};

/// The `request` label values, in [`ControlCounters::requests`]' order; `malformed`
/// counts frames that did not decode.
pub const REQUEST_KINDS: [&str; 14] = [
    "hello",
    "alloc",
    "free",
    "stat",
    "volume_open",
    "volume_chunks",
    "volume_close",
    "volume_list",
    "volume_destroy",
    "malformed",
    "copy",
    "session_end",
    "session_chunks",
    "prove",
];

/// The `reason` label values, in [`ControlCounters::refusals`]' order; `other` is a
/// code this build does not know.
pub const REFUSAL_REASONS: [&str; 10] = [
    "no_space",
    "bad_request",
    "not_found",
    "auth_failed",
    "version_mismatch",
    "not_authenticated",
    "busy",
    "fenced",
    "over_quota",
    "other",
];

#[derive(Debug, Default)]
pub struct ControlCounters {
    requests: [AtomicU64; REQUEST_KINDS.len()],
    refusals: [AtomicU64; REFUSAL_REASONS.len()],
    /// Hellos that resumed a session whose connections had all closed (a client back
    /// after a network blip or a stall, within the grace period).
    pub sessions_resumed: AtomicU64,
    /// Sessions whose client did not come back within the grace period: their
    /// scratch memory was reclaimed.
    pub sessions_expired: AtomicU64,
}

fn kind_index(req: Option<&Request>) -> usize {
    match req {
        Some(Request::Hello { .. }) => 0,
        Some(Request::Alloc { .. }) => 1,
        Some(Request::Free { .. }) => 2,
        Some(Request::Stat) => 3,
        Some(Request::VolumeOpen { .. }) => 4,
        Some(Request::VolumeChunks { .. }) => 5,
        Some(Request::VolumeClose) => 6,
        Some(Request::VolumeList { .. }) => 7,
        Some(Request::VolumeDestroy { .. }) => 8,
        None => 9,
        Some(Request::Copy { .. }) => 10,
        Some(Request::SessionEnd) => 11,
        Some(Request::SessionChunks { .. }) => 12,
        Some(Request::Prove { .. }) => 13,
    }
}

fn reason_index(code: ErrorCode) -> usize {
    match code {
        ErrorCode::NoSpace => 0,
        ErrorCode::BadRequest => 1,
        ErrorCode::NotFound => 2,
        ErrorCode::AuthFailed => 3,
        ErrorCode::VersionMismatch => 4,
        ErrorCode::NotAuthenticated => 5,
        ErrorCode::Busy => 6,
        ErrorCode::Fenced => 7,
        ErrorCode::OverQuota => 8,
        ErrorCode::Unknown(_) => 9,
    }
}

impl ControlCounters {
    /// A frame arrived: the request it decoded to, or `None` for one that did not.
    pub fn request(&self, req: Option<&Request>) {
        self.requests[kind_index(req)].fetch_add(1, Ordering::Relaxed);
    }

    /// An error reply with `code` went out.
    pub fn refused(&self, code: ErrorCode) {
        self.refusals[reason_index(code)].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests by kind, as (label value, count).
    pub fn requests(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        REQUEST_KINDS
            .iter()
            .zip(&self.requests)
            .map(|(k, n)| (*k, n.load(Ordering::Relaxed)))
    }

    /// Error replies by reason, as (label value, count).
    pub fn refusals(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        REFUSAL_REASONS
            .iter()
            .zip(&self.refusals)
            .map(|(k, n)| (*k, n.load(Ordering::Relaxed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_refusals_are_counted_under_their_own_names() {
        let c = ControlCounters::default();
        c.request(Some(&Request::Stat));
        c.request(Some(&Request::Stat));
        c.request(Some(&Request::Alloc { bytes: 1 }));
        c.request(None);
        c.refused(ErrorCode::NoSpace);
        c.refused(ErrorCode::Unknown(99));
        let req: Vec<_> = c.requests().filter(|(_, n)| *n > 0).collect();
        assert_eq!(req, vec![("alloc", 1), ("stat", 2), ("malformed", 1)]);
        let refused: Vec<_> = c.refusals().filter(|(_, n)| *n > 0).collect();
        assert_eq!(refused, vec![("no_space", 1), ("other", 1)]);
    }
}
