//! Flags, the config file and their defaults, as a member parses them.

use super::*;
use crate::member_file::MEMBER_FILE;
use std::path::Path;

fn parse(args: &[&str]) -> Result<Config, ConfigError> {
    let mut all = vec!["cairn"];
    all.extend_from_slice(args);
    Config::from_flags(Flags::try_parse_from(all).expect("clap").merge_file()?)
}

#[test]
fn no_flags_start_a_single_member_on_loopback() {
    let c = parse(&[]).unwrap();
    assert_eq!(c.name, "default");
    assert_eq!(c.data_dir, PathBuf::from("default.cairn"));
    assert_eq!(
        c.listen_client_addrs,
        vec!["127.0.0.1:2379".parse().unwrap()]
    );
    assert_eq!(c.listen_peer_addrs, vec!["127.0.0.1:2380".parse().unwrap()]);
    assert_eq!(c.initial_cluster.len(), 1);
    assert_eq!(
        c.initial_cluster[0].peer_urls,
        vec!["http://127.0.0.1:2380"]
    );
    assert_eq!(c.max_request_bytes, 1_572_864);
    assert_eq!(c.max_txn_ops, 128);
    assert_eq!(c.max_concurrent_streams, u32::MAX, "etcd's: no limit");
    assert_eq!(c.stream_limit(), None);
    let capped = parse(&["--max-concurrent-streams", "100"]).unwrap();
    assert_eq!(capped.max_concurrent_streams, 100);
    assert_eq!(capped.stream_limit(), Some(100));
    assert!(c.cores >= 1);
    assert_eq!(c.shards, c.cores, "one shard per core by default");
    assert!(!c.shards_from_flag);
    assert_eq!(c.idle_poll, Duration::from_micros(DEFAULT_IDLE_POLL_US));
    let off = parse(&["--idle-poll-us", "0"]).unwrap();
    assert!(off.idle_poll.is_zero());
}

#[test]
fn three_member_cluster_flags() {
    let c = parse(&[
        "--name",
        "b",
        "--listen-client-urls",
        "http://127.0.0.1:22379",
        "--listen-peer-urls",
        "http://127.0.0.1:22380",
        "--initial-advertise-peer-urls",
        "http://127.0.0.1:22380",
        "--initial-cluster",
        "a=http://127.0.0.1:12380,b=http://127.0.0.1:22380,c=http://127.0.0.1:32380",
        "--initial-cluster-state",
        "new",
        "--shards",
        "4",
    ])
    .unwrap();
    assert_eq!(c.initial_cluster.len(), 3);
    assert_eq!(c.initial_cluster[1].name, "b");
    assert_eq!(c.shards, 4);
    assert_eq!(c.data_dir, PathBuf::from("b.cairn"));
}

#[test]
fn peer_names_are_checked_for_form_not_looked_up() {
    // A peer whose name does not resolve yet (its DNS record appears when
    // it starts) does not stop this member from starting.
    let c = parse(&[
        "--name",
        "a",
        "--initial-advertise-peer-urls",
        "http://127.0.0.1:12380",
        "--initial-cluster",
        "a=http://127.0.0.1:12380,b=http://cairn-b.invalid:2380",
    ])
    .unwrap();
    assert_eq!(
        c.initial_cluster[1].peer_urls,
        ["http://cairn-b.invalid:2380"]
    );
    for bad in [
        "a=http://127.0.0.1:12380,b=http://cairn-b.invalid",
        "a=http://127.0.0.1:12380,b=http://:2380",
        "a=http://127.0.0.1:12380,b=http://cairn-b.invalid:2380/path",
    ] {
        let err = parse(&[
            "--name",
            "a",
            "--initial-advertise-peer-urls",
            "http://127.0.0.1:12380",
            "--initial-cluster",
            bad,
        ])
        .expect_err(bad);
        assert!(err.to_string().starts_with("--initial-cluster"), "{err}");
    }
}

#[test]
fn bad_values_name_their_flag() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--initial-cluster-state", "old"],
            "--initial-cluster-state",
        ),
        (
            &["--listen-client-urls", "https://127.0.0.1:1"],
            "--listen-client-urls",
        ),
        (
            &["--listen-client-urls", "http://127.0.0.1:notaport"],
            "--listen-client-urls",
        ),
        (&["--shards", "0"], "--shards"),
        (&["--cores", "100000"], "--cores"),
        (&["--idle-poll-us", "20000"], "--idle-poll-us"),
        (&["--max-request-bytes", "99999999"], "--max-request-bytes"),
        (
            &["--max-concurrent-streams", "0"],
            "--max-concurrent-streams",
        ),
        (&["--election-timeout", "200"], "--election-timeout"),
        (&["--log-format", "xml"], "--log-format"),
        (&["--log-level", "loud"], "--log-level"),
        (&["--wal-backend", "magic"], "--wal-backend"),
        (
            &["--wal-segment-size-bytes", "1000"],
            "--wal-segment-size-bytes",
        ),
        (
            &["--initial-cluster", "x=http://127.0.0.1:2380"],
            "--initial-cluster",
        ),
        (&["--initial-cluster", "garbage"], "--initial-cluster"),
    ];
    for (args, flag) in cases {
        let err = parse(args).expect_err(&format!("{args:?} must be refused"));
        assert!(
            err.to_string().starts_with(flag),
            "{args:?}: error {err} should name {flag}"
        );
    }
}

#[test]
fn unknown_flag_is_refused_by_the_parser() {
    assert!(Flags::try_parse_from(["cairn", "--no-such-flag"]).is_err());
}

#[test]
fn config_file_fills_what_flags_leave_out() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cairn.toml");
    std::fs::write(
        &path,
        "name = \"filed\"\nshards = 3\nmax-txn-ops = 64\nmax-concurrent-streams = 500\n\
         initial-cluster = \"filed=http://127.0.0.1:2380\"\n\
         [wal]\nbackend = \"sync\"\nsegment-size-bytes = 8388608\n",
    )
    .unwrap();
    let c = parse(&["--config-file", path.to_str().unwrap(), "--shards", "5"]).unwrap();
    assert_eq!(c.name, "filed");
    assert_eq!(c.shards, 5, "the flag wins over the file");
    assert_eq!(c.max_txn_ops, 64);
    assert_eq!(c.max_concurrent_streams, 500);
    assert_eq!(c.wal.backend, WalBackendChoice::Sync);
    assert_eq!(c.wal.segment_size_bytes, 8 * 1024 * 1024);
}

#[test]
fn the_shipped_example_config_is_valid() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/cairn.toml");
    let flags = Flags::from_file(&path).expect("systemd/cairn.toml parses");
    assert_eq!(flags.name.as_deref(), Some("node1"));
    // Its addresses are another host's; everything else must validate.
    let c = Config::from_flags(Flags {
        listen_client_urls: Some("http://127.0.0.1:0".into()),
        advertise_client_urls: Some("http://127.0.0.1:2379".into()),
        listen_peer_urls: Some("http://127.0.0.1:0".into()),
        listen_metrics_urls: None,
        ..flags
    })
    .expect("the example validates");
    assert_eq!(c.initial_cluster.len(), 3);
}

#[test]
fn the_shipped_tls_example_config_is_valid() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/cairn-tls.toml");
    let flags = Flags::from_file(&path).expect("systemd/cairn-tls.toml parses");
    // Its addresses are another host's; everything else must validate.
    let c = Config::from_flags(Flags {
        listen_client_urls: Some("https://127.0.0.1:0".into()),
        listen_peer_urls: Some("https://127.0.0.1:0".into()),
        listen_metrics_urls: None,
        ..flags
    })
    .expect("the TLS example validates");
    assert_eq!(c.listen_client_https, [true]);
    assert!(c.client_tls.client_cert_auth && c.peer_tls.client_cert_auth);
    assert_eq!(
        c.peer_tls.trusted_ca_file.as_deref(),
        Some(Path::new("/etc/cairn/tls/ca.pem"))
    );
    assert_eq!(c.cipher_suites.len(), 2);
}

#[test]
fn tls_flags_follow_etcds_rules() {
    // An https:// URL needs its port's certificate, or auto TLS.
    let err = parse(&["--listen-client-urls", "https://127.0.0.1:1"]).unwrap_err();
    assert!(err.to_string().starts_with("--listen-client-urls"), "{err}");
    assert!(parse(&["--listen-client-urls", "https://127.0.0.1:1", "--auto-tls"]).is_ok());
    let err = parse(&["--listen-peer-urls", "https://127.0.0.1:2"]).unwrap_err();
    assert!(err.to_string().starts_with("--listen-peer-urls"), "{err}");
    // A certificate needs its key, and the other way round.
    let err = parse(&["--cert-file", "c.pem"]).unwrap_err();
    assert!(err.to_string().starts_with("--key-file"), "{err}");
    let err = parse(&["--peer-key-file", "k.pem"]).unwrap_err();
    assert!(err.to_string().starts_with("--peer-cert-file"), "{err}");
    // Bare boolean flags, as etcd's, or with a value.
    let c = parse(&[
        "--client-cert-auth",
        "--peer-client-cert-auth=false",
        "--cert-file",
        "c.pem",
        "--key-file",
        "k.pem",
    ])
    .unwrap();
    assert!(c.client_tls.client_cert_auth && !c.peer_tls.client_cert_auth);
    assert_eq!(c.listen_client_https, [false], "http:// stays in clear");
    // Revocation lists and allowed names, as etcd names them per side.
    let c = parse(&[
        "--client-crl-file",
        "client.crl",
        "--client-cert-allowed-hostname",
        "app.example",
        "--peer-crl-file",
        "peer.crl",
        "--peer-cert-allowed-cn",
        "peer",
    ])
    .unwrap();
    assert_eq!(
        c.client_tls.crl_file.as_deref(),
        Some(Path::new("client.crl"))
    );
    assert_eq!(
        c.client_tls.allowed_hostname.as_deref(),
        Some("app.example")
    );
    assert_eq!(c.client_tls.allowed_cn, None);
    assert_eq!(c.peer_tls.crl_file.as_deref(), Some(Path::new("peer.crl")));
    assert_eq!(c.peer_tls.allowed_cn.as_deref(), Some("peer"));
    assert!(!c.peer_tls.skip_client_san_verify);
    let c = parse(&[
        "--peer-cert-allowed-hostname",
        "node1.example",
        "--experimental-peer-skip-client-san-verification",
    ])
    .unwrap();
    assert_eq!(
        c.peer_tls.allowed_hostname.as_deref(),
        Some("node1.example")
    );
    assert!(c.peer_tls.skip_client_san_verify);
    let err = parse(&["--cipher-suites", "TLS_NOPE"]).unwrap_err();
    assert!(err.to_string().starts_with("--cipher-suites"), "{err}");
    // https:// peers need this member's peer TLS to reach them.
    let err = parse(&[
        "--name",
        "a",
        "--initial-advertise-peer-urls",
        "http://127.0.0.1:12380",
        "--initial-cluster",
        "a=http://127.0.0.1:12380,b=https://127.0.0.1:22380",
    ])
    .unwrap_err();
    assert!(err.to_string().starts_with("--initial-cluster"), "{err}");
}

#[test]
fn log_filters_are_accepted() {
    assert!(parse(&["--log-level", "info,cairn::raft=debug"]).is_ok());
    assert!(parse(&["--log-format", "human"]).is_ok());
}

#[test]
fn config_file_with_unknown_key_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "nmae = \"typo\"\n").unwrap();
    let err = parse(&["--config-file", path.to_str().unwrap()]).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("bad.toml") && msg.contains("nmae"), "{msg}");
}

/// Member b of three on this host.
const LOCAL_B: [&str; 6] = [
    "--name",
    "b",
    "--listen-peer-urls",
    "http://127.0.0.1:22380",
    "--initial-cluster",
    "a=http://127.0.0.1:12380,b=http://127.0.0.1:22380,c=http://localhost:32380",
];

/// `args` with `--data-dir` set to `dir`.
fn in_dir<'a>(args: &[&'a str], dir: &'a Path) -> Vec<&'a str> {
    let mut v = args.to_vec();
    v.extend(["--data-dir", dir.to_str().unwrap()]);
    v
}

/// Each member's share of its host, as that member works it out.
fn shares(spec: &str) -> Vec<HostShare> {
    let cluster = parse_initial_cluster(spec).unwrap();
    let pairs = || {
        cluster
            .iter()
            .map(|m| (m.name.as_str(), m.peer_urls.as_slice()))
    };
    cluster
        .iter()
        .map(|m| HostShare::of(&m.name, pairs()))
        .collect()
}

#[test]
fn a_cluster_on_one_host_divides_its_cpus() {
    // Every loopback name is one host; names compare without case; the
    // place is by name, whatever the list's order.
    let local = shares("c=http://127.0.0.1:1,b=http://LOCALHOST:2,a=http://[::1]:3");
    let expect = |index| HostShare { members: 3, index };
    assert_eq!(local, vec![expect(2), expect(1), expect(0)]);
    let named = shares("a=http://Node1:1,b=http://node1:2");
    assert_eq!(
        named,
        vec![
            HostShare {
                members: 2,
                index: 0
            },
            HostShare {
                members: 2,
                index: 1
            }
        ]
    );

    // A cluster over several hosts: every member keeps every CPU.
    let spread = shares("a=http://10.0.0.1:2380,b=http://10.0.0.2:2380,c=http://10.0.0.3:2380");
    assert!(spread.iter().all(|s| *s == HostShare::ALONE), "{spread:?}");
    // Two of three on one host is not the whole cluster: each member, those
    // two included, keeps every CPU, so all derive the same shard count.
    let mixed = shares("a=http://10.0.0.1:2380,b=http://10.0.0.1:2381,c=http://10.0.0.2:2380");
    assert!(mixed.iter().all(|s| *s == HostShare::ALONE), "{mixed:?}");
    // A member with URLs on two hosts does not make the others disagree.
    let two_urls =
        shares("a=http://127.0.0.1:1,a=http://10.0.0.1:1,b=http://127.0.0.1:2,c=http://10.0.0.1:3");
    assert!(
        two_urls.iter().all(|s| *s == HostShare::ALONE),
        "{two_urls:?}"
    );
    assert_eq!(shares("a=http://127.0.0.1:1"), vec![HostShare::ALONE]);

    let three = HostShare {
        members: 3,
        index: 2,
    };
    assert_eq!(three.cores(2), 1, "never below one core");
    assert_eq!(three.cores(8), 2);
    assert_eq!(HostShare::ALONE.cores(8), 8);
    assert_eq!(
        three.first_cpu(2),
        4,
        "after the cores of the two before it"
    );
}

#[test]
fn a_local_cluster_divides_the_cpus_unless_cores_is_given() {
    let cpus = available_cores();
    let dir = tempfile::tempdir().unwrap();
    let args = in_dir(&LOCAL_B, dir.path());
    let c = parse(&args).unwrap();
    assert_eq!(
        c.host_share,
        HostShare {
            members: 3,
            index: 1
        }
    );
    assert_eq!(c.cores, (cpus / 3).max(1));
    assert_eq!(
        c.shards, c.cores,
        "one shard per core of the member's share"
    );
    assert!(!c.shards_from_flag);
    let mut given = args.clone();
    given.extend(["--cores", "2", "--shards", "2"]);
    let c = parse(&given).unwrap();
    assert_eq!((c.cores, c.shards), (2, 2));
    assert!(c.shards_from_flag);
    assert_eq!(c.host_share.first_cpu(c.cores), 2);
    // Cores given alone: one shard each.
    let mut cores_only = args.clone();
    cores_only.extend(["--cores", "3"]);
    let c = parse(&cores_only).unwrap();
    assert_eq!((c.cores, c.shards), (3, 3));
    assert!(!c.shards_from_flag);
    // A lone member takes every CPU.
    let c = parse(&in_dir(&[], dir.path())).unwrap();
    assert_eq!(c.host_share, HostShare::ALONE);
    assert_eq!(c.cores, cpus);
}

#[test]
fn an_existing_member_keeps_its_layout_and_place_unless_flags_say_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let member = |name: &str, port: u16| {
        format!(
            "[[members]]\nid = {port}\nname = \"{name}\"\npeer_urls = [\"http://127.0.0.1:{port}\"]\n"
        )
    };
    // Member b (id 22380) with 5 shards on 3 WAL lanes and `members`.
    let write_table = |members: &[String]| {
        let text = format!(
            "layout_version = 1\nname = \"b\"\nmember_id = 22380\ncluster_id = 2\n\
             shards = 5\nwal_lanes = 3\n{}",
            members.concat()
        );
        std::fs::write(dir.path().join(MEMBER_FILE), text).unwrap();
    };
    let restart_b = || parse(&in_dir(&["--name", "b"], dir.path())).unwrap();
    let abc = [member("a", 12380), member("b", 22380), member("c", 32380)];
    write_table(&abc);
    // Restarted with no --initial-* flags: the table says where it stands.
    let c = restart_b();
    assert_eq!((c.cores, c.shards), (3, 5));
    assert_eq!(
        c.host_share,
        HostShare {
            members: 3,
            index: 1
        }
    );
    // A member added but not started (no name yet) does not move the
    // others' places; a table without this member's entry counts it alone.
    write_table(&[member("a", 12380), member("", 42380), member("b", 22380)]);
    assert_eq!(
        restart_b().host_share,
        HostShare {
            members: 3,
            index: 1
        }
    );
    write_table(&[member("a", 12380)]);
    assert_eq!(restart_b().host_share, HostShare::ALONE);
    write_table(&abc);
    let mut args = in_dir(&LOCAL_B, dir.path());
    let c = parse(&args).unwrap();
    assert_eq!((c.cores, c.shards), (3, 5), "not the local-cluster default");
    args.extend(["--cores", "1"]);
    let c = parse(&args).unwrap();
    assert_eq!(
        (c.cores, c.shards),
        (1, 5),
        "the flag wins; the start checks it"
    );
    // Unreadable layouts are left to the start to report.
    std::fs::write(dir.path().join(MEMBER_FILE), "not toml [").unwrap();
    let c = parse(&in_dir(&[], dir.path())).unwrap();
    assert_eq!(c.cores, available_cores());
}
