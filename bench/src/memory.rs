//! `cairn-bench memory`: the members' resident memory after the same load,
//! side by side.
//!
//! Each system is started alone (the other is not running), its members'
//! memory read, then `--puts` puts of `--val-size` bytes are written to as
//! many distinct keys by 100 clients over 10 connections, and after
//! `--settle` (the stores' commits and the runtimes' freed memory) the
//! members' memory is read again. Resident memory is VmRSS from
//! `/proc/<pid>/status`, summed over the members, and split into anonymous
//! (heap, stacks) and file-backed (mapped store files, the binary) pages.

use std::time::Duration;

use clap::{Args, Parser as _};
use serde_json::json;

use crate::binaries::DaemonOpts;
use crate::cluster::{Resident, StartOptions, System};
use crate::config::{parse_duration, Cli, GlobalOpts};
use crate::session::{say, scratch_dir, start_secured};
use crate::BenchError;

/// Most puts one run writes.
pub const MAX_MEMORY_PUTS: u64 = 10_000_000;

#[derive(Debug, Clone, Args)]
pub struct MemoryOpts {
    /// Systems to start, one after the other, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "etcd,cairn")]
    pub systems: Vec<System>,
    /// Members per cluster.
    #[arg(long, default_value_t = 3)]
    pub members: usize,
    /// Puts written, each to its own key.
    #[arg(long, default_value_t = 100_000)]
    pub puts: u64,
    /// Value size in bytes.
    #[arg(long, default_value_t = 256)]
    pub val_size: usize,
    /// Wait after the puts before memory is read, e.g. 5s.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub settle: Duration,
    #[command(flatten)]
    pub daemons: DaemonOpts,
}

/// One system's figures.
struct Row {
    system: System,
    before: Resident,
    after: Resident,
    puts_per_sec: f64,
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1024.0 * 1024.0))
}

pub async fn run(global: &GlobalOpts, opts: &MemoryOpts, progress: bool) -> Result<(), BenchError> {
    let bad = |option: &'static str, reason: String| Err(BenchError::Option { option, reason });
    if opts.systems.is_empty() {
        return bad("--systems", "nothing to measure".into());
    }
    if opts.puts == 0 || opts.puts > MAX_MEMORY_PUTS {
        return bad(
            "--puts",
            format!("{} is not in 1..={MAX_MEMORY_PUTS}", opts.puts),
        );
    }
    if global.tls() || global.user.is_some() {
        return bad(
            "memory",
            "--cacert, --cert, --key and --user do not apply: memory starts its own clusters"
                .into(),
        );
    }
    let scratch = scratch_dir(opts.daemons.work_dir.as_deref(), "cairn-bench-memory-")?;
    let mut rows = Vec::new();
    for &system in &opts.systems {
        let binary = opts.daemons.binary(system);
        let dir = scratch.path().join(system.name());
        let cluster = start_secured(
            system,
            &binary,
            opts.members,
            &dir,
            &StartOptions::default(),
            None,
        )
        .await?;
        let gone = || BenchError::Option {
            option: "memory",
            reason: format!("a {system} member exited; its log is in {}", dir.display()),
        };
        let before = Resident::of_members(&cluster).ok_or_else(gone)?;
        let args: Vec<String> = [
            "cairn-bench",
            "--endpoints",
            &cluster.endpoints_arg(),
            "--conns",
            "10",
            "--clients",
            "100",
            "--total",
            &opts.puts.to_string(),
            "put",
            "--key-size",
            "8",
            "--val-size",
            &opts.val_size.to_string(),
            "--key-space-size",
            &opts.puts.to_string(),
            "--sequential-keys",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        say(global, &format!("{system}: {}", args.join(" ")));
        let cli = Cli::try_parse_from(&args).map_err(|e| BenchError::Option {
            option: "memory",
            reason: format!("the put command does not parse: {e}"),
        })?;
        let report = crate::run_workload(&cli.global, &cli.command, progress).await?;
        if report.errors() > 0 {
            return bad(
                "memory",
                format!("{} of the puts to {system} failed", report.errors()),
            );
        }
        tokio::time::sleep(opts.settle).await;
        let after = Resident::of_members(&cluster).ok_or_else(gone)?;
        say(
            global,
            &format!(
                "    {} members: {} MiB resident before, {} MiB after ({} anonymous, {} file)",
                opts.members,
                mib(before.total),
                mib(after.total),
                mib(after.anon),
                mib(after.file)
            ),
        );
        rows.push(Row {
            system,
            before,
            after,
            puts_per_sec: report.requests_per_sec(),
        });
        drop(cluster);
    }
    if !global.json {
        println!(
            "| system | members | puts of {} B | resident before (MiB) | resident after (MiB) | anonymous (MiB) | file-backed (MiB) | puts/s |",
            opts.val_size
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|");
        for r in &rows {
            println!(
                "| {} | {} | {} | {} | {} | {} | {} | {:.0} |",
                r.system,
                opts.members,
                opts.puts,
                mib(r.before.total),
                mib(r.after.total),
                mib(r.after.anon),
                mib(r.after.file),
                r.puts_per_sec
            );
        }
        let find = |s: System| rows.iter().find(|r| r.system == s);
        if let (Some(e), Some(c)) = (find(System::Etcd), find(System::Cairn)) {
            println!(
                "\nResident after, Cairn/etcd: {:.2}",
                c.after.total as f64 / e.after.total.max(1) as f64
            );
        }
    }
    let results: Vec<_> = rows
        .iter()
        .map(|r| {
            json!({
                "system": r.system.name(),
                "resident_before_bytes": r.before.total,
                "resident_after_bytes": r.after.total,
                "anonymous_after_bytes": r.after.anon,
                "file_after_bytes": r.after.file,
                "puts_per_sec": r.puts_per_sec,
            })
        })
        .collect();
    println!(
        "{}",
        json!({
            "memory": results,
            "members": opts.members,
            "puts": opts.puts,
            "val_size": opts.val_size,
            "settle_s": opts.settle.as_secs_f64(),
        })
    );
    Ok(())
}
