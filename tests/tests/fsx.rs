//! fsx (the Rust `fsx` crate) hammers one file in the mount with random reads, writes,
//! mmap reads and writes, truncates, fsyncs and reopens, checking every byte it reads
//! against its own model. The file is larger than fsd's cache, so blocks are evicted
//! to the memnode and read back from it all the time.

use rmemfs_tests::binaries::fsx;
use rmemfs_tests::config::{cache_of, BLOCK_SIZE, DEAD_TIME};
use rmemfs_tests::{fresh_dir, heavy_test, FsdMount, MemnodeProc, Pattern, StatsFile, MIB};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MIN_OPS: u64 = 50_000;
const TIME_LIMIT: Duration = Duration::from_secs(30 * 60);

/// fsx's settings: an 8 MiB file against a 1 MiB cache, every operation fsx knows that
/// a POSIX filesystem must support (no fallocate, hole punching or copy_file_range).
const FSX_CONFIG: &str = r#"
flen = 8388608

[opsize]
max = 65536
min = 0
align = 1

[weights]
close_open = 1
read = 10
write = 10
mapread = 10
mapwrite = 10
invalidate = 1
truncate = 5
fsync = 1
fdatasync = 1
sendfile = 1
posix_fadvise = 1
"#;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|s| s.trim().parse().ok())
}

fn tail(path: &std::path::Path, bytes: usize) -> String {
    match std::fs::read(path) {
        Ok(b) => String::from_utf8_lossy(&b[b.len().saturating_sub(bytes)..]).into_owned(),
        Err(e) => format!("({}: {e})", path.display()),
    }
}

/// Runs fsx on a file of `fsd`'s mount: `ops` operations from `seed`, calling
/// `meanwhile` once, `after` into the run. Panics with fsx's and fsd's output unless
/// fsx finishes without a miscompare within [`TIME_LIMIT`].
fn run_fsx(fsd: &FsdMount, ops: u64, seed: u64, after: Duration, meanwhile: impl FnOnce()) {
    let fsx = fsx();
    println!("fsx: seed {seed}, {ops} operations (RMEMFS_FSX_SEED={seed} repeats it)");
    let work = fresh_dir("rmemfs-fsx");
    let config = work.join("fsx.toml");
    std::fs::write(&config, FSX_CONFIG).expect("writing fsx.toml");
    let (out_path, err_path) = (work.join("fsx.stdout"), work.join("fsx.stderr"));
    let target = fsd.join("fsx.file");

    let started = Instant::now();
    let mut child = Command::new(&fsx)
        .arg("-f")
        .arg(&config)
        .arg("-N")
        .arg(ops.to_string())
        .arg("-S")
        .arg(seed.to_string())
        .arg("-P")
        .arg(&work)
        .arg(&target)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).expect("fsx stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("fsx stderr file"))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", fsx.display()));
    let mut meanwhile = Some(meanwhile);
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for fsx") {
            break Some(status);
        }
        if started.elapsed() > TIME_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        if started.elapsed() >= after {
            if let Some(f) = meanwhile.take() {
                f();
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let report = || {
        format!(
            "fsx stdout:\n{}\nfsx stderr:\n{}\nfsx log (end):\n{}\nfsd stderr:\n{}\n\
             (artifacts kept in {})",
            tail(&out_path, 8 << 10),
            tail(&err_path, 8 << 10),
            tail(&work.join("fsx.file.fsxlog"), 8 << 10),
            fsd.stderr(),
            work.display()
        )
    };
    let Some(status) = status else {
        panic!(
            "fsx (seed {seed}) did not finish {ops} operations within {TIME_LIMIT:?}\n{}",
            report()
        );
    };
    assert!(
        status.success(),
        "fsx (seed {seed}) failed with {status} within {ops} operations\n{}",
        report()
    );
    assert!(
        meanwhile.is_none(),
        "fsx finished within {after:?}, before the event the test wanted during the run; \
         run more operations"
    );
    // Nothing damages remote memory here: a checksum failure is fsd's own mistake
    // (a page sum not kept in step with what it wrote), even when another copy hid it.
    assert!(
        !fsd.stderr().contains("checksum mismatch"),
        "fsd reported checksum mismatches that no damage explains\n{}",
        report()
    );
    println!(
        "fsx: {ops} operations passed in {:?}: {}",
        started.elapsed(),
        tail(&out_path, 200).trim()
    );
    let _ = std::fs::remove_dir_all(&work);
}

fn seed_and_ops() -> (u64, u64) {
    let seed = env_u64("RMEMFS_FSX_SEED").unwrap_or_else(|| rand::random::<u32>().into());
    let ops = env_u64("RMEMFS_FSX_OPS").unwrap_or(MIN_OPS).max(MIN_OPS);
    (seed, ops)
}

#[test]
fn fsx_runs_50000_operations_on_a_file_larger_than_the_cache_without_a_miscompare() {
    let _serial = heavy_test();
    let (seed, ops) = seed_and_ops();
    let memnode = MemnodeProc::start("256M");
    let fsd = FsdMount::with_memnode(&memnode, &[&cache_of("1M")[..], &["--page-cache"]].concat());
    run_fsx(&fsd, ops, seed, Duration::ZERO, || {});
    fsd.unmount();
}

/// The same with `--direct-io` (the default): reads and writes bypass the page cache
/// while fsx's mapped reads and writes go through it, so this checks that the two
/// stay coherent.
#[test]
fn fsx_runs_50000_operations_with_direct_io_without_a_miscompare() {
    let _serial = heavy_test();
    let (seed, ops) = seed_and_ops();
    let memnode = MemnodeProc::start("256M");
    let fsd = FsdMount::with_memnode(&memnode, &[&cache_of("1M")[..], &["--direct-io"]].concat());
    run_fsx(&fsd, ops, seed, Duration::ZERO, || {});
    fsd.unmount();
}

/// With two copies of every block on three memnodes, one memnode killed while fsx
/// runs changes nothing fsx can see: write-backs move to the survivors, reads fail
/// over, and re-replication (through the same cache fsx is using) races fsx's writes,
/// truncates and mmap writes without a miscompare.
///
/// A second file that fsx never touches is written first: its blocks are certain to
/// have copies on the memnode that dies, so re-replication certainly has work (fsx's
/// own file may by then have been truncated and rewritten onto the survivors only),
/// and its bytes must come through intact.
#[test]
fn fsx_sees_no_miscompare_when_a_memnode_dies_under_two_replicas() {
    let _serial = heavy_test();
    let (seed, ops) = seed_and_ops();
    let mut nodes: Vec<MemnodeProc> = (0..3).map(|_| MemnodeProc::start("128M")).collect();
    let refs: Vec<&MemnodeProc> = nodes.iter().collect();
    let stats = StatsFile::new();
    let fsd = FsdMount::with_memnodes(
        &refs,
        &[
            "--cache",
            "1M",
            "--block-size",
            BLOCK_SIZE,
            "--replicas",
            "2",
            "--dead-time",
            DEAD_TIME,
            "--stats-file",
            stats.arg(),
        ],
    );
    let steady = Pattern::for_test("file beside fsx's while a memnode dies");
    let steady_path = fsd.join("steady");
    steady.write_file(&steady_path, 4 * MIB);
    std::fs::File::open(&steady_path)
        .and_then(|f| f.sync_all())
        .expect("fsync the steady file");
    run_fsx(&fsd, ops, seed, Duration::from_secs(3), || {
        println!("killing memnode 1 while fsx runs");
        nodes[1].kill();
    });
    let s = stats.wait_for(
        Duration::from_secs(60),
        "every block back to two copies after fsx",
        |s| s.value("nodes_down") == 1 && s.value("blocks") > 0 && s.value("blocks_degraded") == 0,
    );
    assert!(
        s.value("rereplicated_blocks") > 0 && s.value("blocks_lost") == 0,
        "copies lost with memnode 1 should have been restored and none lost: {s}"
    );
    steady.verify_file(&steady_path, 4 * MIB);
    fsd.unmount();
}
