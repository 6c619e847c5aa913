//! Webhook bots on every worker: the hooks address, and one chat's turns across workers.
//!
//! ```text
//! POST /hooks/{platform}/{bot} → verify (the platform's scheme) → ticket in the chat's turn
//!   queue (and the turn, when free, in the same round trip) → journal (deduplicated by the
//!   platform's id) → 2xx → wait for the turn (a wake-up, not a poll) → handler with the
//!   chat's state → send (skipped if the outbox has it) → outbox record, state CAS and entry
//!   end in one write → release (wakes the next ticket's worker)
//! handler answers 202 → the turn stays held, kept as data by the worker's lot (`lot.rs`,
//!   no task) until the last part of its answer or its time to live → release
//! ```
//!
//! A 2xx is never sent before the journal write: a worker killed right after answering
//! loses nothing. Tickets of a worker that died are taken over by whoever asks next for that
//! chat, which replays their entries in ticket order; entries whose tickets were lost (a
//! coordinator that lost its data, a worker that died between journal and ticket) are swept
//! up by the fleet's sweeper (one leader at a time).

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    body::Bytes,
    extract::{DefaultBodyLimit, Path, RawQuery, State},
    http::{HeaderMap, Method, StatusCode},
    response::{IntoResponse, Response},
    routing::any,
    Router,
};
use botfleet_coord::{Coordinator, Group, LeaseHandle, LeaseLost, Turn};
use botfleet_core::Incarnation;
use botfleet_core::{BotId, BotSpec, BotStatus, Fence, Platform};
use botfleet_platform::{ErrorKind, HookAnswer, HookRequest, Sender, Webhooks};
use botfleet_store::{InboxItem, InboxState, Journaled, Store, TurnFence, TurnView};
use tokio::sync::{mpsc, watch, Notify};
use tracing::{debug, info, warn};

use crate::{
    handler::Handler,
    later::Posted,
    metrics::{
        Metrics, EVENTS_PAUSED_TOTAL, HOOKS_DUPLICATES_TOTAL, HOOKS_JOURNALED_TOTAL,
        HOOKS_REFUSED_TOTAL, HOOKS_UNAVAILABLE_TOTAL, TURN_OLDER_FIRST_TOTAL, TURN_TAKEOVERS_TOTAL,
        TURN_WAITS_EXCEEDED_TOTAL,
    },
    reporter::Reporter,
    retry::{backoff, sleep_or_stop},
    turn::{self, Armed, Halt, Hold, Parked, TurnBase, TurnCtx},
};

mod lot;

use lot::{Lodged, ToLot};

/// Largest webhook body taken (bytes); larger ones are answered 413.
pub const MAX_HOOK_BODY: usize = 1024 * 1024;

/// Pending entries of one bot the sweeper looks at per pass (oldest first; entries still
/// being served are skipped, so a slow chat does not hide the others' lost ones).
const SWEEP_BATCH: usize = 5_000;

/// How long a bot's spec is reused before it is read again (token rotations and mode changes
/// reach every worker within this).
const SPEC_TTL: Duration = Duration::from_secs(2);

/// Settings of the hooks address.
#[derive(Clone, Debug)]
pub(crate) struct HookSettings {
    pub(crate) lease: Duration,
    pub(crate) turn_wait: Duration,
    pub(crate) handler_timeout: Duration,
    /// Handlers compiled into the worker, by name.
    pub(crate) handlers: crate::HandlerRegistry,
    pub(crate) retry_for: Duration,
    /// The worker's turn slots.
    pub(crate) slots: crate::turn::Slots,
    /// The worker's file links.
    pub(crate) files: crate::Files,
    /// The worker's answers that come later.
    pub(crate) later: crate::later::Later,
    /// The fleet's send buckets.
    pub(crate) pace: crate::pace::Pace,
}

/// The webhook side of one worker: serve its [`Hooks::router`] on the hooks address.
#[derive(Clone)]
pub struct Hooks {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks").finish_non_exhaustive()
    }
}

/// A spec as read at an instant (`None`: no such bot), with its `updated_at_ms`.
type CachedSpec = (Instant, Option<Arc<BotSpec>>, i64);
/// A sender and the spec it was made for.
type CachedSender = (Arc<BotSpec>, Arc<dyn Sender>);

struct Inner {
    coord: Arc<dyn Coordinator>,
    store: Arc<dyn Store>,
    webhooks: HashMap<Platform, Arc<dyn Webhooks>>,
    metrics: Arc<Metrics>,
    lease: watch::Receiver<Option<LeaseHandle>>,
    http: reqwest::Client,
    settings: HookSettings,
    reporter: Reporter,
    // std Mutexes: each held for one map operation, never across .await.
    specs: Mutex<HashMap<BotId, CachedSpec>>,
    senders: Mutex<HashMap<BotId, CachedSender>>,
    /// Bots whose credentials the platform refused, with the `updated_at_ms` of the spec
    /// refused: their turns under that spec call no handler, and hold their chats.
    refused: Mutex<HashMap<BotId, Option<i64>>>,
    /// Deadlines of events this worker received (a Telegram press), armed until they come
    /// or the event's turn here ends; a turn on another worker races them, which the
    /// platform settles (an acknowledgement after the answer is refused and ignored).
    armed: Mutex<HashMap<(BotId, String), Arc<Armed>>>,
    /// Per chat key with a ticket waiting here: what its wake-up notifies.
    waiters: Mutex<HashMap<String, Arc<Notify>>>,
    /// (bot, entry key) being worked on here: the sweeper leaves them alone.
    active: Mutex<HashSet<(BotId, String)>>,
    /// The part of `active` whose ticket is being asked for again after a take failed (the
    /// coordinator was away): not journaled by that delivery, which was answered 503.
    retaking: Mutex<HashSet<(BotId, String)>>,
    /// Shutting down: new deliveries are answered 503, waiting tickets are left to others.
    draining: std::sync::atomic::AtomicBool,
    /// Leaving for good: no turn starts being handled any more (set just before the worker
    /// unregisters, so none is handled here after others may take it over), and the waits
    /// between a turn's tries end at once.
    closed: watch::Sender<bool>,
    /// Turns being handled here now, and a signal when that falls to zero.
    handling: std::sync::atomic::AtomicUsize,
    idle: Notify,
    /// Tells the lot of held turns what to keep (see `lot.rs`).
    lot: mpsc::UnboundedSender<ToLot>,
    /// The lot's side, until its task takes it.
    lot_rx: Mutex<Option<mpsc::UnboundedReceiver<ToLot>>>,
    /// Which of the lot's held turns may have had a part of their answer posted.
    posted: Arc<Posted>,
}

/// What serving a held turn came to.
enum Served {
    /// Handled and released.
    Done,
    /// The worker may not go on (its registration ended, or it is leaving).
    Stop,
    /// The turn was taken from this worker meanwhile: its own ticket's next answer.
    Again(Turn),
    /// The entry's turn is held open for an answer that comes later: the turn stays held
    /// (not released) until the lot ends it.
    Held(Box<Held>),
}

/// A turn held open for an answer that comes later, as its serving handed it back.
struct Held {
    turn: Box<Parked>,
    /// When it is to be looked at though no part was posted.
    due: Instant,
    /// The spec it was held under, and when that spec was registered (if known): its parts
    /// go out under them.
    spec: Arc<BotSpec>,
    spec_at: Option<i64>,
    /// The fence of the chat's turn it holds.
    fence: Fence,
}

/// Whether a taken-over turn's fence was recorded.
enum Accepted {
    Yes,
    /// A newer turn of the chat was granted: this one is void.
    Superseded,
    /// The worker may not act now.
    Fenced,
}

/// What a turn's handling came to.
enum Handled {
    /// Done (answered, undeliverable, or nothing to do).
    Done,
    /// This worker may not act (its lease is not safe): leave the entry to whoever takes over.
    Fenced,
    /// The platform refused the bot's credentials: the entry stays pending, and so do the
    /// chat's later ones, behind it, until the bot's spec changes.
    Refused,
    /// Held open for an answer that comes later: the turn as data, when it is due, and the
    /// `updated_at_ms` of the spec it was held under.
    Held(Box<Parked>, Instant, Option<i64>),
}

/// How long a turn held for a bot whose credentials were refused waits between looks at the
/// bot's spec (read through the spec cache: one store read per bot per [`SPEC_TTL`]).
const REFUSED_LOOK: Duration = Duration::from_secs(1);

/// What became of a bot whose credentials were refused, for a turn held meanwhile.
enum Replaced {
    /// Its spec changed (a new token, say): the turn is tried again under it.
    Spec(Arc<BotSpec>),
    /// It was removed or disabled: the turn is let go, its entries stay pending.
    Gone,
    /// This worker is leaving, or its registration ended: the turn is left to be taken over.
    Stop,
}

impl Hooks {
    // Called once, by the worker, with what it shares; a builder would only rename these.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        coord: Arc<dyn Coordinator>,
        store: Arc<dyn Store>,
        webhooks: HashMap<Platform, Arc<dyn Webhooks>>,
        metrics: Arc<Metrics>,
        lease: watch::Receiver<Option<LeaseHandle>>,
        http: reqwest::Client,
        settings: HookSettings,
        reporter: Reporter,
    ) -> Self {
        let (lot, lot_rx) = mpsc::unbounded_channel();
        Self {
            inner: Arc::new(Inner {
                coord,
                store,
                webhooks,
                metrics,
                lease,
                http,
                settings,
                reporter,
                specs: Mutex::default(),
                senders: Mutex::default(),
                refused: Mutex::default(),
                armed: Mutex::default(),
                waiters: Mutex::default(),
                active: Mutex::default(),
                retaking: Mutex::default(),
                draining: std::sync::atomic::AtomicBool::new(false),
                closed: watch::Sender::new(false),
                handling: std::sync::atomic::AtomicUsize::new(0),
                idle: Notify::new(),
                lot,
                lot_rx: Mutex::new(Some(lot_rx)),
                posted: Arc::default(),
            }),
        }
    }

    /// `/hooks/{platform}/{bot}` (GET for handshakes, POST for deliveries), bodies up to
    /// [`MAX_HOOK_BODY`].
    pub fn router(&self) -> Router {
        Router::new()
            .route("/hooks/{platform}/{bot}", any(hook))
            .layer(DefaultBodyLimit::max(MAX_HOOK_BODY))
            .with_state(self.clone())
    }

    /// The background work: turn wake-ups, the lot of held turns and the sweeper. Runs until
    /// aborted.
    pub(crate) async fn background(self) {
        let wake = self.clone().wakeups();
        let lot = self.clone().keep_lot();
        let sweep = self.sweeper();
        tokio::join!(wake, lot, sweep);
    }

    /// Starts a clean shutdown: new deliveries are answered 503 (the load balancer or the
    /// platform sends them to another worker), tickets still waiting are left to be taken over.
    pub(crate) fn begin_drain(&self) {
        self.inner
            .draining
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Waits (up to `limit`) until no turn is being handled here: a worker leaves only once
    /// its turns are done, so none is handled twice at once.
    pub(crate) async fn wait_idle(&self, limit: Duration) {
        self.inner.closed.send_replace(true);
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let idle = self.inner.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self
                .inner
                .handling
                .load(std::sync::atomic::Ordering::SeqCst)
                == 0
            {
                return;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                warn!(
                    "turns still being handled at shutdown; their entries are replayed by others"
                );
                return;
            }
        }
    }

    fn closed(&self) -> bool {
        *self.inner.closed.borrow()
    }

    fn draining(&self) -> bool {
        self.inner
            .draining
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    fn lease(&self) -> Option<LeaseHandle> {
        self.inner.lease.borrow().clone()
    }

    /// Whether this worker is registered and not revoked: deliveries are then taken, each
    /// message as its chat's group's part of the lease allows ([`Hooks::deliver`]).
    fn live(&self) -> bool {
        !self.closed()
            && self
                .lease()
                .is_some_and(|l| l.check() != Err(LeaseLost::Revoked))
    }

    fn may_act(&self) -> bool {
        !self.closed() && self.lease().is_some_and(|l| l.check().is_ok())
    }

    /// Whether this worker may act now on what was granted as `grant`: while its chat's
    /// group's part of the lease is safe, and never once the worker registered again there
    /// (that registration's turns are others' to take over, while a task from before may
    /// still run here).
    fn may_act_as(&self, grant: &Grant) -> bool {
        !self.closed() && grant.safe() && self.same_registration(grant)
    }

    /// Dispatches this worker's turn wake-ups to the tickets waiting here.
    async fn wakeups(self) {
        let mut lease = self.inner.lease.clone();
        loop {
            // Wake-ups are addressed to the worker id: subscribe once registered.
            while lease.borrow().is_none() {
                if lease.changed().await.is_err() {
                    return;
                }
            }
            match self.inner.coord.turn_wakeups().await {
                Ok(mut rx) => {
                    while let Some(chat) = rx.recv().await {
                        let n = lock(&self.inner.waiters).get(&chat).cloned();
                        if let Some(n) = n {
                            n.notify_waiters();
                        }
                    }
                }
                Err(e) => {
                    debug!(error = %e, "turn wake-ups unavailable; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// Entries journaled but not answered long after (their worker died between journal and
    /// ticket, or the coordinator lost their tickets): one worker at a time takes tickets for
    /// them, in journal order.
    async fn sweeper(&self) {
        let every = self.inner.settings.lease.max(Duration::from_secs(1));
        loop {
            tokio::time::sleep(every).await;
            if !self.may_act() {
                continue;
            }
            match self.inner.coord.try_lead("hooks-sweeper", every * 3).await {
                Ok(Some(_)) => {}
                Ok(None) => continue,
                Err(e) => {
                    debug!(error = %e, "sweeper: cannot lead");
                    continue;
                }
            }
            if let Err(e) = self.sweep(every * 2).await {
                debug!(error = %e, "sweeper: store unavailable");
            }
        }
    }

    async fn sweep(&self, older_than: Duration) -> Result<(), botfleet_store::StoreError> {
        let stats = self.inner.store.inbox_stats().await?;
        let cutoff =
            botfleet_core::unix_ms() - i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
        for (bot, s) in stats {
            if s.pending == 0 {
                continue;
            }
            // Read afresh (not the hot path's cache): a bot whose credentials were refused
            // keeps its entries until it is restarted, then they are replayed in order.
            let Ok(Some(rec)) = self.inner.store.get_bot(&bot).await else {
                continue;
            };
            if !crate::is_webhook(&rec.spec) || !rec.spec.enabled || rec.status == BotStatus::Failed
            {
                continue;
            }
            let Some(spec) = self.cache_spec(&bot, Some((rec.spec, rec.updated_at_ms))) else {
                continue;
            };
            for e in self.inner.store.inbox_pending(&bot, SWEEP_BATCH).await? {
                if e.received_at_ms > cutoff || !self.claim_local(&bot, &e.key) {
                    continue;
                }
                info!(%bot, key = %e.key, "replaying a journaled entry whose turn was lost");
                if let Err(err) = self.serve_now(&spec, &bot, &e.chat, &e.key).await {
                    debug!(error = %err, "sweeper: coordinator unavailable");
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Serves entries of `unit` (a unit of `spec`'s bot) in `chat` made pending again (a
    /// paused chat resumed with a replay), in the order given: a ticket each, taken now. An
    /// entry this worker serves already, or whose ticket cannot be taken now, is left to the
    /// sweeper.
    pub(crate) async fn replay(
        &self,
        spec: Arc<BotSpec>,
        unit: &BotId,
        chat: &str,
        keys: &[String],
    ) {
        for key in keys {
            if !self.claim_local(unit, key) {
                continue;
            }
            if let Err(e) = self.serve_now(&spec, unit, chat, key).await {
                debug!(bot = %unit, error = %e, "cannot take a ticket for a replayed entry; the sweeper serves it");
                return;
            }
        }
    }

    /// Takes a ticket now for the pending entry `key` of `chat` of `unit` (claimed here
    /// already) and serves it in the background; unclaimed again when the ticket cannot be
    /// taken.
    async fn serve_now(
        &self,
        spec: &Arc<BotSpec>,
        unit: &BotId,
        chat: &str,
        key: &str,
    ) -> botfleet_coord::Result<()> {
        let ck = chat_key(unit, chat);
        match self.take_now(&ck, key).await {
            (grant, Ok((ticket, turn))) => {
                let h = self.clone();
                let (spec, chat, key) = (spec.clone(), chat.to_owned(), key.to_owned());
                tokio::spawn(async move {
                    let t = Taken {
                        ticket,
                        turn,
                        grant,
                    };
                    h.run_ticket(spec, ck, chat, key, t, Instant::now(), None)
                        .await;
                });
                Ok(())
            }
            (_, Err(e)) => {
                self.unclaim_local(unit, key);
                Err(e)
            }
        }
    }

    /// The bot's spec, read again after [`SPEC_TTL`].
    async fn spec_of(
        &self,
        id: &BotId,
    ) -> Result<Option<Arc<BotSpec>>, botfleet_store::StoreError> {
        if let Some((at, spec, _)) = lock(&self.inner.specs).get(id) {
            if at.elapsed() < SPEC_TTL {
                return Ok(spec.clone());
            }
        }
        let rec = self.inner.store.get_bot(id).await?;
        Ok(self.cache_spec(id, rec.map(|r| (r.spec, r.updated_at_ms))))
    }

    /// Keeps a spec just read (with its `updated_at_ms`) for [`SPEC_TTL`].
    fn cache_spec(&self, id: &BotId, read: Option<(BotSpec, i64)>) -> Option<Arc<BotSpec>> {
        let at_ms = read.as_ref().map_or(0, |(_, at)| *at);
        let spec = read.map(|(s, _)| Arc::new(s));
        let mut specs = lock(&self.inner.specs);
        // Only webhook bots' specs are kept: the sweeper also looks up polling and socket
        // bots with pending entries, and holding those would cost every such bot memory.
        if spec.as_ref().is_some_and(|s| crate::is_webhook(s)) {
            if specs.len() >= 10_000 {
                specs.retain(|_, (at, _, _)| at.elapsed() < SPEC_TTL);
            }
            specs.insert(id.clone(), (Instant::now(), spec.clone(), at_ms));
        } else {
            specs.remove(id);
        }
        spec
    }

    /// The `updated_at_ms` of `spec`, when it is the one cached (the turn's reports are then
    /// made under it).
    fn spec_at(&self, spec: &Arc<BotSpec>) -> Option<i64> {
        match lock(&self.inner.specs).get(&spec.id) {
            Some((_, Some(cached), at)) if Arc::ptr_eq(cached, spec) => Some(*at),
            _ => None,
        }
    }

    fn sender_of(
        &self,
        spec: &Arc<BotSpec>,
    ) -> Result<Arc<dyn Sender>, botfleet_platform::PlatformError> {
        if let Some((s, sender)) = lock(&self.inner.senders).get(&spec.id) {
            if **s == **spec {
                return Ok(sender.clone());
            }
        }
        let wh = self.inner.webhooks.get(&spec.platform).ok_or_else(|| {
            botfleet_platform::PlatformError::new(
                ErrorKind::Rejected,
                "no_webhooks",
                "this build has no webhook side for the platform",
            )
        })?;
        let sender = wh.sender(spec)?;
        lock(&self.inner.senders).insert(spec.id.clone(), (spec.clone(), sender.clone()));
        Ok(sender)
    }

    /// Marks the entry as served here; false when a task here serves it already.
    fn claim_local(&self, bot: &BotId, key: &str) -> bool {
        lock(&self.inner.active).insert((bot.clone(), key.to_owned()))
    }

    fn unclaim_local(&self, bot: &BotId, key: &str) {
        lock(&self.inner.active).remove(&(bot.clone(), key.to_owned()));
    }

    fn waiter(&self, chat_key: &str) -> Arc<Notify> {
        lock(&self.inner.waiters)
            .entry(chat_key.to_owned())
            .or_default()
            .clone()
    }

    fn forget_waiter(&self, chat_key: &str, n: Arc<Notify>) {
        let mut w = lock(&self.inner.waiters);
        // Ours and the map's: nobody else waits on this chat here.
        if Arc::strong_count(&n) <= 2 {
            w.remove(chat_key);
        }
    }

    /// Journals a verified delivery's messages and queues them for their chats' turns.
    async fn deliver(
        &self,
        spec: Arc<BotSpec>,
        messages: Vec<botfleet_platform::Received>,
        arrived: Instant,
    ) -> Response {
        let p = spec.platform;
        // Tickets first (in delivery order), then the journal, then the 2xx. A ticket whose
        // entry never got journaled is released empty when its turn comes.
        let mut tickets = Vec::with_capacity(messages.len());
        let mut failed = false;
        for (idx, m) in messages.iter().enumerate() {
            // Served here already (a redelivery reaching the same worker): its task has it.
            if !self.claim_local(&spec.id, &m.key) {
                // Unless that task only asks for the ticket of a delivery that failed: its
                // turn may come and go before this journals the entry, leaving the entry to
                // the sweeper, after later messages of its chat. Refused until it is done.
                if lock(&self.inner.retaking).contains(&(spec.id.clone(), m.key.clone())) {
                    failed = true;
                    break;
                }
                continue;
            }
            let ck = chat_key(&spec.id, &m.message.chat.chat);
            let grant = self.grant(&ck);
            if !self.may_act_as(&grant) {
                // This worker may not act in the chat's coordination group now (its part of
                // the lease is late): the platform delivers again, here or elsewhere.
                self.unclaim_local(&spec.id, &m.key);
                failed = true;
                break;
            }
            let taken = self.inner.coord.turn_take(&ck, &m.key).await;
            match taken {
                Ok((_, Turn::NotLive)) => {
                    self.unclaim_local(&spec.id, &m.key);
                    failed = true;
                    break;
                }
                Ok((ticket, turn)) => tickets.push((
                    idx,
                    ck,
                    Taken {
                        ticket,
                        turn,
                        grant,
                    },
                )),
                Err(e) => {
                    warn!(bot = %spec.id, error = %e, "cannot take a turn ticket; answering 503");
                    let chat = m.message.chat.chat.clone();
                    self.retake(spec.clone(), ck, chat, m.key.clone(), grant);
                    failed = true;
                    break;
                }
            }
        }
        let items: Vec<InboxItem> = messages
            .iter()
            .map(|m| InboxItem {
                key: m.key.clone(),
                chat: m.message.chat.chat.clone(),
                message: serde_json::to_string(&m.message).unwrap_or_default(),
            })
            .collect();
        // A ticket granted at once (the uncontended case) reads its turn's start in the same
        // store call as the journal write: its turn is held, nothing else can change it.
        let first_granted = tickets
            .iter()
            .find(|(_, _, t)| matches!(t.turn, Turn::Granted { .. }))
            .map(|(idx, ..)| *idx);
        let mut preload = None;
        let journaled = if failed {
            None
        } else {
            match self
                .inner
                .store
                .journal_put(&spec.id, &items, None, first_granted)
                .await
            {
                Ok((new, view)) => {
                    preload = view;
                    Some(new)
                }
                Err(e) => {
                    warn!(bot = %spec.id, error = %e, "cannot journal a delivery; answering 503");
                    None
                }
            }
        };
        // Every ticket taken is served, journaled or not (an empty one is just released).
        for (idx, ck, taken) in tickets {
            let h = self.clone();
            let item = &items[idx];
            let (spec, chat, key) = (spec.clone(), item.chat.clone(), item.key.clone());
            let view = if Some(idx) == first_granted {
                preload.take()
            } else {
                None
            };
            tokio::spawn(async move {
                h.run_ticket(spec, ck, chat, key, taken, arrived, view)
                    .await;
            });
        }
        match journaled {
            Some(new) => {
                // Recorded now (paused ones too: the platform's deadline is kept for them,
                // acknowledged then).
                let received: Vec<&botfleet_platform::Received> = messages
                    .iter()
                    .zip(&new)
                    .filter_map(|(m, n)| (*n != Journaled::Known).then_some(m))
                    .collect();
                self.arm(&spec, &received, arrived);
                let paused = new.iter().filter(|n| **n == Journaled::Paused).count() as u64;
                let fresh = received.len() as u64;
                self.inner.metrics.count(HOOKS_JOURNALED_TOTAL, p, fresh);
                self.inner.metrics.count(EVENTS_PAUSED_TOTAL, p, paused);
                self.inner
                    .metrics
                    .count(HOOKS_DUPLICATES_TOTAL, p, new.len() as u64 - fresh);
                for _ in 0..fresh {
                    self.inner.metrics.received_by(spec.id.as_str());
                }
                StatusCode::OK.into_response()
            }
            None => {
                self.inner.metrics.count(HOOKS_UNAVAILABLE_TOTAL, p, 1);
                (StatusCode::SERVICE_UNAVAILABLE, "not journaled; retry\n").into_response()
            }
        }
    }

    /// After a ticket take whose answer was lost (it may have happened): asks again (the
    /// same ticket comes back) until known, then serves it (empty: it is released). Until
    /// then the key is marked as being retaken.
    fn retake(&self, spec: Arc<BotSpec>, ck: String, chat: String, key: String, grant: Grant) {
        let h = self.clone();
        let mark = (spec.id.clone(), key.clone());
        lock(&self.inner.retaking).insert(mark.clone());
        tokio::spawn(async move {
            match h.take(&ck, &key, &grant).await {
                Some((ticket, turn)) => {
                    let t = Taken {
                        ticket,
                        turn,
                        grant,
                    };
                    h.run_ticket(spec, ck, chat, key, t, Instant::now(), None)
                        .await;
                }
                // The worker registered again meanwhile (a failover lost its writes): the
                // entry is still this worker's to see through, as the new registration.
                None if grant.inc.is_some() && !h.closed() && !h.draining() => {
                    h.again_as_registered(spec, ck, chat, key, grant);
                }
                None => h.unclaim_local(&spec.id, &key),
            }
            lock(&h.inner.retaking).remove(&mark);
        });
    }

    /// Journals `item`, a send from the backend to a chat of `spec`'s bot, and serves it in
    /// the chat's turn as a delivery's message is: a ticket first, then the journal; the
    /// ticket's turn runs here in the background (after the chat's earlier tickets, wherever
    /// they are). Answers whether the entry is new. Without a ticket (this worker is not
    /// live), the journaled entry waits for a worker's sweeper.
    ///
    /// # Errors
    /// When the ticket or the journal write failed: the send is not accepted (a ticket whose
    /// answer was lost is asked for again and released empty).
    pub(crate) async fn inject(
        &self,
        spec: Arc<BotSpec>,
        item: &InboxItem,
    ) -> Result<bool, crate::sends::SendError> {
        let ck = chat_key(&spec.id, &item.chat);
        let ticket = if self.claim_local(&spec.id, &item.key) {
            let (grant, taken) = self.take_now(&ck, &item.key).await;
            match taken {
                Ok((_, Turn::NotLive)) => {
                    self.unclaim_local(&spec.id, &item.key);
                    None
                }
                Ok((ticket, turn)) => Some(Taken {
                    ticket,
                    turn,
                    grant,
                }),
                Err(e) => {
                    // Not journaled meanwhile: that ticket's turn could come and go before
                    // the entry exists.
                    let (chat, key) = (item.chat.clone(), item.key.clone());
                    self.retake(spec, ck, chat, key, grant);
                    return Err(crate::sends::SendError::Coordinator(e.to_string()));
                }
            }
        } else if lock(&self.inner.retaking).contains(&(spec.id.clone(), item.key.clone())) {
            // The last try of this key lost its ticket's answer; not accepted until that
            // ticket is served.
            return Err(crate::sends::SendError::Coordinator(
                "a ticket of this key's last try is still being asked for; retry".into(),
            ));
        } else {
            // Served here already (a repeat of the key while its first is in its turn).
            None
        };
        let granted = ticket
            .as_ref()
            .is_some_and(|t| matches!(t.turn, Turn::Granted { .. }));
        let journaled = self
            .inner
            .store
            .journal_put(
                &spec.id,
                std::slice::from_ref(item),
                None,
                granted.then_some(0),
            )
            .await;
        let (new, view) = match journaled {
            // (A send is never paused.)
            Ok((new, view)) => (Ok(new.first().is_some_and(|n| n.is_new())), view),
            Err(e) => (Err(e.into()), None),
        };
        // Every ticket taken is served, journaled or not (an empty one is just released).
        if let Some(taken) = ticket {
            let h = self.clone();
            let (chat, key) = (item.chat.clone(), item.key.clone());
            tokio::spawn(async move {
                h.run_ticket(spec, ck, chat, key, taken, Instant::now(), view)
                    .await;
            });
        }
        new
    }

    /// Waits for the turn of the ticket `taken` (replaying dead workers' tickets before it),
    /// handles its entry, releases the turn. Everything is asked and done as the registration
    /// the ticket was taken under: once the worker registered again, that registration's
    /// tickets and turns are others' (or this worker's newer tasks') to take over.
    #[allow(clippy::too_many_arguments)]
    async fn run_ticket(
        &self,
        spec: Arc<BotSpec>,
        ck: String,
        chat: String,
        key: String,
        taken: Taken,
        arrived: Instant,
        mut preload: Option<TurnView>,
    ) {
        let Taken {
            mut ticket,
            mut turn,
            grant,
        } = taken;
        let waiter = self.waiter(&ck);
        let coord = &self.inner.coord;
        let p = spec.platform;
        let waited_from = Instant::now();
        let mut reported = false;
        let mut attempt = 0u32;
        // Re-asks while waiting: a wake-up ends the wait at once; the timer only notices a
        // ticket taker that died (expiries are not signalled).
        let recheck = (self.inner.settings.lease / 2).max(Duration::from_millis(100));
        let held = loop {
            let next = match turn {
                Turn::Granted {
                    fence, after_loss, ..
                } => {
                    let pre = preload.take();
                    match self
                        .serve(
                            &spec,
                            &ck,
                            &chat,
                            &key,
                            ticket,
                            (fence, after_loss),
                            Some(arrived),
                            pre,
                            &grant,
                            ticket,
                        )
                        .await
                    {
                        Served::Done | Served::Stop => break None,
                        Served::Again(t) => Ok(t),
                        Served::Held(held) => break Some((ticket, held)),
                    }
                }
                Turn::TakeOver {
                    ticket: dead,
                    entry,
                    fence,
                    after_loss,
                } => {
                    self.inner.metrics.count(TURN_TAKEOVERS_TOTAL, p, 1);
                    info!(bot = %spec.id, chat = %chat, ticket = dead, "taking over a turn its worker left");
                    match self
                        .serve(
                            &spec,
                            &ck,
                            &chat,
                            &entry,
                            dead,
                            (fence, after_loss),
                            None,
                            None,
                            &grant,
                            ticket,
                        )
                        .await
                    {
                        Served::Stop => break None,
                        Served::Held(held) => break Some((dead, held)),
                        Served::Done | Served::Again(_) => {
                            self.try_as(&grant, coord.turn_try(&ck, ticket)).await
                        }
                    }
                }
                // Leaving: this ticket is taken over once the worker unregisters.
                Turn::Wait if self.draining() => break None,
                Turn::Wait => {
                    if !reported && waited_from.elapsed() > self.inner.settings.turn_wait {
                        reported = true;
                        self.inner.metrics.count(TURN_WAITS_EXCEEDED_TOTAL, p, 1);
                        warn!(bot = %spec.id, chat = %chat, waited_ms = waited_from.elapsed().as_millis() as u64, "a message waited longer than --turn-wait-ms for its chat's turn; still waiting");
                    }
                    let notified = waiter.notified();
                    tokio::pin!(notified);
                    notified.as_mut().enable();
                    // Asked once more after arming: a release between the last answer and
                    // now is not missed.
                    match self.try_as(&grant, coord.turn_try(&ck, ticket)).await {
                        Ok(Turn::Wait) => {
                            let _ = tokio::time::timeout(recheck, notified).await;
                            self.try_as(&grant, coord.turn_try(&ck, ticket)).await
                        }
                        other => other,
                    }
                }
                Turn::Passed => {
                    // Served already (taken over while this worker was thought dead), or the
                    // coordinator forgot the queue: the entry decides.
                    match self.inner.store.turn_view(&spec.id, &key, &chat).await {
                        Ok(v)
                            if v.entry
                                .as_ref()
                                .is_some_and(|e| e.state == InboxState::Pending) =>
                        {
                            match self.take(&ck, &key, &grant).await {
                                Some((t, next)) => {
                                    ticket = t;
                                    Ok(next)
                                }
                                None => break None,
                            }
                        }
                        Ok(_) => break None,
                        Err(e) => {
                            debug!(error = %e, "cannot read the entry of a passed ticket");
                            if !self.same_registration(&grant) {
                                break None;
                            }
                            tokio::time::sleep(backoff(attempt)).await;
                            attempt += 1;
                            Ok(Turn::Passed)
                        }
                    }
                }
                // This registration is gone: its tickets are others' to take over.
                Turn::NotLive => break None,
            };
            turn = match next {
                Ok(t) => {
                    attempt = 0;
                    t
                }
                Err(e) => {
                    debug!(error = %e, "turn queue unavailable; retrying");
                    match self.try_again(&ck, ticket, &grant).await {
                        Some(t) => t,
                        None => break None,
                    }
                }
            };
        };
        self.forget_waiter(&ck, waiter);
        match held {
            // Held open for an answer that comes later: kept as data by the lot, which does
            // the rest of this task's work once the turn ends (the entry stays marked active).
            Some((held_ticket, held)) => {
                let Held {
                    turn,
                    due,
                    spec,
                    spec_at,
                    fence,
                } = *held;
                // The entry asked with is kept only when it is not the held turn's own.
                let key = (key != turn.key()).then(|| key.into_boxed_str());
                self.lodge(Box::new(Lodged {
                    turn,
                    due,
                    spec,
                    spec_at,
                    ck: ck.into_boxed_str(),
                    key,
                    own: ticket,
                    ticket: held_ticket,
                    fence,
                    grant,
                }));
            }
            None => self.ticket_over(spec, ck, chat, key, grant),
        }
    }

    /// What a ticket's task does last: forgets the entry's mark, or, when the worker
    /// registered again meanwhile, sees the entry through as the new registration.
    fn ticket_over(&self, spec: Arc<BotSpec>, ck: String, chat: String, key: String, grant: Grant) {
        let gone = !self.same_registration(&grant) || grant.revoked();
        if grant.inc.is_some() && gone && !self.closed() && !self.draining() {
            // The worker registered again in the chat's group, or is about to (Redis lost some
            // of its writes): this ticket is the earlier registration's, taken over in its
            // turn by whoever comes next, but the entry is still this worker's to see
            // through, also when no later message of its chat comes (else it would wait for
            // the sweeper).
            self.again_as_registered(spec, ck, chat, key, grant);
            return;
        }
        self.unclaim_local(&spec.id, &key);
    }

    /// Serves `key` (an entry of `chat`, whose ticket was taken as `was`) again once the worker
    /// is registered anew in the chat's group: if it is still pending, with a ticket of the
    /// new registration (the old ticket's turn, when it comes, is taken over and serves it;
    /// the new one then finds it done). Nothing while the worker stops or drains.
    fn again_as_registered(
        &self,
        spec: Arc<BotSpec>,
        ck: String,
        chat: String,
        key: String,
        was: Grant,
    ) {
        let h = self.clone();
        tokio::spawn(async move {
            let mut lease = h.inner.lease.clone();
            loop {
                if h.closed() || h.draining() {
                    h.unclaim_local(&spec.id, &key);
                    return;
                }
                let now = h.incarnation_in(was.group);
                // Registered anew there; or `was` was taken while the keeper had not caught up
                // with a join of the group yet (its handle revoked, its incarnation already the
                // new one): served again under a grant taken once the part is not revoked.
                let caught_up = now == was.inc
                    && h.lease()
                        .is_some_and(|l| l.check_in(was.group) != Err(LeaseLost::Revoked));
                if now.is_some() && (now != was.inc || caught_up) {
                    break;
                }
                if let Ok(Err(_)) =
                    tokio::time::timeout(Duration::from_secs(1), lease.changed()).await
                {
                    // No more lease changes: the worker is stopping.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            let pending = matches!(
                h.inner.store.turn_view(&spec.id, &key, &chat).await,
                Ok(v) if v.entry.as_ref().is_some_and(|e| e.state == InboxState::Pending)
            );
            if !pending {
                // Done (by whoever took its turn over), or unreadable: the sweeper's then.
                h.unclaim_local(&spec.id, &key);
                return;
            }
            info!(bot = %spec.id, chat = %chat, key = %key, "registered again: taking a ticket again for an entry of the earlier registration");
            // Through coordinator failures (just after a failover a grant may wait for a
            // replica to follow the new primary) while this registration lasts.
            let grant = h.grant(&ck);
            match h.take(&ck, &key, &grant).await {
                Some((ticket, turn)) if turn != Turn::NotLive => {
                    let t = Taken {
                        ticket,
                        turn,
                        grant,
                    };
                    h.run_ticket(spec, ck, chat, key, t, Instant::now(), None)
                        .await;
                }
                // Not live, or registered again meanwhile: once more as the next one.
                _ => h.again_as_registered(spec, ck, chat, key, grant),
            }
        });
    }

    /// Handles `entry` under the held turn of `ticket` (its fence, and whether the grant came
    /// soon after a loss of coordination data: then the chat's older pending entries go
    /// first) and releases it. `asker` is the ticket the turn was asked with: `ticket` itself,
    /// or for a taken-over turn the ticket of this task's own entry. A worker whose lease
    /// became unsafe in between waits for it to be safe again and asks for the turn again as
    /// `asker` (it is still its own unless it was taken over meanwhile); one whose
    /// registration ended, or that is leaving, stops and leaves the turn to be taken over.
    #[allow(clippy::too_many_arguments)]
    async fn serve(
        &self,
        first: &Arc<BotSpec>,
        ck: &str,
        chat: &str,
        entry: &str,
        ticket: u64,
        (mut fence, mut after_loss): (Fence, bool),
        arrived: Option<Instant>,
        mut preload: Option<TurnView>,
        grant: &Grant,
        asker: u64,
    ) -> Served {
        let takeover = asker != ticket;
        let mut spec = first.clone();
        let spec = &mut spec;
        // Whether the spec changed under this turn after its credentials were refused.
        let mut replaced = false;
        loop {
            // A taken-over turn's holder may still be frozen somewhere: the fence is recorded
            // first, so its late state write (for this entry or an older one) is refused.
            let accepted = if takeover {
                match self.accept(spec, chat, fence, grant).await {
                    Accepted::Yes => Handled::Done,
                    // A newer turn of the chat was granted: this one is void.
                    Accepted::Superseded => return Served::Done,
                    Accepted::Fenced => Handled::Fenced,
                }
            } else {
                Handled::Done
            };
            let older = match accepted {
                Handled::Done if after_loss => {
                    // Read before older entries may change the chat's state: read again.
                    preload = None;
                    self.serve_older(spec, chat, entry, fence, grant).await
                }
                other => other,
            };
            let done = match older {
                Handled::Done => {
                    let pre = preload.take();
                    self.handle_entry(spec, chat, entry, fence, grant, arrived, pre, true)
                        .await
                }
                other => other,
            };
            let done = match done {
                // The chat's later entries wait behind this one, in order, as a polling bot's
                // do while it is failed; once the bot's spec changes it is answered again.
                Handled::Refused => match self.until_replaced(spec, grant).await {
                    Replaced::Spec(newer) => {
                        *spec = newer;
                        preload = None;
                        replaced = true;
                        continue;
                    }
                    Replaced::Gone => Handled::Done,
                    Replaced::Stop => return Served::Stop,
                },
                other => other,
            };
            if let Handled::Held(turn, due, spec_at) = done {
                if replaced {
                    // Answered (held) under the new spec: the bot works again.
                    self.report_working(spec, spec_at);
                }
                return Served::Held(Box::new(Held {
                    turn,
                    due,
                    spec: spec.clone(),
                    spec_at,
                    fence,
                }));
            }
            if matches!(done, Handled::Done) {
                if replaced {
                    // Answered under the new spec: the bot works again.
                    self.report_working(spec, self.spec_at(spec));
                }
                return if self.release(ck, ticket, fence, grant).await {
                    Served::Done
                } else {
                    Served::Stop
                };
            }
            if !self.recover(grant).await {
                return Served::Stop;
            }
            match self.try_again(ck, asker, grant).await {
                Some(Turn::Granted {
                    fence: f,
                    after_loss: recent,
                    ..
                }) if !takeover => (fence, after_loss) = (f, recent),
                Some(Turn::TakeOver {
                    ticket: t,
                    fence: f,
                    after_loss: recent,
                    ..
                }) if takeover && t == ticket => (fence, after_loss) = (f, recent),
                Some(other) => return Served::Again(other),
                None => return Served::Stop,
            }
        }
    }

    /// Reports `spec`'s bot (under the spec changed at `spec_at`) running again: a turn was
    /// answered under a spec that replaced one whose credentials were refused.
    fn report_working(&self, spec: &BotSpec, spec_at: Option<i64>) {
        self.inner.reporter.report_under(
            &spec.id,
            BotStatus::Running,
            None,
            &self.worker_name(),
            spec_at,
        );
    }

    /// Holds a turn of a bot whose credentials were refused under `spec` until the bot's
    /// spec changes (an operator replaced the token), it is removed or disabled, or this
    /// worker stops.
    async fn until_replaced(&self, spec: &Arc<BotSpec>, grant: &Grant) -> Replaced {
        let refused_at = self.spec_at(spec);
        let mut stop = self.inner.closed.subscribe();
        loop {
            if self.closed() || !self.same_registration(grant) {
                return Replaced::Stop;
            }
            if sleep_or_stop(REFUSED_LOOK, &mut stop).await {
                return Replaced::Stop;
            }
            match self.spec_of(&spec.id).await {
                Ok(Some(s)) if !s.enabled => return Replaced::Gone,
                Ok(Some(s)) if self.spec_at(&s) != refused_at => {
                    info!(bot = %spec.id, "the bot's spec changed after its credentials were refused: answering its held turns again");
                    return Replaced::Spec(s);
                }
                Ok(Some(_)) => {}
                Ok(None) => return Replaced::Gone,
                Err(e) => {
                    debug!(bot = %spec.id, error = %e, "cannot read a refused bot's spec; looking again")
                }
            }
        }
    }

    /// After a loss of coordination data (see [`Turn::after_loss`]): handles the chat's
    /// entries journaled before `entry` and still pending, oldest first, under the turn held
    /// for `entry`. Their tickets may have gone with the forgotten queue; served here, the chat
    /// keeps its order (a ticket taken for one of them later finds it done). Store failures
    /// are retried while this worker may act.
    async fn serve_older(
        &self,
        spec: &Arc<BotSpec>,
        chat: &str,
        entry: &str,
        fence: Fence,
        grant: &Grant,
    ) -> Handled {
        let mut attempt = 0;
        let pending = loop {
            if !self.may_act_as(grant) {
                return Handled::Fenced;
            }
            match self
                .inner
                .store
                .inbox_pending_chat(&spec.id, chat, SWEEP_BATCH)
                .await
            {
                Ok(p) => break p,
                Err(e) => {
                    warn!(bot = %spec.id, error = %e, "cannot read a chat's older entries after a loss; retrying");
                    tokio::time::sleep(backoff(attempt).min(Duration::from_secs(2))).await;
                    attempt += 1;
                }
            }
        };
        // The chat's own, oldest first. An entry not among them is done (nothing to keep in
        // order before it), unless the list was cut short: then every listed one is older.
        let own = pending.iter().position(|e| e.key == entry);
        let upto = match own {
            Some(i) => i,
            None if pending.len() >= SWEEP_BATCH => pending.len(),
            None => 0,
        };
        for e in &pending[..upto] {
            info!(bot = %spec.id, chat = %chat, key = %e.key, "after a coordinator data loss: serving an older entry of the chat first");
            self.inner
                .metrics
                .count(TURN_OLDER_FIRST_TOTAL, spec.platform, 1);
            // Held in this task if it is held (the entry it was served for is next).
            let done = self
                .handle_entry(spec, chat, &e.key, fence, grant, None, None, false)
                .await;
            if !matches!(done, Handled::Done) {
                return done;
            }
        }
        Handled::Done
    }

    /// `handle`, or nothing for an empty entry (a ticket whose journal write failed).
    #[allow(clippy::too_many_arguments)]
    async fn handle_entry(
        &self,
        spec: &Arc<BotSpec>,
        chat: &str,
        entry: &str,
        fence: Fence,
        grant: &Grant,
        arrived: Option<Instant>,
        preload: Option<TurnView>,
        park: bool,
    ) -> Handled {
        if entry.is_empty() {
            return Handled::Done;
        }
        self.handle(spec, chat, entry, fence, grant, arrived, preload, park)
            .await
    }

    /// Records a taken-over turn's fence in the store, through store failures, while this
    /// worker may act as `grant`.
    async fn accept(&self, spec: &BotSpec, chat: &str, fence: Fence, grant: &Grant) -> Accepted {
        let mut attempt = 0;
        loop {
            if !self.may_act_as(grant) {
                return Accepted::Fenced;
            }
            match self.inner.store.turn_accept(&spec.id, chat, fence).await {
                Ok(()) => return Accepted::Yes,
                Err(botfleet_store::StoreError::StaleFence { .. }) => return Accepted::Superseded,
                Err(e) => {
                    warn!(bot = %spec.id, error = %e, "cannot record a taken-over turn; retrying");
                    tokio::time::sleep(backoff(attempt).min(Duration::from_secs(2))).await;
                    attempt += 1;
                }
            }
        }
    }

    /// Runs the coordinator call `op` until it answers, while this registration lasts
    /// (`None` once it ended: what was asked is others' to take over then).
    async fn while_registered<T, F, Fut>(
        &self,
        what: &'static str,
        grant: &Grant,
        mut op: F,
    ) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = botfleet_coord::Result<T>>,
    {
        let mut attempt = 0;
        loop {
            // Checked just before the call: it acts for the registration current as it starts.
            if !self.same_registration(grant) {
                return None;
            }
            match op().await {
                Ok(t) => return Some(t),
                Err(e) => {
                    debug!(error = %e, "{what}: turn queue unavailable; retrying");
                    tokio::time::sleep(backoff(attempt).min(Duration::from_secs(2))).await;
                    attempt += 1;
                }
            }
        }
    }

    /// Takes a ticket for `key` (idempotent per entry), through coordinator failures, while
    /// this registration lasts.
    async fn take(&self, ck: &str, key: &str, grant: &Grant) -> Option<(u64, Turn)> {
        self.while_registered("take a ticket", grant, || {
            self.inner.coord.turn_take(ck, key)
        })
        .await
    }

    /// Asks for `ticket`'s turn again, through coordinator failures, while this registration
    /// lasts.
    async fn try_again(&self, ck: &str, ticket: u64, grant: &Grant) -> Option<Turn> {
        self.while_registered("ask for a turn", grant, || {
            self.inner.coord.turn_try(ck, ticket)
        })
        .await
    }

    /// Waits until this worker may act again under the same registration: true then; false
    /// when the registration ended or changed, or the worker is leaving (its turns are then
    /// taken over by others).
    async fn recover(&self, grant: &Grant) -> bool {
        loop {
            if self.closed() || !self.same_registration(grant) || grant.revoked() {
                return false;
            }
            if grant.safe() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Ends the turn, through coordinator failures, while this registration lasts (a turn
    /// left held by a live worker would hold its chat up). False when it could not.
    async fn release(&self, ck: &str, ticket: u64, fence: Fence, grant: &Grant) -> bool {
        self.while_registered("release a turn", grant, || {
            self.inner.coord.turn_release(ck, ticket, fence)
        })
        .await
        .is_some()
    }

    /// What the turns of `spec`'s bot (under the spec changed at `spec_at`) share here.
    fn turn_ctx(&self, spec: &Arc<BotSpec>, spec_at: Option<i64>) -> TurnCtx {
        TurnCtx::new(
            spec,
            spec_at,
            self.sender_of(spec).map_err(|e| e.to_string()),
            Handler::new(
                spec.handler.clone(),
                self.inner.http.clone(),
                spec.handler_timeout(self.inner.settings.handler_timeout),
                &self.inner.settings.handlers,
            ),
            TurnBase {
                store: self.inner.store.clone(),
                metrics: self.inner.metrics.clone(),
                reporter: self.inner.reporter.clone(),
                worker: self.worker_name(),
                retry_for: self.inner.settings.retry_for,
                slots: self.inner.settings.slots.clone(),
                files: self.inner.settings.files.clone(),
                later: self.inner.settings.later.clone(),
                pace: self.inner.settings.pace.clone(),
            },
        )
    }

    /// Arms the deadline of each event just journaled that has one: at it, the event is
    /// acknowledged unless its turn here answered it first.
    fn arm(&self, spec: &Arc<BotSpec>, fresh: &[&botfleet_platform::Received], arrived: Instant) {
        // Only an event the platform waits on has a deadline: most deliveries have none, and
        // cost nothing more here.
        if !fresh.iter().any(|m| m.message.answer_handle.is_some()) {
            return;
        }
        let Ok(sender) = self.sender_of(spec) else {
            return;
        };
        for m in fresh {
            let Some(after) = sender.defer_after(&m.message) else {
                continue;
            };
            let armed = Armed::new(m.message.clone(), arrived + after);
            let mark = (spec.id.clone(), m.key.clone());
            lock(&self.inner.armed).insert(mark.clone(), armed.clone());
            let (h, spec) = (self.clone(), spec.clone());
            tokio::spawn(async move {
                tokio::time::sleep_until(armed.at.into()).await;
                if !lock(&h.inner.armed).contains_key(&mark) {
                    return; // its turn here ended first
                }
                let ctx = h.turn_ctx(&spec, h.spec_at(&spec));
                armed.expire(&ctx, &h).await;
                lock(&h.inner.armed).remove(&mark);
            });
        }
    }

    /// This worker's id, for status reports (empty before it registered).
    fn worker_name(&self) -> Arc<str> {
        self.lease()
            .map_or_else(|| Arc::from(""), |l| Arc::from(l.worker().to_string()))
    }

    /// The worker's incarnation in coordination group `g`, if registered: what its calls of
    /// that group act for.
    fn incarnation_in(&self, g: Group) -> Option<Incarnation> {
        self.inner.coord.registration_in(g).map(|(_, inc)| inc)
    }

    /// What a call for the chat `ck` made now acts for (see [`Grant`]): its group's part of
    /// the lease, then the worker's incarnation there.
    fn grant(&self, ck: &str) -> Grant {
        let group = self.inner.coord.group_of_chat(ck);
        let lease = self.lease().map(|l| l.in_group(group));
        let inc = self.incarnation_in(group);
        Grant { group, lease, inc }
    }

    /// Takes a ticket for `key` in the chat `ck`: the answer, and what it was granted as
    /// (read just before the call, which acts for the registration current as it starts).
    async fn take_now(&self, ck: &str, key: &str) -> (Grant, botfleet_coord::Result<(u64, Turn)>) {
        let grant = self.grant(ck);
        (grant, self.inner.coord.turn_take(ck, key).await)
    }

    /// The turn-queue ask `call` as `grant`; [`Turn::NotLive`] without asking once the worker
    /// registered again in its group (checked just before the call, which acts for the
    /// registration current as it starts).
    async fn try_as(
        &self,
        grant: &Grant,
        call: impl std::future::Future<Output = botfleet_coord::Result<Turn>>,
    ) -> botfleet_coord::Result<Turn> {
        if self.same_registration(grant) {
            call.await
        } else {
            Ok(Turn::NotLive)
        }
    }

    /// Whether the worker is still registered in `grant`'s group as it was then (and not past
    /// its leave).
    fn same_registration(&self, grant: &Grant) -> bool {
        grant.inc.is_some() && self.incarnation_in(grant.group) == grant.inc
    }

    /// Whether the worker registered again in `grant`'s group since (it has another
    /// incarnation there now): what was granted is others' to take over.
    fn registered_again(&self, grant: &Grant) -> bool {
        self.incarnation_in(grant.group)
            .is_some_and(|now| grant.inc.as_ref() != Some(&now))
    }

    /// Handles the journaled entry `key` under the turn's `fence`, granted as `grant`: handler
    /// with the chat's state, send (unless the outbox has it), then outbox, state and entry end
    /// at once. A turn held open for an answer that comes later is handed
    /// back as data when `park` (for the lot), else held here until it ends.
    #[allow(clippy::too_many_arguments)]
    async fn handle(
        &self,
        spec: &Arc<BotSpec>,
        chat: &str,
        key: &str,
        fence: Fence,
        grant: &Grant,
        arrived: Option<Instant>,
        preload: Option<TurnView>,
        park: bool,
    ) -> Handled {
        let _busy = self.busy();
        if self.closed() {
            // Leaving: this turn is taken over once the worker unregisters.
            return Handled::Fenced;
        }
        self.handle_inner(spec, chat, key, fence, grant, arrived, preload, park)
            .await
    }

    /// The entry `key` of `bot` is over: the deadline armed for its event on receipt (`armed`,
    /// if one was) has nothing left to do.
    fn disarm(&self, bot: &BotId, key: &str, armed: Option<Arc<Armed>>) {
        if let Some(a) = armed {
            a.disarm();
            lock(&self.inner.armed).remove(&(bot.clone(), key.to_owned()));
        }
    }

    /// Counts a turn being handled here (a worker leaves once none is) while it lives.
    fn busy(&self) -> Busy<'_> {
        self.inner
            .handling
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Busy(&self.inner)
    }

    #[allow(clippy::too_many_arguments)]
    async fn handle_inner(
        &self,
        spec: &Arc<BotSpec>,
        chat: &str,
        key: &str,
        fence: Fence,
        grant: &Grant,
        arrived: Option<Instant>,
        preload: Option<TurnView>,
        park: bool,
    ) -> Handled {
        let spec_at = self.spec_at(spec);
        if lock(&self.inner.refused).get(&spec.id) == Some(&spec_at) {
            // Refused under this very spec: no handler is called until it changes.
            return Handled::Refused;
        }
        let ctx = self.turn_ctx(spec, spec_at);
        let mark = (spec.id.clone(), key.to_owned());
        let armed = lock(&self.inner.armed).get(&mark).cloned();
        let job = turn::Job {
            key,
            chat,
            fence: TurnFence::Chat(fence),
            view: preload,
            arrived,
            slot: None,
            armed: armed.clone(),
        };
        let hold = TurnHold {
            hooks: self,
            grant,
            parks: park.then_some(&self.inner.posted),
        };
        let r = if park {
            turn::run_or_park(&ctx, &hold, job).await
        } else {
            turn::run(&ctx, &hold, job).await.map(|()| None)
        };
        if let Ok(Some(turn)) = r {
            // Its deadline stays armed while it is held.
            let due = turn.due(&ctx);
            return Handled::Held(turn, due, spec_at);
        }
        if let Ok(None) = r {
            self.disarm(&spec.id, key, armed);
        }
        match r {
            Ok(_) => {
                // Answered under a newer spec than the one refused: nothing is held any more.
                lock(&self.inner.refused).remove(&spec.id);
                Handled::Done
            }
            // The bot was reported failed: its entry stays pending, its chat's turn held.
            Err(Halt::Failed(_)) => {
                lock(&self.inner.refused).insert(spec.id.clone(), spec_at);
                Handled::Refused
            }
            Err(Halt::Stopped | Halt::Fenced(_)) => Handled::Fenced,
        }
    }
}

/// A ticket just taken: its number, its turn as first answered, and what it was granted as
/// (which alone may act on it).
struct Taken {
    ticket: u64,
    turn: Turn,
    grant: Grant,
}

/// What a chat's turn calls act for, read just before the first of them: the chat's
/// coordination group, this worker's part of the lease there, then its incarnation there (the
/// handle first: a group joined again in between leaves a handle that is revoked, never one
/// that passes for the new incarnation's grants). What is granted may be acted on only while
/// that part is safe and the incarnation is still the group's; once the group is joined again,
/// or the worker registers again, its turns are others' to take over.
#[derive(Clone, Debug)]
pub(super) struct Grant {
    group: Group,
    lease: Option<LeaseHandle>,
    inc: Option<Incarnation>,
}

impl Grant {
    /// Whether its part of the lease is safe to act on now.
    fn safe(&self) -> bool {
        self.lease.as_ref().is_some_and(|l| l.check().is_ok())
    }

    /// Whether its part of the lease is revoked for good (the liveness it was granted under
    /// is gone, or its group was joined again): it is never safe again.
    fn revoked(&self) -> bool {
        self.lease
            .as_ref()
            .is_some_and(|l| l.check() == Err(LeaseLost::Revoked))
    }
}

/// A turn's hold here: this worker may act for it while its chat's group's part of the lease
/// is safe, under the registration the turn was granted to. A worker whose liveness was lost
/// (a failover that lost its renewals) registers again at once (or joins the group again);
/// the turns of its earlier registration are then taken over by others, so a task still
/// running one of them must act on nothing, even though the new registration's lease is safe.
struct TurnHold<'a> {
    hooks: &'a Hooks,
    grant: &'a Grant,
    /// Where the wake-ups of a turn held open go when it is kept as data (the lot's).
    parks: Option<&'a Arc<Posted>>,
}

/// A turn counted as being handled here.
struct Busy<'a>(&'a Inner);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        if self
            .0
            .handling
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst)
            == 1
        {
            self.0.idle.notify_waiters();
        }
    }
}

impl Hold for TurnHold<'_> {
    fn check(&self) -> Result<(), Halt> {
        if self.hooks.closed() {
            return Err(Halt::Stopped);
        }
        if !self.grant.safe() {
            return Err(Halt::Fenced(
                "this worker's lease is not safe in the chat's coordination group".into(),
            ));
        }
        if self.hooks.same_registration(self.grant) {
            Ok(())
        } else {
            Err(Halt::Fenced(
                "this worker registered again since the turn was granted".into(),
            ))
        }
    }

    fn stop(&self) -> watch::Receiver<bool> {
        self.hooks.stop()
    }

    fn parks(&self) -> Option<&Arc<Posted>> {
        self.parks
    }

    /// Once the turn's part of the lease is revoked, or the worker registered again: the
    /// turn was the earlier registration's.
    fn gone(&self) -> impl std::future::Future<Output = ()> + Send {
        let mut lease = self.hooks.inner.lease.clone();
        async move {
            let revoked = async {
                match &self.grant.lease {
                    Some(l) => l.revoked().await,
                    None => std::future::pending().await,
                }
            };
            let again = async {
                loop {
                    lease.borrow_and_update();
                    if self.hooks.registered_again(self.grant) {
                        return;
                    }
                    if lease.changed().await.is_err() {
                        return std::future::pending().await;
                    }
                }
            };
            tokio::select! {
                () = revoked => {}
                () = again => {}
            }
        }
    }
}

impl Hold for Hooks {
    fn check(&self) -> Result<(), Halt> {
        if self.closed() {
            return Err(Halt::Stopped);
        }
        if self.may_act() {
            Ok(())
        } else {
            Err(Halt::Fenced("this worker's lease is not safe".into()))
        }
    }

    fn stop(&self) -> watch::Receiver<bool> {
        self.inner.closed.subscribe()
    }
}

/// The coordinator's key of a chat: `{bot}/{chat}`, or `{bot}/h:{hash}` when the chat id
/// has characters keys may not hold (or is long).
pub(crate) fn chat_key(bot: &BotId, chat: &str) -> String {
    let plain = !chat.is_empty()
        && chat.len() <= 150
        && chat
            .chars()
            .all(|c| !(c.is_whitespace() || c.is_control() || c == '{' || c == '}'));
    if plain {
        return format!("{}/{chat}", bot.as_str());
    }
    use sha2::Digest;
    let d = sha2::Sha256::digest(chat.as_bytes());
    let hex: String = d.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("{}/h:{hex}", bot.as_str())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

async fn hook(
    State(h): State<Hooks>,
    Path((platform, bot)): Path<(String, String)>,
    method: Method,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let arrived = Instant::now();
    let not_found = |what: &str| (StatusCode::NOT_FOUND, format!("{what}\n")).into_response();
    let Ok(p) = platform.parse::<Platform>() else {
        return not_found("unknown platform");
    };
    let Some(wh) = h.inner.webhooks.get(&p).cloned() else {
        return not_found("this build takes no webhooks for the platform");
    };
    let Ok(id) = BotId::new(bot) else {
        return not_found("no such bot");
    };
    let spec = match h.spec_of(&id).await {
        Ok(Some(s)) if s.platform == p && crate::is_webhook(&s) => s,
        Ok(_) => return not_found("no webhook bot of this platform with this id"),
        Err(e) => {
            warn!(error = %e, "cannot read the registry for a webhook; answering 503");
            h.inner.metrics.count(HOOKS_UNAVAILABLE_TOTAL, p, 1);
            return (StatusCode::SERVICE_UNAVAILABLE, "registry unavailable\n").into_response();
        }
    };
    let headers: Vec<(String, String)> = headers
        .iter()
        .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
        .collect();
    let req = HookRequest {
        method: method.as_str(),
        headers: &headers,
        query: query.as_deref().unwrap_or(""),
        body: &body,
    };
    match wh.receive(&spec, &req) {
        Err(refusal) => {
            h.inner.metrics.count(HOOKS_REFUSED_TOTAL, p, 1);
            debug!(bot = %spec.id, reason = refusal.reason, "webhook request refused");
            let status = StatusCode::from_u16(refusal.status).unwrap_or(StatusCode::UNAUTHORIZED);
            (status, format!("{}\n", refusal.reason)).into_response()
        }
        Ok(HookAnswer::Respond {
            status,
            content_type,
            body,
        }) => (
            StatusCode::from_u16(status).unwrap_or(StatusCode::OK),
            [("content-type", content_type)],
            body,
        )
            .into_response(),
        Ok(HookAnswer::Deliver {
            messages,
            seen,
            ignored: _,
            malformed,
        }) => {
            if malformed > 0 {
                h.inner.metrics.platform_error(p, "malformed_update");
            }
            if !seen.is_empty() {
                // Before the answer: a reply window the user renewed is not forgotten (the
                // platform delivers again what was not answered 200).
                if let Err(e) = h.inner.store.chat_seen(&spec.id, &seen).await {
                    warn!(bot = %spec.id, error = %e, "cannot record when users last wrote; answering 503");
                    h.inner.metrics.count(HOOKS_UNAVAILABLE_TOTAL, p, 1);
                    return (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "store unavailable; retry\n",
                    )
                        .into_response();
                }
            }
            if messages.is_empty() {
                return StatusCode::OK.into_response();
            }
            if !spec.enabled {
                // Not taken: the platform keeps it and retries.
                return (StatusCode::SERVICE_UNAVAILABLE, "bot disabled\n").into_response();
            }
            if !h.live() || h.draining() {
                h.inner.metrics.count(HOOKS_UNAVAILABLE_TOTAL, p, 1);
                return (StatusCode::SERVICE_UNAVAILABLE, "worker not live; retry\n")
                    .into_response();
            }
            // In a task of its own: a platform that hangs up mid-request must not cut a
            // delivery between its ticket and the task that serves it.
            let task = tokio::spawn(async move { h.deliver(spec, messages, arrived).await });
            task.await
                .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_keys_are_valid_coordinator_keys() {
        let bot = BotId::new("b1").unwrap();
        assert_eq!(chat_key(&bot, "-100123"), "b1/-100123");
        for odd in ["a b", "{x}", "", &"x".repeat(400), "tab\there"] {
            let k = chat_key(&bot, odd);
            assert!(k.starts_with("b1/h:"), "{k}");
            assert!(k.len() < 200);
        }
        assert_ne!(chat_key(&bot, "a b"), chat_key(&bot, "a  b"));
    }
}
