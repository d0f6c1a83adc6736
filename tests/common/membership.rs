//! Membership changes as an operator makes them: retried while etcd's
//! strict reconfiguration check refuses them as the members' connections
//! are too new (right after a start), and no longer.

use std::time::{Duration, Instant};

/// What etcd's strict reconfiguration check answers while the members
/// have not been connected for 5 s (as right after a start).
pub const UNHEALTHY: &str = "etcdserver: unhealthy cluster";

/// Longest a membership change is retried while refused as [`UNHEALTHY`]:
/// the check passes 5 s after the members connect.
const UNHEALTHY_RETRY_FOR: Duration = Duration::from_secs(60);

/// Runs `change` (a membership change) until it is not refused as
/// [`UNHEALTHY`], as an operator retries one right after a start.
async fn when_healthy<T, F, Fut>(mut change: F) -> Result<T, etcd_client::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    let deadline = Instant::now() + UNHEALTHY_RETRY_FOR;
    loop {
        match change().await {
            Err(etcd_client::Error::GRpcStatus(s))
                if s.message() == UNHEALTHY && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            other => return other,
        }
    }
}

/// Adds a learner at `peer_url` through `c`, retried while refused as
/// [`UNHEALTHY`].
pub async fn add_learner(
    c: &etcd_client::Client,
    peer_url: &str,
) -> Result<etcd_client::MemberAddResponse, etcd_client::Error> {
    when_healthy(|| {
        let mut c = c.clone();
        let url = peer_url.to_string();
        async move {
            c.member_add(
                vec![url],
                Some(etcd_client::MemberAddOptions::new().with_is_learner()),
            )
            .await
        }
    })
    .await
}

/// Removes member `id` through `c`, retried while refused as [`UNHEALTHY`].
pub async fn remove_member(
    c: &etcd_client::Client,
    id: u64,
) -> Result<etcd_client::MemberRemoveResponse, etcd_client::Error> {
    when_healthy(|| {
        let mut c = c.clone();
        async move { c.member_remove(id).await }
    })
    .await
}

/// Runs an etcdctl membership change (`run` gives its success and output)
/// until it is not refused as [`UNHEALTHY`].
pub fn etcdctl_when_healthy(mut run: impl FnMut() -> (bool, String)) -> (bool, String) {
    let deadline = Instant::now() + UNHEALTHY_RETRY_FOR;
    loop {
        let (ok, out) = run();
        if ok || !out.contains(UNHEALTHY) || Instant::now() >= deadline {
            return (ok, out);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}
