//! Waiting for a condition with a deadline, instead of sleeping and hoping.

use std::{future::Future, time::Duration};

/// Polls `cond` every 10 ms until it returns `Some`, or panics with `what` after `limit`.
///
/// # Panics
/// When the deadline passes: the test fails with a message naming the condition.
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut cond: F) -> T
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
            panic!("timed out after {limit:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
