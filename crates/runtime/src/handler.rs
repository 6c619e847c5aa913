//! Handlers: what a bot answers to a message.

use std::time::Duration;

use botfleet_core::{Action, Caps, HandlerSpec, Inbound, Secret};
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The header carrying the webhook signature: `sha256=<hex of HMAC-SHA256(secret, body)>`.
pub const SIGNATURE_HEADER: &str = "x-botfleet-signature";

/// Why a handler produced no answer.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// The webhook could not be reached or timed out.
    #[error("webhook unreachable: {0}")]
    Unreachable(#[source] reqwest::Error),
    /// The webhook answered with an error status.
    #[error("webhook answered {0}")]
    Status(u16),
    /// The webhook's answer was not JSON (or `text` was not a string).
    #[error("webhook answer unreadable: {0}")]
    BadReply(String),
}

impl HandlerError {
    /// Whether trying again later may succeed: the service was unreachable, timed out, said
    /// it is failing (5xx) or busy (429). Other refusals (4xx) and unreadable answers are not
    /// retried.
    pub fn is_transient(&self) -> bool {
        match self {
            HandlerError::Unreachable(_) => true,
            HandlerError::Status(s) => *s == 429 || *s >= 500,
            HandlerError::BadReply(_) => false,
        }
    }
}

/// Runs one bot's handler.
#[derive(Clone, Debug)]
pub struct Handler {
    spec: HandlerSpec,
    http: reqwest::Client,
    timeout: Duration,
}

/// `sha256=<hex>` of `body` under `secret`.
pub fn sign(secret: &Secret, body: &[u8]) -> String {
    // HMAC accepts keys of any length, so new_from_slice cannot fail.
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret.expose().as_bytes()) {
        Ok(m) => m,
        Err(_) => return String::new(),
    };
    mac.update(body);
    let bytes = mac.finalize().into_bytes();
    let mut hex = String::with_capacity(7 + bytes.len() * 2);
    hex.push_str("sha256=");
    for b in bytes {
        hex.push_str(&format!("{b:02x}"));
    }
    hex
}

/// The JSON a `webhook` handler is POSTed for `msg` in a chat whose state is `state`, on a
/// platform mode that can do `caps`: the event's fields, the state as `state` and the
/// capabilities as `caps` (see the `HandlerEvent` schema in the OpenAPI document). What the
/// platform needs to answer the event (`answer_handle`) is not shown.
///
/// # Errors
/// A stored state that is not JSON.
pub fn request(
    msg: &Inbound,
    state: Option<&str>,
    caps: &Caps,
) -> Result<serde_json::Value, HandlerError> {
    let mut doc = serde_json::to_value(msg).map_err(|e| HandlerError::BadReply(e.to_string()))?;
    if let Some(obj) = doc.as_object_mut() {
        obj.remove("answer_handle");
        if let Some(st) = state {
            let v: serde_json::Value = serde_json::from_str(st)
                .map_err(|e| HandlerError::BadReply(format!("stored state: {e}")))?;
            obj.insert("state".into(), v);
        }
        let caps = serde_json::to_value(caps).map_err(|e| HandlerError::BadReply(e.to_string()))?;
        obj.insert("caps".into(), caps);
    }
    Ok(doc)
}

/// A handler's answer, and the chat's new conversation state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reply {
    /// The text to send back, if any (one `send`, before `actions`).
    pub text: Option<String>,
    /// The chat's new state (JSON), if the handler gave one: sent with the chat's next message.
    pub state: Option<String>,
    /// What to do, in order, after `text`.
    pub actions: Vec<Action>,
    /// Entries of `actions` that could not be read, each with its reason (the others run).
    pub refused: Vec<String>,
}

impl Reply {
    /// Reads a handler's JSON answer `{text?, state?, actions?}`.
    ///
    /// # Errors
    /// `text` that is not a string, `actions` that is not a list.
    pub fn from_json(v: &serde_json::Value) -> Result<Self, HandlerError> {
        let text = match v.get("text") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(s)) if s.is_empty() => None,
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(HandlerError::BadReply("`text` is not a string".into())),
        };
        let state = match v.get("state") {
            None | Some(serde_json::Value::Null) => None,
            Some(s) => Some(s.to_string()),
        };
        let (mut actions, mut refused) = (Vec::new(), Vec::new());
        match v.get("actions") {
            None | Some(serde_json::Value::Null) => {}
            Some(serde_json::Value::Array(items)) => {
                for (i, a) in items.iter().enumerate() {
                    match Action::from_json(i, a) {
                        Ok(a) => actions.push(a),
                        Err(why) => refused.push(why),
                    }
                }
            }
            Some(_) => return Err(HandlerError::BadReply("`actions` is not a list".into())),
        }
        Ok(Reply {
            text,
            state,
            actions,
            refused,
        })
    }
}

impl Handler {
    /// A handler for `spec`, sharing the process's HTTP client.
    pub fn new(spec: HandlerSpec, http: reqwest::Client, timeout: Duration) -> Self {
        Self {
            spec,
            http,
            timeout,
        }
    }

    /// Whether this handler is given the chat's conversation state (a webhook is; echo keeps
    /// none, so its turns need not read it).
    pub fn takes_state(&self) -> bool {
        matches!(self.spec, HandlerSpec::Webhook { .. })
    }

    /// The answer to `msg` in a chat whose state is `state` (JSON), on a platform mode that
    /// can do `caps`: the webhook gets them as the request's `state` and `caps` fields and may
    /// answer `{"text": …, "state": {…}, "actions": […]}`.
    ///
    /// # Errors
    /// Webhook failures; echo never fails.
    pub async fn answer_with_state(
        &self,
        msg: &Inbound,
        state: Option<&str>,
        caps: &Caps,
    ) -> Result<Reply, HandlerError> {
        match &self.spec {
            HandlerSpec::Echo => Ok(Reply {
                text: (!msg.text.is_empty()).then(|| msg.text.clone()),
                ..Reply::default()
            }),
            HandlerSpec::Webhook { url, secret } => {
                let doc = request(msg, state, caps)?;
                let body =
                    serde_json::to_vec(&doc).map_err(|e| HandlerError::BadReply(e.to_string()))?;
                let mut req = self
                    .http
                    .post(url)
                    .timeout(self.timeout)
                    .header("content-type", "application/json");
                if let Some(s) = secret {
                    req = req.header(SIGNATURE_HEADER, sign(s, &body));
                }
                let resp = req
                    .body(body)
                    .send()
                    .await
                    .map_err(|e| HandlerError::Unreachable(e.without_url()))?;
                let status = resp.status();
                if !status.is_success() {
                    return Err(HandlerError::Status(status.as_u16()));
                }
                let bytes = resp
                    .bytes()
                    .await
                    .map_err(|e| HandlerError::Unreachable(e.without_url()))?;
                if bytes.iter().all(u8::is_ascii_whitespace) {
                    return Ok(Reply::default());
                }
                let v: serde_json::Value = serde_json::from_slice(&bytes)
                    .map_err(|e| HandlerError::BadReply(e.to_string()))?;
                Reply::from_json(&v)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_keep_text_and_read_actions_one_by_one() {
        let r = Reply::from_json(&serde_json::json!({
            "text": "hi",
            "state": {"n": 1},
            "actions": [{"type": "typing"}, {"type": "teleport"}, {"type": "send", "text": "b"}],
        }))
        .unwrap();
        assert_eq!(r.text.as_deref(), Some("hi"));
        assert_eq!(r.state.as_deref(), Some(r#"{"n":1}"#));
        assert_eq!(r.actions, [Action::Typing {}, Action::send("b")]);
        assert_eq!(r.refused.len(), 1);
        assert!(r.refused[0].contains("action 1"), "{:?}", r.refused);
        assert!(Reply::from_json(&serde_json::json!({"actions": {"type": "typing"}})).is_err());
        assert!(Reply::from_json(&serde_json::json!({"text": 3})).is_err());
        assert_eq!(
            Reply::from_json(&serde_json::json!({})).unwrap(),
            Reply::default()
        );
    }

    #[test]
    fn signature_matches_a_known_vector() {
        // RFC 4231 test case 2.
        let s = sign(&Secret::new("Jefe"), b"what do ya want for nothing?");
        assert_eq!(
            s,
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
