//! The worker: keeps its lease, claims its share of the ring, runs those bots, hands them over
//! when the ring changes, and drains on shutdown.

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
    CoordError, Coordinator, LeaseHandle, LeaseKeeper, LeaseLost, LifecycleEvent, MemberWatch,
    WorkerCommand, WorkerMeta,
};
use botfleet_core::{BotId, BotRecord, Clock, Fence, Platform, SystemClock, WorkerId};
use botfleet_store::{BotFilter, Store, StoreError};
use botfleet_telegram::TelegramClient;
use futures_util::{stream, StreamExt};
use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
};
use tracing::{debug, info, warn};

use crate::{bot::BotExit, metrics::Metrics, starter::Starter, WorkerConfig};
use converge::stop_task;

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
            registry_stale: false,
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
    /// A lifecycle event arrived: re-read the registry before the next pass.
    registry_stale: bool,
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
                if std::mem::take(&mut self.registry_stale) {
                    self.refresh_registry().await;
                }
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
                    // Take everything already queued before converging once: an import of a
                    // thousand bots is a thousand events, not a thousand registry reads.
                    while let Ok(sig) = rx.try_recv() {
                        dirty |= self.on_signal(sig).await;
                    }
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
                self.registry_stale = true;
                self.restart(&bot).await;
                true
            }
            Signal::Command(WorkerCommand::HandOver { bot, to }) => {
                self.let_go(&bot, Some(&to)).await;
                true
            }
            Signal::Event(LifecycleEvent::Activate(_) | LifecycleEvent::Deactivate(_)) => {
                self.registry_stale = true;
                true
            }
        }
    }
}
