//! etcd's authentication and role-based access control, on this member's
//! copy of the auth state ([`crate::server::auth_state`]), which shard 0's
//! driver applies. The API services ask this member's [`AuthStore`] who a
//! request comes from ([`AuthStore::caller`]) and whether it may do what it
//! asks ([`AuthStore::check`]); with auth disabled both are one atomic load,
//! and with auth enabled they take no lock (the state is published:
//! [`crate::server::auth_state::published`]).

pub mod check;
pub mod limiter;
pub mod service;
pub mod tokens;

use std::path::Path;
use std::sync::Arc;

use cairn_proto::authpb::permission::Type as PermType;

use crate::server::auth_state::state::{has_root_role, AuthData};
use crate::server::auth_state::{AuthLoadError, AuthReplica, AUTH_SHARD};
use crate::server::errors::ApiError;
use tokens::{JwtTokens, TokenKind};

pub use crate::config::auth::AuthOptions;

/// Who a request comes from, once authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub user: String,
    /// The auth revision the caller's credentials were checked at: a JWT
    /// issued before a later change is refused as etcd refuses it.
    pub revision: u64,
}

/// This member's auth state and tokens, as the API services use them.
pub struct AuthStore {
    /// The state and simple tokens, shared with shard 0's driver.
    replica: Arc<AuthReplica>,
    jwt: Option<JwtTokens>,
    pub options: AuthOptions,
    pub limiter: limiter::FailureLimiter,
}

impl AuthStore {
    /// Loads the auth state kept in `dir` (none yet: auth disabled, no users).
    pub fn open(dir: &Path, options: AuthOptions) -> Result<Arc<AuthStore>, AuthLoadError> {
        let replica = AuthReplica::open(dir, options.simple_token_ttl)?;
        let jwt = match &options.token {
            TokenKind::Simple => None,
            TokenKind::Jwt(o) => Some(JwtTokens::load(o).map_err(|reason| AuthLoadError {
                path: o.pub_key.clone(),
                reason,
            })?),
        };
        Ok(Arc::new(AuthStore {
            replica: Arc::new(replica),
            jwt,
            options,
            limiter: limiter::FailureLimiter::default(),
        }))
    }

    /// The state and simple tokens, for shard 0's driver that applies the
    /// changes to them.
    pub fn replica(&self) -> &Arc<AuthReplica> {
        &self.replica
    }

    pub fn is_enabled(&self) -> bool {
        self.replica.is_enabled()
    }

    pub fn revision(&self) -> u64 {
        self.replica.revision()
    }

    /// Reads the state (without a lock).
    pub fn with<T>(&self, f: impl FnOnce(&AuthData) -> T) -> T {
        self.replica.with(f)
    }

    /// Who a request comes from: its token (gRPC metadata `token`, or the
    /// gateway's `Authorization` header), else with `--client-cert-auth` its
    /// certificate's common name. None when auth is disabled or the request
    /// names nobody.
    pub fn caller(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        common_name: Option<&str>,
    ) -> Result<Option<Caller>, ApiError> {
        self.caller_by(request_token(metadata), common_name)
    }

    /// [`Self::caller`] from what a stream keeps of its request: the token
    /// ([`request_token`]) and the certificate's common name.
    pub fn caller_by(
        &self,
        token: Option<&str>,
        common_name: Option<&str>,
    ) -> Result<Option<Caller>, ApiError> {
        if !self.is_enabled() {
            return Ok(None);
        }
        if let Some(token) = token {
            let token = token.strip_prefix("Bearer ").unwrap_or(token);
            return self.token_caller(token).map(Some);
        }
        Ok(match common_name {
            Some(cn) if self.options.client_cert_auth && !cn.is_empty() => Some(Caller {
                user: cn.to_string(),
                revision: self.revision(),
            }),
            _ => None,
        })
    }

    fn token_caller(&self, token: &str) -> Result<Caller, ApiError> {
        match &self.jwt {
            Some(jwt) => jwt
                .verify(token)
                .map(|(user, revision)| Caller { user, revision })
                .ok_or(ApiError::InvalidAuthToken),
            None => self
                .replica
                .token_user(token)
                .map(|user| Caller {
                    user,
                    revision: self.revision(),
                })
                .ok_or(ApiError::InvalidAuthToken),
        }
    }

    /// With auth enabled, `judge` of the caller (refused when there is none)
    /// by the current state; Ok when auth is disabled.
    fn judge_caller(
        &self,
        caller: Option<&Caller>,
        judge: impl FnOnce(&Caller, &AuthData) -> Result<(), ApiError>,
    ) -> Result<(), ApiError> {
        if !self.is_enabled() {
            return Ok(());
        }
        let caller = caller.ok_or(ApiError::UserEmpty)?;
        self.with(|data| {
            if data.enabled() {
                judge(caller, data)
            } else {
                Ok(())
            }
        })
    }

    /// Whether `caller` may do `kind` on `key` (`range_end` empty) or the
    /// range `[key, range_end)`, with etcd's errors.
    pub fn check(
        &self,
        caller: Option<&Caller>,
        key: &[u8],
        range_end: &[u8],
        kind: PermType,
    ) -> Result<(), ApiError> {
        self.judge_caller(caller, |caller, data| {
            if caller.revision < data.revision() {
                return Err(ApiError::AuthOldRevision);
            }
            match data.perms(&caller.user) {
                Some(p) if p.permits(key, range_end, kind) => Ok(()),
                _ => Err(ApiError::PermissionDenied),
            }
        })
    }

    /// Whether `caller` holds the root role (auth management, membership
    /// changes, defragment, snapshots, hashes, leader moves).
    pub fn check_admin(&self, caller: Option<&Caller>) -> Result<(), ApiError> {
        self.judge_caller(caller, |caller, data| {
            let user = data.user(&caller.user).ok_or(ApiError::UserNotFound)?;
            if has_root_role(user) {
                Ok(())
            } else {
                Err(ApiError::PermissionDenied)
            }
        })
    }

    /// A token for `user`, who just gave the right password: a JWT signed
    /// here, or None for a simple token (assigned through the log).
    pub fn sign_jwt(&self, user: &str) -> Option<Result<String, ApiError>> {
        let jwt = self.jwt.as_ref()?;
        let revision = self.revision();
        Some(match jwt.sign(user, revision) {
            Some(Ok(token)) => Ok(token),
            Some(Err(e)) => Err(ApiError::Storage {
                shard: AUTH_SHARD,
                reason: format!("signing a token: {e}"),
            }),
            None => Err(ApiError::Unsupported(
                "Authenticate on a member without a jwt priv-key",
            )),
        })
    }
}

/// The member's auth handle as the API services use it: the store plus this
/// request's caller.
pub fn caller_of<T>(
    auth: &AuthStore,
    request: &tonic::Request<T>,
) -> Result<Option<Caller>, ApiError> {
    if !auth.is_enabled() {
        return Ok(None);
    }
    let cn = conn_info(request).and_then(|i| i.common_name.as_deref());
    auth.caller(request.metadata(), cn)
}

/// A request's token: gRPC metadata `token`, else the gateway's
/// `Authorization` header; None when it has neither or the value is not text.
pub fn request_token(metadata: &tonic::metadata::MetadataMap) -> Option<&str> {
    metadata
        .get("token")
        .or_else(|| metadata.get("authorization"))
        .and_then(|v| v.to_str().ok())
}

/// What the client port learned about a request's connection (its address,
/// its certificate's name); none for the gateway's in-process calls.
pub fn conn_info<T>(request: &tonic::Request<T>) -> Option<&crate::tls::ClientConnInfo> {
    request.extensions().get()
}

/// Refuses a request whose caller does not hold the root role (with auth
/// enabled): membership changes, defragment, snapshots, hashes, leader moves.
pub fn require_admin<T>(auth: &AuthStore, request: &tonic::Request<T>) -> Result<(), ApiError> {
    if !auth.is_enabled() {
        return Ok(());
    }
    let caller = caller_of(auth, request)?;
    auth.check_admin(caller.as_ref())
}

/// [`require_admin`] for the Maintenance calls etcd guards in its gRPC layer
/// (Defragment, Snapshot, Hash, HashKV, MoveLeader): etcd passes its auth
/// package's own error on there, which gRPC answers as code Unknown with
/// the `auth: ...` message; clients see exactly that.
pub fn require_admin_maintenance<T>(
    auth: &AuthStore,
    request: &tonic::Request<T>,
) -> Result<(), tonic::Status> {
    require_admin(auth, request).map_err(|e| {
        let text = e.to_string();
        let reason = text.strip_prefix("etcdserver: ").unwrap_or(&text);
        tonic::Status::unknown(format!("auth: {reason}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::auth_state::tests::change;
    use cairn_proto::cairnpb::{auth_change, AuthToken};
    use std::time::Duration;

    fn options() -> AuthOptions {
        AuthOptions {
            token: TokenKind::Simple,
            simple_token_ttl: Duration::from_secs(60),
            bcrypt_cost: 4,
            client_cert_auth: true,
        }
    }

    #[test]
    fn callers_come_from_tokens_or_the_certificate_name() {
        let dir = tempfile::tempdir().unwrap();
        let a = AuthStore::open(dir.path(), options()).unwrap();
        let md = tonic::metadata::MetadataMap::new();
        assert_eq!(a.caller(&md, Some("root")), Ok(None), "auth disabled");
        crate::server::auth_state::tests::enable_with_root(a.replica());
        assert_eq!(a.caller(&md, None), Ok(None));
        assert_eq!(
            a.check(None, b"k", b"", PermType::Read),
            Err(ApiError::UserEmpty)
        );
        let by_cert = a.caller(&md, Some("root")).unwrap().unwrap();
        assert_eq!(by_cert.user, "root");
        a.check(Some(&by_cert), b"k", b"", PermType::Write).unwrap();
        a.check_admin(Some(&by_cert)).unwrap();
        let mut md = tonic::metadata::MetadataMap::new();
        md.insert("token", "nope.1".parse().unwrap());
        assert_eq!(a.caller(&md, None), Err(ApiError::InvalidAuthToken));
        a.replica()
            .apply(
                4,
                &change(auth_change::Change::Token(AuthToken {
                    user: "root".into(),
                    token: "nope.1".into(),
                })),
            )
            .unwrap();
        assert!(a.replica().knows_token("nope.1"));
        assert_eq!(a.caller(&md, None).unwrap().unwrap().user, "root");
        // What a Watch stream keeps of its request names the same caller.
        assert_eq!(request_token(&md), Some("nope.1"));
        assert_eq!(a.caller_by(Some("nope.1"), None), a.caller(&md, None));
        let mut gateway = tonic::metadata::MetadataMap::new();
        gateway.insert("authorization", "Bearer nope.1".parse().unwrap());
        assert_eq!(request_token(&gateway), Some("Bearer nope.1"));
        assert_eq!(a.caller(&gateway, None).unwrap().unwrap().user, "root");
        assert_eq!(
            a.caller_by(Some("other"), None),
            Err(ApiError::InvalidAuthToken)
        );
        let nobody = Caller {
            user: "eve".into(),
            revision: a.revision(),
        };
        assert_eq!(
            a.check(Some(&nobody), b"k", b"", PermType::Read),
            Err(ApiError::PermissionDenied)
        );
        assert_eq!(a.check_admin(Some(&nobody)), Err(ApiError::UserNotFound));
        let stale = Caller {
            user: "root".into(),
            revision: a.revision() - 1,
        };
        assert_eq!(
            a.check(Some(&stale), b"k", b"", PermType::Read),
            Err(ApiError::AuthOldRevision)
        );
    }
}
