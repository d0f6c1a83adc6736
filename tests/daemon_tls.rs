//! TLS on the client and peer ports with etcd's flags, driven by Debian's
//! etcdctl 3.4 (and curl and openssl for the HTTP endpoints and the
//! certificates served) against 3-member clusters. Guards against a TLS port
//! that lets in a client or a peer it should refuse (no certificate, one from
//! another CA, plaintext), against certificates that only a restart picks
//! up, against bad certificate files that start a member half-configured,
//! and against handshake floods or garbage that stop a member serving.

use crate::common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::replace_file;
use common::tls::{cluster_certs, ctl, ctl_eventually, get_value, mutual_tls_flags, s, Ca, Certs};
use common::{require_tool, Cluster};

fn curl(args: &[&str]) -> (bool, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .args(args)
        .output()
        .expect("run curl");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// The subject of the certificate served at 127.0.0.1:`port` (openssl's
/// one-line form), presenting `client` as the client certificate.
fn served_subject(port: u16, client: &Certs) -> String {
    let mut child = Command::new("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{port}")])
        .args(["-CAfile", &s(&client.ca)])
        .args(["-cert", &s(&client.cert), "-key", &s(&client.key)])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run openssl");
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.lines()
        .find(|l| l.starts_with("subject="))
        .unwrap_or_else(|| panic!("no certificate served on {port}:\n{text}"))
        .replace(' ', "")
}

fn tools_present() -> bool {
    require_tool("etcdctl") && require_tool("curl") && require_tool("openssl")
}

#[test]
fn mutual_tls_serves_the_right_certificates_and_refuses_the_rest() {
    if !tools_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("cairn test CA");
    let other_ca = Ca::new("another CA");
    let [client, server, peer] = cluster_certs(dir.path(), &ca);
    let stranger = Certs::write(dir.path(), "stranger", &other_ca, "client");
    let flags = mutual_tls_flags(&server, &peer);
    let cluster = Cluster::start_in(dir, "https", &vec![flags; 3]);
    let good = client.etcdctl_args();
    let eps = cluster.endpoints();

    ctl_eventually(&cluster, &eps[0], &good, &["put", "/tls/a", "1"]);
    for ep in &eps {
        // Each member serves over TLS, and the write reached every member
        // over the TLS peer links (a linearizable read goes to the leader).
        ctl_eventually(&cluster, ep, &good, &["put", &format!("/tls/{ep}"), "v"]);
        assert_eq!(get_value(ep, &good, "/tls/a").as_deref(), Some("1"));
    }
    let (ok, members) = ctl(&eps[1], &good, &["member", "list"]);
    assert!(
        ok && members.matches("https://127.0.0.1:").count() >= 3,
        "{members}"
    );

    // A lease kept alive at every member: at the two that do not lead the
    // shard, the renewal goes to the leader over the peer port's TLS HTTP.
    let (ok, out) = ctl(&eps[0], &good, &["lease", "grant", "60"]);
    assert!(ok, "{out}");
    let lease = out.split_whitespace().nth(1).unwrap().to_string();
    for ep in &eps {
        let (ok, out) = ctl(ep, &good, &["lease", "keep-alive", "--once", &lease]);
        assert!(ok && out.contains("TTL"), "keep-alive at {ep}: {out}");
    }

    // Refused: no client certificate, one from another CA, plaintext.
    let ca_only = vec![format!("--cacert={}", s(&client.ca))];
    let refusals: [(&str, String, Vec<String>); 3] = [
        ("no client certificate", eps[0].clone(), ca_only),
        ("another CA's certificate", eps[0].clone(), {
            let mut a = stranger.etcdctl_args();
            a[0] = format!("--cacert={}", s(&client.ca));
            a
        }),
        (
            "plaintext",
            eps[0].replace("https://", "http://"),
            Vec::new(),
        ),
    ];
    for (what, ep, tls) in &refusals {
        let (ok, out) = ctl(ep, tls, &["put", "/tls/refused", what]);
        assert!(!ok, "{what}: the put went through: {out}");
    }
    assert_eq!(get_value(&eps[0], &good, "/tls/refused"), None);

    // Health and metrics follow the client port's TLS.
    let port = cluster.members[0].client_port;
    let https = format!("https://127.0.0.1:{port}");
    let with_cert = [
        "--cacert",
        &s(&client.ca),
        "--cert",
        &s(&client.cert),
        "--key",
        &s(&client.key),
    ];
    let mut args = with_cert.to_vec();
    let health = format!("{https}/health");
    args.push(&health);
    let (ok, out) = curl(&args);
    assert!(ok && out.contains("\"health\":\"true\""), "{out}");
    let metrics = format!("{https}/metrics");
    let mut args = with_cert.to_vec();
    args.push(&metrics);
    let (ok, out) = curl(&args);
    assert!(ok && out.contains("etcd_server_has_leader"), "{out}");
    let (ok, out) = curl(&["--cacert", &s(&client.ca), &health]);
    assert!(!ok, "health without a client certificate: {out}");
    let (ok, out) = curl(&[&format!("http://127.0.0.1:{port}/health")]);
    assert!(!ok, "health in clear on a TLS port: {out}");

    // A handshake flood and garbage on both ports: half-open connections
    // that never finish a handshake, and bytes that are no TLS at all.
    let targets = [cluster.members[0].client_port, cluster.members[0].peer_port];
    let mut held = Vec::new();
    for i in 0..200usize {
        let port = targets[i % 2];
        let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            continue;
        };
        match i % 4 {
            0 | 1 => {
                let _ = c.write_all(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage");
            }
            2 => {
                let _ = c.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
            }
            _ => {}
        }
        held.push(c);
    }
    // Served all along, by the member under the flood and through its
    // peer links.
    for (i, ep) in eps.iter().enumerate() {
        let key = format!("/tls/flood{i}");
        let (ok, out) = ctl(ep, &good, &["put", &key, "x"]);
        assert!(
            ok,
            "put at {ep} during the flood: {out}\n{}",
            cluster.logs()
        );
        assert_eq!(get_value(&eps[0], &good, &key).as_deref(), Some("x"));
    }
    drop(held);
    let (ok, out) = ctl(&eps[0], &good, &["put", "/tls/after", "y"]);
    assert!(ok, "after the flood: {out}");
}

#[test]
fn a_peer_with_a_certificate_from_another_ca_is_refused() {
    if !tools_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("cairn test CA");
    let other_ca = Ca::new("another CA");
    let [client, server, peer] = cluster_certs(dir.path(), &ca);
    // m2 trusts the cluster's CA but presents a peer certificate of
    // another CA: the members it dials refuse it, and it cannot serve them.
    let mut intruder = Certs::write(dir.path(), "intruder", &other_ca, "peer");
    intruder.ca = peer.ca.clone();
    let flags = vec![
        mutual_tls_flags(&server, &peer),
        mutual_tls_flags(&server, &peer),
        mutual_tls_flags(&server, &intruder),
    ];
    let cluster = Cluster::start_in(dir, "https", &flags);
    let good = client.etcdctl_args();
    let eps = cluster.endpoints();
    // m0 and m1 are a quorum without m2.
    ctl_eventually(&cluster, &eps[0], &good, &["put", "/peer/a", "1"]);
    ctl_eventually(&cluster, &eps[1], &good, &["put", "/peer/b", "2"]);
    assert_eq!(get_value(&eps[1], &good, "/peer/a").as_deref(), Some("1"));
    // The members m2 dials refuse its certificate (from an unknown issuer)
    // and log it; m2 never gets the log, so its own reads see nothing.
    common::try_wait_until(
        "a refused TLS handshake logged",
        Duration::from_secs(60),
        || {
            let refused = cluster.members[..2].iter().any(|m| {
                m.log_text()
                    .lines()
                    .any(|l| l.contains("peer TLS handshake failed") && l.contains("UnknownIssuer"))
            });
            refused.then_some(()).ok_or_else(|| "none yet".to_string())
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    let (ok, out) = ctl(
        &eps[2],
        &good,
        &["get", "/peer/a", "--consistency=s", "--print-value-only"],
    );
    assert!(!(ok && out.contains('1')), "m2 got the data: {out}");
}

#[test]
fn certificates_rotate_without_restart() {
    if !tools_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("cairn test CA");
    let new_ca = Ca::new("next year's CA");
    let [client, server, peer] = cluster_certs(dir.path(), &ca);
    let flags = mutual_tls_flags(&server, &peer);
    let mut cluster = Cluster::start_in(dir, "https", &vec![flags; 3]);
    let good = client.etcdctl_args();
    let eps = cluster.endpoints();
    ctl_eventually(&cluster, &eps[0], &good, &["put", "/rot/a", "1"]);
    let peer_port = cluster.members[0].peer_port;
    assert!(served_subject(peer_port, &peer).contains("CN=peer"));

    // The client port moves to a certificate of the new CA: clients that
    // trust it get in, clients that trust only the old one no longer do.
    let (cert, key) = new_ca.leaf("server-v2");
    replace_file(&server.key, &key);
    replace_file(&server.cert, &cert);
    let new_ca_file = server.ca.with_file_name("new-ca.pem");
    std::fs::write(&new_ca_file, new_ca.issuer.pem()).unwrap();
    let mut trusting_new = good.clone();
    trusting_new[0] = format!("--cacert={}", s(&new_ca_file));
    for ep in &eps {
        let out = ctl_eventually(&cluster, ep, &trusting_new, &["get", "/rot/a"]);
        assert!(out.contains('1'), "{out}");
        let (ok, out) = ctl(ep, &good, &["get", "/rot/a"]);
        assert!(!ok, "the old CA still verifies {ep}: {out}");
    }

    // The peer port serves a new certificate at the next handshake, and a
    // member restarted afterwards rejoins over the new certificates.
    let (cert, key) = ca.leaf("peer-v2");
    replace_file(&peer.key, &key);
    replace_file(&peer.cert, &cert);
    assert!(
        served_subject(peer_port, &peer).contains("CN=peer-v2"),
        "peer port still serves the old certificate"
    );
    cluster.members[1].kill9();
    cluster.members[1].restart();
    let out = ctl_eventually(&cluster, &eps[1], &trusting_new, &["put", "/rot/b", "2"]);
    assert!(out.contains("OK"), "{out}");
    assert_eq!(
        get_value(&eps[2], &trusting_new, "/rot/b").as_deref(),
        Some("2")
    );
}

#[test]
fn a_member_joins_a_tls_cluster_over_tls() {
    if !require_tool("etcdctl") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("cairn test CA");
    let [client, server, peer] = cluster_certs(dir.path(), &ca);
    let flags = mutual_tls_flags(&server, &peer);
    let mut cluster = Cluster::start_in(dir, "https", &vec![flags.clone(); 3]);
    let good = client.etcdctl_args();
    let eps = cluster.endpoints();
    ctl_eventually(&cluster, &eps[0], &good, &["put", "/join/a", "1"]);
    // The joiner asks the members for the table over their TLS peer ports,
    // then replicates over TLS links.
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let joiner = cluster.new_joining_member("m3", &flags);
    let peer_url = cluster.members[joiner].peer_url();
    let (ok, out) = common::etcdctl_when_healthy(|| {
        ctl(
            &eps[1],
            &good,
            &[
                "member",
                "add",
                "m3",
                "--learner",
                &format!("--peer-urls={peer_url}"),
            ],
        )
    });
    assert!(ok, "member add: {out}");
    cluster.members[joiner].restart();
    let endpoint = cluster.members[joiner].endpoint();
    common::try_wait_until("the joiner catching up", Duration::from_secs(60), || {
        let (ok, out) = ctl(
            &endpoint,
            &good,
            &["get", "/join/a", "--consistency=s", "--print-value-only"],
        );
        (ok && out.trim() == "1").then_some(()).ok_or(out)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
}

#[test]
fn auto_tls_encrypts_both_ports_with_self_signed_certificates() {
    if !require_tool("etcdctl") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let flags: Vec<String> = vec!["--auto-tls".into(), "--peer-auto-tls".into()];
    let cluster = Cluster::start_in(dir, "https", &vec![flags; 3]);
    let eps = cluster.endpoints();
    let insecure = vec![
        "--insecure-transport=false".to_string(),
        "--insecure-skip-tls-verify".to_string(),
    ];
    ctl_eventually(&cluster, &eps[0], &insecure, &["put", "/auto/a", "1"]);
    for ep in &eps {
        let out = ctl_eventually(&cluster, ep, &insecure, &["get", "/auto/a"]);
        assert!(out.contains('1'), "{out}");
    }
    for m in &cluster.members {
        for side in ["client", "peer"] {
            let cert = m.data_dir.join("fixtures").join(side).join("cert.pem");
            assert!(cert.is_file(), "{} has no {side} certificate", m.name);
        }
    }
    let (ok, out) = ctl(
        &eps[0].replace("https://", "http://"),
        &[],
        &["get", "/auto/a"],
    );
    assert!(!ok, "plaintext got through: {out}");
}

/// Runs `cairn` with `args` in `dir`, expecting it to refuse to start:
/// returns what it printed.
fn refused_start(dir: &Path, args: &[String]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .current_dir(dir)
        .args([
            "--listen-client-urls",
            &format!("https://127.0.0.1:{}", common::free_port()),
            "--listen-peer-urls",
            &format!("https://127.0.0.1:{}", common::free_port()),
        ])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run cairn");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} started:\n{text}");
    text
}

#[test]
fn bad_certificates_and_keys_are_refused_at_start_naming_flag_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new("cairn test CA");
    let good = Certs::write(d, "good", &ca, "server");
    let other = Certs::write(d, "other", &ca, "server");
    let garbage = d.join("garbage.pem");
    std::fs::write(
        &garbage,
        "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let text = d.join("text.pem");
    std::fs::write(&text, "just some text\n").unwrap();
    let missing = d.join("missing.pem");
    let peer_ok = [
        "--peer-cert-file".to_string(),
        s(&good.cert),
        "--peer-key-file".to_string(),
        s(&good.key),
    ];
    let with_peer = |client: &[String]| -> Vec<String> {
        let mut v = client.to_vec();
        v.extend(peer_ok.iter().cloned());
        v
    };
    let pair =
        |cert: &Path, key: &Path| vec!["--cert-file".into(), s(cert), "--key-file".into(), s(key)];
    let cases: Vec<(Vec<String>, &str, Option<&Path>)> = vec![
        (
            with_peer(&pair(&garbage, &good.key)),
            "--cert-file",
            Some(&garbage),
        ),
        (
            with_peer(&pair(&text, &good.key)),
            "--cert-file",
            Some(&text),
        ),
        (
            with_peer(&pair(&missing, &good.key)),
            "--cert-file",
            Some(&missing),
        ),
        (
            with_peer(&pair(&good.cert, &text)),
            "--key-file",
            Some(&text),
        ),
        (
            with_peer(&pair(&good.cert, &good.cert)),
            "--key-file",
            Some(&good.cert),
        ),
        (
            with_peer(&pair(&good.cert, &other.key)),
            "--key-file",
            Some(&other.key),
        ),
        (
            with_peer(
                &[
                    pair(&good.cert, &good.key),
                    vec!["--trusted-ca-file".into(), s(&text)],
                ]
                .concat(),
            ),
            "--trusted-ca-file",
            Some(&text),
        ),
        (
            [
                pair(&good.cert, &good.key),
                vec![
                    "--peer-cert-file".into(),
                    s(&garbage),
                    "--peer-key-file".into(),
                    s(&good.key),
                ],
            ]
            .concat(),
            "--peer-cert-file",
            Some(&garbage),
        ),
        (
            [
                pair(&good.cert, &good.key),
                vec![
                    "--peer-cert-file".into(),
                    s(&good.cert),
                    "--peer-key-file".into(),
                    s(&other.key),
                ],
            ]
            .concat(),
            "--peer-key-file",
            Some(&other.key),
        ),
        (
            with_peer(&["--cert-file".into(), s(&good.cert)]),
            "--key-file",
            None,
        ),
        (peer_ok.to_vec(), "--listen-client-urls", None),
        (
            with_peer(
                &[
                    pair(&good.cert, &good.key),
                    vec!["--peer-crl-file".into(), s(&garbage)],
                ]
                .concat(),
            ),
            "--peer-crl-file",
            Some(&garbage),
        ),
        (
            with_peer(
                &[
                    pair(&good.cert, &good.key),
                    vec![
                        "--trusted-ca-file".into(),
                        s(&good.ca),
                        "--client-crl-file".into(),
                        s(&missing),
                    ],
                ]
                .concat(),
            ),
            "--client-crl-file",
            Some(&missing),
        ),
        (
            with_peer(
                &[
                    pair(&good.cert, &good.key),
                    vec![
                        "--peer-cert-allowed-cn".into(),
                        "peer".into(),
                        "--peer-cert-allowed-hostname".into(),
                        "localhost".into(),
                    ],
                ]
                .concat(),
            ),
            "mutually exclusive",
            None,
        ),
        (
            with_peer(
                &[
                    pair(&good.cert, &good.key),
                    vec!["--cipher-suites".into(), "TLS_RSA_WITH_RC4_128_SHA".into()],
                ]
                .concat(),
            ),
            "--cipher-suites",
            None,
        ),
    ];
    for (args, flag, file) in &cases {
        let out = refused_start(d, args);
        assert!(out.contains(flag), "{args:?}: {out}");
        if let Some(file) = file {
            assert!(
                out.contains(&s(file)),
                "{args:?} should name {}: {out}",
                file.display()
            );
        }
        assert!(!out.contains("panicked"), "{args:?}: {out}");
    }
    // Nothing was created for a start that was refused on its certificates.
    assert!(!d.join("default.cairn").join("member.toml").exists());
}
