//! The Auth service and role-based access control, as etcd 3.4 does them:
//! users, roles and permissions managed with etcdctl and the etcd-client
//! crate, every KV, Watch, Lease, Cluster and Maintenance call checked against
//! the caller's permissions, simple tokens that expire when unused, auth
//! state that survives crashes and reaches a member by snapshot, the HTTP
//! gateway's tokens, and client certificates naming the user. Guards against
//! a store that lets a user read or write what no role grants (through a
//! transaction's compare, a watch, a lease, a `prev_kv`), against error codes
//! or messages that clients of etcd would not recognise, and against auth
//! state lost or stale on a member.
//!
//! Every scenario runs against Cairn (the `cairn` test of each module) and,
//! to verify its expectations, against a real 3-member etcd 3.4 cluster
//! started the same way (the ignored `etcd` test of each module):
//!
//! ```text
//! cargo test --test integration -- --ignored daemon_auth::
//! ```
//!
//! The limit on failed authentications is Cairn's own (etcd has none) and
//! runs against Cairn only.
//!
//! The scenarios, by concern: `auth/etcdctl.rs` (an operator's etcdctl
//! flow), `auth/rbac.rs` (every API against the caller's permissions),
//! `auth/tokens.rs` (token expiry, JWTs, the limit on failed
//! authentications), `auth/durability.rs` (crashes, catching up by
//! snapshot), `auth/transports.rs` (the gateway's token header, users named
//! by client certificates); `auth/mod.rs` starts the clusters.

#[path = "auth/mod.rs"]
mod auth;

use crate::common;

/// Each scenario as two tests: `cairn` against Cairn, and `etcd` (ignored)
/// against a real etcd, with the same expectations.
macro_rules! against_cairn_and_etcd {
    ($($module:ident::$scenario:ident),* $(,)?) => {$(
        mod $scenario {
            use super::auth::{$module::$scenario as scenario, Target};

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn cairn() {
                scenario(Target::Cairn).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[ignore = "verifies the expectations against etcd 3.4: cargo test --test integration -- --ignored daemon_auth::"]
            async fn etcd() {
                if crate::common::require_tool("etcd") {
                    scenario(Target::Etcd).await;
                }
            }
        }
    )*};
}

against_cairn_and_etcd!(
    etcdctl::etcdctl_manages_users_roles_and_permissions,
    rbac::every_api_checks_the_callers_permissions,
    tokens::an_unused_simple_token_expires_and_the_client_reauthenticates,
    durability::auth_state_survives_crashes_and_reaches_a_member_by_snapshot,
    transports::gateway_authenticates_with_a_token_header,
    transports::a_client_certificate_names_the_user,
    tokens::jwt_tokens_are_signed_and_accepted_by_every_member,
);

/// A member killed as it is about to write `auth.state` after applying a
/// new user comes back with the user: the file is written off the core after
/// the apply, and shard 0's store is not committed past the change until the
/// file has it, so the WAL replays it at the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_killed_before_its_auth_state_is_written_replays_the_change() {
    use std::time::Duration;

    use common::{client, eventually, wait_writable, Cluster};

    let mut flags = vec!["--shards", "2", "--cores", "1"];
    flags.extend(auth::FAST_BCRYPT);
    let mut cluster = Cluster::start(1, &flags);
    let m = &mut cluster.members[0];
    let mut c = client(&m.endpoint()).await;
    wait_writable(&mut c, "/auth-crash/ready").await;
    // The writer thread waits 1.5 s at the point before the kill while the
    // shards go on applying and committing: a store committed past the
    // change would keep the restart from replaying it.
    m.restart_armed("auth-file-write", 1500);
    let mut c = client(&m.endpoint()).await;
    wait_writable(&mut c, "/auth-crash/back").await;
    c.user_add("carol", "cpw", None).await.unwrap();
    // Writes meanwhile, on both shards, applied before the member dies
    // (the last of them may find it gone).
    for i in 0..50 {
        if c.put(format!("/a/after-user{i:02}"), "v", None)
            .await
            .is_err()
            || c.put(format!("/b/after-user{i:02}"), "v", None)
                .await
                .is_err()
        {
            break;
        }
    }
    let code = m.wait_exit(Duration::from_secs(120));
    let log = m.log_text();
    assert!(
        log.contains("crash point auth-file-write reached"),
        "exit {code:?}:\n{log}"
    );
    let file = m.data_dir.join("auth.state");
    let holds_carol = |path: &std::path::Path| {
        std::fs::read(path)
            .map(|b| b.windows(5).any(|w| w == b"carol"))
            .unwrap_or(false)
    };
    assert!(!holds_carol(&file), "the file was written before the crash");
    m.set_env(&[]);
    m.restart();
    let mut c = client(&m.endpoint()).await;
    wait_writable(&mut c, "/auth-crash/again").await;
    let users = c.user_list().await.unwrap().users().to_vec();
    assert!(
        users.iter().any(|u| u == "carol"),
        "the restarted member lost the user: {users:?}"
    );
    eventually("carol in auth.state", Duration::from_secs(60), || {
        let file = file.clone();
        async move {
            if holds_carol(&file) {
                Ok(())
            } else {
                Err("not yet".to_string())
            }
        }
    })
    .await;
}
