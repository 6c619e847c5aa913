//! Platform-neutral messages: what providers turn wire updates into, and what handlers send.

use serde::{Deserialize, Serialize};

use crate::{ChatKey, Platform};

/// A message received by a bot, normalised across platforms.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Inbound {
    /// The platform it came from.
    pub platform: Platform,
    /// The conversation it belongs to.
    pub chat: ChatKey,
    /// The platform's id of this message, unique within the chat (Telegram `update_id`).
    /// Idempotency keys of replies derive from it.
    pub message_id: String,
    /// Who wrote it (platform user id), when known.
    pub sender: Option<String>,
    /// The text, empty for messages without text.
    pub text: String,
    /// Unix milliseconds when the platform says it was sent, when known.
    pub sent_at_ms: Option<i64>,
}

/// A message a bot sends.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Outbound {
    /// The conversation to send to.
    pub chat: ChatKey,
    /// The text.
    pub text: String,
    /// The message this answers, if any (used for threading and for the idempotency key).
    pub reply_to: Option<String>,
    /// Stable key: the same reply to the same message is sent at most once.
    pub idempotency_key: String,
}

impl Outbound {
    /// A reply to `inbound`, keyed so that replaying the inbound message does not send twice.
    pub fn reply_to(inbound: &Inbound, text: impl Into<String>) -> Self {
        Self {
            chat: inbound.chat.clone(),
            text: text.into(),
            reply_to: Some(inbound.message_id.clone()),
            idempotency_key: format!("{}:{}:reply", inbound.chat, inbound.message_id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BotId;

    #[test]
    fn reply_key_is_stable_per_message() {
        let m = Inbound {
            platform: Platform::Telegram,
            chat: ChatKey::new(BotId::new("b").unwrap(), "42"),
            message_id: "7".into(),
            sender: None,
            text: "hi".into(),
            sent_at_ms: None,
        };
        let a = Outbound::reply_to(&m, "hi");
        let b = Outbound::reply_to(&m, "other text");
        assert_eq!(a.idempotency_key, b.idempotency_key);
        assert_eq!(a.idempotency_key, "b/42:7:reply");
    }
}
