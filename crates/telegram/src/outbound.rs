//! [`Outbound`] messages → `sendMessage`.

use botfleet_core::{AttachmentKind, Outbound, Upload};

use crate::{BotApi, TelegramClient, TelegramError};

/// Telegram's longest message, in characters; longer texts are cut (and marked).
pub const MAX_TEXT_CHARS: usize = 4096;

/// Telegram's longest caption of a file, in characters: a longer text is sent as a message
/// of its own before the files.
pub(crate) const MAX_CAPTION_CHARS: usize = 1024;

/// How long a button press waits for the handler's answer before it is answered empty (the
/// client stops spinning; a later answer is a message): the user is not left watching a
/// spinner, and it is well within the ~15 s Telegram keeps a query answerable.
pub(crate) const CALLBACK_DEFER: std::time::Duration = std::time::Duration::from_secs(2);

/// The largest file a bot uploads through the Bot API (50 MB).
pub(crate) const MAX_UPLOAD_BYTES: u64 = 50 * 1024 * 1024;

/// Sends `out` through `client`. Texts over [`MAX_TEXT_CHARS`] are cut; empty texts are not
/// sent (Telegram refuses them).
///
/// # Errors
/// See [`TelegramError`].
pub async fn send(
    client: &TelegramClient,
    api: &BotApi,
    out: &Outbound,
) -> Result<(), TelegramError> {
    if out.text.is_empty() {
        return Ok(());
    }
    let text = fit(&out.text);
    // `out.reply_to` is the update id (the idempotency key's source), not Telegram's
    // message id, so replies are sent unthreaded.
    client.send_message(api, &out.chat.chat, &text, None).await
}

/// What Telegram bots can do: inline keyboards (up to 100 buttons, `callback_data` of 64
/// bytes), edits, deletes, `sendChatAction`, `answerCallbackQuery` (a toast or an alert, never
/// ephemeral: Telegram has no ephemeral messages), files in and out (up to 10 a send, 50 MB
/// each: `sendPhoto`, `sendDocument`, …, `sendMediaGroup`), no threads.
pub const CAPS: botfleet_core::Caps = botfleet_core::Caps {
    buttons: true,
    max_buttons: 100,
    max_button_value: 64,
    edit: true,
    delete: true,
    typing: true,
    answer: true,
    ephemeral: false,
    threads: false,
    files: true,
    max_files: 10,
    max_file_bytes: MAX_UPLOAD_BYTES,
    max_text: MAX_TEXT_CHARS as u32,
    commands: true,
    streams: true,
    templates: false,
    reply_window_s: 0,
};

/// Whether a streamed answer in chat `chat` goes as message drafts: a private chat (a
/// user's own id, positive; groups and channels are negative), where Telegram has
/// `sendMessageDraft`.
pub(crate) fn drafts_in(chat: &str) -> bool {
    chat.parse::<i64>().is_ok_and(|id| id > 0)
}

/// The prefix of a streamed answer's id while it is a draft (before its message is sent).
const DRAFT_PREFIX: &str = "draft:";

/// A draft id for the stream whose first step had the key `key`: stable across replays
/// (a worker that takes the turn over shows the same draft), non-zero, 31 bits.
fn draft_id(key: &str) -> i64 {
    // FNV-1a: stable across builds and processes.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    i64::try_from(h % 0x7fff_ffff).unwrap_or(0) + 1
}

/// Does one step of a streamed answer in the private chat `chat_id` as message drafts:
/// the start and each addition show the whole text so far as the draft (`sendMessageDraft`,
/// one `draft_id` per stream); the stop sends it as a message (`sendMessage`), whose id it
/// answers. The start answers the draft's stand-in id.
///
/// # Errors
/// See [`TelegramError`].
pub(crate) async fn stream(
    client: &TelegramClient,
    api: &BotApi,
    chat_id: &str,
    step: botfleet_platform::StreamStep<'_>,
    key: &str,
) -> Result<Option<String>, TelegramError> {
    use botfleet_platform::StreamStep;
    let draft = |id: &str| {
        id.strip_prefix(DRAFT_PREFIX)
            .and_then(|n| n.parse::<i64>().ok())
            .ok_or_else(|| TelegramError::Refused {
                status: 400,
                description: "not a draft of a streamed answer".into(),
            })
    };
    match step {
        StreamStep::Start { text } => {
            let id = draft_id(key);
            client
                .send_message_draft(api, chat_id, id, &fit(text))
                .await?;
            Ok(Some(format!("{DRAFT_PREFIX}{id}")))
        }
        StreamStep::Append {
            message_id, text, ..
        } => {
            client
                .send_message_draft(api, chat_id, draft(message_id)?, &fit(text))
                .await?;
            Ok(None)
        }
        StreamStep::Stop { message_id, text } => {
            if draft(message_id).is_err() {
                // Sent before (a replayed stop): done.
                return Ok(None);
            }
            answer_as_message(client, api, chat_id, Some(text)).await
        }
    }
}

/// `text` cut to [`MAX_TEXT_CHARS`] (and marked) when longer.
fn fit(text: &str) -> std::borrow::Cow<'_, str> {
    botfleet_core::fit_text(text, MAX_TEXT_CHARS)
}

/// The `inline_keyboard` markup of `rows`: value buttons carry `callback_data`, link buttons
/// `url`.
pub fn keyboard(rows: &[Vec<botfleet_core::Button>]) -> serde_json::Value {
    let rows: Vec<Vec<serde_json::Value>> = rows
        .iter()
        .map(|row| {
            row.iter()
                .map(|b| match (&b.url, &b.value) {
                    (Some(url), _) => serde_json::json!({"text": b.text, "url": url}),
                    (None, v) => serde_json::json!({
                        "text": b.text,
                        "callback_data": v.as_deref().unwrap_or_default(),
                    }),
                })
                .collect()
        })
        .collect();
    serde_json::json!({ "inline_keyboard": rows })
}

/// Whether `e` says the request changed nothing that it had not already changed (an edit to
/// the same text, a delete of a message already gone): a replayed action, done.
fn already_done(e: &TelegramError) -> bool {
    match e {
        TelegramError::Refused {
            status: 400,
            description,
        } => {
            let d = description.to_ascii_lowercase();
            d.contains("message is not modified")
                || d.contains("message to delete not found")
                // A callback answered before (a replay): the client has its answer.
                || d.contains("query is too old")
        }
        _ => false,
    }
}

/// Does one resolved action for the chat `chat_id`: the sent message's id for a `send`.
///
/// # Errors
/// See [`TelegramError`].
pub async fn act(
    client: &TelegramClient,
    api: &BotApi,
    chat_id: &str,
    act: &botfleet_core::Act<'_>,
) -> Result<Option<String>, TelegramError> {
    use botfleet_core::Act;
    use serde_json::json;
    let message_id = |id: &str| -> Result<i64, TelegramError> {
        id.parse::<i64>().map_err(|_| TelegramError::Refused {
            status: 400,
            description: format!(
                "{:?} is not a Telegram message id",
                id.chars().take(32).collect::<String>()
            ),
        })
    };
    let r = match act {
        Act::Send {
            text,
            buttons,
            files,
            ..
        } if !files.is_empty() => {
            return send_files(client, api, chat_id, text, buttons, files).await
        }
        Act::Send { text, buttons, .. } => {
            let mut body = json!({ "chat_id": chat_id, "text": fit(text) });
            if !buttons.is_empty() {
                body["reply_markup"] = keyboard(buttons);
            }
            return Ok(client
                .send_message_body(api, body)
                .await?
                .map(|id| id.to_string()));
        }
        Act::Edit {
            message_id: id,
            text,
            buttons,
            ..
        } => {
            let mut body = json!({ "chat_id": chat_id, "message_id": message_id(id)? });
            if !buttons.is_empty() {
                body["reply_markup"] = keyboard(buttons);
            }
            match text {
                Some(t) => {
                    body["text"] = json!(fit(t));
                    client.call_method(api, "editMessageText", body).await
                }
                None => {
                    client
                        .call_method(api, "editMessageReplyMarkup", body)
                        .await
                }
            }
        }
        Act::Delete { message_id: id, .. } => {
            let body = json!({ "chat_id": chat_id, "message_id": message_id(id)? });
            client.call_method(api, "deleteMessage", body).await
        }
        Act::Typing => {
            let body = json!({ "chat_id": chat_id, "action": "typing" });
            client.call_method(api, "sendChatAction", body).await
        }
        Act::Template { .. } => {
            return Err(TelegramError::Refused {
                status: 400,
                description: "Telegram has no message templates".into(),
            })
        }
        Act::Defer { event } => match &event.answer_handle {
            // The client stops spinning; a later answer is a message.
            Some(query) => {
                let body = json!({ "callback_query_id": query });
                client.call_method(api, "answerCallbackQuery", body).await
            }
            None => return Ok(None),
        },
        Act::Answer {
            event,
            text,
            alert,
            deferred,
            answered,
            ..
        } => match &event.answer_handle {
            // A command's answer is a message: Telegram has no other way to answer one. So is
            // a press's answered already (empty, because the handler took long, or by an
            // earlier `answer`): a query is answered once.
            None => return answer_as_message(client, api, chat_id, *text).await,
            Some(_) if *deferred || *answered => {
                return answer_as_message(client, api, chat_id, *text).await
            }
            Some(query) => {
                let mut body = json!({ "callback_query_id": query, "show_alert": alert });
                if let Some(t) = text {
                    body["text"] = json!(t.chars().take(200).collect::<String>());
                }
                match client.call_method(api, "answerCallbackQuery", body).await {
                    // Answered before: acknowledged at its deadline by the worker that
                    // received it while this turn ran on another. The text still shows, as
                    // a message.
                    Err(e) if already_done(&e) && text.is_some_and(|t| !t.is_empty()) => {
                        return answer_as_message(client, api, chat_id, *text).await
                    }
                    r => r,
                }
            }
        },
    };
    match r {
        Ok(_) => Ok(None),
        Err(e) if already_done(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// An answer sent as a message of its own (none without a text): its id.
async fn answer_as_message(
    client: &TelegramClient,
    api: &BotApi,
    chat_id: &str,
    text: Option<&str>,
) -> Result<Option<String>, TelegramError> {
    let Some(t) = text.filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    let body = serde_json::json!({ "chat_id": chat_id, "text": fit(t) });
    Ok(client
        .send_message_body(api, body)
        .await?
        .map(|id| id.to_string()))
}

/// The method and field that send one file of `kind` (`sendPhoto` with `photo`, …).
fn method_of(kind: AttachmentKind) -> (&'static str, &'static str) {
    match kind {
        AttachmentKind::Image => ("sendPhoto", "photo"),
        AttachmentKind::Video => ("sendVideo", "video"),
        AttachmentKind::Audio => ("sendAudio", "audio"),
        AttachmentKind::Voice => ("sendVoice", "voice"),
        AttachmentKind::Sticker => ("sendSticker", "sticker"),
        AttachmentKind::File => ("sendDocument", "document"),
    }
}

/// The `InputMedia` type of `kind` in a media group, when it can be in one.
fn group_type(kind: AttachmentKind) -> Option<&'static str> {
    match kind {
        AttachmentKind::Image => Some("photo"),
        AttachmentKind::Video => Some("video"),
        AttachmentKind::Audio => Some("audio"),
        AttachmentKind::File => Some("document"),
        AttachmentKind::Voice | AttachmentKind::Sticker => None,
    }
}

/// Whether `files` can go as one `sendMediaGroup` (2–10 files; photos and videos together,
/// documents together, audio together, as Telegram groups them).
fn one_group(files: &[Upload]) -> bool {
    let family = |k: AttachmentKind| match k {
        AttachmentKind::Image | AttachmentKind::Video => Some(0),
        AttachmentKind::File => Some(1),
        AttachmentKind::Audio => Some(2),
        _ => None,
    };
    (2..=10).contains(&files.len())
        && family(files[0].kind).is_some()
        && files
            .iter()
            .all(|f| family(f.kind) == family(files[0].kind))
}

/// A file as a multipart part.
fn part(f: &Upload) -> Result<reqwest::multipart::Part, TelegramError> {
    botfleet_platform::upload_part(f).map_err(|e| TelegramError::Refused {
        status: 400,
        description: e.to_string(),
    })
}

/// Sends `files` with `text` and `buttons`: the text as the caption where it fits, and as a
/// message of its own (first) when it is too long, when there are buttons under several
/// files (a media group takes none) or with a sticker. Answers the id of the message a ref
/// names: the one with the buttons, else the first.
async fn send_files(
    client: &TelegramClient,
    api: &BotApi,
    chat_id: &str,
    text: &str,
    buttons: &[Vec<botfleet_core::Button>],
    files: &[Upload],
) -> Result<Option<String>, TelegramError> {
    use serde_json::json;
    let grouped = one_group(files);
    let captioned = !text.is_empty()
        && text.chars().count() <= MAX_CAPTION_CHARS
        && files[0].kind != AttachmentKind::Sticker
        && (buttons.is_empty() || (files.len() == 1 && !grouped));
    let mut first: Option<i64> = None;
    if !text.is_empty() && !captioned {
        let mut body = json!({ "chat_id": chat_id, "text": fit(text) });
        if !buttons.is_empty() {
            body["reply_markup"] = keyboard(buttons);
        }
        first = client.send_message_body(api, body).await?;
    }
    let id_of = |v: &serde_json::Value| v.get("message_id").and_then(serde_json::Value::as_i64);
    if grouped {
        let mut form = reqwest::multipart::Form::new().text("chat_id", chat_id.to_owned());
        let mut media = Vec::with_capacity(files.len());
        for (i, f) in files.iter().enumerate() {
            let mut m = json!({
                "type": group_type(f.kind).unwrap_or("document"),
                "media": format!("attach://f{i}"),
            });
            if i == 0 && captioned {
                m["caption"] = json!(text);
            }
            media.push(m);
            form = form.part(format!("f{i}"), part(f)?);
        }
        form = form.text("media", serde_json::Value::Array(media).to_string());
        let sent = client.call_multipart(api, "sendMediaGroup", form).await?;
        first = first.or_else(|| sent.as_array().and_then(|a| a.first()).and_then(id_of));
    } else {
        for (i, f) in files.iter().enumerate() {
            let (method, field) = method_of(f.kind);
            let mut form = reqwest::multipart::Form::new()
                .text("chat_id", chat_id.to_owned())
                .part(field, part(f)?);
            if i == 0 && captioned {
                form = form.text("caption", text.to_owned());
                if !buttons.is_empty() {
                    form = form.text("reply_markup", keyboard(buttons).to_string());
                }
            }
            let sent = client.call_multipart(api, method, form).await?;
            first = first.or_else(|| id_of(&sent));
        }
    }
    Ok(first.map(|id| id.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(kind: AttachmentKind) -> Upload {
        Upload {
            kind,
            name: "f".into(),
            mime: "application/octet-stream".into(),
            data: vec![1].into(),
        }
    }

    #[test]
    fn files_group_as_telegram_groups_them() {
        use AttachmentKind::*;
        assert!(!one_group(&[up(Image)]), "one file is no group");
        assert!(one_group(&[up(Image), up(Video)]));
        assert!(one_group(&[up(File), up(File)]));
        assert!(!one_group(&[up(Image), up(File)]));
        assert!(!one_group(&[up(Voice), up(Voice)]));
        assert!(!one_group(&vec![up(Image); 11]));
        assert_eq!(method_of(Voice), ("sendVoice", "voice"));
        assert_eq!(method_of(File), ("sendDocument", "document"));
    }
}

/// Telegram's documented send limits: about one message a second in a chat, 20 a minute in
/// a group, 30 a second over all of a bot's chats.
pub mod limits {
    use botfleet_platform::{Bucket, Call, Limit, StreamStep};

    /// Messages to one chat.
    pub const CHAT: Limit = Limit::every(1, 1, 1);
    /// Messages to one group (a chat whose id is negative: groups, supergroups, channels).
    pub const GROUP: Limit = Limit::every(20, 60, 1);
    /// Messages from the bot, over all its chats.
    pub const BOT: Limit = Limit::every(30, 1, 30);

    /// Every scope and its limit.
    pub const SCOPES: &[(&str, Limit)] = &[("chat", CHAT), ("group", GROUP), ("bot", BOT)];

    /// The buckets `call` in `chat` counts against: a new message (a send, and a draft's
    /// end, which sends the message) counts against its chat, its group and the bot; edits,
    /// deletes, typing, answers to presses and a draft's changes are not counted (an edit
    /// stream is paced per message by the runtime; a draft is made to change often).
    pub fn buckets(chat: &str, call: Call<'_>) -> Vec<Bucket> {
        let message = matches!(
            call,
            Call::Act(botfleet_core::Act::Send { .. }) | Call::Stream(StreamStep::Stop { .. })
        );
        if !message {
            return Vec::new();
        }
        let mut b = vec![Bucket::of("chat", chat, CHAT), Bucket::bot("bot", BOT)];
        if chat.starts_with('-') {
            b.push(Bucket::of("group", chat, GROUP));
        }
        b
    }
}
