//! Simulated lease clients: each grants one to three leases of one or two
//! seconds, attaches a key to each, and keeps them alive together through
//! running members, one renewal naming them all (a member that does not
//! lead says who does, and the renewal goes there, as a follower's
//! gathered keep-alives do), reading a key now and then; now and then it
//! stops keeping its leases alive and starts others.
//!
//! What they saw is checked ([`check`]): a lease is never gone (its key
//! deleted, or a keep-alive told it does not exist) before the TTL of a
//! grant or keep-alive that was answered had run from when it was sent.
//! After the faults, every lease ends within its TTL and the liveness bound
//! on every member ([`all_revoked`]).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use cairn_proto::cairnpb::shard_request;
use cairn_proto::etcdserverpb as pb;
use tokio::time::Instant;

use crate::server::command::{ShardCommand, WriteResult, REQUEST_TIMEOUT};
use crate::server::errors::ApiError;

use super::checks::{violation, DriverViolation, DriverViolationKind as Kind};
use super::world::{AskError, World};

/// Lease clients at once.
const CLIENTS: u64 = 4;
/// Most leases a client keeps alive together.
const MAX_HELD: usize = 3;
/// How long a client waits for a keep-alive or a read of its key, as an
/// etcd client's keep-alive gives up well within the TTL.
const KEEP_ALIVE_WAIT: Duration = Duration::from_millis(500);
/// The shortest TTL the API grants for the simulation's election timeout,
/// and the longest a client asks.
const MIN_TTL_SECS: i64 = 1;
pub const MAX_TTL_SECS: i64 = 2 * MIN_TTL_SECS;

/// One lease and what its client saw of it.
#[derive(Debug, Clone)]
pub struct Lease {
    pub id: i64,
    pub key: Bytes,
    /// The grant and the keep-alives answered.
    pub alive: Vec<Answered>,
    /// When the lease was seen gone (by the end of the call that saw it),
    /// and how.
    pub gone: Option<(Instant, &'static str)>,
}

/// A grant or keep-alive answered with a TTL.
#[derive(Debug, Clone, Copy)]
pub struct Answered {
    /// When it was sent: the TTL runs from a moment after this.
    pub sent: Instant,
    pub ttl_secs: i64,
    /// Leases the grant or renewal named (a grant names one).
    pub named: usize,
}

impl Answered {
    /// Before this, the lease must be alive.
    fn alive_until(&self) -> Instant {
        self.sent + Duration::from_secs(self.ttl_secs as u64)
    }
}

pub type Leases = Rc<RefCell<Vec<Lease>>>;

/// Runs the lease clients until `until`.
pub async fn run(world: Rc<World>, leases: Leases, until: Instant) {
    // Aborted with this task.
    let clients: Vec<_> = (0..CLIENTS)
        .map(|n| {
            let c = client(world.clone(), leases.clone(), n, until);
            super::AbortOnDrop(world.spawn_checked(move || format!("lease client {n}"), c))
        })
        .collect();
    for mut c in clients {
        let _ = (&mut c.0).await;
    }
}

async fn client(world: Rc<World>, leases: Leases, n: u64, until: Instant) {
    let mut made = 0i64;
    while Instant::now() < until {
        // Granted one by one; a grant that fails ends the group.
        let want = world.gen_range(1..=MAX_HELD);
        let mut held = Vec::new();
        let mut shortest_ttl = MAX_TTL_SECS;
        while held.len() < want && Instant::now() < until {
            made += 1;
            let id = ((n as i64 + 1) << 32) | made;
            let Some((at, ttl)) = grant(&world, &leases, id).await else {
                break;
            };
            held.push(at);
            shortest_ttl = shortest_ttl.min(ttl);
        }
        if !held.is_empty() {
            keep_alive(&world, &leases, held, shortest_ttl, until).await;
        }
    }
}

/// Grants lease `id` and attaches a key to it; its place in the log and its
/// TTL, or None when either failed.
async fn grant(world: &World, leases: &Leases, id: i64) -> Option<(usize, i64)> {
    let ttl = world.gen_range(MIN_TTL_SECS..=MAX_TTL_SECS);
    let key = Bytes::from(format!("lease{id}"));
    let sent = Instant::now();
    let grant = shard_request::Request::LeaseGrant(pb::LeaseGrantRequest { ttl, id });
    if !matches!(write(world, grant).await, Some(Ok(_))) {
        // Maybe granted, maybe not: it ends by itself either way.
        tokio::time::sleep(Duration::from_millis(world.gen_range(10..100))).await;
        return None;
    }
    let put = shard_request::Request::Put(pb::PutRequest {
        key: key.clone(),
        value: key.clone(),
        lease: id,
        ..Default::default()
    });
    if !matches!(write(world, put).await, Some(Ok(WriteResult::Put(_)))) {
        return None;
    }
    let mut all = leases.borrow_mut();
    all.push(Lease {
        id,
        key,
        alive: vec![Answered {
            sent,
            ttl_secs: ttl,
            named: 1,
        }],
        gone: None,
    });
    Some((all.len() - 1, ttl))
}

/// Keeps the leases at `held` alive together, within the shortest of their
/// TTLs, until `until`, until each is seen gone, or until the client lets
/// them go.
async fn keep_alive(
    world: &World,
    leases: &Leases,
    mut held: Vec<usize>,
    ttl: i64,
    until: Instant,
) {
    let period_ms = ttl as u64 * 1000;
    while Instant::now() < until && !held.is_empty() && !world.chance(50) {
        tokio::time::sleep(Duration::from_millis(
            world.gen_range(period_ms / 5..period_ms * 9 / 10),
        ))
        .await;
        let ids: Vec<i64> = held.iter().map(|&at| leases.borrow()[at].id).collect();
        let sent = Instant::now();
        if let Some(Ok(ttls)) = renew(world, &ids).await {
            let mut all = leases.borrow_mut();
            for (&at, ttl) in held.iter().zip(ttls) {
                match ttl {
                    Some(ttl_secs) => all[at].alive.push(Answered {
                        sent,
                        ttl_secs,
                        named: ids.len(),
                    }),
                    None => all[at].gone = Some((Instant::now(), "a keep-alive")),
                }
            }
        }
        if world.chance(500) && !held.is_empty() {
            let at = held[world.gen_range(0..held.len())];
            let key = leases.borrow()[at].key.clone();
            if read_absent(world, &key).await {
                leases.borrow_mut()[at].gone = Some((Instant::now(), "a read of its key"));
            }
        }
        held.retain(|&at| leases.borrow()[at].gone.is_none());
    }
}

/// Sends `request` to a running member's driver; None: no member ran.
async fn write(
    world: &World,
    request: shard_request::Request,
) -> Option<Result<WriteResult, AskError>> {
    let member = world.pick_up()?;
    Some(
        world
            .ask(member, REQUEST_TIMEOUT * 2, |reply| ShardCommand::Write {
                request,
                reply,
            })
            .await,
    )
}

/// A renewal of the leases `ids` through a running member, sent on to the
/// leader it names: each lease's TTL in order, None for one the leader
/// lacks. None: no member ran.
async fn renew(world: &World, ids: &[i64]) -> Option<Result<Vec<Option<i64>>, AskError>> {
    let renew = |reply| ShardCommand::LeaseRenew {
        ids: ids.to_vec(),
        reply,
    };
    let member = world.pick_up()?;
    let answer = match world.ask(member, KEEP_ALIVE_WAIT, renew).await {
        Err(AskError::Refused {
            error: ApiError::NotLeader { leader },
            ..
        }) if leader != 0 && world.is_up(leader) => world.ask(leader, KEEP_ALIVE_WAIT, renew).await,
        other => other,
    };
    Some(answer)
}

/// Whether a linearizable read through a running member found no `key`.
async fn read_absent(world: &World, key: &Bytes) -> bool {
    let Some(member) = world.pick_up() else {
        return false;
    };
    let request = pb::RangeRequest {
        key: key.clone(),
        ..Default::default()
    };
    let answer = world
        .ask(member, KEEP_ALIVE_WAIT, |reply| ShardCommand::Range {
            request,
            at: None,
            reply,
        })
        .await;
    matches!(answer, Ok(r) if r.kvs.is_empty())
}

/// Waits until no member holds a lease, or says which still does `bound`
/// after the clients stopped keeping them alive.
pub async fn all_revoked(world: &World, bound: Duration) -> Result<(), DriverViolation> {
    let deadline = Instant::now() + bound;
    for id in world.ids() {
        loop {
            let held = match world
                .ask(id, REQUEST_TIMEOUT * 2, |reply| ShardCommand::LeaseList {
                    reply,
                })
                .await
            {
                Ok(ids) => ids,
                Err(e) => {
                    return Err(violation(
                        Kind::NoLiveness,
                        format!("member {id} did not list its leases: {e}"),
                    ))
                }
            };
            if held.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                return Err(violation(
                    Kind::LeaseNotRevoked,
                    format!(
                        "member {id} still holds leases {held:?} {bound:?} after the clients \
                         stopped keeping them alive"
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(())
}

/// Checks that no lease was seen gone before the TTL of an answered grant
/// or keep-alive had run from when it was sent.
pub fn check(leases: &[Lease]) -> Result<(), DriverViolation> {
    for l in leases {
        let Some((seen, how)) = &l.gone else {
            continue;
        };
        if let Some(a) = l.alive.iter().find(|a| *seen < a.alive_until()) {
            return Err(violation(
                Kind::LeaseRevokedEarly,
                format!(
                    "lease {} was seen gone by {how} {:?} after a grant or keep-alive sent \
                     before it was answered a TTL of {} s",
                    l.id,
                    seen.saturating_duration_since(a.sent),
                    a.ttl_secs
                ),
            ));
        }
    }
    Ok(())
}
