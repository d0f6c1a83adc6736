//! gRPC's health service (`grpc.health.v1.Health`), as etcd 3.4 serves it:
//! the member as a whole (service "") is SERVING for as long as its client
//! port answers, which is what etcd sets once its gRPC server starts; any
//! other service name is unknown. Load balancers, Kubernetes' gRPC probes
//! and grpc_health_probe ask it. Whether the member can serve writes is
//! `/health` and `/readyz` (README, Operations). On a learner the service
//! is refused, as etcd's interceptors refuse every service of its gRPC
//! server there ([`super::call_gate`]).

use cairn_proto::grpc_health_v1::health_check_response::ServingStatus;
use cairn_proto::grpc_health_v1::health_server::Health;
use cairn_proto::grpc_health_v1::{HealthCheckRequest, HealthCheckResponse};
use futures::stream::{self, BoxStream, StreamExt};
use tonic::{Request, Response, Status};

use super::require_leader::{self, LeaderLoss};

/// The service name that stands for the whole server.
const WHOLE_SERVER: &str = "";

/// The health service of one core's client port.
#[derive(Debug, Clone)]
pub struct HealthService {
    /// Ends the Watch streams that require a leader when the member has
    /// none, as etcd's stream interceptor ends every stream that does.
    pub leader_loss: LeaderLoss,
}

/// An answer carrying `status`.
fn answer(status: ServingStatus) -> HealthCheckResponse {
    HealthCheckResponse {
        status: status as i32,
    }
}

#[tonic::async_trait]
impl Health for HealthService {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        if request.into_inner().service != WHOLE_SERVER {
            // gRPC's own health server's answer.
            return Err(Status::not_found("unknown service"));
        }
        Ok(Response::new(answer(ServingStatus::Serving)))
    }

    type WatchStream = BoxStream<'static, Result<HealthCheckResponse, Status>>;

    /// The status at once, then nothing: it never changes while the port
    /// answers. The stream stays open until the client ends it, or, for one
    /// that requires a leader, until the member loses it.
    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let mut leader = self.leader_loss.open(request.metadata())?;
        let status = if request.into_inner().service == WHOLE_SERVER {
            ServingStatus::Serving
        } else {
            ServingStatus::ServiceUnknown
        };
        let now = stream::once(async move { Ok(answer(status)) });
        let lost = stream::once(async move {
            leader.lost().await;
            Err(require_leader::no_leader())
        });
        Ok(Response::new(now.chain(lost).boxed()))
    }
}
