//! The [`Coordinator`] trait: everything workers agree on through a shared backend.

use std::time::Duration;

use async_trait::async_trait;
use botfleet_core::{BotId, Fence, Incarnation, WorkerId};
use tokio::sync::mpsc;

use crate::{
    BucketTake, ClaimOutcome, EpochInfo, EventCursor, Group, LifecycleEvent, LiveWorker, LockGuard,
    Owner, Permit, RateGrant, RateLimit, Renewal, Result, WorkerCommand, WorkerMeta,
};

/// One process's handle on the fleet's shared coordination state.
///
/// A handle acts for at most one worker at a time: [`register`](Coordinator::register) binds
/// it to a worker id and a fresh incarnation, and claims, renewals and command reads are made
/// for that registration. Unregistered handles can still do the administrative calls (list
/// workers, look up owners, publish events, send commands).
///
/// A call acts for the registration current when it is first polled (it reads it before it
/// awaits anything): a caller that reads [`registration`](Coordinator::registration) just
/// before knows which registration a grant belongs to, across a re-registration.
///
/// Every backend (in-memory, Redis) passes the same conformance suite in `botfleet-testkit`.
#[async_trait]
pub trait Coordinator: Send + Sync + std::fmt::Debug {
    /// Registers `worker` with a fresh incarnation and makes it live for `lease`.
    ///
    /// Any earlier incarnation of the same worker id is replaced: its claims become void.
    ///
    /// # Errors
    /// Backend failures; [`CoordError::InvalidArgument`](crate::CoordError) for a lease
    /// outside 100 ms – 10 min.
    async fn register(
        &self,
        worker: &WorkerId,
        meta: &WorkerMeta,
        lease: Duration,
    ) -> Result<Incarnation>;

    /// Extends this worker's liveness by one lease from now and records how many bots it runs.
    ///
    /// Answers [`Renewal::Lost`] if the liveness is gone or belongs to another incarnation, or
    /// if the backend lost data this registration wrote (its claims, hand-overs, releases or
    /// renewals: a restart without persistence, a failover to a replica that missed writes);
    /// the caller must stop its bots and register again.
    ///
    /// # Errors
    /// [`CoordError::NotRegistered`](crate::CoordError) before `register`; backend failures.
    async fn renew(&self, bots_held: u32) -> Result<Renewal> {
        self.renew_with(bots_held, 0).await
    }

    /// [`Coordinator::renew`], also saying how much memory the worker uses (shown in the
    /// fleet's status).
    ///
    /// # Errors
    /// As [`Coordinator::renew`].
    async fn renew_with(&self, bots_held: u32, rss_bytes: u64) -> Result<Renewal>;

    /// Ends this worker's liveness at once, so others see the departure without waiting for
    /// the lease. Claims it still holds become free.
    ///
    /// # Errors
    /// Backend failures.
    async fn unregister(&self) -> Result<()>;

    /// The registration of this handle, if any.
    fn registration(&self) -> Option<(WorkerId, Incarnation)>;

    /// This handle's incarnation in group `g`: the registration's own, or the one `g` was
    /// joined again with ([`Coordinator::rejoin_group`]). A grant in `g` belongs to the
    /// incarnation this answered just before the call.
    fn registration_in(&self, g: Group) -> Option<(WorkerId, Incarnation)> {
        let _ = g;
        self.registration()
    }

    /// [`Coordinator::renew_with`] with each group's answer apart, in group order, one per
    /// group. In a backend with groups, a group that answered [`Renewal::Lost`] is not renewed
    /// again (it answers `Lost` at once, with no call, so a group that went back in time is not
    /// pushed further into its hold) until it is joined again ([`Coordinator::rejoin_group`])
    /// or the worker registers again. Groups are independent: one lost or not answering says
    /// nothing of the others' grants. The default: the one group's [`Coordinator::renew_with`].
    async fn renew_groups(&self, bots_held: u32, rss_bytes: u64) -> Vec<(Group, Result<Renewal>)> {
        vec![(Group::ZERO, self.renew_with(bots_held, rss_bytes).await)]
    }

    /// Joins group `g` again under a fresh incarnation there, after its liveness in `g` was
    /// lost (the group lost its data, or this worker's deadline there passed): every grant
    /// held in `g` under the earlier incarnation is void (a call of it still in flight is
    /// refused), the other groups' grants stay good. Group 0 also holds the roster: joining
    /// it again announces a join. A group that lost its data starts its grace window.
    ///
    /// # Errors
    /// [`CoordError::NotRegistered`](crate::CoordError) before `register`;
    /// [`CoordError::InvalidArgument`](crate::CoordError) for a group the backend does not
    /// have, and from a backend without groups (the default: register again instead);
    /// backend failures.
    async fn rejoin_group(&self, g: Group) -> Result<Incarnation> {
        Err(crate::CoordError::InvalidArgument(format!(
            "this coordinator has one coordination group: register again instead of joining {g} again"
        )))
    }

    /// Every worker whose liveness is current, sorted by id.
    ///
    /// # Errors
    /// Backend failures.
    async fn live_workers(&self) -> Result<Vec<LiveWorker>>;

    /// A signal that fires (best effort, coalesced) when a worker registers or unregisters,
    /// in place when this returns (a listing made after it misses no signalled change).
    /// Expiries are not signalled: [`MemberWatch`](crate::MemberWatch) also polls.
    ///
    /// # Errors
    /// Backend failures.
    async fn member_signal(&self) -> Result<mpsc::Receiver<()>>;

    /// Claims `bot` for this worker.
    ///
    /// Granted when the bot is unowned, owned by a worker whose liveness is gone (or carries
    /// another incarnation), owned by this very registration, or handed over to it. The fence
    /// granted is above every fence granted for the bot before and above `min_fence` — pass
    /// the store's highest accepted fence so fences never go back even if the backend lost
    /// its data. It is also at least the backend's clock in ms, so a grant made after a loss
    /// is above a grant made before it that the store has not seen yet.
    ///
    /// A `min_fence` above what the backend remembers for the bot means the backend lost
    /// data since the store accepted it: the bot may still be run by its old owner, so the
    /// answer is [`ClaimOutcome::Grace`] until one lease (the longest the fleet uses) after
    /// the loss could have happened. A bot the store knows no fence of is never delayed.
    ///
    /// # Errors
    /// Backend failures; `NotRegistered` before `register`.
    async fn claim(&self, bot: &BotId, min_fence: Fence) -> Result<ClaimOutcome>;

    /// Gives up `bot` if this worker holds it under `fence`. Answers whether it did.
    ///
    /// # Errors
    /// Backend failures; `NotRegistered` before `register`.
    async fn release(&self, bot: &BotId, fence: Fence) -> Result<bool>;

    /// Hands `bot` (held under `fence`) to `to` and sends `to` a
    /// [`WorkerCommand::Take`]: while `to` is live, nobody else may claim the bot; `to` claims
    /// it with a new fence. If `to` is not live the bot is simply released. A hand-over `to`
    /// has not taken within a grace (the longest lease) lapses: the bot goes to whoever claims
    /// it then (`to` may have let the Take go). Answers whether this worker held the bot under
    /// `fence`.
    ///
    /// # Errors
    /// Backend failures; `NotRegistered` before `register`.
    async fn hand_over(&self, bot: &BotId, fence: Fence, to: &WorkerId) -> Result<bool>;

    /// Who holds `bot`, if anyone.
    ///
    /// # Errors
    /// Backend failures.
    async fn owner(&self, bot: &BotId) -> Result<Option<Owner>>;

    /// Appends a lifecycle event to the fleet's event stream (trimmed to a bound).
    ///
    /// # Errors
    /// Backend failures.
    async fn publish(&self, event: &LifecycleEvent) -> Result<EventCursor>;

    /// The cursor of the newest event: read after it to see only what comes next. Take it
    /// *before* the first claim pass, so nothing published during the pass is missed.
    ///
    /// # Errors
    /// Backend failures.
    async fn events_head(&self) -> Result<EventCursor>;

    /// Up to `max` events after `after`, oldest first; waits up to `wait` for the first one.
    /// Events that were trimmed away are skipped (the caller re-reads the registry then).
    ///
    /// # Errors
    /// Backend failures.
    async fn read_events(
        &self,
        after: &EventCursor,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<(EventCursor, LifecycleEvent)>>;

    /// Queues `command` for worker `to`. Queued commands of a worker that never reads them
    /// expire after a while.
    ///
    /// # Errors
    /// Backend failures.
    async fn send_command(&self, to: &WorkerId, command: &WorkerCommand) -> Result<()>;

    /// Up to `max` commands queued for this worker, in order; waits up to `wait` for one.
    ///
    /// # Errors
    /// Backend failures; `NotRegistered` before `register`.
    async fn recv_commands(&self, max: usize, wait: Duration) -> Result<Vec<WorkerCommand>>;

    /// Takes a token from the fleet-wide bucket `key` (e.g. `connect:telegram`), or says how
    /// long to wait for one.
    ///
    /// # Errors
    /// Backend failures.
    async fn acquire_rate(&self, key: &str, limit: RateLimit) -> Result<Permit> {
        let g = self.acquire_rate_many(key, limit, 1).await?;
        Ok(if g.taken == 1 {
            Permit::Granted
        } else {
            Permit::Wait(g.wait)
        })
    }

    /// Takes up to `n` tokens from the bucket `key` in one call (a start queue with thousands
    /// of bots waiting asks once, not once per bot). Answers how many were taken and, when
    /// fewer than `n`, how long until the next one is there.
    ///
    /// # Errors
    /// Backend failures.
    async fn acquire_rate_many(&self, key: &str, limit: RateLimit, n: u32) -> Result<RateGrant>;

    /// Takes a token from every send bucket of `scopes` (a platform call's: its chat, its
    /// group, its bot, its route…, each with its limit) at once, or from none: one round trip
    /// for all of them, shared by every worker of the fleet. Answers a zero wait when taken,
    /// else how long until every bucket could give one (a paused bucket counts its pause)
    /// and which scope holds the call longest.
    ///
    /// # Errors
    /// [`CoordError::InvalidArgument`](crate::CoordError) for a bad key or no scope; backend
    /// failures.
    async fn take_buckets(&self, scopes: &[(&str, RateLimit)]) -> Result<BucketTake>;

    /// [`Coordinator::take_buckets`] for a call that yields to others (an edit that a newer
    /// one may make needless): it takes only from buckets that keep their reserve — a fifth
    /// of the bucket ([`RateLimit::reserve`]) — for the calls that do not yield, so a final
    /// message goes before a streaming edit. Waits, as a take does, until they would.
    ///
    /// # Errors
    /// As [`Coordinator::take_buckets`].
    async fn take_buckets_yielding(&self, scopes: &[(&str, RateLimit)]) -> Result<BucketTake>;

    /// Pauses the send bucket `key` for `for_` (the platform's retry-after of a 429) for every
    /// worker of the fleet: no token from it before then (one at its end); a longer pause
    /// already set stays.
    ///
    /// # Errors
    /// [`CoordError::InvalidArgument`](crate::CoordError) for a bad key or pause; backend
    /// failures.
    async fn pause_bucket(&self, key: &str, for_: Duration) -> Result<()>;

    /// The fleet's current epoch, or `None` before any worker registered on this backend.
    /// Read-only: operators' tools call it to show a grace window after a data loss.
    ///
    /// # Errors
    /// Backend failures.
    async fn epoch(&self) -> Result<Option<EpochInfo>>;

    /// How many coordination groups this backend's keys fall in (see
    /// [`KeySpace`](crate::KeySpace)); 1 unless it splits them.
    fn groups(&self) -> u16 {
        1
    }

    /// Every coordination group, in order ([`Coordinator::groups`] of them; the default: one).
    fn all_groups(&self) -> Vec<Group> {
        vec![Group::ZERO]
    }

    /// The coordination group of `bot`'s owner record and fence.
    fn group_of_bot(&self, bot: &BotId) -> Group {
        let _ = bot;
        Group::ZERO
    }

    /// The coordination group of a chat's turn queue (`chat`: the key [`Coordinator::turn_take`]
    /// takes).
    fn group_of_chat(&self, chat: &str) -> Group {
        let _ = chat;
        Group::ZERO
    }

    /// Every group's epoch that exists, by group: where [`Coordinator::epoch`] combines them
    /// (the longest grace window), this says which groups lost their data. Read-only.
    ///
    /// # Errors
    /// Backend failures.
    async fn group_epochs(&self) -> Result<Vec<(Group, EpochInfo)>> {
        Ok(self
            .epoch()
            .await?
            .map(|e| (Group::ZERO, e))
            .into_iter()
            .collect())
    }

    /// Leads the singleton job `name` for `ttl`: answers the lock's fence while this handle
    /// leads (calling again renews), `None` while another does.
    ///
    /// # Errors
    /// Backend failures.
    async fn try_lead(&self, name: &str, ttl: Duration) -> Result<Option<Fence>>;

    /// Takes the lock `key` for `ttl` if nobody holds it, with a fresh token and a fence
    /// above every fence granted for `key` before.
    ///
    /// Inside a grace window after a data loss (see [`Coordinator::epoch`]) nobody gets a
    /// lock or leadership that is not already theirs: the holder from before the loss may
    /// still act on it by its own clock. `None` then, as when another holds it.
    ///
    /// # Errors
    /// Backend failures.
    async fn acquire_lock_fenced(&self, key: &str, ttl: Duration) -> Result<Option<LockGuard>>;

    /// Appends entries (JSON documents: what workers saw happen) to the fleet's journal, which
    /// keeps the newest [`JOURNAL_KEEP`](crate::JOURNAL_KEEP). Each gets the next position.
    ///
    /// # Errors
    /// Backend failures.
    async fn journal_append(&self, entries: &[String]) -> Result<()>;

    /// Up to `max` journal entries after position `after` (`None`: the newest `max`), oldest
    /// first, with their positions.
    ///
    /// # Errors
    /// Backend failures.
    async fn journal_read(&self, after: Option<u64>, max: usize) -> Result<Vec<(u64, String)>>;

    /// Keeps `bot` off `worker` for `for_` (its transport stayed down there): every worker's
    /// placement then puts the bot on its next choice, unless no other live worker is left.
    ///
    /// # Errors
    /// Backend failures.
    async fn avoid(&self, bot: &BotId, worker: &WorkerId, for_: Duration) -> Result<()>;

    /// The (bot, worker) pairs kept apart now (see [`Coordinator::avoid`]), sorted.
    ///
    /// # Errors
    /// Backend failures.
    async fn avoidances(&self) -> Result<Vec<(BotId, WorkerId)>>;

    /// Takes the next ticket of `chat`'s turn queue for the journal entry `entry` (its
    /// delivery key) and, in the same round trip, asks for the turn (as
    /// [`Coordinator::turn_try`]). Tickets are served in the order they were taken, one holder
    /// at a time; different chats are independent. `chat` is 1-300 bytes without white space
    /// or braces (e.g. `{bot}/{chat}`).
    ///
    /// A turn is held while the holder's liveness (this registration) holds: a worker that
    /// dies holding a turn, or holding tickets not yet served, is skipped by whoever asks next
    /// ([`Turn::TakeOver`](crate::Turn::TakeOver)), which replays its entry in order.
    ///
    /// # Errors
    /// Backend failures; `NotRegistered` before `register`; `InvalidArgument` for a bad key.
    async fn turn_take(&self, chat: &str, entry: &str) -> Result<(u64, crate::Turn)>;

    /// Asks for `ticket`'s turn again (after a wake-up, or after waiting a while: a taker
    /// that died is noticed here, not signalled). A held turn is granted again only to the
    /// ticket it was granted for: its holder asking again gets it (with a newer fence), as
    /// [`Turn::TakeOver`](crate::Turn::TakeOver) again when it asked with a later ticket and
    /// took an earlier one over; any other asker, of this worker too, waits.
    ///
    /// # Errors
    /// As [`Coordinator::turn_take`].
    async fn turn_try(&self, chat: &str, ticket: u64) -> Result<crate::Turn>;

    /// Ends the turn of `ticket` held under `fence`, and wakes the worker that took the next
    /// ticket. Answers whether this registration held it.
    ///
    /// # Errors
    /// As [`Coordinator::turn_take`].
    async fn turn_release(&self, chat: &str, ticket: u64, fence: Fence) -> Result<bool>;

    /// Wake-ups for this worker: the chat whose turn was released while this worker holds the
    /// next ticket (best effort: a missed one is made up by asking again after a while).
    ///
    /// # Errors
    /// Backend failures; `NotRegistered` before `register`.
    async fn turn_wakeups(&self) -> Result<mpsc::Receiver<String>>;

    /// Extends a held lock; answers false if it was lost.
    ///
    /// # Errors
    /// Backend failures.
    async fn renew_lock(&self, guard: &LockGuard, ttl: Duration) -> Result<bool>;

    /// Releases a held lock; only the holder's token does. Answers whether it did.
    ///
    /// # Errors
    /// Backend failures.
    async fn release_lock(&self, guard: &LockGuard) -> Result<bool>;
}

/// One answer for the whole lease from each group's renewal ([`Coordinator::renew_groups`]):
/// a group where the liveness is lost loses it all, and so does one that did not answer (the
/// lease keeper fences on time).
pub(crate) fn whole_lease(renewed: Vec<(Group, Result<Renewal>)>) -> Result<Renewal> {
    let mut failed = None;
    for (_, r) in renewed {
        match r {
            Ok(Renewal::Renewed) => {}
            Ok(Renewal::Lost) => return Ok(Renewal::Lost),
            Err(e) => failed = failed.or(Some(e)),
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(Renewal::Renewed),
    }
}

/// Checks a lease or TTL against the accepted range.
pub(crate) fn check_ttl(what: &str, d: Duration) -> Result<u64> {
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    if !(100..=600_000).contains(&ms) {
        return Err(crate::CoordError::InvalidArgument(format!(
            "{what} must be between 100 ms and 10 min, got {ms} ms"
        )));
    }
    Ok(ms)
}

/// A send bucket's pause: 1 ms to a day (a platform may ask for hours), in ms.
pub(crate) fn check_pause(d: Duration) -> Result<u64> {
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    if !(1..=86_400_000).contains(&ms) {
        return Err(crate::CoordError::InvalidArgument(format!(
            "a bucket's pause must be between 1 ms and a day, got {ms} ms"
        )));
    }
    Ok(ms)
}

/// The scopes of one take of send buckets: 1–64, each key checked.
pub(crate) fn check_scopes(scopes: &[(&str, RateLimit)]) -> Result<()> {
    if scopes.is_empty() || scopes.len() > 64 {
        return Err(crate::CoordError::InvalidArgument(format!(
            "a take of send buckets names 1-64 scopes, not {}",
            scopes.len()
        )));
    }
    scopes
        .iter()
        .try_for_each(|(key, _)| check_key("send bucket key", key))
}

/// Checks a rate-limiter or lock key: 1–200 bytes, no white space or braces.
pub(crate) fn check_key(what: &str, key: &str) -> Result<()> {
    check_key_len(what, key, 200)
}

/// Checks a key of 1–`max` bytes without white space or braces.
pub(crate) fn check_key_len(what: &str, key: &str, max: usize) -> Result<()> {
    if key.is_empty()
        || key.len() > max
        || key
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '{' || c == '}')
    {
        return Err(crate::CoordError::InvalidArgument(format!(
            "{what} must be 1-{max} bytes without white space or braces"
        )));
    }
    Ok(())
}

/// A fresh random nonce, 16 hex characters.
pub(crate) fn nonce() -> String {
    let mut b = [0u8; 8];
    // getrandom only fails on platforms without an entropy source; fall back to time and pid.
    if getrandom::fill(&mut b).is_err() {
        let t = botfleet_core::unix_ms() as u64 ^ (u64::from(std::process::id()) << 32);
        b = t.to_le_bytes();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// What a handle learned about the fleet that must outlive its registration: per
/// coordination group the epoch it last saw (so it can tell that group's loss) and the highest
/// write sequence its registration was answered there (so a renewal can tell lost writes), and
/// the longest lease it saw (the grace after a loss).
#[derive(Debug)]
pub(crate) struct Knowledge {
    /// Indexed by the group's number; never empty.
    groups: Box<[GroupKnown]>,
    max_lease_ms: std::sync::atomic::AtomicU64,
}

/// What a handle learned about one coordination group.
#[derive(Debug, Default)]
struct GroupKnown {
    epoch: std::sync::Mutex<String>,
    seq: std::sync::Mutex<SeqAt>,
}

/// A registration's write sequence in one group, and which registration of the handle it
/// belongs to (`gen`, counted up by every [`Knowledge::reset_seq`]): an answer to a call sent
/// for an earlier registration may arrive after the next one began, and must not move the new
/// registration's sequence (a higher stale one would make its next renewal look like lost
/// writes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SeqAt {
    gen: u64,
    /// The highest write sequence answered.
    pub(crate) seq: u64,
}

impl Default for Knowledge {
    fn default() -> Self {
        Self::with_groups(1)
    }
}

impl Knowledge {
    /// Nothing known yet, for a keyspace of `groups` groups (at least one is kept).
    pub(crate) fn with_groups(groups: u16) -> Self {
        Self {
            groups: (0..groups.max(1)).map(|_| GroupKnown::default()).collect(),
            max_lease_ms: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Group `g`'s (group 0's for a number out of range: the keyspace sizes both alike).
    fn of(&self, g: Group) -> &GroupKnown {
        let i = usize::from(g.index());
        debug_assert!(i < self.groups.len(), "group {i} of {}", self.groups.len());
        match self.groups.get(i) {
            Some(k) => k,
            // Never empty (made with at least one).
            None => &self.groups[0],
        }
    }

    /// The epoch id of group `g` last seen, `""` if none.
    pub(crate) fn epoch(&self, g: Group) -> String {
        self.of(g)
            .epoch
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Remembers the epoch group `g` answered with (ignores "none").
    pub(crate) fn saw_epoch(&self, g: Group, id: &str) {
        if !id.is_empty() {
            let mut e = self.of(g).epoch.lock().unwrap_or_else(|e| e.into_inner());
            if *e != id {
                id.clone_into(&mut e);
            }
        }
    }

    /// Remembers a lease used in the fleet.
    pub(crate) fn saw_lease(&self, ms: u64) {
        self.max_lease_ms
            .fetch_max(ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// The grace after a loss: the longest lease seen (0 if none).
    pub(crate) fn grace_ms(&self) -> u64 {
        self.max_lease_ms.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn seq_state(&self, g: Group) -> std::sync::MutexGuard<'_, SeqAt> {
        self.of(g).seq.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new registration starts its write sequence in group `g` at `seq`.
    pub(crate) fn reset_seq(&self, g: Group, seq: u64) {
        let mut s = self.seq_state(g);
        s.gen += 1;
        s.seq = seq;
    }

    /// Group `g` answered a write with sequence `seq`.
    pub(crate) fn saw_seq(&self, g: Group, seq: u64) {
        let mut s = self.seq_state(g);
        s.seq = s.seq.max(seq);
    }

    /// Group `g` answered a write sent at `at` ([`Knowledge::seq_at`]) with sequence `seq`:
    /// noted only if no registration began since.
    pub(crate) fn saw_seq_at(&self, g: Group, at: SeqAt, seq: u64) {
        let mut s = self.seq_state(g);
        if s.gen == at.gen {
            s.seq = s.seq.max(seq);
        }
    }

    /// The highest write sequence group `g` answered to this registration.
    pub(crate) fn seq(&self, g: Group) -> u64 {
        self.seq_state(g).seq
    }

    /// [`Knowledge::seq`], with the registration it belongs to, for
    /// [`Knowledge::saw_seq_at`].
    pub(crate) fn seq_at(&self, g: Group) -> SeqAt {
        *self.seq_state(g)
    }
}

#[cfg(test)]
mod knowledge_tests {
    #![allow(clippy::unwrap_used)]

    use super::Knowledge;
    use crate::KeySpace;

    #[test]
    fn each_group_keeps_its_own_epoch_and_write_sequence() {
        let ks = KeySpace::with_groups("k", 4).unwrap();
        let known = Knowledge::with_groups(ks.groups());
        let g: Vec<_> = ks.all_groups().collect();
        known.saw_epoch(g[1], "e1");
        known.reset_seq(g[1], 7);
        known.saw_seq(g[1], 9);
        known.saw_seq(g[2], 3);
        // A lower sequence answered late does not move it back.
        known.saw_seq(g[1], 8);
        assert_eq!(
            (known.epoch(g[0]), known.seq(g[0])),
            (String::new(), 0),
            "group 0 saw nothing"
        );
        assert_eq!((known.epoch(g[1]), known.seq(g[1])), ("e1".into(), 9));
        assert_eq!((known.epoch(g[2]), known.seq(g[2])), (String::new(), 3));
        // "No epoch" in an answer keeps the one known.
        known.saw_epoch(g[1], "");
        assert_eq!(known.epoch(g[1]), "e1");
        // One group by default, as the in-memory hub keeps.
        let one = Knowledge::default();
        one.saw_seq(g[0], 5);
        assert_eq!(one.seq(g[0]), 5);
    }

    /// An answer to a write sent for an earlier registration that arrives after the next one
    /// began does not move the new one's sequence: its next renewal would look like lost
    /// writes. Answers for the current registration still do.
    #[test]
    fn a_late_answer_of_an_earlier_registration_is_ignored() {
        let ks = KeySpace::with_groups("k", 2).unwrap();
        let known = Knowledge::with_groups(ks.groups());
        let g = ks.all_groups().nth(1).unwrap();
        known.reset_seq(g, 1);
        known.saw_seq(g, 500);
        let sent = known.seq_at(g);
        assert_eq!(sent.seq, 500);
        known.reset_seq(g, 1);
        known.saw_seq_at(g, sent, 501);
        assert_eq!(known.seq(g), 1, "the stale answer is not kept");
        let now = known.seq_at(g);
        known.saw_seq_at(g, now, 2);
        assert_eq!(known.seq(g), 2);
    }
}
