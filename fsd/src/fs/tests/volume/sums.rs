//! Page sums kept on a durable volume: after a remount or a crash, a copy damaged
//! behind fsd's back is still caught, and pages written back after their sums were
//! committed still read back.

use super::*;

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
