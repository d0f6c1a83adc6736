//! The etcdctl flow of an operator: users, roles and permissions added,
//! granted, shown, revoked and deleted; auth enabled and disabled; what each
//! user may then do, at every member. Guards against etcdctl output or error
//! texts that differ from etcd's, and against a change committed through one
//! member that another does not enforce.

use super::{
    ctl, ctl_fails, ctl_says, ctl_with, wait_serving, Target, AUTH_FAILED, FAST_BCRYPT, PATIENCE,
    PERMISSION_DENIED, USER_EMPTY,
};
use crate::common::{eventually, require_tool};

/// etcdctl's answer at `endpoint` eventually fails with `message`: a change
/// committed through another member reaches this one.
async fn ctl_eventually_fails(endpoint: &str, user: Option<&str>, args: &[&str], message: &str) {
    eventually(
        &format!("{args:?} refused at {endpoint}"),
        PATIENCE,
        || async {
            let (ok, out) = ctl(endpoint, user, args);
            if !ok && out.contains(&format!("Error: {message}")) {
                Ok(())
            } else {
                Err(out)
            }
        },
    )
    .await
}

pub async fn etcdctl_manages_users_roles_and_permissions(target: Target) {
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
        eventually(&format!("{ep} serves without a user"), PATIENCE, || async {
            let (ok, out) = ctl(ep, None, &["get", "/s"]);
            (ok && out.trim() == "/s\ns").then_some(()).ok_or(out)
        })
        .await;
    }
    ctl_says(ep, None, &["user", "list"], "alice\neve\nroot");
    ctl_says(ep, None, &["auth", "disable"], "Authentication Disabled");
}
