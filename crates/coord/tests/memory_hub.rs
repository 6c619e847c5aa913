//! What only the in-memory hub has: simulated crashes and wipes, and a clock it is told.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{sync::Arc, time::Duration};

use botfleet_coord::{ClaimOutcome, Coordinator, EventCursor, LifecycleEvent, MemoryHub, Renewal};
use botfleet_core::{Fence, ManualClock};
use botfleet_testkit::coord_suite::{bid, meta, wid};

#[tokio::test]
async fn a_crashed_worker_keeps_its_liveness_until_the_lease_ends() {
    let clock = ManualClock::new();
    let hub = MemoryHub::with_clock(Arc::new(clock.clone()));
    let (a, b) = (hub.coordinator(), hub.coordinator());
    let lease = Duration::from_secs(10);
    a.register(&wid("w-a"), &meta(), lease).await.unwrap();
    b.register(&wid("w-b"), &meta(), lease).await.unwrap();
    a.claim(&bid("bot"), Fence::ZERO).await.unwrap();
    hub.crash(&a);
    assert!(a.renew(0).await.unwrap_err().is_transient());
    clock.advance(Duration::from_millis(9_999));
    assert_eq!(b.renew(0).await.unwrap(), Renewal::Renewed);
    assert!(matches!(
        b.claim(&bid("bot"), Fence::ZERO).await.unwrap(),
        ClaimOutcome::Held(_)
    ));
    clock.advance(Duration::from_millis(1));
    assert!(matches!(
        b.claim(&bid("bot"), Fence::ZERO).await.unwrap(),
        ClaimOutcome::Granted(Fence(2))
    ));
    assert_eq!(b.live_workers().await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_wipe_loses_everything_like_a_redis_restart() {
    let hub = MemoryHub::new();
    let a = hub.coordinator();
    a.register(&wid("w-a"), &meta(), Duration::from_secs(10))
        .await
        .unwrap();
    a.claim(&bid("bot"), Fence::ZERO).await.unwrap();
    hub.wipe();
    assert_eq!(a.renew(0).await.unwrap(), Renewal::Lost);
    assert!(a.owner(&bid("bot")).await.unwrap().is_none());
    a.register(&wid("w-a"), &meta(), Duration::from_secs(10))
        .await
        .unwrap();
    // The caller's minimum keeps fences growing across the loss.
    assert_eq!(
        a.claim(&bid("bot"), Fence(1)).await.unwrap(),
        ClaimOutcome::Granted(Fence(2))
    );
}

#[tokio::test]
async fn the_event_log_is_bounded() {
    let hub = MemoryHub::new();
    let a = hub.coordinator();
    for i in 0..10_050 {
        a.publish(&LifecycleEvent::Activate(bid(&format!("b{i}"))))
            .await
            .unwrap();
    }
    let all = a
        .read_events(&EventCursor::START, 20_000, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(all.len(), 10_000);
    assert_eq!(all[0].1, LifecycleEvent::Activate(bid("b50")));
}
