//! Tokens: a simple token that expires when unused and a client that
//! authenticates again, JWTs signed by one member and accepted by all, and
//! Cairn's limit on failed authentications. Guards against tokens that
//! expire while in use or never, forged JWTs accepted, and password
//! guessing left unchecked.

use std::time::{Duration, Instant};

use etcd_client::ConnectOptions;
use serde_json::json;
use tonic::Code;

use super::{
    assert_refused, connect, connect_as, denied, enable_auth, set_up_alice, wait_serving, Target,
    AUTH_FAILED, FAST_BCRYPT, INVALID_TOKEN, PATIENCE,
};
use crate::common::{self, eventually};
use crate::gateway_http;

pub async fn an_unused_simple_token_expires_and_the_client_reauthenticates(target: Target) {
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

pub async fn jwt_tokens_are_signed_and_accepted_by_every_member(target: Target) {
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

/// Failed authentications a bucket of Cairn's limiter holds.
const LIMITER_BURST: u32 = 5;
/// How often Cairn's limiter gives a bucket one failure back.
const LIMITER_REFILL: Duration = Duration::from_secs(1);
/// An emptied bucket full again, with one refill to spare.
const LIMITER_REFILLED: Duration = LIMITER_REFILL.saturating_mul(LIMITER_BURST + 1);

/// Cairn limits failed authentications (etcd 3.4 does not): per user name
/// and per client address, a bucket of [`LIMITER_BURST`] failures refilled
/// one per [`LIMITER_REFILL`]; once empty, even the right password is
/// refused with ResourceExhausted.
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
            assert!(i >= LIMITER_BURST, "refused after only {i} failures");
            break;
        }
        assert_eq!(got, Err(failed.clone()), "attempt {i}");
    }
    let refused_at = refused_at.expect("20 wrong passwords in a row were never limited");
    // The right password right away is refused too, unless a refill passed
    // and gave a failure back.
    let right = attempt("alice".into(), "apw").await;
    if right.is_ok() {
        assert!(
            refused_at.elapsed() >= LIMITER_REFILL,
            "the right password got through an empty bucket"
        );
    } else {
        assert_eq!(right, Err(limited.clone()));
    }

    // Once a failure is given back, the right password works again.
    eventually("alice authenticates after the refill", PATIENCE, || async {
        attempt("alice".into(), "apw")
            .await
            .map_err(|e| format!("{e:?}"))
    })
    .await;

    // Per client address: failures spread over many user names, from a
    // full bucket (the address's emptied with alice's).
    tokio::time::sleep(LIMITER_REFILLED).await;
    let mut limited_by_address = false;
    for i in 0..20 {
        let got = attempt(format!("nobody{i}"), "x").await;
        if got == Err(limited.clone()) {
            assert!(i >= LIMITER_BURST, "refused after only {i} failures");
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
