//! One set of error kinds for every platform.

use std::{fmt, time::Duration};

/// What kind of failure a platform call met: the runtime acts on the kind, the same way for
/// every platform.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The platform refused the credentials (Telegram 401, Slack `invalid_auth`): the bot
    /// fails and is not retried until an operator restarts it.
    Credentials,
    /// Too many requests: try again after this long.
    RateLimited(Duration),
    /// Another connection holds what this bot needs (a second Telegram poller, a webhook set):
    /// back off and report.
    Conflict,
    /// Network failures, timeouts, 5xx: retried with capped exponential backoff and jitter.
    Transient,
    /// The platform sent something that cannot be read: skipped, counted, logged.
    Malformed,
    /// This one request cannot succeed as it is (a 4xx such as an unknown chat): not retried.
    Rejected,
}

impl ErrorKind {
    /// A short name for metric labels and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Credentials => "credentials",
            ErrorKind::RateLimited(_) => "rate_limited",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Transient => "transient",
            ErrorKind::Malformed => "malformed",
            ErrorKind::Rejected => "rejected",
        }
    }
}

/// A failed platform call: its kind, a metric-friendly reason and a message for people.
///
/// Platforms build these so that neither the message nor the source ever holds a token.
#[derive(Debug, thiserror::Error)]
pub struct PlatformError {
    kind: ErrorKind,
    reason: &'static str,
    message: String,
    /// The send limit a 429 was for, when the platform says ([`PlatformError::in_scope`]).
    scope: Option<&'static str>,
    /// Whether the platform counts the answer against its limit on refused calls
    /// ([`PlatformError::invalid`]).
    invalid: bool,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl fmt::Display for PlatformError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl PlatformError {
    /// An error of `kind`; `reason` is a short label (e.g. `unauthorized`, `server_error`)
    /// for metrics, `message` says what happened without any secret.
    pub fn new(kind: ErrorKind, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            kind,
            reason,
            message: message.into(),
            scope: None,
            invalid: false,
            source: None,
        }
    }

    /// Says the platform counts this answer against its limit on refused calls, past which
    /// it bans the caller (Discord: 401, 403 and 429 but a shared route's, 10,000 in 10
    /// minutes; see [`crate::Sender::invalid_budget`]).
    #[must_use]
    pub fn invalid(mut self) -> Self {
        self.invalid = true;
        self
    }

    /// Whether the platform counts this answer against its limit on refused calls.
    pub fn is_invalid(&self) -> bool {
        self.invalid
    }

    /// Says which of the call's send limits ([`crate::Bucket::scope`]) a rate limit was for,
    /// when the platform's answer tells (Discord's `global`): the fleet pauses that bucket.
    /// Without it, a 429 pauses the call's narrowest one (its first).
    #[must_use]
    pub fn in_scope(mut self, scope: &'static str) -> Self {
        self.scope = Some(scope);
        self
    }

    /// The send limit a rate limit was for, when the platform said.
    pub fn scope(&self) -> Option<&'static str> {
        self.scope
    }

    /// Keeps the underlying error (which must not hold a secret either).
    #[must_use]
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// What kind of failure it is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The short reason for metric labels.
    pub fn reason(&self) -> &'static str {
        self.reason
    }

    /// Whether retrying later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::RateLimited(_) | ErrorKind::Transient | ErrorKind::Conflict
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("connection reset")]
    struct Reset;

    #[test]
    fn display_kind_and_source_survive() {
        let e = PlatformError::new(
            ErrorKind::Transient,
            "network",
            "getUpdates: connection reset",
        )
        .with_source(Reset);
        assert_eq!(e.to_string(), "getUpdates: connection reset");
        assert_eq!((e.kind(), e.reason()), (ErrorKind::Transient, "network"));
        assert!(e.is_retryable());
        let src = std::error::Error::source(&e).expect("source kept");
        assert_eq!(src.to_string(), "connection reset");
        assert!(!PlatformError::new(ErrorKind::Credentials, "unauthorized", "401").is_retryable());
        assert_eq!(
            ErrorKind::RateLimited(Duration::from_secs(1)).as_str(),
            "rate_limited"
        );
    }
}
