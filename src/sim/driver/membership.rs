//! Membership changes under the faults, as an operator makes them with
//! etcdctl: a spare member is added as a learner and started empty (it
//! catches up from the log or by snapshot), then promoted to voter; later a
//! member, the leader as likely as any other, is removed and stopped for
//! good. Each change goes to the leader and is retried, after a leader
//! change or a lost answer, until the group says it is in effect (a change
//! already in effect is answered at once), also after the faults end: the
//! checks that follow need to know who is in the group.

use std::rc::Rc;
use std::time::Duration;

use cairn_proto::cairnpb::MemberInfo;
use tokio::time::Instant;

use crate::raft::ConfChangeType;
use crate::server::command::ShardCommand;
use crate::server::errors::ApiError;

use super::checks::{driver_stopped, violation, DriverViolation, DriverViolationKind as Kind};
use super::world::World;
use super::LIVENESS_BOUND;

/// How long one attempt waits for its answer.
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(500);

/// Adds and removes members until `until`, then finishes the change under
/// way. Returns the changes made.
pub async fn run(world: Rc<World>, until: Instant) -> Result<u64, DriverViolation> {
    let mut changes = 0;
    let founders = world.ids().len();
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(world.gen_range(100..1_500))).await;
        if Instant::now() >= until || !world.chance(500) {
            continue;
        }
        let ids = world.ids();
        if ids.len() > founders {
            let id = ids[world.gen_range(0..ids.len())];
            change(&world, ConfChangeType::ConfChangeRemoveNode, id).await?;
            world.leave(id).await.map_err(driver_stopped)?;
            changes += 1;
        } else if let Some(&id) = world.spare_ids().first() {
            change(&world, ConfChangeType::ConfChangeAddLearnerNode, id).await?;
            world
                .join(id)
                .await
                .map_err(|e| violation(Kind::RestartFailed, e))?;
            change(&world, ConfChangeType::ConfChangeAddNode, id).await?;
            changes += 2;
        }
    }
    Ok(changes)
}

/// Asks the leader for `change` of member `id` until it is in effect.
async fn change(world: &Rc<World>, change: ConfChangeType, id: u64) -> Result<(), DriverViolation> {
    let began = Instant::now();
    // The leader seen on the wire first; then the one a refusal names, or
    // any member (the leader seen last may be stale: the faults are over,
    // or it was removed).
    let mut hint = world.leader_seen();
    loop {
        if began.elapsed() >= LIVENESS_BOUND {
            return Err(violation(
                Kind::NoLiveness,
                format!("{change:?} of member {id} did not take effect within {LIVENESS_BOUND:?}"),
            ));
        }
        let up = world.up_ids();
        let to = match hint.take().filter(|l| up.contains(l)) {
            Some(leader) => Some(leader),
            None => world.pick_up(),
        };
        if let Some(commands) = to.and_then(|to| world.commands(to)) {
            let (reply, answer) = crate::server::command::Reply::channel();
            let member = MemberInfo {
                id,
                name: format!("m{id}"),
                peer_urls: vec![format!("sim://m{id}")],
                client_urls: Vec::new(),
                is_learner: change == ConfChangeType::ConfChangeAddLearnerNode,
            };
            let asked = commands.try_send(ShardCommand::ConfChange {
                change,
                member,
                check_only: false,
                reply,
            });
            if asked.is_ok() {
                match tokio::time::timeout(ATTEMPT_TIMEOUT, answer).await {
                    Ok(Ok(Ok(_))) => return Ok(()),
                    Ok(Ok(Err(ApiError::NotLeader { leader }))) if leader != 0 => {
                        hint = Some(leader);
                    }
                    // Not ready (a learner still behind), no leader, a lost
                    // or late answer: ask again.
                    _ => {}
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
