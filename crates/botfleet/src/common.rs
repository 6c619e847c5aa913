//! Flags shared by several commands, and opening what they name.

use std::sync::Arc;

use anyhow::Context;
use botfleet_coord::{Coordinator, RedisConfig, RedisCoordinator};
use botfleet_store::Store;
use clap::Args;

/// Where the registry lives and, in a fleet, where the workers coordinate. `Debug` hides the
/// URLs: they may hold passwords.
#[derive(Clone, Args)]
pub(crate) struct Backends {
    /// The bot registry and state: sqlite://PATH, postgres://..., memory://
    #[arg(
        long,
        env = "BOTFLEET_DATABASE_URL",
        default_value = "sqlite://botfleet.db",
        hide_env_values = true
    )]
    pub(crate) database_url: String,
    /// Redis of the fleet. Absent: embedded mode (one worker, in-memory coordination).
    #[arg(long, env = "BOTFLEET_REDIS_URL", hide_env_values = true)]
    pub(crate) redis_url: Option<String>,
    /// Prefix of every Redis key of this fleet.
    #[arg(long, env = "BOTFLEET_PREFIX", default_value = "botfleet")]
    pub(crate) prefix: String,
}

impl std::fmt::Debug for Backends {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backends")
            .field("database_url", &"<redacted>")
            .field("redis_url", &self.redis_url.as_ref().map(|_| "<redacted>"))
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl Backends {
    pub(crate) async fn store(&self) -> anyhow::Result<Arc<dyn Store>> {
        botfleet_store::open(&self.database_url)
            .await
            .context("opening the bot registry (--database-url)")
    }

    /// The fleet's coordinator, when `--redis-url` is given.
    pub(crate) async fn redis(&self) -> anyhow::Result<Option<Arc<dyn Coordinator>>> {
        let Some(url) = &self.redis_url else {
            return Ok(None);
        };
        let c =
            RedisCoordinator::connect(RedisConfig::new(url.clone()).prefix(self.prefix.clone()))
                .await
                .context("connecting to Redis (--redis-url)")?;
        Ok(Some(Arc::new(c)))
    }

    /// The SQLite file path, when the registry is one.
    pub(crate) fn sqlite_path(&self) -> Option<std::path::PathBuf> {
        self.database_url
            .strip_prefix("sqlite://")
            .filter(|p| !p.is_empty())
            .map(std::path::PathBuf::from)
    }
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// Text on a terminal, JSON lines otherwise.
    Auto,
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

static LOG_FORMAT: std::sync::OnceLock<LogFormat> = std::sync::OnceLock::new();

/// Chooses the format `init_logs` uses (once, from `--log-format`).
pub(crate) fn set_log_format(f: LogFormat) {
    let _ = LOG_FORMAT.set(f);
}

/// Logs to stderr; `RUST_LOG` overrides `default`. Colour only when stderr is a terminal.
pub(crate) fn init_logs(default: &str) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let terminal = std::io::stderr().is_terminal();
    let json = match LOG_FORMAT.get().copied().unwrap_or(LogFormat::Auto) {
        LogFormat::Auto => !terminal,
        LogFormat::Text => false,
        LogFormat::Json => true,
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(terminal && !json);
    let _ = if json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
}
