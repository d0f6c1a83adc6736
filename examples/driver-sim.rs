//! Runs the production shard driver under simulation over many seeds
//! (`cairn::sim::driver`).
//!
//! ```text
//! cargo run --release --example driver-sim -- --seeds 2000 --members 3
//! cargo run --release --example driver-sim -- --seed 17 --members 5          # one seed
//! cargo run --release --example driver-sim -- --seeds 500 --mutation vote-without-log-check
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
    /// Run this one seed only.
    #[arg(long)]
    seed: Option<u64>,
    /// Switch off a safety rule of the Raft core: commit-previous-term-by-count
    /// or vote-without-log-check.
    #[arg(long)]
    mutation: Option<String>,
    /// Show the drivers' log lines at this level (e.g. `info`).
    #[arg(long)]
    log: Option<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(level) = &args.log {
        tracing_subscriber::fmt()
            .with_env_filter(level.as_str())
            .with_writer(std::io::stderr)
            .init();
    }
    let mutation = match args.mutation.as_deref().map(sim::parse_mutation) {
        None => None,
        Some(Ok(m)) => Some(m),
        Some(Err(e)) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if mutation.is_some() {
        sim::install_quiet_panic_hook();
    }
    let (first, count) = match args.seed {
        Some(seed) => (seed, 1),
        None => (args.first_seed, args.seeds),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    let started = Instant::now();
    let result = runtime.block_on(tokio::task::LocalSet::new().run_until(driver::run_seeds(
        args.members,
        first,
        count,
        mutation,
    )));
    let (run, stats, found) = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    println!(
        "seeds={run} members={} violations={} in {:.1} s",
        args.members,
        u8::from(found.is_some()),
        started.elapsed().as_secs_f64()
    );
    println!("{stats:#?}");
    match (found, mutation) {
        (Some(out), None) => {
            println!("{out}");
            println!(
                "replay: cargo run --release --example driver-sim -- --seed {} --members {}",
                out.seed, out.members
            );
            ExitCode::from(1)
        }
        (Some(out), Some(_)) => {
            println!("caught: {out}");
            ExitCode::SUCCESS
        }
        (None, Some(_)) => {
            println!("the mutation was not caught in {run} seeds");
            ExitCode::from(1)
        }
        (None, None) => ExitCode::SUCCESS,
    }
}
