//! A volume an older fsd left: format version 1 mounts and is rewritten as the
//! current version in both superblock slots.

use super::*;
use crate::volume::format::FORMAT_VERSION;

/// Rewrites the volume's current superblock and checkpoint as format version 1 wrote
/// them (same layout; the version words say 1), as an fsd of that version left it.
fn downgrade_to_version_1(node: &memnode::Memnode) {
    use crate::volume::format::{crc, Superblock, CHECKPOINT_HEADER, SUPERBLOCK_SLOT};
    let remote = store(node, false);
    let root = remote.volume_root(0).unwrap();
    let at = |addr: u64, rkey: u32| rmemfs_common::fabric::RemoteAddr { addr, rkey };
    let mut slots = vec![0u8; 2 * SUPERBLOCK_SLOT];
    remote
        .read_at(0, at(root.addr, root.rkey), &mut slots)
        .unwrap();
    let (slot, mut sb) = (0..2)
        .filter_map(|i| {
            let s = Superblock::decode(&slots[i * SUPERBLOCK_SLOT..(i + 1) * SUPERBLOCK_SLOT]);
            Some((i, s.ok()??))
        })
        .max_by_key(|(_, s)| s.generation)
        .unwrap();
    let (area, _) = sb.checkpoint.unwrap();
    let chunk = remote
        .volume_chunks(0)
        .unwrap()
        .into_iter()
        .find(|c| c.addr <= area.addr && area.addr < c.addr + c.len)
        .unwrap();
    let mut ck = vec![0u8; area.len as usize];
    remote
        .read_at(0, at(area.addr, chunk.rkey), &mut ck)
        .unwrap();
    ck[8..12].copy_from_slice(&1u32.to_le_bytes());
    let head = crc(&ck[..CHECKPOINT_HEADER - 4]);
    ck[CHECKPOINT_HEADER - 4..CHECKPOINT_HEADER].copy_from_slice(&head.to_le_bytes());
    remote.write_at(0, at(area.addr, chunk.rkey), &ck).unwrap();
    sb.checkpoint = Some((area, crc(&ck)));
    let mut bytes = sb.encode();
    bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
    let end = bytes.len() - 4;
    let c = crc(&bytes[..end]);
    bytes[end..].copy_from_slice(&c.to_le_bytes());
    let slot_at = root.addr + (slot * SUPERBLOCK_SLOT) as u64;
    remote.write_at(0, at(slot_at, root.rkey), &bytes).unwrap();
    remote.close_volume();
}

/// The format versions of both superblock slots.
fn slot_versions(node: &memnode::Memnode) -> Vec<u32> {
    use crate::volume::format::{Superblock, SUPERBLOCK_SLOT};
    let remote = store(node, false);
    let root = remote.volume_root(0).unwrap();
    let mut slots = vec![0u8; 2 * SUPERBLOCK_SLOT];
    let at = rmemfs_common::fabric::RemoteAddr {
        addr: root.addr,
        rkey: root.rkey,
    };
    remote.read_at(0, at, &mut slots).unwrap();
    remote.close_volume();
    slots
        .chunks(SUPERBLOCK_SLOT)
        .map(|s| Superblock::decode(s).unwrap().unwrap().version)
        .collect()
}

#[test]
fn a_version_1_volume_mounts_and_is_rewritten_as_version_2_in_both_slots() {
    let node = memnode();
    let fs = mount(&node);
    let f = new_file(&fs, "f");
    let data = pattern(2 * BS as usize, 8);
    fs.write(f, 0, &data).unwrap();
    fs.shutdown();
    drop(fs);
    let fs = mount(&node); // a second generation: both slots written
    fs.shutdown();
    drop(fs);
    downgrade_to_version_1(&node);
    assert!(slot_versions(&node).contains(&1));
    let fs = mount(&node);
    let f = lookup(&fs, "f").unwrap();
    assert_eq!(fs.read(f, 0, data.len() as u32).unwrap(), data);
    fs.shutdown();
    drop(fs);
    assert_eq!(
        slot_versions(&node),
        vec![FORMAT_VERSION; 2],
        "no slot an older fsd could take for current"
    );
    assert_eq!(check(&node), (vec![], 0));
}
