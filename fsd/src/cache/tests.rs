//! Unit tests of the page cache, against an in-memory [`RemoteIo`] that counts what
//! it loads and stores. It and the helpers that read and write through the
//! cache as the filesystem does are here; the tests are in `tests/`, by subject.

mod blocks;
mod cleaner;
mod partial;
mod sector_pages;
mod sums;

use super::sectors::bits;
use super::*;
use std::ops::Range;
use std::sync::atomic::AtomicUsize;

const BS: usize = 16;

/// An in-memory [`RemoteIo`] that counts loads and stores.
#[derive(Default)]
struct MemRemote {
    blocks: Mutex<HashMap<PageKey, Vec<u8>>>,
    /// Ranges loaded (one per run of sectors) and blocks stored.
    loads: AtomicUsize,
    stores: AtomicUsize,
    /// Every range loaded: block, first byte, length.
    loaded: Mutex<Vec<(PageKey, usize, usize)>>,
    /// Every range stored: block, first byte, length.
    stored: Mutex<Vec<(PageKey, usize, usize)>>,
    /// Whether blocks it holds may be stored in part.
    parts: std::sync::atomic::AtomicBool,
    /// Bytes per checksum of the cache under test (none checked when 0).
    sum_unit: AtomicUsize,
    /// Checksums the cache handed over, all checked against their bytes.
    sums_checked: AtomicUsize,
    /// Calls of `load` and of `store` (batches).
    load_calls: AtomicUsize,
    store_calls: AtomicUsize,
    /// Loads of these keys fail.
    failing: Mutex<Vec<PageKey>>,
    /// Errors recorded by `record_write_error`.
    recorded: Mutex<Vec<PageKey>>,
}

impl RemoteIo for MemRemote {
    fn load(&self, reads: &mut [(PageKey, usize, &mut [u8])]) -> Vec<Result<(), FsError>> {
        self.load_calls.fetch_add(1, Ordering::SeqCst);
        let blocks = lock(&self.blocks);
        let failing = lock(&self.failing);
        reads
            .iter_mut()
            .map(|(k, off, buf)| {
                self.loads.fetch_add(1, Ordering::SeqCst);
                lock(&self.loaded).push((*k, *off, buf.len()));
                if failing.contains(k) {
                    buf.fill(0xee); // what a failed read may leave behind
                    return Err(FsError::Io("injected".into()));
                }
                match blocks.get(k) {
                    Some(b) => buf.copy_from_slice(&b[*off..*off + buf.len()]),
                    None => buf.fill(0),
                }
                Ok(())
            })
            .collect()
    }

    fn store(&self, writes: &[Store<'_>]) -> Vec<Result<(), FsError>> {
        self.store_calls.fetch_add(1, Ordering::SeqCst);
        let mut blocks = lock(&self.blocks);
        writes
            .iter()
            .map(|w| {
                let (k, off, buf) = (&w.key, &w.offset, w.bytes);
                // Every checksum the cache hands over is that of the bytes beside it.
                let unit = self.sum_unit.load(Ordering::SeqCst);
                for (p, sum) in w.sums.iter().enumerate() {
                    let Some(sum) = sum else { continue };
                    let page = buf.get(p * unit..(p + 1) * unit).filter(|_| unit > 0);
                    if let Some(page) = page {
                        assert_eq!(
                            crate::remote::sums::page_sum(page),
                            *sum,
                            "the cache's sum of page {p} of a store of {k:?} at {off}"
                        );
                        self.sums_checked.fetch_add(1, Ordering::SeqCst);
                    }
                }
                self.stores.fetch_add(1, Ordering::SeqCst);
                lock(&self.stored).push((*k, *off, buf.len()));
                if buf.len() == BS {
                    blocks.insert(*k, buf.to_vec());
                } else {
                    let block = blocks
                        .get_mut(k)
                        .expect("a part of a block it does not hold");
                    block[*off..*off + buf.len()].copy_from_slice(buf);
                }
                Ok(())
            })
            .collect()
    }

    fn stores_in_part(&self, key: PageKey) -> bool {
        self.parts.load(Ordering::SeqCst) && lock(&self.blocks).contains_key(&key)
    }

    fn record_write_error(&self, key: PageKey, _e: &FsError) {
        lock(&self.recorded).push(key);
    }
}

fn write_block(c: &PageCache, b: &dyn RemoteIo, key: PageKey, byte: u8) {
    c.access(
        b,
        key.0,
        key.1..key.1 + 1,
        |_| Fill::Overwrite,
        |_, buf, dirty| {
            buf.fill(byte);
            *dirty = true;
            Ok(())
        },
    )
    .expect("write");
}

/// The bytes of block `key`'s page as the callback of an access with `fill` sees them.
fn view(c: &PageCache, b: &dyn RemoteIo, key: PageKey, fill: Fill) -> Result<Vec<u8>, FsError> {
    let mut out = Vec::new();
    c.access(
        b,
        key.0,
        key.1..key.1 + 1,
        |_| fill,
        |_, buf, _| {
            out = buf.to_vec();
            Ok(())
        },
    )
    .map(|()| out)
}

fn read_block(c: &PageCache, b: &dyn RemoteIo, key: PageKey) -> Vec<u8> {
    view(c, b, key, Fill::Load).expect("read")
}

// Sub-block validity: blocks of 16 bytes in 4 sectors of 4.

const SECTOR: usize = 4;

fn sectored(blocks: usize) -> PageCache {
    PageCache::with_sector_size((blocks * BS) as u64, BS, SECTOR)
}

/// Writes `data` at byte `from` of block `key`, as the filesystem's write does.
fn write_at(c: &PageCache, b: &dyn RemoteIo, key: PageKey, from: usize, data: &[u8]) {
    let to = from + data.len();
    c.access(
        b,
        key.0,
        key.1..key.1 + 1,
        |_| {
            if from == 0 && to == BS {
                Fill::Overwrite
            } else {
                Fill::Write { from, to }
            }
        },
        |_, buf, dirty| {
            buf[from..to].copy_from_slice(data);
            *dirty = true;
            Ok(())
        },
    )
    .expect("write");
}

fn block_of(bytes: &[u8]) -> Vec<u8> {
    assert_eq!(bytes.len(), BS);
    bytes.to_vec()
}

/// Reads bytes `from..to` of block `key` as the filesystem's random read does
/// ([`PageCache::read`], sector pages).
fn read_fs(c: &PageCache, b: &dyn RemoteIo, key: PageKey, from: usize, to: usize) -> Vec<u8> {
    let mut out = Vec::new();
    c.read(
        b,
        key.0,
        key.1..key.1 + 1,
        |_| Fill::Read { from, to },
        |_, base, bytes| {
            out.extend_from_slice(&bytes[from - base..to - base]);
            Ok(())
        },
    )
    .expect("read");
    out
}
