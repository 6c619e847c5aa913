//! `botfleet`: run thousands of chat bots on a few worker processes, as one fleet.
//!
//! This binary is the edge where errors become messages for people (`anyhow`); the libraries
//! below it return typed errors.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Run thousands of chat bots on a few worker processes, as one fleet.
#[derive(Debug, Parser)]
#[command(name = "botfleet", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the version, the supported platforms and storage backends.
    Version,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // clap prints help and version to stdout (exit 0) and usage errors to stderr (exit 2).
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Version => {
            println!("botfleet {}", env!("CARGO_PKG_VERSION"));
            let platforms: Vec<_> = botfleet_core::Platform::ALL
                .iter()
                .map(|p| p.as_str())
                .collect();
            println!("platforms: {}", platforms.join(", "));
            println!("stores: sqlite (default), postgres, memory");
            println!("coordinators: memory (embedded), redis (fleet)");
            Ok(())
        }
    }
}
