//! `botfleet`: run thousands of chat bots on a few worker processes, as one fleet.
//!
//! This binary is the edge where errors become messages for people (`anyhow`); the libraries
//! below it return typed errors.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod api;
mod bots;
mod chats;
mod common;
mod config;
mod demo;
mod desk;
#[cfg(test)]
mod docs;
mod fleet;
mod handler_schema;
mod lines;
mod registry;
mod secrets;
mod send;
mod worker;

/// Run thousands of chat bots on a few worker processes, as one fleet.
#[derive(Debug, Parser)]
#[command(name = "botfleet", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// A TOML file whose keys are flags of the command (`lease_ms = 15000`); the command line
    /// and `BOTFLEET_*` variables win over it.
    #[arg(long, global = true, env = "BOTFLEET_CONFIG", value_name = "FILE")]
    config: Option<std::path::PathBuf>,
    /// Logs: `text` for people, `json` (one object per line) for collectors; `auto` is text on
    /// a terminal and JSON otherwise. Colour only on a terminal.
    #[arg(
        long,
        global = true,
        env = "BOTFLEET_LOG_FORMAT",
        value_enum,
        default_value = "auto"
    )]
    log_format: common::LogFormat,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Host bots: alone (embedded, SQLite, no Redis) or as one of a fleet (--redis-url).
    Worker(worker::WorkerArgs),
    /// Manage the bot registry.
    #[command(subcommand)]
    Bots(bots::BotsCommand),
    /// Look at the fleet.
    #[command(subcommand)]
    Fleet(fleet::FleetCommand),
    /// Tokens and signing secrets at rest.
    #[command(subcommand)]
    Secrets(secrets::SecretsCommand),
    /// Send a message to a chat of a bot from the backend (through a worker's API): it goes
    /// out once, in the chat's turn.
    Send(send::SendArgs),
    /// Hand a chat to a person and give it back (through a worker's API).
    #[command(subcommand)]
    Chats(chats::ChatsCommand),
    /// A self-contained show: fake Telegram, Slack and Discord servers, three workers, a few
    /// hundred bots of all three platforms, users writing; one worker is killed midway and
    /// another joins; then a report per platform.
    Demo(demo::DemoArgs),
    /// Print the version, the supported platforms and storage backends.
    Version,
}

fn main() -> ExitCode {
    let args = match config::apply(std::env::args_os().collect()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // clap prints help and version to stdout (exit 0) and usage errors to stderr (exit 2).
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    let threads = match &cli.command {
        Command::Worker(a) => a.worker_threads(),
        _ => std::thread::available_parallelism().map_or(2, |n| n.get().min(4)),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    common::set_log_format(cli.log_format);
    match cli.command {
        Command::Worker(a) => worker::run(a).await,
        Command::Bots(c) => bots::run(c).await,
        Command::Fleet(c) => fleet::run(c).await,
        Command::Secrets(c) => secrets::run(c).await,
        Command::Send(a) => send::run(a).await,
        Command::Chats(c) => chats::run(c).await,
        Command::Demo(a) => demo::run(a).await,
        Command::Version => {
            println!("botfleet {}", env!("CARGO_PKG_VERSION"));
            let runs: Vec<_> = botfleet_runtime::supported_platforms()
                .iter()
                .map(|p| p.as_str())
                .collect();
            println!("platforms: {}", runs.join(", "));
            println!("stores: sqlite (default), postgres, memory");
            println!("coordinators: memory (embedded), redis (fleet)");
            Ok(ExitCode::SUCCESS)
        }
    }
}
