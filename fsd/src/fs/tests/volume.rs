//! The filesystem on a durable volume, without a mount: what a commit makes durable
//! survives a crash (fsd dropped without a shutdown, dirty pages and uncommitted
//! metadata lost), a clean shutdown keeps everything, and a remounted volume checks
//! clean: no inconsistency, no leaked chunk.

use super::*;
use crate::namespace::RenameMode;
use crate::remote::VolumeSpec;
use crate::volume::admin;
use crate::volume::Volume;
use std::collections::BTreeMap;
use std::path::Path;

fn memnode() -> memnode::Memnode {
    memnode_of(64 << 20)
}

fn memnode_of(size: u64) -> memnode::Memnode {
    memnode::Memnode::start(memnode::MemnodeConfig {
        listen: "127.0.0.1:0".into(),
        size,
        token: None,
        tenants: None,
        huge_pages: false,
        transport: rmemfs_common::fabric::Transport::Tcp,
        poll: Duration::ZERO,
        lease: memnode::DEFAULT_LEASE,
        // A dropped fsd (a crash) lets go of the volume at once, as these tests of
        // crashes expect; the session tests are in memnode and tests/.
        session_grace: Duration::ZERO,
        memory_file: None,
        connections: rmemfs_common::fabric::ConnectionLimits::default(),
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

// The tests of one subject each, on the volume rig above.
mod format;
mod full;
mod sums;
