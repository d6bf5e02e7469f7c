//! The result of a run, and its JSON: the part of fio's JSON output that
//! `scripts/bench` reads (one grouped job, the read and write sections with bytes,
//! bandwidth, IOPS, runtime and completion-latency percentiles), so the bench
//! reports the fabric beside the filesystems without a second reader. The document
//! says it is fabricbench's (`"fabricbench version"`), not fio's.

use std::fmt::Write as _;
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

    /// The fio-shaped JSON document (see the module docs).
    pub fn to_json(&self) -> String {
        let mut sorted = self.latencies_ns.clone();
        sorted.sort_unstable();
        let mean = if sorted.is_empty() {
            0.0
        } else {
            sorted.iter().map(|&v| v as f64).sum::<f64>() / sorted.len() as f64
        };
        let mut pct = String::new();
        for (i, p) in PERCENTILES.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            let _ = write!(pct, "{sep}\"{p:.6}\": {}", percentile(&sorted, *p));
        }
        let measured = format!(
            "{{\"io_bytes\": {}, \"bw_bytes\": {:.0}, \"iops\": {:.3}, \"runtime\": {}, \
             \"total_ios\": {}, \"clat_ns\": {{\"mean\": {mean:.1}, \"percentile\": {{{pct}}}}}}}",
            self.bytes,
            self.bytes_per_second(),
            self.iops(),
            self.elapsed.as_millis(),
            self.ops,
        );
        let idle = "{\"io_bytes\": 0, \"bw_bytes\": 0, \"iops\": 0.0, \"runtime\": 0, \
                    \"total_ios\": 0}";
        let (read, write) = if self.writes {
            (idle, measured.as_str())
        } else {
            (measured.as_str(), idle)
        };
        format!(
            "{{\"fabricbench version\": \"fabricbench-{}\", \"jobs\": [{{\"jobname\": \"{}\", \
             \"error\": 0, \"usr_cpu\": {:.2}, \"sys_cpu\": {:.2}, \"read\": {read}, \
             \"write\": {write}}}]}}\n",
            env!("CARGO_PKG_VERSION"),
            self.name.escape_default(),
            self.usr_cpu_pct,
            self.sys_cpu_pct,
        )
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
        let read = &j[j.find("\"read\"").unwrap()..j.find("\"write\"").unwrap()];
        assert!(read.contains("\"io_bytes\": 16384"), "{j}");
        assert!(read.contains("\"iops\": 2000.000"), "{j}");
        assert!(read.contains("\"bw_bytes\": 8192000"), "{j}");
        assert!(read.contains("\"runtime\": 2"), "{j}");
        assert!(read.contains("\"mean\": 25000.0"), "{j}");
        assert!(read.contains("\"50.000000\": 20000"), "{j}");
        assert!(read.contains("\"99.000000\": 40000"), "{j}");
        let write = &j[j.find("\"write\"").unwrap()..];
        assert!(write.contains("\"io_bytes\": 0"), "{j}");
        assert!(j.contains("\"usr_cpu\": 12.50"), "{j}");
        let w = Summary { writes: true, ..s }.to_json();
        assert!(w[w.find("\"write\"").unwrap()..].contains("\"io_bytes\": 16384"));
    }
}
