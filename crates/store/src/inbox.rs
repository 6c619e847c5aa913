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

/// What an entry of a bot's journal is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EntryKind {
    /// Something a platform delivered (a message, a command, a press, an edit).
    Event,
    /// A message the backend asked the bot to send (`POST /api/v1/bots/{id}/messages`): it
    /// takes its place in its chat's turns like an event, and calls no handler.
    Send,
}

/// How the key of a backend send starts (no platform's delivery key starts so).
pub const SEND_KEY_PREFIX: &str = "send:";

/// How long a backend send's entry is kept after it ended: a repeat of its
/// `Idempotency-Key` within this window finds it, and sends nothing again.
pub const SEND_KEEP_MS: i64 = 24 * 3_600_000;

/// The journal key of a backend send under the client's `Idempotency-Key` (per bot: keys
/// are a bot's own): the key hashed, so what a client chose is not stored as it is.
pub fn send_key(idempotency_key: &str) -> String {
    format!("{SEND_KEY_PREFIX}{}", crate::held::digest(idempotency_key))
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
    /// Received while its chat was paused (handed to a person, see
    /// [`ChatPause`](crate::ChatPause)): recorded, not answered by the bot. Kept as long as an
    /// undeliverable entry.
    Paused,
}

impl InboxState {
    /// The lowercase name, as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            InboxState::Pending => "pending",
            InboxState::Done => "done",
            InboxState::Undeliverable => "undeliverable",
            InboxState::Paused => "paused",
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
            "paused" => Ok(InboxState::Paused),
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
    /// Its arrival, in µs since the Unix epoch: the bot's entries in order (see
    /// [`Store::journal_put`](crate::Store::journal_put)).
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

impl InboxEntry {
    /// What the entry is: a backend send (its key made by [`send_key`]) or an event.
    pub fn kind(&self) -> EntryKind {
        Self::kind_of(&self.key)
    }

    /// What the entry of key `key` is.
    pub fn kind_of(key: &str) -> EntryKind {
        if key.starts_with(SEND_KEY_PREFIX) {
            EntryKind::Send
        } else {
            EntryKind::Event
        }
    }
}

/// How an entry ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InboxOutcome {
    /// Answered, or nothing to answer.
    Done,
    /// Given up on, with why (never a token or the message's text).
    Undeliverable(String),
    /// Not answered: its chat is paused ([`InboxState::Paused`]).
    Paused,
}

/// What journaling one item did ([`Store::journal_put`](crate::Store::journal_put)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Journaled {
    /// Recorded now, pending: a turn of its chat answers it.
    New,
    /// Recorded before (a redelivery): left as it was.
    Known,
    /// Recorded now as [`InboxState::Paused`]: its chat is paused, no turn answers it.
    Paused,
}

impl Journaled {
    /// Whether a turn must answer it (recorded now, pending).
    pub fn is_new(self) -> bool {
        self == Journaled::New
    }
}

/// A bot's inbox at a glance.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InboxStats {
    /// Entries waiting to be answered (sends from the backend among them).
    pub pending: u64,
    /// Entries given up on (kept until pruned).
    pub undeliverable: u64,
    /// Pending entries whose turn is held open for an answer that comes later.
    pub held: u64,
    /// The bot's chats paused now (counted under the bot's own id, not its slices'), see
    /// [`ChatPause`](crate::ChatPause).
    pub paused_chats: u64,
    /// The bot's sends from the backend kept now (each is kept [`SEND_KEEP_MS`] after it
    /// ends), by how they stand.
    pub sends: SendCounts,
}

/// A bot's sends from the backend, by how they stand.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendCounts {
    /// Waiting for, or in, their chat's turn.
    pub queued: u64,
    /// Sent.
    pub sent: u64,
    /// Given up on (the platform refused, or failing past the retry window).
    pub failed: u64,
}

impl SendCounts {
    /// Every send counted.
    pub fn total(&self) -> u64 {
        self.queued + self.sent + self.failed
    }
}

impl std::ops::AddAssign for SendCounts {
    fn add_assign(&mut self, o: Self) {
        self.queued += o.queued;
        self.sent += o.sent;
        self.failed += o.failed;
    }
}
