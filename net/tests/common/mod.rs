//! Shared helpers for the link tests: a single-threaded runtime like a core's,
//! test configurations with short timeouts, and a log capture so tests can
//! check that a closed connection is logged exactly once, naming both sides.

#![allow(dead_code)]

use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_net::{AcceptPolicy, Config, MemberSet, PeerListener};

pub const CLUSTER_ID: u64 = 0xC1A5_7E12;
pub const TEST_TIMEOUT: Duration = Duration::from_secs(20);

/// Runs `f` on a current-thread runtime inside a `LocalSet`, as a core does,
/// failing the test if it takes longer than [`TEST_TIMEOUT`].
pub fn run_local<F: Future>(f: F) -> F::Output {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        tokio::time::timeout(TEST_TIMEOUT, f)
            .await
            .expect("test timed out")
    })
}

pub fn config(member_id: u64) -> Config {
    Config {
        cluster_id: CLUSTER_ID,
        member_id,
        handshake_timeout_ms: 2_000,
        stall_timeout_ms: 300,
        connect_timeout_ms: 1_000,
        backoff_initial_ms: 10,
        backoff_max_ms: 100,
        read_buffer_bytes: 256 * 1024,
        read_chunk_bytes: 64 * 1024,
        ..Config::default()
    }
}

pub async fn listener(member_id: u64, members: &[u64], lane_count: u32) -> PeerListener {
    listener_with(config(member_id), members, lane_count).await
}

pub async fn listener_with(config: Config, members: &[u64], lane_count: u32) -> PeerListener {
    let policy = AcceptPolicy {
        config,
        members: MemberSet::new(members.iter().copied()),
        lane_count,
    };
    PeerListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)), policy)
        .await
        .unwrap()
}

/// Captures log lines of the current thread (where a current-thread runtime
/// runs every task) for the life of the guard.
pub struct LogCapture {
    buffer: Arc<Mutex<Vec<u8>>>,
    _guard: tracing::subscriber::DefaultGuard,
}

#[derive(Clone)]
struct SharedWriter(Arc<Mutex<Vec<u8>>>);

impl Write for SharedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogCapture {
    pub fn start() -> Self {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let writer = SharedWriter(buffer.clone());
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || writer.clone())
            .finish();
        Self {
            buffer,
            _guard: tracing::subscriber::set_default(subscriber),
        }
    }

    pub fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.buffer.lock().unwrap())
            .lines()
            .map(str::to_owned)
            .collect()
    }

    pub fn lines_with(&self, needle: &str) -> Vec<String> {
        self.lines()
            .into_iter()
            .filter(|l| l.contains(needle))
            .collect()
    }
}

/// A listener on a given address (a restarted peer reusing its port).
pub async fn listener_at(
    addr: SocketAddr,
    member_id: u64,
    members: &[u64],
    lane_count: u32,
) -> PeerListener {
    let policy = AcceptPolicy {
        config: config(member_id),
        members: MemberSet::new(members.iter().copied()),
        lane_count,
    };
    PeerListener::bind(addr, policy).await.unwrap()
}
