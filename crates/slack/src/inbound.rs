//! Socket Mode frames (wire JSON) → what they mean, and Slack events → [`Inbound`] messages.

use botfleet_core::{
    ActionEvent, Attachment, AttachmentKind, BotId, ChatKey, Command, EventKind, Inbound, Platform,
};
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
// Short-lived (one per envelope, turned into a `Received` at once): boxing the message would
// cost an allocation per event for nothing.
#[allow(clippy::large_enum_variant)]
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
    let subtype = ev.get("subtype").and_then(Value::as_str);
    if subtype == Some("message_changed") {
        return parse_edit(bot, me, ev);
    }
    // Deletions, joins, bot messages: not a person writing to the bot. A file shared is.
    let person = subtype.is_none() || subtype == Some("file_share");
    if !person || ev.get("bot_id").is_some_and(|b| !b.is_null()) {
        return Event::Ignored;
    }
    let user = ev.get("user").and_then(Value::as_str);
    if user.is_some_and(|u| u == me.user_id) {
        return Event::Ignored;
    }
    let Some((channel, ts)) = channel_and_ts(ev.get("channel"), ev.get("ts")) else {
        return Event::Malformed(format!("{kind} event without a usable channel or ts"));
    };
    let text = ev.get("text").and_then(Value::as_str).unwrap_or("");
    let mut inbound = Inbound::message(
        Platform::Slack,
        ChatKey::new(bot.clone(), chat_of(channel, ev.get("thread_ts"), ts)),
        ts,
        user.map(str::to_owned),
        text,
        ms_of_ts(ts),
    );
    inbound.attachments = files(ev.get("files"));
    Event::Message(format!("{channel}:{ts}"), inbound)
}

/// The `files` of a message: each one the bot can download (`url_private_download`, else
/// `url_private`), its kind from its `mimetype` (a clip recorded in Slack is a voice note).
/// A file without a URL (an external one, one still being processed) is left out.
fn files(list: Option<&Value>) -> Vec<Attachment> {
    let Some(list) = list.and_then(Value::as_array) else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|f| {
            let url = ["url_private_download", "url_private"]
                .iter()
                .find_map(|k| f.get(*k).and_then(Value::as_str))
                .filter(|u| u.starts_with("https://") || u.starts_with("http://"))?;
            let mime = f.get("mimetype").and_then(Value::as_str);
            let clip = f.get("subtype").and_then(Value::as_str) == Some("slack_audio");
            let kind = match mime.map(AttachmentKind::of_mime) {
                Some(AttachmentKind::Audio) if clip => AttachmentKind::Voice,
                Some(k) => k,
                None => AttachmentKind::File,
            };
            Some(
                Attachment::new(kind, url)
                    .mime(mime)
                    .size(f.get("size").and_then(Value::as_u64))
                    .name(f.get("name").and_then(Value::as_str)),
            )
        })
        .collect()
}

/// A `message_changed` event: a person edited what they wrote. Its own `ts` keys it (each
/// edit is an event); an edit that leaves the text as it was (Slack sends one when a link
/// preview is added) and edits of the bot's or other bots' messages are ignored.
fn parse_edit(bot: &BotId, me: &Me, ev: &serde_json::Map<String, Value>) -> Event {
    let Some(m) = ev.get("message").and_then(Value::as_object) else {
        return Event::Malformed("message_changed without message".into());
    };
    let user = m.get("user").and_then(Value::as_str);
    if m.get("bot_id").is_some_and(|b| !b.is_null()) || user.is_none_or(|u| u == me.user_id) {
        return Event::Ignored;
    }
    let text = m.get("text").and_then(Value::as_str).unwrap_or("");
    let before = ev
        .get("previous_message")
        .and_then(|p| p.get("text"))
        .and_then(Value::as_str);
    if before == Some(text) {
        return Event::Ignored;
    }
    let Some((channel, ts)) = channel_and_ts(ev.get("channel"), ev.get("ts")) else {
        return Event::Malformed("message_changed without a usable channel or ts".into());
    };
    let Some(edited) = m
        .get("ts")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
    else {
        return Event::Malformed("message_changed without the message's ts".into());
    };
    let mut inbound = Inbound::message(
        Platform::Slack,
        ChatKey::new(bot.clone(), chat_of(channel, m.get("thread_ts"), edited)),
        ts,
        user.map(str::to_owned),
        text,
        ms_of_ts(ts),
    );
    inbound.kind = EventKind::Edited;
    inbound.edited_message_id = Some(edited.to_owned());
    Event::Message(format!("{channel}:{ts}"), inbound)
}

/// A slash command (a `slash_commands` envelope's payload, or the fields of the Events mode's
/// form request): keyed by its `trigger_id`, which each use of a command has its own of.
pub fn parse_command(bot: &BotId, payload: &Value) -> Event {
    let field = |k: &str| payload.get(k).and_then(Value::as_str);
    let Some(name) = field("command").and_then(|c| c.strip_prefix('/')) else {
        return Event::Malformed("slash command without a /command".into());
    };
    let (Some(channel), Some(trigger)) = (field("channel_id"), field("trigger_id")) else {
        return Event::Malformed("slash command without channel_id or trigger_id".into());
    };
    // Slack's command names are short, lowercase, without spaces.
    let odd = |c: char| c.is_whitespace() || c.is_control() || c == '/' || c == '@';
    if name.is_empty() || name.chars().count() > 32 || name.contains(odd) {
        return Event::Malformed("slash command with an unusable name".into());
    }
    if channel.is_empty() || channel.contains('/') || trigger.is_empty() {
        return Event::Malformed("slash command with an unusable channel or trigger".into());
    }
    let args = field("text").unwrap_or("").trim();
    let mut inbound = Inbound::message(
        Platform::Slack,
        ChatKey::new(bot.clone(), channel),
        trigger,
        field("user_id").map(str::to_owned),
        format!("/{name} {args}").trim_end(),
        Some(botfleet_core::unix_ms()),
    );
    inbound.kind = EventKind::Command;
    inbound.command = Some(Box::new(Command::new(name, args)));
    Event::Message(format!("cmd:{trigger}"), inbound)
}

/// An `interactive` payload (a Socket Mode envelope's, or the Events mode's form `payload`):
/// a press of one of the bot's buttons (`block_actions`) is an `action` event in the chat of
/// the message that carried it, keyed by its `trigger_id`, its `response_url` kept to answer
/// it. Other interactions (shortcuts, modals) are ignored.
pub fn parse_interactive(bot: &BotId, payload: &Value) -> Event {
    if payload["type"].as_str() != Some("block_actions") {
        return Event::Ignored;
    }
    let msg = &payload["message"];
    let channel = payload["channel"]
        .get("id")
        .filter(|v| v.is_string())
        .or_else(|| payload["container"].get("channel_id"));
    let ts = msg
        .get("ts")
        .filter(|v| v.is_string())
        .or_else(|| payload["container"].get("message_ts"));
    let Some((channel, ts)) = channel_and_ts(channel, ts) else {
        return Event::Malformed("block_actions without a usable channel or message".into());
    };
    let Some(a) = payload["actions"].as_array().and_then(|a| a.first()) else {
        return Event::Malformed("block_actions without an action".into());
    };
    let (Some(action_id), Some(trigger)) = (
        a["action_id"].as_str(),
        payload["trigger_id"].as_str().filter(|t| !t.is_empty()),
    ) else {
        return Event::Malformed("block_actions without action_id or trigger_id".into());
    };
    let thread = msg
        .get("thread_ts")
        .or(payload["container"].get("thread_ts"));
    let mut inbound = Inbound::message(
        Platform::Slack,
        ChatKey::new(bot.clone(), chat_of(channel, thread, ts)),
        trigger,
        payload["user"]["id"].as_str().map(str::to_owned),
        String::new(),
        a["action_ts"].as_str().and_then(ms_of_ts),
    );
    inbound.kind = EventKind::Action;
    inbound.action = Some(Box::new(ActionEvent {
        id: action_id.to_owned(),
        value: a["value"].as_str().unwrap_or_default().to_owned(),
        message_ref: None,
        message_id: Some(ts.to_owned()),
    }));
    inbound.answer_handle = payload["response_url"].as_str().map(Into::into);
    Event::Message(format!("act:{trigger}"), inbound)
}

/// The channel and ts of an event, if both are there and usable in keys.
fn channel_and_ts<'a>(
    channel: Option<&'a Value>,
    ts: Option<&'a Value>,
) -> Option<(&'a str, &'a str)> {
    let channel = channel.and_then(Value::as_str)?;
    let ts = ts.and_then(Value::as_str)?;
    (!channel.is_empty() && !channel.contains('/') && !ts.is_empty()).then_some((channel, ts))
}

/// One queue per thread where threaded: replies stay in it, in order. A thread's parent
/// (its `thread_ts` is its own `ts`, once it has replies) belongs to the channel, where it was
/// first answered.
fn chat_of(channel: &str, thread_ts: Option<&Value>, ts: &str) -> String {
    match thread_ts.and_then(Value::as_str) {
        Some(t) if !t.is_empty() && t != ts => format!("{channel}/{t}"),
        _ => channel.to_owned(),
    }
}

/// Unix ms of a Slack `ts` (`seconds.micros`).
fn ms_of_ts(ts: &str) -> Option<i64> {
    ts.split('.')
        .next()
        .and_then(|s| s.parse::<i64>().ok())
        .map(|s| s.saturating_mul(1000))
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
            json!({"type": "message", "subtype": "message_deleted", "channel": "C1", "ts": "1.2"}),
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
        assert!(matches!(
            parse_event(
                &bot(),
                &me(),
                &json!({"event": {"type": "message", "subtype": "message_changed", "channel": "C1", "ts": "1.2"}})
            ),
            Event::Malformed(_)
        ));
    }

    #[test]
    fn shared_files_come_in_as_attachments() {
        let ev = json!({"event": {"type": "message", "subtype": "file_share", "channel": "C1",
        "user": "U1", "text": "see", "ts": "1700000000.000200", "files": [
            {"id": "F1", "name": "a.png", "mimetype": "image/png", "size": 99,
             "url_private": "https://files.slack.com/files-pri/T1-F1/a.png",
             "url_private_download": "https://files.slack.com/files-pri/T1-F1/download/a.png"},
            {"id": "F2", "name": "clip.webm", "mimetype": "audio/webm", "subtype": "slack_audio",
             "url_private": "https://files.slack.com/files-pri/T1-F2/clip.webm"},
            {"id": "F3", "mode": "external", "name": "gdoc"},
        ]}});
        let Event::Message(_, m) = parse_event(&bot(), &me(), &ev) else {
            panic!("a file shared is a message");
        };
        assert_eq!(m.text, "see");
        assert_eq!(
            m.attachments.len(),
            2,
            "the external file has no URL to read"
        );
        let a = &m.attachments[0];
        assert_eq!(
            (a.kind, a.size, a.name.as_deref()),
            (AttachmentKind::Image, Some(99), Some("a.png"))
        );
        assert!(a.source.ends_with("/download/a.png"), "{}", a.source);
        assert_eq!(m.attachments[1].kind, AttachmentKind::Voice);
    }

    #[test]
    fn a_persons_edit_is_an_event_of_its_own() {
        let edit = |user: &str, before: &str, after: &str| {
            json!({"event": {"type": "message", "subtype": "message_changed", "channel": "C1",
                "ts": "1700000100.000200", "hidden": true,
                "message": {"type": "message", "user": user, "text": after,
                    "ts": "1700000000.000100", "thread_ts": "1699999999.000001",
                    "edited": {"user": user, "ts": "1700000100.000000"}},
                "previous_message": {"type": "message", "user": user, "text": before,
                    "ts": "1700000000.000100"}}})
        };
        let Event::Message(key, m) = parse_event(&bot(), &me(), &edit("U1", "teh", "the")) else {
            panic!("an edit")
        };
        assert_eq!(key, "C1:1700000100.000200", "not the edited message's key");
        assert_eq!(m.kind, EventKind::Edited);
        assert_eq!(m.edited_message_id.as_deref(), Some("1700000000.000100"));
        assert_eq!(
            (m.chat.chat.as_str(), m.text.as_str()),
            ("C1/1699999999.000001", "the")
        );
        assert_eq!(
            parse_event(&bot(), &me(), &edit("U1", "same", "same")),
            Event::Ignored,
            "a link preview added: the text did not change"
        );
        assert_eq!(
            parse_event(&bot(), &me(), &edit("UBOT", "a", "b")),
            Event::Ignored,
            "the bot's own edit"
        );
        // A thread's parent (thread_ts = its own ts) was answered in the channel: so is its
        // edit.
        let mut parent = edit("U1", "a", "b");
        parent["event"]["message"]["thread_ts"] = json!("1700000000.000100");
        let Event::Message(_, m) = parse_event(&bot(), &me(), &parent) else {
            panic!("an edit")
        };
        assert_eq!(m.chat.chat, "C1");
    }

    #[test]
    fn a_button_press_is_an_action_in_the_chat_of_its_message() {
        let p = json!({"type": "block_actions", "user": {"id": "U7"}, "trigger_id": "13.14.ab",
            "container": {"type": "message", "message_ts": "1700000001.000002", "channel_id": "C1"},
            "channel": {"id": "C1"}, "message": {"ts": "1700000001.000002", "thread_ts": "1700000000.000001"},
            "response_url": "https://hooks.slack.com/actions/T1/2/x",
            "actions": [{"action_id": "bf0_1", "value": "buy", "type": "button", "action_ts": "1700000002.1"}]});
        match parse_interactive(&bot(), &p) {
            Event::Message(key, m) => {
                assert_eq!(key, "act:13.14.ab");
                assert_eq!(m.kind, EventKind::Action);
                assert_eq!(m.chat.chat, "C1/1700000000.000001");
                let a = m.action.as_deref().unwrap();
                assert_eq!((a.id.as_str(), a.value.as_str()), ("bf0_1", "buy"));
                assert_eq!(a.message_id.as_deref(), Some("1700000001.000002"));
                assert_eq!(
                    m.answer_handle.as_deref(),
                    Some("https://hooks.slack.com/actions/T1/2/x")
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            parse_interactive(&bot(), &json!({"type": "shortcut"})),
            Event::Ignored
        );
        for bad in [
            json!({"type": "block_actions"}),
            json!({"type": "block_actions", "channel": {"id": "C1"}, "message": {"ts": "1.2"}, "actions": []}),
            json!({"type": "block_actions", "channel": {"id": "C/1"}, "message": {"ts": "1.2"},
                   "trigger_id": "t", "actions": [{"action_id": "a"}]}),
        ] {
            assert!(
                matches!(parse_interactive(&bot(), &bad), Event::Malformed(_)),
                "{bad}"
            );
        }
    }

    #[test]
    fn slash_commands_are_commands_keyed_by_trigger() {
        let p = json!({"command": "/weather", "text": " 94070 ", "channel_id": "C7",
            "user_id": "U1", "trigger_id": "13345224609.738474920.8088930838d88f008e0",
            "response_url": "https://hooks.slack.com/commands/1234/5678"});
        let Event::Message(key, m) = parse_command(&bot(), &p) else {
            panic!("a command")
        };
        assert_eq!(key, "cmd:13345224609.738474920.8088930838d88f008e0");
        assert_eq!(m.kind, EventKind::Command);
        let c = m.command.unwrap();
        assert_eq!((c.name.as_str(), c.args.as_str()), ("weather", "94070"));
        assert_eq!(
            (m.chat.chat.as_str(), m.text.as_str()),
            ("C7", "/weather 94070")
        );
        for bad in [
            json!({"text": "x", "channel_id": "C7", "trigger_id": "t"}),
            json!({"command": "/", "channel_id": "C7", "trigger_id": "t"}),
            json!({"command": "/a", "channel_id": "C/7", "trigger_id": "t"}),
            json!({"command": "/a", "channel_id": "C7"}),
            json!({"command": "/a b", "channel_id": "C7", "trigger_id": "t"}),
            json!({"command": "/a@b", "channel_id": "C7", "trigger_id": "t"}),
            json!(null),
        ] {
            assert!(
                matches!(parse_command(&bot(), &bad), Event::Malformed(_)),
                "{bad}"
            );
        }
    }
}
