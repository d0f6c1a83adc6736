//! etcdctl 3.4's per-endpoint commands (`endpoint status`, `endpoint health`,
//! `endpoint status --cluster`, `move-leader`) with endpoints written as URLs
//! (`http://127.0.0.1:PORT`, `https://...`), against 3-member clusters.
//! In clear etcdctl then sends the whole URL as the HTTP/2 `:authority`,
//! which etcd accepts; guards against Cairn's client port resetting those
//! requests (RST_STREAM PROTOCOL_ERROR). Over TLS etcdctl 3.4.23 sends a
//! plain `host:port`; the same commands are checked there too, through the
//! same shim.

use crate::common;

use std::time::Duration;

use common::tls::{cluster_certs, mutual_tls_flags, Ca};
use common::{etcdctl, require_tool, Cluster};

/// Runs etcdctl with `tls` flags first; panics with the logs if it fails.
fn ok(cluster: &Cluster, endpoints: &str, tls: &[String], args: &[&str]) -> String {
    let all: Vec<&str> = tls
        .iter()
        .map(String::as_str)
        .chain(args.iter().copied())
        .collect();
    let (success, out) = etcdctl(endpoints, &all);
    assert!(
        success,
        "etcdctl --endpoints={endpoints} {args:?} failed:\n{out}\n{}",
        cluster.logs()
    );
    out
}

/// Waits until `endpoint` takes writes: the cluster has a leader.
fn wait_writable(cluster: &Cluster, endpoint: &str, tls: &[String]) {
    let mut args: Vec<&str> = tls.iter().map(String::as_str).collect();
    args.extend(["put", "/endpoints/ready", "1"]);
    common::try_wait_until(
        &format!("{endpoint} taking a write"),
        Duration::from_secs(60),
        || match etcdctl(endpoint, &args) {
            (true, _) => Ok(()),
            (false, out) => Err(out),
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
}

/// Each endpoint's (member id, leader id) from `endpoint status -w json`.
fn statuses(cluster: &Cluster, endpoints: &str, tls: &[String]) -> Vec<(String, u64, u64)> {
    let out = ok(
        cluster,
        endpoints,
        tls,
        &["endpoint", "status", "-w", "json"],
    );
    let json: serde_json::Value = serde_json::from_str(&out).expect("etcdctl json");
    json.as_array()
        .expect("an array of statuses")
        .iter()
        .map(|s| {
            let endpoint = s["Endpoint"].as_str().unwrap().to_string();
            let member = s["Status"]["header"]["member_id"].as_u64().unwrap();
            let leader = s["Status"]["leader"].as_u64().unwrap();
            (endpoint, member, leader)
        })
        .collect()
}

fn check_endpoint_commands(cluster: &Cluster, tls: &[String]) {
    let eps = cluster.endpoints();
    let all = eps.join(",");
    wait_writable(cluster, &eps[0], tls);

    for ep in &eps {
        let out = ok(cluster, ep, tls, &["endpoint", "status"]);
        assert!(out.starts_with(ep.as_str()), "{out}");
        let out = ok(cluster, ep, tls, &["endpoint", "health"]);
        assert!(out.contains(&format!("{ep} is healthy")), "{out}");
    }
    let out = ok(cluster, &all, tls, &["endpoint", "health"]);
    assert_eq!(out.matches("is healthy").count(), 3, "{out}");

    let table = ok(
        cluster,
        &eps[1],
        tls,
        &["endpoint", "status", "--cluster", "-w", "table"],
    );
    for ep in &eps {
        assert!(table.contains(ep.as_str()), "{ep} missing from\n{table}");
    }
    assert_eq!(table.matches(" true ").count(), 1, "one leader:\n{table}");

    let before = statuses(cluster, &all, tls);
    assert_eq!(before.len(), 3);
    let leader = before[0].2;
    assert!(before.iter().all(|s| s.2 == leader), "{before:?}");
    let target = before.iter().map(|s| s.1).find(|&m| m != leader).unwrap();
    let out = ok(cluster, &all, tls, &["move-leader", &format!("{target:x}")]);
    assert!(out.contains("Leadership transferred"), "{out}");
    common::wait_until(
        &format!("leadership reaching {target:x}"),
        Duration::from_secs(20),
        || {
            let after = statuses(cluster, &all, tls);
            if after.iter().all(|s| s.2 == target) {
                Ok(())
            } else {
                Err(format!("{after:?}"))
            }
        },
    );
}

#[test]
fn endpoint_commands_with_http_urls() {
    if !require_tool("etcdctl") {
        return;
    }
    let cluster = Cluster::start(3, &[]);
    check_endpoint_commands(&cluster, &[]);
}

#[test]
fn endpoint_commands_with_https_urls() {
    if !require_tool("etcdctl") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("cairn test CA");
    let [client, server, peer] = cluster_certs(dir.path(), &ca);
    let flags = mutual_tls_flags(&server, &peer);
    let cluster = Cluster::start_in(dir, "https", &vec![flags; 3]);
    check_endpoint_commands(&cluster, &client.etcdctl_args());
}
