//! Platform-neutral messages: what providers turn wire updates into, and what handlers send.

use serde::{Deserialize, Serialize};

use crate::{ActionEvent, Attachment, ChatKey, Platform};

/// What an event is: the `kind` field a handler gets.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// Someone wrote (or sent something) in the chat.
    #[default]
    Message,
    /// Someone used one of the bot's commands (`command` says which).
    Command,
    /// Someone edited a message they wrote (`edited_message_id` says which; `text` is the new
    /// text).
    Edited,
    /// Someone pressed one of the bot's buttons (`action` says which).
    Action,
}

impl EventKind {
    /// Its name on the wire (`message`, `command`, `edited`, `action`).
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Message => "message",
            EventKind::Command => "command",
            EventKind::Edited => "edited",
            EventKind::Action => "action",
        }
    }
}

/// A command a user gave the bot: Telegram `/name[@bot] args`, a Slack slash command, a
/// Discord application command.
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct Command {
    /// The command's name, without `/` or `@bot` (`start` for `/start@my_bot now`).
    pub name: String,
    /// The text after the name, trimmed (`now`); empty if none.
    #[serde(default)]
    pub args: String,
    /// Named options where the platform has them (Discord's application command options,
    /// by name); empty where it has none.
    #[serde(default)]
    pub options: serde_json::Map<String, serde_json::Value>,
}

impl Command {
    /// A command without named options.
    pub fn new(name: impl Into<String>, args: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            args: args.into(),
            options: serde_json::Map::new(),
        }
    }

    /// Reads `/name[@bot] args` at the start of `text` (a Telegram command). Names are 1–32
    /// letters, digits or `_`, as Telegram allows; anything else is not a command.
    pub fn from_slash_text(text: &str) -> Option<Self> {
        let rest = text.strip_prefix('/')?;
        let (head, args) = match rest.find(char::is_whitespace) {
            Some(i) => (&rest[..i], rest[i..].trim()),
            None => (rest, ""),
        };
        let name = head.split_once('@').map_or(head, |(n, _)| n);
        let valid = !name.is_empty()
            && name.len() <= 32
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        valid.then(|| Self::new(name, args))
    }
}

/// A message received by a bot, normalised across platforms.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Inbound {
    /// What the event is. Journal entries recorded before events had kinds read as
    /// `message`.
    #[serde(default)]
    pub kind: EventKind,
    /// The event's id, stable across the platform's redeliveries and the fleet's replays
    /// (`{bot}:{journal key}`): a handler may use it to tell a repeat. Set by the turn
    /// pipeline from the journal entry (so the journal does not store it).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub event_id: String,
    /// Which call of the handler for this event this is: 1, then 2, 3… when a call failed,
    /// timed out or was cut off and the event is tried again. Set by the turn pipeline for
    /// each call (0, and not journaled, before that). A handler that answered an earlier
    /// attempt answers a later one the same way: only one answer is ever sent.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempt: u32,
    /// The platform it came from.
    pub platform: Platform,
    /// The conversation it belongs to.
    pub chat: ChatKey,
    /// The platform's id of this message, unique within the chat (Telegram `update_id`).
    /// Idempotency keys of replies derive from it.
    pub message_id: String,
    /// Who wrote it (platform user id), when known.
    pub sender: Option<String>,
    /// The text, empty for messages without text (a file's caption for a file).
    pub text: String,
    /// Files that came with it: photos, voice notes, documents…
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Attachment>,
    /// Unix milliseconds when the platform says it was sent, when known.
    pub sent_at_ms: Option<i64>,
    /// The command, for `kind: command` (boxed: most events have none, and batches of
    /// events are held in memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Box<Command>>,
    /// For `kind: edited`: the platform's id of the message that was edited (Telegram's
    /// `message_id`, Slack's `ts`, Discord's message id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edited_message_id: Option<String>,
    /// For `kind: action`: the button that was pressed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<Box<ActionEvent>>,
    /// What the platform needs to answer this event (Telegram's callback query id, Slack's
    /// `response_url`): journaled with the event, never shown to a handler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_handle: Option<Box<str>>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Inbound {
    /// A plain message (`kind: message`); set the other fields as the event needs.
    pub fn message(
        platform: Platform,
        chat: ChatKey,
        message_id: impl Into<String>,
        sender: Option<String>,
        text: impl Into<String>,
        sent_at_ms: Option<i64>,
    ) -> Self {
        Self {
            kind: EventKind::Message,
            event_id: String::new(),
            attempt: 0,
            platform,
            chat,
            message_id: message_id.into(),
            sender,
            text: text.into(),
            attachments: Vec::new(),
            sent_at_ms,
            command: None,
            edited_message_id: None,
            action: None,
            answer_handle: None,
        }
    }
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
    /// A message's reply is keyed by the message; any other event's by the event (an edit
    /// keeps the edited message's id, and each edit is answered).
    pub fn reply_to(inbound: &Inbound, text: impl Into<String>) -> Self {
        Self {
            chat: inbound.chat.clone(),
            text: text.into(),
            reply_to: Some(inbound.message_id.clone()),
            idempotency_key: Self::reply_key(inbound),
        }
    }

    /// The idempotency key of the reply to `inbound` (see [`Outbound::reply_to`]); the
    /// actions of a reply are keyed from it.
    pub fn reply_key(inbound: &Inbound) -> String {
        if inbound.kind == EventKind::Message || inbound.event_id.is_empty() {
            format!("{}:{}:reply", inbound.chat, inbound.message_id)
        } else {
            format!(
                "{}:{}:{}:reply",
                inbound.chat,
                inbound.kind.as_str(),
                inbound.event_id
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BotId;

    #[test]
    fn reply_key_is_stable_per_message() {
        let m = Inbound::message(
            Platform::Telegram,
            ChatKey::new(BotId::new("b").unwrap(), "42"),
            "7",
            None,
            "hi",
            None,
        );
        let a = Outbound::reply_to(&m, "hi");
        let b = Outbound::reply_to(&m, "other text");
        assert_eq!(a.idempotency_key, b.idempotency_key);
        assert_eq!(a.idempotency_key, "b/42:7:reply");
        let edit = |event_id: &str| Inbound {
            kind: EventKind::Edited,
            event_id: event_id.into(),
            edited_message_id: Some("7".into()),
            ..m.clone()
        };
        let (e1, e2) = (
            Outbound::reply_to(&edit("b:7:edit:1"), "x"),
            Outbound::reply_to(&edit("b:7:edit:2"), "x"),
        );
        assert_ne!(e1.idempotency_key, a.idempotency_key);
        assert_ne!(e1.idempotency_key, e2.idempotency_key);
        assert_eq!(e1.reply_to.as_deref(), Some("7"));
    }

    #[test]
    fn slash_commands_are_read_from_text() {
        let c = Command::from_slash_text("/start@my_bot  now please ").unwrap();
        assert_eq!((c.name.as_str(), c.args.as_str()), ("start", "now please"));
        assert!(c.options.is_empty());
        assert_eq!(Command::from_slash_text("/help").unwrap().args, "");
        let c = Command::from_slash_text("/go\nnext line").unwrap();
        assert_eq!((c.name.as_str(), c.args.as_str()), ("go", "next line"));
        let long = format!("/{}", "a".repeat(33));
        for not in [
            "hello",
            "/",
            "/ start",
            "/café",
            "//x",
            "/@bot",
            long.as_str(),
        ] {
            assert_eq!(Command::from_slash_text(not), None, "{not:?}");
        }
    }

    #[test]
    fn old_journal_entries_read_as_messages() {
        let old = r#"{"platform":"telegram","chat":{"bot":"b","chat":"1"},"message_id":"3","sender":null,"text":"hi","sent_at_ms":null}"#;
        let m: Inbound = serde_json::from_str(old).unwrap();
        assert_eq!(m.kind, EventKind::Message);
        assert_eq!(
            (m.event_id.as_str(), &m.command, &m.edited_message_id),
            ("", &None, &None)
        );
        let v = serde_json::to_value(Inbound {
            kind: EventKind::Command,
            command: Some(Box::new(Command::new("start", ""))),
            ..m
        })
        .unwrap();
        assert_eq!(v["kind"], "command");
        assert_eq!(v["command"]["name"], "start");
        assert!(v.get("edited_message_id").is_none());
    }
}
