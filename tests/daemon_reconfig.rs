//! etcd's strict reconfiguration check, against real processes: with one of
//! three members killed, adding a member (which would make four with two
//! up, no quorum) and removing a member that serves are refused with etcd's
//! "unhealthy cluster", and nothing is changed; removing the member that is
//! down is allowed, as etcd allows it.

use crate::common;

use std::time::{Duration, Instant};

use common::{client, status_of, wait_writable, Cluster};

/// Longest wait for the members to notice the kill (their links see the
/// connection end at once; slack for a loaded machine).
const NOTICE_WITHIN: Duration = Duration::from_secs(60);

async fn member_ids(c: &mut etcd_client::Client) -> Vec<(u64, String)> {
    let list = c.member_list().await.expect("member list");
    let mut ids: Vec<_> = list
        .members()
        .iter()
        .map(|m| (m.id(), m.name().to_string()))
        .collect();
    ids.sort_by(|a, b| a.1.cmp(&b.1));
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_that_would_break_the_quorum_are_refused() {
    let mut cluster = Cluster::start(3, &[]);
    let endpoint = cluster.members[0].endpoint();
    let mut c = client(&endpoint).await;
    wait_writable(&mut c, "/reconfig/ready").await;
    let ids = member_ids(&mut c).await;
    assert_eq!(ids.len(), 3, "{ids:?}");
    // First a change that passes, once the links have lasted 5 s: the
    // refusals below are then the kill's doing.
    let learner_peer = format!("http://127.0.0.1:{}", common::free_port());
    let learner = common::add_learner(&c, &learner_peer)
        .await
        .expect("a learner added")
        .member()
        .expect("the added member")
        .id();
    c.member_remove(learner).await.expect("the learner removed");
    cluster.members[2].kill9();

    // Adding a member now would leave 2 of 4 up.
    let new_peer = format!("http://127.0.0.1:{}", common::free_port());
    let deadline = Instant::now() + NOTICE_WITHIN;
    let refused = loop {
        match c.member_add([new_peer.clone()], None).await {
            Err(e) => {
                let s = status_of(e);
                if s.message() == "etcdserver: unhealthy cluster" {
                    break s;
                }
                // Another member's shard leader may still be elected.
                assert!(Instant::now() < deadline, "never refused: {s:?}");
            }
            Ok(r) => panic!("a member added with one of three down: {r:?}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    // Removing a member that serves would leave 1 of 2 up.
    let e = status_of(c.member_remove(ids[1].0).await.unwrap_err());
    assert_eq!(
        (e.code(), e.message()),
        (tonic::Code::Unavailable, "etcdserver: unhealthy cluster")
    );
    assert_eq!(
        member_ids(&mut c).await,
        ids,
        "a refused change changed the table"
    );
    // Removing the member that is down leaves 2 of 2.
    c.member_remove(ids[2].0)
        .await
        .expect("the member that is down removed");
    let left = member_ids(&mut c).await;
    assert_eq!(left, ids[..2].to_vec());
    c.put("/reconfig/after", "v", None)
        .await
        .expect("a write on the two members left");
}
