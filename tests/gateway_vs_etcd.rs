//! The HTTP/JSON gateway answers as etcd 3.4's gateway does: the same requests,
//! good and bad (malformed JSON, wrong types, unknown fields, bad base64,
//! oversize bodies, unknown paths, wrong methods), go to a real etcd and to a
//! Cairn member, and the answers are compared field by field, apart from what
//! identifies the member or the moment (header ids, revisions and terms,
//! member URLs, sizes, hashes). Guards against a gateway whose JSON differs
//! from etcd's in names, number encoding, defaults, status codes or stream
//! framing, which clients parsing etcd's JSON (curl scripts, Patroni,
//! etcd3gw) would trip over. Where Cairn differs on purpose (the text of JSON
//! parse errors, the Auth service it does not have yet, the version it
//! reports) the test checks Cairn's own answer and the README says so.

use crate::common;
use crate::gateway_http;

use std::time::{Duration, Instant};

use gateway_http::{open_stream, post, request, try_post_status, Answer};
use serde_json::{json, Value};

/// Waits until a gateway answers a write (a leader exists), bounded by progress
/// of the member's start rather than a tight clock.
fn wait_serving(endpoint: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if try_post_status(endpoint, "/v3/kv/put", r#"{"key":"cmVhZHk="}"#) == Some(200) {
            return;
        }
        assert!(Instant::now() < deadline, "{endpoint} never served a put");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Replaces what differs between any two members by nature: header ids,
/// revisions and terms, member ids and URLs, sizes, hashes, versions.
fn normalize(value: &mut Value) {
    match value {
        Value::Object(map) => {
            // A Status answer's `version` is the server's; elsewhere it is a key's.
            let status = map.contains_key("raftIndex");
            for (key, v) in map.iter_mut() {
                match key.as_str() {
                    "header" => *v = json!("<header>"),
                    "ID" | "leader" | "member_id" | "cluster_id" | "raftIndex" | "raftTerm"
                    | "raftAppliedIndex" | "dbSize" | "dbSizeInUse" | "hash" | "blob"
                    | "remaining_bytes" | "peerURLs" | "clientURLs" | "raft_term" => {
                        *v = json!("<any>")
                    }
                    "version" if status => *v = json!("<any>"),
                    _ => normalize(v),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalize),
        _ => {}
    }
}

fn normalized(answer: &Answer) -> (u16, Value) {
    let mut v = answer.json();
    normalize(&mut v);
    (answer.status, v)
}

/// Both answers, compared field by field after normalising.
fn same(what: &str, etcd: &Answer, cairn: &Answer) {
    let (e, c) = (normalized(etcd), normalized(cairn));
    assert_eq!(
        e,
        c,
        "{what}: etcd answered {} {}, Cairn {} {}",
        etcd.status,
        etcd.text(),
        cairn.status,
        cairn.text()
    );
}

/// A failure both refuse alike: HTTP status and gRPC code equal, a message in
/// `error` and `message`; the message itself equal when `same_message` (etcd's
/// server errors), not when it is a JSON parser's wording.
fn same_error(what: &str, etcd: &Answer, cairn: &Answer, same_message: bool) {
    let (e, c) = (etcd.json(), cairn.json());
    let context = format!(
        "{what}: etcd {} {}, Cairn {} {}",
        etcd.status,
        etcd.text(),
        cairn.status,
        cairn.text()
    );
    assert_ne!(etcd.status, 200, "{context}");
    assert_eq!(etcd.status, cairn.status, "{context}");
    assert_eq!(e["code"], c["code"], "{context}");
    for body in [&e, &c] {
        assert!(body["error"].is_string(), "{context}");
        assert_eq!(body["error"], body["message"], "{context}");
        let keys: Vec<&String> = body.as_object().unwrap().keys().collect();
        assert_eq!(keys.len(), 3, "{context}");
    }
    if same_message {
        assert_eq!(e["message"], c["message"], "{context}");
    }
}

fn both(etcd: &str, cairn: &str, path: &str, body: &str) -> (Answer, Answer) {
    (post(etcd, path, body), post(cairn, path, body))
}

#[test]
fn gateway_answers_as_etcd_does() {
    if !common::require_tool("etcd") {
        return;
    }
    let etcd_server = common::Etcd::start();
    // One shard numbers revisions from 1 as etcd does, so the calls below
    // name the same revisions on both.
    let cluster = common::Cluster::start(1, &["--shards", "1"]);
    let (e, c) = (etcd_server.endpoint.as_str(), cluster.members[0].endpoint());
    let c = c.as_str();
    wait_serving(e);
    wait_serving(c);

    // Calls that succeed, in the same order on both, so revisions agree too.
    let good: &[(&str, &str)] = &[
        ("/v3/kv/put", r#"{"key":"Zm9v","value":"YmFy"}"#),
        (
            "/v3/kv/put",
            r#"{"key":"Zm9v","value":"YmF6","prev_kv":true}"#,
        ),
        ("/v3/kv/put", r#"{"key":"Zm9vMg==","value":"eA=="}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v"}"#),
        (
            "/v3/kv/range",
            r#"{"key":"Zm9v","range_end":"Zm9w","limit":1}"#,
        ),
        (
            "/v3/kv/range",
            r#"{"key":"Zm9v","range_end":"Zm9w","limit":"1","sort_order":"DESCEND","sort_target":2}"#,
        ),
        (
            "/v3/kv/range",
            r#"{"key":"Zm9v","range_end":"Zm9w","count_only":true}"#,
        ),
        (
            "/v3/kv/range",
            r#"{"key":"Zm9v","keysOnly":true,"serializable":true}"#,
        ),
        ("/v3/kv/range", r#"{"key":"Zm9v","unknown_field":[1,2]}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v"} trailing text is ignored"#),
        ("/v3beta/kv/range", r#"{"key":"Zm9v"}"#),
        ("/v3/kv/range", r#"{"key":"bm9uZQ=="}"#),
        // Base64 broken by line breaks, as `base64` prints long text.
        ("/v3/kv/range", r#"{"key":"Zm\n9v\r\n"}"#),
        (
            "/v3/kv/txn",
            r#"{"compare":[{"key":"Zm9v","target":"VALUE","result":"EQUAL","value":"YmF6"}],"success":[{"request_put":{"key":"dA==","value":"MQ=="}},{"request_range":{"key":"Zm9v"}}],"failure":[{"request_delete_range":{"key":"dA=="}}]}"#,
        ),
        (
            "/v3/kv/txn",
            r#"{"compare":[{"key":"Zm9v","target":"VERSION","result":"GREATER","version":"10"}],"success":[],"failure":[{"request_delete_range":{"key":"dA==","prev_kv":true}}]}"#,
        ),
        // A nested txn: etcd's answer gives it an empty header.
        (
            "/v3/kv/txn",
            r#"{"success":[{"request_txn":{"success":[{"request_put":{"key":"bg==","value":"MQ=="}},{"request_range":{"key":"bg=="}}]}},{"request_range":{"key":"dA=="}}]}"#,
        ),
        // etcd's ops answer the revision they read or wrote at: a range or
        // a delete of nothing before the txn's first write, the one
        // before the txn.
        (
            "/v3/kv/txn",
            r#"{"success":[{"request_range":{"key":"bg=="}},{"request_delete_range":{"key":"bm9uZQ=="}},{"request_put":{"key":"bg==","value":"Mg=="}},{"request_range":{"key":"bg=="}},{"request_delete_range":{"key":"bm9uZQ=="}}]}"#,
        ),
        // A txn that writes nothing.
        (
            "/v3/kv/txn",
            r#"{"success":[{"request_delete_range":{"key":"bm9uZQ=="}},{"request_range":{"key":"bg=="}}]}"#,
        ),
        ("/v3/kv/deleterange", r#"{"key":"Zm9vMg==","prev_kv":true}"#),
        ("/v3/kv/deleterange", r#"{"key":"bm9uZQ=="}"#),
        ("/v3/kv/compaction", r#"{"revision":"3","physical":true}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v","revision":3}"#),
        ("/v3/lease/grant", r#"{"TTL":60,"ID":77}"#),
        ("/v3/lease/grant", r#"{"TTL":"60","ID":"78"}"#),
        (
            "/v3/kv/put",
            r#"{"key":"bGVhc2Vk","value":"eQ==","lease":"77"}"#,
        ),
        // etcd's Lock and Election services, on lease 77 (0x4d): keys
        // `l/4d` and `e/4d`. A resign naming another revision changes
        // nothing.
        ("/v3/lock/lock", r#"{"name":"bA==","lease":"77"}"#),
        ("/v3/lock/unlock", r#"{"key":"bC80ZA=="}"#),
        // etcd takes `/v3beta/` for `/v3/` on every path.
        ("/v3beta/lock/lock", r#"{"name":"bA==","lease":"77"}"#),
        ("/v3beta/lock/unlock", r#"{"key":"bC80ZA=="}"#),
        (
            "/v3/election/campaign",
            r#"{"name":"ZQ==","lease":77,"value":"djE="}"#,
        ),
        ("/v3/election/leader", r#"{"name":"ZQ=="}"#),
        (
            "/v3/election/resign",
            r#"{"leader":{"name":"ZQ==","key":"ZS80ZA==","rev":"1","lease":77}}"#,
        ),
        ("/v3/lease/leases", "{}"),
        ("/v3/kv/lease/leases", ""),
        ("/v3/lease/revoke", r#"{"ID":78}"#),
        ("/v3/kv/lease/revoke", r#"{"ID":"77"}"#),
        ("/v3/lease/timetolive", r#"{"ID":79}"#),
        ("/v3/kv/lease/timetolive", r#"{"ID":79,"keys":true}"#),
        ("/v3/kv/range", r#"{"key":"bGVhc2Vk"}"#),
        ("/v3/cluster/member/list", "{}"),
        ("/v3/maintenance/alarm", r#"{"action":"GET"}"#),
        ("/v3/maintenance/status", "{}"),
        ("/v3/maintenance/hash", "{}"),
    ];
    for (path, body) in good {
        let (ea, mut ca) = both(e, c, path, body);
        if path.contains("/lease/") {
            // etcd stamps every lease answer with its store's revision.
            assert_eq!(
                ea.json()["header"]["revision"],
                ca.json()["header"]["revision"],
                "{path} {body}: the header's revision"
            );
        }
        if *path == "/v3/maintenance/alarm" {
            // etcd leaves the header out of an Alarm answer; Cairn's has one.
            assert!(ca.json()["header"].is_object(), "{}", ca.text());
            let mut body = ca.json();
            body.as_object_mut().unwrap().remove("header");
            ca.body = body.to_string().into_bytes();
        }
        if *path == "/v3/kv/txn" {
            // Inside a txn etcd's headers carry the revision alone (a
            // nested txn's none), and revisions agree here: compared whole.
            assert_eq!(
                (&ea.json()["header"]["revision"], &ea.json()["responses"]),
                (&ca.json()["header"]["revision"], &ca.json()["responses"]),
                "{path} {body}: etcd {}, Cairn {}",
                ea.text(),
                ca.text()
            );
        }
        assert_eq!(ea.status, 200, "{path} {body}: etcd {}", ea.text());
        same(&format!("{path} {body}"), &ea, &ca);
        assert_eq!(ca.content_type, "application/json", "{path}");
        for cors in [
            "access-control-allow-origin",
            "access-control-allow-methods",
            "access-control-allow-headers",
        ] {
            assert_eq!(ea.header(cors), ca.header(cors), "{path}: {cors}");
        }
    }

    // Bad input etcd's own server refuses: same status, code and message.
    let refused: &[(&str, &str)] = &[
        ("/v3/kv/range", "{}"),
        ("/v3/kv/range", ""),
        ("/v3/kv/range", "null"),
        ("/v3/kv/range", r#"{"kex":"Zm9v"}"#),
        ("/v3/kv/put", r#"{"value":"eA=="}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v","revision":2}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v","revision":100000}"#),
        ("/v3/kv/compaction", r#"{"revision":2}"#),
        ("/v3/kv/put", r#"{"key":"eA==","lease":"12345"}"#),
        // A put that keeps the value or lease of a key that does not exist.
        ("/v3/kv/put", r#"{"key":"bm9uZQ==","ignore_value":true}"#),
        (
            "/v3/kv/put",
            r#"{"key":"bm9uZQ==","value":"eA==","ignore_lease":true}"#,
        ),
        (
            "/v3/kv/txn",
            r#"{"success":[{"request_put":{"key":"bm9uZQ==","ignore_value":true}}]}"#,
        ),
        // A txn op with no request in it.
        ("/v3/kv/txn", r#"{"success":[{}]}"#),
        ("/v3/lock/lock", r#"{"name":"bA==","lease":"12345"}"#),
        ("/v3/election/leader", r#"{"name":"bm9uZQ=="}"#),
        ("/v3/election/proclaim", r#"{"value":"eA=="}"#),
        ("/v3/election/resign", "{}"),
        (
            "/v3/election/proclaim",
            r#"{"leader":{"name":"ZQ==","key":"ZS80ZA==","rev":"1","lease":77},"value":"eA=="}"#,
        ),
        ("/v3/lease/revoke", r#"{"ID":79}"#),
        ("/v3/lease/grant", r#"{"TTL":60,"ID":80}"#),
        ("/v3/lease/grant", r#"{"TTL":60,"ID":80}"#),
        ("/v3/cluster/member/promote", r#"{"ID":1}"#),
        ("/v3/cluster/member/remove", r#"{"ID":"1"}"#),
        (
            "/v3/cluster/member/update",
            r#"{"ID":1,"peerURLs":["http://127.0.0.1:1"]}"#,
        ),
    ];
    for (path, body) in refused {
        let (ea, ca) = both(e, c, path, body);
        if ea.status == 200 {
            same(&format!("{path} {body}"), &ea, &ca);
        } else {
            same_error(&format!("{path} {body}"), &ea, &ca, true);
        }
    }

    // Text that is not the message: same status and code; the wording is the
    // JSON parser's own on each side.
    let malformed: &[(&str, &str)] = &[
        ("/v3/kv/range", r#"{"key":"Zm9v""#),
        ("/v3/kv/range", r#"{"key":5}"#),
        ("/v3/kv/range", r#"{"key":"@@@"}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v","limit":1.5}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v","limit":"x"}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v","sort_order":"BOGUS"}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v","serializable":"true"}"#),
        ("/v3/kv/range", "[1]"),
        ("/v3/kv/put", "not json"),
        ("/v3/lease/grant", r#"{"TTL":{}}"#),
    ];
    for (path, body) in malformed {
        let (ea, ca) = both(e, c, path, body);
        same_error(&format!("{path} {body}"), &ea, &ca, false);
    }

    // Oversize bodies: past the request limit (etcd's "request is too large"),
    // and past what the gateway reads at all (gRPC's ResourceExhausted).
    let value = "eHh4".repeat(1_600_000 / 3);
    let (ea, ca) = both(
        e,
        c,
        "/v3/kv/put",
        &format!(r#"{{"key":"Zm9v","value":"{value}"}}"#),
    );
    same_error("1.6 MB put", &ea, &ca, true);
    // A body the gateway reads whose message is past gRPC's cap (the
    // request limit plus 512 KiB): gRPC's own refusal, ResourceExhausted.
    let value = "eHh4".repeat(2_100_000 / 3);
    let (ea, ca) = both(
        e,
        c,
        "/v3/kv/put",
        &format!(r#"{{"key":"Zm9v","value":"{value}"}}"#),
    );
    same_error("2.1 MB put", &ea, &ca, true);
    let value = "eHh4".repeat(4_000_000 / 3);
    let (ea, ca) = both(
        e,
        c,
        "/v3/kv/put",
        &format!(r#"{{"key":"Zm9v","value":"{value}"}}"#),
    );
    same_error("4 MB put", &ea, &ca, false);

    // Paths and methods: text answers, same status and body.
    for (method, path) in [
        ("POST", "/v3/nope"),
        ("POST", "/v3/kv/nope"),
        ("POST", "/v3alpha/kv/range"),
        ("POST", "/nope"),
        ("GET", "/v3/kv/range"),
        ("PUT", "/v3/kv/put"),
        ("POST", "/v3/maintenance/hashkv"),
    ] {
        let ea = request(e, method, path, b"{}");
        let ca = request(c, method, path, b"{}");
        assert_eq!(
            (ea.status, ea.text()),
            (ca.status, ca.text()),
            "{method} {path}"
        );
    }

    // GET /version: both fields, parsed as clients parse them.
    let (ea, ca) = (
        request(e, "GET", "/version", b""),
        request(c, "GET", "/version", b""),
    );
    assert_eq!((ea.status, ca.status), (200, 200));
    let (ev, cv) = (ea.json(), ca.json());
    assert_eq!(ev["etcdcluster"], cv["etcdcluster"]);
    assert!(
        cv["etcdserver"].as_str().unwrap().starts_with("3.4."),
        "{cv}"
    );
    assert_eq!(cv.as_object().unwrap().len(), 2, "{cv}");

    // Streams: the same lines, one JSON object per message in {"result": ...}.
    let (ea, ca) = both(e, c, "/v3/lease/grant", r#"{"TTL":60,"ID":90}"#);
    same("grant for keepalive", &ea, &ca);
    let keepalive = r#"{"ID":90}{"ID":"90"}{"ID":91}"#;
    let mut es = open_stream(e, "/v3/lease/keepalive", keepalive);
    let mut cs = open_stream(c, "/v3/lease/keepalive", keepalive);
    assert_eq!((es.status, cs.status), (200, 200));
    let (mut el, mut cl) = (es.lines(3), cs.lines(3));
    let revision = |lines: &[Value]| lines[0]["result"]["header"]["revision"].clone();
    assert_eq!(revision(&el), revision(&cl), "keepalive's header revision");
    el.iter_mut().for_each(normalize);
    cl.iter_mut().for_each(normalize);
    assert_eq!(el, cl, "keepalive lines");

    let watch = r#"{"create_request":{"key":"dw==","range_end":"eA==","prev_kv":true}}"#;
    let mut es = open_stream(e, "/v3/watch", watch);
    let mut cs = open_stream(c, "/v3/watch", watch);
    assert_eq!((es.status, cs.status), (200, 200));
    let (mut el, mut cl) = (es.lines(1), cs.lines(1));
    for (path, body) in [
        ("/v3/kv/put", r#"{"key":"dzE=","value":"MQ=="}"#),
        ("/v3/kv/put", r#"{"key":"dzE=","value":"Mg=="}"#),
        ("/v3/kv/deleterange", r#"{"key":"dzE="}"#),
    ] {
        let (ea, ca) = both(e, c, path, body);
        same(path, &ea, &ca);
        el.extend(es.lines(1));
        cl.extend(cs.lines(1));
    }
    el.iter_mut().for_each(normalize);
    cl.iter_mut().for_each(normalize);
    assert_eq!(el, cl, "watch lines");
    assert_eq!(el[0]["result"]["created"], json!(true));

    // A stream's later message past gRPC's cap ends the stream with gRPC's
    // refusal, as its last line (whether the watch created before it
    // answers first is a race in etcd).
    let huge_key = "eHh4".repeat(2_100_000 / 3);
    let two = format!(
        r#"{{"create_request":{{"key":"dw=="}}}}{{"create_request":{{"key":"{huge_key}"}}}}"#
    );
    let mut es = open_stream(e, "/v3/watch", &two);
    let mut cs = open_stream(c, "/v3/watch", &two);
    assert_eq!((es.status, cs.status), (200, 200));
    let last_line = |s: &mut gateway_http::Streamed| {
        let mut body = Vec::new();
        while let Some(bytes) = s.read_some() {
            body.extend(bytes);
        }
        let text = String::from_utf8_lossy(&body).into_owned();
        let last = text.lines().last().unwrap_or_default().to_string();
        serde_json::from_str::<Value>(&last)
            .unwrap_or_else(|err| panic!("last line not JSON ({err}): {text}"))
    };
    let (el, cl) = (last_line(&mut es), last_line(&mut cs));
    assert_eq!(
        el, cl,
        "the last line of a watch stream with a message over the cap"
    );
    assert_eq!(cl["error"]["grpc_code"], json!(8), "{cl}");

    // A watch from a compacted revision, and a create then cancel.
    let watch = r#"{"create_request":{"key":"Zm9v","start_revision":1}}"#;
    let (mut el, mut cl) = (
        open_stream(e, "/v3/watch", watch).lines(2),
        open_stream(c, "/v3/watch", watch).lines(2),
    );
    // The cancellation's header carries no revision on either.
    let revision = |lines: &[Value]| lines[1]["result"]["header"]["revision"].clone();
    assert_eq!(
        revision(&el),
        revision(&cl),
        "compacted watch's header revision"
    );
    el.iter_mut().for_each(normalize);
    cl.iter_mut().for_each(normalize);
    // Cairn says why, as etcd 3.5 does; etcd 3.4 leaves `cancel_reason` out.
    let reason = cl[1]["result"]
        .as_object_mut()
        .unwrap()
        .remove("cancel_reason");
    assert_eq!(
        reason,
        Some(json!(
            "etcdserver: mvcc: required revision has been compacted"
        ))
    );
    assert_eq!(el, cl, "watch from a compacted revision");
    let watch = r#"{"create_request":{"key":"Zm9v"}}{"cancel_request":{"watch_id":0}}"#;
    let (mut el, mut cl) = (
        open_stream(e, "/v3beta/watch", watch).lines(2),
        open_stream(c, "/v3beta/watch", watch).lines(2),
    );
    el.iter_mut().for_each(normalize);
    cl.iter_mut().for_each(normalize);
    assert_eq!(el, cl, "watch create and cancel");

    // A stream whose first message is not JSON fails as a whole, with gRPC's Unknown.
    for (path, body) in [
        ("/v3/watch", r#"{"create_request":{"key":"Zm9v"}"#),
        ("/v3/watch", r#"{"create_request":{"key":5}}"#),
        ("/v3/lease/keepalive", r#"{"ID":"#),
        ("/v3/lease/keepalive", r#"{"ID":"abc"}"#),
    ] {
        let (ea, ca) = both(e, c, path, body);
        same_error(&format!("{path} {body}"), &ea, &ca, false);
    }

    // A server stream from a one-message request: the snapshot's first chunk.
    let mut es = open_stream(e, "/v3/maintenance/snapshot", "{}");
    let mut cs = open_stream(c, "/v3/maintenance/snapshot", "{}");
    assert_eq!((es.status, cs.status), (200, 200));
    // The files differ (bbolt and Cairn's own format), and etcd 3.4 sends a
    // small database in one chunk with no header and nothing remaining.
    let (el, cl) = (es.lines(1), cs.lines(1));
    assert!(el[0]["result"]["blob"].is_string(), "{}", el[0]);
    assert!(cl[0]["result"]["blob"].is_string(), "{}", cl[0]);

    // MoveLeader to a member that does not exist: etcd's refusal.
    let (ea, ca) = both(
        e,
        c,
        "/v3/maintenance/transfer-leadership",
        r#"{"targetID":"5"}"#,
    );
    same_error("MoveLeader to an unknown member", &ea, &ca, true);

    // A token in `Authorization` goes to the call. etcd 3.4 checks it even
    // with auth off (an unknown one is 401, code 16); Cairn ignores tokens
    // while auth is off, as etcd 3.5 does (README, "HTTP/JSON API").
    let ea = gateway_http::request_with(
        e,
        "POST",
        "/v3/kv/range",
        br#"{"key":"Zm9v"}"#,
        &[("Authorization", "sometoken")],
    );
    let ca = gateway_http::request_with(
        c,
        "POST",
        "/v3/kv/range",
        br#"{"key":"Zm9v"}"#,
        &[("Authorization", "sometoken")],
    );
    assert_eq!(
        (ea.status, ea.json()["code"].clone()),
        (401, json!(16)),
        "{}",
        ea.text()
    );
    assert_eq!(ca.status, 200, "{}", ca.text());
    assert_eq!(ca.json()["count"], "1");

    // Auth with auth disabled: the same refusals, and the same empty lists.
    // (tests/daemon_auth.rs covers the gateway with auth enabled.)
    for (path, body) in [
        ("/v3/auth/enable", "{}"),
        ("/v3/auth/authenticate", r#"{"name":"root","password":"x"}"#),
        ("/v3/auth/user/get", r#"{"name":"nobody"}"#),
        (
            "/v3/auth/role/grant",
            r#"{"name":"r","perm":{"key":"YQ=="}}"#,
        ),
        ("/v3/auth/role/delete", r#"{"role":"r"}"#),
    ] {
        let (ea, ca) = both(e, c, path, body);
        same_error(path, &ea, &ca, true);
    }
    for path in ["/v3/auth/user/list", "/v3/auth/role/list"] {
        let (ea, ca) = both(e, c, path, "{}");
        same(path, &ea, &ca);
    }

    // grpc-gateway's headers: `Grpc-Timeout` is the call's deadline (a
    // malformed one refused before the call), and `Grpc-Metadata-<key>` is
    // metadata `<key>` (`hasleader` with a leader known: served).
    let with = |endpoint: &str, headers: &[(&str, &str)]| {
        gateway_http::request_with(
            endpoint,
            "POST",
            "/v3/kv/range",
            br#"{"key":"Zm9v"}"#,
            headers,
        )
    };
    let malformed = [("Grpc-Timeout", "abc")];
    same_error(
        "a malformed Grpc-Timeout",
        &with(e, &malformed),
        &with(c, &malformed),
        true,
    );
    for headers in [
        [("Grpc-Timeout", "5S")],
        [("Grpc-Metadata-Hasleader", "true")],
    ] {
        same(
            &format!("a range with {headers:?}"),
            &with(e, &headers),
            &with(c, &headers),
        );
    }

    // Neither member was hurt by any of it.
    wait_serving(e);
    wait_serving(c);
}
