//! Socket Mode frames (wire JSON) → what they mean, and Slack events → [`Inbound`] messages.

use botfleet_core::{BotId, ChatKey, Inbound, Platform};
use serde_json::Value;

/// One text frame of a Socket Mode connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// The connection is ready.
    Hello,
    /// Slack will close the connection (`warning`, `refresh_requested`, `link_disabled`,
    /// `too_many_websockets`, ...).
    Disconnect(String),
    /// A delivery to acknowledge: `events_api`, `slash_commands`, `interactive`.
    Envelope {
        /// What to acknowledge.
        envelope_id: String,
        /// `events_api`, `slash_commands`, `interactive`, ...
        kind: String,
        /// 0 for a first delivery.
        retry_attempt: u64,
        /// The payload.
        payload: Value,
    },
    /// Anything else (ignored).
    Other,
}

/// Reads one frame. Never panics, whatever the text.
///
/// # Errors
/// A reason when the text is not a JSON object.
pub fn parse_frame(text: &str) -> Result<Frame, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("frame is not JSON: {e}"))?;
    let Value::Object(mut obj) = v else {
        return Err("frame is not an object".into());
    };
    if let Some(id) = obj.get("envelope_id").and_then(Value::as_str) {
        return Ok(Frame::Envelope {
            envelope_id: id.to_owned(),
            kind: obj
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            retry_attempt: obj
                .get("retry_attempt")
                .and_then(Value::as_u64)
                .unwrap_or(0),
            // Moved out, not copied: thousands of bots may be reading one at the same time.
            payload: obj.remove("payload").unwrap_or(Value::Null),
        });
    }
    Ok(match obj.get("type").and_then(Value::as_str) {
        Some("hello") => Frame::Hello,
        Some("disconnect") => Frame::Disconnect(
            obj.get("reason")
                .and_then(Value::as_str)
                .unwrap_or("unknown")
                .to_owned(),
        ),
        _ => Frame::Other,
    })
}

/// Whose messages a bot must not answer: its own.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Me {
    /// The bot's user id (`auth.test` `user_id`).
    pub user_id: String,
    /// The bot's id (`auth.test` `bot_id`).
    pub bot_id: Option<String>,
}

/// What an `events_api` payload means to a bot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A message to answer, with its key: `{channel}:{ts}`, the same for a redelivery and for
    /// the `message` and `app_mention` events of one message, so it is answered once.
    Message(String, Inbound),
    /// An event the bot does not answer (edits, joins, bots' messages, other event types).
    Ignored,
    /// Unreadable.
    Malformed(String),
}

/// Interprets an `events_api` envelope's payload for `bot`. Never panics.
pub fn parse_event(bot: &BotId, me: &Me, payload: &Value) -> Event {
    let Some(ev) = payload.get("event").and_then(Value::as_object) else {
        return Event::Malformed("payload without event".into());
    };
    let kind = ev.get("type").and_then(Value::as_str).unwrap_or("");
    if kind != "message" && kind != "app_mention" {
        return Event::Ignored;
    }
    // Edits, deletions, joins, bot messages: not a person writing to the bot.
    if ev.get("subtype").is_some() || ev.get("bot_id").is_some_and(|b| !b.is_null()) {
        return Event::Ignored;
    }
    let user = ev.get("user").and_then(Value::as_str);
    if user.is_some_and(|u| u == me.user_id) {
        return Event::Ignored;
    }
    let (Some(channel), Some(ts)) = (
        ev.get("channel").and_then(Value::as_str),
        ev.get("ts").and_then(Value::as_str),
    ) else {
        return Event::Malformed(format!("{kind} event without channel or ts"));
    };
    if channel.is_empty() || channel.contains('/') || ts.is_empty() {
        return Event::Malformed(format!("{kind} event with an unusable channel or ts"));
    }
    // One queue per thread where threaded: replies stay in it, in order.
    let chat = match ev.get("thread_ts").and_then(Value::as_str) {
        Some(t) if !t.is_empty() => format!("{channel}/{t}"),
        _ => channel.to_owned(),
    };
    let sent_at_ms = ts
        .split('.')
        .next()
        .and_then(|s| s.parse::<i64>().ok())
        .map(|s| s.saturating_mul(1000));
    Event::Message(
        format!("{channel}:{ts}"),
        Inbound {
            platform: Platform::Slack,
            chat: ChatKey::new(bot.clone(), chat),
            message_id: ts.to_owned(),
            sender: user.map(str::to_owned),
            text: ev
                .get("text")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            sent_at_ms,
        },
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn me() -> Me {
        Me {
            user_id: "UBOT".into(),
            bot_id: Some("BBOT".into()),
        }
    }

    fn bot() -> BotId {
        BotId::new("sl").unwrap()
    }

    #[test]
    fn frames_are_read_whatever_the_text() {
        assert_eq!(
            parse_frame(r#"{"type":"hello","num_connections":1}"#),
            Ok(Frame::Hello)
        );
        assert_eq!(
            parse_frame(r#"{"type":"disconnect","reason":"refresh_requested"}"#),
            Ok(Frame::Disconnect("refresh_requested".into()))
        );
        let f = parse_frame(
            r#"{"envelope_id":"e1","type":"events_api","retry_attempt":2,"payload":{"x":1}}"#,
        )
        .unwrap();
        assert!(
            matches!(f, Frame::Envelope { retry_attempt: 2, ref kind, .. } if kind == "events_api")
        );
        assert!(parse_frame("not json").is_err());
        assert!(parse_frame("[1,2]").is_err());
        assert_eq!(parse_frame(r#"{"type":"mystery"}"#), Ok(Frame::Other));
    }

    #[test]
    fn messages_and_mentions_become_inbound_keyed_by_channel_and_ts() {
        let p = json!({"event": {"type": "message", "channel": "C1", "user": "U1",
            "text": "hi", "ts": "1700000000.000100"}, "event_id": "Ev1"});
        let Event::Message(key, m) = parse_event(&bot(), &me(), &p) else {
            panic!("a message")
        };
        assert_eq!(key, "C1:1700000000.000100");
        assert_eq!((m.chat.chat.as_str(), m.text.as_str()), ("C1", "hi"));
        assert_eq!(m.sent_at_ms, Some(1_700_000_000_000));
        let p = json!({"event": {"type": "app_mention", "channel": "C1", "user": "U1",
            "text": "<@UBOT> hi", "ts": "1700000000.000100", "thread_ts": "1699999999.000001"}});
        let Event::Message(key2, m) = parse_event(&bot(), &me(), &p) else {
            panic!("a mention")
        };
        assert_eq!(
            key2, key,
            "the mention and the message of one post are one key"
        );
        assert_eq!(m.chat.chat, "C1/1699999999.000001");
    }

    #[test]
    fn edits_bots_and_self_are_ignored_and_garbage_is_malformed() {
        for ev in [
            json!({"type": "message", "subtype": "message_changed", "channel": "C1", "ts": "1.2"}),
            json!({"type": "message", "bot_id": "B2", "channel": "C1", "ts": "1.2", "user": "U9"}),
            json!({"type": "message", "user": "UBOT", "channel": "C1", "ts": "1.2"}),
            json!({"type": "reaction_added", "user": "U1"}),
        ] {
            assert_eq!(
                parse_event(&bot(), &me(), &json!({"event": ev})),
                Event::Ignored
            );
        }
        assert!(matches!(
            parse_event(
                &bot(),
                &me(),
                &json!({"event": {"type": "message", "user": "U1"}})
            ),
            Event::Malformed(_)
        ));
        assert!(matches!(
            parse_event(&bot(), &me(), &json!(42)),
            Event::Malformed(_)
        ));
    }
}
