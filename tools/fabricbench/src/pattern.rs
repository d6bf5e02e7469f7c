//! What the benchmark moves and where: the offsets a job visits and the bytes that
//! fill each block, so that every READ can be checked without costing the
//! measurement more than a few loads.
//!
//! Remote memory is laid out in blocks of the job's block size. A block holds a fixed
//! pseudo-random body whose first 8 bytes are replaced by the block's own offset
//! (little-endian). A READ that came back from the wrong place, or not at all, shows a
//! wrong tag; [`check_block`] also compares the body, for the final verification.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// How a job walks through remote memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Block after block, from the start again after the last (as fio's time-based
    /// sequential jobs wrap around their file).
    Sequential,
    /// Blocks picked uniformly at random, aligned to the block size.
    Random,
}

/// The offsets of one job's blocks, in the order the job visits them.
pub struct Offsets {
    access: Access,
    block: u64,
    blocks: u64,
    next: u64,
    rng: StdRng,
}

impl Offsets {
    /// Offsets of `block`-byte blocks within `size` bytes (`size / block` blocks, at
    /// least one). `seed` fixes the random order, so runs are comparable (fio's
    /// randrepeat); jobs of one run use different seeds.
    pub fn new(access: Access, block: u64, size: u64, seed: u64) -> Offsets {
        assert!(block > 0 && size >= block, "a job needs room for one block");
        Offsets {
            access,
            block,
            blocks: size / block,
            next: 0,
            rng: StdRng::seed_from_u64(seed),
        }
    }
}

impl Iterator for Offsets {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        let index = match self.access {
            Access::Sequential => {
                let i = self.next;
                self.next = (self.next + 1) % self.blocks;
                i
            }
            Access::Random => self.rng.random_range(0..self.blocks),
        };
        Some(index * self.block)
    }
}

/// The body every block starts from: pseudo-random bytes, never zero-filled, so a
/// READ of memory nobody wrote fails its check.
pub fn body(block: usize) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(0x5eed_f00d);
    let mut b = vec![0u8; block];
    rng.fill(&mut b[..]);
    b
}

/// Writes the tag of the block at `offset` into `buf` (a block, `body` otherwise).
pub fn tag_block(buf: &mut [u8], offset: u64) {
    buf[..8].copy_from_slice(&offset.to_le_bytes());
}

/// Fills `buf`, which is remote memory from `offset` on and a whole number of
/// `body.len()`-byte blocks long, with those blocks as they are laid out.
pub fn fill_blocks(buf: &mut [u8], offset: u64, body: &[u8]) {
    for (i, chunk) in buf.chunks_mut(body.len()).enumerate() {
        chunk.copy_from_slice(body);
        tag_block(chunk, offset + (i * body.len()) as u64);
    }
}

/// The offset a block's tag names.
pub fn tag_of(buf: &[u8]) -> u64 {
    u64::from_le_bytes(buf[..8].try_into().expect("a block is at least 8 bytes"))
}

/// Checks a whole block read from `offset`: its tag and its body.
pub fn check_block(buf: &[u8], offset: u64, body: &[u8]) -> Result<(), String> {
    if tag_of(buf) != offset {
        return Err(format!(
            "the block at offset {offset} carries the tag of offset {}",
            tag_of(buf)
        ));
    }
    match buf[8..].iter().zip(&body[8..]).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(format!(
            "the block at offset {offset} differs from what was written at byte {}",
            i + 8
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_offsets_walk_every_block_and_wrap() {
        let got: Vec<u64> = Offsets::new(Access::Sequential, 4096, 3 * 4096 + 100, 1)
            .take(5)
            .collect();
        assert_eq!(got, vec![0, 4096, 8192, 0, 4096]);
    }

    #[test]
    fn random_offsets_are_aligned_in_range_and_repeatable() {
        let walk = |seed| -> Vec<u64> {
            Offsets::new(Access::Random, 4096, 1 << 20, seed)
                .take(1000)
                .collect()
        };
        let a = walk(7);
        assert!(a.iter().all(|&o| o % 4096 == 0 && o + 4096 <= 1 << 20));
        assert_eq!(a, walk(7), "the same seed gives the same order");
        assert_ne!(a, walk(8), "jobs with other seeds go elsewhere");
        let distinct: std::collections::HashSet<_> = a.iter().collect();
        assert!(
            distinct.len() > 200,
            "random, not stuck: {}",
            distinct.len()
        );
    }

    #[test]
    fn laid_out_blocks_pass_their_check_and_misplaced_ones_fail() {
        let body = body(4096);
        assert!(body.iter().any(|&b| b != 0));
        let mut buf = vec![0u8; 3 * 4096];
        fill_blocks(&mut buf, 8192, &body);
        for (i, block) in buf.chunks(4096).enumerate() {
            check_block(block, 8192 + 4096 * i as u64, &body).unwrap();
        }
        let wrong_place = check_block(&buf[4096..8192], 8192, &body).unwrap_err();
        assert!(wrong_place.contains("tag of offset 12288"), "{wrong_place}");
        buf[4096 + 100] ^= 1;
        let changed = check_block(&buf[4096..8192], 12288, &body).unwrap_err();
        assert!(changed.contains("at byte 100"), "{changed}");
        let zeros = vec![0u8; 4096];
        assert!(
            check_block(&zeros, 0, &body).is_err(),
            "unwritten memory fails"
        );
    }
}
