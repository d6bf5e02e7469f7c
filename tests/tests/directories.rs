//! Large and deep namespaces through a real mount: a directory of 100,000 entries
//! lists each exactly once (also while half of them are being removed) and quickly
//! enough for `ls -l`; names of 255 bytes work and 256 is ENAMETOOLONG; a tree 1,000
//! directories deep is made, walked and removed.

use rmemfs_tests::{assert_errno, dir_names, heavy_test, within, FsdMount, MemnodeProc};
use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

fn mount() -> (FsdMount, MemnodeProc) {
    let memnode = MemnodeProc::start("64M");
    let fsd = FsdMount::with_memnode(&memnode, &["--cache", "2M"]);
    (fsd, memnode)
}

const ENTRIES: usize = 100_000;

fn name(i: usize) -> String {
    format!("entry-{i:06}")
}

#[test]
fn a_directory_of_100000_entries_lists_each_once_and_quickly() {
    let _serial = heavy_test();
    let (fsd, _memnode) = mount();
    let dir = fsd.join("big");
    fs::create_dir(&dir).expect("mkdir big");
    let d = dir.clone();
    within(
        Duration::from_secs(300),
        "creating 100,000 files",
        move || {
            for i in 0..ENTRIES {
                fs::File::create(d.join(name(i)))
                    .unwrap_or_else(|e| panic!("create {}: {e}", name(i)));
            }
        },
    );
    let expected: BTreeSet<String> = (0..ENTRIES).map(name).collect();

    // Each entry once: read_dir yields a Vec, so a repeat would survive into the count.
    let start = Instant::now();
    let listed: Vec<String> = fs::read_dir(&dir)
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    let took = start.elapsed();
    println!("readdir of {ENTRIES} entries: {took:?}");
    assert_eq!(listed.len(), ENTRIES, "entries listed (repeats included)");
    assert_eq!(
        listed.into_iter().collect::<BTreeSet<_>>(),
        expected,
        "the names listed"
    );

    // `ls -l`: a readdir and a stat of every entry.
    let start = Instant::now();
    let out = within(Duration::from_secs(120), "ls -l of 100,000 entries", {
        let dir = dir.clone();
        move || Command::new("ls").arg("-l").arg(&dir).output()
    })
    .expect("running ls");
    let took = start.elapsed();
    println!("ls -l of {ENTRIES} entries: {took:?}");
    assert!(out.status.success(), "ls -l failed: {out:?}");
    let lines = out
        .stdout
        .split(|&b| b == b'\n')
        .filter(|l| l.starts_with(b"-"))
        .count();
    assert_eq!(lines, ENTRIES, "ls -l shows every file");
    assert!(
        took < Duration::from_secs(60),
        "ls -l of {ENTRIES} entries took {took:?}: expected well under a minute"
    );

    // A listing that runs while every other entry is removed still returns each
    // survivor exactly once and nothing twice.
    let mut seen = BTreeSet::new();
    let mut repeats = Vec::new();
    for (n, entry) in fs::read_dir(&dir).expect("readdir").enumerate() {
        let entry = entry.expect("entry");
        let s = entry.file_name().to_string_lossy().into_owned();
        if !seen.insert(s.clone()) {
            repeats.push(s);
        }
        if n % 1000 == 0 {
            for i in (n..(n + 2000).min(ENTRIES)).step_by(2) {
                let _ = fs::remove_file(dir.join(name(i)));
            }
        }
    }
    assert!(
        repeats.is_empty(),
        "entries listed twice: {:?}",
        &repeats[..repeats.len().min(10)]
    );
    let survivors: BTreeSet<String> = (1..ENTRIES).step_by(2).map(name).collect();
    assert!(
        survivors.is_subset(&seen),
        "{} entries that were never removed are missing from the listing",
        survivors.difference(&seen).count()
    );
    for i in (0..ENTRIES).step_by(2) {
        let _ = fs::remove_file(dir.join(name(i)));
    }
    assert_eq!(
        dir_names(&dir),
        survivors,
        "after removing the even entries"
    );
}

#[test]
fn names_of_255_bytes_work_and_256_is_enametoolong() {
    let (fsd, _memnode) = mount();
    let long = "n".repeat(255);
    let too_long = "n".repeat(256);
    fs::write(fsd.join(&long), b"x").expect("create a 255-byte name");
    fs::create_dir(fsd.join(format!("d{}", &long[1..]))).expect("mkdir a 255-byte name");
    assert_eq!(fs::read(fsd.join(&long)).expect("read"), b"x");
    assert!(dir_names(fsd.path()).contains(&long), "listed");
    // A multi-byte UTF-8 name of 255 bytes (85 three-byte characters).
    let wide = "\u{20ac}".repeat(85);
    assert_eq!(wide.len(), 255);
    fs::write(fsd.join(&wide), b"y").expect("create a 255-byte UTF-8 name");
    assert_errno(
        fs::write(fsd.join(&too_long), b"x"),
        libc::ENAMETOOLONG,
        "create with a 256-byte name",
    );
    assert_errno(
        fs::create_dir(fsd.join(&too_long)),
        libc::ENAMETOOLONG,
        "mkdir with a 256-byte name",
    );
    assert_errno(
        fs::metadata(fsd.join(&too_long)),
        libc::ENAMETOOLONG,
        "stat with a 256-byte name",
    );
    assert_errno(
        fs::rename(fsd.join(&long), fsd.join(&too_long)),
        libc::ENAMETOOLONG,
        "rename to a 256-byte name",
    );
}

#[test]
fn a_tree_1000_directories_deep_is_made_walked_and_removed() {
    let (fsd, _memnode) = mount();
    const DEPTH: usize = 1000;
    let mut path: PathBuf = fsd.join("deep");
    fs::create_dir(&path).expect("mkdir deep");
    for _ in 0..DEPTH {
        path.push("d");
        fs::create_dir(&path)
            .unwrap_or_else(|e| panic!("mkdir at {} bytes: {e}", path.as_os_str().len()));
    }
    fs::write(path.join("leaf"), b"bottom").expect("a file at the bottom");
    assert_eq!(
        fs::read(path.join("leaf")).expect("read the leaf"),
        b"bottom"
    );
    let found = Command::new("find")
        .arg(fsd.join("deep"))
        .arg("-name")
        .arg("leaf")
        .output()
        .expect("running find");
    assert!(found.status.success(), "find failed: {found:?}");
    assert_eq!(
        String::from_utf8_lossy(&found.stdout).trim(),
        path.join("leaf").to_string_lossy(),
        "find walks down to the leaf"
    );
    assert_eq!(
        fs::metadata(fsd.join("deep")).expect("stat").nlink(),
        3,
        "deep holds one subdirectory"
    );
    fs::remove_dir_all(fsd.join("deep")).expect("rm -r of the deep tree");
    assert!(dir_names(fsd.path()).is_empty(), "the tree is gone");
}
