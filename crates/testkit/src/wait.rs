//! Waiting for a condition with a deadline, instead of sleeping and hoping.

use std::{future::Future, time::Duration};

/// Polls `cond` every 10 ms until it returns `Some`, or panics with `what` after `limit`.
///
/// # Panics
/// When the deadline passes: the test fails with a message naming the condition.
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, cond: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    wait_for_or(what, limit, cond, String::new).await
}

/// [`wait_for`], and when the deadline passes the panic message carries `context()` too (what
/// the fakes saw, the workers' logs): a failure on a CI machine says why, not only what.
///
/// # Panics
/// When the deadline passes.
pub async fn wait_for_or<T, F, Fut>(
    what: &str,
    limit: Duration,
    mut cond: F,
    context: impl FnOnce() -> String,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = cond().await {
            return v;
        }
        if tokio::time::Instant::now() >= deadline {
            let context = context();
            let sep = if context.is_empty() { "" } else { "\n" };
            panic!("timed out after {limit:?} waiting for: {what}{sep}{context}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
