//! Errors of Discord's REST API and gateway, classified by what the caller should do.

use std::time::Duration;

use botfleet_platform::{ErrorKind, PlatformError};

/// A failed Discord call. Never contains a token (it travels in headers and IDENTIFY only).
#[derive(Debug, thiserror::Error)]
pub enum DiscordError {
    /// The token was refused (HTTP 401, gateway close 4004).
    #[error("Discord refused the token")]
    Unauthorized,
    /// The gateway refused the session for good: invalid shard (4010), sharding required
    /// (4011), invalid API version (4012), invalid (4013) or disallowed (4014) intents.
    #[error("Discord closed the gateway with {code}: {reason}")]
    Refused {
        /// The close code.
        code: u16,
        /// What it means.
        reason: &'static str,
    },
    /// HTTP 429: wait this long.
    #[error("rate limited by Discord, retry after {0:?}")]
    RateLimited(Duration),
    /// HTTP 429 for the bot's global limit (`"global": true`): every REST call of the bot
    /// waits this long.
    #[error("rate limited by Discord (global), retry after {0:?}")]
    GlobalRateLimited(Duration),
    /// HTTP 429 for a resource's limit that others share (`X-RateLimit-Scope: shared`): the
    /// only 429 Discord does not count as an invalid request.
    #[error("rate limited by Discord (a shared resource), retry after {0:?}")]
    SharedRateLimited(Duration),
    /// Discord is failing (5xx) or the connection dropped: retry later.
    #[error("Discord server error during {what}: {detail}")]
    Server {
        /// The call.
        what: &'static str,
        /// Status or reason.
        detail: String,
    },
    /// This request cannot succeed as it is (403 missing access, 404 unknown channel, ...).
    #[error("Discord refused {what}: HTTP {status} (code {code})")]
    Rejected {
        /// The call.
        what: &'static str,
        /// The HTTP status.
        status: u16,
        /// Discord's JSON error code (`10008` unknown message, `40060` interaction already
        /// acknowledged, …); 0 when it gave none.
        code: u64,
    },
    /// The connection failed, timed out or dropped.
    #[error("network error: {what}")]
    Network {
        /// What was being done, and what went wrong.
        what: String,
        /// The failure underneath, where there is one that names no secret.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// Discord answered something that is not its JSON.
    #[error("malformed reply: {0}")]
    Malformed(String),
}

impl DiscordError {
    /// A network failure caused by `source`, kept as the error's source. `what` says what
    /// was being done (its text may repeat the source's, so `Display` alone tells all).
    pub(crate) fn network_from(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        DiscordError::Network {
            what: what.into(),
            source: Some(Box::new(source)),
        }
    }

    /// A short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            DiscordError::Unauthorized => "unauthorized",
            DiscordError::Refused { .. } => "gateway_refused",
            DiscordError::RateLimited(_)
            | DiscordError::GlobalRateLimited(_)
            | DiscordError::SharedRateLimited(_) => "rate_limited",
            DiscordError::Server { .. } => "server_error",
            DiscordError::Rejected { .. } => "rejected",
            DiscordError::Network { .. } => "network",
            DiscordError::Malformed(_) => "malformed",
        }
    }
}

/// What a gateway close code means for the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CloseAction {
    /// Resume the session.
    Resume,
    /// The session is gone: identify again.
    Identify,
    /// Stop: the bot fails with this error.
    Fail,
}

/// Classifies a close code Discord sent.
pub(crate) fn close_action(code: u16) -> (CloseAction, Option<DiscordError>) {
    let refused = |reason| {
        (
            CloseAction::Fail,
            Some(DiscordError::Refused { code, reason }),
        )
    };
    match code {
        4004 => (CloseAction::Fail, Some(DiscordError::Unauthorized)),
        4010 => refused("invalid shard"),
        4011 => refused("sharding required (more shards)"),
        4012 => refused("invalid API version"),
        4013 => refused("invalid intents"),
        4014 => refused(
            "disallowed intents: enable the privileged intents (message content) for the bot",
        ),
        4007 | 4009 => (CloseAction::Identify, None),
        // 1000/1001 from Discord, 4000-4008 otherwise: the session may be resumed.
        _ => (CloseAction::Resume, None),
    }
}

impl From<DiscordError> for PlatformError {
    fn from(e: DiscordError) -> Self {
        let kind = match &e {
            DiscordError::Unauthorized | DiscordError::Refused { .. } => ErrorKind::Credentials,
            DiscordError::RateLimited(d)
            | DiscordError::GlobalRateLimited(d)
            | DiscordError::SharedRateLimited(d) => ErrorKind::RateLimited(*d),
            DiscordError::Server { .. } | DiscordError::Network { .. } => ErrorKind::Transient,
            DiscordError::Rejected { .. } => ErrorKind::Rejected,
            DiscordError::Malformed(_) => ErrorKind::Malformed,
        };
        let global = matches!(e, DiscordError::GlobalRateLimited(_));
        let out = PlatformError::new(kind, e.reason(), e.to_string());
        // The bot's global bucket, for the fleet to pause; else the call's route's, whose
        // major parameter is its channel (a learnt route's own bucket is paused as Discord
        // announced it: `Sender::drained`).
        let out = match &e {
            DiscordError::RateLimited(_) | DiscordError::SharedRateLimited(_) => {
                out.in_scope("channel")
            }
            _ if global => out.in_scope("global"),
            _ => out,
        };
        // What Discord counts towards banning the caller's IP: 401, 403, and 429 but a
        // shared resource's.
        let invalid = match &e {
            DiscordError::Unauthorized
            | DiscordError::RateLimited(_)
            | DiscordError::GlobalRateLimited(_) => true,
            DiscordError::Rejected { status, .. } => matches!(status, 401 | 403),
            _ => false,
        };
        let out = if invalid { out.invalid() } else { out };
        out.with_source(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_network_error_keeps_its_source_through_the_platform_error() {
        use std::error::Error as _;
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let e = DiscordError::network_from("send message: reset by peer", io);
        assert_eq!(e.to_string(), "network error: send message: reset by peer");
        assert!(e
            .source()
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .is_some());
        let p: PlatformError = e.into();
        assert_eq!((p.kind(), p.reason()), (ErrorKind::Transient, "network"));
        let discord = p.source().and_then(|s| s.downcast_ref::<DiscordError>());
        let io = discord
            .and_then(|d| d.source())
            .and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(
            io.map(std::io::Error::kind),
            Some(std::io::ErrorKind::ConnectionReset)
        );
    }

    #[test]
    fn close_codes_map_to_what_the_docs_say() {
        assert_eq!(close_action(4004).0, CloseAction::Fail);
        assert!(matches!(
            close_action(4004).1,
            Some(DiscordError::Unauthorized)
        ));
        for c in [4010, 4011, 4012, 4013, 4014] {
            assert_eq!(close_action(c).0, CloseAction::Fail, "{c}");
        }
        assert_eq!(close_action(4007).0, CloseAction::Identify);
        assert_eq!(close_action(4009).0, CloseAction::Identify);
        for c in [1000, 1001, 1006, 4000, 4001, 4008] {
            assert_eq!(close_action(c).0, CloseAction::Resume, "{c}");
        }
        let e: PlatformError = DiscordError::Refused {
            code: 4014,
            reason: "x",
        }
        .into();
        assert_eq!(e.kind(), ErrorKind::Credentials);
    }
}
