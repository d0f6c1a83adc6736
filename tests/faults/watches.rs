//! Watchers over the register prefix, and the check of what they saw.
//!
//! A watcher records every event with its revision. After an error, the end
//! of its stream, or a silence longer than [`WATCH_IDLE`] (its member cut off
//! or stopped), it reconnects to the next member from its last revision + 1,
//! as etcd's clients resume. Afterwards every watcher must have seen every
//! acknowledged write exactly once, in revision order, no event of a write
//! known not to have happened, and all watchers the same sequence.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{EventType, WatchOptions};

use super::cluster::{stream_client, OP_TIMEOUT};
use super::history::{History, Outcome, Record, RegOp, RegOut};

/// Silence after which a watcher tries another member.
const WATCH_IDLE: Duration = Duration::from_secs(3);

pub const WATCH_PREFIX: &str = "/reg/";

/// One event as a watcher saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub rev: i64,
    pub key: String,
    /// None for a delete.
    pub value: Option<Vec<u8>>,
    /// When the watcher received it (the write had taken effect by then).
    pub at_ns: u64,
}

#[derive(Default)]
pub struct WatchLog {
    pub events: Mutex<Vec<Seen>>,
    pub last_rev: AtomicI64,
    pub reconnects: AtomicU64,
    /// Cancellations the server sent, with their reasons.
    pub cancels: Mutex<Vec<String>>,
}

pub struct Watcher {
    pub endpoints: Vec<String>,
    pub start_rev: i64,
    pub first_member: usize,
    pub log: Arc<WatchLog>,
    pub stop: Arc<AtomicBool>,
    pub clock: History,
}

impl Watcher {
    pub async fn run(self) {
        let mut at = self.first_member % self.endpoints.len();
        let mut next_rev = self.start_rev;
        while !self.stop.load(Ordering::Relaxed) {
            let mut c = stream_client(&self.endpoints[at]).await;
            let options = WatchOptions::new()
                .with_prefix()
                .with_start_revision(next_rev);
            if let Ok(Ok(mut stream)) =
                tokio::time::timeout(OP_TIMEOUT, c.watch(WATCH_PREFIX, Some(options))).await
            {
                while !self.stop.load(Ordering::Relaxed) {
                    let msg = match tokio::time::timeout(WATCH_IDLE, stream.message()).await {
                        Ok(Ok(Some(msg))) => msg,
                        _ => break,
                    };
                    if msg.canceled() {
                        self.log
                            .cancels
                            .lock()
                            .unwrap()
                            .push(msg.cancel_reason().to_string());
                        break;
                    }
                    let at_ns = self.clock.now_ns();
                    let mut events = self.log.events.lock().unwrap();
                    for e in msg.events() {
                        let Some(kv) = e.kv() else { continue };
                        events.push(Seen {
                            rev: kv.mod_revision(),
                            key: String::from_utf8_lossy(kv.key()).into_owned(),
                            value: (e.event_type() == EventType::Put).then(|| kv.value().to_vec()),
                            at_ns,
                        });
                        next_rev = next_rev.max(kv.mod_revision() + 1);
                        self.log
                            .last_rev
                            .fetch_max(kv.mod_revision(), Ordering::Relaxed);
                    }
                }
            }
            if self.stop.load(Ordering::Relaxed) {
                break;
            }
            self.log.reconnects.fetch_add(1, Ordering::Relaxed);
            at = (at + 1) % self.endpoints.len();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A watcher's events as (revision, key, value), for comparing watchers.
type Sequence = Vec<(i64, String, Option<Vec<u8>>)>;

/// What the watchers' events say of the writes whose outcome was unknown.
#[derive(Debug, Default)]
pub struct Resolved {
    pub applied: usize,
    pub never: usize,
}

/// Settles unknown writes with the watchers' events, as etcd's robustness
/// tests do: once every watcher has reached a revision committed after the
/// whole cluster restarted, no older write can still commit, so a value no
/// watcher saw was never written, and one seen at revision `r` took effect
/// at `r`, before the first watcher received it. Unknown writes never
/// applied leave the history; applied ones become known writes. A value seen
/// before its write was invoked is an anomaly (returned) and stays unknown.
pub fn resolve_unknowns(
    records: &[Record],
    watchers: &[Arc<WatchLog>],
    end_rev: i64,
) -> (Vec<Record>, Resolved, Vec<String>) {
    let mut seen: HashMap<(String, u64), (i64, u64)> = HashMap::new();
    for log in watchers {
        for e in log
            .events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.rev <= end_rev)
        {
            let value = e
                .value
                .as_deref()
                .and_then(|v| std::str::from_utf8(v).ok())
                .and_then(|v| v.parse::<u64>().ok());
            if let Some(value) = value {
                let entry = seen
                    .entry((e.key.clone(), value))
                    .or_insert((e.rev, e.at_ns));
                entry.1 = entry.1.min(e.at_ns);
            }
        }
    }
    let mut resolved = Resolved::default();
    let mut anomalies = Vec::new();
    let mut out = Vec::with_capacity(records.len());
    for r in records {
        if r.outcome != Outcome::Unknown {
            out.push(r.clone());
            continue;
        }
        let Some(written) = r.op.written() else {
            continue;
        };
        match seen.get(&(r.key.clone(), written)) {
            None => resolved.never += 1,
            Some(&(_, at_ns)) if at_ns < r.invoke_ns => {
                anomalies.push(format!(
                    "{}={written} was watched at {at_ns} ns, before its write was invoked at {} ns",
                    r.key, r.invoke_ns
                ));
                out.push(r.clone());
            }
            Some(&(rev, at_ns)) => {
                resolved.applied += 1;
                let known = match r.op {
                    RegOp::Write(_) => RegOut::Written { rev },
                    _ => RegOut::Swapped { rev },
                };
                out.push(Record {
                    complete_ns: at_ns,
                    outcome: Outcome::Ok(known),
                    ..r.clone()
                });
            }
        }
    }
    (out, resolved, anomalies)
}

/// Judges every watcher's events against the history of the register
/// operations (up to `end_rev`, the revision every watcher reached).
pub fn check(history: &[Record], watchers: &[Arc<WatchLog>], end_rev: i64) -> Vec<String> {
    let mut anomalies = Vec::new();
    // Acknowledged writes by revision, and values known never written.
    let mut acked: BTreeMap<i64, (String, u64)> = BTreeMap::new();
    let mut attempted: HashSet<(String, u64)> = HashSet::new();
    let mut never: HashSet<(String, u64)> = HashSet::new();
    for r in history {
        let Some(value) = r.op.written() else {
            continue;
        };
        attempted.insert((r.key.clone(), value));
        match r.outcome {
            Outcome::Ok(RegOut::Written { rev } | RegOut::Swapped { rev }) => {
                acked.insert(rev, (r.key.clone(), value));
            }
            Outcome::Ok(RegOut::Missed { .. }) => {
                never.insert((r.key.clone(), value));
            }
            _ => {}
        }
    }
    let mut first: Option<Sequence> = None;
    for (w, log) in watchers.iter().enumerate() {
        let events: Vec<Seen> = log
            .events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.rev <= end_rev)
            .cloned()
            .collect();
        let mut by_rev: HashMap<i64, &Seen> = HashMap::new();
        for pair in events.windows(2) {
            if pair[1].rev <= pair[0].rev {
                anomalies.push(format!(
                    "watcher {w}: revision {} after {} (duplicate or out of order)",
                    pair[1].rev, pair[0].rev
                ));
            }
        }
        for e in &events {
            by_rev.insert(e.rev, e);
            if e.key.starts_with("/reg/") && e.key.len() == "/reg/00".len() {
                let value = e
                    .value
                    .as_deref()
                    .and_then(|v| std::str::from_utf8(v).ok())
                    .and_then(|v| v.parse::<u64>().ok());
                let Some(value) = value else {
                    anomalies.push(format!("watcher {w}: event {e:?} holds no written value"));
                    continue;
                };
                let id = (e.key.clone(), value);
                if !attempted.contains(&id) {
                    anomalies.push(format!("watcher {w}: event {e:?} of a value nobody wrote"));
                }
                if never.contains(&id) {
                    anomalies.push(format!(
                        "watcher {w}: event {e:?} of a CAS that answered it did not write"
                    ));
                }
            }
        }
        for (rev, (key, value)) in &acked {
            let want = Some(value.to_string().into_bytes());
            match by_rev.get(rev) {
                Some(e) if e.key == *key && e.value == want => {}
                Some(e) => anomalies.push(format!(
                    "watcher {w}: revision {rev} is {e:?}, but the write of {key}={value} was acknowledged at it"
                )),
                None => anomalies.push(format!(
                    "watcher {w}: missed the acknowledged write {key}={value} at revision {rev}"
                )),
            }
        }
        let events: Sequence = events
            .into_iter()
            .map(|e| (e.rev, e.key, e.value))
            .collect();
        match &first {
            None => first = Some(events),
            Some(f) if *f != events => anomalies.push(format!(
                "watcher {w} saw {} events, watcher 0 {}; they differ",
                events.len(),
                f.len()
            )),
            Some(_) => {}
        }
    }
    anomalies
}

#[cfg(test)]
mod tests {
    //! Guards the watch check against missing a gap, a duplicate, a
    //! reordering or a phantom event, and against false alarms.

    use super::*;

    fn write(key: &str, v: u64, rev: i64) -> Record {
        Record {
            client: 0,
            key: key.into(),
            op: RegOp::Write(v),
            invoke_ns: 0,
            complete_ns: 1,
            outcome: Outcome::Ok(RegOut::Written { rev }),
        }
    }
    fn seen(key: &str, v: u64, rev: i64) -> Seen {
        Seen {
            rev,
            key: key.into(),
            value: Some(v.to_string().into_bytes()),
            at_ns: 2,
        }
    }
    fn log(events: Vec<Seen>) -> Arc<WatchLog> {
        let l = WatchLog::default();
        *l.events.lock().unwrap() = events;
        Arc::new(l)
    }

    #[test]
    fn unknown_writes_are_settled_by_what_was_watched() {
        let unknown = |v: u64, invoke_ns: u64| Record {
            client: 1,
            key: "/reg/00".into(),
            op: RegOp::Write(v),
            invoke_ns,
            complete_ns: u64::MAX,
            outcome: Outcome::Unknown,
        };
        let h = [
            write("/reg/00", 1, 5),
            unknown(2, 1),
            unknown(3, 1),
            unknown(4, 9),
        ];
        let events = vec![
            seen("/reg/00", 1, 5),
            seen("/reg/00", 2, 6),
            seen("/reg/00", 4, 7),
        ];
        let (settled, resolved, early) = resolve_unknowns(&h, &[log(events)], 7);
        assert_eq!((resolved.applied, resolved.never), (1, 1));
        assert_eq!(
            settled.len(),
            3,
            "the write never applied leaves: {settled:?}"
        );
        assert_eq!(settled[1].outcome, Outcome::Ok(RegOut::Written { rev: 6 }));
        assert_eq!(
            settled[1].complete_ns, 2,
            "it took effect by the time it was watched"
        );
        // Value 4 was watched (at 2 ns) before its write was invoked (9 ns).
        assert_eq!(early.len(), 1, "{early:?}");
        assert_eq!(settled[2].outcome, Outcome::Unknown);
    }

    #[test]
    fn complete_ordered_streams_pass() {
        let h = [write("/reg/00", 1, 5), write("/reg/01", 2, 6)];
        let events = vec![seen("/reg/00", 1, 5), seen("/reg/01", 2, 6)];
        assert!(check(&h, &[log(events.clone()), log(events)], 6).is_empty());
    }

    #[test]
    fn gaps_duplicates_reorders_and_phantoms_are_caught() {
        let h = [write("/reg/00", 1, 5), write("/reg/01", 2, 6)];
        let gap = check(&h, &[log(vec![seen("/reg/01", 2, 6)])], 6);
        assert!(gap.iter().any(|a| a.contains("missed")), "{gap:?}");
        let dup = vec![
            seen("/reg/00", 1, 5),
            seen("/reg/00", 1, 5),
            seen("/reg/01", 2, 6),
        ];
        let dup = check(&h, &[log(dup)], 6);
        assert!(dup.iter().any(|a| a.contains("duplicate")), "{dup:?}");
        let reorder = vec![seen("/reg/01", 2, 6), seen("/reg/00", 1, 5)];
        let reorder = check(&h, &[log(reorder)], 6);
        assert!(
            reorder.iter().any(|a| a.contains("out of order")),
            "{reorder:?}"
        );
        let phantom = vec![
            seen("/reg/00", 1, 5),
            seen("/reg/01", 2, 6),
            seen("/reg/01", 9, 7),
        ];
        let phantom = check(&h, &[log(phantom)], 7);
        assert!(
            phantom.iter().any(|a| a.contains("nobody wrote")),
            "{phantom:?}"
        );
    }
}
