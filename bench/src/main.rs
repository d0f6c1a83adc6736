//! The `cairn-bench` command: parse, run, print a table (or only JSON), and stop
//! every process it started on SIGINT/SIGTERM.

use clap::Parser;
use tokio::signal::unix::{signal, SignalKind};

use cairn_bench::{BenchError, Cli, Command};

async fn run(cli: Cli) -> Result<(), BenchError> {
    match &cli.command {
        Command::Compare(opts) => cairn_bench::compare::run(&cli.global, opts, true).await,
        Command::TlsCost(opts) => cairn_bench::tls_cost::run(&cli.global, opts, true).await,
        Command::WatchLoad(opts) => cairn_bench::watch_load::run(&cli.global, opts, true).await,
        Command::Memory(opts) => cairn_bench::memory::run(&cli.global, opts, true).await,
        command => {
            let report = cairn_bench::run_workload(&cli.global, command, true).await?;
            if !cli.global.json {
                print!("{}", report.table());
            }
            println!("{}", report.to_json());
            Ok(())
        }
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let mut sigterm = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cairn-bench: cannot install the SIGTERM handler: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    // Dropping the losing future of the select stops any cluster it started.
    let outcome = tokio::select! {
        r = run(cli) => r,
        _ = tokio::signal::ctrl_c() => Err(BenchError::Interrupted { signal: "SIGINT" }),
        _ = sigterm.recv() => Err(BenchError::Interrupted { signal: "SIGTERM" }),
    };
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e @ BenchError::Interrupted { .. }) => {
            eprintln!("cairn-bench: {e}");
            std::process::ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("cairn-bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
