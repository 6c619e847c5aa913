//! A chat's log, as a desk reads it: what the chat's users sent (its journal entries), the
//! sends from the backend, and what the bot's turns said, in the order they were recorded,
//! each with a number from one counter per chat. A reader keeps the last number it saw (its
//! cursor) and asks for what came after: numbers are taken in the writing transaction and
//! commit in order, so nothing recorded later is ever numbered below a number already read.
//!
//! Kept as long as the inbox keeps its entries (what was said: as long as answered entries).

use crate::{InboxEntry, InboxState, StoreError};

/// What an item of a chat's log is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChatEventKind {
    /// An event a user sent (a message, a command, a press, an edit), as journaled.
    Received,
    /// A send from the backend (a person at a desk, or the tenant's backend), as asked.
    Send,
    /// Something a turn of the bot did in the chat (one action as the handler gave it: a
    /// message sent, an edit, a file), recorded with the turn's end.
    Said,
}

impl ChatEventKind {
    /// The lowercase name (the events API's `type`).
    pub fn as_str(self) -> &'static str {
        match self {
            ChatEventKind::Received => "received",
            ChatEventKind::Send => "send",
            ChatEventKind::Said => "said",
        }
    }
}

/// One item of a chat's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatEvent {
    /// Its number in the chat's log (from 1; gaps where a number was taken for nothing, a
    /// redelivery say): the cursor to read after.
    pub n: u64,
    /// What it is.
    pub kind: ChatEventKind,
    /// The journal entry's key: the entry itself, or for [`ChatEventKind::Said`] the entry
    /// whose turn said it.
    pub entry: String,
    /// The event or the send as journaled (JSON), or what was said (one action, JSON).
    pub body: String,
    /// Where the entry is in its life now (`None` for what was said).
    pub state: Option<InboxState>,
    /// Unix ms when it was recorded.
    pub at_ms: i64,
}

/// The most items one read of a chat's log answers.
pub const MAX_CHAT_EVENTS: usize = 1000;

/// An item as the SQL backends read it: `said` whether it is what a turn said, `state` the
/// entry's (`None` for what was said).
pub(crate) fn event(
    n: i64,
    said: bool,
    entry: String,
    body: String,
    state: Option<&str>,
    at_ms: i64,
) -> Result<ChatEvent, StoreError> {
    let kind = match (said, InboxEntry::kind_of(&entry)) {
        (true, _) => ChatEventKind::Said,
        (false, crate::EntryKind::Event) => ChatEventKind::Received,
        (false, crate::EntryKind::Send) => ChatEventKind::Send,
    };
    let state = match state {
        Some(s) => Some(
            s.parse::<InboxState>()
                .map_err(|e| StoreError::backend("read a chat's log", e))?,
        ),
        None => None,
    };
    Ok(ChatEvent {
        n: n.max(0).unsigned_abs(),
        kind,
        entry,
        body,
        state,
        at_ms,
    })
}
