//! cairn-tune: the fsync tuning lab.
//!
//! It measures, on the disk under a directory, how long a durable append takes under
//! every setting Cairn's WAL supports (and under outside reference engines), agrees
//! with fio on etcd's disk check, and says which WAL setting to use.
//!
//! Back of the envelope for this machine class (BASELINE.md): a 4 KiB O_DIRECT
//! write plus fdatasync costs about 100 µs, so one writer tops out near 10,000
//! durable appends/s; a 0.4 s quick experiment therefore gathers a few thousand
//! samples, enough for a p99 and a rough p99.9.

pub mod buf;
pub mod engines;
pub mod error;
pub mod etcd_check;
pub mod matrix;
pub mod model;
pub mod recommend;
pub mod replicas;
pub mod report;
pub mod safety;
pub mod stats;

use error::LabError;
use model::ExperimentResult;
use report::RunReport;
use safety::LabDir;
use std::path::Path;
use std::time::Instant;

/// Runs the matrix (quick or full) in `dir`, restricted to experiments whose label
/// contains `only` when given, and builds the report with its recommendation;
/// `progress` sees each result as it arrives.
pub fn run_lab(
    dir: &Path,
    quick: bool,
    only: Option<&str>,
    mut progress: impl FnMut(usize, &ExperimentResult),
) -> Result<RunReport, LabError> {
    let lab = LabDir::open(dir)?;
    let started = Instant::now();
    let mut experiments = matrix::build_matrix(quick);
    if let Some(only) = only {
        experiments.retain(|e| e.label().contains(only));
    }
    let limits = matrix::limits(quick);
    let results = matrix::run_matrix(&lab, &experiments, &limits, &mut progress);
    lab.cleanup();
    if safety::stop_requested() {
        return Err(LabError::Interrupted);
    }
    let mut recommendation = recommend::recommend(&results, lab.facts());
    if let Ok(rec) = &recommendation {
        if rec.experiment != rec.default_experiment {
            let find = |label: &str| {
                results
                    .iter()
                    .find(|r| r.label == label)
                    .map(|r| r.experiment)
            };
            if let (Some(candidate), Some(default)) =
                (find(&rec.experiment), find(&rec.default_experiment))
            {
                let default_setting =
                    recommend::wal_setting(&default).expect("the default maps to a WAL setting");
                let (mut c_rates, mut d_rates) = (Vec::new(), Vec::new());
                for _ in 0..recommend::CONFIRM_ROUNDS {
                    let rate = |exp: &model::Experiment| {
                        matrix::run_experiment(&lab, exp, &limits)
                            .measurement()
                            .filter(|m| recommend::unsafe_reason(m, lab.facts()).is_none())
                            .map(|m| m.appends_per_sec)
                    };
                    c_rates.push(rate(&candidate));
                    d_rates.push(rate(&default));
                }
                lab.cleanup();
                if safety::stop_requested() {
                    return Err(LabError::Interrupted);
                }
                recommendation = Ok(recommend::apply_confirmation(
                    rec.clone(),
                    default_setting,
                    &c_rates,
                    &d_rates,
                    lab.facts(),
                ));
            }
        }
    }
    Ok(RunReport::new(
        lab.facts().clone(),
        quick,
        results,
        recommendation,
        started.elapsed().as_secs_f64(),
    ))
}
