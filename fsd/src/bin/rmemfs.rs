//! `rmemfs`: volume administration without a mount.
//!
//! - `rmemfs volume list --memnode A`: the volumes a memnode holds.
//! - `rmemfs volume destroy NAME --memnode A [--memnode B ...]`: frees a volume.
//! - `rmemfs fsck NAME --memnode A [--memnode B ...]`: walks a volume offline and
//!   reports inconsistencies and leaked chunks (exit 0 clean, 1 problems found, 2 the
//!   volume cannot be read).
//! - `rmemfs status MOUNTPOINT [--json]`: how a running mount is doing, from the
//!   status file its fsd keeps (`fsd::status`; exit 0 healthy, 1 degraded, data lost
//!   or fsd stuck, 2 no live rmemfs mount there).
//! - `rmemfs tenants --metrics HOST:PORT [--json]`: each tenant's memory, volumes and
//!   quota on a memnode, from its metrics endpoint (`rmemfs/tenants.rs`).

use clap::{Parser, Subcommand};
use fsd::remote::{Connector, RemoteConfig, RemoteStore, VolumeSpec};
use fsd::status::report;
use fsd::volume::admin::{self, FsckReport};
use rmemfs_common::control::{self, random_id};
use rmemfs_common::fabric::{self, Endpoint, Transport};
use rmemfs_common::size::{format_size, parse_size};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

#[path = "rmemfs/tenants.rs"]
mod tenants;

#[derive(Debug, Parser)]
#[command(
    name = "rmemfs",
    version,
    about = "Administer rmemfs: volumes on memnodes, and running mounts"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Args)]
struct Remote {
    /// A memnode, HOST:PORT; repeat for every memnode of the volume.
    #[arg(long = "memnode", value_name = "HOST:PORT", required = true)]
    memnodes: Vec<String>,
    /// Token presented to memnodes (also from RMEMFS_TOKEN).
    #[arg(long, env = "RMEMFS_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// A file whose one line is the token: kept out of `ps` and the environment.
    #[arg(long, value_name = "PATH", conflicts_with = "token",
          value_parser = rmemfs_common::token::read_token_file)]
    token_file: Option<String>,
    /// Fabric to the memnodes: verbs, tcp, or auto.
    #[arg(long, default_value = "auto", value_parser = clap::value_parser!(Transport))]
    transport: Transport,
    /// Seconds a remote operation may take.
    #[arg(long, default_value_t = 5.0)]
    op_timeout: f64,
}

impl Remote {
    /// The token, from `--token` (or RMEMFS_TOKEN) or `--token-file`; empty if none.
    fn token(&self) -> &str {
        self.token
            .as_deref()
            .or(self.token_file.as_deref())
            .unwrap_or_default()
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List or destroy volumes.
    Volume {
        #[command(subcommand)]
        action: VolumeAction,
    },
    /// Check a volume offline (it must not be mounted): the namespace, every
    /// block reference, and chunks nothing references.
    Fsck {
        /// The volume.
        name: String,
        #[command(flatten)]
        remote: Remote,
        /// The volume's block size (fsd's --block-size when it was made).
        #[arg(long, default_value = "64K", value_parser = parse_size)]
        block_size: u64,
        /// Print one JSON object instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Show how a running mount is doing.
    ///
    /// Its memnodes (up or down, memory used), copies, cache, degraded and lost
    /// blocks, re-replication and scrub progress, checksum failures, from the status
    /// file its fsd rewrites once a second (docs/metrics.md). Exit 0 when healthy, 1
    /// when not (a memnode down, blocks degraded or lost, fsd stuck), 2 when
    /// MOUNTPOINT has no live rmemfs mount.
    Status {
        /// Where the filesystem is mounted.
        mountpoint: PathBuf,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// What each tenant of a memnode holds: memory and volumes against its quota,
    /// clients connected, requests refused for the quota.
    ///
    /// Read from the memnode's metrics endpoint (`memnode --metrics`), which shows
    /// every tenant and needs no tenant's token. A tenant marked "(removed)" is in the
    /// memnode's memory file but no longer in its tenants file: its memory is kept
    /// and no client can use it.
    Tenants {
        /// A memnode's metrics endpoint, HOST:PORT; repeat for every memnode.
        #[arg(long = "metrics", value_name = "HOST:PORT", required = true)]
        metrics: Vec<String>,
        /// Print a JSON array (one object per tenant per memnode) instead of a table.
        #[arg(long)]
        json: bool,
        /// Seconds each memnode may take to answer.
        #[arg(long, default_value_t = 10.0)]
        timeout: f64,
    },
    /// Declare an unreachable memnode of a running mount lost now, instead of at its
    /// fsd's --dead-time: its copies are re-made from other copies (blocks with no
    /// other copy read as EIO), and operations waiting for it stop waiting. A memnode
    /// that is up is left alone. Exit 0 when fsd declared it lost.
    DeclareLost {
        /// Where the filesystem is mounted.
        mountpoint: PathBuf,
        /// The memnode, HOST:PORT as on fsd's command line.
        memnode: String,
    },
}

#[derive(Debug, Subcommand)]
enum VolumeAction {
    /// The volumes each memnode holds.
    List {
        #[command(flatten)]
        remote: Remote,
        /// Print a JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Destroy a volume on every memnode named: its memory goes back to them.
    Destroy {
        name: String,
        #[command(flatten)]
        remote: Remote,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("rmemfs: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn timeout(r: &Remote) -> Duration {
    Duration::from_secs_f64(r.op_timeout.clamp(0.001, 3600.0))
}

/// One authenticated control connection to `memnode`.
fn connect(r: &Remote, memnode: &str) -> anyhow::Result<Box<dyn Endpoint>> {
    use anyhow::Context;
    let client = random_id();
    let ep = fabric::connect(r.transport, memnode, client, timeout(r), Duration::ZERO)
        .with_context(|| format!("connecting to memnode {memnode}"))?;
    let token = r.token().to_string();
    control::hello(ep.as_ref(), client, token.as_bytes())
        .with_context(|| format!("memnode {memnode}"))?;
    Ok(ep)
}

/// One volume of `volume list --json`: a JSON array of these, one per volume per
/// memnode.
#[derive(Serialize)]
struct VolumeRow<'a> {
    memnode: &'a str,
    name: String,
    id: u64,
    bytes: u64,
    chunks: u32,
    holder: u64,
}

/// `fsck --json`: one object (tests/src/volume.rs reads it).
#[derive(Serialize)]
struct FsckJson<'a> {
    generation: u64,
    log_entries: usize,
    inodes: usize,
    orphans: usize,
    lost_blocks: usize,
    inconsistencies: usize,
    leaked_chunks: usize,
    leaked_bytes: u64,
    problems: &'a [String],
    metadata: Vec<MetadataJson<'a>>,
    /// `null` when every memnode answered.
    missing: Option<&'a str>,
}

/// One memnode's copy of the metadata in `fsck --json`.
#[derive(Serialize)]
struct MetadataJson<'a> {
    memnode: &'a str,
    superblock: Area,
    checkpoint: Option<Area>,
    log: Option<Area>,
    problem: Option<&'a str>,
}

/// An area of a memnode's memory: `{"addr":A,"len":L}`.
#[derive(Serialize)]
struct Area {
    addr: u64,
    len: u64,
}

impl Area {
    fn of((addr, len): (u64, u64)) -> Area {
        Area { addr, len }
    }
}

/// `value` as one line of compact JSON.
fn json_line(value: &impl Serialize) -> String {
    // Strings, integers, options and arrays of them: serializing cannot fail.
    serde_json::to_string(value).unwrap_or_default()
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Volume {
            action: VolumeAction::List { remote, json },
        } => {
            let mut rows = Vec::new();
            for m in &remote.memnodes {
                let ep = connect(&remote, m)?;
                for v in admin::list(ep.as_ref())? {
                    rows.push((m.clone(), v));
                }
            }
            if json {
                let items: Vec<VolumeRow> = rows
                    .iter()
                    .map(|(m, v)| VolumeRow {
                        memnode: m,
                        name: String::from_utf8_lossy(&v.name).into_owned(),
                        id: v.volume_id,
                        bytes: v.bytes,
                        chunks: v.chunks,
                        holder: v.holder,
                    })
                    .collect();
                println!("{}", json_line(&items));
            } else {
                println!(
                    "{:<24} {:<18} {:>10} {:>7} {:<18} MEMNODE",
                    "NAME", "ID", "SIZE", "CHUNKS", "HOLDER"
                );
                for (m, v) in &rows {
                    println!(
                        "{:<24} {:<18} {:>10} {:>7} {:<18} {m}",
                        String::from_utf8_lossy(&v.name),
                        format!("{:#x}", v.volume_id),
                        format_size(v.bytes),
                        v.chunks,
                        if v.holder == 0 {
                            "-".to_string()
                        } else {
                            format!("{:#x}", v.holder)
                        }
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Volume {
            action: VolumeAction::Destroy { name, remote },
        } => {
            let mut missing = 0;
            for m in &remote.memnodes {
                let ep = connect(&remote, m)?;
                match admin::destroy(ep.as_ref(), &name) {
                    Ok(bytes) => {
                        println!("{m}: destroyed volume {name}, {} freed", format_size(bytes))
                    }
                    Err(e) if e.is_not_found() => {
                        missing += 1;
                        println!("{m}: no volume {name}");
                    }
                    Err(e) => anyhow::bail!("memnode {m}: {e}"),
                }
            }
            if missing == remote.memnodes.len() {
                anyhow::bail!("no memnode holds a volume {name}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Fsck {
            name,
            remote,
            block_size,
            json,
        } => fsck(&name, &remote, block_size, json),
        Command::Status { mountpoint, json } => status(&mountpoint, json),
        Command::Tenants {
            metrics,
            json,
            timeout,
        } => {
            let timeout = Duration::from_secs_f64(timeout.clamp(0.001, 3600.0));
            tenants::show(&metrics, json, timeout)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::DeclareLost {
            mountpoint,
            memnode,
        } => declare_lost(&mountpoint, &memnode),
    }
}

fn status(mountpoint: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let found = report::locate(mountpoint)?;
    let r = report::Report::new(&found.status, found.age);
    if json {
        println!("{}", r.to_json());
    } else {
        print!("{}", r.to_text());
    }
    Ok(if r.is_fine() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// How long `rmemfs declare-lost` waits for fsd to take its request (fsd looks once
/// a second).
const DECLARE_LOST_WAIT: Duration = Duration::from_secs(10);

fn declare_lost(mountpoint: &Path, memnode: &str) -> anyhow::Result<ExitCode> {
    use anyhow::Context;
    let found = report::locate(mountpoint)?;
    let Some(entry) = found.status.memnodes.iter().find(|m| m.name == memnode) else {
        let names: Vec<&str> = found
            .status
            .memnodes
            .iter()
            .map(|m| m.name.as_str())
            .collect();
        anyhow::bail!(
            "{memnode} is not a memnode of the mount on {} (its memnodes: {})",
            mountpoint.display(),
            names.join(", ")
        );
    };
    if entry.unreachable_secs.is_none() {
        println!(
            "memnode {memnode} is {}: nothing to declare",
            if entry.up { "up" } else { "already lost" }
        );
        return Ok(ExitCode::from(1));
    }
    let request = fsd::status::declare_lost_path(&found.file);
    std::fs::write(&request, format!("{memnode}\n"))
        .with_context(|| format!("writing the request {}", request.display()))?;
    let deadline = std::time::Instant::now() + DECLARE_LOST_WAIT;
    while request.exists() {
        if std::time::Instant::now() >= deadline {
            let _ = std::fs::remove_file(&request);
            anyhow::bail!("fsd did not take the request within {DECLARE_LOST_WAIT:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // The status written after the request says what became of it.
    std::thread::sleep(Duration::from_millis(1200));
    let after = report::locate(mountpoint)?;
    let now = after.status.memnodes.iter().find(|m| m.name == memnode);
    match now {
        Some(m) if !m.up && m.unreachable_secs.is_none() => {
            println!("memnode {memnode} declared lost: its copies are re-made from other copies");
            Ok(ExitCode::SUCCESS)
        }
        Some(m) if m.up => {
            println!("memnode {memnode} came back before fsd took the request: nothing was lost");
            Ok(ExitCode::from(1))
        }
        _ => anyhow::bail!("fsd took the request but memnode {memnode} is still unreachable"),
    }
}

fn fsck(name: &str, r: &Remote, block_size: u64, json: bool) -> anyhow::Result<ExitCode> {
    use anyhow::Context;
    let (transport, t) = (r.transport, timeout(r));
    let connector: Arc<Connector> = Arc::new(move |peer: &str, client: u64| {
        fabric::connect(transport, peer, client, t, Duration::ZERO)
    });
    let store = RemoteStore::connect(
        &r.memnodes,
        &RemoteConfig {
            block_size,
            chunk_size: block_size,
            connections: 1,
            client_id: random_id(),
            token: r.token().as_bytes().to_vec(),
            replicas: 1,
            watch_interval: Duration::from_secs(3600),
            dead_time: Duration::from_secs(3600),
            // A memnode out of reach fails the check rather than holding it up.
            unreachable_timeout: Some(t),
            volume: Some(VolumeSpec {
                name: name.to_string(),
                create: false,
                takeover: false,
            }),
        },
        connector,
    )
    .with_context(|| format!("opening volume {name}"))?;
    let result = admin::fsck(&store, name);
    store.close_volume();
    let report = match result {
        Ok(Some(r)) => r,
        Ok(None) => {
            println!("volume {name} holds no metadata yet (never mounted)");
            return Ok(ExitCode::SUCCESS);
        }
        Err(fsd::volume::VolumeError::BlockSize { stored, .. }) if stored as u64 != block_size => {
            drop(store);
            return fsck(name, r, stored as u64, json);
        }
        Err(e) => return Err(e.into()),
    };
    if json {
        print_json(&report);
    } else {
        print_lines(&report);
    }
    let clean = report.problems.is_empty() && report.leaked_chunks == 0 && report.missing.is_none();
    Ok(if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn print_lines(r: &FsckReport) {
    println!("generation: {}", r.generation);
    println!("log entries: {}", r.log_entries);
    println!("inodes: {}", r.inodes);
    println!("orphans: {} (reclaimed at the next mount)", r.orphans);
    println!("lost blocks: {}", r.lost_blocks);
    println!("inconsistencies: {}", r.problems.len());
    println!(
        "leaked chunks: {} ({}){}",
        r.leaked_chunks,
        format_size(r.leaked_bytes),
        if r.leaked_chunks > 0 {
            // Expected after fsd was killed: it takes chunks ahead of the commits that
            // name them. After a clean unmount there should be none.
            ": nothing references them; the next mount gives them back (after a crash: \
             space fsd took after its last commit)"
        } else {
            ""
        }
    );
    if let Some(m) = &r.missing {
        println!(
            "incomplete: {m}; a missing memnode may hold newer metadata than generation {}, \
             and its chunks were not checked",
            r.generation
        );
    }
    for p in &r.problems {
        println!("  problem: {p}");
    }
    for m in &r.metadata {
        if let Some(p) = &m.problem {
            println!("  metadata copy on {}: {p}", m.memnode);
        }
    }
}

fn print_json(r: &FsckReport) {
    println!("{}", fsck_json(r));
}

fn fsck_json(r: &FsckReport) -> String {
    let metadata = r
        .metadata
        .iter()
        .map(|m| MetadataJson {
            memnode: &m.memnode,
            superblock: Area::of(m.superblock),
            checkpoint: m.checkpoint.map(Area::of),
            log: m.log.map(Area::of),
            problem: m.problem.as_deref(),
        })
        .collect();
    json_line(&FsckJson {
        generation: r.generation,
        log_entries: r.log_entries,
        inodes: r.inodes,
        orphans: r.orphans,
        lost_blocks: r.lost_blocks,
        inconsistencies: r.problems.len(),
        leaked_chunks: r.leaked_chunks,
        leaked_bytes: r.leaked_bytes,
        problems: &r.problems,
        metadata,
        missing: r.missing.as_deref(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use fsd::volume::admin::MetadataPlace;

    #[test]
    fn volume_rows_are_the_compact_json_array_scripts_read() {
        let rows = [VolumeRow {
            memnode: "127.0.0.1:7000",
            name: "v \"1\"\\\n".into(),
            id: 17,
            bytes: 1 << 20,
            chunks: 2,
            holder: 0,
        }];
        assert_eq!(
            json_line(&rows),
            r#"[{"memnode":"127.0.0.1:7000","name":"v \"1\"\\\n","id":17,"bytes":1048576,"chunks":2,"holder":0}]"#
        );
    }

    #[test]
    fn fsck_json_names_every_figure_and_nulls_what_is_absent() {
        let report = FsckReport {
            generation: 9,
            inodes: 4,
            log_entries: 3,
            orphans: 1,
            problems: vec!["inode 5: block 2 lost".into()],
            leaked_chunks: 2,
            leaked_bytes: 4096,
            lost_blocks: 1,
            metadata: vec![MetadataPlace {
                memnode: "m0".into(),
                superblock: (4096, 64),
                checkpoint: Some((8192, 128)),
                log: None,
                problem: None,
            }],
            missing: None,
        };
        assert_eq!(
            fsck_json(&report),
            concat!(
                r#"{"generation":9,"log_entries":3,"inodes":4,"orphans":1,"lost_blocks":1,"#,
                r#""inconsistencies":1,"leaked_chunks":2,"leaked_bytes":4096,"#,
                r#""problems":["inode 5: block 2 lost"],"metadata":[{"memnode":"m0","#,
                r#""superblock":{"addr":4096,"len":64},"checkpoint":{"addr":8192,"len":128},"#,
                r#""log":null,"problem":null}],"missing":null}"#
            )
        );
    }
}
