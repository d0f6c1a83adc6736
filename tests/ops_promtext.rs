//! A strict parser of the Prometheus text exposition format 0.0.4, and its own
//! tests. Guards against a `/metrics` output that a real scraper would reject or
//! misread: malformed lines, bad escapes, families split apart or declared twice,
//! duplicate series, and histograms whose buckets are not cumulative or whose
//! `+Inf` bucket disagrees with `_count`. `integration.rs` declares this file as
//! `promtext`, which other tests use to check what Cairn renders.

use std::collections::{BTreeMap, HashSet};

#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    pub name: String,
    pub help: Option<String>,
    pub kind: String,
    pub samples: Vec<Sample>,
}

#[derive(Debug, Default)]
pub struct Exposition {
    pub families: Vec<Family>,
}

impl Exposition {
    pub fn family(&self, name: &str) -> Option<&Family> {
        self.families.iter().find(|f| f.name == name)
    }

    /// The sum of every sample `name`, whatever its labels (a per-core or
    /// per-shard family member-wide); 0 when there is none.
    pub fn sum(&self, name: &str) -> f64 {
        self.families
            .iter()
            .flat_map(|f| f.samples.iter())
            .filter(|s| s.name == name)
            .map(|s| s.value)
            .sum()
    }

    /// The value of the one sample `name` whose labels include all of `labels`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let matching: Vec<&Sample> = self
            .families
            .iter()
            .flat_map(|f| f.samples.iter())
            .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.label(k) == Some(*v)))
            .collect();
        match matching.as_slice() {
            [one] => Some(one.value),
            _ => None,
        }
    }
}

fn valid_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn parse_value(s: &str) -> Result<f64, String> {
    match s {
        "NaN" => Ok(f64::NAN),
        "+Inf" | "Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        _ => {
            let ok_chars = s
                .chars()
                .all(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E'));
            if s.is_empty() || !ok_chars {
                return Err(format!("bad value {s:?}"));
            }
            s.parse::<f64>()
                .map_err(|e| format!("bad value {s:?}: {e}"))
        }
    }
}

fn unescape_help(s: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('\\') => out.push('\\'),
                Some('n') => out.push('\n'),
                other => return Err(format!("bad escape \\{other:?} in HELP {s:?}")),
            }
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

type Labels = Vec<(String, String)>;

/// Buckets as (le, cumulative count), then `_sum` and `_count`.
type HistogramSeries = (Vec<(f64, f64)>, Option<f64>, Option<f64>);

/// Parses `{a="x",b="y"}`; returns the labels and the rest of the line.
fn parse_labels(s: &str) -> Result<(Labels, &str), String> {
    let mut labels = Vec::new();
    let mut rest = s.strip_prefix('{').ok_or("labels must open with '{'")?;
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            return Ok((labels, after));
        }
        let eq = rest
            .find('=')
            .ok_or_else(|| format!("label without '=' in {s:?}"))?;
        let name = &rest[..eq];
        if !valid_label_name(name) {
            return Err(format!("bad label name {name:?}"));
        }
        if labels.iter().any(|(k, _)| k == name) {
            return Err(format!("label {name} given twice"));
        }
        rest = rest[eq + 1..]
            .strip_prefix('"')
            .ok_or_else(|| format!("label {name} value not quoted"))?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                None => return Err(format!("unterminated value of label {name}")),
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, 'n')) => value.push('\n'),
                    other => return Err(format!("bad escape {other:?} in label {name}")),
                },
                Some((_, '\n')) => return Err(format!("raw line break in label {name}")),
                Some((_, c)) => value.push(c),
            }
        };
        labels.push((name.to_string(), value));
        rest = &rest[end + 1..];
        if let Some(after) = rest.strip_prefix(',') {
            rest = after;
        } else if !rest.starts_with('}') {
            return Err(format!("expected ',' or '}}' after label {name}"));
        }
    }
}

fn family_of(sample: &str, kinds: &BTreeMap<String, String>) -> String {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = sample.strip_suffix(suffix) {
            if kinds
                .get(base)
                .is_some_and(|k| k == "histogram" || k == "summary")
            {
                return base.to_string();
            }
        }
    }
    sample.to_string()
}

/// Parses and checks a whole exposition; the error names the line.
pub fn parse(text: &str) -> Result<Exposition, String> {
    if !text.is_empty() && !text.ends_with('\n') {
        return Err("exposition must end with a line feed".into());
    }
    let mut families: Vec<Family> = Vec::new();
    let mut kinds: BTreeMap<String, String> = BTreeMap::new();
    let mut closed: HashSet<String> = HashSet::new();
    let mut series: HashSet<String> = HashSet::new();
    for (n, line) in text.lines().enumerate() {
        let at = |e: String| format!("line {}: {e}: {line:?}", n + 1);
        if line.is_empty() {
            return Err(at("empty line".into()));
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut parts = comment.trim_start().splitn(3, ' ');
            let keyword = parts.next().unwrap_or("");
            if keyword != "HELP" && keyword != "TYPE" {
                continue;
            }
            let name = parts.next().ok_or_else(|| at("no metric name".into()))?;
            let rest = parts.next().unwrap_or("");
            if !valid_metric_name(name) {
                return Err(at(format!("bad metric name {name:?}")));
            }
            if closed.contains(name) {
                return Err(at(format!("{keyword} for {name} after its family ended")));
            }
            let current = families.last().map(|f| f.name.as_str());
            if current != Some(name) {
                if let Some(prev) = families.last() {
                    closed.insert(prev.name.clone());
                }
                families.push(Family {
                    name: name.to_string(),
                    help: None,
                    kind: "untyped".into(),
                    samples: Vec::new(),
                });
            }
            let family = families.last_mut().expect("just pushed");
            if !family.samples.is_empty() {
                return Err(at(format!("{keyword} for {name} after its samples")));
            }
            if keyword == "HELP" {
                if family.help.is_some() {
                    return Err(at(format!("second HELP for {name}")));
                }
                family.help = Some(unescape_help(rest).map_err(at)?);
            } else {
                if kinds.contains_key(name) {
                    return Err(at(format!("second TYPE for {name}")));
                }
                if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&rest) {
                    return Err(at(format!("unknown type {rest:?}")));
                }
                kinds.insert(name.to_string(), rest.to_string());
                family.kind = rest.to_string();
            }
            continue;
        }
        let name_end = line
            .find(['{', ' '])
            .ok_or_else(|| at("sample without value".into()))?;
        let name = &line[..name_end];
        if !valid_metric_name(name) {
            return Err(at(format!("bad sample name {name:?}")));
        }
        let (labels, rest) = if line[name_end..].starts_with('{') {
            parse_labels(&line[name_end..]).map_err(at)?
        } else {
            (Vec::new(), &line[name_end..])
        };
        let rest = rest
            .strip_prefix(' ')
            .ok_or_else(|| at("expected one space before the value".into()))?;
        let mut fields = rest.split(' ');
        let value = parse_value(fields.next().unwrap_or("")).map_err(at)?;
        if let Some(ts) = fields.next() {
            ts.parse::<i64>()
                .map_err(|_| at(format!("bad timestamp {ts:?}")))?;
        }
        if fields.next().is_some() {
            return Err(at("trailing fields".into()));
        }
        let family_name = family_of(name, &kinds);
        if closed.contains(&family_name) {
            return Err(at(format!(
                "sample of {family_name} after its family ended"
            )));
        }
        if families.last().map(|f| f.name.as_str()) != Some(family_name.as_str()) {
            if let Some(prev) = families.last() {
                closed.insert(prev.name.clone());
            }
            families.push(Family {
                name: family_name.clone(),
                help: None,
                kind: "untyped".into(),
                samples: Vec::new(),
            });
        }
        let family = families.last_mut().expect("present");
        match family.kind.as_str() {
            "counter" if value < 0.0 || value.is_nan() => {
                return Err(at("counter below zero".into()))
            }
            "counter" | "gauge" | "untyped" if name != family.name => {
                return Err(at(format!(
                    "sample {name} in {} family {}",
                    family.kind, family.name
                )))
            }
            "histogram" if name == family.name => {
                return Err(at("histogram sample without _bucket/_sum/_count".into()))
            }
            "histogram" if name.ends_with("_bucket") && labels.iter().all(|(k, _)| k != "le") => {
                return Err(at("bucket without le".into()))
            }
            _ => {}
        }
        let mut key_labels = labels.clone();
        key_labels.sort();
        let key = format!("{name}{key_labels:?}");
        if !series.insert(key) {
            return Err(at("duplicate series".into()));
        }
        family.samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    let exposition = Exposition { families };
    for family in &exposition.families {
        if family.kind == "histogram" {
            check_histogram(family)?;
        }
    }
    Ok(exposition)
}

fn check_histogram(family: &Family) -> Result<(), String> {
    // Group by the labels other than `le`.
    let mut groups: BTreeMap<Labels, HistogramSeries> = BTreeMap::new();
    for s in &family.samples {
        let mut key: Vec<(String, String)> = s
            .labels
            .iter()
            .filter(|(k, _)| k != "le")
            .cloned()
            .collect();
        key.sort();
        let entry = groups.entry(key).or_default();
        if s.name.ends_with("_bucket") {
            let le = parse_value(s.label("le").expect("checked"))
                .map_err(|e| format!("{}: {e}", family.name))?;
            entry.0.push((le, s.value));
        } else if s.name.ends_with("_sum") {
            entry.1 = Some(s.value);
        } else {
            entry.2 = Some(s.value);
        }
    }
    for (labels, (buckets, sum, count)) in groups {
        let what = format!("histogram {}{labels:?}", family.name);
        let count = count.ok_or_else(|| format!("{what}: no _count"))?;
        sum.ok_or_else(|| format!("{what}: no _sum"))?;
        if buckets.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(format!("{what}: le not strictly increasing"));
        }
        if buckets.windows(2).any(|w| w[0].1 > w[1].1) {
            return Err(format!("{what}: buckets not cumulative"));
        }
        match buckets.last() {
            Some((le, n)) if le.is_infinite() && *n == count => {}
            _ => {
                return Err(format!(
                    "{what}: +Inf bucket missing or not equal to _count {count}"
                ))
            }
        }
    }
    Ok(())
}

#[test]
fn accepts_a_well_formed_exposition() {
    let text = "# HELP a_total Things, with \\\\ and \\n.\n# TYPE a_total counter\na_total{x=\"q\\\"\"} 3\n\
                # HELP h Lat.\n# TYPE h histogram\nh_bucket{le=\"0.5\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 1.5\nh_count 2\n";
    let e = parse(text).unwrap();
    assert_eq!(e.families.len(), 2);
    assert_eq!(
        e.family("a_total").unwrap().help.as_deref(),
        Some("Things, with \\ and \n.")
    );
    assert_eq!(e.value("a_total", &[("x", "q\"")]), Some(3.0));
    assert_eq!(e.value("h_count", &[]), Some(2.0));
}

#[test]
fn rejects_what_a_scraper_would_reject() {
    let bad = [
        ("no final newline", "a 1"),
        ("bad name", "1a 1\n"),
        ("missing value", "a\n"),
        ("two spaces", "a  1\n"),
        ("bad escape", "a{x=\"\\t\"} 1\n"),
        ("unterminated label", "a{x=\"1} 1\n"),
        ("duplicate label", "a{x=\"1\",x=\"2\"} 1\n"),
        ("duplicate series", "a 1\na 2\n"),
        ("type after samples", "a 1\n# TYPE a gauge\n"),
        ("second type", "# TYPE a gauge\n# TYPE a gauge\na 1\n"),
        ("split family", "# TYPE a gauge\na{x=\"1\"} 1\n# TYPE b gauge\nb 1\na{x=\"2\"} 1\n"),
        ("negative counter", "# TYPE a counter\na -1\n"),
        ("bad timestamp", "a 1 soon\n"),
        (
            "non-cumulative buckets",
            "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 0\nh_count 1\n",
        ),
        (
            "inf bucket != count",
            "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 1\nh_sum 0\nh_count 2\n",
        ),
        ("no +Inf bucket", "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 0\nh_count 1\n"),
        ("unknown type", "# TYPE a thing\na 1\n"),
        ("empty line", "a 1\n\nb 1\n"),
    ];
    for (why, text) in bad {
        assert!(parse(text).is_err(), "accepted {why}: {text:?}");
    }
}
