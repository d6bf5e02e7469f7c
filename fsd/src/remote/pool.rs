//! Sub-allocation of fixed-size blocks from large remote chunks, for one memnode.
//!
//! fsd asks a memnode for memory a chunk at a time (one control round trip buys many
//! blocks) and hands out blocks from those chunks locally, so writing a block never
//! needs the control path. A chunk that becomes entirely free is given back to the
//! memnode, except one spare per node so a file that grows and shrinks does not make
//! the pool thrash.
//!
//! This module is pure bookkeeping: it never talks to the network. The caller does
//! the Alloc/Free round trips and feeds the results in.

use rmemfs_common::fabric::RemoteAddr;
use rmemfs_common::protocol::Allocation;
use std::collections::{BTreeMap, BTreeSet};

/// Blocks from one chunk; `free` holds the indices of blocks not in use, and
/// `is_free` says the same per block (so a second free of a block is caught).
#[derive(Debug)]
struct Chunk {
    alloc: Allocation,
    free: Vec<u32>,
    is_free: Vec<bool>,
    blocks: u32,
}

/// The chunks fsd holds on one memnode and which of their blocks are free.
#[derive(Debug)]
pub struct BlockPool {
    block_size: u64,
    /// Keyed by the chunk's start address.
    chunks: BTreeMap<u64, Chunk>,
    /// Chunks that have at least one free block.
    with_space: BTreeSet<u64>,
    free_blocks: u64,
}

impl BlockPool {
    pub fn new(block_size: u64) -> BlockPool {
        BlockPool {
            block_size,
            chunks: BTreeMap::new(),
            with_space: BTreeSet::new(),
            free_blocks: 0,
        }
    }

    /// Takes a free block, if any chunk has one. Lowest chunk first keeps usage
    /// compact, so high chunks empty out and can be returned.
    pub fn take(&mut self) -> Option<RemoteAddr> {
        let &start = self.with_space.iter().next()?;
        let chunk = self.chunks.get_mut(&start)?;
        let idx = chunk.free.pop()?;
        chunk.is_free[idx as usize] = false;
        if chunk.free.is_empty() {
            self.with_space.remove(&start);
        }
        self.free_blocks -= 1;
        Some(RemoteAddr {
            addr: chunk.alloc.addr + idx as u64 * self.block_size,
            rkey: chunk.alloc.rkey,
        })
    }

    /// Adds a freshly allocated chunk; all its whole blocks become free.
    pub fn add_chunk(&mut self, alloc: Allocation) {
        self.add_chunk_in_use(alloc, &Default::default());
    }

    /// Adds a chunk of which the blocks at addresses `used` are already taken (a
    /// volume's chunk, adopted at mount).
    pub fn add_chunk_in_use(&mut self, alloc: Allocation, used: &std::collections::BTreeSet<u64>) {
        let blocks = (alloc.len / self.block_size) as u32;
        if blocks == 0 {
            return;
        }
        // Reverse so that `pop` hands out blocks in ascending address order.
        let free: Vec<u32> = (0..blocks)
            .rev()
            .filter(|&i| !used.contains(&(alloc.addr + i as u64 * self.block_size)))
            .collect();
        let mut is_free = vec![false; blocks as usize];
        for &i in &free {
            is_free[i as usize] = true;
        }
        self.free_blocks += free.len() as u64;
        if !free.is_empty() {
            self.with_space.insert(alloc.addr);
        }
        self.chunks.insert(
            alloc.addr,
            Chunk {
                alloc,
                free,
                is_free,
                blocks,
            },
        );
    }

    /// Returns a block to its chunk. Returns chunks that should now be given back to
    /// the memnode (entirely free, beyond the one spare kept). A block this pool does
    /// not know is ignored (and reported by the `false`).
    pub fn put(&mut self, block: RemoteAddr) -> (bool, Vec<Allocation>) {
        let Some((&start, chunk)) = self.chunks.range_mut(..=block.addr).next_back() else {
            return (false, Vec::new());
        };
        let offset = block.addr - start;
        if chunk.alloc.rkey != block.rkey
            || offset >= chunk.blocks as u64 * self.block_size
            || !offset.is_multiple_of(self.block_size)
        {
            return (false, Vec::new());
        }
        let idx = (offset / self.block_size) as u32;
        if chunk.is_free[idx as usize] {
            // Handing it out twice would put two files' data in one block.
            log::error!(
                "block {:#x} freed twice; the second free is ignored",
                block.addr
            );
            return (false, Vec::new());
        }
        chunk.free.push(idx);
        chunk.is_free[idx as usize] = true;
        self.free_blocks += 1;
        self.with_space.insert(start);
        (true, self.release_empty_chunks())
    }

    /// Removes every entirely free chunk but one and returns them for freeing.
    fn release_empty_chunks(&mut self) -> Vec<Allocation> {
        let empty: Vec<u64> = self
            .chunks
            .iter()
            .filter(|(_, c)| c.free.len() as u32 == c.blocks)
            .map(|(&a, _)| a)
            .collect();
        // Keep the lowest empty chunk as a spare.
        empty
            .into_iter()
            .skip(1)
            .filter_map(|start| {
                let c = self.chunks.remove(&start)?;
                self.with_space.remove(&start);
                self.free_blocks -= c.blocks as u64;
                Some(c.alloc)
            })
            .collect()
    }

    /// Removes every chunk (all their blocks must be free or abandoned); for shutdown.
    pub fn drain(&mut self) -> Vec<Allocation> {
        self.with_space.clear();
        self.free_blocks = 0;
        std::mem::take(&mut self.chunks)
            .into_values()
            .map(|c| c.alloc)
            .collect()
    }

    /// Free blocks held locally (already allocated on the memnode).
    pub fn free_blocks(&self) -> u64 {
        self.free_blocks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BS: u64 = 4096;

    fn chunk(addr: u64, blocks: u64, rkey: u32) -> Allocation {
        Allocation {
            addr,
            len: blocks * BS,
            rkey,
        }
    }

    #[test]
    fn hands_out_every_block_of_a_chunk_once_then_runs_dry() {
        let mut p = BlockPool::new(BS);
        p.add_chunk(chunk(1 << 20, 4, 7));
        let got: Vec<_> = (0..4).map(|_| p.take().expect("a block")).collect();
        let addrs: Vec<u64> = got.iter().map(|b| b.addr).collect();
        assert_eq!(
            addrs,
            vec![
                1 << 20,
                (1 << 20) + BS,
                (1 << 20) + 2 * BS,
                (1 << 20) + 3 * BS
            ]
        );
        assert!(got.iter().all(|b| b.rkey == 7));
        assert_eq!(p.take(), None);
    }

    #[test]
    fn an_emptied_chunk_is_returned_unless_it_is_the_spare() {
        let mut p = BlockPool::new(BS);
        p.add_chunk(chunk(0, 2, 1));
        p.add_chunk(chunk(1 << 20, 2, 2));
        let blocks: Vec<_> = (0..4).map(|_| p.take().unwrap()).collect();
        // Freeing the first chunk's blocks: it becomes the spare, nothing returned.
        assert_eq!(p.put(blocks[0]), (true, vec![]));
        assert_eq!(p.put(blocks[1]), (true, vec![]));
        // Freeing the second chunk's blocks: now two are empty, the higher one goes.
        assert_eq!(p.put(blocks[2]), (true, vec![]));
        assert_eq!(p.put(blocks[3]), (true, vec![chunk(1 << 20, 2, 2)]));
        assert_eq!(p.free_blocks(), 2);
    }

    #[test]
    fn unknown_blocks_are_refused() {
        let mut p = BlockPool::new(BS);
        p.add_chunk(chunk(8192, 2, 3));
        let wrong_key = RemoteAddr {
            addr: 8192,
            rkey: 4,
        };
        let misaligned = RemoteAddr {
            addr: 8193,
            rkey: 3,
        };
        let past_end = RemoteAddr {
            addr: 8192 + 2 * BS,
            rkey: 3,
        };
        let before = RemoteAddr { addr: 0, rkey: 3 };
        for b in [wrong_key, misaligned, past_end, before] {
            assert!(!p.put(b).0, "{b:?} should be refused");
        }
    }

    #[test]
    fn a_second_free_of_a_block_is_refused_so_it_is_never_handed_out_twice() {
        let mut p = BlockPool::new(BS);
        p.add_chunk(chunk(0, 4, 1));
        let b = p.take().unwrap();
        assert!(p.put(b).0);
        assert!(!p.put(b).0, "double free accepted");
        let handed: Vec<u64> = std::iter::from_fn(|| p.take()).map(|b| b.addr).collect();
        let mut unique = handed.clone();
        unique.dedup();
        assert_eq!(handed.len(), 4);
        assert_eq!(unique, handed);
    }

    #[test]
    fn an_adopted_chunk_hands_out_only_the_blocks_not_in_use() {
        let mut p = BlockPool::new(BS);
        let used: std::collections::BTreeSet<u64> = [BS, 3 * BS].into_iter().collect();
        p.add_chunk_in_use(chunk(0, 4, 1), &used);
        assert_eq!(p.free_blocks(), 2);
        let mut got: Vec<u64> = std::iter::from_fn(|| p.take()).map(|b| b.addr).collect();
        got.sort_unstable();
        assert_eq!(got, vec![0, 2 * BS]);
        assert!(
            p.put(RemoteAddr { addr: BS, rkey: 1 }).0,
            "a used block frees once"
        );
        assert!(!p.put(RemoteAddr { addr: BS, rkey: 1 }).0);
    }

    #[test]
    fn a_partial_trailing_block_of_a_chunk_is_not_used() {
        let mut p = BlockPool::new(BS);
        p.add_chunk(Allocation {
            addr: 0,
            len: BS + 100,
            rkey: 1,
        });
        assert!(p.take().is_some());
        assert!(p.take().is_none());
    }
}
