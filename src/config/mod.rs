//! The daemon's configuration: command-line flags with etcd's names, the same keys
//! in an optional TOML file (`--config-file`), and built-in defaults that start a
//! single member on 127.0.0.1 with data in `./default.cairn`.
//!
//! Precedence is flag, then file, then default. Every value is checked in
//! [`Config::validate`] and a bad one is refused with a message naming it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::member_file::MemberFile;
use crate::tls::TlsFiles;

pub mod auth;
pub mod compaction;
mod flags;
mod host_share;
mod urls;
mod wal;

pub use flags::Flags;
use host_share::available_cores;
pub use host_share::HostShare;
pub use urls::{parse_initial_cluster, url_host_port, url_is_https};
use urls::{split_list, urls_to_addrs};
pub use wal::{
    WalBackendChoice, WalFlags, WalSettings, WalSyncMode, DEFAULT_WAL_SEGMENT_SIZE_BYTES,
};

/// etcd's default `--max-request-bytes` (1.5 MiB).
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 3 * 512 * 1024;
/// etcd's default `--max-concurrent-streams`: no limit.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = u32::MAX;
/// etcd's default `--max-txn-ops`.
pub const DEFAULT_MAX_TXN_OPS: usize = 128;
/// etcd's default `--quota-backend-bytes` (2 GiB).
pub const DEFAULT_QUOTA_BACKEND_BYTES: u64 = 2 * 1024 * 1024 * 1024;
/// Upper bound on `--cores` and `--shards`: routing tables and per-core channels are
/// sized by these, and a typo such as `--shards 100000` should be refused, not obeyed.
pub const MAX_CORES: usize = 256;
pub const MAX_SHARDS: usize = 1024;
/// etcd refuses requests above 10 MiB whatever the flag says; so do we, since
/// every request is held whole in memory and in one Raft entry.
pub const MAX_REQUEST_BYTES_LIMIT: usize = 10 * 1024 * 1024;
/// Default longest idle poll of a core (`--idle-poll-us`).
pub const DEFAULT_IDLE_POLL_US: u64 = 1000;
/// Upper bound on `--idle-poll-us`: a core polling for longer than this is
/// simply spinning, which `--idle-poll-us` is not meant for.
pub const MAX_IDLE_POLL_US: u64 = 10_000;

const _: () = assert!(DEFAULT_MAX_REQUEST_BYTES <= MAX_REQUEST_BYTES_LIMIT);
const _: () = assert!(MAX_CORES <= MAX_SHARDS);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterState {
    New,
    Existing,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Which HTTP/2 server answers gRPC on the client port (`--grpc-server`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrpcServer {
    /// Cairn's own ([`crate::grpc`]).
    Cairn,
    /// tonic's, on hyper and h2.
    Tonic,
}

/// One member of `--initial-cluster`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitialMember {
    pub name: String,
    pub peer_urls: Vec<String>,
}

/// The validated configuration the daemon runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub name: String,
    pub data_dir: PathBuf,
    pub listen_client_addrs: Vec<SocketAddr>,
    pub advertise_client_urls: Vec<String>,
    pub listen_peer_addrs: Vec<SocketAddr>,
    pub initial_advertise_peer_urls: Vec<String>,
    pub initial_cluster: Vec<InitialMember>,
    pub initial_cluster_state: ClusterState,
    pub initial_cluster_token: String,
    pub cores: usize,
    pub shards: usize,
    /// Whether `--shards` was given (else a joining or restoring member takes
    /// the cluster's or the backup's shard count).
    pub shards_from_flag: bool,
    /// The members sharing this host, and this one's place among them: it
    /// decides the default `--cores` and the CPUs pinned to.
    pub host_share: HostShare,
    pub idle_poll: Duration,
    pub max_request_bytes: usize,
    pub max_txn_ops: usize,
    pub max_concurrent_streams: u32,
    pub quota_backend_bytes: u64,
    pub heartbeat_interval_ms: u64,
    pub election_timeout_ms: u64,
    pub snapshot_count: u64,
    /// `--auto-compaction-mode` and `--auto-compaction-retention`.
    pub auto_compaction: compaction::AutoCompaction,
    /// How often revision-mode compaction looks at the revision (etcd's five
    /// minutes; `--test-revision-compaction-interval-ms` in tests).
    pub revision_compaction_interval: Duration,
    /// `--experimental-watch-progress-notify-interval` (etcd's 10 minutes,
    /// at least 100 ms).
    pub watch_progress_notify_interval: Duration,
    pub strict_reconfig_check: bool,
    pub restore_snapshot: Option<PathBuf>,
    pub listen_metrics_addrs: Vec<SocketAddr>,
    pub log_level: String,
    pub log_format: LogFormat,
    pub grpc_server: GrpcServer,
    pub wal: WalSettings,
    /// Whether each of `listen_client_addrs` is an https:// URL.
    pub listen_client_https: Vec<bool>,
    /// Whether each of `listen_peer_addrs` is an https:// URL.
    pub listen_peer_https: Vec<bool>,
    pub client_tls: TlsFiles,
    pub peer_tls: TlsFiles,
    /// `--cipher-suites`, checked by [`crate::tls::parse_cipher_suites`].
    pub cipher_suites: Vec<String>,
    /// `--auth-token`, `--auth-token-ttl`, `--bcrypt-cost`, and whether a
    /// client certificate names the user (`--client-cert-auth`).
    pub auth: auth::AuthOptions,
    /// `--test-disk-faults`, resolved against the data directory.
    pub test_disk_faults: Option<PathBuf>,
    /// `--test-clock-file`, resolved against the data directory.
    pub test_clock_file: Option<PathBuf>,
}

/// A setting that cannot be used, naming the flag it came from.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("--{flag}: {reason}")]
    Invalid { flag: &'static str, reason: String },
    #[error("--config-file {path}: {reason}")]
    File { path: PathBuf, reason: String },
    #[error("{flag}: {reason}")]
    Tls { flag: String, reason: String },
}

/// A TLS flag's error: the same message form, the flag named in full.
fn tls_invalid(flag: String, reason: String) -> ConfigError {
    ConfigError::Tls { flag, reason }
}

fn invalid(flag: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        flag,
        reason: reason.into(),
    }
}

impl Config {
    /// Parses the process's arguments and config file into a validated config.
    pub fn from_args() -> Result<Config, ConfigError> {
        Config::from_flags(Flags::parse().merge_file()?)
    }

    /// Applies defaults to the merged flags and validates the result.
    pub fn from_flags(f: Flags) -> Result<Config, ConfigError> {
        let name = f.name.unwrap_or_else(|| "default".to_string());
        let data_dir = f
            .data_dir
            .unwrap_or_else(|| PathBuf::from(format!("{name}.cairn")));
        let listen_client_urls = split_list(
            f.listen_client_urls
                .as_deref()
                .unwrap_or("http://127.0.0.1:2379"),
        );
        let advertise_client_urls = match f.advertise_client_urls.as_deref() {
            Some(s) => split_list(s),
            None => listen_client_urls.clone(),
        };
        let listen_peer_urls = split_list(
            f.listen_peer_urls
                .as_deref()
                .unwrap_or("http://127.0.0.1:2380"),
        );
        let initial_advertise_peer_urls = match f.initial_advertise_peer_urls.as_deref() {
            Some(s) => split_list(s),
            None => listen_peer_urls.clone(),
        };
        let initial_cluster = match f.initial_cluster.as_deref() {
            Some(s) => parse_initial_cluster(s)?,
            None => vec![InitialMember {
                name: name.clone(),
                peer_urls: initial_advertise_peer_urls.clone(),
            }],
        };
        let initial_cluster_state = match f.initial_cluster_state.as_deref().unwrap_or("new") {
            "new" => ClusterState::New,
            "existing" => ClusterState::Existing,
            other => {
                return Err(invalid(
                    "initial-cluster-state",
                    format!("{other:?}: expected \"new\" or \"existing\""),
                ))
            }
        };
        // A member restarts with the layout and table it has (the defaults
        // could have moved since: another CPU count, other --initial-* flags,
        // which matter only at creation), so a restart never depends on them.
        // An unreadable file is left to the start to report, with the reason.
        let existing = MemberFile::load(&data_dir).ok().flatten();
        let host_share = match &existing {
            Some(file) => HostShare::of_file(file),
            None => HostShare::of(
                &name,
                initial_cluster
                    .iter()
                    .map(|m| (m.name.as_str(), m.peer_urls.as_slice())),
            ),
        };
        let cores = f
            .cores
            .or(existing.as_ref().map(|e| e.wal_lanes as usize))
            .unwrap_or_else(|| host_share.cores(available_cores()));
        let shards_from_flag = f.shards.is_some();
        let shards = f
            .shards
            .or(existing.as_ref().map(|e| e.shards as usize))
            .unwrap_or(cores);
        let grpc_server = match f.grpc_server.as_deref().unwrap_or("cairn") {
            "cairn" => GrpcServer::Cairn,
            "tonic" => GrpcServer::Tonic,
            other => {
                return Err(invalid(
                    "grpc-server",
                    format!("{other:?}: expected \"cairn\" or \"tonic\""),
                ))
            }
        };
        let log_format = match f.log_format.as_deref().unwrap_or("text") {
            "text" | "human" => LogFormat::Text,
            "json" => LogFormat::Json,
            other => {
                return Err(invalid(
                    "log-format",
                    format!("{other:?}: expected \"text\" or \"json\""),
                ))
            }
        };
        let wal = f.wal.settings()?;
        let auth = auth::AuthOptions::from_flags(
            f.auth_token.as_deref(),
            f.auth_token_ttl,
            f.bcrypt_cost,
            f.client_cert_auth.unwrap_or(false),
        )
        .map_err(|(flag, reason)| invalid(flag, reason))?;
        let client_tls = TlsFiles {
            cert_file: f.cert_file,
            key_file: f.key_file,
            trusted_ca_file: f.trusted_ca_file,
            client_cert_auth: f.client_cert_auth.unwrap_or(false),
            auto_tls: f.auto_tls.unwrap_or(false),
            crl_file: f.client_crl_file,
            allowed_cn: None,
            allowed_hostname: f.client_cert_allowed_hostname,
            skip_client_san_verify: false,
        };
        let peer_tls = TlsFiles {
            cert_file: f.peer_cert_file,
            key_file: f.peer_key_file,
            trusted_ca_file: f.peer_trusted_ca_file,
            client_cert_auth: f.peer_client_cert_auth.unwrap_or(false),
            auto_tls: f.peer_auto_tls.unwrap_or(false),
            crl_file: f.peer_crl_file,
            allowed_cn: f.peer_cert_allowed_cn,
            allowed_hostname: f.peer_cert_allowed_hostname,
            skip_client_san_verify: f
                .experimental_peer_skip_client_san_verification
                .unwrap_or(false),
        };
        let test_disk_faults = f.test_disk_faults.map(|p| data_dir.join(p));
        let test_clock_file = f.test_clock_file.map(|p| data_dir.join(p));
        let config = Config {
            test_disk_faults,
            test_clock_file,
            listen_client_https: listen_client_urls.iter().map(|u| url_is_https(u)).collect(),
            listen_peer_https: listen_peer_urls.iter().map(|u| url_is_https(u)).collect(),
            client_tls,
            peer_tls,
            cipher_suites: f
                .cipher_suites
                .as_deref()
                .map(split_list)
                .unwrap_or_default(),
            listen_client_addrs: urls_to_addrs("listen-client-urls", &listen_client_urls)?,
            listen_peer_addrs: urls_to_addrs("listen-peer-urls", &listen_peer_urls)?,
            listen_metrics_addrs: match f.listen_metrics_urls.as_deref() {
                Some(s) => urls_to_addrs("listen-metrics-urls", &split_list(s))?,
                None => Vec::new(),
            },
            name,
            data_dir,
            advertise_client_urls,
            initial_advertise_peer_urls,
            initial_cluster,
            initial_cluster_state,
            initial_cluster_token: f
                .initial_cluster_token
                .unwrap_or_else(|| "cairn-cluster".to_string()),
            cores,
            shards,
            shards_from_flag,
            host_share,
            idle_poll: Duration::from_micros(f.idle_poll_us.unwrap_or(DEFAULT_IDLE_POLL_US)),
            max_request_bytes: f.max_request_bytes.unwrap_or(DEFAULT_MAX_REQUEST_BYTES),
            max_txn_ops: f.max_txn_ops.unwrap_or(DEFAULT_MAX_TXN_OPS),
            max_concurrent_streams: f
                .max_concurrent_streams
                .unwrap_or(DEFAULT_MAX_CONCURRENT_STREAMS),
            quota_backend_bytes: f.quota_backend_bytes.unwrap_or(DEFAULT_QUOTA_BACKEND_BYTES),
            heartbeat_interval_ms: f.heartbeat_interval.unwrap_or(100),
            election_timeout_ms: f.election_timeout.unwrap_or(1000),
            snapshot_count: f.snapshot_count.unwrap_or(100_000),
            auto_compaction: compaction::from_flags(
                f.auto_compaction_mode.as_deref(),
                f.auto_compaction_retention.as_deref(),
            )
            .map_err(|(flag, reason)| invalid(flag, reason))?,
            watch_progress_notify_interval: watch_progress_interval(
                f.experimental_watch_progress_notify_interval.as_deref(),
            )
            .map_err(|reason| invalid("experimental-watch-progress-notify-interval", reason))?,
            revision_compaction_interval: f
                .test_revision_compaction_interval_ms
                .map_or(Duration::from_secs(300), |ms| {
                    Duration::from_millis(ms.max(1))
                }),
            strict_reconfig_check: f.strict_reconfig_check.unwrap_or(true),
            restore_snapshot: f.restore_snapshot,
            log_level: f.log_level.unwrap_or_else(|| "info".to_string()),
            log_format,
            grpc_server,
            wal,
            auth,
        };
        config.validate()?;
        Ok(config)
    }

    /// The most streams a client connection may have open, `None` for no
    /// limit (`--max-concurrent-streams` at its default, etcd's).
    pub fn stream_limit(&self) -> Option<u32> {
        (self.max_concurrent_streams != DEFAULT_MAX_CONCURRENT_STREAMS)
            .then_some(self.max_concurrent_streams)
    }

    /// Checks every limit and every relation between settings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.name.is_empty() {
            return Err(invalid("name", "must not be empty"));
        }
        if self.listen_client_addrs.is_empty() {
            return Err(invalid("listen-client-urls", "no URL given"));
        }
        if self.listen_peer_addrs.is_empty() {
            return Err(invalid("listen-peer-urls", "no URL given"));
        }
        for url in &self.advertise_client_urls {
            url_host_port("advertise-client-urls", url)?;
        }
        for url in &self.initial_advertise_peer_urls {
            url_host_port("initial-advertise-peer-urls", url)?;
        }
        let me = self
            .initial_cluster
            .iter()
            .find(|m| m.name == self.name)
            .ok_or_else(|| {
                invalid(
                    "initial-cluster",
                    format!("does not name this member ({:?})", self.name),
                )
            })?;
        let mut mine = me.peer_urls.clone();
        let mut advertised = self.initial_advertise_peer_urls.clone();
        mine.sort();
        advertised.sort();
        if mine != advertised {
            return Err(invalid(
                "initial-cluster",
                format!(
                    "lists {:?} for {:?}, but --initial-advertise-peer-urls is {:?}",
                    me.peer_urls, self.name, self.initial_advertise_peer_urls
                ),
            ));
        }
        if self.cores == 0 || self.cores > MAX_CORES {
            return Err(invalid("cores", format!("must be 1..={MAX_CORES}")));
        }
        if self.shards == 0 || self.shards > MAX_SHARDS {
            return Err(invalid("shards", format!("must be 1..={MAX_SHARDS}")));
        }
        if self.idle_poll > Duration::from_micros(MAX_IDLE_POLL_US) {
            return Err(invalid(
                "idle-poll-us",
                format!("must be 0..={MAX_IDLE_POLL_US}"),
            ));
        }
        if self.max_request_bytes == 0 || self.max_request_bytes > MAX_REQUEST_BYTES_LIMIT {
            return Err(invalid(
                "max-request-bytes",
                format!("must be 1..={MAX_REQUEST_BYTES_LIMIT}"),
            ));
        }
        if self.max_txn_ops == 0 {
            return Err(invalid("max-txn-ops", "must be at least 1"));
        }
        if self.max_concurrent_streams == 0 {
            return Err(invalid("max-concurrent-streams", "must be at least 1"));
        }
        if self.heartbeat_interval_ms == 0 {
            return Err(invalid("heartbeat-interval", "must be at least 1 ms"));
        }
        // etcd's rule: the election timeout must be at least five heartbeats so a
        // single lost heartbeat never starts an election.
        if self.election_timeout_ms < 5 * self.heartbeat_interval_ms {
            return Err(invalid(
                "election-timeout",
                format!(
                    "{} ms must be at least 5 times --heartbeat-interval ({} ms)",
                    self.election_timeout_ms, self.heartbeat_interval_ms
                ),
            ));
        }
        if self.snapshot_count == 0 {
            return Err(invalid("snapshot-count", "must be at least 1"));
        }
        if self.restore_snapshot.is_some() && self.initial_cluster_state == ClusterState::Existing {
            return Err(invalid(
                "restore-snapshot",
                "builds the members of a new cluster; it cannot be used with \
                 --initial-cluster-state existing",
            ));
        }
        const MIN_SEGMENT_BYTES: u64 = 1024 * 1024;
        if self.wal.segment_size_bytes < MIN_SEGMENT_BYTES
            || !self.wal.segment_size_bytes.is_multiple_of(4096)
        {
            return Err(invalid(
                "wal-segment-size-bytes",
                format!("must be a multiple of 4096 and at least {MIN_SEGMENT_BYTES}"),
            ));
        }
        if self.wal.segment_size_bytes <= self.max_request_bytes as u64 * 2 {
            return Err(invalid(
                "wal-segment-size-bytes",
                "must be more than twice --max-request-bytes so any entry fits in a segment",
            ));
        }
        if let Err(e) = crate::ops::logging::parse_log_level(&self.log_level) {
            return Err(invalid("log-level", e.to_string()));
        }
        self.validate_tls()
    }

    /// etcd's rules for the TLS flags: an https:// URL needs a certificate
    /// (or auto TLS) for its port, a certificate needs its key, and cipher
    /// suites must be known. The files themselves are read at start.
    fn validate_tls(&self) -> Result<(), ConfigError> {
        use crate::tls::Side;
        for (side, files) in [
            (Side::Client, &self.client_tls),
            (Side::Peer, &self.peer_tls),
        ] {
            match (&files.cert_file, &files.key_file) {
                (Some(_), None) => {
                    return Err(tls_invalid(
                        side.flag("key-file"),
                        format!("must be given with {}", side.flag("cert-file")),
                    ))
                }
                (None, Some(_)) => {
                    return Err(tls_invalid(
                        side.flag("cert-file"),
                        format!("must be given with {}", side.flag("key-file")),
                    ))
                }
                _ => {}
            }
        }
        let https_client = self.listen_client_https.iter().any(|&h| h);
        if https_client && !self.client_tls.can_serve() {
            return Err(invalid(
                "listen-client-urls",
                "TLS key/cert (--cert-file, --key-file) or --auto-tls must be provided for \
                 a client URL with the https scheme",
            ));
        }
        if self.listen_peer_https.iter().any(|&h| h) && !self.peer_tls.can_serve() {
            return Err(invalid(
                "listen-peer-urls",
                "TLS key/cert (--peer-cert-file, --peer-key-file) or --peer-auto-tls must be \
                 provided for a peer URL with the https scheme",
            ));
        }
        let https_peers = self
            .initial_cluster
            .iter()
            .flat_map(|m| m.peer_urls.iter())
            .any(|u| url_is_https(u));
        if https_peers && !self.peer_tls.can_serve() {
            return Err(invalid(
                "initial-cluster",
                "names https:// peer URLs: this member needs peer TLS to reach them                  (--peer-cert-file and --peer-key-file, or --peer-auto-tls)",
            ));
        }
        crate::tls::parse_cipher_suites(&self.cipher_suites).map_err(|e| match e {
            crate::tls::TlsError::Flag { reason, .. } => invalid("cipher-suites", reason),
            other => invalid("cipher-suites", other.to_string()),
        })?;
        Ok(())
    }
}

/// etcd's progress notification period: a Go duration, 10 minutes when not
/// given (or 0), raised to 100 ms when below.
fn watch_progress_interval(given: Option<&str>) -> Result<Duration, String> {
    const MIN: Duration = Duration::from_millis(100);
    let interval = match given {
        Some(text) => auth::parse_go_duration(text)?,
        None => Duration::ZERO,
    };
    if interval.is_zero() {
        return Ok(Duration::from_secs(600));
    }
    // etcd raises it the same way (with a warning, which here would come
    // before logging starts).
    Ok(interval.max(MIN))
}

#[cfg(test)]
mod tests;
