//! The webhook side of the seam: platforms that POST updates to the fleet (Telegram webhook
//! mode, Slack Events API, WhatsApp Cloud API). Every worker takes these requests; the
//! platform verifies and reads them, the runtime journals, orders and answers them.

use std::sync::Arc;

use botfleet_core::{BotSpec, Platform};

use crate::{PlatformError, Received, Sender};

/// A request a platform made to `/hooks/{platform}/{bot}`.
#[derive(Clone, Copy, Debug)]
pub struct HookRequest<'a> {
    /// `GET` or `POST`.
    pub method: &'a str,
    /// Headers, names in lowercase.
    pub headers: &'a [(String, String)],
    /// The raw query string (without `?`).
    pub query: &'a str,
    /// The raw body.
    pub body: &'a [u8],
}

impl HookRequest<'_> {
    /// The first value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The first value of query parameter `name`, percent-decoded.
    pub fn query_param(&self, name: &str) -> Option<String> {
        self.query.split('&').find_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k) == name).then(|| decode(v))
        })
    }
}

/// The pairs of an `application/x-www-form-urlencoded` body, decoded (a body that is not
/// UTF-8 has none; a name given twice keeps its first value).
pub fn form_pairs(body: &[u8]) -> Vec<(String, String)> {
    let Ok(text) = std::str::from_utf8(body) else {
        return Vec::new();
    };
    let mut out: Vec<(String, String)> = Vec::new();
    for pair in text.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let k = decode(k);
        if !out.iter().any(|(have, _)| *have == k) {
            out.push((k, decode(v)));
        }
    }
    out
}

/// `application/x-www-form-urlencoded` decoding of one component.
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What to do with a verified request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookAnswer {
    /// Journal these messages (and record when the users of `seen` wrote), then answer 200
    /// (the platform retries anything else).
    Deliver {
        /// Messages to handle, in the order the platform sent them.
        messages: Vec<Received>,
        /// Chats whose users wrote something not handled (a location, a reaction), and when
        /// (unix ms): not journaled, but recorded as when the user last wrote (a reply window
        /// renews).
        seen: Vec<(String, i64)>,
        /// Deliveries of kinds the bot does not handle (status updates, reactions...).
        ignored: usize,
        /// Deliveries that could not be read (answered 200: a retry would not read better).
        malformed: usize,
    },
    /// Answer at once with this (handshakes: Slack's `url_verification`, WhatsApp's
    /// `hub.challenge`); nothing to journal.
    Respond {
        /// HTTP status.
        status: u16,
        /// `Content-Type`.
        content_type: &'static str,
        /// Body.
        body: String,
    },
}

/// Why a request was refused before anything was stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HookRefusal {
    /// 401 (no or bad signature), 403 (a handshake with the wrong token), 405 (method).
    pub status: u16,
    /// A short label for metrics and logs (`bad_signature`, `stale_timestamp`...).
    pub reason: &'static str,
}

/// A platform that delivers by webhook.
pub trait Webhooks: Send + Sync + std::fmt::Debug {
    /// Which platform this is (the `{platform}` of the path).
    fn platform(&self) -> Platform;

    /// Verifies `req` for `spec` by the platform's own scheme, then reads it. Runs before
    /// anything is stored; never panics on any input.
    ///
    /// # Errors
    /// A refusal with its status when the request is not the platform's.
    fn receive(&self, spec: &BotSpec, req: &HookRequest<'_>) -> Result<HookAnswer, HookRefusal>;

    /// What sends `spec`'s replies from this worker.
    ///
    /// # Errors
    /// A spec the platform cannot send for (a bad API URL).
    fn sender(&self, spec: &BotSpec) -> Result<Arc<dyn Sender>, PlatformError>;
}

/// The receiver of a webhook bot's unit: nothing arrives this way (deliveries reach every
/// worker's hooks address), so it waits until closed.
#[derive(Debug, Default)]
pub struct NoDeliveries;

#[async_trait::async_trait]
impl crate::Receiver for NoDeliveries {
    async fn next(&mut self) -> Result<crate::Batch, PlatformError> {
        std::future::pending().await
    }

    async fn ack(&mut self, _ack: crate::Ack) -> Result<Option<String>, PlatformError> {
        Ok(None)
    }

    async fn close(&mut self) {}
}

/// Compares two secrets in time that does not depend on where they differ.
pub fn secrets_match(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_params_decode() {
        let headers = Vec::new();
        let r = HookRequest {
            method: "GET",
            headers: &headers,
            query: "hub.mode=subscribe&hub.verify_token=a%20b+c&hub.challenge=12%",
            body: b"",
        };
        assert_eq!(r.query_param("hub.verify_token").as_deref(), Some("a b c"));
        assert_eq!(r.query_param("hub.challenge").as_deref(), Some("12%"));
        assert_eq!(r.query_param("nope"), None);
    }

    #[test]
    fn form_bodies_decode() {
        let pairs = form_pairs(b"command=%2Fweather&text=94070+caf%C3%A9&text=again&empty=&flag");
        assert_eq!(
            pairs,
            [
                ("command".into(), "/weather".into()),
                ("text".into(), "94070 café".into()),
                ("empty".into(), String::new()),
                ("flag".into(), String::new()),
            ]
        );
        assert!(form_pairs(b"\xff\xfe=1").is_empty());
        assert!(form_pairs(b"").is_empty());
    }

    #[test]
    fn secrets_compare() {
        assert!(secrets_match(b"abc", b"abc"));
        assert!(!secrets_match(b"abc", b"abd"));
        assert!(!secrets_match(b"abc", b"abcd"));
    }
}
