//! `MESSAGE_CREATE` and `MESSAGE_UPDATE` dispatches as normalized events.

use botfleet_core::{BotId, ChatKey, EventKind, Inbound, Platform};
use botfleet_platform::Received;
use serde_json::Value;

/// A message from a dispatch's `d`: `Ok(None)` for messages the bot does not answer (its own,
/// other bots', webhooks'), `Err` for a dispatch that cannot be read.
pub fn parse_message(bot: &BotId, d: &Value, me: &str) -> Result<Option<Received>, String> {
    let id = d["id"].as_str().ok_or("message without id")?;
    let channel = d["channel_id"]
        .as_str()
        .ok_or("message without channel_id")?;
    let author = &d["author"];
    let author_id = author["id"].as_str().ok_or("message without author")?;
    if id.is_empty() || channel.is_empty() || author_id.is_empty() {
        return Err("message with an empty id, channel_id or author".into());
    }
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
        message: Inbound::message(
            Platform::Discord,
            ChatKey::new(bot.clone(), channel),
            id,
            Some(author_id.to_owned()),
            d["content"].as_str().unwrap_or_default(),
            sent_at_ms,
        ),
    }))
}

/// An edit from a `MESSAGE_UPDATE` dispatch: `Ok(None)` for updates that are not a person
/// changing the text (an embed resolved, a pin: no new `edited_timestamp` or no content; the
/// bot's own, other bots' and webhooks' messages). Each edit is an event of its own, keyed by
/// the message and the edit's time; `message_id` stays the edited message's (replies refer to
/// it).
pub fn parse_edit(bot: &BotId, d: &Value, me: &str) -> Result<Option<Received>, String> {
    let (Some(edited_at), Some(_)) = (d["edited_timestamp"].as_str(), d["content"].as_str()) else {
        return Ok(None);
    };
    if d["author"].is_null() {
        return Ok(None);
    }
    let Some(mut r) = parse_message(bot, d, me)? else {
        return Ok(None);
    };
    r.key = format!("{}:edit:{edited_at}", r.key);
    r.message.kind = EventKind::Edited;
    r.message.edited_message_id = Some(r.message.message_id.clone());
    r.message.sent_at_ms = None;
    Ok(Some(r))
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
        let no_channel =
            json!({"id": "5", "channel_id": "", "author": {"id": "9"}, "content": "x"});
        assert!(parse_message(&bot, &no_channel, "1").is_err());
    }

    #[test]
    fn edits_are_events_of_their_own() {
        let bot = BotId::new("d").unwrap();
        let edit = |at: &str| {
            json!({"id": "1100000000000000000", "channel_id": "42", "author": {"id": "9"},
                   "content": "fixed", "edited_timestamp": at})
        };
        let r = parse_edit(&bot, &edit("2026-12-02T10:00:00.000000+00:00"), "1")
            .unwrap()
            .unwrap();
        assert_eq!(r.message.kind, EventKind::Edited);
        assert_eq!(r.message.message_id, "1100000000000000000");
        assert_eq!(
            r.message.edited_message_id.as_deref(),
            Some("1100000000000000000")
        );
        assert_eq!(r.message.text, "fixed");
        let again = parse_edit(&bot, &edit("2026-12-02T10:01:00.000000+00:00"), "1")
            .unwrap()
            .unwrap();
        assert_ne!(r.key, again.key, "a second edit is a second event");
        assert_ne!(r.key, "1100000000000000000", "nor the message's own key");
        // An embed resolved: no edit time, or no content; the bot's own edit.
        let embed = json!({"id": "5", "channel_id": "42", "embeds": []});
        assert!(parse_edit(&bot, &embed, "1").unwrap().is_none());
        let mut own = edit("2026-12-02T10:00:00Z");
        own["author"]["id"] = json!("1");
        assert!(parse_edit(&bot, &own, "1").unwrap().is_none());
        let no_channel =
            json!({"id": "6", "author": {"id": "9"}, "content": "x", "edited_timestamp": "t"});
        assert!(parse_edit(&bot, &no_channel, "1").is_err());
    }
}
