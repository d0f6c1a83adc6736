//! gRPC's health service, asked the same questions of etcd 3.4 and of a
//! Cairn member: the server as a whole serves, an unknown service is
//! refused by Check and named unknown by Watch, whose stream stays open.
//! Guards against probes (Kubernetes' gRPC probes, grpc_health_probe, load
//! balancers) that pass against etcd and fail against Cairn.

use std::time::Duration;

use cairn_proto::grpc_health_v1::health_check_response::ServingStatus;
use cairn_proto::grpc_health_v1::health_client::HealthClient;
use cairn_proto::grpc_health_v1::HealthCheckRequest;

use crate::common::{self, client, wait_writable, Cluster, Etcd};

/// Every answer of one server, as text to compare.
async fn answers(endpoint: String) -> Vec<String> {
    wait_writable(&mut client(&endpoint).await, "health-ready").await;
    let mut health = HealthClient::connect(endpoint.clone())
        .await
        .unwrap_or_else(|e| panic!("connecting to {endpoint}: {e}"));
    let ask = |service: &str| HealthCheckRequest {
        service: service.into(),
    };
    let mut out = Vec::new();
    for service in ["", "etcdserverpb.KV", "no.such.Service"] {
        let answer = match health.check(ask(service)).await {
            Ok(r) => format!("{:?}", ServingStatus::try_from(r.into_inner().status)),
            Err(s) => format!("refused {:?} {:?}", s.code(), s.message()),
        };
        out.push(format!("check {service:?}: {answer}"));
    }
    for service in ["", "no.such.Service"] {
        let mut stream = health
            .watch(ask(service))
            .await
            .unwrap_or_else(|e| panic!("watch {service:?} at {endpoint}: {e}"))
            .into_inner();
        let first = stream
            .message()
            .await
            .unwrap_or_else(|e| panic!("watch {service:?} at {endpoint}: {e}"))
            .unwrap_or_else(|| panic!("watch {service:?} at {endpoint} ended at once"));
        // Nothing changes, and the stream stays open.
        let next = tokio::time::timeout(Duration::from_millis(500), stream.message()).await;
        assert!(
            next.is_err(),
            "watch {service:?} at {endpoint}: then {next:?}"
        );
        out.push(format!(
            "watch {service:?}: {:?}, then open",
            ServingStatus::try_from(first.status)
        ));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_service_answers_as_etcds() {
    if !common::require_tool("etcd") {
        return;
    }
    let etcd = Etcd::start();
    let cluster = Cluster::start(1, &[]);
    let on_etcd = answers(etcd.endpoint.clone()).await;
    let on_cairn = answers(cluster.members[0].endpoint()).await;
    assert_eq!(
        on_etcd[0], r#"check "": Ok(Serving)"#,
        "etcd's own answer: {on_etcd:?}"
    );
    assert_eq!(on_etcd, on_cairn, "etcd (left) against Cairn (right)");
}
