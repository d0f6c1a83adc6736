//! Command line of `cairn-bench`: global options shared by every workload, one
//! subcommand per workload, and the limits every option is checked against.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::security::Credentials;
use crate::BenchError;

/// Most gRPC connections one run opens.
pub const MAX_CONNS: usize = 1_024;
/// Most concurrent requesters (or watch streams) one run drives.
pub const MAX_CLIENTS: usize = 10_000;
/// Largest key the generator builds.
pub const MAX_KEY_SIZE_BYTES: usize = 64 * 1024;
/// Largest value the generator builds; above etcd's and Cairn's 1.5 MiB request
/// limit on purpose, so oversize requests can be measured as errors.
pub const MAX_VAL_SIZE_BYTES: usize = 16 * 1024 * 1024;
/// Most watchers one watch-latency run opens in total.
pub const MAX_WATCHERS: usize = 100_000;
/// Longest run (warm-up or measured phase) accepted.
pub const MAX_RUN_DURATION: Duration = Duration::from_secs(24 * 3600);
/// Highest fixed target rate accepted, requests per second.
pub const MAX_RATE_PER_SEC: f64 = 10_000_000.0;
/// Most keys one `txn-one` or `txn-cross` txn compares and puts: one per
/// routing prefix `txn-cross` has.
pub const MAX_KEYS_PER_TXN: usize = crate::placement::CROSS_PREFIXES.len();

const _: () = assert!(MAX_CONNS <= MAX_CLIENTS, "every connection needs a client");
// The watch-latency put value carries an 8-byte sequence number and a phase byte.
const _: () = assert!(crate::watch::VALUE_HEADER_BYTES < MAX_VAL_SIZE_BYTES);

#[derive(Debug, Parser)]
#[command(
    name = "cairn-bench",
    version,
    about = "Load generator for the etcd v3 API: measures Cairn and etcd the same way",
    long_about = "Load generator for the etcd v3 gRPC API. Latency is measured from the \
                  moment a request is sent to its response (with --rate, from the moment it \
                  was due to be sent); requests/s is completed requests over the measured \
                  phase's wall time; the warm-up phase is excluded. See bench/README.md."
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalOpts,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Args)]
pub struct GlobalOpts {
    /// Comma-separated client URLs (http://host:port, https://host:port or host:port).
    #[arg(
        long,
        global = true,
        value_delimiter = ',',
        default_value = "127.0.0.1:2379"
    )]
    pub endpoints: Vec<String>,
    /// gRPC connections (HTTP/2), spread round-robin over the endpoints.
    #[arg(long, global = true, default_value_t = 1)]
    pub conns: usize,
    /// Concurrent requesters, spread round-robin over the connections.
    #[arg(long, global = true, default_value_t = 1)]
    pub clients: usize,
    /// Measured requests (after warm-up). Default 10000 unless --duration is given.
    #[arg(long, global = true, conflicts_with = "duration")]
    pub total: Option<u64>,
    /// Length of the measured phase instead of a request count, e.g. 10s, 500ms, 2m.
    #[arg(long, global = true, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Fixed target rate in requests/s over all clients. Latency is then measured from
    /// each request's intended send time, so a stalled server shows in the tail.
    #[arg(long, global = true)]
    pub rate: Option<f64>,
    /// Warm-up phase run before measuring and excluded from every figure, e.g. 2s
    /// (default: none for a single workload, 2s per run for `compare`).
    #[arg(long, global = true, value_parser = parse_duration)]
    pub warmup: Option<Duration>,
    /// Per-request deadline; a request that misses it counts as a DeadlineExceeded error
    /// (through tonic's client: Cancelled, "Timeout expired").
    #[arg(long, global = true, value_parser = parse_duration, default_value = "10s")]
    pub timeout: Duration,
    /// Print one JSON object per run on stdout and nothing else (no table, no progress bar).
    #[arg(long, global = true)]
    pub json: bool,
    /// CA certificate (PEM) that server certificates are verified against: TLS to
    /// every endpoint (host:port endpoints become https://). Only this CA is
    /// trusted, not the system's.
    #[arg(long, global = true, value_name = "FILE")]
    pub cacert: Option<PathBuf>,
    /// Client certificate (PEM) for servers that require one (with --key).
    #[arg(long, global = true, value_name = "FILE")]
    pub cert: Option<PathBuf>,
    /// Private key (PEM) of --cert.
    #[arg(long = "key", id = "client_key", global = true, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// Authenticate as this user: each connection calls Authenticate once, and
    /// every request it carries sends the token.
    #[arg(long, global = true, value_name = "NAME:PASSWORD", value_parser = Credentials::parse)]
    pub user: Option<Credentials>,
    /// The gRPC client of the unary KV calls (put, range, txn-put, txn-one,
    /// txn-cross, mixed): `cairn`, the load generator's own, plaintext only,
    /// which costs the host a fraction of tonic's CPU per call; `tonic`; or
    /// `auto`, the own client without TLS and tonic with it. Streams
    /// (lease-keepalive, watches) always use tonic.
    #[arg(long, global = true, value_enum, default_value = "auto")]
    pub grpc_client: GrpcClient,
}

/// `--grpc-client`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GrpcClient {
    Auto,
    Cairn,
    Tonic,
}

impl GrpcClient {
    /// The client that carries the unary KV calls over a connection with or
    /// without TLS: `auto` is the own client without TLS and tonic with it.
    pub fn resolved(self, tls: bool) -> GrpcClient {
        match self {
            GrpcClient::Auto if tls => GrpcClient::Tonic,
            GrpcClient::Auto => GrpcClient::Cairn,
            other => other,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            GrpcClient::Auto => "auto",
            GrpcClient::Cairn => "cairn",
            GrpcClient::Tonic => "tonic",
        }
    }
}

/// Default measured request count when neither --total nor --duration is given.
pub const DEFAULT_TOTAL: u64 = 10_000;

/// When the measured phase ends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stop {
    Total(u64),
    Duration(Duration),
}

impl GlobalOpts {
    /// Whether the unary KV calls go through the load generator's own client.
    pub fn own_grpc_client(&self) -> bool {
        self.grpc_client.resolved(self.tls()) == GrpcClient::Cairn
    }

    pub fn warmup(&self) -> Duration {
        self.warmup.unwrap_or(Duration::ZERO)
    }

    pub fn stop(&self) -> Stop {
        match (self.total, self.duration) {
            (_, Some(d)) => Stop::Duration(d),
            (Some(n), None) => Stop::Total(n),
            (None, None) => Stop::Total(DEFAULT_TOTAL),
        }
    }

    pub fn validate(&self) -> Result<(), BenchError> {
        let bad = |option: &'static str, reason: String| Err(BenchError::Option { option, reason });
        if self.endpoints.iter().all(|e| e.trim().is_empty()) {
            return bad("--endpoints", "no endpoint given".into());
        }
        if self.conns == 0 || self.conns > MAX_CONNS {
            return bad(
                "--conns",
                format!("{} is not in 1..={MAX_CONNS}", self.conns),
            );
        }
        if self.clients == 0 || self.clients > MAX_CLIENTS {
            return bad(
                "--clients",
                format!("{} is not in 1..={MAX_CLIENTS}", self.clients),
            );
        }
        if self.clients < self.conns {
            return bad(
                "--clients",
                format!(
                    "{} clients cannot use {} connections",
                    self.clients, self.conns
                ),
            );
        }
        if self.total == Some(0) {
            return bad("--total", "must be at least 1".into());
        }
        if let Some(d) = self.duration {
            if d.is_zero() || d > MAX_RUN_DURATION {
                return bad(
                    "--duration",
                    format!("{d:?} is not in (0, {MAX_RUN_DURATION:?}]"),
                );
            }
        }
        if self.warmup() > MAX_RUN_DURATION {
            return bad(
                "--warmup",
                format!("{:?} exceeds {MAX_RUN_DURATION:?}", self.warmup()),
            );
        }
        if self.timeout.is_zero() {
            return bad("--timeout", "must be positive".into());
        }
        if self.grpc_client == GrpcClient::Cairn && self.tls() {
            return bad(
                "--grpc-client",
                "cairn speaks plaintext only: use tonic (or auto) with TLS".into(),
            );
        }
        if let Some(r) = self.rate {
            if !(r > 0.0 && r <= MAX_RATE_PER_SEC) {
                return bad("--rate", format!("{r} is not in (0, {MAX_RATE_PER_SEC}]"));
            }
        }
        self.validate_tls()
    }

    /// Whether connections use TLS: --cacert is given.
    pub fn tls(&self) -> bool {
        self.cacert.is_some()
    }

    /// A client certificate comes with its key; TLS options and https://
    /// endpoints go together.
    fn validate_tls(&self) -> Result<(), BenchError> {
        let bad = |option: &'static str, reason: String| Err(BenchError::Option { option, reason });
        match (&self.cert, &self.key) {
            (Some(_), None) => return bad("--cert", "needs --key".into()),
            (None, Some(_)) => return bad("--key", "needs --cert".into()),
            (Some(_), Some(_)) if self.cacert.is_none() => {
                return bad(
                    "--cert",
                    "needs --cacert (servers are verified against it only)".into(),
                )
            }
            _ => {}
        }
        for endpoint in self.endpoints.iter().map(|e| e.trim()) {
            let scheme = endpoint.split_once("://").map(|(scheme, _)| scheme);
            if self.tls() && scheme == Some("http") {
                return bad(
                    "--endpoints",
                    format!("{endpoint} is plaintext but --cacert asks for TLS"),
                );
            }
            if !self.tls() && scheme == Some("https") {
                return bad(
                    "--cacert",
                    format!("{endpoint} needs the CA that signed its certificate"),
                );
            }
        }
        Ok(())
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Write keys (one Put per request).
    Put(PutOpts),
    /// Read a key or a range (one Range per request).
    Range(RangeOpts),
    /// Compare-and-swap transactions: put if nobody modified the key after the
    /// newest revision this client has seen, otherwise read it back.
    TxnPut(TxnPutOpts),
    /// Compare-and-swap transactions over several keys of one routing prefix
    /// (one shard)
    ///
    /// txn-put's txn over --keys-per-txn keys `/bench/one/<j>/<key>`: put
    /// them all if none was modified after the newest revision this client
    /// has seen, otherwise read them back.
    TxnOne(TxnMultiOpts),
    /// The txns of txn-one with each key under its own routing prefix
    /// (several shards)
    ///
    /// Key j is `/bench/x<i>/<key>`; with N shards (N up to 16) the keys of
    /// one txn fall on min(keys, N) different shards.
    TxnCross(TxnMultiOpts),
    /// A mix of reads and writes over one key space.
    Mixed(MixedOpts),
    /// Time from sending a put to each watcher receiving its event.
    WatchLatency(WatchOpts),
    /// Lease keep-alive round trips, one lease and stream per client.
    LeaseKeepalive(LeaseOpts),
    /// Start a local 3-member cluster of Cairn and of etcd and run the same workloads
    /// against both, alternating, in one table.
    Compare(crate::compare::CompareOpts),
    /// Start the same system as a plaintext and a mutual-TLS cluster (and one
    /// with auth too, with --auth) and run the same workloads through each
    /// one's leader, alternating: what TLS costs, in one table.
    TlsCost(crate::tls_cost::TlsCostOpts),
    /// Start the system and measure put-100 alone and beside many reading
    /// watchers plus one that never reads, alternating: what watchers cost
    /// writers, and the members' memory, in one table.
    WatchLoad(crate::watch_load::WatchLoadOpts),
    /// Start each system alone, write the same puts (100,000 of 256 B by
    /// default) and read its members' resident memory before and after, in
    /// one table.
    Memory(crate::memory::MemoryOpts),
}

#[derive(Debug, Clone, Args)]
pub struct KeyOpts {
    /// Key size in bytes.
    #[arg(long, default_value_t = 8)]
    pub key_size: usize,
    /// Value size in bytes.
    #[arg(long, default_value_t = 8)]
    pub val_size: usize,
    /// Number of distinct keys written (1: the same key over and over).
    #[arg(long, default_value_t = 1)]
    pub key_space_size: u64,
    /// Walk the key space in order instead of picking keys at random.
    #[arg(long)]
    pub sequential_keys: bool,
}

impl KeyOpts {
    pub fn validate(&self) -> Result<(), BenchError> {
        let bad = |option: &'static str, reason: String| Err(BenchError::Option { option, reason });
        if self.key_size == 0 || self.key_size > MAX_KEY_SIZE_BYTES {
            return bad(
                "--key-size",
                format!("{} is not in 1..={MAX_KEY_SIZE_BYTES}", self.key_size),
            );
        }
        if self.val_size > MAX_VAL_SIZE_BYTES {
            return bad(
                "--val-size",
                format!("{} exceeds {MAX_VAL_SIZE_BYTES}", self.val_size),
            );
        }
        if self.key_space_size == 0 {
            return bad("--key-space-size", "must be at least 1".into());
        }
        let digits = crate::workload::decimal_digits(self.key_space_size - 1);
        if digits > self.key_size {
            return bad(
                "--key-size",
                format!(
                    "{} bytes cannot hold {} distinct keys (needs {digits})",
                    self.key_size, self.key_space_size
                ),
            );
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Args)]
pub struct PutOpts {
    #[command(flatten)]
    pub keys: KeyOpts,
    /// Send each put as JSON to etcd's HTTP/JSON gateway (`POST /v3/kv/put`)
    /// over HTTP/1.1, one connection per client, instead of gRPC.
    #[arg(long)]
    pub gateway: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Consistency {
    /// Linearizable: confirmed with the quorum (ReadIndex).
    L,
    /// Serializable: served from the member's local state.
    S,
}

#[derive(Debug, Clone, Args)]
pub struct RangeOpts {
    /// First key of the range (a key written by `put` with its defaults is "00000000").
    #[arg(default_value = "00000000")]
    pub key: String,
    /// End of the range [key, end); empty reads just the key.
    pub end: Option<String>,
    /// Read every key with the prefix `key`.
    #[arg(long, conflicts_with = "end")]
    pub prefix: bool,
    /// Read consistency.
    #[arg(long, value_enum, default_value = "l")]
    pub consistency: Consistency,
    /// Most keys returned per request (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub limit: i64,
    /// Send each range as etcd's read-only txn: a compare on the first
    /// key's mod revision, and the range on either branch.
    #[arg(long)]
    pub in_txn: bool,
}

impl RangeOpts {
    pub fn validate(&self) -> Result<(), BenchError> {
        if self.key.is_empty() {
            return Err(BenchError::Option {
                option: "key",
                reason: "must not be empty".into(),
            });
        }
        if self.limit < 0 {
            return Err(BenchError::Option {
                option: "--limit",
                reason: format!("{} is negative", self.limit),
            });
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Args)]
pub struct TxnPutOpts {
    #[command(flatten)]
    pub keys: KeyOpts,
}

#[derive(Debug, Clone, Args)]
pub struct TxnMultiOpts {
    /// Key options; --key-size is the size of the part after the prefix.
    #[command(flatten)]
    pub keys: KeyOpts,
    /// Keys each txn compares and puts, each under its own prefix for
    /// txn-cross (2 to 8).
    #[arg(long, default_value_t = 2)]
    pub keys_per_txn: usize,
}

impl TxnMultiOpts {
    pub fn validate(&self) -> Result<(), BenchError> {
        self.keys.validate()?;
        if !(2..=MAX_KEYS_PER_TXN).contains(&self.keys_per_txn) {
            return Err(BenchError::Option {
                option: "--keys-per-txn",
                reason: format!("{} is not in 2..={MAX_KEYS_PER_TXN}", self.keys_per_txn),
            });
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Args)]
pub struct MixedOpts {
    #[command(flatten)]
    pub keys: KeyOpts,
    /// Fraction of requests that are reads, 0.0 to 1.0.
    #[arg(long, default_value_t = 0.9)]
    pub read_ratio: f64,
    /// Read consistency.
    #[arg(long, value_enum, default_value = "l")]
    pub consistency: Consistency,
}

impl MixedOpts {
    pub fn validate(&self) -> Result<(), BenchError> {
        self.keys.validate()?;
        if !(0.0..=1.0).contains(&self.read_ratio) {
            return Err(BenchError::Option {
                option: "--read-ratio",
                reason: format!("{} is not in [0, 1]", self.read_ratio),
            });
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Args)]
pub struct WatchOpts {
    /// Watch streams, spread over the connections.
    #[arg(long, default_value_t = 10)]
    pub streams: usize,
    /// Watchers on the watched key per stream.
    #[arg(long, default_value_t = 10)]
    pub watchers_per_stream: usize,
    /// Value size of the puts in bytes (at least 9: sequence number and phase).
    #[arg(long, default_value_t = 32)]
    pub val_size: usize,
    /// Puts per second when --rate is not given.
    #[arg(long, default_value_t = 100.0)]
    pub put_rate: f64,
    /// How long to wait for outstanding events after the last put.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    pub drain_timeout: Duration,
    /// Watch the whole keyspace (etcd's `watch --prefix ""`) instead of the
    /// put key: on Cairn with several shards, a watch over every shard.
    #[arg(long)]
    pub whole_keyspace: bool,
}

impl WatchOpts {
    pub fn validate(&self) -> Result<(), BenchError> {
        let bad = |option: &'static str, reason: String| Err(BenchError::Option { option, reason });
        if self.streams == 0 || self.streams > MAX_CLIENTS {
            return bad(
                "--streams",
                format!("{} is not in 1..={MAX_CLIENTS}", self.streams),
            );
        }
        if self.watchers_per_stream == 0 || self.streams * self.watchers_per_stream > MAX_WATCHERS {
            return bad(
                "--watchers-per-stream",
                format!(
                    "{} x {} streams is not in 1..={MAX_WATCHERS}",
                    self.watchers_per_stream, self.streams
                ),
            );
        }
        if self.val_size < crate::watch::VALUE_HEADER_BYTES || self.val_size > MAX_VAL_SIZE_BYTES {
            return bad(
                "--val-size",
                format!(
                    "{} is not in {}..={MAX_VAL_SIZE_BYTES}",
                    self.val_size,
                    crate::watch::VALUE_HEADER_BYTES
                ),
            );
        }
        if !(self.put_rate > 0.0 && self.put_rate <= MAX_RATE_PER_SEC) {
            return bad(
                "--put-rate",
                format!("{} is not in (0, {MAX_RATE_PER_SEC}]", self.put_rate),
            );
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Args)]
pub struct LeaseOpts {
    /// TTL of each client's lease in seconds; keep-alives renew it.
    #[arg(long, default_value_t = 60)]
    pub ttl_secs: i64,
}

/// Parses `250ms`, `10s`, `2m`, `1h` or a bare number of seconds (`1.5`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration (examples: 500ms, 10s, 2m)"))?;
    let scale_secs = match unit {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "us" => 1e-6,
        "m" => 60.0,
        "h" => 3600.0,
        _ => {
            return Err(format!(
                "`{text}` has unknown unit `{unit}` (use ms, s, m or h)"
            ))
        }
    };
    let secs = value * scale_secs;
    if !secs.is_finite() || secs < 0.0 || secs > MAX_RUN_DURATION.as_secs_f64() {
        return Err(format!("`{text}` is out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn key_size_must_hold_the_key_space() {
        let keys = KeyOpts {
            key_size: 3,
            val_size: 8,
            key_space_size: 1000,
            sequential_keys: false,
        };
        assert!(keys.validate().is_ok());
        let keys = KeyOpts {
            key_space_size: 1001,
            ..keys
        };
        assert!(matches!(
            keys.validate(),
            Err(BenchError::Option {
                option: "--key-size",
                ..
            })
        ));
    }

    #[test]
    fn clients_cover_connections() {
        let cli = Cli::parse_from(["cairn-bench", "--conns", "10", "--clients", "5", "put"]);
        assert!(matches!(
            cli.global.validate(),
            Err(BenchError::Option {
                option: "--clients",
                ..
            })
        ));
        let cli = Cli::parse_from(["cairn-bench", "put", "--conns", "10", "--clients", "100"]);
        assert!(cli.global.validate().is_ok());
        assert_eq!(cli.global.stop(), Stop::Total(DEFAULT_TOTAL));
    }

    fn option_error(args: &[&str]) -> Option<&'static str> {
        let cli = Cli::try_parse_from(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        match cli.global.validate() {
            Ok(()) => None,
            Err(BenchError::Option { option, .. }) => Some(option),
            Err(e) => panic!("{args:?}: {e}"),
        }
    }

    #[test]
    fn tls_and_user_options_parse_anywhere_on_the_line() {
        let cli = Cli::parse_from([
            "cairn-bench",
            "--endpoints",
            "https://127.0.0.1:2379,127.0.0.1:3379",
            "--cacert",
            "ca.pem",
            "range",
            "00000000",
            "--cert",
            "client.pem",
            "--key",
            "client-key.pem",
            "--user",
            "bench:secret",
        ]);
        cli.global.validate().unwrap();
        assert!(cli.global.tls());
        assert_eq!(cli.global.cacert, Some(PathBuf::from("ca.pem")));
        assert_eq!(cli.global.cert, Some(PathBuf::from("client.pem")));
        assert_eq!(cli.global.key, Some(PathBuf::from("client-key.pem")));
        assert_eq!(cli.global.user, Some(Credentials::new("bench", "secret")));
        let Command::Range(range) = cli.command else {
            panic!("not a range");
        };
        assert_eq!(range.key, "00000000", "--key is not the range's key");
        assert!(Cli::try_parse_from(["cairn-bench", "--user", "nopassword", "put"]).is_err());
    }

    #[test]
    fn the_own_grpc_client_carries_plaintext_unless_told_otherwise() {
        let own = |args: &[&str]| {
            let args = [&["cairn-bench"], args, &["put"]].concat();
            Cli::parse_from(args).global.own_grpc_client()
        };
        assert!(own(&[]));
        assert!(own(&["--user", "u:p"]));
        assert!(!own(&["--cacert", "ca"]));
        assert!(!own(&["--grpc-client", "tonic"]));
        assert!(own(&["--grpc-client", "cairn"]));
    }

    #[test]
    fn the_client_of_the_unary_calls_is_resolved_by_tls() {
        // What `compare`'s summary names (`grpc_client`).
        let name = |c: GrpcClient, tls| c.resolved(tls).name();
        assert_eq!(name(GrpcClient::Auto, false), "cairn");
        assert_eq!(name(GrpcClient::Auto, true), "tonic");
        assert_eq!(name(GrpcClient::Tonic, false), "tonic");
        assert_eq!(name(GrpcClient::Cairn, false), "cairn");
    }

    #[test]
    fn tls_options_are_checked_together() {
        // (endpoint, options before the subcommand, the option blamed or None)
        let cases: [(&str, &[&str], Option<&str>); 10] = [
            ("127.0.0.1:1", &["--cert", "c"], Some("--cert")),
            ("127.0.0.1:1", &["--key", "k"], Some("--key")),
            // A client certificate without a CA.
            (
                "127.0.0.1:1",
                &["--cert", "c", "--key", "k"],
                Some("--cert"),
            ),
            ("https://127.0.0.1:1", &[], Some("--cacert")),
            (
                "http://127.0.0.1:1",
                &["--cacert", "ca"],
                Some("--endpoints"),
            ),
            (
                "127.0.0.1:1",
                &["--cacert", "ca", "--cert", "c", "--key", "k"],
                None,
            ),
            ("127.0.0.1:1", &["--user", "u:p"], None),
            // The own gRPC client speaks plaintext only.
            (
                "127.0.0.1:1",
                &["--cacert", "ca", "--grpc-client", "cairn"],
                Some("--grpc-client"),
            ),
            (
                "127.0.0.1:1",
                &["--cacert", "ca", "--grpc-client", "tonic"],
                None,
            ),
            ("127.0.0.1:1", &["--grpc-client", "cairn"], None),
        ];
        for (endpoint, extra, expected) in cases {
            let args = [&["cairn-bench", "--endpoints", endpoint], extra, &["put"]].concat();
            assert_eq!(option_error(&args), expected, "{args:?}");
        }
    }
}
