//! Every Redis key and channel name of coordination, built in one place.

use botfleet_core::{BotId, WorkerId};

/// Builds the Redis keys of one fleet.
///
/// Every key starts with `{<prefix>}:`. The braces are a Redis Cluster hash tag: all keys of
/// a fleet live in one slot, so every multi-key script runs unchanged on a cluster. (A fleet's
/// coordination traffic is O(workers) per second plus claims, small enough for one slot.)
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeySpace {
    tag: String,
}

impl KeySpace {
    /// A key space under `prefix` (e.g. `botfleet`, `prod-eu`).
    ///
    /// # Errors
    /// A prefix that is empty, longer than 64 bytes, or has white space or braces.
    pub fn new(prefix: &str) -> Result<Self, crate::CoordError> {
        if prefix.is_empty()
            || prefix.len() > 64
            || prefix
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || c == '{' || c == '}')
        {
            return Err(crate::CoordError::InvalidArgument(format!(
                "key prefix {prefix:?} must be 1-64 bytes without white space or braces"
            )));
        }
        Ok(Self {
            tag: format!("{{{prefix}}}"),
        })
    }

    fn key(&self, parts: &[&str]) -> String {
        let mut k = self.tag.clone();
        for p in parts {
            k.push(':');
            k.push_str(p);
        }
        k
    }

    /// Hash: worker → incarnation.
    pub fn workers(&self) -> String {
        self.key(&["workers"])
    }
    /// Sorted set: worker → liveness deadline (server ms).
    pub fn deadlines(&self) -> String {
        self.key(&["deadlines"])
    }
    /// Hash: worker → metadata JSON.
    pub fn meta(&self) -> String {
        self.key(&["meta"])
    }
    /// Hash: worker → last renewal (server ms).
    pub fn beats(&self) -> String {
        self.key(&["beats"])
    }
    /// Hash: the fleet epoch (id, birth, grace window); missing after a data loss.
    pub fn epoch(&self) -> String {
        self.key(&["epoch"])
    }
    /// Hash: worker → write sequence of its registration (to detect lost writes).
    pub fn seqs(&self) -> String {
        self.key(&["seqs"])
    }
    /// Pub/sub channel announcing joins and leaves.
    pub fn members_channel(&self) -> String {
        self.key(&["members"])
    }
    /// Hash: the owner record of a bot.
    pub fn owner(&self, bot: &BotId) -> String {
        self.key(&["owner", bot.as_str()])
    }
    /// Counter: the last fence granted for a bot.
    pub fn fence(&self, bot: &BotId) -> String {
        self.key(&["fence", bot.as_str()])
    }
    /// Stream: lifecycle events.
    pub fn events(&self) -> String {
        self.key(&["events"])
    }
    /// List: commands queued for a worker.
    pub fn commands(&self, worker: &WorkerId) -> String {
        self.key(&["cmd", worker.as_str()])
    }
    /// Hash: a token bucket.
    pub fn rate(&self, name: &str) -> String {
        self.key(&["rate", name])
    }
    /// Hash: a send bucket of a platform scope (tokens, and the time they were counted at or
    /// a pause ends).
    pub fn bucket(&self, name: &str) -> String {
        self.key(&["bucket", name])
    }
    /// Hash: a fenced lock.
    pub fn lock(&self, name: &str) -> String {
        self.key(&["lock", name])
    }
    /// Counter: the last fence granted for a lock.
    pub fn lock_fence(&self, name: &str) -> String {
        self.key(&["lockfence", name])
    }
    /// Sorted set: the fleet's journal, `position|json` scored by position.
    pub fn journal(&self) -> String {
        self.key(&["journal"])
    }
    /// Counter: the last journal position given.
    pub fn journal_seq(&self) -> String {
        self.key(&["journalseq"])
    }
    /// Hash: `bot|worker` → unix ms until which placement keeps the bot off the worker.
    pub fn avoid(&self) -> String {
        self.key(&["avoid"])
    }
    /// Hash: a chat's turn queue (`next`, `serving`, holder `hw`/`hi`, fence `f`, and per
    /// ticket `t{n}` = `worker|incarnation|entry`).
    pub fn turn(&self, chat: &str) -> String {
        self.key(&["turn", chat])
    }
    /// Pub/sub channel waking a worker whose ticket's turn came.
    pub fn turn_wake(&self, worker: &WorkerId) -> String {
        self.key(&["turnwake", worker.as_str()])
    }
    /// What [`KeySpace::turn_wake`] puts before the worker id.
    pub fn turn_wake_prefix(&self) -> String {
        self.key(&["turnwake", ""])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_one_hash_tag() {
        let ks = KeySpace::new("prod").unwrap();
        let bot = BotId::new("b1").unwrap();
        assert_eq!(ks.owner(&bot), "{prod}:owner:b1");
        assert_eq!(ks.workers(), "{prod}:workers");
        for k in [
            ks.fence(&bot),
            ks.events(),
            ks.lock("x"),
            ks.rate("connect:telegram"),
        ] {
            assert!(k.starts_with("{prod}:"), "{k}");
        }
    }

    #[test]
    fn rejects_bad_prefixes() {
        for bad in ["", "a b", "{x}", &"p".repeat(65)] {
            assert!(KeySpace::new(bad).is_err(), "{bad:?}");
        }
    }
}
