//! What a handler asks the fleet to do (a reply's `actions`), what a platform is asked to do
//! once the fleet resolved them ([`Act`]), and what each platform and mode can do ([`Caps`]).

use serde::{Deserialize, Serialize};

use crate::{Inbound, OutFile, Upload};

/// A button under a message the bot sends: a press sends the bot an `action` event carrying
/// `value` (a callback button), or the button opens `url` (a link button). Exactly one of the
/// two is given.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Button {
    /// The label.
    pub text: String,
    /// What a press hands back to the handler (any length: values longer than the platform
    /// allows are kept by the fleet and replaced with a short key on the wire).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// A link the button opens instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

/// Which message an `edit` or `delete` is about: a `ref` an earlier `send` named, or the
/// platform's message id.
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct Target {
    /// The name a `send` of this chat gave its message (kept 48 h).
    #[serde(default, rename = "ref", skip_serializing_if = "Option::is_none")]
    pub ref_name: Option<String>,
    /// The platform's id of the message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
}

/// One action of a handler's reply, done in order. Unknown fields are ignored; an unknown
/// `type` is refused with a reason (the reply's other actions still run).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Action {
    /// Sends a message to the event's chat.
    Send {
        /// The text.
        #[serde(default)]
        text: String,
        /// Rows of buttons under it.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        buttons: Vec<Vec<Button>>,
        /// Reply in the thread of the event's message, where the platform has threads.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        thread: bool,
        /// A name for the sent message, so a later `edit` or `delete` (of this turn or a
        /// later one, on any worker) can find it.
        #[serde(default, rename = "ref", skip_serializing_if = "Option::is_none")]
        ref_name: Option<String>,
        /// Files to send with it (`caps.files` says whether the mode sends files; the text,
        /// when given, goes with them as their caption where the platform has one).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        attachments: Vec<OutFile>,
        /// Only the user who acted sees it, where the send answers their interaction (a
        /// Discord command or button press); ignored elsewhere.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        ephemeral: bool,
    },
    /// Replaces the text and buttons of a message the bot sent: the text stays when none is
    /// given; the buttons are the ones given (none when absent, as every platform's edit
    /// leaves them).
    Edit {
        /// Which message.
        #[serde(flatten)]
        target: Target,
        /// The new text (unchanged when absent).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        /// The buttons it has after the edit.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        buttons: Vec<Vec<Button>>,
    },
    /// Deletes a message the bot sent.
    Delete {
        /// Which message.
        #[serde(flatten)]
        target: Target,
    },
    /// Shows that the bot is typing, in the event's chat.
    Typing {},
    /// Sends a message template the business had approved (WhatsApp Cloud: the one kind of
    /// message a business may send a user more than 24 hours after the user's last message).
    Template {
        /// The template's name.
        name: String,
        /// Its language code (`en_US`).
        language: String,
        /// Its components with their parameters, as the platform takes them.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        components: Option<serde_json::Value>,
    },
    /// Answers the event itself: a button press (Telegram's `answerCallbackQuery`: a toast,
    /// or an `alert`), or a command (an ephemeral reply where the platform has one).
    Answer {
        /// What to show.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        /// As a dialog the user must close, rather than a toast (Telegram).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        alert: bool,
        /// Only the user who acted sees it (Slack, Discord).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        ephemeral: bool,
    },
}

impl Action {
    /// Every `type` there is, on the wire.
    pub const KINDS: [&'static str; 6] = ["send", "edit", "delete", "typing", "answer", "template"];

    /// Its `type` on the wire.
    pub fn kind(&self) -> &'static str {
        match self {
            Action::Send { .. } => "send",
            Action::Edit { .. } => "edit",
            Action::Delete { .. } => "delete",
            Action::Typing {} => "typing",
            Action::Answer { .. } => "answer",
            Action::Template { .. } => "template",
        }
    }

    /// A plain `send` of `text`.
    pub fn send(text: impl Into<String>) -> Self {
        Action::Send {
            text: text.into(),
            buttons: Vec::new(),
            thread: false,
            ref_name: None,
            attachments: Vec::new(),
            ephemeral: false,
        }
    }

    /// Reads one entry of a reply's `actions`: the action, or why it cannot be done (an
    /// unknown `type`, a field of the wrong shape).
    ///
    /// # Errors
    /// The reason, naming the action's position.
    pub fn from_json(i: usize, v: &serde_json::Value) -> Result<Self, String> {
        match v.get("type").and_then(serde_json::Value::as_str) {
            None => return Err(format!("action {i}: no \"type\"")),
            Some(t) if !Self::KINDS.contains(&t) => {
                return Err(format!(
                    "action {i}: unknown type {:?} (one of {})",
                    t.chars().take(32).collect::<String>(),
                    Self::KINDS.join(", ")
                ))
            }
            Some(_) => {}
        }
        let a = Action::deserialize(v).map_err(|e| format!("action {i}: {e}"))?;
        if let Action::Template {
            components: Some(c),
            ..
        } = &a
        {
            if !c.is_array() {
                return Err(format!("action {i}: `components` is not a list"));
            }
        }
        Ok(a)
    }
}

/// An action as a platform gets it: refs resolved to message ids, button values already
/// shortened to what the platform takes.
#[derive(Clone, Copy, Debug)]
pub enum Act<'a> {
    /// Send `text` with `buttons` and `files`; in the thread of `thread_of` when given.
    Send {
        /// The text (empty only when there are files).
        text: &'a str,
        /// Rows of buttons.
        buttons: &'a [Vec<Button>],
        /// The event whose thread to reply in.
        thread_of: Option<&'a Inbound>,
        /// Files to send with the text (within the mode's `max_files` and
        /// `max_file_bytes`).
        files: &'a [Upload],
    },
    /// Edit the bot's message `message_id`.
    Edit {
        /// The platform's id of the message.
        message_id: &'a str,
        /// The answer handle of the event whose answer made the message, while it still
        /// answers: the platform edits through it where it can (Discord: the interaction's
        /// webhook, the one way to edit an ephemeral answer or one in a channel the bot may
        /// not post in).
        via: Option<&'a str>,
        /// The new text, if it changes.
        text: Option<&'a str>,
        /// The buttons it has after the edit (none when empty).
        buttons: &'a [Vec<Button>],
    },
    /// Delete the bot's message `message_id`.
    Delete {
        /// The platform's id of the message.
        message_id: &'a str,
        /// As for [`Act::Edit`]: the answer handle the message was made with, while it lives.
        via: Option<&'a str>,
    },
    /// Show typing in the chat.
    Typing,
    /// Answer `event` (a button press, a command). Without a `text` it only acknowledges the
    /// event, so the user's client stops waiting (the fleet does this at the end of a turn that
    /// did not answer).
    Answer {
        /// The event answered.
        event: &'a Inbound,
        /// What to show.
        text: Option<&'a str>,
        /// As an alert.
        alert: bool,
        /// Only to the user who acted.
        ephemeral: bool,
        /// The event was acknowledged already ([`Act::Defer`]): the answer follows up.
        deferred: bool,
        /// The event has its answer already: this one comes after it (Discord: a follow-up
        /// message, where a first answer would edit the original response).
        answered: bool,
        /// Rows of buttons under it, where an answer is a message that shows them (Discord's
        /// interaction responses); empty otherwise.
        buttons: &'a [Vec<Button>],
        /// Files shown with it, where an answer is a message (Discord's); empty otherwise.
        files: &'a [Upload],
    },
    /// Send the approved template `name` in `language`, with its `components`.
    Template {
        /// Its name.
        name: &'a str,
        /// Its language code.
        language: &'a str,
        /// Its components with their parameters (none when absent).
        components: Option<&'a serde_json::Value>,
    },
    /// Acknowledge `event` now, before the handler has answered, so the platform's deadline
    /// is met (Discord's 3 s for an interaction); an answer later follows up.
    Defer {
        /// The event.
        event: &'a Inbound,
    },
}

/// What a platform's mode can do, given to every handler request as `caps` so a handler
/// never has to guess. An action a mode cannot do is refused with a reason.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Caps {
    /// Buttons under sent messages (and `action` events when they are pressed).
    pub buttons: bool,
    /// The most buttons in one message (0 without buttons).
    pub max_buttons: u16,
    /// The longest button value the platform carries, in bytes; longer ones are kept by the
    /// fleet behind a short key.
    pub max_button_value: u16,
    /// `edit` of a message the bot sent.
    pub edit: bool,
    /// `delete` of a message the bot sent.
    pub delete: bool,
    /// `typing`.
    pub typing: bool,
    /// `answer` to a button press or command.
    pub answer: bool,
    /// `answer` seen only by the user who acted.
    pub ephemeral: bool,
    /// Replies in a message's thread.
    pub threads: bool,
    /// Files in and out (attachments).
    pub files: bool,
    /// The most files one `send` takes (0 without files).
    pub max_files: u16,
    /// The largest file the fleet sends on this mode, in bytes (0 without files).
    pub max_file_bytes: u64,
    /// The longest text of one message, in characters (longer ones are cut).
    pub max_text: u32,
    /// The bot's commands (`--commands`) are registered with the platform, which shows them
    /// in its command menu.
    pub commands: bool,
    /// A streamed answer (a message sent with a `ref`, then edited as it grows) goes as the
    /// platform's own stream in some chats (Slack: in a thread; Telegram: a private chat),
    /// unless the bot's `stream` is `edits`; elsewhere as paced edits of one message.
    #[serde(default)]
    pub streams: bool,
    /// `template`: approved message templates (WhatsApp Cloud).
    #[serde(default)]
    pub templates: bool,
    /// How long after a user's last message the bot may still send them messages of its
    /// own words, in seconds (0: no limit); after it only a `template` goes, and any other
    /// message is refused with [`OUTSIDE_WINDOW`] (WhatsApp Cloud: 86,400, its customer
    /// service window).
    #[serde(default)]
    pub reply_window_s: u32,
}

/// Why a message was refused outside the platform's reply window
/// ([`Caps::reply_window_s`]).
pub const OUTSIDE_WINDOW: &str = "outside the 24-hour window: use a template";

impl Caps {
    /// A mode that can send text and nothing else.
    pub const TEXT_ONLY: Caps = Caps {
        buttons: false,
        max_buttons: 0,
        max_button_value: 0,
        edit: false,
        delete: false,
        typing: false,
        answer: false,
        ephemeral: false,
        threads: false,
        files: false,
        max_files: 0,
        max_file_bytes: 0,
        max_text: 4096,
        commands: false,
        streams: false,
        templates: false,
        reply_window_s: 0,
    };

    /// The capabilities by name, in a fixed order (for the README's table and for reasons).
    pub fn flags(&self) -> [(&'static str, bool); 11] {
        [
            ("buttons", self.buttons),
            ("edit", self.edit),
            ("delete", self.delete),
            ("typing", self.typing),
            ("answer", self.answer),
            ("ephemeral", self.ephemeral),
            ("threads", self.threads),
            ("files", self.files),
            ("commands", self.commands),
            ("streams", self.streams),
            ("templates", self.templates),
        ]
    }
}

/// `text` cut to `max` characters, the last one an ellipsis, when longer (a platform's
/// limit on a message or a label).
pub fn fit_text(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if max > 0 && text.chars().count() > max {
        let mut t: String = text.chars().take(max - 1).collect();
        t.push('…');
        t.into()
    } else {
        text.into()
    }
}

/// For an `action` event: which control was used.
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct ActionEvent {
    /// The control's id where the platform has one (Slack's `action_id`, Discord's
    /// `custom_id`, WhatsApp's reply id); the wire value otherwise.
    pub id: String,
    /// The button's `value`, as the handler gave it.
    #[serde(default)]
    pub value: String,
    /// The `ref` the handler gave the message carrying the button, when it gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_ref: Option<String>,
    /// The platform's id of the message carrying the button.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn actions_read_from_json_with_reasons_for_what_is_not_one() {
        let a = Action::from_json(
            0,
            &json!({"type": "send", "text": "hi", "ref": "menu", "buttons": [[{"text": "A", "value": "a"}]]}),
        )
        .unwrap();
        match &a {
            Action::Send {
                text,
                ref_name,
                buttons,
                ..
            } => {
                assert_eq!(text, "hi");
                assert_eq!(ref_name.as_deref(), Some("menu"));
                assert_eq!(buttons[0][0].value.as_deref(), Some("a"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            serde_json::to_value(&a).unwrap()["ref"],
            "menu",
            "the ref keeps its wire name"
        );
        let e = Action::from_json(1, &json!({"type": "edit", "ref": "menu", "text": "x"})).unwrap();
        assert_eq!(
            e,
            Action::Edit {
                target: Target {
                    ref_name: Some("menu".into()),
                    message_id: None
                },
                text: Some("x".into()),
                buttons: Vec::new()
            }
        );
        assert_eq!(
            Action::from_json(2, &json!({"type": "typing"})).unwrap(),
            Action::Typing {}
        );
        let why = Action::from_json(3, &json!({"type": "dance"})).unwrap_err();
        assert!(why.contains("action 3") && why.contains("dance"), "{why}");
        assert!(Action::from_json(4, &json!({"text": "x"}))
            .unwrap_err()
            .contains("type"));
        assert!(Action::from_json(5, &json!({"type": "send", "text": 5})).is_err());
        let t = json!({"type": "template", "name": "hi", "language": "en",
                       "components": [{"type": "body"}]});
        assert!(Action::from_json(6, &t).is_ok());
        let bad = json!({"type": "template", "name": "hi", "language": "en",
                         "components": {"type": "body"}});
        let why = Action::from_json(7, &bad).unwrap_err();
        assert!(why.contains("`components` is not a list"), "{why}");
    }
}
