//! `cairn-bench compare`: a local cluster of each system, the same workloads
//! against both, alternating, one table with the ratio Cairn/etcd.
//!
//! Each workload row runs as the exact `cairn-bench` command line shown under the
//! table (see [`crate::preset`]), so any row can be reproduced by hand against
//! any cluster.

use clap::Args;
use serde_json::{json, Value};

use crate::binaries::DaemonOpts;
use crate::cluster::{LocalCluster, StartOptions, System};
use crate::config::GlobalOpts;
use crate::preset::{preset_command, shown_security_args, Preset};
use crate::security::{bench_user, ClusterCerts};
use crate::session::{
    alternating_order, check_runs, cpu_per_op, isolate, median, parse_preset, print_run,
    run_failed, run_preset, say, scratch_dir, seed, start_secured, CLUSTER_READY_TIMEOUT,
};
use crate::stats::Report;
use crate::BenchError;

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
    /// Cairn members run with `--shards N` (etcd has one Raft group): how
    /// the one keyspace over several shards compares.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub cairn_shards: Option<u16>,
    #[command(flatten)]
    pub daemons: DaemonOpts,
    /// Start both systems secured the same way: mutual TLS on client and peer
    /// ports (a CA and certificates made for the run, in its temporary
    /// directory), auth enabled with a root user, and the workloads run as the
    /// non-root user `bench` (readwrite on every key), each connection
    /// authenticating once.
    #[arg(long)]
    pub secure: bool,
    /// The member (0-based) made leader of every cluster before each run, or
    /// `any` to leave leadership as elected. A workload of one connection
    /// talks to the first member: by default it reaches the leader, and with
    /// `--leader 1` it goes through a follower, which forwards each write to
    /// the leader and hears back when it commits. Members on one host also
    /// divide its CPUs by position. Left to the elections, which member
    /// happened to lead would decide such a row, differently for each system.
    #[arg(long, default_value = "0")]
    pub leader: Leader,
}

/// Which member leads each cluster while it is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leader {
    /// This member (0-based), moved there by Maintenance.MoveLeader.
    Member(usize),
    /// Whichever member the cluster elected.
    AsElected,
}

impl std::str::FromStr for Leader {
    type Err = String;

    fn from_str(s: &str) -> Result<Leader, String> {
        if s == "any" {
            return Ok(Leader::AsElected);
        }
        s.parse()
            .map(Leader::Member)
            .map_err(|_| format!("expected a member index (0, 1, ...) or `any`, got {s:?}"))
    }
}

impl std::fmt::Display for Leader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Leader::Member(i) => write!(f, "{i}"),
            Leader::AsElected => f.write_str("any"),
        }
    }
}

struct Row {
    preset: Preset,
    command: Vec<String>,
    /// Median run per started system, in the order of `CompareOpts::systems`.
    results: Vec<(System, Report)>,
    /// Systems on which the workload could not run at all, and why.
    failed: Vec<(System, String)>,
}

/// Runs the comparison. Clusters live in this future: if it is dropped (Ctrl-C),
/// their drop stops every member.
pub async fn run(
    global: &GlobalOpts,
    opts: &CompareOpts,
    progress: bool,
) -> Result<(), BenchError> {
    check_runs(opts.runs)?;
    if opts.workloads.is_empty() || opts.systems.is_empty() {
        return Err(BenchError::Option {
            option: "--workloads",
            reason: "nothing to compare".into(),
        });
    }
    if let Leader::Member(i) = opts.leader {
        if i >= opts.members {
            return Err(BenchError::Option {
                option: "--leader",
                reason: format!(
                    "member {i} does not exist: the clusters have {} (0 to {})",
                    opts.members,
                    opts.members - 1
                ),
            });
        }
    }
    if global.tls() || global.user.is_some() {
        return Err(BenchError::Option {
            option: "compare",
            reason: "--cacert, --cert, --key and --user do not apply: compare starts its own \
                     clusters (--secure gives both mutual TLS and auth)"
                .into(),
        });
    }
    let scratch = scratch_dir(opts.daemons.work_dir.as_deref(), "cairn-bench-compare-")?;

    let certs = if opts.secure {
        Some(ClusterCerts::generate(&scratch.path().join("certs"))?)
    } else {
        None
    };
    let user = opts.secure.then(bench_user);
    let mut clusters: Vec<LocalCluster> = Vec::new();
    let mut not_measured: Vec<(System, String)> = Vec::new();
    for &system in &opts.systems {
        let binary = opts.daemons.binary(system);
        if system == System::Cairn && opts.daemons.cairn_bin.is_none() && !binary.exists() {
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
        let options = StartOptions {
            cores: opts.member_cores.map(usize::from),
            tls: certs.clone(),
            cairn_shards: opts.cairn_shards.map(usize::from),
        };
        let dir = scratch.path().join(system.name());
        let started = start_secured(system, &binary, opts.members, &dir, &options, user.as_ref());
        match started.await {
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
            Err(e) => {
                eprintln!("{system}: NOT MEASURED: it failed to start: {e}");
                not_measured.push((system, e.to_string()));
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
            for i in alternating_order(run, clusters.len()) {
                done_runs += 1;
                if paused {
                    if let Err(e) = isolate(&mut clusters, i).await {
                        // This system cannot be measured now; the others can.
                        run_failed(&mut failed, preset, clusters[i].system, &e);
                        continue;
                    }
                }
                let cluster = &clusters[i];
                // A leader asked for must lead before the run; one as elected
                // is only named (a moment without one costs no run).
                let leader = match opts.leader {
                    Leader::Member(m) => {
                        if let Err(e) = cluster.move_leader_to(m, CLUSTER_READY_TIMEOUT).await {
                            run_failed(&mut failed, preset, cluster.system, &e);
                            continue;
                        }
                        format!("{} leads", cluster.members[m].name)
                    }
                    Leader::AsElected => match cluster.leader_index().await {
                        Ok(m) => format!("{} leads", cluster.members[m].name),
                        Err(_) => "no member says it leads".to_string(),
                    },
                };
                let args = preset_command(
                    preset,
                    &cluster.endpoints_arg(),
                    &cluster.client_args(user.as_ref()),
                    global,
                );
                say(
                    global,
                    &format!(
                        "[{done_runs}/{total_runs}] {} on {}: {} ({leader})",
                        preset.name(),
                        cluster.system,
                        args.join(" "),
                    ),
                );
                let cli = parse_preset("compare", preset, &args, global)?;
                let system = cluster.system.name().to_owned();
                let cpu_before = cluster.cpu_time();
                let report = match run_preset(&cli, preset, system, progress).await {
                    Ok(mut report) => {
                        report.server_cpu_us_per_op =
                            cpu_per_op(cpu_before, cluster.cpu_time(), &report);
                        report
                    }
                    Err(e) => {
                        // One system lacking a feature must not cost the other's row.
                        run_failed(&mut failed, preset, cluster.system, &e);
                        continue;
                    }
                };
                if global.json {
                    println!("{}", report.to_json());
                }
                print_run(global, &report);
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

    let summary = summary_json(
        &rows,
        &not_measured,
        opts,
        paused,
        global.grpc_client.resolved(opts.secure).name(),
    );
    if !global.json {
        print!("{}", table(&rows, &not_measured, opts, paused));
    }
    println!("{summary}");
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
        "\n{} members per system on 127.0.0.1{}; {}; {}; median of {} run(s); latency in ms; ratio = cairn/etcd\n\n",
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
        match opts.leader {
            Leader::Member(0) => "the first member leads".to_string(),
            Leader::Member(m) => format!("member {m} leads, one-connection workloads go through member 0"),
            Leader::AsElected => "leadership as elected".to_string(),
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
    out.push_str(
        "\nServer CPU per request: user + system time of the members over a run (warm-up included) divided by the requests answered, in µs\n\n",
    );
    out.push_str("| workload | etcd CPU µs/op | cairn CPU µs/op | ratio |\n|---|---:|---:|---:|\n");
    for row in rows {
        let cpu = |system: System| {
            row.results
                .iter()
                .find(|(s, _)| *s == system)
                .and_then(|(_, r)| r.server_cpu_us_per_op)
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            row.preset.name(),
            cell(row, System::Etcd, cpu(System::Etcd), 1),
            cell(row, System::Cairn, cpu(System::Cairn), 1),
            ratio(cpu(System::Cairn), cpu(System::Etcd)),
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
    grpc_client: &str,
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
        "leader": opts.leader.to_string(),
        "grpc_client": grpc_client,
        "not_measured": not_measured,
    })
}
