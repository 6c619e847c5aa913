//! Settings of a worker. Every value has a default and a range; the CLI maps flags and
//! `BOTFLEET_*` variables onto it.

use std::time::Duration;

use botfleet_core::WorkerId;
use botfleet_telegram::TelegramConfig;

/// Settings of one worker process.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// This worker's id (default: random).
    pub worker_id: WorkerId,
    /// Host label shown in `fleet status`.
    pub host: String,
    /// Most bots this worker runs. Default 10,000; at least 1.
    pub capacity: u32,
    /// Liveness lease. Default 15 s; 1 s – 10 min. A dead worker's bots move after at most
    /// this long.
    pub lease: Duration,
    /// Fleet-wide bot starts per second, for a platform without its own rate in
    /// `connect_rates`. Default 1,000; above 0.
    pub connect_rate: f64,
    /// Fleet-wide bot starts per second, per platform. Defaults are each platform's
    /// descriptor's `connect_rate` (Telegram 10,000, the others 1,000): the platforms' limits
    /// are per bot, not per fleet, and the limiter's job is to keep a cold start of a whole
    /// fleet from stampeding the store and the network.
    pub connect_rates: std::collections::BTreeMap<botfleet_core::Platform, f64>,
    /// Telegram client settings (poll timeout, batch). Default poll timeout 45 s: an idle bot
    /// costs one request per timeout, and the Bot API ends an older pending poll when a newer
    /// one comes, so a frozen worker's last poll never holds up the bot's next owner.
    pub telegram: TelegramConfig,
    /// How often the bot registry is re-read besides lifecycle events. Default 30 s.
    pub registry_refresh: Duration,
    /// How often the worker re-checks placement besides events. Default 1 s.
    pub reconcile_every: Duration,
    /// How long one handler call may take before it is cut off and tried again as the next
    /// attempt (`--handler-timeout-s`); a bot's own `handler_timeout_s` overrides it.
    /// Default 120 s; 1 s - 900 s.
    pub handler_timeout: Duration,
    /// How long a turn whose handler answered `202` waits for its answer
    /// (`--async-reply-ttl-s`) before the event is given up on (`async reply expired`); a
    /// bot's own `async_reply_ttl_s` overrides it. Default 900 s; 10 s - 24 h.
    pub async_reply_ttl: Duration,
    /// Changes to the platforms' documented send limits, which the fleet keeps for every
    /// bot (default: none, every documented limit kept).
    pub rate_limits: crate::RateLimits,
    /// Handlers compiled into this worker, by the name a bot's `--handler NAME` gives (a
    /// worker built as a library adds its own). Default none.
    pub handlers: crate::HandlerRegistry,
    /// How long one message's handler (or send) is retried through transient failures
    /// (unreachable, timeouts, 5xx, 429) while its chat waits and the others go on, before it
    /// is recorded as undeliverable. Default 5 min.
    pub handler_retry_for: Duration,
    /// Messages a bot holds received but not answered before it stops receiving until its
    /// chats catch up (what is received is recorded and acknowledged first). Default 1,000.
    pub max_in_flight: usize,
    /// Turns in their own work at once over every bot of the worker (reading and decoding a
    /// message, sending, recording); more wait for a slot. The handler's time is not counted,
    /// so slow handlers never hold a slot. Bounds what a burst (every bot written to at
    /// once) costs in memory, which the allocator keeps afterwards. Default 128.
    pub turn_slots: usize,
    /// A bot whose platform stays unreachable from this worker this long (transient failures
    /// only: refused, reset, timeout, 5xx) is handed to another worker, which its placement
    /// then prefers for `avoid_for`. Zero never moves it.
    pub transport_down: Duration,
    /// How long a bot moved for a transport that was down stays off this worker.
    pub avoid_for: Duration,
    /// A webhook message waiting this long for its chat's turn is reported (metric and log)
    /// and goes on waiting: never dropped. Default 10 s.
    pub turn_wait: Duration,
    /// Slack client settings.
    #[cfg(feature = "slack")]
    pub slack: botfleet_slack::SlackConfig,
    /// How Discord bots reach Discord.
    #[cfg(feature = "discord")]
    pub discord: botfleet_discord::DiscordConfig,
    /// How often slice 0 of a Discord bot on the recommended shard count (`shards` auto, split
    /// into slices) reads the recommendation again; when it changed, the bot restarts as a
    /// whole on the new count. Default 1 h (Discord changes it a few times a year).
    pub shard_recount_every: Duration,
    /// The WhatsApp Web version device-link bots announce (`2.3000.1017`); `None` asks
    /// web.whatsapp.com for the current one, once a day per session.
    pub whatsapp_web_version: Option<String>,
    /// How handlers reach the workers' API (`--api-public-url`): the file links events carry
    /// are built on it. Default `http://127.0.0.1:8080`; a worker serving its API elsewhere
    /// sets it (the CLI uses the bound HTTP address when no URL is given).
    pub api_public_url: String,
    /// How long a file link stays valid. Default 1 h.
    pub file_link_ttl: Duration,
}

impl WorkerConfig {
    /// Starts per second allowed for `p`.
    pub fn connect_rate_of(&self, p: botfleet_core::Platform) -> f64 {
        self.connect_rates
            .get(&p)
            .copied()
            .unwrap_or(self.connect_rate)
    }

    /// Defaults for `worker_id`.
    pub fn new(worker_id: WorkerId) -> Self {
        Self {
            worker_id,
            host: hostname(),
            capacity: 10_000,
            lease: Duration::from_secs(15),
            connect_rate: 1_000.0,
            connect_rates: crate::DESCRIPTORS
                .iter()
                .map(|d| (d.platform, d.connect_rate))
                .collect(),
            telegram: TelegramConfig {
                poll_timeout: Duration::from_secs(45),
                ..TelegramConfig::default()
            },
            registry_refresh: Duration::from_secs(30),
            reconcile_every: Duration::from_secs(1),
            handler_timeout: Duration::from_secs(120),
            async_reply_ttl: Duration::from_secs(900),
            rate_limits: crate::RateLimits::default(),
            handlers: crate::HandlerRegistry::default(),
            handler_retry_for: Duration::from_secs(300),
            max_in_flight: 1_000,
            turn_slots: 128,
            transport_down: Duration::from_secs(120),
            avoid_for: Duration::from_secs(600),
            turn_wait: Duration::from_secs(10),
            shard_recount_every: Duration::from_secs(3600),
            whatsapp_web_version: None,
            api_public_url: "http://127.0.0.1:8080".into(),
            file_link_ttl: Duration::from_secs(3600),
            #[cfg(feature = "slack")]
            slack: botfleet_slack::SlackConfig::default(),
            #[cfg(feature = "discord")]
            discord: botfleet_discord::DiscordConfig::default(),
        }
    }
}

/// The machine's host name, or `unknown`.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}
