//! A strict parser of the Prometheus text exposition formats, so a test fails on any
//! line a scraper could not take rather than skipping it (the lenient parsers on
//! crates.io ignore lines they do not understand).
//!
//! It takes both formats the daemons serve: OpenMetrics 1.0 text (`# UNIT` lines,
//! counters' samples `NAME_total`, a final `# EOF`) and the Prometheus text format
//! 0.0.4 (no `# UNIT`, no `# EOF`). It checks:
//!
//! - every line is `# HELP`, `# TYPE`, `# UNIT` (OpenMetrics), `# EOF` (OpenMetrics,
//!   last) or a sample; no blank line, no other comment; the text ends in a newline;
//! - names and label names are well formed, label values are quoted with only the
//!   escapes `\\`, `\"` and `\n`, values are numbers (`+Inf`, `-Inf`, `NaN` too);
//! - a family's `# TYPE` comes once, before its samples, and its samples are
//!   contiguous and named after it as its type allows (`_total`/`_created` for a
//!   counter in OpenMetrics, `_bucket`/`_sum`/`_count`/`_created` for a histogram);
//!   no sample (name and labels) appears twice;
//! - counters are not negative; a histogram's buckets (per label set) have an `le`
//!   label, rise with it, end at `+Inf`, and that bucket equals `_count`.

use std::collections::{BTreeMap, BTreeSet};

/// One sample: its name, labels and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A metric family: its type, help and unit, and its samples in order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Family {
    pub kind: String,
    pub help: Option<String>,
    pub unit: Option<String>,
    pub samples: Vec<Sample>,
}

/// A whole exposition, by family name.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Exposition {
    pub families: BTreeMap<String, Family>,
}

/// Which format the text is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    OpenMetrics,
    Prometheus,
}

impl Exposition {
    /// The value of the sample `name` whose labels include `labels`; `None` when no
    /// sample matches, a panic naming them when several do.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let matching: Vec<&Sample> = self
            .families
            .values()
            .flat_map(|f| &f.samples)
            .filter(|s| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).is_some_and(|x| x == v))
            })
            .collect();
        assert!(
            matching.len() <= 1,
            "{} samples {name}{labels:?}: {matching:?}",
            matching.len()
        );
        matching.first().map(|s| s.value)
    }

    /// As [`Exposition::value`], panicking when there is no such sample.
    #[track_caller]
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(name, labels).unwrap_or_else(|| {
            let names: BTreeSet<&str> = self
                .families
                .values()
                .flat_map(|f| f.samples.iter().map(|s| s.name.as_str()))
                .collect();
            panic!("no sample {name} with labels {labels:?}; the samples are {names:?}")
        })
    }
}

fn valid_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn valid_label_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn number(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" | "Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ if s
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-'))
            && !s.is_empty() =>
        {
            s.parse().map_err(|e| format!("bad number {s:?}: {e}"))
        }
        _ => Err(format!("bad number {s:?}")),
    }
}

/// Parses `{a="x",b="y"}` at the start of `s`; returns the labels and the rest.
fn labels(s: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut out = BTreeMap::new();
    let Some(mut rest) = s.strip_prefix('{') else {
        return Ok((out, s));
    };
    loop {
        if let Some(r) = rest.strip_prefix('}') {
            return Ok((out, r));
        }
        let eq = rest.find('=').ok_or("a label without '='")?;
        let name = &rest[..eq];
        if !valid_label_name(name) {
            return Err(format!("bad label name {name:?}"));
        }
        rest = rest[eq + 1..]
            .strip_prefix('"')
            .ok_or("a label value without its opening quote")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                None => return Err("a label value without its closing quote".into()),
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, 'n')) => value.push('\n'),
                    other => return Err(format!("bad escape in a label value: {other:?}")),
                },
                Some((_, '\n')) => return Err("a newline in a label value".into()),
                Some((_, c)) => value.push(c),
            }
        };
        if out.insert(name.to_string(), value).is_some() {
            return Err(format!("label {name} twice"));
        }
        rest = &rest[end + 1..];
        if let Some(r) = rest.strip_prefix(',') {
            rest = r;
        } else if !rest.starts_with('}') {
            return Err("labels not separated by ','".into());
        }
    }
}

/// The suffixes a sample of a family of `kind` may add to the family's name.
fn suffixes(kind: &str, format: Format) -> &'static [&'static str] {
    match (kind, format) {
        ("counter", Format::OpenMetrics) => &["_total", "_created"],
        ("counter", Format::Prometheus) => &[""],
        ("histogram", _) => &["_bucket", "_sum", "_count", "_created"],
        ("summary", _) => &["", "_sum", "_count", "_created"],
        ("info", Format::OpenMetrics) => &["_info"],
        _ => &[""],
    }
}

/// Parses `text` in `format`; the error names the line and what is wrong with it.
pub fn parse(text: &str, format: Format) -> Result<Exposition, String> {
    let mut exp = Exposition::default();
    let mut current: Option<String> = None;
    let mut closed: BTreeSet<String> = BTreeSet::new();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut eof = false;
    if !text.ends_with('\n') {
        return Err("the text does not end with a newline".into());
    }
    for (n, line) in text.lines().enumerate() {
        let at = |e: String| format!("line {}: {e}: {line:?}", n + 1);
        if eof {
            return Err(at("a line after # EOF".into()));
        }
        if let Some(meta) = line.strip_prefix("# ") {
            let mut parts = meta.splitn(3, ' ');
            let what = parts.next().unwrap_or("");
            if what == "EOF" && meta == "EOF" {
                if format != Format::OpenMetrics {
                    return Err(at("# EOF in the Prometheus text format".into()));
                }
                eof = true;
                continue;
            }
            let name = parts.next().ok_or_else(|| at("no metric name".into()))?;
            let arg = parts.next().unwrap_or("");
            if !valid_name(name) {
                return Err(at(format!("bad metric name {name:?}")));
            }
            if current.as_deref() != Some(name) {
                if exp.families.contains_key(name) || closed.contains(name) {
                    return Err(at(format!("family {name} described twice or interleaved")));
                }
                if let Some(prev) = current.take() {
                    closed.insert(prev);
                }
                current = Some(name.to_string());
                exp.families.insert(name.to_string(), Family::default());
            }
            let fam = exp.families.get_mut(name).ok_or("unreachable")?;
            if !fam.samples.is_empty() {
                return Err(at(format!("a descriptor of {name} after its samples")));
            }
            match what {
                "HELP" if fam.help.is_none() => fam.help = Some(arg.to_string()),
                "TYPE" if fam.kind.is_empty() => {
                    let known = [
                        "counter",
                        "gauge",
                        "histogram",
                        "summary",
                        "untyped",
                        "unknown",
                        "info",
                        "stateset",
                        "gaugehistogram",
                    ];
                    if !known.contains(&arg) {
                        return Err(at(format!("unknown type {arg:?}")));
                    }
                    fam.kind = arg.to_string();
                }
                "UNIT" if format == Format::OpenMetrics && fam.unit.is_none() => {
                    if !name.ends_with(&format!("_{arg}")) {
                        return Err(at(format!("{name} does not end with its unit {arg}")));
                    }
                    fam.unit = Some(arg.to_string());
                }
                _ => return Err(at(format!("unexpected or repeated # {what}"))),
            }
            continue;
        }
        if line.is_empty() || line.starts_with('#') {
            return Err(at("a blank line or a comment".into()));
        }
        // A sample: NAME[{labels}] VALUE [TIMESTAMP]
        let name_end = line
            .find(['{', ' '])
            .ok_or_else(|| at("a sample without a value".into()))?;
        let name = &line[..name_end];
        if !valid_name(name) {
            return Err(at(format!("bad metric name {name:?}")));
        }
        let (labels, rest) = labels(&line[name_end..]).map_err(at)?;
        let rest = rest
            .strip_prefix(' ')
            .ok_or_else(|| at("no space before the value".into()))?;
        let mut fields = rest.split(' ');
        let value = number(fields.next().unwrap_or("")).map_err(at)?;
        if let Some(ts) = fields.next() {
            number(ts).map_err(at)?;
        }
        if fields.next().is_some() {
            return Err(at("more than a value and a timestamp".into()));
        }
        let fam_name = current
            .clone()
            .ok_or_else(|| at("a sample before any # TYPE".into()))?;
        let fam = exp.families.get_mut(&fam_name).ok_or("unreachable")?;
        if fam.kind.is_empty() {
            return Err(at(format!("a sample of {fam_name} before its # TYPE")));
        }
        let suffix = name.strip_prefix(fam_name.as_str()).unwrap_or("\u{0}");
        if !suffixes(&fam.kind, format).contains(&suffix) {
            return Err(at(format!(
                "sample {name} does not belong to {} family {fam_name}",
                fam.kind
            )));
        }
        if fam.kind == "counter" && (value.is_nan() || value < 0.0) {
            return Err(at("a negative or NaN counter".into()));
        }
        let key = format!("{name}{labels:?}");
        if !seen.insert(key) {
            return Err(at("the same sample twice".into()));
        }
        fam.samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    if format == Format::OpenMetrics && !eof {
        return Err("no # EOF at the end".into());
    }
    for (name, fam) in &exp.families {
        if fam.kind.is_empty() {
            return Err(format!("family {name} has no # TYPE"));
        }
        if fam.kind == "histogram" {
            check_histogram(name, fam)?;
        }
    }
    Ok(exp)
}

/// One label set of a histogram: its buckets (upper bound, count) in order, and its
/// `_count`.
type Series = (Vec<(f64, f64)>, Option<f64>);

fn check_histogram(name: &str, fam: &Family) -> Result<(), String> {
    // Per label set (le aside): the buckets in order and the count.
    let mut sets: BTreeMap<String, Series> = BTreeMap::new();
    for s in &fam.samples {
        let mut rest = s.labels.clone();
        let le = rest.remove("le");
        let entry = sets.entry(format!("{rest:?}")).or_default();
        if s.name.ends_with("_bucket") {
            let le = le.ok_or_else(|| format!("{name}: a bucket without le"))?;
            entry.0.push((number(&le)?, s.value));
        } else if s.name.ends_with("_count") {
            entry.1 = Some(s.value);
        }
    }
    for (labels, (buckets, count)) in sets {
        let what = format!("histogram {name}{labels}");
        let last = buckets.last().ok_or(format!("{what}: no buckets"))?;
        if last.0 != f64::INFINITY {
            return Err(format!("{what}: the last bucket is not +Inf"));
        }
        if buckets
            .windows(2)
            .any(|w| w[1].0 <= w[0].0 || w[1].1 < w[0].1)
        {
            return Err(format!("{what}: buckets not rising: {buckets:?}"));
        }
        if count != Some(last.1) {
            return Err(format!(
                "{what}: _count {count:?} is not the +Inf bucket {}",
                last.1
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const OM: &str = "\
# HELP a_total_bytes Bytes.
# TYPE a_total_bytes counter
# UNIT a_total_bytes bytes
a_total_bytes_total{op=\"read\"} 3
a_total_bytes_total{op=\"w\\\"x\\\\y\\n\"} 4
# HELP g G.
# TYPE g gauge
g 1.5
# HELP h_seconds H.
# TYPE h_seconds histogram
# UNIT h_seconds seconds
h_seconds_sum{k=\"r\"} 0.5
h_seconds_count{k=\"r\"} 2
h_seconds_bucket{le=\"0.1\",k=\"r\"} 1
h_seconds_bucket{le=\"+Inf\",k=\"r\"} 2
# EOF
";

    #[test]
    fn a_well_formed_openmetrics_text_parses() {
        let e = parse(OM, Format::OpenMetrics).expect("parses");
        assert_eq!(e.get("a_total_bytes_total", &[("op", "read")]), 3.0);
        assert_eq!(e.get("a_total_bytes_total", &[("op", "w\"x\\y\n")]), 4.0);
        assert_eq!(e.get("g", &[]), 1.5);
        assert_eq!(e.get("h_seconds_count", &[("k", "r")]), 2.0);
        assert_eq!(e.families["h_seconds"].unit.as_deref(), Some("seconds"));
    }

    #[test]
    fn the_prometheus_format_parses_without_eof() {
        let text = "# HELP x_total X.\n# TYPE x_total counter\nx_total 1\n# HELP y Y.\n# TYPE y gauge\ny{a=\"b\"} -2 1700000000\n";
        let e = parse(text, Format::Prometheus).expect("parses");
        assert_eq!(e.get("x_total", &[]), 1.0);
        assert_eq!(e.get("y", &[("a", "b")]), -2.0);
        assert!(parse(&format!("{text}# EOF\n"), Format::Prometheus).is_err());
        assert!(parse(text, Format::OpenMetrics).is_err(), "no # EOF");
    }

    #[test]
    fn every_kind_of_malformed_line_is_an_error() {
        let bad = [
            ("no newline at the end", OM.trim_end()),
            ("blank line", "# TYPE g gauge\n\ng 1\n# EOF\n"),
            ("stray comment", "# TYPE g gauge\n# hello\ng 1\n# EOF\n"),
            ("no type", "g 1\n# EOF\n"),
            ("bad value", "# TYPE g gauge\ng one\n# EOF\n"),
            ("no value", "# TYPE g gauge\ng\n# EOF\n"),
            ("two spaces", "# TYPE g gauge\ng  1\n# EOF\n"),
            ("extra field", "# TYPE g gauge\ng 1 2 3\n# EOF\n"),
            ("bad name", "# TYPE 1g gauge\n1g 1\n# EOF\n"),
            ("unquoted label", "# TYPE g gauge\ng{a=b} 1\n# EOF\n"),
            ("unclosed label", "# TYPE g gauge\ng{a=\"b} 1\n# EOF\n"),
            ("bad escape", "# TYPE g gauge\ng{a=\"\\t\"} 1\n# EOF\n"),
            ("bad label name", "# TYPE g gauge\ng{1a=\"b\"} 1\n# EOF\n"),
            ("labels without comma", "# TYPE g gauge\ng{a=\"b\"c=\"d\"} 1\n# EOF\n"),
            ("duplicate label", "# TYPE g gauge\ng{a=\"b\",a=\"c\"} 1\n# EOF\n"),
            ("duplicate sample", "# TYPE g gauge\ng 1\ng 2\n# EOF\n"),
            ("foreign sample", "# TYPE g gauge\nh 1\n# EOF\n"),
            ("counter without _total", "# TYPE c counter\nc 1\n# EOF\n"),
            ("negative counter", "# TYPE c counter\nc_total -1\n# EOF\n"),
            ("unknown type", "# TYPE g meter\ng 1\n# EOF\n"),
            ("type twice", "# TYPE g gauge\n# TYPE g gauge\ng 1\n# EOF\n"),
            ("interleaved", "# TYPE g gauge\ng 1\n# TYPE h gauge\nh 1\n# TYPE g gauge\n# EOF\n"),
            ("unit not in name", "# TYPE g gauge\n# UNIT g bytes\ng 1\n# EOF\n"),
            ("line after eof", "# TYPE g gauge\ng 1\n# EOF\ng 2\n"),
            (
                "buckets falling",
                "# TYPE h histogram\nh_count 2\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\n# EOF\n",
            ),
            (
                "no +Inf bucket",
                "# TYPE h histogram\nh_count 1\nh_bucket{le=\"1\"} 1\n# EOF\n",
            ),
            (
                "count is not +Inf",
                "# TYPE h histogram\nh_count 3\nh_bucket{le=\"+Inf\"} 2\n# EOF\n",
            ),
            (
                "bucket without le",
                "# TYPE h histogram\nh_count 1\nh_bucket 1\n# EOF\n",
            ),
        ];
        for (what, text) in bad {
            assert!(
                parse(text, Format::OpenMetrics).is_err(),
                "{what} should not parse: {text:?}"
            );
        }
    }
}
