//! Every API checked against the caller's permissions, through the
//! etcd-client crate: KV (a txn's compares and both its branches, `prev_kv`),
//! Watch, Lease, Cluster, Maintenance, Lock and Election, and the Auth
//! service itself. Guards
//! against a user reaching through any call what no role grants, and against
//! refusals whose gRPC code or message etcd's clients would not recognise.

use etcd_client::{
    Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, LockOptions, PutOptions, Txn,
    TxnOp, WatchOptions,
};
use tonic::Code;

use super::{
    assert_refused, connect, connect_as, denied, enable_auth, maintenance_denied, set_up_alice,
    wait_serving, Target, AUTH_FAILED, FAST_BCRYPT, PATIENCE, PERMISSION_DENIED, USER_EMPTY,
};
use crate::common;

pub async fn every_api_checks_the_callers_permissions(target: Target) {
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

    // Lock and Election act with the caller's permissions on the keys under
    // their name; etcd's services pass a refusal on as code Unknown.
    let lease = alice.lease_grant(30, None).await.unwrap().id();
    let with_lease = || Some(LockOptions::new().with_lease(lease));
    let held = alice.lock("/a/lock", with_lease()).await.unwrap();
    assert!(held.key().starts_with(b"/a/lock/"));
    alice.unlock(held.key()).await.unwrap();
    let recipe_denied = |what: &str, r| assert_refused(what, r, Code::Unknown, PERMISSION_DENIED);
    recipe_denied(
        "lock under /secret",
        alice.lock("/secret/lock", with_lease()).await.map(drop),
    );
    recipe_denied(
        "lock under /ro",
        alice.lock("/ro/lock", with_lease()).await.map(drop),
    );
    recipe_denied(
        "campaign under /ro",
        alice.campaign("/ro/el", "v", lease).await.map(drop),
    );
    recipe_denied("leader under /wo", alice.leader("/wo/el").await.map(drop));
    // An Observe the user may not read ends at once without an error, as
    // etcd's does.
    let mut observer = alice.observe("/wo/el").await.unwrap();
    let observed = observer.message().await;
    assert!(matches!(observed, Ok(None)), "observe /wo/el: {observed:?}");
    let mut campaign = alice.campaign("/a/el", "v", lease).await.unwrap();
    let leader = alice.leader("/a/el").await.unwrap();
    assert_eq!(leader.kv().map(|kv| kv.value()), Some(&b"v"[..]));
    let resign = etcd_client::ResignOptions::new().with_leader(campaign.take_leader().unwrap());
    alice.resign(Some(resign)).await.unwrap();

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
