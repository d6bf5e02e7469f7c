//! Durable volumes as a test sees them: the `rmemfs` tool (`volume list`, `volume
//! destroy`, `fsck`), run as a user would, with a time limit, and its output parsed
//! (`--json` through serde_json); and mounting a volume again after fsd was killed.
//!
//! `rmemfs` is built beside fsd (same crate), so [`crate::binaries::binary`] finds it
//! in the same directory. Every run is bounded ([`RMEMFS_LIMIT`]); a run that hangs,
//! prints something that is not what the contract says, or panics fails the test
//! with the command line and both output streams.
//!
//! The memnodes are named as fsd names them: `--memnode HOST:PORT` for each, and
//! `--token T` when the memnodes were started with one. `--transport T` (the
//! memnodes' transport) is passed when the subcommand's `--help` lists that flag; a
//! memnode on 127.0.0.1 is reached over tcp either way.

use crate::binaries::binary;
use crate::command::{command_line, run_within};
use crate::memnode::MemnodeProc;
use crate::{poll_until, FsdMount, Refusal};
use rmemfs_common::sync::lock;
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long one `rmemfs` run may take (fsck walks a whole volume).
pub const RMEMFS_LIMIT: Duration = Duration::from_secs(120);
/// How long a volume whose fsd was killed may still be reported held by it, before a
/// new fsd can open it (the memnodes learn of the dead connection).
pub const HOLDER_RELEASE_LIMIT: Duration = Duration::from_secs(20);

/// How an `rmemfs` run ended.
#[derive(Debug, Clone)]
pub struct RmemfsRun {
    pub line: String,
    /// Exit code; -1 when a signal ended it.
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl RmemfsRun {
    fn from_output(line: String, out: Output) -> RmemfsRun {
        RmemfsRun {
            line,
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Everything about the run, for failure messages.
    pub fn context(&self) -> String {
        format!(
            "`{}` exited with code {}\nstdout:\n{}\nstderr:\n{}",
            self.line, self.code, self.stdout, self.stderr
        )
    }

    /// Panics unless it exited 0 (and did not panic); returns self.
    #[track_caller]
    pub fn ok(self, what: &str) -> RmemfsRun {
        assert!(
            self.code == 0,
            "{what}: rmemfs should exit 0; {}",
            self.context()
        );
        self.no_panic(what)
    }

    /// Panics if rmemfs's stderr shows a Rust panic; returns self.
    #[track_caller]
    pub fn no_panic(self, what: &str) -> RmemfsRun {
        assert!(
            !self.stderr.contains("panicked"),
            "{what}: rmemfs panicked; {}",
            self.context()
        );
        self
    }
}

/// Whether `rmemfs SUBCOMMAND --help` lists `--transport` (asked once per subcommand).
fn accepts_transport(sub: &[&str]) -> bool {
    static SEEN: Mutex<BTreeMap<String, bool>> = Mutex::new(BTreeMap::new());
    let key = sub.join(" ");
    let mut seen = lock(&SEEN);
    if let Some(&known) = seen.get(&key) {
        return known;
    }
    let mut cmd = Command::new(binary("rmemfs"));
    cmd.args(sub).arg("--help");
    let out = run_within(&mut cmd, RMEMFS_LIMIT, "rmemfs --help");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let known = text.contains("--transport");
    seen.insert(key, known);
    known
}

/// The arguments naming `memnodes`: `--memnode ADDR` for each (in order), then
/// `--token T` if the first has one, then `--transport T` if `sub` takes it.
fn memnode_args(sub: &[&str], memnodes: &[&MemnodeProc]) -> Vec<String> {
    let first = memnodes
        .first()
        .expect("an rmemfs command needs at least one memnode");
    let mut args = Vec::new();
    for m in memnodes {
        args.push("--memnode".to_string());
        args.push(m.addr().to_string());
    }
    if let Some(t) = first.token() {
        args.push("--token".to_string());
        args.push(t.to_string());
    }
    if accepts_transport(sub) {
        args.push("--transport".to_string());
        args.push(first.transport().to_string());
    }
    args
}

/// Runs `rmemfs SUB... ARGS... <memnode args>` within [`RMEMFS_LIMIT`], whatever its
/// exit status.
pub fn run(sub: &[&str], args: &[&str], memnodes: &[&MemnodeProc]) -> RmemfsRun {
    let mut cmd = Command::new(binary("rmemfs"));
    cmd.args(sub).args(args).args(memnode_args(sub, memnodes));
    let line = command_line(&cmd);
    let out = run_within(&mut cmd, RMEMFS_LIMIT, &format!("`{line}`"));
    RmemfsRun::from_output(line, out)
}

/// One volume as `rmemfs volume list --json` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeInfo {
    pub name: String,
    /// The volume's id as printed (a number or a string).
    pub id: String,
    pub bytes: u64,
    pub chunks: u64,
    /// The client id of the fsd holding it, 0 when none.
    pub holder: u64,
}

/// A JSON value as u64: a number, or a string of decimal or `0x` hex digits.
pub fn json_u64(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => {
            let s = s.trim();
            match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
                Some(hex) => u64::from_str_radix(hex, 16).ok(),
                None => s.parse().ok(),
            }
        }
        _ => None,
    }
}

fn field_u64(obj: &Value, name: &str, context: &str) -> u64 {
    let v = obj
        .get(name)
        .unwrap_or_else(|| panic!("{context}: no field {name:?} in {obj}"));
    json_u64(v).unwrap_or_else(|| panic!("{context}: field {name:?} is not an integer: {v}"))
}

/// `rmemfs volume list --memnode A --json`: every volume on `memnode`.
pub fn list(memnode: &MemnodeProc) -> Vec<VolumeInfo> {
    list_with(memnode, &[])
}

/// As [`list`], with more arguments (`--token T`: a tenant's volumes).
pub fn list_with(memnode: &MemnodeProc, args: &[&str]) -> Vec<VolumeInfo> {
    let all: Vec<&str> = ["--json"].iter().chain(args).copied().collect();
    let r = run(&["volume", "list"], &all, &[memnode]).ok("rmemfs volume list --json");
    let json: Value = serde_json::from_str(r.stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "rmemfs volume list --json should print a JSON array: {e}; {}",
            r.context()
        )
    });
    let items = json.as_array().unwrap_or_else(|| {
        panic!(
            "rmemfs volume list --json should print a JSON array; {}",
            r.context()
        )
    });
    items
        .iter()
        .map(|v| {
            let ctx = format!("a volume in `{}`", r.line);
            let name = v
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_else(|| panic!("{ctx}: no string \"name\" in {v}"))
                .to_string();
            let id = match v.get("id") {
                Some(Value::String(s)) => s.clone(),
                Some(other @ Value::Number(_)) => other.to_string(),
                other => panic!("{ctx}: \"id\" should be a number or a string, is {other:?}"),
            };
            VolumeInfo {
                name,
                id,
                bytes: field_u64(v, "bytes", &ctx),
                chunks: field_u64(v, "chunks", &ctx),
                holder: field_u64(v, "holder", &ctx),
            }
        })
        .collect()
}

/// The volume `name` in [`list`], if it is there.
pub fn find(memnode: &MemnodeProc, name: &str) -> Option<VolumeInfo> {
    list(memnode).into_iter().find(|v| v.name == name)
}

/// The volume `name` in [`list`]; panics (showing the list) if it is not there.
#[track_caller]
pub fn expect(memnode: &MemnodeProc, name: &str) -> VolumeInfo {
    let all = list(memnode);
    all.iter()
        .find(|v| v.name == name)
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "rmemfs volume list on memnode {} should show volume {name:?}, but shows \
                 {all:?}",
                memnode.addr()
            )
        })
}

/// `rmemfs volume list --memnode A` (the text form): its stdout.
pub fn list_text(memnode: &MemnodeProc) -> String {
    run(&["volume", "list"], &[], &[memnode])
        .ok("rmemfs volume list")
        .stdout
}

/// `rmemfs volume destroy NAME --memnode ...`, which must exit 0.
pub fn destroy(name: &str, memnodes: &[&MemnodeProc]) -> RmemfsRun {
    run(&["volume", "destroy"], &[name], memnodes).ok(&format!("rmemfs volume destroy {name}"))
}

/// Where one copy of a volume's metadata lives (addresses in the memnode process).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    pub addr: u64,
    pub len: u64,
}

/// One memnode's copy of the metadata, from `fsck --json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataCopy {
    /// `HOST:PORT`, as on the command line.
    pub memnode: String,
    /// Each region, or `None` where fsck printed `null` (not written yet).
    pub superblock: Option<Region>,
    pub checkpoint: Option<Region>,
    pub log: Option<Region>,
    /// What fsck found wrong with this copy, if it says.
    pub problem: Option<String>,
}

impl MetadataCopy {
    /// The region called `which` (`superblock`, `checkpoint`, `log`), if fsck gave it.
    pub fn region(&self, which: &str) -> Option<Region> {
        match which {
            "superblock" => self.superblock,
            "checkpoint" => self.checkpoint,
            "log" => self.log,
            other => panic!("no metadata region called {other:?}"),
        }
    }
}

/// What `rmemfs fsck NAME --json` reported.
#[derive(Debug, Clone)]
pub struct FsckReport {
    pub run: RmemfsRun,
    pub inodes: u64,
    pub inconsistencies: u64,
    pub leaked_chunks: u64,
    pub problems: Vec<String>,
    pub metadata: Vec<MetadataCopy>,
}

fn region(obj: &Value, name: &str, ctx: &str) -> Option<Region> {
    let r = obj
        .get(name)
        .unwrap_or_else(|| panic!("{ctx}: no {name:?} in {obj}"));
    if r.is_null() {
        return None;
    }
    Some(Region {
        addr: field_u64(r, "addr", &format!("{ctx}, {name}")),
        len: field_u64(r, "len", &format!("{ctx}, {name}")),
    })
}

/// Parses `fsck --json` output (panics, showing the run, if it is not the contract's
/// object).
pub fn parse_fsck_json(run: RmemfsRun) -> FsckReport {
    let json: Value = serde_json::from_str(run.stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "rmemfs fsck --json should print one JSON object: {e}; {}",
            run.context()
        )
    });
    let ctx = format!("the object `{}` printed", run.line);
    let problems = json
        .get("problems")
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("{ctx}: no \"problems\" array in {json}"))
        .iter()
        .map(|p| p.as_str().map_or_else(|| p.to_string(), str::to_string))
        .collect();
    let metadata = json
        .get("metadata")
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("{ctx}: no \"metadata\" array in {json}"))
        .iter()
        .map(|m| MetadataCopy {
            memnode: m
                .get("memnode")
                .and_then(Value::as_str)
                .unwrap_or_else(|| panic!("{ctx}: a metadata entry has no \"memnode\": {m}"))
                .to_string(),
            superblock: region(m, "superblock", &ctx),
            checkpoint: region(m, "checkpoint", &ctx),
            log: region(m, "log", &ctx),
            problem: m.get("problem").and_then(Value::as_str).map(str::to_string),
        })
        .collect();
    FsckReport {
        inodes: field_u64(&json, "inodes", &ctx),
        inconsistencies: field_u64(&json, "inconsistencies", &ctx),
        leaked_chunks: field_u64(&json, "leaked_chunks", &ctx),
        problems,
        metadata,
        run,
    }
}

/// `rmemfs fsck NAME --json --memnode ...`: the report, whatever the exit code.
pub fn fsck_json(name: &str, memnodes: &[&MemnodeProc]) -> FsckReport {
    let run = run(&["fsck"], &[name, "--json"], memnodes).no_panic(&format!("fsck {name}"));
    if run.code == 2 {
        panic!(
            "rmemfs fsck {name} --json could not read the volume (exit 2); {}",
            run.context()
        );
    }
    parse_fsck_json(run)
}

/// As [`fsck_json`] for a volume whose fsd was killed (see [`fsck_after_crash`]).
pub fn fsck_json_after_crash(name: &str, memnodes: &[&MemnodeProc]) -> FsckReport {
    let r = fsck_after_crash(name, &["--json"], memnodes);
    if r.code == 2 {
        panic!(
            "rmemfs fsck {name} --json could not read the volume (exit 2); {}",
            r.context()
        );
    }
    parse_fsck_json(r)
}

/// As [`fsck_text`] for a volume whose fsd was killed (see [`fsck_after_crash`]).
pub fn fsck_text_after_crash(name: &str, memnodes: &[&MemnodeProc]) -> RmemfsRun {
    fsck_after_crash(name, &[], memnodes)
}

/// `rmemfs fsck NAME ARGS...` for a volume whose fsd was killed, retried for up to
/// [`HOLDER_RELEASE_LIMIT`] while it refuses with `is held by` (the memnodes may take
/// a moment to let go of the dead fsd); whatever its exit code after that.
fn fsck_after_crash(name: &str, args: &[&str], memnodes: &[&MemnodeProc]) -> RmemfsRun {
    let mut last = None;
    let argv: Vec<&str> = std::iter::once(name).chain(args.iter().copied()).collect();
    let done = poll_until(HOLDER_RELEASE_LIMIT, || {
        let r = run(&["fsck"], &argv, memnodes).no_panic(&format!("fsck {name}"));
        if r.stderr.contains("is held by") {
            last = Some(r);
            std::thread::sleep(Duration::from_millis(250));
            return None;
        }
        Some(r)
    });
    done.unwrap_or_else(|| {
        panic!(
            "fsck {name} still refused the volume {HOLDER_RELEASE_LIMIT:?} after its fsd was \
             killed; {}",
            last.expect("a refusal").context()
        )
    })
}

/// The counts of the text form (`inodes: N`, `inconsistencies: N`, `leaked chunks: N`,
/// `lost blocks: N`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsckCounts {
    pub inodes: u64,
    pub inconsistencies: u64,
    pub leaked_chunks: u64,
    pub lost_blocks: u64,
}

/// Parses the text form's three count lines.
pub fn parse_fsck_text(stdout: &str) -> Option<FsckCounts> {
    let count = |label: &str| {
        stdout.lines().find_map(|l| {
            l.trim()
                .strip_prefix(label)
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|n| n.parse::<u64>().ok())
        })
    };
    Some(FsckCounts {
        inodes: count("inodes:")?,
        inconsistencies: count("inconsistencies:")?,
        leaked_chunks: count("leaked chunks:")?,
        lost_blocks: count("lost blocks:")?,
    })
}

/// `rmemfs fsck NAME --memnode ...` (text form) whatever its exit code.
pub fn fsck_text(name: &str, memnodes: &[&MemnodeProc]) -> RmemfsRun {
    run(&["fsck"], &[name], memnodes).no_panic(&format!("fsck {name}"))
}

/// fsck (text form) must find the unmounted volume clean: exit 0, `inconsistencies: 0`,
/// `leaked chunks: 0`. Prints its output and returns the counts.
#[track_caller]
pub fn assert_fsck_clean(name: &str, memnodes: &[&MemnodeProc], when: &str) -> FsckCounts {
    assert_fsck_clean_with(fsck_text, name, memnodes, when)
}

/// As [`assert_fsck_clean`], retrying while a memnode still says the volume `is
/// held by` a client (as [`fsck_text_after_crash`] does).
#[track_caller]
pub fn assert_fsck_clean_once_released(
    name: &str,
    memnodes: &[&MemnodeProc],
    when: &str,
) -> FsckCounts {
    assert_fsck_clean_with(fsck_text_after_crash, name, memnodes, when)
}

#[track_caller]
fn assert_fsck_clean_with(
    fsck: fn(&str, &[&MemnodeProc]) -> RmemfsRun,
    name: &str,
    memnodes: &[&MemnodeProc],
    when: &str,
) -> FsckCounts {
    let started = Instant::now();
    let r = fsck(name, memnodes);
    println!(
        "fsck {name} ({when}) in {:.1} s: exit {}\n{}",
        started.elapsed().as_secs_f64(),
        r.code,
        r.stdout.trim_end()
    );
    let counts = parse_fsck_text(&r.stdout).unwrap_or_else(|| {
        panic!(
            "fsck {name} ({when}): stdout should have `inodes: N`, `inconsistencies: N` and \
             `leaked chunks: N` lines; {}",
            r.context()
        )
    });
    assert!(
        r.code == 0 && counts.inconsistencies == 0 && counts.leaked_chunks == 0,
        "fsck {name} ({when}) should find the cleanly unmounted volume consistent with no \
         leaked chunks (exit 0), but found {counts:?}; {}",
        r.context()
    );
    counts
}

/// Mounts a volume again after its fsd was killed: as [`FsdMount::try_with_memnodes`],
/// retrying for up to [`HOLDER_RELEASE_LIMIT`] while fsd refuses with `is held by`
/// (the memnodes may take a moment to see the dead fsd's connections close). Panics
/// with fsd's last refusal if it never mounts.
pub fn remount_after_crash(memnodes: &[&MemnodeProc], args: &[&str]) -> FsdMount {
    let started = Instant::now();
    let mut last: Option<Refusal> = None;
    let mut tries = 0u32;
    let mounted = poll_until(HOLDER_RELEASE_LIMIT, || {
        tries += 1;
        match FsdMount::try_with_memnodes(memnodes, args) {
            Ok(m) => Some(m),
            Err(r) if r.stderr.contains("is held by") => {
                last = Some(r);
                std::thread::sleep(Duration::from_millis(250));
                None
            }
            Err(r) => panic!(
                "fsd {} refused to mount the volume after its previous fsd was killed \
                 ({}); stderr:\n{}",
                args.join(" "),
                r.status,
                r.stderr
            ),
        }
    });
    match mounted {
        Some(m) => {
            if tries > 1 {
                println!(
                    "remount after the crash took {tries} tries ({:.1} s): the volume was \
                     still held by the killed fsd at first",
                    started.elapsed().as_secs_f64()
                );
            }
            m
        }
        None => {
            let r = last.expect("at least one refusal");
            panic!(
                "fsd {} still refused the volume {HOLDER_RELEASE_LIMIT:?} after its holder was \
                 killed with SIGKILL ({}); the dead fsd must not hold the volume; stderr:\n{}",
                args.join(" "),
                r.status,
                r.stderr
            )
        }
    }
}

/// Every `0x...` hex number in `text`.
pub fn hex_numbers(text: &str) -> Vec<u64> {
    let mut out = Vec::new();
    let b = text.as_bytes();
    let mut i = 0;
    while i + 2 < b.len() {
        if b[i] == b'0' && (b[i + 1] == b'x' || b[i + 1] == b'X') {
            let start = i + 2;
            let mut end = start;
            while end < b.len() && b[end].is_ascii_hexdigit() {
                end += 1;
            }
            if end > start && end - start <= 16 {
                if let Ok(v) = u64::from_str_radix(&text[start..end], 16) {
                    out.push(v);
                }
            }
            i = end.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fsck_text_counts_parse() {
        let out =
            "inodes: 12\nlost blocks: 3\ninconsistencies: 1\nleaked chunks: 0\ninode 5: bad\n";
        assert_eq!(
            parse_fsck_text(out),
            Some(FsckCounts {
                inodes: 12,
                inconsistencies: 1,
                leaked_chunks: 0,
                lost_blocks: 3,
            })
        );
        assert_eq!(parse_fsck_text("inodes: 1\n"), None);
        let with_units = "generation: 5\ninodes: 3\norphans: 0 (reclaimed)\n\
                          lost blocks: 0\ninconsistencies: 0\nleaked chunks: 2 (128 KiB)\n";
        assert_eq!(
            parse_fsck_text(with_units),
            Some(FsckCounts {
                inodes: 3,
                inconsistencies: 0,
                leaked_chunks: 2,
                lost_blocks: 0,
            })
        );
    }

    #[test]
    fn hex_numbers_are_found() {
        assert_eq!(
            hex_numbers("volume v is held by client 0x1a2b (pid 7), 0xzz 0x00ff."),
            vec![0x1a2b, 0xff]
        );
    }

    #[test]
    fn json_integers_may_be_numbers_or_strings() {
        assert_eq!(json_u64(&serde_json::json!(5)), Some(5));
        assert_eq!(json_u64(&serde_json::json!("0x10")), Some(16));
        assert_eq!(json_u64(&serde_json::json!("17")), Some(17));
        assert_eq!(json_u64(&serde_json::json!(u64::MAX)), Some(u64::MAX));
        assert_eq!(json_u64(&serde_json::json!(-1)), None);
    }
}
