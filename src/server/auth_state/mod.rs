//! This member's copy of the auth state: the users, roles and permissions
//! ([`state`]) and the simple tokens ([`simple_tokens`]), changed only
//! through shard 0's Raft log. Every member applies the same changes in the
//! same order (shard 0's driver calls [`AuthReplica::apply`]), keeps the
//! state in `<data dir>/auth.state` (written by a thread of its own:
//! [`LatestFile`]), and hands it to a member
//! that catches up by snapshot ([`AuthReplica::snapshot`],
//! [`AuthReplica::install`]).
//!
//! Below the shard driver that applies it; the access control above
//! (`auth/`: tokens, callers, permission checks, the Auth service) reads it
//! through [`AuthReplica::with`], without a lock (the state is
//! [`Published`]).

pub mod perms;
pub mod published;
pub mod simple_tokens;
pub mod state;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cairn_proto::cairnpb::{auth_change::Change, AuthChange, AuthState};
use prost::Message as _;

use crate::server::errors::ApiError;
use crate::server::latest_file::{LatestFile, WriterThread};
use published::Published;
use simple_tokens::SimpleTokens;
use state::AuthData;

/// The file holding this member's copy of the auth state.
pub const AUTH_FILE: &str = "auth.state";

/// The shard whose log carries the auth state.
pub const AUTH_SHARD: u32 = 0;

/// Why the auth state could not be loaded.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct AuthLoadError {
    pub path: PathBuf,
    pub reason: String,
}

/// This member's auth state and simple tokens, as shard 0's log made them.
pub struct AuthReplica {
    /// Mirrors the state's flag, read without a lock on every request.
    enabled: AtomicBool,
    data: Published<AuthData>,
    /// `auth.state`, numbered by the applied index of the state it holds.
    file: LatestFile<AuthState>,
    simple: SimpleTokens,
}

/// `auth.state` in `dir`, holding the state of `applied_index`, written by
/// a thread of its own.
fn state_file(dir: &Path, applied_index: u64) -> LatestFile<AuthState> {
    let dir = dir.to_path_buf();
    LatestFile::new(
        AUTH_FILE,
        applied_index,
        WriterThread::Own,
        move |state: &AuthState| {
            crate::server::crash_point::reached("auth-file-write");
            crate::durable_file::write_checked(&dir, AUTH_FILE, &state.encode_to_vec())
        },
    )
}

impl AuthReplica {
    /// Loads the auth state kept in `dir` (none yet: auth disabled, no
    /// users); simple tokens live `simple_token_ttl` without use.
    pub fn open(dir: &Path, simple_token_ttl: Duration) -> Result<AuthReplica, AuthLoadError> {
        let path = dir.join(AUTH_FILE);
        let bad = |reason: String| AuthLoadError {
            path: path.clone(),
            reason,
        };
        let state = match crate::durable_file::read_checked(&path).map_err(bad)? {
            Some(body) => AuthState::decode(body.as_slice()).map_err(|e| bad(e.to_string()))?,
            None => AuthState::default(),
        };
        Ok(AuthReplica {
            enabled: AtomicBool::new(state.enabled),
            file: state_file(dir, state.applied_index),
            data: Published::new(AuthData::new(state)),
            simple: SimpleTokens::new(simple_token_ttl),
        })
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
    /// ([`AuthReplica::unwritten`]).
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
            let state = next.state().clone();
            self.file.queue(state.applied_index, state);
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
        self.file.write_now(state.applied_index, state)?;
        data.set(AuthData::new(state.clone()));
        self.enabled.store(state.enabled, Ordering::Release);
        self.simple.clear();
        Ok(())
    }

    /// The user a simple token stands for, renewing its time to live.
    pub fn token_user(&self, token: &str) -> Option<String> {
        self.simple.user_of(token)
    }

    /// Looks up a simple token's user without renewing it (for tests).
    #[cfg(test)]
    pub fn knows_token(&self, token: &str) -> bool {
        self.simple.user_of(token).is_some()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use cairn_proto::etcdserverpb as pb;

    pub(crate) fn change(c: Change) -> AuthChange {
        AuthChange { change: Some(c) }
    }

    /// Adds root with the root role and enables auth.
    pub(crate) fn enable_with_root(a: &AuthReplica) {
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
        let a = AuthReplica::open(dir.path(), Duration::from_secs(60)).unwrap();
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
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while a.unwritten().unwrap() {
            assert!(
                std::time::Instant::now() < deadline,
                "auth.state never written"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(a);
        let a = AuthReplica::open(dir.path(), Duration::from_secs(60)).unwrap();
        assert!(a.is_enabled());
        assert_eq!(a.revision(), rev);
        assert!(a.with(|d| d.role("r").is_none()));
    }
}
