//! Every coordinator backend runs the one conformance suite from `botfleet-testkit`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;

use botfleet_coord::{Coordinator, MemoryHub, MemorySnapshot, RedisConfig, RedisCoordinator};
use botfleet_testkit::{CoordFixture, RedisServer, SentinelSetup, SENTINEL_MASTER};

/// Handles on one in-memory hub (on the system clock, like the embedded mode).
struct Memory {
    hub: MemoryHub,
}

impl CoordFixture for Memory {
    type Snapshot = MemorySnapshot;
    async fn handle(&self) -> Arc<dyn Coordinator> {
        Arc::new(self.hub.coordinator())
    }
    async fn lose_everything(&self) {
        self.hub.wipe();
    }
    async fn snapshot(&self) -> MemorySnapshot {
        self.hub.snapshot()
    }
    async fn roll_back(&self, snapshot: &MemorySnapshot) {
        self.hub.restore(snapshot);
    }
}

/// Handles on a private `redis-server`, killed when the fixture drops, the keys in `groups`
/// coordination groups.
struct Redis {
    server: RedisServer,
    groups: u16,
}

/// Every key of the fleet with its remaining TTL (ms, 0 for none) and its `DUMP`.
type Dump = Vec<(String, i64, Vec<u8>)>;

/// A plain connection to the Redis at `url`, for the fixture's own reads and writes.
async fn raw(url: String) -> ::redis::aio::MultiplexedConnection {
    ::redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// A coordinator on `config`, keys under `conf` in `groups` groups.
async fn coordinator(config: RedisConfig, groups: u16) -> Arc<dyn Coordinator> {
    Arc::new(
        RedisCoordinator::connect(config.prefix("conf").groups(groups))
            .await
            .unwrap(),
    )
}

impl CoordFixture for Redis {
    type Snapshot = Dump;
    async fn handle(&self) -> Arc<dyn Coordinator> {
        coordinator(RedisConfig::new(self.server.url()), self.groups).await
    }
    async fn lose_everything(&self) {
        self.server.flushall().unwrap();
    }
    async fn snapshot(&self) -> Dump {
        dump(&mut raw(self.server.url()).await).await
    }
    async fn roll_back(&self, snapshot: &Dump) {
        restore(&mut raw(self.server.url()).await, snapshot).await;
    }
}

/// Every key of the fleet (the roster's and every group's), with its TTL and its `DUMP`.
async fn dump(c: &mut ::redis::aio::MultiplexedConnection) -> Dump {
    let keys: Vec<String> = ::redis::cmd("KEYS")
        .arg("{conf*")
        .query_async(c)
        .await
        .unwrap();
    let mut out = Vec::new();
    for k in keys {
        let ttl: i64 = ::redis::cmd("PTTL").arg(&k).query_async(c).await.unwrap();
        let dump: Vec<u8> = ::redis::cmd("DUMP").arg(&k).query_async(c).await.unwrap();
        out.push((k, ttl.max(0), dump));
    }
    out
}

/// Replaces every key with `snapshot`'s.
async fn restore(c: &mut ::redis::aio::MultiplexedConnection, snapshot: &Dump) {
    let _: () = ::redis::cmd("FLUSHALL").query_async(c).await.unwrap();
    for (k, ttl, dump) in snapshot {
        let _: () = ::redis::cmd("RESTORE")
            .arg(k)
            .arg(*ttl)
            .arg(dump.as_slice())
            .query_async(c)
            .await
            .unwrap();
    }
}

mod memory {
    use super::*;
    botfleet_testkit::coordinator_conformance!(Memory {
        hub: MemoryHub::new()
    });
}

/// The suite on a hub with its state split into 8 coordination groups.
mod memory_groups {
    use super::*;
    botfleet_testkit::coordinator_conformance!(Memory {
        hub: MemoryHub::with_groups(Arc::new(botfleet_core::SystemClock::new()), 8).unwrap()
    });
}

mod redis {
    use super::*;
    botfleet_testkit::coordinator_conformance!(Redis {
        server: RedisServer::start().unwrap(),
        groups: 1,
    });
}

/// The suite with the keys split into 8 coordination groups.
mod redis_groups {
    use super::*;
    botfleet_testkit::coordinator_conformance!(Redis {
        server: RedisServer::start().unwrap(),
        groups: 8,
    });
}

/// Handles through Redis Sentinel (a primary, a replica, three Sentinels), killed when the
/// fixture drops: the suite's data losses and snapshots act on the primary.
struct Sentinel {
    setup: SentinelSetup,
    groups: u16,
}

impl CoordFixture for Sentinel {
    type Snapshot = Dump;
    async fn handle(&self) -> Arc<dyn Coordinator> {
        coordinator(
            RedisConfig::new(self.setup.urls()).sentinel(SENTINEL_MASTER),
            self.groups,
        )
        .await
    }
    async fn lose_everything(&self) {
        self.setup.primary().flushall().unwrap();
    }
    async fn snapshot(&self) -> Dump {
        dump(&mut raw(self.setup.primary_url()).await).await
    }
    async fn roll_back(&self, snapshot: &Dump) {
        restore(&mut raw(self.setup.primary_url()).await, snapshot).await;
    }
}

mod sentinel {
    use super::*;
    botfleet_testkit::coordinator_conformance!(Sentinel {
        setup: SentinelSetup::start().unwrap(),
        groups: 1,
    });
}

/// The suite through Sentinel with the keys split into 8 coordination groups.
mod sentinel_groups {
    use super::*;
    botfleet_testkit::coordinator_conformance!(Sentinel {
        setup: SentinelSetup::start().unwrap(),
        groups: 8,
    });
}

/// With 8 groups a fleet's keys fall in exactly 8 hash tags — each group's under its own,
/// the roster's under group 0's — whatever it does: workers registered in every group
/// (liveness, epoch, write sequences there, metadata only in the roster), bots claimed and
/// handed over, chats' turns taken, commands, events, locks, buckets, the journal. A bot of
/// every group is granted (its group knows the worker live), and unregistering leaves no
/// group's liveness behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keys_of_eight_groups_fall_in_eight_hash_tags() {
    use std::collections::{BTreeMap, BTreeSet};
    use std::time::Duration;

    use botfleet_coord::{ClaimOutcome, KeySpace, LifecycleEvent, RateLimit, WorkerCommand};
    use botfleet_core::Fence;
    use botfleet_testkit::coord_suite::{bid, meta, wid};

    let server = RedisServer::start().unwrap();
    let ks = KeySpace::with_groups("conf", 8).unwrap();
    let a = coordinator(RedisConfig::new(server.url()), 8).await;
    let b = coordinator(RedisConfig::new(server.url()), 8).await;
    a.register(&wid("w-a"), &meta(), Duration::from_secs(10))
        .await
        .unwrap();
    b.register(&wid("w-b"), &meta(), Duration::from_secs(10))
        .await
        .unwrap();
    let mut groups_granted = BTreeSet::new();
    for i in 0..64 {
        let bot = bid(&format!("bot-{i}"));
        let ClaimOutcome::Granted(fence) = a.claim(&bot, Fence(0)).await.unwrap() else {
            panic!("bot-{i} is not granted");
        };
        groups_granted.insert(ks.group_of_bot(&bot));
        if i % 4 == 0 {
            assert!(a.hand_over(&bot, fence, &wid("w-b")).await.unwrap());
            assert!(matches!(
                b.claim(&bot, Fence(0)).await.unwrap(),
                ClaimOutcome::Granted(_)
            ));
        }
        let chat = format!("bot-{i}/{}", i * 3);
        let (_, turn) = b.turn_take(&chat, "k").await.unwrap();
        assert!(
            matches!(turn, botfleet_coord::Turn::Granted { .. }),
            "{chat}: {turn:?}"
        );
    }
    assert_eq!(
        groups_granted.len(),
        8,
        "bots of every group: {groups_granted:?}"
    );
    a.send_command(&wid("w-b"), &WorkerCommand::Stop { bot: bid("bot-1") })
        .await
        .unwrap();
    a.publish(&LifecycleEvent::Activate(bid("bot-1")))
        .await
        .unwrap();
    assert!(a
        .acquire_lock_fenced("x", Duration::from_secs(5))
        .await
        .unwrap()
        .is_some());
    let limit = RateLimit {
        per_second: 10.0,
        burst: 10,
    };
    a.acquire_rate_many("connect", limit, 1).await.unwrap();
    a.take_buckets(&[("tg:1", limit)]).await.unwrap();
    a.journal_append(&["{}".to_owned()]).await.unwrap();
    a.avoid(&bid("bot-1"), &wid("w-b"), Duration::from_secs(5))
        .await
        .unwrap();

    let mut c = raw(server.url()).await;
    let keys: Vec<String> = ::redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut c)
        .await
        .unwrap();
    let mut tags = BTreeMap::<String, usize>::new();
    for k in &keys {
        let tag = k
            .strip_prefix('{')
            .and_then(|r| r.split_once('}'))
            .unwrap_or_else(|| panic!("{k} has no hash tag"))
            .0;
        *tags.entry(tag.to_owned()).or_default() += 1;
    }
    let want: BTreeSet<String> = ks
        .all_groups()
        .map(|g| ks.group_tag(g).trim_matches(['{', '}']).to_owned())
        .collect();
    assert_eq!(
        tags.keys().cloned().collect::<BTreeSet<_>>(),
        want,
        "{keys:?}"
    );
    // Every group knows both workers; only the roster keeps their metadata.
    for g in ks.all_groups() {
        let members: BTreeMap<String, String> = ::redis::cmd("HGETALL")
            .arg(ks.workers_in(g))
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(members.len(), 2, "{g}: {members:?}");
        let beats: i64 = ::redis::cmd("EXISTS")
            .arg(ks.beats_in(g))
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(beats, i64::from(g == botfleet_coord::Group::ZERO), "{g}");
    }
    assert_eq!(a.renew(0).await.unwrap(), botfleet_coord::Renewal::Renewed);
    a.unregister().await.unwrap();
    for g in ks.all_groups() {
        let left: Vec<String> = ::redis::cmd("HKEYS")
            .arg(ks.workers_in(g))
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(left, ["w-b"], "{g}");
    }
}

/// Every worker of a fleet uses one number of groups, recorded in the roster: a worker with
/// another number is refused while the fleet has live workers — naming both numbers, leaving
/// no liveness of its own in any group — and a fleet that began before groups (no record)
/// counts as one group. Once every worker is gone, the fleet may start again with another
/// number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_of_another_number_of_groups_is_refused() {
    use std::time::Duration;

    use botfleet_coord::CoordError;
    use botfleet_testkit::coord_suite::{meta, wid};

    let server = RedisServer::start().unwrap();
    let lease = Duration::from_secs(10);
    let mut c = raw(server.url()).await;
    let a = coordinator(RedisConfig::new(server.url()), 8).await;
    a.register(&wid("w-a"), &meta(), lease).await.unwrap();
    let b = coordinator(RedisConfig::new(server.url()), 4).await;
    let e = b.register(&wid("w-b"), &meta(), lease).await.unwrap_err();
    assert!(
        matches!(e, CoordError::GroupsMismatch { ours: 4, fleet: 8 }),
        "{e:?}"
    );
    let said = e.to_string();
    assert!(
        said.contains('4') && said.contains('8') && said.contains("--coord-groups"),
        "{said}"
    );
    assert!(b.registration().is_none());
    let ks = botfleet_coord::KeySpace::with_groups("conf", 8).unwrap();
    for g in ks.all_groups() {
        let members: Vec<String> = ::redis::cmd("HKEYS")
            .arg(ks.workers_in(g))
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(members, ["w-a"], "{g}");
    }
    // The same number joins.
    let a2 = coordinator(RedisConfig::new(server.url()), 8).await;
    a2.register(&wid("w-a2"), &meta(), lease).await.unwrap();
    a2.unregister().await.unwrap();
    // The fleet gone, another number starts it again and is recorded.
    a.unregister().await.unwrap();
    b.register(&wid("w-b"), &meta(), lease).await.unwrap();
    let one = coordinator(RedisConfig::new(server.url()), 1).await;
    assert!(matches!(
        one.register(&wid("w-c"), &meta(), lease).await.unwrap_err(),
        CoordError::GroupsMismatch { ours: 1, fleet: 4 }
    ));
    // A fleet without a record (its workers began before groups) has one group.
    let _: () = ::redis::cmd("DEL")
        .arg(ks.layout())
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(matches!(
        a.register(&wid("w-a"), &meta(), lease).await.unwrap_err(),
        CoordError::GroupsMismatch { ours: 8, fleet: 1 }
    ));
    one.register(&wid("w-c"), &meta(), lease).await.unwrap();
}

/// Every key of one group's tag (`{conf:gK}`) with its TTL and `DUMP`.
async fn group_dump(c: &mut ::redis::aio::MultiplexedConnection, tag: &str) -> Dump {
    dump(c)
        .await
        .into_iter()
        .filter(|(k, _, _)| k.starts_with(tag))
        .collect()
}

/// Deletes every key of one group's tag, then writes `keep`'s back: the group alone goes back
/// to `keep` (empty: loses its data), as its own node would after a restart or a failover.
async fn group_back_to(c: &mut ::redis::aio::MultiplexedConnection, tag: &str, keep: &Dump) {
    for (k, _, _) in group_dump(c, tag).await {
        let _: () = ::redis::cmd("DEL").arg(&k).query_async(c).await.unwrap();
    }
    for (k, ttl, dump) in keep {
        let _: () = ::redis::cmd("RESTORE")
            .arg(k)
            .arg(*ttl)
            .arg(dump.as_slice())
            .query_async(c)
            .await
            .unwrap();
    }
}

/// A private Redis and worker "w-a" registered there (lease 10 s) with its keys in 8 groups;
/// the key space, and the group `nth` of it.
async fn worker_in_eight_groups(
    nth: usize,
) -> (
    RedisServer,
    botfleet_coord::KeySpace,
    botfleet_coord::Group,
    Arc<dyn Coordinator>,
    std::time::Duration,
) {
    use botfleet_testkit::coord_suite::{meta, wid};

    let server = RedisServer::start().unwrap();
    let ks = botfleet_coord::KeySpace::with_groups("conf", 8).unwrap();
    let g = ks.all_groups().nth(nth).unwrap();
    let a = coordinator(RedisConfig::new(server.url()), 8).await;
    let lease = std::time::Duration::from_secs(10);
    a.register(&wid("w-a"), &meta(), lease).await.unwrap();
    (server, ks, g, a, lease)
}

/// Eight groups, one of them (not the roster's) loses its data: renewing tells that group
/// lost and every other renewed; the bots of the others are still granted to their holder,
/// the lost group's are not. Joined again, the group gives this worker a fresh incarnation
/// there (the roster's and the other groups' stay), renews, and — its data lost — holds its
/// bots for the grace window while the other groups grant at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_that_lost_its_data_is_lost_alone_and_joined_again() {
    use std::time::Duration;

    use botfleet_coord::{ClaimOutcome, Renewal};
    use botfleet_core::Fence;
    use botfleet_testkit::coord_suite::bid;

    let (server, ks, lost, a, lease) = worker_in_eight_groups(3).await;
    let (_, first) = a.registration().unwrap();
    let bots: Vec<_> = (0..64).map(|i| bid(&format!("bot-{i}"))).collect();
    // Each bot's fence, as the store would keep it: the floor of its next claim.
    let mut fences = std::collections::HashMap::new();
    for bot in &bots {
        let ClaimOutcome::Granted(f) = a.claim(bot, Fence(0)).await.unwrap() else {
            panic!("{bot} not granted");
        };
        fences.insert(bot.clone(), f);
    }
    let (inside, outside): (Vec<_>, Vec<_>) = bots.iter().partition(|b| a.group_of_bot(b) == lost);
    assert!(!inside.is_empty() && !outside.is_empty());

    let mut c = raw(server.url()).await;
    group_back_to(&mut c, &ks.group_tag(lost), &Vec::new()).await;
    let renewed = a.renew_groups(0, 0).await;
    assert_eq!(renewed.len(), 8);
    for (g, r) in &renewed {
        let want = if *g == lost {
            Renewal::Lost
        } else {
            Renewal::Renewed
        };
        assert_eq!(r.as_ref().ok(), Some(&want), "{g}: {r:?}");
    }
    assert_eq!(a.renew(0).await.unwrap(), Renewal::Lost, "the whole lease");
    assert!(matches!(
        a.claim(outside[0], Fence(0)).await.unwrap(),
        ClaimOutcome::Granted(_)
    ));
    assert!(matches!(
        a.claim(inside[0], Fence(0)).await.unwrap(),
        ClaimOutcome::NotLive
    ));

    let again = a.rejoin_group(lost).await.unwrap();
    assert_ne!(again, first, "a fresh incarnation in the group");
    assert_eq!(a.registration_in(lost).unwrap().1, again);
    assert_eq!(a.registration().unwrap().1, first, "the registration stays");
    for g in ks.all_groups().filter(|g| *g != lost) {
        assert_eq!(a.registration_in(g).unwrap().1, first, "{g}");
    }
    let live = a.live_workers().await.unwrap();
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].incarnation, first, "the roster did not change");
    for (g, r) in a.renew_groups(0, 0).await {
        assert_eq!(r.ok(), Some(Renewal::Renewed), "{g}");
    }
    match a.claim(inside[0], fences[inside[0]]).await.unwrap() {
        ClaimOutcome::Grace(d) => assert!(d > Duration::ZERO && d <= lease, "{d:?}"),
        o => panic!("a bot of the group that lost its data: {o:?}"),
    }
    assert!(matches!(
        a.claim(outside[1], fences[outside[1]]).await.unwrap(),
        ClaimOutcome::Granted(_)
    ));
    assert_eq!(
        botfleet_testkit::coord_suite::groups_in_grace(&*a).await,
        [lost]
    );
    // A group may be joined again while its liveness there is good (its grants go).
    a.rejoin_group(ks.all_groups().last().unwrap())
        .await
        .unwrap();
    botfleet_testkit::coord_suite::a_group_beyond_is_refused(&*a).await;
    // Unregistering ends the liveness in every group, under each group's incarnation.
    a.unregister().await.unwrap();
    for g in ks.all_groups() {
        let left: Vec<String> = ::redis::cmd("HKEYS")
            .arg(ks.workers_in(g))
            .query_async(&mut c)
            .await
            .unwrap();
        assert!(left.is_empty(), "{g}: {left:?}");
    }
}

/// A group whose node went back in time (its keys restored to an earlier copy: the worker's
/// writes there since are gone) is found lost once and then not renewed again until joined
/// again: each renewal there would push its hold a grace further.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_that_went_back_in_time_is_not_renewed_again() {
    use std::time::Duration;

    use botfleet_coord::ClaimOutcome;
    use botfleet_core::Fence;
    use botfleet_testkit::coord_suite::bid;

    let (server, ks, back, a, lease) = worker_in_eight_groups(5).await;
    let mut c = raw(server.url()).await;
    let before = group_dump(&mut c, &ks.group_tag(back)).await;
    // Writes in the group the copy does not have.
    let bot = (0..)
        .map(|i| bid(&format!("bot-{i}")))
        .find(|b| a.group_of_bot(b) == back)
        .unwrap();
    assert!(matches!(
        a.claim(&bot, Fence(0)).await.unwrap(),
        ClaimOutcome::Granted(_)
    ));
    group_back_to(&mut c, &ks.group_tag(back), &before).await;
    let lost = botfleet_testkit::coord_suite::lost_groups;
    assert_eq!(lost(a.renew_groups(0, 0).await), [back]);
    let found = std::time::Instant::now();
    let left = || botfleet_testkit::coord_suite::grace_left_in(&*a, back);
    assert!(left().await > Duration::ZERO, "the group holds its bots");
    // Time passes; the group is answered lost again without a call, so its hold is not
    // pushed: it ends a grace after it was first found.
    while found.elapsed() < Duration::from_millis(1_500) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(lost(a.renew_groups(0, 0).await), [back]);
    let now_left = left().await;
    assert!(
        now_left <= lease - Duration::from_millis(1_400),
        "the hold moved: {now_left:?} left"
    );
    a.rejoin_group(back).await.unwrap();
    assert!(lost(a.renew_groups(0, 0).await).is_empty());
}

/// A lease keeper with its groups kept apart, one group (not the roster's) losing its data:
/// the handles of that group are revoked for good, the keeper joins the group again under a
/// fresh incarnation, and a new handle of it is good again — while the whole lease and every
/// other group's handles never fail. Without groups kept apart, the same loss revokes the
/// whole lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keeper_with_groups_apart_joins_a_lost_group_again_alone() {
    use std::time::{Duration, Instant};

    use botfleet_coord::{KeySpace, LeaseKeeper, LeaseLost};
    use botfleet_core::SystemClock;
    use botfleet_testkit::coord_suite::{meta, wid};

    let server = RedisServer::start().unwrap();
    let ks = KeySpace::with_groups("conf", 8).unwrap();
    let lost = ks.all_groups().nth(3).unwrap();
    // Long enough that a renewal late on a loaded 2-core machine stays inside the fence.
    let lease = Duration::from_secs(3);
    let a = coordinator(RedisConfig::new(server.url()), 8).await;
    let keeper = LeaseKeeper::start_with(
        a.clone(),
        Arc::new(SystemClock::new()),
        wid("w-a"),
        meta(),
        lease,
        true,
    )
    .await
    .unwrap();
    let whole = keeper.handle();
    let first = a.registration().unwrap().1;
    let in_lost = whole.in_group(lost);
    let others: Vec<_> = ks
        .all_groups()
        .filter(|g| *g != lost)
        .map(|g| (g, whole.in_group(g)))
        .collect();
    // A bot task of the lost group, waiting beside its poll: woken by the loss.
    let waiter = tokio::spawn({
        let h = in_lost.clone();
        async move { h.lost().await }
    });
    // A turn of the lost group and one of another, each given up once revoked for good.
    let given_up = tokio::spawn({
        let h = in_lost.clone();
        async move { h.revoked().await }
    });
    let kept = tokio::spawn({
        let h = others[0].1.clone();
        async move { h.revoked().await }
    });
    let mut c = raw(server.url()).await;
    group_back_to(&mut c, &ks.group_tag(lost), &Vec::new()).await;
    // Until a new handle of the lost group is good again (joined again), and for a lease
    // after: the whole lease and the other groups' handles stay good at every look.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut back_at = None;
    while back_at.is_none_or(|at: Instant| at.elapsed() < lease) {
        assert!(
            Instant::now() < deadline,
            "the lost group is not joined again"
        );
        assert_eq!(whole.check(), Ok(()), "the whole lease");
        for (g, h) in &others {
            assert_eq!(h.check(), Ok(()), "{g}");
        }
        if back_at.is_none() && whole.check_in(lost).is_ok() {
            back_at = Some(Instant::now());
            assert_eq!(whole.in_group(lost).check(), Ok(()), "a new handle");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("a waiter of the lost group is woken")
            .unwrap(),
        LeaseLost::Revoked
    );
    assert_eq!(in_lost.check(), Err(LeaseLost::Revoked), "revoked for good");
    tokio::time::timeout(Duration::from_secs(1), given_up)
        .await
        .expect("a turn of the lost group is given up")
        .unwrap();
    assert!(!kept.is_finished(), "a turn of another group is kept");
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(1), in_lost.lost())
            .await
            .unwrap(),
        LeaseLost::Revoked
    );
    let again = a.registration_in(lost).unwrap().1;
    assert_ne!(again, first, "joined again under a fresh incarnation");
    assert_eq!(a.registration().unwrap().1, first, "the registration stays");
    keeper.stop();

    // Without groups kept apart, the whole lease.
    let b = coordinator(RedisConfig::new(server.url()), 8).await;
    let keeper = LeaseKeeper::start(
        b.clone(),
        Arc::new(SystemClock::new()),
        wid("w-b"),
        meta(),
        lease,
    )
    .await
    .unwrap();
    let whole = keeper.handle();
    let given_up = tokio::spawn({
        let h = whole.clone();
        async move { h.revoked().await }
    });
    // A Redis that does not answer makes the lease late, not revoked: nothing is given up.
    let pid = server.pid().unwrap().to_string();
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig}");
    };
    signal("-STOP");
    let why = tokio::time::timeout(Duration::from_secs(10), whole.lost()).await;
    // Let a waiter that would wrongly resolve on lateness run before it is looked at.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let late_only = !given_up.is_finished();
    signal("-CONT");
    assert!(
        matches!(why, Ok(LeaseLost::Expired(_))),
        "late while Redis is frozen: {why:?}"
    );
    assert!(late_only, "a late lease gives nothing up");
    // Answering again: safe again (or revoked, had its deadline passed while it was frozen).
    let until = |want: fn(&Result<(), LeaseLost>) -> bool, what: &'static str| {
        let whole = whole.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !want(&whole.check()) {
                assert!(Instant::now() < deadline, "{what}: {:?}", whole.check());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    until(
        |r| !matches!(r, Err(LeaseLost::Expired(_))),
        "late no longer",
    )
    .await;
    group_back_to(&mut c, &ks.group_tag(lost), &Vec::new()).await;
    until(|r| *r == Err(LeaseLost::Revoked), "learns in time").await;
    tokio::time::timeout(Duration::from_secs(1), given_up)
        .await
        .expect("given up once revoked")
        .unwrap();
}
