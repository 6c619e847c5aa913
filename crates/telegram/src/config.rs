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
    /// Idle connections kept per host. Default 64.
    pub pool_idle_per_host: usize,
}

impl Default for TelegramConfig {
    fn default() -> Self {
        Self {
            poll_timeout: Duration::from_secs(25),
            request_slack: Duration::from_secs(10),
            batch: 100,
            pool_idle_per_host: 64,
        }
    }
}
