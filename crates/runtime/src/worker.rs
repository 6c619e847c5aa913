//! The worker: keeps its lease, claims its share of the ring, runs those bots, hands them over
//! when the ring changes, and drains on shutdown.
//!
//! One control loop owns the worker's state and never waits on its own bots: claims, stops and
//! hand-overs run as background jobs that report back through an unbounded channel, and a bot
//! task's exit notice never waits either. So a pass that moves ten thousand bots takes as long
//! as computing the plan, and a SIGTERM, a command or a member change arriving meanwhile is
//! seen on the next turn of the loop.

mod converge;

use std::{
    collections::{HashMap, HashSet},
    future::Future,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use botfleet_coord::{
    CoordError, Coordinator, EpochInfo, EventCursor, Group, LeaseHandle, LeaseKeeper, LeaseLost,
    LifecycleEvent, MemberWatch, WorkerCommand, WorkerMeta,
};
use botfleet_core::{BotId, BotRecord, Clock, Fence, Platform, SystemClock, WorkerId};
use botfleet_platform::Connector;
use botfleet_store::{BotFilter, Store, StoreError};
use tokio::{
    sync::{mpsc, watch, Semaphore},
    task::{JoinHandle, JoinSet},
    time::Instant,
};
use tracing::{debug, info, warn};

use crate::{
    bot::BotExit, metrics::Metrics, reporter::Reporter, starter::Starter, Journal, WorkerConfig,
    JOURNAL_CAPACITY,
};
use converge::{After, ClaimResult};

/// Why a worker could not run.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// Coordination failed in a way retrying does not fix.
    #[error(transparent)]
    Coord(#[from] CoordError),
    /// The store failed in a way retrying does not fix.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The Telegram client could not be built.
    #[error(transparent)]
    Telegram(#[from] botfleet_telegram::TelegramError),
    /// A platform's client could not be built (the platform's error is the source).
    #[error("platform client: {0}")]
    Platform(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The worker's own HTTP client (handlers' webhooks) could not be built.
    #[error("HTTP client: {0}")]
    Http(#[source] reqwest::Error),
}

/// How often finished inbox entries are pruned.
const INBOX_PRUNE_EVERY: Duration = Duration::from_secs(60);

/// Something that makes the worker look at its state again. Every sender is unbounded and
/// never waits: the loop that reads them is the one that waits for nothing.
#[derive(Debug)]
enum Signal {
    Members,
    Command(WorkerCommand),
    Event(LifecycleEvent),
    /// A bot task ended by itself (failed, fenced) or was stopped.
    Exited(BotId, Fence, BotExit),
    /// A claim job answered for one bot; the claim was made under this part of the lease
    /// (the bot's group's).
    Claimed(BotId, ClaimResult, LeaseHandle),
    /// A let-go job finished: the bot's task has ended and its claim is dealt with.
    LetGo(BotId),
    /// The fleet was told to keep this bot off this worker: let it go now.
    Avoided(BotId),
}

struct Running {
    fence: Fence,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    /// Failed (e.g. 401): the claim is kept so no other worker retries it, but nothing runs.
    parked: bool,
}

/// A worker process's engine. Build with [`Worker::new`], run with [`Worker::run`].
pub struct Worker {
    cfg: WorkerConfig,
    coord: Arc<dyn Coordinator>,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    connectors: HashMap<Platform, Arc<dyn Connector>>,
    http: reqwest::Client,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    journal: Arc<Journal>,
    /// The current registration's lease, for the hooks address.
    lease_tx: watch::Sender<Option<LeaseHandle>>,
    /// The mailboxes of the bot tasks here, for entries journaled elsewhere.
    mailboxes: Arc<crate::sends::Mailboxes>,
    /// The webhook side, when asked for (its background work runs with the worker).
    hooks: Option<crate::Hooks>,
    /// Status reports of every bot here, unit holders' and webhook turns' alike.
    reporter: Reporter,
    /// The reports' queue, written to the store from [`Worker::run`] on.
    reports: Option<crate::reporter::Reports>,
    /// The turn slots every bot's turns share, whatever their transport.
    slots: crate::turn::Slots,
    /// File links: signed for every event's attachments, served by [`Worker::files`].
    files: crate::Files,
    /// Answers that come later: the reply-token key and the held turns' time to live.
    later: crate::later::Later,
    /// The fleet's send buckets (the platforms' rate limits).
    pace: crate::pace::Pace,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("worker_id", &self.cfg.worker_id)
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// A worker on `coord` and `store`.
    ///
    /// # Errors
    /// When the HTTP clients cannot be built.
    pub fn new(
        cfg: WorkerConfig,
        coord: Arc<dyn Coordinator>,
        store: Arc<dyn Store>,
    ) -> Result<Self, WorkerError> {
        let connectors = crate::platforms::connectors(&cfg, &coord)?;
        let http = reqwest::Client::builder()
            .build()
            .map_err(|e| WorkerError::Http(e.without_url()))?;
        let metrics = Arc::new(Metrics::default());
        metrics.set_capacity(cfg.capacity);
        let journal = Journal::new(JOURNAL_CAPACITY);
        let (reporter, reports) = Reporter::new();
        let slots = crate::turn::Slots::new(cfg.turn_slots);
        let files = crate::Files::new(
            store.clone(),
            connectors.clone(),
            http.clone(),
            metrics.clone(),
            cfg.api_public_url.clone(),
            cfg.file_link_ttl,
        );
        let later = crate::later::Later::new(store.clone(), cfg.async_reply_ttl);
        let pace = crate::pace::Pace::new(coord.clone(), cfg.rate_limits.clone());
        Ok(Self {
            cfg,
            coord,
            store,
            clock: Arc::new(SystemClock::new()),
            connectors,
            http,
            metrics,
            ready: Arc::new(AtomicBool::new(false)),
            journal,
            lease_tx: watch::Sender::new(None),
            mailboxes: Arc::default(),
            hooks: None,
            reporter,
            reports: Some(reports),
            slots,
            files,
            later,
            pace,
        })
    }

    /// The fleet's file links on this worker: serve [`Files::router`](crate::Files::router)
    /// on the address `api_public_url` names (the CLI serves it on `--http-addr`, beside the
    /// control API).
    pub fn files(&self) -> crate::Files {
        self.files.clone()
    }

    /// Answers that come later through this worker (`POST /api/v1/replies/{reply_token}`):
    /// serve [`Replies::router`](crate::Replies::router) beside the API.
    pub fn replies(&self) -> crate::Replies {
        crate::Replies::new(self.later.clone())
    }

    /// The worker's webhook side: serve [`Hooks::router`](crate::Hooks::router) on the hooks
    /// address. Its background work (turn wake-ups, the sweeper of lost turns) runs while
    /// [`Worker::run`] does.
    pub fn hooks(&mut self) -> crate::Hooks {
        if let Some(h) = &self.hooks {
            return h.clone();
        }
        let webhooks = self
            .connectors
            .values()
            .filter_map(|c| c.webhooks().map(|w| (c.platform(), w)))
            .collect();
        let h = crate::Hooks::new(
            self.coord.clone(),
            self.store.clone(),
            webhooks,
            self.metrics.clone(),
            self.lease_tx.subscribe(),
            self.http.clone(),
            crate::hooks::HookSettings {
                lease: self.cfg.lease,
                turn_wait: self.cfg.turn_wait,
                handler_timeout: self.cfg.handler_timeout,
                handlers: self.cfg.handlers.clone(),
                retry_for: self.cfg.handler_retry_for,
                slots: self.slots.clone(),
                files: self.files.clone(),
                later: self.later.clone(),
                pace: self.pace.clone(),
            },
            self.reporter.clone(),
        );
        self.hooks = Some(h.clone());
        h
    }

    /// Sends from the backend through this worker (`POST /api/v1/bots/{id}/messages`): each
    /// journaled and run in its chat's turn, wherever the fleet holds that. Makes the
    /// webhook side ([`Worker::hooks`]) if it was not made yet: a webhook bot's send takes
    /// its chat's turn here.
    pub fn sends(&mut self) -> crate::Sends {
        let hooks = self.hooks();
        crate::Sends::new(
            self.cfg.worker_id.clone(),
            self.store.clone(),
            self.coord.clone(),
            self.connectors.clone(),
            Some(hooks),
            self.mailboxes.clone(),
        )
    }

    /// The worker's metrics (for `/metrics` and reports).
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// What this worker saw happen (bots started, moved, failed; workers joining and
    /// leaving), for the control API and the live page.
    pub fn journal(&self) -> Arc<Journal> {
        self.journal.clone()
    }

    /// Records into `journal` instead of a journal of its own (workers of one process
    /// sharing one, as the demo's do).
    #[must_use]
    pub fn with_journal(mut self, journal: Arc<Journal>) -> Self {
        self.journal = journal;
        self
    }

    /// True once the first claim pass is done; false while draining.
    pub fn readiness(&self) -> Arc<AtomicBool> {
        self.ready.clone()
    }

    /// Runs until `shutdown` resolves, then hands every bot over and unregisters.
    ///
    /// # Errors
    /// Only for failures that retrying cannot fix; a Redis or database that goes away for a
    /// while is waited out.
    pub async fn run(
        mut self,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), WorkerError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let cfg = self.cfg.clone();
        let starter = Starter::spawn(self.coord.clone(), move |p| cfg.connect_rate_of(p));
        if let Some(reports) = self.reports.take() {
            tokio::spawn(reports.write(self.store.clone()));
        }
        let hooks_task = self.hooks.clone().map(|h| tokio::spawn(h.background()));
        let state = State {
            w: self,
            tx,
            starter,
            running: HashMap::new(),
            claiming: HashSet::new(),
            stopping: HashSet::new(),
            held_by: HashMap::new(),
            registry: HashMap::new(),
            takes: HashSet::new(),
            leaving: HashSet::new(),
            members_seen: None,
            avoid: Vec::new(),
            heavy: false,
            avoid_pending: HashSet::new(),
            cold_start: Some((Instant::now(), Instant::now())),
            last_scan: Instant::now(),
            plan: converge::Plan::default(),
            jobs: JoinSet::new(),
            coord_slots: Arc::new(Semaphore::new(converge::COORD_CONCURRENCY)),
            lease: None,
            keeper: None,
            rejoined: 0,
            fenced: false,
            draining: false,
            registry_stale: false,
            stamp: None,
            generation: 0,
            short: 0,
            grace_wake: None,
            event_reader: None,
        };
        let r = state.run(rx, shutdown).await;
        if let Some(t) = hooks_task {
            t.abort();
        }
        r
    }
}

struct State {
    w: Worker,
    /// Where background jobs and bot tasks report.
    tx: mpsc::UnboundedSender<Signal>,
    starter: Starter,
    running: HashMap<BotId, Running>,
    /// Bots with a claim in flight.
    claiming: HashSet<BotId>,
    /// Bots being stopped (and handed over or released) by a let-go job.
    stopping: HashSet<BotId>,
    /// Bots of our share another live worker held at our last claim, and when it answered:
    /// not asked for again until that worker hands them over, the members change, or a lease
    /// passed (a hand-over whose Take never came is found then).
    held_by: HashMap<BotId, (WorkerId, Instant)>,
    registry: HashMap<BotId, BotRecord>,
    /// Bots handed to us that we have not claimed yet.
    takes: HashSet<BotId>,
    /// Live workers that said they are shutting down: placed as if gone already, so the bots
    /// they hand over are ours by our own plan too (and are not passed back to them).
    leaving: HashSet<WorkerId>,
    /// (unit, worker) pairs placement keeps apart: a transport that was down there.
    avoid: Vec<(BotId, WorkerId)>,
    /// Whether some unit weighs more than one connection (a Discord bot or slice).
    heavy: bool,
    /// Units this worker is marking as avoided (until the coordinator lists them).
    avoid_pending: HashSet<BotId>,
    /// The live workers at the last pass (for the journal's joins and leaves).
    members_seen: Option<HashSet<WorkerId>>,
    /// Until the first share is all running: when the worker started, and the last progress
    /// line.
    cold_start: Option<(Instant, Instant)>,
    /// When a pass last walked every running bot for ones that are no longer ours.
    last_scan: Instant,
    plan: converge::Plan,
    /// Claim and let-go jobs (each owned here; drained before exit).
    jobs: JoinSet<()>,
    /// Bounds the coordinator calls the jobs make at once.
    coord_slots: Arc<Semaphore>,
    lease: Option<LeaseHandle>,
    keeper: Option<LeaseKeeper>,
    /// The lease's [`LeaseHandle::groups_rejoined`] last seen.
    rejoined: u64,
    /// Bots were stopped because the lease was unsafe; waiting for it to be good again.
    fenced: bool,
    /// Shutting down: nothing is started any more.
    draining: bool,
    /// A lifecycle event arrived: re-read the registry before the next pass.
    registry_stale: bool,
    /// The registry stamp of the last full read.
    stamp: Option<(u64, i64)>,
    /// Bumped whenever the registry read changed.
    generation: u64,
    /// Claims of our share that were not granted since the last pass (held, grace, failed).
    short: usize,
    /// When a grace window after a coordinator data loss ends: pass again then.
    grace_wake: Option<Instant>,
    /// The task that forwards lifecycle events (restarted with a fresh cursor on every
    /// registration).
    event_reader: Option<JoinHandle<()>>,
}

fn me_meta(cfg: &WorkerConfig) -> WorkerMeta {
    WorkerMeta {
        host: cfg.host.clone(),
        capacity: cfg.capacity,
        started_at_ms: botfleet_core::unix_ms(),
        bots_held: 0,
        rss_bytes: 0,
    }
}

/// Forwards coordinator reads to the loop until the loop is gone.
fn spawn_forwarders(
    coord: &Arc<dyn Coordinator>,
    lease: Duration,
    tx: &mpsc::UnboundedSender<Signal>,
) -> [JoinHandle<()>; 2] {
    let mut members = MemberWatch::spawn(coord.clone(), lease / 3);
    let members_tx = tx.clone();
    let member_task = tokio::spawn(async move {
        while members.recv().await.is_some() {
            if members_tx.send(Signal::Members).is_err() {
                return;
            }
        }
    });
    let (coord, cmd_tx) = (coord.clone(), tx.clone());
    let command_task = tokio::spawn(async move {
        loop {
            match coord.recv_commands(1_000, Duration::from_secs(5)).await {
                Ok(cmds) => {
                    for c in cmds {
                        if cmd_tx.send(Signal::Command(c)).is_err() {
                            return;
                        }
                    }
                }
                Err(e) => {
                    debug!(error = %e, "reading commands failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    });
    [member_task, command_task]
}

/// Forwards lifecycle events after `cursor` to the loop.
fn spawn_event_reader(
    coord: Arc<dyn Coordinator>,
    mut cursor: EventCursor,
    tx: mpsc::UnboundedSender<Signal>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            match coord
                .read_events(&cursor, 1_000, Duration::from_secs(5))
                .await
            {
                Ok(evs) => {
                    for (c, e) in evs {
                        cursor = c;
                        if tx.send(Signal::Event(e)).is_err() {
                            return;
                        }
                    }
                }
                Err(e) => {
                    debug!(error = %e, "reading events failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    })
}

impl State {
    fn me(&self) -> &WorkerId {
        &self.w.cfg.worker_id
    }

    /// Registers (again), retrying while the coordinator is unreachable; then reads events
    /// from the stream's head and the whole registry afresh. Events and commands published
    /// while this worker was away (or that a coordinator lost with its data) are covered by
    /// the registry read: it is the truth the events only hint at.
    ///
    /// # Errors
    /// On the `first` registration, a fleet whose coordination groups are not this worker's
    /// ([`CoordError::GroupsMismatch`]): the worker does not start. Later (this worker's
    /// liveness lost, and meanwhile the fleet restarted with another number) it keeps trying,
    /// saying why.
    async fn start_keeper(&mut self, first: bool) -> Result<(), WorkerError> {
        let mut attempt = 0u32;
        loop {
            // With more than one coordination group, each group's part of the lease stands
            // alone: one group late or lost fences only its own bots and chats.
            match LeaseKeeper::start_with(
                self.w.coord.clone(),
                self.w.clock.clone(),
                self.me().clone(),
                me_meta(&self.w.cfg),
                self.w.cfg.lease,
                self.groups_apart(),
            )
            .await
            {
                Ok(k) => {
                    info!(worker = %self.me(), incarnation = %k.handle().incarnation(), "registered");
                    self.w.metrics.registered();
                    self.lease = Some(k.handle());
                    self.rejoined = 0;
                    self.w.lease_tx.send_replace(Some(k.handle()));
                    self.keeper = Some(k);
                    self.fenced = false;
                    break;
                }
                Err(e @ CoordError::GroupsMismatch { .. }) if first => return Err(e.into()),
                Err(e) => {
                    warn!(worker = %self.me(), error = %e, "cannot register; retrying");
                    tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt.min(10) + 1)))
                        .await;
                    attempt += 1;
                }
            }
        }
        // Take the event cursor before the next claim pass: nothing published during the pass
        // is missed, nothing older is replayed.
        let cursor = loop {
            match self.w.coord.events_head().await {
                Ok(c) => break c,
                Err(e) => {
                    warn!(error = %e, "cannot read the event stream head; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        };
        if let Some(old) = self.event_reader.take() {
            old.abort();
        }
        self.event_reader = Some(spawn_event_reader(
            self.w.coord.clone(),
            cursor,
            self.tx.clone(),
        ));
        self.stamp = None;
        self.registry_stale = true;
        self.held_by.clear();
        self.check_grace().await;
        Ok(())
    }

    /// Reads the fleet's grace window (after a coordinator data loss) into the metrics, and
    /// plans a pass for when it ends.
    async fn check_grace(&mut self) {
        let each = match self.w.coord.group_epochs().await {
            Ok(each) => each,
            Err(e) => {
                debug!(error = %e, "cannot read the fleet epoch");
                return;
            }
        };
        let graces: Vec<_> = each.iter().map(|(g, e)| (*g, e.grace_left)).collect();
        self.w.metrics.set_group_graces(&graces);
        match EpochInfo::combine(each.into_iter().map(|(_, e)| e)) {
            Some(e) if !e.grace_left.is_zero() => {
                let groups: Vec<String> = graces
                    .iter()
                    .filter(|(_, left)| !left.is_zero())
                    .map(|(g, _)| g.to_string())
                    .collect();
                warn!(
                    left_ms = e.grace_left.as_millis() as u64,
                    groups = %groups.join(","),
                    "the coordinator lost its data: bots that had owners wait out the grace window"
                );
                self.w.metrics.set_grace(e.grace_left);
                self.wake_at(Instant::now() + e.grace_left);
            }
            _ => self.w.metrics.set_grace(Duration::ZERO),
        }
    }

    fn wake_at(&mut self, at: Instant) {
        self.grace_wake = Some(self.grace_wake.map_or(at, |w| w.min(at)));
    }

    /// Re-reads the registry. Running bots whose spec changed since (new token, URL, handler,
    /// or an operator's `bots restart`) are stopped; the next pass starts them again.
    async fn refresh_registry(&mut self) {
        // The stamp is one cheap query; the full read (thousands of rows) only on a change.
        match self.w.store.registry_stamp().await {
            Ok(s) if Some(s) == self.stamp => return,
            Ok(s) => self.stamp = Some(s),
            Err(e) => {
                warn!(error = %e, "cannot read the registry stamp; keeping the last registry");
                return;
            }
        }
        self.generation += 1;
        let bots = match self.w.store.list_bots(&BotFilter::default()).await {
            Ok(b) => b,
            Err(e) => {
                warn!(error = %e, "cannot read the bot registry; keeping the last one");
                self.stamp = None;
                return;
            }
        };
        // What the fleet places are units: a bot, or each slice of a Discord bot split into
        // slices (`bot#k`, its own spec naming its shards).
        let fresh: HashMap<BotId, BotRecord> = bots
            .into_iter()
            .flat_map(BotRecord::into_units)
            .map(|u| (u.spec.id.clone(), u))
            .collect();
        self.heavy = fresh.values().any(|r| r.spec.weight() > 1);
        let changed: Vec<BotId> = self
            .running
            .keys()
            .filter(|b| match (self.registry.get(*b), fresh.get(*b)) {
                (Some(old), Some(new)) => {
                    old.spec != new.spec || old.updated_at_ms != new.updated_at_ms
                }
                _ => false,
            })
            .cloned()
            .collect();
        // Removed while we run them: their platform set-up goes with them.
        let removed: Vec<BotRecord> = self
            .running
            .keys()
            .filter(|b| !fresh.contains_key(*b))
            .filter_map(|b| self.registry.get(b).cloned())
            .collect();
        for rec in removed {
            if let Some(c) = self.w.connectors.get(&rec.spec.platform).cloned() {
                tokio::spawn(async move {
                    match c.removed(&rec.spec).await {
                        Ok(()) => {
                            debug!(bot = %rec.spec.id, "removed bot's platform set-up undone")
                        }
                        Err(e) => {
                            warn!(bot = %rec.spec.id, error = %e, "cannot undo a removed bot's platform set-up")
                        }
                    }
                });
            }
        }
        self.registry = fresh;
        for bot in changed {
            info!(%bot, "spec changed; restarting");
            self.let_go(&bot, After::Release);
        }
    }

    async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<Signal>,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), WorkerError> {
        self.start_keeper(true).await?;
        let forwarders = spawn_forwarders(&self.w.coord, self.w.cfg.lease, &self.tx);
        let (journal_stop, journal_task) = spawn_journal_forwarder(
            self.w.coord.clone(),
            self.w.journal.clone(),
            self.me().to_string(),
        );
        let mut tick = tokio::time::interval(self.w.cfg.reconcile_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut refresh = tokio::time::interval(self.w.cfg.registry_refresh);
        refresh.tick().await;
        tokio::pin!(shutdown);
        let mut dirty = true;
        let mut check = false;
        let mut last_prune = Instant::now();
        loop {
            // A pass asked for while the lease is not safe waits until it is: bots that fenced
            // themselves (their own timer, before this loop noticed) come back then.
            let safe = self.lease.as_ref().is_some_and(|l| l.check().is_ok());
            if (dirty || check) && !self.fenced && safe {
                if std::mem::take(&mut self.registry_stale) {
                    self.refresh_registry().await;
                }
                self.reconcile(dirty).await;
                // A wake-up serves one time: bots held elsewhere at a later answer are due later.
                self.arm_held_retry();
                dirty = false;
                check = false;
                if !self.w.ready.swap(true, Ordering::SeqCst) {
                    info!(worker = %self.me(), claiming = self.claiming.len(), "first claim pass done; ready");
                }
            }
            // Finished jobs leave nothing to collect but their slot in the set.
            while self.jobs.try_join_next().is_some() {}
            let lease = self.lease.clone();
            let fenced = self.fenced;
            let grace_wake = self.grace_wake;
            tokio::select! {
                () = &mut shutdown => break,
                why = async { match lease.as_ref() { Some(l) if !fenced => l.lost().await, _ => std::future::pending().await } } => {
                    self.self_fence(&why);
                    if matches!(why, LeaseLost::Revoked | LeaseLost::Stopped) {
                        self.start_keeper(false).await?;
                        dirty = true;
                    }
                }
                Some(sig) = rx.recv() => {
                    dirty |= self.on_signal(sig);
                    // Take everything already queued before converging once: an import of a
                    // thousand bots is a thousand events, not a thousand registry reads.
                    while let Ok(sig) = rx.try_recv() {
                        dirty |= self.on_signal(sig);
                    }
                }
                () = async { match grace_wake { Some(at) => tokio::time::sleep_until(at).await, None => std::future::pending().await } } => {
                    self.grace_wake = None;
                    self.check_grace().await;
                    dirty = true;
                }
                _ = refresh.tick() => {
                    self.refresh_registry().await;
                    self.held_by.clear();
                    check = true;
                }
                _ = tick.tick() => {
                    if let Some(n) = self.lease.as_ref().map(LeaseHandle::groups_rejoined) {
                        if n != self.rejoined {
                            // A group joined again (it lost its data, or our liveness there):
                            // its grace window shows, and its bots are claimed again.
                            self.rejoined = n;
                            self.check_grace().await;
                            dirty = true;
                        }
                    }
                    self.cold_start_progress();
                    self.refresh_avoid().await;
                    for (p, c) in &self.w.connectors {
                        if let Some(n) = c.open_connections() {
                            self.w.metrics.set_connections(*p, n);
                        }
                        self.w.metrics.set_platform_stats(*p, c.stats());
                    }
                    if last_prune.elapsed() >= INBOX_PRUNE_EVERY {
                        last_prune = Instant::now();
                        self.prune_inbox();
                    }
                    if self.fenced {
                        match self.lease.as_ref().map(LeaseHandle::check) {
                            Some(Ok(())) => {
                                info!(worker = %self.me(), "lease is safe again; resuming");
                                self.fenced = false;
                            }
                            // Still unsure (the backend may be away): keep waiting.
                            Some(Err(LeaseLost::Expired(_))) => {}
                            // The liveness is gone for good (e.g. we were frozen past it, or
                            // the coordinator lost it): register again as a new incarnation,
                            // after stopping what the fence left running (the other groups'
                            // bots, with groups kept apart).
                            other => {
                                if !self.running.is_empty() {
                                    let why = other
                                        .and_then(Result::err)
                                        .unwrap_or(LeaseLost::Revoked);
                                    self.self_fence(&why);
                                }
                                self.start_keeper(false).await?;
                                dirty = true;
                            }
                        }
                    }
                    check = true;
                }
            }
        }
        self.drain(&mut rx).await;
        // The journal's last entries (the drain's hand-overs) reach the fleet before we go.
        let _ = journal_stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(1), journal_task).await;
        for t in forwarders {
            t.abort();
        }
        if let Some(t) = self.event_reader.take() {
            t.abort();
        }
        Ok(())
    }

    /// Forgets answered inbox entries after an hour (the platforms' own cursors guard older
    /// deliveries) and undeliverable ones after a week, in a job.
    fn prune_inbox(&mut self) {
        let store = self.w.store.clone();
        self.jobs.spawn(async move {
            let now = botfleet_core::unix_ms();
            match store
                .inbox_prune(now - 3_600_000, now - 7 * 24 * 3_600_000)
                .await
            {
                Ok(0) => {}
                Ok(n) => debug!(entries = n, "pruned the inbox"),
                Err(e) => debug!(error = %e, "could not prune the inbox"),
            }
        });
    }

    /// Whether each coordination group's part of the lease stands alone (more than one group).
    fn groups_apart(&self) -> bool {
        self.w.coord.groups() > 1
    }

    /// Stops every bot at once, keeping no claim: the lease may be gone. The stops run as
    /// jobs; a bot is not started again before its old task has ended. With the coordination
    /// groups kept apart, a lease only late (the roster's group not renewed in time) stops
    /// the roster group's bots alone: each other group's bots run on their own group's part of
    /// the lease, and fence themselves if it fails too. Passes wait until the lease is safe.
    fn self_fence(&mut self, why: &LeaseLost) {
        let apart = self.groups_apart() && matches!(why, LeaseLost::Expired(_));
        let stop: Vec<BotId> = self
            .running
            .keys()
            .filter(|b| !apart || self.w.coord.group_of_bot(b) == Group::ZERO)
            .cloned()
            .collect();
        if apart {
            warn!(worker = %self.me(), reason = %why, bots = stop.len(), "lease not safe in the roster's coordination group; stopping its bots (the other groups' run on)");
        } else {
            warn!(worker = %self.me(), reason = %why, bots = stop.len(), "lease not safe; stopping every bot");
        }
        self.w.metrics.self_fence();
        self.note("self_fenced", None, None, Some(&why.to_string()));
        self.fenced = true;
        for bot in stop {
            self.let_go(&bot, After::Keep);
        }
        self.held_by.clear();
        if let Some(l) = &self.lease {
            l.set_bots_held(u32::try_from(self.running.len()).unwrap_or(u32::MAX));
        }
    }

    /// While the worker's first share is starting: a progress line every 2 s, and one when
    /// every bot of it runs.
    fn cold_start_progress(&mut self) {
        let Some((since, last)) = self.cold_start else {
            return;
        };
        let share = self.plan_share();
        let running = self.running.len();
        if share > 0 && running >= share {
            info!(
                bots = running,
                seconds = format!("{:.1}", since.elapsed().as_secs_f64()),
                "cold start done: every bot of this worker's share runs"
            );
            self.cold_start = None;
        } else if last.elapsed() >= Duration::from_secs(2) && share > 0 {
            info!(
                share,
                running,
                claiming = self.claiming.len(),
                "cold start: starting this worker's share"
            );
            self.cold_start = Some((since, Instant::now()));
        }
    }

    /// Journals something this worker saw happen.
    fn note(
        &self,
        kind: &'static str,
        bot: Option<&str>,
        peer: Option<&str>,
        detail: Option<&str>,
    ) {
        self.w
            .journal
            .record(self.me().as_str(), kind, bot, peer, detail);
    }

    /// Handles one signal; answers whether placement should be looked at again.
    fn on_signal(&mut self, sig: Signal) -> bool {
        match sig {
            Signal::Members => {
                self.held_by.clear();
                true
            }
            Signal::Exited(bot, fence, exit) => {
                let Some(r) = self.running.get_mut(&bot).filter(|r| r.fence == fence) else {
                    return false;
                };
                match exit {
                    BotExit::Stopped => false,
                    BotExit::Failed(why) => {
                        debug!(%bot, why = %why, "bot parked");
                        r.parked = true;
                        self.note("bot_failed", Some(bot.as_str()), None, Some(&why));
                        false
                    }
                    BotExit::TransportDown(why) => {
                        self.note("transport_down", Some(bot.as_str()), None, Some(&why));
                        let me = self.me().clone();
                        self.avoid.push((bot.clone(), me.clone()));
                        self.avoid.sort();
                        self.avoid_pending.insert(bot.clone());
                        let (coord, tx, b, for_) = (
                            self.w.coord.clone(),
                            self.tx.clone(),
                            bot.clone(),
                            self.w.cfg.avoid_for,
                        );
                        // Mark it for the fleet, then let it go: the next pass places it
                        // on its next choice, here and on every other worker.
                        self.jobs.spawn(async move {
                            if let Err(e) = coord.avoid(&b, &me, for_).await {
                                warn!(bot = %b, error = %e, "could not tell the fleet to run the bot elsewhere");
                            }
                            let _ = tx.send(Signal::Avoided(b));
                        });
                        true
                    }
                    BotExit::Fenced(why) => {
                        info!(%bot, why = %why, "bot lost its claim");
                        self.running.remove(&bot);
                        true
                    }
                }
            }
            Signal::Claimed(bot, result, under) => self.on_claimed(bot, result, under),
            Signal::Avoided(bot) => {
                self.avoid_pending.remove(&bot);
                self.let_go(&bot, After::Release);
                true
            }
            Signal::LetGo(bot) => {
                self.stopping.remove(&bot);
                // Bots stopped to restart or after a fence come back on the next pass.
                true
            }
            Signal::Command(WorkerCommand::Take { bot, from }) => {
                debug!(%bot, %from, "bot handed to us");
                self.held_by.remove(&bot);
                self.takes.insert(bot);
                true
            }
            Signal::Command(WorkerCommand::Stop { bot }) => {
                self.let_go(&bot, After::Release);
                true
            }
            Signal::Command(WorkerCommand::Restart { bot })
            | Signal::Event(LifecycleEvent::Restart(bot)) => {
                self.note(
                    "registry_changed",
                    Some(bot.as_str()),
                    None,
                    Some("restart"),
                );
                self.registry_stale = true;
                // The bot itself, or every slice of it that runs here.
                let units: Vec<BotId> = self
                    .running
                    .keys()
                    .filter(|u| **u == bot || u.base() == bot.as_str())
                    .cloned()
                    .collect();
                for u in units {
                    self.let_go(&u, After::Release);
                }
                true
            }
            Signal::Command(WorkerCommand::HandOver { bot, to }) => {
                self.let_go(&bot, After::HandOver(to));
                true
            }
            Signal::Command(WorkerCommand::Inbox { bot, chat }) => {
                // Dropped unless the unit's task runs here: its next owner replays the entry.
                self.w.mailboxes.post(&bot, &chat);
                false
            }
            Signal::Command(WorkerCommand::Leaving { worker }) => {
                info!(%worker, "a worker is leaving; placing its bots without it");
                self.note("worker_leaving", None, Some(worker.as_str()), None);
                self.leaving.insert(worker);
                true
            }
            Signal::Event(e @ (LifecycleEvent::Activate(_) | LifecycleEvent::Deactivate(_))) => {
                let (bot, what) = match &e {
                    LifecycleEvent::Activate(b) => (b, "activate"),
                    LifecycleEvent::Deactivate(b) | LifecycleEvent::Restart(b) => (b, "deactivate"),
                };
                self.note("registry_changed", Some(bot.as_str()), None, Some(what));
                self.registry_stale = true;
                true
            }
        }
    }
}

/// Copies this worker's journal entries to the fleet's journal (the coordinator) every
/// 250 ms, so any worker's live page shows the whole fleet. Telemetry: a batch the coordinator
/// refuses is dropped, not retried, and a burst larger than the local journal keeps its newest
/// entries. Stops (after one last batch) when told.
fn spawn_journal_forwarder(
    coord: Arc<dyn Coordinator>,
    journal: Arc<Journal>,
    me: String,
) -> (watch::Sender<bool>, JoinHandle<()>) {
    let (stop_tx, mut stop) = watch::channel(false);
    let task = tokio::spawn(async move {
        let mut last = 0u64;
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let done = tokio::select! {
                _ = tick.tick() => false,
                _ = stop.changed() => true,
            };
            let entries = journal.since(last, crate::JOURNAL_CAPACITY);
            if let Some(e) = entries.last() {
                last = e.seq;
            }
            // Workers of one process may share a journal: each sends its own.
            let batch: Vec<String> = entries
                .iter()
                .filter(|e| e.worker == me)
                .filter_map(|e| serde_json::to_string(e).ok())
                .collect();
            if !batch.is_empty() {
                if let Err(e) = coord.journal_append(&batch).await {
                    debug!(error = %e, entries = batch.len(), "journal entries not shared with the fleet");
                }
            }
            if done {
                return;
            }
        }
    });
    (stop_tx, task)
}
