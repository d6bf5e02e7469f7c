//! `rmemfs status MOUNTPOINT [--json]` as a test runs it: bounded in time, its exit
//! code and output kept, `--json` parsed with serde_json. fsd rewrites the status
//! once a second and counts copies in the background, so tests wait (bounded) for
//! the state they expect ([`wait_for`]) and a failure shows the last report.

use crate::binaries::binary;
use crate::command::{command_line, run_within};
use crate::poll_until;
use crate::volume::RmemfsRun;
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// How long one `rmemfs status` may take (it reads two small files).
const STATUS_LIMIT: Duration = Duration::from_secs(30);

/// Runs `rmemfs status PATH` (with `--json` when asked).
pub fn run(path: &Path, json: bool) -> RmemfsRun {
    let mut cmd = Command::new(binary("rmemfs"));
    cmd.arg("status").arg(path);
    if json {
        cmd.arg("--json");
    }
    let line = command_line(&cmd);
    let out = run_within(&mut cmd, STATUS_LIMIT, "rmemfs status");
    RmemfsRun {
        line,
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
    .no_panic("rmemfs status")
}

/// `rmemfs status PATH --json`: its exit code and report; panics unless it exited 0
/// or 1 with one JSON object.
#[track_caller]
pub fn json(path: &Path) -> (i32, Value) {
    let r = run(path, true);
    assert!(
        r.code == 0 || r.code == 1,
        "rmemfs status should report (exit 0 or 1); {}",
        r.context()
    );
    let v: Value = serde_json::from_str(&r.stdout).unwrap_or_else(|e| {
        panic!(
            "rmemfs status --json printed no JSON ({e}); {}",
            r.context()
        )
    });
    assert!(v.is_object(), "not a JSON object; {}", r.context());
    (r.code, v)
}

/// Polls `rmemfs status --json` until `done` holds for its (exit code, report);
/// returns them. Panics after `limit`, naming `what` and showing the last report.
#[track_caller]
pub fn wait_for(
    path: &Path,
    limit: Duration,
    what: &str,
    mut done: impl FnMut(i32, &Value) -> bool,
) -> (i32, Value) {
    let mut last = None;
    let reached = poll_until(limit, || {
        let (code, v) = json(path);
        let ok = done(code, &v);
        last = Some((code, v.clone()));
        ok.then_some((code, v))
    });
    reached.unwrap_or_else(|| {
        panic!(
            "{what}: rmemfs status did not show it within {limit:?}; the last report \
             (exit {:?}):\n{}",
            last.as_ref().map(|l| l.0),
            last.map_or("none".into(), |l| serde_json::to_string_pretty(&l.1)
                .unwrap_or_default())
        )
    })
}

/// The unsigned integer at `pointer` (`/memnodes/0/copies`) of a report; panics
/// naming it when it is missing.
#[track_caller]
pub fn u64_at(v: &Value, pointer: &str) -> u64 {
    v.pointer(pointer)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("the status report has no number at {pointer}: {v}"))
}
