//! Swap on rmemfs, the way docs/swap.md sets it up: a memnode started with
//! `--lock-memory`, an fsd with `--for-swap`, and `scripts/swap on` (a file on the
//! mount behind a direct-I/O loop device, mkswap, swapon). A process in a memory
//! cgroup whose limit is far below what it uses then swaps hundreds of MiB to
//! remote memory, and must read back every page exactly as it wrote it: once on a
//! machine with memory to spare, once with a hog holding all but a sliver of the
//! machine's memory, where the daemons serving swap must not need the reclaim they
//! serve (the test fails, rather than hangs, if they do). Needs root.

use rmemfs_tests::swap::{meminfo_bytes, pswpout_bytes, Hog, MemCgroup, SwapDevice};
use rmemfs_tests::{command::run_within, heavy_test, FsdMount, MemnodeProc, StatsFile, MIB};
use std::path::Path;
use std::time::Duration;

/// What the workload maps and writes, and its cgroup's limit: it must swap out most
/// of it.
const WORKLOAD_MIB: u64 = 400;
const CGROUP_LIMIT: u64 = 128 * MIB;
/// What must at least go to swap (and so to the memnode).
const SWAPPED_AT_LEAST: u64 = 200 * MIB;
/// How long the workload may take: swapping 400 MiB out and in twice over tcp on
/// loopback takes about 15 s on the development machine.
const WORKLOAD_LIMIT: Duration = Duration::from_secs(300);

fn memtouch() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_memtouch"))
}

/// A memnode and fsd set up to serve swap, and the swap device on the mount.
struct SwapSetup {
    // Dropped in this order: swap off before the mount goes, the mount before its
    // memnode.
    swap: SwapDevice,
    fsd: FsdMount,
    _memnode: MemnodeProc,
    stats: StatsFile,
}

impl SwapSetup {
    fn new() -> SwapSetup {
        let memnode = MemnodeProc::start_with("640M", &["--lock-memory"]);
        let stats = StatsFile::new();
        let fsd = FsdMount::with_memnode(
            &memnode,
            &["--for-swap", "--cache", "64M", "--stats-file", stats.arg()],
        );
        let swap = SwapDevice::on(fsd.path(), "512M");
        // The swap file's memory is reserved on the memnode up front (fallocate).
        let used = memnode.stats().used;
        assert!(
            used >= 512 * MIB,
            "memnode {} should hold the 512 MiB swap file, uses {} MiB",
            memnode.addr(),
            used / MIB
        );
        assert!(swap.is_active(), "{} should be in /proc/swaps", swap.device);
        assert!(
            swap.direct_io(),
            "{} should do direct I/O on its rmemfs file",
            swap.device
        );
        SwapSetup {
            swap,
            fsd,
            _memnode: memnode,
            stats,
        }
    }

    /// Runs the workload in a fresh cgroup; checks it read back every page, that
    /// hundreds of MiB went to swap and that they went through fsd to the memnode.
    fn swap_a_workload(&self, name: &str, seed: u64) {
        let cgroup = MemCgroup::new(name, CGROUP_LIMIT);
        let written_before = self
            .stats
            .wait_for(Duration::from_secs(10), "fsd's stats file", |_| true)
            .value("remote_write_bytes");
        let swapped_before = pswpout_bytes();
        let out = run_within(
            cgroup
                .command(memtouch())
                .args(["fill", &WORKLOAD_MIB.to_string(), &seed.to_string()]),
            WORKLOAD_LIMIT,
            "memtouch fill in a memory cgroup swapping to rmemfs",
        );
        let swapped = pswpout_bytes() - swapped_before;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "memtouch fill {WORKLOAD_MIB} MiB (seed {seed}) exited with {}: {stdout}{}\nfsd: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            self.fsd.stderr()
        );
        let pages = WORKLOAD_MIB * MIB / 4096;
        assert!(
            stdout.contains(&format!("{pages} pages checked")),
            "memtouch should report all {pages} pages checked: {stdout}"
        );
        println!(
            "{name}: {} MiB swapped out (pswpout) while a {WORKLOAD_MIB} MiB process ran \
             in a {} MiB cgroup",
            swapped / MIB,
            CGROUP_LIMIT / MIB
        );
        assert!(
            swapped >= SWAPPED_AT_LEAST,
            "only {} MiB swapped out; the workload should have pushed at least {} MiB",
            swapped / MIB,
            SWAPPED_AT_LEAST / MIB
        );
        // Swapped pages really went to remote memory: fsd wrote them to the memnode.
        let s = self
            .stats
            .wait_for(Duration::from_secs(10), "fsd's stats file", |_| true);
        let written = s.value("remote_write_bytes") - written_before;
        assert!(
            written >= SWAPPED_AT_LEAST,
            "fsd wrote only {} MiB to remote memory while {} MiB were swapped out: {s}",
            written / MIB,
            swapped / MIB
        );
    }
}

#[test]
fn a_process_over_its_memory_limit_swaps_to_rmemfs_and_reads_every_page_back() {
    let _heavy = heavy_test();
    let setup = SwapSetup::new();
    setup.swap_a_workload("swap", 1);
    drop(setup.swap);
    setup.fsd.unmount();
}

#[test]
fn with_the_whole_machine_short_of_memory_swap_to_rmemfs_neither_hangs_nor_loses_a_page() {
    let _heavy = heavy_test();
    let setup = SwapSetup::new();
    // All the machine's memory but 384 MiB locked away: the workload's cgroup limit
    // and the kernel's own needs take most of what is left, so reclaim runs machine
    // wide while fsd and the memnode serve swap-out.
    let mut hog = Hog::leaving(memtouch(), 384 * MIB);
    let available = meminfo_bytes("MemAvailable");
    println!(
        "hog holds {} MiB; {} MiB left available",
        hog.bytes / MIB,
        available / MIB
    );
    assert!(
        available < 1024 * MIB,
        "the machine should be short of memory with the hog, yet {} MiB are available",
        available / MIB
    );
    setup.swap_a_workload("swap-short", 2);
    assert!(
        hog.is_running(),
        "the hog was killed (OOM?): the machine was not short of memory the way the \
         test meant"
    );
    drop(hog);
    drop(setup.swap);
    setup.fsd.unmount();
}

#[test]
fn swap_on_refuses_a_mount_whose_fsd_is_not_protected_from_reclaim() {
    let memnode = MemnodeProc::start("64M");
    let fsd = FsdMount::with_memnode(&memnode, &[]);
    let out = run_within(
        std::process::Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/swap"))
            .arg("on")
            .arg(fsd.path())
            .arg("16M"),
        Duration::from_secs(60),
        "scripts/swap on a mount without --for-swap",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "swap on should refuse: {stderr}");
    assert!(
        stderr.contains("--for-swap"),
        "the refusal should name --for-swap: {stderr}"
    );
    assert!(
        !fsd.join(".rmemfs-swap").exists(),
        "a refused swap on should leave no swap file"
    );
    fsd.unmount();
}
