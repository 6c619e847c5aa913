//! How a Graph API failure is classified for the runtime: refused credentials, rate limits,
//! transient faults, malformed answers.

use std::time::Duration;

use botfleet_platform::{ErrorKind, PlatformError};

/// Why a Graph call failed. Never holds the access token.
#[derive(Debug, thiserror::Error)]
pub enum WhatsappError {
    /// Graph error 190 (or HTTP 401): the access token is invalid or expired.
    #[error("WhatsApp refused the access token (code {code}): {message}")]
    Credentials {
        /// Graph's error code.
        code: i64,
        /// Graph's message.
        message: String,
    },
    /// Rate limited (codes 4, 80007, 130429, 131056 — the pair rate —, or HTTP 429).
    #[error("rate limited by WhatsApp (code {code})")]
    RateLimited {
        /// Graph's error code.
        code: i64,
    },
    /// Graph error 131047: a message other than a template, more than 24 hours after the
    /// user's last message (the customer service window); never retried.
    #[error("{}", OUTSIDE_WINDOW)]
    OutsideWindow,
    /// Graph refused this request (a bad recipient, a bad template...).
    #[error("WhatsApp refused the request (code {code}): {message}")]
    Refused {
        /// Graph's error code.
        code: i64,
        /// Graph's message.
        message: String,
    },
    /// A 5xx.
    #[error("WhatsApp answered {0}")]
    Server(u16),
    /// The network failed or timed out.
    #[error("network: {0}")]
    Network(#[source] reqwest::Error),
    /// The answer could not be read.
    #[error("unreadable answer: {0}")]
    Malformed(String),
}

/// Graph's code for a message outside the 24-hour window.
pub(crate) const OUTSIDE_WINDOW_CODE: i64 = 131_047;

/// Why a message other than a template is not sent to a user who last wrote more than 24
/// hours ago.
pub const OUTSIDE_WINDOW: &str = botfleet_core::OUTSIDE_WINDOW;

impl From<WhatsappError> for PlatformError {
    fn from(e: WhatsappError) -> Self {
        let (kind, reason) = match &e {
            WhatsappError::Credentials { .. } => (ErrorKind::Credentials, "unauthorized"),
            WhatsappError::RateLimited { .. } => (
                ErrorKind::RateLimited(Duration::from_secs(5)),
                "rate_limited",
            ),
            WhatsappError::Refused { .. } => (ErrorKind::Rejected, "refused"),
            WhatsappError::OutsideWindow => (ErrorKind::Rejected, "outside_window"),
            WhatsappError::Server(_) => (ErrorKind::Transient, "server_error"),
            WhatsappError::Network(_) => (ErrorKind::Transient, "network"),
            WhatsappError::Malformed(_) => (ErrorKind::Malformed, "malformed"),
        };
        let out = PlatformError::new(kind, reason, e.to_string());
        // The send limit it was for, for the fleet to pause: one user's (the pair rate), or
        // the number's (its throughput, and the account's and app's call limits).
        let out = match &e {
            WhatsappError::RateLimited { code: 131_056 } => out.in_scope("pair"),
            WhatsappError::RateLimited { .. } => out.in_scope("number"),
            _ => out,
        };
        out.with_source(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limits_name_the_send_limit_they_were_for() {
        let pair = PlatformError::from(WhatsappError::RateLimited { code: 131_056 });
        assert!(matches!(pair.kind(), ErrorKind::RateLimited(_)));
        assert_eq!(pair.scope(), Some("pair"));
        let number = PlatformError::from(WhatsappError::RateLimited { code: 130_429 });
        assert_eq!(number.scope(), Some("number"));
        let refused = PlatformError::from(WhatsappError::Refused {
            code: 131_009,
            message: "bad parameter".into(),
        });
        assert_eq!(
            (refused.kind(), refused.scope()),
            (ErrorKind::Rejected, None)
        );
        let late = PlatformError::from(WhatsappError::OutsideWindow);
        assert_eq!(
            (late.kind(), late.to_string().as_str()),
            (ErrorKind::Rejected, OUTSIDE_WINDOW)
        );
    }
}
