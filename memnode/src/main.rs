//! The `memnode` command: lend this host's memory to rmemfs clients until SIGINT or
//! SIGTERM.
//!
//! Stdout carries two lines, printed and flushed once the listener is bound:
//! `memnode transport <BACKEND> (<WHY>)`, then `memnode listening on <ADDR> capacity
//! <BYTES>` (scripts and tests read the port from the latter when listening on port
//! 0, so its shape never changes). With `--metrics`, `memnode metrics on <ADDR>`
//! comes between them, once the metrics endpoint listens. Everything else goes to
//! the log on stderr.

use clap::Parser;
use memnode::{Memnode, MemnodeConfig};
use rmemfs_common::fabric::{self, Transport};
use rmemfs_common::size::parse_size;
use rmemfs_metrics::prometheus_client::registry::Registry;
use rmemfs_metrics::MetricsServer;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use std::io::Write;
use std::process::ExitCode;
use std::str::FromStr;

/// Lends a region of this host's memory to rmemfs clients (fsd).
#[derive(Debug, Parser)]
#[command(name = "memnode", version)]
struct Cli {
    /// Address to listen on (HOST:PORT; port 0 picks a free port).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:7070")]
    listen: String,

    /// Memory to lend, e.g. 512M, 4G (binary units; rounded down to whole pages).
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = parse_size_arg)]
    size: u64,

    /// Token every client must present in its Hello.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "RMEMFS_TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,

    /// A file whose one line is the token: kept out of `ps` and the environment.
    #[arg(long, value_name = "PATH", conflicts_with = "token",
          value_parser = rmemfs_common::token::read_token_file)]
    token_file: Option<String>,

    /// Serve with no token on an address beyond loopback: anyone who reaches the
    /// port may allocate, read and write. Without it such a memnode refuses to start.
    #[arg(long)]
    insecure: bool,

    /// A TOML file of tenants, each with its own token and optional quota of bytes
    /// and volumes (docs/reference.md): a tenant's memory and volumes are its own.
    /// Instead of --token/--token-file.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["token", "token_file"])]
    tenants: Option<std::path::PathBuf>,

    /// Back the region with 2 MiB huge pages (falls back to normal pages if none).
    #[arg(long)]
    huge_pages: bool,

    /// Keep this memnode out of memory reclaim, for a swap device on rmemfs: all of
    /// its memory locked and resident from the start (the whole region), its threads
    /// I/O flushers, the OOM killer's last choice. Needs root.
    #[arg(long)]
    lock_memory: bool,

    /// Fabric backend: verbs (RDMA), tcp, mapped (tcp, and the region shared by
    /// descriptor with clients of this user on this host, who copy into it), or auto
    /// (verbs when this host has an RDMA device, otherwise tcp with the region shared
    /// as with mapped, unless a tenants file divides it).
    #[arg(long, value_name = "auto|verbs|tcp|mapped", default_value = "auto", value_parser = Transport::from_str)]
    transport: Transport,

    /// Microseconds a connection thread polls for a client's next request before it
    /// sleeps, over tcp (0: sleep at once; verbs: unused, the NIC serves requests).
    /// Polling spends CPU to cut latency where waking a sleeping thread is slow.
    #[arg(long, value_name = "MICROS", default_value_t = fabric::DEFAULT_POLL.as_micros() as u64,
          value_parser = clap::value_parser!(u64).range(0..=fabric::MAX_POLL_US))]
    poll_us: u64,

    /// Seconds a volume's holder keeps it without sending a request; after that
    /// another client may open the volume, which fences the old holder.
    #[arg(long, value_name = "SECS", default_value_t = memnode::DEFAULT_LEASE.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    lease_secs: u64,

    /// Seconds a client's session keeps its memory after its last connection closed,
    /// so that a client cut off by a network blip or a stall finds every chunk when it
    /// reconnects; a session not resumed by then is reclaimed. A client that shuts
    /// down cleanly gives its memory back at once. 0: reclaim at once (the behaviour
    /// before sessions).
    #[arg(long, value_name = "SECS", default_value_t = memnode::DEFAULT_SESSION_GRACE.as_secs(),
          value_parser = clap::value_parser!(u64).range(0..=7 * 86400))]
    session_grace: u64,

    /// Keep the lent memory and the memnode's books in this file (on tmpfs or
    /// hugetlbfs), so that a crash or an upgrade of this process loses nothing: a
    /// memnode started again on the file comes back as the same instance with every
    /// chunk, session and volume, and clients resume where they were. Made (and its
    /// room reserved) when missing or empty; a file that is damaged, truncated, of
    /// another size or another listen address's is refused.
    #[arg(long, value_name = "PATH")]
    memory_file: Option<std::path::PathBuf>,

    /// Start the --memory-file empty, as a new memnode, whatever it holds (what it
    /// held is lost to its clients).
    #[arg(long, requires = "memory_file")]
    memory_file_reset: bool,

    /// Serve Prometheus metrics over HTTP on this address (GET /metrics; port 0
    /// picks a free port, printed on stdout). Off by default.
    #[arg(long, value_name = "HOST:PORT")]
    metrics: Option<String>,

    /// Seconds a connection has from accept to complete its Hello; then it is closed.
    #[arg(long, value_name = "SECS", default_value_t = fabric::HELLO_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    hello_timeout: u64,

    /// Seconds a request, once begun, has to arrive whole over tcp; then the
    /// connection is closed.
    #[arg(long, value_name = "SECS", default_value_t = fabric::FRAME_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    frame_timeout: u64,
}

fn parse_size_arg(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        0 => Err("size must be greater than zero".into()),
        n => Ok(n),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::error!("{e:#}");
            eprintln!("memnode: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    use anyhow::Context;
    // Register before binding so a signal that arrives during startup is not lost.
    let mut signals = Signals::new([SIGINT, SIGTERM]).context("installing signal handlers")?;
    if cli.lock_memory {
        // Before the region is mapped (it is then faulted in whole) and before any
        // thread starts (they inherit the flusher flag).
        rmemfs_common::reclaim::protect_from_reclaim()
            .context("--lock-memory")?
            .log("--lock-memory");
    }
    let token = cli.token.or(cli.token_file).map(String::into_bytes);
    if token.is_none() && cli.tenants.is_none() {
        refuse_open_doors(&cli.listen, cli.insecure)?;
    }
    let mut node = Memnode::start(MemnodeConfig {
        listen: cli.listen.clone(),
        size: cli.size,
        token,
        tenants: cli.tenants,
        huge_pages: cli.huge_pages,
        transport: cli.transport,
        poll: std::time::Duration::from_micros(cli.poll_us),
        lease: std::time::Duration::from_secs(cli.lease_secs),
        session_grace: std::time::Duration::from_secs(cli.session_grace),
        memory_file: cli.memory_file.map(|path| memnode::MemoryFileConfig {
            path,
            reset: cli.memory_file_reset,
        }),
        connections: fabric::ConnectionLimits {
            hello_timeout: std::time::Duration::from_secs(cli.hello_timeout),
            frame_timeout: std::time::Duration::from_secs(cli.frame_timeout),
            ..fabric::ConnectionLimits::default()
        },
    })
    .with_context(|| format!("starting memnode on {}", cli.listen))?;
    let metrics = match &cli.metrics {
        None => None,
        Some(listen) => {
            let mut registry = Registry::default();
            registry.register_collector(Box::new(node.collector()));
            let server = MetricsServer::start(listen, registry)
                .with_context(|| format!("serving metrics on {listen}"))?;
            log::info!("metrics on http://{}/metrics", server.local_addr());
            Some(server)
        }
    };
    let capacity = node.stats().capacity;
    let mut out = std::io::stdout().lock();
    writeln!(out, "memnode transport {}", node.transport_choice())
        .and_then(|()| match &metrics {
            Some(m) => writeln!(out, "memnode metrics on {}", m.local_addr()),
            None => Ok(()),
        })
        .and_then(|()| {
            writeln!(
                out,
                "memnode listening on {} capacity {capacity}",
                node.local_addr()
            )
        })
        .and_then(|()| out.flush())
        .context("writing the listening lines to stdout")?;
    drop(out);
    let signal = signals.forever().next();
    log::info!(
        "{}: shutting down",
        match signal {
            Some(SIGINT) => "SIGINT",
            Some(SIGTERM) => "SIGTERM",
            _ => "signal handling stopped",
        }
    );
    node.shutdown();
    Ok(())
}

/// A memnode without a token lets in whoever reaches its port: on loopback only that
/// host's users, beyond it the network. That needs saying out loud: `--insecure`.
fn refuse_open_doors(listen: &str, insecure: bool) -> anyhow::Result<()> {
    use std::net::ToSocketAddrs;
    let beyond: Vec<std::net::SocketAddr> = listen
        .to_socket_addrs()
        .map_err(|e| anyhow::anyhow!("--listen {listen}: {e}"))?
        .filter(|a| !a.ip().is_loopback())
        .collect();
    let Some(first) = beyond.first() else {
        return Ok(());
    };
    if !insecure {
        anyhow::bail!(
            "--listen {listen} reaches beyond this host ({first}) and no token is set: anyone who reaches the port could use and read this memory. Give --token-file PATH (or --token, RMEMFS_TOKEN), listen on 127.0.0.1, or say --insecure"
        );
    }
    log::warn!(
        "--insecure: serving {listen} ({first}) with no token; any client that reaches the port is let in"
    );
    Ok(())
}
