//! Memnodes made of local memory, for the volume loader's tests and its fuzz target
//! (`fuzz/fuzz_targets/volume_load.rs`): a [`VolumeSource`] with no network, whose
//! every answer a test or the fuzzer can make up. What a real memnode's replies go
//! through in fsd goes through here too: the root and the chunk list are checked by
//! `remote/checked.rs`, and a read outside the root and the chunks the memnode
//! holds fails as a remote access error. [`MemorySource::volume`] writes a healthy
//! volume (superblocks, checkpoint, log, spares, data chunks) to start from.
//!
//! Built for tests and with the `test-support` feature only: fsd itself never
//! reads a volume from anywhere but its memnodes.

use super::format::{
    encode_checkpoint, encode_entry, encode_records, Area, Record, StoredAttr, StoredBlock,
    StoredCopy, Superblock, Time, BLOCK_WRITTEN, FORMAT_VERSION, SUPERBLOCK_SLOT,
};
use super::source::VolumeSource;
use crate::remote::checked::{check_chunk_list, check_volume_root};
use crate::remote::{RemoteError, Replica};
use rmemfs_common::fabric::{FabricError, RemoteAddr};
use rmemfs_common::protocol::Allocation;
use std::collections::BTreeMap;

const PAGE: u64 = 4096;

/// One memnode: what it says (its id, capacity, the volume's root and chunks) and
/// the bytes written to its memory, by page (the rest reads as zeros).
#[derive(Debug, Clone, Default)]
pub struct MemoryNode {
    pub name: String,
    /// Its memnode id (0: it holds no copies of this fsd).
    pub id: u64,
    /// What its Welcome said.
    pub capacity: u64,
    /// The volume's root as VolumeOpened gave it (`None`: the node is down).
    pub root: Option<Allocation>,
    /// Its VolumeChunks answer as sent.
    pub chunks: Vec<Allocation>,
    pages: BTreeMap<u64, Box<[u8]>>,
}

impl MemoryNode {
    /// Writes `bytes` at `addr` (up to the end of the address space).
    pub fn write(&mut self, addr: u64, bytes: &[u8]) {
        let mut at = addr;
        for b in bytes {
            let page = self
                .pages
                .entry(at / PAGE)
                .or_insert_with(|| vec![0; PAGE as usize].into_boxed_slice());
            page[(at % PAGE) as usize] = *b;
            match at.checked_add(1) {
                Some(next) => at = next,
                None => return,
            }
        }
    }

    /// The `len` bytes at `addr`.
    pub fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0; len];
        self.fill(addr, &mut buf);
        buf
    }

    fn fill(&self, addr: u64, buf: &mut [u8]) {
        buf.fill(0);
        let Some(last) = addr.checked_add(buf.len() as u64) else {
            return;
        };
        for (&page, bytes) in self.pages.range(addr / PAGE..last.div_ceil(PAGE)) {
            for (k, b) in bytes.iter().enumerate() {
                let at = page * PAGE + k as u64;
                if (addr..last).contains(&at) {
                    buf[(at - addr) as usize] = *b;
                }
            }
        }
    }

    /// The root, if a memnode may say it (as `remote/checked.rs` decides).
    fn checked_root(&self) -> Option<Allocation> {
        self.root
            .filter(|r| check_volume_root(self.capacity, r).is_ok())
    }

    /// True when `[addr, addr + len)` lies in the root or one of the chunks.
    fn holds(&self, addr: u64, len: u64) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        self.root
            .iter()
            .chain(&self.chunks)
            .any(|c| c.addr <= addr && c.addr.checked_add(c.len).is_some_and(|e| end <= e))
    }
}

/// Memnodes of local memory holding one volume.
#[derive(Debug, Clone, Default)]
pub struct MemorySource {
    pub block_size: u64,
    pub nodes: Vec<MemoryNode>,
}

impl VolumeSource for MemorySource {
    fn node_count(&self) -> usize {
        self.nodes.len()
    }
    fn node_name(&self, node: usize) -> &str {
        self.nodes.get(node).map_or("?", |n| n.name.as_str())
    }
    fn block_size(&self) -> u64 {
        self.block_size
    }
    fn node_identity(&self, node: usize) -> Option<(u32, u64)> {
        let n = self.nodes.get(node)?;
        (n.id != 0 && n.checked_root().is_some()).then_some((0, n.id))
    }
    fn volume_root(&self, node: usize) -> Option<Allocation> {
        self.nodes.get(node)?.checked_root()
    }
    fn volume_chunks(&self, node: usize) -> Result<Vec<Allocation>, RemoteError> {
        let n = self.nodes.get(node).ok_or(RemoteError::Lost)?;
        let root = n.checked_root();
        check_chunk_list("VolumeChunks", n.capacity, root.as_ref(), &n.chunks).map_err(|what| {
            RemoteError::Untrusted {
                node: n.name.clone(),
                what,
            }
        })?;
        Ok(n.chunks.clone())
    }
    fn read_at(&self, node: usize, at: RemoteAddr, buf: &mut [u8]) -> Result<(), RemoteError> {
        let n = self.nodes.get(node).ok_or(RemoteError::Lost)?;
        if !n.holds(at.addr, buf.len() as u64) {
            return Err(RemoteError::Fabric {
                node: n.name.clone(),
                error: FabricError::RemoteAccess {
                    addr: at.addr,
                    rkey: at.rkey,
                    len: buf.len(),
                },
            });
        }
        n.fill(at.addr, buf);
        Ok(())
    }
    fn replica_at(&self, node: usize, at: RemoteAddr) -> Option<Replica> {
        Some(Replica {
            node: u16::try_from(node).ok()?,
            epoch: 0,
            remote: at,
        })
    }
}

/// The generation [`MemorySource::volume`] writes (the older slot holds the one
/// before, naming the spares), and its log's first sequence number.
pub const GENERATION: u64 = 2;
pub const FIRST_SEQ: u64 = 10;

fn attr(ino: u64, kind: u8, nlink: u32, size: u64) -> StoredAttr {
    StoredAttr {
        ino,
        kind,
        perm: 0o755,
        nlink,
        uid: 0,
        gid: 0,
        rdev: 0,
        size,
        atime: Time::default(),
        mtime: Time::default(),
        ctime: Time::default(),
    }
}

impl MemorySource {
    /// A healthy volume of `files` files (of up to three blocks each, every block
    /// with a copy on every node) over `nodes` memnodes with 64 KiB blocks: each
    /// node holds the metadata (checkpoint of generation [`GENERATION`] and a log
    /// with one entry) and the spares the older superblock slot names.
    pub fn volume(nodes: usize, files: usize) -> MemorySource {
        let bs = 64 << 10;
        let chunk = |base: u64, at: u64, len: u64, rkey: u32| Allocation {
            addr: base + at,
            len,
            rkey,
        };
        let bases: Vec<u64> = (0..nodes as u64)
            .map(|i| 0x7f00_0000_0000 + (i << 32))
            .collect();
        let data = |i: usize| chunk(bases[i], 8 << 20, 1 << 20, 6);
        let mut records = vec![
            Record::Attr(attr(1, 2, 2, 0)),
            Record::Dir { ino: 1, parent: 1 },
        ];
        let mut block = 0;
        for k in 0..files as u64 {
            let ino = 2 + k;
            let blocks = k % 4;
            records.push(Record::Attr(attr(ino, 1, 1, blocks * bs)));
            records.push(Record::DirAdd {
                dir: 1,
                cookie: 3 + k,
                ino,
                name: format!("f{k}").into_bytes(),
            });
            for index in 0..blocks {
                let copies = (0..nodes)
                    .map(|i| StoredCopy {
                        slot: i as u16,
                        addr: data(i).addr + (block % 16) * bs,
                    })
                    .collect();
                block += 1;
                records.push(Record::Block(StoredBlock {
                    ino,
                    index,
                    flags: BLOCK_WRITTEN,
                    alloc_len: bs as u32,
                    sums: vec![None, Some(0x1234_5678)],
                    copies,
                }));
            }
        }
        records.push(Record::NextIno {
            next: 2 + files as u64,
        });
        let checkpoint = encode_checkpoint(GENERATION, &encode_records(&records));
        let entry = encode_entry(
            FIRST_SEQ,
            &encode_records(&[Record::Attr(attr(1, 2, 2, 1))]),
        );
        let members: Vec<u64> = (0..nodes as u64).map(|i| 0x1111 * (i + 1)).collect();
        let mut out = MemorySource {
            block_size: bs,
            nodes: Vec::new(),
        };
        for (i, &base) in bases.iter().enumerate() {
            let root = chunk(base, 0, PAGE, 1);
            let (ck, log) = (
                chunk(base, 1 << 20, 256 << 10, 2),
                chunk(base, 2 << 20, 64 << 10, 3),
            );
            let (spare_ck, spare_log) = (
                chunk(base, 3 << 20, 256 << 10, 4),
                chunk(base, 4 << 20, 64 << 10, 5),
            );
            let mut node = MemoryNode {
                name: format!("memnode{i}"),
                id: members[i],
                capacity: 64 << 20,
                root: Some(root),
                chunks: vec![ck, log, spare_ck, spare_log, data(i)],
                pages: BTreeMap::new(),
            };
            let superblock = |generation: u64, ck: &Allocation, log: &Allocation, body: &[u8]| {
                Superblock {
                    volume_id: 0xabcd,
                    generation,
                    block_size: bs as u32,
                    first_seq: FIRST_SEQ + generation - GENERATION,
                    checkpoint: Some((
                        Area {
                            addr: ck.addr,
                            len: body.len() as u64,
                        },
                        super::format::crc(body),
                    )),
                    log: Some(Area {
                        addr: log.addr,
                        len: log.len,
                    }),
                    members: members.clone(),
                    version: FORMAT_VERSION,
                }
                .encode()
            };
            let slot = |generation: u64| root.addr + (generation % 2) * SUPERBLOCK_SLOT as u64;
            let older = encode_checkpoint(GENERATION - 1, &encode_records(&records[..2]));
            node.write(
                slot(GENERATION),
                &superblock(GENERATION, &ck, &log, &checkpoint),
            );
            node.write(
                slot(GENERATION - 1),
                &superblock(GENERATION - 1, &spare_ck, &spare_log, &older),
            );
            node.write(ck.addr, &checkpoint);
            node.write(log.addr, &entry);
            node.write(spare_ck.addr, &older);
            out.nodes.push(node);
        }
        out
    }
}
