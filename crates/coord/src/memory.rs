//! The in-memory backend: a hub shared by several coordinators in one process.
//!
//! It is the embedded default (one process, no Redis) and the test double, and it runs the
//! same protocol as the Redis backend: liveness with deadlines, fenced claims, hand-over
//! records. Time comes from an injected [`Clock`], so a simulation can drive it step by step.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use async_trait::async_trait;
use botfleet_core::{BotId, Clock, Fence, Incarnation, SystemClock, WorkerId};
use tokio::sync::{mpsc, Notify};

use crate::{
    coordinator::{check_key, check_key_len, check_ttl, nonce, Knowledge},
    BucketTake, ClaimOutcome, CoordError, Coordinator, EpochInfo, EventCursor, Group,
    LifecycleEvent, LiveWorker, LockGuard, Owner, RateGrant, RateLimit, Renewal, Result, Turn,
    WorkerCommand, WorkerMeta,
};

/// The hub keeps one coordination group.
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
}

#[derive(Debug, Clone)]
struct Lock {
    token: String,
    fence: Fence,
    deadline_ms: u64,
}

/// A worker's registration, shared by the tickets it takes and the turns it holds (a held
/// turn of the embedded worker costs its chat's queue here: kept small).
type Taker = Arc<(WorkerId, Incarnation)>;

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

#[derive(Debug, Default, Clone)]
struct State {
    epoch: Option<Epoch>,
    members: HashMap<WorkerId, Member>,
    owners: HashMap<BotId, OwnerRec>,
    fence_counters: HashMap<BotId, u64>,
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
    /// Per chat key: its turn queue (gone while the chat has no ticket).
    turns: HashMap<Box<str>, ChatTurns>,
    /// The last turn fence granted, of any chat (a forgotten chat's next fences stay above).
    turn_fence: u64,
    /// Per worker: where its turn wake-ups go.
    turn_wakers: HashMap<WorkerId, Vec<mpsc::Sender<String>>>,
    /// Handles made unusable by [`MemoryHub::crash`].
    crashed: Vec<u64>,
}

impl State {
    fn is_live(&self, worker: &WorkerId, inc: &Incarnation, now: u64) -> bool {
        self.members
            .get(worker)
            .is_some_and(|m| &m.incarnation == inc && m.deadline_ms > now)
    }

    /// The turn answer for `ticket` of `chat`, asked by `me` (see `Coordinator::turn_try`).
    fn turn_try(
        &mut self,
        chat: &str,
        ticket: u64,
        me: &Taker,
        now: u64,
        known: &Knowledge,
        grace_rule: bool,
    ) -> Turn {
        let grace = known.grace_ms();
        let abandoned_after = crate::redis::abandoned_after_ms(grace);
        if !self.is_live(&me.0, &me.1, now) {
            return Turn::NotLive;
        }
        let live = |st: &State, w: &WorkerId, i: &Incarnation| st.is_live(w, i, now);
        let Some(q) = self.turns.get(chat) else {
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
        let after_loss = match self.epoch(now, &known.epoch(G0), grace) {
            Some(e) if grace_rule && e.grace_left(now) > 0 => return Turn::Wait,
            Some(e) => {
                e.lost && now < e.till.max(e.hold) + crate::redis::after_loss_settle_ms(grace)
            }
            None => false,
        };
        if !self.turns.contains_key(chat) {
            return Turn::Passed;
        }
        // A grant is a write of the caller's registration (as turn.lua's).
        let seq = self.bump(&me.0, known.seq(G0));
        known.saw_seq(G0, seq);
        let f = (self.turn_fence + 1).max(now.saturating_mul(1000));
        self.turn_fence = f;
        let Some(q) = self.turns.get_mut(chat) else {
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

    /// The epoch, created (untrusted: it follows a loss) when missing and `grace` is known.
    fn epoch(&mut self, now: u64, known: &str, grace: u64) -> Option<&mut Epoch> {
        if self.epoch.is_none() && grace > 0 {
            self.epoch = Some(Epoch {
                id: nonce(),
                born: now,
                till: now + grace,
                lost: !known.is_empty(),
                hold: 0,
                trusted: false,
            });
        }
        let e = self.epoch.as_mut()?;
        if !known.is_empty() && known != e.id {
            e.lost = true;
        }
        Some(e)
    }

    /// Writes were lost (the hub went back in time): no bot that had an owner is granted
    /// before `till`.
    fn went_back(&mut self, hub: &Hub, till: u64) {
        if !hub.grace_rule.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        if let Some(e) = self.epoch.as_mut() {
            e.hold = e.hold.max(till);
            e.lost = true;
            e.trusted = false;
        }
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
        Self {
            hub: Arc::new(Hub {
                state: Mutex::new(State {
                    epoch: Some(Epoch {
                        id: nonce(),
                        born: clock.now_ms(),
                        till: 0,
                        lost: false,
                        hold: 0,
                        trusted: true,
                    }),
                    ..State::default()
                }),
                clock,
                wake: Notify::new(),
                grace_rule: std::sync::atomic::AtomicBool::new(true),
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
            known: Arc::new(Knowledge::default()),
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
        let signals = std::mem::take(&mut st.member_signals);
        let crashed = std::mem::take(&mut st.crashed);
        *st = State {
            member_signals: signals,
            crashed,
            ..State::default()
        };
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
        if let Some(e) = st.epoch.as_mut() {
            e.trusted = false;
        }
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
    reg: Arc<Mutex<Option<Taker>>>,
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
            return Err(CoordError::Unreachable {
                what: "memory hub (handle crashed)".into(),
                source: None,
            });
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

    fn me(&self) -> Result<(WorkerId, Incarnation)> {
        Ok((*self.taker()?).clone())
    }

    /// The registration, shared (what the turn queues keep).
    fn taker(&self) -> Result<Taker> {
        self.reg
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(CoordError::NotRegistered)
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
        let now = self.now();
        let mut st = self.state()?;
        let epoch = st
            .epoch(now, &self.known.epoch(G0), self.known.grace_ms())
            .map(|e| e.id.clone());
        st.members.insert(
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
        st.signal_members();
        drop(st);
        self.known.saw_epoch(G0, epoch.as_deref().unwrap_or(""));
        self.known.reset_seq(G0, 1);
        *self.reg.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(Arc::new((worker.clone(), inc.clone())));
        Ok(inc)
    }

    async fn renew_with(&self, bots_held: u32, rss_bytes: u64) -> Result<Renewal> {
        let (w, inc) = self.me()?;
        let now = self.now();
        let mut st = self.state()?;
        // As renew.lua: a hub that lost everything starts its new epoch at once.
        st.epoch(now, &self.known.epoch(G0), self.known.grace_ms());
        if st
            .members
            .get(&w)
            .is_some_and(|m| m.incarnation == inc && m.seq < self.known.seq(G0))
        {
            // The same rule as renew.lua: lost writes mean the hub went back in time.
            st.went_back(&self.hub, now + self.known.grace_ms());
            return Ok(Renewal::Lost);
        }
        let known = self.known.epoch(G0);
        if st.epoch.as_ref().map(|e| e.id.as_str()) != Some(known.as_str()) {
            return Ok(Renewal::Lost);
        }
        match st.members.get_mut(&w) {
            Some(m)
                if m.incarnation == inc && m.deadline_ms > now && m.seq >= self.known.seq(G0) =>
            {
                m.deadline_ms = now + m.lease_ms;
                m.renewed_at_ms = now;
                m.meta.bots_held = bots_held;
                m.meta.rss_bytes = rss_bytes;
                m.seq += 1;
                self.known.saw_seq(G0, m.seq);
                Ok(Renewal::Renewed)
            }
            _ => Ok(Renewal::Lost),
        }
    }

    async fn unregister(&self) -> Result<()> {
        let Ok((w, inc)) = self.me() else {
            return Ok(());
        };
        let mut st = self.state()?;
        if st.members.get(&w).is_some_and(|m| m.incarnation == inc) {
            st.members.remove(&w);
            st.signal_members();
        }
        drop(st);
        *self.reg.lock().unwrap_or_else(|e| e.into_inner()) = None;
        Ok(())
    }

    fn registration(&self) -> Option<(WorkerId, Incarnation)> {
        self.me().ok()
    }

    async fn live_workers(&self) -> Result<Vec<LiveWorker>> {
        let now = self.now();
        let mut st = self.state()?;
        // As live.lua: a hub that lost everything starts its new epoch at once.
        st.epoch(now, &self.known.epoch(G0), self.known.grace_ms());
        let mut out: Vec<LiveWorker> = st
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
        let (w, inc) = self.me()?;
        let now = self.now();
        let grace = self.known.grace_ms();
        let grace_rule = self
            .hub
            .grace_rule
            .load(std::sync::atomic::Ordering::SeqCst);
        let mut st = self.state()?;
        if !st.is_live(&w, &inc, now) {
            return Ok(ClaimOutcome::NotLive);
        }
        let epoch = st.epoch(now, &self.known.epoch(G0), grace).cloned();
        if st
            .members
            .get(&w)
            .is_some_and(|m| m.seq < self.known.seq(G0))
        {
            // The same rule as claim.lua: the caller's own writes were lost.
            st.went_back(&self.hub, now + grace);
            return Ok(ClaimOutcome::NotLive);
        }
        if let Some(o) = st.owners.get(bot) {
            let ours = o.worker == w && o.incarnation == inc;
            if !ours && st.is_live(&o.worker, &o.incarnation, now) {
                return Ok(ClaimOutcome::Held(Owner {
                    worker: o.worker.clone(),
                    incarnation: o.incarnation.clone(),
                    fence: o.fence,
                    live: true,
                    handed_over: o.handed_over,
                }));
            }
        }
        let mut counter = st.fence_counters.get(bot).copied().unwrap_or(0);
        let min = min_fence.0;
        // The same rule as claim.lua: a store fence above the counter is a grant the hub
        // forgot, and its owner may still run the bot; after a loss found within the epoch, no
        // bot that had an owner is granted until the hold ends.
        if let Some(e) = epoch.filter(|e| grace_rule && !e.trusted) {
            let mut till = 0;
            if min > counter {
                if min < e.born {
                    till = e.till;
                    if let Some(cur) = st.epoch.as_mut() {
                        cur.lost = true;
                    }
                } else {
                    till = now + grace;
                    st.fence_counters.insert(bot.clone(), min);
                    counter = min;
                    if let Some(cur) = st.epoch.as_mut() {
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
        st.fence_counters.insert(bot.clone(), fence.0);
        st.owners.insert(
            bot.clone(),
            OwnerRec {
                worker: w.clone(),
                incarnation: inc,
                fence,
                handed_over: false,
            },
        );
        let seq = st.bump(&w, self.known.seq(G0));
        drop(st);
        self.known.saw_seq(G0, seq);
        Ok(ClaimOutcome::Granted(fence))
    }

    async fn release(&self, bot: &BotId, fence: Fence) -> Result<bool> {
        let (w, _) = self.me()?;
        let mut st = self.state()?;
        match st.owners.get(bot) {
            Some(o) if o.worker == w && o.fence == fence => {
                st.owners.remove(bot);
                let seq = st.bump(&w, self.known.seq(G0));
                drop(st);
                self.known.saw_seq(G0, seq);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn hand_over(&self, bot: &BotId, fence: Fence, to: &WorkerId) -> Result<bool> {
        let (w, _) = self.me()?;
        let now = self.now();
        let mut st = self.state()?;
        match st.owners.get(bot) {
            Some(o) if o.worker == w && o.fence == fence && !o.handed_over => {}
            _ => return Ok(false),
        }
        let seq = st.bump(&w, self.known.seq(G0));
        let target = st
            .members
            .get(to)
            .filter(|m| m.deadline_ms > now)
            .map(|m| m.incarnation.clone());
        match target {
            Some(target_inc) => {
                st.owners.insert(
                    bot.clone(),
                    OwnerRec {
                        worker: to.clone(),
                        incarnation: target_inc,
                        fence,
                        handed_over: true,
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
                st.owners.remove(bot);
            }
        }
        self.known.saw_seq(G0, seq);
        Ok(true)
    }

    async fn owner(&self, bot: &BotId) -> Result<Option<Owner>> {
        let now = self.now();
        let st = self.state()?;
        Ok(st.owners.get(bot).map(|o| Owner {
            worker: o.worker.clone(),
            incarnation: o.incarnation.clone(),
            fence: o.fence,
            live: st.is_live(&o.worker, &o.incarnation, now),
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
        let now = self.now();
        let st = self.state()?;
        Ok(st.epoch.as_ref().map(|e| EpochInfo {
            id: e.id.clone(),
            age: Duration::from_millis(now.saturating_sub(e.born)),
            grace_left: Duration::from_millis(e.grace_left(now)),
            after_loss: e.lost,
        }))
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
        let me = self.taker()?;
        let now = self.now();
        let rule = self.grace_rule();
        let mut st = self.state()?;
        if !st.is_live(&me.0, &me.1, now) {
            return Ok((0, Turn::NotLive));
        }
        if let Some(have) = st.turns.get(chat).and_then(|q| q.by_entry(entry)) {
            let turn = st.turn_try(chat, have, &me, now, &self.known, rule);
            return Ok((have, turn));
        }
        // Numbers start above every ticket given before: never reused for a chat.
        let base = (st.turn_fence + 1).max(now.saturating_mul(1000));
        let q = st.turns.entry(chat.into()).or_insert_with(|| ChatTurns {
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
        st.turn_fence = st.turn_fence.max(ticket);
        let turn = st.turn_try(chat, ticket, &me, now, &self.known, rule);
        Ok((ticket, turn))
    }

    async fn turn_try(&self, chat: &str, ticket: u64) -> Result<Turn> {
        check_key_len("chat key", chat, 300)?;
        let me = self.taker()?;
        let now = self.now();
        let rule = self.grace_rule();
        Ok(self
            .state()?
            .turn_try(chat, ticket, &me, now, &self.known, rule))
    }

    async fn turn_release(&self, chat: &str, ticket: u64, fence: Fence) -> Result<bool> {
        check_key_len("chat key", chat, 300)?;
        let me = self.taker()?;
        let mut st = self.state()?;
        let Some(q) = st.turns.get_mut(chat) else {
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
        let seq = st.bump(&me.0, self.known.seq(G0));
        self.known.saw_seq(G0, seq);
        if done {
            st.turns.remove(chat);
            return Ok(true);
        }
        let Some(q) = st.turns.get_mut(chat) else {
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
        .epoch(now, &c.known.epoch(G0), c.known.grace_ms())
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
