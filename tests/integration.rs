//! The root crate's integration tests, as one test binary: each `tests/*.rs`
//! file below is a module of it, named after its file (`cargo test --test
//! integration daemon_tls::` runs one file's tests). One binary builds and
//! links the member's code, the shared helpers and the etcd client's
//! generic code once instead of once per file, and its tests share the
//! test threads, so a file's long test no longer leaves the other CPU
//! waiting before the next file starts.
//!
//! Four files stay their own binaries (`driver_sim.rs`,
//! `request_head_memory.rs`, `ops_logging.rs`, `ops_notify_env.rs`);
//! `Cargo.toml` says why beside each. Helpers here carry no
//! `allow(dead_code)`: one that no test calls is a warning, and an error
//! under CI's clippy.

// Helpers shared by several files. A folder that serves one file (`auth/`,
// `cross_txn/`, `faults/`) is declared by that file, so its tests carry the
// file's name too.
mod common;
mod gateway_http;
#[path = "ops_promtext.rs"]
mod promtext;

// The tests, one module per file.
mod daemon_auth;
mod daemon_auto_compaction;
mod daemon_backup;
mod daemon_catch_up;
mod daemon_cluster;
mod daemon_cross_txn;
mod daemon_disk_full;
mod daemon_etcdctl;
mod daemon_failures;
mod daemon_keyspace;
mod daemon_lease;
mod daemon_limits;
mod daemon_members;
mod daemon_move_leader;
mod daemon_ops;
mod daemon_read_txn;
mod daemon_recipes_api;
mod daemon_reconfig;
mod daemon_require_leader;
mod daemon_slow_store;
mod daemon_tls;
mod daemon_tls_checks;
mod daemon_watch_ids;
mod daemon_watch_lag;
mod daemon_watch_progress;
mod etcd3gw_client;
mod etcdctl_check_perf;
mod etcdctl_endpoints;
mod etcdctl_recipes;
mod faults;
mod gateway_limits;
mod gateway_vs_etcd;
mod grpc_health;
mod grpc_limits;
mod grpc_server;
mod keyspace_every_count;
mod module_layers;
mod ops_daemon;
mod ops_http;
mod ops_metrics;
mod ops_notify;
mod ops_systemd;
mod patroni;
