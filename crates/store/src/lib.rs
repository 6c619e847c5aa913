#![doc = include_str!("../README.md")]

use std::sync::Arc;

mod chatlog;
mod error;
mod held;
mod inbox;
mod memory;
mod pauses;
mod postgres;
mod schema;
mod seal;
mod session;
#[cfg(feature = "session-kv")]
mod session_kv;
mod sqlite;
mod store;
mod turns;

pub use chatlog::{ChatEvent, ChatEventKind, MAX_CHAT_EVENTS};
pub use error::{Result, StoreError};
pub use held::{PostAnswer, PostedReply, ReplyPost, TurnHold};
pub use inbox::{
    send_key, EntryKind, InboxEntry, InboxItem, InboxOutcome, InboxState, InboxStats, Journaled,
    SendCounts, SEND_KEEP_MS, SEND_KEY_PREFIX,
};
pub use memory::MemoryStore;
pub use pauses::{ChatPause, Resumed, MAX_PAUSE_REASON};
pub use postgres::PostgresStore;
pub use seal::{KeyError, Keyring};
pub use session::SessionWrite;
#[cfg(feature = "session-kv")]
pub use session_kv::StoreSession;
pub use sqlite::SqliteStore;
pub use store::{BotFilter, Cursor, StatusReport, Store};
pub use turns::{
    progress_key, reply_key, StateWrite, TurnFence, TurnRecord, TurnStep, TurnView,
    MAX_STATE_BYTES, REFS_TTL_MS,
};

/// Opens the store a URL names:
///
/// - `sqlite://PATH` (relative, e.g. `sqlite://botfleet.db`) or `sqlite:///abs/path.db`
/// - `sqlite::memory:` — a private in-memory SQLite database
/// - `postgres://…` or `postgresql://…`
/// - `memory://` — the in-memory store
///
/// # Errors
/// [`StoreError::InvalidUrl`] for an unknown scheme; [`StoreError::Open`] when the database
/// cannot be opened.
pub async fn open(url: &str) -> Result<Arc<dyn Store>> {
    open_with(url, Keyring::none()).await
}

/// [`open`], with credentials sealed at rest by `keys` in the SQL stores (see [`Keyring`]).
///
/// # Errors
/// As [`open`].
pub async fn open_with(url: &str, keys: Arc<Keyring>) -> Result<Arc<dyn Store>> {
    let url = url.trim();
    if url == "sqlite::memory:" {
        return Ok(Arc::new(
            SqliteStore::open_in_memory().await?.with_keyring(keys),
        ));
    }
    if let Some(path) = url.strip_prefix("sqlite://") {
        if path.is_empty() {
            return Err(StoreError::InvalidUrl {
                reason: "sqlite:// needs a file path, e.g. sqlite://botfleet.db".into(),
            });
        }
        return Ok(Arc::new(SqliteStore::open(path).await?.with_keyring(keys)));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(Arc::new(PostgresStore::open(url).await?.with_keyring(keys)));
    }
    if url == "memory://" {
        return Ok(Arc::new(MemoryStore::new()));
    }
    let scheme = url.split_once("://").map_or(url, |(s, _)| s);
    let shown: String = scheme.chars().take(20).collect();
    Err(StoreError::InvalidUrl {
        reason: format!(
            "unsupported scheme {shown:?} (expected sqlite://PATH, sqlite::memory:, postgres://…, memory://)"
        ),
    })
}
