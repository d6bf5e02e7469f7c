//! `fsd MOUNTPOINT [--memnode HOST:PORT]...`: mounts remote memory as a filesystem.

use clap::Parser;
use fsd::daemon::{run, Options};

/// mimalloc rather than glibc's malloc: a 4 KiB read that misses the cache makes a
/// few dozen small short-lived allocations (the cache's, the remote store's and the
/// fabric's batches), on which glibc's allocator spent a measurable share of fsd's
/// time and mimalloc spends less (docs/benchmarks-history.md, "mimalloc for fsd").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let opts = Options::parse();
    if let Err(e) = run(opts) {
        eprintln!("fsd: {e:#}");
        std::process::exit(1);
    }
}
