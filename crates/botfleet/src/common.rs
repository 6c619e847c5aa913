//! Flags shared by several commands, and opening what they name.

use std::sync::Arc;

use anyhow::Context;
use botfleet_coord::{Coordinator, RedisConfig, RedisCoordinator};
use botfleet_store::{Keyring, Store};
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
    /// Redis of the fleet. Absent: embedded mode (one worker, in-memory coordination). In
    /// sentinel mode, the Sentinels' URLs, comma-separated.
    #[arg(long, env = "BOTFLEET_REDIS_URL", hide_env_values = true)]
    pub(crate) redis_url: Option<String>,
    /// How --redis-url is read: `standalone` (one Redis) or `sentinel` (Redis Sentinels that
    /// name the primary; a failover is followed within seconds).
    #[arg(
        long,
        env = "BOTFLEET_REDIS_MODE",
        value_enum,
        default_value = "standalone"
    )]
    pub(crate) redis_mode: RedisModeArg,
    /// The name the Sentinels monitor the fleet's primary under (sentinel mode).
    #[arg(long, env = "BOTFLEET_REDIS_SENTINEL_MASTER", value_name = "NAME")]
    pub(crate) redis_sentinel_master: Option<String>,
    /// How many replicas must have a grant (a bot's claim, a chat's turn) before a worker acts
    /// on it: a failover may promote a replica that missed the primary's last writes. Fewer
    /// within the call's time: the grant is asked for again. Default 1 in sentinel mode (a
    /// primary with no replica attached grants nothing), 0 for one Redis.
    #[arg(
        long,
        env = "BOTFLEET_REDIS_MIN_REPLICAS",
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(0..=16)
    )]
    pub(crate) redis_min_replicas: Option<u32>,
    /// How many coordination groups the fleet's Redis keys are split into: each group has a
    /// hash tag and a view of the workers' liveness of its own, so a Redis Cluster can spread
    /// them over its primaries; a worker renews in every group. Every worker of a fleet must
    /// use the same number: one whose number differs from the live fleet's does not start.
    /// Default 1 (the layout of fleets before groups).
    #[arg(
        long,
        env = "BOTFLEET_COORD_GROUPS",
        value_name = "G",
        value_parser = clap::value_parser!(u16).range(1..=1024)
    )]
    pub(crate) coord_groups: Option<u16>,
    /// Prefix of every Redis key of this fleet.
    #[arg(long, env = "BOTFLEET_PREFIX", default_value = "botfleet")]
    pub(crate) prefix: String,
    /// A file of secret keys (64 hex characters each, one per line, as `openssl rand -hex 32`
    /// prints) sealing tokens and signing secrets in the registry: the first seals, all open.
    /// `BOTFLEET_SECRET_KEY` gives the key itself. Without either, they are stored in plain
    /// text.
    #[arg(long, env = "BOTFLEET_SECRET_KEY_FILE", value_name = "FILE")]
    pub(crate) secret_key_file: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for Backends {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backends")
            .field("database_url", &"<redacted>")
            .field("redis_url", &self.redis_url.as_ref().map(|_| "<redacted>"))
            .field("redis_mode", &self.redis_mode)
            .field("redis_sentinel_master", &self.redis_sentinel_master)
            .field("redis_min_replicas", &self.redis_min_replicas)
            .field("coord_groups", &self.coord_groups)
            .field("prefix", &self.prefix)
            .field("secret_key_file", &self.secret_key_file)
            .finish()
    }
}

impl Backends {
    pub(crate) async fn store(&self) -> anyhow::Result<Arc<dyn Store>> {
        botfleet_store::open_with(&self.database_url, self.keyring()?)
            .await
            .context("opening the bot registry (--database-url)")
    }

    /// The secret keys: from `--secret-key-file`, else `BOTFLEET_SECRET_KEY`, else none.
    pub(crate) fn keyring(&self) -> anyhow::Result<Arc<Keyring>> {
        if let Some(path) = &self.secret_key_file {
            return Ok(Keyring::from_file(path)?);
        }
        match std::env::var("BOTFLEET_SECRET_KEY") {
            Ok(text) => Ok(Keyring::from_text(&text, "BOTFLEET_SECRET_KEY")?),
            Err(_) => Ok(Keyring::none()),
        }
    }

    /// What connecting to Redis is called in errors.
    fn connecting(&self) -> &'static str {
        match self.redis_mode {
            RedisModeArg::Standalone => "connecting to Redis (--redis-url)",
            RedisModeArg::Sentinel => "connecting to Redis through its Sentinels (--redis-url)",
        }
    }

    /// The fleet's coordinator for commands that act on the fleet (not a worker's), when
    /// `--redis-url` is given.
    pub(crate) async fn redis(&self) -> anyhow::Result<Option<Arc<dyn Coordinator>>> {
        let Some(config) = self.redis_config()? else {
            return Ok(None);
        };
        let what = self.connecting();
        let c = RedisCoordinator::connect(config.clone())
            .await
            .context(what)?;
        if self.coord_groups.is_some() {
            return Ok(Some(Arc::new(c)));
        }
        // A command that reads the fleet (status, owners) without `--coord-groups` reads it
        // with the groups its workers use.
        match c
            .fleet_groups()
            .await
            .context("reading the fleet's number of coordination groups from Redis")?
        {
            Some(g) if g != c.keyspace().groups() => {
                let c = RedisCoordinator::connect(config.groups(g))
                    .await
                    .context(what)?;
                Ok(Some(Arc::new(c)))
            }
            _ => Ok(Some(Arc::new(c))),
        }
    }

    /// The fleet's coordinator for a worker, when `--redis-url` is given: its groups are
    /// `--coord-groups` (default 1), and a fleet using another number refuses it.
    pub(crate) async fn redis_worker(&self) -> anyhow::Result<Option<Arc<dyn Coordinator>>> {
        let Some(config) = self.redis_config()? else {
            return Ok(None);
        };
        let c = RedisCoordinator::connect(config)
            .await
            .context(self.connecting())?;
        Ok(Some(Arc::new(c)))
    }

    /// The coordinator's settings from the flags, when `--redis-url` is given; the mode's
    /// flags are checked to fit together.
    pub(crate) fn redis_config(&self) -> anyhow::Result<Option<RedisConfig>> {
        let master = self
            .redis_sentinel_master
            .as_deref()
            .map(str::trim)
            .filter(|m| !m.is_empty());
        let Some(url) = &self.redis_url else {
            if self.redis_mode != RedisModeArg::Standalone || master.is_some() {
                anyhow::bail!("--redis-mode sentinel and --redis-sentinel-master need --redis-url (the Sentinels)");
            }
            if self.redis_min_replicas.is_some() {
                anyhow::bail!("--redis-min-replicas needs --redis-url (without it there is no Redis and no replica)");
            }
            if self.coord_groups.is_some() {
                anyhow::bail!("--coord-groups needs --redis-url (without it one worker coordinates in memory, with no groups)");
            }
            return Ok(None);
        };
        let mut config = RedisConfig::new(url.clone()).prefix(self.prefix.clone());
        if let Some(n) = self.redis_min_replicas {
            config = config.min_replicas(n);
        }
        if let Some(g) = self.coord_groups {
            config = config.groups(g);
        }
        match (self.redis_mode, master) {
            (RedisModeArg::Standalone, None) => Ok(Some(config)),
            (RedisModeArg::Standalone, Some(_)) => anyhow::bail!(
                "--redis-sentinel-master is for --redis-mode sentinel (the mode is standalone)"
            ),
            (RedisModeArg::Sentinel, Some(m)) => Ok(Some(config.sentinel(m))),
            (RedisModeArg::Sentinel, None) => anyhow::bail!(
                "--redis-mode sentinel needs --redis-sentinel-master NAME (the name the Sentinels monitor the primary under)"
            ),
        }
    }

    /// The SQLite file path, when the registry is one.
    pub(crate) fn sqlite_path(&self) -> Option<std::path::PathBuf> {
        self.database_url
            .strip_prefix("sqlite://")
            .filter(|p| !p.is_empty())
            .map(std::path::PathBuf::from)
    }
}

/// A worker's control API, for `bots` and `fleet` commands that go through it instead of the
/// database (`--api-url URL`; on `bots add`/`update`, where `--api-url` is the platform's,
/// `--worker-url`; both read `BOTFLEET_API_URL`).
#[derive(Clone, Args)]
pub(crate) struct Remote {
    /// A worker's control API (e.g. `http://worker-1:8080`) to go through instead of the
    /// database; the worker tells the fleet.
    #[arg(long = "api-url", env = "BOTFLEET_API_URL", value_name = "URL")]
    pub(crate) url: Option<String>,
    /// A file holding the API's bearer token (`BOTFLEET_API_TOKEN` gives the token itself).
    #[arg(long, env = "BOTFLEET_API_TOKEN_FILE", value_name = "FILE")]
    pub(crate) api_token_file: Option<std::path::PathBuf>,
}

/// [`Remote`] where `--api-url` names the platform's API (`bots add`, `bots update`).
#[derive(Clone, Args)]
pub(crate) struct RemoteWorker {
    /// A worker's control API (e.g. `http://worker-1:8080`) to go through instead of the
    /// database (`--api-url` here is the platform's).
    #[arg(long = "worker-url", env = "BOTFLEET_API_URL", value_name = "URL")]
    pub(crate) url: Option<String>,
    /// A file holding the API's bearer token (`BOTFLEET_API_TOKEN` gives the token itself).
    #[arg(long, env = "BOTFLEET_API_TOKEN_FILE", value_name = "FILE")]
    pub(crate) api_token_file: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("url", &self.url.is_some())
            .finish()
    }
}

impl std::fmt::Debug for RemoteWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteWorker")
            .field("url", &self.url.is_some())
            .finish()
    }
}

impl Remote {
    /// The client, when a URL is given.
    pub(crate) fn client(&self) -> anyhow::Result<Option<ApiClient>> {
        ApiClient::new(self.url.as_deref(), self.api_token_file.as_deref())
    }
}

impl RemoteWorker {
    /// The client, when a URL is given.
    pub(crate) fn client(&self) -> anyhow::Result<Option<ApiClient>> {
        ApiClient::new(self.url.as_deref(), self.api_token_file.as_deref())
    }
}

/// A client of a worker's control API. `Debug` hides the token.
pub(crate) struct ApiClient {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl std::fmt::Debug for ApiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiClient")
            .field("base", &self.base)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl ApiClient {
    fn new(
        url: Option<&str>,
        token_file: Option<&std::path::Path>,
    ) -> anyhow::Result<Option<Self>> {
        let Some(url) = url else { return Ok(None) };
        let base = url.trim_end_matches('/');
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            anyhow::bail!("the control API URL must start with http:// or https://");
        }
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(60))
            .build()
            .context("building the HTTP client")?;
        Ok(Some(Self {
            http,
            base: base.to_owned(),
            token: api_token(token_file)?,
        }))
    }

    /// Calls `method path` under `/api/v1`; a non-2xx answer is an error with the API's
    /// message and code.
    pub(crate) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<String>,
    ) -> anyhow::Result<serde_json::Value> {
        self.call_with(method, path, body, &[]).await
    }

    /// [`ApiClient::call`] with `headers` added.
    pub(crate) async fn call_with(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<String>,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<serde_json::Value> {
        let mut r = self
            .http
            .request(method, format!("{}/api/v1{path}", self.base));
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        if let Some(t) = &self.token {
            r = r.bearer_auth(t);
        }
        if let Some(b) = body {
            r = r.header("content-type", "application/json").body(b);
        }
        let resp = r.send().await.map_err(|e| {
            anyhow::anyhow!(
                "cannot reach the control API at {}: {}",
                self.base,
                e.without_url()
            )
        })?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        let v: serde_json::Value = if text.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_str(&text).map_err(|_| {
                anyhow::anyhow!(
                    "the control API at {} answered {status} with something not JSON",
                    self.base
                )
            })?
        };
        if !status.is_success() {
            anyhow::bail!(
                "{} ({})",
                v["message"]
                    .as_str()
                    .unwrap_or("the control API refused the request"),
                v["code"].as_str().unwrap_or(status.as_str())
            );
        }
        Ok(v)
    }
}

/// The control API's token: from the file `--api-token-file` names, else
/// `BOTFLEET_API_TOKEN`; surrounding white space is dropped.
pub(crate) fn api_token(file: Option<&std::path::Path>) -> anyhow::Result<Option<String>> {
    let (text, from) = match file {
        Some(path) => (
            std::fs::read_to_string(path).with_context(|| {
                format!(
                    "reading the API token file {} (--api-token-file)",
                    path.display()
                )
            })?,
            "--api-token-file",
        ),
        None => match std::env::var("BOTFLEET_API_TOKEN") {
            Ok(t) => (t, "BOTFLEET_API_TOKEN"),
            Err(_) => return Ok(None),
        },
    };
    let token = text.trim();
    if token.is_empty() {
        anyhow::bail!("the API token ({from}) is empty");
    }
    if token.len() < 16 || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        anyhow::bail!(
            "the API token ({from}) must be at least 16 characters without white space (e.g. `openssl rand -hex 32`)"
        );
    }
    Ok(Some(token.to_owned()))
}

/// `--redis-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum RedisModeArg {
    /// One Redis at --redis-url.
    Standalone,
    /// --redis-url lists Redis Sentinels; the keys live on the primary they name.
    Sentinel,
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
