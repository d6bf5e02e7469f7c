//! Sub-allocation of block copies from large remote chunks, for one memnode.
//!
//! fsd asks a memnode for memory a chunk at a time (one control round trip buys many
//! blocks) and hands out pieces of those chunks locally, so writing a block never
//! needs the control path. A piece is any whole number of 4 KiB pages ([`PAGE`]) up to
//! a block: a file's last, partial block (or a whole small file) takes only the pages
//! it uses, as on tmpfs, while whole blocks of large files still take one piece each.
//! A chunk that becomes entirely free is given back to the memnode, except one spare
//! per node so a file that grows and shrinks does not make the pool thrash.
//!
//! Free space is a set of extents per chunk, never spanning two chunks (each chunk
//! has its own rkey). A request takes the smallest extent that fits (best fit, lowest
//! address among equals), which keeps small pieces in the gaps small pieces left and
//! large runs whole for whole blocks. Freeing coalesces with the neighbours in the
//! same chunk.
//!
//! This module is pure bookkeeping: it never talks to the network. The caller does
//! the Alloc/Free round trips and feeds the results in.

use rmemfs_common::fabric::RemoteAddr;
use rmemfs_common::protocol::Allocation;
use std::collections::{BTreeMap, BTreeSet};

/// The unit of remote memory a block copy takes: what tmpfs charges per page.
pub const PAGE: u64 = 4096;

/// `bytes` rounded up to whole pages (at least one).
pub fn pages_for(bytes: u64) -> u64 {
    bytes.max(1).div_ceil(PAGE) * PAGE
}

#[derive(Debug)]
struct Chunk {
    alloc: Allocation,
    /// The whole pages of the chunk (a trailing partial page is never used).
    usable: u64,
    free: u64,
}

/// The chunks fsd holds on one memnode and which of their pages are free.
#[derive(Debug, Default)]
pub struct BlockPool {
    /// Keyed by the chunk's start address.
    chunks: BTreeMap<u64, Chunk>,
    /// Free extents: start -> length, each inside one chunk.
    free: BTreeMap<u64, u64>,
    /// The same extents by (length, start), for best fit.
    by_size: BTreeSet<(u64, u64)>,
    free_bytes: u64,
}

impl BlockPool {
    pub fn new() -> BlockPool {
        BlockPool::default()
    }

    /// Takes `bytes` (rounded up to whole pages) from the smallest free extent that
    /// holds them, if any does.
    pub fn take(&mut self, bytes: u64) -> Option<RemoteAddr> {
        let len = pages_for(bytes);
        let &(ext_len, start) = self.by_size.range((len, 0)..).next()?;
        self.remove_extent(start, ext_len);
        if ext_len > len {
            self.insert_extent(start + len, ext_len - len);
        }
        self.free_bytes -= len;
        let (chunk_start, _, rkey) = self.chunk_of(start)?;
        if let Some(c) = self.chunks.get_mut(&chunk_start) {
            c.free -= len;
        }
        Some(RemoteAddr { addr: start, rkey })
    }

    /// Grows the piece of `bytes` at `piece` to `to` bytes where it lies, if the pages
    /// right after it are free (in the same chunk). False leaves everything as it was.
    pub fn extend(&mut self, piece: RemoteAddr, bytes: u64, to: u64) -> bool {
        let (old, new) = (pages_for(bytes), pages_for(to));
        let Some((start, usable, rkey)) = self.chunk_of(piece.addr) else {
            return false;
        };
        let end = piece.addr + old;
        let Some(&len) = self.free.get(&end) else {
            return false;
        };
        if rkey != piece.rkey || new <= old || end >= start + usable || len < new - old {
            return false;
        }
        self.remove_extent(end, len);
        if len > new - old {
            self.insert_extent(piece.addr + new, len - (new - old));
        }
        self.free_bytes -= new - old;
        if let Some(c) = self.chunks.get_mut(&start) {
            c.free -= new - old;
        }
        true
    }

    /// True when the chunk starting at `addr` is one of this pool's.
    pub fn has_chunk(&self, addr: u64) -> bool {
        self.chunks.contains_key(&addr)
    }

    /// Adds a freshly allocated chunk; all of it becomes free. A chunk that overlaps
    /// one the pool holds is not added: that one is returned (two chunks over the
    /// same memory would hand it out twice).
    pub fn add_chunk(&mut self, alloc: Allocation) -> Option<Allocation> {
        self.add_chunk_in_use(alloc, &BTreeMap::new())
    }

    /// Adds a chunk of which the pieces in `used` (start -> length) are already taken
    /// (a volume's chunk, adopted at mount). Pieces outside the chunk are ignored. As
    /// [`BlockPool::add_chunk`], a chunk overlapping a held one is not added.
    pub fn add_chunk_in_use(
        &mut self,
        alloc: Allocation,
        used: &BTreeMap<u64, u64>,
    ) -> Option<Allocation> {
        let usable = alloc.len / PAGE * PAGE;
        // A chunk that wraps is refused where it enters (`checked.rs`); here it is
        // only never added.
        let end = alloc.addr.checked_add(usable)?;
        if let Some(held) = self.overlapping(alloc.addr, end) {
            return Some(held);
        }
        if usable == 0 {
            return None;
        }
        let mut at = alloc.addr;
        let mut free = 0;
        for (&start, &len) in used.range(alloc.addr..end) {
            if start > at {
                self.insert_extent(at, start - at);
                free += start - at;
            }
            at = at.max(start.saturating_add(pages_for(len)).min(end));
        }
        if end > at {
            self.insert_extent(at, end - at);
            free += end - at;
        }
        self.free_bytes += free;
        self.chunks.insert(
            alloc.addr,
            Chunk {
                alloc,
                usable,
                free,
            },
        );
        None
    }

    /// A held chunk with usable pages in `[start, end)`.
    fn overlapping(&self, start: u64, end: u64) -> Option<Allocation> {
        let before = self.chunks.range(..end).next_back()?.1;
        (before.alloc.addr.saturating_add(before.usable.max(1)) > start).then_some(before.alloc)
    }

    /// Returns the piece of `bytes` at `piece` to its chunk. Returns whether the pool
    /// knew it as taken, and the chunks that should now be given back to the memnode
    /// (entirely free, beyond the one spare kept). A piece this pool does not know,
    /// or one that is (partly) free already, is refused: handing it out twice would
    /// put two files' data in one place.
    pub fn put(&mut self, piece: RemoteAddr, bytes: u64) -> (bool, Vec<Allocation>) {
        let len = pages_for(bytes);
        let Some((start, usable, rkey)) = self.chunk_of(piece.addr) else {
            return (false, Vec::new());
        };
        let chunk_end = start + usable;
        if rkey != piece.rkey
            || !(piece.addr - start).is_multiple_of(PAGE)
            || piece.addr + len > chunk_end
        {
            return (false, Vec::new());
        }
        let end = piece.addr + len;
        let overlaps = self
            .free
            .range(..end)
            .next_back()
            .is_some_and(|(&s, &l)| s + l > piece.addr);
        if overlaps {
            log::error!(
                "remote memory {:#x}+{len} freed twice; the second free is ignored",
                piece.addr
            );
            return (false, Vec::new());
        }
        if let Some(c) = self.chunks.get_mut(&start) {
            c.free += len;
        }
        let (mut from, mut to) = (piece.addr, end);
        if let Some((&s, &l)) = self.free.range(start..piece.addr).next_back() {
            if s + l == piece.addr {
                self.remove_extent(s, l);
                from = s;
            }
        }
        if let Some(&l) = self.free.get(&end) {
            if end < chunk_end {
                self.remove_extent(end, l);
                to = end + l;
            }
        }
        self.insert_extent(from, to - from);
        self.free_bytes += len;
        (true, self.release_empty_chunks())
    }

    /// Removes every entirely free chunk but one and returns them for freeing.
    fn release_empty_chunks(&mut self) -> Vec<Allocation> {
        // Keep the lowest empty chunk as a spare.
        self.remove_empty_chunks(1)
    }

    /// Removes every entirely free chunk, the spare too, and returns them for
    /// freeing (a volume let go of: an empty chunk would stay on the memnode as the
    /// volume's, referenced by nothing).
    pub fn take_empty_chunks(&mut self) -> Vec<Allocation> {
        self.remove_empty_chunks(0)
    }

    /// Removes the entirely free chunks past the lowest `keep`.
    fn remove_empty_chunks(&mut self, keep: usize) -> Vec<Allocation> {
        let empty: Vec<u64> = self
            .chunks
            .iter()
            .filter(|(_, c)| c.free == c.usable)
            .map(|(&a, _)| a)
            .collect();
        empty
            .into_iter()
            .skip(keep)
            .filter_map(|start| {
                let c = self.chunks.remove(&start)?;
                self.remove_extent(start, c.usable);
                self.free_bytes -= c.usable;
                Some(c.alloc)
            })
            .collect()
    }

    /// Removes every chunk (all their pieces must be free or abandoned); for shutdown.
    pub fn drain(&mut self) -> Vec<Allocation> {
        self.free.clear();
        self.by_size.clear();
        self.free_bytes = 0;
        std::mem::take(&mut self.chunks)
            .into_values()
            .map(|c| c.alloc)
            .collect()
    }

    /// Free bytes held locally (already allocated on the memnode).
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// The chunk holding `addr`: its start, usable bytes and rkey.
    fn chunk_of(&self, addr: u64) -> Option<(u64, u64, u32)> {
        let (&start, c) = self.chunks.range(..=addr).next_back()?;
        (addr < start + c.usable).then_some((start, c.usable, c.alloc.rkey))
    }

    fn insert_extent(&mut self, start: u64, len: u64) {
        self.free.insert(start, len);
        self.by_size.insert((len, start));
    }

    fn remove_extent(&mut self, start: u64, len: u64) {
        self.free.remove(&start);
        self.by_size.remove(&(len, start));
    }
}

#[cfg(test)]
#[path = "pool_tests.rs"]
mod tests;
