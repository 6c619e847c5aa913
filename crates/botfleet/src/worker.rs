//! `botfleet worker`.

use std::{net::SocketAddr, process::ExitCode, sync::Arc, time::Duration};

use anyhow::Context;
use botfleet_coord::{Coordinator, MemoryHub};
use botfleet_core::WorkerId;
use botfleet_runtime::{http, InstanceLock, Worker, WorkerConfig};
use clap::Args;
use tracing::info;

use crate::common::{init_logs, Backends};

fn positive_rate(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if v.is_finite() && v > 0.0 && v <= 100_000.0 {
        Ok(v)
    } else {
        Err("must be above 0 and at most 100000".into())
    }
}

fn worker_id(s: &str) -> Result<WorkerId, String> {
    WorkerId::new(s).map_err(|e| e.to_string())
}

/// Flags of `botfleet worker`; each also reads a `BOTFLEET_*` variable.
#[derive(Debug, Args)]
pub(crate) struct WorkerArgs {
    #[command(flatten)]
    backends: Backends,
    /// This worker's id [default: random]
    #[arg(long, env = "BOTFLEET_WORKER_ID", value_parser = worker_id)]
    worker_id: Option<WorkerId>,
    /// Address of /healthz, /readyz, /metrics and the control API /api/v1 (port 0 picks a
    /// free one).
    #[arg(long, env = "BOTFLEET_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    http_addr: SocketAddr,
    /// A file holding the control API's bearer token (`BOTFLEET_API_TOKEN` gives the token
    /// itself). Without either, the API answers loopback clients only.
    #[arg(long, env = "BOTFLEET_API_TOKEN_FILE")]
    api_token_file: Option<std::path::PathBuf>,
    /// Most connections this worker holds (1-1000000): a Telegram or Slack bot counts 1, a
    /// Discord bot (or slice) its shards.
    #[arg(long, env = "BOTFLEET_CAPACITY", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    capacity: u32,
    /// Liveness lease in ms (1000-600000): a dead worker's bots move after at most this.
    #[arg(long, env = "BOTFLEET_LEASE_MS", default_value_t = 15_000,
          value_parser = clap::value_parser!(u64).range(1_000..=600_000))]
    lease_ms: u64,
    /// Fleet-wide bot starts per second for every platform (above 0, at most 100000)
    /// [default: each platform's own: --telegram-connect-rate, --slack-connect-rate]
    #[arg(long, env = "BOTFLEET_CONNECT_RATE", value_parser = positive_rate)]
    connect_rate: Option<f64>,
    /// Fleet-wide Telegram bot starts per second [default: --connect-rate, else 10000]
    /// (Telegram limits per token, so this only keeps a cold fleet from stampeding the store).
    #[arg(long, env = "BOTFLEET_TELEGRAM_CONNECT_RATE", value_parser = positive_rate)]
    telegram_connect_rate: Option<f64>,
    /// Fleet-wide Slack bot starts per second [default: --connect-rate, else 1000] (Slack
    /// limits per app).
    #[arg(long, env = "BOTFLEET_SLACK_CONNECT_RATE", value_parser = positive_rate)]
    slack_connect_rate: Option<f64>,
    /// Fleet-wide Discord bot starts per second [default: --connect-rate, else 1000]
    /// (IDENTIFYs are paced apart: one per 5 s per bot and bucket).
    #[arg(long, env = "BOTFLEET_DISCORD_CONNECT_RATE", value_parser = positive_rate)]
    discord_connect_rate: Option<f64>,
    /// How long one call of a bot's handler may take, in seconds (1-900), before it is cut
    /// off and the event is tried again as its next `attempt`; a bot's `handler_timeout_s`
    /// overrides it.
    #[arg(long, env = "BOTFLEET_HANDLER_TIMEOUT_S", default_value_t = 120,
          value_parser = clap::value_parser!(u64).range(1..=u64::from(botfleet_core::MAX_HANDLER_TIMEOUT_S)))]
    handler_timeout_s: u64,
    /// How long a turn whose handler answered 202 waits for its answer through
    /// `POST /api/v1/replies/{reply_token}`, in seconds (10-86400), before the event is recorded
    /// undeliverable (`async reply expired`) and the chat goes on; a bot's `async_reply_ttl_s`
    /// overrides it.
    #[arg(long, env = "BOTFLEET_ASYNC_REPLY_TTL_S", default_value_t = 900,
          value_parser = clap::value_parser!(u64).range(u64::from(*botfleet_core::ASYNC_REPLY_TTL_S.start())..=u64::from(*botfleet_core::ASYNC_REPLY_TTL_S.end())))]
    async_reply_ttl_s: u64,
    /// Changes to the platforms' documented send limits, which the fleet keeps for every bot
    /// through the coordinator (see docs/platforms.md): comma-separated `off` (none kept),
    /// `PLATFORM=off`, `PLATFORM.SCOPE=off` or `PLATFORM.SCOPE=CALLS/SECONDS[:BURST]`, e.g.
    /// `whatsapp.number=250/1,telegram=off` (a Bot API server of one's own)
    /// [default: every documented limit kept]
    #[arg(long, env = "BOTFLEET_RATE_LIMITS",
          value_parser = clap::value_parser!(botfleet_runtime::RateLimits))]
    rate_limits: Option<botfleet_runtime::RateLimits>,
    /// How long one message's handler (or send) is retried through transient failures, in
    /// seconds (0-86400), before it is recorded as undeliverable.
    #[arg(long, env = "BOTFLEET_HANDLER_RETRY_S", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(0..=86_400))]
    handler_retry_s: u64,
    /// Turns at work at once over every bot of this worker (1-65536): reading a message,
    /// a quick handler, sending, recording. More wait for a slot in order; a handler still
    /// working after 250 ms gives its slot back until it answers, so slow handlers hold none.
    /// Bounds what a burst over every bot costs in memory, which the allocator keeps after.
    #[arg(long, env = "BOTFLEET_TURN_SLOTS", default_value_t = 128,
          value_parser = clap::value_parser!(u32).range(1..=65_536))]
    turn_slots: u32,
    /// Telegram long-poll timeout in seconds (0-50). Longer polls cost less: an idle bot
    /// polls once per timeout (measured: 45 s polls ~0.03 % of a core per 1,000 idle bots,
    /// 9 s polls ~1.2 %); HTTP intermediaries often cut requests idle for 60 s.
    #[arg(long, env = "BOTFLEET_POLL_TIMEOUT_S", default_value_t = 45,
          value_parser = clap::value_parser!(u64).range(0..=50))]
    poll_timeout_s: u64,
    /// How often the registry is re-read besides lifecycle events, in ms
    /// [default: 2000 embedded, 30000 in a fleet]
    #[arg(long, env = "BOTFLEET_REGISTRY_REFRESH_MS",
          value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    registry_refresh_ms: Option<u64>,
    /// Where platforms' webhooks are served (`/hooks/{platform}/{bot}`): the only port to
    /// expose publicly, behind the load balancer that spreads requests over every worker.
    #[arg(long, env = "BOTFLEET_HOOKS_ADDR", default_value = "127.0.0.1:8081")]
    hooks_addr: SocketAddr,
    /// How platforms reach the hooks address (the load balancer in front of every worker),
    /// e.g. `https://bots.example.com`: webhook bots are registered at
    /// `{public-url}/hooks/{platform}/{bot}`.
    #[arg(long, env = "BOTFLEET_PUBLIC_URL", value_parser = public_url)]
    public_url: Option<String>,
    /// How handlers reach the workers' API (`/api/v1/files/…` links to the files users
    /// send are built on it), e.g. `https://bots-api.example.com` behind a load balancer
    /// [default: this worker's --http-addr]
    #[arg(long, env = "BOTFLEET_API_PUBLIC_URL", value_parser = public_url)]
    api_public_url: Option<String>,
    /// How long a file link stays valid, in seconds (60-604800).
    #[arg(long, env = "BOTFLEET_FILE_LINK_TTL_S", default_value_t = 3_600,
          value_parser = clap::value_parser!(u64).range(60..=604_800))]
    file_link_ttl_s: u64,
    /// A webhook message waiting this long (ms) for its chat's turn is reported (log and
    /// `botfleet_turn_waits_exceeded_total`) and goes on waiting; it is never dropped.
    #[arg(long, env = "BOTFLEET_TURN_WAIT_MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    turn_wait_ms: u64,
    /// A bot whose platform stays unreachable from this worker this long, in ms, is handed to
    /// another worker (which placement prefers for it for 10 minutes); 0 never moves it.
    #[arg(long, env = "BOTFLEET_TRANSPORT_DOWN_MS", default_value_t = 120_000,
          value_parser = clap::value_parser!(u64).range(0..=86_400_000))]
    transport_down_ms: u64,
    /// How often (s) a Discord bot on the recommended shard count (`--shards auto` with
    /// slices) reads the recommendation again; another count restarts the bot as a whole.
    #[arg(long, env = "BOTFLEET_DISCORD_SHARD_RECOUNT_S", default_value_t = 3_600,
          value_parser = clap::value_parser!(u64).range(1..=604_800))]
    discord_shard_recount_s: u64,
    /// The WhatsApp Web version device-link bots announce (e.g. 2.3000.1017); unset, each
    /// session asks web.whatsapp.com for the current one once a day.
    #[arg(long, env = "BOTFLEET_WHATSAPP_WEB_VERSION", value_parser = web_version)]
    whatsapp_web_version: Option<String>,
    /// Show the message counts of this many of the busiest bots in /metrics (0-1000), as
    /// `botfleet_bot_messages_received_total{bot_id}`: a bounded label set.
    #[arg(long, env = "BOTFLEET_METRICS_TOP_BOTS", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(0..=1_000))]
    metrics_top_bots: u32,
    /// Async runtime threads (1-256). One thread serves thousands of idle long polls with the
    /// fewest wake-ups; to use more cores, run more workers (or raise this for busy bots).
    #[arg(long, env = "BOTFLEET_WORKER_THREADS", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=256))]
    worker_threads: u16,
}

impl WorkerArgs {
    pub(crate) fn worker_threads(&self) -> usize {
        usize::from(self.worker_threads)
    }
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

pub(crate) async fn run(a: WorkerArgs) -> anyhow::Result<ExitCode> {
    init_logs("info");
    let id = match a.worker_id {
        Some(id) => id,
        None => WorkerId::new(format!("w-{}", random_hex()))?,
    };
    let keys = a.backends.keyring()?;
    if keys.is_empty() {
        tracing::warn!(
            "tokens and signing secrets are stored in plain text: give --secret-key-file or \
             BOTFLEET_SECRET_KEY to encrypt them"
        );
    } else {
        info!(keys = ?keys.key_ids(), "tokens and signing secrets are encrypted at rest");
    }
    let store = a.backends.store().await?;
    // A registry the keys cannot open is a configuration error: say so now, not per bot.
    if let Err(e @ botfleet_store::StoreError::Secrets(_)) =
        store.list_bots(&botfleet_store::BotFilter::default()).await
    {
        return Err(anyhow::Error::new(e).context("reading the bot registry"));
    }
    let fleet = a.backends.redis_worker().await?;
    let embedded = fleet.is_none();
    // Embedded: one worker per database; the lock is released by the OS even on kill -9.
    let _lock = match (&fleet, a.backends.sqlite_path()) {
        (None, Some(path)) => Some(InstanceLock::acquire(&path).map_err(anyhow::Error::msg)?),
        _ => None,
    };
    let coord: Arc<dyn Coordinator> = match fleet {
        Some(c) => c,
        None => Arc::new(MemoryHub::new().coordinator()),
    };
    let mut cfg = WorkerConfig::new(id.clone());
    cfg.capacity = a.capacity;
    cfg.lease = Duration::from_millis(a.lease_ms);
    // A platform's own flag, else --connect-rate for every platform, else its default.
    if let Some(r) = a.connect_rate {
        cfg.connect_rate = r;
        cfg.connect_rates.clear();
    }
    for (p, own) in [
        (botfleet_core::Platform::Telegram, a.telegram_connect_rate),
        (botfleet_core::Platform::Slack, a.slack_connect_rate),
        (botfleet_core::Platform::Discord, a.discord_connect_rate),
    ] {
        if let Some(r) = own {
            cfg.connect_rates.insert(p, r);
        }
    }
    cfg.handler_timeout = Duration::from_secs(a.handler_timeout_s);
    cfg.async_reply_ttl = Duration::from_secs(a.async_reply_ttl_s);
    if let Some(r) = &a.rate_limits {
        cfg.rate_limits = r.clone();
    }
    cfg.handler_retry_for = Duration::from_secs(a.handler_retry_s);
    cfg.turn_slots = a.turn_slots as usize;
    cfg.transport_down = Duration::from_millis(a.transport_down_ms);
    cfg.shard_recount_every = Duration::from_secs(a.discord_shard_recount_s);
    cfg.whatsapp_web_version = a.whatsapp_web_version.clone();
    cfg.turn_wait = Duration::from_millis(a.turn_wait_ms);
    cfg.file_link_ttl = Duration::from_secs(a.file_link_ttl_s);
    if let Some(u) = &a.api_public_url {
        cfg.api_public_url = u.clone();
    }
    cfg.telegram.public_url = a.public_url.clone();
    cfg.telegram.poll_timeout = Duration::from_secs(a.poll_timeout_s);
    cfg.registry_refresh = Duration::from_millis(a.registry_refresh_ms.unwrap_or(if embedded {
        2_000
    } else {
        30_000
    }));
    // Every long-polling bot holds a connection, and every connection a file descriptor.
    if let Some(limit) = open_file_limit() {
        let needed = u64::from(a.capacity).saturating_add(FD_HEADROOM);
        if limit < needed {
            tracing::warn!(
                open_file_limit = limit,
                capacity = a.capacity,
                "the open-file limit is below the capacity plus {FD_HEADROOM}: bots beyond about \
                 {} on this worker will fail to connect; raise `ulimit -n` (LimitNOFILE in \
                 systemd) or lower --capacity",
                limit.saturating_sub(FD_HEADROOM)
            );
        }
    }
    let token = crate::common::api_token(a.api_token_file.as_deref())?;
    if token.is_none() {
        tracing::warn!(
            "the control API has no token (--api-token-file, BOTFLEET_API_TOKEN): it answers \
             loopback clients only"
        );
    }
    let mut worker = Worker::new(cfg, coord.clone(), store.clone())?;
    let hooks = worker.hooks();
    let sends = worker.sends();
    let files = worker.files();
    let replies = worker.replies();
    worker.metrics().set_top_bots(a.metrics_top_bots);
    let router = http::app(http::HttpState {
        metrics: worker.metrics(),
        ready: worker.readiness(),
        worker_id: id.to_string(),
    })
    .merge(crate::api::routes(crate::api::ApiState {
        registry: crate::registry::Registry {
            store,
            fleet: Some(coord.clone()),
        },
        coord,
        mode: if embedded { "embedded" } else { "fleet" },
        journal: worker.journal(),
        token_digest: token.as_deref().map(crate::api::digest),
        fleet_cache: Default::default(),
        sends: Some(sends),
        metrics: Some(worker.metrics()),
    }))
    .merge(files.router())
    .merge(replies.router());
    let (addr, http_task) = http::serve_router(a.http_addr, router)
        .await
        .with_context(|| format!("binding the HTTP address {} (--http-addr)", a.http_addr))?;
    if a.api_public_url.is_none() {
        // Handlers on this machine reach the API where it is bound; elsewhere, the operator
        // says where (a balancer in front of every worker's --http-addr).
        let host = if addr.ip().is_unspecified() {
            botfleet_runtime::hostname()
        } else {
            addr.ip().to_string()
        };
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        files.set_public_url(&format!("http://{host}:{}", addr.port()));
    }
    let (hooks_addr, hooks_task) = http::serve_router(a.hooks_addr, hooks.router())
        .await
        .with_context(|| format!("binding the hooks address {} (--hooks-addr)", a.hooks_addr))?;
    info!(worker = %id, %addr, %hooks_addr, mode = if embedded { "embedded" } else { "fleet" }, "worker starting");
    // Machine-readable lines for scripts and tests: where the HTTP endpoints are.
    eprintln!("botfleet worker {id} hooks on http://{hooks_addr}");
    eprintln!("botfleet worker {id} listening on http://{addr}");
    worker.run(shutdown_signal()).await?;
    http_task.abort();
    hooks_task.abort();
    info!(worker = %id, "worker stopped");
    Ok(ExitCode::SUCCESS)
}

/// `--public-url`: an `http(s)://` URL without a query.
fn public_url(s: &str) -> Result<String, String> {
    let ok = (s.starts_with("https://") || s.starts_with("http://"))
        && s.len() <= 2048
        && !s.contains(['?', '#', ' '])
        && s.split("://").nth(1).is_some_and(|rest| !rest.is_empty());
    if ok {
        Ok(s.trim_end_matches('/').to_owned())
    } else {
        Err(
            "must be an http:// or https:// URL without a query, e.g. https://bots.example.com"
                .into(),
        )
    }
}

/// Descriptors a worker needs besides its bots' connections (store, Redis, HTTP server,
/// a margin for connections being replaced).
const FD_HEADROOM: u64 = 1_000;

/// The soft limit on open files, from `/proc/self/limits` (Linux); `None` when unknown or
/// unlimited.
fn open_file_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// 8 random hex characters (from the OS's randomness through std's hasher seed).
pub(crate) fn random_hex() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    format!("{:08x}", h.finish() as u32)
}

/// `--whatsapp-web-version`: three numbers, `2.3000.1017`.
fn web_version(v: &str) -> Result<String, String> {
    let parts: Vec<&str> = v.split('.').collect();
    if parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.len() <= 9 && p.bytes().all(|b| b.is_ascii_digit()))
    {
        Ok(v.to_owned())
    } else {
        Err(format!(
            "a WhatsApp Web version looks like 2.3000.1017, not {v:?}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn web_versions_are_three_numbers() {
        assert!(web_version("2.3000.1017").is_ok());
        for bad in [
            "",
            "2.3000",
            "2.3000.x",
            "2..1",
            "2.3000.1.4",
            "1234567890.1.1",
        ] {
            assert!(web_version(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_open_file_limit_is_read_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(open_file_limit().is_some_and(|n| n > 0));
        }
    }
}
