//! A member that restarts far behind applies its backlog in bounded turns:
//! the shard driver stops applying once a turn has applied its budget
//! (`APPLY_BYTES_PER_TURN`, 4 MiB) and goes on in the next turn, so the
//! shard's ticks and the core's other shards run in between; the store it
//! ends with is the others'.

use crate::common;
use crate::promtext;

use std::time::Duration;

use common::{client, eventually, http_get, shard0_leader, wait_writable, Cluster};

/// Values written while the member is down: 40 MiB in all.
const VALUES: usize = 160;
const VALUE_BYTES: usize = 256 << 10;

fn capped_turns(port: u16) -> Option<f64> {
    let (code, body) = http_get(port, "/metrics");
    if code != 200 {
        return None;
    }
    promtext::parse(&body)
        .ok()?
        .value("cairn_shard_apply_turns_capped_total", &[("shard", "0")])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_restarting_behind_applies_its_backlog_in_capped_turns_and_ends_equal() {
    let mut cluster = Cluster::start(3, &[]);
    let mut c = client(&cluster.members[0].endpoint()).await;
    wait_writable(&mut c, "/catch-up/ready").await;
    let leader = shard0_leader(&cluster).await;
    let behind = (leader + 1) % 3;
    let writer = (leader + 2) % 3;
    assert_eq!(cluster.members[behind].terminate(), Some(0));

    let mut c = client(&cluster.members[writer].endpoint()).await;
    for i in 0..VALUES {
        let value = vec![b'a' + (i % 26) as u8; VALUE_BYTES];
        c.put(format!("/catch-up/k{i:04}"), value, None)
            .await
            .unwrap_or_else(|e| panic!("put {i}: {e}\n{}", cluster.logs()));
    }
    let last = format!("/catch-up/k{:04}", VALUES - 1);
    let revision = c
        .get(last.as_str(), None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();

    cluster.members[behind].restart();
    let endpoint = cluster.members[behind].endpoint();
    let b = client(&endpoint).await;
    eventually(
        "the restarted member applies the backlog",
        Duration::from_secs(120),
        || {
            let mut b = b.clone();
            let last = last.clone();
            async move {
                let opts = etcd_client::GetOptions::new().with_serializable();
                match b.get(last, Some(opts)).await {
                    Ok(r) if r.kvs().len() == 1 => Ok(()),
                    Ok(r) => Err(format!(
                        "not yet: revision {:?}",
                        r.header().map(|h| h.revision())
                    )),
                    Err(e) => Err(e.to_string()),
                }
            }
        },
    )
    .await;

    let capped = capped_turns(cluster.members[behind].client_port).unwrap_or(0.0);
    assert!(
        capped >= 1.0,
        "applying {} MiB of backlog never stopped at the turn budget ({capped} capped turns)\n{}",
        (VALUES * VALUE_BYTES) >> 20,
        cluster.logs()
    );
    // The store it applied in pieces is the others' store.
    let mut hashes = Vec::new();
    for m in &cluster.members {
        let mut c = client(&m.endpoint()).await;
        hashes.push(c.hash_kv(revision).await.unwrap().hash());
    }
    assert!(
        hashes.iter().all(|h| *h == hashes[0]),
        "HashKV at {revision} differs: {hashes:?}"
    );
}
