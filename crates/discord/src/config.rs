//! Settings of the Discord connector.

use std::time::Duration;

/// How the connector talks to Discord.
#[derive(Clone, Debug)]
pub struct DiscordConfig {
    /// Connecting a WebSocket or a REST call: give up after this long.
    pub connect_timeout: Duration,
    /// A REST call: give up after this long.
    pub request_timeout: Duration,
    /// Read buffer of each shard's WebSocket. Idle shards hold it: sized for chat traffic.
    pub read_buffer: usize,
    /// Largest gateway message accepted (READY and GUILD_CREATE of large guilds are big).
    pub max_message: usize,
    /// Discord's rule: at most one IDENTIFY per this long per bucket (`shard % max_concurrency`).
    pub identify_spacing: Duration,
    /// How often the stored checkpoint (sessions and sequence numbers) is written behind.
    pub checkpoint_every: Duration,
    /// Most REST calls in flight per process.
    pub max_concurrent_calls: usize,
}

impl Default for DiscordConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(15),
            read_buffer: 4 * 1024,
            max_message: 16 << 20,
            identify_spacing: Duration::from_secs(5),
            checkpoint_every: Duration::from_secs(3),
            max_concurrent_calls: 128,
        }
    }
}
