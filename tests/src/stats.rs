//! fsd's statistics as a test sees them: the file `--stats-file` names, which fsd
//! replaces once a second with a flat JSON object of `"name": unsigned-integer` pairs,
//! one per line (fsd/src/stats.rs).
//!
//! Some counters come from a pass fsd makes in the background (the replication state
//! of every block, say), so a test never reads them once and concludes: it waits,
//! bounded, until they reach the state it expects ([`StatsFile::wait_for`]), and a
//! failure shows the last stats fsd wrote. A counter the stats lack makes the test
//! fail at once, naming it ([`FsdStats::value`]): an fsd without the feature under
//! test is a failure, not a long wait.

use crate::poll_until;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One reading of fsd's stats file: counter name -> value.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FsdStats(BTreeMap<String, u64>);

impl FsdStats {
    /// The counter `name`, if the stats have it.
    pub fn get(&self, name: &str) -> Option<u64> {
        self.0.get(name).copied()
    }

    /// The counter `name`; panics naming it (and showing the stats) if it is missing.
    #[track_caller]
    pub fn value(&self, name: &str) -> u64 {
        self.get(name).unwrap_or_else(|| {
            panic!(
                "fsd's stats have no `{name}` (an fsd that lacks what this test needs?); \
                 they are: {self}"
            )
        })
    }

    /// The sum of the counters `names` (each must be there).
    #[track_caller]
    pub fn sum<S: AsRef<str>>(&self, names: impl IntoIterator<Item = S>) -> u64 {
        names.into_iter().map(|n| self.value(n.as_ref())).sum()
    }

    /// Every counter, by name.
    pub fn counters(&self) -> &BTreeMap<String, u64> {
        &self.0
    }
}

impl fmt::Display for FsdStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{k}: {v}")?;
        }
        f.write_str("}")
    }
}

/// Parses a flat JSON object whose values are all unsigned integers. `None` for
/// anything else (a file cut short, a nested value, a repeated name).
pub fn parse_stats(text: &str) -> Option<FsdStats> {
    let body = text.trim().strip_prefix('{')?.strip_suffix('}')?.trim();
    let mut map = BTreeMap::new();
    if body.is_empty() {
        return Some(FsdStats(map));
    }
    for pair in body.split(',') {
        let (name, value) = pair.split_once(':')?;
        let name = name.trim().strip_prefix('"')?.strip_suffix('"')?;
        if name.is_empty() || name.contains(['"', '\\']) {
            return None;
        }
        let value = value.trim();
        if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        if map.insert(name.to_string(), value.parse().ok()?).is_some() {
            return None;
        }
    }
    Some(FsdStats(map))
}

/// The stats in the file at `path`; `None` if it is missing or not (yet) a whole
/// stats object.
pub fn read_stats(path: &Path) -> Option<FsdStats> {
    parse_stats(&std::fs::read_to_string(path).ok()?)
}

/// A stats file for one fsd: a path in a fresh temporary directory (removed on drop),
/// to pass as `--stats-file`.
pub struct StatsFile {
    dir: PathBuf,
    path: PathBuf,
}

impl StatsFile {
    pub fn new() -> StatsFile {
        let dir = crate::fresh_dir("rmemfs-stats");
        let path = dir.join("stats.json");
        StatsFile { dir, path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path as an argument for fsd (`["--stats-file", stats.arg()]`).
    pub fn arg(&self) -> &str {
        self.path
            .to_str()
            .expect("the temporary directory's path is not UTF-8")
    }

    /// The stats fsd wrote last, if there are any yet.
    pub fn read(&self) -> Option<FsdStats> {
        read_stats(&self.path)
    }

    /// The stats fsd writes within 10 s (it writes them once a second); panics if
    /// there are none.
    #[track_caller]
    pub fn current(&self) -> FsdStats {
        self.wait_for(Duration::from_secs(10), "any stats from fsd", |_| true)
    }

    /// Polls the stats until `done` holds for one reading, and returns that reading.
    /// Panics after `limit`, naming `what` and showing the last stats seen (or saying
    /// that fsd wrote none). `done` sees every reading, so it can also keep track of
    /// a counter over the whole wait (the largest value seen, ...).
    #[track_caller]
    pub fn wait_for(
        &self,
        limit: Duration,
        what: &str,
        mut done: impl FnMut(&FsdStats) -> bool,
    ) -> FsdStats {
        let mut last = None;
        let mut readings = 0u64;
        let reached = poll_until(limit, || {
            let stats = self.read()?;
            readings += 1;
            let ok = done(&stats);
            last = Some(stats.clone());
            ok.then_some(stats)
        });
        match (reached, last) {
            (Some(stats), _) => stats,
            (None, Some(last)) => panic!(
                "{what}: fsd's stats did not get there within {limit:?} ({readings} readings); \
                 the last reading was {last}"
            ),
            (None, None) => panic!(
                "{what}: fsd wrote no stats to {} within {limit:?} (was it given \
                 --stats-file?)",
                self.path.display()
            ),
        }
    }
}

impl Default for StatsFile {
    fn default() -> StatsFile {
        StatsFile::new()
    }
}

impl Drop for StatsFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::parse_stats;

    #[test]
    fn parses_fsd_s_flat_json() {
        let s = parse_stats("{\n  \"remote_reads\": 3,\n  \"node0_up\": 1,\n  \"blocks\": 0\n}\n")
            .expect("a whole stats object parses");
        assert_eq!(s.get("remote_reads"), Some(3));
        assert_eq!(s.get("node0_up"), Some(1));
        assert_eq!(s.get("blocks"), Some(0));
        assert_eq!(s.get("nodes_up"), None);
        assert_eq!(s.counters().len(), 3);
        assert_eq!(s.sum(["remote_reads", "node0_up"]), 4);
        assert_eq!(s.to_string(), "{blocks: 0, node0_up: 1, remote_reads: 3}");
        assert_eq!(parse_stats("{}").map(|s| s.counters().len()), Some(0));
        assert_eq!(
            parse_stats(&format!("{{\"big\": {}}}", u64::MAX)).and_then(|s| s.get("big")),
            Some(u64::MAX)
        );
    }

    #[test]
    fn anything_but_a_whole_flat_object_is_none() {
        for text in [
            "",
            "{",
            "{\n  \"remote_reads\": 3,\n  \"node0_up\"",
            "{\n  \"remote_reads\": 3,\n",
            "{\"a\": 1,}",
            "{\"a\": -1}",
            "{\"a\": 1.5}",
            "{\"a\": \"1\"}",
            "{\"a\": {\"b\": 1}}",
            "{a: 1}",
            "{\"a\": 1, \"a\": 2}",
            "{\"a\": 18446744073709551616}",
        ] {
            assert_eq!(
                parse_stats(text),
                None,
                "{text:?} is not a whole stats object"
            );
        }
    }

    #[test]
    #[should_panic(expected = "fsd's stats have no `nodes_up`")]
    fn a_missing_counter_names_itself() {
        parse_stats("{\"blocks\": 1}").unwrap().value("nodes_up");
    }
}
