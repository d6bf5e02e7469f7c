//! Durable volumes when memnodes fail or their memory goes bad.
//!
//! - `--replicas 2` over three memnodes: one memnode dies while fsd is stopped; fsd
//!   refuses to mount with the same three `--memnode` arguments (the dead one refusing
//!   connections might have held newer metadata), and mounts with `--degraded`: every
//!   file reads back, every block gets its second copy back on the
//!   survivors, and then a second memnode can die with every file still readable.
//! - Damaged metadata: bytes of the superblock, the checkpoint or the log (addresses
//!   from `rmemfs fsck --json`) are overwritten in the memnode's memory through
//!   `/proc/PID/mem`. With one copy, fsd either refuses the volume with a clear error
//!   (naming the volume and what is corrupt) or mounts it showing only files with
//!   exactly their bytes, and not an empty volume in place of one with fsynced files;
//!   the log is damaged twice, after a clean unmount (empty) and after kill -9 (entries
//!   to replay). With two copies on two memnodes, one damaged copy changes nothing a
//!   user sees. Every case runs; the test fails listing each case that failed.

use rmemfs_tests::config::{BLOCK, DEAD_TIME, OP_TIMEOUT};
use rmemfs_tests::fileset::FileSet;
use rmemfs_tests::volume::{self, MetadataCopy};
use rmemfs_tests::{
    heavy_test, procmem, within, FsdMount, MemnodeProc, Pattern, Refusal, StatsFile, MIB,
};
use std::time::{Duration, Instant};

/// How long re-replication of a few MiB may take.
const REREPLICATION_LIMIT: Duration = Duration::from_secs(120);

#[test]
fn memnode_lost_while_fsd_is_down() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("memnode lost while fsd is down");
    let mut nodes: Vec<MemnodeProc> = (0..3).map(|_| MemnodeProc::start("256M")).collect();
    let stats = StatsFile::new();
    let args = [
        "--volume",
        "r2",
        "--replicas",
        "2",
        "--cache",
        "2M",
        "--op-timeout",
        OP_TIMEOUT,
        // The memnodes killed here are lost, not away for a moment: 3 s, not 10 min.
        "--dead-time",
        DEAD_TIME,
        "--stats-file",
        stats.arg(),
    ];
    let mut files = FileSet::new(pattern);
    {
        let refs: Vec<&MemnodeProc> = nodes.iter().collect();
        let fsd = FsdMount::with_memnodes(&refs, &args);
        files.write_mix(fsd.path(), 9, 4 * MIB);
        for i in 0..4 {
            files.write(fsd.path(), &format!("big/{i}"), (2 + i) * MIB + 4321);
        }
        fsd.unmount();
    }
    let data_blocks: u64 = files.files().map(|(_, len)| len.div_ceil(BLOCK)).sum();
    println!(
        "{} files, {} MiB, {data_blocks} blocks written with 2 replicas; killing memnode 1 ({}) \
         while fsd is down",
        files.len(),
        files.bytes() / MIB,
        nodes[1].addr()
    );
    nodes[1].kill();

    let refs: Vec<&MemnodeProc> = nodes.iter().collect();
    // Without --degraded fsd cannot know memnode 1 held no newer metadata: it waits
    // for it, then refuses, naming it.
    let waiting = [&args[..], &["--mount-wait", "1"]].concat();
    let refused = FsdMount::refused(&refs, &waiting);
    assert!(
        refused.stderr.contains(nodes[1].addr()) && refused.stderr.contains("--degraded"),
        "the refusal names the missing memnode and --degraded: {}",
        refused.stderr
    );
    let degraded = [&waiting[..], &["--degraded"]].concat();
    let started = Instant::now();
    let fsd = FsdMount::with_memnodes(&refs, &degraded);
    println!(
        "mounted degraded with memnode 1 dead in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let root = fsd.path().to_path_buf();
    let f = files.clone();
    within(
        Duration::from_secs(120),
        "verifying every file with memnode 1 dead",
        move || f.verify_all(&root, "after a mount with memnode 1 dead"),
    );
    let mut most_lost = 0;
    let s = stats.wait_for(
        REREPLICATION_LIMIT,
        "every block back to two copies on memnodes 0 and 2",
        |s| {
            most_lost = most_lost.max(s.value("blocks_lost"));
            s.value("node1_up") == 0
                && s.value("nodes_down") == 1
                && s.value("blocks") >= data_blocks
                && s.value("blocks_degraded") == 0
                && s.value("node0_blocks") + s.value("node2_blocks") == 2 * s.value("blocks")
        },
    );
    println!("redundancy restored: {s}");
    assert_eq!(
        most_lost, 0,
        "with 2 replicas and one memnode lost no block may be lost; last stats {s}"
    );

    // Nothing of the files in fsd's cache: the reads below go to memnode 2 alone.
    fsd.push_out_of_cache(2 * MIB, BLOCK);
    println!("killing memnode 0 ({}) too", nodes[0].addr());
    nodes[0].kill();
    let root = fsd.path().to_path_buf();
    let f = files.clone();
    within(
        Duration::from_secs(120),
        "verifying every file with memnodes 1 and 0 dead",
        move || f.verify_all(&root, "with only memnode 2 left"),
    );
    fsd.unmount();
}

/// Where `which` region of `copy` is damaged, and how many bytes: a few bytes into the
/// superblock (past its magic number, into its fields), the start of the log (its
/// first entry), the middle of the checkpoint.
fn damage_at(copy: &MetadataCopy, which: &str) -> (u64, usize) {
    let r = copy.region(which).unwrap_or_else(|| {
        panic!(
            "fsck --json gives no {which} (null) for memnode {}: {copy:?}",
            copy.memnode
        )
    });
    assert!(
        r.len > 0 && r.addr != 0,
        "fsck --json gives an empty {which} for memnode {}: {copy:?}",
        copy.memnode
    );
    let off = match which {
        "superblock" if r.len > 64 => 24,
        "log" => 0,
        _ => r.len / 2,
    };
    (r.addr + off, 16.min((r.len - off) as usize))
}

/// Flips bytes of `which` in the copy on `memnode`; returns a description.
fn damage(memnode: &MemnodeProc, copy: &MetadataCopy, which: &str) -> String {
    assert_eq!(
        copy.memnode,
        memnode.addr(),
        "the metadata copy to damage is on another memnode"
    );
    let (addr, len) = damage_at(copy, which);
    let old = procmem::flip(memnode.pid(), addr, len);
    let start = copy.region(which).expect("checked by damage_at").addr;
    format!(
        "{which} of memnode {} ({len} bytes at {addr:#x}, {} into it, were {old:02x?})",
        memnode.addr(),
        addr - start
    )
}

/// The metadata copies fsck reports, one per memnode of `nodes`.
fn metadata(name: &str, nodes: &[&MemnodeProc], crashed: bool) -> Vec<MetadataCopy> {
    let report = if crashed {
        volume::fsck_json_after_crash(name, nodes)
    } else {
        volume::fsck_json(name, nodes)
    };
    println!(
        "fsck {name} --json: {} inodes, {} inconsistencies, {} leaked; metadata {:?}",
        report.inodes, report.inconsistencies, report.leaked_chunks, report.metadata
    );
    assert!(
        report.run.code == 0 && report.inconsistencies == 0 && report.leaked_chunks == 0,
        "fsck of volume {name} ({}) should be clean before any damage; {}",
        if crashed {
            "after kill -9"
        } else {
            "cleanly unmounted"
        },
        report.run.context()
    );
    for n in nodes {
        assert!(
            report.metadata.iter().any(|m| m.memnode == n.addr()),
            "fsck --json lists no metadata on memnode {}: {:?}",
            n.addr(),
            report.metadata
        );
    }
    report.metadata
}

/// A volume `name` on `nodes` holding a typical set of files (each fsynced with its
/// directory), cleanly unmounted, or with `crash` ended by kill -9 (so its log has
/// entries no checkpoint holds yet).
fn volume_with_files(
    name: &str,
    nodes: &[&MemnodeProc],
    args: &[&str],
    p: Pattern,
    crash: bool,
) -> FileSet {
    let fsd = FsdMount::with_memnodes(nodes, args);
    let mut files = FileSet::new(p);
    files.write_mix(fsd.path(), 10, 4 * MIB);
    std::os::unix::fs::symlink("f000", fsd.join("link")).expect("symlink");
    if crash {
        fsd.kill9();
    } else {
        fsd.unmount();
    }
    println!(
        "volume {name}: {} files, {} bytes, then {}",
        files.len(),
        files.bytes(),
        if crash { "kill -9" } else { "a clean unmount" }
    );
    files
}

/// After damage, one copy: fsd refuses with a clear error, or mounts and shows only
/// exact files (and not none of them). Returns what happened.
fn mount_damaged_one_copy(
    name: &str,
    node: &MemnodeProc,
    args: &[&str],
    files: &FileSet,
    what: &str,
) -> String {
    match retry_while_held(|| FsdMount::try_with_memnodes(&[node], args)) {
        Err(refusal) => {
            println!(
                "damaged {what}: fsd refused ({}); stderr:\n{}",
                refusal.status,
                refusal.stderr.trim_end()
            );
            let lower = refusal.stderr.to_lowercase();
            assert!(
                !refusal.status.success() && !refusal.stderr.contains("panicked"),
                "with damaged {what} fsd must refuse with a non-zero exit and no panic; exit \
                 {}, stderr:\n{}",
                refusal.status,
                refusal.stderr
            );
            assert!(
                refusal.stderr.contains(name),
                "fsd's refusal should name the volume {name:?}; stderr:\n{}",
                refusal.stderr
            );
            assert!(
                ["corrupt", "checksum", "crc", "damaged", "invalid", "mismatch", "bad "]
                    .iter()
                    .any(|w| lower.contains(w))
                    && ["superblock", "checkpoint", "log"]
                        .iter()
                        .any(|w| lower.contains(w)),
                "with damaged {what}, fsd's refusal should say what is corrupt (the \
                 superblock, checkpoint or log, and that it fails its checksum / is \
                 corrupt); stderr:\n{}",
                refusal.stderr
            );
            let fsck = volume::fsck_text(name, &[node]);
            println!(
                "fsck of the damaged volume: exit {}\n{}{}",
                fsck.code, fsck.stdout, fsck.stderr
            );
            assert!(
                fsck.code != 0,
                "fsd refused volume {name} as damaged, so fsck must not call it clean; {}",
                fsck.context()
            );
            "refused".to_string()
        }
        Ok(fsd) => {
            let shown = files.verify_shown(fsd.path(), &format!("damaged {what}"), &["link"]);
            println!(
                "damaged {what}: fsd mounted and shows {shown} of {} files, each exact",
                files.len()
            );
            assert!(
                shown > 0,
                "with damaged {what} fsd mounted volume {name} showing none of its {} \
                 fsynced files: an empty volume in place of one it cannot read is silent \
                 data loss; it should refuse with an error instead. fsd stderr:\n{}",
                files.len(),
                fsd.stderr()
            );
            fsd.unmount();
            format!(
                "mounted, {shown} of {} files shown, each exact",
                files.len()
            )
        }
    }
}

/// Runs `mount` again while fsd refuses with `is held by` (after a kill -9 the memnode
/// may hold the volume for the dead fsd a little longer), up to the release limit.
fn retry_while_held(
    mut mount: impl FnMut() -> Result<FsdMount, Refusal>,
) -> Result<FsdMount, Refusal> {
    let deadline = Instant::now() + volume::HOLDER_RELEASE_LIMIT;
    loop {
        match mount() {
            Err(r) if r.stderr.contains("is held by") && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(250));
            }
            other => return other,
        }
    }
}

/// Runs `case`, turning a panic into an `Err` with its message (the panic is printed
/// as usual), so every case runs and the test lists every failure.
fn run_case(name: &str, case: impl FnOnce() -> String) -> Result<String, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(case)).map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic without a message".to_string());
        format!("{name}: {msg}")
    })
}

#[test]
fn corrupted_metadata_is_detected() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("corrupted metadata");
    let mut outcomes = Vec::new();

    // One copy: each region damaged on a volume of its own; the log twice, once after
    // a clean unmount (an empty log) and once after kill -9 (entries to replay).
    let one_copy = [
        ("checkpoint", false),
        ("log", false),
        ("superblock", false),
        ("log", true),
    ];
    for (i, (which, crash)) in one_copy.into_iter().enumerate() {
        let case = format!(
            "R=1, {which} damaged after {}",
            if crash { "kill -9" } else { "a clean unmount" }
        );
        let p = pattern.derive(i as u64);
        outcomes.push(run_case(&case.clone(), move || {
            let node = MemnodeProc::start("128M");
            let name = format!("one-{which}{}", if crash { "-crash" } else { "" });
            let args = ["--volume", name.as_str(), "--cache", "2M"];
            let files = volume_with_files(&name, &[&node], &args, p, crash);
            let copies = metadata(&name, &[&node], crash);
            let what = damage(&node, &copies[0], which);
            println!("{case}: damaged {what}");
            format!(
                "{case}: {}",
                mount_damaged_one_copy(&name, &node, &args, &files, &what)
            )
        }));
    }

    // Two copies on two memnodes: one damaged copy is invisible.
    let two_copies: [(usize, &[&str]); 2] = [
        (0, &["checkpoint"]),
        (1, &["superblock", "checkpoint", "log"]),
    ];
    for (i, (bad, regions)) in two_copies.into_iter().enumerate() {
        let case = format!("R=2, memnode {bad}'s {} damaged", regions.join("+"));
        let p = pattern.derive(10 + i as u64);
        outcomes.push(run_case(&case.clone(), move || {
            let nodes = [MemnodeProc::start("128M"), MemnodeProc::start("128M")];
            let refs = [&nodes[0], &nodes[1]];
            let name = format!("two-{i}");
            let args = [
                "--volume",
                name.as_str(),
                "--cache",
                "2M",
                "--replicas",
                "2",
            ];
            let files = volume_with_files(&name, &refs, &args, p, false);
            let copies = metadata(&name, &refs, false);
            let copy = copies
                .iter()
                .find(|c| c.memnode == nodes[bad].addr())
                .expect("checked by metadata()");
            let damaged: Vec<String> = regions
                .iter()
                .map(|which| damage(&nodes[bad], copy, which))
                .collect();
            println!("{case}: damaged {}", damaged.join("; "));
            let fsd = match FsdMount::try_with_memnodes(&refs, &args) {
                Ok(fsd) => fsd,
                Err(r) => panic!(
                    "with 2 copies and only memnode {bad}'s damaged ({}), fsd must mount \
                     volume {name} from the good copy, but exited {}; stderr:\n{}",
                    damaged.join("; "),
                    r.status,
                    r.stderr
                ),
            };
            files.verify_all(
                fsd.path(),
                &format!(
                    "volume {name} with one damaged copy ({})",
                    damaged.join("; ")
                ),
            );
            fsd.unmount();
            format!("{case}: mounted, every file exact")
        }));
    }
    println!("outcomes:");
    for o in &outcomes {
        match o {
            Ok(s) => println!("  ok: {s}"),
            Err(e) => println!("  FAILED: {}", e.lines().next().unwrap_or("")),
        }
    }
    let failed: Vec<&String> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    assert!(
        failed.is_empty(),
        "{} of {} damaged-metadata cases failed:\n{}",
        failed.len(),
        outcomes.len(),
        failed
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n\n")
    );
}
