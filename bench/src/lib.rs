//! cairn-bench: an etcd v3 load generator that measures Cairn and etcd the same way.
//!
//! It speaks the etcd v3 gRPC API through the generated clients of
//! `cairn-proto` (and, for `put --gateway`, etcd's HTTP/JSON gateway); it never
//! links the server. The pieces:
//! - [`config`]: the command line and its limits;
//! - [`grpc`]: the client's own gRPC over HTTP/2 for the unary KV calls;
//! - [`runner`]: connections, the closed-loop and fixed-rate drivers, warm-up;
//! - [`workload`]: put, range, txn-put, txn-one, txn-cross, mixed and
//!   lease-keepalive requests;
//! - [`placement`]: Cairn's routing rule, copied, so txn-one and txn-cross
//!   pick keys on one shard or on several;
//! - [`watch`]: watch latency from put sent to event received;
//! - [`watch_load`]: what many watchers, one never reading, cost writers;
//! - [`memory`]: the members' resident memory after the same puts;
//! - [`gateway`]: the put workload over etcd's HTTP/JSON gateway;
//! - [`security`]: client TLS, per-connection authentication, and the
//!   certificates and users of a secure local cluster;
//! - [`stats`]: histograms, error counts, the table and the JSON line;
//! - [`cluster`]: local etcd or Cairn clusters on free ports (used by `compare`
//!   and by tests);
//! - [`binaries`]: where this workspace's `cairn` is;
//! - [`preset`]: the workloads of `compare` and `tls-cost`, each a fixed
//!   command line;
//! - [`session`]: what `compare` and `tls-cost` share: starting, pausing and
//!   seeding clusters, running a preset, the median run;
//! - [`compare`]: both systems, alternating runs, one table;
//! - [`tls_cost`]: one system plaintext against mutual TLS (and auth), one table.

pub mod binaries;
pub mod cluster;
pub mod compare;
pub mod config;
pub mod gateway;
pub mod grpc;
pub mod memory;
pub mod placement;
pub mod preset;
pub mod runner;
pub mod security;
pub mod session;
pub mod stats;
pub mod tls_cost;
pub mod watch;
pub mod watch_load;
pub mod workload;

pub use cluster::{ClusterError, LocalCluster, System};
pub use config::{Cli, Command, GlobalOpts, Stop};
pub use stats::{Recorder, Report};

/// Why a benchmark run could not be carried out. Failed requests are not errors of
/// this kind: they are counted in the run's [`Report`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    #[error("invalid option {option}: {reason}")]
    Option {
        option: &'static str,
        reason: String,
    },
    #[error("invalid endpoint {endpoint}: {reason}")]
    Endpoint { endpoint: String, reason: String },
    #[error("setting up {workload} on {endpoint}: {status}")]
    Setup {
        workload: &'static str,
        endpoint: String,
        status: Box<tonic::Status>,
    },
    #[error("authenticating {user} at {endpoint}: {status}")]
    Auth {
        user: String,
        endpoint: String,
        status: Box<tonic::Status>,
    },
    #[error("a requester task of {workload} failed: {reason}")]
    Task {
        workload: &'static str,
        reason: String,
    },
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error("interrupted by {signal}; every started process was stopped")]
    Interrupted { signal: &'static str },
}

/// Runs one workload subcommand (everything but `compare`) and returns its report.
pub async fn run_workload(
    global: &GlobalOpts,
    command: &Command,
    progress: bool,
) -> Result<Report, BenchError> {
    global.validate()?;
    match command {
        Command::Put(o) if o.gateway => {
            o.keys.validate()?;
            if global.tls() || global.user.is_some() {
                return Err(BenchError::Option {
                    option: "--gateway",
                    reason: "the HTTP/JSON gateway workload speaks plaintext without auth only"
                        .into(),
                });
            }
            gateway::run(global, &o.keys, progress).await
        }
        Command::Put(o) => {
            o.keys.validate()?;
            runner::run(global, workload::Spec::Put(o.keys.clone()), progress).await
        }
        Command::Range(o) => {
            o.validate()?;
            runner::run(global, workload::Spec::Range(o.clone()), progress).await
        }
        Command::TxnPut(o) => {
            o.keys.validate()?;
            runner::run(global, workload::Spec::TxnPut(o.keys.clone()), progress).await
        }
        Command::TxnOne(o) | Command::TxnCross(o) => {
            o.validate()?;
            let spread = if matches!(command, Command::TxnOne(_)) {
                workload::Spread::OnePrefix
            } else {
                workload::Spread::CrossPrefixes
            };
            let spec = workload::Spec::TxnMulti(o.clone(), spread);
            runner::run(global, spec, progress).await
        }
        Command::Mixed(o) => {
            o.validate()?;
            runner::run(global, workload::Spec::Mixed(o.clone()), progress).await
        }
        Command::LeaseKeepalive(o) => {
            if o.ttl_secs <= 0 {
                return Err(BenchError::Option {
                    option: "--ttl-secs",
                    reason: format!("{} is not positive", o.ttl_secs),
                });
            }
            runner::run(global, workload::Spec::LeaseKeepalive(o.clone()), progress).await
        }
        Command::WatchLatency(o) => {
            o.validate()?;
            watch::run(global, o, progress).await
        }
        Command::Compare(_) | Command::TlsCost(_) | Command::WatchLoad(_) | Command::Memory(_) => {
            Err(BenchError::Option {
                option: "compare",
                reason: "compare, tls-cost, watch-load and memory are not single workloads".into(),
            })
        }
    }
}

/// Whether a required external binary (`etcd`, `cairn`) can be run. For tests:
/// when it is missing and the `CI` environment variable is set, this panics (a CI
/// machine must have it); otherwise it prints a skip note and returns false.
pub fn binary_available_or_skip(binary: &std::path::Path) -> bool {
    let found = std::process::Command::new(binary)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "{} is not runnable but CI is set: it must be installed on CI",
            binary.display()
        );
        eprintln!("skipping: {} is not runnable here", binary.display());
    }
    found
}
