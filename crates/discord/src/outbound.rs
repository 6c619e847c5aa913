//! Replies as `POST /channels/{id}/messages`; edits, deletes and typing.

use botfleet_core::{Act, Outbound};
use botfleet_platform::PlatformError;

use crate::{DiscordApi, DiscordClient, DiscordError};

/// Discord's limit on a message's content, in characters.
const MAX_CONTENT: usize = 2000;

/// What Discord bots do here: edits, deletes and typing in the channel, files in and out (up
/// to 10 a message, 10 MiB each: Discord's limit for a bot in an unboosted server). Buttons (message
/// components) and answers come with interactions, which this version does not read yet.
pub const CAPS: botfleet_core::Caps = botfleet_core::Caps {
    edit: true,
    delete: true,
    typing: true,
    files: true,
    max_files: 10,
    max_file_bytes: 10 * 1024 * 1024,
    max_text: MAX_CONTENT as u32,
    ..botfleet_core::Caps::TEXT_ONLY
};

/// Does one resolved action in `channel`: the id of the (first) message a `send` made.
/// Buttons and answers wait for interactions: refused as unsupported.
pub(crate) async fn act(
    client: &DiscordClient,
    api: &DiscordApi,
    channel: &str,
    act: &Act<'_>,
    key: &str,
) -> Result<Option<String>, PlatformError> {
    let r = match act {
        Act::Send {
            text,
            buttons: [],
            thread_of,
            files: [],
        } => {
            let reply_to = thread_of.map(|m| m.message_id.as_str());
            return Ok(send_text(client, api, channel, text, reply_to, key).await?);
        }
        Act::Send {
            text,
            buttons: [],
            thread_of,
            files,
        } => {
            // One message: the text (cut to Discord's 2,000 characters) and every file.
            let mut body = serde_json::json!({
                "content": text.chars().take(MAX_CONTENT).collect::<String>(),
                "nonce": nonce_of(key, 0),
                "enforce_nonce": true,
            });
            if let Some(m) = thread_of {
                body["message_reference"] =
                    serde_json::json!({ "message_id": m.message_id, "fail_if_not_exists": false });
            }
            return Ok(client
                .create_message_with(api, channel, body, files)
                .await?);
        }
        Act::Edit {
            message_id,
            text,
            buttons: [],
        } => {
            let text = text.map(|t| t.chars().take(MAX_CONTENT).collect::<String>());
            client
                .edit_message(api, channel, message_id, text.as_deref())
                .await
        }
        Act::Delete { message_id } => client.delete_message(api, channel, message_id).await,
        Act::Typing => client.trigger_typing(api, channel).await,
        other => return Err(botfleet_platform::unsupported(other)),
    };
    match r {
        // Deleted before (a replayed delete), or the message is gone: nothing left to do.
        Err(DiscordError::Rejected { status: 404, .. }) if matches!(act, Act::Delete { .. }) => {
            Ok(None)
        }
        r => Ok(r.map(|()| None)?),
    }
}

/// Sends `out` to its channel (as a reply to the message it answers). Longer texts go out in
/// pieces of at most 2,000 characters. Answers the first piece's id.
pub(crate) async fn send(
    client: &DiscordClient,
    api: &DiscordApi,
    out: &Outbound,
) -> Result<Option<String>, DiscordError> {
    send_text(
        client,
        api,
        &out.chat.chat,
        &out.text,
        out.reply_to.as_deref(),
        &out.idempotency_key,
    )
    .await
}

/// [`send`] of `text` to `channel`, answering `reply_to`, under the idempotency key `key`.
async fn send_text(
    client: &DiscordClient,
    api: &DiscordApi,
    channel: &str,
    text: &str,
    reply_to: Option<&str>,
    key: &str,
) -> Result<Option<String>, DiscordError> {
    let mut first = None;
    let chars: Vec<char> = text.chars().collect();
    let pieces: Vec<String> = if chars.is_empty() {
        vec![String::new()]
    } else {
        chars
            .chunks(MAX_CONTENT)
            .map(|c| c.iter().collect())
            .collect()
    };
    for (i, piece) in pieces.iter().enumerate() {
        // The nonce makes a retried send land once: from the idempotency key, at most 25
        // characters.
        let nonce = nonce_of(key, i);
        let id = client
            .create_message(
                api,
                channel,
                piece,
                if i == 0 { reply_to } else { None },
                &nonce,
            )
            .await?;
        if i == 0 {
            first = id;
        }
    }
    Ok(first)
}

/// A 25-character nonce from a key and a piece number (FNV-1a, hex).
fn nonce_of(key: &str, piece: usize) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes().chain(piece.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("bf{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_are_stable_short_and_distinct() {
        assert_eq!(nonce_of("a:1:reply", 0), nonce_of("a:1:reply", 0));
        assert_ne!(nonce_of("a:1:reply", 0), nonce_of("a:1:reply", 1));
        assert!(nonce_of("a:1:reply", 0).len() <= 25);
    }
}
