//! The three outputs of a run: a terminal table, one JSON object, and a
//! self-contained HTML page with an SVG latency CDF per experiment.

use crate::model::ExperimentResult;
use crate::recommend::{NoRecommendation, Recommendation};
use crate::safety::DiskFacts;
use serde::Serialize;
use std::fmt::Write as _;

/// Everything a run found, as printed with `--json` and embedded in the report.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub disk: DiskFacts,
    pub quick: bool,
    pub experiments: Vec<ExperimentResult>,
    pub recommendation: Option<Recommendation>,
    pub no_recommendation: Option<String>,
    pub elapsed_secs: f64,
}

impl RunReport {
    pub fn new(
        disk: DiskFacts,
        quick: bool,
        experiments: Vec<ExperimentResult>,
        recommendation: Result<Recommendation, NoRecommendation>,
        elapsed_secs: f64,
    ) -> RunReport {
        let (recommendation, no_recommendation) = match recommendation {
            Ok(r) => (Some(r), None),
            Err(e) => (None, Some(e.to_string())),
        };
        RunReport {
            disk,
            quick,
            experiments,
            recommendation,
            no_recommendation,
            elapsed_secs,
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("report serializes")
    }
}

/// Header of the terminal table.
pub fn table_header() -> String {
    format!(
        "{:>3} {:<11} {:<8} {:<9} {:<9} {:>6} {:>3} {:>4} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8}  {}",
        "#",
        "engine",
        "io",
        "sync",
        "prealloc",
        "bs",
        "qd",
        "wrtr",
        "appends/s",
        "p50us",
        "p90us",
        "p99us",
        "p99.9us",
        "maxus",
        "status"
    )
}

/// One row of the terminal table.
pub fn table_row(index: usize, r: &ExperimentResult) -> String {
    let e = &r.experiment;
    let figures = match r.outcome.measurement() {
        Some(m) => format!(
            "{:>10.0} {:>8.0} {:>8.0} {:>8.0} {:>8.0} {:>8.0}",
            m.appends_per_sec,
            m.latency.p50_us,
            m.latency.p90_us,
            m.latency.p99_us,
            m.latency.p999_us,
            m.latency.max_us
        ),
        None => format!(
            "{:>10} {:>8} {:>8} {:>8} {:>8} {:>8}",
            "-", "-", "-", "-", "-", "-"
        ),
    };
    format!(
        "{:>3} {:<13} {:<8} {:<9} {:<9} {:>6} {:>3} {:>4} {:>6} {}  {}",
        index + 1,
        e.engine.name(),
        e.io_mode.name(),
        e.sync_mode.name(),
        e.prealloc.name(),
        e.block_size_bytes,
        e.queue_depth,
        e.writers,
        if e.batch_max_bytes == 0 {
            "-".to_string()
        } else {
            (e.batch_max_bytes >> 10).to_string()
        },
        figures,
        status_text(r)
    )
}

/// The outcome's status, with the zeros the engine wrote beside its appends
/// during the measured phase when it wrote any (the WAL's spare segments).
fn status_text(r: &ExperimentResult) -> String {
    match r.outcome.measurement() {
        Some(m) if m.zero_fill_bytes > 0 => format!(
            "{} (+{:.1} MiB spare zero-fill)",
            r.outcome.status(),
            m.zero_fill_bytes as f64 / (1u64 << 20) as f64
        ),
        _ => r.outcome.status(),
    }
}

/// The whole table, header first.
pub fn table(results: &[ExperimentResult]) -> String {
    let mut s = table_header();
    s.push('\n');
    for (i, r) in results.iter().enumerate() {
        s.push_str(&table_row(i, r));
        s.push('\n');
    }
    s
}

/// The recommendation block for the terminal.
pub fn recommendation_text(report: &RunReport) -> String {
    match (&report.recommendation, &report.no_recommendation) {
        (Some(r), _) => {
            let mut s = String::from(
                "Recommended WAL setting (paste into the file given to `cairn --config-file`):\n\n",
            );
            s.push_str(&r.toml);
            for note in &r.rejected {
                let _ = writeln!(s, "# set aside: {note}");
            }
            s
        }
        (None, Some(why)) => format!("No recommendation: {why}\n"),
        (None, None) => "No recommendation.\n".into(),
    }
}

pub fn escape_html(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Plot geometry.
const PLOT_WIDTH_PX: f64 = 640.0;
const PLOT_HEIGHT_PX: f64 = 280.0;
const PLOT_MARGIN_LEFT_PX: f64 = 64.0;
const PLOT_MARGIN_BOTTOM_PX: f64 = 36.0;
const PLOT_MARGIN_TOP_PX: f64 = 12.0;
const PLOT_MARGIN_RIGHT_PX: f64 = 16.0;
/// The y axis is stretched toward the tail: y = -log10(1 - q), up to 99.999%.
const TAIL_NINES_MAX: f64 = 5.0;
const SERIES_COLOURS: [&str; 4] = ["#1f6feb", "#d1242f", "#1a7f37", "#9a6700"];

fn tail_y(q: f64) -> f64 {
    if q >= 1.0 {
        TAIL_NINES_MAX
    } else {
        (-(1.0 - q).log10()).min(TAIL_NINES_MAX)
    }
}

/// An SVG latency CDF: x is latency in µs on a log scale, y the fraction of appends
/// at or below it, on a scale that gives each extra nine the same height.
pub fn cdf_svg(title: &str, series: &[(&str, &[(f64, f64)])]) -> String {
    let all: Vec<f64> = series
        .iter()
        .flat_map(|(_, pts)| pts.iter().map(|p| p.0))
        .filter(|v| *v > 0.0)
        .collect();
    let lo = all.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = all.iter().cloned().fold(0.0, f64::max);
    let (lo_dec, hi_dec) = if all.is_empty() {
        (0.0, 1.0)
    } else {
        let l = lo.log10().floor();
        let h = hi.log10().ceil();
        (l, if h <= l { l + 1.0 } else { h })
    };
    let plot_w = PLOT_WIDTH_PX - PLOT_MARGIN_LEFT_PX - PLOT_MARGIN_RIGHT_PX;
    let plot_h = PLOT_HEIGHT_PX - PLOT_MARGIN_TOP_PX - PLOT_MARGIN_BOTTOM_PX;
    let x_of = |us: f64| {
        PLOT_MARGIN_LEFT_PX + (us.max(1e-3).log10() - lo_dec) / (hi_dec - lo_dec) * plot_w
    };
    let y_of = |q: f64| PLOT_MARGIN_TOP_PX + plot_h - tail_y(q) / TAIL_NINES_MAX * plot_h;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg class="cdf" xmlns="http://www.w3.org/2000/svg" width="{PLOT_WIDTH_PX}" height="{PLOT_HEIGHT_PX}" viewBox="0 0 {PLOT_WIDTH_PX} {PLOT_HEIGHT_PX}" role="img" aria-label="{}"><title>{}</title>"#,
        escape_html(title),
        escape_html(title)
    );
    let _ = write!(
        s,
        r##"<rect x="{PLOT_MARGIN_LEFT_PX}" y="{PLOT_MARGIN_TOP_PX}" width="{plot_w}" height="{plot_h}" fill="#fff" stroke="#888"/>"##
    );
    let mut dec = lo_dec;
    while dec <= hi_dec + 1e-9 {
        let x = x_of(10f64.powf(dec));
        let label = format_us(10f64.powf(dec));
        let _ = write!(
            s,
            r##"<line x1="{x:.1}" y1="{PLOT_MARGIN_TOP_PX}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" font-size="11" text-anchor="middle">{label}</text>"##,
            PLOT_MARGIN_TOP_PX + plot_h,
            PLOT_MARGIN_TOP_PX + plot_h + 14.0
        );
        dec += 1.0;
    }
    for (q, label) in [
        (0.0, "0%"),
        (0.9, "90%"),
        (0.99, "99%"),
        (0.999, "99.9%"),
        (0.9999, "99.99%"),
        (0.99999, "99.999%"),
    ] {
        let y = y_of(q);
        let _ = write!(
            s,
            r##"<line x1="{PLOT_MARGIN_LEFT_PX}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{label}</text>"##,
            PLOT_MARGIN_LEFT_PX + plot_w,
            PLOT_MARGIN_LEFT_PX - 4.0,
            y + 4.0
        );
    }
    let _ = write!(
        s,
        r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">durable append latency (µs, log scale)</text>"#,
        PLOT_MARGIN_LEFT_PX + plot_w / 2.0,
        PLOT_HEIGHT_PX - 4.0
    );
    for (i, (name, pts)) in series.iter().enumerate() {
        let colour = SERIES_COLOURS[i % SERIES_COLOURS.len()];
        let mut path = String::new();
        for (us, q) in pts.iter() {
            let _ = write!(path, "{:.1},{:.1} ", x_of(*us), y_of(*q));
        }
        let _ = write!(
            s,
            r#"<polyline class="cdf-line" fill="none" stroke="{colour}" stroke-width="1.5" points="{}"><title>{}</title></polyline>"#,
            path.trim_end(),
            escape_html(name)
        );
        if series.len() > 1 {
            let _ = write!(
                s,
                r#"<text x="{:.1}" y="{:.1}" font-size="11" fill="{colour}">{}</text>"#,
                PLOT_MARGIN_LEFT_PX + 8.0,
                PLOT_MARGIN_TOP_PX + 14.0 + 14.0 * i as f64,
                escape_html(name)
            );
        }
    }
    s.push_str("</svg>");
    s
}

fn format_us(us: f64) -> String {
    if us >= 1_000_000.0 {
        format!("{}s", us / 1_000_000.0)
    } else if us >= 1000.0 {
        format!("{}ms", us / 1000.0)
    } else {
        format!("{us}µs")
    }
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}td.l,th.l{text-align:left}pre{background:#f6f8fa;padding:1em}.experiment{display:inline-block;margin:0 1em 1em 0;vertical-align:top}.experiment h3{font-size:13px;font-weight:600;margin:0}.bad{color:#b00}";

/// The self-contained HTML page: no script, no external resource.
pub fn html(report: &RunReport) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>cairn-tune report: {}</title><style>{STYLE}</style></head><body>",
        escape_html(&report.disk.dir)
    );
    let _ = write!(
        s,
        "<h1>cairn-tune report</h1><p>Directory <code>{}</code> on {} (device write cache: {}), {} run of {} experiments in {:.0} s.</p>",
        escape_html(&report.disk.dir),
        escape_html(&report.disk.filesystem),
        escape_html(report.disk.write_cache.as_deref().unwrap_or("unknown")),
        if report.quick { "quick" } else { "full" },
        report.experiments.len(),
        report.elapsed_secs
    );
    s.push_str("<h2 id=\"recommendation\">Recommendation</h2>");
    match (&report.recommendation, &report.no_recommendation) {
        (Some(r), _) => {
            let _ = write!(
                s,
                "<pre class=\"recommendation\">{}</pre>",
                escape_html(&r.toml)
            );
            if !r.rejected.is_empty() {
                s.push_str("<p>Set aside:</p><ul>");
                for note in &r.rejected {
                    let _ = write!(s, "<li>{}</li>", escape_html(note));
                }
                s.push_str("</ul>");
            }
            let find = |label: &str| {
                report
                    .experiments
                    .iter()
                    .find(|e| e.label == label)
                    .and_then(|e| e.outcome.measurement())
                    .map(|m| m.cdf.as_slice())
            };
            if let (Some(best), Some(default)) = (find(&r.experiment), find(&r.default_experiment))
            {
                s.push_str(&cdf_svg(
                    "recommended vs default",
                    &[("recommended", best), ("default", default)],
                ));
            }
        }
        (None, why) => {
            let _ = write!(
                s,
                "<p class=\"bad\">No recommendation: {}</p>",
                escape_html(why.as_deref().unwrap_or("none"))
            );
        }
    }
    s.push_str("<h2>Results</h2><table><tr><th>#</th><th class=\"l\">engine</th><th class=\"l\">io</th><th class=\"l\">sync</th><th class=\"l\">prealloc</th><th>block bytes</th><th>queue depth</th><th>writers</th><th>batch max bytes</th><th>appends/s</th><th>p50 µs</th><th>p90 µs</th><th>p99 µs</th><th>p99.9 µs</th><th>max µs</th><th class=\"l\">status</th></tr>");
    for (i, r) in report.experiments.iter().enumerate() {
        let e = &r.experiment;
        let _ = write!(
            s,
            "<tr><td><a href=\"#exp-{}\">{}</a></td><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
            i + 1,
            i + 1,
            e.engine.name(),
            e.io_mode.name(),
            e.sync_mode.name(),
            e.prealloc.name(),
            e.block_size_bytes,
            e.queue_depth,
            e.writers,
            e.batch_max_bytes
        );
        match r.outcome.measurement() {
            Some(m) => {
                let _ = write!(
                    s,
                    "<td>{:.0}</td><td>{:.0}</td><td>{:.0}</td><td>{:.0}</td><td>{:.0}</td><td>{:.0}</td>",
                    m.appends_per_sec, m.latency.p50_us, m.latency.p90_us, m.latency.p99_us, m.latency.p999_us, m.latency.max_us
                );
            }
            None => s.push_str("<td>-</td><td>-</td><td>-</td><td>-</td><td>-</td><td>-</td>"),
        }
        let _ = write!(
            s,
            "<td class=\"l\">{}</td></tr>",
            escape_html(&status_text(r))
        );
    }
    s.push_str("</table><h2>Latency CDF per experiment</h2>");
    for (i, r) in report.experiments.iter().enumerate() {
        let _ = write!(
            s,
            "<div class=\"experiment\" id=\"exp-{}\"><h3>{}. {}</h3>",
            i + 1,
            i + 1,
            escape_html(&r.label)
        );
        match r.outcome.measurement() {
            Some(m) => s.push_str(&cdf_svg(&r.label, &[(&r.label, &m.cdf)])),
            None => {
                let _ = write!(
                    s,
                    "<p class=\"bad\">{}</p>",
                    escape_html(&r.outcome.status())
                );
            }
        }
        s.push_str("</div>");
    }
    s.push_str("</body></html>\n");
    s
}
