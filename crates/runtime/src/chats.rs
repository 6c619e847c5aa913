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
    collections::{HashMap, VecDeque},
    sync::Arc,
    time::{Duration, Instant},
};

use botfleet_coord::LeaseHandle;
use botfleet_core::{BotId, Fence, Inbound, Outbound, Platform};
use botfleet_platform::{ErrorKind, PlatformError, Sender};
use botfleet_store::{InboxEntry, InboxItem, InboxOutcome, Store, StoreError};
use tokio::{sync::watch, task::JoinSet};
use tracing::{debug, warn};

use crate::{
    bot::{backoff, sleep_or_stop},
    handler::Handler,
    metrics::Metrics,
};

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

/// Why a message was left where it was.
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

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    busy: bool,
}

/// The chat queues of one bot, driven by the bot's task: a chat with messages has one task
/// answering its oldest; when it is done the next one starts. An idle chat holds nothing, so
/// ten thousand idle bots cost no queue at all.
pub(crate) struct Chats {
    ctx: Arc<ChatsCtx>,
    /// Per chat with messages not done: its queue (the front one is being answered while
    /// `busy`). A chat is here only while it has some.
    waiting: HashMap<String, Queue>,
    /// One task per chat whose message is being answered; each answers with its chat.
    answering: JoinSet<(String, Result<(), Halt>)>,
    in_flight: usize,
}

impl Chats {
    pub(crate) fn new(ctx: ChatsCtx) -> Self {
        Self {
            ctx: Arc::new(ctx),
            waiting: HashMap::new(),
            answering: JoinSet::new(),
            in_flight: 0,
        }
    }

    /// Messages received and not done yet.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight
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
        self.in_flight += 1;
        let q = self.waiting.entry(chat.clone()).or_default();
        q.jobs.push_back(Job { key, message });
        if !q.busy {
            self.start_next(chat);
        }
    }

    /// Starts answering the chat's oldest waiting message (it leaves the queue; the chat is
    /// busy until its task is done), or forgets the chat when nothing waits.
    fn start_next(&mut self, chat: String) {
        let Some(q) = self.waiting.get_mut(&chat) else {
            return;
        };
        let Some(job) = q.jobs.pop_front() else {
            self.waiting.remove(&chat);
            return;
        };
        q.busy = true;
        let ctx = self.ctx.clone();
        self.answering.spawn(async move {
            let mut stop = ctx.stop.clone();
            let r = answer(&ctx, &job, &mut stop).await;
            (chat, r)
        });
    }

    /// Waits for a chat's message to be done, and starts that chat's next. Answers `Some`
    /// when a queue stopped the bot; pends while nothing is being answered.
    pub(crate) async fn progress(&mut self) -> Option<ChatExit> {
        loop {
            let Some(done) = self.answering.join_next().await else {
                return std::future::pending().await;
            };
            let Ok((chat, result)) = done else {
                continue; // aborted (shutting down)
            };
            match result {
                Ok(()) => {
                    self.in_flight = self.in_flight.saturating_sub(1);
                    if let Some(q) = self.waiting.get_mut(&chat) {
                        q.busy = false;
                    }
                    self.start_next(chat);
                    return None;
                }
                Err(Halt::Stopped) => {}
                Err(Halt::Exit(e)) => return Some(e),
            }
        }
    }

    /// Ends the queues: each chat finishes the message it is on (up to `limit`), the rest
    /// stays pending in the inbox for the next owner.
    pub(crate) async fn finish(mut self, limit: Duration) {
        self.waiting.clear();
        let deadline = tokio::time::sleep(limit);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                r = self.answering.join_next() => if r.is_none() { return },
                () = &mut deadline => {
                    self.answering.abort_all();
                    return;
                }
            }
        }
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
