//! Runs the deterministic Raft simulator over many seeds.
//!
//! ```text
//! cargo run --release --example raft-sim -- --seeds 2000 --members 3
//! cargo run --release --example raft-sim -- --seed 17 --members 5      # replay one seed, with trace
//! cargo run --release --example raft-sim -- --seeds 2000 --mutation vote-without-log-check
//! ```
//!
//! A normal run ends with `seeds=N steps=S violations=0` and exits 0, or
//! prints the first violating seed with its trace and exits 1. With
//! `--mutation`, the run searches for the first seed that catches the broken
//! core: it exits 0 once one is found (printing it) and 1 if none is.

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;

use cairn::sim::{self, SimConfig, SimOutcome};

#[derive(Parser, Debug)]
#[command(about = "Deterministic simulator of a Cairn Raft group")]
struct Args {
    /// Number of seeds to run.
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// First seed of the run.
    #[arg(long, default_value_t = 0)]
    first_seed: u64,
    /// Members of the initial group.
    #[arg(long, default_value_t = 3)]
    members: usize,
    /// Replay this one seed and print its full trace.
    #[arg(long)]
    seed: Option<u64>,
    /// Switch off a safety rule of the core: commit-previous-term-by-count or
    /// vote-without-log-check.
    #[arg(long)]
    mutation: Option<String>,
    /// Run every seed and list each violating one instead of stopping at
    /// the first.
    #[arg(long)]
    keep_going: bool,
    /// Trace lines printed for a violating seed found in a multi-seed run (the
    /// end of the trace); 0 prints all of it.
    #[arg(long, default_value_t = 300)]
    trace_lines: usize,
    /// Drive members as the pipelined shard driver does (Raft's
    /// async_append): the next Ready is taken while earlier writes are in
    /// flight.
    #[arg(long)]
    pipelined: bool,
}

fn print_trace(out: &SimOutcome, tail: usize) {
    let skip = if tail == 0 {
        0
    } else {
        out.trace.len().saturating_sub(tail)
    };
    if skip > 0 {
        println!(
            "... {skip} earlier trace lines omitted (replay with --seed {} for all)",
            out.seed
        );
    }
    for line in &out.trace[skip..] {
        println!("{line}");
    }
}

fn replay(
    members: usize,
    seed: u64,
    mutation: Option<cairn::raft::SafetyMutation>,
    pipelined: bool,
) -> SimOutcome {
    let mut cfg = SimConfig::new(members, seed);
    cfg.mutation = mutation;
    cfg.trace = true;
    cfg.pipelined = pipelined;
    match sim::run_seed(&cfg) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("raft-sim: {e}");
            std::process::exit(2);
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    sim::install_quiet_panic_hook();
    let mutation = match args
        .mutation
        .as_deref()
        .map(sim::parse_mutation)
        .transpose()
    {
        Ok(m) => m,
        Err(e) => {
            eprintln!("raft-sim: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(seed) = args.seed {
        let out = replay(args.members, seed, mutation, args.pipelined);
        print_trace(&out, 0);
        println!("{out}");
        let violations = u64::from(out.violation.is_some());
        println!("seeds=1 steps={} violations={violations}", out.stats.steps);
        return if violations == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }

    let started = Instant::now();
    if args.keep_going {
        let mut violations = 0u64;
        let mut steps = 0u64;
        for seed in args.first_seed..args.first_seed + args.seeds {
            let mut cfg = SimConfig::new(args.members, seed);
            cfg.mutation = mutation;
            cfg.pipelined = args.pipelined;
            let out = match sim::run_seed(&cfg) {
                Ok(o) => o,
                Err(e) => {
                    eprintln!("raft-sim: {e}");
                    return ExitCode::from(2);
                }
            };
            steps += out.stats.steps;
            if out.violation.is_some() {
                violations += 1;
                println!("{out}");
            }
        }
        println!(
            "elapsed                 {:.2} s",
            started.elapsed().as_secs_f64()
        );
        println!("seeds={} steps={steps} violations={violations}", args.seeds);
        return if violations == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let summary = match sim::run_seeds(
        args.members,
        args.first_seed,
        args.seeds,
        mutation,
        args.pipelined,
    ) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("raft-sim: {e}");
            return ExitCode::from(2);
        }
    };
    let elapsed = started.elapsed();
    let st = &summary.stats;
    println!("members                 {}", args.members);
    println!("seeds run               {}", summary.seeds_run);
    println!("steps                   {}", st.steps);
    println!("ticks                   {}", st.ticks);
    println!("messages delivered      {}", st.messages_delivered);
    println!("messages dropped        {}", st.messages_dropped);
    println!("crashes                 {}", st.crashes);
    println!("partitions              {}", st.partitions);
    println!("leaders elected         {}", st.leaders_elected);
    println!("writes applied          {}", st.writes_applied);
    println!("reads served            {}", st.reads_served);
    println!("snapshots installed     {}", st.snapshots_installed);
    println!("conf changes applied    {}", st.conf_changes_applied);
    println!("transfers requested     {}", st.transfers_requested);
    println!(
        "max recovery ticks      {} (bound {})",
        st.recovery_ticks,
        sim::LIVENESS_BOUND_TICKS
    );
    println!("old-term commits        {}", st.old_term_commits);
    println!("most writes in flight   {}", st.max_writes_in_flight);
    println!("elapsed                 {:.2} s", elapsed.as_secs_f64());

    match (&summary.first_violation, mutation) {
        (Some(v), _) => {
            let out = replay(args.members, v.seed, mutation, args.pipelined);
            println!(
                "first violating seed {} (replay: --seed {} --members {}{}{})",
                v.seed,
                v.seed,
                args.members,
                args.mutation
                    .as_deref()
                    .map(|m| format!(" --mutation {m}"))
                    .unwrap_or_default(),
                if args.pipelined { " --pipelined" } else { "" }
            );
            print_trace(&out, args.trace_lines);
            println!("{v}");
            if out.violation != v.violation {
                println!("replay differs from the run: {out}");
            }
            if let Some(m) = &args.mutation {
                println!("mutation {m} caught after {} seeds", summary.seeds_run);
            }
            println!(
                "seeds={} steps={} violations=1",
                summary.seeds_run, st.steps
            );
            if mutation.is_some() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        (None, Some(_)) => {
            println!(
                "mutation {} NOT caught in {} seeds",
                args.mutation.as_deref().unwrap_or_default(),
                summary.seeds_run
            );
            println!(
                "seeds={} steps={} violations=0",
                summary.seeds_run, st.steps
            );
            ExitCode::FAILURE
        }
        (None, None) => {
            println!(
                "seeds={} steps={} violations=0",
                summary.seeds_run, st.steps
            );
            ExitCode::SUCCESS
        }
    }
}
