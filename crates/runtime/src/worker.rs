//! The worker: keeps its lease, claims its share of the ring, runs those bots, hands them over
//! when the ring changes, and drains on shutdown.

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
    placement::{Ring, RingConfig, DEFAULT_BALANCE},
    ClaimOutcome, CoordError, Coordinator, LeaseHandle, LeaseKeeper, LeaseLost, LifecycleEvent,
    MemberWatch, WorkerCommand, WorkerMeta,
};
use botfleet_core::{BotId, BotRecord, BotStatus, Clock, Fence, Platform, SystemClock, WorkerId};
use botfleet_store::{BotFilter, Store, StoreError};
use botfleet_telegram::TelegramClient;
use futures_util::{stream, StreamExt};
use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
};
use tracing::{debug, info, warn};

use crate::{
    bot::{BotCtx, BotExit},
    handler::Handler,
    metrics::Metrics,
    starter::Starter,
    WorkerConfig,
};

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
}

/// Something that makes the worker look at placement again.
#[derive(Debug)]
enum Signal {
    Members,
    Command(WorkerCommand),
    Event(LifecycleEvent),
    Exited(BotId, Fence, BotExit),
}

struct Running {
    fence: Fence,
    platform: Platform,
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
    telegram: TelegramClient,
    http: reqwest::Client,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
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
        let telegram = TelegramClient::new(cfg.telegram.clone())?;
        let http = reqwest::Client::builder()
            .build()
            .map_err(|e| botfleet_telegram::TelegramError::Network(e.without_url()))?;
        let metrics = Arc::new(Metrics::default());
        metrics.set_capacity(cfg.capacity);
        Ok(Self {
            cfg,
            coord,
            store,
            clock: Arc::new(SystemClock::new()),
            telegram,
            http,
            metrics,
            ready: Arc::new(AtomicBool::new(false)),
        })
    }

    /// The worker's metrics (for `/metrics` and reports).
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
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
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), WorkerError> {
        let state = State {
            w: self,
            running: HashMap::new(),
            registry: HashMap::new(),
            takes: HashSet::new(),
            lease: None,
            keeper: None,
            fenced: false,
            stamp: None,
            generation: 0,
            last_inputs: None,
            short: 0,
        };
        state.run(shutdown).await
    }
}

struct State {
    w: Worker,
    running: HashMap<BotId, Running>,
    registry: HashMap<BotId, BotRecord>,
    /// Bots handed to us that our view of the ring gives to someone else.
    takes: HashSet<BotId>,
    lease: Option<LeaseHandle>,
    keeper: Option<LeaseKeeper>,
    /// Bots were stopped because the lease was unsafe; waiting for it to be good again.
    fenced: bool,
    /// The registry stamp of the last full read.
    stamp: Option<(u64, i64)>,
    /// Bumped whenever the registry read changed.
    generation: u64,
    /// What placement was last computed from: members, capacities, registry generation.
    last_inputs: Option<u64>,
    /// Bots of our share that the last pass could not claim (held by others for now).
    short: usize,
}

fn me_meta(cfg: &WorkerConfig) -> WorkerMeta {
    WorkerMeta {
        host: cfg.host.clone(),
        capacity: cfg.capacity,
        started_at_ms: botfleet_core::unix_ms(),
        bots_held: 0,
    }
}

impl State {
    fn me(&self) -> &WorkerId {
        &self.w.cfg.worker_id
    }

    /// Registers (again), retrying while the coordinator is unreachable.
    async fn start_keeper(&mut self) {
        let mut attempt = 0u32;
        loop {
            match LeaseKeeper::start(
                self.w.coord.clone(),
                self.w.clock.clone(),
                self.me().clone(),
                me_meta(&self.w.cfg),
                self.w.cfg.lease,
            )
            .await
            {
                Ok(k) => {
                    info!(worker = %self.me(), incarnation = %k.handle().incarnation(), "registered");
                    self.lease = Some(k.handle());
                    self.keeper = Some(k);
                    self.fenced = false;
                    return;
                }
                Err(e) => {
                    warn!(worker = %self.me(), error = %e, "cannot register; retrying");
                    tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt.min(10) + 1)))
                        .await;
                    attempt += 1;
                }
            }
        }
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
        let fresh: HashMap<BotId, BotRecord> =
            bots.into_iter().map(|b| (b.spec.id.clone(), b)).collect();
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
        self.registry = fresh;
        for bot in changed {
            info!(%bot, "spec changed; restarting");
            self.restart(&bot).await;
        }
    }

    /// Stops a running bot and gives up its claim; the next pass claims and starts it again.
    async fn restart(&mut self, bot: &BotId) {
        if let Some(r) = self.running.remove(bot) {
            let fence = r.fence;
            stop_task(r).await;
            let _ = self.w.coord.release(bot, fence).await;
        }
    }

    async fn run(mut self, shutdown: impl Future<Output = ()> + Send) -> Result<(), WorkerError> {
        self.start_keeper().await;
        // Take the event cursor before the first claim pass: nothing published during the
        // pass is missed, nothing older is replayed.
        let mut cursor = loop {
            match self.w.coord.events_head().await {
                Ok(c) => break c,
                Err(e) => {
                    warn!(error = %e, "cannot read the event stream head; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        };
        let (tx, mut rx) = mpsc::channel::<Signal>(1024);
        let mut members = MemberWatch::spawn(self.w.coord.clone(), self.w.cfg.lease / 3);
        let members_tx = tx.clone();
        let member_task = tokio::spawn(async move {
            while members.recv().await.is_some() {
                if members_tx.send(Signal::Members).await.is_err() {
                    return;
                }
            }
        });
        let (coord, events_tx) = (self.w.coord.clone(), tx.clone());
        let event_task = tokio::spawn(async move {
            loop {
                match coord
                    .read_events(&cursor, 100, Duration::from_secs(5))
                    .await
                {
                    Ok(evs) => {
                        for (c, e) in evs {
                            cursor = c;
                            if events_tx.send(Signal::Event(e)).await.is_err() {
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
        });
        let (coord, cmd_tx) = (self.w.coord.clone(), tx.clone());
        let command_task = tokio::spawn(async move {
            loop {
                match coord.recv_commands(100, Duration::from_secs(5)).await {
                    Ok(cmds) => {
                        for c in cmds {
                            if cmd_tx.send(Signal::Command(c)).await.is_err() {
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
        let starter = Starter::spawn(self.w.coord.clone(), self.w.cfg.connect_rate);
        self.refresh_registry().await;
        let mut tick = tokio::time::interval(self.w.cfg.reconcile_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut refresh = tokio::time::interval(self.w.cfg.registry_refresh);
        refresh.tick().await;
        tokio::pin!(shutdown);
        let mut dirty = true;
        let mut check = false;
        loop {
            if (dirty || check) && !self.fenced {
                self.reconcile(&starter, &tx, dirty).await;
                dirty = false;
                check = false;
                if !self.w.ready.swap(true, Ordering::SeqCst) {
                    info!(worker = %self.me(), bots = self.running.len(), "first claim pass done; ready");
                }
            }
            let mut lease = self.lease.clone();
            let fenced = self.fenced;
            tokio::select! {
                () = &mut shutdown => break,
                why = async { match lease.as_mut() { Some(l) if !fenced => l.lost().await, _ => std::future::pending().await } } => {
                    self.self_fence(&why).await;
                    if matches!(why, LeaseLost::Revoked | LeaseLost::Stopped) {
                        self.start_keeper().await;
                        dirty = true;
                    }
                }
                Some(sig) = rx.recv() => {
                    dirty |= self.on_signal(sig).await;
                }
                _ = refresh.tick() => {
                    self.refresh_registry().await;
                    check = true;
                }
                _ = tick.tick() => {
                    if self.fenced {
                        match self.lease.as_ref().map(LeaseHandle::check) {
                            Some(Ok(())) => {
                                info!(worker = %self.me(), "lease is safe again; resuming");
                                self.fenced = false;
                            }
                            // Still unsure (the backend may be away): keep waiting.
                            Some(Err(LeaseLost::Expired(_))) => {}
                            // The liveness is gone for good (e.g. we were frozen past it):
                            // register again as a new incarnation.
                            _ => {
                                self.start_keeper().await;
                                dirty = true;
                            }
                        }
                    }
                    check = true;
                }
            }
        }
        self.drain().await;
        member_task.abort();
        event_task.abort();
        command_task.abort();
        Ok(())
    }

    /// Stops every bot at once, keeping no claim: the lease may be gone.
    async fn self_fence(&mut self, why: &LeaseLost) {
        warn!(worker = %self.me(), reason = %why, bots = self.running.len(), "lease not safe; stopping every bot");
        self.w.metrics.self_fence();
        self.fenced = true;
        let all: Vec<BotId> = self.running.keys().cloned().collect();
        stream::iter(all.into_iter().filter_map(|b| self.running.remove(&b)))
            .for_each_concurrent(256, stop_task)
            .await;
        if let Some(l) = &self.lease {
            l.set_bots_held(0);
        }
    }

    /// Handles one signal; answers whether placement should be looked at again.
    async fn on_signal(&mut self, sig: Signal) -> bool {
        match sig {
            Signal::Members => true,
            Signal::Exited(bot, fence, exit) => {
                let Some(r) = self.running.get_mut(&bot).filter(|r| r.fence == fence) else {
                    return false;
                };
                match exit {
                    BotExit::Stopped => false,
                    BotExit::Failed(why) => {
                        debug!(%bot, why = %why, "bot parked");
                        r.parked = true;
                        false
                    }
                    BotExit::Fenced(why) => {
                        info!(%bot, why = %why, "bot lost its claim");
                        self.running.remove(&bot);
                        true
                    }
                }
            }
            Signal::Command(WorkerCommand::Take { bot, from }) => {
                debug!(%bot, %from, "bot handed to us");
                self.takes.insert(bot);
                true
            }
            Signal::Command(WorkerCommand::Stop { bot }) => {
                self.let_go(&bot, None).await;
                true
            }
            Signal::Command(WorkerCommand::Restart { bot })
            | Signal::Event(LifecycleEvent::Restart(bot)) => {
                self.refresh_registry().await;
                self.restart(&bot).await;
                true
            }
            Signal::Command(WorkerCommand::HandOver { bot, to }) => {
                self.let_go(&bot, Some(&to)).await;
                true
            }
            Signal::Event(LifecycleEvent::Activate(_) | LifecycleEvent::Deactivate(_)) => {
                self.refresh_registry().await;
                true
            }
        }
    }

    /// Stops `bot` and hands it to `to` (or releases it).
    async fn let_go(&mut self, bot: &BotId, to: Option<&WorkerId>) {
        let Some(r) = self.running.remove(bot) else {
            return;
        };
        let fence = r.fence;
        stop_task(r).await;
        let res = match to.filter(|t| *t != self.me()) {
            Some(t) => {
                self.w.metrics.handoff();
                self.w.coord.hand_over(bot, fence, t).await
            }
            None => self.w.coord.release(bot, fence).await,
        };
        if let Err(e) = res {
            // The claim then ends with our liveness; nobody runs the bot twice meanwhile.
            warn!(%bot, error = %e, "could not hand over; the claim will expire");
        }
    }

    /// Converges on our share. Unless `force`d, the placement is recomputed only when its
    /// inputs (members, capacities, registry) changed or some of our share is still unclaimed:
    /// an idle worker with thousands of bots costs one member listing per tick.
    async fn reconcile(&mut self, starter: &Starter, tx: &mpsc::Sender<Signal>, force: bool) {
        let Some(lease) = self.lease.clone() else {
            return;
        };
        if lease.check().is_err() {
            return;
        }
        let live = match self.w.coord.live_workers().await {
            Ok(l) => l,
            Err(e) => {
                warn!(error = %e, "cannot list workers; placement unchanged");
                return;
            }
        };
        if !live.iter().any(|l| &l.id == self.me()) {
            return;
        }
        let inputs = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            for l in &live {
                (l.id.as_str(), l.incarnation.as_str(), l.meta.capacity).hash(&mut h);
            }
            self.generation.hash(&mut h);
            h.finish()
        };
        if !force && self.short == 0 && self.last_inputs == Some(inputs) {
            return;
        }
        self.last_inputs = Some(inputs);
        let caps: HashMap<WorkerId, u32> = live
            .iter()
            .map(|l| (l.id.clone(), l.meta.capacity))
            .collect();
        let ring = Ring::new(live.iter().map(|l| &l.id), RingConfig::default());
        let enabled: Vec<BotId> = self
            .registry
            .values()
            .filter(|r| r.spec.enabled)
            .map(|r| r.spec.id.clone())
            .collect();
        let plan = ring.assign(&enabled, DEFAULT_BALANCE, |w| caps.get(w).copied());
        self.w.metrics.set_unplaced(plan.unplaced.len());
        if !plan.unplaced.is_empty() {
            warn!(
                count = plan.unplaced.len(),
                "bots no live worker has room for"
            );
        }
        let me = self.me().clone();
        // Let go of what is no longer ours.
        let extra: Vec<BotId> = self
            .running
            .keys()
            .filter(|b| plan.owners.get(*b) != Some(&me))
            .cloned()
            .collect();
        for bot in extra {
            let to = plan.owners.get(&bot).cloned();
            self.let_go(&bot, to.as_ref()).await;
        }
        // Pass on bots handed to us that are not ours by our view.
        let takes: Vec<BotId> = self.takes.drain().collect();
        for bot in takes {
            match plan.owners.get(&bot) {
                Some(o) if *o == me => {}
                other => {
                    let min = self
                        .w
                        .store
                        .highest_fence(&bot)
                        .await
                        .unwrap_or(Fence::ZERO);
                    if let Ok(ClaimOutcome::Granted(f)) = self.w.coord.claim(&bot, min).await {
                        let _ = self.w.store.accept_fence(&bot, f).await;
                        let _ = match other {
                            Some(to) => self.w.coord.hand_over(&bot, f, to).await,
                            None => self.w.coord.release(&bot, f).await,
                        };
                    }
                }
            }
        }
        // Claim what is ours and not running, within capacity.
        let room = (self.w.cfg.capacity as usize).saturating_sub(self.running.len());
        let wanted: Vec<BotId> = plan
            .bots_of(&me)
            .into_iter()
            .filter(|b| !self.running.contains_key(*b))
            .take(room)
            .cloned()
            .collect();
        let asked = wanted.len();
        let (coord, store) = (self.w.coord.clone(), self.w.store.clone());
        let granted: Vec<(BotId, Fence)> = stream::iter(wanted)
            .map(|bot| {
                let (coord, store) = (coord.clone(), store.clone());
                async move {
                    let min = store.highest_fence(&bot).await.ok()?;
                    match coord.claim(&bot, min).await {
                        Ok(ClaimOutcome::Granted(f)) => match store.accept_fence(&bot, f).await {
                            Ok(()) => Some((bot, f)),
                            Err(e) => {
                                warn!(%bot, error = %e, "claim granted but the store refused its fence");
                                let _ = coord.release(&bot, f).await;
                                None
                            }
                        },
                        Ok(_) => None,
                        Err(e) => {
                            debug!(%bot, error = %e, "claim failed");
                            None
                        }
                    }
                }
            })
            .buffer_unordered(32)
            .filter_map(|x| async move { x })
            .collect()
            .await;
        self.short = asked - granted.len();
        for (bot, fence) in granted {
            self.w.metrics.claim();
            let Some(rec) = self.registry.get(&bot) else {
                continue;
            };
            let (stop_tx, stop_rx) = watch::channel(false);
            let ctx = BotCtx {
                spec: rec.spec.clone(),
                fence,
                worker: me.to_string(),
                store: self.w.store.clone(),
                telegram: self.w.telegram.clone(),
                handler: Handler::new(
                    rec.spec.handler.clone(),
                    self.w.http.clone(),
                    self.w.cfg.webhook_timeout,
                ),
                lease: lease.clone(),
                metrics: self.w.metrics.clone(),
                starter: starter.clone(),
                stop: stop_rx,
            };
            let platform = rec.spec.platform;
            let parked = platform != Platform::Telegram;
            let tx = tx.clone();
            let b = bot.clone();
            let task = tokio::spawn(async move {
                let exit = if platform == Platform::Telegram {
                    ctx.run().await
                } else {
                    BotExit::Failed(format!(
                        "platform {platform} is not supported by this worker yet"
                    ))
                };
                let _ = tx.send(Signal::Exited(b, fence, exit)).await;
            });
            if parked {
                let _ = self
                    .w
                    .store
                    .set_status(
                        &bot,
                        BotStatus::Failed,
                        Some("platform not supported yet"),
                        Some(me.as_str()),
                    )
                    .await;
            }
            self.running.insert(
                bot,
                Running {
                    fence,
                    platform,
                    stop: stop_tx,
                    task,
                    parked,
                },
            );
        }
        lease.set_bots_held(self.running.len() as u32);
    }

    /// Clean shutdown: not ready → stop each bot → hand it to its next owner → unregister.
    async fn drain(&mut self) {
        self.w.ready.store(false, Ordering::SeqCst);
        let me = self.me().clone();
        info!(worker = %me, bots = self.running.len(), "draining");
        let others: Vec<WorkerId> = match self.w.coord.live_workers().await {
            Ok(l) => l.into_iter().map(|w| w.id).filter(|w| *w != me).collect(),
            Err(_) => Vec::new(),
        };
        let ring = Ring::new(&others, RingConfig::default());
        let running: Vec<(BotId, Running)> = self.running.drain().collect();
        let fences: Vec<(BotId, Fence, Platform, bool)> = running
            .iter()
            .map(|(b, r)| (b.clone(), r.fence, r.platform, r.parked))
            .collect();
        stream::iter(running.into_iter().map(|(_, r)| r))
            .for_each_concurrent(256, stop_task)
            .await;
        let coord = self.w.coord.clone();
        let metrics = self.w.metrics.clone();
        stream::iter(fences)
            .for_each_concurrent(64, |(bot, fence, _, _)| {
                let (coord, metrics) = (coord.clone(), metrics.clone());
                let to = ring.owner_of(&bot).cloned();
                async move {
                    let r = match to {
                        Some(t) => {
                            metrics.handoff();
                            coord.hand_over(&bot, fence, &t).await
                        }
                        None => coord.release(&bot, fence).await,
                    };
                    if let Err(e) = r {
                        warn!(%bot, error = %e, "hand-over failed; the claim ends with our liveness");
                    }
                }
            })
            .await;
        if let Err(e) = self.w.coord.unregister().await {
            warn!(error = %e, "unregister failed; liveness ends with the lease");
        }
        if let Some(k) = self.keeper.take() {
            k.stop();
        }
        info!(worker = %me, "drained");
    }
}

/// Asks a bot task to stop and waits (briefly) until it has: its poll is closed before the
/// bot is handed over, so the next owner never meets a second poller.
async fn stop_task(r: Running) {
    let _ = r.stop.send(true);
    let mut task = r.task;
    if tokio::time::timeout(Duration::from_secs(5), &mut task)
        .await
        .is_err()
    {
        task.abort();
    }
}
