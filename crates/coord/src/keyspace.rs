//! Every Redis key and channel name of coordination, built in one place.
//!
//! The keys fall in **groups**: each group is a full copy of the per-entity schema (a bot's
//! owner record and fence, a chat's turn queue) with its own view of the fleet's liveness —
//! workers, their deadlines, renewals and write sequences, and an epoch — under a hash tag of
//! its own, so that every script touches the keys of one group only, which a Redis Cluster
//! keeps in one slot. Fleet-wide keys (worker metadata, membership, events, the journal,
//! worker commands, locks, rate and send buckets, turn wake-ups) live in the **roster**, under
//! the tag `{prefix}`, which group 0 shares: with one group (the default) every key is named
//! as it always was, so a fleet that starts using groups finds its keys where they were.

use botfleet_core::{BotId, WorkerId};

/// The most groups a fleet may have.
pub const MAX_GROUPS: u16 = 1024;

/// A coordination group: which copy of the per-entity schema a key belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Group(u16);

impl Group {
    /// Group 0: its keys carry the roster's tag (today's names).
    pub const ZERO: Self = Self(0);

    /// Its number, `0..groups`.
    pub fn index(self) -> u16 {
        self.0
    }
}

impl std::fmt::Display for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "g{}", self.0)
    }
}

/// Builds the Redis keys of one fleet.
///
/// Every key starts with a hash tag: `{<prefix>}:` for the roster and group 0,
/// `{<prefix>:g<K>}:` for group K > 0. The braces are a Redis Cluster hash tag: all keys of a
/// group live in one slot, so every script, touching one group's keys, runs unchanged on a
/// cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeySpace {
    prefix: String,
    /// `{prefix}`: the roster's and group 0's tag.
    tag: String,
    groups: u16,
}

impl KeySpace {
    /// A key space under `prefix` (e.g. `botfleet`, `prod-eu`), with one group.
    ///
    /// # Errors
    /// A prefix that is empty, longer than 64 bytes, has white space or braces, or ends in
    /// `:g` and a number.
    pub fn new(prefix: &str) -> Result<Self, crate::CoordError> {
        Self::with_groups(prefix, 1)
    }

    /// A key space under `prefix` split into `groups` groups.
    ///
    /// # Errors
    /// A bad prefix (see [`KeySpace::new`]), or `groups` outside 1–[`MAX_GROUPS`].
    pub fn with_groups(prefix: &str, groups: u16) -> Result<Self, crate::CoordError> {
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
        if let Some((_, n)) = prefix.rsplit_once(":g") {
            if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
                // `{p:g3}` is group 3 of the fleet `p`: no fleet's own tag may be one.
                return Err(crate::CoordError::InvalidArgument(format!(
                    "key prefix {prefix:?} may not end in \":g\" and a number (the tags of \
                     another fleet's coordination groups)"
                )));
            }
        }
        if !(1..=MAX_GROUPS).contains(&groups) {
            return Err(crate::CoordError::InvalidArgument(format!(
                "coordination groups must be 1-{MAX_GROUPS}, not {groups}"
            )));
        }
        Ok(Self {
            prefix: prefix.to_owned(),
            tag: format!("{{{prefix}}}"),
            groups,
        })
    }

    /// The in-memory hub's key space: no Redis key is built from it, only groups are hashed
    /// (which the prefix does not change); `groups` is clamped to 1–[`MAX_GROUPS`].
    pub(crate) fn in_memory(groups: u16) -> Self {
        Self {
            prefix: "memory".to_owned(),
            tag: "{memory}".to_owned(),
            groups: groups.clamp(1, MAX_GROUPS),
        }
    }

    /// How many groups the keys fall in.
    pub fn groups(&self) -> u16 {
        self.groups
    }

    /// Every group, in order.
    pub fn all_groups(&self) -> impl Iterator<Item = Group> {
        (0..self.groups).map(Group)
    }

    /// The group of `bot`'s owner record and fence.
    pub fn group_of_bot(&self, bot: &BotId) -> Group {
        self.group_of(bot.as_str())
    }

    /// The group of a chat's turn queue (`chat`: the coordinator's key of the chat, which
    /// names its bot and chat).
    pub fn group_of_chat(&self, chat: &str) -> Group {
        self.group_of(chat)
    }

    /// The group `name` hashes to: FNV-1a (64 bits), mixed, scaled to the groups by its high
    /// bits (FNV's low bits follow the names' last bytes too closely), the same on every worker and
    /// in every version: a change — of the hash, or of a fleet's number of groups — moves
    /// nearly every key.
    fn group_of(&self, name: &str) -> Group {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in name.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Mixed (murmur3's finalizer): every byte moves the high bits.
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^= h >> 33;
        let g = (u128::from(h) * u128::from(self.groups)) >> 64;
        // Below `groups` (at most 1,024): fits.
        Group(u16::try_from(g).unwrap_or(0))
    }

    /// The hash tag of group `g`'s keys.
    pub fn group_tag(&self, g: Group) -> String {
        if g.0 == 0 {
            self.tag.clone()
        } else {
            format!("{{{}:{g}}}", self.prefix)
        }
    }

    fn key(&self, parts: &[&str]) -> String {
        join(self.tag.clone(), parts)
    }

    fn key_in(&self, g: Group, parts: &[&str]) -> String {
        join(self.group_tag(g), parts)
    }

    // ---- per group: each group's own view of the fleet ----

    /// Hash: worker → incarnation (group 0's).
    pub fn workers(&self) -> String {
        self.workers_in(Group::ZERO)
    }
    /// Hash: worker → incarnation, as group `g` knows it.
    pub fn workers_in(&self, g: Group) -> String {
        self.key_in(g, &["workers"])
    }
    /// Sorted set: worker → liveness deadline (server ms) (group 0's).
    pub fn deadlines(&self) -> String {
        self.deadlines_in(Group::ZERO)
    }
    /// Sorted set: worker → liveness deadline (server ms), as group `g` knows it.
    pub fn deadlines_in(&self, g: Group) -> String {
        self.key_in(g, &["deadlines"])
    }
    /// Hash: worker → last renewal (server ms) (group 0's).
    pub fn beats(&self) -> String {
        self.beats_in(Group::ZERO)
    }
    /// Hash: worker → last renewal (server ms) in group `g`.
    pub fn beats_in(&self, g: Group) -> String {
        self.key_in(g, &["beats"])
    }
    /// Hash: the epoch (id, birth, grace window) (group 0's); missing after a data loss.
    pub fn epoch(&self) -> String {
        self.epoch_in(Group::ZERO)
    }
    /// Hash: group `g`'s epoch; missing after its data was lost.
    pub fn epoch_in(&self, g: Group) -> String {
        self.key_in(g, &["epoch"])
    }
    /// Hash: worker → write sequence of its registration (group 0's; to detect lost writes).
    pub fn seqs(&self) -> String {
        self.seqs_in(Group::ZERO)
    }
    /// Hash: worker → write sequence of its registration in group `g`.
    pub fn seqs_in(&self, g: Group) -> String {
        self.key_in(g, &["seqs"])
    }

    // ---- per entity, in its group ----

    /// Hash: the owner record of a bot (in the bot's group).
    pub fn owner(&self, bot: &BotId) -> String {
        self.key_in(self.group_of_bot(bot), &["owner", bot.as_str()])
    }
    /// Counter: the last fence granted for a bot (in the bot's group).
    pub fn fence(&self, bot: &BotId) -> String {
        self.key_in(self.group_of_bot(bot), &["fence", bot.as_str()])
    }
    /// Hash: a chat's turn queue (`next`, `serving`, holder `hw`/`hi`, fence `f`, and per
    /// ticket `t{n}` = `worker|incarnation|entry`), in the chat's group.
    pub fn turn(&self, chat: &str) -> String {
        self.key_in(self.group_of_chat(chat), &["turn", chat])
    }

    // ---- the roster: fleet-wide ----

    /// Hash: worker → metadata JSON.
    pub fn meta(&self) -> String {
        self.key(&["meta"])
    }
    /// Hash: the fleet's layout (`groups`: how many coordination groups its workers use).
    pub fn layout(&self) -> String {
        self.key(&["layout"])
    }
    /// Pub/sub channel announcing joins and leaves.
    pub fn members_channel(&self) -> String {
        self.key(&["members"])
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
    /// Pub/sub channel waking a worker whose ticket's turn came.
    pub fn turn_wake(&self, worker: &WorkerId) -> String {
        self.key(&["turnwake", worker.as_str()])
    }
    /// What [`KeySpace::turn_wake`] puts before the worker id.
    pub fn turn_wake_prefix(&self) -> String {
        self.key(&["turnwake", ""])
    }
}

fn join(mut k: String, parts: &[&str]) -> String {
    for p in parts {
        k.push(':');
        k.push_str(p);
    }
    k
}

/// The hash tag of `key` as Redis Cluster reads it: what is between the first `{` and the
/// next `}`, when that is not empty.
#[cfg(test)]
fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let close = key[open + 1..].find('}')? + open + 1;
    (close > open + 1).then(|| &key[open + 1..close])
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;

    /// Every key of one worker, one bot and one chat, by name.
    fn keys(ks: &KeySpace, bot: &BotId, chat: &str, g: Group) -> BTreeMap<&'static str, String> {
        let w = WorkerId::new("w1").unwrap();
        BTreeMap::from([
            ("workers", ks.workers_in(g)),
            ("deadlines", ks.deadlines_in(g)),
            ("beats", ks.beats_in(g)),
            ("epoch", ks.epoch_in(g)),
            ("seqs", ks.seqs_in(g)),
            ("owner", ks.owner(bot)),
            ("fence", ks.fence(bot)),
            ("turn", ks.turn(chat)),
            ("meta", ks.meta()),
            ("layout", ks.layout()),
            ("members", ks.members_channel()),
            ("events", ks.events()),
            ("cmd", ks.commands(&w)),
            ("rate", ks.rate("connect:telegram")),
            ("bucket", ks.bucket("tg:1")),
            ("lock", ks.lock("x")),
            ("lockfence", ks.lock_fence("x")),
            ("journal", ks.journal()),
            ("journalseq", ks.journal_seq()),
            ("avoid", ks.avoid()),
            ("turnwake", ks.turn_wake(&w)),
        ])
    }

    /// One group is exactly the layout every fleet had before groups: one tag, today's names.
    #[test]
    fn one_group_keeps_every_name() {
        let ks = KeySpace::new("prod").unwrap();
        assert_eq!(ks.groups(), 1);
        let bot = BotId::new("b1").unwrap();
        let got = keys(&ks, &bot, "b1/42", Group::ZERO);
        let want = BTreeMap::from([
            ("workers", "{prod}:workers"),
            ("deadlines", "{prod}:deadlines"),
            ("beats", "{prod}:beats"),
            ("epoch", "{prod}:epoch"),
            ("seqs", "{prod}:seqs"),
            ("owner", "{prod}:owner:b1"),
            ("fence", "{prod}:fence:b1"),
            ("turn", "{prod}:turn:b1/42"),
            ("meta", "{prod}:meta"),
            ("layout", "{prod}:layout"),
            ("members", "{prod}:members"),
            ("events", "{prod}:events"),
            ("cmd", "{prod}:cmd:w1"),
            ("rate", "{prod}:rate:connect:telegram"),
            ("bucket", "{prod}:bucket:tg:1"),
            ("lock", "{prod}:lock:x"),
            ("lockfence", "{prod}:lockfence:x"),
            ("journal", "{prod}:journal"),
            ("journalseq", "{prod}:journalseq"),
            ("avoid", "{prod}:avoid"),
            ("turnwake", "{prod}:turnwake:w1"),
        ]);
        let got: BTreeMap<_, _> = got.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(got, want);
        assert_eq!(ks.workers(), "{prod}:workers");
        assert_eq!(ks.deadlines(), "{prod}:deadlines");
        assert_eq!(ks.beats(), "{prod}:beats");
        assert_eq!(ks.epoch(), "{prod}:epoch");
        assert_eq!(ks.seqs(), "{prod}:seqs");
        assert_eq!(ks.turn_wake_prefix(), "{prod}:turnwake:");
        assert_eq!(ks.all_groups().collect::<Vec<_>>(), [Group::ZERO]);
    }

    /// With G groups the keys fall in exactly G hash tags (group 0's is the roster's): each
    /// group's view of the fleet under its own, a bot's keys and a chat's turn queue under
    /// their group's, the fleet-wide keys under the roster's; bots and chats spread over
    /// every group.
    #[test]
    fn groups_split_the_keys_into_their_tags() {
        let ks = KeySpace::with_groups("prod", 8).unwrap();
        let mut tags = BTreeSet::new();
        let mut bots_in = BTreeMap::<Group, usize>::new();
        let mut chats_in = BTreeMap::<Group, usize>::new();
        for i in 0..800 {
            let bot = BotId::new(format!("bot-{i}")).unwrap();
            let chat = format!("bot-{i}/{}", i * 7);
            let (bg, cg) = (ks.group_of_bot(&bot), ks.group_of_chat(&chat));
            *bots_in.entry(bg).or_default() += 1;
            *chats_in.entry(cg).or_default() += 1;
            for (name, key) in keys(&ks, &bot, &chat, Group(u16::try_from(i % 8).unwrap())) {
                let tag = hash_tag(&key).unwrap().to_owned();
                let want = match name {
                    "workers" | "deadlines" | "beats" | "epoch" | "seqs" => {
                        ks.group_tag(Group(u16::try_from(i % 8).unwrap()))
                    }
                    "owner" | "fence" => ks.group_tag(bg),
                    "turn" => ks.group_tag(cg),
                    _ => ks.group_tag(Group::ZERO),
                };
                assert_eq!(format!("{{{tag}}}"), want, "{name}: {key}");
                tags.insert(tag);
            }
        }
        let want: BTreeSet<String> = std::iter::once("prod".to_owned())
            .chain((1..8).map(|g| format!("prod:g{g}")))
            .collect();
        assert_eq!(tags, want);
        // Spread: every group has bots and chats, none more than twice its share.
        for counts in [&bots_in, &chats_in] {
            assert_eq!(counts.len(), 8, "{counts:?}");
            assert!(counts.values().all(|n| *n > 50 && *n < 200), "{counts:?}");
        }
    }

    /// A bot's group is the same on every worker and in every version: the hash is fixed
    /// (these values are FNV-1a's, mixed and scaled by its high bits), not the process's.
    #[test]
    fn groups_are_the_same_everywhere() {
        let ks = KeySpace::with_groups("prod", 1024).unwrap();
        let bot = BotId::new("b1").unwrap();
        assert_eq!(ks.group_of_bot(&bot), Group(80));
        assert_eq!(ks.owner(&bot), "{prod:g80}:owner:b1");
        let again = KeySpace::with_groups("other", 1024).unwrap();
        assert_eq!(again.group_of_bot(&bot), ks.group_of_bot(&bot));
        assert_eq!(ks.group_of_chat("b1/42"), Group(144));
        assert_eq!(ks.turn("b1/42"), "{prod:g144}:turn:b1/42");
    }

    #[test]
    fn rejects_bad_prefixes_and_group_counts() {
        for bad in ["", "a b", "{x}", &"p".repeat(65), "prod:g3", "x:g17"] {
            assert!(KeySpace::new(bad).is_err(), "{bad:?}");
        }
        for fine in ["prod:g", "prod:gx", "prod:g3x", "g3", "prod-g3"] {
            assert!(KeySpace::new(fine).is_ok(), "{fine:?}");
        }
        for bad in [0, MAX_GROUPS + 1] {
            let e = KeySpace::with_groups("p", bad).unwrap_err().to_string();
            assert!(
                e.contains("1-1024") && e.contains(&format!("not {bad}")),
                "{e}"
            );
        }
        assert!(KeySpace::with_groups("p", MAX_GROUPS).is_ok());
    }
}
