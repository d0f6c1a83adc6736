//! Runs the production shard driver under simulation over many seeds
//! (`cairn::sim::driver`).
//!
//! ```text
//! cargo run --release --example driver-sim -- --seeds 2000 --members 3
//! cargo run --release --example driver-sim -- --seed 17 --members 5          # one seed
//! cargo run --release --example driver-sim -- --seeds 500 --mutation vote-without-log-check
//! cargo run --release --example driver-sim -- --seeds 50 --replay-check      # each seed twice
//! cargo run --release --example driver-sim -- --seeds 1000 --shards 3       # one keyspace over 3
//! cargo run --release --example driver-sim -- --seeds 100 --shards 3 --keyspace-mutation open-before-applied
//! ```
//!
//! A normal run ends with `seeds=N violations=0` and exits 0, or prints the
//! first violating seed and exits 1. With `--mutation`, it searches for the
//! first seed that catches the broken core: exit 0 once one is found, 1 if
//! none is.

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;

use cairn::sim::{self, driver};

#[derive(Parser, Debug)]
#[command(about = "Simulator of Cairn's shard driver")]
struct Args {
    /// Number of seeds to run.
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// First seed of the run.
    #[arg(long, default_value_t = 0)]
    first_seed: u64,
    /// Members of the group.
    #[arg(long, default_value_t = 3)]
    members: usize,
    /// Shards each member runs, over one revision counter.
    #[arg(long, default_value_t = 1)]
    shards: usize,
    /// Run this one seed only.
    #[arg(long)]
    seed: Option<u64>,
    /// Switch off a safety rule of the Raft core: commit-previous-term-by-count
    /// or vote-without-log-check.
    #[arg(long)]
    mutation: Option<String>,
    /// Switch off a rule of the revision order (with --shards 2 or more):
    /// open-before-applied, no-finishing, no-leases, no-restart-vote-hold,
    /// join-ignores-overlap, watch-no-merge or watch-from-now-early.
    #[arg(long)]
    keyspace_mutation: Option<String>,
    /// Show the drivers' log lines at this level (e.g. `info`).
    #[arg(long)]
    log: Option<String>,
    /// Run every seed twice and compare the messages the members sent: exit
    /// 1 at the first seed whose two runs differ, showing where.
    #[arg(long)]
    replay_check: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(level) = &args.log {
        tracing_subscriber::fmt()
            .with_env_filter(level.as_str())
            .with_writer(std::io::stderr)
            .init();
    }
    let (first, count) = match args.seed {
        Some(seed) => (seed, 1),
        None => (args.first_seed, args.seeds),
    };
    let mut base = driver::DriverSimConfig::new(args.members, first);
    base.shards = args.shards;
    let parsed = (|| {
        base.mutation = args
            .mutation
            .as_deref()
            .map(sim::parse_mutation)
            .transpose()?;
        base.keyspace_mutation = (args.keyspace_mutation.as_deref())
            .map(sim::parse_keyspace_mutation)
            .transpose()?;
        Ok::<_, sim::SimConfigError>(())
    })();
    if let Err(e) = parsed {
        eprintln!("{e}");
        return ExitCode::from(2);
    }
    let mutated = base.is_mutated();
    if mutated {
        sim::install_quiet_panic_hook();
    }
    let started = Instant::now();
    if args.replay_check {
        if mutated {
            eprintln!("--replay-check runs the core as built: it takes no mutation");
            return ExitCode::from(2);
        }
        return replay_check(&base, count);
    }
    let result = driver::run_seeds(&base, count);
    let (run, stats, found) = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    println!(
        "seeds={run} members={} shards={} violations={} in {:.1} s",
        args.members,
        args.shards,
        u8::from(found.is_some()),
        started.elapsed().as_secs_f64()
    );
    println!("{stats:#?}");
    match (found, mutated) {
        (Some(out), false) => {
            println!("{out}");
            println!(
                "replay: cargo run --release --example driver-sim -- --seed {} --members {} \
                 --shards {}",
                out.seed, out.members, args.shards
            );
            ExitCode::from(1)
        }
        (Some(out), true) => {
            println!("caught: {out}");
            ExitCode::SUCCESS
        }
        (None, true) => {
            println!("the mutation was not caught in {run} seeds");
            ExitCode::from(1)
        }
        (None, false) => ExitCode::SUCCESS,
    }
}

/// Runs each seed twice with a trace of the wire and reports the first seed
/// whose runs differ.
fn replay_check(base: &driver::DriverSimConfig, count: u64) -> ExitCode {
    for seed in base.seed..base.seed + count {
        let mut runs = Vec::new();
        for _ in 0..2 {
            let cfg = driver::DriverSimConfig {
                seed,
                trace: true,
                ..base.clone()
            };
            match driver::run_seed_alone(&cfg) {
                Ok(out) => runs.push(out),
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::from(2);
                }
            }
        }
        let (a, b) = (&runs[0], &runs[1]);
        if a.wire_digest == b.wire_digest && a.stats == b.stats {
            println!("seed={seed} same: {} messages", a.messages_sent);
            continue;
        }
        println!(
            "seed={seed} DIFFERS: {} and {} messages sent",
            a.messages_sent, b.messages_sent
        );
        let first_diff = a
            .trace
            .iter()
            .zip(&b.trace)
            .position(|(x, y)| x != y)
            .unwrap_or(a.trace.len().min(b.trace.len()));
        println!("first difference at message {first_diff}:");
        let from = first_diff.saturating_sub(5);
        for (name, run) in [("first", a), ("second", b)] {
            println!("-- {name} run");
            for line in run.trace.iter().skip(from).take(12) {
                println!("{line}");
            }
        }
        if a.stats != b.stats {
            println!("first run: {:?}\nsecond run: {:?}", a.stats, b.stats);
        }
        return ExitCode::from(1);
    }
    println!(
        "seeds={count} members={} shards={}: every seed ran the same twice",
        base.members, base.shards
    );
    ExitCode::SUCCESS
}
