//! Runs the deterministic keyspace simulator (several shards per member, one
//! revision counter, txns, reads and watches over several shards) over many
//! seeds with a chosen guard and, optionally, a planted bug.
//!
//! ```text
//! cargo run --release --example keyspace-sim -- --seeds 1000 --members 3 --guard lease
//! cargo run --release --example keyspace-sim -- --seeds 1000 --members 5 --guard none
//! cargo run --release --example keyspace-sim -- --seeds 1000 --members 3 --bug skip-finish --keep-going
//! cargo run --release --example keyspace-sim -- --seeds 1000 --members 3 --protocol as-built --keep-going
//! cargo run --release --example keyspace-sim -- --seed 17 --members 3 --guard none   # replay, with trace
//! ```
//!
//! `--protocol` picks the model of txns and reads over several shards:
//! `fixed` (the default: the code as built plus the two changes the model
//! calls for, see `keyspace::Protocol`), `as-built`, or `reopen-only`.
//!
//! Prints a table and a machine-readable `keyspace-sim ...` line. Without
//! `--keep-going`, a run stops at the first violating seed and prints its
//! trace. Exits 0 when no seed violated a check, 1 otherwise.

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;

use cairn::sim;
use cairn::sim::keyspace::{self, Bug, Guard, KsConfig, KsOutcome, Protocol};

#[derive(Parser, Debug)]
#[command(about = "Deterministic simulator of a Cairn keyspace over several shards")]
struct Args {
    /// Number of seeds to run.
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// First seed of the run.
    #[arg(long, default_value_t = 0)]
    first_seed: u64,
    /// Members of the keyspace.
    #[arg(long, default_value_t = 3)]
    members: usize,
    /// Shards per member; drawn from each seed (2..=4) when absent.
    #[arg(long)]
    shards: Option<usize>,
    /// lease (the fix), none (the planted bug) or lease-no-restart-hold.
    #[arg(long, default_value = "lease")]
    guard: String,
    /// The protocol for txns and reads over several shards: fixed (the
    /// code as built plus the two changes the model calls for), as-built,
    /// or reopen-only.
    #[arg(long, default_value = "fixed")]
    protocol: String,
    /// A bug planted in the model of txns, reads and watches: none,
    /// skip-finish, no-fence, skip-read-wait, skip-read-term, watch-no-merge,
    /// batch-one-revision or join-ignores-overlap.
    #[arg(long, default_value = "none")]
    bug: String,
    /// Replay this one seed and print its full trace.
    #[arg(long)]
    seed: Option<u64>,
    /// Run every seed and count the violating ones instead of stopping at
    /// the first.
    #[arg(long)]
    keep_going: bool,
    /// Trace lines printed for a violating seed found in a multi-seed run
    /// (the end of the trace); 0 prints all of it.
    #[arg(long, default_value_t = 200)]
    trace_lines: usize,
}

fn config(args: &Args, guard: Guard, protocol: Protocol, bug: Bug, seed: u64) -> KsConfig {
    let mut cfg = KsConfig::new(args.members, seed, guard);
    cfg.shards = args.shards;
    cfg.protocol = protocol;
    cfg.bug = bug;
    cfg
}

fn replay(args: &Args, guard: Guard, protocol: Protocol, bug: Bug, seed: u64) -> KsOutcome {
    let mut cfg = config(args, guard, protocol, bug, seed);
    cfg.trace = true;
    match keyspace::run_seed(&cfg) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("keyspace-sim: {e}");
            std::process::exit(2);
        }
    }
}

fn print_trace(out: &KsOutcome, tail: usize) {
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

fn main() -> ExitCode {
    let args = Args::parse();
    sim::install_quiet_panic_hook();
    let guard = match Guard::parse(&args.guard) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("keyspace-sim: {e}");
            return ExitCode::from(2);
        }
    };
    let protocol = match Protocol::parse(&args.protocol) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("keyspace-sim: {e}");
            return ExitCode::from(2);
        }
    };
    let bug = match Bug::parse(&args.bug) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("keyspace-sim: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(seed) = args.seed {
        let out = replay(&args, guard, protocol, bug, seed);
        print_trace(&out, 0);
        println!("{out}");
        return if out.violation.is_none() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let started = Instant::now();
    let max_violations = if args.keep_going { usize::MAX } else { 1 };
    let summary = match keyspace::run_seeds(
        &config(&args, guard, protocol, bug, 0),
        args.first_seed,
        args.seeds,
        max_violations,
    ) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("keyspace-sim: {e}");
            return ExitCode::from(2);
        }
    };
    let elapsed = started.elapsed().as_secs_f64();
    let st = &summary.stats;
    let seeds_per_sec = summary.seeds_run as f64 / elapsed.max(1e-9);
    println!("guard                   {}", guard.name());
    println!("protocol                {}", protocol.name());
    println!("planted bug             {}", bug.name());
    println!("members                 {}", args.members);
    println!("seeds run               {}", summary.seeds_run);
    println!("steps                   {}", st.steps);
    println!("ticks                   {}", st.ticks);
    println!("messages delivered      {}", st.messages_delivered);
    println!("messages dropped        {}", st.messages_dropped);
    println!("crashes                 {}", st.crashes);
    println!("pauses                  {}", st.pauses);
    println!("tick stalls             {}", st.tick_stalls);
    println!(
        "partitions (partial)    {} ({})",
        st.partitions, st.partial_partitions
    );
    println!(
        "stale-view episodes     {} ({} reached two leaders)",
        st.episodes, st.episodes_held
    );
    println!("leaders elected         {}", st.leaders_elected);
    println!("transfers requested     {}", st.transfers_requested);
    println!("writes invoked          {}", st.writes_invoked);
    println!("writes proposed         {}", st.writes_proposed);
    println!("writes applied          {}", st.writes_applied);
    println!("writes acknowledged     {}", st.writes_acked);
    println!(
        "txns invoked (batches)  {} ({}: {} acknowledged, {} retried, {} unknown)",
        st.txns_invoked, st.txn_runs, st.txns_acked, st.txn_retries, st.txn_unknown
    );
    println!("txns applied            {}", st.txns_applied);
    println!(
        "parts proposed          {} (+{} by finishing; {} finishing retries)",
        st.parts_proposed, st.parts_finished, st.finish_retries
    );
    println!(
        "batches (txns, max)     {} ({}, {}; {} joins)",
        st.batches, st.batched_txns, st.batch_max_txns, st.batch_joins
    );
    println!(
        "joins refused           {} for a key in common, {} full",
        st.joins_refused_overlap, st.joins_refused_full
    );
    println!("entries of several parts {}", st.parts_entries);
    println!(
        "batches half proposed   {} ({} finished by an opening, {} parts; {} abandoned)",
        st.batches_half_proposed,
        st.batches_finished_by_opening,
        st.batch_parts_finished,
        st.batches_abandoned
    );
    println!("counter openings        {}", st.openings);
    println!("fences under a half txn {}", st.fences_under_half_txn);
    println!(
        "reads invoked (acked)   {} ({}; {} refused, leader changed)",
        st.reads_invoked, st.reads_acked, st.reads_leader_changed
    );
    println!("closes proposed         {}", st.closes_proposed);
    println!("watch events released   {}", st.watch_events_released);
    println!("lease refusals          {}", st.lease_refusals);
    println!("votes held (restart)    {}", st.votes_held);
    println!("steps with two leaders  {}", st.dual_leader_steps);
    println!(
        "max recovery ticks      {} (bound {})",
        st.recovery_ticks,
        keyspace::LIVENESS_BOUND_TICKS
    );
    println!("violating seeds         {}", summary.violations.len());
    println!("elapsed                 {elapsed:.2} s ({seeds_per_sec:.1} seeds/s)");
    for v in &summary.violations {
        println!("{v}");
    }
    let first = summary.violations.first().map(|v| v.seed);
    println!(
        "keyspace-sim guard={} protocol={} bug={} members={} seeds={} violations={} batches={} batched_txns={} batch_max_txns={} parts_entries={} batches_half_proposed={} batches_finished_by_opening={} reads_leader_changed={} first_violating_seed={} seeds_to_first={} elapsed_s={elapsed:.2} seeds_per_s={seeds_per_sec:.1}",
        guard.name(),
        protocol.name(),
        bug.name(),
        args.members,
        summary.seeds_run,
        summary.violations.len(),
        st.batches,
        st.batched_txns,
        st.batch_max_txns,
        st.parts_entries,
        st.batches_half_proposed,
        st.batches_finished_by_opening,
        st.reads_leader_changed,
        first.map_or("none".to_string(), |s| s.to_string()),
        first.map_or("none".to_string(), |s| (s - args.first_seed + 1).to_string()),
    );
    if let Some(seed) = first {
        if !args.keep_going {
            let out = replay(&args, guard, protocol, bug, seed);
            println!(
                "first violating seed {seed} (replay: --seed {seed} --members {} --guard {} --protocol {} --bug {}{})",
                args.members,
                guard.name(),
                protocol.name(),
                bug.name(),
                args.shards
                    .map(|s| format!(" --shards {s}"))
                    .unwrap_or_default()
            );
            print_trace(&out, args.trace_lines);
            println!("{out}");
        }
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
