//! Where a block's copies live.
//!
//! A block has up to [`MAX_REPLICAS`] copies, each on a different memnode. A copy is
//! named by its memnode, the memnode's connection epoch it was allocated in, and the
//! remote address. The epoch matters because a memnode gives a client's memory back
//! when the client's connections close: once fsd has lost a memnode and reconnected
//! to it (a new epoch), copies of an older epoch no longer exist, even though the
//! addresses may be valid again for new allocations.

use arrayvec::ArrayVec;
use rmemfs_common::fabric::RemoteAddr;

/// The most copies of one block fsd keeps (`--replicas` at most this).
pub const MAX_REPLICAS: usize = 4;

/// One copy of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replica {
    /// Index of the memnode (its position on fsd's command line).
    pub node: u16,
    /// The memnode's connection epoch the copy was allocated in.
    pub epoch: u32,
    pub remote: RemoteAddr,
}

/// Every copy of one block, the first being the one reads try first, and how much of
/// the block each copy holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockLoc {
    replicas: ArrayVec<Replica, MAX_REPLICAS>,
    /// Bytes of remote memory each copy has: the block's first `bytes` (whole pages,
    /// at most a block). The block's bytes past them are zeros nobody wrote, kept
    /// nowhere: a file's small last block costs only the pages it uses.
    bytes: u32,
}

impl BlockLoc {
    /// No copies yet, of `bytes` each.
    pub fn new(bytes: u64) -> BlockLoc {
        BlockLoc {
            replicas: ArrayVec::new(),
            bytes: u32::try_from(bytes).unwrap_or(u32::MAX),
        }
    }

    pub fn from_replicas(bytes: u64, replicas: impl IntoIterator<Item = Replica>) -> BlockLoc {
        let mut loc = BlockLoc::new(bytes);
        for r in replicas {
            loc.push(r);
        }
        loc
    }

    /// Bytes of remote memory each copy has (see the field).
    pub fn bytes(&self) -> u64 {
        self.bytes as u64
    }

    pub fn replicas(&self) -> &[Replica] {
        &self.replicas
    }

    /// Adds a copy; a copy on a memnode that already has one replaces it (a block
    /// never has two copies on one memnode).
    pub fn push(&mut self, r: Replica) {
        self.replicas.retain(|x| x.node != r.node);
        if !self.replicas.is_full() {
            self.replicas.push(r);
        }
    }

    /// Keeps only the copies `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(&Replica) -> bool) {
        self.replicas.retain(|r| keep(r));
    }

    pub fn has_node(&self, node: u16) -> bool {
        self.replicas.iter().any(|r| r.node == node)
    }

    pub fn len(&self) -> usize {
        self.replicas.len()
    }

    pub fn is_empty(&self) -> bool {
        self.replicas.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rep(node: u16, addr: u64) -> Replica {
        Replica {
            node,
            epoch: 0,
            remote: RemoteAddr { addr, rkey: 1 },
        }
    }

    #[test]
    fn one_copy_per_memnode_and_at_most_max_replicas() {
        let mut loc = BlockLoc::from_replicas(4096, [rep(0, 10), rep(1, 20)]);
        loc.push(rep(0, 30));
        assert_eq!(loc.replicas(), &[rep(1, 20), rep(0, 30)]);
        for n in 2..10 {
            loc.push(rep(n, 0));
        }
        assert_eq!(loc.len(), MAX_REPLICAS);
        assert!(loc.has_node(3) && !loc.has_node(5));
        loc.retain(|r| r.node != 1);
        assert_eq!(loc.len(), MAX_REPLICAS - 1);
        assert!(!loc.has_node(1));
    }
}
