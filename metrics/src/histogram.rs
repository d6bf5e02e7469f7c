//! A latency histogram cheap enough for the data path: an observation is a bucket
//! search over a short constant table and two relaxed atomic additions (its bucket
//! and the sum). No lock, no allocation, no floating point.
//!
//! prometheus-client's own `Histogram` takes a mutex per observation, which fsd's
//! request threads would contend on at every FUSE request and remote operation;
//! this one only shares cache lines, and [`LatencyHistogram`] is aligned to 128
//! bytes so two histograms never share one (counters that moved onto a shared line
//! once slowed fsd's small-file creates markedly: docs/benchmarks-history.md,
//! "Counters on a cache-line pair of their own").
//!
//! Buckets are fixed, 1-2.5-5 steps from 5 µs to 10 s: wide enough for a loopback
//! round trip and for a request stuck behind `--op-timeout`. The count is not kept
//! apart: at scrape time it is the sum of the buckets, so count and buckets always
//! agree; the sum may be a few observations ahead or behind them (each is read once,
//! not under a lock), which is what any lock-free Prometheus client gives.

use prometheus_client::encoding::{MetricEncoder, NoLabelSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Upper bounds of the finite buckets, in nanoseconds (the `le` labels in seconds).
pub const BOUNDS_NS: [u64; 20] = [
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// The finite buckets and the one above them (`le="+Inf"`).
const BUCKETS: usize = BOUNDS_NS.len() + 1;

/// Observations of durations, by bucket.
#[repr(align(128))]
#[derive(Debug)]
pub struct LatencyHistogram {
    /// Observations per bucket (not cumulative; the last is above every bound).
    buckets: [AtomicU64; BUCKETS],
    /// Sum of every observation, in nanoseconds (wraps after 584 years).
    sum_ns: AtomicU64,
}

impl Default for LatencyHistogram {
    fn default() -> LatencyHistogram {
        LatencyHistogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }
    }
}

/// A reading of a histogram.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramReading {
    /// Sum of the observations, in seconds.
    pub sum: f64,
    pub count: u64,
    /// Per bucket (not cumulative): upper bound in seconds, observations.
    pub buckets: Vec<(f64, u64)>,
}

impl LatencyHistogram {
    /// Records one observation.
    #[inline]
    pub fn observe(&self, d: Duration) {
        self.observe_many(d, 1);
    }

    /// Records `n` observations of `d` at once (operations that completed together,
    /// such as a batch posted on one connection).
    #[inline]
    pub fn observe_many(&self, d: Duration, n: u64) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let i = BOUNDS_NS.partition_point(|&b| b < ns);
        self.buckets[i].fetch_add(n, Ordering::Relaxed);
        self.sum_ns
            .fetch_add(ns.saturating_mul(n), Ordering::Relaxed);
    }

    /// Starts timing: the returned guard records the time until it is dropped.
    #[inline]
    pub fn start_timer(&self) -> Timer<'_> {
        Timer {
            histogram: self,
            start: Instant::now(),
        }
    }

    /// The counts as of now.
    pub fn read(&self) -> HistogramReading {
        let buckets: Vec<(f64, u64)> = self
            .buckets
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let bound = BOUNDS_NS
                    .get(i)
                    .map_or(f64::INFINITY, |&ns| ns as f64 / 1e9);
                (bound, b.load(Ordering::Relaxed))
            })
            .collect();
        HistogramReading {
            sum: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
            count: buckets.iter().map(|(_, n)| n).sum(),
            buckets,
        }
    }

    /// Writes the histogram as one metric (of a family, or alone).
    pub fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let r = self.read();
        encoder.encode_histogram::<NoLabelSet>(r.sum, r.count, &r.buckets, None)
    }
}

/// Times from its creation until it is dropped, into a histogram.
#[must_use = "the time is recorded when the timer is dropped"]
pub struct Timer<'a> {
    histogram: &'a LatencyHistogram,
    start: Instant,
}

impl Drop for Timer<'_> {
    #[inline]
    fn drop(&mut self) {
        self.histogram.observe(self.start.elapsed());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(h: &LatencyHistogram) -> Vec<u64> {
        h.read().buckets.iter().map(|(_, n)| *n).collect()
    }

    #[test]
    fn an_observation_lands_in_the_first_bucket_whose_bound_holds_it() {
        let h = LatencyHistogram::default();
        h.observe(Duration::from_nanos(1)); // bucket 0 (<= 5 µs)
        h.observe(Duration::from_micros(5)); // bound included: bucket 0
        h.observe(Duration::from_nanos(5_001)); // bucket 1 (<= 10 µs)
        h.observe(Duration::from_millis(3)); // <= 5 ms: bucket 9
        h.observe(Duration::from_secs(11)); // above every bound
        let c = counts(&h);
        assert_eq!(c.len(), BOUNDS_NS.len() + 1);
        assert_eq!(c[0], 2);
        assert_eq!(c[1], 1);
        assert_eq!(c[9], 1);
        assert_eq!(c[BOUNDS_NS.len()], 1);
        assert_eq!(c.iter().sum::<u64>(), 5);
        let r = h.read();
        assert_eq!(r.count, 5);
        let expected = 1e-9 + 5e-6 + 5.001e-6 + 3e-3 + 11.0;
        assert!(
            (r.sum - expected).abs() < 1e-9,
            "sum {} != {expected}",
            r.sum
        );
        assert_eq!(r.buckets[0].0, 5e-6);
        assert_eq!(r.buckets[BOUNDS_NS.len() - 1].0, 10.0);
        assert!(r.buckets[BOUNDS_NS.len()].0.is_infinite());
    }

    #[test]
    fn many_observations_at_once_count_each() {
        let h = LatencyHistogram::default();
        h.observe_many(Duration::from_micros(100), 7);
        let r = h.read();
        assert_eq!(r.count, 7);
        assert_eq!(r.buckets[4], (1e-4, 7));
        assert!((r.sum - 7e-4).abs() < 1e-12);
    }

    #[test]
    fn a_timer_records_when_dropped() {
        let h = LatencyHistogram::default();
        {
            let _t = h.start_timer();
            assert_eq!(h.read().count, 0, "nothing before the drop");
        }
        assert_eq!(h.read().count, 1);
    }

    #[test]
    fn a_huge_duration_saturates_instead_of_overflowing() {
        let h = LatencyHistogram::default();
        h.observe_many(Duration::MAX, 3);
        let r = h.read();
        assert_eq!(r.count, 3);
        assert_eq!(r.buckets[BOUNDS_NS.len()].1, 3);
    }

    #[test]
    fn histograms_do_not_share_cache_lines() {
        assert_eq!(std::mem::align_of::<LatencyHistogram>(), 128);
        assert_eq!(std::mem::size_of::<LatencyHistogram>() % 128, 0);
    }
}
