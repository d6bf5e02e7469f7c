//! The filesystem on a durable volume, without a mount: what a commit makes durable
//! survives a crash (fsd dropped without a shutdown, dirty pages and uncommitted
//! metadata lost), a clean shutdown keeps everything, and a remounted volume checks
//! clean: no inconsistency, no leaked chunk.

use super::*;
use crate::remote::VolumeSpec;
use crate::volume::admin;
use crate::volume::format::FORMAT_VERSION;
use crate::volume::Volume;
use std::collections::BTreeMap;

fn memnode() -> memnode::Memnode {
    memnode_of(64 << 20)
}

fn memnode_of(size: u64) -> memnode::Memnode {
    memnode::Memnode::start(memnode::MemnodeConfig {
        listen: "127.0.0.1:0".into(),
        size,
        token: None,
        huge_pages: false,
        transport: rmemfs_common::fabric::Transport::Tcp,
        poll: Duration::ZERO,
        lease: memnode::DEFAULT_LEASE,
        // A dropped fsd (a crash) lets go of the volume at once, as these tests of
        // crashes expect; the session tests are in memnode and tests/.
        session_grace: Duration::ZERO,
        memory_file: None,
    })
    .expect("memnode starts")
}

/// Opens the volume. A "crash" here is dropping the last store: its connections
/// close at once, but the memnode notices on its own threads, so on a loaded machine
/// the next open may still find the volume held for a moment; it tries again for up
/// to 10 s, as a restarted fsd's operator would.
fn store(node: &memnode::Memnode, create: bool) -> Arc<RemoteStore> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match try_store(node, create) {
            Err(crate::remote::RemoteError::Control { error, .. })
                if error.is_busy() && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            r => return Arc::new(r.expect("connects and opens the volume")),
        }
    }
}

fn try_store(
    node: &memnode::Memnode,
    create: bool,
) -> Result<RemoteStore, crate::remote::RemoteError> {
    connect_store(
        node,
        Some(VolumeSpec {
            name: "vol".into(),
            create,
            takeover: false,
        }),
    )
}

/// A client of `node`: of the volume `volume`, or of scratch memory.
fn connect_store(
    node: &memnode::Memnode,
    volume: Option<VolumeSpec>,
) -> Result<RemoteStore, crate::remote::RemoteError> {
    let connect: Arc<Connector> = Arc::new(|peer: &str, _client: u64| {
        Ok(Box::new(TcpEndpoint::connect(peer, Duration::from_secs(2))?) as Box<dyn Endpoint>)
    });
    RemoteStore::connect(
        &[node.local_addr().to_string()],
        &RemoteConfig {
            block_size: BS,
            chunk_size: 64 * BS,
            connections: 2,
            client_id: rmemfs_common::control::random_id(),
            token: Vec::new(),
            replicas: 1,
            watch_interval: Duration::from_secs(1),
            dead_time: Duration::from_secs(600),
            unreachable_timeout: None,
            volume,
        },
        connect,
    )
}

fn mount(node: &memnode::Memnode) -> RmemFs {
    mount_reporting(node).0
}

fn mount_reporting(node: &memnode::Memnode) -> (RmemFs, crate::volume::MountReport) {
    let remote = store(node, true);
    let (volume, ns, report) =
        Volume::mount("vol", remote.clone(), (0, 0), Default::default()).expect("volume mounts");
    (RmemFs::on_volume(remote, 16 * BS, ns, volume), report)
}

/// What `fsck` says of the volume (not mounted): (inconsistencies, leaked chunks).
fn check(node: &memnode::Memnode) -> (Vec<String>, usize) {
    let remote = store(node, false);
    let r = admin::fsck(&remote, "vol")
        .expect("volume reads")
        .expect("volume has metadata");
    remote.close_volume();
    (r.problems, r.leaked_chunks)
}

/// Every regular file under the root, by name, read whole.
fn files(fs: &RmemFs) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for e in fs.readdir(ROOT_INO, 0, usize::MAX).unwrap() {
        if e.kind != FileKind::File {
            continue;
        }
        let size = fs.getattr(e.ino).unwrap().size;
        let data = fs.read(e.ino, 0, size as u32).unwrap();
        out.insert(e.name.to_string_lossy().into_owned(), data);
    }
    out
}

fn lookup(fs: &RmemFs, name: &str) -> Option<Ino> {
    fs.lookup(ROOT_INO, name.as_ref()).ok().map(|a| a.ino)
}

/// A small random workload on `fs` from `seed`: creates, writes, truncates,
/// renames, unlinks. `model` follows what the files hold.
fn workload(fs: &RmemFs, model: &mut BTreeMap<String, Vec<u8>>, seed: u64, ops: usize) {
    let mut x = seed | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..ops {
        let name = format!("f{}", next() % 12);
        match next() % 6 {
            0 | 1 => {
                let ino = match lookup(fs, &name) {
                    Some(i) => i,
                    None => new_file(fs, &name),
                };
                let cur = model.entry(name.clone()).or_default();
                let off = (next() % (6 * BS)) as usize;
                let data = pattern((next() % (3 * BS)) as usize + 1, next());
                fs.write(ino, off as u64, &data).unwrap();
                if cur.len() < off + data.len() {
                    cur.resize(off + data.len(), 0);
                }
                cur[off..off + data.len()].copy_from_slice(&data);
            }
            2 => {
                if let Some(ino) = lookup(fs, &name) {
                    let size = next() % (5 * BS);
                    fs.setattr(
                        ino,
                        &SetAttr {
                            size: Some(size),
                            ..Default::default()
                        },
                    )
                    .unwrap();
                    model.get_mut(&name).unwrap().resize(size as usize, 0);
                }
            }
            3 => {
                if lookup(fs, &name).is_some() {
                    fs.unlink(ROOT_INO, name.as_ref()).unwrap();
                    model.remove(&name);
                }
            }
            4 => {
                let to = format!("f{}", next() % 12);
                if lookup(fs, &name).is_some() && to != name {
                    fs.rename(
                        ROOT_INO,
                        name.as_ref(),
                        ROOT_INO,
                        to.as_ref(),
                        RenameMode::default(),
                    )
                    .unwrap();
                    let data = model.remove(&name).unwrap();
                    model.insert(to, data);
                }
            }
            _ => {
                if let Some(ino) = lookup(fs, &name) {
                    fs.fsync(ino).unwrap();
                }
            }
        }
    }
}

#[test]
fn a_clean_shutdown_keeps_every_file_attribute_and_xattr() {
    let node = memnode();
    let fs = mount(&node);
    let mut model = BTreeMap::new();
    workload(&fs, &mut model, 11, 300);
    let d = fs.mkdir(ROOT_INO, "d".as_ref(), 0o750, ME).unwrap().ino;
    let s = fs
        .symlink(d, "s".as_ref(), Path::new("../f1"), ME)
        .unwrap()
        .ino;
    fs.setxattr(d, "user.k".as_ref(), b"v", Default::default(), ME)
        .unwrap();
    let before: Vec<Attr> = [d, s].iter().map(|&i| fs.getattr(i).unwrap()).collect();
    fs.shutdown();
    drop(fs);
    let fs = mount(&node);
    assert_eq!(files(&fs), model);
    let after: Vec<Attr> = [d, s].iter().map(|&i| fs.getattr(i).unwrap()).collect();
    assert_eq!(after, before);
    assert_eq!(fs.readlink(s).unwrap(), Path::new("../f1"));
    assert_eq!(fs.getxattr(d, "user.k".as_ref()).unwrap(), b"v");
    fs.shutdown();
    drop(fs);
    assert_eq!(check(&node), (vec![], 0));
}

#[test]
fn after_a_crash_everything_committed_is_back_and_the_volume_checks_clean() {
    let node = memnode();
    for round in 0..8u64 {
        let seed = 1000 + round;
        println!("round {round}, seed {seed}");
        let fs = mount(&node);
        let mut model = files(&fs);
        workload(&fs, &mut model, seed, 200);
        fs.flush_all().unwrap();
        let committed = model.clone();
        // More changes that are never committed, then the crash: no shutdown.
        workload(&fs, &mut model, seed ^ 0xabcdef, 50 + round as usize * 20);
        drop(fs);
        let fs = mount(&node);
        let got = files(&fs);
        // Files the uncommitted tail never touched are exact; the others are the
        // committed or a later version, never bytes nobody wrote.
        for (name, data) in &committed {
            let now = model.get(name);
            if now == Some(data) {
                assert_eq!(got.get(name), Some(data), "seed {seed}: {name} changed");
            }
        }
        fs.shutdown();
        drop(fs);
        let (problems, leaked) = check(&node);
        assert!(problems.is_empty(), "seed {seed}: {problems:?}");
        assert_eq!(leaked, 0, "seed {seed}: leaked chunks");
    }
}

#[test]
fn a_freed_block_is_not_reused_before_the_commit_that_frees_it() {
    let node = memnode();
    let fs = mount(&node);
    let a = new_file(&fs, "a");
    let data = pattern(4 * BS as usize, 5);
    fs.write(a, 0, &data).unwrap();
    fs.fsync_durable(a).unwrap();
    // Deleted but not committed: its blocks must not go to "b".
    fs.unlink(ROOT_INO, "a".as_ref()).unwrap();
    fs.release(a).unwrap();
    let b = new_file(&fs, "b");
    fs.write(b, 0, &pattern(4 * BS as usize, 6)).unwrap();
    fs.fsync(b).unwrap(); // data written back, metadata not committed
    drop(fs);
    let fs = mount(&node);
    let a = lookup(&fs, "a").expect("the delete was never committed");
    assert_eq!(
        fs.read(a, 0, data.len() as u32).unwrap(),
        data,
        "a's blocks were reused"
    );
    fs.shutdown();
}

#[test]
fn bytes_cut_off_by_a_truncate_never_come_back_after_a_crash() {
    let node = memnode();
    let fs = mount(&node);
    let f = new_file(&fs, "f");
    let data = pattern(3 * BS as usize, 9);
    fs.write(f, 0, &data).unwrap();
    fs.fsync_durable(f).unwrap();
    let cut = BS + 100;
    fs.setattr(
        f,
        &SetAttr {
            size: Some(cut),
            ..Default::default()
        },
    )
    .unwrap();
    // Another file's fsync commits f's new size too; f's own pages are not flushed.
    let g = new_file(&fs, "g");
    fs.write(g, 0, b"x").unwrap();
    fs.fsync_durable(g).unwrap();
    drop(fs); // crash
    let fs = mount(&node);
    let f = lookup(&fs, "f").unwrap();
    assert_eq!(fs.getattr(f).unwrap().size, cut);
    // Growing the file again must show zeros past the old end, not the cut bytes.
    fs.setattr(
        f,
        &SetAttr {
            size: Some(3 * BS),
            ..Default::default()
        },
    )
    .unwrap();
    let got = fs.read(f, 0, 3 * BS as u32).unwrap();
    assert_eq!(&got[..cut as usize], &data[..cut as usize]);
    let stale = got[cut as usize..].iter().position(|&b| b != 0);
    assert_eq!(stale, None, "cut bytes came back at {stale:?} past the cut");
    fs.shutdown();
}

#[test]
fn bytes_written_past_an_end_that_a_crash_rolled_back_never_show_when_the_file_grows() {
    let node = memnode();
    let fs = mount(&node);
    let f = new_file(&fs, "f");
    let data = pattern(1000, 4);
    fs.write(f, 0, &data).unwrap();
    fs.fsync_durable(f).unwrap();
    // Past the end, in the same block and in a later one: written back, never committed.
    fs.write(f, 2000, &pattern(100, 5)).unwrap();
    fs.write(f, 2 * BS + 10, &pattern(100, 6)).unwrap();
    fs.fsync(f).unwrap();
    drop(fs); // crash
    let fs = mount(&node);
    let f = lookup(&fs, "f").unwrap();
    assert_eq!(fs.getattr(f).unwrap().size, 1000);
    fs.setattr(
        f,
        &SetAttr {
            size: Some(4 * BS),
            ..Default::default()
        },
    )
    .unwrap();
    let got = fs.read(f, 0, 4 * BS as u32).unwrap();
    assert_eq!(&got[..1000], &data[..]);
    let stale = got[1000..].iter().position(|&b| b != 0);
    assert_eq!(
        stale, None,
        "uncommitted bytes showed at {stale:?} past the end"
    );
    fs.shutdown();
}

/// Flips a byte of the first copy of block `index` of `ino` in remote memory, behind
/// fsd's back, and drops the file from the cache.
fn damage_block(fs: &RmemFs, ino: Ino, index: u64, at: usize) {
    let copy = fs.ns.get(ino).unwrap().meta().blocks[&index].loc.replicas()[0];
    let remote = copy.remote.offset(at);
    let mut byte = [0u8; 1];
    fs.remote()
        .read_at(copy.node as usize, remote, &mut byte)
        .unwrap();
    byte[0] ^= 0x10;
    fs.remote()
        .write_at(copy.node as usize, remote, &byte)
        .unwrap();
    fs.cache().invalidate(ino, 0);
}

fn checksum_failures(fs: &RmemFs) -> u64 {
    fs.remote()
        .counters
        .checksum_failures
        .load(Ordering::Relaxed)
}

fn known_sums(fs: &RmemFs, ino: Ino) -> usize {
    let inode = fs.ns.get(ino).unwrap();
    let m = inode.meta();
    m.blocks.values().map(|e| e.sums.known()).sum()
}

#[test]
fn page_sums_kept_on_the_volume_catch_damage_after_a_remount_and_after_a_crash() {
    let node = memnode();
    for crash in [false, true] {
        let fs = mount(&node);
        let name = format!("f{crash}");
        let f = new_file(&fs, &name);
        let data = pattern(3 * BS as usize, 21);
        fs.write(f, 0, &data).unwrap();
        fs.fsync_durable(f).unwrap();
        if crash {
            drop(fs); // the sums are in the log, not in a checkpoint
        } else {
            fs.shutdown();
            drop(fs);
        }
        let fs = mount(&node);
        let f = lookup(&fs, &name).unwrap();
        assert_eq!(
            known_sums(&fs, f),
            3,
            "crash {crash}: every page's sum came back"
        );
        damage_block(&fs, f, 1, 17);
        match fs.read(f, BS, BS as u32) {
            Err(FsError::Io(msg)) => assert!(msg.contains("checksum"), "{msg}"),
            other => panic!("crash {crash}: a damaged page read as {other:?}"),
        }
        assert_eq!(checksum_failures(&fs), 1);
        assert_eq!(fs.read(f, 0, BS as u32).unwrap(), data[..BS as usize]);
        assert_eq!(
            fs.read(f, 2 * BS, BS as u32).unwrap(),
            data[2 * BS as usize..]
        );
        // Mend it for the next round's checks.
        fs.write(f, BS, &data[BS as usize..2 * BS as usize])
            .unwrap();
        fs.shutdown();
    }
}

#[test]
fn pages_written_back_after_their_sums_were_committed_read_back_after_a_crash() {
    let node = memnode();
    let fs = mount(&node);
    let f = new_file(&fs, "f");
    fs.write(f, 0, &pattern(4 * BS as usize, 1)).unwrap();
    fs.fsync_durable(f).unwrap();
    // Rewritten and written back, never committed: the log's sums are older than the
    // pages now, so it must say they are stale.
    let newer = pattern(4 * BS as usize, 2);
    fs.write(f, 0, &newer).unwrap();
    fs.fsync(f).unwrap();
    drop(fs); // crash
    let fs = mount(&node);
    let f = lookup(&fs, "f").unwrap();
    assert_eq!(
        fs.read(f, 0, 4 * BS as u32)
            .expect("newer pages are no damage"),
        newer
    );
    assert_eq!(checksum_failures(&fs), 0);
    assert_eq!(known_sums(&fs, f), 0, "the log said the sums were stale");
    // The next commit gives them sums again, in the log.
    fs.write(f, 0, &newer).unwrap();
    fs.fsync_durable(f).unwrap();
    drop(fs); // crash
    let fs = mount(&node);
    let f = lookup(&fs, "f").unwrap();
    assert_eq!(known_sums(&fs, f), 4);
    assert_eq!(fs.read(f, 0, 4 * BS as u32).unwrap(), newer);
    fs.shutdown();
    drop(fs);
    assert_eq!(check(&node), (vec![], 0));
}

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

/// Writes `name` in 256 KiB pieces, each written back, until remote memory is full
/// (the write or its write-back fails with ENOSPC): the bytes that made it.
fn fill(fs: &RmemFs, name: &str) -> (Ino, u64) {
    fill_committing(fs, name, false)
}

/// [`fill`], each piece also committed when `commit`.
fn fill_committing(fs: &RmemFs, name: &str, commit: bool) -> (Ino, u64) {
    let ino = new_file(fs, name);
    let piece = pattern(64 * BS as usize, 9);
    let mut at = 0;
    loop {
        let synced = fs.write(ino, at, &piece).and_then(|_| match commit {
            true => fs.fsync_durable(ino),
            false => fs.fsync(ino),
        });
        match synced {
            Ok(()) => at += piece.len() as u64,
            Err(FsError::NoSpace) => return (ino, at),
            Err(e) => panic!("filling {name}: {e}"),
        }
        assert!(at < 1 << 30, "remote memory never filled");
    }
}

#[test]
fn a_volume_whose_memory_filled_up_still_commits_its_deletes_and_gets_the_space_back() {
    let node = memnode();
    let fs = mount(&node);
    let keep = new_file(&fs, "keep");
    let kept = pattern(3 * BS as usize, 4);
    fs.write(keep, 0, &kept).unwrap();
    fs.fsync_durable(keep).unwrap();
    let volume = fs.volume.clone().expect("on a volume");
    // One more checkpoint, so the spares have been written into once already.
    volume.want_checkpoint();
    fs.flush_all().unwrap();
    let (big, filled) = fill(&fs, "big");
    assert!(filled > 8 << 20, "only {filled} bytes before ENOSPC");
    fs.unlink(ROOT_INO, "big".as_ref()).unwrap();
    fs.release(big).unwrap();
    // With every byte of remote memory taken, the commit that frees "big" has to be
    // a checkpoint (as when the log is full): it must still find room.
    volume.want_checkpoint();
    fs.flush_all()
        .expect("a checkpoint with remote memory full goes to the spares");
    let (again_ino, again) = fill(&fs, "again");
    assert!(
        again + (1 << 20) >= filled,
        "the space of the deleted file came back: {again} bytes now, {filled} before"
    );
    fs.unlink(ROOT_INO, "again".as_ref()).unwrap();
    fs.release(again_ino).unwrap();
    volume.want_checkpoint();
    fs.flush_all().unwrap();
    fs.shutdown();
    drop(fs);
    let fs = mount(&node);
    assert_eq!(lookup(&fs, "big"), None);
    let keep = lookup(&fs, "keep").expect("kept");
    assert_eq!(fs.read(keep, 0, kept.len() as u32).unwrap(), kept);
    fs.shutdown();
    drop(fs);
    assert_eq!(check(&node), (vec![], 0), "clean, spares given back");
}

#[test]
fn on_a_full_volume_a_write_right_after_a_delete_gets_the_deleted_files_space() {
    let node = memnode();
    let fs = mount(&node);
    let (big, filled) = fill(&fs, "big");
    fs.unlink(ROOT_INO, "big".as_ref()).unwrap();
    fs.release(big).unwrap();
    // No commit in between: the write's ENOSPC commits the delete and tries again.
    let (_, again) = fill(&fs, "again");
    assert!(
        again + (1 << 20) >= filled,
        "{again} bytes written after the delete, {filled} before it"
    );
    fs.shutdown();
    drop(fs);
    assert_eq!(check(&node), (vec![], 0));
}

/// Fills a 256 MiB memnode with one file of 4 KiB blocks: its checkpoint (a record
/// per block) outgrows the room the first checkpoints were given. The volume must
/// still unmount with everything durable, mount again, commit the file's delete and
/// give its space back. With `commit`, every piece is committed as it is written.
fn a_volume_whose_checkpoint_outgrew_its_room_in_full_memory(commit: bool) -> usize {
    let node = memnode_of(256 << 20);
    let fs = mount(&node);
    let (_, filled) = fill_committing(&fs, "big", commit);
    assert!(filled > 128 << 20, "only {filled} bytes before ENOSPC");
    fs.shutdown();
    drop(fs);
    let (fs, report) = mount_reporting(&node);
    let big = lookup(&fs, "big").expect("the full volume mounts with its file");
    assert_eq!(fs.getattr(big).unwrap().size, filled);
    let piece = pattern(64 * BS as usize, 9);
    let last = filled - piece.len() as u64;
    assert_eq!(fs.read(big, last, piece.len() as u32).unwrap(), piece);
    fs.unlink(ROOT_INO, "big".as_ref()).unwrap();
    fs.flush_all()
        .expect("the delete commits with remote memory full");
    let (_, again) = fill(&fs, "again");
    assert!(
        again + (16 << 20) >= filled,
        "the space of the deleted file came back: {again} bytes now, {filled} before"
    );
    fs.shutdown();
    drop(fs);
    let fs = mount(&node);
    assert_eq!(lookup(&fs, "big"), None);
    let again_ino = lookup(&fs, "again").expect("again is kept");
    assert_eq!(fs.getattr(again_ino).unwrap().size, again);
    fs.unlink(ROOT_INO, "again".as_ref()).unwrap();
    fs.shutdown();
    drop(fs);
    assert_eq!(check(&node), (vec![], 0), "clean, nothing leaked");
    report.log_entries
}

#[test]
fn a_volume_filled_without_commits_has_its_checkpoints_room_reserved() {
    // Nothing committed while filling: the checkpoint chunks were allocated with
    // room for a full log while memory was free, so the unmount's checkpoint fits.
    let replayed = a_volume_whose_checkpoint_outgrew_its_room_in_full_memory(false);
    assert_eq!(replayed, 0, "the unmount's checkpoint found room");
}

#[test]
fn commits_grow_the_room_for_the_next_checkpoint_while_memory_lasts() {
    // Each piece committed: the spares grow with the log, so the unmount's
    // checkpoint fits and the mount has no log to replay.
    let replayed = a_volume_whose_checkpoint_outgrew_its_room_in_full_memory(true);
    assert_eq!(replayed, 0, "the unmount's checkpoint found room");
}

/// Makes `count` empty files in a new directory `many` of `fs`: metadata only.
fn many_files(fs: &RmemFs, count: usize) -> Ino {
    let dir = fs.mkdir(ROOT_INO, "many".as_ref(), 0o755, ME).unwrap().ino;
    for n in 0..count {
        let name = format!("file-with-a-long-name-{n:08}");
        let ino = fs.create(dir, name.as_ref(), 0o644, ME).unwrap().ino;
        fs.release(ino).unwrap();
    }
    dir
}

fn entries(fs: &RmemFs, dir: Ino) -> usize {
    // "." and ".." besides the files.
    fs.readdir(dir, 0, usize::MAX).unwrap().len() - 2
}

/// Makes empty files in `dir` (named from `first` on), committing every 2,000 as a
/// program calling fsync would, until one fails with ENOSPC: how many it made.
fn files_until_full(fs: &RmemFs, dir: Ino, first: usize) -> usize {
    let mut made = 0;
    loop {
        let name = format!("file-with-a-long-name-{:08}", first + made);
        match fs.create(dir, name.as_ref(), 0o644, ME) {
            Ok(a) => fs.release(a.ino).unwrap(),
            Err(FsError::NoSpace) => return made,
            Err(e) => panic!("creating {name}: {e}"),
        }
        made += 1;
        if made % 2000 == 0 {
            fs.flush_all().expect("a commit while the volume has room");
        }
        assert!(made < 1_000_000, "the metadata never ran out of room");
    }
}

#[test]
fn a_volume_with_no_room_for_more_metadata_refuses_new_files_and_loses_none() {
    // Another client took all but a sliver of memory before the volume was made, so
    // its spares cannot grow much. Empty files need no data, only metadata: made
    // until one fails with ENOSPC, each must still be durable, as the checkpoint
    // that holds them must fit its spare (before, creates never failed and the
    // checkpoint outgrew its room: no commit, not even the unmount's, could make
    // anything durable any more). Deletes bring the room back.
    let node = memnode_of(64 << 20);
    let scratch = connect_store(&node, None).expect("a scratch client connects");
    let other = RmemFs::new(Arc::new(scratch), 16 * BS, ME);
    let hog = new_file(&other, "hog");
    other.write(hog, 0, &pattern(44 << 20, 1)).unwrap();
    other.fsync(hog).unwrap();
    let fs = mount(&node);
    let dir = fs.mkdir(ROOT_INO, "many".as_ref(), 0o755, ME).unwrap().ino;
    let made = files_until_full(&fs, dir, 0);
    assert!(made > 5_000, "only {made} files before ENOSPC");
    // What does not grow the metadata still works, and commits.
    let first = fs
        .lookup(dir, "file-with-a-long-name-00000000".as_ref())
        .unwrap()
        .ino;
    let chmod = SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    fs.setattr(first, &chmod)
        .expect("a chmod with no room to grow");
    fs.flush_all().expect("a commit with no room to grow");
    let deleted = made / 2;
    for n in 0..deleted {
        let name = format!("file-with-a-long-name-{n:08}");
        fs.unlink(dir, name.as_ref()).unwrap();
    }
    fs.flush_all().unwrap();
    // The checkpoint's size is measured again at most every 100 ms.
    std::thread::sleep(Duration::from_millis(150));
    let again = files_until_full(&fs, dir, made);
    assert!(
        again * 4 > deleted,
        "{again} files made after {deleted} were deleted"
    );
    fs.shutdown();
    drop(fs);
    let (fs, report) = mount_reporting(&node);
    assert_eq!(report.log_entries, 0, "the unmount's checkpoint found room");
    let dir = lookup(&fs, "many").expect("the directory");
    assert_eq!(entries(&fs, dir), made - deleted + again, "every file made");
    fs.shutdown();
    drop(fs);
    drop(other);
    assert_eq!(check(&node), (vec![], 0), "clean, nothing leaked");
}

#[test]
fn changes_too_many_for_the_log_made_before_memory_filled_survive_an_unmount() {
    // A fresh volume: many files made within one commit interval (more than the log
    // has room for, so the first commit must be a checkpoint), then a file that
    // fills remote memory before any commit. The checkpoint must have had its room
    // reserved while memory was free: an unmount that cannot commit loses them all.
    let node = memnode_of(256 << 20);
    let fs = mount(&node);
    let names = 40_000;
    many_files(&fs, names);
    let (_, filled) = fill(&fs, "big");
    assert!(filled > 128 << 20, "only {filled} bytes before ENOSPC");
    fs.flush_all()
        .expect("the commit finds the room it reserved");
    fs.shutdown();
    drop(fs);
    let fs = mount(&node);
    let dir = lookup(&fs, "many").expect("the directory made before memory filled");
    assert_eq!(entries(&fs, dir), names, "every file made");
    let big = lookup(&fs, "big").expect("the file that filled memory");
    assert_eq!(fs.getattr(big).unwrap().size, filled);
    fs.shutdown();
    drop(fs);
    assert_eq!(check(&node), (vec![], 0), "clean, nothing leaked");
}
