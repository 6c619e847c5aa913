//! Settings of the Telegram client.

use std::time::Duration;

/// The public Bot API endpoint.
pub const DEFAULT_API_URL: &str = "https://api.telegram.org";

/// Settings shared by every bot a [`TelegramClient`](crate::TelegramClient) serves.
#[derive(Clone, Debug)]
pub struct TelegramConfig {
    /// Long-poll timeout sent as `getUpdates`' `timeout`. Default 25 s; 0–50 s.
    pub poll_timeout: Duration,
    /// How long a request may take beyond the poll timeout before it is abandoned. Default
    /// 10 s.
    pub request_slack: Duration,
    /// Updates per `getUpdates`. Default 100; 1–100.
    pub batch: u32,
    /// Idle connections kept per host for `getMe`, `sendMessage` and `deleteWebhook` (every
    /// bot's long poll has a connection of its own). Default 128.
    pub pool_idle_per_host: usize,
    /// Those calls in flight at once, over every bot of the client; more wait their turn.
    /// A burst (every bot answering at once) then reuses a few warm connections instead of
    /// opening one per bot: each costs tens of KiB and, over TLS, a handshake. Default 128.
    pub max_concurrent_calls: usize,
    /// Where Telegram reaches the fleet's hooks address (`--public-url`): webhook bots are
    /// registered at `{public_url}/hooks/telegram/{bot}`. Default none (webhook bots fail
    /// with a clear message).
    pub public_url: Option<String>,
    /// PEM certificates trusted besides the public web roots: a self-hosted Bot API server
    /// behind a private CA. Default none.
    pub extra_root_certs_pem: Option<String>,
}

impl Default for TelegramConfig {
    fn default() -> Self {
        Self {
            poll_timeout: Duration::from_secs(25),
            request_slack: Duration::from_secs(10),
            batch: 100,
            pool_idle_per_host: 128,
            max_concurrent_calls: 128,
            extra_root_certs_pem: None,
            public_url: None,
        }
    }
}
