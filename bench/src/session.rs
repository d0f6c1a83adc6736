//! What `compare` and `tls-cost` share when they run presets against local
//! clusters: scratch space, starting a cluster (secured or not), pausing the
//! clusters not measured, running a preset's command line, and picking the
//! median run.

use std::path::Path;
use std::time::Duration;

use clap::Parser;
use tempfile::TempDir;

use crate::cluster::{ClusterError, LocalCluster, StartOptions, System};
use crate::config::{Cli, GlobalOpts};
use crate::preset::{Preset, PRESET_VAL_SIZE_BYTES, RANGE_KEY};
use crate::security::{self, Credentials};
use crate::stats::Report;
use crate::BenchError;

/// How long a cluster gets to elect leaders and commit a first write, after it
/// starts and after it is resumed from a pause.
pub const CLUSTER_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Most runs per workload and cluster.
pub const MAX_RUNS: usize = 99;

/// Checks `--runs`: at least one, at most [`MAX_RUNS`].
pub(crate) fn check_runs(runs: usize) -> Result<(), BenchError> {
    if runs == 0 || runs > MAX_RUNS {
        return Err(BenchError::Option {
            option: "--runs",
            reason: format!("{runs} is not in 1..={MAX_RUNS}"),
        });
    }
    Ok(())
}

/// A temporary directory whose name starts with `prefix`, in `work_dir`
/// (default: $TMPDIR), which is created if missing. Removed when dropped.
pub(crate) fn scratch_dir(work_dir: Option<&Path>, prefix: &str) -> Result<TempDir, BenchError> {
    let parent = work_dir.map_or_else(std::env::temp_dir, Path::to_path_buf);
    let bad_work_dir = |e: std::io::Error| BenchError::Option {
        option: "--work-dir",
        reason: format!("{}: {e}", parent.display()),
    };
    std::fs::create_dir_all(&parent).map_err(bad_work_dir)?;
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(&parent)
        .map_err(bad_work_dir)
}

/// Starts of a cluster made before giving up when a member finds one of its
/// ports taken.
const START_ATTEMPTS: usize = 3;

/// Whether a start failed because a member's port was taken: free ports are
/// picked, then released for the members to bind, and another process (a
/// connection's ephemeral port, say) may take one in between.
fn port_taken(e: &ClusterError) -> bool {
    matches!(e, ClusterError::Exited { tail, .. }
        if tail.to_ascii_lowercase().contains("address already in use"))
}

/// Starts `members` members of `binary` under `dir` with `options` and waits
/// until they serve; with `user`, then turns auth on (root with
/// [`security::ROOT_PASSWORD`], and `user` with readwrite on every key). A
/// start that fails because a port was taken is made again, afresh, on new
/// ports.
pub(crate) async fn start_secured(
    system: System,
    binary: &Path,
    members: usize,
    dir: &Path,
    options: &StartOptions,
    user: Option<&Credentials>,
) -> Result<LocalCluster, ClusterError> {
    let mut attempt = 1;
    let mut cluster = loop {
        let mut cluster = LocalCluster::start_with(system, binary, members, dir, options)?;
        match cluster.wait_ready(CLUSTER_READY_TIMEOUT).await {
            Ok(()) => break cluster,
            Err(e) if port_taken(&e) && attempt < START_ATTEMPTS => {
                eprintln!("{system}: a port was taken while starting; starting again on new ports");
                drop(cluster);
                std::fs::remove_dir_all(dir).map_err(|source| ClusterError::Io {
                    system,
                    action: "remove",
                    path: dir.to_owned(),
                    source,
                })?;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    };
    if let Some(user) = user {
        cluster.enable_auth(security::ROOT_PASSWORD, user).await?;
    }
    Ok(cluster)
}

/// The order in which `clusters` clusters are measured in run `run`: which
/// goes first alternates, so drift (page cache, thermal, neighbours) does not
/// always favour the same one.
pub(crate) fn alternating_order(run: usize, clusters: usize) -> Vec<usize> {
    if run.is_multiple_of(2) {
        (0..clusters).collect()
    } else {
        (0..clusters).rev().collect()
    }
}

/// Leaves only cluster `measured` running: pauses every other one and, if
/// `measured` was paused, resumes it and waits until it serves again. A
/// cluster that cannot be paused (a member has exited) is reported and left
/// running: the run measured beside it still counts.
pub(crate) async fn isolate(
    clusters: &mut [LocalCluster],
    measured: usize,
) -> Result<(), ClusterError> {
    for (i, cluster) in clusters.iter_mut().enumerate() {
        if i != measured && !cluster.is_paused() {
            if let Err(e) = cluster.pause_all() {
                eprintln!("    {} left running: {e}", cluster.system);
            }
        }
    }
    // What the systems wrote before and the kernel has not yet written
    // back (file metadata, pages written without a sync) goes to the disk
    // now, not during the measured run, where it would queue ahead of the
    // measured system's syncs: every run starts from a disk with nothing
    // pending, whichever system ran before it.
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    let cluster = &mut clusters[measured];
    if cluster.is_paused() {
        cluster.resume_all()?;
        cluster.wait_ready(CLUSTER_READY_TIMEOUT).await?;
    }
    Ok(())
}

/// Parses `args`, the command line of `preset`, as a user's command is parsed,
/// with `global`'s `--json`. A line that does not parse is a fault of the
/// preset, reported as an option error of `caller` (`compare`, `tls-cost`).
pub(crate) fn parse_preset(
    caller: &'static str,
    preset: Preset,
    args: &[String],
    global: &GlobalOpts,
) -> Result<Cli, BenchError> {
    let mut cli = Cli::try_parse_from(args).map_err(|e| BenchError::Option {
        option: caller,
        reason: format!("preset {} does not parse: {e}", preset.name()),
    })?;
    cli.global.json = global.json;
    Ok(cli)
}

/// Runs `cli`, a command line of [`parse_preset`], and names its report after
/// `preset` and `system`.
pub(crate) async fn run_preset(
    cli: &Cli,
    preset: Preset,
    system: String,
    progress: bool,
) -> Result<Report, BenchError> {
    let mut report = crate::run_workload(&cli.global, &cli.command, progress).await?;
    report.system = Some(system);
    report.workload = preset.name().to_owned();
    Ok(report)
}

/// The members' CPU time over a run divided by the requests it answered
/// (warm-up included, as the CPU time is), in microseconds.
pub(crate) fn cpu_per_op(
    before: Option<Duration>,
    after: Option<Duration>,
    report: &Report,
) -> Option<f64> {
    let used = after?.checked_sub(before?)?;
    let requests = report.requests() + report.warmup_requests;
    (requests > 0).then(|| used.as_secs_f64() * 1e6 / requests as f64)
}

/// The progress line of one run, unless only JSON is printed.
pub(crate) fn print_run(global: &GlobalOpts, report: &Report) {
    say(
        global,
        &format!(
            "    {:.0} req/s, p50 {:.3} ms, p99 {:.3} ms, errors {}{}",
            report.requests_per_sec(),
            report.p50_ms(),
            report.p99_ms(),
            report.errors(),
            report
                .server_cpu_us_per_op
                .map_or(String::new(), |us| format!(", server CPU {us:.1} µs/op"))
        ),
    );
}

/// Says that a run of `preset` failed on `system` and records why, once per
/// system, for the row.
pub(crate) fn run_failed(
    failed: &mut Vec<(System, String)>,
    preset: Preset,
    system: System,
    why: &dyn std::fmt::Display,
) {
    eprintln!("    {} FAILED on {system}: {why}", preset.name());
    if !failed.iter().any(|(s, _)| *s == system) {
        failed.push((system, why.to_string()));
    }
}

/// The run with the median requests/s (of an even count, the lower middle).
pub(crate) fn median(mut runs: Vec<Report>) -> Option<Report> {
    runs.sort_by(|a, b| a.requests_per_sec().total_cmp(&b.requests_per_sec()));
    let mid = runs.len().saturating_sub(1) / 2;
    (!runs.is_empty()).then(|| runs.swap_remove(mid))
}

/// A progress message on stderr, unless only JSON is printed.
pub(crate) fn say(global: &GlobalOpts, text: &str) {
    if !global.json {
        eprintln!("{text}");
    }
}

/// Writes the key the range presets read ([`RANGE_KEY`]) once, as `user`.
pub(crate) async fn seed(
    cluster: &LocalCluster,
    user: Option<&Credentials>,
) -> Result<(), BenchError> {
    let mut args = vec![
        "cairn-bench".to_owned(),
        "--endpoints".into(),
        cluster.endpoints_arg(),
        "--total".into(),
        "1".into(),
    ];
    args.extend(cluster.client_args(user));
    args.extend([
        "put".into(),
        "--key-size".into(),
        "8".into(),
        "--val-size".into(),
        PRESET_VAL_SIZE_BYTES.to_string(),
    ]);
    let cli = Cli::parse_from(args);
    let report = crate::run_workload(&cli.global, &cli.command, false).await?;
    if report.requests() != 1 {
        return Err(BenchError::Task {
            workload: "put",
            reason: format!(
                "seeding {RANGE_KEY} on {} failed: {:?}",
                cluster.system, report.recorder.errors
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_picks_the_middle_run() {
        let report = |rps: u64| Report {
            workload: "put".into(),
            system: None,
            clients: 1,
            conns: 1,
            target_rate_per_sec: None,
            elapsed: Duration::from_secs(1),
            warmup: Duration::ZERO,
            warmup_requests: 0,
            recorder: {
                let mut r = crate::Recorder::new();
                for _ in 0..rps {
                    r.record_ok(Duration::from_millis(1));
                }
                r
            },
            server_cpu_us_per_op: None,
        };
        let m = median(vec![report(30), report(10), report(20)]).unwrap();
        assert_eq!(m.requests(), 20);
        assert!(median(Vec::new()).is_none());
    }

    #[test]
    fn a_start_is_made_again_only_when_a_port_was_taken() {
        let exited = |tail: &str| ClusterError::Exited {
            system: System::Etcd,
            member: "etcd2".into(),
            status: "exit status: 1".into(),
            log: std::path::PathBuf::from("member.log"),
            tail: tail.into(),
        };
        assert!(port_taken(&exited(
            "etcdmain: listen tcp 127.0.0.1:40947: bind: address already in use"
        )));
        assert!(port_taken(&exited(
            "binding 127.0.0.1:2380: Address already in use (os error 98)"
        )));
        assert!(!port_taken(&exited("data directory is locked")));
        assert!(!port_taken(&ClusterError::Size { members: 0 }));
    }
}
