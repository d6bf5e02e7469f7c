//! A directory listing that runs while other entries are renamed: every entry present
//! for the whole walk comes back exactly once, and the walk ends.
//!
//! 15,000 files; while a reader walks the directory (pausing now and then, as a
//! program working on each entry does), another thread keeps saving files the way
//! editors do (write a temporary name, rename it over the real one) and moving a
//! file back and forth between two names. The real names never stop existing, so
//! each must be listed once; the temporary and moving names may or may not be.
//! tmpfs runs the same scenario and is reported beside rmemfs, not judged: on Linux
//! 6.18 it misses names that were renamed over during the walk.

use rmemfs_tests::{FsdMount, MemnodeProc, TmpfsMount};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

const FILES: usize = 15_000;
const WALKS: usize = 3;

fn name(i: usize) -> String {
    format!("file-{i:05}")
}

/// What the walks found: stable names listed other than once, and renames done.
struct Outcome {
    wrong: Vec<(String, usize)>,
    renames: u64,
}

fn walk_while_renaming(dir: &Path) -> Outcome {
    std::fs::create_dir(dir).expect("mkdir");
    for i in 0..FILES {
        std::fs::write(dir.join(name(i)), b"v1").expect("create");
    }
    std::fs::write(dir.join("moving-a"), b"m").expect("create");
    let stop = AtomicBool::new(false);
    let renames = AtomicU64::new(0);
    let mut wrong = Vec::new();
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut k = 0usize;
            while !stop.load(Ordering::Relaxed) {
                // Save file k through a temporary name.
                let tmp = dir.join(".tmp-save");
                std::fs::write(&tmp, b"v2").expect("write temporary");
                let target = (k * 7919) % FILES;
                std::fs::rename(&tmp, dir.join(name(target))).expect("rename over");
                // And move another file between two names.
                let (from, to) = if k.is_multiple_of(2) {
                    ("moving-a", "moving-b")
                } else {
                    ("moving-b", "moving-a")
                };
                std::fs::rename(dir.join(from), dir.join(to)).expect("move");
                renames.fetch_add(2, Ordering::Relaxed);
                k += 1;
            }
        });
        for _ in 0..WALKS {
            let mut seen: HashMap<String, usize> = HashMap::new();
            for (n, e) in std::fs::read_dir(dir).expect("opendir").enumerate() {
                let e = e.expect("readdir");
                *seen
                    .entry(e.file_name().to_string_lossy().into_owned())
                    .or_default() += 1;
                if n.is_multiple_of(500) {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            for i in 0..FILES {
                let c = seen.get(&name(i)).copied().unwrap_or(0);
                if c != 1 {
                    wrong.push((name(i), c));
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    Outcome {
        wrong,
        renames: renames.load(Ordering::Relaxed),
    }
}

#[test]
fn a_listing_returns_each_lasting_entry_once_while_others_are_renamed() {
    let tmpfs = TmpfsMount::start("256M");
    let on_tmpfs = walk_while_renaming(&tmpfs.join("dir"));
    println!(
        "tmpfs: {} renames during {WALKS} walks; lasting names listed other than once: {:?}",
        on_tmpfs.renames,
        &on_tmpfs.wrong[..on_tmpfs.wrong.len().min(10)]
    );
    drop(tmpfs);

    let memnode = MemnodeProc::start("256M");
    let fsd = FsdMount::with_memnode(&memnode, &[]);
    let on_rmemfs = walk_while_renaming(&fsd.join("dir"));
    println!("rmemfs: {} renames during {WALKS} walks", on_rmemfs.renames);
    assert!(
        on_rmemfs.renames > 0,
        "no rename happened during the walks: the test proved nothing"
    );
    assert!(
        on_rmemfs.wrong.is_empty(),
        "{} lasting names were listed other than once in {WALKS} walks of {FILES} entries \
         (name, times listed), first ones: {:?}",
        on_rmemfs.wrong.len(),
        &on_rmemfs.wrong[..on_rmemfs.wrong.len().min(10)]
    );
    fsd.unmount();
}
