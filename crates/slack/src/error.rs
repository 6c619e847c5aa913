//! Errors of the Slack Web API and Socket Mode, classified by what the caller should do.

use std::time::Duration;

use botfleet_platform::{ErrorKind, PlatformError};

/// A failed Slack call. Never contains a token (they travel in headers only).
#[derive(Debug, thiserror::Error)]
pub enum SlackError {
    /// The token was refused (`invalid_auth`, `token_revoked`, `account_inactive`, ...).
    #[error("Slack refused the {which} token ({code})")]
    Unauthorized {
        /// `bot` or `app`.
        which: &'static str,
        /// Slack's error code.
        code: String,
    },
    /// HTTP 429 or `ratelimited`: wait this long.
    #[error("rate limited by Slack, retry after {0:?}")]
    RateLimited(Duration),
    /// Slack is failing (5xx, `internal_error`, `service_unavailable`, ...): retry later.
    #[error("Slack server error during {method}: {detail}")]
    Server {
        /// The method.
        method: &'static str,
        /// Status or error code.
        detail: String,
    },
    /// The request itself was refused (`channel_not_found`, `not_in_channel`, ...).
    #[error("Slack refused {method}: {code}")]
    Refused {
        /// The method.
        method: &'static str,
        /// Slack's error code.
        code: String,
    },
    /// Socket Mode was turned off for the app (`disconnect` with `link_disabled`).
    #[error("Socket Mode is disabled for this app (link_disabled)")]
    LinkDisabled,
    /// The connection failed, timed out or dropped.
    #[error("network error: {0}")]
    Network(String),
    /// Slack answered something that is not its JSON.
    #[error("malformed reply: {0}")]
    Malformed(String),
}

impl SlackError {
    /// A short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            SlackError::Unauthorized { .. } => "unauthorized",
            SlackError::RateLimited(_) => "rate_limited",
            SlackError::Server { .. } => "server_error",
            SlackError::Refused { .. } => "refused",
            SlackError::LinkDisabled => "link_disabled",
            SlackError::Network(_) => "network",
            SlackError::Malformed(_) => "malformed",
        }
    }
}

impl From<SlackError> for PlatformError {
    fn from(e: SlackError) -> Self {
        let kind = match &e {
            SlackError::Unauthorized { .. } | SlackError::LinkDisabled => ErrorKind::Credentials,
            SlackError::RateLimited(d) => ErrorKind::RateLimited(*d),
            SlackError::Server { .. } | SlackError::Network(_) => ErrorKind::Transient,
            SlackError::Refused { .. } => ErrorKind::Rejected,
            SlackError::Malformed(_) => ErrorKind::Malformed,
        };
        PlatformError::new(kind, e.reason(), e.to_string()).with_source(e)
    }
}
