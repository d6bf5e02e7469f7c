//! Which FUSE transport serves a mount, and what happens when the io_uring one
//! cannot: `--fuse-transport io-uring` is served by the ring (fsd counts the requests
//! it answers there) with data exact after the cache is dropped; `classic` answers
//! none there; `auto` falls back to /dev/fuse with one clear line when the kernel
//! parameter is off or io_uring is disabled by sysctl, while `io-uring` then refuses
//! to mount, saying why; each CPU queue gets the serving threads asked for, and
//! more tasks than that on one CPU are all answered; SIGTERM in the middle of
//! readers and writers on the ring ends fsd cleanly, with every reader and writer
//! answered; random reads that come together are loaded in one batch, exact.
//!
//! These tests turn `/sys/module/fuse/parameters/enable_uring` and
//! `kernel.io_uring_disabled` on and off (each restored after), so they need root and
//! a kernel with FUSE over io_uring (Linux 6.14, CONFIG_FUSE_IO_URING); they take one
//! lock so they never overlap. Without root or that kernel they fail, saying so.

use rmemfs_common::sync::lock;
use rmemfs_tests::data::assert_bytes_eq;
use rmemfs_tests::{FsdMount, MemnodeProc, Pattern, StatsFile, MIB};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";
const IO_URING_DISABLED: &str = "/proc/sys/kernel/io_uring_disabled";

/// One test at a time touches the kernel's settings.
static SETTINGS: Mutex<()> = Mutex::new(());

/// A kernel setting written for one test and put back when it ends.
struct Setting {
    path: &'static str,
    before: String,
    _lock: Option<MutexGuard<'static, ()>>,
}

impl Setting {
    fn set(path: &'static str, value: &str) -> Setting {
        let before = std::fs::read_to_string(path).unwrap_or_else(|e| {
            panic!(
                "reading {path}: {e} (these tests need a kernel with FUSE over io_uring, \
                 Linux 6.14 with CONFIG_FUSE_IO_URING)"
            )
        });
        std::fs::write(path, value)
            .unwrap_or_else(|e| panic!("writing {value} to {path}: {e} (these tests need root)"));
        Setting {
            path,
            before: before.trim().to_string(),
            _lock: None,
        }
    }
}

impl Drop for Setting {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(self.path, &self.before) {
            eprintln!("restoring {} to {}: {e}", self.path, self.before);
        }
    }
}

/// The settings lock plus FUSE over io_uring on (as scripts/run and scripts/test set
/// it), restored when the test ends.
fn uring_on() -> (MutexGuard<'static, ()>, Setting) {
    let lock = lock(&SETTINGS);
    (lock, Setting::set(ENABLE_URING, "Y"))
}

fn ring_requests(stats: &StatsFile) -> u64 {
    stats.current().value("fuse_ring_requests")
}

/// Writes a file of patterned data, drops the page cache and fsd's (a file past
/// `--cache 2M`), and reads it back exact.
fn round_trip(mount: &FsdMount, name: &str) {
    let data = Pattern::for_test(name).bytes(0, 8 * MIB as usize);
    let path = mount.join(name);
    std::fs::write(&path, &data).unwrap();
    drop_page_cache();
    assert_bytes_eq(&data, &std::fs::read(&path).unwrap(), 0, name);
}

fn drop_page_cache() {
    std::fs::write("/proc/sys/vm/drop_caches", "3").expect("dropping the page cache");
}

fn args<'a>(stats: &'a StatsFile, transport: &'a str) -> Vec<&'a str> {
    vec![
        "--cache",
        "2M",
        "--stats-file",
        stats.arg(),
        "--fuse-transport",
        transport,
    ]
}

#[test]
fn the_ring_serves_a_mount_that_asks_for_it_with_exact_data() {
    let _on = uring_on();
    let stats = StatsFile::new();
    let mount = FsdMount::start(&args(&stats, "io-uring"));
    round_trip(&mount, "ring-data");
    let before = ring_requests(&stats);
    // 64 stats of a file not yet looked up: each a LOOKUP or GETATTR at least.
    for i in 0..64 {
        let p = mount.join(format!("f{i}"));
        std::fs::write(&p, b"x").unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 1);
    }
    let after = stats
        .wait_for(Duration::from_secs(10), "ring requests counted", |s| {
            s.value("fuse_ring_requests") >= before + 64 * 2
        })
        .value("fuse_ring_requests");
    assert!(
        after >= 64 * 2 + 100,
        "the ring answered only {after} requests"
    );
    let log = mount.stderr_with("FUSE transport: io_uring");
    assert!(
        log.contains("FUSE transport: io_uring"),
        "fsd should say the ring serves the mount; stderr:\n{log}"
    );
    mount.unmount();
}

#[test]
fn the_classic_loop_serves_a_mount_that_asks_for_it() {
    let _on = uring_on();
    let stats = StatsFile::new();
    let mount = FsdMount::start(&args(&stats, "classic"));
    round_trip(&mount, "classic-data");
    assert_eq!(ring_requests(&stats), 0, "no request goes through a ring");
    let line = "FUSE transport: /dev/fuse (--fuse-transport classic)";
    assert!(mount.stderr_with(line).contains(line));
    mount.unmount();
}

/// With the kernel's parameter off: auto mounts on /dev/fuse saying why, io-uring
/// refuses to mount saying why.
#[test]
fn with_the_parameter_off_auto_falls_back_and_io_uring_refuses() {
    let _lock = lock(&SETTINGS);
    let _off = Setting::set(ENABLE_URING, "N");
    let stats = StatsFile::new();
    let mount = FsdMount::start(&args(&stats, "auto"));
    round_trip(&mount, "fallback-data");
    assert_eq!(ring_requests(&stats), 0);
    let log = mount.stderr_with("FUSE transport: /dev/fuse");
    assert!(
        log.contains("FUSE transport: /dev/fuse") && log.contains("enable_uring is N"),
        "fsd should say in one line that /dev/fuse serves and why; stderr:\n{log}"
    );
    mount.unmount();

    let memnode = MemnodeProc::start("64M");
    let refusal = FsdMount::refused(&[&memnode], &["--fuse-transport", "io-uring"]);
    assert!(!refusal.status.success());
    assert!(
        refusal.stderr.contains("--fuse-transport io-uring")
            && refusal.stderr.contains("enable_uring is N"),
        "the refusal should name the option and the reason; stderr:\n{}",
        refusal.stderr
    );
}

#[test]
fn with_io_uring_disabled_by_sysctl_auto_falls_back() {
    let (_lock, _on) = uring_on();
    let _disabled = Setting::set(IO_URING_DISABLED, "2");
    let stats = StatsFile::new();
    let mount = FsdMount::start(&args(&stats, "auto"));
    round_trip(&mount, "no-io-uring-data");
    assert_eq!(ring_requests(&stats), 0);
    let log = mount.stderr_with("FUSE transport: /dev/fuse");
    assert!(
        log.contains("FUSE transport: /dev/fuse") && log.contains("io_uring is unavailable"),
        "fsd should say in one line that /dev/fuse serves and why; stderr:\n{log}"
    );
    mount.unmount();
}

/// Readers and writers busy on the ring when fsd gets SIGTERM: the unmount is
/// lazy while their files are open, fsd serves them until they close (every read
/// exact, every write answered), then exits 0 within the unmount deadline with
/// nothing left mounted.
#[test]
fn sigterm_under_load_on_the_ring_answers_every_request_then_exits() {
    let (_lock, _on) = uring_on();
    let stats = StatsFile::new();
    let mount = FsdMount::start(&args(&stats, "io-uring"));
    let data = Arc::new(Pattern::for_test("busy").bytes(0, 4 * MIB as usize));
    std::fs::write(mount.join("busy"), &*data).unwrap();
    let until = Instant::now() + Duration::from_secs(3);
    let workers = spawn_busy(&mount, "busy", &data, 4, until, None);
    std::thread::sleep(Duration::from_millis(500));
    assert!(ring_requests(&stats) > 0);
    mount.unmount(); // SIGTERM; asserts exit 0 and the mount gone
    for w in workers {
        let done = w.join().expect("a worker failed");
        assert!(done > 0, "a worker got nothing done");
    }
}

/// One serving thread per CPU queue unless `--ring-threads` asks for more (the line
/// naming the transport says how many), and either way eight readers and writers
/// pinned to one CPU, more than its queue has threads (their requests wait for a
/// thread to be free), are all answered, with exact data.
#[test]
fn each_queue_has_the_ring_threads_asked_for_and_serves_more_tasks_than_that() {
    let (_lock, _on) = uring_on();
    for (flag, per_queue) in [(None, 1), (Some("3"), 3)] {
        let stats = StatsFile::new();
        let mut a = args(&stats, "io-uring");
        if let Some(n) = flag {
            a.extend(["--ring-threads", n]);
        }
        let mount = FsdMount::start(&a);
        let line = format!(" queues x {per_queue} threads x ");
        let log = mount.stderr_with(&line);
        assert!(
            log.contains(&line),
            "--ring-threads {flag:?}: expected {per_queue} threads per queue; stderr:\n{log}"
        );
        let data = Arc::new(Pattern::for_test("one-cpu").bytes(0, 4 * MIB as usize));
        std::fs::write(mount.join("one-cpu"), &*data).unwrap();
        drop_page_cache();
        let before = ring_requests(&stats);
        let until = Instant::now() + Duration::from_secs(1);
        for w in spawn_busy(&mount, "one-cpu", &data, 8, until, Some(0)) {
            assert!(
                w.join().expect("a worker failed") > 0,
                "a worker got nothing done"
            );
        }
        assert!(ring_requests(&stats) > before, "the ring served none of it");
        mount.unmount();
    }
}

/// Random reads that reach a queue while its thread is busy are answered together:
/// what they miss is loaded from remote memory in one batch (fsd counts those
/// misses), and every byte each reader gets is exact. Eight readers on one CPU, a
/// file 8 times `--cache`: most reads miss, and they queue behind each other. Over
/// tcp whatever RMEMFS_TRANSPORT says: over the mapped fabric such reads go around
/// the cache, one copy each with no round trip to batch (tests/mapped_reads.rs).
#[test]
fn random_reads_that_come_together_are_loaded_in_one_batch_with_exact_data() {
    use std::os::unix::fs::FileExt;
    let (_lock, _on) = uring_on();
    let stats = StatsFile::new();
    let mount = FsdMount::start_on(rmemfs_tests::Transport::Tcp, &args(&stats, "io-uring"));
    let data = Arc::new(Pattern::for_test("together").bytes(0, 16 * MIB as usize));
    std::fs::write(mount.join("together"), &*data).unwrap();
    let until = Instant::now() + Duration::from_secs(2);
    let readers: Vec<_> = (0..8u64)
        .map(|i| {
            let file = std::fs::File::open(mount.join("together")).unwrap();
            let data = data.clone();
            std::thread::spawn(move || {
                pin_to_cpu(0);
                let mut buf = [0u8; 4096];
                let mut seed = 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(i + 1);
                let mut done = 0usize;
                while Instant::now() < until {
                    // xorshift: a different sequence of blocks per reader.
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let at = (seed % (data.len() / buf.len()) as u64) as usize * buf.len();
                    file.read_exact_at(&mut buf, at as u64)
                        .unwrap_or_else(|e| panic!("read at {at}: {e}"));
                    assert_bytes_eq(&data[at..at + buf.len()], &buf, at as u64, "together");
                    done += 1;
                }
                done
            })
        })
        .collect();
    for r in readers {
        assert!(
            r.join().expect("a reader failed") > 0,
            "a reader got nothing"
        );
    }
    let batched = stats
        .wait_for(Duration::from_secs(10), "misses loaded in a batch", |s| {
            s.value("cache_batched_misses") > 0
        })
        .value("cache_batched_misses");
    eprintln!("{batched} misses loaded in batches");
    mount.unmount();
}

/// `n` threads busy on `mount` until `until`, each returning how much it did: the
/// even ones read `name`, which holds `data`, the odd ones write files of their own;
/// with `cpu`, all of them on that CPU.
fn spawn_busy(
    mount: &FsdMount,
    name: &str,
    data: &Arc<Vec<u8>>,
    n: usize,
    until: Instant,
    cpu: Option<usize>,
) -> Vec<std::thread::JoinHandle<usize>> {
    (0..n)
        .map(|i| {
            let reader = i % 2 == 0;
            let path = if reader {
                mount.join(name)
            } else {
                mount.join(format!("{name}-w{i}"))
            };
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .unwrap();
            let data = data.clone();
            std::thread::spawn(move || {
                if let Some(cpu) = cpu {
                    pin_to_cpu(cpu);
                }
                busy(file, reader, &data, until)
            })
        })
        .collect()
}

/// Keeps the calling thread on `cpu`, so its FUSE requests go to that CPU's queue.
fn pin_to_cpu(cpu: usize) {
    assert!(
        rmemfs_common::cpus::pin_current_thread(cpu),
        "pinning to CPU {cpu}: {}",
        std::io::Error::last_os_error()
    );
}

/// Reads (checking every byte) or writes through `file` until `until`; returns how
/// many it did. Panics on any error or wrong byte.
fn busy(file: std::fs::File, reader: bool, data: &[u8], until: Instant) -> usize {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; 64 << 10];
    let mut done = 0;
    while Instant::now() < until {
        let at = (done % 64) * buf.len();
        if reader {
            file.read_exact_at(&mut buf, at as u64)
                .unwrap_or_else(|e| panic!("read at {at} after {done}: {e}"));
            assert!(buf == data[at..at + buf.len()], "wrong bytes at {at}");
        } else {
            file.write_all_at(&buf[..4096], (done % 16 * 4096) as u64)
                .unwrap_or_else(|e| panic!("write after {done}: {e}"));
        }
        done += 1;
    }
    done
}
