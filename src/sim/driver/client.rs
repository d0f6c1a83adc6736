//! The simulated clients: puts and linearizable reads of a few keys, sent
//! to any running member's driver of the key's shard as the API layer sends
//! them (with several shards also reads of every key at one read point and
//! txns, over several shards through the keyspace layer), and the history
//! of what each was answered. The reads are in `reads`.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use cairn_proto::cairnpb::shard_request;
use cairn_proto::etcdserverpb as pb;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::server::command::{ShardCommand, WriteResult, REQUEST_TIMEOUT};
use crate::server::errors::ApiError;
use crate::server::keyspace::cross_txn;
use crate::server::shard::LEADERLESS_WAIT;

use super::world::World;

mod reads;

pub(super) use reads::CLIENT_KEYS;
use reads::{read, read_all};

/// Keys the clients write and read: few, so that reads and writes meet.
pub const KEYS: u32 = 8;

/// What a client asked.
#[derive(Debug, Clone)]
pub enum Op {
    Put {
        key: Bytes,
        value: Bytes,
    },
    Read {
        key: Bytes,
    },
    /// A linearizable read of every client key, over every shard at one
    /// read point (several shards only): a range, or (`by_txn`: Some(lag))
    /// etcd's read-only txn of a compare on every client key's mod revision
    /// (all at least `lag` below the read point's) and that range on both
    /// branches, read over the shards as the API layer reads one.
    ReadAll {
        by_txn: Option<i64>,
    },
    /// A txn (several shards only): if `compare`'s key holds its value
    /// (or with no compare), the puts of `success`, else those of
    /// `failure`; each branch puts distinct keys, and the txn runs over
    /// several shards when its keys' shards differ.
    Txn {
        compare: Option<(Bytes, Bytes)>,
        success: Vec<(Bytes, Bytes)>,
        failure: Vec<(Bytes, Bytes)>,
    },
}

impl Op {
    /// Every key and value it may write.
    pub fn puts(&self) -> Vec<(&Bytes, &Bytes)> {
        match self {
            Op::Put { key, value } => vec![(key, value)],
            Op::Read { .. } | Op::ReadAll { .. } => Vec::new(),
            Op::Txn {
                success, failure, ..
            } => success.iter().chain(failure).map(|(k, v)| (k, v)).collect(),
        }
    }
}

impl Call {
    /// What it was acknowledged to have written, and at which revision.
    pub fn acknowledged(&self) -> Option<(i64, Vec<(&Bytes, &Bytes)>)> {
        match (&self.op, &self.answer) {
            (Op::Put { key, value }, Answer::Put { revision }) => {
                Some((*revision, vec![(key, value)]))
            }
            (
                Op::Txn {
                    success, failure, ..
                },
                Answer::Txn {
                    revision,
                    succeeded,
                },
            ) => {
                let branch = if *succeeded { success } else { failure };
                Some((*revision, branch.iter().map(|(k, v)| (k, v)).collect()))
            }
            _ => None,
        }
    }
}

/// Most keys a txn puts.
const MAX_TXN_KEYS: u32 = 3;

/// What it was answered.
#[derive(Debug, Clone)]
pub enum Answer {
    /// The put was applied at this revision.
    Put { revision: i64 },
    /// The txn was applied at this revision, with the branch its compare
    /// chose.
    Txn { revision: i64, succeeded: bool },
    /// The key's value and mod revision (0: no such key).
    Read { value: Bytes, mod_revision: i64 },
    /// The read point's revision, and every key's value there.
    ReadAll {
        revision: i64,
        kvs: Vec<(Bytes, Bytes)>,
    },
    /// An error: the write may or may not have taken effect.
    Failed(String),
    /// No answer at all from a driver that kept running: a lost request.
    Unanswered,
}

/// One operation, from when it was sent to when it was answered.
#[derive(Debug, Clone)]
pub struct Call {
    pub member: u64,
    pub op: Op,
    pub start: Instant,
    pub end: Instant,
    pub answer: Answer,
}

pub type History = Rc<RefCell<Vec<Call>>>;

fn key(n: u32) -> Bytes {
    Bytes::from(format!("k{n}"))
}

/// Sends client operations until `stop`, one every few milliseconds, each to
/// a running member picked at random; answers land in `history`.
pub async fn run_clients(world: Rc<World>, history: History, until: Instant) {
    let mut next_value = 0u64;
    // Calls sent, to name one.
    let mut calls = 0u64;
    // The last value each key was sent, for the txns' compares.
    let mut last_sent: std::collections::BTreeMap<Bytes, Bytes> = Default::default();
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_micros(world.gen_range(200..4_000))).await;
        let Some(member) = world.pick_up() else {
            continue;
        };
        // Txns only with several shards, where most span some; the draw
        // is not made with one shard, whose seeds run as they always did.
        let txn = world.shards() > 1 && !world.txns_paused.get() && world.chance(200);
        let op = if txn {
            // Half compare a key with the last value it was sent: true
            // when no write of it since was applied.
            let compare = world
                .chance(500)
                .then(|| key(world.gen_range(0..KEYS)))
                .and_then(|k| Some((k.clone(), last_sent.get(&k)?.clone())));
            let mut branch = || {
                let want = world.gen_range(1..=MAX_TXN_KEYS);
                let mut keys: Vec<u32> = Vec::new();
                while keys.len() < want as usize {
                    let k = world.gen_range(0..KEYS);
                    if !keys.contains(&k) {
                        keys.push(k);
                    }
                }
                keys.into_iter()
                    .map(|k| {
                        next_value += 1;
                        (key(k), Bytes::from(format!("v{next_value}")))
                    })
                    .collect::<Vec<_>>()
            };
            let success = branch();
            let failure = if compare.is_some() {
                branch()
            } else {
                Vec::new()
            };
            for (k, v) in success.iter().chain(&failure) {
                last_sent.insert(k.clone(), v.clone());
            }
            Op::Txn {
                compare,
                success,
                failure,
            }
        } else if world.chance(500) {
            next_value += 1;
            let (k, v) = (
                key(world.gen_range(0..KEYS)),
                Bytes::from(format!("v{next_value}")),
            );
            last_sent.insert(k.clone(), v.clone());
            Op::Put { key: k, value: v }
        } else if world.shards() > 1 && world.chance(200) {
            // Every other one through a txn, its compare's lag 1 to 4.
            Op::ReadAll {
                by_txn: (calls % 2 == 1).then(|| 1 + (calls / 2 % 4) as i64),
            }
        } else {
            Op::Read {
                key: key(world.gen_range(0..KEYS)),
            }
        };
        calls += 1;
        let n = calls;
        let what = {
            let op = op.clone();
            move || format!("the clients' call {n} through member {member}, {op:?},")
        };
        let history = history.clone();
        let task = {
            let world = world.clone();
            async move {
                let Some(call) = call(&world, member, op).await else {
                    return;
                };
                #[cfg(feature = "raft-mutations")]
                if world.planted_panic() == Some(super::PlantedPanic::ClientCall(n)) {
                    panic!("planted: call {n} was answered {:?}", call.answer);
                }
                history.borrow_mut().push(call);
            }
        };
        world.spawn_checked(what, task);
    }
}

/// Sends `op` to `member` and waits for its answer (None: the member was
/// not running).
pub async fn call(world: &World, member: u64, op: Op) -> Option<Call> {
    let key = match &op {
        Op::Put { key, .. } | Op::Read { key } => key,
        Op::ReadAll { .. } => &CLIENT_KEYS.0,
        Op::Txn { success, .. } => &success[0].0,
    };
    let commands = world.commands_for(member, key)?;
    world.note(|| format!("call {member}: {op:?}"));
    let start = Instant::now();
    let answer = match &op {
        Op::Put { key, value } => {
            let request = shard_request::Request::Put(pb::PutRequest {
                key: key.clone(),
                value: value.clone(),
                ..Default::default()
            });
            match write(&commands, request)?.await {
                Ok(WriteResult::Put(r)) => Answer::Put {
                    revision: r.header.map_or(0, |h| h.revision),
                },
                Ok(other) => Answer::Failed(format!("a put answered {other:?}")),
                Err(e) => e.into(),
            }
        }
        Op::Txn {
            compare,
            success,
            failure,
        } => txn(world, member, &commands, compare, success, failure).await,
        Op::ReadAll { by_txn } => match read_all(world, member, *by_txn).await {
            Ok((revision, kvs)) => Answer::ReadAll { revision, kvs },
            Err(e) => Answer::Failed(e),
        },
        Op::Read { key } => match read(world, member, &commands, key).await {
            Ok(kv) => Answer::Read {
                value: kv.as_ref().map(|kv| kv.value.clone()).unwrap_or_default(),
                mod_revision: kv.map_or(0, |kv| kv.mod_revision),
            },
            Err(e) => e.into(),
        },
    };
    world.note(|| format!("call {member}: {op:?} answered {answer:?}"));
    Some(Call {
        member,
        op,
        start,
        end: Instant::now(),
        answer,
    })
}

/// A txn of `puts` through `member`, as the API layer runs it: on the
/// shard of its keys when they share one (`commands` is its queue), else
/// as a txn over several shards by the keyspace leader, this member or the
/// member it names (which the daemon asks over the peer port, and does not
/// ask again once it answered: the txn may have been proposed).
async fn txn(
    world: &World,
    member: u64,
    commands: &tokio::sync::mpsc::Sender<ShardCommand>,
    compare: &Option<(Bytes, Bytes)>,
    success: &[(Bytes, Bytes)],
    failure: &[(Bytes, Bytes)],
) -> Answer {
    let ops = |puts: &[(Bytes, Bytes)]| -> Vec<pb::RequestOp> {
        puts.iter()
            .map(|(key, value)| pb::RequestOp {
                request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
                    key: key.clone(),
                    value: value.clone(),
                    ..Default::default()
                })),
            })
            .collect()
    };
    let req = pb::TxnRequest {
        compare: compare
            .iter()
            .map(|(key, value)| pb::Compare {
                result: pb::compare::CompareResult::Equal as i32,
                target: pb::compare::CompareTarget::Value as i32,
                key: key.clone(),
                target_union: Some(pb::compare::TargetUnion::Value(value.clone())),
                ..Default::default()
            })
            .collect(),
        success: ops(success),
        failure: ops(failure),
    };
    let shards = crate::server::validate::txn_shards(&req, &world.routing);
    let answered_at = |r: pb::TxnResponse| Answer::Txn {
        revision: r.header.map_or(0, |h| h.revision),
        succeeded: r.succeeded,
    };
    if shards.len() == 1 {
        let Some(answer) = write(commands, shard_request::Request::Txn(req)) else {
            return Answer::Failed("the member's queue refused the txn".into());
        };
        return match answer.await {
            Ok(WriteResult::Txn(r)) => answered_at(r),
            Ok(other) => Answer::Failed(format!("a txn answered {other:?}")),
            Err(e) => e.into(),
        };
    }
    match tokio::time::timeout(CROSS_TXN_BOUND, txn_across(world, member, req)).await {
        Ok(Ok(r)) => answered_at(r),
        Ok(Err(e)) => Answer::Failed(e.to_string()),
        Err(_) => Answer::Unanswered,
    }
}

/// Longest a txn over several shards may take to be answered: its holds,
/// compares, parts and their forgetting each within the request timeout,
/// after a wait for a keyspace leader.
const CROSS_TXN_BOUND: Duration = REQUEST_TIMEOUT
    .saturating_mul(8)
    .saturating_add(LEADERLESS_WAIT);

/// A txn over several shards, run where `KvService::txn_across` runs it.
async fn txn_across(
    world: &World,
    member: u64,
    req: pb::TxnRequest,
) -> Result<pb::TxnResponse, ApiError> {
    let deadline = Instant::now() + LEADERLESS_WAIT;
    let mut last = ApiError::NoLeader;
    loop {
        let router = world.router(member).ok_or(ApiError::Stopped)?;
        // Apart from this call, as the daemon runs it: a txn is not
        // stopped half way through its holds. A panic of it is the seed's
        // violation; the call is then answered as by a member that stopped.
        let what = move || format!("a txn over several shards run by member {member}");
        let run = world.spawn_checked(what, cross_txn::run(router, req.clone()));
        let leader = match run.await {
            Ok(Some(Ok(r))) => return Ok(r),
            Ok(Some(Err(ApiError::NotLeader { leader }))) => leader,
            Ok(Some(Err(e @ (ApiError::NoLeader | ApiError::LeaderChanged)))) => {
                last = e;
                crate::raft::NONE
            }
            Ok(Some(Err(e))) => return Err(e),
            Ok(None) | Err(_) => return Err(ApiError::Stopped),
        };
        let remote = (leader != member && leader != crate::raft::NONE)
            .then(|| world.router(leader))
            .flatten();
        if let Some(remote) = remote {
            let what = move || format!("a txn over several shards run by member {leader}");
            let run = world.spawn_checked(what, cross_txn::run(remote, req.clone()));
            match run.await {
                Ok(Some(Ok(r))) => return Ok(r),
                Ok(Some(Err(ApiError::NotLeader { .. }))) => {}
                Ok(Some(Err(e))) => return Err(e),
                Ok(None) | Err(_) => return Err(ApiError::Stopped),
            }
        }
        if Instant::now() >= deadline {
            return Err(last);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads `key` at `revision` (0: the newest) from a member's driver.
pub async fn range(
    commands: &tokio::sync::mpsc::Sender<ShardCommand>,
    key: &Bytes,
    revision: i64,
    serializable: bool,
) -> Result<Option<cairn_proto::mvccpb::KeyValue>, Unanswered> {
    let request = pb::RangeRequest {
        key: key.clone(),
        revision,
        serializable,
        ..Default::default()
    };
    range_request(commands, request)
        .await
        .map(|kvs| kvs.into_iter().next())
}

/// Every key a member's store holds at `revision` (serializable).
pub async fn range_all(
    commands: &tokio::sync::mpsc::Sender<ShardCommand>,
    revision: i64,
) -> Result<Vec<cairn_proto::mvccpb::KeyValue>, Unanswered> {
    let request = pb::RangeRequest {
        key: Bytes::from_static(b"\0"),
        range_end: Bytes::from_static(b"\0"),
        revision,
        serializable: true,
        ..Default::default()
    };
    range_request(commands, request).await
}

async fn range_request(
    commands: &tokio::sync::mpsc::Sender<ShardCommand>,
    request: pb::RangeRequest,
) -> Result<Vec<cairn_proto::mvccpb::KeyValue>, Unanswered> {
    let (reply, rx) = crate::server::command::Reply::channel();
    commands
        .try_send(ShardCommand::Range {
            request,
            at: None,
            reply,
        })
        .map_err(|e| Unanswered::Error(format!("the member's queue refused the read: {e}")))?;
    answered(rx).await.map(|r| r.kvs)
}

/// Queues a write for a member's driver of one shard, as the router does;
/// None when its queue has no room (the write was never sent). The future
/// waits for the answer.
fn write(
    commands: &tokio::sync::mpsc::Sender<ShardCommand>,
    request: shard_request::Request,
) -> Option<impl std::future::Future<Output = Result<WriteResult, Unanswered>>> {
    let (reply, rx) = crate::server::command::Reply::channel();
    commands
        .try_send(ShardCommand::Write { request, reply })
        .ok()?;
    Some(answered(rx))
}

/// Why a request has no result.
#[derive(Debug)]
pub enum Unanswered {
    /// The driver answered with an error, or stopped (crashed) first.
    Error(String),
    /// No answer within twice the request timeout from a driver still running.
    No,
}

impl From<Unanswered> for Answer {
    fn from(u: Unanswered) -> Answer {
        match u {
            Unanswered::Error(e) => Answer::Failed(e),
            Unanswered::No => Answer::Unanswered,
        }
    }
}

/// The driver's answer. Its own timeout ends every request, so a wait much
/// longer than that means the driver lost the request.
async fn answered<T>(rx: oneshot::Receiver<Result<T, ApiError>>) -> Result<T, Unanswered> {
    match tokio::time::timeout(REQUEST_TIMEOUT * 2, rx).await {
        Ok(Ok(Ok(v))) => Ok(v),
        Ok(Ok(Err(e))) => Err(Unanswered::Error(e.to_string())),
        Ok(Err(_)) => Err(Unanswered::Error("the driver stopped (crashed)".into())),
        Err(_) => Err(Unanswered::No),
    }
}
