//! What a driver simulation checks: the clients' history on its own
//! (nothing lost in the driver, one revision per write, no stale read), and
//! against every member's store once the faults are over (every
//! acknowledged write kept at its revision, every read's value in the log,
//! the same store everywhere).

use std::collections::BTreeMap;
use std::fmt;

use bytes::Bytes;

use crate::routing::ShardId;
use crate::server::command::{ShardCommand, ShardHash, ShardStatus, REQUEST_TIMEOUT};

use super::client::{range, range_all, Answer, Call, Op, Unanswered, CLIENT_KEYS};
use super::world::World;

/// A property the real driver broke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverViolation {
    pub kind: DriverViolationKind,
    pub detail: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverViolationKind {
    /// An acknowledged put is missing from a member's store at its revision.
    LostWrite,
    /// Two acknowledged puts were given one revision.
    DuplicateRevision,
    /// A txn's puts are in the log at different revisions, or some are and
    /// some are not, or its branch there is not the one its compare chose
    /// or the one it was answered with.
    TxnTorn,
    /// One put's value is in the log at two revisions.
    AppliedTwice,
    /// Puts that did not overlap in time took revisions in the other order.
    WriteOrder,
    /// A linearizable read missed a put acknowledged before it began.
    StaleRead,
    /// A read returned a value the log does not hold at its revision.
    PhantomRead,
    /// A read over several shards at one point is not the log's state at
    /// that revision.
    CutMismatch,
    /// Two members' stores differ once they applied the same log.
    Diverged,
    /// Two members sent appends or heartbeats as leaders of one term
    /// (Raft's election safety), seen on the wire.
    TwoLeaders,
    /// A member's Raft core was told to replace an entry it had committed
    /// (its own assertion stopped the driver).
    CommittedOverwritten,
    /// Two appends showed one `(index, term)` with different data or after
    /// different terms (Raft's log matching), seen on the wire.
    LogMismatch,
    /// A leader said an index is committed with another term than an
    /// earlier leader had (Raft's state machine safety), seen on the wire.
    CommittedChanged,
    /// A leader's log lacks an entry a leader of an earlier term committed
    /// (Raft's leader completeness), seen on the wire.
    LeaderIncomplete,
    /// A running driver never answered a request.
    Unanswered,
    /// No write was acknowledged everywhere within the bound after the
    /// faults stopped.
    NoLiveness,
    /// A watch was sent a revision again, or out of order.
    WatchOrder,
    /// A watch was sent a revision at or below the one it started after:
    /// for a watch from now, its created response's header revision.
    WatchBeforeStart,
    /// A watch was never sent a revision of the log between the first and
    /// the last it was sent, or was cancelled as compacted.
    WatchGap,
    /// A watch was sent a key or value the log does not hold at its revision.
    WatchPhantom,
    /// A watch was not sent the newest revision within the bound after the
    /// faults stopped.
    WatchStalled,
    /// A shard sent a watch over several shards an event past the watch's
    /// window.
    WatchPastWindow,
    /// A lease was gone before the TTL a grant or keep-alive was answered
    /// had run from when it was sent.
    LeaseRevokedEarly,
    /// A lease no one kept alive was still held past its TTL and the
    /// liveness bound after the faults stopped.
    LeaseNotRevoked,
    /// A driver panicked or stopped by itself.
    DriverPanic,
    /// A task of the simulation panicked: a client's call (with the API
    /// layer's code it runs), a watch session, a lease client, a fault or a
    /// message on its way. What it was doing never reached the checks.
    TaskPanic,
    /// A member did not open again after a crash.
    RestartFailed,
    /// The drivers took far more real time than the simulated load needs.
    Storm,
}

impl DriverViolationKind {
    /// The kinds that mean acknowledged data or linearizability was lost, or
    /// a watch disagreed with the log: what a safety mutation of the Raft
    /// core must lead to.
    pub fn is_consensus_safety(self) -> bool {
        matches!(
            self,
            DriverViolationKind::LostWrite
                | DriverViolationKind::DuplicateRevision
                | DriverViolationKind::TxnTorn
                | DriverViolationKind::AppliedTwice
                | DriverViolationKind::WriteOrder
                | DriverViolationKind::StaleRead
                | DriverViolationKind::PhantomRead
                | DriverViolationKind::CutMismatch
                | DriverViolationKind::Diverged
                | DriverViolationKind::TwoLeaders
                | DriverViolationKind::CommittedOverwritten
                | DriverViolationKind::LogMismatch
                | DriverViolationKind::CommittedChanged
                | DriverViolationKind::LeaderIncomplete
                | DriverViolationKind::WatchOrder
                | DriverViolationKind::WatchBeforeStart
                | DriverViolationKind::WatchGap
                | DriverViolationKind::WatchPhantom
        )
    }
}

impl fmt::Display for DriverViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.detail)
    }
}

/// A driver that panicked or stopped: the Raft core's assertion that a
/// committed entry is never replaced means the group lost a committed write;
/// any other panic is a driver fault.
pub fn driver_stopped(detail: String) -> DriverViolation {
    let kind = if detail.contains("conflicts with committed entry") {
        DriverViolationKind::CommittedOverwritten
    } else {
        DriverViolationKind::DriverPanic
    };
    violation(kind, detail)
}

pub fn violation(kind: DriverViolationKind, detail: impl Into<String>) -> DriverViolation {
    DriverViolation {
        kind,
        detail: detail.into(),
    }
}

/// The acknowledged puts and txns, by revision.
fn acknowledged(calls: &[Call]) -> Result<BTreeMap<i64, &Call>, DriverViolation> {
    let mut by_revision = BTreeMap::new();
    for c in calls {
        if let Some((revision, _)) = c.acknowledged() {
            if let Some(other) = by_revision.insert(revision, c) {
                return Err(violation(
                    DriverViolationKind::DuplicateRevision,
                    format!(
                        "{:?} and {:?} were both acknowledged at revision {revision}",
                        other.op, c.op
                    ),
                ));
            }
        }
    }
    Ok(by_revision)
}

/// The checks the history alone decides.
pub fn check_history(calls: &[Call]) -> Result<(), DriverViolation> {
    if let Some(c) = calls
        .iter()
        .find(|c| matches!(c.answer, Answer::Unanswered))
    {
        return Err(violation(
            DriverViolationKind::Unanswered,
            format!("member {} never answered {:?}", c.member, c.op),
        ));
    }
    acknowledged(calls)?;
    for read in calls {
        let (Op::Read { key }, Answer::Read { mod_revision, .. }) = (&read.op, &read.answer) else {
            continue;
        };
        let newest_before = calls
            .iter()
            .filter(|w| w.end < read.start)
            .filter_map(|w| {
                let (revision, writes) = w.acknowledged()?;
                writes.iter().any(|(k, _)| *k == key).then_some(revision)
            })
            .max();
        if let Some(newest) = newest_before.filter(|n| n > mod_revision) {
            return Err(violation(
                DriverViolationKind::StaleRead,
                format!(
                    "a linearizable read of {key:?} through member {} saw mod revision \
                     {mod_revision}, but a put of it was acknowledged at {newest} before the \
                     read began",
                    read.member
                ),
            ));
        }
    }
    Ok(())
}

/// Member `id`'s status of shard 0.
pub async fn status(world: &World, id: u64) -> Result<ShardStatus, String> {
    status_of(world, id, 0).await
}

/// Member `id`'s status of `shard`.
pub async fn status_of(world: &World, id: u64, shard: ShardId) -> Result<ShardStatus, String> {
    world
        .ask_shard(id, shard, REQUEST_TIMEOUT * 2, |reply| {
            ShardCommand::Status { reply }
        })
        .await
        .map_err(|e| e.to_string())
}

/// The last revision that changed a key, as member `id`'s stores hold it.
/// With one shard, its revision (every entry that moves it changes a key).
/// With several, the highest mod revision of any key of any shard: a
/// shard's revision also moves on the keyspace leader's closes, which
/// change no key, and the clients only put (no key is deleted).
pub async fn last_change(world: &World, id: u64) -> Result<i64, String> {
    if world.shards() == 1 {
        return Ok(status(world, id).await?.revision);
    }
    let mut last = 0;
    for shard in world.routing.shard_ids() {
        let commands = world
            .commands_of(id, shard)
            .ok_or_else(|| format!("member {id} is not running"))?;
        let newest = status_of(world, id, shard).await?.revision;
        let keys = range_all(&commands, newest)
            .await
            .map_err(|e| format!("member {id}, shard {shard}: {e:?}"))?;
        last = keys.iter().map(|kv| kv.mod_revision).fold(last, i64::max);
    }
    Ok(last)
}

/// One change of a key: put to a value, or deleted (None).
pub type Change = (Bytes, Option<Bytes>);
/// Each revision that changed keys, with its changes in key order.
pub type Log = BTreeMap<i64, Vec<Change>>;

/// The checks against the members' stores, once every member has applied
/// the same log; answers the log.
pub async fn check_stores(world: &World, calls: &[Call]) -> Result<Log, DriverViolation> {
    let by_revision = acknowledged(calls)?;
    let ids = world.ids();
    let not_running = |id| {
        violation(
            DriverViolationKind::NoLiveness,
            format!("member {id} is not running"),
        )
    };
    for &id in &ids {
        for (&revision, call) in &by_revision {
            let (_, writes) = call.acknowledged().expect("acknowledged");
            for (key, value) in writes {
                let commands = world.commands_for(id, key).ok_or_else(|| not_running(id))?;
                let found = stored(&commands, key, revision).await;
                if holds(&found) != Some((value, revision)) {
                    return Err(violation(
                        DriverViolationKind::LostWrite,
                        format!(
                            "put {key:?}={value:?} was acknowledged at revision {revision}; \
                             member {id} holds {found:?} there"
                        ),
                    ));
                }
            }
        }
    }
    for read in calls {
        let (
            Op::Read { key },
            Answer::Read {
                value,
                mod_revision,
            },
        ) = (&read.op, &read.answer)
        else {
            continue;
        };
        if *mod_revision == 0 {
            continue;
        }
        let first = world
            .commands_for(ids[0], key)
            .ok_or_else(|| not_running(ids[0]))?;
        let found = stored(&first, key, *mod_revision).await;
        if holds(&found) != Some((value, *mod_revision)) {
            return Err(violation(
                DriverViolationKind::PhantomRead,
                format!(
                    "a read of {key:?} through member {} returned {value:?} at mod revision \
                     {mod_revision}; the log holds {found:?} there",
                    read.member
                ),
            ));
        }
    }
    let log = if world.shards() == 1 {
        read_log(world, ids[0]).await?
    } else {
        read_key_histories(world, ids[0]).await?
    };
    check_order(&log, calls)?;
    for shard in world.routing.shard_ids() {
        check_same_stores(world, &ids, shard).await?;
    }
    Ok(log)
}

/// Every member's store of `shard` hashes the same. With one shard, at each
/// member's newest revision; with several, at the oldest of the members'
/// newest revisions (the keyspace leader's closes of an idle shard move
/// its revision with no change of a key, and may still be applying).
async fn check_same_stores(
    world: &World,
    ids: &[u64],
    shard: ShardId,
) -> Result<(), DriverViolation> {
    let unreadable = |e: String| violation(DriverViolationKind::NoLiveness, e);
    let mut revision = 0;
    if world.shards() > 1 {
        revision = i64::MAX;
        for &id in ids {
            let s = status_of(world, id, shard).await.map_err(unreadable)?;
            revision = revision.min(s.revision);
        }
    }
    let mut hashes: Vec<(u64, ShardHash)> = Vec::new();
    for &id in ids {
        let hash = world
            .ask_shard(id, shard, REQUEST_TIMEOUT * 2, |reply| {
                ShardCommand::HashKv { revision, reply }
            })
            .await
            .map_err(|e| unreadable(e.to_string()))?;
        hashes.push((id, hash));
    }
    let (first_id, first_hash) = &hashes[0];
    for (id, hash) in &hashes[1..] {
        if (hash.hash, hash.revision) != (first_hash.hash, first_hash.revision) {
            return Err(violation(
                DriverViolationKind::Diverged,
                format!(
                    "shard {shard}: member {first_id}'s store hashes to {:#x} at revision {}, \
                     member {id}'s to {:#x} at {}",
                    first_hash.hash, first_hash.revision, hash.hash, hash.revision
                ),
            ));
        }
    }
    Ok(())
}

/// The value and mod revision a member's store holds for `key` at
/// `revision`, or why it could not be read.
async fn stored(
    commands: &tokio::sync::mpsc::Sender<ShardCommand>,
    key: &Bytes,
    revision: i64,
) -> Result<Option<(Bytes, i64)>, String> {
    match range(commands, key, revision, true).await {
        Ok(kv) => Ok(kv.map(|kv| (kv.value, kv.mod_revision))),
        Err(Unanswered::Error(e)) => Err(e),
        Err(Unanswered::No) => Err("no answer".into()),
    }
}

fn holds(found: &Result<Option<(Bytes, i64)>, String>) -> Option<(&Bytes, i64)> {
    found.as_ref().ok()?.as_ref().map(|(v, r)| (v, *r))
}

/// The log of several shards as member `id`'s stores hold it, from each
/// key's history: its value now, then at the revision before each mod
/// revision found, back to its first. Revisions of several shards are
/// sparse (each keyspace leader's start above `epoch << 40`), so they are
/// not read one by one; with several shards the clients only put (no
/// leases, whose end deletes), so a key's history has no gap.
async fn read_key_histories(world: &World, id: u64) -> Result<Log, DriverViolation> {
    let unreadable = |e: String| violation(DriverViolationKind::NoLiveness, e);
    let mut log = Log::new();
    for shard in world.routing.shard_ids() {
        let commands = world
            .commands_of(id, shard)
            .ok_or_else(|| unreadable(format!("member {id} is not running")))?;
        let newest = status_of(world, id, shard)
            .await
            .map_err(unreadable)?
            .revision;
        let keys = range_all(&commands, newest)
            .await
            .map_err(|e| unreadable(format!("{e:?}")))?;
        for kv in keys {
            let mut at = newest;
            while at > 0 {
                let found = stored(&commands, &kv.key, at).await.map_err(unreadable)?;
                let Some((value, mod_revision)) = found else {
                    break;
                };
                log.entry(mod_revision)
                    .or_default()
                    .push((kv.key.clone(), Some(value)));
                at = mod_revision - 1;
            }
        }
    }
    for changes in log.values_mut() {
        changes.sort();
    }
    Ok(log)
}

/// The log as member `id`'s store holds it: the revisions that changed a
/// key, each with its changes, read revision by revision (nothing compacts
/// the stores here).
async fn read_log(world: &World, id: u64) -> Result<Log, DriverViolation> {
    let unreadable = |e: String| violation(DriverViolationKind::NoLiveness, e);
    let commands = world
        .commands(id)
        .ok_or_else(|| unreadable(format!("member {id} is not running")))?;
    let newest = status(world, id).await.map_err(unreadable)?.revision;
    let mut log = Log::new();
    let mut before: BTreeMap<Bytes, i64> = BTreeMap::new();
    for revision in 1..=newest {
        let kvs = range_all(&commands, revision)
            .await
            .map_err(|e| unreadable(format!("{e:?}")))?;
        let mut changes: Vec<Change> = Vec::new();
        let mut now = BTreeMap::new();
        for kv in kvs {
            if kv.mod_revision == revision {
                changes.push((kv.key.clone(), Some(kv.value)));
            }
            now.insert(kv.key, kv.mod_revision);
        }
        changes.extend(
            before
                .keys()
                .filter(|k| !now.contains_key(*k))
                .map(|k| (k.clone(), None)),
        );
        if !changes.is_empty() {
            changes.sort();
            log.insert(revision, changes);
        }
        before = now;
    }
    Ok(log)
}

/// Every key's value as of `revision`, from the log.
fn state_at(log: &Log, revision: i64) -> BTreeMap<&Bytes, &Bytes> {
    let mut state = BTreeMap::new();
    for (key, value) in log.range(..=revision).flat_map(|(_, changes)| changes) {
        match value {
            Some(v) => state.insert(key, v),
            None => state.remove(key),
        };
    }
    state
}

/// Every read over several shards is the log's state of the client keys at
/// its read point, and that point is at or above every write acknowledged
/// before the read began and below every one that began after it ended.
fn check_cuts(log: &Log, calls: &[Call]) -> Result<(), DriverViolation> {
    for read in calls {
        let Answer::ReadAll { revision, kvs } = &read.answer else {
            continue;
        };
        let mut state = state_at(log, *revision);
        state.retain(|k, _| (&CLIENT_KEYS.0..&CLIENT_KEYS.1).contains(k));
        let seen: BTreeMap<&Bytes, &Bytes> = kvs.iter().map(|(k, v)| (k, v)).collect();
        if seen != state {
            return Err(violation(
                DriverViolationKind::CutMismatch,
                format!(
                    "a read over every shard through member {} at revision {revision} saw \
                     {seen:?}; the log holds {state:?} there",
                    read.member
                ),
            ));
        }
        for w in calls {
            let Some((r, _)) = w.acknowledged() else {
                continue;
            };
            if (w.end < read.start && r > *revision) || (w.start > read.end && r <= *revision) {
                return Err(violation(
                    DriverViolationKind::StaleRead,
                    format!(
                        "a read over every shard through member {} at revision {revision} and \
                         {:?} acknowledged at {r} ({}) overlap no instant",
                        read.member,
                        w.op,
                        if r > *revision {
                            "before the read began"
                        } else {
                            "begun after the read ended"
                        }
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Every txn, answered or not, is in the log whole at one revision with
/// one branch, or not at all; the branch is the one its compare chose on
/// the log just before that revision, and the one it was answered with
/// (`revision_of`: each value's revision in the log).
fn check_txns_whole(
    log: &Log,
    revision_of: &BTreeMap<&Bytes, i64>,
    calls: &[Call],
) -> Result<(), DriverViolation> {
    let torn = |c: &Call, why: String| {
        violation(
            DriverViolationKind::TxnTorn,
            format!(
                "a txn through member {} answered {:?}: {why}: {:?}",
                c.member, c.answer, c.op
            ),
        )
    };
    for c in calls {
        let Op::Txn {
            compare,
            success,
            failure,
        } = &c.op
        else {
            continue;
        };
        let at = |puts: &[(Bytes, Bytes)]| -> Vec<Option<i64>> {
            puts.iter()
                .map(|(_, v)| revision_of.get(v).copied())
                .collect()
        };
        let (s, f) = (at(success), at(failure));
        let whole = |r: &[Option<i64>]| r.iter().all(|x| *x == r[0]) && r[0].is_some();
        let absent = |r: &[Option<i64>]| r.iter().all(|x| x.is_none());
        let taken = if whole(&s) && absent(&f) {
            Some((true, s[0].expect("whole")))
        } else if !f.is_empty() && whole(&f) && absent(&s) {
            Some((false, f[0].expect("whole")))
        } else if absent(&s) && absent(&f) {
            None
        } else {
            return Err(torn(
                c,
                format!("its puts are at revisions {s:?} and {f:?} (None: not in the log)"),
            ));
        };
        let Some((succeeded, revision)) = taken else {
            continue;
        };
        if let Answer::Txn {
            succeeded: answered,
            ..
        } = c.answer
        {
            if answered != succeeded {
                return Err(torn(
                    c,
                    format!("the log has the other branch at revision {revision}"),
                ));
            }
        }
        if let Some((key, value)) = compare {
            let before = state_at(log, revision - 1).get(key).copied();
            if (before == Some(value)) != succeeded {
                return Err(torn(
                    c,
                    format!(
                        "its compare saw {before:?} before revision {revision}, and the log has \
                         the {} branch",
                        if succeeded { "success" } else { "failure" }
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The log's writes, revision by revision, against the clients' history:
/// each value written once; puts that did not overlap in time ordered as
/// they happened; each read's value written by a put that began before the
/// read ended, and no older than what an earlier read of the key saw.
fn check_order(log: &Log, calls: &[Call]) -> Result<(), DriverViolation> {
    let mut revision_of: BTreeMap<&Bytes, i64> = BTreeMap::new();
    let puts = log
        .iter()
        .flat_map(|(r, changes)| changes.iter().map(move |c| (*r, c)))
        .filter_map(|(r, (key, value))| Some((r, key, value.as_ref()?)));
    for (revision, key, value) in puts {
        if let Some(first) = revision_of.insert(value, revision) {
            return Err(violation(
                DriverViolationKind::AppliedTwice,
                format!("{key:?}={value:?} is in the log at revisions {first} and {revision}"),
            ));
        }
    }
    check_txns_whole(log, &revision_of, calls)?;
    check_cuts(log, calls)?;
    let put_of = |value: &Bytes| {
        calls
            .iter()
            .find(|c| c.op.puts().iter().any(|(_, v)| *v == value))
    };
    let acked: Vec<(&Call, i64)> = calls
        .iter()
        .filter_map(|c| Some((c, c.acknowledged()?.0)))
        .collect();
    for (a, ra) in &acked {
        if let Some((b, rb)) = acked.iter().find(|(b, rb)| a.end < b.start && rb <= ra) {
            return Err(violation(
                DriverViolationKind::WriteOrder,
                format!(
                    "{:?} was acknowledged at revision {ra} before {:?} began, which got \
                     revision {rb}",
                    a.op, b.op
                ),
            ));
        }
    }
    let reads: Vec<(&Call, &Bytes, &Bytes, i64)> = calls
        .iter()
        .filter_map(|c| match (&c.op, &c.answer) {
            (
                Op::Read { key },
                Answer::Read {
                    value,
                    mod_revision,
                },
            ) => Some((c, key, value, *mod_revision)),
            _ => None,
        })
        .collect();
    for (read, key, value, seen) in &reads {
        if *seen > 0 {
            match put_of(value) {
                Some(put) if put.start < read.end => {}
                other => {
                    return Err(violation(
                        DriverViolationKind::StaleRead,
                        format!(
                            "a read of {key:?} through member {} saw {value:?}, written by \
                             {other:?}, which had not begun when the read ended",
                            read.member
                        ),
                    ))
                }
            }
        }
        if let Some((earlier, _, _, newer)) = reads
            .iter()
            .find(|(r, k, _, m)| k == key && r.end < read.start && m > seen)
        {
            return Err(violation(
                DriverViolationKind::StaleRead,
                format!(
                    "a read of {key:?} through member {} saw mod revision {seen} after a \
                     read through member {} had seen {newer}",
                    read.member, earlier.member
                ),
            ));
        }
    }
    Ok(())
}
