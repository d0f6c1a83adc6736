//! MoveLeader (`etcdctl move-leader`) against a real 3-member cluster: the
//! leadership moves to the target and stays there, and etcd's refusals come
//! for an unknown target, a learner, and a member that leads nothing.
//! Guards against an operator's move being lost or silently undone.

use crate::common;

use std::time::Duration;

use common::{client, etcdctl, shard0_leader, status_of, wait_writable, Cluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn move_leader_moves_shard_leadership_as_etcd_does() {
    if !common::require_tool("etcdctl") {
        return;
    }
    let cluster = Cluster::start(3, &["--shards", "1", "--cores", "1"]);
    let mut c = client(&cluster.members[0].endpoint()).await;
    wait_writable(&mut c, "/move/ready").await;
    let leader = shard0_leader(&cluster).await;
    let target = (leader + 1) % 3;
    let mut to_target = client(&cluster.members[target].endpoint()).await;
    let target_id = to_target
        .status()
        .await
        .unwrap()
        .header()
        .unwrap()
        .member_id();

    // etcdctl finds the leader among the endpoints and asks it. (Endpoints
    // are given without a scheme: etcdctl then sends `http://...` as each
    // call's HTTP/2 authority, which Cairn's HTTP/2 server refuses.)
    let all = cluster
        .members
        .iter()
        .map(|m| format!("127.0.0.1:{}", m.client_port))
        .collect::<Vec<_>>()
        .join(",");
    let (ok, out) = etcdctl(&all, &["move-leader", &format!("{target_id:x}")]);
    assert!(ok, "{out}\n{}", cluster.logs());
    assert!(out.contains("Leadership transferred"), "{out}");
    assert_eq!(shard0_leader(&cluster).await, target);
    // It stays: with one shard nothing hands it back.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(shard0_leader(&cluster).await, target, "{}", cluster.logs());
    c.put("/move/after", "1", None).await.unwrap();

    // A member that leads nothing is not the leader.
    let follower = (target + 1) % 3;
    let mut f = client(&cluster.members[follower].endpoint()).await;
    let e = status_of(f.move_leader(target_id).await.unwrap_err());
    assert!(e.message().contains("etcdserver: not leader"), "{e:?}");
    // Unknown targets and learners are bad transferees.
    let mut l = client(&cluster.members[target].endpoint()).await;
    let e = status_of(l.move_leader(0x1234_5678).await.unwrap_err());
    assert!(e.message().contains("bad leader transferee"), "{e:?}");
    let url = format!("http://127.0.0.1:{}", common::free_port());
    let added = common::add_learner(&l, &url).await.unwrap();
    let learner = added.member().unwrap().id();
    let e = status_of(l.move_leader(learner).await.unwrap_err());
    assert!(e.message().contains("bad leader transferee"), "{e:?}");
    assert_eq!(shard0_leader(&cluster).await, target);
}
