//! fsd's command line: the [`Options`] clap parses (the mount helper runs the same
//! parser to check a mount's options before starting fsd) and the checks of ranges
//! and combinations clap cannot express, made before anything starts. Kept apart
//! from `run` so the flags and their help read as one list.

use crate::fuse::ring::FuseTransport;
use crate::remote::MAX_REPLICAS;
use anyhow::bail;
use clap::Parser;
use rmemfs_common::fabric::{self, Transport};
use rmemfs_common::size::parse_size;
use std::path::PathBuf;

/// `--poll-us` default.
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
    /// Fabric to the memnodes: verbs (RDMA), tcp, mapped (a memnode on this host:
    /// control over tcp, READ and WRITE copies into its shared region), or auto (verbs
    /// when this host has an RDMA device and the memnode is not on a loopback
    /// address, else tcp, mapped where the memnode is on this host and shares its
    /// region). The embedded memnode is mapped with auto.
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

    pub(super) fn validate(&self) -> anyhow::Result<()> {
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
        if let Some(token) = self.token() {
            use rmemfs_common::protocol::{MAX_TOKEN_LEN, MIN_TOKEN_LEN};
            let len = token.len();
            if len == 0 {
                bail!("--token (or RMEMFS_TOKEN) is empty: give the memnodes' token, or none at all for memnodes that have none");
            }
            if len < MIN_TOKEN_LEN {
                bail!("--token is {len} bytes; a token of fewer than {MIN_TOKEN_LEN} is too easily guessed, and no memnode takes one");
            }
            if len > MAX_TOKEN_LEN {
                bail!("--token is {len} bytes; at most {MAX_TOKEN_LEN} are allowed");
            }
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
