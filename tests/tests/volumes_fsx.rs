//! An fsx-like run on a durable volume, across remounts: random writes, truncates,
//! hole punches, zeroed ranges, fallocates and stores through a shared mapping on one
//! file, every read (plain, O_DIRECT, through a mapping) checked against
//! an in-memory model, and every K operations fsd goes away and comes back (a clean
//! unmount, or an fsync and then `kill -9`) and the whole file must match the model.
//!
//! The `fsx` tool cannot pick up a file it did not write in the same run (it truncates
//! it at start and keeps its model in memory), so the model is the test's own. Its
//! operations and their odds come from a printed seed (`RMEMFS_TEST_SEED` repeats it),
//! `RMEMFS_FSX_CYCLES` sets the number of remounts (default 12).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rmemfs_tests::config::cache_of;
use rmemfs_tests::data::{assert_bytes_eq, UncachedReader};
use rmemfs_tests::kernel::Mapping;
use rmemfs_tests::{heavy_test, volume, FsdMount, MemnodeProc, MIB};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

/// The file never grows past this.
const MAX_LEN: u64 = 8 * MIB;
/// Largest single write, punch, read.
const MAX_OP: u64 = 256 << 10;
/// Operations between remounts.
const OPS_PER_CYCLE: u64 = 2500;

/// The model: the file's bytes.
struct Model {
    data: Vec<u8>,
}

impl Model {
    fn len(&self) -> u64 {
        self.data.len() as u64
    }

    fn write(&mut self, off: u64, bytes: &[u8]) {
        let end = off as usize + bytes.len();
        if self.data.len() < end {
            self.data.resize(end, 0);
        }
        self.data[off as usize..end].copy_from_slice(bytes);
    }

    fn truncate(&mut self, len: u64) {
        self.data.resize(len as usize, 0);
    }

    /// Zeros `off..off+len` within the file; grows it to `off+len` unless `keep_size`.
    fn zero(&mut self, off: u64, len: u64, keep_size: bool) {
        let end = off + len;
        if !keep_size && self.len() < end {
            self.data.resize(end as usize, 0);
        }
        let stop = end.min(self.len());
        if off < stop {
            self.data[off as usize..stop as usize].fill(0);
        }
    }
}

fn fallocate(f: &File, mode: i32, off: u64, len: u64) -> io::Result<()> {
    // SAFETY: fallocate on an open descriptor with plain integers.
    let rc =
        unsafe { libc::fallocate(f.as_raw_fd(), mode, off as libc::off_t, len as libc::off_t) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn open(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()))
}

/// One random operation on `f` and the model; `log` keeps the last ones for the
/// failure message.
fn step(
    rng: &mut StdRng,
    f: &File,
    path: &Path,
    model: &mut Model,
    op: u64,
    log: &mut Vec<String>,
) {
    let len = model.len();
    let off = rng.random_range(0..MAX_LEN);
    let n = rng.random_range(1..=MAX_OP).min(MAX_LEN - off);
    let fail = |what: &str, e: io::Error, log: &[String]| -> ! {
        panic!(
            "op {op}: {what} failed: {e}\nlast operations:\n{}",
            log.join("\n")
        )
    };
    match rng.random_range(0..100) {
        0..=34 => {
            let bytes: Vec<u8> = (0..n).map(|_| rng.random()).collect();
            log.push(format!("{op}: write {off}+{n}"));
            f.write_all_at(&bytes, off)
                .unwrap_or_else(|e| fail("write", e, log));
            model.write(off, &bytes);
        }
        35..=54 => {
            let off = if len == 0 {
                0
            } else {
                rng.random_range(0..len)
            };
            let want = n.min(len - off) as usize;
            log.push(format!("{op}: read {off}+{want}"));
            let mut buf = vec![0u8; want];
            f.read_exact_at(&mut buf, off)
                .unwrap_or_else(|e| fail("read", e, log));
            assert_bytes_eq(
                &model.data[off as usize..off as usize + want],
                &buf,
                off,
                &format!("op {op}: read of {} against the model", path.display()),
            );
        }
        55..=62 => {
            let to = if rng.random_bool(0.5) && len > 0 {
                rng.random_range(0..len)
            } else {
                rng.random_range(0..=MAX_LEN)
            };
            log.push(format!("{op}: truncate {len} -> {to}"));
            f.set_len(to).unwrap_or_else(|e| fail("truncate", e, log));
            model.truncate(to);
        }
        63..=71 => {
            log.push(format!("{op}: punch hole {off}+{n}"));
            fallocate(
                f,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off,
                n,
            )
            .unwrap_or_else(|e| fail("punch hole", e, log));
            model.zero(off, n, true);
        }
        72..=77 => {
            let keep = rng.random_bool(0.5);
            log.push(format!("{op}: zero range {off}+{n} keep_size {keep}"));
            let mode =
                libc::FALLOC_FL_ZERO_RANGE | if keep { libc::FALLOC_FL_KEEP_SIZE } else { 0 };
            fallocate(f, mode, off, n).unwrap_or_else(|e| fail("zero range", e, log));
            model.zero(off, n, keep);
        }
        78..=81 => {
            let keep = rng.random_bool(0.5);
            log.push(format!("{op}: fallocate {off}+{n} keep_size {keep}"));
            let mode = if keep { libc::FALLOC_FL_KEEP_SIZE } else { 0 };
            fallocate(f, mode, off, n).unwrap_or_else(|e| fail("fallocate", e, log));
            // Reserving changes no byte; without KEEP_SIZE it may grow the file.
            if !keep && model.len() < off + n {
                model.truncate(off + n);
            }
        }
        82..=85 => {
            // Read around the page cache: what fsd itself holds.
            let off = if len == 0 {
                0
            } else {
                rng.random_range(0..len)
            };
            let want = n.min(len - off) as usize;
            log.push(format!("{op}: O_DIRECT read {off}+{want}"));
            let got = UncachedReader::open(path)
                .and_then(|mut r| r.read_at(off, want))
                .unwrap_or_else(|e| fail("O_DIRECT read", e, log));
            assert_bytes_eq(
                &model.data[off as usize..off as usize + want],
                &got,
                off,
                &format!(
                    "op {op}: O_DIRECT read of {} against the model",
                    path.display()
                ),
            );
        }
        86..=89 if len > 0 => {
            // Through a shared mapping of the whole file: stores, or loads checked
            // against the model; msync makes the stores the file's.
            let off = rng.random_range(0..len);
            let want = n.min(len - off) as usize;
            let store = rng.random_bool(0.5);
            log.push(format!(
                "{op}: mmap {} {off}+{want}",
                if store { "write" } else { "read" }
            ));
            let mut map = Mapping::shared(f, len as usize).unwrap_or_else(|e| fail("mmap", e, log));
            let range = off as usize..off as usize + want;
            if store {
                let bytes: Vec<u8> = (0..want).map(|_| rng.random()).collect();
                map.as_mut_slice()[range].copy_from_slice(&bytes);
                map.sync().unwrap_or_else(|e| fail("msync", e, log));
                model.write(off, &bytes);
            } else {
                assert_bytes_eq(
                    &model.data[range.clone()],
                    &map.as_slice()[range],
                    off,
                    &format!("op {op}: mmap read of {} against the model", path.display()),
                );
            }
        }
        90..=93 => {
            log.push(format!("{op}: fdatasync"));
            f.sync_data().unwrap_or_else(|e| fail("fdatasync", e, log));
        }
        94..=96 => {
            log.push(format!("{op}: fsync"));
            f.sync_all().unwrap_or_else(|e| fail("fsync", e, log));
        }
        _ => {
            log.push(format!("{op}: stat"));
            let size = f.metadata().unwrap_or_else(|e| fail("fstat", e, log)).len();
            assert_eq!(size, model.len(), "op {op}: size against the model");
        }
    }
    if log.len() > 40 {
        log.drain(..log.len() - 40);
    }
}

/// The whole file against the model, read around the page cache.
fn verify_whole(path: &Path, model: &Model, when: &str) {
    let size = std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{when}: stat {}: {e}", path.display()))
        .len();
    assert_eq!(size, model.len(), "{when}: size of {}", path.display());
    let mut r = UncachedReader::open(path)
        .unwrap_or_else(|e| panic!("{when}: opening {}: {e}", path.display()));
    let mut pos = 0u64;
    while pos < model.len() {
        let n = MIB.min(model.len() - pos) as usize;
        let got = r
            .read_at(pos, n)
            .unwrap_or_else(|e| panic!("{when}: reading at {pos}: {e}"));
        assert_bytes_eq(
            &model.data[pos as usize..pos as usize + n],
            &got,
            pos,
            &format!("{when}: the whole file against the model"),
        );
        pos += n as u64;
    }
}

#[test]
fn fsx_across_remounts() {
    let _serial = heavy_test();
    let seed = std::env::var("RMEMFS_TEST_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    let cycles: u64 = std::env::var("RMEMFS_FSX_CYCLES")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(12);
    println!(
        "fsx across remounts: seed {seed} (RMEMFS_TEST_SEED={seed} repeats it), {cycles} \
         cycles of {OPS_PER_CYCLE} operations"
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let memnode = MemnodeProc::start("256M");
    let args = [&["--volume", "fsx"][..], &cache_of("1M")].concat();
    let mut model = Model { data: Vec::new() };
    let mut log = Vec::new();
    let mut fsd = FsdMount::with_memnode(&memnode, &args);
    let started = Instant::now();
    for cycle in 0..cycles {
        let path = fsd.join("fsx.file");
        let f = open(&path);
        for i in 0..OPS_PER_CYCLE {
            step(
                &mut rng,
                &f,
                &path,
                &mut model,
                cycle * OPS_PER_CYCLE + i,
                &mut log,
            );
        }
        // Odd cycles end with fsync and kill -9: what was fsynced must all be back.
        let crash = cycle % 2 == 1;
        if crash {
            f.sync_all().expect("fsync before kill -9");
            drop(f);
            log.push(format!("cycle {cycle}: fsync, then kill -9 of fsd"));
            fsd.kill9();
            fsd = volume::remount_after_crash(&[&memnode], &args);
        } else {
            drop(f);
            log.push(format!("cycle {cycle}: clean unmount"));
            fsd.unmount();
            fsd = FsdMount::with_memnode(&memnode, &args);
        }
        let when = format!(
            "after cycle {cycle} ({} then a mount; seed {seed}); last operations:\n{}\n",
            if crash {
                "fsync, kill -9"
            } else {
                "a clean unmount"
            },
            log.join("\n")
        );
        verify_whole(&fsd.join("fsx.file"), &model, &when);
        println!(
            "cycle {cycle}: file of {} bytes matches the model after {} ({:.1} s so far)",
            model.len(),
            if crash { "kill -9" } else { "unmount" },
            started.elapsed().as_secs_f64()
        );
    }
    fsd.unmount();
    volume::assert_fsck_clean("fsx", &[&memnode], "after the fsx cycles");
}
