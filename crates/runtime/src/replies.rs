//! Answers that come later, taken in: `POST /api/v1/replies/{reply_token}` on any worker,
//! with `{"actions": [...], "state"?, "final": true|false}` and an `Idempotency-Key`.
//!
//! ```text
//! token checked (the fleet's key: any worker, no one asked) → body checked (every action
//!   readable, the state within bounds) → kept in the store after the parts before it, under
//!   the key (a repeat answers as the first post did) → 202 → the turn holding the chat does
//!   its actions (woken at once when held here, within a poll when held elsewhere)
//! ```
//!
//! The token is the permission (like a file link's signature): no API token is asked for.

use axum::{
    body::Bytes,
    extract::{Path, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::post,
    Json, Router,
};
use botfleet_core::Action;
use botfleet_store::{PostAnswer, ReplyPost, StoreError, MAX_STATE_BYTES};
use serde_json::Value;

use crate::{later::Later, reply_token::TokenRefusal};

/// Longest `Idempotency-Key` the API takes (characters).
pub const MAX_IDEMPOTENCY_KEY: usize = 200;

/// Whether `key` is an `Idempotency-Key` the API takes (sends and replies alike): 1 to
/// [`MAX_IDEMPOTENCY_KEY`] printable ASCII characters.
pub fn idempotency_key_fits(key: &str) -> bool {
    let n = key.chars().count();
    n > 0 && n <= MAX_IDEMPOTENCY_KEY && key.chars().all(|c| c.is_ascii_graphic() || c == ' ')
}

/// Takes the parts of answers that come later, on this worker (cheap to clone).
#[derive(Clone)]
pub struct Replies {
    later: Later,
}

impl std::fmt::Debug for Replies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replies").finish_non_exhaustive()
    }
}

/// A part kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Posted {
    /// Its place among the turn's parts.
    pub seq: u64,
    /// The key was posted before with the same body: nothing was kept again.
    pub repeated: bool,
}

/// Why a part was not kept.
#[derive(Debug, thiserror::Error)]
pub enum ReplyError {
    /// Not a token of this fleet (or damaged), or its turn is unknown: the same answer for
    /// both.
    #[error("unknown reply token")]
    Unknown,
    /// The turn already ended, expired, or had its last part posted.
    #[error("the turn already ended or expired")]
    Ended,
    /// The key was posted before with another body.
    #[error("this Idempotency-Key was posted to this turn with another body: the first stands")]
    KeyReused,
    /// The body or the key is not what the API takes.
    #[error("{0}")]
    Invalid(String),
    /// The store failed: nothing may be assumed kept; post again with the same key.
    #[error("not recorded, post again with the same key: {0}")]
    Store(#[from] StoreError),
}

impl ReplyError {
    /// The HTTP status and error code the API answers it with.
    pub fn status(&self) -> (StatusCode, &'static str) {
        match self {
            ReplyError::Unknown => (StatusCode::NOT_FOUND, "unknown_token"),
            ReplyError::Ended => (StatusCode::GONE, "turn_ended"),
            ReplyError::KeyReused => (StatusCode::CONFLICT, "key_reused"),
            ReplyError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid"),
            ReplyError::Store(_) => (StatusCode::SERVICE_UNAVAILABLE, "store_failed"),
        }
    }
}

impl Replies {
    pub(crate) fn new(later: Later) -> Self {
        Self { later }
    }

    /// Keeps a part of the answer of the turn `token` names, posted under `idempotency_key`:
    /// `body` is `{"actions": [...], "state"?, "final": bool}`.
    ///
    /// # Errors
    /// See [`ReplyError`].
    pub async fn post(
        &self,
        token: &str,
        idempotency_key: &str,
        body: &Value,
    ) -> Result<Posted, ReplyError> {
        if !idempotency_key_fits(idempotency_key) {
            return Err(ReplyError::Invalid(
                "the `Idempotency-Key` header must be 1 to 200 printable characters".into(),
            ));
        }
        let key = self.later.key().await?;
        let claim = crate::reply_token::verify(key, token, botfleet_core::unix_ms()).map_err(
            |r| match r {
                TokenRefusal::Unknown => ReplyError::Unknown,
                TokenRefusal::Expired => ReplyError::Ended,
            },
        )?;
        let (body, last) = part_body(body).map_err(ReplyError::Invalid)?;
        let post = ReplyPost {
            key: claim.entry.clone(),
            idempotency_key: idempotency_key.to_owned(),
            body,
            last,
        };
        match self.later.store().reply_post(&claim.bot, &post).await? {
            PostAnswer::Accepted(seq) => {
                self.later.wake(&claim.bot, &claim.entry);
                Ok(Posted {
                    seq,
                    repeated: false,
                })
            }
            PostAnswer::Repeat(seq) => Ok(Posted {
                seq,
                repeated: true,
            }),
            PostAnswer::Conflict => Err(ReplyError::KeyReused),
            PostAnswer::Ended => Err(ReplyError::Ended),
            PostAnswer::Unknown => Err(ReplyError::Unknown),
        }
    }

    /// `POST /api/v1/replies/{reply_token}`: serve it beside the API (it needs no API token:
    /// the reply token is the permission).
    pub fn router(&self) -> Router {
        Router::new()
            .route("/api/v1/replies/{reply_token}", post(post_reply))
            .with_state(self.clone())
    }
}

/// A part's body as kept: the fields taken, in one form (the same part posted twice is the
/// same text), and whether it is the last.
fn part_body(v: &Value) -> Result<(String, bool), String> {
    let Some(obj) = v.as_object() else {
        return Err("the body must be a JSON object: {\"actions\": [...], \"state\"?, \"final\": true|false}".into());
    };
    if let Some(k) = obj
        .keys()
        .find(|k| !matches!(k.as_str(), "actions" | "state" | "final"))
    {
        return Err(format!(
            "unknown field {:?} (a part takes `actions`, `state` and `final`)",
            k.chars().take(40).collect::<String>()
        ));
    }
    let last = match obj.get("final") {
        Some(Value::Bool(b)) => *b,
        _ => return Err("`final` is required: true ends the turn, false waits for more".into()),
    };
    let actions = match obj.get("actions") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => {
            for (i, a) in items.iter().enumerate() {
                Action::from_json(i, a)?;
            }
            items.clone()
        }
        Some(_) => return Err("`actions` must be a list".into()),
    };
    let mut out = serde_json::Map::new();
    out.insert("actions".into(), Value::Array(actions));
    out.insert("final".into(), Value::Bool(last));
    match obj.get("state") {
        None | Some(Value::Null) => {}
        Some(s) => {
            let n = s.to_string().len();
            if n > MAX_STATE_BYTES {
                return Err(format!(
                    "`state` is {n} bytes, over the {MAX_STATE_BYTES}-byte bound"
                ));
            }
            out.insert("state".into(), s.clone());
        }
    }
    Ok((Value::Object(out).to_string(), last))
}

async fn post_reply(
    State(r): State<Replies>,
    Path(reply_token): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let answer = match serde_json::from_slice::<Value>(&body) {
        Ok(v) => r.post(&reply_token, &key, &v).await,
        Err(e) => Err(ReplyError::Invalid(format!("the body is not JSON: {e}"))),
    };
    match answer {
        Ok(p) => (
            StatusCode::ACCEPTED,
            Json(serde_json::json!({
                "status": "accepted",
                "seq": p.seq,
                "repeated": p.repeated,
            })),
        )
            .into_response(),
        Err(e) => {
            let (status, code) = e.status();
            (
                status,
                Json(serde_json::json!({ "code": code, "message": e.to_string() })),
            )
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_kept_in_one_form_and_checked() {
        let (a, last) = part_body(&serde_json::json!({
            "final": true, "state": {"n": 1}, "actions": [{"type": "send", "text": "hi"}]
        }))
        .unwrap();
        let (b, _) = part_body(&serde_json::json!({
            "actions": [{"text": "hi", "type": "send"}], "state": {"n": 1}, "final": true
        }))
        .unwrap();
        assert!(last);
        assert_eq!(a, b, "the same part is the same text");
        for bad in [
            serde_json::json!([]),
            serde_json::json!({"actions": []}),
            serde_json::json!({"final": "yes"}),
            serde_json::json!({"final": true, "text": "hi"}),
            serde_json::json!({"final": true, "actions": {"type": "typing"}}),
            serde_json::json!({"final": true, "actions": [{"type": "teleport"}]}),
            serde_json::json!({"final": true, "state": "x".repeat(MAX_STATE_BYTES + 1)}),
        ] {
            assert!(part_body(&bad).is_err(), "{bad}");
        }
        let (plain, last) = part_body(&serde_json::json!({"final": false})).unwrap();
        assert!(!last);
        assert_eq!(plain, r#"{"actions":[],"final":false}"#);
    }
}
