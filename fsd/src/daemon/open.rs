//! From the command line to a ready filesystem: the memnodes fsd uses (an embedded
//! one started in-process when none is given), the fabric each is reached over,
//! the connection to them (waiting for a volume another fsd is letting go of), and
//! the filesystem on top, scratch or a durable volume. Kept apart from `run` so the
//! start-up reads as steps and each step's messages sit with its code.

use super::Options;
use crate::fs::{Caller, RmemFs};
use crate::remote::{Connector, RemoteConfig, RemoteStore, VolumeSpec};
use crate::volume::{MountPolicy, Volume};
use anyhow::Context;
use rmemfs_common::control::random_id;
use rmemfs_common::fabric::{self, Transport};
use rmemfs_common::size::format_size;
use std::sync::Arc;
use std::time::Duration;

/// How often each memnode gets a heartbeat, or a reconnect attempt while it is down.
const WATCH_INTERVAL: Duration = Duration::from_secs(1);
/// How long opening a volume waits for another client to let go of it: an fsd that
/// is unmounting it still holds it for a moment after umount(8) returns (FUSE
/// unmounts without waiting for the daemon), so `umount && mount` must not fail; and
/// an fsd that crashed holds it until its lease runs out (10 s by default: the
/// memnode cannot tell a crash from a network blip), so a restart must not fail.
const VOLUME_BUSY_PATIENCE: Duration = Duration::from_secs(20);

/// The memnodes to use and the token to present to them: `--memnode` and the
/// token given, or, without any `--memnode`, an embedded memnode started here
/// (returned too: it serves as long as it is kept) with a private token.
pub(super) fn memnodes(
    opts: &Options,
    poll: Duration,
) -> anyhow::Result<(Vec<String>, Vec<u8>, Option<memnode::Memnode>)> {
    let mut token = opts.token().unwrap_or_default().as_bytes().to_vec();
    let mut memnodes = opts.memnodes.clone();
    let embedded = if memnodes.is_empty() {
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
            tenants: None,
            huge_pages: false,
            // As asked, not resolved: with auto it shares its region by mapping, and
            // this fsd (auto too) maps it.
            transport: opts.transport,
            poll,
            lease: memnode::DEFAULT_LEASE,
            session_grace: memnode::DEFAULT_SESSION_GRACE,
            memory_file: None,
            connections: rmemfs_common::fabric::ConnectionLimits::default(),
        })
        .context("starting the embedded memnode")?;
        if let Some(v) = &opts.volume {
            log::warn!(
                "volume {v} is on the embedded memnode: it lives as long as this fsd; run a \
                 memnode beside fsd (--memnode) for a volume that outlives it"
            );
        }
        log::info!(
            "no --memnode given: embedded memnode of {} on {} over {}",
            format_size(opts.embedded_size),
            node.local_addr(),
            node.transport_choice()
        );
        memnodes.push(node.local_addr().to_string());
        Some(node)
    } else {
        None
    };
    Ok((memnodes, token, embedded))
}

/// Logs the fabric each memnode is reached over; true when any is RDMA (then the
/// cache's buffers are registered).
pub(super) fn any_over_rdma(opts: &Options, memnodes: &[String]) -> anyhow::Result<bool> {
    let mut rdma = false;
    for m in memnodes {
        let t = fabric::resolve_for(opts.transport, m)?;
        rdma |= t == Transport::Verbs;
        let maybe_mapped = if opts.transport == Transport::Auto && t == Transport::Tcp {
            ", mapped if it is on this host and shares its region"
        } else {
            ""
        };
        log::info!(
            "memnode {m} over {t}{maybe_mapped} (--transport {}: {})",
            opts.transport,
            opts.transport.describe_choice()
        );
    }
    Ok(rdma)
}

/// Connects to the memnodes as a new client (holding `--volume`, if given).
pub(super) fn connect(
    opts: &Options,
    memnodes: &[String],
    token: Vec<u8>,
    timeout: Duration,
    poll: Duration,
) -> anyhow::Result<RemoteStore> {
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
    connect_waiting_for_volume(memnodes, &config, connector).context("connecting to memnodes")
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

/// The filesystem on `remote`: scratch memory, or `--volume` mounted (created on
/// first use); its cache registered with the RDMA device when `rdma`.
pub(super) fn filesystem(
    opts: &Options,
    remote: RemoteStore,
    owner: Caller,
    rdma: bool,
) -> anyhow::Result<Arc<RmemFs>> {
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
    Ok(fs)
}
