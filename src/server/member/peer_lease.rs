//! The peer port's lease requests (`POST /cairn/lease-renew`,
//! `/cairn/lease-renews`, `/cairn/lease-ttl`, `/cairn/lease-revoke`): a member asks the leader of a
//! shard (or, to revoke, the keyspace leader) on behalf of its client. The
//! HTTP side and its table of paths are in `crate::server::member::peer_http`.

use std::sync::Arc;

use bytes::Bytes;
use cairn_proto::cairnpb::{LeaseRenewalTtls, LeaseRenewals};
use cairn_proto::etcdserverpb::{
    LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseRevokeRequest, LeaseRevokeResponse,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse, ResponseHeader,
};
use prost::Message as _;

use crate::routing::ShardId;
use crate::server::api::lease_renewals::MAX_RENEWALS;
use crate::server::command::MAX_LEASES_PER_RENEW;
use crate::server::errors::ApiError;
use crate::server::keyspace::router::Router;

/// What this member answers a peer's forwarded lease request with.
#[derive(Debug)]
pub enum PeerLeaseAnswer {
    Ok(Bytes),
    NotLeader(u64),
    Failed(ApiError),
    BadRequest(String),
}

/// Most leases one `lease-renews` request may name (a follower sends at most
/// [`MAX_RENEWALS`] at once): the shard renews them with one command.
pub const MAX_RENEWALS_PER_REQUEST: usize = MAX_LEASES_PER_RENEW;

const _: () = assert!(MAX_RENEWALS <= MAX_RENEWALS_PER_REQUEST);

/// Serves `POST /cairn/lease-renew`, `/cairn/lease-renews` and
/// `/cairn/lease-ttl` for one shard this member is asked to lead.
///
/// - `lease-renew`: body `LeaseKeepAliveRequest`; answer
///   `LeaseKeepAliveResponse` whose TTL is the granted TTL, 0 when the shard
///   has no such lease.
/// - `lease-renews`: body `cairnpb.LeaseRenewals`, the keep-alives a member
///   gathered; answer `cairnpb.LeaseRenewalTtls`, each lease's TTL as above,
///   in order. The shard renews them with one command, in one ReadIndex
///   round. Where the shard refuses them (another member leads it, say), the
///   whole request is refused so: renewing a lease twice is harmless, so the
///   asker sends them again.
/// - `lease-ttl`: body `LeaseTimeToLiveRequest`; answer
///   `LeaseTimeToLiveResponse` whose TTL is the time left in milliseconds (-1
///   when the shard has no such lease), with the shard's keys when asked.
pub async fn serve_lease(
    router: &Arc<Router>,
    path: &str,
    shard: &str,
    body: Bytes,
) -> PeerLeaseAnswer {
    let Some(shard) = shard
        .parse::<ShardId>()
        .ok()
        .filter(|&s| (s as usize) < router.routing.shard_count())
    else {
        return PeerLeaseAnswer::BadRequest(format!("no shard {shard:?}"));
    };
    let answer = match path {
        "/cairn/lease-renew" => {
            let req = match LeaseKeepAliveRequest::decode(body) {
                Ok(r) => r,
                Err(e) => return PeerLeaseAnswer::BadRequest(format!("bad request: {e}")),
            };
            router.lease_renew(shard, req.id).await.map(|ttl| {
                LeaseKeepAliveResponse {
                    header: None,
                    id: req.id,
                    ttl: ttl.unwrap_or(0),
                }
                .encode_to_vec()
            })
        }
        "/cairn/lease-renews" => {
            let req = match LeaseRenewals::decode(body) {
                Ok(r) => r,
                Err(e) => return PeerLeaseAnswer::BadRequest(format!("bad request: {e}")),
            };
            if req.ids.len() > MAX_RENEWALS_PER_REQUEST {
                return PeerLeaseAnswer::BadRequest(format!(
                    "{} leases to renew, more than {MAX_RENEWALS_PER_REQUEST} in one request",
                    req.ids.len()
                ));
            }
            router.lease_renew_many(shard, req.ids).await.map(|ttls| {
                LeaseRenewalTtls {
                    ttls: ttls.into_iter().map(|t| t.unwrap_or(0)).collect(),
                }
                .encode_to_vec()
            })
        }
        "/cairn/lease-revoke" => {
            let req = match LeaseRevokeRequest::decode(body) {
                Ok(r) => r,
                Err(e) => return PeerLeaseAnswer::BadRequest(format!("bad request: {e}")),
            };
            // Run apart from this connection, as a txn over several shards.
            let run = tokio::spawn(crate::server::keyspace::cross_txn::revoke_lease(
                router.clone(),
                req.id,
            ));
            run.await.unwrap_or(Err(ApiError::Stopped)).map(|revision| {
                LeaseRevokeResponse {
                    header: Some(ResponseHeader {
                        revision,
                        ..Default::default()
                    }),
                }
                .encode_to_vec()
            })
        }
        "/cairn/lease-ttl" => {
            let req = match LeaseTimeToLiveRequest::decode(body) {
                Ok(r) => r,
                Err(e) => return PeerLeaseAnswer::BadRequest(format!("bad request: {e}")),
            };
            router
                .lease_query(shard, req.id, req.keys)
                .await
                .map(|info| {
                    let mut resp = LeaseTimeToLiveResponse {
                        id: req.id,
                        ttl: -1,
                        ..Default::default()
                    };
                    if let Some(info) = info {
                        resp.ttl = info.remaining.as_millis().min(i64::MAX as u128) as i64;
                        resp.granted_ttl = info.granted_ttl;
                        resp.keys = info.keys.into_iter().map(Bytes::from).collect();
                    }
                    resp.encode_to_vec()
                })
        }
        other => return PeerLeaseAnswer::BadRequest(format!("no {other} here")),
    };
    match answer {
        Ok(b) => PeerLeaseAnswer::Ok(Bytes::from(b)),
        Err(ApiError::NotLeader { leader }) => PeerLeaseAnswer::NotLeader(leader),
        Err(e) => PeerLeaseAnswer::Failed(e),
    }
}
