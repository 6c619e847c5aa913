//! Running one bot, whatever its platform: a start slot, verify the credentials, connect (or
//! resume from the stored checkpoint), then receive batches, record each message in the inbox,
//! acknowledge the batch to the platform and store its checkpoint, and hand each message to its
//! chat's queue (see [`crate::chats`]). Nothing here names a platform's wire types.

use std::{sync::Arc, time::Duration};

use botfleet_coord::{Coordinator, LeaseHandle, LifecycleEvent};
use botfleet_core::{BotId, BotSpec, BotStatus, Fence};
use botfleet_platform::{Connection, Connector, ErrorKind, PlatformError};
use botfleet_store::{InboxItem, Journaled, Store, StoreError};
use tokio::sync::{oneshot, watch};
use tracing::{debug, info, warn};

/// The session records' kind of what the fleet registered with the platform for a bot.
const REGISTERED: &str = "registered";
/// Its record of the commands' digest.
const COMMANDS: &str = "commands";

use crate::{
    chats::{Chats, ChatsCtx},
    handler::Handler,
    metrics::{Metrics, EVENTS_PAUSED_TOTAL},
    reporter::Reporter,
    retry::{backoff, sleep_or_stop, stopped, wait_after},
    starter::Starter,
    turn::{Halt, TurnBase, TurnCtx},
};

/// Writes `next` over the registered version `at` (`Ok(false)`: changed since, nothing
/// written) and, when written, tells the fleet to restart the bot; a fleet that cannot be
/// told sees the change at its next registry read.
async fn rewrite_and_restart(
    store: &dyn Store,
    coord: &dyn Coordinator,
    next: &BotSpec,
    at: i64,
) -> Result<bool, StoreError> {
    if !store.update_bot_if(next, at).await? {
        return Ok(false);
    }
    if let Err(e) = coord
        .publish(&LifecycleEvent::Restart(next.id.clone()))
        .await
    {
        debug!(bot = %next.id, error = %e, "could not tell the fleet; workers see it at their next registry read");
    }
    Ok(true)
}

/// Aborts a side task when the bot's run ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Why a bot task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BotExit {
    /// Asked to stop (hand-over, disable, shutdown).
    Stopped,
    /// The worker may no longer act for it: lease not safe, or a newer fence exists.
    Fenced(String),
    /// Needs an operator (bad token, unusable spec). Not retried until restarted.
    Failed(String),
    /// The platform stayed unreachable from this worker for `transport_down`: another worker
    /// should run the bot.
    TransportDown(String),
}

/// Per-bot settings the worker passes down.
#[derive(Clone, Debug)]
pub(crate) struct BotSettings {
    /// How long a message's handler or send is retried through transient failures before the
    /// message is recorded as undeliverable.
    pub(crate) retry_for: Duration,
    /// Messages a bot holds in memory at most (received, not yet answered): past it, it stops
    /// receiving until its chats catch up.
    pub(crate) max_in_flight: usize,
    /// Whether to verify the credentials before connecting. A bot handed over by its last
    /// owner skips it: it ran there a moment ago, and connecting refuses bad credentials just
    /// the same (one platform call less per bot when thousands move at once).
    pub(crate) verify: bool,
    /// See [`crate::WorkerConfig::transport_down`].
    pub(crate) transport_down: Duration,
    /// See [`crate::WorkerConfig::shard_recount_every`].
    pub(crate) shard_recount: Duration,
    /// The worker's turn slots.
    pub(crate) slots: crate::turn::Slots,
    /// The worker's file links.
    pub(crate) files: crate::Files,
    /// The worker's answers that come later.
    pub(crate) later: crate::later::Later,
    /// The fleet's send buckets.
    pub(crate) pace: crate::pace::Pace,
    /// Where entries journaled by other workers (sends from the backend) reach the bot.
    pub(crate) mailboxes: Arc<crate::sends::Mailboxes>,
}

/// Everything a bot task needs; owned by the task.
pub(crate) struct BotCtx {
    pub(crate) spec: BotSpec,
    /// The `updated_at_ms` of the registered spec it runs.
    pub(crate) spec_at_ms: i64,
    pub(crate) fence: Fence,
    pub(crate) worker: String,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) coord: Arc<dyn Coordinator>,
    pub(crate) connector: Arc<dyn Connector>,
    pub(crate) handler: Handler,
    pub(crate) lease: LeaseHandle,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) starter: Starter,
    pub(crate) reporter: Reporter,
    pub(crate) settings: BotSettings,
    pub(crate) stop: watch::Receiver<bool>,
    /// Since when the platform has been unreachable without a success in between.
    pub(crate) down_since: Option<std::time::Instant>,
}

/// How long a stop waits for a connect in progress to end (well inside the 5 s a worker gives
/// a stopping bot before it hands the bot over).
const CONNECT_WIND_DOWN: Duration = Duration::from_millis(4_500);

impl BotCtx {
    /// Counts a failure toward `transport_down` (transient ones only): the exit when the
    /// platform has been unreachable from here that long.
    fn down(&mut self, e: &PlatformError) -> Option<BotExit> {
        if e.kind() != ErrorKind::Transient || self.settings.transport_down.is_zero() {
            return None;
        }
        let since = *self.down_since.get_or_insert_with(std::time::Instant::now);
        (since.elapsed() >= self.settings.transport_down).then(|| {
            warn!(bot = %self.spec.id, error = %e, down_s = since.elapsed().as_secs(), "the platform is unreachable from this worker; handing the bot to another");
            BotExit::TransportDown(e.to_string())
        })
    }

    fn report(&self, status: BotStatus, error: Option<&str>) {
        self.reporter
            .report(&self.spec.id, status, error, &self.worker);
    }

    /// Registers the bot's commands with its platform when they changed since they were
    /// last registered (by this worker or another: the digest registered is in the bot's
    /// session records, written under the claim's fence). Only one unit of a bot registers
    /// (slice 0 of a sliced one). A failure is reported on the bot and tried again when the
    /// unit next starts; the bot runs either way.
    async fn register_commands(&self) {
        let caps = self
            .connector
            .descriptor()
            .mode_of(&self.spec)
            .map(|m| m.caps);
        if !caps.is_some_and(|c| c.commands) || self.spec.options.slice.is_some_and(|k| k != 0) {
            return;
        }
        // The unit's own records, under its claim's fence (slice 0's for a sliced bot).
        let bot = self.spec.id.clone();
        let commands = &self.spec.options.commands;
        let digest = botfleet_core::commands_digest(commands);
        let stored = match self.store.session_record(&bot, REGISTERED, COMMANDS).await {
            Ok(v) => v.map(|b| String::from_utf8_lossy(&b).into_owned()),
            Err(e) => {
                warn!(bot = %self.spec.id, error = %e, "cannot read which commands were registered; registering again at the next start");
                return;
            }
        };
        if stored.as_deref() == Some(digest.as_str()) || (stored.is_none() && commands.is_empty()) {
            return;
        }
        match self.connector.register_commands(&self.spec).await {
            Ok(()) => {
                info!(bot = %self.spec.id, commands = commands.len(), "commands registered with the platform");
                let write = botfleet_store::SessionWrite::Put {
                    kind: REGISTERED.into(),
                    key: COMMANDS.into(),
                    value: digest.into_bytes(),
                };
                if let Err(e) = self.store.session_write(&bot, &[write], self.fence).await {
                    warn!(bot = %self.spec.id, error = %e, "cannot record the commands registered; they are registered again at the next start");
                }
            }
            Err(e) => {
                self.metrics.platform_error(self.spec.platform, e.reason());
                warn!(bot = %self.spec.id, error = %e, "cannot register the bot's commands; trying again at the next start");
                self.report(
                    BotStatus::Running,
                    Some(&format!("registering the bot's commands: {e}")),
                );
            }
        }
    }

    fn fail(&self, e: &PlatformError) -> BotExit {
        warn!(bot = %self.spec.id, reason = e.reason(), error = %e, "bot failed; not retrying until restarted");
        self.metrics.start_failure(self.spec.platform, e.reason());
        let detail = e.to_string();
        // Under its spec: a refusal of a token replaced meanwhile does not fail the new one.
        self.reporter.report_under(
            &self.spec.id,
            BotStatus::Failed,
            Some(&detail),
            &self.worker,
            Some(self.spec_at_ms),
        );
        BotExit::Failed(detail)
    }

    /// The bot's exit when its chats halted it, or a stop was asked for.
    fn chat_exit(&self, halt: Halt) -> BotExit {
        match halt {
            Halt::Stopped => BotExit::Stopped,
            Halt::Fenced(why) => BotExit::Fenced(why),
            // Reported failed by the turn that met the refusal.
            Halt::Failed(e) => {
                self.metrics.start_failure(self.spec.platform, e.reason());
                BotExit::Failed(e.to_string())
            }
        }
    }

    /// Waits for a start slot from the fleet-wide rate limiter.
    async fn wait_for_slot(&mut self) -> bool {
        let (go, ready) = oneshot::channel();
        self.starter.request(self.spec.platform, go).await;
        tokio::select! {
            r = ready => r.is_ok(),
            () = stopped(self.stop.clone()) => false,
        }
    }

    /// Runs `call` until it succeeds, the credentials are refused (the bot fails), the lease is
    /// not safe or a stop is asked for; retryable failures wait as their kind says.
    async fn until_ok<T, F, Fut>(&mut self, what: &'static str, call: F) -> Result<T, BotExit>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, PlatformError>>,
    {
        self.until_ok_then(what, call, None::<fn(T) -> std::future::Ready<()>>)
            .await
    }

    /// [`Self::until_ok`], where a stop does not drop a call midway: `wind_down` gets the
    /// call [`CONNECT_WIND_DOWN`] to end (the connector sees `may_act` turn false) and is
    /// handed what it opened anyway, to close. A connect dropped midway could leave a client
    /// dialing or logging in on its own after the bot was handed over, beside the next
    /// owner's connection (WhatsApp kicks both).
    async fn until_ok_then<T, F, Fut, W, WFut>(
        &mut self,
        what: &'static str,
        mut call: F,
        mut wind_down: Option<W>,
    ) -> Result<T, BotExit>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, PlatformError>>,
        W: FnOnce(T) -> WFut,
        WFut: std::future::Future<Output = ()>,
    {
        let mut attempt = 0;
        loop {
            self.lease
                .check()
                .map_err(|e| BotExit::Fenced(e.to_string()))?;
            let fut = call();
            tokio::pin!(fut);
            // A fence (the lease timer, not the control loop) ends the call as a stop does.
            let lease = self.lease.clone();
            let r = tokio::select! {
                r = &mut fut => r,
                halt = async {
                    tokio::select! {
                        () = stopped(self.stop.clone()) => BotExit::Stopped,
                        why = lease.lost() => BotExit::Fenced(why.to_string()),
                    }
                } => {
                    if let Some(close) = wind_down.take() {
                        match tokio::time::timeout(CONNECT_WIND_DOWN, fut).await {
                            Ok(Ok(opened)) => close(opened).await,
                            Ok(Err(_)) => {}
                            Err(_) => warn!(bot = %self.spec.id, "{what} did not end within {:.1} s of the stop; dropped", CONNECT_WIND_DOWN.as_secs_f32()),
                        }
                    }
                    return Err(halt);
                }
            };
            match r {
                Ok(v) => {
                    self.down_since = None;
                    return Ok(v);
                }
                Err(e) if matches!(e.kind(), ErrorKind::Credentials | ErrorKind::Rejected) => {
                    return Err(self.fail(&e));
                }
                Err(e) => {
                    if let Some(exit) = self.down(&e) {
                        return Err(exit);
                    }
                    self.metrics.platform_error(self.spec.platform, e.reason());
                    let wait = wait_after(&e, attempt);
                    warn!(bot = %self.spec.id, error = %e, wait_ms = wait.as_millis() as u64, "{what} failed; retrying");
                    // Say why the bot is not running yet where operators look (bots list):
                    // once, and whenever the platform's budget holds it back.
                    if attempt == 0 || e.reason() == "identify_budget" {
                        self.report(BotStatus::Pending, Some(&e.to_string()));
                    }
                    if sleep_or_stop(wait, &mut self.stop).await {
                        return Err(BotExit::Stopped);
                    }
                    attempt += 1;
                }
            }
        }
    }

    /// A store write retried through backend failures; a stale fence ends the bot here.
    async fn store_retry<T, F, Fut>(
        &mut self,
        what: &'static str,
        mut call: F,
    ) -> Result<T, BotExit>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        let mut tries = 0;
        loop {
            match call().await {
                Ok(v) => return Ok(v),
                Err(StoreError::StaleFence { current, .. }) => {
                    return Err(BotExit::Fenced(format!(
                        "a newer fence {current} owns this bot"
                    )));
                }
                Err(e) => {
                    warn!(bot = %self.spec.id, error = %e, "cannot {what}; retrying");
                    if sleep_or_stop(backoff(tries), &mut self.stop).await {
                        return Err(BotExit::Stopped);
                    }
                    tries += 1;
                }
            }
        }
    }

    /// The whole life of the bot on this worker. Boxed: the task's future then holds a
    /// pointer to the context instead of copies of it (an idle bot's memory is mostly this).
    pub(crate) async fn run(mut self: Box<Self>) -> BotExit {
        if !self.wait_for_slot().await {
            return BotExit::Stopped;
        }
        if self.spec.is_counting() {
            return self.count_shards().await;
        }
        let (connector, spec) = (self.connector.clone(), self.spec.clone());
        if self.settings.verify {
            let identity = match self.until_ok("verify", || connector.verify(&spec)).await {
                Ok(i) => i,
                Err(exit) => return exit,
            };
            debug!(bot = %self.spec.id, user = %identity.user_id, "credentials accepted");
        }
        // Where to resume: the checkpoint, and what a predecessor recorded but did not answer
        // (one store call: a worker taking thousands of bots makes one per bot).
        let (store, bot) = (self.store.clone(), self.spec.id.clone());
        // A webhook bot's journal belongs to the chats' turns on every worker (and their
        // sweeper), not to the unit: replaying it here would answer outside the turns.
        let limit = if self.connector.descriptor().is_webhook(&self.spec) {
            0
        } else {
            100_000
        };
        // Opened before the journal is read: an entry journaled elsewhere after this read is
        // posted here (one journaled before it is among the pending).
        let mailbox = (limit > 0).then(|| self.settings.mailboxes.open(&bot));
        let (checkpoint, pending) = match self
            .store_retry("read the resume point", || store.resume_point(&bot, limit))
            .await
        {
            Ok((c, p)) => (c.map(|c| c.value), p),
            Err(exit) => return exit,
        };
        let cp = checkpoint.clone();
        // A connection that reconnects on its own asks before every attempt: a worker whose
        // lease is gone, or a bot being stopped, never takes the bot back.
        let may_act: botfleet_platform::MayAct = {
            let (lease, stop) = (self.lease.clone(), self.stop.clone());
            Arc::new(move || lease.check().is_ok() && !*stop.borrow())
        };
        // The session a platform client keeps (a linked WhatsApp device), under this claim.
        let session: Arc<dyn botfleet_platform::SessionKv> = Arc::new(crate::StoreSession::new(
            self.store.clone(),
            self.spec.id.clone(),
            self.fence,
        ));
        let Connection { receiver, sender } = match self
            .until_ok_then(
                "connect",
                || {
                    connector.connect_with_session(
                        &spec,
                        cp.as_deref(),
                        may_act.clone(),
                        session.clone(),
                    )
                },
                Some(|c: Connection| async move {
                    let mut receiver = c.receiver;
                    receiver.close().await;
                }),
            )
            .await
        {
            Ok(c) => c,
            Err(exit) => return exit,
        };
        // Not kept for the bot's life: an idle bot's task holds as little as it can.
        drop(may_act);
        drop(cp);
        drop(session);
        self.metrics.running(self.spec.platform, 1);
        let _running = RunningGuard {
            metrics: self.metrics.clone(),
            platform: self.spec.platform,
        };
        self.report(BotStatus::Running, None);
        info!(bot = %self.spec.id, fence = self.fence.get(), checkpoint = checkpoint.as_deref().unwrap_or("-"), "bot running");
        self.register_commands().await;
        let mut chats = Chats::new(ChatsCtx {
            turn: TurnCtx::new(
                &self.spec,
                Some(self.spec_at_ms),
                Ok(sender),
                self.handler.clone(),
                TurnBase {
                    store: self.store.clone(),
                    metrics: self.metrics.clone(),
                    reporter: self.reporter.clone(),
                    worker: Arc::from(self.worker.as_str()),
                    retry_for: self.settings.retry_for,
                    slots: self.settings.slots.clone(),
                    files: self.settings.files.clone(),
                    later: self.settings.later.clone(),
                    pace: self.settings.pace.clone(),
                },
            ),
            fence: self.fence,
            lease: self.lease.clone(),
            stop: self.stop.clone(),
            posted: Arc::default(),
        });
        // Slice 0 of a bot on the recommended count watches the recommendation.
        let _watch = self.watch_recommendation().map(AbortOnDrop);
        let exit = self
            .receive(receiver, &mut chats, pending, mailbox.as_ref())
            .await;
        chats.finish(Duration::from_secs(4)).await;
        exit
    }

    /// A bot of `shards` auto split into slices whose count is not settled: waits until no
    /// slice of the count in use runs anywhere (so no moment has two slices covering one
    /// shard), reads the recommendation and records it over the version this unit runs (an
    /// operator's change made meanwhile wins, and is counted again). The worker stops this
    /// unit once the registry names the slices.
    async fn count_shards(&mut self) -> BotExit {
        let (connector, spec) = (self.connector.clone(), self.spec.clone());
        let old = spec.options.shards_in_use.unwrap_or(0);
        // A bot has at most as many slices as shards.
        for k in 0..old {
            let unit = spec.id.slice(k);
            loop {
                if let Err(e) = self.lease.check() {
                    return BotExit::Fenced(e.to_string());
                }
                match self.coord.owner(&unit).await {
                    Ok(o) if o.as_ref().is_none_or(|o| !o.live || o.handed_over) => break,
                    Ok(_) => debug!(bot = %spec.id, %unit, "waiting for the old slice to stop"),
                    Err(e) => debug!(bot = %spec.id, error = %e, "cannot read a slice's owner"),
                }
                if sleep_or_stop(Duration::from_millis(250), &mut self.stop).await {
                    return BotExit::Stopped;
                }
            }
        }
        let n = match self
            .until_ok("read the recommended shard count", || {
                connector.recommended_shards(&spec)
            })
            .await
        {
            Ok(Some(n)) => n.clamp(1, 4096),
            Ok(None) => {
                return self.fail(&PlatformError::new(
                    ErrorKind::Rejected,
                    "no_shards",
                    "this platform recommends no shard count: give shards N",
                ))
            }
            Err(exit) => return exit,
        };
        let mut next = spec.clone();
        next.options.shards_in_use = Some(n);
        next.options.shards_recommended = Some(n);
        let (store, coord, at) = (self.store.clone(), self.coord.clone(), self.spec_at_ms);
        match self
            .store_retry("record the shard count", || {
                rewrite_and_restart(&*store, &*coord, &next, at)
            })
            .await
        {
            Ok(true) => {
                info!(bot = %spec.id, shards = n, was = old, "shard count recorded: the slices start on it");
            }
            Ok(false) => {
                info!(bot = %spec.id, "the bot changed while its shards were counted; counted again")
            }
            Err(exit) => return exit,
        }
        stopped(self.stop.clone()).await;
        BotExit::Stopped
    }

    /// For slice 0 of a bot on Discord's recommended count: a task that reads the
    /// recommendation every [`BotSettings::shard_recount`] and, when it changed, marks the
    /// bot to be counted again as a whole (every slice stops first).
    fn watch_recommendation(&self) -> Option<tokio::task::JoinHandle<()>> {
        let spec = &self.spec;
        if spec.options.shards.is_some() || spec.options.slice != Some(0) {
            return None;
        }
        let in_use = spec.options.shards_in_use?;
        let mut base = spec.clone();
        base.id = BotId::new(spec.id.base()).ok()?;
        base.options.slice = None;
        let (connector, store, coord) = (
            self.connector.clone(),
            self.store.clone(),
            self.coord.clone(),
        );
        let (at, every, mut stop) = (
            self.spec_at_ms,
            self.settings.shard_recount,
            self.stop.clone(),
        );
        Some(tokio::spawn(async move {
            loop {
                if sleep_or_stop(every, &mut stop).await {
                    return;
                }
                let n = match connector.recommended_shards(&base).await {
                    Ok(Some(n)) if n != in_use => n.clamp(1, 4096),
                    Ok(_) => continue,
                    Err(e) => {
                        debug!(bot = %base.id, error = %e, "cannot read the recommended shard count");
                        continue;
                    }
                };
                let mut next = base.clone();
                next.options.shards_recommended = Some(n);
                match rewrite_and_restart(&*store, &*coord, &next, at).await {
                    Ok(true) => {
                        info!(bot = %base.id, shards = n, was = in_use, "Discord recommends another shard count: the bot restarts as a whole on it");
                        return;
                    }
                    // Changed meanwhile: the bot restarts (and is counted) anyway.
                    Ok(false) | Err(StoreError::NotFound(_)) => return,
                    Err(e) => {
                        warn!(bot = %base.id, error = %e, "cannot record the new shard count; trying again")
                    }
                }
            }
        }))
    }

    /// Queues the sends journaled elsewhere for the chats posted to `mailbox`: each chat's
    /// pending entries its queue does not have yet, behind what it has, in the journal's
    /// order.
    async fn queue_posted(&self, mailbox: &crate::sends::MailboxGuard, chats: &mut Chats) {
        let bot = &self.spec.id;
        for chat in mailbox.take() {
            match self
                .store
                .inbox_pending_chat(bot, &chat, MAILBOX_READ)
                .await
            {
                Ok(pending) => chats.dispatch_unknown(pending),
                Err(e) => {
                    warn!(bot = %bot, error = %e, "cannot read a chat's sends; trying again in a second");
                    mailbox.again_later(chat);
                }
            }
        }
    }

    /// Replays what a predecessor recorded but did not answer, then receives until told to
    /// stop or no longer allowed to act.
    async fn receive(
        &mut self,
        mut receiver: Box<dyn botfleet_platform::Receiver>,
        chats: &mut Chats,
        pending: Vec<botfleet_store::InboxEntry>,
        mailbox: Option<&crate::sends::MailboxGuard>,
    ) -> BotExit {
        let bot = self.spec.id.clone();
        if !pending.is_empty() {
            info!(bot = %bot, messages = pending.len(), "replaying recorded messages not answered yet");
        }
        for e in pending {
            chats.dispatch(e);
        }
        let mut attempt = 0;
        let exit = loop {
            if let Err(e) = self.lease.check() {
                break BotExit::Fenced(e.to_string());
            }
            // Bounded: past the limit, wait for the chats to catch up before receiving more.
            if chats.in_flight() >= self.settings.max_in_flight {
                tokio::select! {
                    halt = chats.progress() => {
                        if let Some(halt) = halt { break self.chat_exit(halt); }
                        continue;
                    }
                    () = stopped(self.stop.clone()) => break BotExit::Stopped,
                    why = self.lease.lost() => break BotExit::Fenced(why.to_string()),
                }
            }
            // One receive (a long poll) stays in flight while chats make progress beside it:
            // dropping it would close its connection. The lease's fence timer drops it: a
            // worker whose control loop hangs on a dead coordinator link still stops polling
            // by `t_ok + 2/3 · lease`, before anyone else may claim the bot.
            let r = {
                let next = receiver.next();
                tokio::pin!(next);
                loop {
                    tokio::select! {
                        r = &mut next => break Ok(r),
                        halt = chats.progress() => if let Some(halt) = halt { break Err(halt) },
                        m = posted(mailbox) => self.queue_posted(m, chats).await,
                        () = stopped(self.stop.clone()) => break Err(Halt::Stopped),
                        why = self.lease.lost() => break Err(Halt::Fenced(why.to_string())),
                    }
                }
            };
            let r = match r {
                Ok(r) => r,
                Err(halt) => break self.chat_exit(halt),
            };
            let received_at = tokio::time::Instant::now();
            let received_ms = botfleet_core::unix_ms();
            let batch = match r {
                Ok(b) => {
                    if attempt > 0 {
                        // Recovered: clear the error the failures reported.
                        self.report(BotStatus::Running, None);
                    }
                    attempt = 0;
                    self.down_since = None;
                    b
                }
                Err(e) if e.kind() == ErrorKind::Credentials => break self.fail(&e),
                Err(e) => {
                    if let Some(exit) = self.down(&e) {
                        break exit;
                    }
                    self.metrics.platform_error(self.spec.platform, e.reason());
                    if e.kind() == ErrorKind::Conflict {
                        self.report(BotStatus::Running, Some(&e.to_string()));
                    }
                    let wait = wait_after(&e, attempt);
                    warn!(bot = %self.spec.id, error = %e, wait_ms = wait.as_millis() as u64, "receiving failed");
                    attempt += 1;
                    // Sending may work while receiving does not: held turns go on meanwhile.
                    match beside(chats, sleep_or_stop(wait, &mut self.stop)).await {
                        Ok(true) => break BotExit::Stopped,
                        Ok(false) => continue,
                        Err(halt) => break self.chat_exit(halt),
                    }
                }
            };
            // A worker that was frozen acts on nothing it fetched before the freeze.
            if let Err(e) = self.lease.check() {
                break BotExit::Fenced(e.to_string());
            }
            // Recording what arrived is turn work too: it takes one of the worker's slots,
            // so a burst over every bot records a bounded number of batches at a time.
            let _slot = if batch.messages.is_empty() {
                None
            } else {
                let slots = self.settings.slots.clone();
                let stop = self.stop.clone();
                let slot = async {
                    tokio::select! {
                        s = slots.next() => Some(s),
                        () = stopped(stop) => None,
                    }
                };
                // Held turns go on while the worker's slots are all taken.
                match beside(chats, slot).await {
                    Ok(Some(s)) => s,
                    Ok(None) => break BotExit::Stopped,
                    Err(halt) => break self.chat_exit(halt),
                }
            };
            self.metrics
                .delivery_redelivered(self.spec.platform, batch.redelivered);
            for _ in 0..batch.malformed {
                self.metrics
                    .platform_error(self.spec.platform, "malformed_update");
            }
            // Record first, then acknowledge: what the platform forgets, the inbox keeps.
            let (items, events): (Vec<InboxItem>, Vec<&botfleet_core::Inbound>) = batch
                .messages
                .iter()
                .filter_map(|r| {
                    serde_json::to_string(&r.message).ok().map(|message| {
                        let item = InboxItem {
                            key: r.key.clone(),
                            chat: r.message.chat.chat.clone(),
                            message,
                        };
                        (item, &r.message)
                    })
                })
                .unzip();
            let (store, fence) = (self.store.clone(), self.fence);
            let new = if items.is_empty() {
                Vec::new()
            } else {
                match self
                    .store_retry("record messages", || {
                        store.journal_put(&bot, &items, Some(fence), None)
                    })
                    .await
                {
                    Ok((n, _)) => n,
                    Err(exit) => break exit,
                }
            };
            let checkpoint = match receiver.ack(batch.ack).await {
                Ok(c) => {
                    self.metrics
                        .ack_latency(self.spec.platform, received_at.elapsed());
                    c
                }
                Err(e) => {
                    // Unacknowledged deliveries come again; the inbox knows them then.
                    self.metrics.platform_error(self.spec.platform, e.reason());
                    debug!(bot = %bot, error = %e, "acknowledging failed");
                    None
                }
            };
            if let Some(cp) = checkpoint {
                if let Err(exit) = self
                    .store_retry("write the checkpoint", || {
                        store.put_cursor(&bot, &cp, fence)
                    })
                    .await
                {
                    break exit;
                }
            }
            for ((item, event), done) in items.into_iter().zip(events).zip(new) {
                match done {
                    Journaled::New => {}
                    Journaled::Known => {
                        self.metrics.redelivered(self.spec.platform);
                        continue;
                    }
                    // Its chat is handed to a person: recorded, no turn.
                    Journaled::Paused => {
                        self.metrics.received_by(self.spec.id.as_str());
                        self.metrics
                            .count(EVENTS_PAUSED_TOTAL, self.spec.platform, 1);
                        chats.paused(event, received_ms);
                        continue;
                    }
                }
                self.metrics.received_by(self.spec.id.as_str());
                chats.dispatch_new(item, event, received_ms);
            }
        };
        // A stop or hand-over writes the checkpoint the platform kept behind (Discord's
        // sessions), while the claim is still ours: the next owner resumes from here.
        if matches!(exit, BotExit::Stopped) && self.lease.check().is_ok() {
            if let Some(cp) = receiver.pending_checkpoint() {
                let (store, bot, fence) = (self.store.clone(), self.spec.id.clone(), self.fence);
                if let Err(e) = store.put_cursor(&bot, &cp, fence).await {
                    debug!(bot = %bot, error = %e, "could not write the last checkpoint; the next owner resumes from the one before");
                }
            }
        }
        receiver.close().await;
        exit
    }
}

/// How many pending entries of a chat a nudge reads at most.
const MAILBOX_READ: usize = 1_000;

/// Awaits `f` while the bot's chat queues make progress beside it (held turns looked at when
/// a part comes or a timer of theirs is due, the next turns started). `Err` when a queue
/// stopped the bot meanwhile (`f` is dropped then).
async fn beside<F: std::future::Future>(chats: &mut Chats, f: F) -> Result<F::Output, Halt> {
    tokio::pin!(f);
    loop {
        tokio::select! {
            r = &mut f => return Ok(r),
            halt = chats.progress() => {
                if let Some(halt) = halt {
                    return Err(halt);
                }
            }
        }
    }
}

/// `mailbox`, once something is posted to it (never without one).
async fn posted(mailbox: Option<&crate::sends::MailboxGuard>) -> &crate::sends::MailboxGuard {
    match mailbox {
        Some(m) => {
            m.posted().await;
            m
        }
        None => std::future::pending().await,
    }
}

/// Keeps `bots_running` right however the task ends.
struct RunningGuard {
    metrics: Arc<Metrics>,
    platform: botfleet_core::Platform,
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.metrics.running(self.platform, -1);
    }
}
