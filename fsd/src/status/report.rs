//! `rmemfs status`: finding the status file of a mount, checking that it speaks for
//! a live fsd ([`locate`]), and showing it to a person ([`Report::to_text`]) or a
//! script ([`Report::to_json`]).
//!
//! Nothing here touches the mount itself (no stat of the mountpoint, which a stuck
//! fsd would never answer): the mount is found in `/proc/self/mountinfo`, fsd's
//! liveness in `/proc/PID`, everything else in the status file.

use super::paths::{self, absolute_mountpoint};
use super::{MemnodeEntry, StatusFile};
use rmemfs_common::size::format_size;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use thiserror::Error;

/// A status file older than this means fsd is stuck (it writes once a second).
pub const STALE_AFTER: Duration = Duration::from_secs(5);
/// Width of a progress bar, in characters between its brackets.
const BAR: usize = 30;

/// Why there is no status to show.
#[derive(Debug, Error)]
pub enum StatusError {
    #[error("{path}: {error}")]
    Path {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("cannot read /proc/self/mountinfo: {0}")]
    MountInfo(std::io::Error),
    #[error("{0} is not mounted")]
    NotMounted(PathBuf),
    #[error("{path} is not an rmemfs mount (it is {fstype}, source {device})")]
    NotRmemfs {
        path: PathBuf,
        fstype: String,
        device: String,
    },
    #[error(
        "{path} is an rmemfs mount, but no fsd status file {name} is in {dirs} (fsd \
         writes it there once a second; an fsd started with another RMEMFS_RUNTIME_DIR \
         or by another user without XDG_RUNTIME_DIR writes elsewhere, or none)"
    )]
    NoStatus {
        path: PathBuf,
        name: String,
        dirs: String,
    },
    #[error("the status file {file} cannot be read: {error}")]
    Unreadable { file: PathBuf, error: String },
    #[error(
        "fsd (pid {pid}) that mounted {path} is no longer running: the mount is dead \
         (unmount it: fusermount3 -u {path}); its last status was written {age} ago"
    )]
    FsdGone {
        path: PathBuf,
        pid: u32,
        age: String,
    },
}

/// A status file found for a live fsd.
#[derive(Debug)]
pub struct Located {
    pub file: PathBuf,
    pub status: StatusFile,
    /// How long ago fsd wrote it.
    pub age: Duration,
}

/// What /proc/self/mountinfo says is mounted at `mountpoint` (the last mount there
/// wins): its type and source.
pub fn mount_entry(mountinfo: &str, mountpoint: &Path) -> Option<(String, String)> {
    let want = mountpoint.to_string_lossy();
    mountinfo.lines().rev().find_map(|line| {
        // id parent major:minor root MOUNTPOINT options [optional...] - TYPE SOURCE opts
        let mut fields = line.split(' ');
        let point = unescape_mountinfo(fields.nth(4)?);
        let mut rest = fields.skip_while(|f| *f != "-").skip(1);
        let fstype = rest.next()?.to_string();
        let source = unescape_mountinfo(rest.next()?);
        (point == want).then_some((fstype, source))
    })
}

/// True for the type and source of an fsd mount: `fuse.rmemfs`, or `fuse` with
/// source `rmemfs` (fuser's own mount(2) as root drops the subtype).
pub fn is_rmemfs(fstype: &str, source: &str) -> bool {
    fstype == "fuse.rmemfs" || (fstype == "fuse" && source == "rmemfs")
}

/// Undoes mountinfo's octal escapes (`\040` for a space, ...).
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 4 <= b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = b[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
            out.push(v as u8);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn age_of(s: &StatusFile) -> Duration {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    Duration::from_millis(now.saturating_sub(s.updated_unix_ms))
}

/// Whether a process `pid` runs (in this pid namespace).
pub(super) fn pid_alive(pid: u32) -> bool {
    pid != 0 && Path::new(&format!("/proc/{pid}")).exists()
}

/// Finds the status of the fsd serving `mountpoint`, checking that it is an rmemfs
/// mount and that the fsd that wrote the status still runs.
pub fn locate(mountpoint: &Path) -> Result<Located, StatusError> {
    let path = absolute_mountpoint(mountpoint).map_err(|error| StatusError::Path {
        path: mountpoint.to_path_buf(),
        error,
    })?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").map_err(StatusError::MountInfo)?;
    match mount_entry(&info, &path) {
        None => return Err(StatusError::NotMounted(path)),
        Some((fstype, source)) if !is_rmemfs(&fstype, &source) => {
            return Err(StatusError::NotRmemfs {
                path,
                fstype,
                device: source,
            })
        }
        Some(_) => {}
    }
    let name = paths::file_name(&path);
    let dirs = paths::search_dirs();
    let mut found: Vec<(PathBuf, StatusFile)> = Vec::new();
    for dir in &dirs {
        let file = dir.join(&name);
        let text = match std::fs::read_to_string(&file) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(StatusError::Unreadable {
                    file,
                    error: e.to_string(),
                })
            }
        };
        let status: StatusFile =
            serde_json::from_str(&text).map_err(|e| StatusError::Unreadable {
                file: file.clone(),
                error: e.to_string(),
            })?;
        found.push((file, status));
    }
    // The newest first: a file a dead fsd left elsewhere loses to a live one's.
    found.sort_by_key(|(_, s)| std::cmp::Reverse(s.updated_unix_ms));
    let Some(newest) = found.first() else {
        return Err(StatusError::NoStatus {
            path,
            name,
            dirs: dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        });
    };
    let gone = StatusError::FsdGone {
        path: path.clone(),
        pid: newest.1.pid,
        age: format!("{:.0} s", age_of(&newest.1).as_secs_f64()),
    };
    let (file, status) = found
        .into_iter()
        .find(|(_, s)| pid_alive(s.pid))
        .ok_or(gone)?;
    let age = age_of(&status);
    Ok(Located { file, status, age })
}

/// How the mount is doing, worst first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Health {
    /// Some blocks have no copy left: their data is gone (reads give EIO).
    DataLost,
    /// A memnode is down or blocks have fewer copies than `--replicas`.
    Degraded,
    Healthy,
}

/// Cache use.
#[derive(Debug, Clone, Serialize)]
pub struct CacheUse {
    pub pages: u64,
    pub capacity_pages: u64,
    pub bytes: u64,
    pub capacity_bytes: u64,
}

/// Re-replication: blocks back to full copies out of all.
#[derive(Debug, Clone, Serialize)]
pub struct Rereplication {
    /// `idle` (nothing to do), `running` (blocks are being copied) or `waiting` (too
    /// few memnodes up to hold `--replicas` copies).
    pub state: &'static str,
    /// Blocks with every copy.
    pub blocks_whole: u64,
    pub blocks: u64,
    /// Copies written since fsd started.
    pub copies_restored: u64,
}

/// The scrubber.
#[derive(Debug, Clone, Serialize)]
pub struct Scrub {
    pub passes: u64,
    pub pass_under_way: bool,
    pub pass_blocks: u64,
    pub bytes: u64,
    pub bad_pages: u64,
}

/// Everything `rmemfs status` shows (and prints with `--json`).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub mountpoint: String,
    pub pid: u32,
    pub fsd_version: String,
    pub volume: Option<String>,
    pub embedded_memnode: bool,
    pub updated_secs_ago: f64,
    /// fsd has not written its status for [`STALE_AFTER`]: it may be stuck.
    pub stale: bool,
    pub health: Health,
    /// What is wrong, one sentence each (empty when healthy and fresh).
    pub problems: Vec<String>,
    pub replicas: u64,
    pub block_size: u64,
    pub memnodes_up: usize,
    pub memnodes: Vec<MemnodeEntry>,
    pub cache: CacheUse,
    pub blocks: u64,
    pub blocks_degraded: u64,
    pub blocks_lost: u64,
    pub rereplication: Rereplication,
    pub scrub: Scrub,
    pub checksum_failures: u64,
    pub pages_repaired: u64,
    /// Every counter of the status file (the `--stats-file` object).
    pub counters: BTreeMap<String, u64>,
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

impl Report {
    /// The report on `s`, written `age` ago.
    pub fn new(s: &StatusFile, age: Duration) -> Report {
        let c = |k: &str| s.counters.get(k).copied().unwrap_or(0);
        let replicas = c("replicas").max(1);
        let (blocks, degraded, lost) = (c("blocks"), c("blocks_degraded"), c("blocks_lost"));
        let up = s.memnodes.iter().filter(|m| m.up).count();
        let stale = age > STALE_AFTER;
        let mut problems = Vec::new();
        for m in s.memnodes.iter().filter(|m| !m.up) {
            problems.push(match m.unreachable_secs {
                Some(secs) => format!(
                    "memnode {} is unreachable for {secs} s: its {} kept, fsd is reconnecting (lost only past the dead time)",
                    m.name,
                    plural(m.copies, "copy is", "copies are")
                ),
                None => format!("memnode {} is down", m.name),
            });
        }
        let unreachable = c("blocks_unreachable");
        if unreachable > 0 {
            problems.push(format!(
                "{} every copy on an unreachable memnode (reading them waits for it)",
                plural(unreachable, "block has", "blocks have")
            ));
        }
        if degraded > 0 {
            problems.push(format!(
                "{} fewer than {replicas} copies",
                plural(degraded, "block has", "blocks have")
            ));
        }
        if lost > 0 {
            problems.push(format!(
                "{} no copy left (reading them fails with EIO)",
                plural(lost, "block has", "blocks have")
            ));
        }
        if stale {
            problems.push(format!(
                "fsd has not updated its status for {:.0} s: it may be stuck",
                age.as_secs_f64()
            ));
        }
        let health = if lost > 0 {
            Health::DataLost
        } else if degraded > 0 || up < s.memnodes.len() {
            Health::Degraded
        } else {
            Health::Healthy
        };
        let state = if degraded == 0 {
            "idle"
        } else if (up as u64) < replicas {
            "waiting"
        } else {
            "running"
        };
        let block_size = c("block_size");
        Report {
            mountpoint: s.mountpoint.clone(),
            pid: s.pid,
            fsd_version: s.fsd_version.clone(),
            volume: s.volume.clone(),
            embedded_memnode: s.embedded_memnode,
            updated_secs_ago: age.as_secs_f64(),
            stale,
            health,
            problems,
            replicas,
            block_size,
            memnodes_up: up,
            memnodes: s.memnodes.clone(),
            cache: CacheUse {
                pages: c("cache_pages"),
                capacity_pages: c("cache_capacity_pages"),
                bytes: c("cache_pages").saturating_mul(block_size),
                capacity_bytes: c("cache_capacity_pages").saturating_mul(block_size),
            },
            blocks,
            blocks_degraded: degraded,
            blocks_lost: lost,
            rereplication: Rereplication {
                state,
                blocks_whole: blocks.saturating_sub(degraded.saturating_add(lost)),
                blocks,
                copies_restored: c("rereplicated_blocks"),
            },
            scrub: Scrub {
                passes: c("scrub_passes"),
                pass_under_way: c("scrub_pass_blocks") > 0,
                pass_blocks: c("scrub_pass_blocks"),
                bytes: c("scrub_bytes"),
                bad_pages: c("scrub_bad_pages"),
            },
            checksum_failures: c("checksum_failures"),
            pages_repaired: c("pages_repaired"),
            counters: s.counters.clone(),
        }
    }

    /// Healthy and fresh: what `rmemfs status` exits 0 for.
    pub fn is_fine(&self) -> bool {
        self.health == Health::Healthy && !self.stale
    }

    pub fn to_json(&self) -> String {
        // Strings, numbers and maps: serializing cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// The report for a person: the verdict on the first line, then one line per
    /// part, a progress bar where re-replication or a scrub pass is under way.
    pub fn to_text(&self) -> String {
        let mut o = String::new();
        let verdict = match self.health {
            Health::Healthy => "healthy".to_string(),
            Health::Degraded => "DEGRADED".to_string(),
            Health::DataLost => "DATA LOST".to_string(),
        };
        let _ = writeln!(o, "{}: {verdict}", self.mountpoint);
        for p in &self.problems {
            let _ = writeln!(o, "  ! {p}");
        }
        let source = match (&self.volume, self.embedded_memnode) {
            (Some(v), _) => format!("volume {v}"),
            (None, true) => "scratch memory on fsd's embedded memnode".to_string(),
            (None, false) => "scratch memory".to_string(),
        };
        let _ = writeln!(
            o,
            "  {source}; {}, {} blocks; fsd pid {} ({}), status {:.1} s old",
            plural(self.replicas, "copy", "copies"),
            format_size(self.block_size),
            self.pid,
            self.fsd_version,
            self.updated_secs_ago
        );
        let _ = writeln!(
            o,
            "\nmemnodes: {} of {} up",
            self.memnodes_up,
            self.memnodes.len()
        );
        let width = self
            .memnodes
            .iter()
            .map(|m| m.name.len())
            .max()
            .unwrap_or(0)
            .max(7);
        let _ = writeln!(
            o,
            "  {:<width$}  {:<11}  {:>10}  {:>10}  {:>10}",
            "MEMNODE", "STATE", "USED", "CAPACITY", "COPIES"
        );
        for m in &self.memnodes {
            let size = |v: Option<u64>| v.map_or_else(|| "-".to_string(), format_size);
            let _ = writeln!(
                o,
                "  {:<width$}  {:<11}  {:>10}  {:>10}  {:>10}",
                m.name,
                match (m.up, m.unreachable_secs) {
                    (true, _) => "up",
                    (false, Some(_)) => "UNREACHABLE",
                    (false, None) => "DOWN",
                },
                size(m.used),
                size(m.capacity),
                m.copies
            );
        }
        let _ = writeln!(o);
        let cache = &self.cache;
        let _ = writeln!(
            o,
            "{:<15}{} of {} ({})",
            "cache",
            format_size(cache.bytes),
            format_size(cache.capacity_bytes),
            percent(cache.pages, cache.capacity_pages)
        );
        let _ = writeln!(
            o,
            "{:<15}{} ({} degraded, {} lost)",
            "blocks", self.blocks, self.blocks_degraded, self.blocks_lost
        );
        let r = &self.rereplication;
        let restored = plural(r.copies_restored, "copy", "copies");
        let line = match r.state {
            "idle" => format!(
                "idle: every block has its {}; {restored} restored since fsd started",
                plural(self.replicas, "copy", "copies")
            ),
            state => format!(
                "{} {} of {} blocks have {}; {restored} restored{}",
                bar(r.blocks_whole, r.blocks),
                r.blocks_whole,
                r.blocks,
                plural(self.replicas, "copy", "copies"),
                if state == "waiting" {
                    format!(
                        " (waiting: {} up, {} needed)",
                        plural(self.memnodes_up as u64, "memnode", "memnodes"),
                        self.replicas
                    )
                } else {
                    String::new()
                }
            ),
        };
        let _ = writeln!(o, "{:<15}{line}", "re-replication");
        let s = &self.scrub;
        let line = if s.pass_under_way {
            format!(
                "pass {} {} {} of {} blocks; {} read, {} bad pages",
                s.passes.saturating_add(1),
                bar(s.pass_blocks, self.blocks.max(s.pass_blocks)),
                s.pass_blocks,
                self.blocks.max(s.pass_blocks),
                format_size(s.bytes),
                s.bad_pages
            )
        } else {
            format!(
                "{} done; {} read, {} bad pages",
                plural(s.passes, "pass", "passes"),
                format_size(s.bytes),
                s.bad_pages
            )
        };
        let _ = writeln!(o, "{:<15}{line}", "scrub");
        let _ = writeln!(
            o,
            "{:<15}{}, {} repaired",
            "checksums",
            plural(self.checksum_failures, "failure", "failures"),
            plural(self.pages_repaired, "page", "pages")
        );
        o
    }
}

fn percent(n: u64, of: u64) -> String {
    if of == 0 {
        return "-".into();
    }
    format!("{}%", u128::from(n.min(of)) * 100 / u128::from(of))
}

/// `[#######-----------------------]  23%`
fn bar(done: u64, total: u64) -> String {
    let total = total.max(1);
    let filled = (done.min(total) as u128 * BAR as u128 / total as u128) as usize;
    format!(
        "[{}{}] {:>4}",
        "#".repeat(filled),
        "-".repeat(BAR - filled),
        percent(done, total)
    )
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
