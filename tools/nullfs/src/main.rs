//! `nullfs MOUNTPOINT [--threads N] [--ring-threads N] [--direct-io | --page-cache | --writeback-cache]
//! [--fuse-transport auto|io-uring|classic]`: a FUSE filesystem that keeps no data,
//! for the benchmark only. It measures the ceiling FUSE itself puts on any FUSE
//! filesystem on this host: writes are dropped (the file only grows), reads return
//! the transport's buffer as it is, unwritten (zeros on /dev/fuse), and the namespace
//! is a flat directory in memory.
//!
//! A fair ceiling for fsd because everything FUSE-side is the same, taken from the
//! crate fsd serves through (`rmemfs-fuse`): the same fuser, init settings
//! (`rmemfs_fuse::configure_kernel`), entry and attribute TTL, open flags (through the
//! page cache, or not with `--direct-io` as with fsd's; written back by the kernel
//! with `--writeback-cache`), mount options and number of request loops
//! (`rmemfs_fuse::mount`), the same transports (fuser's /dev/fuse loop, or FUSE over
//! io_uring), and the same kind of answer to getxattr.
//! The only work left is FUSE's own: the kernel's copies and the round trips to this
//! process. It takes over clearing setuid/setgid from the kernel as fsd does
//! (`FUSE_HANDLE_KILLPRIV_V2`) but, keeping nothing that matters, does not clear them.

mod fuse;
mod namespace;

use anyhow::bail;
use clap::Parser;
use rmemfs_fuse::ring::FuseTransport;
use rmemfs_fuse::CacheMode;
use std::path::PathBuf;

/// A FUSE filesystem that keeps no data: the FUSE ceiling, for benchmarks.
#[derive(Debug, Parser)]
#[command(name = "nullfs", version)]
struct Options {
    /// Where to mount (an existing directory). Runs in the foreground until
    /// unmounted or sent SIGTERM/SIGINT.
    mountpoint: PathBuf,
    /// FUSE request loops running at once (as fsd's --threads).
    #[arg(long, default_value_t = 4,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    threads: usize,
    /// Serving threads per CPU queue of the io_uring transport (as fsd's
    /// --ring-threads).
    #[arg(long, default_value_t = rmemfs_fuse::ring::DEFAULT_THREADS_PER_QUEUE,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    ring_threads: usize,
    /// Bypass the kernel's page cache (the default, as fsd's --direct-io).
    #[arg(long, group = "cache_mode")]
    direct_io: bool,
    /// Serve through the kernel's page cache (as fsd's --page-cache).
    #[arg(long, group = "cache_mode")]
    page_cache: bool,
    /// Let the kernel write back cached writes later (as fsd's --writeback-cache).
    #[arg(long, group = "cache_mode")]
    writeback_cache: bool,
    /// How the kernel hands FUSE requests over (as fsd's --fuse-transport).
    #[arg(long, value_enum, default_value = "auto")]
    fuse_transport: FuseTransport,
}

fn run(opts: Options) -> anyhow::Result<()> {
    if !opts.mountpoint.is_dir() {
        bail!(
            "mountpoint {} is not a directory",
            opts.mountpoint.display()
        );
    }
    // SAFETY: geteuid/getegid have no preconditions and cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let spec = rmemfs_fuse::mount::MountSpec::new("nullfs", opts.threads);
    let cache = CacheMode::from_flags(opts.page_cache, opts.writeback_cache);
    let fs = std::sync::Arc::new(fuse::NullFs::new(uid, gid, cache));
    let serving = rmemfs_fuse::mount::Serving {
        transport: opts.fuse_transport,
        threads: opts.threads,
        ring_threads: opts.ring_threads,
    };
    rmemfs_fuse::mount::Mounted::new(fs, &opts.mountpoint, &spec, serving, "nullfs", || {})?
        .run()?;
    log::info!("unmounted {}", opts.mountpoint.display());
    Ok(())
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let opts = Options::parse();
    if let Err(e) = run(opts) {
        eprintln!("nullfs: {e:#}");
        std::process::exit(1);
    }
}
