//! Fault tests of the Redis backend against a private `redis-server`: restarts that lose every
//! key, a Redis that is down, bad URLs. And the steady-state cost of an idle worker.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{collections::HashMap, sync::Arc, time::Duration};

use botfleet_coord::{
    placement::{Ring, RingConfig, DEFAULT_BALANCE},
    ClaimOutcome, CoordError, Coordinator, LeaseKeeper, LifecycleEvent, MemberWatch, RedisConfig,
    RedisCoordinator, Renewal, WorkerCommand,
};
use botfleet_core::{BotId, Fence, SystemClock};
use botfleet_store::{SqliteStore, Store};
use botfleet_testkit::{
    coord_suite::{bid, meta, wid},
    free_port, nonce, wait_for, RedisServer, SentinelSetup, SENTINEL_MASTER,
};

async fn connect(server: &RedisServer) -> Arc<dyn Coordinator> {
    Arc::new(
        RedisCoordinator::connect(RedisConfig::new(server.url()).prefix("faults"))
            .await
            .unwrap(),
    )
}

struct TempDb(std::path::PathBuf);

impl TempDb {
    async fn open() -> (Self, SqliteStore) {
        let dir = std::env::temp_dir().join(format!("botfleet-faults-{}", nonce()));
        std::fs::create_dir_all(&dir).unwrap();
        let store = SqliteStore::open(dir.join("s.db")).await.unwrap();
        (Self(dir), store)
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Claims `bots` for `c`, passing the store's highest fence; returns bot → fence. Bots in a
/// grace window after a data loss are asked for again until granted.
async fn claim_all(
    c: &dyn Coordinator,
    store: &dyn Store,
    bots: &[&BotId],
) -> HashMap<BotId, Fence> {
    let mut out = HashMap::new();
    for b in bots {
        loop {
            let min = store.highest_fence(b).await.unwrap();
            match c.claim(b, min).await.unwrap() {
                ClaimOutcome::Granted(f) => {
                    store.accept_fence(b, f).await.unwrap();
                    out.insert((*b).clone(), f);
                    break;
                }
                ClaimOutcome::Grace(d) => tokio::time::sleep(d).await,
                other => panic!("{b}: {other:?}"),
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_with_data_loss_never_yields_two_owners() {
    data_loss_never_yields_two_owners(|s| s.restart().unwrap()).await;
}

/// `FLUSHALL` keeps every connection up: nobody notices from a broken socket, only from what
/// the scripts find (or no longer find).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_never_yields_two_owners() {
    data_loss_never_yields_two_owners(|s| s.flushall().unwrap()).await;
}

async fn data_loss_never_yields_two_owners(lose: impl FnOnce(&mut RedisServer)) {
    let mut server = RedisServer::start().unwrap();
    let (_db, store) = TempDb::open().await;
    let lease = Duration::from_millis(1500);
    let bots: Vec<BotId> = (0..40).map(|i| bid(&format!("bot-{i}"))).collect();
    let (wa, wb) = (wid("w-a"), wid("w-b"));
    let ring = Ring::new([&wa, &wb], RingConfig::default());
    let plan = ring.assign(&bots, DEFAULT_BALANCE, |_| None);
    let (mine_a, mine_b) = (plan.bots_of(&wa), plan.bots_of(&wb));

    let a = connect(&server).await;
    let b = connect(&server).await;
    let clock = Arc::new(SystemClock::new());
    let ka = LeaseKeeper::start(a.clone(), clock.clone(), wa.clone(), meta(), lease)
        .await
        .unwrap();
    let kb = LeaseKeeper::start(b.clone(), clock.clone(), wb.clone(), meta(), lease)
        .await
        .unwrap();
    let before_a = claim_all(&*a, &store, &mine_a).await;
    let before_b = claim_all(&*b, &store, &mine_b).await;

    lose(&mut server);
    let lost_at = tokio::time::Instant::now();

    // Both keepers learn the liveness is gone (revoked at the next renewal, or expired if
    // Redis answered nothing in time) well within one lease.
    let (ha, hb) = (ka.handle(), kb.handle());
    tokio::time::timeout(lease, ha.lost())
        .await
        .expect("a learns");
    tokio::time::timeout(lease, hb.lost())
        .await
        .expect("b learns");
    drop((ka, kb));

    // Re-register with new incarnations (the clients reconnect by themselves) and re-claim.
    let ka = wait_for("a re-registers", Duration::from_secs(10), || {
        let (a, clock, wa) = (a.clone(), clock.clone(), wa.clone());
        async move { LeaseKeeper::start(a, clock, wa, meta(), lease).await.ok() }
    })
    .await;
    let kb = LeaseKeeper::start(b.clone(), clock.clone(), wb.clone(), meta(), lease)
        .await
        .unwrap();
    // Their old bots wait out the grace window: an old owner that had not noticed the loss
    // could still be running them by its own clock.
    let min = store.highest_fence(mine_b[0]).await.unwrap();
    assert!(
        matches!(
            b.claim(mine_b[0], min).await.unwrap(),
            ClaimOutcome::Grace(_)
        ),
        "granted inside the grace window"
    );
    let after_a = claim_all(&*a, &store, &mine_a).await;
    // b may not take a's bots: they are held again, by a live worker.
    for bot in &mine_a {
        assert!(
            matches!(
                b.claim(bot, Fence::ZERO).await.unwrap(),
                ClaimOutcome::Held(_)
            ),
            "{bot} claimed twice after the restart"
        );
    }
    let after_b = claim_all(&*b, &store, &mine_b).await;
    assert!(
        lost_at.elapsed() >= lease,
        "owned bots granted {:?} after the loss",
        lost_at.elapsed()
    );
    // Fences kept growing although Redis forgot every counter: the store's floor carried them.
    for (bot, f) in before_a.iter().chain(&before_b) {
        let now = after_a.get(bot).or_else(|| after_b.get(bot)).unwrap();
        assert!(now > f, "{bot}: fence went from {f} to {now}");
        assert!(store.put_cursor(bot, "stale", *f).await.is_err());
    }
    assert!(ka.handle().check().is_ok() && kb.handle().check().is_ok());
}

/// A fleet started on a Redis that has never seen it, with a registry whose bots had owners
/// (Redis was replaced, or restarted while the fleet was down): Redis cannot tell those owners
/// are gone, so their bots wait one lease; bots that never had an owner start at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_redis_under_an_old_registry_waits_a_lease_for_owned_bots() {
    let server = RedisServer::start().unwrap();
    let (_db, store) = TempDb::open().await;
    let (owned, fresh) = (bid("owned"), bid("fresh"));
    store.accept_fence(&owned, Fence(42)).await.unwrap();
    let lease = Duration::from_millis(1000);
    let c = connect(&server).await;
    c.register(&wid("w-a"), &meta(), lease).await.unwrap();
    let t = tokio::time::Instant::now();
    assert!(matches!(
        c.claim(&fresh, Fence::ZERO).await.unwrap(),
        ClaimOutcome::Granted(_)
    ));
    let wait = match c.claim(&owned, Fence(42)).await.unwrap() {
        ClaimOutcome::Grace(d) => d,
        other => panic!("{other:?}"),
    };
    assert!(wait > lease / 2 && wait <= lease, "{wait:?}");
    let epoch = c.epoch().await.unwrap().unwrap();
    assert!(epoch.after_loss, "evidence of a loss marks the epoch");
    for _ in 0..2 {
        tokio::time::sleep(wait / 2).await;
        assert_eq!(c.renew(0).await.unwrap(), botfleet_coord::Renewal::Renewed);
    }
    assert!(matches!(
        c.claim(&owned, Fence(42)).await.unwrap(),
        ClaimOutcome::Granted(f) if f > Fence(42)
    ));
    assert!(t.elapsed() >= wait);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_fail_fast_while_redis_is_down_and_recover_after() {
    let mut server = RedisServer::start().unwrap();
    let c = connect(&server).await;
    c.register(&wid("w-a"), &meta(), Duration::from_secs(5))
        .await
        .unwrap();
    server.stop();
    let started = tokio::time::Instant::now();
    let e = c.claim(&bid("b"), Fence::ZERO).await.unwrap_err();
    assert!(e.is_transient(), "{e:?}");
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        matches!(e, CoordError::Unreachable { .. } | CoordError::Timeout(_)),
        "{e:?}"
    );
    server.restart().unwrap();
    // Reconnected by itself; the data is gone, so the worker must register again.
    let renewal = wait_for("reconnect", Duration::from_secs(10), || async {
        c.renew(0).await.ok()
    })
    .await;
    assert_eq!(renewal, botfleet_coord::Renewal::Lost);
    c.register(&wid("w-a"), &meta(), Duration::from_secs(5))
        .await
        .unwrap();
    assert!(matches!(
        c.claim(&bid("b"), Fence::ZERO).await.unwrap(),
        ClaimOutcome::Granted(_)
    ));
}

#[tokio::test]
async fn an_unreachable_redis_is_a_clear_error() {
    let port = free_port().unwrap();
    let started = tokio::time::Instant::now();
    let e = RedisCoordinator::connect(RedisConfig::new(format!("redis://127.0.0.1:{port}")))
        .await
        .unwrap_err();
    assert!(matches!(e, CoordError::Unreachable { .. }), "{e:?}");
    assert!(e.to_string().starts_with("Redis unreachable"), "{e}");
    // The cause survives for whoever logs the chain.
    assert!(std::error::Error::source(&e).is_some(), "{e:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn malformed_redis_urls_are_refused_without_echoing_secrets() {
    for url in [
        "",
        "localhost:6379",
        "http://127.0.0.1:6379",
        "rediss://127.0.0.1:6379",
        "redis://:pw-secret@[::1",
        "redis://:pw-secret@127.0.0.1:notaport",
    ] {
        match RedisCoordinator::connect(RedisConfig::new(url)).await {
            Err(e @ CoordError::InvalidUrl { .. }) => {
                assert!(!e.to_string().contains("pw-secret"), "{e}");
            }
            other => panic!("{url:?}: expected InvalidUrl, got {other:?}"),
        }
    }
    // A list is for the sentinel mode; the sentinel mode needs the primary's name, and a
    // list with one bad URL is refused as a whole.
    for (url, master) in [
        ("redis://127.0.0.1:1,redis://127.0.0.1:2", None),
        ("redis://127.0.0.1:1", Some(" ")),
        (",", Some("fleet")),
        ("redis://:pw-secret@127.0.0.1:1,http://x:1", Some("fleet")),
    ] {
        let cfg = RedisConfig::new(url);
        let cfg = match master {
            Some(m) => cfg.sentinel(m),
            None => cfg,
        };
        match RedisCoordinator::connect(cfg).await {
            Err(e @ CoordError::InvalidUrl { .. }) => {
                assert!(!e.to_string().contains("pw-secret"), "{e}");
            }
            other => panic!("{url:?} {master:?}: expected InvalidUrl, got {other:?}"),
        }
    }
    // Sentinels that do not answer: a clear error naming the mode's step, no password.
    let port = free_port().unwrap();
    let e = RedisCoordinator::connect(
        RedisConfig::new(format!("redis://:pw-secret@127.0.0.1:{port}")).sentinel("fleet"),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, CoordError::Unreachable { .. }), "{e:?}");
    assert!(e.to_string().contains("through Sentinel"), "{e}");
    assert!(!format!("{e} {e:?}").contains("pw-secret"), "{e:?}");
    let cfg = RedisConfig::new("redis://:pw-secret@127.0.0.1:1");
    assert!(!format!("{cfg:?}").contains("pw-secret"));
    let e = RedisCoordinator::connect(RedisConfig::new("redis://127.0.0.1:1").prefix("a b"))
        .await
        .unwrap_err();
    assert!(matches!(e, CoordError::InvalidArgument(_)), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_is_trimmed_to_its_bound() {
    let server = RedisServer::start().unwrap();
    let mut cfg = RedisConfig::new(server.url());
    cfg.max_events = 100;
    let c = RedisCoordinator::connect(cfg).await.unwrap();
    for i in 0..1_000 {
        c.publish(&LifecycleEvent::Restart(bid(&format!("b{i}"))))
            .await
            .unwrap();
    }
    let all = c
        .read_events(&botfleet_coord::EventCursor::START, 10_000, Duration::ZERO)
        .await
        .unwrap();
    // Redis trims by whole stream nodes (`MAXLEN ~`), so a little over the bound is normal.
    assert!((100..400).contains(&all.len()), "kept {}", all.len());
    assert_eq!(all.last().unwrap().1, LifecycleEvent::Restart(bid("b999")));
}

/// Redis commands a worker's steady state costs per second, with `bots` bots held: the lease
/// keeper, the member watch, and blocking reads of events and commands.
async fn idle_calls_per_second(bots: usize) -> f64 {
    let server = RedisServer::start().unwrap();
    let c = connect(&server).await;
    let lease = Duration::from_secs(3);
    let keeper = LeaseKeeper::start(
        c.clone(),
        Arc::new(SystemClock::new()),
        wid("w-a"),
        meta(),
        lease,
    )
    .await
    .unwrap();
    for i in 0..bots {
        c.claim(&bid(&format!("bot-{i}")), Fence::ZERO)
            .await
            .unwrap();
    }
    keeper.handle().set_bots_held(bots as u32);
    let _members = MemberWatch::spawn(c.clone(), lease / 3);
    let reader = c.clone();
    let events = tokio::spawn(async move {
        let mut cur = reader.events_head().await.unwrap();
        loop {
            for (id, _) in reader
                .read_events(&cur, 100, Duration::from_secs(5))
                .await
                .unwrap()
            {
                cur = id;
            }
        }
    });
    let reader = c.clone();
    let commands = tokio::spawn(async move {
        loop {
            reader
                .recv_commands(100, Duration::from_secs(5))
                .await
                .unwrap();
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let window = Duration::from_secs(10);
    // Round trips, not commands: an EVALSHA counts once, whatever its script runs.
    let before = server.client_round_trips();
    tokio::time::sleep(window).await;
    let after = server.client_round_trips();
    events.abort();
    commands.abort();
    (after - before) / window.as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_worker_costs_the_same_few_calls_whatever_it_holds() {
    let none = idle_calls_per_second(0).await;
    let many = idle_calls_per_second(2_000).await;
    println!(
        "idle worker, lease 3 s: {none:.2} Redis calls/s holding 0 bots, {many:.2} holding 2,000"
    );
    assert!(none < 5.0 && many < 5.0, "{none} / {many} calls per second");
    assert!(
        (many - none).abs() < 1.0,
        "cost grew with bots: {none} -> {many}"
    );
}

/// Renews `c` (as worker `w`, saying it holds `marker` bots) until the renewal lands on the
/// server `direct` talks to, registering again when one says the failover lost what the
/// registration wrote. (A write accepted by the old primary in the moment before it is
/// demoted never reaches the new one.)
async fn renews_on(c: &RedisCoordinator, direct: &RedisCoordinator, marker: u32, what: &str) {
    wait_for(what, Duration::from_secs(30), || async {
        match c.renew(marker).await {
            Ok(Renewal::Renewed) => {}
            Ok(Renewal::Lost) => {
                let _ = c
                    .register(&wid("w"), &meta(), Duration::from_secs(30))
                    .await;
                return None;
            }
            Err(_) => return None,
        }
        let live = direct.live_workers().await.ok()?;
        live.iter()
            .any(|l| l.id == wid("w") && l.meta.bots_held == marker)
            .then_some(())
    })
    .await;
}

/// Sentinel mode follows the primary through both kinds of failover, with no restart: a
/// manual one (`SENTINEL FAILOVER`: the old primary stays up as a replica and answers writes
/// with READONLY) and a kill -9 of the primary. After each, calls (scripts), subscriptions
/// (member signals) and blocking reads (worker commands) work on the promoted server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_mode_follows_failovers() {
    let mut setup = SentinelSetup::start().unwrap();
    let urls = setup.urls();
    let config = || {
        RedisConfig::new(urls.clone())
            .prefix("faults")
            .sentinel(SENTINEL_MASTER)
    };
    let c = RedisCoordinator::connect(config()).await.unwrap();
    c.register(&wid("w"), &meta(), Duration::from_secs(30))
        .await
        .unwrap();
    let mut signals = c.member_signal().await.unwrap();
    for (round, kind) in ["a manual failover", "a kill -9 of the primary"]
        .into_iter()
        .enumerate()
    {
        let took = tokio::task::block_in_place(|| {
            if round == 0 {
                setup.fail_over().unwrap()
            } else {
                setup.kill_primary_and_fail_over().unwrap()
            }
        });
        let t = std::time::Instant::now();
        // The registration's renewals land on the promoted server.
        let direct =
            RedisCoordinator::connect(RedisConfig::new(setup.primary_url()).prefix("faults"))
                .await
                .unwrap();
        let marker = 100 + round as u32;
        renews_on(
            &c,
            &direct,
            marker,
            &format!("renewals on the promoted server after {kind}"),
        )
        .await;
        println!(
            "{kind}: promoted {took:?} after it began; renewals land there {:?} later",
            t.elapsed()
        );
        // Subscriptions followed: a join on the promoted server is signalled.
        while signals.try_recv().is_ok() {}
        let other = RedisCoordinator::connect(config()).await.unwrap();
        other
            .register(&wid(&format!("x{round}")), &meta(), Duration::from_secs(30))
            .await
            .unwrap();
        wait_for(
            &format!("a member signal after {kind}"),
            Duration::from_secs(15),
            || {
                let got = signals.try_recv().ok();
                async move { got }
            },
        )
        .await;
        // Blocking reads followed: a command sent there reaches the worker.
        let cmd = WorkerCommand::Stop {
            bot: bid(&format!("b{round}")),
        };
        other.send_command(&wid("w"), &cmd).await.unwrap();
        let got = wait_for(
            &format!("a worker command after {kind}"),
            Duration::from_secs(15),
            || async {
                c.recv_commands(10, Duration::from_millis(500))
                    .await
                    .ok()
                    .filter(|v| !v.is_empty())
            },
        )
        .await;
        assert_eq!(got, vec![cmd], "{kind}");
    }
}

/// Passwords in sentinel mode. Data servers with a password behind Sentinels without one (the
/// usual setup): the URLs' password serves the primary and the Sentinels are asked without
/// it. Sentinels with the same password: asked again with it when they answer NOAUTH. A
/// wrong password is an error that does not echo it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_mode_with_passwords() {
    const PW: &str = "pw-secret-1";
    for sentinels_too in [false, true] {
        let setup =
            SentinelSetup::start_with_passwords(Some(PW), sentinels_too.then_some(PW)).unwrap();
        let c = RedisCoordinator::connect(
            RedisConfig::new(setup.urls())
                .prefix("faults")
                .sentinel(SENTINEL_MASTER),
        )
        .await
        .unwrap();
        c.register(&wid("w"), &meta(), Duration::from_secs(30))
            .await
            .unwrap();
        let direct =
            RedisCoordinator::connect(RedisConfig::new(setup.primary_url()).prefix("faults"))
                .await
                .unwrap();
        let live = direct.live_workers().await.unwrap();
        assert!(live.iter().any(|l| l.id == wid("w")), "{live:?}");

        let wrong = setup.urls().replace(PW, "pw-wrong-2");
        let e = RedisCoordinator::connect(
            RedisConfig::new(wrong)
                .prefix("faults")
                .sentinel(SENTINEL_MASTER),
        )
        .await
        .unwrap_err();
        let shown = format!("{e} {e:?}");
        println!("sentinels with a password: {sentinels_too}; a wrong one: {e}");
        assert!(!shown.contains("pw-wrong-2"), "{shown}");
        assert!(shown.contains("authentication failed"), "{shown}");
    }
}

/// In sentinel mode a grant is acted on only once a replica has it (the default of
/// `min_replicas`: 1): with the only replica frozen, a claim, a turn and a fenced lock each
/// fail with `Unreplicated` within the call's deadline (written, not acted on; the lock is free
/// again at its time to live) while calls that grant nothing go on; thawed, asking again grants them (the same holder again, a higher
/// fence). With `min_replicas(0)` the same primary grants at once. Without this, a failover to
/// a replica that missed the last grants hands a chat's turn to a second worker while the
/// first still acts (the Sentinel drill in `webhooks.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_grants_wait_for_a_replica() {
    let setup = SentinelSetup::start().unwrap();
    let config = || {
        RedisConfig::new(setup.urls())
            .prefix("replicas")
            .sentinel(SENTINEL_MASTER)
    };
    assert_eq!(config().replicas_wanted(), 1);
    assert_eq!(RedisConfig::new(setup.primary_url()).replicas_wanted(), 0);
    // (Each refused call below waits its whole deadline: 4 s, twice the response timeout.)
    let lease = Duration::from_secs(60);
    let c = RedisCoordinator::connect(config()).await.unwrap();
    c.register(&wid("w"), &meta(), lease).await.unwrap();
    // Replicated: granted as before.
    let ClaimOutcome::Granted(first) = c.claim(&bid("a"), Fence::ZERO).await.unwrap() else {
        panic!("claim with the replica running")
    };
    let (ticket, turn) = c.turn_take("chat-1", "e1").await.unwrap();
    assert!(
        matches!(turn, botfleet_coord::Turn::Granted { .. }),
        "{turn:?}"
    );
    assert!(c
        .turn_release("chat-1", ticket, turn_fence(&turn))
        .await
        .unwrap());

    setup.freeze_replicas(true).unwrap();
    let thaw = Thaw(&setup);
    let t = std::time::Instant::now();
    let e = c.claim(&bid("b"), Fence::ZERO).await.unwrap_err();
    let took = t.elapsed();
    assert!(
        matches!(
            e,
            CoordError::Unreplicated {
                acked: 0,
                wanted: 1,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.is_transient());
    assert!(e.to_string().contains("--redis-min-replicas"), "{e}");
    // Within the call's deadline (twice the 2 s response timeout, at most half the lease).
    assert!(took < Duration::from_secs(5), "{took:?}");
    let e = c.turn_take("chat-2", "e2").await.unwrap_err();
    assert!(matches!(e, CoordError::Unreplicated { .. }), "{e:?}");
    let e = c
        .acquire_lock_fenced("sweep", Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(e, CoordError::Unreplicated { .. }), "{e:?}");
    // What grants nothing is not held up: renewals, reads, an answer to wait.
    assert_eq!(c.renew(0).await.unwrap(), Renewal::Renewed);
    assert!(c.owner(&bid("b")).await.unwrap().is_some());
    // With no replica asked for, the same primary grants at once.
    let direct = RedisCoordinator::connect(
        RedisConfig::new(setup.primary_url())
            .prefix("replicas")
            .min_replicas(0),
    )
    .await
    .unwrap();
    direct.register(&wid("x"), &meta(), lease).await.unwrap();
    assert!(matches!(
        direct.claim(&bid("c"), Fence::ZERO).await.unwrap(),
        ClaimOutcome::Granted(_)
    ));

    drop(thaw);
    // Asked again once the replica runs: granted again to the same asker.
    let again = wait_for(
        "the claim granted once the replica runs",
        Duration::from_secs(20),
        || async {
            match c.claim(&bid("b"), Fence::ZERO).await {
                Ok(ClaimOutcome::Granted(f)) => Some(f),
                _ => None,
            }
        },
    )
    .await;
    assert!(again > first);
    let (_, turn) = c.turn_take("chat-2", "e2").await.unwrap();
    assert!(
        matches!(turn, botfleet_coord::Turn::Granted { .. }),
        "{turn:?}"
    );
    // The lock written for the refused call has a token nobody knows: it is free again at
    // its time to live, not before.
    wait_for(
        "the lock free at its time to live",
        Duration::from_secs(20),
        || async {
            c.acquire_lock_fenced("sweep", Duration::from_secs(5))
                .await
                .ok()
                .flatten()
        },
    )
    .await;
}

/// Thaws the frozen replicas however the test ends (a frozen replica would outlive it).
struct Thaw<'a>(&'a SentinelSetup);

impl Drop for Thaw<'_> {
    fn drop(&mut self) {
        let _ = self.0.freeze_replicas(false);
    }
}

fn turn_fence(t: &botfleet_coord::Turn) -> Fence {
    match t {
        botfleet_coord::Turn::Granted { fence, .. }
        | botfleet_coord::Turn::TakeOver { fence, .. } => *fence,
        other => panic!("not granted: {other:?}"),
    }
}
