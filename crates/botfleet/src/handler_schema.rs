//! The webhook handler contract as JSON Schema, in the OpenAPI document: what a bot's
//! `webhook` handler is POSTed ([`HandlerEvent`]) and what it may answer ([`HandlerAnswer`]).
//! The handler is the bot owner's service, not a route of this API; its contract is documented
//! beside the API. A test checks the schema against the body a worker really sends.

// These types exist for their schema; nothing reads their fields.
#![allow(dead_code)]

use serde::Serialize;
use utoipa::ToSchema;

/// What an event is. New kinds may be added: a handler answers one it does not know with an
/// empty 200.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum HandlerEventKind {
    /// Someone wrote in the chat.
    Message,
    /// Someone used one of the bot's commands (see `command`).
    Command,
    /// Someone edited what they wrote (see `edited_message_id`).
    Edited,
    /// Someone pressed one of the bot's buttons (see `action`). Answer it (an `answer`
    /// action) so the user's client stops waiting.
    Action,
}

/// For `kind: action`: the button that was pressed.
#[derive(Serialize, ToSchema)]
pub(crate) struct HandlerActionEvent {
    /// The control's id where the platform has one (Slack's `action_id`, Discord's
    /// `custom_id`); the wire value otherwise.
    id: String,
    /// The button's `value`, exactly as the handler gave it (however long).
    #[schema(example = "buy:3")]
    value: String,
    /// The `ref` the handler gave the message carrying the button, when it gave one.
    #[schema(example = "menu")]
    message_ref: Option<String>,
    /// The platform's id of the message carrying the button.
    message_id: Option<String>,
}

/// What the bot's platform and mode can do, in every request: an action beyond it is refused
/// with a reason.
#[derive(Serialize, ToSchema)]
pub(crate) struct HandlerCaps {
    /// Buttons under sent messages.
    buttons: bool,
    /// The most buttons in one message.
    max_buttons: u16,
    /// The longest button value the platform carries (longer ones are kept by the fleet).
    max_button_value: u16,
    /// `edit` of a message the bot sent.
    edit: bool,
    /// `delete` of a message the bot sent.
    delete: bool,
    /// `typing`.
    typing: bool,
    /// `answer` to a button press or command.
    answer: bool,
    /// `answer` with `ephemeral: true`.
    ephemeral: bool,
    /// Replies in a message's thread.
    threads: bool,
    /// Files in (`attachments` of events) and out (`attachments` of `send`).
    files: bool,
    /// The most files one `send` takes.
    max_files: u16,
    /// The largest file sent, in bytes.
    max_file_bytes: u64,
    /// The longest text of one message, in characters.
    max_text: u32,
    /// The bot's commands are registered with the platform's command menu.
    commands: bool,
    /// A streamed answer (a send with a `ref`, then edits that extend it) goes as the
    /// platform's own stream where the chat has one (Slack: a thread; Telegram: a private
    /// chat), unless the bot's `stream` is `edits`.
    streams: bool,
    /// `template`: approved message templates (WhatsApp Cloud: the one message allowed 24
    /// hours after the user's last).
    templates: bool,
    /// Seconds after a user's last message the bot may still send other messages to them
    /// (0: no limit; WhatsApp Cloud: 86,400): later, only `template` goes, and any other
    /// message is refused with `outside the 24-hour window: use a template`.
    reply_window_s: u32,
}

/// What a file is.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum HandlerFileKind {
    /// A picture.
    Image,
    /// A video (Telegram's video notes and animations too).
    Video,
    /// A sound file.
    Audio,
    /// A voice note.
    Voice,
    /// Any other file.
    File,
    /// A sticker.
    Sticker,
}

/// A file that came with an event (a photo, a voice note, a document). Its bytes are at `url`
/// on any worker, without an API token: the link is signed and expires (an hour by default);
/// a bad or expired one is answered 403.
#[derive(Serialize, ToSchema)]
#[schema(example = json!({"kind": "image", "mime": "image/jpeg", "size": 48213,
    "url": "https://bots-api.example.com/api/v1/files/eyJiIjoi….3q2-7w"}))]
pub(crate) struct HandlerAttachment {
    /// What it is.
    kind: HandlerFileKind,
    /// Its MIME type, when the platform says.
    mime: Option<String>,
    /// Its size in bytes, when the platform says.
    size: Option<u64>,
    /// Its file name, when it has one.
    name: Option<String>,
    /// `GET` it for the bytes (`{api-public-url}/api/v1/files/{id}`).
    url: String,
}

/// A file a `send` carries: `url` (the worker downloads it; a file link of the fleet's own is
/// read through the fleet, so a handler can send back what it was sent) or `data` (base64).
/// A file that cannot be had (unreachable, over `caps.max_file_bytes`, bad base64) refuses
/// the action with a reason.
#[derive(Serialize, ToSchema)]
#[schema(example = json!({"url": "https://files.example.com/report.pdf", "name": "report.pdf"}))]
pub(crate) struct HandlerOutFile {
    /// What to send it as; by default what `mime` suggests (`image/*` an image…), else a file.
    kind: Option<HandlerFileKind>,
    /// Where the bytes are (`http://`, `https://`).
    url: Option<String>,
    /// The bytes, base64.
    data: Option<String>,
    /// The file name shown.
    name: Option<String>,
    /// Its MIME type (by default what the download says, or what the name suggests).
    mime: Option<String>,
}

/// A button: `value` (a press sends the bot an `action` event with it) or `url` (opens a link).
#[derive(Serialize, ToSchema)]
pub(crate) struct HandlerButton {
    /// The label.
    text: String,
    /// Handed back on a press; any length.
    value: Option<String>,
    /// A link to open instead.
    url: Option<String>,
}

/// The type of an action.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum HandlerActionType {
    /// Send a message (`text`, `buttons`, `thread`, `ref`, `attachments`).
    Send,
    /// Replace a sent message's text (kept when absent) and buttons (none when absent), by
    /// `ref` or `message_id`.
    Edit,
    /// Delete a sent message, by `ref` or `message_id`.
    Delete,
    /// Show that the bot is typing.
    Typing,
    /// Answer the event itself (`text`, `alert`, `ephemeral`): a button press's toast, a
    /// command's reply.
    Answer,
    /// Send an approved message template (`name`, `language`, `components`): WhatsApp Cloud.
    Template,
}

/// One action of an answer, done in order. An action that cannot be done (an unknown type, an
/// unknown ref, beyond `caps`) is refused with a reason recorded on the event, and the next
/// one still runs.
#[derive(Serialize, ToSchema)]
#[schema(example = json!({"type": "send", "text": "Pick one", "ref": "menu",
    "buttons": [[{"text": "Yes", "value": "yes"}, {"text": "Docs", "url": "https://example.com"}]]}))]
pub(crate) struct HandlerAction {
    /// What to do.
    #[serde(rename = "type")]
    kind: HandlerActionType,
    /// `send`: the text; `edit`: the new text; `answer`: what to show.
    text: Option<String>,
    /// `send`, `edit`: rows of buttons.
    buttons: Option<Vec<Vec<HandlerButton>>>,
    /// `send`: reply in the event's thread, where the platform has threads.
    thread: Option<bool>,
    /// `send`: a name for the sent message (per chat, kept 48 h, on every worker); `edit`,
    /// `delete`: the message to change.
    #[serde(rename = "ref")]
    ref_name: Option<String>,
    /// `edit`, `delete`: the platform's id of the message, instead of a `ref`.
    message_id: Option<String>,
    /// `answer`: as a dialog rather than a toast (Telegram).
    alert: Option<bool>,
    /// `answer`: seen only by the user who acted (Slack, Discord). `send`: the same, where
    /// the send answers the user's interaction (a Discord command or button press).
    ephemeral: Option<bool>,
    /// `send`: files, sent with the text as their caption where the platform has captions.
    attachments: Option<Vec<HandlerOutFile>>,
    /// `template`: the approved template's name.
    name: Option<String>,
    /// `template`: its language code (`en_US`).
    language: Option<String>,
    /// `template`: its components with their parameters, as WhatsApp takes them.
    #[schema(value_type = Option<Vec<Object>>)]
    components: Option<serde_json::Value>,
}

/// The conversation an event belongs to.
#[derive(Serialize, ToSchema)]
pub(crate) struct HandlerChat {
    /// The bot's id in the registry.
    bot: String,
    /// The platform's id of the chat: a Telegram chat id, a Slack channel (`C…`, or
    /// `C…/thread_ts` inside a thread), a Discord channel id, a WhatsApp number or JID.
    chat: String,
}

/// A command a user gave the bot.
#[derive(Serialize, ToSchema)]
pub(crate) struct HandlerCommand {
    /// The name, without `/` or `@bot`.
    #[schema(example = "start")]
    name: String,
    /// The text after the name, trimmed; empty if none.
    #[schema(example = "deep-link")]
    args: String,
    /// Named options where the platform has them (Discord); `{}` otherwise.
    #[schema(value_type = Object)]
    options: serde_json::Value,
}

/// One event, POSTed to a bot's `webhook` handler as JSON. With a webhook secret the request
/// carries `x-botfleet-signature: sha256=<hex of HMAC-SHA256(secret, body)>`. A chat's events
/// come one at a time, in order; an event is sent again (same `event_id`, the next `attempt`)
/// when the handler failed transiently (unreachable, 429, 5xx, no answer within the bot's
/// handler timeout) or the worker that called it died before the reply was recorded.
#[derive(Serialize, ToSchema)]
#[schema(example = json!({
    "kind": "command", "event_id": "support-bot:1042", "attempt": 1, "platform": "telegram",
    "chat": {"bot": "support-bot", "chat": "7701"}, "message_id": "1042", "sender": "7701",
    "text": "/start@support_bot deep-link", "sent_at_ms": 1_764_669_600_000_i64,
    "command": {"name": "start", "args": "deep-link", "options": {}},
    "state": {"n": 3}
}))]
pub(crate) struct HandlerEvent {
    /// What the event is.
    kind: HandlerEventKind,
    /// Stable across redeliveries and replays (`{bot}:{journal key}`): a repeat has the same
    /// id.
    event_id: String,
    /// Which call for this event this is: 1, then 2, 3… after a call failed or was cut off at
    /// the handler timeout. Counted by the worker holding the chat's turn: a replay on another
    /// worker (after a crash) starts again at 1, with the same `event_id`. Answer any attempt
    /// of an event you answered before the same way: one answer is sent.
    attempt: u32,
    /// `telegram`, `slack`, `discord` or `whatsapp`.
    #[schema(example = "telegram")]
    platform: String,
    /// The conversation.
    chat: HandlerChat,
    /// The platform's id of the message (Telegram: the update id; Slack: the `ts`, a slash
    /// command's `trigger_id`).
    message_id: String,
    /// Who wrote it (the platform's user id), when known.
    sender: Option<String>,
    /// The text as written (a command's too, a file's caption); empty for messages without
    /// text.
    text: String,
    /// Files that came with it.
    attachments: Option<Vec<HandlerAttachment>>,
    /// Unix ms when the platform says it was sent, when known.
    sent_at_ms: Option<i64>,
    /// For `kind: command`.
    command: Option<HandlerCommand>,
    /// For `kind: edited`: the platform's id of the message that was edited.
    edited_message_id: Option<String>,
    /// For `kind: action`.
    action: Option<HandlerActionEvent>,
    /// What the platform and mode can do.
    caps: HandlerCaps,
    /// The chat's state as the handler last answered it (absent until it answers one).
    #[schema(value_type = Option<Object>)]
    state: Option<serde_json::Value>,
    /// What finishes this event's turn later (`POST /api/v1/replies/{reply_token}`, on any
    /// worker) after the handler answered `202`: signed by the fleet, bound to the bot, chat
    /// and event, valid until the turn ends or the bot's `async_reply_ttl_s` passes.
    reply_token: String,
}

/// What a handler answers: `200` with this JSON (or an empty body: nothing to send). Any other
/// 2xx but `202` is taken the same way; `202` (body ignored) holds the chat's turn open for an
/// answer that comes later through the event's `reply_token`; 429 and 5xx are retried with
/// backoff; other statuses and unreadable answers end the event as undeliverable.
#[derive(Serialize, ToSchema)]
#[schema(example = json!({"text": "Welcome! You are user 3.", "state": {"n": 4},
    "actions": [{"type": "send", "text": "Menu", "ref": "menu", "buttons": [[{"text": "Help", "value": "help"}]]},
                {"type": "typing"}]}))]
pub(crate) struct HandlerAnswer {
    /// Sent back to the chat (in its thread, where there is one), before `actions`. Absent,
    /// null or empty: nothing is sent.
    text: Option<String>,
    /// What to do, in order, after `text`.
    actions: Option<Vec<HandlerAction>>,
    /// `text` is seen only by the user who acted, where it answers their interaction (a
    /// Discord command or button press, whose answer a text is).
    ephemeral: Option<bool>,
    /// The chat's new state (any JSON up to 64 KiB), given to the chat's next event.
    /// Absent: the state stays as it was.
    #[schema(value_type = Option<Object>)]
    state: Option<serde_json::Value>,
}
