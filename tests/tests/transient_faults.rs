//! A blip is not a loss: an fsd whose connections to a memnode are reset, or whose
//! memnode stalls past `--op-timeout`, finds it unreachable, reconnects as the same
//! session and goes on with every copy it had. Nothing is lost, nothing is re-made,
//! and a durable volume's metadata records nothing of it: every file reads back
//! exact on the live mount and after a remount, and fsck finds no lost block.
//!
//! Connection resets go through a fault proxy between fsd and the memnode
//! ([`FaultProxy`], tcp only: it forwards TCP streams); a stall is a SIGSTOP of the
//! memnode for longer than fsd's op timeout, which runs on both fabrics.

use rmemfs_tests::config::OP_TIMEOUT;
use rmemfs_tests::fault_proxy::FaultProxy;
use rmemfs_tests::{heavy_test, volume, within, FsdMount, MemnodeProc, Pattern, StatsFile, MIB};
use std::path::Path;
use std::time::Duration;

/// How long a test waits for anything that should happen in a few seconds.
const LIMIT: Duration = Duration::from_secs(120);
const CACHE: u64 = 16 * MIB;
/// The memnodes keep a cut-off fsd's session this long (far past any fault here).
const GRACE: &[&str] = &["--session-grace", "60"];
const FILE: u64 = 48 * MIB;

/// fsd's arguments for these tests, with `extra` after them.
fn fsd_args<'a>(stats: &'a StatsFile, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "--cache",
        "16M",
        "--op-timeout",
        OP_TIMEOUT,
        "--stats-file",
        stats.arg(),
    ];
    args.extend_from_slice(extra);
    args
}

/// `--memnode ADDR` for each address, then `rest`.
fn with_memnodes<'a>(addrs: &'a [String], rest: &[&'a str]) -> Vec<&'a str> {
    let mut all = Vec::new();
    for a in addrs {
        all.extend(["--memnode", a.as_str()]);
    }
    all.extend_from_slice(rest);
    all
}

/// Writes and syncs the test file, then pushes it out of fsd's cache so that reading
/// it goes to the memnodes.
fn write_file_to_remote(fsd: &FsdMount, pattern: &Pattern) {
    pattern.write_file(&fsd.join("data"), FILE);
    fsd.push_out_of_cache(CACHE, 64 * 1024);
}

/// Reads the whole file back (around the kernel's cache), bounded in time.
fn verify_within(path: &Path, pattern: &Pattern, what: &str) {
    let (path, pattern) = (path.to_path_buf(), *pattern);
    within(LIMIT, what, move || pattern.verify_file(&path, FILE));
}

/// Asserts fsd saw the memnode(s) unreachable and resumed, and lost nothing.
fn assert_resumed_losing_nothing(stats: &StatsFile, fsd: &FsdMount, what: &str) {
    assert_resumed_remaking_at_most(stats, fsd, what, 0);
}

/// As [`assert_resumed_losing_nothing`], with up to `remade` blocks re-replicated:
/// a block written while one of its memnodes was away drops the stale copy there
/// and rightly gets a new one; what was not written meanwhile must not be re-made.
fn assert_resumed_remaking_at_most(stats: &StatsFile, fsd: &FsdMount, what: &str, remade: u64) {
    let s = stats.wait_for(LIMIT, "every memnode back up", |s| {
        s.value("nodes_down") == 0 && s.value("memnode_sessions_resumed") >= 1
    });
    println!("{what}: stats {s}");
    assert!(
        s.value("memnode_unreachable_events") >= 1,
        "{what}: fsd should have seen a memnode unreachable; stats {s}"
    );
    assert_eq!(
        s.value("memnode_losses"),
        0,
        "{what}: no memnode's copies may count as lost; stats {s}"
    );
    assert_eq!(s.value("blocks_lost"), 0, "{what}: stats {s}");
    assert!(
        s.value("rereplicated_blocks") <= remade,
        "{what}: a blip must re-make no more than the {remade} blocks written meanwhile; stats {s}"
    );
    let stderr = fsd.stderr();
    assert!(
        !stderr.contains("are lost"),
        "{what}: fsd must not log a loss; stderr:\n{stderr}"
    );
}

#[test]
fn scratch_memory_survives_a_reset_of_every_connection() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("scratch reset");
    let memnode = MemnodeProc::start_on(rmemfs_tests::Transport::Tcp, "256M", GRACE);
    let proxy = FaultProxy::start(memnode.addr());
    let stats = StatsFile::new();
    let addrs = [proxy.addr()];
    let args = with_memnodes(&addrs, &fsd_args(&stats, &[]));
    let fsd = FsdMount::start_on(rmemfs_tests::Transport::Tcp, &args);
    write_file_to_remote(&fsd, &pattern);
    let used = memnode.stats().used;
    assert!(
        used >= FILE,
        "the file lives on the memnode ({used} bytes used)"
    );

    let reset = proxy.reset_all();
    println!("reset {reset} connections between fsd and the memnode");
    assert!(reset > 0, "fsd had connections open through the proxy");
    verify_within(
        &fsd.join("data"),
        &pattern,
        "reading the file after the reset",
    );
    assert_resumed_losing_nothing(&stats, &fsd, "after a reset");
    assert_eq!(
        memnode.stats().used,
        used,
        "the memnode still holds the same memory for fsd: nothing reclaimed, nothing re-made"
    );

    // A writer that runs across more resets loses nothing it was told was written.
    let other = pattern.derive(1);
    let path = fsd.join("written-across-resets");
    let writer = {
        let (other, path) = (other, path.clone());
        std::thread::spawn(move || other.write_file(&path, FILE))
    };
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(300));
        proxy.reset_all();
    }
    within(LIMIT, "the writer across resets", move || writer.join())
        .expect("the writer across resets must finish without an error");
    fsd.push_out_of_cache(CACHE, 64 * 1024);
    let p = path.clone();
    within(
        LIMIT,
        "verifying the file written across resets",
        move || other.verify_file(&p, FILE),
    );
    verify_within(&fsd.join("data"), &pattern, "the first file again");
    fsd.unmount();
    // A clean unmount ends the session: the memnode gives the memory back at once,
    // not after its grace period.
    rmemfs_tests::poll_until(Duration::from_secs(10), || {
        (memnode.stats().used == 0).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "after a clean unmount the memnode should reclaim fsd's memory at once, \
             but {} bytes are still used",
            memnode.stats().used
        )
    });
}

/// What a test of `replicas` copies on scratch memory or a volume is called, and
/// the fsd arguments that make it.
fn layout(volume: bool, replicas: &str) -> (String, Vec<&str>) {
    let name = format!("{} R={replicas}", if volume { "volume" } else { "scratch" });
    let mut args = vec!["--replicas", replicas];
    if volume {
        args.extend(["--volume", "v"]);
    }
    (name, args)
}

/// Every memnode stopped (SIGSTOP) for longer than fsd's op timeout, then continued:
/// a reader meanwhile waits (a hard mount) rather than failing, and gets every byte
/// once they continue; nothing is lost or re-made, and a volume reads back after a
/// remount with fsck clean. Both fabrics.
fn stalled_memnodes_are_waited_for_and_resumed(volume: bool, replicas: usize) {
    let _serial = heavy_test();
    let r = replicas.to_string();
    let (name, extra) = layout(volume, &r);
    let what = format!("{name} stalled");
    let pattern = Pattern::for_test(&what);
    let memnodes: Vec<MemnodeProc> = (0..replicas)
        .map(|_| MemnodeProc::start_with("256M", GRACE))
        .collect();
    let refs: Vec<&MemnodeProc> = memnodes.iter().collect();
    let stats = StatsFile::new();
    let fsd = FsdMount::with_memnodes(&refs, &fsd_args(&stats, &extra));
    write_file_to_remote(&fsd, &pattern);
    for m in &memnodes {
        m.freeze();
    }
    let reader = {
        let (path, pattern) = (fsd.join("data"), pattern);
        std::thread::spawn(move || pattern.verify_file(&path, FILE))
    };
    std::thread::sleep(Duration::from_secs(6));
    let s = stats.current();
    println!("while stopped: {s}");
    for m in &memnodes {
        m.thaw();
    }
    within(LIMIT, "the reader across the stall", move || reader.join())
        .expect("the reader across the stall must get every byte");
    assert!(
        s.value("nodes_down") as usize == replicas,
        "{what}: memnodes stopped past --op-timeout {OP_TIMEOUT} count as unreachable; stats {s}"
    );
    assert_resumed_losing_nothing(&stats, &fsd, &what);
    verify_within(
        &fsd.join("data"),
        &pattern,
        "reading the file after the stall",
    );
    fsd.unmount();
    if !volume {
        return;
    }
    let counts = volume::assert_fsck_clean("v", &refs, &what);
    assert_eq!(counts.lost_blocks, 0, "{what}: {counts:?}");
    let stats = StatsFile::new();
    let fsd = FsdMount::with_memnodes(&refs, &fsd_args(&stats, &extra));
    verify_within(&fsd.join("data"), &pattern, "reading after the remount");
    fsd.unmount();
}

#[test]
fn a_memnode_stalled_past_the_op_timeout_is_waited_for_and_resumed() {
    stalled_memnodes_are_waited_for_and_resumed(false, 1);
}

#[test]
fn a_volume_whose_memnode_stalled_past_the_op_timeout_is_waited_for_and_resumed() {
    stalled_memnodes_are_waited_for_and_resumed(true, 1);
}

#[test]
fn a_volume_whose_two_memnodes_stalled_past_the_op_timeout_is_waited_for_and_resumed() {
    stalled_memnodes_are_waited_for_and_resumed(true, 2);
}

/// A volume with `replicas` copies over one memnode per copy, each behind a proxy:
/// every connection reset at once (a flap of fsd's own network), then the file is
/// read back on the live mount and after a remount, and fsck finds nothing lost.
fn volume_survives_a_reset_of_every_connection(replicas: usize) {
    let _serial = heavy_test();
    let pattern = Pattern::for_test(&format!("volume reset R={replicas}"));
    let memnodes: Vec<MemnodeProc> = (0..replicas)
        .map(|_| MemnodeProc::start_on(rmemfs_tests::Transport::Tcp, "512M", GRACE))
        .collect();
    let proxies: Vec<FaultProxy> = memnodes
        .iter()
        .map(|m| FaultProxy::start(m.addr()))
        .collect();
    let addrs: Vec<String> = proxies.iter().map(FaultProxy::addr).collect();
    let r = replicas.to_string();
    let stats = StatsFile::new();
    let args = with_memnodes(
        &addrs,
        &fsd_args(&stats, &["--volume", "v", "--replicas", &r]),
    );
    let fsd = FsdMount::start_on(rmemfs_tests::Transport::Tcp, &args);
    write_file_to_remote(&fsd, &pattern);
    let reset: usize = proxies.iter().map(FaultProxy::reset_all).sum();
    println!("reset {reset} connections");
    verify_within(&fsd.join("data"), &pattern, "reading on the live mount");
    assert_resumed_losing_nothing(&stats, &fsd, "volume after a reset");
    // A file made after the reset is durable too (the log goes on).
    pattern.derive(2).write_file(&fsd.join("after"), MIB);
    fsd.unmount();

    let refs: Vec<&MemnodeProc> = memnodes.iter().collect();
    let counts = volume::assert_fsck_clean("v", &refs, "after the reset and an unmount");
    assert_eq!(
        counts.lost_blocks, 0,
        "no block of the volume may be lost to a reset: {counts:?}"
    );
    let stats = StatsFile::new();
    let fsd = FsdMount::with_memnodes(
        &refs,
        &fsd_args(&stats, &["--volume", "v", "--replicas", &r]),
    );
    verify_within(&fsd.join("data"), &pattern, "reading after the remount");
    pattern.derive(2).verify_file(&fsd.join("after"), MIB);
    fsd.unmount();
}

#[test]
fn a_volume_with_one_copy_survives_a_reset_of_every_connection() {
    volume_survives_a_reset_of_every_connection(1);
}

#[test]
fn a_volume_with_two_copies_survives_a_reset_of_every_connection() {
    volume_survives_a_reset_of_every_connection(2);
}

/// Where the tests keep memnodes' memory files: tmpfs (`/dev/shm`) where there is
/// one, as a user would; a directory of its own, removed on drop.
struct MemoryFiles(std::path::PathBuf);

impl MemoryFiles {
    fn new(test: &str) -> MemoryFiles {
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!("rmemfs-memory-files-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a directory for the memory files");
        MemoryFiles(dir)
    }

    fn path(&self, i: usize) -> String {
        self.0.join(format!("memnode{i}")).display().to_string()
    }
}

impl Drop for MemoryFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Memnodes on memory files, killed (SIGKILL: a crash of the process) while fsd
/// uses them and started again on their files at their addresses: fsd finds each
/// unreachable, then the same instance with every chunk under new rkeys, and goes
/// on. A writer runs across the restart; nothing is lost or re-made, every file
/// reads back exact on the live mount, and a volume's after a remount, with fsck
/// clean. Both fabrics: over verbs every rkey really changes.
fn memnodes_restarted_on_their_memory_files_lose_nothing(volume: bool, replicas: usize) {
    let _serial = heavy_test();
    let r = replicas.to_string();
    let (name, extra) = layout(volume, &r);
    let what = format!("{name} restarted on memory files");
    let pattern = Pattern::for_test(&what);
    let files = MemoryFiles::new(&format!("{volume}-{replicas}"));
    let args_of = |i: usize| -> Vec<String> {
        vec![
            "--memory-file".into(),
            files.path(i),
            GRACE[0].into(),
            GRACE[1].into(),
        ]
    };
    let mut memnodes: Vec<MemnodeProc> = (0..replicas)
        .map(|i| {
            let a = args_of(i);
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            MemnodeProc::start_with("256M", &a)
        })
        .collect();
    let stats = StatsFile::new();
    let refs: Vec<&MemnodeProc> = memnodes.iter().collect();
    let fsd = FsdMount::with_memnodes(&refs, &fsd_args(&stats, &extra));
    write_file_to_remote(&fsd, &pattern);
    let used: Vec<u64> = memnodes.iter().map(|m| m.stats().used).collect();

    // The writer is a process of its own (dd): a file of this process open on the
    // mount would be flushed when the new memnode's exec closes it, which waits for
    // the memnode being started (a harness deadlock, not fsd's).
    let other = pattern.derive(1);
    let source = files.0.join("source");
    other.write_file(&source, FILE);
    let path = fsd.join("written-across-the-restart");
    let mut writer = std::process::Command::new("dd")
        .arg(format!("if={}", source.display()))
        .arg(format!("of={}", path.display()))
        .args(["bs=1M", "conv=fsync"])
        .spawn()
        .expect("dd starts");
    std::thread::sleep(Duration::from_millis(300));
    // One at a time, as a rolling upgrade goes.
    for (i, m) in memnodes.iter_mut().enumerate() {
        let addr = m.addr().to_string();
        m.kill();
        let a = args_of(i);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        *m = MemnodeProc::start_at_with(&addr, "256M", &a);
    }
    for (m, before) in memnodes.iter().zip(&used) {
        assert!(
            m.stats().used >= *before,
            "{what}: the restarted memnode holds what it held ({} bytes used, {before} before)",
            m.stats().used
        );
    }
    let status = within(LIMIT, "the writer across the restart", move || {
        writer.wait()
    })
    .expect("waiting for dd");
    assert!(
        status.success(),
        "{what}: the writer across the restart must finish without an error: {status}"
    );
    verify_within(&fsd.join("data"), &pattern, "reading after the restart");
    fsd.push_out_of_cache(CACHE, 64 * 1024);
    let p = path.clone();
    within(
        LIMIT,
        "verifying the file written across the restart",
        move || other.verify_file(&p, FILE),
    );
    // With R = 2, the writer's blocks written while one memnode was away drop the
    // stale copy there and are re-made: at most the writer's file, never the file
    // written before.
    let remade = if replicas > 1 {
        FILE / stats.current().value("block_size").max(1)
    } else {
        0
    };
    assert_resumed_remaking_at_most(&stats, &fsd, &what, remade);
    let said = fsd.stderr();
    assert!(
        said.contains("restarted on its memory file"),
        "{what}: fsd should say the memnode restarted on its memory file; stderr:\n{said}"
    );
    if !volume {
        fsd.unmount();
        return;
    }
    pattern.derive(2).write_file(&fsd.join("after"), MIB);
    fsd.unmount();
    let refs: Vec<&MemnodeProc> = memnodes.iter().collect();
    let counts = volume::assert_fsck_clean("v", &refs, &what);
    assert_eq!(counts.lost_blocks, 0, "{what}: {counts:?}");
    let stats = StatsFile::new();
    let fsd = FsdMount::with_memnodes(&refs, &fsd_args(&stats, &extra));
    verify_within(&fsd.join("data"), &pattern, "reading after the remount");
    other.verify_file(&fsd.join("written-across-the-restart"), FILE);
    pattern.derive(2).verify_file(&fsd.join("after"), MIB);
    fsd.unmount();
}

#[test]
fn scratch_memory_survives_a_memnode_restarted_on_its_memory_file() {
    memnodes_restarted_on_their_memory_files_lose_nothing(false, 1);
}

#[test]
fn a_volume_with_one_copy_survives_a_memnode_restarted_on_its_memory_file() {
    memnodes_restarted_on_their_memory_files_lose_nothing(true, 1);
}

#[test]
fn a_volume_with_two_copies_survives_its_memnodes_restarted_on_their_memory_files() {
    memnodes_restarted_on_their_memory_files_lose_nothing(true, 2);
}

/// An operator who knows a memnode will not come back says so: `rmemfs status` showed
/// it UNREACHABLE with its copies kept; `rmemfs declare-lost` makes them lost at once
/// (a read of data only it held fails with EIO instead of waiting for the dead time),
/// and status shows it DOWN. tcp only: a stopped memnode stalls its data path only
/// when its process serves it.
#[test]
fn an_operator_declares_an_unreachable_memnode_lost() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("declare lost");
    let memnode = MemnodeProc::start_on(rmemfs_tests::Transport::Tcp, "256M", GRACE);
    let stats = StatsFile::new();
    let fsd = FsdMount::with_memnode(&memnode, &fsd_args(&stats, &[]));
    write_file_to_remote(&fsd, &pattern);
    memnode.freeze();
    stats.wait_for(LIMIT, "the memnode unreachable", |s| {
        s.value("nodes_down") == 1
    });
    // The status file is rewritten once a second: wait for one written since.
    let shows = |what: &str, want: &dyn Fn(&str) -> bool| {
        let mut last = String::new();
        rmemfs_tests::poll_until(LIMIT, || {
            last = rmemfs_tests::status::run(fsd.path(), false).stdout;
            want(&last).then_some(())
        })
        .unwrap_or_else(|| panic!("rmemfs status should show {what}; it says:\n{last}"));
        println!("status:\n{last}");
    };
    shows("the memnode unreachable with its copies kept", &|t| {
        t.contains("UNREACHABLE") && t.contains("copies are kept")
    });
    let mut cmd = std::process::Command::new(rmemfs_tests::binaries::binary("rmemfs"));
    cmd.arg("declare-lost").arg(fsd.path()).arg(memnode.addr());
    let out = rmemfs_tests::command::run_within(&mut cmd, LIMIT, "rmemfs declare-lost");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("rmemfs declare-lost: {:?}: {said}", out.status);
    assert!(
        out.status.success() && said.contains("declared lost"),
        "declare-lost should succeed; stdout {said}, stderr {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = fsd.join("data");
    let read = within(LIMIT, "reading a lost block", move || {
        rmemfs_tests::UncachedReader::open(&path).and_then(|mut r| r.read_at(0, 4096))
    });
    assert_eq!(
        read.map(|_| ()).map_err(|e| e.raw_os_error()),
        Err(Some(libc::EIO)),
        "data only the lost memnode held reads as EIO"
    );
    shows("the memnode down once lost", &|t| {
        t.contains("DOWN") && !t.contains("UNREACHABLE")
    });
    let s = stats.current();
    assert_eq!(s.value("memnode_losses"), 1, "stats {s}");
    memnode.thaw();
    fsd.unmount();
}

/// Mounting must not roll a volume back. R=2 over two memnodes: memnode 1 is
/// stopped (SIGSTOP, past `--op-timeout`) while a file is written, so the newest
/// metadata is on memnode 0 alone. With memnode 0 stopped, fsd waits for it and
/// refuses to mount the older generation memnode 1 holds, naming memnode 0 and
/// `--degraded`; once it continues the volume mounts with everything. Then the same
/// again, mounted `--degraded` by an operator who gives up memnode 0's newer
/// history: the files of the older one read back, and when memnode 0 returns its
/// newer history does not come back mixed in: the volume goes on as the degraded
/// mount left it. Last, a memnode that was away is caught up while the volume is
/// mounted (no unmount in between): after fsd dies, it alone holds every file
/// committed, also those committed while it was stopped. A stopped memnode is away
/// on both fabrics (this runs over verbs in the Soft-RoCE VM).
#[test]
fn a_volume_is_not_rolled_back_while_the_memnode_with_its_newest_metadata_is_away() {
    let _serial = heavy_test();
    let pattern = Pattern::for_test("newest metadata away");
    let file = |n: u64| (format!("file{n}"), pattern.derive(n));
    // A short lease: a volume hold left by an fsd cut off from a memnode ends soon.
    let memnodes: Vec<MemnodeProc> = (0..2)
        .map(|_| MemnodeProc::start_with("512M", &[GRACE, &["--lease-secs", "2"]].concat()))
        .collect();
    let refs: Vec<&MemnodeProc> = memnodes.iter().collect();
    let stats = StatsFile::new();
    let args = fsd_args(
        &stats,
        &["--volume", "v", "--replicas", "2", "--mount-wait", "1"],
    );
    let degraded = [&args[..], &["--degraded"]].concat();
    let write = |fsd: &FsdMount, n: u64| {
        let (name, p) = file(n);
        p.write_file(&fsd.join(name), 4 * MIB);
    };
    let expect = |fsd: &FsdMount, present: &[u64], absent: &[u64], when: &str| {
        for &n in present {
            let (name, p) = file(n);
            let path = fsd.join(&name);
            within(LIMIT, &format!("{name} {when}"), move || {
                p.verify_file(&path, 4 * MIB)
            });
        }
        for &n in absent {
            let (name, _) = file(n);
            assert!(!fsd.join(&name).exists(), "{name} must not exist {when}");
        }
    };
    // Memnode 1 stopped while file n is written and the volume unmounted: the newest
    // metadata is on memnode 0.
    let write_with_memnode_1_away = |fsd: FsdMount, n: u64| {
        memnodes[1].freeze();
        stats.wait_for(LIMIT, "memnode 1 unreachable", |s| {
            s.value("nodes_down") == 1
        });
        write(&fsd, n);
        fsd.unmount();
        memnodes[1].thaw();
    };

    let fsd = FsdMount::with_memnodes(&refs, &args);
    write(&fsd, 1);
    write_with_memnode_1_away(fsd, 2);

    memnodes[0].freeze();
    let refused = FsdMount::refused(&refs, &args);
    // fsck says so too: what it checked may not be the newest.
    let fsck = volume::fsck_text("v", &refs);
    memnodes[0].thaw();
    println!("fsck with memnode 0 away: {}", fsck.context());
    assert!(
        fsck.code == 1 && fsck.stdout.contains("incomplete:"),
        "fsck with a memnode of the volume away says its check is incomplete (exit 1)"
    );
    println!(
        "with memnode 0 away: {:?}\n{}",
        refused.status, refused.stderr
    );
    assert!(
        refused.stderr.contains(memnodes[0].addr()) && refused.stderr.contains("--degraded"),
        "the refusal names the missing memnode and --degraded: {}",
        refused.stderr
    );
    let fsd = FsdMount::with_memnodes(&refs, &args);
    expect(&fsd, &[1, 2], &[], "once memnode 0 is back");
    // File 2 gets its second copy on memnode 1 before the next fault.
    stats.wait_for(LIMIT, "every block with two copies", |s| {
        // (A count made: the stats start at zero.)
        s.value("blocks") == 2 * 64
            && s.value("blocks_degraded") == 0
            && s.value("node0_blocks") + s.value("node1_blocks") == 2 * s.value("blocks")
    });
    // An fsync commits the new copies to the volume's metadata on both memnodes.
    std::fs::File::open(fsd.join("file1"))
        .and_then(|f| f.sync_all())
        .expect("fsync commits");
    write_with_memnode_1_away(fsd, 3);

    memnodes[0].freeze();
    let fsd = FsdMount::with_memnodes(&refs, &degraded);
    for line in fsd.stderr().lines().filter(|l| l.contains("volume v")) {
        println!("degraded mount: {line}");
    }
    assert!(
        fsd.stderr().contains("mounting degraded"),
        "a degraded mount says so: {}",
        fsd.stderr()
    );
    expect(&fsd, &[1, 2], &[3], "on the degraded mount");
    write(&fsd, 4);
    fsd.unmount();
    memnodes[0].thaw();

    let fsd = FsdMount::with_memnodes(&refs, &args);
    expect(
        &fsd,
        &[1, 2, 4],
        &[3],
        "after memnode 0 came back with the history the degraded mount gave up",
    );
    // A memnode that was away is caught up once it is back, without an unmount:
    // file 5 is committed while memnode 1 is stopped, file 6 after it continued;
    // then fsd dies and memnode 0 is stopped, and memnode 1's metadata has both.
    memnodes[1].freeze();
    stats.wait_for(LIMIT, "memnode 1 unreachable", |s| {
        s.value("nodes_down") == 1
    });
    write(&fsd, 5);
    memnodes[1].thaw();
    stats.wait_for(LIMIT, "memnode 1 back, file 5 with its second copy", |s| {
        s.value("nodes_down") == 0 && s.value("blocks") == 4 * 64 && s.value("blocks_degraded") == 0
    });
    write(&fsd, 6);
    fsd.kill9();
    memnodes[0].freeze();
    let fsd = volume::remount_after_crash(&refs, &degraded);
    expect(
        &fsd,
        &[1, 2, 4, 5, 6],
        &[3],
        "from memnode 1 alone after it was caught up",
    );
    fsd.unmount();
    memnodes[0].thaw();
    // Memnode 0's chunks of the history given up are referenced by nothing: the next
    // mount with it gives them back.
    let fsd = FsdMount::with_memnodes(&refs, &args);
    expect(&fsd, &[1, 2, 4, 5, 6], &[3], "with both memnodes again");
    fsd.unmount();
    // Over verbs a memnode was seen to still hold the volume for a moment after the
    // unmount (busy for 0.4 s, once): fsck waits for the hold to go.
    let counts = volume::assert_fsck_clean_once_released("v", &refs, "after the degraded mounts");
    assert_eq!(counts.lost_blocks, 0, "{counts:?}");
}

/// fio writes a file at random offsets and reads every block back against its
/// crc32c in one job, while fsd's connections to its memnode are reset and then the
/// network black-holed past `--op-timeout`: the job completes with no error and no
/// wrong data (a hard mount: programs wait out the fault, nothing fails).
/// Runs a `fio --verify` job of random 64 KiB direct writes on `fsd` (about 4 s of
/// writes, then about 4 s of verifying reads) while `fault` runs, and asserts it
/// completes with no error and no wrong data.
fn fio_verify_across(fsd: &FsdMount, what: &str, fault: impl FnOnce()) {
    let mut cmd = std::process::Command::new(rmemfs_tests::binaries::program("fio", "fio"));
    cmd.args([
        "--name=faults",
        "--ioengine=psync",
        "--bs=64k",
        "--size=128M",
        "--rw=randwrite",
        "--verify=crc32c",
        "--do_verify=1",
        "--direct=1",
        // The faults land in the writes, their copies are read back after.
        "--rate=32m,32m",
    ])
    .arg(format!("--filename={}", fsd.join("fio").display()));
    let label = format!("fio verify across {what}");
    let fio =
        std::thread::spawn(move || rmemfs_tests::command::run_within(&mut cmd, LIMIT, &label));
    fault();
    let out = fio.join().expect("fio's thread");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    println!("fio: {:?}\n{stdout}\n{stderr}", out.status);
    assert!(
        out.status.success() && stdout.contains("err= 0") && !stderr.contains("verify"),
        "fio's verify job must complete with no error across {what}"
    );
}

#[test]
fn a_fio_verify_job_runs_across_a_reset_and_a_network_stall() {
    let _serial = heavy_test();
    let memnode = MemnodeProc::start_on(rmemfs_tests::Transport::Tcp, "512M", GRACE);
    let proxy = FaultProxy::start(memnode.addr());
    let addrs = [proxy.addr()];
    let stats = StatsFile::new();
    let args = with_memnodes(&addrs, &fsd_args(&stats, &[]));
    let fsd = FsdMount::start_on(rmemfs_tests::Transport::Tcp, &args);
    fio_verify_across(&fsd, "a reset and a network stall", || {
        std::thread::sleep(Duration::from_secs(1));
        println!("reset {} connections", proxy.reset_all());
        std::thread::sleep(Duration::from_secs(1));
        proxy.blackhole();
        std::thread::sleep(Duration::from_secs(4));
        proxy.restore();
    });
    assert_resumed_losing_nothing(&stats, &fsd, "after fio across the faults");
    fsd.unmount();
}

/// fio's verify job across a memnode killed and started again on its memory file
/// (both fabrics: the guest image carries fio).
#[test]
fn a_fio_verify_job_runs_across_a_memnode_restarted_on_its_memory_file() {
    let _serial = heavy_test();
    let files = MemoryFiles::new("fio");
    let file = files.path(0);
    let extra = ["--memory-file", file.as_str(), GRACE[0], GRACE[1]];
    let mut memnode = MemnodeProc::start_with("512M", &extra);
    let stats = StatsFile::new();
    let fsd = FsdMount::with_memnode(&memnode, &fsd_args(&stats, &[]));
    fio_verify_across(&fsd, "a memnode restart", || {
        std::thread::sleep(Duration::from_secs(2));
        let addr = memnode.addr().to_string();
        memnode.kill();
        memnode = MemnodeProc::start_at_with(&addr, "512M", &extra);
    });
    assert_resumed_losing_nothing(&stats, &fsd, "after fio across a memnode restart");
    fsd.unmount();
}
