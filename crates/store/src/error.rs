//! Errors of persistence.

use botfleet_core::{BotId, Fence, InvalidSpec};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What kind of failure a store call met; match on it, the source is kept.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database URL has an unknown scheme or does not parse.
    #[error("invalid database URL: {reason}")]
    InvalidUrl {
        /// What is wrong; never contains a password.
        reason: String,
    },
    /// The database could not be opened or migrated.
    #[error("cannot open the {backend} database: {reason}")]
    Open {
        /// `sqlite` or `postgres`.
        backend: &'static str,
        /// What went wrong, for people.
        reason: String,
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// No bot with this id is registered.
    #[error("no bot {0}")]
    NotFound(BotId),
    /// A bot with this id is registered already.
    #[error("bot {0} exists already")]
    AlreadyExists(BotId),
    /// The write carries a fence older than one the store accepted before: the writer lost
    /// its claim and must stop.
    #[error("stale fence {offered} for bot {bot} (store has accepted {current})")]
    StaleFence {
        /// The bot.
        bot: BotId,
        /// The fence the writer offered.
        offered: Fence,
        /// The highest fence accepted so far.
        current: Fence,
    },
    /// The bot spec is not valid.
    #[error(transparent)]
    InvalidSpec(#[from] InvalidSpec),
    /// A credential could not be sealed or opened (no key, a key not held, an altered
    /// value). Never holds key material or a credential.
    #[error("{0}")]
    Secrets(String),
    /// A stored row cannot be read back (written by another program or a newer version).
    #[error("stored data unreadable: {0}")]
    Corrupt(String),
    /// The database failed the call.
    #[error("database error during {op}")]
    Backend {
        /// What was attempted.
        op: &'static str,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
}

impl StoreError {
    pub(crate) fn backend(op: &'static str, e: impl Into<BoxError>) -> Self {
        StoreError::Backend {
            op,
            source: e.into(),
        }
    }
}

/// Result of store calls.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;
