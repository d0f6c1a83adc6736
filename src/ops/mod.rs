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
//!   `--log-level`.

pub mod http;
pub mod lifecycle;
pub mod logging;
pub mod metrics;
pub mod notify;
pub mod readiness;
pub mod server_metrics;
pub mod watchdog;
