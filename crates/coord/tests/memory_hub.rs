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
    let first = match a.claim(&bid("bot"), Fence::ZERO).await.unwrap() {
        ClaimOutcome::Granted(f) => f,
        other => panic!("{other:?}"),
    };
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
        b.claim(&bid("bot"), first).await.unwrap(),
        ClaimOutcome::Granted(f) if f > first
    ));
    assert_eq!(b.live_workers().await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_wipe_loses_everything_like_a_redis_restart() {
    let clock = ManualClock::new();
    let hub = MemoryHub::with_clock(Arc::new(clock.clone()));
    let a = hub.coordinator();
    let lease = Duration::from_secs(10);
    a.register(&wid("w-a"), &meta(), lease).await.unwrap();
    let ClaimOutcome::Granted(old) = a.claim(&bid("bot"), Fence::ZERO).await.unwrap() else {
        panic!("granted");
    };
    clock.advance(Duration::from_millis(500));
    hub.wipe();
    assert_eq!(a.renew(0).await.unwrap(), Renewal::Lost);
    assert!(a.owner(&bid("bot")).await.unwrap().is_none());
    a.register(&wid("w-a"), &meta(), lease).await.unwrap();
    // The store's floor says the bot had an owner: it waits one lease from the new epoch.
    assert_eq!(
        a.claim(&bid("bot"), old).await.unwrap(),
        ClaimOutcome::Grace(lease)
    );
    clock.advance(lease - Duration::from_millis(1));
    assert_eq!(a.renew(0).await.unwrap(), Renewal::Renewed);
    assert_eq!(
        a.claim(&bid("bot"), old).await.unwrap(),
        ClaimOutcome::Grace(Duration::from_millis(1))
    );
    clock.advance(Duration::from_millis(1));
    // Then the fence keeps growing from the caller's minimum.
    assert!(matches!(
        a.claim(&bid("bot"), old).await.unwrap(),
        ClaimOutcome::Granted(f) if f > old
    ));
}

/// The embedded mode's hub is new with its process: fences in the store from an earlier run
/// are no sign of a loss (the instance lock keeps the process single), so nothing waits.
#[tokio::test]
async fn a_new_hub_trusts_the_store_floor() {
    let hub = MemoryHub::new();
    let a = hub.coordinator();
    a.register(&wid("w-a"), &meta(), Duration::from_secs(10))
        .await
        .unwrap();
    assert!(matches!(
        a.claim(&bid("bot"), Fence(5_000)).await.unwrap(),
        ClaimOutcome::Granted(f) if f > Fence(5_000)
    ));
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
