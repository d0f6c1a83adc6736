//! The calls refused before they start, as etcd's interceptors refuse them,
//! whichever way they arrive (Cairn's gRPC server, the HTTP/JSON gateway):
//! on a learner, every etcd call but Status and Range (which its shard
//! serves only when serializable); on any member, a call that requires a
//! leader while the member knows none ([`LeaderLoss::refuses`]).

use std::sync::Arc;

use http::HeaderMap;
use tonic::Status;

use crate::server::api::require_leader::{self, LeaderLoss};
use crate::server::errors::ApiError;
use crate::server::members::MemberRegistry;

/// One per core's client port; cheap to clone.
#[derive(Debug, Clone)]
pub struct CallGate {
    members: Arc<MemberRegistry>,
    leader_loss: LeaderLoss,
}

impl CallGate {
    pub fn new(members: Arc<MemberRegistry>, leader_loss: LeaderLoss) -> CallGate {
        CallGate {
            members,
            leader_loss,
        }
    }

    /// Why a call to `path` made with `headers` is refused now, if it is.
    pub fn refusal(&self, path: &[u8], headers: &HeaderMap) -> Option<Status> {
        if self.members.local_is_learner() && !learner_serves(path) {
            return Some(ApiError::NotSupportedForLearner.into());
        }
        self.leader_loss
            .refuses(headers)
            .then(require_leader::no_leader)
    }
}

/// The path prefixes of the services etcd's interceptors guard: its v3
/// services, Lock, Election and gRPC's health service (every service of
/// etcd's gRPC server).
const ETCD_API: &[&[u8]] = &[
    b"/etcdserverpb.",
    b"/v3lockpb.",
    b"/v3electionpb.",
    b"/grpc.health.v1.",
];

/// Whether a learner serves a call to `path` (etcd 3.4's learners serve
/// Status and serializable ranges; calls outside etcd's API are not theirs
/// to refuse).
fn learner_serves(path: &[u8]) -> bool {
    !ETCD_API.iter().any(|api| path.starts_with(api))
        || path == b"/etcdserverpb.KV/Range"
        || path == b"/etcdserverpb.Maintenance/Status"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_learner_serves_status_and_ranges_of_etcds_services_and_no_other_of_them() {
        for served in [
            &b"/etcdserverpb.KV/Range"[..],
            b"/etcdserverpb.Maintenance/Status",
            b"/cairn.Other/Call",
        ] {
            assert!(
                learner_serves(served),
                "{}",
                String::from_utf8_lossy(served)
            );
        }
        for refused in [
            &b"/etcdserverpb.KV/Put"[..],
            b"/v3lockpb.Lock/Lock",
            b"/v3electionpb.Election/Observe",
            b"/grpc.health.v1.Health/Check",
        ] {
            assert!(
                !learner_serves(refused),
                "{}",
                String::from_utf8_lossy(refused)
            );
        }
    }
}
