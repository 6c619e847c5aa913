//! Telegram updates (wire JSON) → [`Inbound`] messages.

use botfleet_core::{BotId, ChatKey, Inbound, Platform};
use serde::Deserialize;
use tracing::warn;

/// One update as received, before interpretation.
#[derive(Debug, Clone)]
pub struct RawUpdate {
    /// `update_id`, when the update has a readable one.
    pub update_id: Option<i64>,
    /// The whole update.
    pub json: serde_json::Value,
}

#[derive(Deserialize)]
struct WireMessage {
    // Required: a message without an id is malformed, though only its presence is used.
    #[serde(rename = "message_id")]
    _message_id: i64,
    chat: WireChat,
    #[serde(default)]
    from: Option<WireUser>,
    #[serde(default)]
    date: Option<i64>,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize)]
struct WireChat {
    id: i64,
}

#[derive(Deserialize)]
struct WireUser {
    id: i64,
}

/// What an update means to a bot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Update {
    /// A message (new or edited) in a chat.
    Message(Inbound),
    /// An update kind the bot does not handle (callback query, poll, member change...):
    /// acknowledged and skipped.
    Ignored,
    /// An update that cannot be read: logged (without the token) and skipped.
    Malformed(String),
}

/// Interprets one raw update for `bot`. Never panics, whatever the JSON.
pub fn parse_update(bot: &BotId, raw: &RawUpdate) -> Update {
    let Some(id) = raw.update_id else {
        return Update::Malformed("no integer update_id".into());
    };
    let Some(obj) = raw.json.as_object() else {
        return Update::Malformed("update is not an object".into());
    };
    let msg = ["message", "edited_message", "channel_post"]
        .iter()
        .find_map(|k| obj.get(*k));
    let Some(msg) = msg else {
        return Update::Ignored;
    };
    match WireMessage::deserialize(msg) {
        Ok(m) => Update::Message(Inbound {
            platform: Platform::Telegram,
            chat: ChatKey::new(bot.clone(), m.chat.id.to_string()),
            message_id: id.to_string(),
            sender: m.from.map(|u| u.id.to_string()),
            text: m.text.unwrap_or_default(),
            sent_at_ms: m.date.map(|d| d.saturating_mul(1000)),
        }),
        Err(e) => {
            let detail = format!("update {id}: {e}");
            warn!(%bot, update_id = id, error = %e, "skipping a malformed update");
            Update::Malformed(detail)
        }
    }
}

/// Splits a `getUpdates` result into raw updates. Entries without an integer `update_id` are
/// kept (as malformed) so the caller can log them; the offset advances past the highest id.
pub fn split_updates(result: serde_json::Value) -> Result<Vec<RawUpdate>, String> {
    let serde_json::Value::Array(items) = result else {
        return Err("getUpdates result is not an array".into());
    };
    Ok(items
        .into_iter()
        .map(|json| RawUpdate {
            update_id: json.get("update_id").and_then(serde_json::Value::as_i64),
            json,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bot() -> BotId {
        BotId::new("b").unwrap()
    }

    #[test]
    fn parses_a_text_message() {
        let raw = split_updates(json!([{
            "update_id": 10,
            "message": {"message_id": 3, "date": 1_700_000_000, "chat": {"id": -42, "type": "group"},
                        "from": {"id": 7, "is_bot": false, "first_name": "A"}, "text": "hi"}
        }]))
        .unwrap();
        match parse_update(&bot(), &raw[0]) {
            Update::Message(m) => {
                assert_eq!(m.chat.chat, "-42");
                assert_eq!(m.message_id, "10");
                assert_eq!(m.sender.as_deref(), Some("7"));
                assert_eq!(m.text, "hi");
                assert_eq!(m.sent_at_ms, Some(1_700_000_000_000));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn never_panics_on_garbage() {
        let raw = split_updates(json!([
            {"update_id": 1, "message": {"chat": "nope"}},
            {"update_id": "two", "message": {}},
            {"update_id": 3, "callback_query": {"id": "x"}},
            42,
            {"update_id": 4, "message": {"message_id": 1, "chat": {"id": 5}}}
        ]))
        .unwrap();
        let kinds: Vec<_> = raw.iter().map(|r| parse_update(&bot(), r)).collect();
        assert!(matches!(kinds[0], Update::Malformed(_)));
        assert!(matches!(kinds[1], Update::Malformed(_)));
        assert_eq!(kinds[2], Update::Ignored);
        assert!(matches!(kinds[3], Update::Malformed(_)));
        assert!(matches!(&kinds[4], Update::Message(m) if m.text.is_empty()));
        assert!(split_updates(json!({"not": "an array"})).is_err());
    }
}
