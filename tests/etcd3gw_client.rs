//! OpenStack's etcd3gw (Debian's python3-etcd3gw), run as its users run it,
//! against a real member through the HTTP/JSON gateway: put, get, prefixes,
//! create and compare-and-swap, leases, its lock recipe and watches. Guards
//! against gateway answers that etcd's own JSON clients cannot read.

use crate::common;

use std::process::Command;

/// Debian's interpreter, which has the distribution's python3-etcd3gw (a
/// `python3` earlier on PATH may be another installation without it).
const PYTHON: &str = "/usr/bin/python3";

fn etcd3gw_installed() -> bool {
    let found = Command::new(PYTHON)
        .args(["-c", "import etcd3gw"])
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "python3-etcd3gw is required under CI but is not installed"
        );
        eprintln!("SKIP: python3-etcd3gw is not installed (apt-get install python3-etcd3gw)");
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd3gw_works_against_cairn() {
    if !etcd3gw_installed() {
        return;
    }
    let cluster = common::Cluster::start(1, &["--cores", "1"]);
    let endpoint = cluster.members[0].endpoint();
    let mut c = common::client(&endpoint).await;
    common::wait_writable(&mut c, "/etcd3gw/ready").await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/etcd3gw/check.py");
    let out = Command::new(PYTHON)
        .arg(script)
        .arg("127.0.0.1")
        .arg(cluster.members[0].client_port.to_string())
        .output()
        .expect("run python3");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}\n{}", cluster.logs());
    assert!(text.contains("etcd3gw: all checks passed"), "{text}");
}
