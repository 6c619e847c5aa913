//! The chat platforms botfleet speaks to.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Serialize};

use crate::error::UnknownPlatform;

/// A chat platform's name: what flags, the store, keys and metric labels say. What the
/// platform *is* (modes, credentials, rules, defaults) is its crate's
/// [`Descriptor`](crate::Descriptor).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Platform {
    /// Telegram Bot API (long polling or webhook).
    Telegram,
    /// Slack (Socket Mode).
    Slack,
    /// Discord (gateway).
    Discord,
    /// WhatsApp (Web session).
    Whatsapp,
}

impl Platform {
    /// Every platform, in a fixed order.
    pub const ALL: [Platform; 4] = [
        Platform::Telegram,
        Platform::Slack,
        Platform::Discord,
        Platform::Whatsapp,
    ];

    /// The lowercase name used in flags, config, keys and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Platform::Telegram => "telegram",
            Platform::Slack => "slack",
            Platform::Discord => "discord",
            Platform::Whatsapp => "whatsapp",
        }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Platform {
    type Err = UnknownPlatform;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Platform::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| UnknownPlatform(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_names() {
        for p in Platform::ALL {
            assert_eq!(p.as_str().parse::<Platform>().unwrap(), p);
        }
        assert_eq!("Telegram".parse::<Platform>().unwrap(), Platform::Telegram);
    }

    #[test]
    fn unknown_platform_is_a_clear_error() {
        let e = "myspace".parse::<Platform>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown platform \"myspace\" (expected one of: telegram, slack, discord, whatsapp)"
        );
    }
}
