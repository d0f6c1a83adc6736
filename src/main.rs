//! The `cairn` daemon. With no flags it starts a single member: client API on
//! 127.0.0.1:2379, peer port 127.0.0.1:2380, data in ./default.cairn.

use cairn::config::{Config, LogFormat};
use cairn::ops::logging;
use cairn::server::member::node::Node;

/// Every request allocates (decoded messages, Raft entries, peer frames, index
/// nodes) and frees on the core that made it; glibc's malloc spent ~15% of the
/// daemon's CPU consolidating and unlinking chunks under load. jemalloc's
/// per-thread caches gave +10-15% put throughput and a lower p99 (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    let config = match Config::from_args() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cairn: {e}");
            std::process::exit(2);
        }
    };
    let format = match config.log_format {
        LogFormat::Text => logging::LogFormat::Human,
        LogFormat::Json => logging::LogFormat::Json,
    };
    if let Err(e) = logging::init_logging(format, &config.log_level) {
        eprintln!("cairn: --log-level/--log-format: {e}");
        std::process::exit(2);
    }
    tracing::info!(
        name = %config.name,
        data_dir = %config.data_dir.display(),
        cores = config.cores,
        shards = config.shards,
        members_on_host = config.host_share.members,
        idle_poll_us = config.idle_poll.as_micros() as u64,
        "starting"
    );
    let mut life = cairn::ops::lifecycle::Lifecycle::from_env(config.cores);
    let node = match Node::start(config, life.watchdog().clone()) {
        Ok(n) => n,
        Err(e) => {
            tracing::error!(error = %e, "start failed");
            eprintln!("cairn: {e}");
            std::process::exit(1);
        }
    };
    tracing::info!(
        member_id = format_args!("{:x}", node.member_id),
        cluster_id = format_args!("{:x}", node.cluster_id),
        client = ?node.client_addrs,
        peer = %node.peer_addr,
        "serving"
    );
    wait_for_signal(&mut life, &node);
    tracing::info!("shutting down");
    life.stopping("shutting down");
    node.stop();
    tracing::info!("stopped");
}

/// Tells systemd READY=1 once the member is ready, and blocks until SIGTERM or
/// SIGINT.
fn wait_for_signal(life: &mut cairn::ops::lifecycle::Lifecycle, node: &Node) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("signal runtime");
    rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
        let ready = life.ready_when_ready(&node.readiness, "serving");
        tokio::pin!(ready);
        let mut ready_done = false;
        loop {
            tokio::select! {
                _ = term.recv() => return,
                _ = int.recv() => return,
                _ = node.members.wait_removed() => {
                    tracing::warn!("this member was removed from the cluster; stopping");
                    return;
                }
                _ = &mut ready, if !ready_done => ready_done = true,
            }
        }
    });
}
