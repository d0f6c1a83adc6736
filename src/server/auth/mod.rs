//! etcd's authentication and role-based access control.
//!
//! The users, roles and permissions ([`state`]) are changed only through shard
//! 0's Raft log: every member applies the same changes in the same order, keeps
//! the result in `<data dir>/auth.state`, and hands it to a member that catches
//! up by snapshot. The API services ask this member's [`AuthStore`] who a
//! request comes from ([`AuthStore::caller`]) and whether it may do what it
//! asks ([`AuthStore::check`]); with auth disabled both are one atomic load,
//! and with auth enabled they take no lock (the state is [`Published`]).

pub mod check;
mod file;
pub mod limiter;
pub mod perms;
pub mod published;
pub mod service;
pub mod state;
pub mod tokens;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cairn_proto::authpb::permission::Type as PermType;
use cairn_proto::cairnpb::{auth_change::Change, AuthChange, AuthState};
use prost::Message as _;

use crate::server::errors::ApiError;
use published::Published;
use state::AuthData;
use tokens::{JwtTokens, SimpleTokens, TokenKind};

/// The file holding this member's copy of the auth state.
pub const AUTH_FILE: &str = "auth.state";

/// The shard whose log carries the auth state.
pub const AUTH_SHARD: u32 = 0;

pub use crate::config::auth::AuthOptions;

/// Who a request comes from, once authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub user: String,
    /// The auth revision the caller's credentials were checked at: a JWT
    /// issued before a later change is refused as etcd refuses it.
    pub revision: u64,
}

/// This member's auth state and tokens.
pub struct AuthStore {
    /// Mirrors the state's flag, read without a lock on every request.
    enabled: AtomicBool,
    data: Published<AuthData>,
    file: file::StateFile,
    simple: SimpleTokens,
    jwt: Option<JwtTokens>,
    pub options: AuthOptions,
    pub limiter: limiter::FailureLimiter,
}

/// Why the auth state could not be loaded.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct AuthLoadError {
    pub path: PathBuf,
    pub reason: String,
}

impl AuthStore {
    /// Loads the auth state kept in `dir` (none yet: auth disabled, no users).
    pub fn open(dir: &Path, options: AuthOptions) -> Result<Arc<AuthStore>, AuthLoadError> {
        let path = dir.join(AUTH_FILE);
        let bad = |reason: String| AuthLoadError {
            path: path.clone(),
            reason,
        };
        let state = match crate::durable_file::read_checked(&path).map_err(bad)? {
            Some(body) => AuthState::decode(body.as_slice()).map_err(|e| bad(e.to_string()))?,
            None => AuthState::default(),
        };
        let jwt = match &options.token {
            TokenKind::Simple => None,
            TokenKind::Jwt(o) => Some(JwtTokens::load(o).map_err(|reason| AuthLoadError {
                path: o.pub_key.clone(),
                reason,
            })?),
        };
        Ok(Arc::new(AuthStore {
            enabled: AtomicBool::new(state.enabled),
            file: file::StateFile::new(dir, state.applied_index),
            data: Published::new(AuthData::new(state)),
            simple: SimpleTokens::new(options.simple_token_ttl),
            jwt,
            options,
            limiter: limiter::FailureLimiter::default(),
        }))
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Acquire)
    }

    pub fn revision(&self) -> u64 {
        self.with(|d| d.revision())
    }

    /// Reads the state (without a lock).
    pub fn with<T>(&self, f: impl FnOnce(&AuthData) -> T) -> T {
        self.data.read(f)
    }

    /// The state as shard 0's snapshots carry it.
    pub fn snapshot(&self) -> AuthState {
        self.with(|d| d.state().clone())
    }

    /// Applies a change committed at shard 0's log `index`. A change at or
    /// below the index the state already has (a replay after restart, or one
    /// a snapshot's state already holds) is skipped. A change to the state
    /// takes effect at once and is written to `auth.state` off the core;
    /// shard 0 commits its store past it only once it is written
    /// ([`AuthStore::unwritten`]).
    pub fn apply(&self, index: u64, change: &AuthChange) -> Result<(), ApiError> {
        let Some(change) = &change.change else {
            return Ok(());
        };
        if let Change::Token(t) = change {
            if self.is_enabled() {
                self.simple.assign(&t.token, &t.user);
            }
            return Ok(());
        }
        let mut data = self.data.write();
        if index <= data.get().applied_index() {
            return Ok(());
        }
        // A refused change leaves the state as it was: nothing to keep.
        let mut next = data.get().clone();
        next.apply(index, change)?;
        // Only a change that altered the state is written: replaying a
        // no-op after a restart is a no-op again.
        if next.revision() != data.get().revision() {
            self.file.queue(next.state().clone());
        }
        let enabled = next.enabled();
        data.set(next);
        self.enabled.store(enabled, Ordering::Release);
        match change {
            Change::UserDelete(r) => self.simple.invalidate_user(&r.name),
            Change::UserChangePassword(r) => self.simple.invalidate_user(&r.name),
            Change::Disable(_) => self.simple.clear(),
            _ => {}
        }
        Ok(())
    }

    /// Whether a change applied is not yet in `auth.state`, so that shard 0's
    /// store must not commit past it yet (a crash would then lose it: the
    /// log would not replay it), or why the file could not be written.
    pub fn unwritten(&self) -> Result<bool, String> {
        self.file.unwritten()
    }

    /// Takes the state a snapshot carried when it is newer than this one,
    /// written to `auth.state` on this thread first (an install runs off the
    /// core).
    pub fn install(&self, state: &AuthState) -> std::io::Result<()> {
        let mut data = self.data.write();
        if state.applied_index <= data.get().applied_index() {
            return Ok(());
        }
        self.file.write_now(state)?;
        data.set(AuthData::new(state.clone()));
        self.enabled.store(state.enabled, Ordering::Release);
        self.simple.clear();
        Ok(())
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
        if !self.is_enabled() {
            return Ok(None);
        }
        let token = metadata
            .get("token")
            .or_else(|| metadata.get("authorization"))
            .and_then(|v| v.to_str().ok());
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
                .simple
                .user_of(token)
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
            if state::has_root_role(user) {
                Ok(())
            } else {
                Err(ApiError::PermissionDenied)
            }
        })
    }

    /// Looks up a simple token's user without renewing it (for tests).
    #[cfg(test)]
    fn knows_token(&self, token: &str) -> bool {
        self.simple.user_of(token).is_some()
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
    use cairn_proto::cairnpb::{auth_change, AuthToken};
    use cairn_proto::etcdserverpb as pb;
    use std::time::Duration;

    fn options() -> AuthOptions {
        AuthOptions {
            token: TokenKind::Simple,
            simple_token_ttl: Duration::from_secs(60),
            bcrypt_cost: 4,
            client_cert_auth: true,
        }
    }

    fn change(c: Change) -> AuthChange {
        AuthChange { change: Some(c) }
    }

    fn enable_with_root(a: &AuthStore) {
        a.apply(
            1,
            &change(Change::UserAdd(pb::AuthUserAddRequest {
                name: "root".into(),
                hashed_password: "h".into(),
                ..Default::default()
            })),
        )
        .unwrap();
        a.apply(
            2,
            &change(Change::UserGrantRole(pb::AuthUserGrantRoleRequest {
                user: "root".into(),
                role: "root".into(),
            })),
        )
        .unwrap();
        a.apply(3, &change(Change::Enable(pb::AuthEnableRequest {})))
            .unwrap();
    }

    #[test]
    fn the_state_survives_reopening_and_replays_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let a = AuthStore::open(dir.path(), options()).unwrap();
        assert!(!a.is_enabled());
        enable_with_root(&a);
        assert!(a.is_enabled());
        let rev = a.revision();
        // A replayed entry (index at or below the state's) changes nothing.
        a.apply(
            2,
            &change(Change::RoleAdd(pb::AuthRoleAddRequest { name: "r".into() })),
        )
        .unwrap();
        assert_eq!(a.revision(), rev);
        // The file is written off the applying thread; shard 0 commits its
        // store only once it is.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while a.unwritten().unwrap() {
            assert!(
                std::time::Instant::now() < deadline,
                "auth.state never written"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        drop(a);
        let a = AuthStore::open(dir.path(), options()).unwrap();
        assert!(a.is_enabled());
        assert_eq!(a.revision(), rev);
        assert!(a.with(|d| d.role("r").is_none()));
    }

    #[test]
    fn callers_come_from_tokens_or_the_certificate_name() {
        let dir = tempfile::tempdir().unwrap();
        let a = AuthStore::open(dir.path(), options()).unwrap();
        let md = tonic::metadata::MetadataMap::new();
        assert_eq!(a.caller(&md, Some("root")), Ok(None), "auth disabled");
        enable_with_root(&a);
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
        a.apply(
            4,
            &change(auth_change::Change::Token(AuthToken {
                user: "root".into(),
                token: "nope.1".into(),
            })),
        )
        .unwrap();
        assert!(a.knows_token("nope.1"));
        assert_eq!(a.caller(&md, None).unwrap().unwrap().user, "root");
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
