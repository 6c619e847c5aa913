//! Placement: which worker *should* run a bot (a consistent hash ring), and which shards a
//! replica of a sharded gateway owns. Pure functions of their inputs, no I/O.
//!
//! The ring only advises. Who actually runs a bot is decided by a fenced claim (see
//! [`Coordinator::claim`](crate::Coordinator::claim)); views of the ring may differ between
//! workers for a moment, claims cannot.
//!
//! # The ring
//! Each worker puts `vnodes × weight` points on a 64-bit circle. A bot is hashed `probes`
//! times (multi-probe consistent hashing); each probe finds the first point at or after it,
//! and the bot goes to the point reached in the shortest distance. With many virtual nodes
//! *and* several probes, the share of each worker is close to its weight (see the balance
//! figures in the crate README), while the ring stays *monotone*: adding a worker only moves
//! bots to it, removing one only moves its own bots away.
//!
//! Hashes are XXH3-64 of the UTF-8 bytes, a published algorithm with fixed output, so every
//! process, platform and Rust version computes the same ring (std's `DefaultHasher` promises
//! none of that).

use std::collections::{HashMap, HashSet};

use botfleet_core::{BotId, WorkerId};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Default virtual nodes per worker of weight 1.
pub const DEFAULT_VNODES: u32 = 100;
/// Default probes per bot.
pub const DEFAULT_PROBES: u32 = 16;

/// Settings of a [`Ring`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingConfig {
    /// Virtual nodes per worker of weight 1. Default [`DEFAULT_VNODES`]; 1 to 10,000. More
    /// nodes even out the shares and cost memory (16 bytes a node) and build time.
    pub vnodes: u32,
    /// Hashes per bot. Default [`DEFAULT_PROBES`]; 1 to 64. More probes even out the shares
    /// and cost one binary search each per lookup.
    pub probes: u32,
}

impl Default for RingConfig {
    fn default() -> Self {
        Self {
            vnodes: DEFAULT_VNODES,
            probes: DEFAULT_PROBES,
        }
    }
}

impl RingConfig {
    /// Clamps both settings into their documented ranges.
    fn clamped(self) -> Self {
        Self {
            vnodes: self.vnodes.clamp(1, 10_000),
            probes: self.probes.clamp(1, 64),
        }
    }
}

/// A consistent hash ring over a set of workers.
#[derive(Clone, Debug)]
pub struct Ring {
    /// Points sorted by position; `.1` indexes `workers`.
    points: Vec<(u64, u32)>,
    /// Members sorted by id, so equal memberships build equal rings whatever the input order.
    workers: Vec<WorkerId>,
    /// Weight of each member, same order as `workers`.
    weights: Vec<f64>,
    probes: u32,
}

impl Ring {
    /// A ring over `workers`, each of weight 1.
    pub fn new<'a>(workers: impl IntoIterator<Item = &'a WorkerId>, config: RingConfig) -> Self {
        Self::weighted(workers.into_iter().map(|w| (w.clone(), 1.0)), config)
    }

    /// A ring over `(worker, weight)` pairs. A worker of weight 2 gets about twice the bots of
    /// a worker of weight 1. Weights are clamped to 0.01–100; a non-finite weight counts as 1.
    /// A worker listed twice counts once (its first weight wins).
    pub fn weighted(
        workers: impl IntoIterator<Item = (WorkerId, f64)>,
        config: RingConfig,
    ) -> Self {
        let config = config.clamped();
        let mut members: Vec<(WorkerId, f64)> = Vec::new();
        let mut seen = HashSet::new();
        for (w, weight) in workers {
            if seen.insert(w.clone()) {
                let weight = if weight.is_finite() {
                    weight.clamp(0.01, 100.0)
                } else {
                    1.0
                };
                members.push((w, weight));
            }
        }
        members.sort_by(|a, b| a.0.cmp(&b.0));
        let mut points = Vec::new();
        for (idx, (w, weight)) in members.iter().enumerate() {
            // Rounding, not truncation: weight 1.0 × 100 must give exactly 100 nodes.
            let n = ((f64::from(config.vnodes) * weight).round() as u32).max(1);
            for v in 0..n {
                let key = format!("{}#{v}", w.as_str());
                points.push((xxh3_64_with_seed(key.as_bytes(), 0), idx as u32));
            }
        }
        points.sort_unstable();
        let (workers, weights) = members.into_iter().unzip();
        Self {
            points,
            workers,
            weights,
            probes: config.probes,
        }
    }

    /// The members, sorted by id.
    pub fn workers(&self) -> &[WorkerId] {
        &self.workers
    }

    /// Whether the ring has no member.
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// Whether `worker` is a member.
    pub fn contains(&self, worker: &WorkerId) -> bool {
        self.workers.binary_search(worker).is_ok()
    }

    /// The worker that should run `bot`, or `None` on an empty ring.
    pub fn owner_of(&self, bot: &BotId) -> Option<&WorkerId> {
        self.preference(bot).next()
    }

    /// All members in the order `bot` prefers them: the owner first, then where the bot goes
    /// if the owner is full or gone. Each member appears once.
    pub fn preference<'r>(&'r self, bot: &BotId) -> Preference<'r> {
        let cursors = if self.points.is_empty() {
            Vec::new()
        } else {
            (0..self.probes)
                .map(|seed| {
                    let h = xxh3_64_with_seed(bot.as_str().as_bytes(), u64::from(seed) + 1);
                    let start = self.points.partition_point(|(p, _)| *p < h);
                    ProbeCursor {
                        origin: h,
                        next: start,
                        walked: 0,
                    }
                })
                .collect()
        };
        Preference {
            ring: self,
            cursors,
            emitted: vec![false; self.workers.len()],
            left: self.workers.len(),
        }
    }

    /// The bots among `bots` that `worker` should run.
    pub fn bots_of<'b>(
        &self,
        worker: &WorkerId,
        bots: impl IntoIterator<Item = &'b BotId>,
    ) -> Vec<&'b BotId> {
        if !self.contains(worker) {
            return Vec::new();
        }
        bots.into_iter()
            .filter(|b| self.owner_of(b) == Some(worker))
            .collect()
    }
}

/// Default balance bound of [`Ring::assign`]: no worker gets more than 1.10 × its share.
pub const DEFAULT_BALANCE: f64 = 1.10;

/// Where [`Ring::assign`] put each bot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Assignment {
    /// Bot → worker that should run it.
    pub owners: HashMap<BotId, WorkerId>,
    /// Bots no worker has room for (every worker at capacity, or no worker at all).
    pub unplaced: Vec<BotId>,
}

impl Assignment {
    /// The bots assigned to `worker`, sorted.
    pub fn bots_of(&self, worker: &WorkerId) -> Vec<&BotId> {
        let mut v: Vec<_> = self
            .owners
            .iter()
            .filter(|(_, w)| *w == worker)
            .map(|(b, _)| b)
            .collect();
        v.sort();
        v
    }

    /// How many bots each worker got.
    pub fn loads(&self) -> HashMap<&WorkerId, usize> {
        let mut m = HashMap::new();
        for w in self.owners.values() {
            *m.entry(w).or_insert(0) += 1;
        }
        m
    }
}

impl Ring {
    /// Assigns a whole set of bots with bounded loads: each bot goes to the first worker of
    /// its [preference](Ring::preference) that has room.
    ///
    /// Room is bounded twice. `capacity(worker)` is a hard limit (`None`: unlimited); bots
    /// beyond every worker's capacity are returned as `unplaced`, never dropped silently.
    /// `balance` (at least 1.0; [`DEFAULT_BALANCE`] is 1.10) is a soft limit of
    /// `ceil(balance × weight share × bots)` per worker: a stateless hash leaves the fullest
    /// worker about 5 % above the mean and occasionally over 10 % (sampling noise of 10,000
    /// independent hashes); the bound trims those outliers onto the next preference, and a
    /// bot that fits nowhere under it is placed by capacity alone.
    ///
    /// Bots are visited in the order of a hash of their id, so the result depends only on
    /// the set of bots, the members and the limits — every process computes the same.
    pub fn assign<'b>(
        &self,
        bots: impl IntoIterator<Item = &'b BotId>,
        balance: f64,
        capacity: impl Fn(&WorkerId) -> Option<u32>,
    ) -> Assignment {
        self.assign_weighted(bots, balance, capacity, |_| 1)
    }

    /// [`Ring::assign`] where a unit weighs `weight(unit)` (at least 1) against the limits:
    /// capacity counts connections, and a Discord slice of K shards holds K.
    pub fn assign_weighted<'b>(
        &self,
        bots: impl IntoIterator<Item = &'b BotId>,
        balance: f64,
        capacity: impl Fn(&WorkerId) -> Option<u32>,
        weight: impl Fn(&BotId) -> u32,
    ) -> Assignment {
        self.assign_with(bots, balance, capacity, weight, |_, _| true)
    }

    /// [`Ring::assign_weighted`] where a unit goes only to workers `allowed` for it (a worker
    /// its transport failed on), unless none of the members is: then to any, as before.
    pub fn assign_with<'b>(
        &self,
        bots: impl IntoIterator<Item = &'b BotId>,
        balance: f64,
        capacity: impl Fn(&WorkerId) -> Option<u32>,
        weight: impl Fn(&BotId) -> u32,
        allowed: impl Fn(&BotId, &WorkerId) -> bool,
    ) -> Assignment {
        let mut order: Vec<(u64, &BotId)> = bots
            .into_iter()
            .map(|b| (xxh3_64_with_seed(b.as_str().as_bytes(), 0x5eed), b))
            .collect();
        order.sort_unstable();
        order.dedup_by(|a, b| a.1 == b.1);
        let mut out = Assignment::default();
        if self.workers.is_empty() {
            out.unplaced = order.into_iter().map(|(_, b)| b.clone()).collect();
            return out;
        }
        let balance = if balance.is_finite() {
            balance.max(1.0)
        } else {
            DEFAULT_BALANCE
        };
        let total_weight: f64 = self.weights.iter().sum();
        let n: f64 = order.iter().map(|(_, b)| f64::from(weight(b).max(1))).sum();
        let hard: Vec<usize> = self
            .workers
            .iter()
            .map(|w| capacity(w).map_or(usize::MAX, |c| c as usize))
            .collect();
        let soft: Vec<usize> = self
            .weights
            .iter()
            .zip(&hard)
            .map(|(wt, h)| ((balance * n * wt / total_weight).ceil() as usize).min(*h))
            .collect();
        let index: HashMap<&WorkerId, usize> = self
            .workers
            .iter()
            .enumerate()
            .map(|(i, w)| (w, i))
            .collect();
        let mut load = vec![0usize; self.workers.len()];
        // The first worker of the bot's preference with room under `limit`; takes the room.
        let mut place = |bot: &BotId, limit: &[usize]| {
            let w = weight(bot).max(1) as usize;
            let any = self.workers.iter().any(|m| allowed(bot, m));
            let i = self
                .preference(bot)
                .filter(|m| !any || allowed(bot, m))
                .map(|w| index[w])
                .find(|&i| load[i].saturating_add(w) <= limit[i])?;
            load[i] += w;
            Some(self.workers[i].clone())
        };
        let mut overflow = Vec::new();
        for (_, bot) in order {
            match place(bot, &soft) {
                Some(w) => {
                    out.owners.insert(bot.clone(), w);
                }
                None => overflow.push(bot),
            }
        }
        for bot in overflow {
            match place(bot, &hard) {
                Some(w) => {
                    out.owners.insert(bot.clone(), w);
                }
                None => out.unplaced.push(bot.clone()),
            }
        }
        out.unplaced.sort();
        out
    }
}

#[derive(Clone, Debug)]
struct ProbeCursor {
    origin: u64,
    /// Index (mod len) of the next point this probe reaches.
    next: usize,
    /// Points this probe has passed; it stops after a full turn.
    walked: usize,
}

/// Iterator over a ring's members in a bot's order of preference; see [`Ring::preference`].
#[derive(Clone, Debug)]
pub struct Preference<'r> {
    ring: &'r Ring,
    cursors: Vec<ProbeCursor>,
    emitted: Vec<bool>,
    left: usize,
}

impl<'r> Iterator for Preference<'r> {
    type Item = &'r WorkerId;

    fn next(&mut self) -> Option<&'r WorkerId> {
        let n = self.ring.points.len();
        while self.left > 0 {
            // The probe whose next point is nearest wins; ties go to the lower worker index so
            // the order is a pure function of membership.
            let mut best: Option<(u64, u32, usize)> = None;
            for (i, c) in self.cursors.iter().enumerate() {
                if c.walked >= n {
                    continue;
                }
                let (pos, w) = self.ring.points[c.next % n];
                let dist = pos.wrapping_sub(c.origin);
                if best.is_none_or(|(d, bw, _)| (dist, w) < (d, bw)) {
                    best = Some((dist, w, i));
                }
            }
            let (_, w, i) = best?;
            let c = &mut self.cursors[i];
            c.next = (c.next + 1) % n;
            c.walked += 1;
            let w = w as usize;
            if !self.emitted[w] {
                self.emitted[w] = true;
                self.left -= 1;
                return Some(&self.ring.workers[w]);
            }
        }
        None
    }
}

/// The fixed slice of shard ids that replica `index` owns, when `shard_count` shards are split
/// `shards_per_replica` to a replica and the last replica absorbs the tail.
///
/// 14 shards, 4 per replica: `[0..4] [4..8] [8..12] [12..14]`. An index past the last
/// replica owns nothing. `shards_per_replica == 0` is treated as 1.
pub fn shard_slice(shard_count: u32, shards_per_replica: u32, index: u32) -> std::ops::Range<u32> {
    let per = shards_per_replica.max(1);
    let start = index.saturating_mul(per);
    if start >= shard_count {
        return shard_count..shard_count;
    }
    start..start.saturating_add(per).min(shard_count)
}

/// How many replicas a sharded gateway needs: `ceil(shard_count / shards_per_replica)`.
pub fn replica_count(shard_count: u32, shards_per_replica: u32) -> u32 {
    shard_count.div_ceil(shards_per_replica.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(s: &str) -> WorkerId {
        WorkerId::new(s).unwrap()
    }

    #[test]
    fn shard_slices_absorb_the_tail() {
        let slices: Vec<_> = (0..replica_count(14, 4))
            .map(|i| shard_slice(14, 4, i))
            .collect();
        assert_eq!(slices, vec![0..4, 4..8, 8..12, 12..14]);
        assert_eq!(shard_slice(14, 4, 4), 14..14);
        assert_eq!(shard_slice(1, 0, 0), 0..1);
        assert_eq!(replica_count(0, 4), 0);
        assert_eq!(shard_slice(16, 4, 3), 12..16);
    }

    #[test]
    fn empty_ring_owns_nothing() {
        let r = Ring::new([], RingConfig::default());
        assert!(r.owner_of(&BotId::new("b").unwrap()).is_none());
        assert!(r.is_empty());
    }

    #[test]
    fn preference_lists_every_member_once() {
        let ws: Vec<_> = (0..7).map(|i| w(&format!("w{i}"))).collect();
        let r = Ring::new(&ws, RingConfig::default());
        let p: Vec<_> = r.preference(&BotId::new("bot-9").unwrap()).collect();
        assert_eq!(p.len(), 7);
        let set: HashSet<_> = p.iter().collect();
        assert_eq!(set.len(), 7);
        assert_eq!(Some(p[0]), r.owner_of(&BotId::new("bot-9").unwrap()));
    }

    #[test]
    fn hash_is_pinned() {
        // If this changes, every running fleet would reshuffle on upgrade: the ring's hash is
        // part of the wire contract between workers of different versions. The expected values
        // come from an independent XXH3 implementation (Python's `xxhash` package).
        assert_eq!(xxh3_64_with_seed(b"w1#0", 0), 11_212_550_454_529_822_458);
        assert_eq!(xxh3_64_with_seed(b"bot-42", 1), 3_758_080_508_709_446_032);
        assert_eq!(xxh3_64_with_seed(b"bot-42", 16), 635_807_291_015_216_921);
    }
}
