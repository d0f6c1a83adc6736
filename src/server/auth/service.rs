//! The etcd v3 Auth service. Changes go through shard 0's log (see
//! [`crate::server::auth_state::AuthReplica::apply`]); reads answer from
//! this member's copy after a ReadIndex round on shard 0, so they see every
//! change acknowledged before them, as etcd's do.

use std::sync::Arc;

use cairn_proto::cairnpb::shard_request::Request as ShardReq;
use cairn_proto::cairnpb::{auth_change::Change, AuthChange, AuthToken};
use cairn_proto::etcdserverpb::auth_server::Auth;
use cairn_proto::etcdserverpb::*;
use tonic::{Request, Response, Status};

use super::{caller_of, AuthStore, Caller};
use crate::server::auth_state::simple_tokens::SimpleTokens;
use crate::server::auth_state::AUTH_SHARD;
use crate::server::command::WriteResult;
use crate::server::errors::ApiError;
use crate::server::identity::Identity;
use crate::server::keyspace::router::Router;

#[derive(Clone)]
pub struct AuthService {
    pub auth: Arc<AuthStore>,
    pub router: Arc<Router>,
    pub identity: Identity,
    /// Counts Authenticate calls refused by the failure limiter.
    pub metrics: Option<crate::ops::server_metrics::CoreRecorder>,
}

impl AuthService {
    fn header(&self, revision: i64) -> Option<ResponseHeader> {
        Some(self.identity.header_now(revision))
    }

    /// Proposes a change and waits for it to be applied; the store revision
    /// it was applied at.
    async fn propose(&self, change: Change) -> Result<i64, ApiError> {
        let request = ShardReq::Auth(AuthChange {
            change: Some(change),
        });
        match self.router.write(AUTH_SHARD, request).await? {
            WriteResult::Applied { revision } => Ok(revision),
            _ => Err(ApiError::Storage {
                shard: AUTH_SHARD,
                reason: "auth change answered with another result kind".into(),
            }),
        }
    }

    /// Waits until this member has applied every change committed before
    /// now; the store revision then.
    async fn barrier(&self) -> Result<i64, ApiError> {
        let resp = self
            .router
            .range(
                AUTH_SHARD,
                RangeRequest {
                    key: b"\0".to_vec().into(),
                    count_only: true,
                    ..Default::default()
                },
            )
            .await?;
        Ok(resp.header.map_or(0, |h| h.revision))
    }

    /// Checks the caller holds the root role, then proposes.
    async fn admin_change<T>(&self, request: &Request<T>, change: Change) -> Result<i64, Status> {
        let caller = caller_of(&self.auth, request)?;
        self.auth.check_admin(caller.as_ref())?;
        Ok(self.propose(change).await?)
    }

    /// Checks the caller holds the root role, or passes `also`.
    fn admin_or(&self, caller: Option<&Caller>, also: bool) -> Result<(), ApiError> {
        match self.auth.check_admin(caller) {
            Err(_) if also => Ok(()),
            other => other,
        }
    }

    async fn hash(&self, password: String) -> Result<String, ApiError> {
        let cost = self.auth.options.bcrypt_cost;
        tokio::task::spawn_blocking(move || bcrypt::hash(password, cost))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
            .map_err(|reason| ApiError::Storage {
                shard: AUTH_SHARD,
                reason: format!("hashing a password: {reason}"),
            })
    }

    fn limited(&self) -> ApiError {
        if let Some(m) = &self.metrics {
            m.auth_failure_limited();
        }
        ApiError::TooManyRequests
    }
}

#[tonic::async_trait]
impl Auth for AuthService {
    async fn auth_enable(
        &self,
        request: Request<AuthEnableRequest>,
    ) -> Result<Response<AuthEnableResponse>, Status> {
        let rev = self
            .admin_change(&request, Change::Enable(AuthEnableRequest {}))
            .await?;
        Ok(Response::new(AuthEnableResponse {
            header: self.header(rev),
        }))
    }

    async fn auth_disable(
        &self,
        request: Request<AuthDisableRequest>,
    ) -> Result<Response<AuthDisableResponse>, Status> {
        let rev = self
            .admin_change(&request, Change::Disable(AuthDisableRequest {}))
            .await?;
        Ok(Response::new(AuthDisableResponse {
            header: self.header(rev),
        }))
    }

    async fn auth_status(
        &self,
        _: Request<AuthStatusRequest>,
    ) -> Result<Response<AuthStatusResponse>, Status> {
        let rev = self.barrier().await?;
        let (enabled, auth_revision) = self.auth.with(|d| (d.enabled(), d.revision()));
        Ok(Response::new(AuthStatusResponse {
            header: self.header(rev),
            enabled,
            auth_revision,
        }))
    }

    async fn authenticate(
        &self,
        request: Request<AuthenticateRequest>,
    ) -> Result<Response<AuthenticateResponse>, Status> {
        let addr = super::conn_info(&request)
            .and_then(|i| i.remote_addr)
            .map(|a| a.ip().to_string());
        let req = request.into_inner();
        if !self.auth.is_enabled() {
            return Err(ApiError::AuthNotEnabled.into());
        }
        if !self.auth.limiter.allows(&req.name, addr.as_deref()) {
            return Err(self.limited().into());
        }
        let hash = self.auth.with(|d| {
            d.user(&req.name)
                .filter(|u| !u.options.unwrap_or_default().no_password)
                .map(|u| String::from_utf8_lossy(&u.password).into_owned())
        });
        let password = req.password.clone();
        let ok = match hash {
            Some(hash) => tokio::task::spawn_blocking(move || bcrypt::verify(password, &hash))
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or(false),
            None => false,
        };
        if !ok {
            self.auth.limiter.failed(&req.name, addr.as_deref());
            return Err(ApiError::AuthFailed.into());
        }
        let (token, rev) = match self.auth.sign_jwt(&req.name) {
            Some(token) => (token?, self.barrier().await?),
            None => {
                let token = SimpleTokens::generate();
                let rev = self
                    .propose(Change::Token(AuthToken {
                        user: req.name.clone(),
                        token: token.clone(),
                    }))
                    .await?;
                (token, rev)
            }
        };
        Ok(Response::new(AuthenticateResponse {
            header: self.header(rev),
            token,
        }))
    }

    async fn user_add(
        &self,
        request: Request<AuthUserAddRequest>,
    ) -> Result<Response<AuthUserAddResponse>, Status> {
        let caller = caller_of(&self.auth, &request)?;
        self.auth.check_admin(caller.as_ref())?;
        let mut req = request.into_inner();
        if req.name.is_empty() {
            return Err(ApiError::UserEmpty.into());
        }
        let no_password = req.options.is_some_and(|o| o.no_password);
        if !no_password && req.hashed_password.is_empty() {
            req.hashed_password = self.hash(std::mem::take(&mut req.password)).await?;
        }
        req.password.clear();
        let rev = self.propose(Change::UserAdd(req)).await?;
        Ok(Response::new(AuthUserAddResponse {
            header: self.header(rev),
        }))
    }

    async fn user_get(
        &self,
        request: Request<AuthUserGetRequest>,
    ) -> Result<Response<AuthUserGetResponse>, Status> {
        let caller = caller_of(&self.auth, &request)?;
        let req = request.into_inner();
        let is_self = caller.as_ref().is_some_and(|c| c.user == req.name);
        self.admin_or(caller.as_ref(), is_self)?;
        let rev = self.barrier().await?;
        let roles = self
            .auth
            .with(|d| d.user(&req.name).map(|u| u.roles.clone()))
            .ok_or(ApiError::UserNotFound)?;
        Ok(Response::new(AuthUserGetResponse {
            header: self.header(rev),
            roles,
        }))
    }

    async fn user_list(
        &self,
        request: Request<AuthUserListRequest>,
    ) -> Result<Response<AuthUserListResponse>, Status> {
        let caller = caller_of(&self.auth, &request)?;
        self.auth.check_admin(caller.as_ref())?;
        let rev = self.barrier().await?;
        Ok(Response::new(AuthUserListResponse {
            header: self.header(rev),
            users: self.auth.with(|d| d.user_names()),
        }))
    }

    async fn user_delete(
        &self,
        request: Request<AuthUserDeleteRequest>,
    ) -> Result<Response<AuthUserDeleteResponse>, Status> {
        let change = Change::UserDelete(request.get_ref().clone());
        let rev = self.admin_change(&request, change).await?;
        Ok(Response::new(AuthUserDeleteResponse {
            header: self.header(rev),
        }))
    }

    async fn user_change_password(
        &self,
        request: Request<AuthUserChangePasswordRequest>,
    ) -> Result<Response<AuthUserChangePasswordResponse>, Status> {
        let caller = caller_of(&self.auth, &request)?;
        self.auth.check_admin(caller.as_ref())?;
        let mut req = request.into_inner();
        if req.hashed_password.is_empty() {
            req.hashed_password = self.hash(std::mem::take(&mut req.password)).await?;
        }
        req.password.clear();
        let rev = self.propose(Change::UserChangePassword(req)).await?;
        Ok(Response::new(AuthUserChangePasswordResponse {
            header: self.header(rev),
        }))
    }

    async fn user_grant_role(
        &self,
        request: Request<AuthUserGrantRoleRequest>,
    ) -> Result<Response<AuthUserGrantRoleResponse>, Status> {
        let change = Change::UserGrantRole(request.get_ref().clone());
        let rev = self.admin_change(&request, change).await?;
        Ok(Response::new(AuthUserGrantRoleResponse {
            header: self.header(rev),
        }))
    }

    async fn user_revoke_role(
        &self,
        request: Request<AuthUserRevokeRoleRequest>,
    ) -> Result<Response<AuthUserRevokeRoleResponse>, Status> {
        let change = Change::UserRevokeRole(request.get_ref().clone());
        let rev = self.admin_change(&request, change).await?;
        Ok(Response::new(AuthUserRevokeRoleResponse {
            header: self.header(rev),
        }))
    }

    async fn role_add(
        &self,
        request: Request<AuthRoleAddRequest>,
    ) -> Result<Response<AuthRoleAddResponse>, Status> {
        let change = Change::RoleAdd(request.get_ref().clone());
        let rev = self.admin_change(&request, change).await?;
        Ok(Response::new(AuthRoleAddResponse {
            header: self.header(rev),
        }))
    }

    async fn role_get(
        &self,
        request: Request<AuthRoleGetRequest>,
    ) -> Result<Response<AuthRoleGetResponse>, Status> {
        let caller = caller_of(&self.auth, &request)?;
        let req = request.into_inner();
        let holds = caller.as_ref().is_some_and(|c| {
            self.auth
                .with(|d| d.user(&c.user).is_some_and(|u| u.roles.contains(&req.role)))
        });
        self.admin_or(caller.as_ref(), holds)?;
        let rev = self.barrier().await?;
        let perm = self.auth.with(|d| d.role_perms(&req.role))?;
        Ok(Response::new(AuthRoleGetResponse {
            header: self.header(rev),
            perm,
        }))
    }

    async fn role_list(
        &self,
        request: Request<AuthRoleListRequest>,
    ) -> Result<Response<AuthRoleListResponse>, Status> {
        let caller = caller_of(&self.auth, &request)?;
        self.auth.check_admin(caller.as_ref())?;
        let rev = self.barrier().await?;
        Ok(Response::new(AuthRoleListResponse {
            header: self.header(rev),
            roles: self.auth.with(|d| d.role_names()),
        }))
    }

    async fn role_delete(
        &self,
        request: Request<AuthRoleDeleteRequest>,
    ) -> Result<Response<AuthRoleDeleteResponse>, Status> {
        let change = Change::RoleDelete(request.get_ref().clone());
        let rev = self.admin_change(&request, change).await?;
        Ok(Response::new(AuthRoleDeleteResponse {
            header: self.header(rev),
        }))
    }

    async fn role_grant_permission(
        &self,
        request: Request<AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<AuthRoleGrantPermissionResponse>, Status> {
        let change = Change::RoleGrantPermission(request.get_ref().clone());
        let rev = self.admin_change(&request, change).await?;
        Ok(Response::new(AuthRoleGrantPermissionResponse {
            header: self.header(rev),
        }))
    }

    async fn role_revoke_permission(
        &self,
        request: Request<AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<AuthRoleRevokePermissionResponse>, Status> {
        let change = Change::RoleRevokePermission(request.get_ref().clone());
        let rev = self.admin_change(&request, change).await?;
        Ok(Response::new(AuthRoleRevokePermissionResponse {
            header: self.header(rev),
        }))
    }
}
