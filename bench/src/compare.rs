//! `cairn-bench compare`: a local cluster of each system, the same workloads
//! against both, alternating, one table with the ratio Cairn/etcd.
//!
//! Each workload row runs as the exact `cairn-bench` command line shown under the
//! table (parsed by the same parser a user's command goes through), so any row can
//! be reproduced by hand against any cluster.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, ValueEnum};
use serde_json::{json, Value};

use crate::cluster::{ClusterError, LocalCluster, StartOptions, System};
use crate::config::{Cli, GlobalOpts, Stop};
use crate::security::{self, ClusterCerts, Credentials};
use crate::stats::Report;
use crate::BenchError;

/// How long a cluster gets to elect leaders and commit a first write, after it
/// starts and after it is resumed from a pause.
pub const CLUSTER_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Measured phase of each run when neither --duration nor --total is given.
pub const DEFAULT_RUN_DURATION: Duration = Duration::from_secs(10);
/// Warm-up of each run when --warmup is not given.
pub const DEFAULT_WARMUP: Duration = Duration::from_secs(2);
/// Most runs per workload and system.
pub const MAX_RUNS: usize = 99;
/// The key the range presets read; written once at cluster start.
pub const RANGE_KEY: &str = "00000000";
/// Value size of the write presets (etcd's published figures use 256 B values).
pub const PRESET_VAL_SIZE_BYTES: usize = 256;
/// Distinct keys of the write presets.
pub const PRESET_KEY_SPACE: u64 = 100_000;

/// The workload rows `compare` knows, each a fixed `cairn-bench` command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// put, 1 client over 1 connection.
    #[value(name = "put-1")]
    Put1,
    /// put, 100 clients over 10 connections.
    #[value(name = "put-100")]
    Put100,
    /// linearizable range of one key, 100 clients over 10 connections.
    RangeL,
    /// serializable range of one key, 100 clients over 10 connections.
    RangeS,
    /// compare-and-swap txn, 100 clients over 10 connections.
    TxnPut,
    /// watch latency, 100 watchers over 10 streams, 100 puts/s from 10 putters.
    Watch,
    /// 90% linearizable reads, 10% writes, 100 clients over 10 connections.
    Mixed,
    /// lease keep-alive round trips, 100 clients over 10 connections.
    LeaseKeepalive,
}

impl Preset {
    pub fn name(self) -> &'static str {
        match self {
            Preset::Put1 => "put-1",
            Preset::Put100 => "put-100",
            Preset::RangeL => "range-l",
            Preset::RangeS => "range-s",
            Preset::TxnPut => "txn-put",
            Preset::Watch => "watch",
            Preset::Mixed => "mixed",
            Preset::LeaseKeepalive => "lease-keepalive",
        }
    }

    /// (clients, conns) and the subcommand with its options.
    fn shape(self) -> (usize, usize, Vec<String>) {
        let keys = |cmd: &str| {
            vec![
                cmd.to_owned(),
                "--key-size".into(),
                "8".into(),
                "--val-size".into(),
                PRESET_VAL_SIZE_BYTES.to_string(),
                "--key-space-size".into(),
                PRESET_KEY_SPACE.to_string(),
            ]
        };
        let range = |c: &str| {
            vec![
                "range".into(),
                RANGE_KEY.into(),
                "--consistency".into(),
                c.into(),
            ]
        };
        match self {
            Preset::Put1 => (1, 1, keys("put")),
            Preset::Put100 => (100, 10, keys("put")),
            Preset::RangeL => (100, 10, range("l")),
            Preset::RangeS => (100, 10, range("s")),
            Preset::TxnPut => (100, 10, keys("txn-put")),
            Preset::Watch => (
                10,
                10,
                [
                    "watch-latency",
                    "--streams",
                    "10",
                    "--watchers-per-stream",
                    "10",
                    "--put-rate",
                    "100",
                ]
                .map(String::from)
                .to_vec(),
            ),
            Preset::Mixed => {
                let mut v = keys("mixed");
                v.extend(["--read-ratio", "0.9", "--consistency", "l"].map(String::from));
                (100, 10, v)
            }
            Preset::LeaseKeepalive => (100, 10, vec!["lease-keepalive".into()]),
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct CompareOpts {
    /// Workloads to run, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "put-1,put-100,range-l,range-s,txn-put,watch"
    )]
    pub workloads: Vec<Preset>,
    /// Systems to start, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "etcd,cairn")]
    pub systems: Vec<System>,
    /// Runs per workload and system, alternating systems; the run with the median
    /// requests/s is reported.
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// Members per cluster.
    #[arg(long, default_value_t = 3)]
    pub members: usize,
    /// Cores per member: Cairn runs with `--cores N`, etcd with `GOMAXPROCS=N`
    /// (default: each system's own: etcd uses every core in each member; Cairn
    /// members, all on this host, divide the cores among them).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub member_cores: Option<u16>,
    /// Keep every system running while another is measured. By default the
    /// systems not being measured are paused (SIGSTOP) for the run and resumed
    /// (SIGCONT, then waited for until they serve) before their own run: an idle
    /// cluster's background work (timers, garbage collection, store commits
    /// after the previous workload) would otherwise count against the one
    /// measured.
    #[arg(long)]
    pub others_running: bool,
    /// The Cairn daemon (default: this workspace's target/release/cairn).
    #[arg(long)]
    pub cairn_bin: Option<PathBuf>,
    /// The etcd daemon.
    #[arg(long, default_value = "etcd")]
    pub etcd_bin: PathBuf,
    /// Directory in which the temporary data directories are made (default: $TMPDIR).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Start both systems secured the same way: mutual TLS on client and peer
    /// ports (a CA and certificates made for the run, in its temporary
    /// directory), auth enabled with a root user, and the workloads run as the
    /// non-root user `bench` (readwrite on every key), each connection
    /// authenticating once.
    #[arg(long)]
    pub secure: bool,
}

/// The user the workloads of a secure comparison run as.
pub fn bench_user() -> Credentials {
    Credentials::new(security::BENCH_USER, security::BENCH_PASSWORD)
}

/// The client options shown under the table for a secure comparison, with
/// `$CERTS` for the run's certificate directory.
fn shown_security_args(secure: bool) -> Vec<String> {
    if !secure {
        return Vec::new();
    }
    [
        "--cacert",
        "$CERTS/ca.pem",
        "--cert",
        "$CERTS/client.pem",
        "--key",
        "$CERTS/client-key.pem",
        "--user",
    ]
    .map(String::from)
    .into_iter()
    .chain([bench_user().arg()])
    .collect()
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
    let cluster = &mut clusters[measured];
    if cluster.is_paused() {
        cluster.resume_all()?;
        cluster.wait_ready(CLUSTER_READY_TIMEOUT).await?;
    }
    Ok(())
}

/// Says that a run of `preset` failed on `system` and records why, once per
/// system, for the row.
fn run_failed(
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

/// The workspace's shared `target` directory (the bench crate sits one level down).
fn workspace_target_dir() -> PathBuf {
    let bench_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    bench_dir.parent().unwrap_or(bench_dir).join("target")
}

/// This workspace's release build of the daemon.
pub fn default_cairn_bin() -> PathBuf {
    workspace_target_dir().join("release").join("cairn")
}

/// The most recently built runnable `cairn` of this workspace, release or debug:
/// what functional tests run against (performance figures want the release build).
pub fn newest_workspace_cairn_bin() -> Option<PathBuf> {
    let target = workspace_target_dir();
    ["release", "debug"]
        .into_iter()
        .map(|profile| target.join(profile).join("cairn"))
        .filter(|bin| {
            std::process::Command::new(bin)
                .arg("--version")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .max_by_key(|bin| std::fs::metadata(bin).and_then(|m| m.modified()).ok())
}

/// [`newest_workspace_cairn_bin`] for tests: when there is none, applies the
/// rule of [`crate::binary_available_or_skip`] to the debug build's path (fail
/// under `CI`, else a skip note) and returns `None`.
pub fn workspace_cairn_or_skip() -> Option<PathBuf> {
    let bin = newest_workspace_cairn_bin();
    if bin.is_none() {
        crate::binary_available_or_skip(&workspace_target_dir().join("debug").join("cairn"));
    }
    bin
}

fn duration_arg(d: Duration) -> String {
    if d.subsec_millis() == 0 && d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// The exact command line of `preset` against `endpoints`, with `client_args`
/// (TLS and user options) after the global ones.
pub fn preset_command(
    preset: Preset,
    endpoints: &str,
    client_args: &[String],
    global: &GlobalOpts,
) -> Vec<String> {
    let (clients, conns, sub) = preset.shape();
    let mut args = vec![
        "cairn-bench".to_owned(),
        "--endpoints".into(),
        endpoints.to_owned(),
        "--conns".into(),
        conns.to_string(),
        "--clients".into(),
        clients.to_string(),
    ];
    match global.stop() {
        Stop::Duration(d) => args.extend(["--duration".into(), duration_arg(d)]),
        Stop::Total(n) if global.total.is_some() => args.extend(["--total".into(), n.to_string()]),
        Stop::Total(_) => args.extend(["--duration".into(), duration_arg(DEFAULT_RUN_DURATION)]),
    }
    args.extend([
        "--warmup".into(),
        duration_arg(global.warmup.unwrap_or(DEFAULT_WARMUP)),
    ]);
    if let Some(rate) = global.rate {
        args.extend(["--rate".into(), rate.to_string()]);
    }
    args.extend_from_slice(client_args);
    args.extend(sub);
    args
}

struct Row {
    preset: Preset,
    command: Vec<String>,
    /// Median run per started system, in the order of `CompareOpts::systems`.
    results: Vec<(System, Report)>,
    /// Systems on which the workload could not run at all, and why.
    failed: Vec<(System, String)>,
}

pub(crate) fn median(mut runs: Vec<Report>) -> Option<Report> {
    runs.sort_by(|a, b| a.requests_per_sec().total_cmp(&b.requests_per_sec()));
    let mid = runs.len().saturating_sub(1) / 2;
    (!runs.is_empty()).then(|| runs.swap_remove(mid))
}

fn say(global: &GlobalOpts, text: &str) {
    if !global.json {
        eprintln!("{text}");
    }
}

/// Runs the comparison. Clusters live in this future: if it is dropped (Ctrl-C),
/// their drop stops every member.
pub async fn run(
    global: &GlobalOpts,
    opts: &CompareOpts,
    progress: bool,
) -> Result<(), BenchError> {
    if opts.runs == 0 || opts.runs > MAX_RUNS {
        return Err(BenchError::Option {
            option: "--runs",
            reason: format!("{} is not in 1..={MAX_RUNS}", opts.runs),
        });
    }
    if opts.workloads.is_empty() || opts.systems.is_empty() {
        return Err(BenchError::Option {
            option: "--workloads",
            reason: "nothing to compare".into(),
        });
    }
    if global.tls() || global.user.is_some() {
        return Err(BenchError::Option {
            option: "compare",
            reason: "--cacert, --cert, --key and --user do not apply: compare starts its own \
                     clusters (--secure gives both mutual TLS and auth)"
                .into(),
        });
    }
    let parent = opts.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&parent).map_err(|e| BenchError::Option {
        option: "--work-dir",
        reason: format!("{}: {e}", parent.display()),
    })?;
    let scratch = tempfile::Builder::new()
        .prefix("cairn-bench-compare-")
        .tempdir_in(&parent)
        .map_err(|e| BenchError::Option {
            option: "--work-dir",
            reason: format!("{}: {e}", parent.display()),
        })?;

    let certs = if opts.secure {
        Some(ClusterCerts::generate(&scratch.path().join("certs"))?)
    } else {
        None
    };
    let user = opts.secure.then(bench_user);
    let mut clusters: Vec<LocalCluster> = Vec::new();
    let mut not_measured: Vec<(System, String)> = Vec::new();
    for &system in &opts.systems {
        let binary = match system {
            System::Etcd => opts.etcd_bin.clone(),
            System::Cairn => opts.cairn_bin.clone().unwrap_or_else(default_cairn_bin),
        };
        if system == System::Cairn && opts.cairn_bin.is_none() && !binary.exists() {
            let why = format!(
                "{} does not exist; build it with `cargo build --release` in the workspace",
                binary.display()
            );
            eprintln!("{system}: NOT MEASURED: {why}");
            not_measured.push((system, why));
            continue;
        }
        say(
            global,
            &format!(
                "{system}: starting {} members from {}{}{}",
                opts.members,
                binary.display(),
                opts.member_cores
                    .map_or(String::new(), |n| format!(", {n} core(s) each")),
                if opts.secure {
                    ", mutual TLS and auth"
                } else {
                    ""
                }
            ),
        );
        let started = LocalCluster::start_with(
            system,
            &binary,
            opts.members,
            &scratch.path().join(system.name()),
            &StartOptions {
                cores: opts.member_cores.map(usize::from),
                tls: certs.clone(),
            },
        );
        let ready = match started {
            Ok(mut cluster) => match cluster.wait_ready(CLUSTER_READY_TIMEOUT).await {
                Ok(()) => match &user {
                    Some(user) => cluster
                        .enable_auth(security::ROOT_PASSWORD, user)
                        .await
                        .map(|()| cluster)
                        .map_err(|e| e.to_string()),
                    None => Ok(cluster),
                },
                Err(e) => Err(e.to_string()),
            },
            Err(e) => Err(e.to_string()),
        };
        match ready {
            Ok(cluster) => {
                seed(&cluster, user.as_ref()).await?;
                say(
                    global,
                    &format!(
                        "{system}: {} members serving at {}",
                        opts.members,
                        cluster.endpoints_arg()
                    ),
                );
                clusters.push(cluster);
            }
            Err(why) => {
                eprintln!("{system}: NOT MEASURED: it failed to start: {why}");
                not_measured.push((system, why));
            }
        }
    }
    if clusters.is_empty() {
        return Err(BenchError::Option {
            option: "--systems",
            reason: "no system could be started; see the messages above".into(),
        });
    }

    // The systems not being measured are paused, unless asked otherwise or
    // there is no other started system to pause.
    let paused = !opts.others_running && clusters.len() > 1;
    let total_runs = opts.workloads.len() * opts.runs * clusters.len();
    let mut done_runs = 0;
    let mut rows = Vec::with_capacity(opts.workloads.len());
    for &preset in &opts.workloads {
        let mut runs: Vec<Vec<Report>> = vec![Vec::new(); clusters.len()];
        let mut failed: Vec<(System, String)> = Vec::new();
        for run in 0..opts.runs {
            // Alternate which system goes first so drift (page cache, thermal,
            // neighbours) does not always favour the same one.
            let order: Vec<usize> = if run % 2 == 0 {
                (0..clusters.len()).collect()
            } else {
                (0..clusters.len()).rev().collect()
            };
            for i in order {
                done_runs += 1;
                if paused {
                    if let Err(e) = isolate(&mut clusters, i).await {
                        // This system cannot be measured now; the others can.
                        run_failed(&mut failed, preset, clusters[i].system, &e);
                        continue;
                    }
                }
                let cluster = &clusters[i];
                let args = preset_command(
                    preset,
                    &cluster.endpoints_arg(),
                    &cluster.client_args(user.as_ref()),
                    global,
                );
                say(
                    global,
                    &format!(
                        "[{done_runs}/{total_runs}] {} on {}: {}",
                        preset.name(),
                        cluster.system,
                        args.join(" ")
                    ),
                );
                let cli = Cli::try_parse_from(&args).map_err(|e| BenchError::Option {
                    option: "compare",
                    reason: format!("preset {} does not parse: {e}", preset.name()),
                })?;
                let mut cli_global = cli.global;
                cli_global.json = global.json;
                let mut report =
                    match crate::run_workload(&cli_global, &cli.command, progress).await {
                        Ok(report) => report,
                        Err(e) => {
                            // One system lacking a feature must not cost the other's row.
                            run_failed(&mut failed, preset, cluster.system, &e);
                            continue;
                        }
                    };
                report.system = Some(cluster.system.name().to_owned());
                report.workload = preset.name().to_owned();
                if global.json {
                    println!("{}", report.to_json());
                } else {
                    eprintln!(
                        "    {:.0} req/s, p50 {:.3} ms, p99 {:.3} ms, errors {}",
                        report.requests_per_sec(),
                        report.p50_ms(),
                        report.p99_ms(),
                        report.errors()
                    );
                }
                runs[i].push(report);
            }
        }
        let results = clusters
            .iter()
            .zip(runs)
            .filter_map(|(c, r)| median(r).map(|m| (c.system, m)))
            .collect();
        rows.push(Row {
            preset,
            command: preset_command(
                preset,
                "$ENDPOINTS",
                &shown_security_args(opts.secure),
                global,
            ),
            results,
            failed,
        });
    }
    for mut cluster in clusters {
        cluster.stop();
    }
    drop(scratch);

    let summary = summary_json(&rows, &not_measured, opts, paused);
    if !global.json {
        print!("{}", table(&rows, &not_measured, opts, paused));
    }
    println!("{summary}");
    Ok(())
}

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

fn ratio(cairn: Option<f64>, etcd: Option<f64>) -> String {
    match (cairn, etcd) {
        (Some(c), Some(e)) if e > 0.0 => format!("{:.2}", c / e),
        _ => "-".into(),
    }
}

fn figure(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "-".into(), |v| format!("{v:.decimals$}"))
}

/// A system's figure in a row: the number, "failed" if the workload could not
/// run on it, "-" if the system was not measured.
fn cell(row: &Row, system: System, value: Option<f64>, decimals: usize) -> String {
    if value.is_none() && row.failed.iter().any(|(s, _)| *s == system) {
        "failed".into()
    } else {
        figure(value, decimals)
    }
}

fn table(
    rows: &[Row],
    not_measured: &[(System, String)],
    opts: &CompareOpts,
    paused: bool,
) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "\n{} members per system on 127.0.0.1{}; {}; median of {} run(s); latency in ms; ratio = cairn/etcd\n\n",
        opts.members,
        if opts.secure {
            ", mutual TLS on client and peer ports, auth on, workloads as user bench"
        } else {
            ""
        },
        if paused {
            "each system measured while the other is paused"
        } else {
            "every system running throughout"
        },
        opts.runs
    ));
    out.push_str(
        "| workload | etcd req/s | cairn req/s | ratio | etcd p50 | cairn p50 | ratio | etcd p99 | cairn p99 | ratio | etcd p99.9 | cairn p99.9 | errors etcd/cairn |\n",
    );
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for row in rows {
        let get = |system: System, f: &dyn Fn(&Report) -> f64| {
            row.results
                .iter()
                .find(|(s, _)| *s == system)
                .map(|(_, r)| f(r))
        };
        let rps = |s| get(s, &|r: &Report| r.requests_per_sec());
        let p50 = |s| get(s, &|r: &Report| r.p50_ms());
        let p99 = |s| get(s, &|r: &Report| r.p99_ms());
        let p999 = |s| get(s, &|r: &Report| r.p999_ms());
        let errs = |s| get(s, &|r: &Report| r.errors() as f64);
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {}/{} |\n",
            row.preset.name(),
            cell(row, System::Etcd, rps(System::Etcd), 0),
            cell(row, System::Cairn, rps(System::Cairn), 0),
            ratio(rps(System::Cairn), rps(System::Etcd)),
            cell(row, System::Etcd, p50(System::Etcd), 3),
            cell(row, System::Cairn, p50(System::Cairn), 3),
            ratio(p50(System::Cairn), p50(System::Etcd)),
            cell(row, System::Etcd, p99(System::Etcd), 3),
            cell(row, System::Cairn, p99(System::Cairn), 3),
            ratio(p99(System::Cairn), p99(System::Etcd)),
            cell(row, System::Etcd, p999(System::Etcd), 3),
            cell(row, System::Cairn, p999(System::Cairn), 3),
            figure(errs(System::Etcd), 0),
            figure(errs(System::Cairn), 0),
        ));
    }
    for (system, why) in not_measured {
        out.push_str(&format!("\n{system} was NOT measured: {why}\n"));
    }
    for row in rows {
        for (system, why) in &row.failed {
            out.push_str(&format!(
                "\n{} FAILED on {system}: {why}\n",
                row.preset.name()
            ));
        }
    }
    out.push_str(&format!(
        "\nCommands ($ENDPOINTS = the client URLs of the system's members{}):\n",
        if opts.secure {
            ", $CERTS = the run's certificates"
        } else {
            ""
        }
    ));
    for row in rows {
        out.push_str(&format!(
            "- {}: `{}`\n",
            row.preset.name(),
            row.command.join(" ")
        ));
    }
    out.push_str(
        "\nWarm-up excluded. Latency: send to response (watch: put sent to event received). \
         req/s: successful requests over the measured wall time (watch: events/s). See bench/README.md.\n",
    );
    out
}

fn summary_json(
    rows: &[Row],
    not_measured: &[(System, String)],
    opts: &CompareOpts,
    paused: bool,
) -> Value {
    let rows: Vec<Value> = rows
        .iter()
        .map(|row| {
            let mut systems = serde_json::Map::new();
            for (system, report) in &row.results {
                systems.insert(system.name().to_owned(), report.to_json());
            }
            let rps = |s: System| {
                row.results
                    .iter()
                    .find(|(x, _)| *x == s)
                    .map(|(_, r)| r.requests_per_sec())
            };
            let cairn_over_etcd = match (rps(System::Cairn), rps(System::Etcd)) {
                (Some(c), Some(e)) if e > 0.0 => json!(c / e),
                _ => Value::Null,
            };
            let failed: serde_json::Map<String, Value> = row
                .failed
                .iter()
                .map(|(s, why)| (s.name().to_owned(), json!(why)))
                .collect();
            json!({
                "workload": row.preset.name(),
                "command": row.command.join(" "),
                "results": systems,
                "failed": failed,
                "requests_per_sec_ratio_cairn_over_etcd": cairn_over_etcd,
            })
        })
        .collect();
    let not_measured: serde_json::Map<String, Value> = not_measured
        .iter()
        .map(|(s, why)| (s.name().to_owned(), json!(why)))
        .collect();
    json!({
        "compare": rows,
        "members": opts.members,
        "runs": opts.runs,
        "secure": opts.secure,
        "others_paused": paused,
        "not_measured": not_measured,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_is_a_valid_command() {
        let global = Cli::parse_from(["cairn-bench", "put"]).global;
        for preset in Preset::value_variants() {
            let named = Preset::from_str(preset.name(), false).unwrap();
            assert_eq!(named, *preset, "the --workloads name is the table name");
            let args = preset_command(*preset, "127.0.0.1:1,127.0.0.1:2", &[], &global);
            let cli =
                Cli::try_parse_from(&args).unwrap_or_else(|e| panic!("{}: {e}", args.join(" ")));
            cli.global.validate().unwrap();
            assert!(!cli.global.tls() && cli.global.user.is_none());
            let secure = shown_security_args(true);
            let args = preset_command(*preset, "127.0.0.1:1", &secure, &global);
            let cli =
                Cli::try_parse_from(&args).unwrap_or_else(|e| panic!("{}: {e}", args.join(" ")));
            cli.global.validate().unwrap();
            assert_eq!(cli.global.cacert, Some(PathBuf::from("$CERTS/ca.pem")));
            assert_eq!(cli.global.user, Some(bench_user()));
            assert_eq!(cli.global.stop(), Stop::Duration(DEFAULT_RUN_DURATION));
            assert_eq!(cli.global.warmup(), DEFAULT_WARMUP);
        }
    }

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
        };
        let m = median(vec![report(30), report(10), report(20)]).unwrap();
        assert_eq!(m.requests(), 20);
        assert!(median(Vec::new()).is_none());
    }
}
