//! `cairn-tune`: measure durable appends on a disk and pick Cairn's WAL setting.

use cairn_tuning::error::{ExperimentError, LabError};
use cairn_tuning::etcd_check::{self, ETCD_CHECK_SIZE_BYTES};
use cairn_tuning::replicas::{self, ReplicaEngine, MEMBERS_MAX};
use cairn_tuning::safety::{self, LabDir};
use cairn_tuning::{report, run_lab};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "cairn-tune", version, about = "Cairn's fsync tuning lab")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the experiment matrix in DIR and recommend a WAL setting.
    Run {
        /// Directory on the disk to measure (must exist and be writable).
        #[arg(long)]
        dir: PathBuf,
        /// Short experiments and fewer sweep points (finishes in under 2 minutes).
        #[arg(long)]
        quick: bool,
        /// End the output with one JSON object holding every result.
        #[arg(long)]
        json: bool,
        /// Write a self-contained HTML report with latency CDF plots.
        #[arg(long, value_name = "FILE.html")]
        report: Option<PathBuf>,
        /// Run only the experiments whose label (as in the report) contains TEXT.
        #[arg(long, value_name = "TEXT")]
        only: Option<String>,
    },
    /// etcd's disk check (2300-byte writes, fdatasync each, 22 MiB), next to fio's.
    EtcdCheck {
        #[arg(long)]
        dir: PathBuf,
        /// End the output with one JSON object.
        #[arg(long)]
        json: bool,
        /// Do not run fio after the lab's check.
        #[arg(long)]
        no_fio: bool,
        /// Bytes to write (etcd's recipe: 22 MiB).
        #[arg(long, default_value_t = ETCD_CHECK_SIZE_BYTES)]
        size_bytes: u64,
        /// Repeat lab-then-fio this many times and report medians (1 to 20).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=etcd_check::ROUNDS_MAX as i64))]
        rounds: u32,
    },
    /// The floor of a replicated write when the members' logs share this disk:
    /// one writer alone, then MEMBERS writers of which a majority must have
    /// each append durable, in alternating rounds.
    Replicas {
        #[arg(long)]
        dir: PathBuf,
        /// Members, each with its own file in DIR (1 to 9).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=MEMBERS_MAX as i64))]
        members: u32,
        /// Seconds per round.
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=600))]
        secs: u32,
        /// How each member writes: "uring" (io_uring, as Cairn's WAL by
        /// default) or "pwrite" (pwritev2).
        #[arg(long, value_enum, default_value_t = ReplicaEngine::Uring)]
        engine: ReplicaEngine,
        /// Rounds of each kind (1 to 20); medians are reported.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
        rounds: u32,
        /// End the output with one JSON object.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,glommio=off".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    safety::install_signal_handlers();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run {
            dir,
            quick,
            json,
            report,
            only,
        } => run(&dir, quick, json, report, only.as_deref()),
        Command::EtcdCheck {
            dir,
            json,
            no_fio,
            size_bytes,
            rounds,
        } => check(&dir, json, !no_fio, size_bytes, rounds),
        Command::Replicas {
            dir,
            members,
            secs,
            engine,
            rounds,
            json,
        } => replicated(&dir, engine, members as usize, secs, rounds, json),
    };
    match result {
        Ok(code) => code,
        Err(LabError::Interrupted) => {
            eprintln!("cairn-tune: interrupted; the lab's files were removed");
            ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("cairn-tune: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(
    dir: &std::path::Path,
    quick: bool,
    json: bool,
    html: Option<PathBuf>,
    only: Option<&str>,
) -> Result<ExitCode, LabError> {
    println!("{}", report::table_header());
    let report = run_lab(dir, quick, only, |i, r| {
        println!("{}", report::table_row(i, r))
    })?;
    println!();
    print!("{}", report::recommendation_text(&report));
    if let Some(path) = html {
        std::fs::write(&path, report::html(&report)).map_err(|source| LabError::Report {
            path: path.clone(),
            source,
        })?;
        println!("report written to {}", path.display());
    }
    println!(
        "{} experiments in {:.1} s",
        report.experiments.len(),
        report.elapsed_secs
    );
    if json {
        println!("{}", report.to_json());
    }
    Ok(ExitCode::SUCCESS)
}

fn check(
    dir: &std::path::Path,
    json: bool,
    with_fio: bool,
    size_bytes: u64,
    rounds: u32,
) -> Result<ExitCode, LabError> {
    let lab = LabDir::open(dir)?;
    let check = etcd_check::etcd_check_rounds(&lab, size_bytes, with_fio, rounds);
    finish(check, "etcd check", json, etcd_check::render, |c| c.pass)
}

fn replicated(
    dir: &std::path::Path,
    engine: ReplicaEngine,
    members: usize,
    secs: u32,
    rounds: u32,
    json: bool,
) -> Result<ExitCode, LabError> {
    let lab = LabDir::open(dir)?;
    let secs = std::time::Duration::from_secs(secs.into());
    let measured = replicas::run(&lab, engine, members, secs, rounds);
    finish(measured, "replicated writes", json, replicas::render, |r| {
        r.rounds.iter().all(|round| round.verified)
    })
}

/// Prints a measurement (and its JSON when asked) and exits 0 when it
/// passed, 1 when it did not or could not be made; Ctrl-C ends the run.
fn finish<T: serde::Serialize>(
    measured: Result<T, ExperimentError>,
    what: &str,
    json: bool,
    render: fn(&T) -> String,
    passed: fn(&T) -> bool,
) -> Result<ExitCode, LabError> {
    let measured = match measured {
        Ok(m) => m,
        Err(ExperimentError::Interrupted) => return Err(LabError::Interrupted),
        Err(e) => {
            eprintln!("cairn-tune: {what} failed: {e}");
            return Ok(ExitCode::from(1));
        }
    };
    print!("{}", render(&measured));
    if json {
        println!(
            "{}",
            serde_json::to_string(&measured).expect("results serialize")
        );
    }
    Ok(if passed(&measured) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
