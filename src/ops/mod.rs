//! Operating Cairn: metrics, health and readiness endpoints, systemd notification
//! and watchdog, log setup.
//!
//! These modules hold no daemon state of their own. The daemon builds them at start
//! and feeds them:
//! - [`server_metrics::server_metrics`] gives the scrape side ([`metrics::Registry`])
//!   and one [`server_metrics::CoreRecorder`] per core, which the core's WAL, Raft
//!   driver and store call on their hot paths;
//! - [`readiness::Readiness`] is told when shards recover, find a leader and catch
//!   up; `/readyz`, `/health` and systemd's `READY=1` read it;
//! - [`watchdog::Watchdog`] collects each core's check-ins and sends systemd's
//!   `WATCHDOG=1` through [`notify::Notifier`] only while every core checks in;
//! - [`http`] serves `/metrics`, `/health`, `/livez`, `/readyz` on the
//!   `--listen-metrics-urls` listeners and, by sniffing, on the client port;
//! - [`logging`] installs the `tracing` subscriber for `--log-format` and
//!   `--log-level`;
//! - [`host`] checks host settings that cost latency; the daemon logs its advice
//!   at start.
//!
//! # Wiring into the daemon
//!
//! At start, after `Config::validate()`:
//! 1. `logging::init_logging(format, &config.log_level)`.
//! 2. `let placement: Vec<(ShardId, usize)> = table.shard_ids().map(|s| (s,
//!    table.core_for_shard(s))).collect();` then
//!    `let (registry, recorders) = server_metrics::server_metrics(config.cores,
//!    &placement)?;` and move `recorders[core]` onto core `core`. The core's WAL
//!    calls `wal_fsync(elapsed)` after each data sync, `wal_group_commit(appends,
//!    bytes)` after each flush and `set_wal_backend(..)` once its backend is
//!    chosen; each shard keeps `recorders[core].shard(shard)` and calls
//!    `set_leader`, `set_term`, `set_committed_index`, `set_applied_index`,
//!    `proposals_pending_add`, `proposal_failed`, `slow_apply`,
//!    `backend_commit(elapsed)`, `proposal_applied(elapsed)`, `set_db_size`;
//!    each core's router calls `shard_command(forwarded)` for every command it
//!    sends and its gRPC server `kv_request(elapsed)` for every KV call.
//! 3. `let readiness = Readiness::new(&shard_ids);` the shards report
//!    `set_shard_has_leader` and `set_shard_caught_up`, the node `set_recovered`, the
//!    quota check `set_alarm`.
//! 4. `let mut life = lifecycle::Lifecycle::from_env(config.cores);` each core
//!    spawns `Arc::clone(life.watchdog()).run_check_ins(core)` on its runtime.
//! 5. `let endpoints = http::OpsEndpoints::new(Arc::new(registry), readiness,
//!    Some(Arc::clone(life.watchdog())));` then for each `--listen-metrics-urls`
//!    address `http::serve_listener(http::bind(addr).await?, endpoints.clone(),
//!    shutdown)`, and on each client listener `http::serve_client_port(listener,
//!    endpoints.clone(), grpc_tx, shutdown)` with
//!    `crate::grpc::serve_incoming(grpc_rx, handler, shutdown)` (or tonic's
//!    `serve_with_incoming` over the connections mapped to `GrpcConn`).
//! 6. `life.ready_when_ready(&readiness, "serving").await` (long recoveries call
//!    `life.extend_start_timeout(..)`); on SIGTERM/SIGINT
//!    `life.stopping("shutting down")` before draining.

/// Implements `AsyncWrite` for a wrapper that only changes what is read, by
/// handing every write to its `inner` stream.
macro_rules! write_through_to_inner {
    ($ty:ident) => {
        impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for $ty<S> {
            fn poll_write(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
            }

            fn poll_write_vectored(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.inner.is_write_vectored()
            }

            fn poll_flush(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.inner).poll_flush(cx)
            }

            fn poll_shutdown(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
            }
        }
    };
}
pub(crate) use write_through_to_inner;

pub mod h2_authority;
pub mod host;
pub mod http;
pub mod lifecycle;
pub mod logging;
pub mod metrics;
pub mod notify;
pub mod process;
pub mod readiness;
pub mod server_metrics;
pub mod watchdog;
