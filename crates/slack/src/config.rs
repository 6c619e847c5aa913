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
    /// WebSocket read buffer per socket, bytes. Default 4 KiB: Socket Mode bots are idle
    /// most of the time, and a larger envelope is read in several chunks.
    pub read_buffer: usize,
    /// Largest WebSocket message accepted, bytes. Default 4 MiB.
    pub max_message: usize,
}

impl Default for SlackConfig {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            read_buffer: 4 * 1024,
            max_message: 4 << 20,
        }
    }
}
