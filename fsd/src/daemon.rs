//! fsd as a process: command line, connecting to memnodes (or starting an embedded
//! one), mounting, the periodic flusher, the metrics endpoint and status file, and
//! clean shutdown on SIGINT/SIGTERM.

use crate::fs::{Caller, RmemFs};
use crate::fuse::ring::FuseTransport;
use crate::fuse::{CacheMode, FuseAdapter, MountChoices};
use crate::metrics::FsdCollector;
use crate::mount::{MountOptions, MountSpec, Mounted, Serving};
use crate::remote::{Connector, RemoteConfig, RemoteStore, VolumeSpec, MAX_REPLICAS};
use crate::stats::Snapshot;
use crate::status::{MountInfo, StatusWriter};
use crate::volume::{MountPolicy, Volume};
use anyhow::{bail, Context};
use clap::Parser;
use rmemfs_common::control::random_id;
use rmemfs_common::fabric::{self, Transport};
use rmemfs_common::size::{format_size, parse_size};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// How often `--stats-file` is rewritten.
const STATS_PERIOD: Duration = Duration::from_secs(1);
/// How often each memnode gets a heartbeat, or a reconnect attempt while it is down.
const WATCH_INTERVAL: Duration = Duration::from_secs(1);
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
/// CPUs idle a quarter of a sequential read, waiting on round trips; three cut
/// that idle time and read 6-21% faster by median in interleaved runs (tcp, 2
/// cores, 64 KiB blocks).
const PREFETCH_THREADS: usize = 3;

/// `--poll-us` default.
/// How long opening a volume waits for another client to let go of it: an fsd that
/// is unmounting it still holds it for a moment after umount(8) returns (FUSE
/// unmounts without waiting for the daemon), so `umount && mount` must not fail; and
/// an fsd that crashed holds it until its lease runs out (10 s by default: the
/// memnode cannot tell a crash from a network blip), so a restart must not fail.
const VOLUME_BUSY_PATIENCE: Duration = Duration::from_secs(20);
const DEFAULT_POLL_US: u64 = fabric::DEFAULT_POLL.as_micros() as u64;

fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s)
}

/// Mount the memory of remote memnodes as a POSIX filesystem.
#[derive(Debug, Parser)]
#[command(name = "fsd", version)]
pub struct Options {
    /// Where to mount (an existing directory).
    pub mountpoint: PathBuf,
    /// A memnode to use, HOST:PORT; repeat for several. Without any, fsd starts an
    /// embedded memnode in-process.
    #[arg(long = "memnode", value_name = "HOST:PORT")]
    pub memnodes: Vec<String>,
    /// Copies of every block, each on a different memnode (1 to 4, at most the number
    /// of memnodes). With 2 or more, losing a memnode loses no data.
    #[arg(long, default_value_t = 1)]
    pub replicas: usize,
    /// Bytes per second that re-replication may copy to bring blocks that lost a copy
    /// with a memnode back to --replicas copies.
    #[arg(long, default_value = "256M", value_parser = size_arg)]
    pub rereplication_rate: u64,
    /// Bytes per second of block copies the scrubber reads and checks against their
    /// page checksums, repairing bad copies from good ones (0: no scrubbing).
    #[arg(long, default_value = "32M", value_parser = size_arg)]
    pub scrub_rate: u64,
    /// Local page cache size (e.g. 256M).
    #[arg(long, default_value = "256M", value_parser = size_arg)]
    pub cache: u64,
    /// File block size: the unit of caching and of remote I/O (power of two, 4K..16M).
    #[arg(long, default_value = "64K", value_parser = size_arg)]
    pub block_size: u64,
    /// Remote memory fsd allocates per control round trip.
    #[arg(long, default_value = "64M", value_parser = size_arg)]
    pub chunk_size: u64,
    /// Size of the embedded memnode (used when no --memnode is given).
    #[arg(long, default_value = "1G", value_parser = size_arg)]
    pub embedded_size: u64,
    /// Token presented to memnodes (also from RMEMFS_TOKEN).
    #[arg(long, env = "RMEMFS_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A file whose one line is the token: kept out of `ps` and the environment.
    #[arg(long, value_name = "PATH", conflicts_with = "token",
          value_parser = rmemfs_common::token::read_token_file)]
    pub token_file: Option<String>,
    /// Seconds a remote operation (or a heartbeat) may take before its memnode
    /// counts as unreachable: its copies are kept, fsd reconnects and resumes.
    #[arg(long, default_value_t = 5.0)]
    pub op_timeout: f64,
    /// Seconds a memnode may stay unreachable before its copies count as lost (and
    /// are re-made from other copies, or read as EIO where there are none). A
    /// memnode that answers as a new instance is lost at once. Default 600, as
    /// Ceph's mon_osd_down_out_interval: a reboot or a network repair fits in it.
    #[arg(long, value_name = "SECS", default_value_t = 600.0)]
    pub dead_time: f64,
    /// Seconds an operation that needs an unreachable memnode (no other copy in
    /// reach) waits for it before failing with EIO: a soft mount. Unset (the
    /// default), it waits until the memnode is back or lost (a hard mount, as NFS's
    /// default): right for swap and scratch, where an EIO kills the program.
    #[arg(long, value_name = "SECS")]
    pub unreachable_timeout: Option<f64>,
    /// FUSE request loops of the classic transport (/dev/fuse) running at once.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Serving threads per CPU queue of the io_uring transport. With one, a
    /// request that arrives while its queue's thread is busy is handed over the
    /// moment that thread answers, with no thread woken for it (much faster with
    /// more readers than CPUs); more let a request that waits long (a flush of
    /// much dirty data, a memnode that stopped answering) hold up fewer of the
    /// requests of the tasks on its CPU.
    #[arg(long, default_value_t = crate::fuse::ring::DEFAULT_THREADS_PER_QUEUE)]
    pub ring_threads: usize,
    /// How the kernel hands FUSE requests to fsd: io-uring (FUSE over io_uring,
    /// Linux 6.14, when /sys/module/fuse/parameters/enable_uring is Y), classic
    /// (/dev/fuse), or auto: io-uring when the kernel offers it, else classic.
    #[arg(long, value_enum, default_value = "auto")]
    pub fuse_transport: FuseTransport,
    /// Turn extended attributes off: every xattr call then fails with EOPNOTSUPP,
    /// as on a filesystem without them. On kernels before Linux 5.11 it also makes
    /// small writes faster: there the kernel asks fsd for "security.capability"
    /// before every write(2), a FUSE round trip of its own (later kernels stop
    /// asking once fsd takes over clearing setuid/setgid, FUSE_HANDLE_KILLPRIV_V2).
    #[arg(long)]
    pub no_xattrs: bool,
    /// Bypass the kernel's page cache (the default): every read and write goes to
    /// fsd, whose --cache is then the only copy in local memory. Streams run faster
    /// and the page cache does not fill with the mount's data; re-reads the page
    /// cache would have answered cost a round trip to fsd. Shared mmap needs Linux
    /// 6.6.
    #[arg(long, group = "cache_mode")]
    pub direct_io: bool,
    /// Serve files through the kernel's page cache: re-reads of data the page cache
    /// holds never reach fsd, at the price of a second local copy of the mount's
    /// data beside --cache and of slower streams.
    #[arg(long, group = "cache_mode")]
    pub page_cache: bool,
    /// Let the kernel cache writes and write them back later (FUSE write-back
    /// cache, through the page cache): small writes return without a round trip to
    /// fsd. fsd then learns of a write only when the kernel writes it back, so a
    /// full remote memory is reported by fsync or close rather than by the write,
    /// st_blocks and df lag until write-back, and SEEK_HOLE finds no holes.
    #[arg(long, group = "cache_mode")]
    pub writeback_cache: bool,
    /// Data connections per memnode.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Seconds between write-backs of all dirty pages.
    #[arg(long, default_value_t = 5.0)]
    pub flush_interval: f64,
    /// Fabric to the memnodes: verbs (RDMA), tcp, or auto (verbs when this host has
    /// an RDMA device and the memnode is not on a loopback address, else tcp).
    #[arg(long, default_value = "auto", value_parser = clap::value_parser!(Transport))]
    pub transport: Transport,
    /// Microseconds a thread waiting for a memnode's answer polls for it before it
    /// sleeps, over tcp (0: sleep at once). Polling spends CPU to cut latency where
    /// waking a sleeping thread is slow, as on VMs whose idle CPUs halt.
    #[arg(long, value_name = "MICROS", default_value_t = DEFAULT_POLL_US,
          value_parser = clap::value_parser!(u64).range(0..=fabric::MAX_POLL_US))]
    pub poll_us: u64,
    /// Write statistics (remote operations and bytes, cache hits and misses) as JSON
    /// to this file, replaced once a second and at exit.
    #[arg(long, value_name = "PATH")]
    pub stats_file: Option<PathBuf>,
    /// Mount the durable volume NAME, created on first use: files, directories and
    /// their metadata live on the memnodes and outlive fsd (unmount, restart, crash).
    /// Without it the mount is scratch memory, gone when fsd exits.
    #[arg(long, value_name = "NAME")]
    pub volume: Option<String>,
    /// Take the volume over from an fsd that still holds it (its host vanished):
    /// the memnodes then refuse that fsd's writes.
    #[arg(long, requires = "volume")]
    pub takeover: bool,
    /// Mount the volume from the memnodes that answer even when one that does not
    /// (or that came back without its memory) may hold newer metadata: what only it
    /// held is given up. Without it such a mount is refused rather than rolled back.
    #[arg(long, requires = "volume")]
    pub degraded: bool,
    /// Seconds a volume mount waits for every --memnode to answer before it
    /// refuses (or, with --degraded, goes on without the missing ones).
    #[arg(long, value_name = "SECS", default_value_t = 30.0, requires = "volume")]
    pub mount_wait: f64,
    /// Mount options, comma-separated (repeatable): ro, rw, nosuid and nodev (the
    /// defaults, as libfuse's), suid, dev, noexec, exec, relatime (the default),
    /// strictatime, noatime, nodiratime, allow_other, default_permissions.
    #[arg(short = 'o', value_name = "OPTIONS", value_parser = crate::mount::options_arg)]
    pub mount_options: Vec<String>,
    /// What /proc/mounts shows as the mounted device (the mount helper passes
    /// its SOURCE); the type is always fuse.rmemfs.
    #[arg(long, value_name = "NAME", default_value = "rmemfs",
          value_parser = crate::mount::fsname_arg)]
    pub fsname: String,
    /// Serve Prometheus metrics over HTTP on this address (GET /metrics; port 0 picks
    /// a free port, printed on stdout as `fsd metrics on ADDR`). Off by default.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics: Option<String>,
    /// Serve a swap device on the mount (a file on it behind a loop device; see
    /// scripts/swap): fsd's memory locked and resident from the start (its cache and
    /// an embedded memnode's region included), its threads I/O flushers, the OOM
    /// killer's last choice, so it never needs the reclaim it serves. Needs root.
    #[arg(long)]
    pub for_swap: bool,
}

impl Options {
    /// The token, from `--token` (or RMEMFS_TOKEN) or `--token-file`.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref().or(self.token_file.as_deref())
    }

    fn validate(&self) -> anyhow::Result<()> {
        let bs = self.block_size;
        if !bs.is_power_of_two() || !(4096..=16 << 20).contains(&bs) {
            bail!("--block-size must be a power of two from 4K to 16M, got {bs}");
        }
        if self.cache < 2 * bs {
            bail!("--cache must hold at least two blocks ({})", 2 * bs);
        }
        if self.chunk_size < bs {
            bail!("--chunk-size must be at least one block");
        }
        if !(self.op_timeout > 0.0 && self.op_timeout <= 3600.0) {
            bail!("--op-timeout must be between 0 and 3600 seconds");
        }
        if !(self.dead_time > 0.0 && self.dead_time <= 7.0 * 86400.0) {
            bail!("--dead-time must be between 0 and 604800 seconds (7 days)");
        }
        if let Some(t) = self.unreachable_timeout {
            if !(t > 0.0 && t <= self.dead_time) {
                bail!("--unreachable-timeout must be more than 0 and at most --dead-time");
            }
        }
        if !(0.0..=3600.0).contains(&self.mount_wait) {
            bail!("--mount-wait must be between 0 and 3600 seconds");
        }
        if !(self.flush_interval > 0.0 && self.flush_interval <= 3600.0) {
            bail!("--flush-interval must be between 0 and 3600 seconds");
        }
        if !(1..=64).contains(&self.threads) || !(1..=64).contains(&self.connections) {
            bail!("--threads and --connections must be between 1 and 64");
        }
        if !(1..=64).contains(&self.ring_threads) {
            bail!("--ring-threads must be between 1 and 64");
        }
        let nodes = self.memnodes.len().max(1);
        if !(1..=MAX_REPLICAS).contains(&self.replicas) || self.replicas > nodes {
            bail!(
                "--replicas must be between 1 and {} and at most the number of memnodes \
                 ({nodes}), got {}",
                MAX_REPLICAS,
                self.replicas
            );
        }
        if self.rereplication_rate < self.block_size {
            bail!("--rereplication-rate must be at least one block per second");
        }
        let token_len = self.token().map_or(0, |t| t.len());
        if token_len > rmemfs_common::protocol::MAX_TOKEN_LEN {
            bail!(
                "--token is {token_len} bytes; at most {} are allowed",
                rmemfs_common::protocol::MAX_TOKEN_LEN
            );
        }
        if let Some(v) = &self.volume {
            if !rmemfs_common::protocol::valid_volume_name(v.as_bytes()) {
                bail!(
                    "--volume {v:?}: a volume name is 1 to {} letters, digits, '.', '_' or '-'",
                    rmemfs_common::protocol::MAX_VOLUME_NAME
                );
            }
        }
        if !self.mountpoint.is_dir() {
            bail!(
                "mountpoint {} is not a directory",
                self.mountpoint.display()
            );
        }
        Ok(())
    }
}

/// Blocks SIGINT and SIGTERM and returns a flag set when one arrives (and a way to
/// wait for it).
struct StopSignal {
    stopped: Mutex<bool>,
    cv: Condvar,
}

impl StopSignal {
    fn stop(&self) {
        *self.stopped.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_all();
    }

    fn is_stopped(&self) -> bool {
        *self.stopped.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits up to `d`; true once stopped.
    fn wait(&self, d: Duration) -> bool {
        let g = self.stopped.lock().unwrap_or_else(|e| e.into_inner());
        if *g {
            return true;
        }
        let (g, _) = self
            .cv
            .wait_timeout(g, d)
            .unwrap_or_else(|e| e.into_inner());
        *g
    }
}

/// Runs fsd until it is unmounted or signalled.
pub fn run(opts: Options) -> anyhow::Result<()> {
    opts.validate()?;
    if opts.for_swap {
        // First: before any thread starts (they inherit the flusher flag) and before
        // the cache and an embedded memnode's region are mapped (then faulted in).
        rmemfs_common::reclaim::protect_from_reclaim()
            .context("--for-swap")?
            .log("--for-swap");
    }
    let timeout = Duration::from_secs_f64(opts.op_timeout);
    let poll = Duration::from_micros(opts.poll_us);
    let mut token = opts.token().unwrap_or_default().as_bytes().to_vec();
    let mut memnodes = opts.memnodes.clone();
    let _embedded = if memnodes.is_empty() {
        // A private token so no other local process can use the embedded memnode.
        token = format!("{:016x}{:016x}", random_id(), random_id()).into_bytes();
        // Over verbs the embedded memnode listens on the RDMA interface's address
        // (RoCE cannot reach loopback).
        let transport = opts.transport.resolve()?;
        let host = fabric::local_host(transport)
            .context("the RDMA device's port has no IPv4 address to listen on")?;
        let node = memnode::Memnode::start(memnode::MemnodeConfig {
            listen: format!("{host}:0"),
            size: opts.embedded_size,
            token: Some(token.clone()),
            huge_pages: false,
            transport,
            poll,
            lease: memnode::DEFAULT_LEASE,
            session_grace: memnode::DEFAULT_SESSION_GRACE,
            memory_file: None,
        })
        .context("starting the embedded memnode")?;
        if let Some(v) = &opts.volume {
            log::warn!(
                "volume {v} is on the embedded memnode: it lives as long as this fsd; run a \
                 memnode beside fsd (--memnode) for a volume that outlives it"
            );
        }
        log::info!(
            "no --memnode given: embedded memnode of {} on {} over {transport}",
            format_size(opts.embedded_size),
            node.local_addr()
        );
        memnodes.push(node.local_addr().to_string());
        Some(node)
    } else {
        None
    };
    // Whether any memnode is reached over RDMA: the cache's buffers are registered.
    let mut rdma = false;
    for m in &memnodes {
        let t = fabric::resolve_for(opts.transport, m)?;
        rdma |= t == Transport::Verbs;
        log::info!(
            "memnode {m} over {t} (--transport {}: {})",
            opts.transport,
            opts.transport.describe_choice()
        );
    }
    let client_id = random_id();
    let transport = opts.transport;
    let connector: Arc<Connector> = Arc::new(move |peer: &str, client: u64| {
        fabric::connect(transport, peer, client, timeout, poll)
    });
    let config = RemoteConfig {
        block_size: opts.block_size,
        chunk_size: opts.chunk_size,
        connections: opts.connections,
        client_id,
        token,
        replicas: opts.replicas,
        watch_interval: WATCH_INTERVAL,
        dead_time: Duration::from_secs_f64(opts.dead_time),
        unreachable_timeout: opts.unreachable_timeout.map(Duration::from_secs_f64),
        volume: opts.volume.as_ref().map(|name| VolumeSpec {
            name: name.clone(),
            create: true,
            takeover: opts.takeover,
        }),
    };
    let remote = connect_waiting_for_volume(&memnodes, &config, connector)
        .context("connecting to memnodes")?;
    // SAFETY: geteuid/getegid have no preconditions and cannot fail.
    let owner = unsafe { Caller::with_ids(libc::geteuid(), libc::getegid()) };
    let remote = Arc::new(remote);
    let fs = match &opts.volume {
        None => {
            log::info!("scratch mode: the files are gone when fsd exits (--volume keeps them)");
            Arc::new(RmemFs::new(remote, opts.cache, owner))
        }
        Some(name) => {
            let policy = MountPolicy {
                wait: Duration::from_secs_f64(opts.mount_wait),
                degraded: opts.degraded,
            };
            let (volume, ns, report) =
                Volume::mount(name, remote.clone(), (owner.uid, owner.gid), policy)
                    .with_context(|| format!("opening volume {name}"))?;
            if report.created {
                log::info!("volume {name} created");
            } else {
                log::info!(
                    "volume {name} opened: {} inodes, {} log entries replayed, {} orphans and \
                     {} unreferenced chunks reclaimed, {} blocks lost, {} file tails zeroed; \
                     now generation {}",
                    report.inodes,
                    report.log_entries,
                    report.orphans,
                    report.reclaimed_chunks,
                    report.lost_blocks,
                    report.tails_zeroed,
                    report.generation
                );
            }
            Arc::new(RmemFs::on_volume(remote, opts.cache, ns, volume))
        }
    };
    if rdma {
        fs.cache()
            .register_with_fabric()
            .context("registering the page cache with the RDMA device")?;
    }
    log::info!(
        "cache {} in {} blocks of {}",
        format_size(opts.cache),
        fs.cache().capacity_pages(),
        format_size(opts.block_size)
    );

    let mut spec = MountSpec::new("rmemfs", opts.threads);
    spec.fsname = opts.fsname.clone();
    spec.options = MountOptions::parse(&opts.mount_options.join(","))?;
    // A second signal: write back what can be and exit; files still open on the
    // detached mount then fail with ENOTCONN.
    let last_resort = {
        let fs = fs.clone();
        move || fs.shutdown()
    };
    // How /proc/self/mountinfo names the mount point (resolved before mounting:
    // afterwards resolving it would ask the mount, which does not serve yet).
    let mountinfo_path =
        std::fs::canonicalize(&opts.mountpoint).unwrap_or_else(|_| opts.mountpoint.clone());
    let adapter = Arc::new(FuseAdapter::new(
        fs.clone(),
        MountChoices {
            xattrs: !opts.no_xattrs,
            cache: CacheMode::from_flags(opts.page_cache, opts.writeback_cache),
        },
    ));
    let _metrics = match &opts.metrics {
        None => None,
        Some(listen) => {
            let collector = FsdCollector::new(fs.clone(), adapter.timing());
            let embedded = _embedded.as_ref().map(memnode::Memnode::collector);
            let server = crate::metrics::serve(listen, collector, embedded)
                .with_context(|| format!("serving metrics on {listen}"))?;
            log::info!("metrics on http://{}/metrics", server.local_addr());
            let mut out = std::io::stdout().lock();
            writeln!(out, "fsd metrics on {}", server.local_addr())
                .and_then(|()| out.flush())
                .context("writing the metrics address to stdout")?;
            Some(server)
        }
    };
    let mounted = Mounted::new(
        adapter,
        &opts.mountpoint,
        &spec,
        Serving {
            transport: opts.fuse_transport,
            threads: opts.threads,
            ring_threads: opts.ring_threads,
        },
        "fsd",
        last_resort,
    )?;

    let stop = Arc::new(StopSignal {
        stopped: Mutex::new(false),
        cv: Condvar::new(),
    });
    let flusher = {
        let fs = fs.clone();
        let stop = stop.clone();
        let every = Duration::from_secs_f64(opts.flush_interval);
        std::thread::spawn(move || {
            while !stop.wait(every) {
                if let Err(e) = fs.flush_all() {
                    log::error!("periodic write-back failed: {e}");
                }
            }
        })
    };

    // Writing back what sequential writers have finished, and the coldest dirty pages
    // while the cache evicts, so requests that need a buffer mostly find clean pages
    // to drop; and giving back the memory of buffers the cache let go.
    let cleaner = {
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
    };

    // Loading sequential readers' next blocks while their requests are answered.
    let prefetchers: Vec<_> = (0..PREFETCH_THREADS)
        .map(|_| {
            let fs = fs.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.is_stopped() {
                    fs.prefetch_next(PREFETCH_IDLE_WAIT);
                }
            })
        })
        .collect();

    // Counting copies and re-replicating, scrubbing, and taking the mount's atime
    // options, once a second.
    let maintainer = {
        let fs = fs.clone();
        let stop = stop.clone();
        let budget = (opts.rereplication_rate / opts.block_size).max(1) as usize;
        let scrub_budget = opts.scrub_rate;
        let mountpoint = mountinfo_path.clone();
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
    };

    let stats_writer = opts.stats_file.clone().map(|path| {
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
    });

    // The status file `rmemfs status` reads (removed when the thread ends).
    let status_writer = {
        let dir = crate::status::paths::runtime_dir(owner.uid == 0);
        if dir.is_none() {
            log::warn!(
                "no runtime directory (not root, no XDG_RUNTIME_DIR or RMEMFS_RUNTIME_DIR): \
                 `rmemfs status` will not see this mount"
            );
        }
        let info = MountInfo {
            mountpoint: mountinfo_path.clone(),
            volume: opts.volume.clone(),
            embedded_memnode: _embedded.is_some(),
        };
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
    };

    let result = mounted.run();
    stop.stop();
    let _ = flusher.join();
    let _ = cleaner.join();
    for t in prefetchers {
        let _ = t.join();
    }
    let _ = maintainer.join();
    if let Some(t) = stats_writer {
        let _ = t.join();
    }
    if let Some(t) = status_writer {
        let _ = t.join();
    }
    // destroy() ran if the kernel said goodbye; shutting down twice is harmless.
    fs.shutdown();
    result?;
    log::info!("unmounted {}", opts.mountpoint.display());
    Ok(())
}

/// Connects to the memnodes; while the volume is held by another live client, tries
/// again for up to [`VOLUME_BUSY_PATIENCE`] (see there), then fails with the
/// memnode's answer, which names the holder.
fn connect_waiting_for_volume(
    memnodes: &[String],
    config: &RemoteConfig,
    connector: Arc<Connector>,
) -> Result<RemoteStore, crate::remote::RemoteError> {
    let deadline = std::time::Instant::now() + VOLUME_BUSY_PATIENCE;
    let mut said = false;
    let mut attempt = config.clone();
    loop {
        match RemoteStore::connect(memnodes, &attempt, connector.clone()) {
            Err(crate::remote::RemoteError::Control { node, error })
                if error.is_busy() && std::time::Instant::now() < deadline =>
            {
                if !std::mem::replace(&mut said, true) {
                    log::info!(
                        "memnode {node}: {error}; waiting up to {} s for it to let go \
                         (an fsd unmounting it does within moments)",
                        VOLUME_BUSY_PATIENCE.as_secs()
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
                // The refused attempt's session may still be on the memnode for a
                // moment: the next one is a client of its own.
                attempt.client_id = rmemfs_common::control::random_id();
            }
            r => return r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Options;
    use crate::fuse::CacheMode;
    use clap::Parser;

    fn cache_mode(flags: &[&str]) -> Result<CacheMode, clap::Error> {
        let args = ["fsd", "/mnt"].iter().chain(flags);
        Options::try_parse_from(args)
            .map(|o| CacheMode::from_flags(o.page_cache, o.writeback_cache))
    }

    #[test]
    fn cache_flags_choose_the_cache_mode_and_exclude_each_other() {
        assert_eq!(cache_mode(&[]).unwrap(), CacheMode::Direct);
        assert_eq!(cache_mode(&["--direct-io"]).unwrap(), CacheMode::Direct);
        assert_eq!(cache_mode(&["--page-cache"]).unwrap(), CacheMode::PageCache);
        assert_eq!(
            cache_mode(&["--writeback-cache"]).unwrap(),
            CacheMode::WriteBack
        );
        for pair in [
            ["--direct-io", "--writeback-cache"],
            ["--page-cache", "--writeback-cache"],
            ["--direct-io", "--page-cache"],
        ] {
            let both = cache_mode(&pair).unwrap_err();
            assert_eq!(both.kind(), clap::error::ErrorKind::ArgumentConflict);
        }
    }
}
