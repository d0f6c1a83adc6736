//! Auth state that survives a kill -9 of every member, and reaches a member
//! that was down while it changed by a snapshot from the leader. Guards
//! against users, roles, passwords or permissions lost in a crash, or stale
//! on a member that caught up.

use etcd_client::{Permission, RoleRevokePermissionOptions};
use tonic::Code;

use super::{
    assert_refused, connect, connect_as, ctl, ctl_fails, ctl_says, enable_auth, wait_serving,
    wait_serving_as, Target, AUTH_FAILED, FAST_BCRYPT, PATIENCE, PERMISSION_DENIED, SNAPSHOT_COUNT,
    USER_EMPTY,
};
use crate::common::{eventually, require_tool};

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

pub async fn auth_state_survives_crashes_and_reaches_a_member_by_snapshot(target: Target) {
    if !require_tool("etcdctl") {
        return;
    }
    let mut flags = FAST_BCRYPT.to_vec();
    let snapshot_count = SNAPSHOT_COUNT.to_string();
    flags.extend(["--snapshot-count", &snapshot_count]);
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
    eventually(&format!("{ep2} caught up"), PATIENCE, || async {
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
