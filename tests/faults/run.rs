//! One bench run: a cluster behind proxies, register clients, watchers,
//! lockers and txn clients working while the nemesis injects faults; then
//! every fault healed, the whole cluster killed -9 and restarted, a final
//! read of every key, and every checker over what was recorded.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::cluster::{direct_client, Bench, OP_TIMEOUT};
use super::elle;
use super::history::{History, Outcome, Record, RegOp, RegOut};
use super::linearizable;
use super::locks::{self, LockLog, Locker};
use super::nemesis::{Fault, Nemesis};
use super::txns::{self, TxnClient, TxnKeys, TxnLog};
use super::watches::{self, WatchLog, Watcher, WATCH_PREFIX};
use super::workload::{self, register_key, RegisterClient, Values};

/// Most time the cluster may take to serve again after the heal.
const RECOVERY_BOUND: Duration = Duration::from_secs(60);

#[derive(Clone, Debug)]
pub struct RunConfig {
    pub members: usize,
    pub register_clients: usize,
    pub watchers: usize,
    pub lockers: usize,
    /// Clients running multi-key list-append txns.
    pub txn_clients: usize,
    pub keys: usize,
    /// Keys the txns read and append to at a time.
    pub txn_keys: usize,
    pub faults: Vec<Fault>,
    /// How long the nemesis works.
    pub duration: Duration,
    pub hold: Duration,
    pub quiet: Duration,
    pub seed: u64,
    /// Planted bug: register reads are served by one member alone.
    pub serializable_reads: bool,
}

impl RunConfig {
    /// The short run of the normal suite: every fault once or so.
    pub fn short(faults: &[Fault]) -> RunConfig {
        RunConfig {
            members: 3,
            register_clients: 4,
            watchers: 2,
            lockers: 2,
            txn_clients: 2,
            keys: 3,
            txn_keys: 8,
            faults: faults.to_vec(),
            duration: Duration::from_secs(56),
            hold: Duration::from_secs(4),
            quiet: Duration::from_secs(3),
            seed: seed_from_env(),
            serializable_reads: false,
        }
    }
}

/// `CAIRN_FAULTS_SEED` when set (to replay a run's schedule), else fresh.
pub fn seed_from_env() -> u64 {
    std::env::var("CAIRN_FAULTS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen())
}

#[derive(Debug, Default)]
pub struct RunReport {
    pub seed: u64,
    pub elapsed: Duration,
    pub injected: BTreeMap<Fault, u32>,
    pub nemesis_log: Vec<String>,
    pub ops: usize,
    pub ok: usize,
    pub failed: usize,
    pub unknown: usize,
    pub lock_holds: usize,
    pub fenced_writes: usize,
    /// The clients' txns: committed, certainly not, unknown; and unknown
    /// ones a read showed committed.
    pub txn_ok: usize,
    pub txn_failed: usize,
    pub txn_unknown: usize,
    pub txn_unknown_committed: usize,
    pub watch_events: Vec<usize>,
    pub watch_reconnects: u64,
    pub watch_cancels: usize,
    /// Unknown writes the watchers showed applied, and never applied.
    pub unknown_applied: usize,
    pub unknown_never: usize,
    pub check_time: Duration,
    pub keys_checked: usize,
    /// Connections the proxies accepted, dialers they could not name, bytes.
    pub proxied_connections: u64,
    pub unknown_dialers: u64,
    pub proxied_bytes: u64,
    pub anomalies: BTreeMap<&'static str, Vec<String>>,
    pub gave_up_keys: Vec<String>,
}

impl RunReport {
    pub fn anomaly_count(&self) -> usize {
        self.anomalies.values().map(Vec::len).sum()
    }

    /// The table printed after every run, then one machine-readable line.
    pub fn table(&self) -> String {
        let mut t = String::new();
        t.push_str(&format!(
            "fault bench run: seed {} ({:.0} s; replay the schedule with CAIRN_FAULTS_SEED={})\n",
            self.seed,
            self.elapsed.as_secs_f64(),
            self.seed
        ));
        t.push_str("| fault | injected |\n|---|---|\n");
        for (f, n) in &self.injected {
            t.push_str(&format!("| {} | {n} |\n", f.name()));
        }
        t.push_str(
            "| register ops | ok | failed | unknown | unknown, watched applied | unknown, never applied |\n|---|---|---|---|---|---|\n",
        );
        t.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            self.ops, self.ok, self.failed, self.unknown, self.unknown_applied, self.unknown_never
        ));
        t.push_str(
            "| txns | ok | failed | unknown | unknown, read committed |\n|---|---|---|---|---|\n",
        );
        t.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            self.txn_ok + self.txn_failed + self.txn_unknown,
            self.txn_ok,
            self.txn_failed,
            self.txn_unknown,
            self.txn_unknown_committed
        ));
        t.push_str(&format!(
            "lock holds {}, fenced writes {}, watch events per watcher {:?}, watch reconnects {}, watch cancels {}\n",
            self.lock_holds, self.fenced_writes, self.watch_events, self.watch_reconnects, self.watch_cancels
        ));
        t.push_str(&format!(
            "proxies: {} connections, {} bytes, {} dialers unnamed; {} keys checked for linearizability; checks took {:.1} s\n",
            self.proxied_connections, self.proxied_bytes, self.unknown_dialers, self.keys_checked, self.check_time.as_secs_f64()
        ));
        t.push_str("| checker | anomalies |\n|---|---|\n");
        for (checker, found) in &self.anomalies {
            t.push_str(&format!("| {checker} | {} |\n", found.len()));
        }
        if !self.gave_up_keys.is_empty() {
            t.push_str(&format!(
                "linearizability search gave up (no verdict) on {:?}\n",
                self.gave_up_keys
            ));
        }
        for (checker, found) in &self.anomalies {
            for a in found.iter().take(5) {
                t.push_str(&format!("{checker}: {a}\n"));
            }
        }
        let machine = serde_json::json!({
            "seed": self.seed,
            "elapsed_s": self.elapsed.as_secs_f64(),
            "faults": self.injected.iter().map(|(f, n)| (f.name(), *n)).collect::<BTreeMap<_, _>>(),
            "ops": self.ops, "ok": self.ok, "failed": self.failed, "unknown": self.unknown,
            "unknown_applied": self.unknown_applied, "unknown_never": self.unknown_never,
            "check_s": self.check_time.as_secs_f64(),
            "lock_holds": self.lock_holds, "fenced_writes": self.fenced_writes,
            "txns": {
                "ok": self.txn_ok, "failed": self.txn_failed, "unknown": self.txn_unknown,
                "unknown_committed": self.txn_unknown_committed,
            },
            "watch_events": self.watch_events,
            "anomalies": self.anomalies.iter().map(|(c, a)| (*c, a.len())).collect::<BTreeMap<_, _>>(),
            "gave_up_keys": self.gave_up_keys.len(),
        });
        t.push_str(&format!("FAULT-BENCH {machine}\n"));
        t
    }
}

pub async fn run(cfg: RunConfig) -> RunReport {
    let started = Instant::now();
    let clients = cfg.register_clients + cfg.watchers + cfg.lockers + cfg.txn_clients;
    let mut bench = Bench::start(cfg.members, clients).await;
    bench.wait_writable(RECOVERY_BOUND).await;
    let mut rng = SmallRng::seed_from_u64(cfg.seed);
    let history = History::new();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();

    // Watchers start from the revision before the first register write.
    let mut observer = direct_client(&bench.cluster.members[0].endpoint()).await;
    let start_rev = observer
        .get("/bench/ready", None)
        .await
        .expect("read the start revision")
        .header()
        .map(|h| h.revision())
        .unwrap_or(0)
        + 1;
    let watch_logs: Vec<Arc<WatchLog>> = (0..cfg.watchers)
        .map(|_| Arc::new(WatchLog::default()))
        .collect();
    for (w, log) in watch_logs.iter().enumerate() {
        let c = cfg.register_clients + w;
        tasks.push(tokio::spawn(
            Watcher {
                endpoints: bench.client_endpoints(c),
                start_rev,
                first_member: w,
                log: log.clone(),
                stop: stop.clone(),
                clock: history.clone(),
            }
            .run(),
        ));
    }
    let values = Values::default();
    for c in 0..cfg.register_clients {
        tasks.push(tokio::spawn(
            RegisterClient {
                id: c,
                endpoints: bench.client_endpoints(c),
                keys: cfg.keys,
                values: values.clone(),
                history: history.clone(),
                stop: stop.clone(),
                seed: rng.gen(),
                serializable_reads: cfg.serializable_reads,
            }
            .run(),
        ));
    }
    let lock_log = Arc::new(LockLog::default());
    for l in 0..cfg.lockers {
        let c = cfg.register_clients + cfg.watchers + l;
        tasks.push(tokio::spawn(
            Locker {
                id: l,
                endpoints: bench.client_endpoints(c),
                history: history.clone(),
                log: lock_log.clone(),
                stop: stop.clone(),
                hold: Duration::from_millis(1500),
            }
            .run(),
        ));
    }
    let txn_log = Arc::new(TxnLog::default());
    let txn_keys = TxnKeys::new(cfg.txn_keys);
    // Their own generator, so the nemesis's schedule for a seed is the same
    // with or without txn clients.
    let mut txn_rng = SmallRng::seed_from_u64(cfg.seed.rotate_left(32));
    for t in 0..cfg.txn_clients {
        let c = cfg.register_clients + cfg.watchers + cfg.lockers + t;
        tasks.push(tokio::spawn(
            TxnClient {
                id: t,
                endpoints: bench.client_endpoints(c),
                keys: txn_keys.clone(),
                values: values.clone(),
                clock: history.clone(),
                log: txn_log.clone(),
                stop: stop.clone(),
                seed: txn_rng.gen(),
            }
            .run(),
        ));
    }

    let mut nemesis = Nemesis::new(SmallRng::seed_from_u64(rng.gen()));
    let until = Instant::now() + cfg.duration;
    nemesis
        .run(&mut bench, &cfg.faults, until, cfg.hold, cfg.quiet)
        .await;
    nemesis.heal(&mut bench);
    bench.wait_writable(RECOVERY_BOUND).await;
    // A quiet spell after the last heal: everyone catches up.
    tokio::time::sleep(cfg.quiet).await;
    stop.store(true, Ordering::Relaxed);
    let (watch_tasks, other_tasks): (Vec<_>, Vec<_>) = tasks
        .into_iter()
        .enumerate()
        .partition(|(i, _)| *i < cfg.watchers);
    for (_, t) in other_tasks {
        let _ = t.await;
    }

    // Durability: every acknowledged write survives kill -9 of every member.
    for m in bench.cluster.members.iter_mut() {
        m.kill9();
    }
    for m in bench.cluster.members.iter_mut() {
        m.restart();
    }
    bench.refresh_pids();
    bench.wait_writable(RECOVERY_BOUND).await;
    let final_reads = read_every_key(&bench, &history, cfg.keys).await;
    txns::read_final(&bench, &history, &txn_log, txn_keys.used(), RECOVERY_BOUND).await;

    // Watchers must reach the last revision; they stopped at the flag, so
    // run fresh ones from where each stopped.
    for (_, t) in watch_tasks {
        let _ = t.await;
    }
    let mut observer = direct_client(&bench.cluster.members[0].endpoint()).await;
    let end_rev = observer
        .put(format!("{WATCH_PREFIX}end"), "end", None)
        .await
        .expect("write the end marker")
        .header()
        .map(|h| h.revision())
        .unwrap_or(0);
    catch_up_watchers(
        &bench,
        &history,
        &watch_logs,
        cfg.register_clients,
        start_rev,
        end_rev,
    )
    .await;

    let records = history.records();
    let checks_started = Instant::now();
    let (settled, resolved, early) = watches::resolve_unknowns(&records, &watch_logs, end_rev);
    let mut report = RunReport {
        seed: cfg.seed,
        injected: nemesis.injected.clone(),
        nemesis_log: nemesis.log.clone(),
        ..RunReport::default()
    };
    (report.ok, report.failed, report.unknown) = history.counts();
    report.ops = records.len();
    let lin = linearizable::check(&settled);
    report.anomalies.insert(
        "linearizability",
        lin.violations
            .iter()
            .map(|v| {
                let s = &v.stuck_at;
                format!(
                    "{}: {} ops, {} linearized before the search could not pass client {}'s {:?} ({:.3}-{:.3} s) -> {:?}",
                    v.key,
                    v.ops,
                    v.linearized,
                    s.client,
                    s.op,
                    s.invoke_ns as f64 / 1e9,
                    s.complete_ns as f64 / 1e9,
                    s.outcome
                )
            })
            .collect(),
    );
    report.gave_up_keys = lin.gave_up;
    report.keys_checked = lin.keys;
    report
        .anomalies
        .insert("durability", lost_writes(&records, &final_reads));
    let mut watch_anomalies = watches::check(&records, &watch_logs, end_rev);
    watch_anomalies.extend(early);
    report.anomalies.insert("watch", watch_anomalies);
    report.unknown_applied = resolved.applied;
    report.unknown_never = resolved.never;
    report.anomalies.insert("lock", locks::check(&lock_log));
    let txn_verdict = elle::check(&txn_log.records());
    report
        .anomalies
        .insert("txn-serializability", txn_verdict.anomalies);
    (report.txn_ok, report.txn_failed, report.txn_unknown) = txn_log.counts();
    report.txn_unknown_committed = txn_verdict.committed_unknown;
    report.lock_holds = lock_log.holds.lock().unwrap().len();
    report.fenced_writes = lock_log.fenced.lock().unwrap().len();
    report.watch_events = watch_logs
        .iter()
        .map(|l| l.events.lock().unwrap().len())
        .collect();
    report.watch_reconnects = watch_logs
        .iter()
        .map(|l| l.reconnects.load(Ordering::Relaxed))
        .sum();
    report.watch_cancels = watch_logs
        .iter()
        .map(|l| l.cancels.lock().unwrap().len())
        .sum();
    report.proxied_connections = bench.net.accepted.load(Ordering::Relaxed);
    report.unknown_dialers = bench.net.unknown_dialers.load(Ordering::Relaxed);
    report.proxied_bytes = bench.net.relayed_bytes.load(Ordering::Relaxed);
    report.check_time = checks_started.elapsed();
    report.elapsed = started.elapsed();
    report
}

/// Reads every register key linearizably after the restart, recording the
/// reads in the history: (key, value, mod revision).
async fn read_every_key(
    bench: &Bench,
    history: &History,
    keys: usize,
) -> Vec<(String, Option<u64>, i64)> {
    let mut c = direct_client(&bench.cluster.members[0].endpoint()).await;
    let mut out = Vec::new();
    for k in 0..keys {
        let key = register_key(k);
        let deadline = Instant::now() + RECOVERY_BOUND;
        loop {
            let invoke_ns = history.now_ns();
            let read = tokio::time::timeout(
                OP_TIMEOUT,
                workload::execute(&mut c, &key, RegOp::Read, false),
            )
            .await;
            if let Ok(Ok(out_read @ RegOut::Read { value, mod_rev })) = read {
                history.push(Record {
                    client: usize::MAX,
                    key: key.clone(),
                    op: RegOp::Read,
                    invoke_ns,
                    complete_ns: history.now_ns(),
                    outcome: Outcome::Ok(out_read),
                });
                out.push((key, value, mod_rev));
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{key} unreadable after the restart\n{}",
                bench.cluster.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    out
}

/// Acknowledged writes missing after the whole cluster restarted: a key
/// whose final mod revision is below its last acknowledged write's.
fn lost_writes(records: &[Record], finals: &[(String, Option<u64>, i64)]) -> Vec<String> {
    let mut last_acked: BTreeMap<&str, i64> = BTreeMap::new();
    for r in records {
        if let Outcome::Ok(RegOut::Written { rev } | RegOut::Swapped { rev }) = r.outcome {
            let e = last_acked.entry(&r.key).or_default();
            *e = (*e).max(rev);
        }
    }
    finals
        .iter()
        .filter_map(|(key, value, mod_rev)| {
            let acked = *last_acked.get(key.as_str())?;
            (*mod_rev < acked).then(|| {
                format!("{key}: acknowledged a write at revision {acked}, after the restart it holds {value:?} from revision {mod_rev}")
            })
        })
        .collect()
}

/// Runs each watcher on until it has seen `end_rev`, from where it stopped
/// (a reconnect like any other).
async fn catch_up_watchers(
    bench: &Bench,
    clock: &History,
    logs: &[Arc<WatchLog>],
    first_client: usize,
    start_rev: i64,
    end_rev: i64,
) {
    for (w, log) in logs.iter().enumerate() {
        let stop = Arc::new(AtomicBool::new(false));
        let from = log.last_rev.load(Ordering::Relaxed).max(start_rev - 1) + 1;
        let task = tokio::spawn(
            Watcher {
                endpoints: bench.client_endpoints(first_client + w),
                start_rev: from,
                first_member: w,
                log: log.clone(),
                stop: stop.clone(),
                clock: clock.clone(),
            }
            .run(),
        );
        let deadline = Instant::now() + RECOVERY_BOUND;
        while log.last_rev.load(Ordering::Relaxed) < end_rev {
            assert!(
                Instant::now() < deadline,
                "watcher {w} never reached revision {end_rev}\n{}",
                bench.cluster.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        stop.store(true, Ordering::Relaxed);
        task.abort();
    }
}
