//! botfleet as a library: work that one process of the fleet must do at a time (a nightly
//! report, a billing sweep), with `Coordinator::try_lead` and a fenced write.
//!
//! Two replicas contend for the job `nightly-report`. The leader holds it for a TTL and renews
//! it by calling `try_lead` again; every grant carries a fence that grows. The work's result is
//! written with that fence, so when a leader stalls past its TTL (a GC pause, a frozen VM) and
//! another takes over, the stale leader's late write is refused by the store instead of
//! overwriting the newer one.
//!
//! Run with: `cargo run -p example-leader-election` (in memory), or with
//! `BOTFLEET_REDIS_URL=redis://127.0.0.1:6379` for the fleet's Redis coordinator.

use std::{sync::Arc, time::Duration};

use botfleet_coord::{Coordinator, MemoryHub, RedisConfig, RedisCoordinator, WorkerMeta};
use botfleet_core::{BotId, Fence, WorkerId};
use botfleet_store::{Store, StoreError};

const JOB: &str = "nightly-report";
const TTL: Duration = Duration::from_millis(1500);

/// Two coordinator handles (one per replica): the in-memory hub, or Redis when
/// `BOTFLEET_REDIS_URL` is set.
async fn replicas() -> anyhow::Result<(Arc<dyn Coordinator>, Arc<dyn Coordinator>)> {
    Ok(match std::env::var("BOTFLEET_REDIS_URL") {
        Ok(url) => {
            let prefix = format!("example-lead-{}", std::process::id());
            let one =
                || RedisCoordinator::connect(RedisConfig::new(url.clone()).prefix(prefix.clone()));
            (Arc::new(one().await?), Arc::new(one().await?))
        }
        Err(_) => {
            let hub = MemoryHub::new();
            (Arc::new(hub.coordinator()), Arc::new(hub.coordinator()))
        }
    })
}

async fn register(c: &dyn Coordinator, id: &str) -> anyhow::Result<()> {
    let meta = WorkerMeta {
        host: "example".into(),
        capacity: 1,
        started_at_ms: 0,
        bots_held: 0,
        rss_bytes: 0,
    };
    c.register(&WorkerId::new(id)?, &meta, Duration::from_secs(10))
        .await?;
    Ok(())
}

/// The leader's work: a result written under the fence of its grant.
async fn write_report(
    store: &dyn Store,
    job: &BotId,
    text: &str,
    fence: Fence,
) -> Result<(), StoreError> {
    store.put_cursor(job, text, fence).await
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (a, b) = replicas().await?;
    register(&*a, "replica-a").await?;
    register(&*b, "replica-b").await?;
    // Where results go: any store (SQLite, Postgres) refuses writes under an older fence.
    let store = botfleet_store::open("sqlite::memory:").await?;
    // Where the job's result lives: a fenced cursor of its own id.
    let job = BotId::new("job.nightly-report")?;

    // a leads; b, asking meanwhile, does not.
    let fence_a = a
        .try_lead(JOB, TTL)
        .await?
        .ok_or_else(|| anyhow::anyhow!("a should lead a free job"))?;
    assert_eq!(b.try_lead(JOB, TTL).await?, None, "one leader at a time");
    // Calling again renews (same fence).
    assert_eq!(a.try_lead(JOB, TTL).await?, Some(fence_a));
    write_report(&*store, &job, "report by a", fence_a).await?;
    println!("replica-a leads {JOB} with fence {fence_a:?} and wrote its report");

    // a stalls past its TTL without renewing; b takes over with a higher fence.
    tokio::time::sleep(TTL + Duration::from_millis(200)).await;
    let fence_b = b
        .try_lead(JOB, TTL)
        .await?
        .ok_or_else(|| anyhow::anyhow!("b should lead once a's TTL ran out"))?;
    assert!(fence_b > fence_a);
    write_report(&*store, &job, "report by b", fence_b).await?;
    println!("replica-a stalled; replica-b leads with fence {fence_b:?} and wrote its report");

    // a wakes up and, not knowing, writes its stale result: refused.
    match write_report(&*store, &job, "late report by a", fence_a).await {
        Err(StoreError::StaleFence { .. }) => {
            println!("replica-a's late write under fence {fence_a:?} was refused: the store keeps b's report");
        }
        other => anyhow::bail!("a stale leader's write must be refused, got {other:?}"),
    }
    let kept = store.cursor(&job).await?.map(|c| c.value);
    assert_eq!(kept.as_deref(), Some("report by b"));
    // And a asking again learns it no longer leads.
    assert_eq!(a.try_lead(JOB, TTL).await?, None);
    println!("replica-a asks again: not the leader");
    Ok(())
}
