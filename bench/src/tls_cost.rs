//! `cairn-bench tls-cost`: what mutual TLS on the client and peer ports (and,
//! with `--auth`, auth on top) costs one system, side by side in one run.
//!
//! The same binary is started as two (or three) local clusters: plaintext,
//! mutual TLS, and mutual TLS with auth (workloads as the non-root user
//! `bench`). Each workload runs through the leader of each cluster in turn,
//! alternating the order run by run, while the other clusters are paused
//! (SIGSTOP), as `compare` does between systems. Leadership is first moved to
//! the same member (the first) in every cluster, and the workload goes
//! through it: a follower forwards writes, which adds a hop of its own, and
//! members on one host divide its CPUs by position (Cairn pins them to CPUs
//! 0, 1, 0 on two cores), so which member a cluster happened to elect would
//! otherwise decide the figure.

use clap::Args;
use serde_json::{json, Value};

use crate::binaries::DaemonOpts;
use crate::cluster::{StartOptions, System};
use crate::config::{GlobalOpts, GrpcClient};
use crate::preset::{preset_command, Preset};
use crate::security::{bench_user, ClusterCerts};
use crate::session::{
    alternating_order, check_runs, isolate, median, parse_preset, print_run, run_preset, say,
    scratch_dir, seed, start_secured, CLUSTER_READY_TIMEOUT,
};
use crate::stats::Report;
use crate::BenchError;

/// The member that leads every cluster while it is measured.
pub const MEASURED_LEADER: usize = 0;

#[derive(Debug, Clone, Args)]
pub struct TlsCostOpts {
    /// The system measured.
    #[arg(long, value_enum, default_value = "cairn")]
    pub system: System,
    /// Workloads to run, comma-separated (`compare`'s names).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "put-1")]
    pub workloads: Vec<Preset>,
    /// Runs per workload and cluster, alternating clusters; the run with the
    /// median requests/s is reported.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Members per cluster.
    #[arg(long, default_value_t = 3)]
    pub members: usize,
    /// Also measure a cluster with mutual TLS and auth on.
    #[arg(long)]
    pub auth: bool,
    #[command(flatten)]
    pub daemons: DaemonOpts,
}

/// How one of the clusters is secured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Plain,
    MutualTls,
    MutualTlsAuth,
}

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Variant::Plain => "plaintext",
            Variant::MutualTls => "mutual TLS",
            Variant::MutualTlsAuth => "mutual TLS + auth",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Variant::Plain => "plain",
            Variant::MutualTls => "mtls",
            Variant::MutualTlsAuth => "mtls_auth",
        }
    }
}

/// One workload's runs on every variant, in the order of the variants.
struct Row {
    preset: Preset,
    runs: Vec<Vec<Report>>,
}

/// Runs the measurement and prints its table (unless `--json`) and one JSON line.
pub async fn run(
    global: &GlobalOpts,
    opts: &TlsCostOpts,
    progress: bool,
) -> Result<(), BenchError> {
    check_runs(opts.runs)?;
    if opts.workloads.is_empty() {
        return Err(BenchError::Option {
            option: "--workloads",
            reason: "nothing to measure".into(),
        });
    }
    if global.tls() || global.user.is_some() {
        return Err(BenchError::Option {
            option: "tls-cost",
            reason: "--cacert, --cert, --key and --user do not apply: tls-cost starts its own \
                     clusters"
                .into(),
        });
    }
    if global.grpc_client == GrpcClient::Cairn {
        return Err(BenchError::Option {
            option: "--grpc-client",
            reason: "tls-cost measures every variant through tonic's client (the own client is \
                     plaintext only)"
                .into(),
        });
    }
    // The plaintext cluster is measured through the same client as the TLS
    // ones, so the difference is TLS's alone.
    let global = &GlobalOpts {
        grpc_client: GrpcClient::Tonic,
        ..global.clone()
    };
    let binary = opts.daemons.binary(opts.system);
    let scratch = scratch_dir(opts.daemons.work_dir.as_deref(), "cairn-bench-tls-cost-")?;
    let certs = ClusterCerts::generate(&scratch.path().join("certs"))?;
    let user = bench_user();

    let mut variants = vec![Variant::Plain, Variant::MutualTls];
    if opts.auth {
        variants.push(Variant::MutualTlsAuth);
    }
    let mut clusters = Vec::with_capacity(variants.len());
    for &variant in &variants {
        let options = StartOptions {
            cores: None,
            tls: (variant != Variant::Plain).then(|| certs.clone()),
            cairn_shards: None,
        };
        let dir = scratch.path().join(variant.key());
        let user = (variant == Variant::MutualTlsAuth).then_some(&user);
        let cluster =
            start_secured(opts.system, &binary, opts.members, &dir, &options, user).await?;
        seed(&cluster, user).await?;
        say(
            global,
            &format!(
                "{} {}: {} members serving at {}",
                opts.system,
                variant.name(),
                opts.members,
                cluster.endpoints_arg()
            ),
        );
        clusters.push(cluster);
    }

    let mut rows = Vec::with_capacity(opts.workloads.len());
    for &preset in &opts.workloads {
        let mut runs: Vec<Vec<Report>> = vec![Vec::new(); variants.len()];
        for run in 0..opts.runs {
            for i in alternating_order(run, variants.len()) {
                isolate(&mut clusters, i).await?;
                let cluster = &clusters[i];
                // The same member leads every cluster (see the module comment).
                cluster
                    .move_leader_to(MEASURED_LEADER, CLUSTER_READY_TIMEOUT)
                    .await?;
                let leader = &cluster.members[MEASURED_LEADER];
                let user = (variants[i] == Variant::MutualTlsAuth).then_some(&user);
                let args = preset_command(
                    preset,
                    &leader.client_url,
                    &cluster.client_args(user),
                    global,
                );
                say(
                    global,
                    &format!(
                        "[{} run {}] {} via {}: {}",
                        preset.name(),
                        run + 1,
                        variants[i].name(),
                        leader.name,
                        args.join(" ")
                    ),
                );
                let cli = parse_preset("tls-cost", preset, &args, global)?;
                let system = format!("{} {}", opts.system, variants[i].key());
                let report = run_preset(&cli, preset, system, progress).await?;
                print_run(global, &report);
                runs[i].push(report);
            }
        }
        rows.push(Row { preset, runs });
    }
    for mut cluster in clusters {
        cluster.stop();
    }
    drop(scratch);

    if !global.json {
        print!("{}", table(&rows, &variants, opts));
    }
    println!("{}", summary_json(rows, &variants, opts));
    Ok(())
}

/// `value` over the plaintext one, as a signed percentage.
fn added_percent(value: f64, plain: f64) -> Option<f64> {
    (plain > 0.0).then(|| (value / plain - 1.0) * 100.0)
}

/// The median of the runs' p50s: what the p50 comparison is made on (the
/// median run by req/s can be a run with an odd p50).
fn median_p50_ms(runs: &[Report]) -> Option<f64> {
    let mut p50s: Vec<f64> = runs.iter().map(Report::p50_ms).collect();
    p50s.sort_by(f64::total_cmp);
    p50s.get(p50s.len().saturating_sub(1) / 2).copied()
}

fn table(rows: &[Row], variants: &[Variant], opts: &TlsCostOpts) -> String {
    let mut out = format!(
        "\n{} {} members on 127.0.0.1 per cluster, workloads through member 0 made leader of \
         each, the other clusters paused; {} run(s) each; latency in ms\n\n",
        opts.system, opts.members, opts.runs
    );
    out.push_str(
        "| workload | cluster | median p50 of runs | vs plaintext | p50 of every run | req/s (median run) | p99 | p99.9 | errors |\n",
    );
    out.push_str("|---|---|---:|---:|---|---:|---:|---:|---:|\n");
    for row in rows {
        let plain_p50 = median_p50_ms(&row.runs[0]);
        for (variant, runs) in variants.iter().zip(&row.runs) {
            let every: Vec<String> = runs.iter().map(|r| format!("{:.3}", r.p50_ms())).collect();
            let (Some(m), Some(p50)) = (median(runs.clone()), median_p50_ms(runs)) else {
                continue;
            };
            let versus = match (variant, plain_p50.and_then(|p| added_percent(p50, p))) {
                (Variant::Plain, _) | (_, None) => "-".to_owned(),
                (_, Some(pct)) => format!("{pct:+.1}%"),
            };
            out.push_str(&format!(
                "| {} | {} | {:.3} | {} | {} | {:.0} | {:.3} | {:.3} | {} |\n",
                row.preset.name(),
                variant.name(),
                p50,
                versus,
                every.join(" / "),
                m.requests_per_sec(),
                m.p99_ms(),
                m.p999_ms(),
                m.errors(),
            ));
        }
    }
    out
}

fn summary_json(rows: Vec<Row>, variants: &[Variant], opts: &TlsCostOpts) -> Value {
    let rows: Vec<Value> = rows
        .into_iter()
        .map(|row| {
            let plain_p50 = median_p50_ms(&row.runs[0]);
            let mut results = serde_json::Map::new();
            for (variant, runs) in variants.iter().zip(row.runs) {
                let p50 = median_p50_ms(&runs);
                let every: Vec<f64> = runs.iter().map(Report::p50_ms).collect();
                if let Some(m) = median(runs) {
                    let mut v = m.to_json();
                    v["median_p50_ms_of_runs"] = json!(p50);
                    v["p50_ms_of_every_run"] = json!(every);
                    v["median_p50_added_percent_over_plain"] = json!(p50
                        .zip(plain_p50)
                        .and_then(|(p, plain)| added_percent(p, plain)));
                    results.insert(variant.key().to_owned(), v);
                }
            }
            json!({ "workload": row.preset.name(), "results": results })
        })
        .collect();
    json!({
        "tls_cost": rows,
        "system": opts.system.name(),
        "members": opts.members,
        "runs": opts.runs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn added_percent_is_relative_to_plaintext() {
        assert_eq!(added_percent(1.15, 1.0).map(|p| p.round()), Some(15.0));
        assert_eq!(added_percent(0.9, 1.0).map(|p| p.round()), Some(-10.0));
        assert_eq!(added_percent(1.0, 0.0), None);
    }

    #[test]
    fn the_p50_compared_is_the_median_of_the_runs() {
        let run = |p50_us: u64| {
            let mut recorder = crate::Recorder::new();
            recorder.record_ok(std::time::Duration::from_micros(p50_us));
            Report {
                workload: "put-1".into(),
                system: None,
                clients: 1,
                conns: 1,
                target_rate_per_sec: None,
                elapsed: std::time::Duration::from_secs(1),
                warmup: std::time::Duration::ZERO,
                warmup_requests: 0,
                recorder,
                server_cpu_us_per_op: None,
            }
        };
        let p50 = median_p50_ms(&[run(900), run(500), run(700)]).unwrap();
        assert!((p50 - 0.7).abs() < 0.01, "{p50}");
        assert_eq!(median_p50_ms(&[]), None);
    }

    #[test]
    fn options_parse() {
        use crate::config::Cli;
        use clap::Parser;

        let cli = Cli::parse_from([
            "cairn-bench",
            "tls-cost",
            "--workloads",
            "put-1,put-100",
            "--runs",
            "5",
            "--auth",
        ]);
        let crate::Command::TlsCost(o) = cli.command else {
            panic!("not tls-cost");
        };
        assert_eq!(o.workloads, vec![Preset::Put1, Preset::Put100]);
        assert_eq!((o.runs, o.members, o.auth), (5, 3, true));
        assert_eq!(o.system, System::Cairn);
    }
}
