//! Guards the outputs: the terminal table has one row per experiment, `--json`
//! carries every result and the recommendation as one object, the HTML report is
//! self-contained with one SVG latency CDF per measured experiment and the
//! recommendation; and etcd-check reads fio's JSON, runs its own check, and emits
//! the keys scripts rely on (p50_us, p99_us, pass, fio_p50_us, fio_p99_us).

mod common;

use cairn_tuning::etcd_check::{
    etcd_check, etcd_check_rounds, parse_fio_json, render, ETCD_P99_LIMIT_US,
};
use cairn_tuning::model::{IoMode, Outcome, SyncMode};
use cairn_tuning::recommend::recommend;
use cairn_tuning::report::{html, table, RunReport};
use cairn_tuning::safety::LabDir;
use common::*;

fn sample_report() -> RunReport {
    let results = vec![
        result(
            wal(IoMode::Direct, SyncMode::RwfDsync),
            measured(5000.0, 400.0),
        ),
        result(
            wal(IoMode::Direct, SyncMode::Fdatasync),
            measured(8000.0, 300.0),
        ),
        result(
            wal(IoMode::Buffered, SyncMode::Linked),
            Outcome::Unsupported {
                reason: "io_uring is not supported here: <disabled & \"off\">".into(),
            },
        ),
    ];
    let rec = recommend(&results, &disk());
    RunReport::new(disk(), true, results, rec, 12.5)
}

#[test]
fn table_has_a_row_per_experiment_with_status() {
    let t = table(&sample_report().experiments);
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines.len(), 4);
    assert!(lines[0].contains("appends/s") && lines[0].contains("p99.9us"));
    assert!(
        lines[1].contains("wal-uring") && lines[1].contains("5000") && lines[1].ends_with("ok")
    );
    assert!(lines[3].contains("unsupported: io_uring"));
}

#[test]
fn spare_zero_fill_during_the_run_is_shown_beside_the_figures() {
    let mut filled = measured(5000.0, 400.0);
    if let Outcome::Measured(m) = &mut filled {
        m.zero_fill_bytes = 3 << 20;
    }
    let results = vec![
        result(wal(IoMode::Direct, SyncMode::RwfDsync), filled),
        result(
            wal(IoMode::Direct, SyncMode::Fdatasync),
            measured(8000.0, 300.0),
        ),
    ];
    let t = table(&results);
    let lines: Vec<&str> = t.lines().collect();
    assert!(
        lines[1].ends_with("ok (+3.0 MiB spare zero-fill)"),
        "{}",
        lines[1]
    );
    assert!(lines[2].ends_with("ok"), "{}", lines[2]);
    let rec = recommend(&results, &disk());
    let report = RunReport::new(disk(), true, results, rec, 1.0);
    let v: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    assert_eq!(
        v["experiments"][0]["outcome"]["zero_fill_bytes"],
        3u64 << 20
    );
    assert!(html(&report).contains("ok (+3.0 MiB spare zero-fill)"));
}

#[test]
fn json_is_one_object_with_results_and_recommendation() {
    let json = sample_report().to_json();
    assert!(!json.contains('\n'));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let exps = v["experiments"].as_array().unwrap();
    assert_eq!(exps.len(), 3);
    assert_eq!(exps[0]["outcome"]["status"], "measured");
    assert_eq!(exps[0]["experiment"]["engine"], "wal-uring");
    assert_eq!(exps[1]["outcome"]["latency"]["p99_us"], 300.0);
    assert_eq!(exps[2]["outcome"]["status"], "unsupported");
    assert_eq!(v["recommendation"]["setting"]["sync_mode"], "fdatasync");
    assert!(v["recommendation"]["toml"]
        .as_str()
        .unwrap()
        .contains("[wal]"));
    assert!((v["recommendation"]["gain_percent"].as_f64().unwrap() - 60.0).abs() < 1e-9);
}

#[test]
fn html_is_self_contained_with_a_cdf_per_measured_experiment() {
    let page = html(&sample_report());
    assert!(page.starts_with("<!DOCTYPE html>"));
    // Two measured experiments, plus the recommended-vs-default overlay.
    assert_eq!(page.matches("<svg class=\"cdf\"").count(), 3);
    assert_eq!(page.matches("<polyline class=\"cdf-line\"").count(), 4);
    assert!(page.contains("[wal]") && page.contains("sync-mode = &quot;fdatasync&quot;"));
    // Nothing fetched from elsewhere, and text is escaped.
    assert!(!page.contains("<script") && !page.contains("src=") && !page.contains("<link"));
    assert!(page.contains("&lt;disabled &amp; &quot;off&quot;&gt;"));
    assert!(!page.contains("<disabled"));
    for id in 1..=3 {
        assert!(page.contains(&format!("id=\"exp-{id}\"")));
    }
}

#[test]
fn no_recommendation_is_stated_in_every_output() {
    let mut r = sample_report();
    r.recommendation = None;
    r.no_recommendation = Some("DIR is on tmpfs".into());
    assert!(html(&r).contains("No recommendation: DIR is on tmpfs"));
    assert!(cairn_tuning::report::recommendation_text(&r).contains("DIR is on tmpfs"));
    let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    assert!(v["recommendation"].is_null());
}

/// The shape of fio 3.x `--output-format=json` for a sync job with fdatasync=1,
/// cut to the parts read, after a warning line fio sometimes prints first.
const FIO_OUTPUT: &str = r#"fio: note: both iodepth >= 1 and synchronous I/O engine are selected
{
  "fio version" : "fio-3.33",
  "jobs" : [
    {
      "jobname" : "cairn-etcd-check",
      "sync" : {
        "total_ios" : 0,
        "lat_ns" : {
          "min" : 90000, "max" : 2500000, "mean" : 210000.5, "N" : 10029,
          "percentile" : { "1.000000" : 100000, "50.000000" : 180224, "99.000000" : 411648, "99.900000" : 1744896 }
        }
      }
    }
  ]
}"#;

#[test]
fn fio_fdatasync_percentiles_are_read_from_its_json() {
    let f = parse_fio_json(FIO_OUTPUT).unwrap();
    assert_eq!(f.syncs, 10029);
    assert!((f.p50_us - 180.224).abs() < 1e-9);
    assert!((f.p99_us - 411.648).abs() < 1e-9);
    assert!((f.p999_us - 1744.896).abs() < 1e-9);
    assert!((f.max_us - 2500.0).abs() < 1e-9);
    assert!(parse_fio_json("fio: error").is_err());
    assert!(parse_fio_json(r#"{"jobs":[{"write":{}}]}"#)
        .unwrap_err()
        .contains("sync"));
}

#[test]
fn etcd_check_runs_the_recipe_and_fio_beside_it() {
    let dir = scratch_dir();
    let lab = LabDir::open(dir.path()).unwrap();
    let size = 64 * 2300;
    let check = etcd_check(&lab, size, true).unwrap();
    assert_eq!(check.writes, 64);
    assert!(check.p50_us > 0.0 && check.p50_us <= check.p99_us);
    assert_eq!(check.pass, check.p99_us < ETCD_P99_LIMIT_US);
    let v: serde_json::Value = serde_json::to_value(&check).unwrap();
    for key in ["p50_us", "p99_us", "pass", "fio_p50_us", "fio_p99_us"] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    let fio_installed = std::process::Command::new("fio")
        .arg("--version")
        .output()
        .is_ok();
    if fio_installed {
        assert!(check.fio_p50_us.unwrap() > 0.0, "{:?}", check.fio_note);
        assert!(check.p50_diff_percent.is_some());
        assert!(render(&check).contains("fio"));
    } else {
        assert_eq!(check.fio_note.as_deref(), Some("fio is not installed"));
    }
    drop(lab);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "etcd-check left files behind"
    );
}

#[test]
fn etcd_check_rounds_report_medians_and_every_round() {
    let dir = scratch_dir();
    let lab = LabDir::open(dir.path()).unwrap();
    let check = etcd_check_rounds(&lab, 32 * 2300, false, 3).unwrap();
    assert_eq!(check.rounds.len(), 3);
    let mut p50s: Vec<f64> = check.rounds.iter().map(|r| r.p50_us).collect();
    p50s.sort_by(f64::total_cmp);
    assert_eq!(check.p50_us, p50s[1], "p50 is the median of the rounds");
    assert_eq!(check.pass, check.p99_us < ETCD_P99_LIMIT_US);
    assert!(check.fio_p50_us.is_none() && check.fio_note.is_some());
    assert!(render(&check).contains("round 3"));
    drop(lab);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
