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

mod auth;
mod common;
mod gateway_http;

use std::time::{Duration, Instant};

use auth::{
    assert_refused, connect, connect_as, ctl, ctl_fails, ctl_ok, ctl_with, denied, eventually,
    maintenance_denied, wait_serving, wait_serving_as, Target, AUTH_FAILED, INVALID_TOKEN,
    PATIENCE, PERMISSION_DENIED, USER_EMPTY,
};
use common::require_tool;
use etcd_client::{
    Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, Permission, PutOptions,
    RoleRevokePermissionOptions, Txn, TxnOp, WatchOptions,
};
use serde_json::json;
use tonic::Code;

/// Each scenario as two tests: `cairn` against Cairn, and `etcd` (ignored)
/// against a real etcd, with the same expectations.
macro_rules! against_cairn_and_etcd {
    ($($scenario:ident),* $(,)?) => {$(
        mod $scenario {
            use super::Target;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn cairn() {
                super::$scenario(Target::Cairn).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[ignore = "verifies the expectations against etcd 3.4: cargo test --test daemon_auth -- --ignored etcd"]
            async fn etcd() {
                if crate::common::require_tool("etcd") {
                    super::$scenario(Target::Etcd).await;
                }
            }
        }
    )*};
}

against_cairn_and_etcd!(
    etcdctl_manages_users_roles_and_permissions,
    every_api_checks_the_callers_permissions,
    an_unused_simple_token_expires_and_the_client_reauthenticates,
    auth_state_survives_crashes_and_reaches_a_member_by_snapshot,
    gateway_authenticates_with_a_token_header,
    a_client_certificate_names_the_user,
    jwt_tokens_are_signed_and_accepted_by_every_member,
);

/// Bcrypt at its cheapest: the tests hash many passwords on a busy machine.
const FAST_BCRYPT: [&str; 2] = ["--bcrypt-cost", "4"];

/// etcdctl's output, trimmed, must be `expected`.
fn ctl_says(endpoint: &str, user: Option<&str>, args: &[&str], expected: &str) {
    let out = ctl_ok(endpoint, user, args);
    assert_eq!(out.trim(), expected, "etcdctl {user:?} {args:?}");
}

/// etcdctl's answer at `endpoint` eventually fails with `message`: a change
/// committed through another member reaches this one.
async fn ctl_eventually_fails(endpoint: &str, user: Option<&str>, args: &[&str], message: &str) {
    eventually(&format!("{args:?} refused at {endpoint}"), || async {
        let (ok, out) = ctl(endpoint, user, args);
        if !ok && out.contains(&format!("Error: {message}")) {
            Ok(())
        } else {
            Err(out)
        }
    })
    .await
}

async fn etcdctl_manages_users_roles_and_permissions(target: Target) {
    if !require_tool("etcdctl") {
        return;
    }
    let servers = target.start(&FAST_BCRYPT);
    wait_serving(&*servers).await;
    let eps = servers.endpoints();
    let ep = eps[0].as_str();
    let root = Some("root:rootpw");

    // etcd refuses to enable auth before a root user exists.
    ctl_fails(
        ep,
        None,
        &["auth", "enable"],
        "etcdserver: root user does not exist",
    );

    // Users, with either way of giving the password non-interactively.
    let add_root = [
        "user",
        "add",
        "root",
        "--new-user-password=rootpw",
        "--interactive=false",
    ];
    ctl_says(ep, None, &add_root, "User root created");
    ctl_fails(
        ep,
        None,
        &["user", "add", "root:other"],
        "etcdserver: user name already exists",
    );
    ctl_says(
        ep,
        None,
        &["user", "add", "alice:apw"],
        "User alice created",
    );
    ctl_says(
        ep,
        None,
        &[
            "user",
            "add",
            "bob",
            "--new-user-password=bpw",
            "--interactive=false",
        ],
        "User bob created",
    );

    // Roles and permissions: one key, a prefix, a range, from a key on.
    ctl_says(ep, None, &["role", "add", "reader"], "Role reader created");
    ctl_fails(
        ep,
        None,
        &["role", "add", "reader"],
        "etcdserver: role name already exists",
    );
    ctl_says(ep, None, &["role", "add", "writer"], "Role writer created");
    for grant in [
        &["reader", "read", "/r/a"][..],
        &["reader", "read", "/p/", "--prefix"],
        &["reader", "readwrite", "/range/a", "/range/m"],
        &["writer", "write", "/w/", "--prefix"],
        &["writer", "readwrite", "/z", "--from-key"],
    ] {
        let mut args = vec!["role", "grant-permission"];
        args.extend_from_slice(grant);
        ctl_says(ep, None, &args, &format!("Role {} updated", grant[0]));
    }
    ctl_fails(
        ep,
        None,
        &["role", "grant-permission", "nope", "read", "/x"],
        "etcdserver: role name not found",
    );

    // Roles granted to users; etcd accepts a role granted twice.
    for _ in 0..2 {
        ctl_says(
            ep,
            None,
            &["user", "grant-role", "alice", "reader"],
            "Role reader is granted to user alice",
        );
    }
    ctl_says(
        ep,
        None,
        &["user", "grant-role", "bob", "writer"],
        "Role writer is granted to user bob",
    );
    ctl_fails(
        ep,
        None,
        &["user", "grant-role", "carol", "reader"],
        "etcdserver: user name not found",
    );
    ctl_fails(
        ep,
        None,
        &["user", "grant-role", "alice", "nope"],
        "etcdserver: role name not found",
    );
    ctl_fails(
        ep,
        None,
        &["user", "revoke-role", "alice", "writer"],
        "etcdserver: role is not granted to the user",
    );

    // What etcdctl shows of them.
    ctl_says(
        ep,
        None,
        &["user", "get", "alice"],
        "User: alice\nRoles: reader",
    );
    ctl_fails(
        ep,
        None,
        &["user", "get", "carol"],
        "etcdserver: user name not found",
    );
    ctl_says(ep, None, &["user", "list"], "alice\nbob\nroot");
    ctl_says(
        ep,
        None,
        &["role", "get", "reader"],
        "Role reader\nKV Read:\n\t[/p/, /p0) (prefix /p/)\n\t/r/a\n\t[/range/a, /range/m)\n\
         KV Write:\n\t[/range/a, /range/m)",
    );
    ctl_says(
        ep,
        None,
        &["role", "get", "writer"],
        "Role writer\nKV Read:\n\t[/z, <open ended>\nKV Write:\n\t[/w/, /w0) (prefix /w/)\n\
         \t[/z, <open ended>",
    );
    ctl_fails(
        ep,
        None,
        &["role", "get", "nope"],
        "etcdserver: role name not found",
    );
    ctl_says(ep, None, &["role", "list"], "reader\nwriter");
    ctl_fails(
        ep,
        None,
        &["role", "revoke-permission", "reader", "/nothing"],
        "etcdserver: permission is not granted to the role",
    );
    ctl_fails(
        ep,
        None,
        &["role", "revoke-permission", "nope", "/r/a"],
        "etcdserver: role name not found",
    );

    for (key, value) in [("/r/a", "1"), ("/p/1", "p"), ("/range/c", "c"), ("/s", "s")] {
        ctl_says(ep, None, &["put", key, value], "OK");
    }
    ctl_says(ep, None, &["auth", "enable"], "Authentication Enabled");
    // Enabling auth made the role root and gave it to the root user.
    ctl_says(ep, root, &["role", "list"], "reader\nroot\nwriter");
    ctl_says(
        ep,
        root,
        &["user", "get", "root"],
        "User: root\nRoles: root",
    );

    // No user, a wrong password, an unknown user; at every member.
    for ep in &eps {
        ctl_eventually_fails(ep, None, &["get", "/r/a"], USER_EMPTY).await;
        ctl_fails(ep, Some("root:bad"), &["get", "/r/a"], AUTH_FAILED);
        ctl_fails(ep, Some("nobody:x"), &["get", "/r/a"], AUTH_FAILED);
    }
    ctl_fails(ep, None, &["user", "list"], USER_EMPTY);

    // alice reads /r/a, the /p/ prefix, and reads and writes [/range/a, /range/m).
    let alice = Some("alice:apw");
    ctl_says(ep, alice, &["get", "/r/a"], "/r/a\n1");
    ctl_says(ep, alice, &["get", "/p/", "--prefix"], "/p/1\np");
    ctl_says(ep, alice, &["put", "/range/c", "c2"], "OK");
    ctl_says(ep, alice, &["get", "/range/a", "/range/m"], "/range/c\nc2");
    for denied in [
        &["put", "/r/a", "2"][..],
        &["get", "/r/b"],
        &["get", "/s"],
        &["put", "/p/2", "x"],
        &["get", "/range/a", "/range/n"],
        &["get", "/r/", "--prefix"],
        &["user", "get", "bob"],
        &["user", "add", "eve:e"],
        &["role", "list"],
        &["auth", "disable"],
    ] {
        ctl_fails(ep, alice, denied, PERMISSION_DENIED);
    }
    // A user may look at itself.
    ctl_says(
        ep,
        alice,
        &["user", "get", "alice"],
        "User: alice\nRoles: reader",
    );

    // bob writes under /w/ without reading it, and owns /z onwards.
    let bob = Some("bob:bpw");
    ctl_says(ep, bob, &["put", "/w/1", "w"], "OK");
    ctl_fails(ep, bob, &["get", "/w/1"], PERMISSION_DENIED);
    ctl_says(ep, bob, &["put", "/zz", "z"], "OK");
    ctl_says(ep, bob, &["get", "/zz"], "/zz\nz");
    ctl_fails(ep, bob, &["put", "/a", "x"], PERMISSION_DENIED);

    // A new password (non-interactive: read from stdin); only root may set it.
    let passwd = ["user", "passwd", "alice", "--interactive=false"];
    let (ok, out) = ctl_with(ep, &["--user=root:rootpw".into()], &passwd, Some("a2\n"));
    assert!(ok && out.trim() == "Password updated", "{out}");
    ctl_fails(ep, alice, &["get", "/r/a"], AUTH_FAILED);
    let alice = Some("alice:a2");
    ctl_says(ep, alice, &["get", "/r/a"], "/r/a\n1");
    let (ok, out) = ctl_with(ep, &["--user=alice:a2".into()], &passwd, Some("a3\n"));
    assert!(
        !ok && out.contains(&format!("Error: {PERMISSION_DENIED}")),
        "{out}"
    );

    // The role named root grants everything.
    ctl_says(
        ep,
        root,
        &["user", "grant-role", "bob", "root"],
        "Role root is granted to user bob",
    );
    ctl_says(ep, bob, &["get", "/s"], "/s\ns");
    ctl_says(ep, bob, &["role", "list"], "reader\nroot\nwriter");
    ctl_says(ep, bob, &["user", "add", "eve:e"], "User eve created");
    ctl_says(
        ep,
        root,
        &["user", "revoke-role", "bob", "root"],
        "Role root is revoked from user bob",
    );
    ctl_fails(ep, bob, &["get", "/s"], PERMISSION_DENIED);

    // Revoked permissions and roles stop working, at every member.
    ctl_says(
        ep,
        root,
        &["role", "revoke-permission", "reader", "/r/a"],
        "Permission of key /r/a is revoked from role reader",
    );
    ctl_says(
        ep,
        root,
        &["role", "revoke-permission", "reader", "/p/", "--prefix"],
        "Permission of range [/p/, /p0) is revoked from role reader",
    );
    ctl_says(
        ep,
        root,
        &[
            "role",
            "revoke-permission",
            "reader",
            "/range/a",
            "/range/m",
        ],
        "Permission of range [/range/a, /range/m) is revoked from role reader",
    );
    ctl_says(
        ep,
        root,
        &["role", "get", "reader"],
        "Role reader\nKV Read:\nKV Write:",
    );
    for ep in &eps {
        ctl_eventually_fails(ep, alice, &["get", "/r/a"], PERMISSION_DENIED).await;
    }
    ctl_says(
        ep,
        root,
        &["user", "revoke-role", "bob", "writer"],
        "Role writer is revoked from user bob",
    );
    ctl_fails(ep, bob, &["put", "/w/1", "w"], PERMISSION_DENIED);

    // Deleted users and roles.
    ctl_says(ep, root, &["user", "delete", "bob"], "User bob deleted");
    ctl_fails(
        ep,
        root,
        &["user", "delete", "bob"],
        "etcdserver: user name not found",
    );
    ctl_fails(ep, bob, &["get", "/zz"], AUTH_FAILED);
    ctl_says(
        ep,
        root,
        &["role", "delete", "writer"],
        "Role writer deleted",
    );
    ctl_fails(
        ep,
        root,
        &["role", "delete", "writer"],
        "etcdserver: role name not found",
    );
    ctl_says(ep, root, &["role", "list"], "reader\nroot");
    ctl_says(ep, root, &["user", "list"], "alice\neve\nroot");
    // Nothing may leave auth enabled without a working root.
    for args in [
        &["role", "delete", "root"][..],
        &["user", "delete", "root"],
        &["user", "revoke-role", "root", "root"],
    ] {
        ctl_fails(ep, root, args, "etcdserver: invalid auth management");
    }

    // Disabled: anyone does anything again, and the users and roles remain.
    ctl_says(ep, root, &["auth", "disable"], "Authentication Disabled");
    for ep in &eps {
        eventually(&format!("{ep} serves without a user"), || async {
            let (ok, out) = ctl(ep, None, &["get", "/s"]);
            (ok && out.trim() == "/s\ns").then_some(()).ok_or(out)
        })
        .await;
    }
    ctl_says(ep, None, &["user", "list"], "alice\neve\nroot");
    ctl_says(ep, None, &["auth", "disable"], "Authentication Disabled");
}

/// Roles of `every_api_checks_the_callers_permissions`: alice reads and
/// writes /a/, reads /ro/, writes /wo/; nothing grants /secret/.
async fn set_up_alice(admin: &mut etcd_client::Client) {
    admin.user_add("root", "rootpw", None).await.unwrap();
    admin.user_add("alice", "apw", None).await.unwrap();
    admin.role_add("app").await.unwrap();
    for perm in [
        Permission::read_write("/a/").with_prefix(),
        Permission::read("/ro/").with_prefix(),
        Permission::write("/wo/").with_prefix(),
    ] {
        admin.role_grant_permission("app", perm).await.unwrap();
    }
    admin.user_grant_role("alice", "app").await.unwrap();
}

/// Enables auth through the API: unlike `etcdctl auth enable`, which makes
/// the role root and grants it to the root user first, AuthEnable wants
/// both to exist.
async fn enable_auth(admin: &mut etcd_client::Client) {
    admin.role_add("root").await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.auth_enable().await.unwrap();
}

async fn every_api_checks_the_callers_permissions(target: Target) {
    let servers = target.start(&FAST_BCRYPT);
    wait_serving(&*servers).await;
    let ep = servers.endpoints()[0].clone();
    let mut admin = connect(&ep, None).await.unwrap();
    assert_refused(
        "auth enable without a root user",
        admin.auth_enable().await,
        Code::FailedPrecondition,
        "etcdserver: root user does not exist",
    );
    set_up_alice(&mut admin).await;
    assert_refused(
        "auth enable without the role root",
        admin.auth_enable().await,
        Code::FailedPrecondition,
        "etcdserver: root user does not have root role",
    );

    // Authenticate while auth is off.
    let with_alice = || ConnectOptions::new().with_user("alice", "apw");
    assert_refused(
        "authenticate with auth disabled",
        connect(&ep, Some(with_alice())).await,
        Code::FailedPrecondition,
        "etcdserver: authentication is not enabled",
    );
    for key in ["/secret/x", "/ro/x", "/a/x", "/wo/x"] {
        admin.put(key, "v0", None).await.unwrap();
    }
    enable_auth(&mut admin).await;

    // No token at all, a wrong password, an unknown user.
    assert_refused(
        "range without a user",
        admin.get("/a/x", None).await,
        Code::InvalidArgument,
        USER_EMPTY,
    );
    for (user, password) in [("alice", "wrong"), ("nobody", "apw")] {
        let options = ConnectOptions::new().with_user(user, password);
        assert_refused(
            &format!("authenticate {user}:{password}"),
            connect(&ep, Some(options)).await,
            Code::InvalidArgument,
            AUTH_FAILED,
        );
    }
    let mut root = connect_as(&ep, "root", "rootpw").await;
    let mut alice = connect_as(&ep, "alice", "apw").await;
    let prefix = || Some(GetOptions::new().with_prefix());

    // Range.
    assert_eq!(alice.get("/a/x", None).await.unwrap().count(), 1);
    assert_eq!(alice.get("/a/", prefix()).await.unwrap().count(), 1);
    assert_eq!(alice.get("/ro/x", None).await.unwrap().count(), 1);
    denied("range /secret/x", alice.get("/secret/x", None).await);
    denied("range /wo/x", alice.get("/wo/x", None).await);
    denied("range over everything", alice.get("/", prefix()).await);

    // Put; prev_kv needs read permission as well.
    let prev_kv = || Some(PutOptions::new().with_prev_key());
    alice.put("/a/x", "v1", None).await.unwrap();
    alice.put("/wo/x", "v1", None).await.unwrap();
    let r = alice.put("/a/x", "v2", prev_kv()).await.unwrap();
    assert_eq!(r.prev_key().map(|kv| kv.value()), Some(&b"v1"[..]));
    denied("put /ro/x", alice.put("/ro/x", "v", None).await);
    denied("put /secret/x", alice.put("/secret/x", "v", None).await);
    denied(
        "put /wo/x with prev_kv",
        alice.put("/wo/x", "v", prev_kv()).await,
    );

    // DeleteRange; prev_kv needs read permission as well.
    denied("delete /secret/x", alice.delete("/secret/x", None).await);
    denied("delete /ro/x", alice.delete("/ro/x", None).await);
    denied(
        "delete /wo/ with prev_kv",
        alice
            .delete(
                "/wo/",
                Some(DeleteOptions::new().with_prefix().with_prev_key()),
            )
            .await,
    );
    assert_eq!(alice.delete("/wo/x", None).await.unwrap().deleted(), 1);

    // Txn: a compare reads its key, so a forbidden compare is refused though
    // every op is permitted; an op on a forbidden key is refused, in either
    // branch, whichever branch runs.
    let secret_is_v0 = || Compare::value("/secret/x", CompareOp::Equal, "v0");
    let a_is_v2 = || Compare::value("/a/x", CompareOp::Equal, "v2");
    denied(
        "txn comparing /secret/x",
        alice
            .txn(
                Txn::new()
                    .when([secret_is_v0()])
                    .and_then([TxnOp::put("/a/t1", "1", None)]),
            )
            .await,
    );
    denied(
        "txn putting /secret/y",
        alice
            .txn(
                Txn::new()
                    .when([a_is_v2()])
                    .and_then([TxnOp::put("/secret/y", "1", None)]),
            )
            .await,
    );
    denied(
        "txn with /secret/z in the branch that does not run",
        alice
            .txn(
                Txn::new()
                    .when([a_is_v2()])
                    .and_then([TxnOp::put("/a/t2", "1", None)])
                    .or_else([TxnOp::put("/secret/z", "1", None)]),
            )
            .await,
    );
    denied(
        "txn reading /wo/x",
        alice
            .txn(Txn::new().and_then([TxnOp::get("/wo/x", None)]))
            .await,
    );
    let r = alice
        .txn(
            Txn::new()
                .when([a_is_v2()])
                .and_then([TxnOp::put("/a/t3", "1", None), TxnOp::get("/ro/x", None)]),
        )
        .await
        .unwrap();
    assert!(r.succeeded());
    for key in ["/a/t1", "/a/t2", "/secret/y", "/secret/z"] {
        let r = root.get(key, None).await.unwrap();
        assert_eq!(r.count(), 0, "{key} was written by a refused txn");
    }
    assert_eq!(root.get("/a/t3", None).await.unwrap().count(), 1);

    // Watch: a forbidden range is created and cancelled at once, with
    // etcd's reason; a permitted one delivers events.
    let mut forbidden = alice
        .watch("/secret/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    let first = tokio::time::timeout(PATIENCE, forbidden.message())
        .await
        .expect("no answer to a forbidden watch")
        .expect("watch stream failed")
        .expect("watch stream ended");
    assert!(first.created() && first.canceled(), "{first:?}");
    assert_eq!(
        first.cancel_reason(),
        "rpc error: code = PermissionDenied desc = etcdserver: permission denied"
    );
    let mut permitted = alice
        .watch("/a/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    let created = permitted.message().await.unwrap().unwrap();
    assert!(created.created() && !created.canceled(), "{created:?}");
    root.put("/a/watched", "w", None).await.unwrap();
    let event = tokio::time::timeout(PATIENCE, permitted.message())
        .await
        .expect("no event on a permitted watch")
        .unwrap()
        .unwrap();
    assert_eq!(event.events()[0].kv().unwrap().key(), b"/a/watched");

    // LeaseRevoke deletes the lease's keys, so it needs write permission on
    // every one of them.
    let lease = root.lease_grant(60, None).await.unwrap().id();
    let with_lease = |id| Some(PutOptions::new().with_lease(id));
    root.put("/secret/leased", "l", with_lease(lease))
        .await
        .unwrap();
    denied(
        "revoke a lease holding /secret/leased",
        alice.lease_revoke(lease).await,
    );
    assert_eq!(root.get("/secret/leased", None).await.unwrap().count(), 1);
    let own = alice.lease_grant(60, None).await.unwrap().id();
    alice.put("/a/leased", "l", with_lease(own)).await.unwrap();
    alice.lease_revoke(own).await.unwrap();
    assert_eq!(root.get("/a/leased", None).await.unwrap().count(), 0);
    root.lease_revoke(lease).await.unwrap();

    // Compact and MemberList are open to any user in etcd 3.4; MemberAdd
    // is root's.
    let revision = root
        .put("/a/rev", "r", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    alice.compact(revision, None).await.unwrap();
    assert_eq!(alice.member_list().await.unwrap().members().len(), 3);
    denied(
        "member add",
        alice
            .member_add(
                [format!("http://127.0.0.1:{}", common::free_port())],
                Some(etcd_client::MemberAddOptions::new().with_is_learner()),
            )
            .await,
    );
    assert_eq!(root.member_list().await.unwrap().members().len(), 3);

    // Maintenance: Status is open; Defragment, Snapshot and HashKV are
    // root's, refused with the auth package's own error (code Unknown).
    alice.status().await.unwrap();
    maintenance_denied("defragment", alice.defragment().await);
    maintenance_denied("hash kv", alice.hash_kv(0).await);
    let snapshot = match alice.snapshot().await {
        Ok(mut stream) => stream.message().await.map(|_| ()),
        Err(e) => Err(e),
    };
    maintenance_denied("snapshot", snapshot);
    root.defragment().await.unwrap();
    root.hash_kv(0).await.unwrap();
    let mut stream = root.snapshot().await.unwrap();
    assert!(!stream.message().await.unwrap().unwrap().blob().is_empty());

    // The Auth service: a user may read itself and its roles, nothing else.
    let me = alice.user_get("alice").await.unwrap();
    assert_eq!(me.roles(), ["app"]);
    let app = alice.role_get("app").await.unwrap();
    assert_eq!(app.permissions().len(), 3);
    denied("user get root", alice.user_get("root").await);
    denied("user list", alice.user_list().await);
    denied("role add", alice.role_add("mine").await);
    denied("role get root", alice.role_get("root").await);
    denied("auth disable", alice.auth_disable().await);
    let mut users = root.user_list().await.unwrap().users().to_vec();
    users.sort();
    assert_eq!(users, ["alice", "root"]);
}

async fn an_unused_simple_token_expires_and_the_client_reauthenticates(target: Target) {
    const TTL: Duration = Duration::from_secs(2);
    let mut flags = FAST_BCRYPT.to_vec();
    flags.extend(["--auth-token-ttl", "2"]);
    let servers = target.start(&flags);
    wait_serving(&*servers).await;
    let ep = servers.endpoints()[0].clone();
    let mut admin = connect(&ep, None).await.unwrap();
    set_up_alice(&mut admin).await;
    enable_auth(&mut admin).await;

    // The crate refreshes a token only when asked to.
    let mut plain = connect_as(&ep, "alice", "apw").await;
    let options = ConnectOptions::new()
        .with_user("alice", "apw")
        .with_auto_token_refresh(true);
    let mut auto = connect(&ep, Some(options)).await.unwrap();

    // A token in use does not expire: its TTL counts from its last use.
    let start = Instant::now();
    while start.elapsed() < TTL * 2 {
        plain.get("/a/x", None).await.unwrap();
        tokio::time::sleep(TTL / 5).await;
    }

    // Unused for longer than the TTL, it is refused.
    let deadline = Instant::now() + PATIENCE;
    let expired = loop {
        tokio::time::sleep(TTL + Duration::from_secs(1)).await;
        match plain.get("/a/x", None).await {
            Ok(_) => assert!(Instant::now() < deadline, "the token never expired"),
            Err(e) => break common::status_of(e),
        }
    };
    assert_eq!(
        (expired.code(), expired.message()),
        (Code::Unauthenticated, INVALID_TOKEN)
    );
    // It stays refused until the client authenticates again.
    assert_refused(
        "a call with the expired token",
        plain.get("/a/x", None).await,
        Code::Unauthenticated,
        INVALID_TOKEN,
    );
    plain.refresh_token().await.unwrap();
    plain.put("/a/after", "1", None).await.unwrap();

    // A client with automatic refresh, idle as long, re-authenticates by
    // itself and its call goes through.
    auto.put("/a/auto", "1", None).await.unwrap();
    assert_eq!(auto.get("/a/auto", None).await.unwrap().count(), 1);
}

/// The state `auth_state_survives_crashes_and_reaches_a_member_by_snapshot`
/// sets up, as seen through `ep`.
async fn check_first_state(ep: &str) {
    let mut alice = connect_as(ep, "alice", "apw").await;
    alice.put("/a/x", "1", None).await.unwrap();
    assert_eq!(alice.get("/ro/x", None).await.unwrap().count(), 1);
    assert_refused(
        "alice puts /ro/x",
        alice.put("/ro/x", "v", None).await,
        Code::PermissionDenied,
        PERMISSION_DENIED,
    );
    let mut bob = connect_as(ep, "bob", "bpw").await;
    bob.put("/anything", "b", None).await.unwrap();
    let mut anonymous = connect(ep, None).await.unwrap();
    assert_refused(
        "a call without a user",
        anonymous.get("/a/x", None).await,
        Code::InvalidArgument,
        USER_EMPTY,
    );
    let mut root = connect_as(ep, "root", "rootpw").await;
    let mut users = root.user_list().await.unwrap().users().to_vec();
    users.sort();
    assert_eq!(users, ["alice", "bob", "root"], "at {ep}");
    assert_eq!(root.role_get("app").await.unwrap().permissions().len(), 2);
}

async fn auth_state_survives_crashes_and_reaches_a_member_by_snapshot(target: Target) {
    if !require_tool("etcdctl") {
        return;
    }
    let mut flags = FAST_BCRYPT.to_vec();
    flags.extend(["--snapshot-count", "100"]);
    let mut servers = target.start(&flags);
    wait_serving(&*servers).await;
    let eps = servers.endpoints();
    let mut admin = connect(&eps[0], None).await.unwrap();
    admin.user_add("root", "rootpw", None).await.unwrap();
    admin.user_add("alice", "apw", None).await.unwrap();
    admin.user_add("bob", "bpw", None).await.unwrap();
    admin.role_add("app").await.unwrap();
    admin
        .role_grant_permission("app", Permission::read_write("/a/").with_prefix())
        .await
        .unwrap();
    admin
        .role_grant_permission("app", Permission::read("/ro/").with_prefix())
        .await
        .unwrap();
    admin.user_grant_role("alice", "app").await.unwrap();
    admin.put("/ro/x", "r", None).await.unwrap();
    enable_auth(&mut admin).await;
    let mut root = connect_as(&eps[0], "root", "rootpw").await;
    root.user_grant_role("bob", "root").await.unwrap();
    for ep in &eps {
        wait_serving_as(ep, "root", "rootpw", "/ready").await;
        check_first_state(ep).await;
    }

    // kill -9 of every member, then all restart.
    for m in 0..3 {
        servers.kill9(m);
    }
    for m in 0..3 {
        servers.restart(m);
    }
    for ep in &eps {
        wait_serving_as(ep, "root", "rootpw", "/ready").await;
        check_first_state(ep).await;
    }

    // A member stopped while the state changes and the log moves on.
    servers.kill9(2);
    let mut root = connect_as(&eps[0], "root", "rootpw").await;
    root.role_revoke_permission(
        "app",
        "/ro/",
        Some(RoleRevokePermissionOptions::new().with_prefix()),
    )
    .await
    .unwrap();
    root.user_add("carol", "cpw", None).await.unwrap();
    root.role_add("c").await.unwrap();
    root.role_grant_permission("c", Permission::read_write("/c/").with_prefix())
        .await
        .unwrap();
    root.user_grant_role("carol", "c").await.unwrap();
    root.user_change_password("alice", "apw2").await.unwrap();
    root.user_delete("bob").await.unwrap();
    root.put("/c/x", "c", None).await.unwrap();
    let writes = servers.writes_past_the_log();
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let mut c = root.clone();
            tokio::spawn(async move {
                for i in (w..writes).step_by(8) {
                    c.put(format!("/fill/{i:05}"), "f", None).await.unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    let last = format!("/fill/{:05}", writes - 1);
    servers.restart(2);

    // It catches up by snapshot, then answers from the new state alone.
    let ep2 = eps[2].as_str();
    let serializable = "--consistency=s";
    eventually(&format!("{ep2} caught up"), || async {
        let (ok, out) = ctl(
            ep2,
            Some("root:rootpw"),
            &["get", &last, serializable, "--print-value-only"],
        );
        (ok && out.trim() == "f").then_some(()).ok_or(out)
    })
    .await;
    assert!(
        servers.installed_snapshot(2),
        "the member caught up without a snapshot\n{}",
        servers.logs()
    );
    ctl_fails(
        ep2,
        Some("alice:apw"),
        &["get", "/a/x", serializable],
        AUTH_FAILED,
    );
    let alice = Some("alice:apw2");
    ctl_says(ep2, alice, &["get", "/a/x", serializable], "/a/x\n1");
    ctl_fails(
        ep2,
        alice,
        &["get", "/ro/x", serializable],
        PERMISSION_DENIED,
    );
    ctl_says(
        ep2,
        Some("carol:cpw"),
        &["get", "/c/x", serializable],
        "/c/x\nc",
    );
    ctl_fails(
        ep2,
        Some("bob:bpw"),
        &["get", "/a/x", serializable],
        AUTH_FAILED,
    );
    ctl_fails(ep2, None, &["get", "/a/x", serializable], USER_EMPTY);
}

async fn gateway_authenticates_with_a_token_header(target: Target) {
    let servers = target.start(&FAST_BCRYPT);
    wait_serving(&*servers).await;
    let ep = servers.endpoints()[0].clone();
    let mut admin = connect(&ep, None).await.unwrap();
    set_up_alice(&mut admin).await;
    enable_auth(&mut admin).await;
    let post = |path: &str, body: &str, token: Option<&str>| {
        let headers: Vec<(&str, &str)> = token.map(|t| ("Authorization", t)).into_iter().collect();
        gateway_http::request_with(&ep, "POST", path, body.as_bytes(), &headers)
    };
    let error =
        |message: &str, code: u32| json!({"error": message, "message": message, "code": code});

    let answer = post(
        "/v3/auth/authenticate",
        r#"{"name":"alice","password":"apw"}"#,
        None,
    );
    assert_eq!(answer.status, 200, "{}", answer.text());
    let body = answer.json();
    let mut fields: Vec<&String> = body.as_object().unwrap().keys().collect();
    fields.sort();
    assert_eq!(fields, ["header", "token"], "{body}");
    assert!(body["header"]["revision"].is_string(), "{body}");
    let token = body["token"].as_str().unwrap().to_string();
    assert!(!token.is_empty());

    // "/a/x" and "/secret/x" in base64.
    let a_x = r#"{"key":"L2EveA=="}"#;
    let secret_x = r#"{"key":"L3NlY3JldC94"}"#;
    let put = post(
        "/v3/kv/put",
        r#"{"key":"L2EveA==","value":"MQ=="}"#,
        Some(&token),
    );
    assert_eq!(put.status, 200, "{}", put.text());
    let range = post("/v3/kv/range", a_x, Some(&token));
    assert_eq!(range.status, 200, "{}", range.text());
    assert_eq!(range.json()["count"], "1");
    assert_eq!(range.json()["kvs"][0]["value"], "MQ==");
    // A simple token reaches the other members through the log (the member
    // that makes it puts it in the Authenticate entry): they accept it too.
    for other in &servers.endpoints()[1..] {
        eventually(&format!("{other} accepts the token"), || async {
            let answer = gateway_http::request_with(
                other,
                "POST",
                "/v3/kv/range",
                a_x.as_bytes(),
                &[("Authorization", &token)],
            );
            (answer.status == 200)
                .then_some(())
                .ok_or_else(|| answer.text())
        })
        .await;
    }

    let refusals = [
        ("no token", "/v3/kv/range", a_x, None, 400, USER_EMPTY, 3),
        (
            "forbidden key",
            "/v3/kv/range",
            secret_x,
            Some(token.as_str()),
            403,
            PERMISSION_DENIED,
            7,
        ),
        (
            "unknown token",
            "/v3/kv/range",
            a_x,
            Some("bogus"),
            401,
            INVALID_TOKEN,
            16,
        ),
        (
            "wrong password",
            "/v3/auth/authenticate",
            r#"{"name":"alice","password":"nope"}"#,
            None,
            400,
            AUTH_FAILED,
            3,
        ),
        (
            "a user's token for root's call",
            "/v3/auth/user/list",
            "{}",
            Some(token.as_str()),
            403,
            PERMISSION_DENIED,
            7,
        ),
    ];
    for (what, path, body, token, status, message, code) in refusals {
        let answer = post(path, body, token);
        assert_eq!(
            (answer.status, answer.json()),
            (status, error(message, code)),
            "{what}"
        );
    }

    let root = post(
        "/v3/auth/authenticate",
        r#"{"name":"root","password":"rootpw"}"#,
        None,
    );
    let root_token = root.json()["token"].as_str().unwrap().to_string();
    let users = post("/v3/auth/user/list", "{}", Some(&root_token));
    assert_eq!(users.status, 200, "{}", users.text());
    assert_eq!(users.json()["users"], json!(["alice", "root"]));
}

async fn a_client_certificate_names_the_user(target: Target) {
    use common::tls::{mutual_tls_flags, Ca, Certs};

    if !require_tool("etcdctl") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("auth test CA");
    let d = dir.path();
    let server = Certs::write(d, "server", &ca, "server");
    let peer = Certs::write(d, "peer", &ca, "peer");
    let as_cn = |cn: &str| Certs::write(d, cn, &ca, cn).etcdctl_args();
    let (root, alice, mallory) = (as_cn("root"), as_cn("alice"), as_cn("mallory"));
    let mut flags = mutual_tls_flags(&server, &peer);
    flags.extend(FAST_BCRYPT.iter().map(|s| s.to_string()));
    let servers = target.start_in(dir, "https", &vec![flags; 3]);
    let ep = servers.endpoints()[0].clone();
    let ep = ep.as_str();
    let run = |tls: &[String], args: &[&str]| ctl_with(ep, tls, args, None);
    eventually("the TLS cluster serves", || async {
        let (ok, out) = run(&root, &["put", "/ready", "1"]);
        ok.then_some(()).ok_or(out)
    })
    .await;

    for args in [
        &["user", "add", "root:rootpw"][..],
        &["user", "add", "alice:apw"],
        &["user", "add", "bob:bpw"],
        &["role", "add", "app"],
        &[
            "role",
            "grant-permission",
            "app",
            "readwrite",
            "/a/",
            "--prefix",
        ],
        &["user", "grant-role", "alice", "app"],
        &["put", "/secret", "s"],
        &["put", "/a/x", "1"],
        &["auth", "enable"],
    ] {
        let (ok, out) = run(&root, args);
        assert!(ok, "{args:?}: {out}");
    }

    // No --user: the certificate's CN is the user.
    let (ok, out) = run(&alice, &["get", "/a/x", "--print-value-only"]);
    assert!(ok && out.trim() == "1", "{out}");
    let (ok, out) = run(&alice, &["put", "/a/y", "2"]);
    assert!(ok, "{out}");
    for (who, tls) in [("alice", &alice), ("mallory", &mallory)] {
        let (ok, out) = run(tls, &["get", "/secret"]);
        assert!(
            !ok && out.contains(&format!("Error: {PERMISSION_DENIED}")),
            "{who}: {out}"
        );
    }
    let (ok, out) = run(&root, &["user", "list"]);
    assert!(ok && out.trim() == "alice\nbob\nroot", "{out}");
    let (ok, out) = run(&root, &["get", "/secret", "--print-value-only"]);
    assert!(ok && out.trim() == "s", "{out}");

    // A token takes precedence over the certificate.
    let mut bob_with_roots_cert = root.clone();
    bob_with_roots_cert.push("--user=bob:bpw".into());
    let (ok, out) = run(&bob_with_roots_cert, &["get", "/secret"]);
    assert!(
        !ok && out.contains(&format!("Error: {PERMISSION_DENIED}")),
        "{out}"
    );
    let mut root_with_alices_cert = alice.clone();
    root_with_alices_cert.push("--user=root:rootpw".into());
    let (ok, out) = run(&root_with_alices_cert, &["get", "/secret"]);
    assert!(ok, "{out}");
}

async fn jwt_tokens_are_signed_and_accepted_by_every_member(target: Target) {
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap(); // ECDSA P-256, for ES256
    let (public, private) = (dir.path().join("jwt.pub"), dir.path().join("jwt.key"));
    std::fs::write(&public, key.public_key_pem()).unwrap();
    std::fs::write(&private, key.serialize_pem()).unwrap();
    let jwt = format!(
        "jwt,pub-key={},priv-key={},sign-method=ES256,ttl=5m",
        public.display(),
        private.display()
    );
    let mut flags: Vec<String> = FAST_BCRYPT.iter().map(|s| s.to_string()).collect();
    flags.extend(["--auth-token".to_string(), jwt]);
    let servers = target.start_in(dir, "http", &vec![flags; 3]);
    wait_serving(&*servers).await;
    let eps = servers.endpoints();
    let mut admin = connect(&eps[0], None).await.unwrap();
    set_up_alice(&mut admin).await;
    enable_auth(&mut admin).await;

    let answer = gateway_http::post(
        &eps[0],
        "/v3/auth/authenticate",
        r#"{"name":"alice","password":"apw"}"#,
    );
    assert_eq!(answer.status, 200, "{}", answer.text());
    let token = answer.json()["token"].as_str().unwrap().to_string();
    // A JWT: base64url header (`{"...`), claims and signature.
    let parts: Vec<&str> = token.split('.').collect();
    assert!(
        parts.len() == 3 && parts.iter().all(|p| !p.is_empty()) && token.starts_with("eyJ"),
        "{token}"
    );
    let range = |ep: &str, token: &str| {
        gateway_http::request_with(
            ep,
            "POST",
            "/v3/kv/range",
            br#"{"key":"L2EveA=="}"#,
            &[("Authorization", token)],
        )
    };
    // Signed, not stored: every member accepts it.
    for ep in &eps {
        let answer = range(ep, &token);
        assert_eq!(answer.status, 200, "at {ep}: {}", answer.text());
    }
    // A signature that does not verify.
    let forged = format!(
        "{}.{}.{}",
        parts[0],
        parts[1],
        &parts[2][..parts[2].len() - 4]
    );
    let answer = range(&eps[1], &forged);
    assert_eq!(
        (answer.status, answer.json()),
        (
            401,
            json!({"error": INVALID_TOKEN, "message": INVALID_TOKEN, "code": 16})
        )
    );
    // The crate works with JWTs as with simple tokens.
    let mut alice = connect_as(&eps[2], "alice", "apw").await;
    alice.put("/a/jwt", "1", None).await.unwrap();
    denied("range /secret/x", alice.get("/secret/x", None).await);
}

/// Cairn limits failed authentications (etcd 3.4 does not): per user name
/// and per client address, a bucket of 5 failures refilled one per second;
/// once empty, even the right password is refused with ResourceExhausted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_authentications_are_rate_limited() {
    let servers = Target::Cairn.start(&FAST_BCRYPT);
    wait_serving(&*servers).await;
    let ep = servers.endpoints()[0].clone();
    let mut admin = connect(&ep, None).await.unwrap();
    set_up_alice(&mut admin).await;
    enable_auth(&mut admin).await;
    let attempt = |user: String, password: &'static str| {
        let ep = ep.clone();
        async move {
            let options = ConnectOptions::new().with_user(user, password);
            connect(&ep, Some(options)).await.map(|_| ()).map_err(|e| {
                let s = common::status_of(e);
                (s.code(), s.message().to_string())
            })
        }
    };
    let limited = (
        Code::ResourceExhausted,
        "etcdserver: too many requests".into(),
    );
    let failed = (Code::InvalidArgument, AUTH_FAILED.to_string());

    // Wrong passwords for one user until refused: the bucket holds five.
    // A refill between attempts (a slow machine) only delays the refusal.
    let mut refused_at = None;
    for i in 0..20 {
        let got = attempt("alice".into(), "wrong").await;
        if got == Err(limited.clone()) {
            refused_at = Some(Instant::now());
            assert!(i >= 5, "refused after only {i} failures");
            break;
        }
        assert_eq!(got, Err(failed.clone()), "attempt {i}");
    }
    let refused_at = refused_at.expect("20 wrong passwords in a row were never limited");
    // The right password right away is refused too, unless a second passed
    // and a token came back.
    let right = attempt("alice".into(), "apw").await;
    if right.is_ok() {
        assert!(
            refused_at.elapsed() >= Duration::from_secs(1),
            "the right password got through an empty bucket"
        );
    } else {
        assert_eq!(right, Err(limited.clone()));
    }

    // Refilled, the right password works again.
    tokio::time::sleep(Duration::from_secs(6)).await;
    eventually("alice authenticates after the refill", || async {
        attempt("alice".into(), "apw")
            .await
            .map_err(|e| format!("{e:?}"))
    })
    .await;

    // Per client address: failures spread over many user names.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let mut limited_by_address = false;
    for i in 0..20 {
        let got = attempt(format!("nobody{i}"), "x").await;
        if got == Err(limited.clone()) {
            assert!(i >= 5, "refused after only {i} failures");
            limited_by_address = true;
            break;
        }
        assert_eq!(got, Err(failed.clone()), "attempt {i}");
    }
    assert!(
        limited_by_address,
        "failures from one address were never limited"
    );

    // The refusals are counted on the client port's /metrics.
    let metrics = gateway_http::request(&ep, "GET", "/metrics", b"");
    assert_eq!(metrics.status, 200);
    let text = metrics.text();
    // One series per core: the member's count is their sum.
    let series: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with("cairn_auth_failures_limited_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    assert!(
        !series.is_empty(),
        "no cairn_auth_failures_limited_total in:\n{text}"
    );
    let count: f64 = series.iter().sum();
    assert!(count >= 2.0, "{count} refusals counted");
}
