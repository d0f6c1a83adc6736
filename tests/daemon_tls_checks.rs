//! What a verified certificate must also pass, with etcd's flags: revocation
//! lists (`--client-crl-file`, `--peer-crl-file`) and the one name a
//! certificate must carry (`--client-cert-allowed-hostname`,
//! `--peer-cert-allowed-cn`, `--peer-cert-allowed-hostname`). The client
//! side is asked of a real etcd 3.4 and of Cairn with the same files, and
//! must answer alike; the peer side is checked on 3-member clusters.
//! Guards against a revoked or misnamed certificate that still gets in, and
//! against a new list that only a restart picks up.

use crate::common;

use std::time::Duration;

use common::tls::{ctl, ctl_eventually, get_value, mutual_tls_flags, s, Ca, Certs};
use common::{replace_file, require_tool, Cluster, Etcd};

/// Each client's name and whether its put went through, in order.
type Outcomes = Vec<(&'static str, bool)>;

/// Puts by every client at `endpoint`, before and after the list changes
/// (`relist` rewrites it).
fn client_outcomes(
    endpoint: &str,
    clients: &[(&'static str, Certs)],
    relist: &dyn Fn(),
) -> (Outcomes, Outcomes) {
    // The clients of a round run side by side: a refused etcdctl retries
    // until its timeouts.
    let round = |tag: &str| -> Outcomes {
        std::thread::scope(|scope| {
            let runs: Vec<_> = clients
                .iter()
                .map(|(name, certs)| {
                    let key = format!("/checks/{tag}/{name}");
                    scope.spawn(move || {
                        let (ok, out) = ctl(endpoint, &certs.etcdctl_args(), &["put", &key, "v"]);
                        assert!(!ok || out.contains("OK"), "{name}: {out}");
                        (*name, ok)
                    })
                })
                .collect();
            runs.into_iter().map(|r| r.join().unwrap()).collect()
        })
    };
    let before = round("before");
    relist();
    // Every connection of etcdctl is new, so the next handshake sees the
    // new list (no restart, no signal).
    let after = round("after");
    (before, after)
}

#[test]
fn revoked_and_misnamed_clients_are_refused_as_by_etcd() {
    if !(require_tool("etcdctl") && require_tool("etcd")) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new("cairn test CA");
    let server = Certs::write(d, "server", &ca, "server");
    let local = &["127.0.0.1", "localhost"];
    let write = |name: &str, cn: &str, names: &[&str], serial: u64| {
        Certs::write_pair(d, name, &ca, ca.leaf_for(cn, names, Some(serial)))
    };
    let clients = [
        ("alice", write("alice", "alice", local, 11)),
        ("bob", write("bob", "bob", local, 12)),
        // Signed by the CA, but for another host only.
        ("carol", write("carol", "localhost", &["carol.example"], 13)),
    ];
    let crl = d.join("crl.pem");
    replace_file(&crl, &ca.crl(&[12]));
    let flags: Vec<String> = [
        "--cert-file",
        &s(&server.cert),
        "--key-file",
        &s(&server.key),
        "--trusted-ca-file",
        &s(&server.ca),
        "--client-cert-auth",
        "--client-crl-file",
        &s(&crl),
        "--client-cert-allowed-hostname",
        "localhost",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let relist = || replace_file(&crl, &ca.crl(&[11, 12]));

    // Cairn's test cluster speaks https on the peer port too.
    let mut cairn_flags = flags.clone();
    cairn_flags.extend(
        [
            "--peer-cert-file",
            &s(&server.cert),
            "--peer-key-file",
            &s(&server.key),
        ]
        .map(String::from),
    );
    let cluster = Cluster::start_in(dir, "https", &[cairn_flags]);
    let cairn_ep = cluster.endpoints()[0].clone();
    ctl_eventually(
        &cluster,
        &cairn_ep,
        &clients[0].1.etcdctl_args(),
        &["put", "/up", "1"],
    );
    let cairn = client_outcomes(&cairn_ep, &clients, &relist);

    replace_file(&crl, &ca.crl(&[12]));
    let etcd = Etcd::start_with("https", &flags);
    common::try_wait_until("etcd serving TLS", Duration::from_secs(60), || {
        match ctl(
            &etcd.endpoint,
            &clients[0].1.etcdctl_args(),
            &["put", "/up", "1"],
        ) {
            (true, _) => Ok(()),
            (false, out) => Err(format!("{out}\n{}", etcd.log_text())),
        }
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let etcd_outcomes = client_outcomes(&etcd.endpoint, &clients, &relist);

    let expected = (
        vec![("alice", true), ("bob", false), ("carol", false)],
        vec![("alice", false), ("bob", false), ("carol", false)],
    );
    assert_eq!(etcd_outcomes, expected, "etcd 3.4's answers changed");
    assert_eq!(
        cairn,
        expected,
        "Cairn answers unlike etcd\n{}",
        cluster.logs()
    );
    // Only alice's first put was written; the server's own certificate
    // (valid for localhost, not revoked) reads it.
    let (ok, out) = ctl(
        &cairn_ep,
        &server.etcdctl_args(),
        &["get", "/checks/", "--prefix", "--keys-only"],
    );
    let keys: Vec<&str> = out.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(ok && keys == ["/checks/before/alice"], "{out}");
}

#[test]
fn peers_refuse_a_revoked_or_misnamed_member_both_ways() {
    if !require_tool("etcdctl") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new("cairn test CA");
    let local = &["127.0.0.1", "localhost"];
    let client = Certs::write(d, "client", &ca, "client");
    let server = Certs::write(d, "server", &ca, "server");
    let peers: Vec<Certs> = (0..3)
        .map(|i| {
            let pair = ca.leaf_for("peer", local, Some(20 + i));
            Certs::write_pair(d, &format!("peer{i}"), &ca, pair)
        })
        .collect();
    let crl = d.join("peer-crl.pem");
    replace_file(&crl, &ca.crl(&[]));
    let flags: Vec<Vec<String>> = peers
        .iter()
        .map(|peer| {
            let mut f = mutual_tls_flags(&server, peer);
            f.extend([
                "--peer-crl-file".to_string(),
                s(&crl),
                "--peer-cert-allowed-cn".to_string(),
                "peer".to_string(),
            ]);
            f
        })
        .collect();
    let mut cluster = Cluster::start_in(dir, "https", &flags);
    let good = client.etcdctl_args();
    let eps = cluster.endpoints();
    ctl_eventually(&cluster, &eps[2], &good, &["put", "/peers/a", "1"]);
    assert_eq!(get_value(&eps[0], &good, "/peers/a").as_deref(), Some("1"));

    // m2's certificate is revoked; the members read the new list at their
    // next handshake. m2, restarted, can no longer reach m0 and m1 or be
    // reached by them: both ways are refused.
    replace_file(&crl, &ca.crl(&[22]));
    cluster.members[2].kill9();
    cluster.members[2].restart();
    refused_in_logs(&cluster, "Revoked");
    ctl_eventually(&cluster, &eps[0], &good, &["put", "/peers/b", "2"]);
    assert_eq!(get_value(&eps[1], &good, "/peers/b").as_deref(), Some("2"));
    let (ok, out) = ctl(
        &eps[2],
        &good,
        &["get", "/peers/b", "--consistency=s", "--print-value-only"],
    );
    assert!(
        !(ok && out.contains('2')),
        "the revoked member got the write: {out}"
    );

    // A new certificate of m2 with another name: signed by the CA and not
    // revoked, refused for its common name.
    let (cert, key) = ca.leaf_for("intruder", local, Some(30));
    replace_file(&peers[2].key, &key);
    replace_file(&peers[2].cert, &cert);
    cluster.members[2].kill9();
    cluster.members[2].restart();
    refused_in_logs(
        &cluster,
        "common name \"intruder\" is not the allowed \"peer\"",
    );

    // Given its name back, m2 rejoins and catches up.
    let (cert, key) = ca.leaf_for("peer", local, Some(31));
    replace_file(&peers[2].key, &key);
    replace_file(&peers[2].cert, &cert);
    cluster.members[2].kill9();
    cluster.members[2].restart();
    common::try_wait_until("m2 catching up", Duration::from_secs(60), || {
        let (ok, out) = ctl(
            &eps[2],
            &good,
            &["get", "/peers/b", "--consistency=s", "--print-value-only"],
        );
        (ok && out.trim() == "2").then_some(()).ok_or(out)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
}

/// Waits until m0 or m1 logs a peer handshake refused with `why`.
fn refused_in_logs(cluster: &Cluster, why: &str) {
    common::try_wait_until(
        &format!("a peer handshake refused for {why:?}"),
        Duration::from_secs(60),
        || {
            let seen = cluster.members[..2].iter().any(|m| {
                m.log_text()
                    .lines()
                    .any(|l| l.contains("peer TLS handshake failed") && l.contains(why))
            });
            seen.then_some(()).ok_or_else(|| "none yet".to_string())
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
}
