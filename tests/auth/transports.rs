//! Auth over the other ways in: the HTTP/JSON gateway's token header, and
//! client certificates whose common name is the user. Guards against the
//! gateway answering with other codes or bodies than etcd's, and against a
//! certificate that overrides a token or grants more than its user has.

use serde_json::json;

use super::{
    connect, ctl_with, enable_auth, set_up_alice, wait_serving, Target, AUTH_FAILED, FAST_BCRYPT,
    INVALID_TOKEN, PATIENCE, PERMISSION_DENIED, USER_EMPTY,
};
use crate::common::{self, eventually, require_tool};
use crate::gateway_http;

pub async fn gateway_authenticates_with_a_token_header(target: Target) {
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
        eventually(&format!("{other} accepts the token"), PATIENCE, || async {
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

pub async fn a_client_certificate_names_the_user(target: Target) {
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
    eventually("the TLS cluster serves", PATIENCE, || async {
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
