//! The cluster under test: real `cairn` members whose peer URLs name proxies
//! in the test process, and client nodes that reach each member through a
//! proxy of their own, all on one fault table.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::proxy::{self, Net, Node, Pids};
use crate::common::{self, Cluster};

/// How long one client request may take before its outcome is unknown.
pub const OP_TIMEOUT: Duration = Duration::from_secs(2);

/// Each member's disk-fault control file, under its data directory.
const DISK_FAULTS_FILE: &str = "disk-faults";
/// Each member's wall-clock control file, under its data directory.
const CLOCK_FILE: &str = "clock-offset";

pub struct Bench {
    pub cluster: Cluster,
    pub net: Arc<Net>,
    pub pids: Pids,
    /// `client_ports[c][m]`: the proxy port through which client `c` reaches
    /// member `m`.
    client_ports: Vec<Vec<u16>>,
    proxies: Vec<tokio::task::JoinHandle<()>>,
}

impl Bench {
    /// Tells member `m` how its disk behaves from now on: "none", for its
    /// WAL "stall <ms>", "error" or "full", for its stores' syncs
    /// "store-stall <ms>" or "store-error".
    pub fn set_disk_fault(&self, m: usize, fault: &str) {
        let path = self.cluster.members[m].data_dir.join(DISK_FAULTS_FILE);
        common::replace_file(&path, fault);
    }

    /// Moves member `m`'s wall clock `offset_ms` away from the system's.
    pub fn set_clock_offset(&self, m: usize, offset_ms: i64) {
        let path = self.cluster.members[m].data_dir.join(CLOCK_FILE);
        common::replace_file(&path, &format!("offset {offset_ms}"));
    }

    /// Starts `members` members behind peer proxies and `clients` client
    /// nodes' proxies.
    pub async fn start(members: usize, clients: usize) -> Bench {
        let net = Net::new();
        // Every proxy port is bound before the members pick their ports, so
        // no member's port can be handed to a proxy between its pick and its
        // bind.
        let mut fronts = Vec::new();
        for _ in 0..members {
            fronts.push(proxy::bind().await);
        }
        let mut client_listeners = Vec::new();
        for _ in 0..clients * members {
            client_listeners.push(proxy::bind().await);
        }
        let front_ports: Vec<u16> = fronts
            .iter()
            .map(|l| l.local_addr().expect("front").port())
            .collect();
        let cluster = Cluster::start_with_peer_fronts(
            members,
            &[
                "--test-disk-faults",
                DISK_FAULTS_FILE,
                "--test-clock-file",
                CLOCK_FILE,
            ],
            &front_ports,
        );
        let pids: Pids = Arc::new(Mutex::new(
            cluster.members.iter().map(|m| m.pid()).collect(),
        ));
        let mut proxies = Vec::new();
        for (m, front) in fronts.into_iter().enumerate() {
            let target = loopback(cluster.members[m].peer_port);
            proxies.push(proxy::serve_peer_front(
                front,
                m,
                target,
                net.clone(),
                pids.clone(),
            ));
        }
        let mut client_ports = Vec::new();
        let mut client_listeners = client_listeners.into_iter();
        for c in 0..clients {
            let mut ports = Vec::new();
            for m in 0..members {
                let listener = client_listeners.next().expect("one per client and member");
                ports.push(listener.local_addr().expect("client front").port());
                let target = loopback(cluster.members[m].client_port);
                proxies.push(proxy::serve_client_front(
                    listener,
                    members + c,
                    m,
                    target,
                    net.clone(),
                ));
            }
            client_ports.push(ports);
        }
        Bench {
            cluster,
            net,
            pids,
            client_ports,
            proxies,
        }
    }

    pub fn members(&self) -> usize {
        self.cluster.members.len()
    }

    pub fn clients(&self) -> usize {
        self.client_ports.len()
    }

    /// The network node of client `c`.
    pub fn client_node(&self, c: usize) -> Node {
        self.members() + c
    }

    /// The endpoints through which client `c` reaches each member.
    pub fn client_endpoints(&self, c: usize) -> Vec<String> {
        self.client_ports[c]
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect()
    }

    /// Records the members' current process ids for the peer proxies.
    pub fn refresh_pids(&self) {
        *self.pids.lock().unwrap() = self.cluster.members.iter().map(|m| m.pid()).collect();
    }

    /// Waits until a write through each member's own port (outside the
    /// proxies' reach) succeeds; panics with the logs after `within`.
    pub async fn wait_writable(&self, within: Duration) {
        let deadline = Instant::now() + within;
        for m in &self.cluster.members {
            let mut c = direct_client(&m.endpoint()).await;
            loop {
                let put = tokio::time::timeout(OP_TIMEOUT, c.put("/bench/ready", "1", None)).await;
                if matches!(put, Ok(Ok(_))) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{} not writable within {within:?}\n{}",
                    m.name,
                    self.cluster.logs()
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }

    /// The member that leads shard 0, asked of each running member directly
    /// (a member that does not answer in time is skipped).
    pub async fn leader(&self) -> Option<usize> {
        for (i, m) in self.cluster.members.iter().enumerate() {
            if !m.is_running() {
                continue;
            }
            let mut c = direct_client(&m.endpoint()).await;
            if let Ok(Ok(s)) = tokio::time::timeout(OP_TIMEOUT, c.status()).await {
                if s.leader() != 0 && s.header().map(|h| h.member_id()) == Some(s.leader()) {
                    return Some(i);
                }
            }
        }
        None
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        for p in &self.proxies {
            p.abort();
        }
    }
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A client of one endpoint whose every request is bounded by [`OP_TIMEOUT`].
pub async fn direct_client(endpoint: &str) -> etcd_client::Client {
    let options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(OP_TIMEOUT)
        .with_timeout(OP_TIMEOUT);
    etcd_client::Client::connect([endpoint], Some(options))
        .await
        .expect("a lazy client never fails to build")
}

/// A client for long-lived streams (watch, keep-alive): no per-request
/// deadline, which would end the stream.
pub async fn stream_client(endpoint: &str) -> etcd_client::Client {
    let options = etcd_client::ConnectOptions::new().with_connect_timeout(OP_TIMEOUT);
    etcd_client::Client::connect([endpoint], Some(options))
        .await
        .expect("a lazy client never fails to build")
}
