//! Errors of the domain types.

use std::fmt;

/// An id that breaks the id rules; says which id, what text and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind} {shown:?}: {reason}")]
pub struct InvalidId {
    kind: &'static str,
    shown: String,
    reason: &'static str,
}

impl InvalidId {
    pub(crate) fn new(kind: &'static str, text: &str, reason: &'static str) -> Self {
        // Show at most 40 characters of what was given: enough to find it, never a whole blob.
        let shown: String = text.chars().take(40).collect();
        Self {
            kind,
            shown,
            reason,
        }
    }

    /// Which kind of id it was (`"bot id"`, `"worker id"`).
    pub fn kind(&self) -> &'static str {
        self.kind
    }
}

/// A platform name botfleet does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct UnknownPlatform(pub(crate) String);

impl fmt::Display for UnknownPlatform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: String = self.0.chars().take(40).collect();
        write!(
            f,
            "unknown platform {shown:?} (expected one of: {})",
            crate::Platform::ALL
                .iter()
                .map(|p| p.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

/// A bot spec that cannot be run as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidSpec {
    /// The id is not a valid bot id.
    #[error(transparent)]
    Id(#[from] InvalidId),
    /// The platform is unknown.
    #[error(transparent)]
    Platform(#[from] UnknownPlatform),
    /// The token is empty or has characters no platform issues.
    #[error("invalid token: {0}")]
    Token(&'static str),
    /// The app token (Slack's `xapp-…`) is missing where needed, or malformed.
    #[error("invalid app_token: {0}")]
    AppToken(&'static str),
    /// The shard count is not valid.
    #[error("invalid shards: {0}")]
    Shards(&'static str),
    /// The bot id is reserved for the fleet's own use.
    #[error("invalid id: {0}")]
    ReservedId(&'static str),
    /// A URL option is not an `http://` or `https://` URL.
    #[error("invalid {field}: {reason}")]
    Url {
        /// Which option (`api_url`, `webhook_url`).
        field: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The receive mode, or a webhook setting it needs, is wrong.
    #[error("invalid {field}: {reason}")]
    Hook {
        /// Which setting (`mode`, `secret_token`, `signing_secret`, `app_secret`,
        /// `verify_token`, `phone_number_id`, `max_connections`).
        field: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The platform has no such receive mode, or this build does not run it.
    #[error("invalid mode: {0}")]
    Mode(String),
    /// A credential or setting that the bot's platform, in its mode, does not take.
    #[error("invalid {field}: not a setting of {platform} bots in mode {mode}")]
    NotASetting {
        /// The field given.
        field: &'static str,
        /// The bot's platform.
        platform: crate::Platform,
        /// Its mode.
        mode: &'static str,
    },
    /// A setting no mode of the bot's platform takes, which other platforms do.
    #[error("invalid {field}: only {owners} bots have {field}")]
    OtherPlatforms {
        /// The field given.
        field: &'static str,
        /// The platforms that take it (`Discord`, `Telegram or WhatsApp`).
        owners: String,
    },
    /// `handler_timeout_s` is out of its range.
    #[error("invalid handler_timeout_s: must be 1-900 seconds")]
    HandlerTimeout,
    /// `async_reply_ttl_s` is out of its range.
    #[error("invalid async_reply_ttl_s: must be 10-86400 seconds")]
    AsyncReplyTtl,
    /// The bot's commands break a rule (see [`check_commands`](crate::check_commands)).
    #[error("invalid commands: {0}")]
    Commands(String),
    /// The handler kind is not one botfleet knows.
    #[error("unknown handler {0:?} (expected echo, webhook, or the name of a handler compiled into the workers: a-z, 0-9, _ or -, starting with a letter, at most 32)")]
    UnknownHandler(String),
    /// A handler that needs a setting did not get it.
    #[error("handler {handler} needs {missing}")]
    Handler {
        /// The handler kind.
        handler: &'static str,
        /// The missing setting.
        missing: &'static str,
    },
}
