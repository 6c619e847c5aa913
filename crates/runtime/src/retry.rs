//! Waiting between tries: capped exponential backoff with jitter, and waits that end at once
//! when a stop is asked for. Shared by the bot task, the turn pipeline and the hooks.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use botfleet_platform::{ErrorKind, PlatformError};
use tokio::sync::watch;

/// Capped exponential backoff with jitter: attempt 0 → ~0.5 s, doubling, at most ~30 s.
pub(crate) fn backoff(attempt: u32) -> Duration {
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

/// How long to wait after a retryable platform failure, `attempt` failures in a row: what a
/// rate limit says, a slow backoff for a conflict (another poller or a webhook holds the
/// token: no hurry), else [`backoff`].
pub(crate) fn wait_after(e: &PlatformError, attempt: u32) -> Duration {
    match e.kind() {
        ErrorKind::RateLimited(d) => d,
        ErrorKind::Conflict => backoff(attempt.max(3)),
        _ => backoff(attempt),
    }
}

/// Resolves once a stop is asked for (or the side that could ask is gone).
pub(crate) async fn stopped(mut stop: watch::Receiver<bool>) {
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
pub(crate) async fn sleep_or_stop(d: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    if *stop.borrow() {
        return true;
    }
    tokio::select! {
        () = tokio::time::sleep(d) => *stop.borrow(),
        r = stop.changed() => r.is_err() || *stop.borrow(),
    }
}
