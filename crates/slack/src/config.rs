//! Settings of the Slack client.

use std::time::Duration;

/// The public Web API base (methods are appended: `{api_url}auth.test`).
pub const DEFAULT_API_URL: &str = "https://slack.com/api/";

/// Settings shared by every Slack bot of a process.
#[derive(Clone, Debug)]
pub struct SlackConfig {
    /// How long one Web API call may take. Default 10 s.
    pub request_timeout: Duration,
    /// How long opening a socket may take, up to its `hello`. Default 10 s.
    pub connect_timeout: Duration,
    /// A socket on which nothing at all (not even a ping) arrived for this long is taken for
    /// dead and replaced (a half-open connection never says so). Default 60 s; Slack pings
    /// well within it.
    pub idle_timeout: Duration,
    /// WebSocket read buffer per socket, bytes. Default 2 KiB: Socket Mode bots are idle
    /// most of the time; a larger envelope is read in several chunks (the buffer grows to
    /// hold a frame as long as it needs to).
    pub read_buffer: usize,
    /// Largest WebSocket message accepted, bytes. Default 4 MiB.
    pub max_message: usize,
    /// Web API calls in flight at once over every bot of the client; more wait their turn.
    /// A quarter as many warm connections are kept between bursts (each costs ~20 KiB): a
    /// burst (every bot answering at once) reuses those and opens the rest, instead of a
    /// connection and a TLS handshake per bot. Default 128.
    pub max_concurrent_calls: usize,
}

impl SlackConfig {
    /// Warm connections kept between calls: a quarter of `max_concurrent_calls`.
    pub fn idle_connections(&self) -> usize {
        (self.max_concurrent_calls / 4).max(1)
    }
}

impl Default for SlackConfig {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            read_buffer: 2 * 1024,
            max_message: 4 << 20,
            max_concurrent_calls: 128,
        }
    }
}
