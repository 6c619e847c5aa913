//! Errors of the Telegram Bot API, classified by what the caller should do.

use std::time::Duration;

/// A failed Bot API call. Never contains the token (request URLs are stripped).
#[derive(Debug, thiserror::Error)]
pub enum TelegramError {
    /// 401: the token is wrong or revoked. Do not retry; an operator must fix it.
    #[error("unauthorized (401): {0}")]
    Unauthorized(String),
    /// 409: another poller (or a webhook) uses this token. Back off and report.
    #[error("conflict (409): {0}")]
    Conflict(String),
    /// 429: too many requests; wait this long.
    #[error("rate limited (429), retry after {0:?}")]
    RateLimited(Duration),
    /// 5xx: the Bot API is failing; retry with backoff.
    #[error("server error ({status}): {description}")]
    Server {
        /// HTTP status.
        status: u16,
        /// What the server said.
        description: String,
    },
    /// Another 4xx: the request itself is wrong (e.g. chat not found). Retrying will not help.
    #[error("request refused ({status}): {description}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// What the server said.
        description: String,
    },
    /// The connection failed or timed out; retry with backoff.
    #[error("network error: {0}")]
    Network(#[source] reqwest::Error),
    /// The long poll's own connection failed, timed out or was cut; retry with backoff.
    #[error("network error: {0}")]
    Transport(String),
    /// The reply was not the Bot API's JSON.
    #[error("malformed reply: {0}")]
    Malformed(String),
}

impl TelegramError {
    /// Whether a retry after a backoff may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            TelegramError::Server { .. }
                | TelegramError::Network(_)
                | TelegramError::Transport(_)
                | TelegramError::RateLimited(_)
                | TelegramError::Conflict(_)
                | TelegramError::Malformed(_)
        )
    }

    /// A short label for metrics (`unauthorized`, `conflict`, `rate_limited`, ...).
    pub fn reason(&self) -> &'static str {
        match self {
            TelegramError::Unauthorized(_) => "unauthorized",
            TelegramError::Conflict(_) => "conflict",
            TelegramError::RateLimited(_) => "rate_limited",
            TelegramError::Server { .. } => "server_error",
            TelegramError::Refused { .. } => "refused",
            TelegramError::Network(_) | TelegramError::Transport(_) => "network",
            TelegramError::Malformed(_) => "malformed",
        }
    }
}
