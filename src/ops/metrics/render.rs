//! Rendering the registry in the Prometheus text exposition format at scrape time.

use std::fmt::Write as _;

use super::histogram::BucketLayout;
use super::registry::Registry;
use super::{Aggregate, Desc, Kind, MemberSeries, MetricType, Scope};

impl Registry {
    /// Renders every metric in the Prometheus text exposition format 0.0.4.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        self.render_into(&mut out);
        out
    }

    pub fn render_into(&self, out: &mut String) {
        // Member-wide (etcd-named) families first: they are what dashboards read.
        for desc in &self.shape.descs {
            if let Some(member) = desc.spec.member {
                self.render_member(out, desc, member);
            }
        }
        for desc in &self.shape.descs {
            self.render_labelled(out, desc);
        }
        if self.shape.process_metrics {
            crate::ops::process::render_into(out);
        }
    }

    /// Every (labels, block base) pair of a metric's series, in a stable order.
    fn series(&self, scope: Scope) -> Vec<(usize, Option<u32>, usize)> {
        let mut series = Vec::new();
        for (core, shards) in self.shape.shards_by_core.iter().enumerate() {
            match scope {
                Scope::Core => series.push((core, None, 0)),
                Scope::Shard => {
                    for (slot, &shard) in shards.iter().enumerate() {
                        let base =
                            self.shape.core_block_slots + slot * self.shape.shard_block_slots;
                        series.push((core, Some(shard), base));
                    }
                }
            }
        }
        series
    }

    fn render_labelled(&self, out: &mut String, desc: &Desc) {
        write_header(out, desc.spec.name, desc.spec.help, desc.kind.metric_type());
        for (core, shard, base) in self.series(desc.scope) {
            let slab = &self.slabs[core];
            let at = base + desc.offset;
            let mut labels = vec![("core", core.to_string())];
            if let Some(shard) = shard {
                labels.push(("shard", shard.to_string()));
            }
            match &desc.kind {
                Kind::Counter => write_sample(out, desc.spec.name, &labels, slab.load(at)),
                Kind::Gauge => write_sample(out, desc.spec.name, &labels, slab.load(at) as i64),
                Kind::Info { label, values } => {
                    let chosen = slab.load(at) as usize;
                    if let Some(value) = chosen.checked_sub(1).and_then(|i| values.get(i)) {
                        labels.push((label, (*value).to_string()));
                        write_sample(out, desc.spec.name, &labels, 1);
                    }
                }
                Kind::Histogram { layout, thresholds } => {
                    let counts: Vec<u64> =
                        (0..=thresholds.len()).map(|b| slab.load(at + b)).collect();
                    let sum = slab.load(at + thresholds.len() + 1);
                    write_histogram(out, desc.spec.name, &labels, layout, &counts, sum);
                }
            }
        }
    }

    fn render_member(&self, out: &mut String, desc: &Desc, member: MemberSeries) {
        write_header(out, member.name, member.help, member.rendered_as);
        let series = self.series(desc.scope);
        let cells = |offset: usize| {
            series
                .iter()
                .map(move |&(core, _, base)| self.slabs[core].load(base + desc.offset + offset))
        };
        match &desc.kind {
            Kind::Counter | Kind::Gauge | Kind::Info { .. } => {
                let signed = !matches!(desc.kind, Kind::Counter);
                let value: i128 = match member.aggregate {
                    Aggregate::Sum => cells(0).map(|v| widen(v, signed)).sum(),
                    Aggregate::Min => cells(0).map(|v| widen(v, signed)).min().unwrap_or(0),
                };
                write_sample(out, member.name, &[], value);
            }
            Kind::Histogram { layout, thresholds } => {
                let counts: Vec<u64> = (0..=thresholds.len())
                    .map(|b| cells(b).fold(0u64, u64::wrapping_add))
                    .collect();
                let sum = cells(thresholds.len() + 1).fold(0u64, u64::wrapping_add);
                write_histogram(out, member.name, &[], layout, &counts, sum);
            }
        }
    }
}

fn widen(v: u64, signed: bool) -> i128 {
    if signed {
        i128::from(v as i64)
    } else {
        i128::from(v)
    }
}

fn write_header(out: &mut String, name: &str, help: &str, ty: MetricType) {
    let _ = writeln!(out, "# HELP {name} {}", escape_help(help));
    let _ = writeln!(out, "# TYPE {name} {}", ty.as_str());
}

fn write_labels(out: &mut String, labels: &[(&str, String)], le: Option<&str>) {
    if labels.is_empty() && le.is_none() {
        return;
    }
    out.push('{');
    let mut first = true;
    let all = labels
        .iter()
        .map(|(k, v)| (*k, v.as_str()))
        .chain(le.map(|le| ("le", le)));
    for (k, v) in all {
        if !first {
            out.push(',');
        }
        first = false;
        let _ = write!(out, "{k}=\"{}\"", escape_label_value(v));
    }
    out.push('}');
}

fn write_sample(
    out: &mut String,
    name: &str,
    labels: &[(&str, String)],
    value: impl std::fmt::Display,
) {
    out.push_str(name);
    write_labels(out, labels, None);
    let _ = writeln!(out, " {value}");
}

fn write_histogram(
    out: &mut String,
    name: &str,
    labels: &[(&str, String)],
    layout: &BucketLayout,
    counts: &[u64],
    sum_base_units: u64,
) {
    let mut cumulative = 0u64;
    for (i, count) in counts.iter().enumerate() {
        cumulative = cumulative.wrapping_add(*count);
        let le = match layout.bounds.get(i) {
            Some(bound) => format_float(*bound),
            None => "+Inf".to_string(),
        };
        let _ = write!(out, "{name}_bucket");
        write_labels(out, labels, Some(&le));
        let _ = writeln!(out, " {cumulative}");
    }
    let sum = sum_base_units as f64 / layout.base_units_per_unit as f64;
    let _ = write!(out, "{name}_sum");
    write_labels(out, labels, None);
    let _ = writeln!(out, " {}", format_float(sum));
    let _ = write!(out, "{name}_count");
    write_labels(out, labels, None);
    let _ = writeln!(out, " {cumulative}");
}

/// Shortest decimal that reads back as the same f64; Rust's `Display` never uses
/// an exponent, which every Prometheus parser accepts.
pub(super) fn format_float(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_string()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_string()
    } else {
        format!("{v}")
    }
}

fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}

fn escape_label_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::metrics::{RegistryBuilder, ShardMetrics};

    use crate::ops::metrics::spec;

    #[test]
    fn member_series_sum_and_min_over_shards() {
        let mut b = RegistryBuilder::new(2).unwrap();
        b.place_shard(0, 0).unwrap();
        b.place_shard(1, 1).unwrap();
        b.place_shard(2, 1).unwrap();
        let leader = b
            .shard_gauge(spec("s_has_leader").with_member(MemberSeries {
                name: "m_has_leader",
                help: "h",
                rendered_as: MetricType::Gauge,
                aggregate: Aggregate::Min,
            }))
            .unwrap();
        let changes = b
            .shard_counter(spec("s_changes_total").with_member(MemberSeries {
                name: "m_changes_total",
                help: "h",
                rendered_as: MetricType::Counter,
                aggregate: Aggregate::Sum,
            }))
            .unwrap();
        let reg = b.build();
        let shards: Vec<ShardMetrics> = [(0, 0), (1, 1), (1, 2)]
            .iter()
            .map(|&(c, s)| reg.core(c).shard(s).unwrap())
            .collect();
        assert!(reg.core(0).shard(1).is_none(), "shard 1 lives on core 1");
        shards[0].gauge_set(leader, 1);
        shards[1].gauge_set(leader, 1);
        shards[2].counter_add(changes, 3);
        shards[0].counter_add(changes, 1);
        let text = reg.render();
        assert!(text.contains("\nm_has_leader 0\n"), "{text}");
        assert!(text.contains("\nm_changes_total 4\n"), "{text}");
        assert!(
            text.contains("s_changes_total{core=\"1\",shard=\"2\"} 3\n"),
            "{text}"
        );
        shards[2].gauge_set(leader, 1);
        assert!(reg.render().contains("\nm_has_leader 1\n"));
    }

    #[test]
    fn info_renders_only_the_chosen_value() {
        let mut b = RegistryBuilder::new(2).unwrap();
        let info = b
            .core_info(spec("x_info"), "backend", &["io_uring", "sync"])
            .unwrap();
        let reg = b.build();
        reg.core(1).info_set(info, 1);
        let text = reg.render();
        assert!(
            text.contains("x_info{core=\"1\",backend=\"sync\"} 1\n"),
            "{text}"
        );
        assert!(
            !text.contains("x_info{core=\"0\""),
            "core 0 has not chosen: {text}"
        );
    }

    #[test]
    fn label_values_and_help_are_escaped() {
        assert_eq!(escape_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(escape_help("x\\y\nz"), "x\\\\y\\nz");
    }
}
