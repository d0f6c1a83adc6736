//! The daemon's configuration: command-line flags with etcd's names, the same keys
//! in an optional TOML file (`--config-file`), and built-in defaults that start a
//! single member on 127.0.0.1 with data in `./default.cairn`.
//!
//! Precedence is flag, then file, then default. Every value is checked in
//! [`Config::validate`] and a bad one is refused with a message naming it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use serde::Deserialize;

use crate::member_file::MemberFile;
use crate::tls::TlsFiles;

pub mod auth;
mod host_share;
mod urls;
mod wal;

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

/// Flags as given on the command line or in the config file; every one optional so
/// that the three sources can be merged.
#[derive(Parser, Deserialize, Debug, Default, Clone)]
#[command(
    name = "cairn",
    version,
    about = "Cairn: a replicated key-value store for cluster metadata, serving the etcd v3 API",
    long_about = "Cairn: a replicated key-value store for cluster metadata, serving the etcd v3 API.\n\n\
        With no flags it starts a single member: client API on 127.0.0.1:2379, peer port \
        127.0.0.1:2380, data in ./default.cairn. Flags follow etcd's names and meaning; every \
        flag can also be set in the TOML file given by --config-file, with the same name as key \
        (WAL settings go in a [wal] table without the `wal-` prefix). A flag wins over the file."
)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Flags {
    /// TOML file with any of these settings; flags given on the command line win.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config_file: Option<PathBuf>,

    /// Human-readable name of this member (default "default").
    #[arg(long)]
    pub name: Option<String>,

    /// Directory for the WAL and the stores (default "./<name>.cairn").
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// Comma-separated URLs to serve clients on (default http://127.0.0.1:2379).
    #[arg(long, value_name = "URLS")]
    pub listen_client_urls: Option<String>,

    /// Comma-separated client URLs advertised to the cluster (default: the listen URLs).
    #[arg(long, value_name = "URLS")]
    pub advertise_client_urls: Option<String>,

    /// Comma-separated URLs to listen on for peer traffic (default http://127.0.0.1:2380).
    #[arg(long, value_name = "URLS")]
    pub listen_peer_urls: Option<String>,

    /// Comma-separated peer URLs advertised to the cluster (default: the peer listen URLs).
    #[arg(long, value_name = "URLS")]
    pub initial_advertise_peer_urls: Option<String>,

    /// Initial cluster: "name=peer-url,name=peer-url,..." (default "<name>=<advertise peer url>").
    #[arg(long, value_name = "CLUSTER")]
    pub initial_cluster: Option<String>,

    /// "new" to bootstrap a cluster, "existing" to join one (default "new").
    #[arg(long, value_name = "STATE")]
    pub initial_cluster_state: Option<String>,

    /// Token that makes cluster and member ids unique per bootstrap (default "cairn-cluster").
    #[arg(long, value_name = "TOKEN")]
    pub initial_cluster_token: Option<String>,

    /// Number of cores to run on, one pinned thread each (default: the layout
    /// of the member in --data-dir; for a new member, all CPUs, or when every
    /// member of --initial-cluster has a peer URL on this host, the CPUs
    /// divided among them, at least 1).
    #[arg(long, value_name = "N")]
    pub cores: Option<usize>,

    /// Number of shards (Raft groups) the keyspace is split into (default: the
    /// layout of the member in --data-dir; for a member joining a cluster or
    /// restoring a backup, theirs; else one per core, see --cores). With more
    /// than one shard revisions start at 2^40 (README, "How the keyspace is
    /// split"); --shards 1 keeps etcd's numbering from 1. Every member of a
    /// cluster must use the same value.
    #[arg(long, value_name = "N")]
    pub shards: Option<usize>,

    /// Longest a core polls for work before it sleeps, in microseconds (default
    /// 1000; 0: never poll). The window adapts: it shrinks to nothing while a
    /// core's waits are longer than this, as an idle member's mostly are.
    #[arg(long, value_name = "MICROSECONDS")]
    pub idle_poll_us: Option<u64>,

    /// Largest client request accepted, in bytes (default 1572864, etcd's).
    #[arg(long, value_name = "BYTES")]
    pub max_request_bytes: Option<usize>,

    /// Most operations in one txn (default 128, etcd's).
    #[arg(long, value_name = "N")]
    pub max_txn_ops: Option<usize>,

    /// Most gRPC streams (calls) open at once on one client connection
    /// (default 4294967295, etcd's: no limit). A client past it queues its
    /// new calls until one ends.
    #[arg(long, value_name = "N")]
    pub max_concurrent_streams: Option<u32>,

    /// Backend size at which a NOSPACE alarm is raised, in bytes (default 2 GiB).
    #[arg(long, value_name = "BYTES")]
    pub quota_backend_bytes: Option<u64>,

    /// Raft heartbeat interval in milliseconds (default 100, etcd's).
    #[arg(long, value_name = "MS")]
    pub heartbeat_interval: Option<u64>,

    /// Raft election timeout in milliseconds (default 1000, etcd's).
    #[arg(long, value_name = "MS")]
    pub election_timeout: Option<u64>,

    /// Applied entries between two store snapshots that allow log release (default 100000).
    #[arg(long, value_name = "N")]
    pub snapshot_count: Option<u64>,

    /// Refuse a membership change that could leave a shard without a quorum
    /// of started, connected members (default true, etcd's).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub strict_reconfig_check: Option<bool>,

    /// On the first start (empty data directory) of a new cluster's member, build its
    /// stores from this file, saved with `etcdctl snapshot save` from a Cairn member.
    /// Start every member of the new cluster with the same file. Ignored once the
    /// data directory exists.
    #[arg(long, value_name = "FILE")]
    pub restore_snapshot: Option<PathBuf>,

    /// Comma-separated URLs to serve /metrics and health on (default: none; the client
    /// port serves them too).
    #[arg(long, value_name = "URLS")]
    pub listen_metrics_urls: Option<String>,

    /// Log level: error, warn, info, debug or trace (default info).
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,

    /// Log format: "text" for people (default) or "json".
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<String>,

    /// HTTP/2 server of the client port's gRPC: "cairn" (default, Cairn's
    /// own, `src/grpc`) or "tonic" (the general one, kept for comparison).
    #[arg(long, value_name = "SERVER")]
    pub grpc_server: Option<String>,

    /// Client port TLS certificate (PEM; the chain, leaf first), served on https:// client URLs.
    #[arg(long, value_name = "FILE")]
    pub cert_file: Option<PathBuf>,

    /// Client port TLS private key (PEM).
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,

    /// CA certificates (PEM) that client certificates must be signed by; given,
    /// a client certificate is required (as with etcd 3.4).
    #[arg(long, value_name = "FILE")]
    pub trusted_ca_file: Option<PathBuf>,

    /// Require a client certificate signed by --trusted-ca-file (or, without
    /// it, by the system's CAs) on https:// client URLs.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub client_cert_auth: Option<bool>,

    /// Client port TLS with a self-signed certificate made in <data-dir>/fixtures/client
    /// (for tests; ignored when --cert-file is given).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub auto_tls: Option<bool>,

    /// Peer TLS certificate (PEM), served on https:// peer URLs and presented to peers.
    #[arg(long, value_name = "FILE")]
    pub peer_cert_file: Option<PathBuf>,

    /// Peer TLS private key (PEM).
    #[arg(long, value_name = "FILE")]
    pub peer_key_file: Option<PathBuf>,

    /// CA certificates (PEM) peers' certificates must be signed by, both ways;
    /// given, a peer must present a certificate (as with etcd 3.4).
    #[arg(long, value_name = "FILE")]
    pub peer_trusted_ca_file: Option<PathBuf>,

    /// Require a peer certificate signed by --peer-trusted-ca-file on https:// peer URLs.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub peer_client_cert_auth: Option<bool>,

    /// Peer TLS with a self-signed certificate made in <data-dir>/fixtures/peer,
    /// not verified by peers (for tests; ignored when --peer-cert-file is given).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub peer_auto_tls: Option<bool>,

    /// Comma-separated TLS 1.2 cipher suites (etcd's names, e.g.
    /// TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256) for client and peer ports
    /// (default: rustls's; TLS 1.3 suites are always offered).
    #[arg(long, value_name = "SUITES")]
    pub cipher_suites: Option<String>,

    /// Test-only: the WAL's writes and syncs obey this control file (a path
    /// under --data-dir when relative): "stall <ms>", "error", "full" or
    /// "none", each perhaps naming one core's WAL ("stall 5000 lane-1"; see
    /// wal/src/fault.rs); the stores' syncs obey its words
    /// "store-stall <ms>" and "store-error" (mvcc/src/fault.rs). For fault
    /// tests; never in production.
    #[arg(long, value_name = "FILE", hide = true)]
    #[serde(skip)]
    pub test_disk_faults: Option<PathBuf>,

    /// Test-only: the wall clock this member reads is moved by the offset
    /// in this control file (a path under --data-dir when relative):
    /// "offset <ms>", signed (see server/clock.rs). For fault tests; never
    /// in production.
    #[arg(long, value_name = "FILE", hide = true)]
    #[serde(skip)]
    pub test_clock_file: Option<PathBuf>,

    /// Auth tokens: "simple" (default), or
    /// "jwt,pub-key=FILE,priv-key=FILE,sign-method=RS256,ttl=5m" (etcd's).
    #[arg(long, value_name = "TYPE")]
    pub auth_token: Option<String>,

    /// Seconds a simple token lives without use (default 300, etcd's).
    #[arg(long, value_name = "SECONDS")]
    pub auth_token_ttl: Option<u64>,

    /// bcrypt cost of new passwords, 4 to 31 (default 10, etcd's).
    #[arg(long, value_name = "COST")]
    pub bcrypt_cost: Option<u32>,

    #[command(flatten)]
    #[serde(default)]
    pub wal: WalFlags,
}

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

impl Flags {
    /// Reads the config file named by `--config-file`, if any, and fills every value
    /// not given on the command line from it.
    pub fn merge_file(self) -> Result<Flags, ConfigError> {
        let Some(path) = self.config_file.clone() else {
            return Ok(self);
        };
        let file = Flags::from_file(&path)?;
        Ok(self.or(file))
    }

    pub fn from_file(path: &Path) -> Result<Flags, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::File {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
    }

    /// Values of `self` where given, else those of `other`.
    fn or(self, other: Flags) -> Flags {
        Flags {
            config_file: self.config_file,
            name: self.name.or(other.name),
            data_dir: self.data_dir.or(other.data_dir),
            listen_client_urls: self.listen_client_urls.or(other.listen_client_urls),
            advertise_client_urls: self.advertise_client_urls.or(other.advertise_client_urls),
            listen_peer_urls: self.listen_peer_urls.or(other.listen_peer_urls),
            initial_advertise_peer_urls: self
                .initial_advertise_peer_urls
                .or(other.initial_advertise_peer_urls),
            initial_cluster: self.initial_cluster.or(other.initial_cluster),
            initial_cluster_state: self.initial_cluster_state.or(other.initial_cluster_state),
            initial_cluster_token: self.initial_cluster_token.or(other.initial_cluster_token),
            cores: self.cores.or(other.cores),
            shards: self.shards.or(other.shards),
            idle_poll_us: self.idle_poll_us.or(other.idle_poll_us),
            max_request_bytes: self.max_request_bytes.or(other.max_request_bytes),
            max_txn_ops: self.max_txn_ops.or(other.max_txn_ops),
            max_concurrent_streams: self.max_concurrent_streams.or(other.max_concurrent_streams),
            quota_backend_bytes: self.quota_backend_bytes.or(other.quota_backend_bytes),
            heartbeat_interval: self.heartbeat_interval.or(other.heartbeat_interval),
            election_timeout: self.election_timeout.or(other.election_timeout),
            snapshot_count: self.snapshot_count.or(other.snapshot_count),
            strict_reconfig_check: self.strict_reconfig_check.or(other.strict_reconfig_check),
            restore_snapshot: self.restore_snapshot.or(other.restore_snapshot),
            listen_metrics_urls: self.listen_metrics_urls.or(other.listen_metrics_urls),
            log_level: self.log_level.or(other.log_level),
            log_format: self.log_format.or(other.log_format),
            grpc_server: self.grpc_server.or(other.grpc_server),
            cert_file: self.cert_file.or(other.cert_file),
            key_file: self.key_file.or(other.key_file),
            trusted_ca_file: self.trusted_ca_file.or(other.trusted_ca_file),
            client_cert_auth: self.client_cert_auth.or(other.client_cert_auth),
            auto_tls: self.auto_tls.or(other.auto_tls),
            peer_cert_file: self.peer_cert_file.or(other.peer_cert_file),
            peer_key_file: self.peer_key_file.or(other.peer_key_file),
            peer_trusted_ca_file: self.peer_trusted_ca_file.or(other.peer_trusted_ca_file),
            peer_client_cert_auth: self.peer_client_cert_auth.or(other.peer_client_cert_auth),
            peer_auto_tls: self.peer_auto_tls.or(other.peer_auto_tls),
            cipher_suites: self.cipher_suites.or(other.cipher_suites),
            test_disk_faults: self.test_disk_faults.or(other.test_disk_faults),
            test_clock_file: self.test_clock_file.or(other.test_clock_file),
            auth_token: self.auth_token.or(other.auth_token),
            auth_token_ttl: self.auth_token_ttl.or(other.auth_token_ttl),
            bcrypt_cost: self.bcrypt_cost.or(other.bcrypt_cost),
            wal: self.wal.merge(other.wal),
        }
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
        };
        let peer_tls = TlsFiles {
            cert_file: f.peer_cert_file,
            key_file: f.peer_key_file,
            trusted_ca_file: f.peer_trusted_ca_file,
            client_cert_auth: f.peer_client_cert_auth.unwrap_or(false),
            auto_tls: f.peer_auto_tls.unwrap_or(false),
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
                "TLS key/cert (--cert-file, --key-file) or --auto-tls must be provided for                  a client URL with the https scheme",
            ));
        }
        if self.listen_peer_https.iter().any(|&h| h) && !self.peer_tls.can_serve() {
            return Err(invalid(
                "listen-peer-urls",
                "TLS key/cert (--peer-cert-file, --peer-key-file) or --peer-auto-tls must be                  provided for a peer URL with the https scheme",
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

#[cfg(test)]
mod tests;
