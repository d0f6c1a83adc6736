//! etcd's strict reconfiguration check (its `--strict-reconfig-check`, on by
//! default): before a membership change of a shard's group is proposed, its
//! leader refuses one that could leave the group without a quorum.
//!
//! - A started member is one whose name the member table holds: a member
//!   of the initial cluster, named there, or one added later that has run
//!   and published its name (a member added with `member add` is nameless
//!   until then). Adding a voter, removing one and promoting a learner each need
//!   a quorum of started voters after the change, counting the new voter
//!   as started only when it is promoted (etcd's `IsReadyTo...` rules),
//!   else "not enough started members".
//! - Connections: adding a member (voter or learner) needs the leader
//!   connected to every other voter for [`HEALTH_INTERVAL`] without a
//!   break, and removing a voter that is connected needs the voters
//!   connected that long, less the one removed, to still make a quorum;
//!   else "unhealthy cluster". A voter that is not connected at all is down
//!   and may be removed: it is not part of the quorum that serves.
//!
//! A connection is the leader's link to a peer for this shard, counted
//! while the peer has also been heard from within an election timeout (a
//! frozen or cut-off peer may keep its TCP connection up long after it
//! stops answering), so each shard's leader checks its own group.

use std::time::{Duration, Instant};

use crate::raft::ConfChangeType;
use crate::server::errors::ApiError;

/// How long a connection must have lasted to count (etcd's
/// `HealthInterval`).
pub(super) const HEALTH_INTERVAL: Duration = Duration::from_secs(5);

/// What the check needs to know of the group, as its leader sees it.
pub(super) struct Group<'a> {
    pub local: u64,
    pub voters: &'a [u64],
    pub learners: &'a [u64],
    /// Whether a member has started (the member table holds its name).
    pub started: &'a dyn Fn(u64) -> bool,
    /// Since when the leader has been connected to a member, without a break.
    pub connected_since: &'a dyn Fn(u64) -> Option<Instant>,
    pub now: Instant,
}

impl Group<'_> {
    /// Whether `id` counts as connected: itself, or connected since at least
    /// [`HEALTH_INTERVAL`] ago.
    fn connected_long_enough(&self, id: u64) -> bool {
        id == self.local
            || (self.connected_since)(id)
                .is_some_and(|since| self.now.saturating_duration_since(since) >= HEALTH_INTERVAL)
    }

    fn started_count(&self, except: Option<u64>) -> usize {
        self.voters
            .iter()
            .filter(|&&v| Some(v) != except && (self.started)(v))
            .count()
    }
}

fn quorum(members: usize) -> usize {
    members / 2 + 1
}

/// Whether changing `member` as `change` says may be proposed now.
pub(super) fn check(
    change: ConfChangeType,
    member: u64,
    group: &Group<'_>,
) -> Result<(), ApiError> {
    let is_voter = group.voters.contains(&member);
    match change {
        ConfChangeType::ConfChangeAddNode if !is_voter => {
            // A learner being promoted, or a new voter.
            let promoting = group.learners.contains(&member);
            let members = group.voters.len() + 1;
            let started = group.started_count(None) + usize::from(promoting);
            // Adding a second member to a one-member cluster (as when a
            // cluster is rebuilt from one member's data) is allowed.
            let second_of_one = !promoting && started == 1 && members == 2;
            if !second_of_one && started < quorum(members) {
                return Err(ApiError::NotEnoughStartedMembers);
            }
            if !promoting && !group.voters.iter().all(|&v| group.connected_long_enough(v)) {
                return Err(ApiError::Unhealthy);
            }
            Ok(())
        }
        ConfChangeType::ConfChangeAddLearnerNode => {
            if group.voters.iter().all(|&v| group.connected_long_enough(v)) {
                Ok(())
            } else {
                Err(ApiError::Unhealthy)
            }
        }
        ConfChangeType::ConfChangeRemoveNode if is_voter => {
            let remaining = group.voters.len() - 1;
            if group.started_count(Some(member)) < quorum(remaining) {
                return Err(ApiError::NotEnoughStartedMembers);
            }
            if member != group.local && (group.connected_since)(member).is_none() {
                // Down: not part of the quorum that serves.
                return Ok(());
            }
            let active = group
                .voters
                .iter()
                .filter(|&&v| group.connected_long_enough(v))
                .count();
            if active.saturating_sub(1) < 1 + (group.voters.len() - 1) / 2 {
                return Err(ApiError::Unhealthy);
            }
            Ok(())
        }
        // Removing a learner, promoting a voter, or a change of URLs.
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A group of voters 1..=n led by 1 and learner 9; `up` lists the
    /// members connected for long enough, `fresh` those connected only just
    /// now; `named` the started members.
    fn checked(
        change: ConfChangeType,
        member: u64,
        n: u64,
        up: &[u64],
        fresh: &[u64],
        named: &[u64],
    ) -> Result<(), ApiError> {
        let now = Instant::now();
        let voters: Vec<u64> = (1..=n).collect();
        let learners = [9];
        let started = |id: u64| named.contains(&id);
        let since = |id: u64| {
            if up.contains(&id) {
                Some(now - HEALTH_INTERVAL - Duration::from_millis(1))
            } else if fresh.contains(&id) {
                Some(now)
            } else {
                None
            }
        };
        check(
            change,
            member,
            &Group {
                local: 1,
                voters: &voters,
                learners: &learners,
                started: &started,
                connected_since: &since,
                now,
            },
        )
    }

    use ConfChangeType::{ConfChangeAddLearnerNode as Learner, ConfChangeAddNode as Add};
    use ConfChangeType::{ConfChangeRemoveNode as Remove, ConfChangeUpdateNode as Update};

    #[test]
    fn adding_needs_every_voter_connected_for_a_while() {
        let all = [1, 2, 3];
        assert_eq!(checked(Add, 8, 3, &[2, 3], &[], &all), Ok(()));
        assert_eq!(checked(Learner, 8, 3, &[2, 3], &[], &all), Ok(()));
        // One voter down, or connected only just now (a member that just
        // started): refused, voter or learner.
        for (up, fresh) in [(&[2][..], &[][..]), (&[2][..], &[3][..])] {
            assert_eq!(
                checked(Add, 8, 3, up, fresh, &all),
                Err(ApiError::Unhealthy)
            );
            assert_eq!(
                checked(Learner, 8, 3, up, fresh, &all),
                Err(ApiError::Unhealthy)
            );
        }
        // A second member for a one-member cluster.
        assert_eq!(checked(Add, 8, 1, &[], &[], &[1]), Ok(()));
    }

    #[test]
    fn adding_a_voter_needs_a_quorum_of_started_members_after_it() {
        // 3 voters, one never started: 2 of 4 started is not a quorum.
        assert_eq!(
            checked(Add, 8, 3, &[2, 3], &[], &[1, 2]),
            Err(ApiError::NotEnoughStartedMembers)
        );
        // A learner is not counted.
        assert_eq!(checked(Learner, 8, 3, &[2, 3], &[], &[1, 2]), Ok(()));
    }

    #[test]
    fn promoting_counts_the_learner_as_started_and_needs_no_connections() {
        // Learner 9, with nothing connected: 3 of 4 started.
        assert_eq!(checked(Add, 9, 3, &[], &[], &[1, 2]), Ok(()));
        assert_eq!(
            checked(Add, 9, 3, &[], &[], &[1]),
            Err(ApiError::NotEnoughStartedMembers)
        );
    }

    #[test]
    fn removing_keeps_a_connected_quorum() {
        let all = [1, 2, 3];
        assert_eq!(checked(Remove, 3, 3, &[2, 3], &[], &all), Ok(()));
        // 3 down: removing it is safe; removing 2, which serves, is not.
        assert_eq!(checked(Remove, 3, 3, &[2], &[], &all), Ok(()));
        assert_eq!(
            checked(Remove, 2, 3, &[2], &[], &all),
            Err(ApiError::Unhealthy)
        );
        // 5 voters, one down: removing a live one leaves 3 of 4.
        let five = [1, 2, 3, 4, 5];
        assert_eq!(checked(Remove, 2, 5, &[2, 3, 4], &[], &five), Ok(()));
        assert_eq!(
            checked(Remove, 2, 5, &[2, 3], &[], &five),
            Err(ApiError::Unhealthy)
        );
        // Too few started members left.
        assert_eq!(
            checked(Remove, 2, 3, &[2, 3], &[], &[1, 2]),
            Err(ApiError::NotEnoughStartedMembers)
        );
        // The leader removing itself counts itself, and whoever else is up.
        assert_eq!(checked(Remove, 1, 3, &[2, 3], &[], &all), Ok(()));
        assert_eq!(
            checked(Remove, 1, 3, &[2], &[], &all),
            Err(ApiError::Unhealthy)
        );
        // A member connected only just now is up, but not yet counted.
        assert_eq!(
            checked(Remove, 2, 3, &[3], &[2], &all),
            Err(ApiError::Unhealthy)
        );
        // A learner, and URL changes, are never refused here.
        assert_eq!(checked(Remove, 9, 3, &[], &[], &[1]), Ok(()));
        assert_eq!(checked(Update, 2, 3, &[], &[], &[1]), Ok(()));
    }
}
