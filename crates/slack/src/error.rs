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
    #[error("network error: {what}")]
    Network {
        /// What was being done, and what went wrong.
        what: String,
        /// The failure underneath, where there is one that names no secret.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// Slack answered something that is not its JSON.
    #[error("malformed reply: {0}")]
    Malformed(String),
}

impl SlackError {
    /// A network failure with nothing underneath to keep (a timeout, a closed socket).
    pub(crate) fn network(what: impl Into<String>) -> Self {
        SlackError::Network {
            what: what.into(),
            source: None,
        }
    }

    /// A network failure caused by `source`, kept as the error's source. `what` says what
    /// was being done (its text may repeat the source's, so `Display` alone tells all).
    pub(crate) fn network_from(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        SlackError::Network {
            what: what.into(),
            source: Some(Box::new(source)),
        }
    }

    /// A short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            SlackError::Unauthorized { .. } => "unauthorized",
            SlackError::RateLimited(_) => "rate_limited",
            SlackError::Server { .. } => "server_error",
            SlackError::Refused { .. } => "refused",
            SlackError::LinkDisabled => "link_disabled",
            SlackError::Network { .. } => "network",
            SlackError::Malformed(_) => "malformed",
        }
    }
}

impl From<SlackError> for PlatformError {
    fn from(e: SlackError) -> Self {
        let kind = match &e {
            SlackError::Unauthorized { .. } | SlackError::LinkDisabled => ErrorKind::Credentials,
            SlackError::RateLimited(d) => ErrorKind::RateLimited(*d),
            SlackError::Server { .. } | SlackError::Network { .. } => ErrorKind::Transient,
            SlackError::Refused { .. } => ErrorKind::Rejected,
            SlackError::Malformed(_) => ErrorKind::Malformed,
        };
        PlatformError::new(kind, e.reason(), e.to_string()).with_source(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn a_network_error_keeps_its_source_through_the_platform_error() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let e = SlackError::network_from("chat.postMessage: reset by peer", io);
        assert_eq!(
            e.to_string(),
            "network error: chat.postMessage: reset by peer"
        );
        let p: PlatformError = e.into();
        assert_eq!((p.kind(), p.reason()), (ErrorKind::Transient, "network"));
        let slack = p.source().and_then(|s| s.downcast_ref::<SlackError>());
        let io = slack
            .and_then(|s| s.source())
            .and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(
            io.map(std::io::Error::kind),
            Some(std::io::ErrorKind::ConnectionReset)
        );
    }

    #[test]
    fn a_network_error_with_nothing_underneath_has_no_source() {
        let e = SlackError::network("socket closed");
        assert_eq!(e.to_string(), "network error: socket closed");
        assert!(e.source().is_none());
    }
}
