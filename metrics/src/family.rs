//! Writing metric families from values read at scrape time: a collector reads the
//! atomics its daemon keeps anyway and writes them with these, so exposing a counter
//! costs the data path nothing.
//!
//! Names are given without the unit or `_total` suffix: the encoder appends them
//! (`bytes` for [`Unit::Bytes`], `_total` to a counter's samples), as OpenMetrics
//! wants. Help texts must not contain a backslash or a newline (they are written
//! unescaped).

use crate::histogram::LatencyHistogram;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
pub use prometheus_client::registry::Unit;
use std::fmt::Error;

/// A counter without labels.
pub fn counter(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    value: u64,
) -> Result<(), Error> {
    let m = ConstCounter::new(value);
    m.encode(enc.encode_descriptor(name, help, unit, m.metric_type())?)
}

/// A gauge without labels.
pub fn gauge(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    value: u64,
) -> Result<(), Error> {
    let m = ConstGauge::new(value);
    m.encode(enc.encode_descriptor(name, help, unit, m.metric_type())?)
}

/// A counter per value of the label `label`.
pub fn counters_by<'a>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    label: &str,
    values: impl IntoIterator<Item = (&'a str, u64)>,
) -> Result<(), Error> {
    let mut family = enc.encode_descriptor(name, help, unit, MetricType::Counter)?;
    for (l, v) in values {
        ConstCounter::new(v).encode(family.encode_family(&[(label, l)])?)?;
    }
    Ok(())
}

/// A gauge per value of the label `label`.
pub fn gauges_by<'a>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    label: &str,
    values: impl IntoIterator<Item = (&'a str, u64)>,
) -> Result<(), Error> {
    let mut family = enc.encode_descriptor(name, help, unit, MetricType::Gauge)?;
    for (l, v) in values {
        ConstGauge::new(v).encode(family.encode_family(&[(label, l)])?)?;
    }
    Ok(())
}

/// A latency histogram (in seconds) per value of the label `label`.
pub fn histograms_by<'a>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    values: impl IntoIterator<Item = (&'a str, &'a LatencyHistogram)>,
) -> Result<(), Error> {
    let mut family =
        enc.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Histogram)?;
    for (l, h) in values {
        h.encode(family.encode_family(&[(label, l)])?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::collector::Collector;
    use prometheus_client::encoding::text::encode;
    use prometheus_client::registry::Registry;
    use std::time::Duration;

    #[derive(Debug, Default)]
    struct Sample {
        latency: LatencyHistogram,
    }

    impl Collector for Sample {
        fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), Error> {
            counter(&mut enc, "ops", "Operations.", None, 3)?;
            gauge(&mut enc, "used", "Bytes used.", Some(&Unit::Bytes), 4096)?;
            counters_by(
                &mut enc,
                "refused",
                "Refusals.",
                None,
                "reason",
                [("busy", 1), ("full", 2)],
            )?;
            gauges_by(&mut enc, "up", "Up.", None, "node", [("a:1", 1)])?;
            histograms_by(&mut enc, "op", "Latency.", "op", [("read", &self.latency)])
        }
    }

    #[test]
    fn families_are_written_with_their_types_units_and_labels() {
        let s = Sample::default();
        s.latency.observe(Duration::from_micros(7));
        let mut reg = Registry::default();
        reg.register_collector(Box::new(s));
        let mut out = String::new();
        encode(&mut out, &reg).unwrap();
        for line in [
            "# TYPE ops counter",
            "ops_total 3",
            "# TYPE used_bytes gauge",
            "# UNIT used_bytes bytes",
            "used_bytes 4096",
            "refused_total{reason=\"busy\"} 1",
            "refused_total{reason=\"full\"} 2",
            "up{node=\"a:1\"} 1",
            "# TYPE op_seconds histogram",
            "op_seconds_count{op=\"read\"} 1",
            "op_seconds_bucket{le=\"0.000005\",op=\"read\"} 0",
            "op_seconds_bucket{le=\"0.00001\",op=\"read\"} 1",
            "op_seconds_bucket{le=\"+Inf\",op=\"read\"} 1",
            "# EOF",
        ] {
            assert!(
                out.lines().any(|l| l == line),
                "no line {line:?} in:\n{out}"
            );
        }
    }
}
