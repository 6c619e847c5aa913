//! A bot's chat queues: each chat's messages are answered one at a time, in the order they
//! were recorded; different chats run in parallel, so no chat waits for another.
//!
//! A queue's task runs the handler (transient failures retried with capped backoff for a
//! bounded time, while the other chats go on), checks the lease before every act the platform
//! can observe, sends the reply and marks the inbox entry done, under the claim's fence. A
//! message the handler or the platform refuses, or that keeps failing past the retry window,
//! is recorded as undeliverable, never dropped silently. A queue whose messages are all done
//! is let go (its task ends) and made again by the next message of its chat.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use botfleet_coord::LeaseHandle;
use botfleet_core::{BotId, Fence, Inbound, Outbound, Platform};
use botfleet_platform::{ErrorKind, PlatformError, Sender};
use botfleet_store::{InboxEntry, InboxItem, InboxOutcome, Store, StoreError};
use tokio::{
    sync::{mpsc, watch, Notify},
    task::JoinSet,
};
use tracing::{debug, warn};

use crate::{
    bot::{backoff, sleep_or_stop},
    handler::Handler,
    metrics::Metrics,
};

/// Queues kept before idle ones (every message done) are let go.
const IDLE_SWEEP_AT: usize = 64;

/// What the queues of one bot share.
pub(crate) struct ChatsCtx {
    pub(crate) bot: BotId,
    pub(crate) platform: Platform,
    pub(crate) fence: Fence,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) sender: Arc<dyn Sender>,
    pub(crate) handler: Handler,
    pub(crate) lease: LeaseHandle,
    pub(crate) metrics: Arc<Metrics>,
    /// How long transient failures of one message are retried.
    pub(crate) retry_for: Duration,
    pub(crate) stop: watch::Receiver<bool>,
}

/// Why a queue stopped the whole bot.
#[derive(Debug)]
pub(crate) enum ChatExit {
    /// The worker may no longer act for the bot.
    Fenced(String),
    /// The platform refused the credentials while sending.
    Failed(PlatformError),
}

/// Why a queue stopped.
enum Halt {
    /// Asked to stop: what is left stays pending for whoever runs the bot next.
    Stopped,
    Exit(ChatExit),
}

/// A recorded message waiting in its chat's queue.
struct Job {
    key: String,
    message: String,
}

struct Queue {
    tx: mpsc::UnboundedSender<Job>,
    /// Messages of this chat not done yet.
    in_flight: Arc<AtomicUsize>,
}

/// The chat queues of one bot. Owned by the bot's task; the queue tasks end with it.
pub(crate) struct Chats {
    ctx: Arc<ChatsCtx>,
    queues: HashMap<String, Queue>,
    tasks: JoinSet<()>,
    in_flight: Arc<AtomicUsize>,
    progress: Arc<Notify>,
    exits_tx: mpsc::UnboundedSender<ChatExit>,
    exits_rx: mpsc::UnboundedReceiver<ChatExit>,
}

impl Chats {
    pub(crate) fn new(ctx: ChatsCtx) -> Self {
        let (exits_tx, exits_rx) = mpsc::unbounded_channel();
        Self {
            ctx: Arc::new(ctx),
            queues: HashMap::new(),
            tasks: JoinSet::new(),
            in_flight: Arc::new(AtomicUsize::new(0)),
            progress: Arc::new(Notify::new()),
            exits_tx,
            exits_rx,
        }
    }

    /// Messages received and not done yet.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Queues a recorded entry (a replay of what a predecessor left pending).
    pub(crate) fn dispatch(&mut self, e: InboxEntry) {
        self.push(e.chat, e.key, e.message);
    }

    /// Queues a message just recorded.
    pub(crate) fn dispatch_new(&mut self, item: InboxItem) {
        self.push(item.chat, item.key, item.message);
    }

    fn push(&mut self, chat: String, key: String, message: String) {
        if self.queues.len() >= IDLE_SWEEP_AT {
            // Dropping an idle queue's sender ends its task; the chat gets a new one later.
            self.queues
                .retain(|_, q| q.in_flight.load(Ordering::SeqCst) > 0);
            while self.tasks.try_join_next().is_some() {}
        }
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let mut job = Job { key, message };
        if let Some(q) = self.queues.get(&chat) {
            q.in_flight.fetch_add(1, Ordering::SeqCst);
            match q.tx.send(job) {
                Ok(()) => return,
                Err(e) => {
                    // Its task ended (stopped): start another.
                    q.in_flight.fetch_sub(1, Ordering::SeqCst);
                    job = e.0;
                }
            }
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let queue_in_flight = Arc::new(AtomicUsize::new(1));
        let _ = tx.send(job);
        self.tasks.spawn(run_queue(
            self.ctx.clone(),
            rx,
            queue_in_flight.clone(),
            self.in_flight.clone(),
            self.progress.clone(),
            self.exits_tx.clone(),
        ));
        self.queues.insert(
            chat,
            Queue {
                tx,
                in_flight: queue_in_flight,
            },
        );
    }

    /// Resolves when a queue stopped the bot.
    pub(crate) async fn exited(&mut self) -> ChatExit {
        match self.exits_rx.recv().await {
            Some(e) => e,
            // Unreachable while `self` holds a sender.
            None => std::future::pending().await,
        }
    }

    /// Resolves when fewer than `limit` messages are in flight (`None`), or a queue stopped
    /// the bot (`Some`).
    pub(crate) async fn wait_below(&mut self, limit: usize) -> Option<ChatExit> {
        loop {
            let progressed = self.progress.notified();
            tokio::pin!(progressed);
            progressed.as_mut().enable();
            if self.in_flight() < limit {
                return None;
            }
            tokio::select! {
                () = progressed => {}
                e = self.exits_rx.recv() => return e,
            }
        }
    }

    /// Ends the queues: each finishes the message it is on (up to `limit`), the rest stays
    /// pending in the inbox for the next owner.
    pub(crate) async fn finish(mut self, limit: Duration) {
        self.queues.clear();
        let deadline = tokio::time::sleep(limit);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                r = self.tasks.join_next() => if r.is_none() { return },
                () = &mut deadline => {
                    self.tasks.abort_all();
                    return;
                }
            }
        }
    }
}

async fn run_queue(
    ctx: Arc<ChatsCtx>,
    mut rx: mpsc::UnboundedReceiver<Job>,
    queue_in_flight: Arc<AtomicUsize>,
    in_flight: Arc<AtomicUsize>,
    progress: Arc<Notify>,
    exits: mpsc::UnboundedSender<ChatExit>,
) {
    let mut stop = ctx.stop.clone();
    loop {
        let job = tokio::select! {
            j = rx.recv() => match j { Some(j) => j, None => return },
            () = crate::bot::stopped(stop.clone()) => return,
        };
        match answer(&ctx, &job, &mut stop).await {
            Ok(()) => {}
            Err(Halt::Stopped) => return,
            Err(Halt::Exit(e)) => {
                let _ = exits.send(e);
                return;
            }
        }
        queue_in_flight.fetch_sub(1, Ordering::SeqCst);
        in_flight.fetch_sub(1, Ordering::SeqCst);
        progress.notify_waiters();
    }
}

/// Checks before an act the platform can observe.
fn may_act(ctx: &ChatsCtx, stop: &watch::Receiver<bool>) -> Result<(), Halt> {
    if *stop.borrow() {
        return Err(Halt::Stopped);
    }
    ctx.lease
        .check()
        .map_err(|e| Halt::Exit(ChatExit::Fenced(e.to_string())))
}

/// Answers one message: handler, reply, inbox entry done.
async fn answer(ctx: &ChatsCtx, job: &Job, stop: &mut watch::Receiver<bool>) -> Result<(), Halt> {
    let msg: Inbound = match serde_json::from_str(&job.message) {
        Ok(m) => m,
        Err(e) => {
            return undeliverable(ctx, job, format!("recorded message unreadable: {e}"), stop)
                .await;
        }
    };
    let started = Instant::now();
    let mut attempt = 0;
    let reply = loop {
        may_act(ctx, stop)?;
        match ctx.handler.answer(&msg).await {
            Ok(a) => break a,
            Err(e) if e.is_transient() && started.elapsed() < ctx.retry_for => {
                ctx.metrics.handler_retry(ctx.platform);
                let wait = backoff(attempt);
                warn!(bot = %ctx.bot, chat = %msg.chat.chat, error = %e, wait_ms = wait.as_millis() as u64, "handler failed; retrying this chat's message");
                if sleep_or_stop(wait, stop).await {
                    return Err(Halt::Stopped);
                }
                attempt += 1;
            }
            Err(e) => {
                ctx.metrics.platform_error(ctx.platform, "handler");
                return undeliverable(ctx, job, format!("handler: {e}"), stop).await;
            }
        }
    };
    if let Some(text) = reply {
        let out = Outbound::reply_to(&msg, text);
        let mut attempt = 0;
        loop {
            // Checked before every send: a frozen or fenced worker sends nothing.
            may_act(ctx, stop)?;
            match ctx.sender.send(&out).await {
                Ok(()) => {
                    ctx.metrics.sent();
                    ctx.metrics.reply_latency(ctx.platform, started.elapsed());
                    break;
                }
                Err(e) if e.kind() == ErrorKind::Credentials => {
                    return Err(Halt::Exit(ChatExit::Failed(e)));
                }
                Err(e) => {
                    ctx.metrics.platform_error(ctx.platform, e.reason());
                    // Rejected: this message cannot be sent as it is. Anything else is retried
                    // (an unreadable reply may hide a sent message: at least once, not at most).
                    let retry = !matches!(e.kind(), ErrorKind::Rejected)
                        && started.elapsed() < ctx.retry_for;
                    if !retry {
                        return undeliverable(ctx, job, format!("send: {e}"), stop).await;
                    }
                    let wait = match e.kind() {
                        ErrorKind::RateLimited(d) => d,
                        _ => backoff(attempt),
                    };
                    debug!(bot = %ctx.bot, error = %e, "send failed; retrying");
                    if sleep_or_stop(wait, stop).await {
                        return Err(Halt::Stopped);
                    }
                    attempt += 1;
                }
            }
        }
    }
    finish(ctx, job, &InboxOutcome::Done, stop).await
}

async fn undeliverable(
    ctx: &ChatsCtx,
    job: &Job,
    why: String,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), Halt> {
    warn!(bot = %ctx.bot, key = %job.key, reason = %why, "message undeliverable");
    ctx.metrics.undeliverable(ctx.platform);
    finish(ctx, job, &InboxOutcome::Undeliverable(why), stop).await
}

/// Ends the inbox entry under the fence, retrying through store failures.
async fn finish(
    ctx: &ChatsCtx,
    job: &Job,
    outcome: &InboxOutcome,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), Halt> {
    let mut tries = 0;
    loop {
        match ctx
            .store
            .inbox_finish(&ctx.bot, &job.key, outcome, ctx.fence)
            .await
        {
            Ok(()) | Err(StoreError::NotFound(_)) => return Ok(()),
            Err(StoreError::StaleFence { current, .. }) => {
                return Err(Halt::Exit(ChatExit::Fenced(format!(
                    "a newer fence {current} owns this bot"
                ))));
            }
            // Not cut short by a stop: once a reply is out, recording it is what keeps the next
            // owner from sending it again.
            Err(e) if tries < 6 => {
                warn!(bot = %ctx.bot, error = %e, "cannot record an answered message; retrying");
                tokio::time::sleep(backoff(tries).min(Duration::from_secs(2))).await;
                tries += 1;
            }
            Err(e) => {
                warn!(bot = %ctx.bot, error = %e, "cannot record an answered message; the next owner may answer it again");
                return if *stop.borrow() {
                    Err(Halt::Stopped)
                } else {
                    Ok(())
                };
            }
        }
    }
}
