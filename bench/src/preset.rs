//! The workloads `compare` and `tls-cost` measure: each a fixed `cairn-bench`
//! command line, parsed by the same parser a user's command goes through, so
//! any row of their tables can be reproduced by hand against any cluster.

use std::path::Path;
use std::time::Duration;

use clap::ValueEnum;

use crate::config::{GlobalOpts, GrpcClient, Stop};
use crate::security::{bench_user, ClusterCerts};

/// Measured phase of each run when neither --duration nor --total is given.
pub const DEFAULT_RUN_DURATION: Duration = Duration::from_secs(10);
/// Warm-up of each run when --warmup is not given.
pub const DEFAULT_WARMUP: Duration = Duration::from_secs(2);
/// The key the range presets read; written once at cluster start.
pub const RANGE_KEY: &str = "00000000";
/// The end of the range `range-all` reads: [RANGE_KEY, RANGE_ALL_END).
pub const RANGE_ALL_END: &str = "00000010";
/// Value size of the write presets (etcd's published figures use 256 B values).
pub const PRESET_VAL_SIZE_BYTES: usize = 256;
/// Distinct keys of the write presets.
pub const PRESET_KEY_SPACE: u64 = 100_000;
/// Keys each txn of `txn-one` and `txn-cross` compares and puts.
pub const PRESET_KEYS_PER_TXN: usize = 2;

/// The workload rows `compare` knows, each a fixed `cairn-bench` command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// put, 1 client over 1 connection.
    #[value(name = "put-1")]
    Put1,
    /// put, 100 clients over 10 connections.
    #[value(name = "put-100")]
    Put100,
    /// linearizable range of one key, 100 clients over 10 connections.
    RangeL,
    /// serializable range of one key, 100 clients over 10 connections.
    RangeS,
    /// `range-l` sent as etcd's read-only txn (a compare on the key, the
    /// range on either branch), 100 clients over 10 connections.
    TxnRange,
    /// linearizable range of the ten keys after the range key (keys that
    /// route to every shard of a Cairn member with several), 100 clients
    /// over 10 connections.
    RangeAll,
    /// `range-all` sent as etcd's read-only txn (a compare on its first
    /// key, the range on either branch): with several shards, a read-only
    /// txn over every shard.
    TxnRangeAll,
    /// compare-and-swap txn, 100 clients over 10 connections.
    TxnPut,
    /// `txn-put`'s compare-and-swap over two keys of one routing prefix
    /// (one shard), 100 clients over 10 connections.
    TxnOne,
    /// the txn of `txn-one` over two keys of two routing prefixes, which
    /// fall on different shards of a Cairn member with several.
    TxnCross,
    /// watch latency, 100 watchers over 10 streams, 100 puts/s from 10 putters.
    Watch,
    /// `watch` with every watcher on the whole keyspace.
    WatchAll,
    /// 90% linearizable reads, 10% writes, 100 clients over 10 connections.
    Mixed,
    /// lease keep-alive round trips, 100 clients over 10 connections.
    LeaseKeepalive,
}

impl Preset {
    pub fn name(self) -> &'static str {
        match self {
            Preset::Put1 => "put-1",
            Preset::Put100 => "put-100",
            Preset::RangeL => "range-l",
            Preset::RangeS => "range-s",
            Preset::TxnRange => "txn-range",
            Preset::RangeAll => "range-all",
            Preset::TxnRangeAll => "txn-range-all",
            Preset::TxnPut => "txn-put",
            Preset::TxnOne => "txn-one",
            Preset::TxnCross => "txn-cross",
            Preset::Watch => "watch",
            Preset::WatchAll => "watch-all",
            Preset::Mixed => "mixed",
            Preset::LeaseKeepalive => "lease-keepalive",
        }
    }

    /// (clients, conns) and the subcommand with its options.
    fn shape(self) -> (usize, usize, Vec<String>) {
        let keys = |cmd: &str| {
            vec![
                cmd.to_owned(),
                "--key-size".into(),
                "8".into(),
                "--val-size".into(),
                PRESET_VAL_SIZE_BYTES.to_string(),
                "--key-space-size".into(),
                PRESET_KEY_SPACE.to_string(),
            ]
        };
        let range = |c: &str| {
            vec![
                "range".into(),
                RANGE_KEY.into(),
                "--consistency".into(),
                c.into(),
            ]
        };
        match self {
            Preset::Put1 => (1, 1, keys("put")),
            Preset::Put100 => (100, 10, keys("put")),
            Preset::RangeL => (100, 10, range("l")),
            Preset::RangeS => (100, 10, range("s")),
            Preset::TxnRange => {
                let mut v = range("l");
                v.push("--in-txn".into());
                (100, 10, v)
            }
            Preset::RangeAll | Preset::TxnRangeAll => {
                let mut v = ["range", RANGE_KEY, RANGE_ALL_END, "--consistency", "l"]
                    .map(String::from)
                    .to_vec();
                if self == Preset::TxnRangeAll {
                    v.push("--in-txn".into());
                }
                (100, 10, v)
            }
            Preset::TxnPut => (100, 10, keys("txn-put")),
            Preset::TxnOne | Preset::TxnCross => {
                let mut v = keys(self.name());
                v.extend(["--keys-per-txn".into(), PRESET_KEYS_PER_TXN.to_string()]);
                (100, 10, v)
            }
            Preset::Watch => (
                10,
                10,
                [
                    "watch-latency",
                    "--streams",
                    "10",
                    "--watchers-per-stream",
                    "10",
                    "--put-rate",
                    "100",
                ]
                .map(String::from)
                .to_vec(),
            ),
            Preset::WatchAll => {
                let (clients, conns, mut v) = Preset::Watch.shape();
                v.push("--whole-keyspace".into());
                (clients, conns, v)
            }
            Preset::Mixed => {
                let mut v = keys("mixed");
                v.extend(["--read-ratio", "0.9", "--consistency", "l"].map(String::from));
                (100, 10, v)
            }
            Preset::LeaseKeepalive => (100, 10, vec!["lease-keepalive".into()]),
        }
    }
}

/// The client options shown under a table for a secure cluster, with `$CERTS`
/// for the run's certificate directory.
pub(crate) fn shown_security_args(secure: bool) -> Vec<String> {
    if !secure {
        return Vec::new();
    }
    let mut args = ClusterCerts::in_dir(Path::new("$CERTS")).client_args();
    args.extend(["--user".into(), bench_user().arg()]);
    args
}

fn duration_arg(d: Duration) -> String {
    if d.subsec_millis() == 0 && d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// The exact command line of `preset` against `endpoints`, with `client_args`
/// (TLS and user options) after the global ones.
pub fn preset_command(
    preset: Preset,
    endpoints: &str,
    client_args: &[String],
    global: &GlobalOpts,
) -> Vec<String> {
    let (clients, conns, sub) = preset.shape();
    let mut args = vec![
        "cairn-bench".to_owned(),
        "--endpoints".into(),
        endpoints.to_owned(),
        "--conns".into(),
        conns.to_string(),
        "--clients".into(),
        clients.to_string(),
    ];
    match global.stop() {
        Stop::Duration(d) => args.extend(["--duration".into(), duration_arg(d)]),
        Stop::Total(n) if global.total.is_some() => args.extend(["--total".into(), n.to_string()]),
        Stop::Total(_) => args.extend(["--duration".into(), duration_arg(DEFAULT_RUN_DURATION)]),
    }
    args.extend([
        "--warmup".into(),
        duration_arg(global.warmup.unwrap_or(DEFAULT_WARMUP)),
    ]);
    if let Some(rate) = global.rate {
        args.extend(["--rate".into(), rate.to_string()]);
    }
    if global.grpc_client != GrpcClient::Auto {
        args.extend(["--grpc-client".into(), global.grpc_client.name().into()]);
    }
    args.extend_from_slice(client_args);
    args.extend(sub);
    args
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::config::Cli;
    use clap::Parser;

    #[test]
    fn every_preset_is_a_valid_command() {
        let global = Cli::parse_from(["cairn-bench", "put"]).global;
        for preset in Preset::value_variants() {
            let named = Preset::from_str(preset.name(), false).unwrap();
            assert_eq!(named, *preset, "the --workloads name is the table name");
            let args = preset_command(*preset, "127.0.0.1:1,127.0.0.1:2", &[], &global);
            let cli =
                Cli::try_parse_from(&args).unwrap_or_else(|e| panic!("{}: {e}", args.join(" ")));
            cli.global.validate().unwrap();
            assert!(!cli.global.tls() && cli.global.user.is_none());
            let secure = shown_security_args(true);
            let args = preset_command(*preset, "127.0.0.1:1", &secure, &global);
            let cli =
                Cli::try_parse_from(&args).unwrap_or_else(|e| panic!("{}: {e}", args.join(" ")));
            cli.global.validate().unwrap();
            assert_eq!(cli.global.cacert, Some(PathBuf::from("$CERTS/ca.pem")));
            assert_eq!(cli.global.user, Some(bench_user()));
            assert_eq!(cli.global.stop(), Stop::Duration(DEFAULT_RUN_DURATION));
            assert_eq!(cli.global.warmup(), DEFAULT_WARMUP);
        }
    }
}
