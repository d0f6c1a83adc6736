//! etcd's Election service (`v3electionpb.Election`), as etcd 3.4 serves it:
//! a campaigner puts its key `<name>/<lease in hex>` holding its value and
//! leads once every key under the name created before it is deleted; the
//! leader's key's value is the election's value (Proclaim changes it,
//! Resign deletes the key). Leader and Observe read and follow the key
//! created first. See [`super::recipes`].

use bytes::Bytes;
use cairn_proto::etcdserverpb::{ResponseHeader, TxnRequest, WatchCreateRequest};
use cairn_proto::mvccpb::event::EventType;
use cairn_proto::mvccpb::KeyValue;
use cairn_proto::v3electionpb::election_server::Election;
use cairn_proto::v3electionpb::{
    CampaignRequest, CampaignResponse, LeaderKey, LeaderRequest, LeaderResponse, ProclaimRequest,
    ProclaimResponse, ResignRequest, ResignResponse,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::service::Routes;
use tonic::{Request, Response, Status};

use super::in_process::Caller;
use super::recipes::{self, Withdrawal};
use super::require_leader::{self, LeaderLoss};

/// Answers an Observe stream holds for a client that reads slowly; the
/// task following the election waits while it is full.
const OBSERVE_QUEUE_MESSAGES: usize = 16;

#[derive(Clone)]
pub struct ElectionService {
    /// The member's KV, Lease and Watch services, called on the client's
    /// behalf.
    pub routes: Routes,
    /// Ends the Observe streams that require a leader when the member has
    /// none.
    pub leader_loss: LeaderLoss,
}

/// etcd's answer to a Proclaim by a campaigner that does not lead.
fn not_leader() -> Status {
    Status::unknown("election: not leader")
}

/// etcd's answer to Leader when nobody campaigns.
fn no_leader() -> Status {
    Status::unknown("election: no leader")
}

/// etcd's answer to a Proclaim or Resign without its leader key.
fn missing_leader_key() -> Status {
    Status::unknown("\"leader\" field must be provided")
}

/// Sets the leader's value, if `leader` still leads.
async fn proclaim(
    caller: &Caller,
    leader: &LeaderKey,
    lease: i64,
    value: &[u8],
) -> Result<Option<ResponseHeader>, Status> {
    let answer = recipes::txn(
        caller,
        TxnRequest {
            compare: vec![recipes::created_at(&leader.key, leader.rev)],
            success: vec![recipes::put_op(&leader.key, value, lease)],
            failure: Vec::new(),
        },
    )
    .await?;
    if !answer.succeeded {
        return Err(not_leader());
    }
    Ok(answer.header)
}

#[tonic::async_trait]
impl Election for ElectionService {
    async fn campaign(
        &self,
        request: Request<CampaignRequest>,
    ) -> Result<Response<CampaignResponse>, Status> {
        let caller = Caller::new(self.routes.clone(), &request);
        let req = request.into_inner();
        let lease = recipes::session_lease(&caller, req.lease).await?;
        let prefix = recipes::contenders_prefix(&req.name);
        let key = recipes::contender_key(&prefix, lease);
        let entered = recipes::enter(&caller, &key, &req.value, lease, None).await?;
        let leader = LeaderKey {
            name: req.name,
            key,
            rev: entered.created,
            lease,
        };
        // A lease that campaigns already keeps its key's place, and the key
        // takes this campaign's value.
        if entered.existing.is_some_and(|kv| kv.value != req.value) {
            if let Err(status) = proclaim(&caller, &leader, lease, &req.value).await {
                let _ = recipes::resign(&caller, &leader.key, leader.rev).await;
                return Err(status);
            }
        }
        // A caller that goes away while waiting resigns; a wait that fails
        // otherwise leaves the key to its lease, as etcd's does.
        let withdrawal = Withdrawal::resign(caller.clone(), leader.key.clone(), leader.rev);
        let waited = recipes::wait_deletes(&caller, &prefix, leader.rev - 1).await;
        withdrawal.forget();
        waited?;
        Ok(Response::new(CampaignResponse {
            header: entered.answer.header,
            leader: Some(leader),
        }))
    }

    async fn proclaim(
        &self,
        request: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        let caller = Caller::new(self.routes.clone(), &request);
        let req = request.into_inner();
        let leader = req.leader.ok_or_else(missing_leader_key)?;
        let lease = recipes::session_lease(&caller, leader.lease).await?;
        let header = proclaim(&caller, &leader, lease, &req.value).await?;
        Ok(Response::new(ProclaimResponse { header }))
    }

    async fn leader(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<LeaderResponse>, Status> {
        let caller = Caller::new(self.routes.clone(), &request);
        let prefix = recipes::contenders_prefix(&request.into_inner().name);
        let mut found = recipes::range(&caller, recipes::one_contender(&prefix, None)).await?;
        if found.kvs.is_empty() {
            return Err(no_leader());
        }
        Ok(Response::new(LeaderResponse {
            header: found.header,
            kv: Some(found.kvs.swap_remove(0)),
        }))
    }

    type ObserveStream = ReceiverStream<Result<LeaderResponse, Status>>;

    async fn observe(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<Self::ObserveStream>, Status> {
        let mut leader = self.leader_loss.open(request.metadata())?;
        let caller = Caller::new(self.routes.clone(), &request);
        let prefix = recipes::contenders_prefix(&request.into_inner().name);
        let (tx, rx) = mpsc::channel(OBSERVE_QUEUE_MESSAGES);
        tokio::spawn(async move {
            tokio::select! {
                // The client went away: the watches go with this task.
                _ = tx.closed() => {}
                // As etcd's stream interceptor ends it.
                () = leader.lost() => {
                    let _ = tx.send(Err(require_leader::no_leader())).await;
                }
                ended = observe(&caller, &prefix, &tx) => {
                    // As etcd's, a stream whose follow failed (a read
                    // refused, a watch ended or cancelled) ends without an
                    // error: etcd's Observe closes its channel then.
                    if let Err(status) = ended {
                        tracing::debug!(%status, "an Observe stream ended");
                    }
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn resign(
        &self,
        request: Request<ResignRequest>,
    ) -> Result<Response<ResignResponse>, Status> {
        let caller = Caller::new(self.routes.clone(), &request);
        let leader = request.into_inner().leader.ok_or_else(missing_leader_key)?;
        let header = recipes::resign(&caller, &leader.key, leader.rev).await?;
        Ok(Response::new(ResignResponse { header }))
    }
}

/// Follows the election under `prefix`: its leader and each value the
/// leader proclaims, then the next leader once that one's key is deleted,
/// as etcd's Observe does. Returns when the client is gone or a watch ends.
async fn observe(
    caller: &Caller,
    prefix: &[u8],
    tx: &mpsc::Sender<Result<LeaderResponse, Status>>,
) -> Result<(), Status> {
    loop {
        let mut found = recipes::range(caller, recipes::one_contender(prefix, None)).await?;
        let (header, leader) = if found.kvs.is_empty() {
            let from = recipes::revision(&found.header);
            match first_put(caller, prefix, from).await? {
                Some(first) => first,
                None => return Ok(()),
            }
        } else {
            (found.header, found.kvs.swap_remove(0))
        };
        let from = recipes::revision(&header) + 1;
        let key = leader.key.clone();
        let answer = LeaderResponse {
            header,
            kv: Some(leader),
        };
        if tx.send(Ok(answer)).await.is_err() {
            return Ok(());
        }
        // Each value the leader proclaims, until its key is deleted.
        let mut events = caller
            .watch(WatchCreateRequest {
                key,
                start_revision: from,
                ..WatchCreateRequest::default()
            })
            .await?;
        'leader: loop {
            let Some(answer) = events.next().await? else {
                return Ok(());
            };
            if answer.canceled {
                return Err(recipes::watch_refused(&answer));
            }
            for e in answer.events {
                if e.r#type == EventType::Delete as i32 {
                    break 'leader;
                }
                let update = LeaderResponse {
                    header: answer.header,
                    kv: e.kv,
                };
                if tx.send(Ok(update)).await.is_err() {
                    return Ok(());
                }
            }
        }
    }
}

/// The first key put under `prefix` from revision `from` on, with the
/// header of the answer that carried it (its revision the put's); `None`
/// when the watch ended first.
async fn first_put(
    caller: &Caller,
    prefix: &[u8],
    from: i64,
) -> Result<Option<(Option<ResponseHeader>, KeyValue)>, Status> {
    let mut events = caller
        .watch(WatchCreateRequest {
            key: Bytes::copy_from_slice(prefix),
            range_end: crate::routing::prefix_end(prefix).into(),
            start_revision: from,
            ..WatchCreateRequest::default()
        })
        .await?;
    while let Some(answer) = events.next().await? {
        if answer.canceled {
            return Err(recipes::watch_refused(&answer));
        }
        // Deletes are passed over: only a put names a leader.
        let put = answer
            .events
            .into_iter()
            .find(|e| e.r#type == EventType::Put as i32)
            .and_then(|e| e.kv);
        if let Some(kv) = put {
            let mut header = answer.header;
            if let Some(h) = header.as_mut() {
                h.revision = kv.mod_revision;
            }
            return Ok(Some((header, kv)));
        }
    }
    Ok(None)
}
