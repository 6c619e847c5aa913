//! The inbox: every message a bot receives is recorded here before the platform is told it
//! was received, and stays until it is answered (or found undeliverable). A worker that takes
//! the bot over replays what is still pending.

use std::{fmt, str::FromStr};

use botfleet_core::BotId;

/// A message to record, as a platform delivered it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InboxItem {
    /// The platform's id of the delivery (Telegram `update_id`, Slack `event_id`): a key seen
    /// before is a redelivery and is not recorded again.
    pub key: String,
    /// The conversation it belongs to (its per-chat queue).
    pub chat: String,
    /// The message, serialised (the runtime's normalised `Inbound` as JSON).
    pub message: String,
}

/// Where an inbox entry is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InboxState {
    /// Recorded, not answered yet.
    Pending,
    /// Answered (or nothing to answer).
    Done,
    /// Given up on: the handler or the platform refused it, or kept failing past the retry
    /// window. Kept for the operator.
    Undeliverable,
}

impl InboxState {
    /// The lowercase name, as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            InboxState::Pending => "pending",
            InboxState::Done => "done",
            InboxState::Undeliverable => "undeliverable",
        }
    }
}

impl fmt::Display for InboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for InboxState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pending" => Ok(InboxState::Pending),
            "done" => Ok(InboxState::Done),
            "undeliverable" => Ok(InboxState::Undeliverable),
            other => Err(format!("unknown inbox state {other:?}")),
        }
    }
}

/// A recorded message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InboxEntry {
    /// The bot that received it.
    pub bot: BotId,
    /// The platform's delivery id.
    pub key: String,
    /// Arrival order within the bot (grows with every new entry).
    pub seq: u64,
    /// Its conversation.
    pub chat: String,
    /// The message, serialised.
    pub message: String,
    /// Where it is in its life.
    pub state: InboxState,
    /// Why it is undeliverable.
    pub error: Option<String>,
    /// Unix ms when it was recorded.
    pub received_at_ms: i64,
}

/// How an entry ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InboxOutcome {
    /// Answered, or nothing to answer.
    Done,
    /// Given up on, with why (never a token or the message's text).
    Undeliverable(String),
}

/// A bot's inbox at a glance.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InboxStats {
    /// Entries waiting to be answered.
    pub pending: u64,
    /// Entries given up on (kept until pruned).
    pub undeliverable: u64,
}
