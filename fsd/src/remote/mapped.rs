//! Reads straight out of a memnode's mapped region (the mapped fabric), for readers
//! that bypass the page cache: over a mapping remote memory is as near as the cache,
//! so a random read that misses is one copy into the reader's buffer rather than a
//! load into a cache page and a copy out of it.
//!
//! Such a read is optimistic. It holds no page lock, so a write-back of the same
//! block could land while it copies; the page sums tell: a read is good only when
//! every page of it has a known sum and matches it. Anything else (no sum, a
//! mismatch, a copy that is not mapped or not in reach, a failed copy) makes it say
//! no, with nothing counted as an error, nothing waited for and nothing repaired: the
//! caller then reads through the cache, whose read does all of that.

use super::batch::CopyOp;
use super::io::held_part;
use super::placement::{BlockLoc, Replica};
use super::pool::PAGE;
use super::{sums, RemoteStore};
use rmemfs_common::fabric::RdmaOp;

impl RemoteStore {
    /// Whether any memnode's connection maps its region now: a cheap test first, so
    /// that fsd over tcp or verbs spends nothing more on a read.
    pub fn maps_any(&self) -> bool {
        self.nodes
            .iter()
            .any(|n| n.link().is_ok_and(|l| l.endpoint().is_mapped()))
    }

    /// The first copy of `loc` in reach on a memnode whose connection maps its region:
    /// where [`RemoteStore::read_mapped`] would read.
    pub fn mapped_copy(&self, loc: &BlockLoc) -> Option<Replica> {
        let r = loc.replicas().iter().find(|r| self.holds(r))?;
        let link = self.nodes.get(r.node as usize)?.link().ok()?;
        link.endpoint().is_mapped().then_some(*r)
    }

    /// Reads bytes `offset..offset + buf.len()` of copy `replica` of `loc` (from
    /// [`RemoteStore::mapped_copy`]) into `buf` and says whether they are good: the
    /// range is whole pages inside the copy's allocation, `expected` (the block's
    /// sums for the range, [`super::sums::Sums::expected`]) knows every one, and each
    /// matches. A read counts in the traffic counters as any other.
    pub fn read_mapped(
        &self,
        loc: &BlockLoc,
        replica: Replica,
        offset: usize,
        buf: &mut [u8],
        expected: &[Option<u32>],
    ) -> bool {
        let page = PAGE as usize;
        let len = buf.len();
        let whole_pages = len > 0 && offset.is_multiple_of(page) && len.is_multiple_of(page);
        if !whole_pages
            || expected.len() != len / page
            || expected.iter().any(Option::is_none)
            || held_part(loc, offset, len) != len
        {
            return false;
        }
        let Some(node) = self.nodes.get(replica.node as usize) else {
            return false;
        };
        let mut batch = [(
            0,
            CopyOp {
                replica,
                op: RdmaOp::Read {
                    local: &mut buf[..],
                    remote: replica.remote.offset(offset),
                },
            },
        )];
        let copied = self.execute_on(node, &mut batch, true);
        copied.iter().all(Result::is_ok) && sums::first_mismatch(offset, buf, expected).is_none()
    }
}
