//! How `rmemfs status MOUNTPOINT` reaches a running fsd: through a **status file**
//! fsd keeps, not a socket. Once a second fsd replaces (temporary file, then rename)
//! `<runtime dir>/<escaped mountpoint>.json` (`paths.rs`: `/run/rmemfs/mnt-rmemfs.json`
//! for a root fsd on `/mnt/rmemfs`) with a [`StatusFile`]: every counter of
//! `--stats-file` (the same flat object), plus the mountpoint, fsd's pid and version,
//! the volume, and per memnode its name, state, copies and memory as its last
//! heartbeat answered. fsd removes the file when it exits.
//!
//! Why a file: it needs no listener, no protocol and no permission beyond reading a
//! file; it costs fsd one small write a second off the data path (the per-memnode
//! usage comes from the heartbeat's Stat, no extra round trip); and a reader can
//! never make fsd block or misbehave. The price is that a file can outlive its fsd
//! (SIGKILL, crash), so the reader checks, in `report.rs`: that the mountpoint is an
//! rmemfs mount in `/proc/self/mountinfo`, that the pid in the file is alive, and how
//! long ago the file was written; and it says plainly which check failed. An fsd
//! that starts removes the files of fsds that are gone (`remove_stale`).

pub mod paths;
pub mod report;

use crate::fs::RmemFs;
use crate::stats::Snapshot;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// One memnode as the status file describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemnodeEntry {
    /// As given on fsd's command line (HOST:PORT).
    pub name: String,
    pub up: bool,
    /// Block copies it holds, as of fsd's last count.
    pub copies: u64,
    /// Its memory as its last heartbeat answered (absent while it is down and
    /// before the first heartbeat).
    pub capacity: Option<u64>,
    /// Memory it has handed out, to this fsd and to every other client.
    pub used: Option<u64>,
    /// Of that, this fsd's chunks that hold no block yet.
    pub held_free: Option<u64>,
    /// While it is unreachable (its copies kept, fsd reconnecting): for how many
    /// seconds. Absent while up, and from an older fsd.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreachable_secs: Option<u64>,
}

/// What a running fsd tells `rmemfs status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusFile {
    pub mountpoint: String,
    pub pid: u32,
    pub fsd_version: String,
    /// The durable volume mounted; `None` for scratch memory.
    pub volume: Option<String>,
    /// True when fsd serves from a memnode inside itself (no `--memnode`).
    pub embedded_memnode: bool,
    /// When fsd wrote this, in milliseconds since the Unix epoch.
    pub updated_unix_ms: u64,
    pub memnodes: Vec<MemnodeEntry>,
    /// Every counter of `--stats-file`, under the same names.
    #[serde(flatten)]
    pub counters: BTreeMap<String, u64>,
}

/// What does not change while fsd runs.
#[derive(Debug, Clone)]
pub struct MountInfo {
    pub mountpoint: PathBuf,
    pub volume: Option<String>,
    pub embedded_memnode: bool,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl StatusFile {
    /// The status of `fs` now.
    pub fn of(fs: &RmemFs, info: &MountInfo) -> StatusFile {
        let snap = Snapshot::of(fs);
        let remote = fs.remote();
        let memnodes = (0..remote.node_count())
            .map(|i| {
                let usage = remote.node_usage(i);
                MemnodeEntry {
                    name: remote.node_name(i).to_string(),
                    up: snap.node_up.get(i).copied().unwrap_or(false),
                    copies: snap.redundancy.per_node.get(i).copied().unwrap_or(0),
                    capacity: usage.map(|u| u.capacity),
                    used: usage.map(|u| u.used),
                    held_free: usage.map(|u| u.held_free),
                    unreachable_secs: match remote.node_state(i) {
                        Some(crate::remote::NodeState::Unreachable { for_, .. }) => {
                            Some(for_.as_secs())
                        }
                        _ => None,
                    },
                }
            })
            .collect();
        StatusFile {
            mountpoint: info.mountpoint.to_string_lossy().into_owned(),
            pid: std::process::id(),
            fsd_version: env!("CARGO_PKG_VERSION").to_string(),
            volume: info.volume.clone(),
            embedded_memnode: info.embedded_memnode,
            updated_unix_ms: now_ms(),
            memnodes,
            counters: counters_of(&snap),
        }
    }

    pub fn to_json(&self) -> String {
        // Strings, integers and a map of integers: serializing cannot fail.
        let mut text = serde_json::to_string_pretty(self).unwrap_or_default();
        text.push('\n');
        text
    }
}

/// The `--stats-file` object of `snap`, as a map.
fn counters_of(snap: &Snapshot) -> BTreeMap<String, u64> {
    serde_json::to_value(snap.record())
        .and_then(serde_json::from_value)
        .unwrap_or_default()
}

/// fsd's status file: written by [`StatusWriter::write`], removed on drop.
pub struct StatusWriter {
    path: PathBuf,
    info: MountInfo,
    /// Whether the last write failed (so a failure is logged once, not each second).
    failing: bool,
}

impl StatusWriter {
    /// The writer for the mount `info` in `dir`, which it creates if need be. `None`
    /// (logged) when the directory cannot be made: the mount then has no status.
    pub fn create(dir: &Path, info: MountInfo) -> Option<StatusWriter> {
        if let Err(e) = std::fs::create_dir_all(dir) {
            log::warn!(
                "cannot create {} ({e}): `rmemfs status` will not see this mount",
                dir.display()
            );
            return None;
        }
        let stale = remove_stale(dir);
        if stale > 0 {
            log::info!(
                "removed {stale} status file(s) in {} of fsds that no longer run",
                dir.display()
            );
        }
        let path = dir.join(paths::file_name(&info.mountpoint));
        log::info!("status for `rmemfs status` in {}", path.display());
        Some(StatusWriter {
            path,
            info,
            failing: false,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Replaces the file with the status of `fs` now, after carrying out a request
    /// to declare memnodes lost that `rmemfs declare-lost` left beside it.
    pub fn write(&mut self, fs: &RmemFs) {
        take_declare_lost(&declare_lost_path(&self.path), fs);
        let status = StatusFile::of(fs, &self.info);
        match crate::stats::replace_file(&self.path, status.to_json().as_bytes()) {
            Ok(()) => self.failing = false,
            Err(e) if !self.failing => {
                self.failing = true;
                log::warn!("cannot write status to {}: {e}", self.path.display());
            }
            Err(_) => {}
        }
    }
}

/// Where `rmemfs declare-lost` asks the fsd whose status file is `status` to declare
/// memnodes lost: a file beside it, of memnode names (as on fsd's command line), one
/// a line. Only who may write the runtime directory (root, for a root fsd) can ask.
pub fn declare_lost_path(status: &Path) -> PathBuf {
    let mut p = status.as_os_str().to_owned();
    p.push(".declare-lost");
    PathBuf::from(p)
}

/// Carries out (and removes) a declare-lost request at `path`, if there is one: each
/// memnode named that is unreachable now has its copies declared lost (they are
/// re-made from other copies); one that is up, or not fsd's, is left alone (logged).
fn take_declare_lost(path: &Path, fs: &RmemFs) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return;
    };
    let _ = std::fs::remove_file(path);
    let remote = fs.remote();
    for name in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        match (0..remote.node_count()).find(|&i| remote.node_name(i) == name) {
            None => log::warn!("declare-lost: {name:?} is not one of this fsd's memnodes"),
            Some(i) if remote.declare_lost(i) => {
                log::warn!("declare-lost: memnode {name} declared lost by the operator")
            }
            Some(_) => log::warn!("declare-lost: memnode {name} is not unreachable: left alone"),
        }
    }
}

/// The most of a status file read to tell whose it is (they are a few KiB).
const MAX_STATUS_FILE: u64 = 1 << 20;

/// Removes the status files in `dir` of fsds that are gone, and what such an fsd
/// left of a write (`.tmp`): an fsd that was killed or crashed could not remove
/// its own, and they would pile up in `/run/rmemfs` (a tmpfs) across restarts.
/// Files that are not status files, or whose fsd runs, are left alone. Returns
/// how many status files it removed.
fn remove_stale(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for path in entries.flatten().map(|e| e.path()) {
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let small =
            std::fs::metadata(&path).is_ok_and(|m| m.is_file() && m.len() <= MAX_STATUS_FILE);
        let status = small
            .then(|| std::fs::read_to_string(&path).ok())
            .flatten()
            .and_then(|text| serde_json::from_str::<StatusFile>(&text).ok());
        let Some(status) = status else { continue };
        if report::pid_alive(status.pid) {
            continue;
        }
        if std::fs::remove_file(&path).is_ok() {
            removed += 1;
        }
        let mut tmp = path.into_os_string();
        tmp.push(".tmp");
        let _ = std::fs::remove_file(tmp);
    }
    removed
}

impl Drop for StatusWriter {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> StatusFile {
        let mut counters = BTreeMap::new();
        for (k, v) in [
            ("blocks", 100),
            ("blocks_degraded", 0),
            ("blocks_lost", 0),
            ("replicas", 2),
            ("block_size", 65536),
            ("cache_pages", 10),
            ("cache_capacity_pages", 4096),
            ("remote_write_bytes", 1 << 20),
        ] {
            counters.insert(k.to_string(), v);
        }
        StatusFile {
            mountpoint: "/mnt/rmemfs".into(),
            pid: 4242,
            fsd_version: "0.1.0".into(),
            volume: Some("mine".into()),
            embedded_memnode: false,
            updated_unix_ms: 1_700_000_000_000,
            memnodes: vec![
                MemnodeEntry {
                    name: "10.0.0.2:7070".into(),
                    up: true,
                    copies: 100,
                    capacity: Some(4 << 30),
                    used: Some(1 << 30),
                    held_free: Some(1 << 20),
                    unreachable_secs: None,
                },
                MemnodeEntry {
                    name: "10.0.0.3:7070".into(),
                    up: true,
                    copies: 100,
                    capacity: Some(4 << 30),
                    used: Some(1 << 30),
                    held_free: Some(0),
                    unreachable_secs: None,
                },
            ],
            counters,
        }
    }

    #[test]
    fn the_file_holds_the_stats_object_and_reads_back_whole() {
        let s = sample();
        let json = s.to_json();
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        // The stats counters sit at the top level, as in --stats-file.
        assert_eq!(value["remote_write_bytes"], 1 << 20);
        assert_eq!(value["mountpoint"], "/mnt/rmemfs");
        assert_eq!(value["memnodes"][1]["name"], "10.0.0.3:7070");
        let back: StatusFile = serde_json::from_str(&json).expect("reads back");
        assert_eq!(back, s);
    }

    #[test]
    fn the_stats_object_becomes_the_counters() {
        let snap = Snapshot {
            remote_reads: 3,
            copies_restored: 7,
            node_up: vec![true],
            ..Snapshot::default()
        };
        let c = counters_of(&snap);
        assert_eq!(c.get("remote_reads"), Some(&3));
        assert_eq!(c.get("rereplicated_blocks"), Some(&7));
        assert_eq!(c.get("node0_up"), Some(&1));
        assert_eq!(c.get("nodes_down"), Some(&0));
    }

    #[test]
    fn a_new_writer_removes_the_files_of_fsds_that_are_gone() {
        let dir = std::env::temp_dir().join(format!("fsd-stale-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let with_pid = |pid: u32| {
            let mut s = sample();
            s.pid = pid;
            s.to_json()
        };
        // No process has a pid this high (pid_max is at most 2^22).
        let gone = dir.join("mnt-gone.json");
        std::fs::write(&gone, with_pid(i32::MAX as u32)).unwrap();
        std::fs::write(dir.join("mnt-gone.json.tmp"), "partial").unwrap();
        let live = dir.join("mnt-live.json");
        std::fs::write(&live, with_pid(std::process::id())).unwrap();
        let other = dir.join("notes.json");
        std::fs::write(&other, "{\"not\": \"a status file\"}").unwrap();
        let info = MountInfo {
            mountpoint: PathBuf::from("/mnt/new"),
            volume: None,
            embedded_memnode: true,
        };
        let w = StatusWriter::create(&dir, info).expect("the directory is there");
        assert!(!gone.exists(), "the file of an fsd that is gone is removed");
        assert!(
            !dir.join("mnt-gone.json.tmp").exists(),
            "and what it left of a write"
        );
        assert!(live.exists(), "the file of a running fsd stays");
        assert!(other.exists(), "a file that is not a status file stays");
        drop(w);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_writer_removes_its_file_when_dropped() {
        let dir = std::env::temp_dir().join(format!("fsd-status-{}", std::process::id()));
        let info = MountInfo {
            mountpoint: PathBuf::from("/mnt/x"),
            volume: None,
            embedded_memnode: true,
        };
        let w = StatusWriter::create(&dir, info).expect("the directory is made");
        assert_eq!(w.path(), dir.join("mnt-x.json"));
        crate::stats::replace_file(w.path(), sample().to_json().as_bytes()).unwrap();
        assert!(w.path().exists());
        let path = w.path().to_path_buf();
        drop(w);
        assert!(!path.exists(), "the file goes with its writer");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
