//! Telegram updates (wire JSON) → [`Inbound`] messages.

use botfleet_core::{
    ActionEvent, Attachment, AttachmentKind, BotId, ChatKey, Command, EventKind, Inbound, Platform,
};
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
    // Required: a message without an id is malformed.
    message_id: i64,
    chat: WireChat,
    #[serde(default)]
    from: Option<WireUser>,
    #[serde(default)]
    date: Option<i64>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    caption: Option<String>,
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
// Short-lived (one per update, turned into a `Received` at once): boxing the message would
// cost an allocation per update for nothing.
#[allow(clippy::large_enum_variant)]
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
    let msg = [
        ("message", false),
        ("edited_message", true),
        ("channel_post", false),
        ("edited_channel_post", true),
    ]
    .iter()
    .find_map(|(k, edited)| obj.get(*k).map(|m| (m, *edited)));
    let Some((msg, edited)) = msg else {
        return match obj.get("callback_query") {
            Some(q) => parse_callback(bot, id, q),
            None => Update::Ignored,
        };
    };
    match WireMessage::deserialize(msg) {
        Ok(m) => {
            let text = m.text.or(m.caption).unwrap_or_default();
            let mut ev = Inbound::message(
                Platform::Telegram,
                ChatKey::new(bot.clone(), m.chat.id.to_string()),
                id.to_string(),
                m.from.map(|u| u.id.to_string()),
                text,
                m.date.map(|d| d.saturating_mul(1000)),
            );
            ev.attachments = attachments(msg);
            if edited {
                ev.kind = EventKind::Edited;
                ev.edited_message_id = Some(m.message_id.to_string());
            } else if let Some(c) = Command::from_slash_text(&ev.text) {
                ev.kind = EventKind::Command;
                ev.command = Some(Box::new(c));
            }
            Update::Message(ev)
        }
        Err(e) => {
            let detail = format!("update {id}: {e}");
            warn!(%bot, update_id = id, error = %e, "skipping a malformed update");
            Update::Malformed(detail)
        }
    }
}

/// One file of a message (`document`, `audio`, …; a photo's largest size).
#[derive(Deserialize)]
struct WireFile {
    file_id: String,
    #[serde(default)]
    file_size: Option<u64>,
    #[serde(default)]
    file_name: Option<String>,
    #[serde(default)]
    mime_type: Option<String>,
    #[serde(default)]
    is_animated: Option<bool>,
    #[serde(default)]
    is_video: Option<bool>,
}

/// The files of a message, as Telegram sends them: `photo` (its largest size), `animation`
/// (which Telegram also sends as `document`: one file), `document`, `video`, `video_note`,
/// `audio`, `voice`, `sticker`. A field that cannot be read is left out (the message is
/// still answered, for its text).
fn attachments(msg: &serde_json::Value) -> Vec<Attachment> {
    let file = |field: &str| -> Option<WireFile> {
        let v = msg.get(field)?;
        let v = if field == "photo" {
            // Sizes, smallest first: the last is the original.
            v.as_array()?.last()?
        } else {
            v
        };
        WireFile::deserialize(v)
            .ok()
            .filter(|f| !f.file_id.is_empty())
    };
    let kinds = [
        ("photo", AttachmentKind::Image, Some("image/jpeg")),
        ("animation", AttachmentKind::Video, None),
        ("document", AttachmentKind::File, None),
        ("video", AttachmentKind::Video, None),
        ("video_note", AttachmentKind::Video, Some("video/mp4")),
        ("audio", AttachmentKind::Audio, None),
        ("voice", AttachmentKind::Voice, Some("audio/ogg")),
        ("sticker", AttachmentKind::Sticker, None),
    ];
    let mut out = Vec::new();
    for (field, kind, mime) in kinds {
        if field == "document" && msg.get("animation").is_some() {
            continue;
        }
        let Some(f) = file(field) else { continue };
        let mime = f.mime_type.as_deref().or(mime).or(match kind {
            AttachmentKind::Sticker if f.is_video == Some(true) => Some("video/webm"),
            AttachmentKind::Sticker if f.is_animated == Some(true) => {
                Some("application/x-tgsticker")
            }
            AttachmentKind::Sticker => Some("image/webp"),
            _ => None,
        });
        out.push(
            Attachment::new(kind, f.file_id)
                .mime(mime)
                .size(f.file_size)
                .name(f.file_name.as_deref()),
        );
    }
    out
}

#[derive(Deserialize)]
struct WireCallback {
    id: String,
    from: WireUser,
    // Absent for a button of an inline-mode message, which has no chat to answer in.
    #[serde(default)]
    message: Option<WireCallbackMessage>,
    #[serde(default)]
    data: Option<String>,
}

#[derive(Deserialize)]
struct WireCallbackMessage {
    message_id: i64,
    chat: WireChat,
}

/// A `callback_query` (a press of an inline keyboard's button) as an `action` event: the
/// button's `callback_data` as its id and value, the query's id kept to answer it.
fn parse_callback(bot: &BotId, id: i64, q: &serde_json::Value) -> Update {
    let q = match WireCallback::deserialize(q) {
        Ok(q) => q,
        Err(e) => {
            warn!(%bot, update_id = id, error = %e, "skipping a malformed callback query");
            return Update::Malformed(format!("update {id}: callback_query: {e}"));
        }
    };
    let (Some(msg), Some(data)) = (q.message, q.data) else {
        // An inline-mode message's button or a game: nothing a chat's turn can answer.
        return Update::Ignored;
    };
    let mut ev = Inbound::message(
        Platform::Telegram,
        ChatKey::new(bot.clone(), msg.chat.id.to_string()),
        id.to_string(),
        Some(q.from.id.to_string()),
        String::new(),
        None,
    );
    ev.kind = EventKind::Action;
    ev.action = Some(Box::new(ActionEvent {
        id: data.clone(),
        value: data,
        message_ref: None,
        message_id: Some(msg.message_id.to_string()),
    }));
    ev.answer_handle = Some(q.id.into());
    Update::Message(ev)
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
    fn a_button_press_is_an_action_with_its_query_kept_for_the_answer() {
        let raw = split_updates(json!([
            {"update_id": 20, "callback_query": {"id": "q-1", "from": {"id": 7, "is_bot": false},
                "chat_instance": "ci", "data": "buy:3",
                "message": {"message_id": 55, "date": 1, "chat": {"id": -9, "type": "group"}}}},
            {"update_id": 21, "callback_query": {"id": "q-2", "from": {"id": 7},
                "inline_message_id": "im", "data": "x", "chat_instance": "ci"}},
            {"update_id": 22, "callback_query": {"from": {"id": 7}, "data": "x"}},
        ]))
        .unwrap();
        match parse_update(&bot(), &raw[0]) {
            Update::Message(m) => {
                assert_eq!(m.kind, EventKind::Action);
                assert_eq!(m.chat.chat, "-9");
                assert_eq!(m.sender.as_deref(), Some("7"));
                let a = m.action.as_deref().unwrap();
                assert_eq!(
                    (a.value.as_str(), a.message_id.as_deref()),
                    ("buy:3", Some("55"))
                );
                assert_eq!(m.answer_handle.as_deref(), Some("q-1"));
                let shown = serde_json::to_value(&m).unwrap();
                assert_eq!(shown["action"]["value"], "buy:3");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(parse_update(&bot(), &raw[1]), Update::Ignored);
        assert!(matches!(
            parse_update(&bot(), &raw[2]),
            Update::Malformed(_)
        ));
    }

    #[test]
    fn commands_and_edits_are_told_apart() {
        let raw = split_updates(json!([
            {"update_id": 11, "message": {"message_id": 4, "chat": {"id": 5, "type": "private"},
                "from": {"id": 7}, "text": "/start@fleet_bot  deep-link",
                "entities": [{"type": "bot_command", "offset": 0, "length": 16}]}},
            {"update_id": 12, "edited_message": {"message_id": 3, "chat": {"id": 5},
                "date": 1, "edit_date": 2, "text": "fixed"}},
            {"update_id": 13, "message": {"message_id": 5, "chat": {"id": 5}, "text": "/ no"}},
            {"update_id": 14, "edited_channel_post": {"message_id": 9, "chat": {"id": -100}, "text": "/x"}}
        ]))
        .unwrap();
        let evs: Vec<Inbound> = raw
            .iter()
            .map(|r| match parse_update(&bot(), r) {
                Update::Message(m) => m,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(evs[0].kind, EventKind::Command);
        let c = evs[0].command.as_ref().unwrap();
        assert_eq!((c.name.as_str(), c.args.as_str()), ("start", "deep-link"));
        assert_eq!(
            evs[0].text, "/start@fleet_bot  deep-link",
            "the text as written"
        );
        assert_eq!(evs[1].kind, EventKind::Edited);
        assert_eq!(evs[1].edited_message_id.as_deref(), Some("3"));
        assert_eq!(
            (evs[1].message_id.as_str(), evs[1].text.as_str()),
            ("12", "fixed")
        );
        assert_eq!(
            (evs[2].kind, evs[2].command.is_none()),
            (EventKind::Message, true)
        );
        assert_eq!(evs[3].kind, EventKind::Edited, "an edit is not a command");
    }

    #[test]
    fn files_come_in_as_attachments_with_their_caption() {
        let raw = split_updates(json!([
            {"update_id": 30, "message": {"message_id": 9, "chat": {"id": 5}, "caption": "look",
                "photo": [{"file_id": "small", "file_unique_id": "s", "width": 90, "height": 90, "file_size": 10},
                          {"file_id": "big", "file_unique_id": "b", "width": 900, "height": 900, "file_size": 1000}]}},
            {"update_id": 31, "message": {"message_id": 10, "chat": {"id": 5},
                "animation": {"file_id": "gif", "file_unique_id": "g", "mime_type": "video/mp4", "file_name": "a.mp4"},
                "document": {"file_id": "gif", "file_unique_id": "g", "mime_type": "video/mp4", "file_name": "a.mp4"}}},
            {"update_id": 32, "message": {"message_id": 11, "chat": {"id": 5},
                "voice": {"file_id": "v", "file_unique_id": "v", "duration": 2, "file_size": 77},
                "sticker": {"file_id": "st", "file_unique_id": "st", "is_animated": false, "is_video": true}}},
            {"update_id": 33, "message": {"message_id": 12, "chat": {"id": 5},
                "document": {"file_unique_id": "no-id"}, "text": "still here"}},
        ]))
        .unwrap();
        let ev = |i: usize| match parse_update(&bot(), &raw[i]) {
            Update::Message(m) => m,
            other => panic!("{other:?}"),
        };
        let photo = ev(0);
        assert_eq!(photo.text, "look", "the caption is the text");
        assert_eq!(photo.attachments.len(), 1);
        let a = &photo.attachments[0];
        assert_eq!(
            (a.kind, a.source.as_str(), a.size, a.mime.as_deref()),
            (AttachmentKind::Image, "big", Some(1000), Some("image/jpeg"))
        );
        let gif = ev(1);
        assert_eq!(gif.attachments.len(), 1, "an animation is one file");
        assert_eq!(gif.attachments[0].kind, AttachmentKind::Video);
        assert_eq!(gif.attachments[0].name.as_deref(), Some("a.mp4"));
        let kinds: Vec<_> = ev(2).attachments.iter().map(|a| a.kind).collect();
        assert_eq!(kinds, [AttachmentKind::Voice, AttachmentKind::Sticker]);
        assert_eq!(ev(2).attachments[1].mime.as_deref(), Some("video/webm"));
        let broken = ev(3);
        assert!(broken.attachments.is_empty());
        assert_eq!(broken.text, "still here");
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
        // A button press is read now: one without its user cannot be answered.
        assert!(matches!(kinds[2], Update::Malformed(_)));
        assert!(matches!(kinds[3], Update::Malformed(_)));
        assert!(matches!(&kinds[4], Update::Message(m) if m.text.is_empty()));
        assert!(split_updates(json!({"not": "an array"})).is_err());
    }
}
