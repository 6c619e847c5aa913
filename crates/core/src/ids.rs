//! Identifier newtypes: a worker id cannot be passed where a bot id belongs.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::InvalidId;

/// Longest id we accept, in bytes. Ids end up in Redis keys, SQL rows and metric labels.
pub const MAX_ID_LEN: usize = 128;

/// Checks the rules every textual id follows: 1 to [`MAX_ID_LEN`] bytes of ASCII letters,
/// digits, `-`, `_`, `.` and `@`. Keeping ids to this set makes them safe inside Redis keys,
/// metric labels and log lines without escaping.
fn validate(kind: &'static str, s: &str) -> Result<(), InvalidId> {
    // A unit of a bot split into slices (`support#3`): the bot's id, `#`, the slice number.
    // Operators cannot register such ids (`BotSpec::validate` refuses them); the fleet makes
    // them from a bot's spec.
    if kind == "bot id" {
        if let Some((base, k)) = s.split_once('#') {
            if k.is_empty() || !k.bytes().all(|b| b.is_ascii_digit()) || k.len() > 6 {
                return Err(InvalidId::new(
                    kind,
                    s,
                    "has a slice suffix that is not a number",
                ));
            }
            return validate(kind, base);
        }
    }
    if s.is_empty() {
        return Err(InvalidId::new(kind, s, "is empty"));
    }
    if s.len() > MAX_ID_LEN {
        return Err(InvalidId::new(kind, s, "is longer than 128 bytes"));
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@')))
    {
        return Err(InvalidId::new(
            kind,
            s,
            if c.is_whitespace() {
                "contains white space"
            } else {
                "contains a character other than A-Z a-z 0-9 - _ . @"
            },
        ));
    }
    Ok(())
}

macro_rules! text_id {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Builds the id after checking it (see [`MAX_ID_LEN`] and the allowed characters).
            ///
            /// # Errors
            /// [`InvalidId`] when the text is empty, too long or has a character outside
            /// `A-Z a-z 0-9 - _ . @`.
            pub fn new(s: impl Into<String>) -> Result<Self, InvalidId> {
                let s = s.into();
                validate($kind, &s)?;
                Ok(Self(s))
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), self.0)
            }
        }

        impl std::str::FromStr for $name {
            type Err = InvalidId;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::new(s)
            }
        }

        impl TryFrom<String> for $name {
            type Error = InvalidId;
            fn try_from(s: String) -> Result<Self, Self::Error> {
                Self::new(s)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

text_id!(
    /// The id of a bot, chosen by the operator (`botfleet bots add <ID>`); unique in a fleet.
    BotId,
    "bot id"
);
impl BotId {
    /// The unit id of slice `k` of this bot: `{id}#{k}`.
    pub fn slice(&self, k: u32) -> BotId {
        BotId(format!("{}#{k}", self.base()))
    }

    /// The bot's own id: this id without a slice suffix.
    pub fn base(&self) -> &str {
        self.0.split_once('#').map_or(self.0.as_str(), |(b, _)| b)
    }

    /// The slice number of a unit id, if it is one.
    pub fn slice_index(&self) -> Option<u32> {
        self.0.split_once('#').and_then(|(_, k)| k.parse().ok())
    }
}

text_id!(
    /// The id of a worker process; stable across restarts if the operator sets it.
    WorkerId,
    "worker id"
);

/// A random nonce drawn at every process start (or re-registration).
///
/// Two lives of the same [`WorkerId`] have different incarnations, so a claim made by an
/// earlier life is recognisably stale.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Incarnation(String);

impl Incarnation {
    /// Wraps a nonce. The coordinator draws them; callers rarely need this.
    pub fn from_nonce(nonce: impl Into<String>) -> Self {
        Self(nonce.into())
    }

    /// The nonce as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Incarnation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Incarnation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Incarnation({})", self.0)
    }
}

/// A fencing token: grows on every grant of a claim or lock and never goes back.
///
/// Stores keep the highest fence seen per bot and refuse writes that carry a lower one, so a
/// worker that lost its claim (stalled, partitioned) cannot overwrite its successor's work.
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default, Serialize, Deserialize,
)]
pub struct Fence(pub u64);

impl Fence {
    /// The fence below every granted fence: "nothing granted yet".
    pub const ZERO: Fence = Fence(0);

    /// The raw number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One conversation on a platform: the bot plus the platform's chat id.
///
/// Messages of one `ChatKey` are handled one at a time, in arrival order.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
pub struct ChatKey {
    /// The bot the chat belongs to.
    pub bot: BotId,
    /// The platform's id of the chat (Telegram chat id, Slack channel, Discord channel).
    pub chat: String,
}

impl ChatKey {
    /// A chat of `bot`.
    pub fn new(bot: BotId, chat: impl Into<String>) -> Self {
        Self {
            bot,
            chat: chat.into(),
        }
    }
}

impl fmt::Display for ChatKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.bot, self.chat)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_usual_ids() {
        for ok in ["a", "bot-1", "tenant_42.support@eu", &"x".repeat(128)] {
            assert!(BotId::new(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn rejects_bad_ids_with_a_reason() {
        let e = BotId::new("").unwrap_err();
        assert_eq!(e.to_string(), "invalid bot id \"\": is empty");
        let e = WorkerId::new("a b").unwrap_err();
        assert!(e.to_string().contains("white space"), "{e}");
        assert!(BotId::new("a:b").is_err());
        assert!(BotId::new("{tag}").is_err());
        assert!(BotId::new("x".repeat(129)).is_err());
    }

    #[test]
    fn serde_checks_ids() {
        let id: BotId = serde_json::from_str("\"ok-1\"").unwrap();
        assert_eq!(id.as_str(), "ok-1");
        assert!(serde_json::from_str::<BotId>("\"not ok\"").is_err());
    }

    #[test]
    fn fences_order() {
        assert!(Fence(2) > Fence(1));
        assert_eq!(Fence::ZERO.get(), 0);
    }
}
