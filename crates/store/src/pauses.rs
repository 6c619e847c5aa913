//! Chats handed to a person: while a chat of a bot is paused, its handler is not called for
//! it on any worker. What the chat's users write is still journaled, acknowledged to the
//! platform and recorded as [`InboxState::Paused`](crate::InboxState::Paused) (readable, not
//! lost, never answered by the bot); sends from the backend go on, so a person answers from a
//! desk. A pause ends when it is lifted, or by itself at its `until_ms`.

/// A chat's pause, as recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatPause {
    /// The chat (as the bot's journal names it).
    pub chat: String,
    /// Unix ms when the pause ends by itself (`None`: when it is lifted).
    pub until_ms: Option<i64>,
    /// Why, as the operator gave it (shown to people; at most [`MAX_PAUSE_REASON`] bytes).
    pub reason: Option<String>,
    /// Unix ms when it was paused.
    pub paused_at_ms: i64,
}

impl ChatPause {
    /// Whether the pause is in effect at `now_ms` (unix ms).
    pub fn in_effect(&self, now_ms: i64) -> bool {
        self.until_ms.is_none_or(|u| u > now_ms)
    }
}

/// The longest reason a pause keeps (bytes).
pub const MAX_PAUSE_REASON: usize = 500;

/// What lifting a chat's pause did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resumed {
    /// The pause lifted (`None`: the chat was not paused, or its pause had ended by itself).
    pub pause: Option<ChatPause>,
    /// The entries recorded paused that were made pending again to be answered in order (the
    /// resume asked for a replay), oldest first: `(unit, key)`.
    pub replayed: Vec<(botfleet_core::BotId, String)>,
}
