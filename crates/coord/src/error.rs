//! Errors of coordination.

use std::time::Duration;

/// What kind of failure a coordinator call met; match on it, the source is kept.
#[derive(Debug, thiserror::Error)]
pub enum CoordError {
    /// The Redis URL does not parse or names an unsupported scheme.
    #[error("invalid Redis URL: {reason}")]
    InvalidUrl {
        /// What is wrong; never contains the URL's password.
        reason: String,
    },
    /// Redis did not answer in time or refused the connection.
    #[error("Redis unreachable ({what})")]
    Unreachable {
        /// What was attempted.
        what: String,
        /// The underlying error.
        #[source]
        source: Option<redis::RedisError>,
    },
    /// Redis answered with an error.
    #[error("Redis error during {what}")]
    Redis {
        /// What was attempted.
        what: &'static str,
        /// The underlying error.
        #[source]
        source: redis::RedisError,
    },
    /// Redis answered something this version does not understand (another program wrote the
    /// keys, or versions mix).
    #[error("unexpected reply during {what}: {detail}")]
    Protocol {
        /// What was attempted.
        what: &'static str,
        /// What was wrong with it.
        detail: String,
    },
    /// The worker has not registered (or was told its liveness is lost): register first.
    #[error("this worker is not registered")]
    NotRegistered,
    /// The caller gave a value out of its range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A grant was written but fewer replicas than asked for had it in time
    /// ([`RedisConfig::min_replicas`](crate::RedisConfig::min_replicas)): it is not acted on;
    /// asked again, it is granted again once a replica follows.
    #[error("{what}: the grant reached {acked} of the {wanted} replica(s) it must reach (--redis-min-replicas) within {within:?}")]
    Unreplicated {
        /// What was attempted.
        what: &'static str,
        /// How many replicas had it.
        acked: u64,
        /// How many must.
        wanted: u32,
        /// How long it waited.
        within: Duration,
    },
    /// The worker splits the coordination keys into another number of groups than the live
    /// workers of its fleet ([`RedisConfig::groups`](crate::RedisConfig::groups)): it may not
    /// join them. Retrying does not help; every worker of a fleet must use one number.
    #[error("this worker splits coordination into {ours} group(s) (--coord-groups) but the fleet's live workers use {fleet}: every worker of a fleet must use the same number (to change it, stop every worker first)")]
    GroupsMismatch {
        /// This worker's number of groups.
        ours: u16,
        /// The fleet's, as its roster records it.
        fleet: u16,
    },
    /// The call did not finish within its deadline.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
}

impl CoordError {
    pub(crate) fn redis(what: &'static str, source: redis::RedisError) -> Self {
        if source.is_io_error()
            || source.is_timeout()
            || source.is_connection_dropped()
            || source.is_connection_refusal()
        {
            CoordError::Unreachable {
                what: what.to_owned(),
                source: Some(source),
            }
        } else {
            CoordError::Redis { what, source }
        }
    }

    /// Whether retrying later may succeed (the backend was unreachable or slow).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            CoordError::Unreachable { .. }
                | CoordError::Timeout(_)
                | CoordError::Redis { .. }
                | CoordError::Unreplicated { .. }
        )
    }
}

/// Result of coordination calls.
pub type Result<T, E = CoordError> = std::result::Result<T, E>;
