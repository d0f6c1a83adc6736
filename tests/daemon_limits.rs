//! Guards against members diverging when started with different request
//! limits: `--max-txn-ops` and `--max-request-bytes` are checked at the API
//! of the member a client talks to (with etcd's errors, nested txns
//! included), never again when a committed entry is applied. A 3-member
//! cluster of real `cairn` processes where one member has small limits: a txn
//! of 10 ops (one nested) and a put of 100 KiB sent to the other members are
//! applied on every member identically (HashKV equal, keys readable on the
//! small member), and the small member refuses the same requests itself.

use crate::common;

use std::time::{Duration, Instant};

use common::{client, status_of, wait_writable, Cluster};
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use tonic::Code;

const TOO_MANY_OPS: &str = "etcdserver: too many operations in txn request";
const TOO_LARGE: &str = "etcdserver: request is too large";

fn ten_op_txn(prefix: &str) -> Txn {
    Txn::new()
        .when(vec![Compare::version(
            format!("{prefix}/0"),
            CompareOp::Equal,
            0,
        )])
        .and_then(
            (0..10)
                .map(|i| TxnOp::put(format!("{prefix}/{i}"), format!("v{i}"), None))
                .collect::<Vec<_>>(),
        )
}

/// One op at the top, ten in a nested txn.
fn nested_ten_op_txn(prefix: &str) -> Txn {
    let inner = Txn::new().and_then(
        (0..10)
            .map(|i| TxnOp::put(format!("{prefix}/{i}"), "nested", None))
            .collect::<Vec<_>>(),
    );
    Txn::new().and_then(vec![TxnOp::txn(inner)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_with_different_limits_apply_the_same_log() {
    let small: &[&str] = &["--max-txn-ops", "4", "--max-request-bytes", "65536"];
    let large: &[&str] = &["--max-txn-ops", "128"];
    let cluster = Cluster::start_each(&[small, large, large]);
    let mut clients = Vec::new();
    for ep in cluster.endpoints() {
        let mut c = client(&ep).await;
        wait_writable(&mut c, &format!("/ready/{ep}")).await;
        clients.push(c);
    }

    // The small member refuses at its API, with etcd's errors and codes.
    for (what, txn) in [
        ("flat", ten_op_txn("/refused/flat")),
        ("nested", nested_ten_op_txn("/refused/nested")),
    ] {
        let e = status_of(clients[0].txn(txn).await.unwrap_err());
        assert_eq!(e.code(), Code::InvalidArgument, "{what}: {e:?}");
        assert_eq!(e.message(), TOO_MANY_OPS, "{what}");
    }
    let big = vec![b'x'; 100 * 1024];
    let e = status_of(
        clients[0]
            .put("/refused/big", big.clone(), None)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert_eq!(e.message(), TOO_LARGE);

    // The same requests through members that accept them.
    let r = clients[1].txn(ten_op_txn("/flat")).await.unwrap();
    assert!(r.succeeded());
    let r = clients[2].txn(nested_ten_op_txn("/nested")).await.unwrap();
    assert!(r.succeeded());
    clients[1].put("/big", big.clone(), None).await.unwrap();
    let last = clients[2]
        .put("/last", "1", None)
        .await
        .unwrap()
        .header()
        .expect("header")
        .revision();

    // Every member applied them, identically: the small member too.
    let deadline = Instant::now() + Duration::from_secs(30);
    let hashes = loop {
        let mut hashes = Vec::new();
        for c in clients.iter_mut() {
            // A member that has not applied `last` yet answers "future revision".
            if let Ok(h) = c.hash_kv(last).await {
                hashes.push(h.hash());
            }
        }
        if hashes.len() == clients.len() || Instant::now() > deadline {
            break hashes;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        hashes.len(),
        clients.len(),
        "not every member reached revision {last}\n{}",
        cluster.logs()
    );
    assert!(
        hashes.windows(2).all(|w| w[0] == w[1]),
        "members diverged: hash_kv at {last} = {hashes:?}\n{}",
        cluster.logs()
    );
    let serializable = || Some(GetOptions::new().with_serializable());
    let flat = clients[0]
        .get("/flat/", serializable().map(|o| o.with_prefix()))
        .await
        .unwrap();
    assert_eq!(flat.kvs().len(), 10);
    let nested = clients[0]
        .get("/nested/", serializable().map(|o| o.with_prefix()))
        .await
        .unwrap();
    assert_eq!(nested.kvs().len(), 10);
    assert!(nested.kvs().iter().all(|kv| kv.value() == b"nested"));
    let got = clients[0].get("/big", serializable()).await.unwrap();
    assert_eq!(
        got.kvs().first().map(|kv| kv.value().len()),
        Some(big.len())
    );
    let refused = clients[1]
        .get("/refused/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(refused.kvs().len(), 0, "a refused request was applied");
}
