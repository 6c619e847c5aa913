//! Discord gateway bots for botfleet.
//!
//! A bot is one gateway session per shard: `GET /gateway/bot` gives the URL, the recommended
//! shard count and the identify budget; each shard connects with `?v=10&encoding=json`, answers
//! HELLO with heartbeats, IDENTIFYs (through a gate that keeps one IDENTIFY per 5 s per bucket,
//! fleet-wide when the runtime backs it with the coordinator) or RESUMEs a stored session, and
//! turns `MESSAGE_CREATE` dispatches into normalized messages. Replies go out with
//! `POST /channels/{id}/messages`.

mod client;
mod config;
mod connector;
mod descriptor;
mod error;
#[cfg(feature = "fake")]
pub mod fake;
mod gateway;
mod inbound;
mod interactions;
mod outbound;
mod routes;

pub use client::{DiscordApi, DiscordClient, GatewayInfo, DEFAULT_API_URL};
pub use config::DiscordConfig;
pub use connector::{shard_of_guild, DiscordConnector, IdentifyGate, LocalGate};
pub use descriptor::DESCRIPTOR;
pub use error::DiscordError;
pub use gateway::{Checkpoint, ShardSession, INTENTS};
#[cfg(feature = "fake")]
pub use inbound::iso_of_unix_ms;
pub use inbound::{parse_edit, parse_message};
pub use interactions::parse_interaction;
pub use outbound::limits;
pub use outbound::CAPS;

/// The guard of `m`, also after a panic elsewhere poisoned it (what it guards stays usable).
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
