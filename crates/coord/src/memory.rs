//! The in-memory backend: a hub shared by several coordinators in one process.
//!
//! It is the embedded default (one process, no Redis) and the test double, and it runs the
//! same protocol as the Redis backend: liveness with deadlines, fenced claims, hand-over
//! records. Time comes from an injected [`Clock`], so a simulation can drive it step by step.
//!
//! Like the Redis backend it may split its state into coordination groups
//! ([`MemoryHub::with_groups`]), each with its own view of the workers' liveness and its own
//! epoch, holding the bots and chats that hash to it: one group can lose its data
//! ([`MemoryHub::wipe_group`]) while the others keep theirs.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use async_trait::async_trait;
use botfleet_core::{BotId, Clock, Fence, Incarnation, SystemClock, WorkerId};
use tokio::sync::{mpsc, Notify};

use crate::{
    coordinator::{check_key, check_key_len, check_ttl, nonce, Knowledge},
    BucketTake, ClaimOutcome, CoordError, Coordinator, EpochInfo, EventCursor, Group, KeySpace,
    LifecycleEvent, LiveWorker, LockGuard, Owner, RateGrant, RateLimit, Renewal, Result, Turn,
    WorkerCommand, WorkerMeta,
};

/// Group 0: it also holds the roster (the members listed, their metadata) and the locks'
/// epoch, as the Redis backend's group 0 shares the roster's tag.
const G0: Group = Group::ZERO;

/// How many lifecycle events the hub keeps.
const MAX_EVENTS: usize = 10_000;
/// How many commands a worker's queue keeps.
const MAX_COMMANDS: usize = 10_000;

#[derive(Debug, Clone)]
struct Member {
    incarnation: Incarnation,
    meta: WorkerMeta,
    lease_ms: u64,
    renewed_at_ms: u64,
    deadline_ms: u64,
    /// Write sequence of this registration (see `Knowledge`).
    seq: u64,
}

/// The hub's epoch; see `lua/epoch.lua` for the Redis twin.
#[derive(Debug, Clone)]
struct Epoch {
    id: String,
    born: u64,
    till: u64,
    lost: bool,
    hold: u64,
    /// The hub was made by this process and lost nothing since, so its counters know every
    /// grant: a store fence above them comes from an earlier process (the embedded mode's
    /// instance lock keeps it single), not from a loss.
    trusted: bool,
}

impl Epoch {
    /// The epoch of a hub made now, which knows every grant since.
    fn trusted(now: u64) -> Self {
        Self {
            id: nonce(),
            born: now,
            till: 0,
            lost: false,
            hold: 0,
            trusted: true,
        }
    }

    fn grace_left(&self, now: u64) -> u64 {
        let mut left = 0;
        if self.lost && self.till > now {
            left = self.till - now;
        }
        left.max(self.hold.saturating_sub(now))
    }
}

#[derive(Debug, Clone)]
struct OwnerRec {
    worker: WorkerId,
    incarnation: Incarnation,
    fence: Fence,
    handed_over: bool,
    /// When it was handed over (ms; 0 if it was not).
    handed_at: u64,
}

impl OwnerRec {
    /// As claim.lua: a hand-over its target has not taken within `grace` (the longest lease)
    /// lapses, and the bot is nobody's.
    fn lapsed(&self, now: u64, grace: u64) -> bool {
        self.handed_over && now >= self.handed_at + grace
    }
}

#[derive(Debug, Clone)]
struct Lock {
    token: String,
    fence: Fence,
    deadline_ms: u64,
}

/// A worker's registration in a group, shared by the tickets it takes and the turns it holds
/// (a held turn of the embedded worker costs its chat's queue here: kept small).
type Taker = Arc<(WorkerId, Incarnation)>;

/// A handle's registration (what the Redis backend's `Registration` keeps).
#[derive(Debug, Clone)]
struct Reg {
    /// The worker and the incarnation it registered with.
    taker: Taker,
    lease_ms: u64,
    meta: WorkerMeta,
    /// Groups joined again on their own, with the incarnation there (the others hold
    /// `taker`'s).
    rejoined: HashMap<Group, Taker>,
    /// Groups where the liveness was found lost: not renewed until joined again.
    out: HashSet<Group>,
}

impl Reg {
    /// The worker and its incarnation in group `g`.
    fn taker_in(&self, g: Group) -> &Taker {
        self.rejoined.get(&g).unwrap_or(&self.taker)
    }
}

/// A ticket of a chat's turn queue: its number, taker and journal key.
#[derive(Debug, Clone)]
struct Ticket {
    n: u64,
    taker: Taker,
    entry: Box<str>,
}

/// A chat's turn queue; see `lua/turn.lua` for the Redis twin.
#[derive(Debug, Default, Clone)]
struct ChatTurns {
    next: u64,
    serving: u64,
    /// When `serving` last moved (ms).
    since_ms: u64,
    holder: Option<Taker>,
    /// The ticket the holder asked with (its own, or the one behind a taken-over ticket):
    /// only that asker is granted the turn again.
    asker: u64,
    fence: u64,
    /// The tickets not released yet, by number (each taken with a higher one than all
    /// before). Usually one or a few: a take asked again finds its ticket by a scan.
    tickets: VecDeque<Ticket>,
}

impl ChatTurns {
    /// Where ticket `n` is in the queue, if it was taken and not released.
    fn position(&self, n: u64) -> Option<usize> {
        self.tickets.binary_search_by_key(&n, |t| t.n).ok()
    }

    /// Ticket `n`, if it was taken and not released.
    fn ticket(&self, n: u64) -> Option<&Ticket> {
        self.tickets.get(self.position(n)?)
    }

    /// The ticket taken for journal key `entry`, while it is not released.
    fn by_entry(&self, entry: &str) -> Option<u64> {
        self.tickets
            .iter()
            .find(|t| &*t.entry == entry)
            .map(|t| t.n)
    }
}

/// One coordination group's part of the hub: its own view of the workers' liveness, its
/// epoch, and the records of the bots and chats that hash to it (what the Redis backend keeps
/// under the group's hash tag).
#[derive(Debug, Default, Clone)]
struct GroupState {
    /// Missing after the group lost its data (until a worker comes: a new one, in grace).
    epoch: Option<Epoch>,
    members: HashMap<WorkerId, Member>,
    owners: HashMap<BotId, OwnerRec>,
    fence_counters: HashMap<BotId, u64>,
    /// Per chat key: its turn queue (gone while the chat has no ticket).
    turns: HashMap<Box<str>, ChatTurns>,
    /// The last turn fence granted, of any chat (a forgotten chat's next fences stay above).
    turn_fence: u64,
}

impl GroupState {
    fn is_live(&self, worker: &WorkerId, inc: &Incarnation, now: u64) -> bool {
        self.members
            .get(worker)
            .is_some_and(|m| &m.incarnation == inc && m.deadline_ms > now)
    }

    /// Bumps a member's write sequence if it has every write the caller was answered
    /// (`known`); answers the new one (0 if not: the caller's next renewal finds the loss).
    fn bump(&mut self, w: &WorkerId, known: u64) -> u64 {
        match self.members.get_mut(w) {
            Some(m) if m.seq >= known => {
                m.seq += 1;
                m.seq
            }
            _ => 0,
        }
    }

    /// Makes `worker` a member as incarnation `inc`, live for `lease_ms` from `now`.
    fn join(
        &mut self,
        worker: &WorkerId,
        inc: &Incarnation,
        meta: &WorkerMeta,
        lease_ms: u64,
        now: u64,
    ) {
        self.members.insert(
            worker.clone(),
            Member {
                incarnation: inc.clone(),
                meta: meta.clone(),
                lease_ms,
                renewed_at_ms: now,
                deadline_ms: now + lease_ms,
                seq: 1,
            },
        );
    }
}

/// The hub's state: its groups, and the fleet-wide things (kept with the roster in Redis).
#[derive(Debug, Default, Clone)]
struct State {
    /// Indexed by the group's number; one at least.
    groups: Vec<GroupState>,
    /// Every group keeps its epoch in group 0 (a mutation only tests set: a group's loss then
    /// goes unseen).
    one_epoch: bool,
    events: VecDeque<(EventCursor, LifecycleEvent)>,
    next_event: u64,
    commands: HashMap<WorkerId, VecDeque<WorkerCommand>>,
    buckets: HashMap<String, (f64, u64)>,
    /// Send buckets: tokens, and when they were counted (in the future while paused).
    send_buckets: HashMap<String, (f64, u64)>,
    locks: HashMap<String, Lock>,
    lock_counters: HashMap<String, u64>,
    /// (bot, worker) → unix ms until which placement keeps them apart.
    avoid: HashMap<(BotId, WorkerId), u64>,
    /// The fleet's journal: (position, entry), the newest `JOURNAL_KEEP`.
    journal: VecDeque<(u64, String)>,
    journal_seq: u64,
    member_signals: Vec<mpsc::Sender<()>>,
    /// Per worker: where its turn wake-ups go.
    turn_wakers: HashMap<WorkerId, Vec<mpsc::Sender<String>>>,
    /// Handles made unusable by [`MemoryHub::crash`].
    crashed: Vec<u64>,
}

impl State {
    /// A state of `groups` groups, each with a new trusted epoch born `now` (a hub made now).
    fn new(groups: u16, now: u64) -> Self {
        Self {
            groups: (0..groups.max(1))
                .map(|_| GroupState {
                    epoch: Some(Epoch::trusted(now)),
                    ..GroupState::default()
                })
                .collect(),
            ..Self::default()
        }
    }

    /// Group `g`'s part. Groups come from the hub's key space (or are checked against it).
    fn grp(&self, g: Group) -> &GroupState {
        &self.groups[usize::from(g.index())]
    }

    fn grp_mut(&mut self, g: Group) -> &mut GroupState {
        &mut self.groups[usize::from(g.index())]
    }

    fn is_live(&self, g: Group, worker: &WorkerId, inc: &Incarnation, now: u64) -> bool {
        self.grp(g).is_live(worker, inc, now)
    }

    /// Where group `g`'s epoch is kept: in the group (group 0's under the one-epoch mutation).
    fn epoch_slot(&mut self, g: Group) -> &mut Option<Epoch> {
        let g = self.epoch_group(g);
        &mut self.grp_mut(g).epoch
    }

    fn epoch_of(&self, g: Group) -> Option<&Epoch> {
        self.grp(self.epoch_group(g)).epoch.as_ref()
    }

    /// The group whose part keeps group `g`'s epoch.
    fn epoch_group(&self, g: Group) -> Group {
        if self.one_epoch {
            G0
        } else {
            g
        }
    }

    /// The turn answer for `ticket` of `chat` (in group `g`), asked by `me` (see
    /// `Coordinator::turn_try`).
    #[allow(clippy::too_many_arguments)]
    fn turn_try(
        &mut self,
        g: Group,
        chat: &str,
        ticket: u64,
        me: &Taker,
        now: u64,
        known: &Knowledge,
        grace_rule: bool,
    ) -> Turn {
        let grace = known.grace_ms();
        let abandoned_after = crate::redis::abandoned_after_ms(grace);
        if !self.is_live(g, &me.0, &me.1, now) {
            return Turn::NotLive;
        }
        let live = |st: &State, w: &WorkerId, i: &Incarnation| st.is_live(g, w, i, now);
        let Some(q) = self.grp(g).turns.get(chat) else {
            // Forgotten (served to the end): nothing of it is left to wait for.
            return Turn::Passed;
        };
        if ticket < q.serving {
            return Turn::Passed;
        }
        let serving = q.serving;
        let takeover = match q.holder.as_deref() {
            Some(h) if h == &**me && q.asker == ticket => serving != ticket,
            Some((w, i)) if live(self, w, i) => return Turn::Wait,
            Some(_) => true,
            None if serving == ticket => false,
            None => match q.ticket(serving).map(|t| &*t.taker) {
                Some((w, i))
                    if live(self, w, i) && now.saturating_sub(q.since_ms) < abandoned_after =>
                {
                    return Turn::Wait
                }
                _ => true,
            },
        };
        // As turn.lua: nothing is granted inside a grace window after a loss (a holder from
        // before it may still be acting), and grants say when a loss was recent.
        let after_loss = match self.epoch(g, now, &known.epoch(g), grace) {
            Some(e) if grace_rule && e.grace_left(now) > 0 => return Turn::Wait,
            Some(e) => {
                e.lost && now < e.till.max(e.hold) + crate::redis::after_loss_settle_ms(grace)
            }
            None => false,
        };
        let gs = self.grp_mut(g);
        if !gs.turns.contains_key(chat) {
            return Turn::Passed;
        }
        // A grant is a write of the caller's registration (as turn.lua's).
        let seq = gs.bump(&me.0, known.seq(g));
        known.saw_seq(g, seq);
        let f = (gs.turn_fence + 1).max(now.saturating_mul(1000));
        gs.turn_fence = f;
        let Some(q) = gs.turns.get_mut(chat) else {
            return Turn::Passed;
        };
        q.fence = f;
        q.holder = Some(me.clone());
        q.asker = ticket;
        let fence = Fence(q.fence);
        if takeover {
            let entry = q
                .ticket(serving)
                .map(|t| t.entry.to_string())
                .unwrap_or_default();
            Turn::TakeOver {
                ticket: serving,
                entry,
                fence,
                after_loss,
            }
        } else {
            Turn::Granted {
                ticket,
                fence,
                after_loss,
            }
        }
    }

    /// Group `g`'s epoch, created (untrusted: it follows a loss) when missing and `grace` is
    /// known.
    fn epoch(&mut self, g: Group, now: u64, known: &str, grace: u64) -> Option<&mut Epoch> {
        let slot = self.epoch_slot(g);
        if slot.is_none() && grace > 0 {
            *slot = Some(Epoch {
                id: nonce(),
                born: now,
                till: now + grace,
                lost: !known.is_empty(),
                hold: 0,
                trusted: false,
            });
        }
        let e = slot.as_mut()?;
        if !known.is_empty() && known != e.id {
            e.lost = true;
        }
        Some(e)
    }

    /// Writes were lost in group `g` (it went back in time): no bot of it that had an owner
    /// is granted before `till`.
    fn went_back(&mut self, g: Group, hub: &Hub, till: u64) {
        if !hub.grace_rule.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        if let Some(e) = self.epoch_slot(g).as_mut() {
            e.hold = e.hold.max(till);
            e.lost = true;
            e.trusted = false;
        }
    }

    /// Replaces the fleet-wide part with `with`'s (a loss or roll-back of the roster), keeping
    /// the groups, the mutation switch, the signal subscribers and the crashed handles.
    fn replace_fleet_wide(&mut self, with: State) {
        *self = State {
            groups: std::mem::take(&mut self.groups),
            one_epoch: self.one_epoch,
            member_signals: std::mem::take(&mut self.member_signals),
            crashed: std::mem::take(&mut self.crashed),
            ..with
        };
    }

    fn signal_members(&mut self) {
        self.member_signals
            .retain(|tx| !matches!(tx.try_send(()), Err(mpsc::error::TrySendError::Closed(_))));
    }
}

#[derive(Debug)]
struct Hub {
    // std Mutex: never held across .await; every critical section is a few map operations.
    state: Mutex<State>,
    clock: Arc<dyn Clock>,
    /// Wakes blocked event and command readers.
    wake: Notify,
    /// Off only in tests that prove the grace rule is needed.
    grace_rule: std::sync::atomic::AtomicBool,
    /// Which group each bot and chat falls in.
    ks: KeySpace,
}

/// A hub of shared coordination state; [`MemoryHub::coordinator`] makes handles on it.
///
/// Cloning the hub shares it.
#[derive(Debug, Clone)]
pub struct MemoryHub {
    hub: Arc<Hub>,
}

impl Default for MemoryHub {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryHub {
    /// A hub on the process's monotonic clock.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock::new()))
    }

    /// A hub on the given clock (e.g. a [`ManualClock`](botfleet_core::ManualClock)).
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self::build(clock, KeySpace::in_memory(1))
    }

    /// A hub on the given clock with its state split into `groups` coordination groups, as
    /// the Redis backend splits its keys ([`KeySpace::with_groups`]: a bot or chat falls in
    /// the same group in both).
    ///
    /// # Errors
    /// [`CoordError::InvalidArgument`] for `groups` outside 1–[`MAX_GROUPS`](crate::MAX_GROUPS).
    pub fn with_groups(clock: Arc<dyn Clock>, groups: u16) -> Result<Self> {
        Ok(Self::build(clock, KeySpace::with_groups("memory", groups)?))
    }

    fn build(clock: Arc<dyn Clock>, ks: KeySpace) -> Self {
        Self {
            hub: Arc::new(Hub {
                state: Mutex::new(State::new(ks.groups(), clock.now_ms())),
                clock,
                wake: Notify::new(),
                grace_rule: std::sync::atomic::AtomicBool::new(true),
                ks,
            }),
        }
    }

    /// A new, unregistered handle on the hub.
    pub fn coordinator(&self) -> MemoryCoordinator {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        MemoryCoordinator {
            hub: self.hub.clone(),
            handle_id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            reg: Arc::new(Mutex::new(None)),
            known: Arc::new(Knowledge::with_groups(self.hub.ks.groups())),
            lead_token: nonce(),
        }
    }

    /// Simulates the process behind `handle` dying: the handle answers every later call with
    /// an error, and its liveness stays until its deadline passes, as a crashed worker's
    /// Redis key would.
    pub fn crash(&self, handle: &MemoryCoordinator) {
        lock(&self.hub.state).crashed.push(handle.handle_id);
        self.hub.wake.notify_waiters();
    }

    /// Simulates losing every piece of state (a Redis restart without persistence, a
    /// `FLUSHALL`): the next registration starts a new epoch with a grace window.
    pub fn wipe(&self) {
        let mut st = lock(&self.hub.state);
        let kept = State {
            groups: vec![GroupState::default(); st.groups.len()],
            one_epoch: st.one_epoch,
            member_signals: std::mem::take(&mut st.member_signals),
            crashed: std::mem::take(&mut st.crashed),
            ..State::default()
        };
        *st = kept;
    }

    /// Simulates group `g` losing its data (the node that holds its keys restarted without
    /// persistence): its workers' liveness there, its owner records, fences and turn queues,
    /// and its epoch are gone; the other groups keep theirs. Group 0 also holds the roster,
    /// so losing it also loses the fleet-wide state (events, commands, locks, buckets, the
    /// journal). A group out of range is ignored.
    pub fn wipe_group(&self, g: Group) {
        let mut st = lock(&self.hub.state);
        let Some(gs) = st.groups.get_mut(usize::from(g.index())) else {
            return;
        };
        *gs = GroupState::default();
        if g == G0 {
            st.replace_fleet_wide(State::default());
        }
    }

    /// A copy of the shared state now, to [`restore`](MemoryHub::restore) later.
    pub fn snapshot(&self) -> MemorySnapshot {
        MemorySnapshot(lock(&self.hub.state).clone())
    }

    /// Simulates a failover to a replica that missed every write since `snapshot`: the state
    /// goes back to it (the crashed handles and signal subscribers stay as they are).
    pub fn restore(&self, snapshot: &MemorySnapshot) {
        let mut st = lock(&self.hub.state);
        let signals = std::mem::take(&mut st.member_signals);
        let crashed = std::mem::take(&mut st.crashed);
        *st = State {
            member_signals: signals,
            crashed,
            ..snapshot.0.clone()
        };
        // It can no longer vouch that its counters know every grant.
        for gs in &mut st.groups {
            if let Some(e) = gs.epoch.as_mut() {
                e.trusted = false;
            }
        }
    }

    /// Simulates group `g`'s node failing over to a replica that missed every write there
    /// since `snapshot`: that group's part goes back to it, the others stay. Group 0 shares
    /// its node with the roster, whose fleet-wide state goes back too. A group out of range is
    /// ignored.
    pub fn restore_group(&self, g: Group, snapshot: &MemorySnapshot) {
        let mut st = lock(&self.hub.state);
        let i = usize::from(g.index());
        let (Some(gs), Some(then)) = (st.groups.get_mut(i), snapshot.0.groups.get(i)) else {
            return;
        };
        *gs = then.clone();
        if let Some(e) = gs.epoch.as_mut() {
            e.trusted = false;
        }
        if g == G0 {
            st.replace_fleet_wide(snapshot.0.clone());
        }
    }

    /// Keeps every group's epoch in group 0, so that a group that loses its data keeps an
    /// epoch that says nothing was lost. A mutation for the tests that prove each group
    /// needs its own (a simulation must then find two owners); never in a real fleet.
    #[doc(hidden)]
    pub fn share_one_epoch_for_tests(&self) {
        lock(&self.hub.state).one_epoch = true;
    }

    /// Turns off the rule that delays grants after a loss. Only for tests that prove the rule
    /// is needed (a simulation must then find two owners); never in a real fleet.
    #[doc(hidden)]
    pub fn disable_loss_grace_for_tests(&self) {
        self.hub
            .grace_rule
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic while holding the lock leaves maps in a consistent state (every section does its
    // checks before it writes), so a poisoned lock is still safe to use.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A copy of a [`MemoryHub`]'s state, from [`MemoryHub::snapshot`].
#[derive(Debug, Clone)]
pub struct MemorySnapshot(State);

/// A handle on a [`MemoryHub`]; see [`Coordinator`].
#[derive(Debug, Clone)]
pub struct MemoryCoordinator {
    hub: Arc<Hub>,
    handle_id: u64,
    reg: Arc<Mutex<Option<Reg>>>,
    known: Arc<Knowledge>,
    lead_token: String,
}

impl MemoryCoordinator {
    /// Takes a token from every bucket of `scopes`, as buckets.lua does; `yields` as
    /// [`Coordinator::take_buckets_yielding`].
    fn take_buckets_as(&self, scopes: &[(&str, RateLimit)], yields: bool) -> Result<BucketTake> {
        crate::coordinator::check_scopes(scopes)?;
        let now = self.now();
        let mut st = self.state()?;
        // As buckets.lua: every bucket's tokens now, and the longest wait for one.
        let mut have = Vec::with_capacity(scopes.len());
        let (mut wait, mut short) = (0.0_f64, 0);
        for (k, (key, limit)) in scopes.iter().enumerate() {
            let burst = f64::from(limit.burst);
            let per_ms = limit.per_second / 1000.0;
            let need = if yields {
                1.0 + f64::from(limit.reserve())
            } else {
                1.0
            };
            let (tokens, ts) = st.send_buckets.get(*key).copied().unwrap_or((burst, now));
            let (tokens, w) = if ts > now {
                (tokens, (ts - now) as f64)
            } else {
                let t = (tokens + (now - ts) as f64 * per_ms).min(burst);
                (t, if t < need { (need - t) / per_ms } else { 0.0 })
            };
            have.push(tokens);
            if w > wait {
                (wait, short) = (w, k);
            }
        }
        if wait > 0.0 {
            return Ok(BucketTake {
                wait: Duration::from_millis(wait.ceil().max(1.0) as u64),
                short,
            });
        }
        for ((key, _), tokens) in scopes.iter().zip(have) {
            st.send_buckets
                .insert((*key).to_owned(), (tokens - 1.0, now));
        }
        Ok(BucketTake::TAKEN)
    }

    fn state(&self) -> Result<MutexGuard<'_, State>> {
        let st = lock(&self.hub.state);
        if st.crashed.contains(&self.handle_id) {
            return Err(crashed());
        }
        Ok(st)
    }

    fn now(&self) -> u64 {
        self.hub.clock.now_ms()
    }

    /// Whether grants wait out a loss's grace window (off only in tests proving the rule).
    fn grace_rule(&self) -> bool {
        self.hub
            .grace_rule
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The worker and the incarnation it registered with.
    fn me(&self) -> Result<(WorkerId, Incarnation)> {
        Ok((*self.registered()?).clone())
    }

    fn reg_lock(&self) -> MutexGuard<'_, Option<Reg>> {
        self.reg.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The worker and its incarnation in group `g`, shared (what the turn queues keep): what
    /// a call in `g` acts for.
    fn taker_in(&self, g: Group) -> Result<Taker> {
        self.reg_lock()
            .as_ref()
            .map(|r| r.taker_in(g).clone())
            .ok_or(CoordError::NotRegistered)
    }

    /// The registration itself ([`Coordinator::registration`]).
    fn registered(&self) -> Result<Taker> {
        self.reg_lock()
            .as_ref()
            .map(|r| r.taker.clone())
            .ok_or(CoordError::NotRegistered)
    }

    /// Renews `me` in group `g` (as renew.lua): whether its liveness there holds.
    fn renew_in(&self, st: &mut State, g: Group, me: &Taker, held: (u32, u64)) -> Renewal {
        let (w, inc) = &**me;
        let now = self.now();
        let grace = self.known.grace_ms();
        let seq = self.known.seq(g);
        // As renew.lua: a group that lost everything starts its new epoch at once.
        st.epoch(g, now, &self.known.epoch(g), grace);
        if st
            .grp(g)
            .members
            .get(w)
            .is_some_and(|m| &m.incarnation == inc && m.seq < seq)
        {
            // The same rule as renew.lua: lost writes mean the group went back in time.
            st.went_back(g, &self.hub, now + grace);
            return Renewal::Lost;
        }
        let known = self.known.epoch(g);
        if st.epoch_of(g).map(|e| e.id.as_str()) != Some(known.as_str()) {
            return Renewal::Lost;
        }
        match st.grp_mut(g).members.get_mut(w) {
            Some(m) if &m.incarnation == inc && m.deadline_ms > now && m.seq >= seq => {
                m.deadline_ms = now + m.lease_ms;
                m.renewed_at_ms = now;
                if g == G0 {
                    (m.meta.bots_held, m.meta.rss_bytes) = held;
                }
                m.seq += 1;
                self.known.saw_seq(g, m.seq);
                Renewal::Renewed
            }
            _ => Renewal::Lost,
        }
    }

    /// Makes `worker` a member of group `g` as `inc` (as register.lua), its epoch and first
    /// write sequence there noted; the roster (group 0) signals the join.
    fn join_in(
        &self,
        st: &mut State,
        g: Group,
        (worker, inc): (&WorkerId, &Incarnation),
        meta: &WorkerMeta,
        lease_ms: u64,
    ) {
        let now = self.now();
        let epoch = st
            .epoch(g, now, &self.known.epoch(g), self.known.grace_ms())
            .map(|e| e.id.clone());
        st.grp_mut(g).join(worker, inc, meta, lease_ms, now);
        if g == G0 {
            st.signal_members();
        }
        self.known.saw_epoch(g, epoch.as_deref().unwrap_or(""));
        self.known.reset_seq(g, 1);
    }

    /// Waits until `f` yields something or `wait` passes; `f` runs under the state lock.
    async fn wait_for<T>(
        &self,
        wait: Duration,
        mut f: impl FnMut(&mut State) -> Option<T> + Send,
    ) -> Result<Option<T>> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.hub.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(v) = f(&mut *self.state()?) {
                return Ok(Some(v));
            }
            // No wait asked for: answer now rather than arming a timer (which rounds up to the
            // timer's 1 ms tick).
            if wait.is_zero() {
                return Ok(None);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Ok(f(&mut *self.state()?));
            }
        }
    }
}

#[async_trait]
impl Coordinator for MemoryCoordinator {
    async fn register(
        &self,
        worker: &WorkerId,
        meta: &WorkerMeta,
        lease: Duration,
    ) -> Result<Incarnation> {
        let lease_ms = check_ttl("lease", lease)?;
        self.known.saw_lease(lease_ms);
        let inc = Incarnation::from_nonce(nonce());
        // Every group at once, under one lock: a worker told of the join finds the newcomer
        // live in every group.
        let mut st = self.state()?;
        for g in self.hub.ks.all_groups() {
            self.join_in(&mut st, g, (worker, &inc), meta, lease_ms);
        }
        drop(st);
        *self.reg_lock() = Some(Reg {
            taker: Arc::new((worker.clone(), inc.clone())),
            lease_ms,
            meta: meta.clone(),
            rejoined: HashMap::new(),
            out: HashSet::new(),
        });
        Ok(inc)
    }

    async fn renew_with(&self, bots_held: u32, rss_bytes: u64) -> Result<Renewal> {
        crate::coordinator::whole_lease(self.renew_groups(bots_held, rss_bytes).await)
    }

    async fn renew_groups(&self, bots_held: u32, rss_bytes: u64) -> Vec<(Group, Result<Renewal>)> {
        let groups = self.hub.ks.all_groups();
        let Some(reg) = self.reg_lock().clone() else {
            return groups
                .map(|g| (g, Err(CoordError::NotRegistered)))
                .collect();
        };
        let Ok(mut st) = self.state() else {
            return groups.map(|g| (g, Err(crashed()))).collect();
        };
        // Every group, but a group already found lost.
        let renewed: Vec<(Group, Result<Renewal>)> = groups
            .map(|g| {
                let r = if reg.out.contains(&g) {
                    Renewal::Lost
                } else {
                    self.renew_in(&mut st, g, reg.taker_in(g), (bots_held, rss_bytes))
                };
                (g, Ok(r))
            })
            .collect();
        drop(st);
        // Out until joined again — unless this worker registered or joined the group again
        // meanwhile (then it was the earlier incarnation's loss).
        let mut cur = self.reg_lock();
        if let Some(cur) = cur.as_mut().filter(|c| c.taker == reg.taker) {
            for (g, r) in &renewed {
                if matches!(r, Ok(Renewal::Lost)) && cur.taker_in(*g) == reg.taker_in(*g) {
                    cur.out.insert(*g);
                }
            }
        }
        renewed
    }

    async fn rejoin_group(&self, g: Group) -> Result<Incarnation> {
        if g.index() >= self.hub.ks.groups() {
            return Err(CoordError::InvalidArgument(format!(
                "no coordination group {g}: this coordinator has {}",
                self.hub.ks.groups()
            )));
        }
        let reg = self.reg_lock().clone().ok_or(CoordError::NotRegistered)?;
        // A fresh incarnation: a call of the earlier one is refused there, not taken for the
        // new one's.
        let inc = Incarnation::from_nonce(nonce());
        let worker = &reg.taker.0;
        let mut st = self.state()?;
        self.join_in(&mut st, g, (worker, &inc), &reg.meta, reg.lease_ms);
        drop(st);
        let mut cur = self.reg_lock();
        match cur.as_mut().filter(|c| c.taker == reg.taker) {
            Some(c) => {
                c.rejoined
                    .insert(g, Arc::new((worker.clone(), inc.clone())));
                c.out.remove(&g);
                Ok(inc)
            }
            // Registered again (or unregistered) meanwhile: that registration is the one.
            None => Err(CoordError::NotRegistered),
        }
    }

    async fn unregister(&self) -> Result<()> {
        let Some(reg) = self.reg_lock().clone() else {
            return Ok(());
        };
        let mut st = self.state()?;
        for g in self.hub.ks.all_groups() {
            let (w, inc) = &**reg.taker_in(g);
            let members = &mut st.grp_mut(g).members;
            if members.get(w).is_some_and(|m| &m.incarnation == inc) {
                members.remove(w);
                if g == G0 {
                    st.signal_members();
                }
            }
        }
        drop(st);
        *self.reg_lock() = None;
        Ok(())
    }

    fn registration(&self) -> Option<(WorkerId, Incarnation)> {
        self.me().ok()
    }

    fn registration_in(&self, g: Group) -> Option<(WorkerId, Incarnation)> {
        self.taker_in(g).ok().map(|t| (*t).clone())
    }

    async fn live_workers(&self) -> Result<Vec<LiveWorker>> {
        let now = self.now();
        let mut st = self.state()?;
        // As live.lua: a roster that lost everything starts its new epoch at once.
        st.epoch(G0, now, &self.known.epoch(G0), self.known.grace_ms());
        let mut out: Vec<LiveWorker> = st
            .grp(G0)
            .members
            .iter()
            .filter(|(_, m)| m.deadline_ms > now)
            .map(|(id, m)| LiveWorker {
                id: id.clone(),
                incarnation: m.incarnation.clone(),
                meta: m.meta.clone(),
                heartbeat_age_ms: now.saturating_sub(m.renewed_at_ms),
                lease: Duration::from_millis(m.lease_ms),
            })
            .collect();
        drop(st);
        for l in &out {
            self.known
                .saw_lease(u64::try_from(l.lease.as_millis()).unwrap_or(0));
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    async fn member_signal(&self) -> Result<mpsc::Receiver<()>> {
        let (tx, rx) = mpsc::channel(1);
        self.state()?.member_signals.push(tx);
        Ok(rx)
    }

    async fn claim(&self, bot: &BotId, min_fence: Fence) -> Result<ClaimOutcome> {
        let g = self.hub.ks.group_of_bot(bot);
        let (w, inc) = (*self.taker_in(g)?).clone();
        let now = self.now();
        let grace = self.known.grace_ms();
        let grace_rule = self
            .hub
            .grace_rule
            .load(std::sync::atomic::Ordering::SeqCst);
        let mut st = self.state()?;
        if !st.is_live(g, &w, &inc, now) {
            return Ok(ClaimOutcome::NotLive);
        }
        let epoch = st.epoch(g, now, &self.known.epoch(g), grace).cloned();
        if st
            .grp(g)
            .members
            .get(&w)
            .is_some_and(|m| m.seq < self.known.seq(g))
        {
            // The same rule as claim.lua: the caller's own writes were lost.
            st.went_back(g, &self.hub, now + grace);
            return Ok(ClaimOutcome::NotLive);
        }
        if let Some(o) = st.grp(g).owners.get(bot) {
            let ours = o.worker == w && o.incarnation == inc;
            if !ours && !o.lapsed(now, grace) && st.is_live(g, &o.worker, &o.incarnation, now) {
                return Ok(ClaimOutcome::Held(Owner {
                    worker: o.worker.clone(),
                    incarnation: o.incarnation.clone(),
                    fence: o.fence,
                    live: true,
                    handed_over: o.handed_over,
                }));
            }
        }
        let mut counter = st.grp(g).fence_counters.get(bot).copied().unwrap_or(0);
        let min = min_fence.0;
        // The same rule as claim.lua: a store fence above the counter is a grant the hub
        // forgot, and its owner may still run the bot; after a loss found within the epoch, no
        // bot that had an owner is granted until the hold ends.
        if let Some(e) = epoch.filter(|e| grace_rule && !e.trusted) {
            let mut till = 0;
            if min > counter {
                if min < e.born {
                    till = e.till;
                    if let Some(cur) = st.epoch_slot(g).as_mut() {
                        cur.lost = true;
                    }
                } else {
                    till = now + grace;
                    st.grp_mut(g).fence_counters.insert(bot.clone(), min);
                    counter = min;
                    if let Some(cur) = st.epoch_slot(g).as_mut() {
                        cur.hold = cur.hold.max(till);
                        cur.lost = true;
                    }
                }
            }
            if min > 0 {
                till = till.max(e.hold);
            }
            if till > now {
                return Ok(ClaimOutcome::Grace(Duration::from_millis(till - now)));
            }
        }
        let fence = Fence((counter + 1).max(min + 1).max(now));
        let gs = st.grp_mut(g);
        gs.fence_counters.insert(bot.clone(), fence.0);
        gs.owners.insert(
            bot.clone(),
            OwnerRec {
                worker: w.clone(),
                incarnation: inc,
                fence,
                handed_over: false,
                handed_at: 0,
            },
        );
        let seq = gs.bump(&w, self.known.seq(g));
        // Noted under the lock: a rejoin of the group (which starts its sequence again) comes
        // wholly before or after.
        self.known.saw_seq(g, seq);
        drop(st);
        Ok(ClaimOutcome::Granted(fence))
    }

    async fn release(&self, bot: &BotId, fence: Fence) -> Result<bool> {
        let g = self.hub.ks.group_of_bot(bot);
        let w = self.taker_in(g)?.0.clone();
        let mut st = self.state()?;
        let gs = st.grp_mut(g);
        match gs.owners.get(bot) {
            Some(o) if o.worker == w && o.fence == fence => {
                gs.owners.remove(bot);
                let seq = gs.bump(&w, self.known.seq(g));
                self.known.saw_seq(g, seq);
                drop(st);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn hand_over(&self, bot: &BotId, fence: Fence, to: &WorkerId) -> Result<bool> {
        let g = self.hub.ks.group_of_bot(bot);
        let w = self.taker_in(g)?.0.clone();
        let now = self.now();
        let mut st = self.state()?;
        let gs = st.grp_mut(g);
        match gs.owners.get(bot) {
            Some(o) if o.worker == w && o.fence == fence && !o.handed_over => {}
            _ => return Ok(false),
        }
        let seq = gs.bump(&w, self.known.seq(g));
        self.known.saw_seq(g, seq);
        // The target's liveness as the bot's group knows it.
        let target = gs
            .members
            .get(to)
            .filter(|m| m.deadline_ms > now)
            .map(|m| m.incarnation.clone());
        match target {
            Some(target_inc) => {
                gs.owners.insert(
                    bot.clone(),
                    OwnerRec {
                        worker: to.clone(),
                        incarnation: target_inc,
                        fence,
                        handed_over: true,
                        handed_at: now,
                    },
                );
                let q = st.commands.entry(to.clone()).or_default();
                q.push_back(WorkerCommand::Take {
                    bot: bot.clone(),
                    from: w,
                });
                while q.len() > MAX_COMMANDS {
                    q.pop_front();
                }
                drop(st);
                self.hub.wake.notify_waiters();
            }
            None => {
                st.grp_mut(g).owners.remove(bot);
            }
        }
        Ok(true)
    }

    async fn owner(&self, bot: &BotId) -> Result<Option<Owner>> {
        let g = self.hub.ks.group_of_bot(bot);
        let now = self.now();
        let grace = self.known.grace_ms();
        let st = self.state()?;
        let gs = st.grp(g);
        Ok(gs.owners.get(bot).map(|o| Owner {
            worker: o.worker.clone(),
            incarnation: o.incarnation.clone(),
            fence: o.fence,
            live: gs.is_live(&o.worker, &o.incarnation, now) && !o.lapsed(now, grace),
            handed_over: o.handed_over,
        }))
    }

    async fn publish(&self, event: &LifecycleEvent) -> Result<EventCursor> {
        let mut st = self.state()?;
        st.next_event += 1;
        let cursor = EventCursor {
            ms: 0,
            seq: st.next_event,
        };
        st.events.push_back((cursor.clone(), event.clone()));
        while st.events.len() > MAX_EVENTS {
            st.events.pop_front();
        }
        drop(st);
        self.hub.wake.notify_waiters();
        Ok(cursor)
    }

    async fn events_head(&self) -> Result<EventCursor> {
        let st = self.state()?;
        Ok(EventCursor {
            ms: 0,
            seq: st.next_event,
        })
    }

    async fn read_events(
        &self,
        after: &EventCursor,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<(EventCursor, LifecycleEvent)>> {
        let max = max.max(1);
        let got = self
            .wait_for(wait, |st| {
                let v: Vec<_> = st
                    .events
                    .iter()
                    .filter(|(c, _)| c > after)
                    .take(max)
                    .cloned()
                    .collect();
                (!v.is_empty()).then_some(v)
            })
            .await?;
        Ok(got.unwrap_or_default())
    }

    async fn send_command(&self, to: &WorkerId, command: &WorkerCommand) -> Result<()> {
        let mut st = self.state()?;
        let q = st.commands.entry(to.clone()).or_default();
        q.push_back(command.clone());
        while q.len() > MAX_COMMANDS {
            q.pop_front();
        }
        drop(st);
        self.hub.wake.notify_waiters();
        Ok(())
    }

    async fn recv_commands(&self, max: usize, wait: Duration) -> Result<Vec<WorkerCommand>> {
        let (w, _) = self.me()?;
        let max = max.max(1);
        let got = self
            .wait_for(wait, |st| {
                let q = st.commands.get_mut(&w)?;
                let n = q.len().min(max);
                (n > 0).then(|| q.drain(..n).collect::<Vec<_>>())
            })
            .await?;
        Ok(got.unwrap_or_default())
    }

    async fn acquire_rate_many(&self, key: &str, limit: RateLimit, n: u32) -> Result<RateGrant> {
        check_key("rate limiter key", key)?;
        let n = n.max(1);
        let now = self.now();
        let mut st = self.state()?;
        let burst = f64::from(limit.burst);
        let per_ms = limit.per_second / 1000.0;
        let (tokens, last) = st.buckets.entry(key.to_owned()).or_insert((burst, now));
        *tokens = (*tokens + (now.saturating_sub(*last)) as f64 * per_ms).min(burst);
        *last = now;
        let taken = (tokens.floor().max(0.0) as u32).min(n);
        *tokens -= f64::from(taken);
        let wait = if taken < n {
            Duration::from_millis(((1.0 - *tokens) / per_ms).ceil().max(1.0) as u64)
        } else {
            Duration::ZERO
        };
        Ok(RateGrant { taken, wait })
    }

    async fn take_buckets(&self, scopes: &[(&str, RateLimit)]) -> Result<BucketTake> {
        self.take_buckets_as(scopes, false)
    }

    async fn take_buckets_yielding(&self, scopes: &[(&str, RateLimit)]) -> Result<BucketTake> {
        self.take_buckets_as(scopes, true)
    }

    async fn pause_bucket(&self, key: &str, for_: Duration) -> Result<()> {
        check_key("send bucket key", key)?;
        let till = self.now() + crate::coordinator::check_pause(for_)?;
        let mut st = self.state()?;
        let b = st.send_buckets.entry(key.to_owned()).or_insert((1.0, 0));
        if till > b.1 {
            *b = (1.0, till);
        }
        Ok(())
    }

    async fn epoch(&self) -> Result<Option<EpochInfo>> {
        // As the Redis backend's: group 0's, in the window of the group that waits longest.
        Ok(EpochInfo::combine(
            self.group_epochs().await?.into_iter().map(|(_, e)| e),
        ))
    }

    fn groups(&self) -> u16 {
        self.hub.ks.groups()
    }

    fn all_groups(&self) -> Vec<Group> {
        self.hub.ks.all_groups().collect()
    }

    fn group_of_bot(&self, bot: &BotId) -> Group {
        self.hub.ks.group_of_bot(bot)
    }

    fn group_of_chat(&self, chat: &str) -> Group {
        self.hub.ks.group_of_chat(chat)
    }

    async fn group_epochs(&self) -> Result<Vec<(Group, EpochInfo)>> {
        let now = self.now();
        let st = self.state()?;
        Ok(self
            .hub
            .ks
            .all_groups()
            .filter_map(|g| {
                let e = st.epoch_of(g)?;
                Some((
                    g,
                    EpochInfo {
                        id: e.id.clone(),
                        age: Duration::from_millis(now.saturating_sub(e.born)),
                        grace_left: Duration::from_millis(e.grace_left(now)),
                        after_loss: e.lost,
                    },
                ))
            })
            .collect())
    }

    async fn try_lead(&self, name: &str, ttl: Duration) -> Result<Option<Fence>> {
        let key = format!("lead:{name}");
        acquire(self, &key, &self.lead_token, ttl).map(|g| g.map(|g| g.fence))
    }

    async fn acquire_lock_fenced(&self, key: &str, ttl: Duration) -> Result<Option<LockGuard>> {
        acquire(self, &format!("lock:{key}"), &nonce(), ttl)
    }

    async fn journal_append(&self, entries: &[String]) -> Result<()> {
        let mut st = self.state()?;
        for e in entries {
            st.journal_seq += 1;
            let pos = st.journal_seq;
            st.journal.push_back((pos, e.clone()));
            if st.journal.len() > crate::JOURNAL_KEEP {
                st.journal.pop_front();
            }
        }
        Ok(())
    }

    async fn journal_read(&self, after: Option<u64>, max: usize) -> Result<Vec<(u64, String)>> {
        let st = self.state()?;
        Ok(match after {
            Some(a) => st
                .journal
                .iter()
                .filter(|(p, _)| *p > a)
                .take(max)
                .cloned()
                .collect(),
            None => {
                let skip = st.journal.len().saturating_sub(max);
                st.journal.iter().skip(skip).cloned().collect()
            }
        })
    }

    async fn avoid(&self, bot: &BotId, worker: &WorkerId, for_: Duration) -> Result<()> {
        let until = self.now() + check_ttl("avoid time", for_)?;
        self.state()?
            .avoid
            .insert((bot.clone(), worker.clone()), until);
        Ok(())
    }

    async fn avoidances(&self) -> Result<Vec<(BotId, WorkerId)>> {
        let now = self.now();
        let mut st = self.state()?;
        st.avoid.retain(|_, until| *until > now);
        let mut out: Vec<(BotId, WorkerId)> = st.avoid.keys().cloned().collect();
        out.sort();
        Ok(out)
    }

    async fn turn_take(&self, chat: &str, entry: &str) -> Result<(u64, Turn)> {
        check_key_len("chat key", chat, 300)?;
        let g = self.hub.ks.group_of_chat(chat);
        let me = self.taker_in(g)?;
        let now = self.now();
        let rule = self.grace_rule();
        let mut st = self.state()?;
        if !st.is_live(g, &me.0, &me.1, now) {
            return Ok((0, Turn::NotLive));
        }
        if let Some(have) = st.grp(g).turns.get(chat).and_then(|q| q.by_entry(entry)) {
            let turn = st.turn_try(g, chat, have, &me, now, &self.known, rule);
            return Ok((have, turn));
        }
        let gs = st.grp_mut(g);
        // Numbers start above every ticket given before: never reused for a chat.
        let base = (gs.turn_fence + 1).max(now.saturating_mul(1000));
        let q = gs.turns.entry(chat.into()).or_insert_with(|| ChatTurns {
            next: base,
            serving: base,
            since_ms: now,
            // Room for one: most chats have one ticket at a time.
            tickets: VecDeque::with_capacity(1),
            ..ChatTurns::default()
        });
        let ticket = q.next;
        q.next += 1;
        q.tickets.push_back(Ticket {
            n: ticket,
            taker: me.clone(),
            entry: entry.into(),
        });
        gs.turn_fence = gs.turn_fence.max(ticket);
        let turn = st.turn_try(g, chat, ticket, &me, now, &self.known, rule);
        Ok((ticket, turn))
    }

    async fn turn_try(&self, chat: &str, ticket: u64) -> Result<Turn> {
        check_key_len("chat key", chat, 300)?;
        let g = self.hub.ks.group_of_chat(chat);
        let me = self.taker_in(g)?;
        let now = self.now();
        let rule = self.grace_rule();
        Ok(self
            .state()?
            .turn_try(g, chat, ticket, &me, now, &self.known, rule))
    }

    async fn turn_release(&self, chat: &str, ticket: u64, fence: Fence) -> Result<bool> {
        check_key_len("chat key", chat, 300)?;
        let g = self.hub.ks.group_of_chat(chat);
        let me = self.taker_in(g)?;
        let mut st = self.state()?;
        let gs = st.grp_mut(g);
        let Some(q) = gs.turns.get_mut(chat) else {
            return Ok(false);
        };
        if q.holder.as_ref() != Some(&me) || q.serving != ticket || q.fence != fence.0 {
            return Ok(false);
        }
        if let Some(i) = q.position(ticket) {
            q.tickets.remove(i);
        }
        q.serving = ticket + 1;
        q.since_ms = self.hub.clock.now_ms();
        q.holder = None;
        let done = q.serving >= q.next;
        // A release is a write of the caller's registration (as turn.lua's).
        let seq = gs.bump(&me.0, self.known.seq(g));
        self.known.saw_seq(g, seq);
        if done {
            gs.turns.remove(chat);
            return Ok(true);
        }
        let Some(q) = gs.turns.get(chat) else {
            return Ok(true);
        };
        let next = q.ticket(q.serving).map(|t| t.taker.0.clone());
        if let Some(w) = next {
            if let Some(txs) = st.turn_wakers.get_mut(&w) {
                txs.retain(|tx| !tx.is_closed());
                for tx in txs.iter() {
                    let _ = tx.try_send(chat.to_owned());
                }
            }
        }
        Ok(true)
    }

    async fn turn_wakeups(&self) -> Result<mpsc::Receiver<String>> {
        let (w, _) = self.me()?;
        let (tx, rx) = mpsc::channel(1024);
        self.state()?.turn_wakers.entry(w).or_default().push(tx);
        Ok(rx)
    }

    async fn renew_lock(&self, guard: &LockGuard, ttl: Duration) -> Result<bool> {
        let ttl = check_ttl("lock ttl", ttl)?;
        let now = self.now();
        let mut st = self.state()?;
        match st.locks.get_mut(&format!("lock:{}", guard.key)) {
            Some(l) if l.token == guard.token && l.deadline_ms > now => {
                l.deadline_ms = now + ttl;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn release_lock(&self, guard: &LockGuard) -> Result<bool> {
        let now = self.now();
        let mut st = self.state()?;
        let k = format!("lock:{}", guard.key);
        match st.locks.get(&k) {
            Some(l) if l.token == guard.token && l.deadline_ms > now => {
                st.locks.remove(&k);
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

fn acquire(
    c: &MemoryCoordinator,
    full_key: &str,
    token: &str,
    ttl: Duration,
) -> Result<Option<LockGuard>> {
    let name = full_key.split_once(':').map_or(full_key, |(_, k)| k);
    check_key("lock key", name)?;
    let ttl = check_ttl("lock ttl", ttl)?;
    let now = c.now();
    let grace_rule = c.hub.grace_rule.load(std::sync::atomic::Ordering::SeqCst);
    let mut st = c.state()?;
    let epoch = st
        .epoch(G0, now, &c.known.epoch(G0), c.known.grace_ms())
        .map(|e| (e.id.clone(), e.grace_left(now)));
    if let Some((id, _)) = &epoch {
        c.known.saw_epoch(G0, id);
    }
    if let Some(l) = st.locks.get_mut(full_key) {
        if l.deadline_ms > now {
            if l.token == token {
                l.deadline_ms = now + ttl;
                return Ok(Some(LockGuard {
                    key: name.to_owned(),
                    token: token.to_owned(),
                    fence: l.fence,
                }));
            }
            return Ok(None);
        }
    }
    // After a loss, whoever held the lock before may still act on it by its own clock.
    if grace_rule && epoch.is_some_and(|(_, left)| left > 0) {
        return Ok(None);
    }
    let counter = st.lock_counters.entry(full_key.to_owned()).or_default();
    *counter = (*counter + 1).max(now);
    let fence = Fence(*counter);
    st.locks.insert(
        full_key.to_owned(),
        Lock {
            token: token.to_owned(),
            fence,
            deadline_ms: now + ttl,
        },
    );
    Ok(Some(LockGuard {
        key: name.to_owned(),
        token: token.to_owned(),
        fence,
    }))
}

/// What a crashed handle answers ([`MemoryHub::crash`]).
fn crashed() -> CoordError {
    CoordError::Unreachable {
        what: "memory hub (handle crashed)".into(),
        source: None,
    }
}
