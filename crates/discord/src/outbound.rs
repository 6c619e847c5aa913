//! Replies as `POST /channels/{id}/messages`.

use botfleet_core::Outbound;

use crate::{DiscordApi, DiscordClient, DiscordError};

/// Discord's limit on a message's content, in characters.
const MAX_CONTENT: usize = 2000;

/// Sends `out` to its channel (as a reply to the message it answers). Longer texts go out in
/// pieces of at most 2,000 characters.
pub(crate) async fn send(
    client: &DiscordClient,
    api: &DiscordApi,
    out: &Outbound,
) -> Result<(), DiscordError> {
    let chars: Vec<char> = out.text.chars().collect();
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
        let nonce = nonce_of(&out.idempotency_key, i);
        client
            .create_message(
                api,
                &out.chat.chat,
                piece,
                if i == 0 {
                    out.reply_to.as_deref()
                } else {
                    None
                },
                &nonce,
            )
            .await?;
    }
    Ok(())
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
