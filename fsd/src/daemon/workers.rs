//! The background threads fsd runs while the mount serves: the periodic flusher,
//! the cleaner, the prefetchers, the maintainer (copies, scrubbing, atime options),
//! the statistics file writer and the status file writer. Each kind is started by
//! a function of its own; [`Workers`] starts them in that order and, once the
//! mount is gone, stops them all and waits for them. They share one
//! [`StopSignal`], so each sleeps on it and wakes at once when fsd stops.

use super::Options;
use crate::fs::RmemFs;
use crate::stats::Snapshot;
use crate::status::{MountInfo, StatusWriter};
use rmemfs_common::sync::{lock, wait_timeout};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often `--stats-file` is rewritten.
const STATS_PERIOD: Duration = Duration::from_secs(1);
/// How often copies are counted and degraded blocks re-replicated.
const MAINTAIN_INTERVAL: Duration = Duration::from_secs(1);
/// Pages the cleaner looks at, at the cold end of the cache, per round.
const CLEAN_AHEAD_PAGES: usize = 64;
/// How long the cleaner sleeps when the cache evicts nothing (then it checks for stop).
const CLEANER_IDLE_WAIT: Duration = Duration::from_millis(200);
/// How long a prefetch thread waits for a job before checking for the stop.
const PREFETCH_IDLE_WAIT: Duration = Duration::from_millis(200);
/// Prefetch threads: each waits for its own remote reads, so this many loads of a
/// stream are in flight at once (on different connections). One alone left the
/// CPUs idle for part of a sequential read, waiting on round trips; three keep
/// the loads coming (docs/benchmarks-history.md, "Prefetch: three threads and 4 MiB
/// of read-ahead").
const PREFETCH_THREADS: usize = 3;

/// Blocks SIGINT and SIGTERM and returns a flag set when one arrives (and a way to
/// wait for it).
struct StopSignal {
    stopped: Mutex<bool>,
    cv: Condvar,
}

impl StopSignal {
    fn stop(&self) {
        *lock(&self.stopped) = true;
        self.cv.notify_all();
    }

    fn is_stopped(&self) -> bool {
        *lock(&self.stopped)
    }

    /// Waits up to `d`; true once stopped.
    fn wait(&self, d: Duration) -> bool {
        let g = lock(&self.stopped);
        if *g {
            return true;
        }
        let (g, _) = wait_timeout(&self.cv, g, d);
        *g
    }
}

/// The running background threads, and the signal that stops them.
pub(super) struct Workers {
    stop: Arc<StopSignal>,
    flusher: JoinHandle<()>,
    cleaner: JoinHandle<()>,
    prefetchers: Vec<JoinHandle<()>>,
    maintainer: JoinHandle<()>,
    stats_writer: Option<JoinHandle<()>>,
    status_writer: Option<JoinHandle<()>>,
}

impl Workers {
    /// Starts every kind of background thread, in this order. `mountpoint` is the
    /// mount point as /proc/self/mountinfo names it; `as_root` chooses the runtime
    /// directory of the status file.
    pub(super) fn start(
        opts: &Options,
        fs: &Arc<RmemFs>,
        mountpoint: &Path,
        as_root: bool,
        embedded_memnode: bool,
    ) -> Workers {
        let stop = Arc::new(StopSignal {
            stopped: Mutex::new(false),
            cv: Condvar::new(),
        });
        let flusher = spawn_flusher(fs, &stop, Duration::from_secs_f64(opts.flush_interval));
        let cleaner = spawn_cleaner(fs, &stop);
        let prefetchers = spawn_prefetchers(fs, &stop);
        let budget = (opts.rereplication_rate / opts.block_size).max(1) as usize;
        let maintainer = spawn_maintainer(fs, &stop, budget, opts.scrub_rate, mountpoint);
        let stats_writer = spawn_stats_writer(fs, &stop, opts.stats_file.clone());
        let info = MountInfo {
            mountpoint: mountpoint.to_path_buf(),
            volume: opts.volume.clone(),
            embedded_memnode,
        };
        let status_writer = spawn_status_writer(fs, &stop, as_root, info);
        Workers {
            stop,
            flusher,
            cleaner,
            prefetchers,
            maintainer,
            stats_writer,
            status_writer,
        }
    }

    /// Tells every thread to stop and waits for each, in the order they started.
    pub(super) fn stop_and_join(self) {
        self.stop.stop();
        let _ = self.flusher.join();
        let _ = self.cleaner.join();
        for t in self.prefetchers {
            let _ = t.join();
        }
        let _ = self.maintainer.join();
        if let Some(t) = self.stats_writer {
            let _ = t.join();
        }
        if let Some(t) = self.status_writer {
            let _ = t.join();
        }
    }
}

/// Writing back all dirty pages every `every` (`--flush-interval`).
fn spawn_flusher(fs: &Arc<RmemFs>, stop: &Arc<StopSignal>, every: Duration) -> JoinHandle<()> {
    let fs = fs.clone();
    let stop = stop.clone();
    std::thread::spawn(move || {
        while !stop.wait(every) {
            if let Err(e) = fs.flush_all() {
                log::error!("periodic write-back failed: {e}");
            }
        }
    })
}

/// Writing back what sequential writers have finished, and the coldest dirty pages
/// while the cache evicts, so requests that need a buffer mostly find clean pages
/// to drop; and giving back the memory of buffers the cache let go.
fn spawn_cleaner(fs: &Arc<RmemFs>, stop: &Arc<StopSignal>) -> JoinHandle<()> {
    let fs = fs.clone();
    let stop = stop.clone();
    let ahead = (fs.cache().capacity_pages() / 8).clamp(1, CLEAN_AHEAD_PAGES);
    std::thread::spawn(move || {
        while !stop.is_stopped() {
            if fs.cache().wait_for_work(CLEANER_IDLE_WAIT) {
                fs.cache().clean_behind(&*fs);
                fs.cache().clean_cold(&*fs, ahead);
            }
            fs.cache().trim_memory();
        }
    })
}

/// Loading sequential readers' next blocks while their requests are answered.
fn spawn_prefetchers(fs: &Arc<RmemFs>, stop: &Arc<StopSignal>) -> Vec<JoinHandle<()>> {
    (0..PREFETCH_THREADS)
        .map(|_| {
            let fs = fs.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.is_stopped() {
                    fs.prefetch_next(PREFETCH_IDLE_WAIT);
                }
            })
        })
        .collect()
}

/// Counting copies and re-replicating (`budget` blocks a round), scrubbing
/// (`scrub_budget` bytes a round, 0: none), and taking the mount's atime options,
/// once a second. The atime options are taken once before the thread starts.
fn spawn_maintainer(
    fs: &Arc<RmemFs>,
    stop: &Arc<StopSignal>,
    budget: usize,
    scrub_budget: u64,
    mountpoint: &Path,
) -> JoinHandle<()> {
    let fs = fs.clone();
    let stop = stop.clone();
    let mountpoint = mountpoint.to_path_buf();
    fs.atime_policy().refresh(&mountpoint);
    std::thread::spawn(move || {
        while !stop.wait(MAINTAIN_INTERVAL) {
            fs.maintain(budget);
            if scrub_budget > 0 {
                fs.scrub(scrub_budget);
            }
            // `mount -o remount,noatime` and the like reach fsd this way.
            fs.atime_policy().refresh(&mountpoint);
        }
    })
}

/// Rewriting `--stats-file` every [`STATS_PERIOD`] and once more at the stop.
fn spawn_stats_writer(
    fs: &Arc<RmemFs>,
    stop: &Arc<StopSignal>,
    path: Option<PathBuf>,
) -> Option<JoinHandle<()>> {
    path.map(|path| {
        let fs = fs.clone();
        let stop = stop.clone();
        std::thread::spawn(move || loop {
            let stopping = stop.wait(STATS_PERIOD);
            if let Err(e) = Snapshot::of(&fs).write_to(&path) {
                log::warn!("cannot write statistics to {}: {e}", path.display());
            }
            if stopping {
                return;
            }
        })
    })
}

/// The status file `rmemfs status` reads (removed when the thread ends); none
/// without a runtime directory to put it in.
fn spawn_status_writer(
    fs: &Arc<RmemFs>,
    stop: &Arc<StopSignal>,
    as_root: bool,
    info: MountInfo,
) -> Option<JoinHandle<()>> {
    let dir = crate::status::paths::runtime_dir(as_root);
    if dir.is_none() {
        log::warn!(
            "no runtime directory (not root, no XDG_RUNTIME_DIR or RMEMFS_RUNTIME_DIR): \
             `rmemfs status` will not see this mount"
        );
    }
    dir.and_then(|d| StatusWriter::create(&d, info))
        .map(|mut w| {
            let fs = fs.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                w.write(&fs);
                while !stop.wait(STATS_PERIOD) {
                    w.write(&fs);
                }
            })
        })
}
