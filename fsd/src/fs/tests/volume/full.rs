//! A volume with no room: remote memory full, or no room in the checkpoint for more
//! metadata. Deletes still commit and give their space back, new files are refused
//! with ENOSPC, and nothing made before is lost.

use super::*;

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
