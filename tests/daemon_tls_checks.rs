//! What a verified certificate must also pass, with etcd's flags: revocation
//! lists (`--client-crl-file`, `--peer-crl-file`) and the one name a
//! certificate must carry (`--client-cert-allowed-hostname`,
//! `--peer-cert-allowed-cn`, `--peer-cert-allowed-hostname`). The client
//! side is asked of a real etcd 3.4 and of Cairn with the same files, and
//! must answer alike; the peer side is checked on 3-member clusters.
//! A peer's client certificate is also checked against the address it
//! connects from. Guards against a revoked or misnamed certificate that
//! still gets in, a peer certificate used from another host, and a new
//! list that only a restart picks up.

use crate::common;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use socket2::{Domain, Socket, Type};

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
    let revoked = "is revoked by --peer-crl-file";
    logged(&cluster, &[0, 1], ACCEPTED, revoked);
    // m0's link to m2 may first have failed while m2 restarted, and a run of
    // failures is logged once: m0, restarted, dials m2 afresh and says why.
    cluster.members[0].kill9();
    cluster.members[0].restart();
    logged(&cluster, &[0], DIALED, revoked);
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
    logged(
        &cluster,
        &[0, 1],
        ACCEPTED,
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

/// The line of a refused connection on the accept side, and on the dial side.
const ACCEPTED: &str = "peer TLS handshake failed";
const DIALED: &str = "peer unreachable";

/// Waits until one of `members` logs a `side` line saying `why`.
fn logged(cluster: &Cluster, members: &[usize], side: &str, why: &str) {
    common::try_wait_until(
        &format!("{side:?} for {why:?} in the log of one of {members:?}"),
        Duration::from_secs(60),
        || {
            let seen = members.iter().any(|&m| {
                let log = cluster.members[m].log_text();
                log.lines().any(|l| l.contains(side) && l.contains(why))
            });
            seen.then_some(()).ok_or_else(|| "none yet".to_string())
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
}

/// A front for a member's peer port at 127.0.0.1:`front` that dials the
/// member from 127.0.0.2, so every peer connection reaches it from an
/// address no peer certificate names.
fn serve_front_from_127_0_0_2(front: TcpListener, target: u16) {
    std::thread::spawn(move || {
        for incoming in front.incoming() {
            let Ok(inbound) = incoming else { continue };
            let dial = || -> std::io::Result<TcpStream> {
                let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
                socket.bind(&SocketAddr::from(([127, 0, 0, 2], 0)).into())?;
                socket.connect(&SocketAddr::from(([127, 0, 0, 1], target)).into())?;
                Ok(socket.into())
            };
            let Ok(outbound) = dial() else { continue };
            for (mut from, mut to) in [
                (inbound.try_clone().unwrap(), outbound.try_clone().unwrap()),
                (outbound, inbound),
            ] {
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from, &mut to);
                    let _ = to.shutdown(std::net::Shutdown::Write);
                });
            }
        }
    });
}

#[test]
fn a_peer_certificate_is_checked_against_the_address_it_connects_from() {
    if !require_tool("etcdctl") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new("cairn test CA");
    // Every certificate names 127.0.0.1 and localhost, not 127.0.0.2.
    let [client, server, peer] = common::tls::cluster_certs(d, &ca);
    let fronts: Vec<TcpListener> = (0..3)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let ports: Vec<u16> = fronts
        .iter()
        .map(|f| f.local_addr().unwrap().port())
        .collect();
    let flags = mutual_tls_flags(&server, &peer);
    let mut cluster = Cluster::start_with(dir, "https", &vec![flags.clone(); 3], &ports);
    for (m, front) in fronts.into_iter().enumerate() {
        serve_front_from_127_0_0_2(front, cluster.members[m].peer_port);
    }
    // Each member refuses the others: their certificates name 127.0.0.1 and
    // localhost, and 127.0.0.2 has no name that leads back to either.
    logged(
        &cluster,
        &[0, 1, 2],
        ACCEPTED,
        "127.0.0.2, the address the peer connected from",
    );

    // With the check off, as etcd's flag turns it off, the same members
    // form the cluster.
    let mut skipping: Vec<&str> = flags.iter().map(String::as_str).collect();
    skipping.push("--experimental-peer-skip-client-san-verification");
    for m in &mut cluster.members {
        m.kill9();
        m.set_args(&skipping);
        m.restart();
    }
    let good = client.etcdctl_args();
    let eps = cluster.endpoints();
    ctl_eventually(&cluster, &eps[0], &good, &["put", "/addr/a", "1"]);
    common::try_wait_until("m2 has the write", Duration::from_secs(60), || {
        let (ok, out) = ctl(
            &eps[2],
            &good,
            &["get", "/addr/a", "--consistency=s", "--print-value-only"],
        );
        (ok && out.trim() == "1").then_some(()).ok_or(out)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
}
