//! What only the in-memory hub has: simulated crashes and wipes, and a clock it is told.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{sync::Arc, time::Duration};

use botfleet_coord::{
    ClaimOutcome, Coordinator, EventCursor, Group, LifecycleEvent, MemoryHub, Renewal, Turn,
};
use botfleet_core::{BotId, Fence, ManualClock};
use botfleet_testkit::coord_suite::{
    a_group_beyond_is_refused, bid, grace_left_in, groups_in_grace, lost_groups, meta, wid,
};

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

/// A hub of 8 groups with worker "w-a" registered (lease 10 s) on a manual clock; the group
/// `nth`, and a bot and a chat key falling in it and one of each falling elsewhere.
struct EightGroups {
    clock: ManualClock,
    hub: MemoryHub,
    a: botfleet_coord::MemoryCoordinator,
    g: Group,
    lease: Duration,
}

impl EightGroups {
    async fn new(nth: usize) -> Self {
        Self::with(nth, false).await
    }

    /// `one_epoch`: the hub keeps one epoch for every group (the mutation).
    async fn with(nth: usize, one_epoch: bool) -> Self {
        let clock = ManualClock::new();
        let hub = MemoryHub::with_groups(Arc::new(clock.clone()), 8).unwrap();
        if one_epoch {
            hub.share_one_epoch_for_tests();
        }
        let a = hub.coordinator();
        let lease = Duration::from_secs(10);
        a.register(&wid("w-a"), &meta(), lease).await.unwrap();
        let g = a.all_groups()[nth];
        Self {
            clock,
            hub,
            a,
            g,
            lease,
        }
    }

    /// The first of `name-0`, `name-1`… that does (`inside`) or does not fall in the group.
    fn key(&self, name: &str, inside: bool, of: impl Fn(&str) -> Group) -> String {
        (0..)
            .map(|i| format!("{name}-{i}"))
            .find(|k| (of(k) == self.g) == inside)
            .unwrap()
    }

    fn bot(&self, inside: bool) -> BotId {
        bid(&self.key("bot", inside, |k| self.a.group_of_bot(&bid(k))))
    }

    fn chat(&self, inside: bool) -> String {
        self.key("bot/chat", inside, |k| self.a.group_of_chat(k))
    }
}

fn granted(o: ClaimOutcome) -> Fence {
    match o {
        ClaimOutcome::Granted(f) => f,
        other => panic!("not granted: {other:?}"),
    }
}

/// The hub's twin of the Redis group test: one group (not the roster's) loses its data.
/// Renewing tells that group lost and every other renewed; the bots and turns of the others
/// stay with their holder, the lost group's are refused. Joined again, the group gives the
/// worker a fresh incarnation there (the registration and the roster's stay), and — its data
/// lost — holds its bots for the grace window while the other groups grant at once.
#[tokio::test]
async fn a_group_that_lost_its_data_is_lost_alone_and_joined_again() {
    let t = EightGroups::new(3).await;
    let (a, lost) = (&t.a, t.g);
    let (_, first) = a.registration().unwrap();
    let (inside, outside) = (t.bot(true), t.bot(false));
    let f_in = granted(a.claim(&inside, Fence::ZERO).await.unwrap());
    let f_out = granted(a.claim(&outside, Fence::ZERO).await.unwrap());
    let (chat_in, chat_out) = (t.chat(true), t.chat(false));
    let (_, held_in) = a.turn_take(&chat_in, "e1").await.unwrap();
    let (ticket_out, held_out) = a.turn_take(&chat_out, "e2").await.unwrap();
    assert!(matches!(held_in, Turn::Granted { .. }), "{held_in:?}");
    assert!(matches!(held_out, Turn::Granted { .. }), "{held_out:?}");

    t.clock.advance(Duration::from_millis(500));
    t.hub.wipe_group(lost);
    let renewed = a.renew_groups(0, 0).await;
    assert_eq!(renewed.len(), 8);
    assert_eq!(lost_groups(renewed), [lost]);
    assert_eq!(a.renew(0).await.unwrap(), Renewal::Lost, "the whole lease");
    assert_eq!(
        lost_groups(a.renew_groups(0, 0).await),
        [lost],
        "still lost"
    );
    assert_eq!(
        a.claim(&inside, f_in).await.unwrap(),
        ClaimOutcome::NotLive,
        "no liveness in the lost group"
    );
    assert!(granted(a.claim(&outside, f_out).await.unwrap()) > f_out);
    assert!(matches!(
        a.turn_try(&chat_out, ticket_out).await.unwrap(),
        Turn::Granted { .. }
    ));
    assert!(
        a.owner(&inside).await.unwrap().is_none(),
        "its record is gone"
    );

    let again = a.rejoin_group(lost).await.unwrap();
    assert_ne!(again, first, "a fresh incarnation in the group");
    assert_eq!(a.registration_in(lost).unwrap().1, again);
    assert_eq!(a.registration().unwrap().1, first, "the registration stays");
    for g in a.all_groups().into_iter().filter(|g| *g != lost) {
        assert_eq!(a.registration_in(g).unwrap().1, first, "{g}");
    }
    let live = a.live_workers().await.unwrap();
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].incarnation, first, "the roster did not change");
    assert!(lost_groups(a.renew_groups(0, 0).await).is_empty());
    assert_eq!(a.renew(0).await.unwrap(), Renewal::Renewed);
    // The store's floor says the bot had an owner: it waits out the group's window.
    assert_eq!(
        a.claim(&inside, f_in).await.unwrap(),
        ClaimOutcome::Grace(t.lease)
    );
    assert_eq!(groups_in_grace(a).await, [lost]);
    assert_eq!(a.epoch().await.unwrap().unwrap().grace_left, t.lease);
    // A chat of the group waits too (its holder from before may still act).
    assert_eq!(
        a.turn_take(&chat_in, "e3").await.unwrap().1,
        Turn::Wait,
        "a turn of the lost group in its window"
    );
    let other = t.chat(false) + "x";
    if a.group_of_chat(&other) != lost {
        assert!(matches!(
            a.turn_take(&other, "e4").await.unwrap().1,
            Turn::Granted { .. }
        ));
    }
    t.clock.advance(t.lease - Duration::from_millis(1));
    assert!(lost_groups(a.renew_groups(0, 0).await).is_empty());
    t.clock.advance(Duration::from_millis(1));
    assert!(granted(a.claim(&inside, f_in).await.unwrap()) > f_in);

    // Joining the roster's group again is a join of the fleet under a fresh incarnation.
    let roster_again = a.rejoin_group(Group::ZERO).await.unwrap();
    assert_ne!(roster_again, first);
    assert_eq!(a.live_workers().await.unwrap()[0].incarnation, roster_again);
    a_group_beyond_is_refused(a).await;
    // Unregistering ends the liveness in every group, under each group's incarnation: another
    // worker is granted a bot of each at once.
    let b = t.hub.coordinator();
    b.register(&wid("w-b"), &meta(), t.lease).await.unwrap();
    let mut one_per_group = std::collections::BTreeMap::new();
    for i in 0..200 {
        let bot = bid(&format!("many-{i}"));
        if let ClaimOutcome::Granted(f) = a.claim(&bot, Fence::ZERO).await.unwrap() {
            one_per_group
                .entry(a.group_of_bot(&bot))
                .or_insert((bot, f));
        }
    }
    assert_eq!(one_per_group.len(), 8, "a bot of every group");
    a.unregister().await.unwrap();
    for (g, (bot, f)) in one_per_group {
        assert!(
            matches!(b.claim(&bot, f).await.unwrap(), ClaimOutcome::Granted(_)),
            "{g}"
        );
    }
}

/// A group that went back in time (its part restored to an earlier copy: the worker's writes
/// there since are gone) is found lost once and then not renewed again until joined again:
/// each renewal there would push its hold a grace further. The other groups never wait.
#[tokio::test]
async fn a_group_that_went_back_in_time_is_not_renewed_again() {
    let t = EightGroups::new(5).await;
    let (a, back) = (&t.a, t.g);
    let before = t.hub.snapshot();
    let (inside, outside) = (t.bot(true), t.bot(false));
    let f_in = granted(a.claim(&inside, Fence::ZERO).await.unwrap());
    granted(a.claim(&outside, Fence::ZERO).await.unwrap());
    t.hub.restore_group(back, &before);
    assert_eq!(lost_groups(a.renew_groups(0, 0).await), [back]);
    let left = || grace_left_in(a, back);
    assert_eq!(
        left().await,
        t.lease,
        "its hold: a grace from the loss found"
    );
    t.clock.advance(Duration::from_millis(1_500));
    assert_eq!(lost_groups(a.renew_groups(0, 0).await), [back]);
    assert_eq!(
        left().await,
        t.lease - Duration::from_millis(1_500),
        "the hold did not move"
    );
    // The restored record is the worker's own claim of before: refused while the hold lasts.
    assert_eq!(
        a.owner(&outside).await.unwrap().map(|o| o.live),
        Some(true),
        "another group's bot stays held"
    );
    a.rejoin_group(back).await.unwrap();
    assert!(lost_groups(a.renew_groups(0, 0).await).is_empty());
    // Its bot, whose fence the group forgot, waits (a grace from when that was found).
    assert!(matches!(
        a.claim(&inside, f_in).await.unwrap(),
        ClaimOutcome::Grace(d) if !d.is_zero() && d <= t.lease
    ));
    assert!(granted(a.claim(&outside, Fence::ZERO).await.unwrap()) > Fence::ZERO);
}

/// The mutation switch the simulation proves the per-group epoch with: with one epoch for
/// every group, a group that lost its data grants its bots at once (nothing tells the loss).
#[tokio::test]
async fn with_one_epoch_for_all_groups_a_group_loss_goes_unseen() {
    let t = EightGroups::with(2, true).await;
    let a = &t.a;
    let inside = t.bot(true);
    let f = granted(a.claim(&inside, Fence::ZERO).await.unwrap());
    t.hub.wipe_group(t.g);
    assert_eq!(lost_groups(a.renew_groups(0, 0).await), [t.g]);
    a.rejoin_group(t.g).await.unwrap();
    assert!(granted(a.claim(&inside, f).await.unwrap()) > f);
}
