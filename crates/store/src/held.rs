//! Turns held open for an answer that comes later: a handler answered `202`, and its answer
//! is posted afterwards, in one or more parts, through any worker
//! (`POST /api/v1/replies/{reply_token}`). The entry stays pending while held (the chat's next
//! messages wait behind it); the parts posted are kept in order under the client's keys until
//! the turn that holds the chat runs them, and the last one ends the turn.

use crate::TurnFence;

/// A turn held open: written under the turn's fence when its handler answered `202`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TurnHold {
    /// The journal entry the turn answers.
    pub key: String,
    /// Its chat.
    pub chat: String,
    /// Who holds the turn.
    pub fence: TurnFence,
    /// Unix ms when the hold expires unless its last part was posted before.
    pub until_ms: i64,
}

/// A part of a held turn's answer, as a client posts it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplyPost {
    /// The journal entry the turn answers.
    pub key: String,
    /// The client's `Idempotency-Key` (kept hashed).
    pub idempotency_key: String,
    /// What was posted (opaque to the store: the API's JSON).
    pub body: String,
    /// Whether this part ends the turn (`"final": true`).
    pub last: bool,
}

/// A part of a held turn's answer, as the turn reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PostedReply {
    /// Its place among the entry's parts (1 for the first posted; increasing, maybe with gaps).
    pub seq: u64,
    /// What was posted.
    pub body: String,
    /// Whether it ends the turn.
    pub last: bool,
    /// Unix ms when it was posted.
    pub posted_at_ms: i64,
}

/// What became of a [`ReplyPost`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PostAnswer {
    /// Kept, at this place among the entry's parts.
    Accepted(u64),
    /// The key was posted before with the same body, kept at this place: nothing is done again.
    Repeat(u64),
    /// The key was posted before with another body: nothing is kept.
    Conflict,
    /// The turn ended, expired, or had its last part posted already: nothing is kept.
    Ended,
    /// No such entry (or it was pruned).
    Unknown,
}

/// A key or body as the store keeps it: its SHA-256 in hex.
pub(crate) fn digest(s: &str) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(s.as_bytes());
    let mut out = String::with_capacity(64);
    for b in d {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// How a post of a key kept before (at `seq`, its body's digest `kept`) is answered: as then
/// when the body is the same (`posted`), refused otherwise.
pub(crate) fn answer_again(seq: u64, kept: &str, posted: &str) -> PostAnswer {
    if kept == posted {
        PostAnswer::Repeat(seq)
    } else {
        PostAnswer::Conflict
    }
}

/// [`Store::replies_since`](crate::Store::replies_since)'s rows as the SQL backends read them.
pub(crate) fn since_rows(
    rows: Vec<(String, String, i64)>,
) -> crate::Result<Vec<(botfleet_core::BotId, String, u64)>> {
    rows.into_iter()
        .map(|(bot, entry, seq)| {
            let bot = botfleet_core::BotId::new(bot)
                .map_err(|e| crate::StoreError::Corrupt(e.to_string()))?;
            Ok((bot, entry, seq.max(0).unsigned_abs()))
        })
        .collect()
}
