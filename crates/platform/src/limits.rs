//! The platforms' outbound rate limits, as each platform crate declares them: every call a
//! bot makes counts against one or more buckets (its chat's, its group's, the bot's own…),
//! and the runtime takes a token from each — fleet-wide, through the coordinator — before
//! the call goes out.

use botfleet_core::Act;

use crate::StreamStep;

/// A token bucket: `per_second` calls a second on average, at most `burst` at once.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limit {
    /// Calls a second, on average; above 0.
    pub per_second: f64,
    /// How many may go at once after a quiet time; at least 1.
    pub burst: u32,
}

impl Limit {
    /// `calls` every `seconds` seconds, `burst` at once.
    pub const fn every(calls: u32, seconds: u32, burst: u32) -> Self {
        Self {
            per_second: calls as f64 / seconds as f64,
            burst,
        }
    }
}

/// One bucket an outbound call takes a token from: the limit of `scope` for `of`.
#[derive(Clone, Debug, PartialEq)]
pub struct Bucket {
    /// What the limit is kept per, as metrics name it: `chat`, `group`, `bot`, `channel`,
    /// `pair`, a method's name…
    pub scope: &'static str,
    /// Which one of that scope the call counts against (a chat id; empty for the bot itself).
    /// The runtime keys the bucket by the bot, the scope and this.
    pub of: String,
    /// The platform's limit for it.
    pub limit: Limit,
    /// Kept for the whole fleet rather than per bot: a limit the platform keeps on the
    /// caller (Discord's refused calls, counted per IP).
    pub fleet: bool,
}

impl Bucket {
    /// The bucket of the bot itself for `scope` (its global limit, a method's tier).
    pub fn bot(scope: &'static str, limit: Limit) -> Self {
        Self::of(scope, "", limit)
    }

    /// The bucket of `scope` for `of` (a chat, a channel, a user).
    pub fn of(scope: &'static str, of: &str, limit: Limit) -> Self {
        Self {
            scope,
            of: of.to_owned(),
            limit,
            fleet: false,
        }
    }

    /// The bucket of `scope` for `of` kept for the whole fleet, every bot of the platform
    /// drawing from it.
    pub fn fleet(scope: &'static str, of: &str, limit: Limit) -> Self {
        Self {
            fleet: true,
            ..Self::of(scope, of, limit)
        }
    }
}

/// An outbound call, as its platform's rate limits see it ([`crate::Sender::buckets`]).
#[derive(Clone, Copy, Debug)]
pub enum Call<'a> {
    /// One action in a chat ([`crate::Sender::act`]; a plain send is an [`Act::Send`] of
    /// its text).
    Act(&'a Act<'a>),
    /// One step of a native stream ([`crate::Sender::stream`]).
    Stream(StreamStep<'a>),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_read_as_documented() {
        let l = Limit::every(20, 60, 1);
        assert!((l.per_second - 1.0 / 3.0).abs() < 1e-9);
        assert_eq!(l.burst, 1);
        assert_eq!(Bucket::bot("bot", l).of, "");
        assert_eq!(Bucket::of("chat", "-100", l).of, "-100");
        assert!(Bucket::fleet("invalid", "budget", l).fleet && !Bucket::bot("bot", l).fleet);
    }
}
