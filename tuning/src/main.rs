//! `cairn-tune`: measure durable appends on a disk and pick Cairn's WAL setting.

use cairn_tuning::error::LabError;
use cairn_tuning::etcd_check::{self, ETCD_CHECK_SIZE_BYTES};
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
    let check = match etcd_check::etcd_check_rounds(&lab, size_bytes, with_fio, rounds) {
        Ok(c) => c,
        Err(cairn_tuning::error::ExperimentError::Interrupted) => {
            return Err(LabError::Interrupted)
        }
        Err(e) => {
            eprintln!("cairn-tune: etcd check failed: {e}");
            return Ok(ExitCode::from(1));
        }
    };
    print!("{}", etcd_check::render(&check));
    if json {
        println!(
            "{}",
            serde_json::to_string(&check).expect("check serializes")
        );
    }
    Ok(if check.pass {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
