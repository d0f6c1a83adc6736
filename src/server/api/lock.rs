//! etcd's Lock service (`v3lockpb.Lock`), as etcd 3.4 serves it: Lock
//! puts the caller's key `<name>/<lease in hex>` (or finds it, when that
//! lease already waits or holds), then waits until every key under the
//! name created before it is deleted; the caller then holds the lock for
//! as long as its key lives. Unlock deletes the key. See [`super::recipes`].

use cairn_proto::v3lockpb::lock_server::Lock;
use cairn_proto::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};
use tonic::service::Routes;
use tonic::{Request, Response, Status};

use super::in_process::Caller;
use super::recipes::{self, Withdrawal};

#[derive(Clone)]
pub struct LockService {
    /// The member's KV, Lease and Watch services, called on the client's
    /// behalf.
    pub routes: Routes,
}

#[tonic::async_trait]
impl Lock for LockService {
    async fn lock(&self, request: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        let caller = Caller::new(self.routes.clone(), &request);
        let req = request.into_inner();
        let lease = recipes::session_lease(&caller, req.lease).await?;
        let prefix = recipes::contenders_prefix(&req.name);
        let key = recipes::contender_key(&prefix, lease);
        let holder = recipes::range_op(recipes::one_contender(&prefix, None));
        let entered = recipes::enter(&caller, &key, b"", lease, Some(holder)).await?;
        let mine = entered.created;
        let holder = recipes::ranged(entered.answer.responses.get(1))?;
        if holder
            .kvs
            .first()
            .is_none_or(|kv| kv.create_revision == mine)
        {
            return Ok(Response::new(LockResponse {
                header: entered.answer.header,
                key,
            }));
        }
        // A caller that goes away while waiting, or a wait that fails,
        // takes its key back out of the queue.
        let withdrawal = Withdrawal::delete(caller.clone(), key.clone());
        let header = recipes::wait_deletes(&caller, &prefix, mine - 1).await?;
        withdrawal.forget();
        Ok(Response::new(LockResponse { header, key }))
    }

    async fn unlock(
        &self,
        request: Request<UnlockRequest>,
    ) -> Result<Response<UnlockResponse>, Status> {
        let caller = Caller::new(self.routes.clone(), &request);
        let header = recipes::delete(&caller, &request.into_inner().key).await?;
        Ok(Response::new(UnlockResponse { header }))
    }
}
