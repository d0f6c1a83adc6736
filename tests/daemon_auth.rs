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
//! cargo test --test daemon_auth -- --ignored etcd
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

mod auth;
mod common;
mod gateway_http;

/// Each scenario as two tests: `cairn` against Cairn, and `etcd` (ignored)
/// against a real etcd, with the same expectations.
macro_rules! against_cairn_and_etcd {
    ($($module:ident::$scenario:ident),* $(,)?) => {$(
        mod $scenario {
            use crate::auth::{$module::$scenario as scenario, Target};

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn cairn() {
                scenario(Target::Cairn).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[ignore = "verifies the expectations against etcd 3.4: cargo test --test daemon_auth -- --ignored etcd"]
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
