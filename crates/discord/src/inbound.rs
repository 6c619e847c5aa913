//! `MESSAGE_CREATE` dispatches as normalized messages.

use botfleet_core::{BotId, ChatKey, Inbound, Platform};
use botfleet_platform::Received;
use serde_json::Value;

/// A message from a dispatch's `d`: `Ok(None)` for messages the bot does not answer (its own,
/// other bots', webhooks'), `Err` for a dispatch that cannot be read.
pub(crate) fn parse_message(bot: &BotId, d: &Value, me: &str) -> Result<Option<Received>, String> {
    let id = d["id"].as_str().ok_or("message without id")?;
    let channel = d["channel_id"]
        .as_str()
        .ok_or("message without channel_id")?;
    let author = &d["author"];
    let author_id = author["id"].as_str().ok_or("message without author")?;
    if author["bot"].as_bool() == Some(true) || author_id == me || d["webhook_id"].is_string() {
        return Ok(None);
    }
    let sent_at_ms = id
        .parse::<u64>()
        .ok()
        // A snowflake's top 42 bits are milliseconds since 2015-01-01.
        .map(|s| i64::try_from((s >> 22) + 1_420_070_400_000).unwrap_or(0));
    Ok(Some(Received {
        key: id.to_owned(),
        message: Inbound {
            platform: Platform::Discord,
            chat: ChatKey::new(bot.clone(), channel),
            message_id: id.to_owned(),
            sender: Some(author_id.to_owned()),
            text: d["content"].as_str().unwrap_or_default().to_owned(),
            sent_at_ms,
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_users_messages_and_skips_bots() {
        let bot = BotId::new("d").unwrap();
        let m = json!({"id": "1100000000000000000", "channel_id": "42", "guild_id": "7",
                       "author": {"id": "9", "username": "u"}, "content": "hi"});
        let r = parse_message(&bot, &m, "1").unwrap().unwrap();
        assert_eq!(
            (
                r.key.as_str(),
                r.message.chat.chat.as_str(),
                r.message.text.as_str()
            ),
            ("1100000000000000000", "42", "hi")
        );
        assert!(r.message.sent_at_ms.unwrap() > 1_420_070_400_000);
        let own = json!({"id": "2", "channel_id": "42", "author": {"id": "1"}, "content": "x"});
        assert!(parse_message(&bot, &own, "1").unwrap().is_none());
        let other_bot = json!({"id": "3", "channel_id": "42", "author": {"id": "5", "bot": true}, "content": "x"});
        assert!(parse_message(&bot, &other_bot, "1").unwrap().is_none());
        assert!(parse_message(&bot, &json!({"id": "4"}), "1").is_err());
    }
}
