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
    let text: std::borrow::Cow<'_, str> = if out.text.chars().count() > MAX_TEXT_CHARS {
        let mut t: String = out.text.chars().take(MAX_TEXT_CHARS - 1).collect();
        t.push('…');
        t.into()
    } else {
        out.text.as_str().into()
    };
    // `out.reply_to` is the update id (the idempotency key's source), not Telegram's
    // message id, so replies are sent unthreaded.
    client.send_message(api, &out.chat.chat, &text, None).await
}
