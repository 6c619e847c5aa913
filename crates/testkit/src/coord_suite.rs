//! The [`Coordinator`] conformance suite, written once and run against every backend through
//! [`coordinator_conformance!`](crate::coordinator_conformance).

use std::{collections::HashSet, future::Future, sync::Arc, time::Duration};

use botfleet_coord::{
    ClaimOutcome, Coordinator, Group, LeaseKeeper, LeaseLost, LifecycleEvent, MemberEvent,
    MemberWatch, Permit, RateLimit, Renewal, Turn, WorkerCommand, WorkerMeta,
};
use botfleet_core::{BotId, Fence, SystemClock, WorkerId};
use botfleet_store::{MemoryStore, Store, StoreError};

use crate::{wait_for, Partition};

/// Makes handles on one shared backend (one hub, one Redis key space), and makes it lose data.
pub trait CoordFixture: Send + Sync {
    /// A copy of the backend's state (see [`CoordFixture::snapshot`]).
    type Snapshot: Send + Sync;

    /// A new, unregistered handle on the shared backend.
    fn handle(&self) -> impl Future<Output = Arc<dyn Coordinator>> + Send;

    /// Loses every piece of the backend's state while handles stay connected (Redis
    /// `FLUSHALL`, a restart without persistence).
    fn lose_everything(&self) -> impl Future<Output = ()> + Send;

    /// A copy of the backend's state now.
    fn snapshot(&self) -> impl Future<Output = Self::Snapshot> + Send;

    /// Puts the backend back to `snapshot`: a failover to a replica that missed every write
    /// since.
    fn roll_back(&self, snapshot: &Self::Snapshot) -> impl Future<Output = ()> + Send;
}

/// A short lease, so expiry tests stay quick.
pub const LEASE: Duration = Duration::from_millis(1000);

/// Metadata for test workers.
pub fn meta() -> WorkerMeta {
    WorkerMeta {
        host: "test-host".into(),
        capacity: 100,
        started_at_ms: 1,
        bots_held: 0,
        rss_bytes: 0,
    }
}

/// `WorkerId` from text.
pub fn wid(s: &str) -> WorkerId {
    WorkerId::new(s).expect("valid worker id")
}

/// `BotId` from text.
pub fn bid(s: &str) -> BotId {
    BotId::new(s).expect("valid bot id")
}

async fn worker<F: CoordFixture>(f: &F, name: &str, lease: Duration) -> Arc<dyn Coordinator> {
    let h = f.handle().await;
    h.register(&wid(name), &meta(), lease)
        .await
        .expect("register");
    h
}

/// The groups a renewal of every group ([`Coordinator::renew_groups`]) answered lost.
pub fn lost_groups(renewed: Vec<(Group, botfleet_coord::Result<Renewal>)>) -> Vec<Group> {
    renewed
        .into_iter()
        .filter(|(_, r)| matches!(r, Ok(Renewal::Lost)))
        .map(|(g, _)| g)
        .collect()
}

/// The groups inside a grace window now ([`Coordinator::group_epochs`]), in order.
pub async fn groups_in_grace(c: &dyn Coordinator) -> Vec<Group> {
    c.group_epochs()
        .await
        .expect("group epochs")
        .into_iter()
        .filter(|(_, e)| !e.grace_left.is_zero())
        .map(|(g, _)| g)
        .collect()
}

/// How much of group `g`'s grace window is left (zero outside one; the group must have an
/// epoch).
pub async fn grace_left_in(c: &dyn Coordinator, g: Group) -> Duration {
    c.group_epochs()
        .await
        .expect("group epochs")
        .into_iter()
        .find(|(k, _)| *k == g)
        .map(|(_, e)| e.grace_left)
        .expect("the group has an epoch")
}

/// Asserts that `c` refuses to join again a group it does not have (the one past its last).
pub async fn a_group_beyond_is_refused(c: &dyn Coordinator) {
    let beyond = botfleet_coord::KeySpace::with_groups("x", c.groups() + 1)
        .expect("a key space")
        .all_groups()
        .last()
        .expect("a group");
    assert!(matches!(
        c.rejoin_group(beyond).await,
        Err(botfleet_coord::CoordError::InvalidArgument(_))
    ));
}

fn grace(o: ClaimOutcome) -> Duration {
    match o {
        ClaimOutcome::Grace(d) => d,
        other => panic!("expected a grace wait, got {other:?}"),
    }
}

/// Claims `bot` for `w` with the store's floor and records the fence in the store.
async fn claim_stored(w: &Arc<dyn Coordinator>, store: &MemoryStore, bot: &BotId) -> ClaimOutcome {
    let min = store.highest_fence(bot).await.unwrap();
    let o = w.claim(bot, min).await.unwrap();
    if let ClaimOutcome::Granted(f) = o {
        store.accept_fence(bot, f).await.unwrap();
    }
    o
}

fn granted(o: ClaimOutcome) -> Fence {
    match o {
        ClaimOutcome::Granted(f) => f,
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// Waits past `LEASE` (plus a margin for clock granularity), renewing `keep` meanwhile.
async fn outlive_lease(keep: &[&Arc<dyn Coordinator>]) {
    let end = tokio::time::Instant::now() + LEASE + Duration::from_millis(150);
    while tokio::time::Instant::now() < end {
        for k in keep {
            assert_eq!(k.renew(0).await.expect("renew"), Renewal::Renewed);
        }
        tokio::time::sleep(LEASE / 4).await;
    }
}

/// Registered workers are listed with their metadata; a clean unregister is visible at once.
pub async fn membership_lists_and_unregisters<F: CoordFixture>(f: &F) {
    let a = worker(f, "w-a", Duration::from_secs(30)).await;
    let b = worker(f, "w-b", Duration::from_secs(30)).await;
    assert_eq!(b.renew_with(7, 12_345_678).await.unwrap(), Renewal::Renewed);
    let live = a.live_workers().await.unwrap();
    let ids: Vec<_> = live.iter().map(|w| w.id.as_str()).collect();
    assert_eq!(ids, ["w-a", "w-b"]);
    assert_eq!(live[1].meta.bots_held, 7);
    assert_eq!(live[1].meta.rss_bytes, 12_345_678);
    assert_eq!(live[1].meta.capacity, 100);
    assert!(live[1].heartbeat_age_ms < 5_000);
    b.unregister().await.unwrap();
    let ids: Vec<_> = a
        .live_workers()
        .await
        .unwrap()
        .into_iter()
        .map(|w| w.id)
        .collect();
    assert_eq!(ids, vec![wid("w-a")]);
    assert!(b.registration().is_none());
}

/// A worker that stops renewing is gone after its lease; its renewal then answers `Lost`.
pub async fn liveness_expires_without_renewal<F: CoordFixture>(f: &F) {
    let a = worker(f, "w-a", LEASE).await;
    let b = worker(f, "w-b", LEASE).await;
    outlive_lease(&[&b]).await;
    let ids: Vec<_> = b
        .live_workers()
        .await
        .unwrap()
        .into_iter()
        .map(|w| w.id)
        .collect();
    assert_eq!(ids, vec![wid("w-b")]);
    assert_eq!(a.renew(0).await.unwrap(), Renewal::Lost);
    // Registering again brings it back with a new incarnation.
    let old = a.registration().unwrap().1;
    let new = a.register(&wid("w-a"), &meta(), LEASE).await.unwrap();
    assert_ne!(old, new);
    assert_eq!(a.renew(0).await.unwrap(), Renewal::Renewed);
}

/// A second life of the same worker id voids the first one's liveness and claims.
pub async fn new_incarnation_voids_the_old<F: CoordFixture>(f: &F) {
    let old = worker(f, "w-a", Duration::from_secs(30)).await;
    let bot = bid("bot-1");
    let f1 = granted(old.claim(&bot, Fence::ZERO).await.unwrap());
    let new = worker(f, "w-a", Duration::from_secs(30)).await;
    assert_eq!(old.renew(0).await.unwrap(), Renewal::Lost);
    assert_eq!(
        old.claim(&bot, Fence::ZERO).await.unwrap(),
        ClaimOutcome::NotLive
    );
    let f2 = granted(new.claim(&bot, Fence::ZERO).await.unwrap());
    assert!(f2 > f1);
}

/// Only one worker holds a bot; the holder may claim again (a fresh, higher fence).
pub async fn claim_is_exclusive<F: CoordFixture>(f: &F) {
    let a = worker(f, "w-a", Duration::from_secs(30)).await;
    let b = worker(f, "w-b", Duration::from_secs(30)).await;
    let bot = bid("bot-1");
    let f1 = granted(a.claim(&bot, Fence::ZERO).await.unwrap());
    match b.claim(&bot, Fence::ZERO).await.unwrap() {
        ClaimOutcome::Held(o) => {
            assert_eq!(o.worker, wid("w-a"));
            assert_eq!(o.fence, f1);
            assert!(o.live && !o.handed_over);
        }
        other => panic!("b must not get a held bot: {other:?}"),
    }
    let f2 = granted(a.claim(&bot, Fence::ZERO).await.unwrap());
    assert!(f2 > f1);
    let o = b.owner(&bot).await.unwrap().unwrap();
    assert_eq!((o.worker, o.fence, o.live), (wid("w-a"), f2, true));
    assert!(b.owner(&bid("nobody")).await.unwrap().is_none());
}

/// Many workers claiming one bot at the same instant: exactly one wins.
pub async fn simultaneous_claims_have_one_winner<F: CoordFixture>(f: &F) {
    let mut ws = Vec::new();
    for i in 0..8 {
        ws.push(worker(f, &format!("w-{i}"), Duration::from_secs(30)).await);
    }
    for round in 0..5 {
        let bot = bid(&format!("contested-{round}"));
        let barrier = Arc::new(tokio::sync::Barrier::new(ws.len()));
        let tasks: Vec<_> = ws
            .iter()
            .map(|w| {
                let (w, bot, barrier) = (w.clone(), bot.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    w.claim(&bot, Fence::ZERO).await.unwrap()
                })
            })
            .collect();
        let mut wins = 0;
        for t in tasks {
            if matches!(t.await.unwrap(), ClaimOutcome::Granted(_)) {
                wins += 1;
            }
        }
        assert_eq!(wins, 1, "round {round}: exactly one claim wins");
    }
}

/// A dead holder's bot can be claimed after its lease, with a higher fence; before, never.
pub async fn claim_after_holder_expires<F: CoordFixture>(f: &F) {
    let a = worker(f, "w-a", LEASE).await;
    let b = worker(f, "w-b", LEASE).await;
    let bot = bid("bot-1");
    let f1 = granted(a.claim(&bot, Fence::ZERO).await.unwrap());
    assert!(matches!(
        b.claim(&bot, Fence::ZERO).await.unwrap(),
        ClaimOutcome::Held(_)
    ));
    outlive_lease(&[&b]).await;
    assert!(!b.owner(&bot).await.unwrap().unwrap().live);
    let f2 = granted(b.claim(&bot, Fence::ZERO).await.unwrap());
    assert!(f2 > f1);
    // The old holder, once back, cannot claim, release or hand over.
    assert_eq!(
        a.claim(&bot, Fence::ZERO).await.unwrap(),
        ClaimOutcome::NotLive
    );
    assert!(!a.release(&bot, f1).await.unwrap());
}

/// A clean unregister frees the worker's bots at once.
pub async fn unregister_frees_claims<F: CoordFixture>(f: &F) {
    let a = worker(f, "w-a", Duration::from_secs(30)).await;
    let b = worker(f, "w-b", Duration::from_secs(30)).await;
    let bot = bid("bot-1");
    granted(a.claim(&bot, Fence::ZERO).await.unwrap());
    a.unregister().await.unwrap();
    granted(b.claim(&bot, Fence::ZERO).await.unwrap());
}

/// Release is compare-and-set on the fence: a stale fence is refused.
pub async fn release_with_stale_fence_is_refused<F: CoordFixture>(f: &F) {
    let a = worker(f, "w-a", Duration::from_secs(30)).await;
    let b = worker(f, "w-b", Duration::from_secs(30)).await;
    let bot = bid("bot-1");
    let f1 = granted(a.claim(&bot, Fence::ZERO).await.unwrap());
    let f2 = granted(a.claim(&bot, Fence::ZERO).await.unwrap());
    assert!(!a.release(&bot, f1).await.unwrap(), "stale fence");
    assert!(!b.release(&bot, f2).await.unwrap(), "not the holder");
    assert!(a.owner(&bot).await.unwrap().is_some());
    assert!(a.release(&bot, f2).await.unwrap());
    assert!(a.owner(&bot).await.unwrap().is_none());
    assert!(!a.release(&bot, f2).await.unwrap(), "already released");
}

/// Fences grow on every grant, across release and workers, and respect the caller's minimum.
pub async fn fences_never_go_back<F: CoordFixture>(f: &F) {
    let a = worker(f, "w-a", Duration::from_secs(30)).await;
    let b = worker(f, "w-b", Duration::from_secs(30)).await;
    let bot = bid("bot-1");
    let mut last = Fence::ZERO;
    for i in 0..10 {
        let w = if i % 2 == 0 { &a } else { &b };
        let fence = granted(w.claim(&bot, Fence::ZERO).await.unwrap());
        assert!(fence > last, "{fence} after {last}");
        assert!(w.release(&bot, fence).await.unwrap());
        last = fence;
    }
    // Above the caller's minimum (the store's floor: the last grant). A minimum above what
    // the backend remembers means it lost data: see `data_loss_waits_for_old_owners`.
    let min = last;
    let fence = granted(a.claim(&bot, min).await.unwrap());
    assert!(fence > min, "{fence} not above {min}");
    assert!(a.release(&bot, fence).await.unwrap());
    // The counter remembers the minimum too.
    let next = granted(b.claim(&bot, Fence::ZERO).await.unwrap());
    assert!(next > fence, "{next} after {fence}");
}

/// Hand-over reserves the bot for the target, tells it, and lets only it claim.
pub async fn hand_over_reserves_for_the_target<F: CoordFixture>(f: &F) {
    let a = worker(f, "w-a", Duration::from_secs(30)).await;
    let b = worker(f, "w-b", Duration::from_secs(30)).await;
    let c = worker(f, "w-c", Duration::from_secs(30)).await;
    let bot = bid("bot-1");
    let f1 = granted(a.claim(&bot, Fence::ZERO).await.unwrap());
    assert!(
        !a.hand_over(&bot, Fence(f1.0 + 7), &wid("w-b"))
            .await
            .unwrap(),
        "wrong fence"
    );
    assert!(a.hand_over(&bot, f1, &wid("w-b")).await.unwrap());
    let o = c.owner(&bot).await.unwrap().unwrap();
    assert!(o.handed_over && o.live);
    assert_eq!(o.worker, wid("w-b"));
    assert!(matches!(
        c.claim(&bot, Fence::ZERO).await.unwrap(),
        ClaimOutcome::Held(_)
    ));
    assert!(!a.release(&bot, f1).await.unwrap(), "the old owner let go");
    let cmds = b.recv_commands(10, Duration::from_secs(2)).await.unwrap();
    assert_eq!(
        cmds,
        vec![WorkerCommand::Take {
            bot: bot.clone(),
            from: wid("w-a")
        }]
    );
    let f2 = granted(b.claim(&bot, Fence::ZERO).await.unwrap());
    assert!(f2 > f1);
    assert!(!b.owner(&bot).await.unwrap().unwrap().handed_over);
}

/// A hand-over its target does not take within a lease lapses: the bot then goes to whoever
/// claims it (the target may have let the Take go: the bot was no longer its own by its view
/// and its claim could not be granted then), and the target, asking late, finds it held.
pub async fn an_untaken_hand_over_lapses_after_a_lease<F: CoordFixture>(f: &F) {
    let a = worker(f, "w-a", LEASE).await;
    let b = worker(f, "w-b", LEASE).await;
    let c = worker(f, "w-c", LEASE).await;
    let bot = bid("bot-1");
    let f1 = granted(a.claim(&bot, Fence::ZERO).await.unwrap());
    assert!(a.hand_over(&bot, f1, &wid("w-b")).await.unwrap());
    assert!(matches!(
        c.claim(&bot, f1).await.unwrap(),
        ClaimOutcome::Held(o) if o.worker == wid("w-b") && o.handed_over
    ));
    assert!(c.owner(&bot).await.unwrap().unwrap().live);
    outlive_lease(&[&b, &c]).await;
    let o = c.owner(&bot).await.unwrap().unwrap();
    assert!(
        o.handed_over && !o.live,
        "a lapsed hand-over is nobody's: {o:?}"
    );
    let f2 = granted(c.claim(&bot, f1).await.unwrap());
    assert!(f2 > f1);
    assert!(matches!(
        b.claim(&bot, f1).await.unwrap(),
        ClaimOutcome::Held(o) if o.worker == wid("w-c") && !o.handed_over
    ));
}

/// Handing over to a worker that is not live just releases the bot.
pub async fn hand_over_to_a_dead_worker_releases<F: CoordFixture>(f: &F) {
    let a = worker(f, "w-a", Duration::from_secs(30)).await;
    let bot = bid("bot-1");
    let f1 = granted(a.claim(&bot, Fence::ZERO).await.unwrap());
    assert!(a.hand_over(&bot, f1, &wid("w-gone")).await.unwrap());
    assert!(a.owner(&bot).await.unwrap().is_none());
}

/// Calls that act for a worker need a registration.
pub async fn unregistered_handles_cannot_claim<F: CoordFixture>(f: &F) {
    let h = f.handle().await;
    let e = h.claim(&bid("b"), Fence::ZERO).await.unwrap_err();
    assert!(e.to_string().contains("not registered"), "{e}");
    assert!(h.renew(0).await.is_err());
    assert!(h.recv_commands(1, Duration::ZERO).await.is_err());
    // Out-of-range leases are refused with a reason.
    let e = h
        .register(&wid("w"), &meta(), Duration::from_millis(5))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("lease"), "{e}");
}

/// Events are read in order after a cursor; nothing published after the head is missed.
pub async fn events_are_ordered_and_not_replayed<F: CoordFixture>(f: &F) {
    let a = f.handle().await;
    let reader = f.handle().await;
    a.publish(&LifecycleEvent::Activate(bid("old")))
        .await
        .unwrap();
    let head = reader.events_head().await.unwrap();
    let evs = [
        LifecycleEvent::Activate(bid("b1")),
        LifecycleEvent::Restart(bid("b2")),
        LifecycleEvent::Deactivate(bid("b1")),
    ];
    for e in &evs {
        a.publish(e).await.unwrap();
    }
    let got = reader
        .read_events(&head, 100, Duration::ZERO)
        .await
        .unwrap();
    let kinds: Vec<_> = got.iter().map(|(_, e)| e.clone()).collect();
    assert_eq!(
        kinds, evs,
        "no replay of history before the head, nothing lost after it"
    );
    let last = got.last().unwrap().0.clone();
    assert!(got.windows(2).all(|w| w[0].0 < w[1].0));
    let none = reader
        .read_events(&last, 100, Duration::from_millis(100))
        .await
        .unwrap();
    assert!(none.is_empty());
    // A blocked reader wakes up for a new event.
    let publisher = a.clone();
    let t = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        publisher
            .publish(&LifecycleEvent::Activate(bid("late")))
            .await
            .unwrap();
    });
    let started = tokio::time::Instant::now();
    let got = reader
        .read_events(&last, 10, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1, LifecycleEvent::Activate(bid("late")));
    assert!(started.elapsed() < Duration::from_secs(8));
    t.await.unwrap();
}

/// One handle waiting for commands does not hold up its own event reads (a worker runs both
/// readers at once).
pub async fn blocked_readers_do_not_wait_for_each_other<F: CoordFixture>(f: &F) {
    let w = worker(f, "w-a", Duration::from_secs(30)).await;
    let head = w.events_head().await.unwrap();
    let waiting = {
        let w = w.clone();
        tokio::spawn(async move { w.recv_commands(10, Duration::from_secs(5)).await })
    };
    // Nothing shows from outside that the reader is blocked yet; give it a moment. Were it not
    // blocked by then, the check below would pass without proving anything, never falsely fail.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let publisher = f.handle().await;
    publisher
        .publish(&LifecycleEvent::Activate(bid("b")))
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let got = w
        .read_events(&head, 10, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "waited {:?}",
        started.elapsed()
    );
    // And a command still reaches the blocked reader at once.
    publisher
        .send_command(&wid("w-a"), &WorkerCommand::Stop { bot: bid("b") })
        .await
        .unwrap();
    let cmds = tokio::time::timeout(Duration::from_secs(2), waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(cmds, vec![WorkerCommand::Stop { bot: bid("b") }]);
}

/// Commands reach the one worker they are sent to, in order.
pub async fn commands_reach_one_worker<F: CoordFixture>(f: &F) {
    let admin = f.handle().await;
    let b = worker(f, "w-b", Duration::from_secs(30)).await;
    let c = worker(f, "w-c", Duration::from_secs(30)).await;
    let cmds = [
        WorkerCommand::Stop { bot: bid("x") },
        WorkerCommand::Restart { bot: bid("y") },
        WorkerCommand::HandOver {
            bot: bid("z"),
            to: wid("w-c"),
        },
    ];
    for cmd in &cmds {
        admin.send_command(&wid("w-b"), cmd).await.unwrap();
    }
    let mut got = Vec::new();
    while got.len() < 3 {
        let batch = b.recv_commands(2, Duration::from_secs(2)).await.unwrap();
        assert!(!batch.is_empty(), "commands lost: {got:?}");
        got.extend(batch);
    }
    assert_eq!(got, cmds);
    assert!(c
        .recv_commands(10, Duration::from_millis(100))
        .await
        .unwrap()
        .is_empty());
    assert!(b
        .recv_commands(10, Duration::ZERO)
        .await
        .unwrap()
        .is_empty());
}

/// Send buckets are taken together or not at all, by every coordinator of the fleet: a
/// platform call's scopes (here a chat's bucket of 2 and the bot's of 30) give one
/// token each; a scope that has none holds the whole call and takes nothing from the others;
/// tokens come back at the bucket's rate. Bad keys and empty takes are refused.
pub async fn send_buckets_are_taken_together_by_the_fleet<F: CoordFixture>(f: &F) {
    let a = f.handle().await;
    let b = f.handle().await;
    // Slow refills, so that a busy machine's pauses between calls change nothing.
    let chat = ("tg:bot1:chat:7", RateLimit::new(0.2, 2));
    let bot = ("tg:bot1", RateLimit::new(0.1, 30));
    assert_eq!(
        a.take_buckets(&[chat, bot]).await.unwrap().wait,
        Duration::ZERO
    );
    assert_eq!(
        b.take_buckets(&[chat, bot]).await.unwrap().wait,
        Duration::ZERO
    );
    // The chat's burst is spent, through either coordinator: the call waits for its next token.
    let held = a.take_buckets(&[chat, bot]).await.unwrap();
    assert!(
        held.wait > Duration::ZERO && held.wait <= Duration::from_secs(5),
        "{held:?}"
    );
    assert_eq!(held.short, 0, "the chat's bucket holds the call");
    // Nothing was taken from the bot's bucket meanwhile: 28 of its 30 are left.
    let other = ("tg:bot1:chat:8", RateLimit::new(100.0, 100));
    for i in 0..28 {
        assert_eq!(
            b.take_buckets(&[other, bot]).await.unwrap().wait,
            Duration::ZERO,
            "take {i}"
        );
    }
    let held = b.take_buckets(&[other, bot]).await.unwrap();
    assert!(
        held.wait > Duration::ZERO && held.short == 1,
        "the bot's: {held:?}"
    );
    // The chat's token comes back at its rate.
    wait_for("a chat token back", Duration::from_secs(20), || async {
        (a.take_buckets(&[chat]).await.unwrap().wait == Duration::ZERO).then_some(())
    })
    .await;
    assert!(a.take_buckets(&[]).await.is_err(), "no scope");
    assert!(a.take_buckets(&[("bad key", chat.1)]).await.is_err());
}

/// A call that yields (an edit a newer one may make needless) leaves each bucket's reserve —
/// a fifth of it — to the calls that do not, whichever coordinator they come through: with
/// 2 of a bucket of 10 left, a yielding take waits while a plain one is taken; a bucket of
/// fewer than 5 keeps no reserve.
pub async fn a_yielding_take_leaves_the_reserve_to_others<F: CoordFixture>(f: &F) {
    let a = f.handle().await;
    let b = f.handle().await;
    // Slow refills: nothing comes back while the test runs.
    let tier = ("sl:bot3:tier3", RateLimit::new(0.01, 10));
    assert_eq!(tier.1.reserve(), 2);
    assert!(
        a.take_buckets_yielding(&[tier]).await.unwrap().taken(),
        "a full bucket"
    );
    for i in 0..7 {
        assert!(b.take_buckets(&[tier]).await.unwrap().taken(), "take {i}");
    }
    let held = a.take_buckets_yielding(&[tier]).await.unwrap();
    assert!(
        !held.taken() && held.short == 0 && held.wait > Duration::from_secs(10),
        "the reserve is left to the others: {held:?}"
    );
    assert!(
        b.take_buckets(&[tier]).await.unwrap().taken(),
        "a plain call takes from the reserve"
    );
    let small = ("sl:bot3:chan", RateLimit::new(0.01, 4));
    assert_eq!(small.1.reserve(), 0);
    for i in 0..4 {
        assert!(
            a.take_buckets_yielding(&[small]).await.unwrap().taken(),
            "take {i}"
        );
    }
    assert!(!a.take_buckets_yielding(&[small]).await.unwrap().taken());
}

/// A 429's retry-after pauses its bucket for the whole fleet: a pause set through one
/// coordinator holds the takes of another until it ends (then a token is there), and only
/// that bucket's; a shorter pause does not cut a longer one short.
pub async fn a_paused_bucket_holds_every_coordinator<F: CoordFixture>(f: &F) {
    let a = f.handle().await;
    let b = f.handle().await;
    let chat = ("tg:bot2:chat:1", RateLimit::new(1.0, 1));
    let elsewhere = ("tg:bot2:chat:2", RateLimit::new(1.0, 1));
    let pause = Duration::from_secs(3);
    let paused_at = tokio::time::Instant::now();
    a.pause_bucket(chat.0, pause).await.unwrap();
    a.pause_bucket(chat.0, Duration::from_millis(100))
        .await
        .unwrap();
    let wait = b.take_buckets(&[chat]).await.unwrap().wait;
    assert!(wait > Duration::ZERO && wait <= pause, "{wait:?}");
    let held = b.take_buckets(&[elsewhere, chat]).await.unwrap();
    assert!(
        held.wait > Duration::ZERO && held.short == 1,
        "a call with a paused scope waits for it: {held:?}"
    );
    assert_eq!(
        b.take_buckets(&[elsewhere]).await.unwrap().wait,
        Duration::ZERO
    );
    wait_for("the pause ends", Duration::from_secs(15), || async {
        (b.take_buckets(&[chat]).await.unwrap().wait == Duration::ZERO).then_some(())
    })
    .await;
    assert!(
        paused_at.elapsed() >= pause - Duration::from_millis(50),
        "taken {:?} after a pause of {pause:?}",
        paused_at.elapsed()
    );
    assert!(a.pause_bucket(chat.0, Duration::ZERO).await.is_err());
    assert!(a.pause_bucket("bad key", pause).await.is_err());
}

/// The rate limiter is one bucket for the whole fleet.
pub async fn rate_limiter_is_fleet_wide<F: CoordFixture>(f: &F) {
    let a = f.handle().await;
    let b = f.handle().await;
    let limit = RateLimit::new(5.0, 2);
    assert_eq!(
        a.acquire_rate("connect:telegram", limit).await.unwrap(),
        Permit::Granted
    );
    assert_eq!(
        b.acquire_rate("connect:telegram", limit).await.unwrap(),
        Permit::Granted
    );
    match a.acquire_rate("connect:telegram", limit).await.unwrap() {
        Permit::Wait(d) => assert!(
            d > Duration::ZERO && d <= Duration::from_millis(200),
            "{d:?}"
        ),
        Permit::Granted => panic!("burst of 2 exceeded"),
    }
    // Another key is another bucket.
    assert_eq!(
        b.acquire_rate("connect:slack", limit).await.unwrap(),
        Permit::Granted
    );
    // A token comes back after 1/rate.
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(
        b.acquire_rate("connect:telegram", limit).await.unwrap(),
        Permit::Granted
    );
    assert!(a.acquire_rate("bad key", limit).await.is_err());
}

/// Over a second, a bucket grants about `burst + rate` tokens, whoever asks.
pub async fn rate_limiter_holds_the_rate<F: CoordFixture>(f: &F) {
    let hs = [f.handle().await, f.handle().await, f.handle().await];
    let limit = RateLimit::new(20.0, 1);
    let start = tokio::time::Instant::now();
    let mut granted = 0;
    let mut i = 0;
    while start.elapsed() < Duration::from_secs(1) {
        match hs[i % 3].acquire_rate("connect:x", limit).await.unwrap() {
            Permit::Granted => granted += 1,
            Permit::Wait(d) => tokio::time::sleep(d.min(Duration::from_millis(20))).await,
        }
        i += 1;
    }
    // 1 (burst) + 20/s over ~1 s; slack for scheduling on a loaded machine.
    assert!(
        (15..=23).contains(&granted),
        "granted {granted} in 1 s at 20/s"
    );
}

/// Fenced locks: one holder, token-checked renew and release, fences that grow.
pub async fn fenced_locks<F: CoordFixture>(f: &F) {
    let a = f.handle().await;
    let b = f.handle().await;
    let ttl = Duration::from_millis(400);
    let g1 = a
        .acquire_lock_fenced("migrate", ttl)
        .await
        .unwrap()
        .unwrap();
    assert!(b
        .acquire_lock_fenced("migrate", ttl)
        .await
        .unwrap()
        .is_none());
    assert!(a.renew_lock(&g1, ttl).await.unwrap());
    let mut forged = g1.clone();
    forged.token = "not-the-token".into();
    assert!(!b.release_lock(&forged).await.unwrap());
    assert!(!b.renew_lock(&forged, ttl).await.unwrap());
    assert!(a.release_lock(&g1).await.unwrap());
    let g2 = b
        .acquire_lock_fenced("migrate", ttl)
        .await
        .unwrap()
        .unwrap();
    assert!(g2.fence > g1.fence);
    // Expiry frees it for the next holder, with a higher fence; the old guard is dead.
    wait_for("lock expiry", Duration::from_secs(5), || async {
        a.acquire_lock_fenced("migrate", ttl).await.unwrap()
    })
    .await;
    assert!(!b.renew_lock(&g2, ttl).await.unwrap());
    assert!(!b.release_lock(&g2).await.unwrap());
}

/// Singleton jobs: one leader, re-entrant for the leader, taken over after it stops renewing.
pub async fn leader_election<F: CoordFixture>(f: &F) {
    let a = f.handle().await;
    let b = f.handle().await;
    let ttl = Duration::from_millis(400);
    let fa = a
        .try_lead("compactor", ttl)
        .await
        .unwrap()
        .expect("a leads");
    assert_eq!(b.try_lead("compactor", ttl).await.unwrap(), None);
    assert_eq!(
        a.try_lead("compactor", ttl).await.unwrap(),
        Some(fa),
        "renewal keeps the fence"
    );
    assert!(b.try_lead("other-job", ttl).await.unwrap().is_some());
    let fb = wait_for("leadership to pass", Duration::from_secs(5), || async {
        b.try_lead("compactor", ttl).await.unwrap()
    })
    .await;
    assert!(fb > fa);
    assert_eq!(a.try_lead("compactor", ttl).await.unwrap(), None);
}

/// Joins and clean leaves are seen at once (signalled), not after the poll period.
pub async fn member_watch_sees_joins_and_leaves<F: CoordFixture>(f: &F) {
    let watcher = f.handle().await;
    let _a = worker(f, "w-a", Duration::from_secs(30)).await;
    let mut rx = MemberWatch::spawn(watcher, Duration::from_secs(60));
    let first = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .unwrap();
    assert_eq!(first, Some(MemberEvent::Joined(wid("w-a"))));
    let b = worker(f, "w-b", Duration::from_secs(30)).await;
    let ev = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .unwrap();
    assert_eq!(ev, Some(MemberEvent::Joined(wid("w-b"))));
    b.unregister().await.unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .unwrap();
    assert_eq!(ev, Some(MemberEvent::Left(wid("w-b"))));
}

/// A lease keeper of `worker` on the backend through `link`, on the system clock.
async fn keeper_on(link: &Partition, worker: &str, lease: Duration) -> LeaseKeeper {
    LeaseKeeper::start(
        Arc::new(link.clone()),
        Arc::new(SystemClock::new()),
        wid(worker),
        meta(),
        lease,
    )
    .await
    .unwrap()
}

/// A worker cut off from the backend learns it must stop *before* its liveness can expire
/// there; one whose liveness was taken learns at its next renewal.
pub async fn lease_keeper_fences_itself<F: CoordFixture>(f: &F) {
    // Long enough that scheduling delays on a loaded 2-core machine stay well inside the
    // margins (the keeper stops at 2/3 of it, the backend expires at all of it).
    let lease = Duration::from_millis(1500);
    let link = Partition::new(f.handle().await);
    let observer = f.handle().await;
    let keeper = keeper_on(&link, "w-a", lease).await;
    let h = keeper.handle();
    // Renewals keep it valid well past one lease.
    tokio::time::sleep(lease * 2).await;
    h.check().expect("renewed lease is valid");
    link.cut(true);
    let cut_at = tokio::time::Instant::now();
    let why = tokio::time::timeout(lease * 2, h.lost())
        .await
        .expect("learns in time");
    assert!(matches!(why, LeaseLost::Expired(_)), "{why:?}");
    assert!(
        cut_at.elapsed() < lease,
        "stopped before the lease could expire"
    );
    // At that moment the backend still shows it live: nobody else can have claimed its bots.
    let live = observer.live_workers().await.unwrap();
    assert!(
        live.iter().any(|w| w.id == wid("w-a")),
        "stopped before expiry in the backend"
    );
    assert!(h.check().is_err());
    keeper.stop();

    // Revocation: another life of the same id takes over; the keeper learns at its next renewal.
    let keeper = LeaseKeeper::start(
        f.handle().await,
        Arc::new(SystemClock::new()),
        wid("w-b"),
        meta(),
        lease,
    )
    .await
    .unwrap();
    let h = keeper.handle();
    let usurper = f.handle().await;
    usurper.register(&wid("w-b"), &meta(), lease).await.unwrap();
    let why = tokio::time::timeout(lease * 2, h.lost())
        .await
        .expect("learns in time");
    assert_eq!(why, LeaseLost::Revoked);
}

/// The keeper's fence timer needs nothing from the backend: with every call hanging (no
/// answer, no error), [`LeaseHandle::lost`] resolves at 2/3 of the lease after the last
/// renewal, while the backend still shows the worker live; it clears when a renewal lands
/// again, and resolves `Stopped` once the keeper is gone.
///
/// [`LeaseHandle::lost`]: botfleet_coord::LeaseHandle::lost
pub async fn the_fence_timer_falls_while_every_call_hangs<F: CoordFixture>(f: &F) {
    // The heal lands a third of the lease before the backend's expiry: a second on a loaded
    // machine.
    let lease = Duration::from_millis(3000);
    let link = Partition::new(f.handle().await);
    let observer = f.handle().await;
    let keeper = keeper_on(&link, "w-a", lease).await;
    let h = keeper.handle();
    tokio::time::sleep(lease).await;
    h.check().expect("renewed lease is valid");
    link.hang(true);
    let hung_at = tokio::time::Instant::now();
    // Something else stuck in a call on the same link, as a worker's control loop would be.
    let stuck = tokio::spawn({
        let link = link.clone();
        async move { link.live_workers().await }
    });
    let why = tokio::time::timeout(lease * 2, h.lost())
        .await
        .expect("the fence falls while every call hangs");
    assert!(matches!(why, LeaseLost::Expired(_)), "{why:?}");
    // The last renewal was sent at most a third of the lease (and a renewal's answer) before
    // the hang, and the fence falls 2/3 of the lease after it.
    assert!(
        hung_at.elapsed() < lease,
        "fenced {:?} after the hang: before the lease could expire",
        hung_at.elapsed()
    );
    assert!(!stuck.is_finished(), "the other call is still hung");
    let live = observer.live_workers().await.unwrap();
    assert!(
        live.iter().any(|w| w.id == wid("w-a")),
        "fenced while the backend still shows it live"
    );
    // Healed before the backend's expiry: a renewal lands and the fence clears.
    link.hang(false);
    stuck.await.unwrap().unwrap();
    wait_for("the lease is safe again", lease, || async {
        h.check().is_ok().then_some(())
    })
    .await;
    assert!(
        tokio::time::timeout(lease / 4, h.lost()).await.is_err(),
        "no fence while renewals land"
    );
    keeper.stop();
    let why = tokio::time::timeout(lease, h.lost())
        .await
        .expect("a stopped keeper fences at once");
    assert!(
        matches!(why, LeaseLost::Stopped | LeaseLost::Expired(_)),
        "{why:?}"
    );
}

/// A holder stalled past its lease loses the claim, and its fenced write is refused.
pub async fn stalled_holder_is_fenced_out<F: CoordFixture>(f: &F) {
    let store = MemoryStore::new();
    let a = worker(f, "w-a", LEASE).await;
    let b = worker(f, "w-b", LEASE).await;
    let bot = bid("bot-1");
    let fa = granted(
        a.claim(&bot, store.highest_fence(&bot).await.unwrap())
            .await
            .unwrap(),
    );
    store.accept_fence(&bot, fa).await.unwrap();
    store.put_cursor(&bot, "10", fa).await.unwrap();
    // a stalls (renews nothing) past its lease; b takes over.
    outlive_lease(&[&b]).await;
    let fb = granted(
        b.claim(&bot, store.highest_fence(&bot).await.unwrap())
            .await
            .unwrap(),
    );
    store.accept_fence(&bot, fb).await.unwrap();
    store.put_cursor(&bot, "11", fb).await.unwrap();
    // a wakes up and tries to write what it fetched before the stall.
    match store.put_cursor(&bot, "10", fa).await {
        Err(StoreError::StaleFence {
            offered, current, ..
        }) => {
            assert_eq!((offered, current), (fa, fb));
        }
        other => panic!("stale write must be refused, got {other:?}"),
    }
    assert_eq!(store.cursor(&bot).await.unwrap().unwrap().value, "11");
    assert_eq!(a.renew(0).await.unwrap(), Renewal::Lost);
}

/// Many bots across a few workers: each bot has exactly one owner, whoever asked first.
pub async fn many_bots_one_owner_each<F: CoordFixture>(f: &F) {
    let mut ws = Vec::new();
    for i in 0..4 {
        ws.push(worker(f, &format!("w-{i}"), Duration::from_secs(30)).await);
    }
    let bots: Vec<_> = (0..50).map(|i| bid(&format!("b-{i}"))).collect();
    let mut tasks = Vec::new();
    for w in &ws {
        let (w, bots) = (w.clone(), bots.clone());
        tasks.push(tokio::spawn(async move {
            let mut mine = HashSet::new();
            for b in &bots {
                if let ClaimOutcome::Granted(_) = w.claim(b, Fence::ZERO).await.unwrap() {
                    mine.insert(b.clone());
                }
            }
            mine
        }));
    }
    let mut all = HashSet::new();
    let mut total = 0;
    for t in tasks {
        let mine = t.await.unwrap();
        total += mine.len();
        all.extend(mine);
    }
    assert_eq!(total, bots.len(), "no bot granted twice");
    assert_eq!(all.len(), bots.len(), "every bot granted once");
}

/// Many tokens in one call: no more than the bucket holds, and the wait for the next one.
pub async fn rate_limiter_grants_in_batches<F: CoordFixture>(f: &F) {
    let a = f.handle().await;
    let b = f.handle().await;
    let limit = RateLimit::new(10.0, 5);
    let g = a
        .acquire_rate_many("connect:batch", limit, 8)
        .await
        .unwrap();
    assert_eq!(g.taken, 5, "{g:?}");
    assert!(
        g.wait > Duration::ZERO && g.wait <= Duration::from_millis(100),
        "{g:?}"
    );
    // The same bucket for another handle: empty now.
    let g = b
        .acquire_rate_many("connect:batch", limit, 3)
        .await
        .unwrap();
    assert_eq!(g.taken, 0, "{g:?}");
    tokio::time::sleep(Duration::from_millis(320)).await;
    let g = b
        .acquire_rate_many("connect:batch", limit, 100)
        .await
        .unwrap();
    assert!(
        (2..=4).contains(&g.taken),
        "about 3 tokens after 0.3 s: {g:?}"
    );
    // Asking for fewer than there are takes only those, with no wait.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let g = a
        .acquire_rate_many("connect:batch", limit, 2)
        .await
        .unwrap();
    assert_eq!((g.taken, g.wait), (2, Duration::ZERO));
}

/// The backend loses everything under running workers: their renewals answer `Lost`; a bot
/// the store knows an owner of is granted again only one lease after the loss (its old owner
/// may still run it by its own clock until then), with a fence above the old one; a bot
/// nobody ever owned is granted at once; locks wait out the window too; the epoch says so.
pub async fn data_loss_waits_for_old_owners<F: CoordFixture>(f: &F) {
    let store = MemoryStore::new();
    let a = worker(f, "w-a", LEASE).await;
    let b = worker(f, "w-b", LEASE).await;
    let (owned, fresh) = (bid("owned"), bid("fresh"));
    let old = granted(claim_stored(&a, &store, &owned).await);
    store.put_cursor(&owned, "10", old).await.unwrap();
    let before = f.handle().await.epoch().await.unwrap().expect("an epoch");
    assert_eq!(before.grace_left, Duration::ZERO);

    f.lose_everything().await;
    let lost_at = tokio::time::Instant::now();
    assert_eq!(a.renew(0).await.unwrap(), Renewal::Lost, "a learns");
    assert_eq!(
        b.claim(&owned, Fence::ZERO).await.unwrap(),
        ClaimOutcome::NotLive,
        "b's registration went with the data"
    );
    b.register(&wid("w-b"), &meta(), LEASE).await.unwrap();
    let wait = grace(claim_stored(&b, &store, &owned).await);
    assert!(
        wait > LEASE / 2 && wait <= LEASE,
        "the owned bot waits about a lease: {wait:?}"
    );
    // Never owned: no reason to wait.
    granted(claim_stored(&b, &store, &fresh).await);
    let epoch = b.epoch().await.unwrap().expect("a new epoch");
    assert_ne!(epoch.id, before.id);
    assert!(epoch.after_loss);
    assert!(epoch.grace_left > Duration::ZERO && epoch.grace_left <= LEASE);
    assert!(b
        .acquire_lock_fenced("migrate", LEASE)
        .await
        .unwrap()
        .is_none());
    assert_eq!(b.try_lead("compactor", LEASE).await.unwrap(), None);
    // Asking again and again does not push the window out.
    let f_new = wait_for("the grace window ends", LEASE * 3, || async {
        assert_eq!(b.renew(0).await.unwrap(), Renewal::Renewed);
        match claim_stored(&b, &store, &owned).await {
            ClaimOutcome::Granted(f) => Some(f),
            ClaimOutcome::Grace(_) => None,
            other => panic!("{other:?}"),
        }
    })
    .await;
    let waited = lost_at.elapsed();
    assert!(waited >= LEASE / 2, "granted after only {waited:?}");
    assert!(f_new > old);
    assert!(store.put_cursor(&owned, "11", old).await.is_err());
    assert_eq!(b.epoch().await.unwrap().unwrap().grace_left, Duration::ZERO);
    assert!(b
        .acquire_lock_fenced("migrate", LEASE)
        .await
        .unwrap()
        .is_some());
}

/// A failover to a replica that missed the last writes: the claim made after the snapshot is
/// gone, though the worker's registration survived. Its next renewal says `Lost` (it must stop
/// its bots), and the bot whose grant was lost waits a lease before anyone gets it.
pub async fn lost_writes_are_detected<F: CoordFixture>(f: &F) {
    let store = MemoryStore::new();
    let a = worker(f, "w-a", LEASE).await;
    let b = worker(f, "w-b", LEASE).await;
    let (kept, lost) = (bid("kept"), bid("lost"));
    let f_kept = granted(claim_stored(&a, &store, &kept).await);
    assert_eq!(a.renew(0).await.unwrap(), Renewal::Renewed);
    assert_eq!(b.renew(0).await.unwrap(), Renewal::Renewed);
    let snap = f.snapshot().await;
    let f_lost = granted(claim_stored(&a, &store, &lost).await);
    f.roll_back(&snap).await;

    assert_eq!(
        a.renew(0).await.unwrap(),
        Renewal::Lost,
        "a's claim was lost: it may not go on"
    );
    // b wrote nothing since the snapshot: it goes on.
    assert_eq!(b.renew(0).await.unwrap(), Renewal::Renewed);
    let c = worker(f, "w-c", LEASE).await;
    let t = tokio::time::Instant::now();
    let wait = grace(claim_stored(&b, &store, &lost).await);
    assert!(
        wait > LEASE / 2,
        "waits about the fleet's longest lease: {wait:?}"
    );
    assert!(
        matches!(
            c.claim(&lost, store.highest_fence(&lost).await.unwrap())
                .await
                .unwrap(),
            ClaimOutcome::Grace(_)
        ),
        "nobody gets it meanwhile"
    );
    assert!(b.epoch().await.unwrap().unwrap().grace_left > Duration::ZERO);
    // `kept` is still a's in the replica (a's liveness holds until it expires there).
    assert!(matches!(
        b.claim(&kept, f_kept).await.unwrap(),
        ClaimOutcome::Held(_)
    ));
    let f_new = wait_for("the hold ends", LEASE * 3, || async {
        assert_eq!(b.renew(0).await.unwrap(), Renewal::Renewed);
        match claim_stored(&b, &store, &lost).await {
            ClaimOutcome::Granted(f) => Some(f),
            _ => None,
        }
    })
    .await;
    assert!(t.elapsed() >= wait.saturating_sub(Duration::from_millis(50)));
    assert!(f_new > f_lost);
}

/// A fleet's first start: nothing was lost, nothing waits.
pub async fn a_fresh_fleet_starts_at_once<F: CoordFixture>(f: &F) {
    let a = worker(f, "w-a", LEASE).await;
    let epoch = a
        .epoch()
        .await
        .unwrap()
        .expect("registering starts an epoch");
    assert!(!epoch.after_loss);
    assert_eq!(epoch.grace_left, Duration::ZERO);
    granted(a.claim(&bid("b1"), Fence::ZERO).await.unwrap());
    assert!(a.acquire_lock_fenced("k", LEASE).await.unwrap().is_some());
    assert!(a.try_lead("job", LEASE).await.unwrap().is_some());
}

/// Journal entries from any handle are read by every handle in one order, from a position;
/// only the newest are kept.
pub async fn the_journal_is_shared_and_bounded<F: CoordFixture>(f: &F) {
    let a = worker(f, "w-a", LEASE).await;
    let b = worker(f, "w-b", LEASE).await;
    a.journal_append(&["a1".into(), "a2".into()]).await.unwrap();
    b.journal_append(&["b1".into()]).await.unwrap();
    a.journal_append(&[]).await.unwrap();
    let all = b.journal_read(None, 10).await.unwrap();
    let texts: Vec<&str> = all.iter().map(|(_, e)| e.as_str()).collect();
    assert_eq!(texts, ["a1", "a2", "b1"]);
    assert!(all.windows(2).all(|w| w[0].0 < w[1].0));
    let after = a.journal_read(Some(all[0].0), 10).await.unwrap();
    assert_eq!(
        after.iter().map(|(_, e)| e.as_str()).collect::<Vec<_>>(),
        ["a2", "b1"]
    );
    assert_eq!(
        a.journal_read(None, 1).await.unwrap()[0].1,
        "b1",
        "the newest"
    );
    let many: Vec<String> = (0..crate::JOURNAL_KEEP_FOR_TESTS + 10)
        .map(|i| format!("x{i}"))
        .collect();
    a.journal_append(&many).await.unwrap();
    let kept = a.journal_read(Some(0), usize::MAX).await.unwrap();
    assert_eq!(kept.len(), crate::JOURNAL_KEEP_FOR_TESTS);
    assert_eq!(
        kept.last().unwrap().1,
        format!("x{}", crate::JOURNAL_KEEP_FOR_TESTS + 9)
    );
}

/// A bot kept off a worker is listed, for every handle, until its time runs out.
pub async fn avoidances_are_shared_and_expire<F: CoordFixture>(f: &F) {
    let a = worker(f, "w-a", LEASE).await;
    let b = worker(f, "w-b", LEASE).await;
    let (bot, other) = (BotId::new("b1").unwrap(), BotId::new("b2").unwrap());
    let wa = WorkerId::new("w-a").unwrap();
    a.avoid(&bot, &wa, Duration::from_millis(700))
        .await
        .unwrap();
    a.avoid(&other, &wa, Duration::from_secs(60)).await.unwrap();
    let seen = b.avoidances().await.unwrap();
    assert_eq!(
        seen,
        [(bot.clone(), wa.clone()), (other.clone(), wa.clone())]
    );
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(
        b.avoidances().await.unwrap(),
        [(other, wa)],
        "the short one expired"
    );
    assert!(a
        .avoid(&bot, &WorkerId::new("w-b").unwrap(), Duration::ZERO)
        .await
        .is_err());
}

/// The fence of a grant made with no loss in sight.
/// Asks for `chat`'s turn as `asker` with `ticket` until the grace window after a loss ends
/// (renewing `asker` and `others` meanwhile): the grant's fence and whether it says the loss
/// was recent.
async fn granted_once_the_window_ends(
    asker: &Arc<dyn Coordinator>,
    others: &[&Arc<dyn Coordinator>],
    chat: &str,
    ticket: u64,
) -> (Fence, bool) {
    wait_for("the grace window ends", LEASE * 3, || async {
        assert_eq!(asker.renew(0).await.unwrap(), Renewal::Renewed);
        for o in others {
            assert_eq!(o.renew(0).await.unwrap(), Renewal::Renewed);
        }
        match asker.turn_try(chat, ticket).await.unwrap() {
            Turn::Granted {
                fence, after_loss, ..
            } => Some((fence, after_loss)),
            Turn::Wait => None,
            other => panic!("{other:?}"),
        }
    })
    .await
}

fn granted_turn(t: Turn) -> Fence {
    match t {
        Turn::Granted {
            fence,
            after_loss: false,
            ..
        } => fence,
        other => panic!("expected the turn, got {other:?}"),
    }
}

/// The backend loses everything while a chat's turn is held and a ticket waits behind it: the
/// holder may still be acting by its own clock, so no turn of any chat is granted until the
/// grace window has passed (a forgotten queue grants nothing early); then grants say the loss
/// was recent (the holder serves the chat's older pending entries first), under fences above
/// the ones granted before, and the old holder's late release is refused.
pub async fn a_forgotten_turn_queue_grants_nothing_during_the_grace_window<F: CoordFixture>(f: &F) {
    let a = worker(f, "w-a", LEASE).await;
    let b = worker(f, "w-b", LEASE).await;
    let (t0, first) = a.turn_take("bot/c", "k0").await.unwrap();
    let f0 = granted_turn(first);
    assert_eq!(b.turn_take("bot/c", "k1").await.unwrap().1, Turn::Wait);

    f.lose_everything().await;
    let lost_at = tokio::time::Instant::now();
    assert_eq!(a.renew(0).await.unwrap(), Renewal::Lost);
    assert_eq!(
        b.turn_try("bot/c", t0 + 1).await.unwrap(),
        Turn::NotLive,
        "b's registration went with the data"
    );
    a.register(&wid("w-a"), &meta(), LEASE).await.unwrap();
    b.register(&wid("w-b"), &meta(), LEASE).await.unwrap();
    let (t1, again) = b.turn_take("bot/c", "k1").await.unwrap();
    assert_eq!(again, Turn::Wait, "the forgotten chat waits out the window");
    assert_eq!(
        a.turn_take("bot/other", "x0").await.unwrap().1,
        Turn::Wait,
        "so does every chat: nothing says which ones had a holder"
    );
    let (fence, recent) = granted_once_the_window_ends(&b, &[&a], "bot/c", t1).await;
    let waited = lost_at.elapsed();
    assert!(waited >= LEASE / 2, "granted after only {waited:?}");
    assert!(recent, "the grant says the loss was recent");
    assert!(
        fence > f0,
        "fences grow past the loss: {f0:?} then {fence:?}"
    );
    assert!(
        !a.turn_release("bot/c", t0, f0).await.unwrap(),
        "the old holder's late release is refused"
    );
    assert!(b.turn_release("bot/c", t1, fence).await.unwrap());
}

/// A failover to a replica that missed a chat's turn grant (or release), and nothing else: the
/// worker it was granted to is told `Lost` at its next renewal (it must give the turn up), and
/// no chat's turn is granted for a grace window — the forgotten holder may still be acting by
/// its own clock; then the grant says the loss was recent. Another worker that wrote nothing
/// since goes on.
pub async fn lost_turn_grants_are_detected<F: CoordFixture>(f: &F) {
    let a = worker(f, "w-a", LEASE).await;
    let b = worker(f, "w-b", LEASE).await;
    assert_eq!(a.renew(0).await.unwrap(), Renewal::Renewed);
    assert_eq!(b.renew(0).await.unwrap(), Renewal::Renewed);
    let snap = f.snapshot().await;
    let (_, first) = a.turn_take("bot/c", "k0").await.unwrap();
    let f0 = granted_turn(first);
    f.roll_back(&snap).await;
    let lost_at = tokio::time::Instant::now();
    assert_eq!(
        a.renew(0).await.unwrap(),
        Renewal::Lost,
        "a's turn grant was lost: it may not go on with it"
    );
    assert_eq!(b.renew(0).await.unwrap(), Renewal::Renewed);
    let (t1, next) = b.turn_take("bot/c", "k1").await.unwrap();
    assert_eq!(
        next,
        Turn::Wait,
        "nobody is granted the chat while a may still act"
    );
    let (fence, recent) = granted_once_the_window_ends(&b, &[], "bot/c", t1).await;
    assert!(
        lost_at.elapsed() >= LEASE / 2,
        "granted after only {:?}",
        lost_at.elapsed()
    );
    assert!(recent, "the grant says the loss was recent");
    assert!(
        fence > f0,
        "fences grow past the loss: {f0:?} then {fence:?}"
    );
    // A lost release is found the same way: b's release goes, then Redis forgets it.
    let snap = f.snapshot().await;
    assert!(b.turn_release("bot/c", t1, fence).await.unwrap());
    f.roll_back(&snap).await;
    assert_eq!(b.renew(0).await.unwrap(), Renewal::Lost);
}

/// A chat's tickets are served in order, one holder at a time; a release wakes the next
/// ticket's worker; fences grow; other chats are independent.
pub async fn turns_are_served_in_ticket_order<F: CoordFixture>(f: &F) {
    let a = worker(f, "w-a", Duration::from_secs(10)).await;
    let b = worker(f, "w-b", Duration::from_secs(10)).await;
    let mut wake_b = b.turn_wakeups().await.unwrap();
    let (t0, first) = a.turn_take("bot1/chat1", "k0").await.unwrap();
    let f0 = granted_turn(first);
    let (t1, second) = b.turn_take("bot1/chat1", "k1").await.unwrap();
    assert_eq!((t1, second), (t0 + 1, Turn::Wait), "one holder at a time");
    // Taking again for the same entry (a take whose answer was lost) is the same ticket.
    assert_eq!(
        b.turn_take("bot1/chat1", "k1").await.unwrap(),
        (t1, Turn::Wait)
    );
    assert_eq!(b.turn_try("bot1/chat1", t1).await.unwrap(), Turn::Wait);
    // Another chat is not held up.
    let (to, other) = b.turn_take("bot1/chat2", "x0").await.unwrap();
    let fo = granted_turn(other);
    // Only the holder with its fence releases.
    assert!(!b.turn_release("bot1/chat1", t0, f0).await.unwrap());
    assert!(!a
        .turn_release("bot1/chat1", t0, Fence(f0.0 + 1))
        .await
        .unwrap());
    assert!(a.turn_release("bot1/chat1", t0, f0).await.unwrap());
    let woke = tokio::time::timeout(Duration::from_secs(5), wake_b.recv())
        .await
        .expect("the next ticket's worker is woken")
        .unwrap();
    assert_eq!(woke, "bot1/chat1");
    let f1 = granted_turn(b.turn_try("bot1/chat1", t1).await.unwrap());
    assert!(f1 > f0, "fences grow: {f0:?} then {f1:?}");
    assert_eq!(a.turn_try("bot1/chat1", t0).await.unwrap(), Turn::Passed);
    assert!(b.turn_release("bot1/chat1", t1, f1).await.unwrap());
    assert!(b.turn_release("bot1/chat2", to, fo).await.unwrap());
    // An emptied queue is forgotten; ticket numbers and fences still grow past it.
    let (t, again) = a.turn_take("bot1/chat1", "k2").await.unwrap();
    let f2 = granted_turn(again);
    assert!(t > t1, "a ticket number is never reused: {t} after {t1}");
    assert!(f2 > f1);
    assert!(a.turn_release("bot1/chat1", t, f2).await.unwrap());
    assert!(a.turn_take("bad chat", "k").await.is_err());
}

/// A worker that dies holding a turn, or holding a ticket not yet served, is skipped by the
/// next asker, which takes over its entry in order; the dead worker's late release is refused.
pub async fn dead_holders_tickets_are_taken_over<F: CoordFixture>(f: &F) {
    let a = worker(f, "w-a", LEASE).await;
    let b = worker(f, "w-b", LEASE).await;
    let c = worker(f, "w-c", LEASE).await;
    // a holds ticket 0 and took ticket 2; b took ticket 1; c takes ticket 3.
    let (_, t) = a.turn_take("bot/c", "e0").await.unwrap();
    let fa = granted_turn(t);
    let (t1, _) = b.turn_take("bot/c", "e1").await.unwrap();
    let (t2, _) = a.turn_take("bot/c", "e2").await.unwrap();
    let (t3, w) = c.turn_take("bot/c", "e3").await.unwrap();
    assert_eq!((t2, t3, w), (t1 + 1, t1 + 2, Turn::Wait));
    // b dies too: c must replay e0, e1 and e2 in order before its own.
    outlive_lease(&[&c]).await;
    let mut replayed = Vec::new();
    let mut last = Fence::ZERO;
    loop {
        match c.turn_try("bot/c", t3).await.unwrap() {
            Turn::TakeOver {
                ticket,
                entry,
                fence,
                ..
            } => {
                assert!(fence > last);
                last = fence;
                replayed.push(entry);
                assert!(c.turn_release("bot/c", ticket, fence).await.unwrap());
            }
            Turn::Granted { fence, .. } => {
                assert!(fence > last);
                assert!(c.turn_release("bot/c", t3, fence).await.unwrap());
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(replayed, ["e0", "e1", "e2"]);
    // The dead holder acts on nothing.
    assert!(!a.turn_release("bot/c", t1 - 1, fa).await.unwrap());
    assert_eq!(a.turn_try("bot/c", t2).await.unwrap(), Turn::NotLive);
}

/// A turn is held by the asker it was granted to. A worker that registered again (its lease
/// lost in a failover) may have two askers of one chat: the task of a ticket taken by its old
/// registration, and a task of its own that took that ticket over. Only the one that was
/// granted the turn is granted it again; the other waits, then finds its ticket passed.
pub async fn a_taken_over_turn_is_held_by_its_asker_alone<F: CoordFixture>(f: &F) {
    let a = worker(f, "w-a", LEASE).await;
    let c = worker(f, "w-c", LEASE).await;
    let (tc, g) = c.turn_take("bot/tk", "c0").await.unwrap();
    let fc = granted_turn(g);
    let (t0, w) = a.turn_take("bot/tk", "a0").await.unwrap();
    assert_eq!(w, Turn::Wait);
    // a's registration ends and another begins: its ticket t0 belongs to no live taker.
    a.register(&wid("w-a"), &meta(), LEASE).await.unwrap();
    let (t1, w) = a.turn_take("bot/tk", "a1").await.unwrap();
    assert_eq!(w, Turn::Wait);
    assert!(c.turn_release("bot/tk", tc, fc).await.unwrap());
    let f1 = match a.turn_try("bot/tk", t1).await.unwrap() {
        Turn::TakeOver {
            ticket,
            entry,
            fence,
            ..
        } if ticket == t0 && entry == "a0" => fence,
        other => panic!("expected the take-over of {t0}, got {other:?}"),
    };
    assert_eq!(
        a.turn_try("bot/tk", t0).await.unwrap(),
        Turn::Wait,
        "t0's own asker, on the same worker, does not hold it too"
    );
    // The asker that took it over, asking again, still holds it, under a newer fence.
    let f2 = match a.turn_try("bot/tk", t1).await.unwrap() {
        Turn::TakeOver { ticket, fence, .. } if ticket == t0 => fence,
        other => panic!("expected the take-over of {t0} again, got {other:?}"),
    };
    assert!(f2 > f1, "{f1:?} then {f2:?}");
    assert!(!a.turn_release("bot/tk", t0, f1).await.unwrap());
    assert!(a.turn_release("bot/tk", t0, f2).await.unwrap());
    assert_eq!(a.turn_try("bot/tk", t0).await.unwrap(), Turn::Passed);
    let f3 = granted_turn(a.turn_try("bot/tk", t1).await.unwrap());
    let f4 = granted_turn(a.turn_try("bot/tk", t1).await.unwrap());
    assert!(
        f4 > f3,
        "the holder asking again with its ticket is granted again"
    );
    assert!(a.turn_release("bot/tk", t1, f4).await.unwrap());
}

/// A ticket whose turn came but whose live taker never asks for it (it lost track of it) is
/// taken over by the next asker once it has waited a lease (at least 5 s) unheld.
pub async fn abandoned_tickets_of_live_takers_are_taken_over<F: CoordFixture>(f: &F) {
    let a = worker(f, "w-a", Duration::from_secs(30)).await;
    let b = worker(f, "w-b", Duration::from_secs(30)).await;
    let (t0, g) = a.turn_take("bot/ab", "x0").await.unwrap();
    let f0 = granted_turn(g);
    let (_, _) = a.turn_take("bot/ab", "x1").await.unwrap(); // a will never ask for this one
    let (t2, w) = b.turn_take("bot/ab", "x2").await.unwrap();
    assert_eq!(w, Turn::Wait);
    assert!(a.turn_release("bot/ab", t0, f0).await.unwrap());
    assert_eq!(
        b.turn_try("bot/ab", t2).await.unwrap(),
        Turn::Wait,
        "its live taker may still ask"
    );
    let start = tokio::time::Instant::now();
    let taken = loop {
        a.renew(0).await.unwrap();
        b.renew(0).await.unwrap();
        match b.turn_try("bot/ab", t2).await.unwrap() {
            Turn::TakeOver { entry, .. } => break entry,
            Turn::Wait => {}
            other => panic!("unexpected {other:?}"),
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "never taken over"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(taken, "x1");
    assert!(
        start.elapsed() >= Duration::from_secs(4),
        "not before it waited about a lease"
    );
}

/// Generates a module `conformance_coord` with one `#[tokio::test]` per suite case, each
/// running against a fresh fixture from `$fixture` (an async expression). The tests' paths
/// (`conformance_coord::<case>`) match `cargo test conformance`.
#[macro_export]
macro_rules! coordinator_conformance {
    ($fixture:expr) => {
        $crate::coordinator_conformance!(@cases $fixture;
            membership_lists_and_unregisters,
            liveness_expires_without_renewal,
            new_incarnation_voids_the_old,
            claim_is_exclusive,
            simultaneous_claims_have_one_winner,
            claim_after_holder_expires,
            unregister_frees_claims,
            release_with_stale_fence_is_refused,
            fences_never_go_back,
            hand_over_reserves_for_the_target,
            hand_over_to_a_dead_worker_releases,
            an_untaken_hand_over_lapses_after_a_lease,
            unregistered_handles_cannot_claim,
            events_are_ordered_and_not_replayed,
            commands_reach_one_worker,
            blocked_readers_do_not_wait_for_each_other,
            rate_limiter_is_fleet_wide,
            rate_limiter_holds_the_rate,
            rate_limiter_grants_in_batches,
            send_buckets_are_taken_together_by_the_fleet,
            a_paused_bucket_holds_every_coordinator,
            a_yielding_take_leaves_the_reserve_to_others,
            fenced_locks,
            leader_election,
            member_watch_sees_joins_and_leaves,
            lease_keeper_fences_itself,
            the_fence_timer_falls_while_every_call_hangs,
            stalled_holder_is_fenced_out,
            many_bots_one_owner_each,
            data_loss_waits_for_old_owners,
            lost_writes_are_detected,
            lost_turn_grants_are_detected,
            a_fresh_fleet_starts_at_once,
            avoidances_are_shared_and_expire,
            the_journal_is_shared_and_bounded,
            turns_are_served_in_ticket_order,
            dead_holders_tickets_are_taken_over,
            abandoned_tickets_of_live_takers_are_taken_over,
            a_taken_over_turn_is_held_by_its_asker_alone,
            a_forgotten_turn_queue_grants_nothing_during_the_grace_window,
        );
    };
    (@cases $fixture:expr; $($case:ident),* $(,)?) => {
        mod conformance_coord {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let fixture = $fixture;
                    $crate::coord_suite::$case(&fixture).await;
                }
            )*
        }
    };
}
