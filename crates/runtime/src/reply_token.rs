//! Reply tokens: what a handler that answers later (a `202`) finishes its turn with, through
//! `POST /api/v1/replies/{reply_token}` on any worker. A token names the turn it belongs to — the
//! bot (its unit), the chat and the event's journal entry — and until when it may be used;
//! it is signed with a key the whole fleet shares (made once, kept in the store), so any
//! worker can check it without asking anyone, and nobody can make one for another turn.
//!
//! It names no fence: the turn may be taken over by another worker (a kill, a hand-over)
//! and the token still finds it.
//!

use base64::Engine;
use botfleet_core::BotId;
use botfleet_store::{Store, StoreError};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// The fleet secret the tokens are signed with (not the file links' key).
const REPLY_KEY: &str = "reply-tokens";

/// Bytes of HMAC-SHA256 kept in a token.
const SIG_BYTES: usize = 20;

/// Put before the payload in what is signed, so no other signed thing of the fleet can pass
/// for a token.
const DOMAIN: &str = "botfleet-reply-token-v1:";

/// The version prefix of a token.
const VERSION: &str = "r1.";

/// Tokens longer than this are refused unread.
const MAX_TOKEN: usize = 2_048;

/// The turn a reply token belongs to, and until when it may be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReplyClaim {
    /// The unit whose turn it is (the bot, or its slice).
    pub(crate) bot: BotId,
    /// The chat.
    pub(crate) chat: String,
    /// The journal key of the event the turn answers.
    pub(crate) entry: String,
    /// Unix milliseconds after which it is refused as expired.
    pub(crate) expires_ms: i64,
}

/// Why a token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TokenRefusal {
    /// Not made by this fleet (or damaged): answered as an unknown token is.
    #[error("unknown reply token")]
    Unknown,
    /// Made by this fleet, but its time is over.
    #[error("the reply token expired")]
    Expired,
}

/// What a token carries, as signed.
#[derive(Serialize, Deserialize)]
struct Payload {
    b: String,
    c: String,
    k: String,
    e: i64,
}

/// The fleet's reply-token key, made and stored once for the fleet.
///
/// # Errors
/// The store's failures.
pub(crate) async fn key(store: &dyn Store) -> Result<Vec<u8>, StoreError> {
    fleet_key(store, REPLY_KEY).await
}

/// The fleet's signing key `name` (32 random bytes, made by the first worker that asks and
/// kept in the store, so every worker signs and checks with the same one).
///
/// # Errors
/// The store's failures; no randomness.
pub(crate) async fn fleet_key(store: &dyn Store, name: &str) -> Result<Vec<u8>, StoreError> {
    let mut fresh = [0u8; 32];
    getrandom::fill(&mut fresh)
        .map_err(|e| StoreError::Secrets(format!("no randomness for a key: {e}")))?;
    store.fleet_secret(name, &fresh).await
}

fn mac(key: &[u8], payload: &str) -> Vec<u8> {
    // HMAC accepts keys of any length: new_from_slice cannot fail.
    match Hmac::<Sha256>::new_from_slice(key) {
        Ok(mut m) => {
            m.update(DOMAIN.as_bytes());
            m.update(payload.as_bytes());
            m.finalize().into_bytes()[..SIG_BYTES].to_vec()
        }
        Err(_) => Vec::new(),
    }
}

/// The token for `claim`, signed with `key`: `r1.{payload}.{signature}`, URL-safe.
pub(crate) fn sign(key: &[u8], claim: &ReplyClaim) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let payload = Payload {
        b: claim.bot.to_string(),
        c: claim.chat.clone(),
        k: claim.entry.clone(),
        e: claim.expires_ms,
    };
    let payload = b64.encode(serde_json::to_vec(&payload).unwrap_or_default());
    let sig = b64.encode(mac(key, &payload));
    format!("{VERSION}{payload}.{sig}")
}

/// The turn `token` names, when this fleet's `key` signed it and it has not expired by
/// `now_ms` (unix milliseconds).
///
/// # Errors
/// [`TokenRefusal::Unknown`] for anything this fleet did not sign, whatever its shape;
/// [`TokenRefusal::Expired`] for one it did whose time is over.
pub(crate) fn verify(key: &[u8], token: &str, now_ms: i64) -> Result<ReplyClaim, TokenRefusal> {
    if token.len() > MAX_TOKEN {
        return Err(TokenRefusal::Unknown);
    }
    let rest = token.strip_prefix(VERSION).ok_or(TokenRefusal::Unknown)?;
    let (payload, sig) = rest.split_once('.').ok_or(TokenRefusal::Unknown)?;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let sig = b64.decode(sig).map_err(|_| TokenRefusal::Unknown)?;
    let want = mac(key, payload);
    if want.is_empty() || !botfleet_platform::secrets_match(&sig, &want) {
        return Err(TokenRefusal::Unknown);
    }
    let raw = b64.decode(payload).map_err(|_| TokenRefusal::Unknown)?;
    let p: Payload = serde_json::from_slice(&raw).map_err(|_| TokenRefusal::Unknown)?;
    let bot = BotId::new(p.b).map_err(|_| TokenRefusal::Unknown)?;
    if p.e < now_ms {
        return Err(TokenRefusal::Expired);
    }
    Ok(ReplyClaim {
        bot,
        chat: p.c,
        entry: p.k,
        expires_ms: p.e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim() -> ReplyClaim {
        ReplyClaim {
            bot: BotId::new("agent-7").unwrap(),
            chat: "-100123/thread 4".into(),
            entry: "tg:991".into(),
            expires_ms: 2_000,
        }
    }

    #[test]
    fn a_token_names_its_turn_until_it_expires() {
        let key = [7u8; 32];
        let t = sign(&key, &claim());
        assert!(t.starts_with(VERSION));
        assert!(
            t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)),
            "URL-safe: {t}"
        );
        assert_eq!(verify(&key, &t, 1_999), Ok(claim()));
        assert_eq!(verify(&key, &t, 2_000), Ok(claim()));
        assert_eq!(verify(&key, &t, 2_001), Err(TokenRefusal::Expired));
    }

    #[test]
    fn nothing_but_the_fleets_own_token_passes() {
        let key = [7u8; 32];
        let t = sign(&key, &claim());
        // Another fleet's key.
        assert_eq!(verify(&[8u8; 32], &t, 0), Err(TokenRefusal::Unknown));
        // Another turn, its payload swapped in under the first one's signature.
        let mut other = claim();
        other.chat = "-100124".into();
        let o = sign(&key, &other);
        let (_, sig) = t.rsplit_once('.').unwrap();
        let (payload, _) = o.rsplit_once('.').unwrap();
        let forged = format!("{payload}.{sig}");
        assert_eq!(verify(&key, &forged, 0), Err(TokenRefusal::Unknown));
        // A later expiry, re-encoded without the key.
        let mut later = claim();
        later.expires_ms = i64::MAX;
        let unsigned = sign(&[0u8; 32], &later);
        assert_eq!(verify(&key, &unsigned, 0), Err(TokenRefusal::Unknown));
        // Every one-byte change of a real token.
        let bytes = t.as_bytes();
        for i in 0..bytes.len() {
            let mut b = bytes.to_vec();
            b[i] = if b[i] == b'A' { b'B' } else { b'A' };
            let s = String::from_utf8(b).unwrap();
            if s != t {
                assert_eq!(verify(&key, &s, 0), Err(TokenRefusal::Unknown), "{s}");
            }
        }
        // Shapes that are not tokens at all.
        for junk in [
            "",
            "r1.",
            "r1..",
            "x.y.z",
            "r1.%%%.%%%",
            &"r1.a".repeat(1_000),
        ] {
            assert_eq!(verify(&key, junk, 0), Err(TokenRefusal::Unknown), "{junk}");
        }
        // A file link's key signing the same payload is not this fleet's reply token.
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let payload = t.strip_prefix(VERSION).unwrap().split('.').next().unwrap();
        let bare = {
            let mut m = Hmac::<Sha256>::new_from_slice(&key).unwrap();
            m.update(payload.as_bytes());
            b64.encode(&m.finalize().into_bytes()[..SIG_BYTES])
        };
        let undomained = format!("{VERSION}{payload}.{bare}");
        assert_eq!(verify(&key, &undomained, 0), Err(TokenRefusal::Unknown));
    }

    #[tokio::test]
    async fn the_key_is_made_once_for_the_fleet() {
        let store = botfleet_store::MemoryStore::new();
        let a = key(&store).await.unwrap();
        let b = key(&store).await.unwrap();
        assert_eq!(a, b);
        assert_eq!(a.len(), 32);
    }
}
