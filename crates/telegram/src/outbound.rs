//! [`Outbound`] messages → `sendMessage`.

use botfleet_core::Outbound;

use crate::{BotApi, TelegramClient, TelegramError};

/// Telegram's longest message, in characters; longer texts are cut (and marked).
pub const MAX_TEXT_CHARS: usize = 4096;

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
/// ephemeral: Telegram has no ephemeral messages), no threads, no files yet.
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
    files: false,
    max_text: MAX_TEXT_CHARS as u32,
};

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
            d.contains("message is not modified") || d.contains("message to delete not found")
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
        Act::Delete { message_id: id } => {
            let body = json!({ "chat_id": chat_id, "message_id": message_id(id)? });
            client.call_method(api, "deleteMessage", body).await
        }
        Act::Typing => {
            let body = json!({ "chat_id": chat_id, "action": "typing" });
            client.call_method(api, "sendChatAction", body).await
        }
        Act::Answer {
            event, text, alert, ..
        } => match &event.answer_handle {
            Some(query) => {
                let mut body = json!({ "callback_query_id": query, "show_alert": alert });
                if let Some(t) = text {
                    body["text"] = json!(t.chars().take(200).collect::<String>());
                }
                client.call_method(api, "answerCallbackQuery", body).await
            }
            // A command's answer is a message: Telegram has no other way to answer one.
            None => match text {
                Some(t) if !t.is_empty() => {
                    let body = json!({ "chat_id": chat_id, "text": fit(t) });
                    return Ok(client
                        .send_message_body(api, body)
                        .await?
                        .map(|id| id.to_string()));
                }
                _ => return Ok(None),
            },
        },
    };
    match r {
        Ok(_) => Ok(None),
        Err(e) if already_done(&e) => Ok(None),
        Err(e) => Err(e),
    }
}
