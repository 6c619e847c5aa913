//! A bot's session records (a linked WhatsApp device's identity and keys): state the platform
//! client keeps between connections, which must move with the bot from worker to worker.

use async_trait::async_trait;

/// One change to a session record. `Debug` shows the record, never the value (private keys).
#[derive(Clone, PartialEq, Eq)]
pub enum KvWrite {
    /// Sets `(kind, key)` to the value.
    Put(String, String, Vec<u8>),
    /// Removes `(kind, key)`.
    Delete(String, String),
}

impl std::fmt::Debug for KvWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KvWrite::Put(kind, key, v) => write!(f, "Put({kind}/{key}, {} bytes)", v.len()),
            KvWrite::Delete(kind, key) => write!(f, "Delete({kind}/{key})"),
        }
    }
}

/// Where a bot's session records live: the shared store, every write under the claim's
/// fence, so a worker that lost the bot cannot corrupt the session its successor uses.
#[async_trait]
pub trait SessionKv: Send + Sync {
    /// Applies `writes`, all or none.
    ///
    /// # Errors
    /// A stale fence (the bot moved on: nothing is written) or the store's failure, said
    /// in words without any secret.
    async fn write(&self, writes: Vec<KvWrite>) -> Result<(), SessionError>;

    /// The record `key` of `kind`, if there is one.
    ///
    /// # Errors
    /// The store's failure.
    async fn get(&self, kind: &str, key: &str) -> Result<Option<Vec<u8>>, SessionError>;

    /// Every record of `kind`, as `(key, value)`, sorted by key.
    ///
    /// # Errors
    /// The store's failure.
    async fn load(&self, kind: &str) -> Result<Vec<(String, Vec<u8>)>, SessionError>;

    /// Forgets the whole session (the phone logged the device out).
    ///
    /// # Errors
    /// As [`SessionKv::write`].
    async fn clear(&self) -> Result<(), SessionError>;
}

/// Why a session read or write failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// A newer owner holds the bot: this worker may no longer change its session.
    #[error("stale fence: a newer owner holds this bot's session")]
    Stale,
    /// The store failed.
    #[error("session store: {0}")]
    Store(String),
}
