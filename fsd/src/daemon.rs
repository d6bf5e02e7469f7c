//! fsd as a process: command line, connecting to memnodes (or starting an embedded
//! one), mounting, the periodic flusher, the metrics endpoint and status file, and
//! clean shutdown on SIGINT/SIGTERM.
//!
//! [`run`] is the daemon's whole life as a sequence of steps, each a function of
//! its own: `options` parses and checks the command line; `open` finds or starts
//! the memnodes, connects and opens the filesystem (scratch or a volume); this file
//! mounts it and serves metrics; `workers` starts the background threads and
//! stops them once the mount is gone.

mod open;
mod options;
mod workers;

pub use options::Options;

use crate::fs::{Caller, RmemFs};
use crate::fuse::{CacheMode, FuseAdapter, MountChoices};
use crate::metrics::FsdCollector;
use crate::mount::{MountOptions, MountSpec, Mounted, Serving};
use anyhow::Context;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;
use workers::Workers;

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
    // Kept to the end: the embedded memnode serves while it lives.
    let (memnodes, token, embedded) = open::memnodes(&opts, poll)?;
    let rdma = open::any_over_rdma(&opts, &memnodes)?;
    let remote = open::connect(&opts, &memnodes, token, timeout, poll)?;
    // SAFETY: geteuid/getegid have no preconditions and cannot fail.
    let owner = unsafe { Caller::with_ids(libc::geteuid(), libc::getegid()) };
    let fs = open::filesystem(&opts, remote, owner, rdma)?;

    let spec = mount_spec(&opts)?;
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
    let _metrics = serve_metrics(&opts, &fs, &adapter, embedded.as_ref())?;
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

    let workers = Workers::start(
        &opts,
        &fs,
        &mountinfo_path,
        owner.uid == 0,
        embedded.is_some(),
    );
    let result = mounted.run();
    workers.stop_and_join();
    // destroy() ran if the kernel said goodbye; shutting down twice is harmless.
    fs.shutdown();
    result?;
    log::info!("unmounted {}", opts.mountpoint.display());
    Ok(())
}

/// How the mount is made: its FUSE request loops, /proc/mounts source and options.
fn mount_spec(opts: &Options) -> anyhow::Result<MountSpec> {
    let mut spec = MountSpec::new("rmemfs", opts.threads);
    spec.fsname = opts.fsname.clone();
    spec.options = MountOptions::parse(&opts.mount_options.join(","))?;
    Ok(spec)
}

/// With `--metrics`, the Prometheus endpoint (fsd's own metrics, and the embedded
/// memnode's when there is one); its address is printed on stdout for whoever
/// asked for port 0. The server runs as long as the returned value is kept.
fn serve_metrics(
    opts: &Options,
    fs: &Arc<RmemFs>,
    adapter: &FuseAdapter,
    embedded: Option<&memnode::Memnode>,
) -> anyhow::Result<Option<rmemfs_metrics::MetricsServer>> {
    let Some(listen) = &opts.metrics else {
        return Ok(None);
    };
    let collector = FsdCollector::new(fs.clone(), adapter.timing());
    let embedded = embedded.map(memnode::Memnode::collector);
    let server = crate::metrics::serve(listen, collector, embedded)
        .with_context(|| format!("serving metrics on {listen}"))?;
    log::info!("metrics on http://{}/metrics", server.local_addr());
    let mut out = std::io::stdout().lock();
    writeln!(out, "fsd metrics on {}", server.local_addr())
        .and_then(|()| out.flush())
        .context("writing the metrics address to stdout")?;
    Ok(Some(server))
}
