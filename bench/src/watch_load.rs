//! `cairn-bench watch-load`: what many watchers, one of which never reads,
//! cost the writers, side by side in one run.
//!
//! Each system is started once. Each run measures the `put-100` preset twice,
//! in alternating order: once with no watcher, once while `--watchers`
//! watchers (one key each, spread over `--streams` streams on ten
//! connections) read their events and one more watcher, on a connection of its
//! own, watches every key and never reads. The watched keys are every tenth
//! key of the preset's key space, so about one put in ten has a reader
//! waiting for it, and the stalled watcher has every put.
//! The reading watchers use the load generator's own client
//! ([`crate::grpc`]), as the puts do, so that reading their events costs
//! the shared CPUs as little as it can; the stalled one uses tonic's, whose
//! flow-control window is returned only as the watcher reads.
//!
//! The stalled watcher's cost is read from the members' resident memory: once
//! the watchers are open (before the puts) and once after the puts. Memory
//! that grew with every put held for a watcher that never reads would show as
//! the difference.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::Args;
use prost::Message;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use cairn_proto::etcdserverpb::watch_client::WatchClient;
use cairn_proto::etcdserverpb::watch_request::RequestUnion;
use cairn_proto::etcdserverpb::{WatchCreateRequest, WatchRequest, WatchResponse};

use crate::binaries::DaemonOpts;
use crate::cluster::{LocalCluster, Resident, StartOptions, System};
use crate::config::GlobalOpts;
use crate::grpc::{self, Method};
use crate::preset::{preset_command, Preset, PRESET_KEY_SPACE};
use crate::security::Conn;
use crate::session::{
    alternating_order, check_runs, cpu_per_op, isolate, parse_preset, print_run, run_preset, say,
    scratch_dir, seed, start_secured,
};
use crate::stats::Report;
use crate::BenchError;

/// Most watchers one run opens.
pub const MAX_LOAD_WATCHERS: usize = 100_000;
/// Connections the reading watchers' streams are spread over.
const WATCH_CONNS: usize = 10;
/// How long a stream may take to confirm its watchers.
const CREATE_TIMEOUT: Duration = Duration::from_secs(60);
/// The preset's key length: watched keys are spelled as its keys are.
const KEY_BYTES: usize = 8;

#[derive(Debug, Clone, Args)]
pub struct WatchLoadOpts {
    /// Systems to start, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "cairn")]
    pub systems: Vec<System>,
    /// Reading watchers, one key each.
    #[arg(long, default_value_t = 10_000)]
    pub watchers: usize,
    /// Streams the reading watchers are spread over.
    #[arg(long, default_value_t = 100)]
    pub streams: usize,
    /// Runs, each measuring with and without watchers; the run with the
    /// median requests/s of each is reported.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Members per cluster.
    #[arg(long, default_value_t = 1)]
    pub members: usize,
    #[command(flatten)]
    pub daemons: DaemonOpts,
}

impl WatchLoadOpts {
    fn validate(&self) -> Result<(), BenchError> {
        check_runs(self.runs)?;
        let bad = |option: &'static str, reason: String| Err(BenchError::Option { option, reason });
        if self.systems.is_empty() {
            return bad("--systems", "nothing to measure".into());
        }
        let keys = (PRESET_KEY_SPACE / 10) as usize;
        if self.watchers == 0 || self.watchers > MAX_LOAD_WATCHERS.min(keys) {
            return bad(
                "--watchers",
                format!(
                    "{} is not in 1..={}",
                    self.watchers,
                    MAX_LOAD_WATCHERS.min(keys)
                ),
            );
        }
        if self.streams == 0 || self.streams > self.watchers {
            return bad(
                "--streams",
                format!("{} is not in 1..={}", self.streams, self.watchers),
            );
        }
        Ok(())
    }
}

/// The key of watcher `i`: every tenth key of the put preset's key space.
fn watched_key(i: usize) -> Bytes {
    Bytes::from(format!("{:0width$}", i * 10, width = KEY_BYTES))
}

/// The watchers of one measured run; dropping them closes every stream.
struct OpenWatchers {
    readers: Vec<tokio::task::JoinHandle<()>>,
    /// The reading watchers' connections, open while a handle is.
    _channels: Vec<grpc::Channel>,
    events: Arc<AtomicU64>,
    /// The stalled stream: its request side, kept open, and its responses,
    /// never read after the watcher was confirmed.
    _stalled: (mpsc::Sender<WatchRequest>, tonic::Streaming<WatchResponse>),
}

impl Drop for OpenWatchers {
    fn drop(&mut self) {
        for r in &self.readers {
            r.abort();
        }
    }
}

/// The create request of a watcher of `key` (to `range_end`).
fn create(key: Bytes, range_end: Bytes) -> WatchRequest {
    WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key,
            range_end,
            ..Default::default()
        })),
    }
}

/// Why a watch stream could not be set up.
fn setup_failed(reason: String) -> BenchError {
    BenchError::Task {
        workload: "watch-load",
        reason,
    }
}

/// Whether an answer during setup confirms a watcher; a refusal fails the
/// setup.
fn confirms(resp: &WatchResponse) -> Result<bool, BenchError> {
    if resp.canceled {
        return Err(setup_failed(format!(
            "watch refused: {}",
            resp.cancel_reason
        )));
    }
    Ok(resp.created)
}

/// Opens a stream on `channel` with a create request per key and waits
/// until every watcher is confirmed. Returns the rest of the answers.
async fn open_read_stream(
    channel: &grpc::Channel,
    keys: Vec<(Bytes, Bytes)>,
) -> Result<mpsc::UnboundedReceiver<Result<Bytes, tonic::Status>>, BenchError> {
    let n = keys.len();
    let creates: Vec<WatchRequest> = keys.into_iter().map(|(k, e)| create(k, e)).collect();
    let mut answers = channel
        .open_stream(Method::Watch, &creates)
        .map_err(|s| setup_failed(format!("watch: {}", s.message())))?;
    let mut created = 0;
    while created < n {
        let message = tokio::time::timeout(CREATE_TIMEOUT, answers.recv())
            .await
            .map_err(|_| setup_failed(format!("{created} of {n} watchers confirmed in time")))?
            .ok_or_else(|| setup_failed("watch stream ended during setup".into()))?
            .map_err(|s| setup_failed(format!("watch stream: {}", s.message())))?;
        let resp = WatchResponse::decode(message)
            .map_err(|e| setup_failed(format!("a watch answer does not decode: {e}")))?;
        created += usize::from(confirms(&resp)?);
    }
    Ok(answers)
}

/// Opens a stream with a create request per key and waits until every
/// watcher is confirmed. Returns the request side (kept open) and the rest
/// of the responses.
async fn open_stream(
    conn: Conn,
    keys: Vec<(Bytes, Bytes)>,
) -> Result<(mpsc::Sender<WatchRequest>, tonic::Streaming<WatchResponse>), BenchError> {
    let n = keys.len();
    let (tx, rx) = mpsc::channel(n.max(1));
    for (key, range_end) in keys {
        tx.send(create(key, range_end))
            .await
            .map_err(|_| setup_failed("watch stream closed during setup".into()))?;
    }
    let mut responses = tokio::time::timeout(
        CREATE_TIMEOUT,
        WatchClient::new(conn).watch(ReceiverStream::new(rx)),
    )
    .await
    .map_err(|_| setup_failed("watch stream not opened in time".into()))?
    .map_err(|s| setup_failed(format!("watch: {}", s.message())))?
    .into_inner();
    let mut created = 0;
    while created < n {
        let resp = tokio::time::timeout(CREATE_TIMEOUT, responses.message())
            .await
            .map_err(|_| setup_failed(format!("{created} of {n} watchers confirmed in time")))?
            .map_err(|s| setup_failed(format!("watch stream: {}", s.message())))?
            .ok_or_else(|| setup_failed("watch stream ended during setup".into()))?;
        created += usize::from(confirms(&resp)?);
    }
    Ok((tx, responses))
}

async fn open_watchers(
    cluster: &LocalCluster,
    opts: &WatchLoadOpts,
) -> Result<OpenWatchers, BenchError> {
    let channels: Vec<grpc::Channel> = (0..WATCH_CONNS.min(opts.streams))
        .map(|i| {
            let url = &cluster.members[i % cluster.members.len()].client_url;
            grpc::Channel::lazy(grpc::host_port(url), None, CREATE_TIMEOUT)
        })
        .collect();
    let events = Arc::new(AtomicU64::new(0));
    let per_stream = opts.watchers.div_ceil(opts.streams);
    let mut readers = Vec::with_capacity(opts.streams);
    for s in 0..opts.streams {
        let keys: Vec<(Bytes, Bytes)> = (s * per_stream..((s + 1) * per_stream).min(opts.watchers))
            .map(|i| (watched_key(i), Bytes::new()))
            .collect();
        if keys.is_empty() {
            continue;
        }
        let mut answers = open_read_stream(&channels[s % channels.len()], keys).await?;
        let events = Arc::clone(&events);
        readers.push(tokio::spawn(async move {
            while let Some(Ok(message)) = answers.recv().await {
                if let Ok(resp) = WatchResponse::decode(message) {
                    events.fetch_add(resp.events.len() as u64, Ordering::Relaxed);
                }
            }
        }));
    }
    // Every key, on a connection of its own: a stream that stops reading holds
    // its connection's flow-control window.
    let stalled_conn = cluster
        .connect_member(0, CREATE_TIMEOUT)
        .await
        .map_err(setup_failed)?;
    let stalled = open_stream(
        stalled_conn,
        vec![(Bytes::from_static(b"\0"), Bytes::from_static(b"\0"))],
    )
    .await?;
    Ok(OpenWatchers {
        readers,
        _channels: channels,
        events,
        _stalled: stalled,
    })
}

/// One measured run: the put report, the members' memory before and after
/// the puts, and what the watchers saw (none without watchers).
struct Measured {
    report: Report,
    events: u64,
    rss_before: Option<u64>,
    rss_after: Option<u64>,
}

/// Runs the put preset on `cluster`, with the members' memory and CPU time
/// read around it.
async fn measure(
    cluster: &LocalCluster,
    cli: &crate::config::Cli,
    progress: bool,
) -> Result<Measured, BenchError> {
    let rss_before = Resident::of_members(cluster).map(|r| r.anon);
    let cpu_before = cluster.cpu_time();
    let mut report = run_preset(
        cli,
        Preset::Put100,
        cluster.system.name().to_owned(),
        progress,
    )
    .await?;
    report.server_cpu_us_per_op = cpu_per_op(cpu_before, cluster.cpu_time(), &report);
    Ok(Measured {
        report,
        events: 0,
        rss_before,
        rss_after: Resident::of_members(cluster).map(|r| r.anon),
    })
}

/// Runs the measurement and prints its table (unless `--json`) and one JSON line.
pub async fn run(
    global: &GlobalOpts,
    opts: &WatchLoadOpts,
    progress: bool,
) -> Result<(), BenchError> {
    opts.validate()?;
    if global.tls() || global.user.is_some() {
        return Err(BenchError::Option {
            option: "watch-load",
            reason: "--cacert, --cert, --key and --user do not apply: watch-load starts its own \
                     clusters"
                .into(),
        });
    }
    let scratch = scratch_dir(opts.daemons.work_dir.as_deref(), "cairn-bench-watch-load-")?;
    let mut clusters = Vec::with_capacity(opts.systems.len());
    for &system in &opts.systems {
        let binary = opts.daemons.binary(system);
        let dir = scratch.path().join(system.name());
        let cluster = start_secured(
            system,
            &binary,
            opts.members,
            &dir,
            &StartOptions::default(),
            None,
        )
        .await?;
        seed(&cluster, None).await?;
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

    let mut quiet: Vec<Vec<Measured>> = clusters.iter().map(|_| Vec::new()).collect();
    let mut watched: Vec<Vec<Measured>> = clusters.iter().map(|_| Vec::new()).collect();
    for run in 0..opts.runs {
        for i in alternating_order(run, clusters.len()) {
            isolate(&mut clusters, i).await?;
            for with_watchers in alternate(run) {
                let cluster = &clusters[i];
                let args = preset_command(Preset::Put100, &cluster.endpoints_arg(), &[], global);
                let cli = parse_preset("watch-load", Preset::Put100, &args, global)?;
                let label = if with_watchers {
                    format!("{} watchers + 1 stalled", opts.watchers)
                } else {
                    "no watchers".to_owned()
                };
                say(
                    global,
                    &format!(
                        "[run {}] {} with {label}: {}",
                        run + 1,
                        cluster.system,
                        args.join(" ")
                    ),
                );
                let measured = if with_watchers {
                    let open = open_watchers(cluster, opts).await?;
                    let mut m = measure(cluster, &cli, progress).await?;
                    m.events = open.events.load(Ordering::Relaxed);
                    drop(open);
                    m
                } else {
                    measure(cluster, &cli, progress).await?
                };
                print_run(global, &measured.report);
                say(
                    global,
                    &format!(
                        "    {} events read; members' memory {} MiB before the puts, {} MiB after",
                        measured.events,
                        mib(measured.rss_before),
                        mib(measured.rss_after)
                    ),
                );
                if with_watchers {
                    watched[i].push(measured);
                } else {
                    quiet[i].push(measured);
                }
            }
        }
    }
    let systems: Vec<System> = clusters.iter().map(|c| c.system).collect();
    for mut cluster in clusters {
        cluster.stop();
    }
    drop(scratch);

    let rows: Vec<Row> = systems
        .into_iter()
        .zip(quiet)
        .zip(watched)
        .filter_map(|((system, q), w)| {
            let tail = Tail::of(&q, &w)?;
            Some((system, median_run(q)?, median_run(w)?, tail))
        })
        .collect();
    if !global.json {
        print!("{}", table(&rows, opts));
    }
    println!("{}", summary_json(&rows, opts));
    Ok(())
}

/// Whether run `run` measures with watchers first or second.
fn alternate(run: usize) -> [bool; 2] {
    if run.is_multiple_of(2) {
        [false, true]
    } else {
        [true, false]
    }
}

/// A system's median runs without and with watchers, and the tail over all
/// its runs.
type Row = (System, Measured, Measured, Tail);

/// The p99 over every run of a side, and each run's p99 ratio: a p99 of one
/// 5 s run moves by a tenth or more between runs here, the p99 of all runs
/// pooled much less.
struct Tail {
    /// p99 of every request of every run, in ms: without, with watchers.
    pooled_p99_ms: (f64, f64),
    /// Each run's p99 with watchers over its p99 without, in run order.
    run_ratios: Vec<f64>,
}

impl Tail {
    fn of(quiet: &[Measured], watched: &[Measured]) -> Option<Tail> {
        let pooled = |runs: &[Measured]| {
            let (first, rest) = runs.split_first()?;
            let mut all = first.report.recorder.clone();
            for m in rest {
                all.merge(&m.report.recorder);
            }
            Some(all.quantile_ms(0.99))
        };
        Some(Tail {
            pooled_p99_ms: (pooled(quiet)?, pooled(watched)?),
            run_ratios: quiet
                .iter()
                .zip(watched)
                .map(|(q, w)| w.report.p99_ms() / q.report.p99_ms())
                .collect(),
        })
    }

    fn pooled_ratio(&self) -> f64 {
        self.pooled_p99_ms.1 / self.pooled_p99_ms.0
    }
}

/// The run with the median requests/s.
fn median_run(mut runs: Vec<Measured>) -> Option<Measured> {
    runs.sort_by(|a, b| {
        a.report
            .requests_per_sec()
            .total_cmp(&b.report.requests_per_sec())
    });
    let mid = runs.len() / 2;
    (!runs.is_empty()).then(|| runs.swap_remove(mid))
}

fn mib(bytes: Option<u64>) -> String {
    bytes.map_or_else(
        || "-".into(),
        |b| format!("{:.1}", b as f64 / (1 << 20) as f64),
    )
}

fn table(rows: &[Row], opts: &WatchLoadOpts) -> String {
    let mut out = format!(
        "\nput-100 on {} member(s), alone and beside {} reading watchers plus 1 that never reads; median of {} run(s); latency in ms\n\n",
        opts.members, opts.watchers, opts.runs
    );
    out.push_str(
        "| system | watchers | req/s | p50 | p99 | p99.9 | p99 ratio | server CPU µs/op | events read | members' heap before / after puts (MiB) |\n",
    );
    out.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for (system, quiet, watched, _) in rows {
        for (label, m) in [
            ("none".to_owned(), quiet),
            (format!("{} + 1 stalled", opts.watchers), watched),
        ] {
            let r = &m.report;
            out.push_str(&format!(
                "| {system} | {label} | {:.0} | {:.3} | {:.3} | {:.3} | {:.2} | {} | {} | {} / {} |\n",
                r.requests_per_sec(),
                r.p50_ms(),
                r.p99_ms(),
                r.p999_ms(),
                r.p99_ms() / quiet.report.p99_ms(),
                r.server_cpu_us_per_op
                    .map_or_else(|| "-".into(), |c| format!("{c:.1}")),
                m.events,
                mib(m.rss_before),
                mib(m.rss_after),
            ));
        }
    }
    out.push('\n');
    for (system, _, _, tail) in rows {
        let (alone, beside) = tail.pooled_p99_ms;
        let runs: Vec<String> = tail.run_ratios.iter().map(|r| format!("{r:.2}")).collect();
        out.push_str(&format!(
            "{system}, every run pooled: p99 {alone:.3} ms alone, {beside:.3} ms beside the watchers, ratio {:.2}; each run's ratio: {}\n",
            tail.pooled_ratio(),
            runs.join(", ")
        ));
    }
    out.push_str(
        "\np99 ratio: p99 over the p99 without watchers. Server CPU: user + system time of the members over the run (warm-up included) per request. Heap: anonymous resident memory of the members, summed, before and after the puts (with watchers: once they are open).\n",
    );
    out
}

fn summary_json(rows: &[Row], opts: &WatchLoadOpts) -> Value {
    let side = |m: &Measured| {
        json!({
            "report": m.report.to_json(),
            "events_read": m.events,
            "members_anon_rss_bytes_before": m.rss_before,
            "members_anon_rss_bytes_after": m.rss_after,
        })
    };
    let rows: Vec<Value> = rows
        .iter()
        .map(|(system, quiet, watched, tail)| {
            json!({
                "system": system.name(),
                "without_watchers": side(quiet),
                "with_watchers": side(watched),
                "p99_ratio": watched.report.p99_ms() / quiet.report.p99_ms(),
                "pooled_p99_ms": [tail.pooled_p99_ms.0, tail.pooled_p99_ms.1],
                "pooled_p99_ratio": tail.pooled_ratio(),
                "p99_ratio_per_run": tail.run_ratios,
            })
        })
        .collect();
    json!({
        "watch_load": rows,
        "watchers": opts.watchers,
        "streams": opts.streams,
        "members": opts.members,
        "runs": opts.runs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watched_keys_are_keys_the_put_preset_writes() {
        assert_eq!(watched_key(0), Bytes::from_static(b"00000000"));
        assert_eq!(watched_key(9_999), Bytes::from_static(b"00099990"));
        assert!((9_999 * 10) < PRESET_KEY_SPACE as usize);
    }

    #[test]
    fn runs_alternate_which_side_goes_first() {
        assert_eq!(alternate(0), [false, true]);
        assert_eq!(alternate(1), [true, false]);
    }
}
