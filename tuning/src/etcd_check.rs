//! etcd's disk check, done by the lab and (when installed) by fio in the same
//! directory right after, so the two can be compared side by side.
//!
//! etcd's recipe: `fio --rw=write --ioengine=sync --fdatasync=1 --size=22m --bs=2300`;
//! the disk is good enough for etcd when the 99th percentile of fdatasync is under
//! 10 ms. fio lays its file out with fallocate and then writes it sequentially, so
//! the lab does the same and times each fdatasync on its own, as fio does.

use crate::error::ExperimentError;
use crate::safety::{stop_requested, LabDir};
use crate::stats::median;
use crate::stats::Recorder;
use serde::Serialize;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// Bytes per write in etcd's recipe (about one etcd WAL entry).
pub const ETCD_CHECK_BLOCK_BYTES: usize = 2300;
/// Bytes written in total by etcd's recipe.
pub const ETCD_CHECK_SIZE_BYTES: u64 = 22 << 20;
/// etcd's threshold: p99 fdatasync latency under 10 ms.
pub const ETCD_P99_LIMIT_US: f64 = 10_000.0;
/// The fio job name; fio names its file `<name>.0.0` in DIR.
pub const FIO_JOB_NAME: &str = "cairn-etcd-check";

/// fio's fdatasync latencies from its JSON output.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct FioSync {
    pub syncs: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

/// Result of the check. Field names are the JSON keys of `etcd-check --json`.
#[derive(Debug, Clone, Serialize)]
pub struct EtcdCheck {
    pub dir: String,
    pub size_bytes: u64,
    pub block_bytes: usize,
    pub writes: u64,
    /// fdatasync latency alone, as fio reports it.
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    /// write + fdatasync: the durable append as a WAL sees it.
    pub append_p50_us: f64,
    pub append_p99_us: f64,
    pub pass: bool,
    pub fio_p50_us: Option<f64>,
    pub fio_p99_us: Option<f64>,
    pub fio_p999_us: Option<f64>,
    /// (lab p50 / fio p50 - 1) in percent.
    pub p50_diff_percent: Option<f64>,
    pub fio_pass: Option<bool>,
    /// Why fio did not run or its result could not be read.
    pub fio_note: Option<String>,
    /// Each round's figures; the fields above are their medians when there are several.
    pub rounds: Vec<Round>,
}

/// One round: the lab's check, then fio's, back to back.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Round {
    pub p50_us: f64,
    pub p99_us: f64,
    pub fio_p50_us: Option<f64>,
    pub fio_p99_us: Option<f64>,
}

/// Most rounds one check may run (each writes 2 x 22 MiB with a sync per write).
pub const ROUNDS_MAX: u32 = 20;

/// Runs the check `rounds` times (lab, then fio, alternating) and reports the
/// median of each figure: on a shared disk whose latency drifts over tens of
/// seconds, pairs taken side by side and then summarised compare the two tools
/// rather than two moments. One round is etcd's recipe exactly.
pub fn etcd_check_rounds(
    lab: &LabDir,
    size_bytes: u64,
    with_fio: bool,
    rounds: u32,
) -> Result<EtcdCheck, ExperimentError> {
    assert!(
        (1..=ROUNDS_MAX).contains(&rounds),
        "rounds {rounds} outside 1..={ROUNDS_MAX}"
    );
    let mut checks = Vec::new();
    for _ in 0..rounds {
        checks.push(etcd_check(lab, size_bytes, with_fio)?);
    }
    let mut combined = checks[0].clone();
    if checks.len() == 1 {
        return Ok(combined);
    }
    let med = |f: &dyn Fn(&EtcdCheck) -> f64| median(checks.iter().map(f).collect());
    combined.p50_us = med(&|c| c.p50_us);
    combined.p90_us = med(&|c| c.p90_us);
    combined.p99_us = med(&|c| c.p99_us);
    combined.p999_us = med(&|c| c.p999_us);
    combined.max_us = checks.iter().map(|c| c.max_us).fold(0.0, f64::max);
    combined.append_p50_us = med(&|c| c.append_p50_us);
    combined.append_p99_us = med(&|c| c.append_p99_us);
    combined.pass = combined.p99_us < ETCD_P99_LIMIT_US;
    let fio_all = |f: &dyn Fn(&EtcdCheck) -> Option<f64>| -> Option<f64> {
        let v: Option<Vec<f64>> = checks.iter().map(f).collect();
        v.map(median)
    };
    combined.fio_p50_us = fio_all(&|c| c.fio_p50_us);
    combined.fio_p99_us = fio_all(&|c| c.fio_p99_us);
    combined.fio_p999_us = fio_all(&|c| c.fio_p999_us);
    combined.p50_diff_percent = combined
        .fio_p50_us
        .map(|f| (combined.p50_us / f - 1.0) * 100.0);
    combined.fio_pass = combined.fio_p99_us.map(|f| f < ETCD_P99_LIMIT_US);
    combined.fio_note = checks.iter().find_map(|c| c.fio_note.clone());
    combined.rounds = checks
        .iter()
        .flat_map(|c| c.rounds.iter().copied())
        .collect();
    Ok(combined)
}

/// Runs the lab's version of the recipe in a fresh file of DIR.
pub fn run_lab_check(
    lab: &LabDir,
    size_bytes: u64,
) -> Result<(Recorder, Recorder, u64), ExperimentError> {
    let path = lab.file_path("etcd-check");
    let result = lab_check_in(&path, size_bytes);
    lab.remove(&path);
    result
}

fn lab_check_in(
    path: &Path,
    size_bytes: u64,
) -> Result<(Recorder, Recorder, u64), ExperimentError> {
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| ExperimentError::from_io("create", path, 0, e))?;
    // SAFETY: fallocate on a descriptor we own; no memory is passed.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, size_bytes as libc::off_t) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        // fio falls back to no preallocation where fallocate is missing; so do we.
        if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
            return Err(ExperimentError::from_io("fallocate", path, 0, e));
        }
    }
    let block = vec![0xA5u8; ETCD_CHECK_BLOCK_BYTES];
    let mut syncs = Recorder::new();
    let mut appends = Recorder::new();
    let mut offset = 0u64;
    let mut writes = 0u64;
    while offset + ETCD_CHECK_BLOCK_BYTES as u64 <= size_bytes {
        if stop_requested() {
            return Err(ExperimentError::Interrupted);
        }
        let t0 = Instant::now();
        file.write_all_at(&block, offset)
            .map_err(|e| ExperimentError::from_io("write", path, offset, e))?;
        let t1 = Instant::now();
        file.sync_data()
            .map_err(|e| ExperimentError::from_io("fdatasync", path, offset, e))?;
        syncs.record(t1.elapsed());
        appends.record(t0.elapsed());
        syncs.syncs += 1;
        offset += ETCD_CHECK_BLOCK_BYTES as u64;
        writes += 1;
    }
    Ok((syncs, appends, writes))
}

/// Reads fio's `--output-format=json` (which may be preceded by warning lines).
pub fn parse_fio_json(text: &str) -> Result<FioSync, String> {
    let start = text.find('{').ok_or("fio printed no JSON")?;
    let value: serde_json::Value =
        serde_json::from_str(&text[start..]).map_err(|e| format!("fio JSON unreadable: {e}"))?;
    let sync = value
        .pointer("/jobs/0/sync/lat_ns")
        .ok_or("fio JSON has no jobs[0].sync.lat_ns (fio too old?)")?;
    let pct = |key: &str| -> Result<f64, String> {
        sync.pointer(&format!("/percentile/{}", key.replace('/', "~1")))
            .and_then(|v| v.as_f64())
            .map(|ns| ns / 1000.0)
            .ok_or_else(|| format!("fio JSON lacks the {key} percentile of fdatasync"))
    };
    Ok(FioSync {
        syncs: sync.get("N").and_then(|v| v.as_u64()).unwrap_or(0),
        p50_us: pct("50.000000")?,
        p99_us: pct("99.000000")?,
        p999_us: pct("99.900000")?,
        max_us: sync.get("max").and_then(|v| v.as_f64()).unwrap_or(0.0) / 1000.0,
    })
}

/// Runs fio's recipe in DIR; the file it creates is registered and removed.
pub fn run_fio(lab: &LabDir, size_bytes: u64) -> Result<FioSync, String> {
    let fio_file = lab.path().join(format!("{FIO_JOB_NAME}.0.0"));
    if fio_file.exists() {
        return Err(format!(
            "{} already exists and is not the lab's; fio was not run",
            fio_file.display()
        ));
    }
    lab.register(fio_file.clone());
    let output = Command::new("fio")
        .arg("--rw=write")
        .arg("--ioengine=sync")
        .arg("--fdatasync=1")
        .arg(format!("--directory={}", lab.path().display()))
        .arg(format!("--size={size_bytes}"))
        .arg(format!("--bs={ETCD_CHECK_BLOCK_BYTES}"))
        .arg(format!("--name={FIO_JOB_NAME}"))
        .arg("--output-format=json")
        .output();
    lab.remove(&fio_file);
    let output = match output {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err("fio is not installed".into())
        }
        Err(e) => return Err(format!("could not start fio: {e}")),
    };
    if stop_requested() {
        return Err("interrupted".into());
    }
    if !output.status.success() {
        return Err(format!(
            "fio exited with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    parse_fio_json(&String::from_utf8_lossy(&output.stdout))
}

/// The whole check: the lab's run, then fio's in the same directory.
pub fn etcd_check(
    lab: &LabDir,
    size_bytes: u64,
    with_fio: bool,
) -> Result<EtcdCheck, ExperimentError> {
    let (syncs, appends, writes) = run_lab_check(lab, size_bytes)?;
    let s = syncs.summary();
    let a = appends.summary();
    let (fio, fio_note) = if with_fio {
        match run_fio(lab, size_bytes) {
            Ok(f) => (Some(f), None),
            Err(note) => (None, Some(note)),
        }
    } else {
        (None, Some("fio not requested (--no-fio)".into()))
    };
    if stop_requested() {
        return Err(ExperimentError::Interrupted);
    }
    Ok(EtcdCheck {
        dir: lab.path().display().to_string(),
        size_bytes,
        block_bytes: ETCD_CHECK_BLOCK_BYTES,
        writes,
        p50_us: s.p50_us,
        p90_us: s.p90_us,
        p99_us: s.p99_us,
        p999_us: s.p999_us,
        max_us: s.max_us,
        append_p50_us: a.p50_us,
        append_p99_us: a.p99_us,
        pass: writes > 0 && s.p99_us < ETCD_P99_LIMIT_US,
        fio_p50_us: fio.map(|f| f.p50_us),
        fio_p99_us: fio.map(|f| f.p99_us),
        fio_p999_us: fio.map(|f| f.p999_us),
        p50_diff_percent: fio.map(|f| (s.p50_us / f.p50_us - 1.0) * 100.0),
        fio_pass: fio.map(|f| f.p99_us < ETCD_P99_LIMIT_US),
        fio_note,
        rounds: vec![Round {
            p50_us: s.p50_us,
            p99_us: s.p99_us,
            fio_p50_us: fio.map(|f| f.p50_us),
            fio_p99_us: fio.map(|f| f.p99_us),
        }],
    })
}

/// The side-by-side table for the terminal.
pub fn render(check: &EtcdCheck) -> String {
    let opt = |v: Option<f64>| {
        v.map(|v| format!("{v:>10.0}"))
            .unwrap_or_else(|| format!("{:>10}", "-"))
    };
    let mut s = format!(
        "etcd disk check in {}: {} sequential {}-byte writes, fdatasync after each ({} bytes)\n",
        check.dir, check.writes, check.block_bytes, check.size_bytes
    );
    s.push_str(&format!(
        "{:<22} {:>10} {:>10}\n",
        "fdatasync latency", "cairn-tune", "fio"
    ));
    s.push_str(&format!(
        "{:<22} {:>10.0} {}\n",
        "p50 µs",
        check.p50_us,
        opt(check.fio_p50_us)
    ));
    s.push_str(&format!(
        "{:<22} {:>10.0} {}\n",
        "p99 µs",
        check.p99_us,
        opt(check.fio_p99_us)
    ));
    s.push_str(&format!(
        "{:<22} {:>10.0} {}\n",
        "p99.9 µs",
        check.p999_us,
        opt(check.fio_p999_us)
    ));
    let verdict = |p: bool| if p { "PASS" } else { "FAIL" };
    s.push_str(&format!(
        "{:<22} {:>10} {:>10}\n",
        "p99 < 10 ms (etcd)",
        verdict(check.pass),
        check.fio_pass.map(verdict).unwrap_or("-")
    ));
    s.push_str(&format!(
        "write+fdatasync p50/p99 µs: {:.0} / {:.0}\n",
        check.append_p50_us, check.append_p99_us
    ));
    if check.rounds.len() > 1 {
        s.push_str(&format!(
            "medians of {} rounds (lab then fio, alternating); per round p50/p99 µs:\n",
            check.rounds.len()
        ));
        for (i, r) in check.rounds.iter().enumerate() {
            let fio = match (r.fio_p50_us, r.fio_p99_us) {
                (Some(p50), Some(p99)) => format!("{p50:.0} / {p99:.0}"),
                _ => "-".into(),
            };
            s.push_str(&format!(
                "  round {}: cairn-tune {:.0} / {:.0}, fio {fio}\n",
                i + 1,
                r.p50_us,
                r.p99_us
            ));
        }
    }
    if let Some(d) = check.p50_diff_percent {
        s.push_str(&format!("p50 differs from fio's by {d:+.1}%\n"));
    }
    if let Some(note) = &check.fio_note {
        s.push_str(&format!("fio: {note}\n"));
    }
    s
}
