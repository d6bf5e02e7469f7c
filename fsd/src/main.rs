//! `fsd MOUNTPOINT [--memnode HOST:PORT]...`: mounts remote memory as a filesystem.

use clap::Parser;
use fsd::daemon::{run, Options};

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let opts = Options::parse();
    if let Err(e) = run(opts) {
        eprintln!("fsd: {e:#}");
        std::process::exit(1);
    }
}
