//! Running one bot: wait for a start slot, check the token, long-poll, hand each chat's
//! messages to the handler one at a time, send the answers, advance the fenced cursor.

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use botfleet_coord::LeaseHandle;
use botfleet_core::{BotSpec, BotStatus, Fence, Inbound, Outbound};
use botfleet_store::{Store, StoreError};
use botfleet_telegram::{parse_update, BotApi, TelegramClient, TelegramError, Update};
use futures_util::future::join_all;
use tokio::sync::{oneshot, watch};
use tracing::{debug, info, warn};

use crate::{handler::Handler, metrics::Metrics, reporter::Reporter, starter::Starter};

/// Why a bot task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BotExit {
    /// Asked to stop (hand-over, disable, shutdown).
    Stopped,
    /// The worker may no longer act for it: lease not safe, or a newer fence exists.
    Fenced(String),
    /// Needs an operator (bad token, unusable spec). Not retried until restarted.
    Failed(String),
}

/// Everything a bot task needs; owned by the task.
pub(crate) struct BotCtx {
    pub(crate) spec: BotSpec,
    pub(crate) fence: Fence,
    pub(crate) worker: String,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) telegram: TelegramClient,
    pub(crate) handler: Handler,
    pub(crate) lease: LeaseHandle,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) starter: Starter,
    pub(crate) reporter: Reporter,
    pub(crate) stop: watch::Receiver<bool>,
}

/// Resolves once a stop is asked for (or the worker that could ask is gone).
async fn stopped(mut stop: watch::Receiver<bool>) {
    loop {
        if *stop.borrow_and_update() {
            return;
        }
        if stop.changed().await.is_err() {
            return;
        }
    }
}

/// Sleeps `d`, or less if asked to stop; answers whether it was asked to stop.
async fn sleep_or_stop(d: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    if *stop.borrow() {
        return true;
    }
    tokio::select! {
        () = tokio::time::sleep(d) => *stop.borrow(),
        r = stop.changed() => r.is_err() || *stop.borrow(),
    }
}

/// Capped exponential backoff with jitter: attempt 0 → ~0.5 s, doubling, at most ~30 s.
fn backoff(attempt: u32) -> Duration {
    static SEED: AtomicU64 = AtomicU64::new(0x2545_f491_4f6c_dd1d);
    let base = 500u64.saturating_mul(1 << attempt.min(6)).min(30_000);
    // xorshift: cheap jitter, no need for a crypto RNG; spreads retries of many bots.
    let mut x = SEED.load(Ordering::Relaxed);
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    SEED.store(x, Ordering::Relaxed);
    Duration::from_millis(base / 2 + x % (base / 2 + 1))
}

impl BotCtx {
    fn report(&self, status: BotStatus, error: Option<&str>) {
        self.reporter
            .report(&self.spec.id, status, error, &self.worker);
    }

    async fn fail(&self, reason: &'static str, detail: String) -> BotExit {
        warn!(bot = %self.spec.id, reason, detail = %detail, "bot failed; not retrying until restarted");
        self.metrics.start_failure(self.spec.platform, reason);
        self.report(BotStatus::Failed, Some(&detail));
        BotExit::Failed(detail)
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

    /// The whole life of a Telegram bot on this worker.
    pub(crate) async fn run(mut self) -> BotExit {
        let api = match BotApi::new(self.spec.options.api_url.as_deref(), &self.spec.token) {
            Ok(a) => a,
            Err(e) => return self.fail("bad_api_url", e.to_string()).await,
        };
        if !self.wait_for_slot().await {
            return BotExit::Stopped;
        }
        // getMe: a bad token fails fast; transient errors are retried.
        let mut attempt = 0;
        loop {
            if let Err(e) = self.lease.check() {
                return BotExit::Fenced(e.to_string());
            }
            let r = tokio::select! {
                r = self.telegram.get_me(&api) => r,
                () = stopped(self.stop.clone()) => return BotExit::Stopped,
            };
            match r {
                Ok(me) => {
                    debug!(bot = %self.spec.id, telegram_id = me.id, "token accepted");
                    break;
                }
                Err(TelegramError::Unauthorized(d)) => {
                    return self
                        .fail(
                            "unauthorized",
                            format!("Telegram refused the token (401): {d}"),
                        )
                        .await;
                }
                Err(e @ TelegramError::Refused { .. }) => {
                    return self.fail("refused", e.to_string()).await;
                }
                Err(e) => {
                    self.metrics.platform_error(self.spec.platform, e.reason());
                    warn!(bot = %self.spec.id, error = %e, "getMe failed; retrying");
                    if sleep_or_stop(backoff(attempt), &mut self.stop).await {
                        return BotExit::Stopped;
                    }
                    attempt += 1;
                }
            }
        }
        let mut offset: i64 = match self.store.cursor(&self.spec.id).await {
            Ok(Some(c)) => c.value.parse().unwrap_or(0),
            Ok(None) => 0,
            Err(e) => {
                warn!(bot = %self.spec.id, error = %e, "cannot read the cursor; starting from the platform's");
                0
            }
        };
        self.metrics.running(self.spec.platform, 1);
        let _running = RunningGuard {
            metrics: self.metrics.clone(),
            platform: self.spec.platform,
        };
        self.report(BotStatus::Running, None);
        info!(bot = %self.spec.id, fence = self.fence.get(), offset, "bot running");
        let mut attempt = 0;
        loop {
            if let Err(e) = self.lease.check() {
                return BotExit::Fenced(e.to_string());
            }
            let r = tokio::select! {
                r = self.telegram.get_updates(&api, offset) => r,
                () = stopped(self.stop.clone()) => return BotExit::Stopped,
            };
            let updates = match r {
                Ok(u) => {
                    if attempt > 0 {
                        // Recovered: clear the error the failures reported.
                        self.report(BotStatus::Running, None);
                    }
                    attempt = 0;
                    u
                }
                Err(e) => {
                    self.metrics.platform_error(self.spec.platform, e.reason());
                    let wait = match &e {
                        TelegramError::Unauthorized(d) => {
                            return self
                                .fail(
                                    "unauthorized",
                                    format!("Telegram refused the token (401): {d}"),
                                )
                                .await;
                        }
                        TelegramError::RateLimited(d) => *d,
                        TelegramError::Conflict(_) => {
                            // Another poller or a webhook holds the token: report, back off.
                            self.report(BotStatus::Running, Some(&e.to_string()));
                            backoff(attempt.max(3))
                        }
                        _ => backoff(attempt),
                    };
                    warn!(bot = %self.spec.id, error = %e, wait_ms = wait.as_millis() as u64, "getUpdates failed");
                    attempt += 1;
                    if sleep_or_stop(wait, &mut self.stop).await {
                        return BotExit::Stopped;
                    }
                    continue;
                }
            };
            if updates.is_empty() {
                continue;
            }
            // A worker that was frozen acts on nothing it fetched before the freeze.
            if let Err(e) = self.lease.check() {
                return BotExit::Fenced(e.to_string());
            }
            let next = updates
                .iter()
                .filter_map(|u| u.update_id)
                .max()
                .map_or(offset, |m| m + 1)
                .max(offset);
            if next == offset {
                // Updates without a usable id cannot be confirmed; do not spin on them.
                self.metrics
                    .platform_error(self.spec.platform, "malformed_update");
                warn!(bot = %self.spec.id, "updates without update_id; backing off");
                if sleep_or_stop(backoff(4), &mut self.stop).await {
                    return BotExit::Stopped;
                }
                continue;
            }
            let mut chats: BTreeMap<String, Vec<Inbound>> = BTreeMap::new();
            for raw in &updates {
                match parse_update(&self.spec.id, raw) {
                    Update::Message(m) => {
                        self.metrics.received();
                        chats.entry(m.chat.chat.clone()).or_default().push(m);
                    }
                    Update::Ignored => {}
                    Update::Malformed(why) => {
                        self.metrics
                            .platform_error(self.spec.platform, "malformed_update");
                        debug!(bot = %self.spec.id, why = %why, "malformed update skipped");
                    }
                }
            }
            // Chats in parallel; within a chat, one message at a time, in order.
            let (this, api) = (&self, &api);
            let results = join_all(chats.into_values().map(|msgs| async move {
                for m in msgs {
                    this.handle(api, &m).await?;
                }
                Ok(())
            }))
            .await;
            if let Some(Err(exit)) = results.into_iter().find(Result::is_err) {
                return exit;
            }
            // Advance the cursor only now that the batch is handled, under our fence.
            let mut tries = 0;
            loop {
                match self
                    .store
                    .put_cursor(&self.spec.id, &next.to_string(), self.fence)
                    .await
                {
                    Ok(()) => break,
                    Err(StoreError::StaleFence { current, .. }) => {
                        return BotExit::Fenced(format!("a newer fence {current} owns this bot"));
                    }
                    Err(e) => {
                        warn!(bot = %self.spec.id, error = %e, "cannot write the cursor; retrying");
                        if sleep_or_stop(backoff(tries), &mut self.stop).await {
                            return BotExit::Stopped;
                        }
                        tries += 1;
                    }
                }
            }
            offset = next;
        }
    }

    /// Answers one message. Errors are exits (the worker may no longer act).
    async fn handle(&self, api: &BotApi, m: &Inbound) -> Result<(), BotExit> {
        let answer = match self.handler.answer(m).await {
            Ok(a) => a,
            Err(e) => {
                warn!(bot = %self.spec.id, chat = %m.chat.chat, error = %e, "handler failed; message not answered");
                self.metrics.platform_error(self.spec.platform, "handler");
                return Ok(());
            }
        };
        let Some(text) = answer else {
            return Ok(());
        };
        let out = Outbound::reply_to(m, text);
        // A replay (after a crash or a freeze of the previous owner) skips what was sent.
        match self
            .store
            .is_sent(&self.spec.id, &out.idempotency_key)
            .await
        {
            Ok(true) => {
                debug!(bot = %self.spec.id, key = %out.idempotency_key, "already answered");
                return Ok(());
            }
            Ok(false) => {}
            Err(e) => {
                warn!(bot = %self.spec.id, error = %e, "cannot check the sent marks; sending")
            }
        }
        let mut attempt = 0;
        loop {
            // Check before every act the platform can observe.
            self.lease
                .check()
                .map_err(|e| BotExit::Fenced(e.to_string()))?;
            match botfleet_telegram::send(&self.telegram, api, &out).await {
                Ok(()) => {
                    self.metrics.sent();
                    if let Err(e) = self
                        .store
                        .mark_sent(&self.spec.id, &out.idempotency_key)
                        .await
                    {
                        warn!(bot = %self.spec.id, error = %e, "cannot record a sent reply");
                    }
                    return Ok(());
                }
                Err(TelegramError::RateLimited(d)) if attempt < 5 => {
                    self.metrics
                        .platform_error(self.spec.platform, "rate_limited");
                    tokio::time::sleep(d).await;
                }
                Err(e) if e.is_transient() && attempt < 5 => {
                    self.metrics.platform_error(self.spec.platform, e.reason());
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Err(TelegramError::Unauthorized(d)) => {
                    return Err(BotExit::Failed(format!(
                        "Telegram refused the token (401): {d}"
                    )));
                }
                Err(e) => {
                    self.metrics.platform_error(self.spec.platform, e.reason());
                    warn!(bot = %self.spec.id, chat = %m.chat.chat, error = %e, "reply not sent");
                    return Ok(());
                }
            }
            attempt += 1;
        }
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
