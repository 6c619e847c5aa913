//! A bot's chat queues: each chat's messages are answered one at a time, in the order they
//! were recorded; different chats run in parallel, so no chat waits for another.
//!
//! This is how a chat's turn is held for a bot whose unit is claimed (polling, socket,
//! gateway and linked-device bots): the claim makes this worker the only one answering, and
//! the local queue keeps the order. Each message is answered by the turn pipeline
//! ([`crate::turn`]) under the claim's fence. A queue whose messages are all done is let go
//! (its task ends) and made again by the next message of its chat.
//!
//! A turn held open for an answer that comes later ends its task too: it is kept here as data
//! ([`Parked`]) with its chat still busy, and a short task looks at it again when a part of
//! its answer is posted or one of its timers (typing, the platform's deadline, a paced edit,
//! its time to live) is due. A thousand held turns cost a thousand records, not a thousand
//! tasks.

use std::{
    collections::{BTreeSet, HashMap, VecDeque},
    sync::Arc,
    time::{Duration, Instant},
};

use botfleet_coord::LeaseHandle;
use botfleet_core::{Fence, Inbound};
use botfleet_store::{InboxEntry, InboxItem, InboxState, TurnFence, TurnView};
use tokio::{
    sync::{watch, OwnedSemaphorePermit},
    task::JoinSet,
};

use crate::{
    later::{EntryOf, Posted},
    turn::{self, Armed, Halt, Hold, Parked, TurnCtx},
};

/// What the queues of one bot share.
pub(crate) struct ChatsCtx {
    pub(crate) turn: TurnCtx,
    /// The unit's claim: every turn's writes carry it.
    pub(crate) fence: Fence,
    pub(crate) lease: LeaseHandle,
    pub(crate) stop: watch::Receiver<bool>,
    /// Which of the turns held here may have had a part of their answer posted.
    pub(crate) posted: Arc<Posted>,
}

/// A recorded message waiting in its chat's queue.
struct Job {
    key: String,
    /// The message, for one just received (a replay's is read with its turn).
    message: Option<String>,
    /// When it was received (unix ms; a replay's is read with its turn): a platform's
    /// deadline for it counts from then.
    received_at_ms: i64,
    /// Its platform deadline, armed on receipt, when it has one.
    armed: Option<Arc<Armed>>,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    busy: bool,
    /// The key of the message being answered, if one is.
    answering: Option<String>,
}

impl Queue {
    /// Whether the entry `key` is queued here or being answered.
    fn has(&self, key: &str) -> bool {
        self.answering.as_deref() == Some(key) || self.jobs.iter().any(|j| j.key == key)
    }
}

/// The chat queues of one bot, driven by the bot's task: a chat with messages has one task
/// answering its oldest; when it is done the next one starts. An idle chat holds nothing, so
/// ten thousand idle bots cost no queue at all.
pub(crate) struct Chats {
    ctx: Arc<ChatsCtx>,
    /// Per chat with messages not done: its queue (the front one is being answered while
    /// `busy`). A chat is here only while it has some.
    waiting: HashMap<String, Queue>,
    /// One task per chat whose message is being answered, or whose held turn is being
    /// looked at.
    answering: JoinSet<Done>,
    /// The entries of the tasks in `answering`, and whether a part was posted for one while
    /// its task ran (its turn is looked at again as soon as the task hands it back).
    running: HashMap<EntryOf, bool>,
    /// Turns held open for an answer that comes later, kept as data between looks, with when
    /// each is due: not counted in flight (a thousand of them cost memory only, and keep no
    /// bot from receiving).
    parked: HashMap<EntryOf, (Instant, Box<Parked>)>,
    /// The parked turns by when they are due, earliest first.
    timers: BTreeSet<(Instant, EntryOf)>,
    /// Held turns being looked at now (in `answering`): not in flight either.
    looking: usize,
    /// Chats whose next message waits for one of the worker's turn slots (in order): no
    /// task is made for a turn before it has one, so a burst costs `slots` turns at a time.
    ready: VecDeque<String>,
    in_flight: usize,
    /// Deadlines of received events not due yet (a Discord interaction, a Telegram press),
    /// kept whatever their chat's turn is doing.
    deadlines: Vec<Arc<Armed>>,
    /// Events being acknowledged at their deadline (made on first use, dropped when done:
    /// an idle bot holds none).
    acknowledging: Option<JoinSet<()>>,
}

impl Chats {
    pub(crate) fn new(ctx: ChatsCtx) -> Self {
        Self {
            ctx: Arc::new(ctx),
            waiting: HashMap::new(),
            answering: JoinSet::new(),
            running: HashMap::new(),
            parked: HashMap::new(),
            timers: BTreeSet::new(),
            looking: 0,
            ready: VecDeque::new(),
            in_flight: 0,
            deadlines: Vec::new(),
            acknowledging: None,
        }
    }

    /// Messages received and not done yet, but those whose turns are held open for an
    /// answer that comes later.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight
            .saturating_sub(self.parked.len() + self.looking)
    }

    /// Queues a recorded entry (a replay of what a predecessor left pending): its turn reads
    /// what the predecessor wrote (state, outbox) first.
    pub(crate) fn dispatch(&mut self, e: InboxEntry) {
        let job = Job {
            key: e.key,
            message: None,
            received_at_ms: e.received_at_ms,
            armed: None,
        };
        self.push(e.chat, job);
    }

    /// Queues a message just recorded (`event`, received at `received_at_ms`, unix ms), and
    /// arms its platform deadline when it has one.
    pub(crate) fn dispatch_new(&mut self, item: InboxItem, event: &Inbound, received_at_ms: i64) {
        let armed = self.arm(event, received_at_ms);
        let job = Job {
            key: item.key,
            message: Some(item.message),
            received_at_ms,
            armed,
        };
        self.push(item.chat, job);
    }

    /// Arms the platform deadline of `event` (received at `received_at_ms`, unix ms) when it
    /// has one: unless a turn answers it first, it is acknowledged then.
    fn arm(&mut self, event: &Inbound, received_at_ms: i64) -> Option<Arc<Armed>> {
        let after = match &self.ctx.turn.sender {
            Ok(s) => s.defer_after(event)?,
            Err(_) => return None,
        };
        let arrived = turn::arrived_at(received_at_ms, Instant::now());
        let armed = Armed::new(event.clone(), arrived + after);
        self.deadlines.push(armed.clone());
        Some(armed)
    }

    /// An event recorded paused (its chat handed to a person): no turn answers it, and one
    /// the platform waits on is acknowledged at its deadline.
    pub(crate) fn paused(&mut self, event: &Inbound, received_at_ms: i64) {
        self.arm(event, received_at_ms);
    }

    /// Queues the entries of `pending` (a chat's pending entries, oldest first) that its
    /// queue does not have yet: entries journaled by other workers (sends from the backend)
    /// join their chat's queue in the journal's order.
    pub(crate) fn dispatch_unknown(&mut self, pending: Vec<InboxEntry>) {
        for e in pending {
            if !self.waiting.get(&e.chat).is_some_and(|q| q.has(&e.key)) {
                self.dispatch(e);
            }
        }
    }

    fn push(&mut self, chat: String, mut job: Job) {
        self.in_flight += 1;
        let q = self.waiting.entry(chat.clone()).or_default();
        if q.busy {
            // It waits behind its chat's turn: its turn reads the entry afresh (its chat may
            // be paused by then).
            job.message = None;
        }
        q.jobs.push_back(job);
        if !q.busy {
            self.start_next(chat);
        }
    }

    /// Starts answering the chat's oldest waiting message when a turn slot is free (else the
    /// chat waits for one in `ready`; busy either way until its task is done), or forgets the
    /// chat when nothing waits.
    fn start_next(&mut self, chat: String) {
        let Some(q) = self.waiting.get_mut(&chat) else {
            return;
        };
        if q.jobs.is_empty() {
            self.waiting.remove(&chat);
            if self.waiting.is_empty() {
                // An idle bot keeps no table: what a burst grew is given back.
                self.waiting = HashMap::new();
            }
            return;
        }
        q.busy = true;
        match self.ctx.turn.slots.try_take() {
            Some(slot) => self.spawn(chat, slot),
            None => {
                // It waits for a slot: its turn reads the entry afresh (its chat may be
                // paused by then).
                if let Some(j) = q.jobs.front_mut() {
                    j.message = None;
                }
                self.ready.push_back(chat);
            }
        }
    }

    /// Starts the task answering the chat's oldest message, with the turn slot it got.
    fn spawn(&mut self, chat: String, slot: OwnedSemaphorePermit) {
        let Some(q) = self.waiting.get_mut(&chat) else {
            return; // the queues were ended meanwhile
        };
        let Some(job) = q.jobs.pop_front() else {
            return;
        };
        q.answering = Some(job.key.clone());
        let turn = &self.ctx.turn;
        let entry = turn.later.entry(&turn.bot, &job.key);
        self.running.insert(entry, false);
        self.answering
            .spawn(answer(self.ctx.clone(), chat, job, entry, slot));
    }

    /// Keeps a held turn its task handed back until a part of its answer is posted or it is
    /// due; at once again when a part came while its task ran.
    fn park(&mut self, p: Box<Parked>) {
        let entry = p.entry();
        if self.running.remove(&entry) == Some(true) {
            self.look(p, true);
            return;
        }
        let due = p.due(&self.ctx.turn);
        self.timers.insert((due, entry));
        self.parked.insert(entry, (due, p));
    }

    /// Looks at a parked turn again, in a task of its own (no slot: its parts are short).
    fn look(&mut self, p: Box<Parked>, posted: bool) {
        self.looking += 1;
        self.running.insert(p.entry(), false);
        self.answering.spawn(look(self.ctx.clone(), p, posted));
    }

    /// Parts may have been posted for `entries`: their turns are looked at (or will be, when
    /// their task hands them back).
    fn posted(&mut self, entries: Vec<EntryOf>) {
        for entry in entries {
            if let Some((due, p)) = self.parked.remove(&entry) {
                self.timers.remove(&(due, entry));
                self.look(p, true);
            } else if let Some(posted) = self.running.get_mut(&entry) {
                *posted = true;
            }
        }
    }

    /// Looks at the parked turns whose time came.
    fn due(&mut self) {
        let now = Instant::now();
        while let Some(&(due, entry)) = self.timers.first() {
            if due > now {
                break;
            }
            self.timers.pop_first();
            if let Some((_, p)) = self.parked.remove(&entry) {
                self.look(p, false);
            }
        }
    }

    /// Waits for a chat's message to be done, and starts that chat's next. Answers `Some`
    /// when a queue stopped the bot (fenced, or its credentials refused; a queue asked to stop
    /// just ends); pends while nothing is being answered.
    pub(crate) async fn progress(&mut self) -> Option<Halt> {
        let ctx = self.ctx.clone();
        loop {
            let done = tokio::select! {
                Some(done) = self.answering.join_next() => done,
                slot = ctx.turn.slots.next(), if !self.ready.is_empty() => {
                    if let (Some(slot), Some(chat)) = (slot, self.ready.pop_front()) {
                        self.spawn(chat, slot);
                    }
                    continue;
                }
                () = sleep_until_first(&self.deadlines), if !self.deadlines.is_empty() => {
                    self.expire();
                    continue;
                }
                () = sleep_until_timer(&self.timers), if !self.timers.is_empty() => {
                    self.due();
                    continue;
                }
                entries = ctx.posted.next() => {
                    self.posted(entries);
                    continue;
                }
                Some(()) = acknowledged(&mut self.acknowledging) => {
                    if self.acknowledging.as_ref().is_some_and(JoinSet::is_empty) {
                        self.acknowledging = None;
                    }
                    continue;
                }
            };
            let Ok(done) = done else {
                continue; // aborted (shutting down)
            };
            let (chat, result) = match done {
                Done::Held(p, looked) => {
                    self.looking -= usize::from(looked);
                    // Held: no longer counted in flight.
                    self.park(p);
                    return None;
                }
                Done::Over(entry, chat, result, looked) => {
                    self.looking -= usize::from(looked);
                    self.running.remove(&entry);
                    if self.running.is_empty() && self.parked.is_empty() {
                        // An idle bot keeps no table: what a burst grew is given back.
                        self.running = HashMap::new();
                        self.parked = HashMap::new();
                    }
                    (chat, result)
                }
            };
            match result {
                Ok(()) => {
                    self.in_flight = self.in_flight.saturating_sub(1);
                    if let Some(q) = self.waiting.get_mut(&chat) {
                        q.busy = false;
                        q.answering = None;
                    }
                    self.start_next(chat);
                    return None;
                }
                Err(Halt::Stopped) => {}
                Err(halt) => return Some(halt),
            }
        }
    }

    /// Acknowledges the events whose deadline came (unless their turn answered them).
    fn expire(&mut self) {
        let now = Instant::now();
        let (due, later) = std::mem::take(&mut self.deadlines)
            .into_iter()
            .partition(|a| a.at <= now);
        self.deadlines = later;
        for armed in due {
            let ctx = self.ctx.clone();
            self.acknowledging
                .get_or_insert_with(JoinSet::new)
                .spawn(async move { armed.expire(&ctx.turn, &*ctx).await });
        }
    }

    /// Ends the queues: each chat finishes the message it is on (up to `limit`), the rest
    /// stays pending in the inbox for the next owner.
    pub(crate) async fn finish(mut self, limit: Duration) {
        // Held turns stay held in the store, for the next owner.
        self.parked.clear();
        self.timers.clear();
        self.waiting.clear();
        self.ready.clear();
        self.deadlines.clear();
        if let Some(set) = self.acknowledging.as_mut() {
            set.abort_all();
        }
        let deadline = tokio::time::sleep(limit);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                r = self.answering.join_next() => if r.is_none() { return },
                () = &mut deadline => {
                    tracing::warn!(turns = self.answering.len(), limit_ms = limit.as_millis() as u64, "turns still at work when the bot stopped: cut short (the next owner replays their messages)");
                    self.answering.abort_all();
                    return;
                }
            }
        }
    }
}

impl Hold for ChatsCtx {
    fn check(&self) -> Result<(), Halt> {
        if *self.stop.borrow() {
            return Err(Halt::Stopped);
        }
        self.lease.check().map_err(|e| Halt::Fenced(e.to_string()))
    }

    fn stop(&self) -> watch::Receiver<bool> {
        self.stop.clone()
    }

    fn parks(&self) -> Option<&Arc<Posted>> {
        Some(&self.posted)
    }
}

/// What a chat's task came to, and whether the task looked at a held turn (else it
/// answered a message).
enum Done {
    /// Its entry (as [`Chats::running`] knows it) is over in `chat` (answered, or nothing
    /// can answer it now), or the task was halted.
    Over(EntryOf, String, Result<(), Halt>, bool),
    /// Its turn is held open for an answer that comes later.
    Held(Box<Parked>, bool),
}

/// Answers one message of `chat` (its entry as [`Chats::running`] knows it) through the turn
/// pipeline, under the unit's claim: how it went, or its turn held open as data.
///
/// An async block, not an async fn (which would keep a second copy of its arguments).
#[allow(clippy::manual_async_fn)] // an async fn would keep its arguments twice
fn answer(
    ctx: Arc<ChatsCtx>,
    chat: String,
    job: Job,
    entry: EntryOf,
    slot: OwnedSemaphorePermit,
) -> impl std::future::Future<Output = Done> + Send + 'static {
    async move {
        // A message just received, for a handler that keeps no state: nothing to read first (it
        // is pending, its reply cannot be in the outbox yet, and no state is sent). Otherwise the
        // turn reads the chat's state and the outbox.
        let view = match job.message {
            Some(message) if !ctx.turn.handler.takes_state() => Some(TurnView {
                entry: Some(InboxEntry {
                    bot: ctx.turn.bot.clone(),
                    key: job.key.clone(),
                    seq: 0,
                    chat: chat.clone(),
                    message,
                    state: InboxState::Pending,
                    error: None,
                    received_at_ms: job.received_at_ms,
                }),
                ..TurnView::default()
            }),
            _ => None,
        };
        let armed = job.armed.clone();
        let j = turn::Job {
            key: &job.key,
            chat: &chat,
            fence: TurnFence::Claim(ctx.fence),
            view,
            arrived: None,
            slot: Some(slot),
            armed: job.armed,
        };
        let r = turn::run_or_park(&ctx.turn, &*ctx, j).await;
        let r = match r {
            Ok(Some(p)) => return Done::Held(p, false),
            Ok(None) => {
                // Over: answered, or nothing can answer it now.
                if let Some(a) = armed {
                    a.disarm();
                }
                Ok(())
            }
            Err(halt) => Err(halt),
        };
        Done::Over(entry, chat, r, false)
    }
}

/// Looks at a held turn again ([`turn::step_held`]): it is handed back held, or its entry is
/// over.
async fn look(ctx: Arc<ChatsCtx>, mut p: Box<Parked>, posted: bool) -> Done {
    let armed = p.armed();
    let r = match turn::step_held(&ctx.turn, &*ctx, &mut p, posted).await {
        Ok(false) => return Done::Held(p, true),
        Ok(true) => {
            // Over: its timer has nothing left to do.
            if let Some(a) = armed {
                a.disarm();
            }
            Ok(())
        }
        Err(halt) => Err(halt),
    };
    Done::Over(p.entry(), p.chat().to_owned(), r, true)
}

/// When one of the acknowledgements in `set` is done (`None` when there are none).
async fn acknowledged(set: &mut Option<JoinSet<()>>) -> Option<()> {
    set.as_mut()?.join_next().await.map(|_| ())
}

/// When the first of `timers` is due (pends while there are none).
pub(crate) async fn sleep_until_timer(timers: &BTreeSet<(Instant, EntryOf)>) {
    match timers.first() {
        Some(&(at, _)) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// When the first of `deadlines` is due.
async fn sleep_until_first(deadlines: &[Arc<Armed>]) {
    match deadlines.iter().map(|a| a.at).min() {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
