//! The result of a run, and its JSON: the part of fio's JSON output that
//! `scripts/bench` reads (one grouped job, the read and write sections with bytes,
//! bandwidth, IOPS, runtime and completion-latency percentiles), so the bench
//! reports the fabric beside the filesystems without a second reader. The document
//! says it is fabricbench's (`"fabricbench version"`), not fio's.

use serde::Serialize;
use std::time::Duration;

/// Percentiles reported, as fio's `percentile_list=50:99:99.9` of the job files.
const PERCENTILES: [f64; 3] = [50.0, 99.0, 99.9];

/// What the timed phase of a run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub name: String,
    /// True when the job wrote (its numbers go in the write section).
    pub writes: bool,
    pub bytes: u64,
    pub ops: u64,
    pub elapsed: Duration,
    /// Completion latency of each measured block, in nanoseconds.
    pub latencies_ns: Vec<u64>,
    /// User and system CPU time of this process over the timed phase, as a share of
    /// its wall time (percent, as fio's usr_cpu and sys_cpu).
    pub usr_cpu_pct: f64,
    pub sys_cpu_pct: f64,
}

/// The `p`th percentile (nearest rank) of sorted values; 0 for none.
fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    // Less a hair: 99.9% of 1000 is 999 exactly, not the 999.0000000000001 of f64.
    let rank = (p * sorted.len() as f64 / 100.0 - 1e-9).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Summary {
    fn per_second(&self, n: u64) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            n as f64 / s
        } else {
            0.0
        }
    }

    pub fn iops(&self) -> f64 {
        self.per_second(self.ops)
    }

    pub fn bytes_per_second(&self) -> f64 {
        self.per_second(self.bytes)
    }

    /// The fio-shaped JSON document (see the module docs), pretty-printed as fio
    /// prints its own, with the same precision as fio's figures.
    pub fn to_json(&self) -> String {
        let mut sorted = self.latencies_ns.clone();
        sorted.sort_unstable();
        let mean = if sorted.is_empty() {
            0.0
        } else {
            sorted.iter().map(|&v| v as f64).sum::<f64>() / sorted.len() as f64
        };
        let measured = Direction {
            io_bytes: self.bytes,
            bw_bytes: self.bytes_per_second().round() as u64,
            iops: rounded(self.iops(), 3),
            runtime: self.elapsed.as_millis() as u64,
            total_ios: self.ops,
            clat_ns: Some(Latency {
                mean: rounded(mean, 1),
                percentile: Percentiles(
                    PERCENTILES
                        .iter()
                        .map(|p| (format!("{p:.6}"), percentile(&sorted, *p)))
                        .collect(),
                ),
            }),
        };
        let (read, write) = if self.writes {
            (Direction::IDLE, measured)
        } else {
            (measured, Direction::IDLE)
        };
        let doc = Document {
            version: format!("fabricbench-{}", env!("CARGO_PKG_VERSION")),
            jobs: [Job {
                jobname: &self.name,
                error: 0,
                usr_cpu: rounded(self.usr_cpu_pct, 2),
                sys_cpu: rounded(self.sys_cpu_pct, 2),
                read,
                write,
            }],
        };
        // Strings, numbers and maps with string keys: serializing cannot fail.
        let mut text = serde_json::to_string_pretty(&doc).unwrap_or_default();
        text.push('\n');
        text
    }
}

/// `x` to `places` decimal places, as fio's JSON gives its figures.
fn rounded(x: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (x * scale).round() / scale
}

/// The whole document: fio's shape, one job.
#[derive(Serialize)]
struct Document<'a> {
    #[serde(rename = "fabricbench version")]
    version: String,
    jobs: [Job<'a>; 1],
}

#[derive(Serialize)]
struct Job<'a> {
    jobname: &'a str,
    error: u32,
    usr_cpu: f64,
    sys_cpu: f64,
    read: Direction,
    write: Direction,
}

/// A `read` or `write` section; the direction not measured is [`Direction::IDLE`],
/// without latencies.
#[derive(Serialize)]
struct Direction {
    io_bytes: u64,
    bw_bytes: u64,
    iops: f64,
    runtime: u64,
    total_ios: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    clat_ns: Option<Latency>,
}

impl Direction {
    const IDLE: Direction = Direction {
        io_bytes: 0,
        bw_bytes: 0,
        iops: 0.0,
        runtime: 0,
        total_ios: 0,
        clat_ns: None,
    };
}

#[derive(Serialize)]
struct Latency {
    mean: f64,
    percentile: Percentiles,
}

/// A JSON object of percentiles by fio's key (`"99.900000"`), in the order given.
struct Percentiles(Vec<(String, u64)>);

impl Serialize for Percentiles {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let v: Vec<u64> = (1..=1000).collect();
        assert_eq!(percentile(&v, 50.0), 500);
        assert_eq!(percentile(&v, 99.0), 990);
        assert_eq!(percentile(&v, 99.9), 999);
        assert_eq!(percentile(&[7], 99.9), 7);
        assert_eq!(percentile(&[], 50.0), 0);
    }

    #[test]
    fn json_carries_the_numbers_in_the_direction_measured() {
        let s = Summary {
            name: "randread".into(),
            writes: false,
            bytes: 4096 * 4,
            ops: 4,
            elapsed: Duration::from_millis(2),
            latencies_ns: vec![40_000, 10_000, 30_000, 20_000],
            usr_cpu_pct: 12.5,
            sys_cpu_pct: 50.0,
        };
        let j = s.to_json();
        let doc: serde_json::Value = serde_json::from_str(&j).expect("valid JSON");
        assert!(
            doc["fabricbench version"]
                .as_str()
                .is_some_and(|v| v.starts_with("fabricbench-")),
            "{j}"
        );
        let job = &doc["jobs"][0];
        assert_eq!(job["jobname"], "randread", "{j}");
        let read = &job["read"];
        assert_eq!(read["io_bytes"], 16384, "{j}");
        assert_eq!(read["iops"], 2000.0, "{j}");
        assert_eq!(read["bw_bytes"], 8192000, "{j}");
        assert_eq!(read["runtime"], 2, "{j}");
        assert_eq!(read["total_ios"], 4, "{j}");
        assert_eq!(read["clat_ns"]["mean"], 25000.0, "{j}");
        assert_eq!(read["clat_ns"]["percentile"]["50.000000"], 20000, "{j}");
        assert_eq!(read["clat_ns"]["percentile"]["99.000000"], 40000, "{j}");
        assert_eq!(job["write"]["io_bytes"], 0, "{j}");
        assert_eq!(job["usr_cpu"], 12.5, "{j}");
        // fio's separators: tests/tests/fabricbench.rs finds `"key": ` in the text.
        assert!(
            j.contains("\"read\": {") && j.contains("\"iops\": 2000.0"),
            "{j}"
        );
        let w: serde_json::Value =
            serde_json::from_str(&Summary { writes: true, ..s }.to_json()).expect("valid JSON");
        assert_eq!(w["jobs"][0]["write"]["io_bytes"], 16384);
        assert_eq!(w["jobs"][0]["read"]["io_bytes"], 0);
    }

    #[test]
    fn json_escapes_a_job_name_as_json_does() {
        let s = Summary {
            name: "a \"job\"\\ \u{e9}\t".into(),
            writes: false,
            bytes: 0,
            ops: 0,
            elapsed: Duration::ZERO,
            latencies_ns: vec![],
            usr_cpu_pct: 0.0,
            sys_cpu_pct: 0.0,
        };
        let doc: serde_json::Value = serde_json::from_str(&s.to_json()).expect("valid JSON");
        assert_eq!(doc["jobs"][0]["jobname"], "a \"job\"\\ \u{e9}\t");
    }
}
