//! Checksums of what remote memory holds: a crc32c of each 4 KiB page of a block's
//! copies, computed by fsd from the bytes it writes and checked against every read.
//!
//! Pages, not blocks, because fsd reads and writes blocks in part (the sectors a
//! random read needs, the dirty sectors of a page): a page's sum is known from the
//! bytes written to it alone, and a read of some pages is checked without the rest.
//! A page whose sum is not known (`None`: written in part, or brought in from a
//! volume whose log could not vouch for it after a crash) is read unchecked until
//! fsd writes it whole. A durable volume keeps the sums in its block records
//! ([`Sums::stored`], [`Sums::from_stored`]).

use super::PAGE;

/// crc32c of one page of `data` (a whole page, or the end of `data`). crc-fast folds
/// with carry-less multiplies (VPCLMULQDQ where the CPU has it), about twice as fast
/// as the crc32 instruction alone (the `crc32c` crate), and every byte fsd reads or
/// writes back goes through it (docs/benchmarks-history.md, "Page checksums: what
/// they cost").
pub fn page_sum(page: &[u8]) -> u32 {
    rmemfs_common::crc32c::crc32c(page)
}

const P: usize = PAGE as usize;

/// The sum of a page of zeros.
pub fn zero_page_sum() -> u32 {
    static ZERO: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *ZERO.get_or_init(|| page_sum(&[0u8; P]))
}

/// The whole pages inside bytes `offset..offset + len` of a block: the first one's
/// index, and the bytes of the range before it.
fn whole_pages(offset: usize, len: usize) -> (usize, usize, usize) {
    let first = offset.div_ceil(P);
    let end = (offset + len) / P;
    (first, end.saturating_sub(first), first * P - offset)
}

/// What a write of `data` at byte `offset` of a block leaves known: the sums of the
/// pages it covers whole, and no sum for a page it covers in part (the rest of that
/// page is not in fsd's hands: a write of part of a sector the cache never loaded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    first_page: usize,
    sums: Vec<Option<u32>>,
}

pub fn written(offset: usize, data: &[u8]) -> Written {
    written_with(offset, data, &[])
}

/// As [`written`], taking the sums of whole pages from `known` where it has them:
/// `known[k]` is the sum of the page at byte `offset + k * 4096` (`offset` is then
/// page-aligned; a caller that knows nothing passes an empty slice).
pub fn written_with(offset: usize, data: &[u8], known: &[Option<u32>]) -> Written {
    let first_page = offset / P;
    let last_page = (offset + data.len()).div_ceil(P);
    let (whole, count, skip) = whole_pages(offset, data.len());
    let mut sums = vec![None; last_page - first_page];
    let pages = data[skip.min(data.len())..].chunks_exact(P).take(count);
    for (k, page) in pages.enumerate() {
        let at = whole - first_page + k;
        let given = if offset.is_multiple_of(P) {
            known.get(at).copied().flatten()
        } else {
            None
        };
        sums[at] = Some(given.unwrap_or_else(|| page_sum(page)));
    }
    Written { first_page, sums }
}

/// The first whole page of `data` (bytes `offset..` of a block) whose sum is known
/// and differs from `expected`'s (one entry per whole page of the range, as
/// [`Sums::expected`] gives them): its offset in the block.
pub fn first_mismatch(offset: usize, data: &[u8], expected: &[Option<u32>]) -> Option<usize> {
    mismatches(offset, data, expected).first().copied()
}

/// The whole pages of `data` (bytes `offset..` of a block) that fail their known
/// sum: their offsets in the block.
pub fn mismatches(offset: usize, data: &[u8], expected: &[Option<u32>]) -> Vec<usize> {
    let (first, count, skip) = whole_pages(offset, data.len());
    data[skip.min(data.len())..]
        .chunks_exact(P)
        .take(count)
        .zip(expected)
        .enumerate()
        .filter(|(_, (page, want))| want.is_some_and(|w| page_sum(page) != w))
        .map(|(k, _)| (first + k) * P)
        .collect()
}

/// One sum per page of a block's copies, from its first page.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sums(Vec<Option<u32>>);

impl Sums {
    /// Records what a write left known (see [`written`]).
    pub fn record(&mut self, w: &Written) {
        let end = w.first_page + w.sums.len();
        if self.0.len() < end {
            self.0.resize(end, None);
        }
        self.0[w.first_page..end].copy_from_slice(&w.sums);
    }

    /// Records that bytes `from..to` (page boundaries) hold zeros.
    pub fn record_zeros(&mut self, from: u64, to: u64) {
        let (from, to) = (from as usize / P, to as usize / P);
        if self.0.len() < to {
            self.0.resize(to, None);
        }
        self.0[from..to].fill(Some(zero_page_sum()));
    }

    /// Forgets the sums of the pages from byte `bytes` on (the copies were cut there).
    pub fn truncate(&mut self, bytes: u64) {
        self.0.truncate(bytes as usize / P);
    }

    /// The expected sums of the whole pages inside bytes `offset..offset + len`.
    pub fn expected(&self, offset: usize, len: usize) -> Vec<Option<u32>> {
        let (first, count, _) = whole_pages(offset, len);
        (first..first + count)
            .map(|p| self.0.get(p).copied().flatten())
            .collect()
    }

    /// How many pages have a known sum.
    pub fn known(&self) -> usize {
        self.0.iter().filter(|s| s.is_some()).count()
    }

    /// The sums as a volume's block record keeps them: one per page from the first,
    /// up to the last known one.
    pub fn stored(&self) -> Vec<Option<u32>> {
        let end = self
            .0
            .iter()
            .rposition(Option::is_some)
            .map_or(0, |p| p + 1);
        self.0[..end].to_vec()
    }

    /// The sums a volume's block record kept.
    pub fn from_stored(sums: Vec<Option<u32>>) -> Sums {
        Sums(sums)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded(offset: usize, data: &[u8]) -> Sums {
        let mut sums = Sums::default();
        sums.record(&written(offset, data));
        sums
    }

    #[test]
    fn a_changed_byte_is_found_in_its_page_and_unknown_pages_pass() {
        let mut data = vec![7u8; 3 * P];
        data[P..2 * P].fill(9);
        let mut sums = recorded(0, &data);
        assert_eq!(first_mismatch(0, &data, &sums.expected(0, 3 * P)), None);
        data[2 * P + 100] ^= 1;
        assert_eq!(
            first_mismatch(0, &data, &sums.expected(0, 3 * P)),
            Some(2 * P)
        );
        assert_eq!(
            first_mismatch(P, &data[P..], &sums.expected(P, 2 * P)),
            Some(2 * P),
            "a read of part of the block is checked against its own pages"
        );
        sums.truncate(2 * P as u64);
        assert_eq!(
            first_mismatch(0, &data, &sums.expected(0, 3 * P)),
            None,
            "a page without a sum is not checked"
        );
    }

    #[test]
    fn a_write_of_part_of_a_page_leaves_that_page_unknown() {
        let data = vec![3u8; 2 * P];
        // Bytes 100.. of page 0, all of page 1, 100 bytes of page 2.
        let mut sums = recorded(100, &data);
        assert_eq!(sums.known(), 1);
        let all = sums.expected(0, 3 * P);
        assert_eq!(all[0], None);
        assert!(all[1].is_some());
        assert_eq!(all[2], None);
        // A read that covers page 1 whole checks it, whatever its alignment.
        let page1 = vec![3u8; P + 200];
        assert_eq!(
            first_mismatch(P - 100, &page1, &sums.expected(P - 100, P + 200)),
            None
        );
        let mut bad = page1.clone();
        bad[150] = 0;
        assert_eq!(
            first_mismatch(P - 100, &bad, &sums.expected(P - 100, P + 200)),
            Some(P)
        );
        // Parts of pages are not checked: a read inside one page checks nothing.
        assert!(sums.expected(P + 10, 100).is_empty());
        // Page 1 rewritten whole keeps its sum; page 0 gains one.
        sums.record(&written(0, &vec![4u8; P]));
        assert_eq!(sums.known(), 2);
    }

    #[test]
    fn stored_sums_end_at_the_last_known_page_and_come_back_the_same() {
        let mut sums = recorded(P, &[5u8; P]);
        sums.0.resize(5, None);
        assert_eq!(sums.stored(), vec![None, Some(page_sum(&[5u8; P]))]);
        let back = Sums::from_stored(sums.stored());
        assert_eq!(back.expected(0, 5 * P), sums.expected(0, 5 * P));
        assert!(Sums::default().stored().is_empty());
    }

    #[test]
    fn known_sums_are_taken_and_the_rest_computed() {
        let data: Vec<u8> = (0..3 * P).map(|i| (i % 241) as u8).collect();
        let all = written(P, &data);
        let fake = Some(0x1234_5678);
        let given = written_with(P, &data, &[None, fake]);
        assert_eq!(given.sums[0], all.sums[0]);
        assert_eq!(given.sums[1], fake, "a known sum is taken as it is");
        assert_eq!(given.sums[2], all.sums[2], "past the known ones: computed");
        assert_eq!(
            written_with(P + 1, &data, &[fake, fake]),
            written(P + 1, &data),
            "known sums of an unaligned range are not used"
        );
    }

    #[test]
    fn a_page_sum_is_the_crc32c_of_its_bytes() {
        let page: Vec<u8> = (0..P).map(|i| (i * 7 % 253) as u8).collect();
        assert_eq!(page_sum(&page), crc32c::crc32c(&page));
        assert_eq!(
            page_sum(b"123456789"),
            0xe306_9283,
            "the CRC-32C check value"
        );
    }

    #[test]
    fn zeros_extend_the_block() {
        let mut sums = recorded(P, &[5u8; P]);
        sums.record_zeros(2 * P as u64, 4 * P as u64);
        assert_eq!(sums.known(), 3);
        assert_eq!(
            first_mismatch(2 * P, &[0u8; 2 * P], &sums.expected(2 * P, 2 * P)),
            None
        );
    }
}
