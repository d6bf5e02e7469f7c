//! What fsd believes of a memnode's replies. A memnode is outside input like any
//! peer: a bug, a damaged memory file or a process that is not the memnode fsd thinks
//! can answer anything, and fsd turns lengths and addresses from replies into
//! ranges, allocation sizes and sums. So every length and address a reply carries is
//! checked here, where it enters, before anything uses it: a chunk (Allocated, the
//! root of VolumeOpened, each chunk of VolumeChunks and SessionChunks), the bytes a
//! Copy says it copied, the memory a Stat reports. What follows from the checks, and
//! what the rest of fsd may take for granted:
//!
//! - a chunk is not empty, does not wrap past the end of the address space, and is no
//!   larger than the capacity the memnode's Welcome gave (a memnode lends one region
//!   of that many bytes; every chunk lies in it);
//! - an allocation holds at least the bytes asked for;
//! - a list of chunks is in address order without repeats or overlaps, none
//!   overlaps the volume's root, and together they span no more than the capacity;
//! - a Copy copied exactly the bytes asked for; a Stat's memory used is within its
//!   capacity.
//!
//! A reply that breaks one is [`RemoteError::Untrusted`], which names the memnode,
//! the reply, the field and its value. At mount the mount is refused with it; after
//! mount the node is treated as failed ([`Node::failed`]): its link is dropped and
//! reconnected, as after a broken connection, and nothing panics.
//!
//! The checks themselves are pure functions (`check_*`), so the volume loader's fuzz
//! target and the tests apply exactly what fsd applies.

use super::error::RemoteError;
use super::link::Link;
use super::node::Node;
use super::pool::BlockPool;
use rmemfs_common::control::{self, VolumeInfo};
use rmemfs_common::fabric::Endpoint;
use rmemfs_common::protocol::{Allocation, CopySpan, NodeStats};

/// A chunk named in reply `reply`: not empty, within `capacity`, not wrapping.
pub fn check_chunk(reply: &str, capacity: u64, c: &Allocation) -> Result<(), String> {
    let at = |why: String| Err(format!("{reply}: chunk at {:#x} {why}", c.addr));
    if c.len == 0 {
        return at("has length 0".into());
    }
    if c.len > capacity {
        return at(format!(
            "has length {} (more than the memnode's capacity, {capacity} bytes)",
            c.len
        ));
    }
    if c.addr.checked_add(c.len).is_none() {
        return at(format!(
            "has length {} and wraps past the end of the address space",
            c.len
        ));
    }
    Ok(())
}

/// The chunk an Alloc of `asked` bytes got.
pub fn check_allocated(capacity: u64, asked: u64, a: &Allocation) -> Result<(), String> {
    check_chunk("Allocated", capacity, a)?;
    if a.len < asked {
        return Err(format!(
            "Allocated: chunk at {:#x} has length {}, less than the {asked} bytes asked for",
            a.addr, a.len
        ));
    }
    Ok(())
}

/// A volume's root chunk as VolumeOpened gave it.
pub fn check_volume_root(capacity: u64, root: &Allocation) -> Result<(), String> {
    check_chunk("VolumeOpened root", capacity, root)
}

/// A listing of chunks (reply `reply`) beside the volume's `root` (none for a
/// session's scratch chunks).
pub fn check_chunk_list(
    reply: &str,
    capacity: u64,
    root: Option<&Allocation>,
    list: &[Allocation],
) -> Result<(), String> {
    // Both checked already (`check_chunk`), so `addr + len` cannot wrap.
    let end = |c: &Allocation| c.addr + c.len;
    let mut lowest = root.map_or(u64::MAX, |r| r.addr);
    let mut highest = root.map_or(0, end);
    let mut prev: Option<&Allocation> = None;
    for c in list {
        check_chunk(reply, capacity, c)?;
        if let Some(p) = prev {
            if c.addr <= p.addr {
                return Err(format!(
                    "{reply}: chunk at {:#x} follows chunk at {:#x} (out of address order, or \
                     repeated)",
                    c.addr, p.addr
                ));
            }
            if c.addr < end(p) {
                return Err(format!(
                    "{reply}: chunk at {:#x} overlaps chunk at {:#x} (length {})",
                    c.addr, p.addr, p.len
                ));
            }
        }
        if let Some(r) = root.filter(|r| c.addr < end(r) && r.addr < end(c)) {
            return Err(format!(
                "{reply}: chunk at {:#x} (length {}) overlaps the volume's root chunk at {:#x}",
                c.addr, c.len, r.addr
            ));
        }
        lowest = lowest.min(c.addr);
        highest = highest.max(end(c));
        prev = Some(c);
    }
    if highest > lowest && highest - lowest > capacity {
        return Err(format!(
            "{reply}: chunks from {lowest:#x} to {highest:#x} span more than the memnode's \
             capacity ({capacity} bytes)"
        ));
    }
    Ok(())
}

/// What a Copy of `asked` bytes says it copied.
pub fn check_copied(asked: u64, copied: u64) -> Result<(), String> {
    if copied != asked {
        return Err(format!("Copied: {copied} bytes, asked to copy {asked}"));
    }
    Ok(())
}

/// A Stat's figures.
pub fn check_stats(s: &NodeStats) -> Result<(), String> {
    if s.used > s.capacity {
        return Err(format!(
            "Stats: {} bytes used of a capacity of {} bytes",
            s.used, s.capacity
        ));
    }
    Ok(())
}

/// The volume VolumeOpen opened on `control` (a connection to memnode `node`
/// whose Welcome said `capacity`), its root checked. A root that cannot be true
/// ends the session: nothing of it is worth keeping for a reconnect.
pub(super) fn volume_opened(
    node: &str,
    control: &dyn Endpoint,
    capacity: u64,
    info: VolumeInfo,
) -> Result<VolumeInfo, RemoteError> {
    match check_volume_root(capacity, &info.root) {
        Ok(()) => Ok(info),
        Err(what) => {
            let _ = control::session_end(control);
            Err(RemoteError::Untrusted {
                node: node.to_string(),
                what,
            })
        }
    }
}

impl Node {
    fn untrusted(&self, what: String) -> RemoteError {
        RemoteError::Untrusted {
            node: self.name.clone(),
            what,
        }
    }

    /// A new chunk of at least `bytes` from the memnode of `link`. A refusal for lack
    /// of space is [`RemoteError::NoSpace`]. Other failures are not recorded on the
    /// node: the caller passes them to [`Node::failed`] once it holds none of the
    /// node's locks (the pool's is taken after the state's elsewhere).
    pub(super) fn alloc(&self, link: &Link, bytes: u64) -> Result<Allocation, RemoteError> {
        let a = control::alloc(link.control(), bytes).map_err(|error| match error {
            e if e.is_no_space() => {
                if e.is_over_quota() {
                    log::warn!("memnode {}: {e}", self.name);
                }
                RemoteError::NoSpace
            }
            error => RemoteError::Control {
                node: self.name.clone(),
                error,
            },
        })?;
        check_allocated(link.capacity, bytes, &a).map_err(|what| self.untrusted(what))?;
        Ok(a)
    }

    /// Puts `a`, a chunk just allocated, into `pool`. A chunk over memory the pool
    /// holds cannot be new: it is refused (not recorded, as [`Node::alloc`]).
    pub(super) fn pool_chunk(
        &self,
        pool: &mut BlockPool,
        a: Allocation,
    ) -> Result<(), RemoteError> {
        match pool.add_chunk(a) {
            None => Ok(()),
            Some(held) => Err(self.untrusted(format!(
                "Allocated: chunk at {:#x} (length {}) overlaps the chunk at {:#x} (length {}) \
                 fsd holds",
                a.addr, a.len, held.addr, held.len
            ))),
        }
    }

    /// The chunks the session of `link` holds: its volume's (root excluded) when
    /// `volume`, else its scratch chunks. Nothing is recorded on the node (a
    /// reconnect asks while it holds the node's state): callers that should, pass
    /// an error through [`Node::failed`].
    pub(super) fn chunks(&self, link: &Link, volume: bool) -> Result<Vec<Allocation>, RemoteError> {
        let (reply, listed) = match volume {
            true => ("VolumeChunks", control::volume_chunks(link.control())),
            false => ("SessionChunks", control::session_chunks(link.control())),
        };
        let chunks = listed.map_err(|error| RemoteError::Control {
            node: self.name.clone(),
            error,
        })?;
        let root = link.volume.as_ref().map(|v| &v.root).filter(|_| volume);
        check_chunk_list(reply, link.capacity, root, &chunks).map_err(|w| self.untrusted(w))?;
        Ok(chunks)
    }

    /// Has the memnode of `link` copy `spans` (`bytes` in all) within its memory.
    pub(super) fn copy(
        &self,
        link: &Link,
        spans: &[CopySpan],
        bytes: u64,
    ) -> Result<(), RemoteError> {
        let copied =
            control::copy(link.control(), spans).map_err(|e| self.control_error(link.epoch, e))?;
        check_copied(bytes, copied).map_err(|what| self.failed(link.epoch, self.untrusted(what)))
    }

    /// The memnode's statistics, from `link`.
    pub(super) fn stat(&self, link: &Link) -> Result<NodeStats, RemoteError> {
        let stats = control::stat(link.control()).map_err(|e| self.control_error(link.epoch, e))?;
        check_stats(&stats).map_err(|what| self.failed(link.epoch, self.untrusted(what)))?;
        Ok(stats)
    }
}

#[cfg(test)]
#[path = "checked_tests.rs"]
mod tests;
