//! What the workload tests against real servers share.

#![allow(dead_code)]

use cairn_bench::{run_workload, Cli, Report};
use clap::Parser;

/// Runs `cairn-bench <args>` in-process and returns its report.
pub async fn bench(args: &[&str]) -> Report {
    let mut full = vec!["cairn-bench"];
    full.extend_from_slice(args);
    let cli = Cli::try_parse_from(&full).unwrap_or_else(|e| panic!("{}: {e}", full.join(" ")));
    run_workload(&cli.global, &cli.command, false)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", full.join(" ")))
}

/// 40 puts at 200/s, each owed to 2 streams x 5 watchers (400 events).
pub async fn watch_latency_40_puts(endpoints: &str) -> Report {
    bench(&[
        "--endpoints",
        endpoints,
        "--conns",
        "2",
        "--clients",
        "2",
        "--total",
        "40",
        "--rate",
        "200",
        "watch-latency",
        "--streams",
        "2",
        "--watchers-per-stream",
        "5",
    ])
    .await
}
