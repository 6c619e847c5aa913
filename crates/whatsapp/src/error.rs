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
    /// Rate limited (codes 4, 80007, 130429, or HTTP 429).
    #[error("rate limited by WhatsApp (code {code})")]
    RateLimited {
        /// Graph's error code.
        code: i64,
    },
    /// Graph refused this request (a bad recipient, a message outside the 24-hour window...).
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

impl From<WhatsappError> for PlatformError {
    fn from(e: WhatsappError) -> Self {
        let (kind, reason) = match &e {
            WhatsappError::Credentials { .. } => (ErrorKind::Credentials, "unauthorized"),
            WhatsappError::RateLimited { .. } => (
                ErrorKind::RateLimited(Duration::from_secs(5)),
                "rate_limited",
            ),
            WhatsappError::Refused { .. } => (ErrorKind::Rejected, "refused"),
            WhatsappError::Server(_) => (ErrorKind::Transient, "server_error"),
            WhatsappError::Network(_) => (ErrorKind::Transient, "network"),
            WhatsappError::Malformed(_) => (ErrorKind::Malformed, "malformed"),
        };
        PlatformError::new(kind, reason, e.to_string()).with_source(e)
    }
}
