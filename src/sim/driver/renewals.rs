//! Lease renewals on the daemon's shard driver, in the simulated world of
//! [`super`] without faults: one [`ShardCommand::LeaseRenew`] naming several
//! leases answers every lease's TTL in the order asked, None for a lease the
//! shard does not have; a follower refuses the whole command naming the
//! leader; and a leader cut off from the other members renews nothing, since
//! its ReadIndex round never comes back. Guards against a batch answered out
//! of order or in part, and against renewals that skip the round.

use std::rc::Rc;
use std::time::Duration;

use cairn_proto::cairnpb::shard_request;
use cairn_proto::etcdserverpb::LeaseGrantRequest;
use tokio::time::Instant;

use super::world::{AskError, World};
use super::DriverSimConfig;
use crate::server::command::{Reply, ShardCommand, WriteResult, REQUEST_TIMEOUT};
use crate::server::errors::ApiError;

/// Sends member `id` a command and waits for its answer.
async fn renew(world: &World, id: u64, ids: &[i64]) -> Result<Vec<Option<i64>>, ApiError> {
    let ids = ids.to_vec();
    ask(world, id, |reply| ShardCommand::LeaseRenew { ids, reply }).await
}

/// Asks a running member's driver, which answers or refuses.
async fn ask<T: Send + 'static>(
    world: &World,
    id: u64,
    make: impl FnOnce(Reply<T>) -> ShardCommand,
) -> Result<T, ApiError> {
    match world.ask(id, REQUEST_TIMEOUT * 2, make).await {
        Ok(v) => Ok(v),
        Err(AskError::Refused { error, .. }) => Err(error),
        Err(e) => panic!("{e}"),
    }
}

/// The member every member sees leading, once they agree.
async fn agreed_leader(world: &World) -> u64 {
    let deadline = Instant::now() + super::LIVENESS_BOUND;
    loop {
        let mut seen = Vec::new();
        for id in world.ids() {
            seen.push(ask(world, id, |reply| ShardCommand::Status { reply }).await);
        }
        let leader = seen[0].as_ref().map_or(0, |s| s.leader);
        if leader != 0
            && seen
                .iter()
                .all(|s| s.as_ref().is_ok_and(|s| s.leader == leader))
        {
            return leader;
        }
        assert!(Instant::now() < deadline, "no leader agreed on: {seen:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn renewals_of_several_leases(world: &Rc<World>) {
    for id in world.ids() {
        world.start(id).await.expect("the member starts");
    }
    let leader = agreed_leader(world).await;
    let (x, y, unknown) = (101, 102, 0x7777);
    for (id, ttl) in [(x, 30), (y, 40)] {
        let granted = ask(world, leader, |reply| ShardCommand::Write {
            request: shard_request::Request::LeaseGrant(LeaseGrantRequest { ttl, id }),
            reply,
        })
        .await;
        assert!(
            matches!(granted, Ok(WriteResult::Applied { .. })),
            "grant of {id}: {granted:?}"
        );
    }

    assert_eq!(
        renew(world, leader, &[y, unknown, x]).await,
        Ok(vec![Some(40), None, Some(30)]),
        "each lease's TTL in the order asked, none for the unknown one"
    );
    assert_eq!(renew(world, leader, &[x]).await, Ok(vec![Some(30)]));
    let follower = world.ids().into_iter().find(|&id| id != leader).unwrap();
    assert_eq!(
        renew(world, follower, &[x, y]).await,
        Err(ApiError::NotLeader { leader }),
        "a follower refuses them all, naming the leader"
    );

    // Raft thesis 6.4: a leader answers for its leadership only once a
    // majority has acknowledged it since the read began.
    for id in world.ids().into_iter().filter(|&id| id != leader) {
        world.cut(leader, id);
        world.cut(id, leader);
    }
    let cut_off = renew(world, leader, &[x, y]).await;
    assert!(
        matches!(cut_off, Err(ApiError::NotLeader { .. } | ApiError::Timeout)),
        "a leader cut off from the majority renewed: {cut_off:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn one_command_renews_several_leases_once_the_leadership_is_confirmed() {
    let world = World::new(&DriverSimConfig::new(3, 7)).expect("the world");
    let within = REQUEST_TIMEOUT * 2 + super::LIVENESS_BOUND;
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async {
            let ended = tokio::time::timeout(within, renewals_of_several_leases(&world)).await;
            // Every driver stops before the members' directories go.
            world.end();
            for id in world.ids() {
                world.crash(id).await.expect("the member's driver stops");
            }
            ended.expect("the scenario ends in simulated time");
        })
        .await;
}
