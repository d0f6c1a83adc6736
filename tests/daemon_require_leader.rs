//! Streams that require a leader (etcd's `hasleader` metadata, which
//! etcdctl, Kubernetes' watches and the etcd client's `with_require_leader`
//! set), against a member cut off from its cluster: its open Watch and
//! LeaseKeepAlive streams end with "etcdserver: no leader" once it has gone
//! three election timeouts without a leader, so clients move to another
//! member; new ones are refused at once; a stream opened without the
//! metadata stays open, as etcd leaves it. Unary calls that require a
//! leader are refused too, and a call that outlives its deadline there is
//! answered DeadlineExceeded, the code a client's own deadline gives; so
//! is a gateway call with a `Grpc-Metadata-Hasleader` header. Once
//! the cluster is back,
//! the member serves such streams again. A Watch stream whose client has
//! stopped reading lets go of its watches at the loss all the same.

use crate::common;

use std::time::{Duration, Instant};

use cairn_proto::etcdserverpb::PutRequest;
use cairn_proto::grpc_health_v1::health_check_response::ServingStatus;
use cairn_proto::grpc_health_v1::health_client::HealthClient;
use cairn_proto::grpc_health_v1::HealthCheckRequest;
use cairn_proto::h2::frame;
use cairn_proto::h2::hpack::{self, Block};
use common::raw_h2::{grpc_message, header_block, request_fields, Raw};
use common::{client, status_of, wait_writable, Cluster};
use etcd_client::{ConnectOptions, GetOptions, WatchOptions};

/// Longest wait for the member to notice, bounded by what the cluster does
/// (an election timeout of 1 s, three of them, plus slow-machine slack).
const NOTICE_WITHIN: Duration = Duration::from_secs(60);

async fn requiring_leader(endpoint: &str) -> etcd_client::Client {
    let options = ConnectOptions::new().with_require_leader(true);
    etcd_client::Client::connect([endpoint], Some(options))
        .await
        .expect("a client that requires a leader")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_that_require_a_leader_end_when_the_member_loses_it() {
    let mut cluster = Cluster::start(3, &["--shards", "1"]);
    let survivor = 2;
    let endpoint = cluster.members[survivor].endpoint();
    let mut plain = client(&endpoint).await;
    wait_writable(&mut plain, "/leader/ready").await;
    let mut c = requiring_leader(&endpoint).await;

    let mut required = c
        .watch("/leader/", Some(WatchOptions::new().with_prefix()))
        .await
        .expect("a watch that requires a leader");
    let mut unrequired = plain
        .watch("/leader/", Some(WatchOptions::new().with_prefix()))
        .await
        .expect("a plain watch");
    for w in [&mut required, &mut unrequired] {
        let created = tokio::time::timeout(NOTICE_WITHIN, w.message())
            .await
            .expect("created in time")
            .expect("created")
            .expect("a response");
        assert!(created.created(), "{created:?}");
    }
    // A watch through the HTTP/JSON gateway that requires a leader.
    let gateway_endpoint = endpoint.clone();
    let mut gateway_watch = tokio::task::spawn_blocking(move || {
        let create = r#"{"create_request": {"key": "L2xlYWRlci8=", "range_end": "L2xlYWRlcjA="}}"#;
        let mut w = crate::gateway_http::open_stream_with(
            &gateway_endpoint,
            "/v3/watch",
            create,
            &[("Grpc-Metadata-Hasleader", "true")],
        );
        let created = w.lines(1);
        assert_eq!(created[0]["result"]["created"], true, "{created:?}");
        w
    })
    .await
    .expect("a gateway watch");
    let lease = c.lease_grant(60, None).await.expect("a lease").id();
    let (mut keeper, mut acks) = c.lease_keep_alive(lease).await.expect("keep-alive");
    keeper.keep_alive().await.expect("a keep-alive sent");
    let ack = tokio::time::timeout(NOTICE_WITHIN, acks.message())
        .await
        .expect("acked in time")
        .expect("acked");
    assert!(ack.is_some_and(|a| a.ttl() > 0));
    // An Observe stream (etcd's Election service) that requires a leader,
    // following a campaign.
    let campaigner = plain.lease_grant(60, None).await.expect("a lease").id();
    plain
        .campaign("/leader-el", "v", campaigner)
        .await
        .expect("a campaign");
    let mut observer = c.observe("/leader-el").await.expect("an observer");
    let seen = tokio::time::timeout(NOTICE_WITHIN, observer.message())
        .await
        .expect("observed in time")
        .expect("observed")
        .expect("the leader");
    assert_eq!(seen.kv().map(|kv| kv.value()), Some(&b"v"[..]));

    // A health Watch (gRPC's health service) that requires a leader.
    let mut health = HealthClient::connect(endpoint.clone())
        .await
        .expect("a health client");
    let mut ask = tonic::Request::new(HealthCheckRequest {
        service: String::new(),
    });
    ask.metadata_mut()
        .insert("hasleader", "true".parse().expect("metadata"));
    let mut health_watch = health
        .watch(ask)
        .await
        .expect("a health watch")
        .into_inner();
    let serving = tokio::time::timeout(NOTICE_WITHIN, health_watch.message())
        .await
        .expect("health in time")
        .expect("health")
        .expect("a status");
    assert_eq!(serving.status, ServingStatus::Serving as i32);

    // The two other members go: no quorum, no leader.
    for (i, m) in cluster.members.iter_mut().enumerate() {
        if i != survivor {
            m.kill9();
        }
    }
    let lost_at = Instant::now();
    let watch_end = tokio::time::timeout(NOTICE_WITHIN, required.message())
        .await
        .expect("the watch that requires a leader ends");
    let status = match watch_end {
        Err(etcd_client::Error::GRpcStatus(s)) => s,
        other => panic!("the watch ended with {other:?}"),
    };
    assert_eq!(
        (status.code(), status.message()),
        (tonic::Code::Unavailable, "etcdserver: no leader")
    );
    let noticed = lost_at.elapsed();
    let ended = tokio::task::spawn_blocking(move || gateway_watch.lines(1))
        .await
        .expect("the gateway watch's last line");
    assert_eq!(
        (
            ended[0]["error"]["grpc_code"].as_i64(),
            ended[0]["error"]["message"].as_str()
        ),
        (Some(14), Some("etcdserver: no leader")),
        "{ended:?}"
    );
    let keep_alive_end = tokio::time::timeout(NOTICE_WITHIN, acks.message())
        .await
        .expect("the keep-alive stream ends");
    assert!(
        matches!(&keep_alive_end, Err(etcd_client::Error::GRpcStatus(s))
            if s.code() == tonic::Code::Unavailable && s.message() == "etcdserver: no leader"),
        "{keep_alive_end:?}"
    );
    let observe_end = tokio::time::timeout(NOTICE_WITHIN, observer.message())
        .await
        .expect("the Observe stream ends");
    assert!(
        matches!(&observe_end, Err(etcd_client::Error::GRpcStatus(s))
            if s.code() == tonic::Code::Unavailable && s.message() == "etcdserver: no leader"),
        "{observe_end:?}"
    );
    let health_end = tokio::time::timeout(NOTICE_WITHIN, health_watch.message())
        .await
        .expect("the health Watch ends");
    assert!(
        matches!(&health_end, Err(s)
            if s.code() == tonic::Code::Unavailable && s.message() == "etcdserver: no leader"),
        "{health_end:?}"
    );
    // A new one is refused at once; the plain watch stays open.
    let refused = c.watch("/leader/", None).await.map(|_| ());
    assert!(
        matches!(&refused, Err(etcd_client::Error::GRpcStatus(s))
            if s.message() == "etcdserver: no leader"),
        "{refused:?}"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(500), unrequired.message())
            .await
            .is_err(),
        "the plain watch was ended"
    );
    // Unary calls that require a leader are refused, serializable reads and
    // Status included (etcd's interceptors check every call); without the
    // metadata a serializable read is served.
    let serializable = || Some(GetOptions::new().with_serializable());
    for refused in [
        c.get("/leader/", serializable()).await.map(|_| ()),
        c.status().await.map(|_| ()),
    ] {
        let s = status_of(refused.expect_err("a call that requires a leader"));
        assert_eq!(
            (s.code(), s.message()),
            (tonic::Code::Unavailable, "etcdserver: no leader")
        );
    }
    plain
        .get("/leader/", serializable())
        .await
        .expect("a plain serializable read");
    // Through the HTTP/JSON gateway too: a `Grpc-Metadata-Hasleader` header
    // is the call's `hasleader` metadata, as etcd's gateway passes it on.
    let read = r#"{"key": "L2xlYWRlci8=", "serializable": true}"#;
    let gateway = |headers: &[(&str, &str)]| {
        crate::gateway_http::request_with(
            &endpoint,
            "POST",
            "/v3/kv/range",
            read.as_bytes(),
            headers,
        )
    };
    let refused = gateway(&[("Grpc-Metadata-Hasleader", "true")]);
    let body = refused.json();
    assert_eq!(
        (
            refused.status,
            body["code"].as_i64(),
            body["error"].as_str()
        ),
        (503, Some(14), Some("etcdserver: no leader")),
        "{body}"
    );
    let served = gateway(&[]);
    assert_eq!(served.status, 200, "{}", served.text());
    // A gateway put past its `Grpc-Timeout` (it cannot commit here): the
    // code a gRPC client's own deadline gives, as through etcd's gateway.
    let late = crate::gateway_http::request_with(
        &endpoint,
        "POST",
        "/v3/kv/put",
        br#"{"key": "L2xlYWRlci9sYXRl", "value": "dg=="}"#,
        &[("Grpc-Timeout", "300m")],
    );
    let body = late.json();
    assert_eq!(
        (late.status, body["code"].as_i64(), body["error"].as_str()),
        (504, Some(4), Some("context deadline exceeded")),
        "{body}"
    );
    // A put cannot commit: at its deadline the member answers with the
    // code the client's own deadline gives. Written by hand, as a client
    // library's own timer would answer first.
    let port = cluster.members[survivor].client_port;
    let late = tokio::task::spawn_blocking(move || {
        let mut raw = Raw::open(port);
        let mut fields = request_fields("/etcdserverpb.KV/Put");
        fields.push(("grpc-timeout", "300m"));
        raw.send(
            frame::HEADERS,
            frame::FLAG_END_HEADERS,
            1,
            &header_block(&fields),
        );
        let put = PutRequest {
            key: b"/leader/late".to_vec().into(),
            value: b"v".to_vec().into(),
            ..Default::default()
        };
        raw.send(frame::DATA, frame::FLAG_END_STREAM, 1, &grpc_message(&put));
        let answer = raw.until(frame::HEADERS, Some(1)).expect("an answer");
        let mut block = Block::default();
        hpack::Decoder::default()
            .decode(&answer.payload, &mut block)
            .expect("a header block");
        block.pairs()
    })
    .await
    .expect("the raw call");
    // DeadlineExceeded, its message percent-encoded as gRPC sends it.
    for field in [
        ("grpc-status", "4"),
        ("grpc-message", "context%20deadline%20exceeded"),
    ] {
        let field = (field.0.to_string(), field.1.to_string());
        assert!(late.contains(&field), "{late:?}");
    }
    // Its status says so, as etcd's does.
    let status = plain.status().await.expect("a status");
    assert_eq!(status.leader(), 0);
    assert!(
        status.errors().iter().any(|e| e == "etcdserver: no leader"),
        "{:?}",
        status.errors()
    );
    eprintln!("the streams that require a leader ended {noticed:?} after quorum was lost");

    // The cluster back: such streams are served again.
    for (i, m) in cluster.members.iter_mut().enumerate() {
        if i != survivor {
            m.restart();
        }
    }
    wait_writable(&mut plain, "/leader/back").await;
    let deadline = Instant::now() + NOTICE_WITHIN;
    let mut again = loop {
        match c
            .watch("/leader/", Some(WatchOptions::new().with_prefix()))
            .await
        {
            Ok(w) => break w,
            Err(e) => {
                assert!(Instant::now() < deadline, "never served again: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let created = tokio::time::timeout(NOTICE_WITHIN, again.message())
        .await
        .expect("created in time");
    assert!(
        matches!(&created, Ok(Some(r)) if r.created() && !r.canceled()),
        "{created:?}"
    );
}

/// A Watch stream that requires a leader, whose client has stopped reading
/// and left its queue full, lets go of its watches as soon as the member
/// loses its leader; the client, reading again, gets the events queued
/// and then the error. (A stream's task that waited for room to send an
/// event saw the loss only once its client read again.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_watch_that_requires_a_leader_lets_go_of_its_watches_when_the_leader_is_lost() {
    let mut cluster = Cluster::start(3, &["--shards", "1"]);
    let survivor = 2;
    let endpoint = cluster.members[survivor].endpoint();
    let port = cluster.members[survivor].client_port;
    let mut plain = client(&endpoint).await;
    wait_writable(&mut plain, "/stall/ready").await;
    let mut c = requiring_leader(&endpoint).await;
    let mut stream = c
        .watch("/stall/", Some(WatchOptions::new().with_prefix()))
        .await
        .expect("a watch that requires a leader");
    let created = tokio::time::timeout(NOTICE_WITHIN, stream.message())
        .await
        .expect("created in time")
        .expect("created")
        .expect("a response");
    assert!(created.created(), "{created:?}");
    // Far more than the stream's queue (256 answers) and the connection's
    // flow-control windows hold, each put its own answer; nothing is read.
    let value = vec![b'v'; 64 * 1024];
    for i in 0..600 {
        plain
            .put(format!("/stall/{i:04}"), value.clone(), None)
            .await
            .expect("a put");
    }
    assert_eq!(
        common::watch_gauges(port).1.expect("the watcher gauge"),
        1.0
    );

    for (i, m) in cluster.members.iter_mut().enumerate() {
        if i != survivor {
            m.kill9();
        }
    }
    common::eventually(
        "the stalled stream lets go of its watch",
        NOTICE_WITHIN,
        || async {
            match common::watch_gauges(port).1.expect("the watcher gauge") {
                0.0 => Ok(()),
                n => Err(format!("{n} watches live")),
            }
        },
    )
    .await;

    let mut events = 0;
    let status = loop {
        match tokio::time::timeout(NOTICE_WITHIN, stream.message())
            .await
            .expect("an answer in time")
        {
            Ok(Some(resp)) => events += resp.events().len(),
            Ok(None) => panic!("the stream ended without its error, after {events} events"),
            Err(e) => break status_of(e),
        }
    };
    assert_eq!(
        (status.code(), status.message()),
        (tonic::Code::Unavailable, "etcdserver: no leader")
    );
    // Some events went out before the error, not all: the stream's task
    // took no more while its queue was full, and its watch fell behind.
    assert!(
        events > 0 && events < 600,
        "{events} of 600 events before the error"
    );
}
