//! Leases on the shard's leader: TTLs renewed and answered by the leader,
//! expired ones revoked through Raft.

use super::*;

impl Shard {
    /// Lease TTLs are answered by the shard's leader only, once it has applied
    /// every entry of earlier terms (it then knows every grant and revoke).
    pub(super) fn lease_leader_check(&self) -> Result<(), ApiError> {
        if let Some(reason) = &self.failed {
            return Err(self.storage_error(reason.clone()));
        }
        let leader = self.node.leader_id();
        if leader != self.member_id {
            return Err(ApiError::NotLeader { leader });
        }
        if !self.lease_clock.is_ready(self.store.applied_index()) {
            return Err(ApiError::NotLeader { leader: raft::NONE });
        }
        Ok(())
    }

    /// Keep-alives (one, or a follower's gathered ones) are answered once a
    /// ReadIndex round has confirmed that this member still leads (see
    /// [`PendingRenewal`]), as etcd confirms leadership before renewing.
    pub(super) fn lease_renew(&mut self, ids: Vec<i64>, reply: Reply<Vec<Option<i64>>>) {
        match self.lease_leader_check() {
            Ok(()) => self.renewals_this_turn.push(PendingRenewal { ids, reply }),
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
    }

    pub(super) fn lease_query(
        &self,
        id: i64,
        keys: bool,
    ) -> Result<Option<crate::server::command::LeaseInfo>, ApiError> {
        self.lease_leader_check()?;
        let Some(remaining) = self.lease_clock.remaining(id, Instant::now()) else {
            return Ok(None);
        };
        Ok(self
            .store
            .lease(id)
            .map(|l| crate::server::command::LeaseInfo {
                granted_ttl: l.ttl_secs,
                remaining,
                keys: if keys { l.keys } else { Vec::new() },
            }))
    }

    /// The leader starts every lease's TTL afresh when it takes over, and
    /// forgets them when it steps down.
    pub(super) fn lease_role_changed(&mut self, leader: bool) {
        if leader {
            let leases = self
                .store
                .leases()
                .into_iter()
                .map(|l| (l.id, l.ttl_secs, l.remaining_ttl_secs));
            self.lease_clock
                .promote(self.node.last_index(), leases, Instant::now());
        } else {
            self.lease_clock.demote();
        }
    }

    /// The leader revokes the leases whose TTL ran out, through Raft: each
    /// member deletes their keys when it applies the revoke.
    pub(super) fn expire_leases(&mut self) {
        if !self.lease_clock.is_ready(self.store.applied_index())
            || self.node.leader_id() != self.member_id
            || !self.takes_proposals()
        {
            return;
        }
        if let Some(k) = &self.keyspace {
            // With several shards, shard 0's leader (the keyspace leader)
            // alone decides expiry, and the lease is revoked on every shard
            // at one revision (`cross_txn::revoke_expired_leases`).
            if self.id == 0 {
                for id in self.lease_clock.due(Instant::now()) {
                    k.lease_expired(id);
                }
            }
            return;
        }
        for id in self.lease_clock.due(Instant::now()) {
            // No client waits on it: request id 0. Revision 0: with one
            // shard the store numbers its own writes.
            let data = ShardRequest {
                id: 0,
                member: self.member_id,
                request: Some(shard_request::Request::LeaseRevoke(
                    pb::LeaseRevokeRequest { id },
                )),
                revision: 0,
            }
            .encode_to_vec();
            match self.node.propose(Bytes::from(data)) {
                Ok(()) => tracing::debug!(shard = self.id, lease = id, "lease expired; revoking"),
                Err(e) => {
                    tracing::debug!(shard = self.id, lease = id, error = %e, "proposing an expired lease's revoke failed; retried later")
                }
            }
        }
    }
}
