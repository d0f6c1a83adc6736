//! The flags as given: on the command line with etcd's names, or as the same
//! keys in the TOML file of `--config-file`, every one optional so that the
//! two sources can be merged (a flag wins). Defaults and checks are
//! [`super::Config`]'s.

use std::path::{Path, PathBuf};

use clap::Parser;
use serde::Deserialize;

use super::{ConfigError, WalFlags};

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

    /// How often a watch created with progress_notify that saw no event is
    /// told the revision its stream reached (a duration, default 10m, at
    /// least 100ms).
    #[arg(long, value_name = "DURATION")]
    pub experimental_watch_progress_notify_interval: Option<String>,

    /// Automatic compaction: "periodic" (default; keep the history of the
    /// retention's time) or "revision" (keep that many revisions).
    #[arg(long, value_name = "MODE")]
    pub auto_compaction_mode: Option<String>,

    /// History automatic compaction keeps: hours or a duration ("30m",
    /// "1h30m") with "periodic", revisions with "revision"; 0 (default) is off.
    #[arg(long, value_name = "RETENTION")]
    pub auto_compaction_retention: Option<String>,

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

    /// Revoked client certificates: a revocation list file (PEM "X509 CRL"
    /// blocks or DER), re-read when it changes; a client certificate it
    /// names (signed by the certificate's issuer) is refused.
    #[arg(long, value_name = "FILE")]
    pub client_crl_file: Option<PathBuf>,

    /// The hostname or IP address a client certificate must be valid for
    /// (its subject alternative names), besides being signed by --trusted-ca-file.
    #[arg(long, value_name = "HOST")]
    pub client_cert_allowed_hostname: Option<String>,

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

    /// Revoked peer certificates: a revocation list file (PEM "X509 CRL"
    /// blocks or DER), re-read when it changes; checked both ways (a peer
    /// dialing in, and a peer this member dials).
    #[arg(long, value_name = "FILE")]
    pub peer_crl_file: Option<PathBuf>,

    /// The subject common name a peer's certificate must have, both ways
    /// (exclusive with --peer-cert-allowed-hostname).
    #[arg(long, value_name = "CN")]
    pub peer_cert_allowed_cn: Option<String>,

    /// The hostname or IP address a peer's certificate must be valid for,
    /// both ways (exclusive with --peer-cert-allowed-cn).
    #[arg(long, value_name = "HOST")]
    pub peer_cert_allowed_hostname: Option<String>,

    /// Do not check a peer's client certificate against the address it
    /// connects from (its IP, or DNS, subject alternative names).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub experimental_peer_skip_client_san_verification: Option<bool>,

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

    /// Test-only: how often `--auto-compaction-mode revision` looks at the
    /// revision, in milliseconds (etcd's five minutes otherwise).
    #[arg(long, value_name = "MS", hide = true)]
    #[serde(skip)]
    pub test_revision_compaction_interval_ms: Option<u64>,

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
            client_crl_file: self.client_crl_file.or(other.client_crl_file),
            client_cert_allowed_hostname: self
                .client_cert_allowed_hostname
                .or(other.client_cert_allowed_hostname),
            peer_cert_file: self.peer_cert_file.or(other.peer_cert_file),
            peer_key_file: self.peer_key_file.or(other.peer_key_file),
            peer_trusted_ca_file: self.peer_trusted_ca_file.or(other.peer_trusted_ca_file),
            peer_client_cert_auth: self.peer_client_cert_auth.or(other.peer_client_cert_auth),
            peer_auto_tls: self.peer_auto_tls.or(other.peer_auto_tls),
            peer_crl_file: self.peer_crl_file.or(other.peer_crl_file),
            experimental_peer_skip_client_san_verification: self
                .experimental_peer_skip_client_san_verification
                .or(other.experimental_peer_skip_client_san_verification),
            peer_cert_allowed_cn: self.peer_cert_allowed_cn.or(other.peer_cert_allowed_cn),
            peer_cert_allowed_hostname: self
                .peer_cert_allowed_hostname
                .or(other.peer_cert_allowed_hostname),
            cipher_suites: self.cipher_suites.or(other.cipher_suites),
            test_disk_faults: self.test_disk_faults.or(other.test_disk_faults),
            test_clock_file: self.test_clock_file.or(other.test_clock_file),
            test_revision_compaction_interval_ms: self
                .test_revision_compaction_interval_ms
                .or(other.test_revision_compaction_interval_ms),
            auto_compaction_mode: self.auto_compaction_mode.or(other.auto_compaction_mode),
            experimental_watch_progress_notify_interval: self
                .experimental_watch_progress_notify_interval
                .or(other.experimental_watch_progress_notify_interval),
            auto_compaction_retention: self
                .auto_compaction_retention
                .or(other.auto_compaction_retention),
            auth_token: self.auth_token.or(other.auth_token),
            auth_token_ttl: self.auth_token_ttl.or(other.auth_token_ttl),
            bcrypt_cost: self.bcrypt_cost.or(other.bcrypt_cost),
            wal: self.wal.merge(other.wal),
        }
    }
}
