//! The durable volume loader (what fsd reads at mount) on memnodes that lie, without
//! a network: memnodes of local memory (`fsd::volume::memory`) hold a healthy volume
//! (`MemorySource::volume`), and the input then changes what they say and hold:
//! superblocks forged with valid checksums (generations, sequence numbers, areas,
//! member tables, block sizes), checkpoints and log entries of made-up records with
//! valid checksums, raw bytes anywhere, chunk lists that wrap, overlap, repeat or go
//! out of order, roots, capacities and memnode ids. The loader must answer with a
//! volume or an error, never a panic, an abort or an allocation it cannot make; a
//! volume it loads must become a namespace and be walked as a checkpoint would.
//!
//! The input is read as a tape of choices (an empty one is the healthy volume of one
//! memnode), so every mutation starts from metadata that passes its checksums.
//! Capacities stay at most 64 MiB: within them every length is a real allocation, and
//! lengths past what memory holds are the loader's unit tests (`load_tests.rs`).
#![no_main]

use fsd::namespace::Namespace;
use fsd::volume::format::{
    decode_checkpoint, encode_checkpoint, encode_entry, encode_records, Area, Record, StoredAttr,
    StoredBlock, StoredCopy, Superblock, Time, SUPERBLOCK_SLOT,
};
use fsd::volume::journal::Journal;
use fsd::volume::memory::{MemoryNode, MemorySource, FIRST_SEQ};
use fsd::volume::{load, Logged};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use rmemfs_common::protocol::Allocation;
use std::sync::Arc;

/// The largest capacity a memnode says it has here (see the module docs).
const MAX_CAPACITY: u64 = 64 << 20;

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    if let Ok(src) = memnodes(&mut u) {
        run(&src);
    }
});

/// Loads the volume and, when it loads, does what a mount does with it short of
/// writing: the namespace from it and a checkpoint's walk of that.
fn run(src: &MemorySource) {
    let Ok(Some(loaded)) = load(src, "fuzz") else {
        return;
    };
    let _ = loaded.used();
    let _ = loaded.leaked();
    let ns: Namespace = loaded.into_namespace(src, Arc::new(Journal::default()));
    let records =
        ns.checkpoint_preview(|| {}, &|ino, index, _, _| Record::BlockGone { ino, index });
    let _ = encode_records(&records);
}

/// The healthy volume, then the input's changes to it.
fn memnodes(u: &mut Unstructured) -> Result<MemorySource> {
    let nodes = u.int_in_range(1..=3)?;
    let files = u.int_in_range(0..=6)?;
    let mut src = MemorySource::volume(nodes, files);
    while !u.is_empty() {
        let k = u.choose_index(nodes)?;
        let node = &mut src.nodes[k];
        match u.int_in_range(0..=8u8)? {
            0 => forge_superblock(u, node)?,
            1 => rewrite_checkpoint(u, node)?,
            2 => append_log(u, node)?,
            3 => change_chunks(u, node)?,
            4 => node.capacity = number(u, node.capacity)? % (MAX_CAPACITY + 1),
            5 => {
                let mut root = node.root.unwrap_or(Allocation {
                    addr: 0,
                    len: 0,
                    rkey: 1,
                });
                root.addr = number(u, root.addr)?;
                root.len = number(u, root.len)?;
                node.root = u.arbitrary::<bool>()?.then_some(root);
            }
            6 => {
                let at = place(u, node)?;
                let len = u.int_in_range(1..=256)?;
                let bytes = u.bytes(len)?.to_vec();
                node.write(at, &bytes);
            }
            7 => node.id = number(u, node.id)?,
            _ => {
                // Another memnode's superblocks in this one's root.
                let from = u.choose_index(nodes)?;
                let (Some(a), Some(b)) = (src.nodes[from].root, src.nodes[k].root) else {
                    continue;
                };
                let bytes = src.nodes[from].read(a.addr, 2 * SUPERBLOCK_SLOT);
                src.nodes[k].write(b.addr, &bytes);
            }
        }
    }
    Ok(src)
}

/// A value near `old`, or one of the values that break arithmetic.
fn number(u: &mut Unstructured, old: u64) -> Result<u64> {
    Ok(match u.int_in_range(0..=7u8)? {
        0 => old.wrapping_add(u.int_in_range(1..=4096)?),
        1 => old.wrapping_sub(u.int_in_range(1..=4096)?),
        2 => u64::MAX - u.int_in_range(0..=8192)?,
        3 => u.int_in_range(0..=8192)?,
        4 => old.wrapping_mul(2),
        5 => 1 << u.int_in_range(0..=63)?,
        6 => u64::MAX,
        _ => u.arbitrary()?,
    })
}

/// An address in the root or one of the chunks of `node` (or anywhere).
fn place(u: &mut Unstructured, node: &MemoryNode) -> Result<u64> {
    let regions: Vec<Allocation> = node.root.iter().chain(&node.chunks).copied().collect();
    if regions.is_empty() || u.ratio(1, 16)? {
        return u.arbitrary();
    }
    let r = regions[u.choose_index(regions.len())?];
    let offset = u.int_in_range(0..=r.len.clamp(1, 1 << 20) - 1)?;
    Ok(r.addr.wrapping_add(offset))
}

/// The newest (or older) superblock slot of `node`, or a fresh one.
fn slot(u: &mut Unstructured, node: &MemoryNode) -> Result<Option<(u64, Superblock)>> {
    let Some(root) = node.root else {
        return Ok(None);
    };
    let at = root
        .addr
        .wrapping_add(u.int_in_range(0..=1u64)? * SUPERBLOCK_SLOT as u64);
    let sb = Superblock::decode(&node.read(at, SUPERBLOCK_SLOT))
        .ok()
        .flatten()
        .unwrap_or_default();
    Ok(Some((at, sb)))
}

fn write_slot(node: &mut MemoryNode, at: u64, sb: &Superblock) {
    node.write(at, &[0; SUPERBLOCK_SLOT]);
    node.write(at, &sb.encode());
}

fn forge_superblock(u: &mut Unstructured, node: &mut MemoryNode) -> Result<()> {
    let Some((at, mut sb)) = slot(u, node)? else {
        return Ok(());
    };
    let area = |u: &mut Unstructured, a: Area| -> Result<Area> {
        Ok(Area {
            addr: number(u, a.addr)?,
            len: number(u, a.len)?,
        })
    };
    match u.int_in_range(0..=8u8)? {
        0 => sb.generation = number(u, sb.generation)?,
        1 => sb.first_seq = number(u, sb.first_seq)?,
        2 => sb.block_size = number(u, sb.block_size as u64)? as u32,
        3 => {
            let (a, crc) = sb.checkpoint.unwrap_or_default();
            sb.checkpoint = Some((area(u, a)?, crc));
        }
        4 => sb.log = Some(area(u, sb.log.unwrap_or_default())?),
        5 => sb.checkpoint = None,
        6 => sb.log = None,
        7 => {
            let n = u.int_in_range(0..=70)?;
            sb.members = (0..n)
                .map(|i| number(u, sb.members.get(i).copied().unwrap_or(0)))
                .collect::<Result<_>>()?;
        }
        _ => sb.volume_id = u.arbitrary()?,
    }
    write_slot(node, at, &sb);
    Ok(())
}

/// A record of any kind, its numbers near the healthy volume's.
fn record(u: &mut Unstructured) -> Result<Record> {
    let ino = number(u, 2)?;
    let name = |u: &mut Unstructured| -> Result<Vec<u8>> {
        let n = u.int_in_range(0..=300)?;
        Ok(u.bytes(n)?.to_vec())
    };
    Ok(match u.int_in_range(0..=11u8)? {
        0 => Record::Attr(StoredAttr {
            ino,
            kind: u.int_in_range(0..=8)?,
            perm: u.arbitrary()?,
            nlink: u.arbitrary()?,
            uid: u.arbitrary()?,
            gid: u.arbitrary()?,
            rdev: u.arbitrary()?,
            size: number(u, 65536)?,
            atime: Time {
                secs: u.arbitrary()?,
                nanos: u.arbitrary()?,
            },
            mtime: Time::default(),
            ctime: Time::default(),
        }),
        1 => Record::Target {
            ino,
            target: name(u)?,
        },
        2 => Record::Xattrs {
            ino,
            xattrs: vec![(name(u)?, name(u)?)],
        },
        3 => {
            let copies = (0..u.int_in_range(0..=4)?)
                .map(|_| {
                    Ok(StoredCopy {
                        slot: u.int_in_range(0..=3)?,
                        addr: number(u, 0x7f00_0080_0000)?,
                    })
                })
                .collect::<Result<_>>()?;
            let sums = (0..u.int_in_range(0..=20)?)
                .map(|_| u.arbitrary())
                .collect::<Result<_>>()?;
            Record::Block(StoredBlock {
                ino,
                index: number(u, 0)?,
                flags: u.arbitrary()?,
                alloc_len: number(u, 65536)? as u32,
                sums,
                copies,
            })
        }
        4 => Record::SumsStale { ino },
        5 => Record::BlockGone {
            ino,
            index: number(u, 0)?,
        },
        6 => Record::InodeGone { ino },
        7 => Record::Dir {
            ino,
            parent: number(u, 1)?,
        },
        8 => Record::DirAdd {
            dir: number(u, 1)?,
            cookie: number(u, 3)?,
            ino,
            name: name(u)?,
        },
        9 => Record::DirRemove {
            dir: number(u, 1)?,
            name: name(u)?,
        },
        10 => Record::DirNextCookie {
            dir: number(u, 1)?,
            next: number(u, 3)?,
        },
        _ => Record::NextIno { next: ino },
    })
}

fn records(u: &mut Unstructured) -> Result<Vec<Record>> {
    (0..u.int_in_range(1..=8)?).map(|_| record(u)).collect()
}

/// A new checkpoint for the newest (or older) superblock: the old records and made-up
/// ones, or raw bytes, under valid checksums, the superblock pointed at it.
fn rewrite_checkpoint(u: &mut Unstructured, node: &mut MemoryNode) -> Result<()> {
    let Some((at, mut sb)) = slot(u, node)? else {
        return Ok(());
    };
    let Some((area, _)) = sb.checkpoint else {
        return Ok(());
    };
    let old = node.read(area.addr, area.len.min(1 << 20) as usize);
    let mut kept = decode_checkpoint(&old, sb.generation).unwrap_or_default();
    let body = if u.ratio(1, 4)? {
        let n = u.int_in_range(0..=4096)?;
        u.bytes(n)?.to_vec()
    } else {
        kept.extend(records(u)?);
        encode_records(&kept)
    };
    let bytes = encode_checkpoint(sb.generation, &body);
    node.write(area.addr, &bytes);
    sb.checkpoint = Some((
        Area {
            addr: area.addr,
            len: bytes.len() as u64,
        },
        fsd::volume::format::crc(&bytes),
    ));
    write_slot(node, at, &sb);
    Ok(())
}

/// A log entry of made-up records (or raw bytes) with a valid checksum, at the next
/// entry's place or anywhere in the log, numbered next or otherwise.
fn append_log(u: &mut Unstructured, node: &mut MemoryNode) -> Result<()> {
    let Some((_, sb)) = slot(u, node)? else {
        return Ok(());
    };
    let Some(log) = sb.log else {
        return Ok(());
    };
    // Numbered as the next entries of the superblock's log (whatever its first
    // sequence number says), or otherwise.
    let nth = u.int_in_range(0..=16u64)?;
    let seq = match u.ratio(3, 4)? {
        true => sb.first_seq.wrapping_add(nth),
        false => number(u, FIRST_SEQ)?,
    };
    let body = match u.ratio(1, 4)? {
        true => {
            let n = u.int_in_range(0..=512)?;
            u.bytes(n)?.to_vec()
        }
        false => encode_records(&records(u)?),
    };
    let entry = encode_entry(seq, &body);
    // The healthy log's one entry is 64 bytes or so; later ones go after it.
    let offset = match u.ratio(3, 4)? {
        true => nth * 512,
        false => u.int_in_range(0..=log.len.min(1 << 20))? / 8 * 8,
    };
    node.write(log.addr.wrapping_add(offset), &entry);
    Ok(())
}

fn change_chunks(u: &mut Unstructured, node: &mut MemoryNode) -> Result<()> {
    let n = node.chunks.len();
    match u.int_in_range(0..=5u8)? {
        0 if n > 0 => {
            let c = &mut node.chunks[u.choose_index(n)?];
            c.addr = number(u, c.addr)?;
        }
        1 if n > 0 => {
            let c = &mut node.chunks[u.choose_index(n)?];
            c.len = number(u, c.len)?;
        }
        2 => {
            let near = node.chunks.last().map_or(0, |c| c.addr);
            node.chunks.push(Allocation {
                addr: number(u, near)?,
                len: number(u, 1 << 20)?,
                rkey: u.arbitrary()?,
            });
        }
        3 if n > 0 => {
            node.chunks.remove(u.choose_index(n)?);
        }
        4 if n > 1 => {
            let (a, b) = (u.choose_index(n)?, u.choose_index(n)?);
            node.chunks.swap(a, b);
        }
        5 if n > 0 => {
            let c = node.chunks[u.choose_index(n)?];
            node.chunks.push(c);
        }
        _ => {}
    }
    Ok(())
}
