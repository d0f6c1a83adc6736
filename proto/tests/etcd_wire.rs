//! Guards the hand-written etcd v3 `.proto` files against drifting from etcd's
//! wire format: a client built from Cairn's generated code talks to a real etcd
//! (Debian's `etcd` binary) and must get back exactly what it stored. A wrong
//! field number, type or service path shows up here as a decode error, an
//! `Unimplemented` status or a missing value.
//!
//! Needs `etcd` on PATH. Without it the test prints a skip note, unless the `CI`
//! variable is set, in which case a missing binary is a failure.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cairn_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use cairn_proto::etcdserverpb::kv_client::KvClient;
use cairn_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use cairn_proto::etcdserverpb::request_op::Request;
use cairn_proto::etcdserverpb::response_op::Response;
use cairn_proto::etcdserverpb::{
    Compare, PutRequest, RangeRequest, RequestOp, StatusRequest, TxnRequest,
};

const ETCD_START_TIMEOUT: Duration = Duration::from_secs(20);

/// Stops and reaps etcd even when an assertion fails half-way.
struct Etcd {
    child: Child,
    client_url: String,
    _data_dir: tempfile::TempDir,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral port on 127.0.0.1")
        .port()
}

fn etcd_available() -> bool {
    let found = Command::new("etcd")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "the etcd binary is not on PATH but CI is set: install etcd-server"
        );
        eprintln!("skipping: no `etcd` binary on PATH");
    }
    found
}

fn start_etcd() -> Etcd {
    let data_dir = tempfile::tempdir().expect("create a temporary data dir");
    let client_url = format!("http://127.0.0.1:{}", free_port());
    let peer_url = format!("http://127.0.0.1:{}", free_port());
    let child = Command::new("etcd")
        .args(["--name", "wire"])
        .arg("--data-dir")
        .arg(data_dir.path())
        .args(["--listen-client-urls", &client_url])
        .args(["--advertise-client-urls", &client_url])
        .args(["--listen-peer-urls", &peer_url])
        .args(["--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", &format!("wire={peer_url}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn etcd");
    Etcd {
        child,
        client_url,
        _data_dir: data_dir,
    }
}

async fn connect(etcd: &Etcd) -> tonic::transport::Channel {
    let deadline = Instant::now() + ETCD_START_TIMEOUT;
    loop {
        if let Ok(channel) = tonic::transport::Endpoint::from_shared(etcd.client_url.clone())
            .expect("valid endpoint url")
            .connect()
            .await
        {
            // A listening socket is not yet a serving member: wait for Status.
            let mut m = MaintenanceClient::new(channel.clone());
            if m.status(StatusRequest {}).await.is_ok() {
                return channel;
            }
        }
        assert!(
            Instant::now() < deadline,
            "etcd at {} did not serve within {ETCD_START_TIMEOUT:?}",
            etcd.client_url
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn generated_client_round_trips_with_real_etcd() {
    if !etcd_available() {
        return;
    }
    let etcd = start_etcd();
    let channel = connect(&etcd).await;
    let mut kv = KvClient::new(channel.clone());

    let status = MaintenanceClient::new(channel)
        .status(StatusRequest {})
        .await
        .expect("status")
        .into_inner();
    assert!(
        status.version.starts_with("3."),
        "version {}",
        status.version
    );
    let header = status.header.expect("status carries a header");
    assert_ne!(header.cluster_id, 0);
    assert_ne!(header.member_id, 0);
    assert_eq!(
        status.leader, header.member_id,
        "a single member leads itself"
    );

    let put = kv
        .put(PutRequest {
            key: "wire/a".into(),
            value: "1".into(),
            ..Default::default()
        })
        .await
        .expect("put wire/a")
        .into_inner();
    let rev_a = put.header.expect("put header").revision;
    assert!(
        rev_a >= 2,
        "first write after bootstrap has revision {rev_a}"
    );
    let put = kv
        .put(PutRequest {
            key: "wire/b".into(),
            value: "2".into(),
            prev_kv: true,
            ..Default::default()
        })
        .await
        .expect("put wire/b")
        .into_inner();
    assert_eq!(put.header.expect("put header").revision, rev_a + 1);
    assert!(put.prev_kv.is_none(), "wire/b did not exist before");

    // Prefix range, descending by key, to exercise the enums and range_end.
    let range = kv
        .range(RangeRequest {
            key: "wire/".into(),
            range_end: "wire0".into(),
            sort_order: cairn_proto::etcdserverpb::range_request::SortOrder::Descend as i32,
            ..Default::default()
        })
        .await
        .expect("range wire/")
        .into_inner();
    assert_eq!(range.count, 2);
    assert!(!range.more);
    let keys: Vec<&[u8]> = range.kvs.iter().map(|kv| kv.key.as_ref()).collect();
    assert_eq!(keys, [b"wire/b".as_ref(), b"wire/a".as_ref()]);
    assert_eq!(range.kvs[1].value.as_ref(), b"1");
    assert_eq!(range.kvs[1].create_revision, rev_a);
    assert_eq!(range.kvs[1].mod_revision, rev_a);
    assert_eq!(range.kvs[1].version, 1);

    // Compare-and-swap on the value: the first txn wins, the second sees the new
    // value and takes the failure branch, which reads the key back.
    let cas = |expect: &'static str, new: &'static str| TxnRequest {
        compare: vec![Compare {
            result: CompareResult::Equal as i32,
            target: CompareTarget::Value as i32,
            key: "wire/a".into(),
            target_union: Some(TargetUnion::Value(expect.into())),
            ..Default::default()
        }],
        success: vec![RequestOp {
            request: Some(Request::RequestPut(PutRequest {
                key: "wire/a".into(),
                value: new.into(),
                ..Default::default()
            })),
        }],
        failure: vec![RequestOp {
            request: Some(Request::RequestRange(RangeRequest {
                key: "wire/a".into(),
                ..Default::default()
            })),
        }],
    };
    let won = kv.txn(cas("1", "3")).await.expect("txn 1").into_inner();
    assert!(won.succeeded);
    assert!(matches!(
        won.responses.as_slice(),
        [cairn_proto::etcdserverpb::ResponseOp {
            response: Some(Response::ResponsePut(_))
        }]
    ));
    assert_eq!(won.header.expect("txn header").revision, rev_a + 2);

    let lost = kv.txn(cas("1", "4")).await.expect("txn 2").into_inner();
    assert!(!lost.succeeded);
    match lost.responses.as_slice() {
        [cairn_proto::etcdserverpb::ResponseOp {
            response: Some(Response::ResponseRange(r)),
        }] => {
            assert_eq!(r.kvs.len(), 1);
            assert_eq!(r.kvs[0].value.as_ref(), b"3");
            assert_eq!(r.kvs[0].version, 2);
            assert_eq!(r.kvs[0].mod_revision, rev_a + 2);
        }
        other => panic!("failure branch should return one range response, got {other:?}"),
    }

    // Compare on mod_revision (an int64 member of the target_union oneof).
    let mut by_rev = cas("", "5");
    by_rev.compare[0].target = CompareTarget::Mod as i32;
    by_rev.compare[0].target_union = Some(TargetUnion::ModRevision(rev_a + 2));
    let swapped = kv.txn(by_rev).await.expect("txn 3").into_inner();
    assert!(swapped.succeeded);
}
