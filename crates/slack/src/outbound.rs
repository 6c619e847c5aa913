//! [`Outbound`] messages → `chat.postMessage`.

use botfleet_core::Outbound;

use crate::{SlackApi, SlackClient, SlackError};

/// The longest text sent, in characters; Slack truncates beyond 40,000 (longer texts are cut
/// here, and marked).
pub const MAX_TEXT_CHARS: usize = 40_000;

/// The channel and thread of a chat key's chat: `C123` or `C123/1700000000.000100`.
pub fn channel_and_thread(chat: &str) -> (&str, Option<&str>) {
    match chat.split_once('/') {
        Some((c, t)) if !t.is_empty() => (c, Some(t)),
        _ => (chat, None),
    }
}

/// Sends `out` through `client`, in its thread when the message answered was in one. Empty
/// texts are not sent.
///
/// # Errors
/// See [`SlackError`].
pub async fn send(client: &SlackClient, api: &SlackApi, out: &Outbound) -> Result<(), SlackError> {
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
    let (channel, thread) = channel_and_thread(&out.chat.chat);
    client.post_message(api, channel, &text, thread).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chats_name_their_thread() {
        assert_eq!(channel_and_thread("C1"), ("C1", None));
        assert_eq!(channel_and_thread("C1/1.2"), ("C1", Some("1.2")));
        assert_eq!(channel_and_thread("C1/"), ("C1/", None));
    }
}
