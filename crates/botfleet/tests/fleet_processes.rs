//! The fleet as operators run it: separate `botfleet worker` processes on one Redis (a
//! private redis-server) and one SQLite registry, 300 bots on the fake Bot API, users writing
//! all along. One worker is killed with SIGKILL, one joins, one is stopped with SIGTERM, one
//! is frozen with SIGSTOP past its lease and thawed. After each event every bot must be polling
//! again within lease + 1 s; the fake must never see two pollers on one token; every message
//! must be answered, in order per chat.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use botfleet_coord::{Coordinator, RedisConfig, RedisCoordinator};
use botfleet_core::{BotId, BotSpec, Platform};
use botfleet_store::{SqliteStore, Store};
use botfleet_testkit::{
    fleet_worker, log_tails, nonce, wait_for, wait_for_or, FakeSlack, FakeTelegram, LinkMode,
    LinkProxy, Proc, RedisServer,
};

const BOTS: usize = 300;
/// Slack bots beside the Telegram ones in the mixed pool.
const SLACK_BOTS: usize = 60;

/// Per (token, chat): the texts, in order.
type Chats = HashMap<(String, String), Vec<String>>;
const LEASE_MS: u64 = 3_000;

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What every test here starts from: a private Redis, the fake Bot API, and a SQLite registry
/// (in a temp directory, removed on drop) with `bots` echo bots on the fake.
struct Setup {
    redis: RedisServer,
    fake: FakeTelegram,
    slack: FakeSlack,
    dir: Dir,
    db: String,
    store: SqliteStore,
}

/// The drills here run one at a time: each starts several worker processes and a Redis, and
/// six of them at once on two cores starved the workers (joins and hand-overs four times
/// slower, a Slack envelope redelivered past its ack deadline): failures of the machine's
/// load, not of the fleet.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn setup(bots: usize) -> Setup {
    setup_mixed(bots, 0).await
}

/// `bots` Telegram bots and `slack_bots` Slack bots (`slack-<j>`), all echo, on the fakes.
async fn setup_mixed(bots: usize, slack_bots: usize) -> Setup {
    let redis = RedisServer::start().unwrap();
    let fake = FakeTelegram::start().await.unwrap();
    let slack = FakeSlack::start().await.unwrap();
    // Frozen clients stop answering pings: the fake stops counting on their sockets soon.
    slack.state().set_ping_every(Duration::from_millis(500));
    let dir = Dir(std::env::temp_dir().join(format!("botfleet-fleet-{}", nonce())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let path = dir.0.join("bots.db");
    let db = format!("sqlite://{}", path.display());
    let store = SqliteStore::open(&path).await.unwrap();
    for i in 0..bots {
        fake.state().add_bot(&token(i));
        let mut spec = BotSpec::new(
            BotId::new(format!("bot-{i}")).unwrap(),
            Platform::Telegram,
            token(i),
        );
        spec.options.api_url = Some(fake.url());
        store.add_bot(&spec).await.unwrap();
    }
    for j in 0..slack_bots {
        slack.state().add_app(&slack_token(j), &slack_app_token(j));
        let mut spec = BotSpec::new(
            BotId::new(format!("slack-{j}")).unwrap(),
            Platform::Slack,
            slack_token(j),
        );
        spec.app_token = Some(botfleet_core::Secret::new(slack_app_token(j)));
        spec.options.api_url = Some(slack.url());
        store.add_bot(&spec).await.unwrap();
    }
    Setup {
        redis,
        fake,
        slack,
        dir,
        db,
        store,
    }
}

/// A coordinator on the fleet's Redis and key prefix, for the test to look with.
async fn coordinator(redis: &RedisServer) -> RedisCoordinator {
    RedisCoordinator::connect(RedisConfig::new(redis.url()).prefix("itest"))
        .await
        .unwrap()
}

/// Registers Discord bot `id` of `shards` shards (its token `token`) on `fake`.
async fn add_discord(
    store: &SqliteStore,
    fake: &botfleet_testkit::FakeDiscord,
    id: &str,
    token: &str,
    shards: u32,
) {
    fake.state().add_bot(token, shards, shards);
    let mut spec = BotSpec::new(BotId::new(id).unwrap(), Platform::Discord, token);
    spec.options.api_url = Some(fake.url());
    store.add_bot(&spec).await.unwrap();
}

/// Runs `botfleet ARGS…` against this fleet's registry and Redis; fails the test on a non-zero
/// exit, with its stderr.
fn fleet_cli(db: &str, redis: &RedisServer, args: &[&str]) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_botfleet"))
        .env("BOTFLEET_HOOKS_ADDR", "127.0.0.1:0")
        .args(args)
        .args([
            "--database-url",
            db,
            "--redis-url",
            &redis.url(),
            "--prefix",
            "itest",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn token(i: usize) -> String {
    format!("{}:fleet-{i}", 5000 + i)
}

fn slack_token(j: usize) -> String {
    format!("xoxb-fleet-{j}")
}

fn slack_app_token(j: usize) -> String {
    format!("xapp-fleet-{j}")
}

fn spawn_worker(name: &str, db: &str, redis: &str, dir: &Path) -> Proc {
    spawn_worker_with(
        name,
        db,
        redis,
        dir,
        &["--lease-ms", &LEASE_MS.to_string(), "--poll-timeout-s", "2"],
    )
}

/// A worker with `extra` flags (lease, poll timeout) besides the fleet's.
fn spawn_worker_with(name: &str, db: &str, redis: &str, dir: &Path, extra: &[&str]) -> Proc {
    Proc::spawn(
        name,
        fleet_worker(env!("CARGO_BIN_EXE_botfleet"), name, db, redis, "itest")
            .args(extra)
            .args(["--connect-rate", "20000"]),
        dir,
    )
}

/// The bots of the mixed pool `worker` holds now: Telegram tokens, Slack bot tokens.
async fn held_by(coord: &RedisCoordinator, worker: &str) -> Victims {
    let mut slack = Vec::new();
    for j in 0..SLACK_BOTS {
        let bot = BotId::new(format!("slack-{j}")).unwrap();
        if let Ok(Some(o)) = coord.owner(&bot).await {
            if o.worker.as_str() == worker && o.live {
                slack.push(slack_token(j));
            }
        }
    }
    Victims {
        telegram: held_among(coord, worker, BOTS).await,
        slack,
    }
}

/// Waits until `worker` is live and holds more than `n` bots; the workers' logs if not.
async fn holding(coord: &RedisCoordinator, dir: &Path, worker: &str, n: u32, limit: Duration) {
    wait_for_or(
        &format!("{worker} holds more than {n} bots"),
        limit,
        || async {
            let live = coord.live_workers().await.ok()?;
            live.iter()
                .find(|w| w.id.as_str() == worker && w.meta.bots_held > n)
                .map(|_| ())
        },
        || log_tails(dir),
    )
    .await;
}

/// Bots a worker held, by platform.
struct Victims {
    telegram: Vec<String>,
    slack: Vec<String>,
}

/// Waits until every bot of `moved` was served again since `since` (a Telegram poll, a Slack
/// socket's hello) by a new owner; answers how long after `since` that was.
async fn moved_served(
    fake: &FakeTelegram,
    slack: &FakeSlack,
    what: &str,
    moved: &Victims,
    since: Instant,
    limit: Duration,
) -> Duration {
    assert!(
        !moved.telegram.is_empty() && !moved.slack.is_empty(),
        "{what}: the worker held bots of both platforms"
    );
    wait_for(what, limit, || async {
        (fake.state().polled_since_among(&moved.telegram, since) == moved.telegram.len()
            && slack.state().connected_since_among(&moved.slack, since) == moved.slack.len())
        .then_some(())
    })
    .await;
    since.elapsed()
}

/// The tokens of the bots (of the first `n`) `worker` holds now.
async fn held_among(coord: &RedisCoordinator, worker: &str, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    for i in 0..n {
        let bot = BotId::new(format!("bot-{i}")).unwrap();
        if let Ok(Some(o)) = coord.owner(&bot).await {
            if o.worker.as_str() == worker && o.live {
                out.push(token(i));
            }
        }
    }
    out
}

/// Waits until every bot of `moved` has been polled since `since` (by its new owner: the old
/// one is dead, frozen or stopped it); answers how long after `since` that was.
async fn moved_polling(
    fake: &FakeTelegram,
    what: &str,
    moved: &[String],
    since: Instant,
    limit: Duration,
) -> Duration {
    assert!(!moved.is_empty(), "{what}: the worker held no bots");
    wait_for(what, limit, || async {
        (fake.state().polled_since_among(moved, since) == moved.len()).then_some(())
    })
    .await;
    since.elapsed()
}

/// Waits until every bot has been polled since `since` (so a live worker serves it); answers
/// how long after `since` that was.
/// If that wait fails, it names the bots that did not poll and prints the logs in `logs`.
async fn all_polling(
    fake: &FakeTelegram,
    what: &str,
    since: Instant,
    limit: Duration,
    logs: &std::path::Path,
) -> Duration {
    wait_for_or(
        what,
        limit,
        || async { (fake.state().polled_since(since) == BOTS).then_some(()) },
        || {
            let quiet = fake.state().not_polled_since(since);
            format!(
                "{} bots not polled since: {:?}\n{}",
                quiet.len(),
                &quiet[..quiet.len().min(20)],
                log_tails(logs)
            )
        },
    )
    .await;
    since.elapsed()
}

/// Waits until `n` bots have been polled since `since`; answers how long after `since` that
/// was.
async fn n_polling(
    fake: &FakeTelegram,
    n: usize,
    what: &str,
    since: Instant,
    limit: Duration,
) -> Duration {
    wait_for(what, limit, || async {
        (fake.state().polled_since(since) == n).then_some(())
    })
    .await;
    since.elapsed()
}

/// Waits (30 s at most) until `n` bots poll, then starts users writing to them and lets
/// that run for 2 s.
async fn polling_then_traffic(fake: &FakeTelegram, n: usize, what: &str) -> Traffic {
    n_polling(fake, n, what, Instant::now(), Duration::from_secs(30)).await;
    let traffic = Traffic::start(fake, n);
    tokio::time::sleep(Duration::from_secs(2)).await;
    traffic
}

/// Stops the users after a second more of writing, waits until every message is answered in
/// order, and checks that none was answered twice and no token had two pollers.
async fn finish_doubling_nothing(traffic: Traffic, fake: &FakeTelegram, what: &str) {
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (total, dups) = traffic.finish(fake).await;
    println!(
        "{what}: {total} written, lost 0, duplicated {dups}, second pollers (409) {}",
        fake.state().conflicts()
    );
    assert_eq!(fake.state().conflicts(), 0, "two pollers on one token");
    assert_eq!(dups, 0, "answered twice");
}

/// Checks every chat of `want` was answered in order (the first answer to each message
/// follows the order of the messages) and answers how many answers were repeats.
fn duplicates_in_order(want: &Chats, got: &Chats) -> usize {
    let mut dups = 0;
    for (chat, texts) in want {
        let g = &got[chat];
        dups += g.len() - texts.len();
        let mut firsts: Vec<&String> = Vec::new();
        for t in g {
            if !firsts.contains(&t) {
                firsts.push(t);
            }
        }
        assert_eq!(
            firsts,
            texts.iter().collect::<Vec<_>>(),
            "order in {chat:?}"
        );
    }
    dups
}

/// Users writing to `bots` bots all along: message k of each chat says "k".
struct Traffic {
    stop: Arc<AtomicBool>,
    written: Arc<AtomicU64>,
    expected: Arc<Mutex<Chats>>,
    task: tokio::task::JoinHandle<()>,
}

impl Traffic {
    fn start(fake: &FakeTelegram, bots: usize) -> Self {
        Self::start_mixed(fake, bots, None, 0)
    }

    /// Users write to `bots` Telegram bots and `slack_bots` Slack bots (two chats each).
    fn start_mixed(
        fake: &FakeTelegram,
        bots: usize,
        slack: Option<&FakeSlack>,
        slack_bots: usize,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let written = Arc::new(AtomicU64::new(0));
        let expected: Arc<Mutex<Chats>> = Arc::default();
        let (state, stop2, written2, expected2) = (
            fake.state().clone(),
            stop.clone(),
            written.clone(),
            expected.clone(),
        );
        let slack_state = slack.map(|s| s.state().clone());
        let task = tokio::spawn(async move {
            let mut x: u64 = 0x1234_5678;
            let mut next: HashMap<(usize, i64), u64> = HashMap::new();
            let all = bots + slack_bots;
            while !stop2.load(Ordering::SeqCst) {
                for _ in 0..5 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let bot = (x % all as u64) as usize;
                    let chat = ((x >> 40) % 2) as i64 + 1;
                    let n = next.entry((bot, chat)).or_default();
                    let key = match (&slack_state, bot.checked_sub(bots)) {
                        (Some(sl), Some(j)) => {
                            let channel = format!("C{chat}");
                            sl.user_writes(&slack_token(j), &channel, None, &n.to_string());
                            (slack_token(j), channel)
                        }
                        _ => {
                            state.user_writes(&token(bot), chat, &n.to_string());
                            (token(bot), chat.to_string())
                        }
                    };
                    expected2
                        .lock()
                        .unwrap()
                        .entry(key)
                        .or_default()
                        .push(n.to_string());
                    *n += 1;
                    written2.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        Self {
            stop,
            written,
            expected,
            task,
        }
    }

    /// Stops writing and waits until every message is answered; checks each chat's order.
    /// Answers (messages written, answers duplicated).
    async fn finish(self, fake: &FakeTelegram) -> (usize, usize) {
        self.finish_mixed(fake, None).await
    }

    /// [`Traffic::finish`] over both platforms.
    async fn finish_mixed(self, fake: &FakeTelegram, slack: Option<&FakeSlack>) -> (usize, usize) {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap();
        let total = self.written.load(Ordering::SeqCst) as usize;
        let want = self.expected.lock().unwrap().clone();
        let answered = wait_for(
            "every message answered",
            Duration::from_secs(30),
            || async {
                let mut got: Chats = HashMap::new();
                for s in fake.state().sent() {
                    got.entry((s.token, s.chat_id)).or_default().push(s.text);
                }
                for p in slack.map(|s| s.state().sent()).unwrap_or_default() {
                    got.entry((p.token, p.channel)).or_default().push(p.text);
                }
                want.iter()
                    .all(|(k, v)| got.get(k).is_some_and(|g| v.iter().all(|t| g.contains(t))))
                    .then_some(got)
            },
        )
        .await;
        (total, duplicates_in_order(&want, &answered))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_survive_kill_join_term_and_stop() {
    kill_join_term_and_stop(1).await;
}

/// The same drill with the fleet's keys in 16 coordination groups (`--coord-groups 16`), each
/// group's part of every worker's lease kept apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_in_sixteen_coordination_groups_survive_kill_join_term_and_stop() {
    kill_join_term_and_stop(16).await;
}

/// Three workers of `groups` coordination groups, users writing to 300 Telegram and 60 Slack
/// bots all along: kill -9 of one, a join, SIGTERM of another, SIGSTOP of a third past its
/// lease; never two pollers or sockets, every message answered once, in order.
async fn kill_join_term_and_stop(groups: u16) {
    let _one = ONE_AT_A_TIME.lock().await;
    let Setup {
        redis,
        fake,
        slack: fake_slack,
        dir,
        db,
        store: _store,
    } = setup_mixed(BOTS, SLACK_BOTS).await;
    let coord =
        RedisCoordinator::connect(RedisConfig::new(redis.url()).prefix("itest").groups(groups))
            .await
            .unwrap();
    let groups = groups.to_string();
    let spawn = |name: &str| {
        let lease = LEASE_MS.to_string();
        let flags = ["--lease-ms", &lease, "--poll-timeout-s", "2"];
        let flags = [&flags[..], &["--coord-groups", &groups]].concat();
        spawn_worker_with(name, &db, &redis.url(), &dir.0, &flags)
    };
    let mut procs: Vec<Proc> = (0..3).map(|i| spawn(&format!("w{i}"))).collect();
    let t = Instant::now();
    let startup = all_polling(
        &fake,
        "300 Telegram bots polling on 3 workers",
        t,
        Duration::from_secs(30),
        &dir.0,
    )
    .await;
    wait_for(
        "60 Slack bots connected",
        Duration::from_secs(30),
        || async { (fake_slack.state().connected_since(t) == SLACK_BOTS).then_some(()) },
    )
    .await;
    println!("start: all {BOTS} Telegram bots polling after {startup:?}, {SLACK_BOTS} Slack bots connected after {:?}", t.elapsed());

    let traffic = Traffic::start_mixed(&fake, BOTS, Some(&fake_slack), SLACK_BOTS);
    // Upper bounds of the waits. Times are reported, and bounded only as generously as a
    // loaded 2-core machine needs: the tight figures are the benchmark's.
    let slack = Duration::from_secs(30);

    // 1. kill -9 w1.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let victims = held_by(&coord, "w1").await;
    let killed_at = Instant::now();
    procs[1].child.kill().unwrap();
    let _ = procs[1].child.wait();
    let after_kill = moved_served(
        &fake,
        &fake_slack,
        "w1's bots back after kill -9",
        &victims,
        killed_at,
        slack,
    )
    .await;
    println!("kill -9: the victim's {} Telegram and {} Slack bots back {after_kill:?} after the kill (lease {LEASE_MS} ms)", victims.telegram.len(), victims.slack.len());

    // 2. w3 joins and takes its share.
    let joined_at = Instant::now();
    procs.push(spawn("w3"));
    holding(&coord, &dir.0, "w3", 50, slack).await;
    all_polling(
        &fake,
        "bots polling after the join",
        joined_at,
        slack,
        &dir.0,
    )
    .await;
    println!(
        "join: w3 runs its share {:?} after starting",
        joined_at.elapsed()
    );

    // 3. SIGTERM w2: it hands its bots over and exits 0.
    let victims = held_by(&coord, "w2").await;
    let term_at = Instant::now();
    procs[2].signal("-TERM");
    let status = tokio::task::spawn_blocking({
        let mut child =
            std::mem::replace(&mut procs[2].child, Command::new("true").spawn().unwrap());
        move || child.wait().unwrap()
    })
    .await
    .unwrap();
    assert!(
        status.success(),
        "w2 exit: {status:?}\n{}",
        procs[2].log_tail()
    );
    let after_term = moved_served(
        &fake,
        &fake_slack,
        "w2's bots back after SIGTERM",
        &victims,
        term_at,
        slack,
    )
    .await;
    println!("SIGTERM: w2 exited 0; its bots back {after_term:?} after the signal");

    // 4. SIGSTOP w0 past its lease, then SIGCONT.
    let victims = held_by(&coord, "w0").await;
    let stopped_at = Instant::now();
    procs[0].freeze_between_writes(&dir.0.join("bots.db"));
    wait_for("w0's liveness ends", slack, || async {
        let live = coord.live_workers().await.ok()?;
        (!live.iter().any(|w| w.id.as_str() == "w0")).then_some(())
    })
    .await;
    let t_stop = moved_served(
        &fake,
        &fake_slack,
        "w0's bots back after SIGSTOP",
        &victims,
        stopped_at,
        slack,
    )
    .await;
    println!("SIGSTOP: the frozen worker's bots back on the others {t_stop:?} after the freeze");
    procs[0].signal("-CONT");
    let thawed = Instant::now();
    wait_for("w0 rejoins and takes bots again", slack, || async {
        let live = coord.live_workers().await.ok()?;
        live.iter()
            .find(|w| w.id.as_str() == "w0" && w.meta.bots_held > 0)
            .map(|_| ())
    })
    .await;
    all_polling(
        &fake,
        "bots polling after w0 rejoined",
        thawed,
        slack,
        &dir.0,
    )
    .await;

    // Stop writing; every message must be answered, once, in order, on both platforms.
    let (total, dups) = traffic.finish_mixed(&fake, Some(&fake_slack)).await;
    let mut acks = fake_slack.state().ack_latencies();
    acks.sort();
    let p99 = acks[(acks.len() * 99 / 100).min(acks.len() - 1)];
    println!(
        "messages: {total} written (Telegram and Slack), {} answers, lost 0, duplicated {dups}; Telegram second pollers (409) {}; Slack sockets of one app on two workers {}; Slack envelopes {} acknowledged, p99 {p99:?}, redelivered {}; most sockets one Slack app held at once {}",
        total + dups,
        fake.state().conflicts(),
        fake_slack.state().overlaps(),
        acks.len(),
        fake_slack.state().redeliveries(),
        (0..SLACK_BOTS)
            .map(|j| fake_slack.state().max_sockets(&slack_token(j)))
            .max()
            .unwrap_or(0)
    );
    assert_eq!(fake.state().conflicts(), 0, "two pollers on one token");
    assert_eq!(
        fake_slack.state().overlaps(),
        0,
        "one Slack app on two workers"
    );
    assert!(
        (0..SLACK_BOTS).all(|j| fake_slack.state().max_sockets(&slack_token(j)) <= 2),
        "a Slack bot held more than two sockets"
    );
    assert!(p99 < Duration::from_secs(3), "Slack acks p99 {p99:?}");
    for (what, d) in [
        ("kill -9", after_kill),
        ("SIGTERM", after_term),
        ("SIGSTOP", t_stop),
    ] {
        assert!(d < Duration::from_secs(20), "{what}: {d:?}");
    }

    // The operator's view agrees.
    let out = fleet_cli(&db, &redis, &["fleet", "status", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let workers: Vec<_> = status["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(workers, ["w0", "w3"]);
    assert_eq!(status["unowned"].as_array().unwrap().len(), 0, "{status}");
}

/// `botfleet bots …` with `--redis-url` publishes lifecycle events: a running worker starts,
/// stops and restarts bots within about a second, without waiting for its registry refresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_commands_reach_running_workers_at_once() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Setup {
        redis,
        fake,
        slack: _slack,
        dir,
        db,
        store: _store,
    } = setup(0).await;
    let cli = |args: &[&str]| {
        fleet_cli(&db, &redis, args);
    };
    // The registry exists before the worker starts (an empty one).
    cli(&["bots", "list"]);
    let _w = spawn_worker("solo", &db, &redis.url(), &dir.0);
    let coord = coordinator(&redis).await;
    wait_for("worker live", Duration::from_secs(20), || async {
        (coord.live_workers().await.ok()?.len() == 1).then_some(())
    })
    .await;
    fake.state().add_bot("9001:EV");
    let t = Instant::now();
    cli(&[
        "bots",
        "add",
        "ev",
        "--platform",
        "telegram",
        "--token",
        "9001:EV",
        "--api-url",
        &fake.url(),
    ]);
    wait_for("added bot polling", Duration::from_secs(5), || async {
        fake.state().is_polling("9001:EV").then_some(())
    })
    .await;
    let added = t.elapsed();
    let t = Instant::now();
    cli(&["bots", "disable", "ev"]);
    wait_for("disabled bot stops", Duration::from_secs(5), || async {
        (!fake.state().is_polling("9001:EV")).then_some(())
    })
    .await;
    let disabled = t.elapsed();
    cli(&["bots", "enable", "ev"]);
    wait_for("enabled bot polls", Duration::from_secs(5), || async {
        fake.state().is_polling("9001:EV").then_some(())
    })
    .await;
    let polls = fake.state().polls("9001:EV");
    cli(&["bots", "restart", "ev"]);
    wait_for("restarted", Duration::from_secs(5), || async {
        (fake.state().polls("9001:EV") > polls && fake.state().is_polling("9001:EV")).then_some(())
    })
    .await;
    println!("lifecycle events: add -> polling {added:?}, disable -> stopped {disabled:?}");
    // Registry refresh in a fleet is 30 s: these came through the event stream.
    assert!(added < Duration::from_secs(2) && disabled < Duration::from_secs(2));
    cli(&["bots", "remove", "ev"]);
    wait_for("removed bot stops", Duration::from_secs(5), || async {
        (!fake.state().is_polling("9001:EV")).then_some(())
    })
    .await;
    assert_eq!(fake.state().conflicts(), 0);
}

/// The highest fence the store accepted for each of the first `n` bots.
async fn fences(store: &SqliteStore, n: usize) -> Vec<botfleet_core::Fence> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let bot = BotId::new(format!("bot-{i}")).unwrap();
        out.push(store.highest_fence(&bot).await.unwrap());
    }
    out
}

/// After a data loss at `lost_at`: waits until every one of `n` bots was claimed again (a
/// fence above `before`) and polled by its new owner; answers how long after the loss that
/// poll came. Every old owner learns of the loss at its next renewal (a third of the lease),
/// so a poll accepted after half a lease is the new owner's.
async fn back_after_loss(
    fake: &FakeTelegram,
    store: &SqliteStore,
    before: &[botfleet_core::Fence],
    what: &str,
    lost_at: Instant,
) -> Duration {
    let n = before.len();
    let new_owners = lost_at + Duration::from_millis(LEASE_MS / 2);
    wait_for(what, Duration::from_secs(60), || async {
        (fake.state().polled_since(new_owners) == n).then_some(())
    })
    .await;
    // Claimed again: under fences above the old ones.
    let now = fences(store, n).await;
    assert!(now.iter().zip(before).all(|(a, b)| a > b), "{what}: fences");
    let mut firsts: Vec<Duration> = fake
        .state()
        .first_polls_since(new_owners)
        .into_iter()
        .map(|t| t.duration_since(lost_at))
        .collect();
    firsts.sort();
    println!(
        "{what}: first polls of the new owners from {:?} to {:?} after the loss (median {:?})",
        firsts[0],
        firsts[firsts.len() - 1],
        firsts[firsts.len() / 2]
    );
    firsts[firsts.len() - 1]
}

/// Redis loses its data twice under three workers while users write: once by `FLUSHALL`
/// (every connection stays up, so the old owners go on polling until their next renewal finds
/// their registration gone) and once by a restart without persistence. The fake Bot API ends
/// an older poll when a newer one arrives, as Telegram does, so a second poller would show as a
/// conflict: there must be none, no message lost, none answered twice, every chat in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_losing_its_data_under_traffic_doubles_nothing() {
    let _one = ONE_AT_A_TIME.lock().await;
    let n = 200;
    let Setup {
        mut redis,
        fake,
        slack: _slack,
        dir,
        db,
        store,
    } = setup(n).await;
    let _procs: Vec<Proc> = (0..3)
        .map(|i| spawn_worker(&format!("w{i}"), &db, &redis.url(), &dir.0))
        .collect();
    let traffic = polling_then_traffic(&fake, n, "all bots polling").await;

    let before = fences(&store, n).await;
    let lost_at = Instant::now();
    redis.flushall().unwrap();
    let after_flush =
        back_after_loss(&fake, &store, &before, "bots back after FLUSHALL", lost_at).await;
    println!(
        "FLUSHALL: every bot polled by its new owner {after_flush:?} after the loss (lease {LEASE_MS} ms); second pollers so far {}",
        fake.state().conflicts()
    );
    assert_eq!(fake.state().conflicts(), 0, "two pollers after FLUSHALL");

    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = fences(&store, n).await;
    let lost_at = Instant::now();
    redis.restart().unwrap();
    let after_restart =
        back_after_loss(&fake, &store, &before, "bots back after a restart", lost_at).await;
    println!(
        "Redis restarted empty: every bot polled by its new owner {after_restart:?} after the loss"
    );
    finish_doubling_nothing(traffic, &fake, "messages").await;
    // Not a tight bound (the machine is shared): the grace window is one lease.
    for (what, d) in [("FLUSHALL", after_flush), ("restart", after_restart)] {
        assert!(
            d >= Duration::from_millis(LEASE_MS / 2),
            "{what}: bots were granted {d:?} after the loss, before their old owners stopped"
        );
        assert!(d < Duration::from_secs(20), "{what}: {d:?}");
    }
}

/// Thousands of bots move at once between worker processes: 5,000 bots on one worker, a
/// second joins and takes its share, then the first gets SIGTERM and hands every bot over
/// before it exits. (Completion is asserted, not a tight time: the benchmark measures that.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_thousand_bots_move_on_a_join_and_a_sigterm() {
    let _one = ONE_AT_A_TIME.lock().await;
    let n = 5_000;
    let Setup {
        redis,
        fake,
        slack: _slack,
        dir,
        db,
        store: _store,
    } = setup(n).await;
    let coord = coordinator(&redis).await;
    // Long polls of 8 s keep the fake's load (in this test process) modest.
    let flags = ["--lease-ms", "15000", "--poll-timeout-s", "8"];
    let mut a = spawn_worker_with("a", &db, &redis.url(), &dir.0, &flags);
    let t = Instant::now();
    let up = n_polling(&fake, n, "a polls every bot", t, Duration::from_secs(120)).await;
    println!("{n} bots polling on one worker {up:?} after it started");

    let t = Instant::now();
    let _b = spawn_worker_with("b", &db, &redis.url(), &dir.0, &flags);
    let held = |who: &'static str| {
        let coord = coord.clone();
        async move {
            coord
                .live_workers()
                .await
                .ok()?
                .into_iter()
                .find(|w| w.id.as_str() == who)
                .map(|w| w.meta.bots_held as usize)
        }
    };
    let share = wait_for_or(
        "b takes its share",
        Duration::from_secs(120),
        || async {
            let (ha, hb) = (held("a").await?, held("b").await?);
            (hb > n / 3 && ha + hb == n).then_some(hb)
        },
        || log_tails(&dir.0),
    )
    .await;
    let joined = t.elapsed();
    n_polling(
        &fake,
        n,
        "every bot polling after the join",
        t,
        Duration::from_secs(60),
    )
    .await;
    println!("join: b runs {share} bots {joined:?} after it started");

    let moved = held_among(&coord, "a", n).await;
    let t = Instant::now();
    a.signal("-TERM");
    let status = tokio::task::spawn_blocking({
        let mut child = std::mem::replace(&mut a.child, Command::new("true").spawn().unwrap());
        move || child.wait().unwrap()
    })
    .await
    .unwrap();
    let exited = t.elapsed();
    assert!(status.success(), "a exit: {status:?}\n{}", a.log_tail());
    assert!(exited < Duration::from_secs(30), "SIGTERM took {exited:?}");
    wait_for("b runs every bot", Duration::from_secs(120), || async {
        (held("b").await? == n).then_some(())
    })
    .await;
    let back = moved_polling(
        &fake,
        "a's bots polled by b",
        &moved,
        t,
        Duration::from_secs(60),
    )
    .await;
    println!(
        "SIGTERM: a handed {} bots over and exited {exited:?} after the signal; all of them polled on b {back:?} after it",
        moved.len()
    );
    assert_eq!(fake.state().conflicts(), 0, "two pollers on one token");
}

/// Discord bots of several shards across worker processes, plus one bot of 16 shards split
/// into slices of 4 (four units placed apart), users writing on every shard: kill -9, a join,
/// SIGTERM and SIGSTOP. After the cold start every move RESUMEs (IDENTIFYs
/// stay at the cold start's count), no shard ever runs two sessions, no IDENTIFY comes too early,
/// nothing is lost, each channel is answered in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discord_shards_resume_across_kill_join_term_and_stop() {
    let _one = ONE_AT_A_TIME.lock().await;
    const DBOTS: usize = 12;
    const SHARDS: u32 = 4;
    let dtoken = |k: usize| format!("DISCORD.fleet.{k}");
    let redis = RedisServer::start().unwrap();
    let fake = botfleet_testkit::FakeDiscord::start().await.unwrap();
    let dir = Dir(std::env::temp_dir().join(format!("botfleet-fleet-{}", nonce())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let path = dir.0.join("bots.db");
    let db = format!("sqlite://{}", path.display());
    let store = SqliteStore::open(&path).await.unwrap();
    for k in 0..DBOTS {
        add_discord(&store, &fake, &format!("disc-{k}"), &dtoken(k), SHARDS).await;
    }
    const BIG: &str = "DISCORD.fleet.big";
    fake.state().add_bot(BIG, 16, 16);
    let mut big = BotSpec::new(BotId::new("disc-big").unwrap(), Platform::Discord, BIG);
    big.options.api_url = Some(fake.url());
    big.options.shards = Some(16);
    big.options.shards_per_slice = Some(4);
    store.add_bot(&big).await.unwrap();
    let coord = coordinator(&redis).await;
    let all_up = |fake: &botfleet_testkit::FakeDiscord| {
        (0..DBOTS).all(|k| fake.state().connected_shards(&dtoken(k)) == SHARDS)
            && fake.state().connected_shards(BIG) == 16
    };
    let mut procs: Vec<Proc> = (0..3)
        .map(|i| spawn_worker(&format!("w{i}"), &db, &redis.url(), &dir.0))
        .collect();
    let limit = Duration::from_secs(30);
    wait_for("every shard connected", limit, || async {
        all_up(&fake).then_some(())
    })
    .await;
    // A cold start IDENTIFYs every shard once; a worker that came up a moment after another
    // (three processes starting on 2 busy cores) may take a shard whose first session was not
    // ready yet, which then IDENTIFYs once more. After this, every move RESUMEs.
    let cold: u64 = (0..DBOTS)
        .map(|k| fake.state().identifies(&dtoken(k)))
        .sum::<u64>()
        + fake.state().identifies(BIG);
    let shards = DBOTS as u64 * u64::from(SHARDS) + 16;
    println!("cold start: {cold} IDENTIFYs for {shards} shards");
    assert!(
        (shards..=shards + 8).contains(&cold),
        "{cold} IDENTIFYs at the cold start of {shards} shards"
    );
    // The big bot's slices are spread: not all on one worker.
    let mut slice_owners = std::collections::HashSet::new();
    for k in 0..4 {
        if let Ok(Some(o)) = coord.owner(&BotId::new("disc-big").unwrap().slice(k)).await {
            slice_owners.insert(o.worker.to_string());
        }
    }
    assert!(
        slice_owners.len() > 1,
        "every slice on one worker: {slice_owners:?}"
    );

    // Users write on every shard (channel c is on shard c % 4).
    let stop = Arc::new(AtomicBool::new(false));
    let expected: Arc<Mutex<Chats>> = Arc::default();
    let writer = {
        let (state, stop, expected) = (fake.state().clone(), stop.clone(), expected.clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                for k in 0..DBOTS {
                    let c = n % 8;
                    let t = format!("{k}:{n}");
                    state.user_writes(&format!("DISCORD.fleet.{k}"), c, &t);
                    expected
                        .lock()
                        .unwrap()
                        .entry((format!("DISCORD.fleet.{k}"), c.to_string()))
                        .or_default()
                        .push(t);
                }
                let c = n % 16;
                let t = format!("big:{n}");
                state.user_writes(BIG, c, &t);
                expected
                    .lock()
                    .unwrap()
                    .entry((BIG.to_owned(), c.to_string()))
                    .or_default()
                    .push(t);
                n += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let held = |coord: &RedisCoordinator, w: &'static str| {
        let coord = coord.clone();
        async move {
            let mut out = Vec::new();
            for k in 0..DBOTS {
                let bot = BotId::new(format!("disc-{k}")).unwrap();
                if let Ok(Some(o)) = coord.owner(&bot).await {
                    if o.worker.as_str() == w && o.live {
                        out.push(k);
                    }
                }
            }
            out
        }
    };
    // Every shard of `victims` RESUMEd at least `after` more times than before, all connected.
    let resumed = |victims: Vec<usize>, before: Vec<u64>| {
        let fake = &fake;
        let dtoken = &dtoken;
        let logs = &dir.0;
        async move {
            // What the fake saw of each moved bot, and the workers' logs, if the wait fails.
            let context = || {
                let mut out = String::new();
                for (k, b) in victims.iter().zip(&before) {
                    let t = dtoken(*k);
                    let (now, up) = (fake.state().resumes(&t), fake.state().connected_shards(&t));
                    out.push_str(&format!(
                        "disc-{k}: RESUMEs {b} before, {now} now; {up} of {SHARDS} shards up\n"
                    ));
                }
                let big = fake.state().connected_shards(BIG);
                format!(
                    "{out}the big bot: {big} of 16 shards up\n{}",
                    log_tails(logs)
                )
            };
            wait_for_or(
                "the moved bots resumed",
                Duration::from_secs(30),
                || async {
                    (victims
                        .iter()
                        .zip(&before)
                        .all(|(k, b)| fake.state().resumes(&dtoken(*k)) >= b + u64::from(SHARDS))
                        && all_up(fake))
                    .then_some(())
                },
                context,
            )
            .await;
        }
    };
    let resumes_of = |ks: &[usize]| -> Vec<u64> {
        ks.iter()
            .map(|k| fake.state().resumes(&dtoken(*k)))
            .collect()
    };
    // Every unit's sessions are checkpointed (written when they start): moves resume.
    let units: Vec<(BotId, usize)> = (0..DBOTS)
        .map(|k| (BotId::new(format!("disc-{k}")).unwrap(), SHARDS as usize))
        .chain((0..4).map(|k| (BotId::new("disc-big").unwrap().slice(k), 4)))
        .collect();
    wait_for("every unit checkpointed", limit, || async {
        for (unit, shards) in &units {
            let c = store.cursor(unit).await.ok()??;
            let cp: botfleet_discord::Checkpoint = serde_json::from_str(&c.value).ok()?;
            if cp.sessions.len() != *shards {
                return None;
            }
        }
        Some(())
    })
    .await;

    // 1. kill -9 w1.
    let victims = held(&coord, "w1").await;
    let before = resumes_of(&victims);
    let t = Instant::now();
    procs[1].child.kill().unwrap();
    let _ = procs[1].child.wait();
    resumed(victims.clone(), before).await;
    println!("kill -9: w1's {} Discord bots resumed every shard {:?} after the kill (lease {LEASE_MS} ms)", victims.len(), t.elapsed());

    // 2. w3 joins.
    procs.push(spawn_worker("w3", &db, &redis.url(), &dir.0));
    wait_for("w3 holds bots", limit, || async {
        (!held(&coord, "w3").await.is_empty() && all_up(&fake)).then_some(())
    })
    .await;

    // 3. SIGTERM w2.
    let victims = held(&coord, "w2").await;
    let before = resumes_of(&victims);
    let t = Instant::now();
    procs[2].signal("-TERM");
    resumed(victims.clone(), before).await;
    println!(
        "SIGTERM: w2's {} Discord bots resumed every shard {:?} after the signal",
        victims.len(),
        t.elapsed()
    );

    // 4. SIGSTOP w0 past its lease, then SIGCONT.
    let victims = held(&coord, "w0").await;
    let before = resumes_of(&victims);
    let t = Instant::now();
    procs[0].freeze_between_writes(&path);
    resumed(victims.clone(), before).await;
    println!(
        "SIGSTOP: w0's {} Discord bots resumed every shard {:?} after the freeze",
        victims.len(),
        t.elapsed()
    );
    procs[0].signal("-CONT");
    wait_for("w0 rejoins and takes units again", limit, || async {
        let live = coord.live_workers().await.ok()?;
        live.iter()
            .find(|w| w.id.as_str() == "w0" && w.meta.bots_held > 0)
            .and_then(|_| all_up(&fake).then_some(()))
    })
    .await;

    stop.store(true, Ordering::SeqCst);
    writer.await.unwrap();
    let want = expected.lock().unwrap().clone();
    let tokens: Vec<String> = (0..DBOTS).map(dtoken).chain([BIG.to_owned()]).collect();
    let got = wait_for("every message answered", limit, || async {
        let mut got: Chats = HashMap::new();
        for t in &tokens {
            for p in fake.state().sent_by(t) {
                got.entry((t.clone(), p.channel))
                    .or_default()
                    .push(p.content);
            }
        }
        want.iter()
            .all(|(key, v)| {
                got.get(key)
                    .is_some_and(|g| v.iter().all(|t| g.contains(t)))
            })
            .then_some(got)
    })
    .await;
    let dups = duplicates_in_order(&want, &got);
    let written: usize = want.values().map(Vec::len).sum();
    let identifies: u64 = tokens.iter().map(|t| fake.state().identifies(t)).sum();
    let resumes: u64 = tokens.iter().map(|t| fake.state().resumes(t)).sum();
    let dropped: u64 = tokens.iter().map(|t| fake.state().dropped(t)).sum();
    let sends_deduplicated: u64 = tokens.iter().map(|t| fake.state().duplicate_sends(t)).sum();
    println!(
        "Discord: {written} messages, lost 0, duplicated {dups} (Discord dropped {sends_deduplicated} repeated sends by nonce); {identifies} IDENTIFYs for {} shards, {resumes} RESUMEs",
        DBOTS as u32 * SHARDS + 16
    );
    assert_eq!(identifies, cold, "a move identified again");
    assert_eq!(dropped, 0);
    for t in &tokens {
        assert_eq!(
            fake.state().max_sessions_per_shard(t),
            1,
            "{t}: a shard ran two sessions"
        );
        assert_eq!(fake.state().identify_violations(t), 0, "{t}");
    }
}

/// The fleet behind Redis Sentinel (a primary, two replicas, three Sentinels), users writing
/// to 100 bots on two workers all along. First the primary is killed (SIGKILL) and a replica
/// promoted (the killed one started again as a replica, as after each kill); then the replicas
/// lose everything they had (empty nodes) and the new primary is killed, so an empty node is
/// promoted. The workers must follow each time (no
/// restart, no flag change) and run every bot again — after the second, through the data-loss
/// rule (renewals answered `Lost`, a grace window of one lease) — and never run a bot twice,
/// lose a message or answer one twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failovers_under_traffic_double_nothing() {
    let _one = ONE_AT_A_TIME.lock().await;
    let n = 100;
    let Setup {
        redis: _unused,
        fake,
        slack: _slack,
        dir,
        db,
        store: _store,
    } = setup(n).await;
    let mut sentinel = botfleet_testkit::SentinelSetup::start_with_replicas(2).unwrap();
    let urls = sentinel.urls();
    let flags = [
        "--lease-ms",
        &LEASE_MS.to_string(),
        "--poll-timeout-s",
        "2",
        "--redis-mode",
        "sentinel",
        "--redis-sentinel-master",
        botfleet_testkit::SENTINEL_MASTER,
        // The users write faster than Telegram lets a bot answer a chat (the fake keeps no
        // send limit): the limits are proved by the `limits` tests.
        "--rate-limits",
        "off",
    ];
    let _procs: Vec<Proc> = ["s0", "s1"]
        .iter()
        .map(|w| spawn_worker_with(w, &db, &urls, &dir.0, &flags))
        .collect();
    let traffic = polling_then_traffic(&fake, n, "all bots polling through Sentinel").await;

    for kind in ["a replica promoted", "an empty node promoted"] {
        // (Blocking calls: out of the way of the fake and the users, which go on meanwhile.)
        let old = sentinel.primary_url();
        let failover = tokio::task::block_in_place(|| {
            if kind == "an empty node promoted" {
                sentinel.empty_the_replicas().unwrap();
            }
            sentinel.kill_primary_and_fail_over().unwrap()
        });
        let promoted = sentinel.primary_url();
        assert_ne!(old, promoted);
        let t = Instant::now();
        let coord = RedisCoordinator::connect(RedisConfig::new(promoted).prefix("itest"))
            .await
            .unwrap();
        // The workers renew on the promoted primary and hold every bot between them. (A
        // replica has their registrations already: only a renewal since the promotion shows
        // that a worker followed.)
        wait_for_or(
            &format!("{kind}: both workers renewing there, holding every bot"),
            Duration::from_secs(60),
            || async {
                let live = coord.live_workers().await.ok()?;
                let held: u32 = live.iter().map(|w| w.meta.bots_held).sum();
                let since = t.elapsed();
                let followed = live
                    .iter()
                    .all(|w| Duration::from_millis(w.heartbeat_age_ms) < since);
                (live.len() == 2 && followed && held as usize == n).then_some(())
            },
            || log_tails(&dir.0),
        )
        .await;
        let followed = t.elapsed();
        let since = Instant::now();
        n_polling(
            &fake,
            n,
            &format!("{kind}: every bot polling again"),
            since,
            Duration::from_secs(30),
        )
        .await;
        println!(
            "Sentinel, {kind}: promoted {failover:?} after the kill; both workers renewing there with every bot {followed:?} later (lease {LEASE_MS} ms); second pollers (409) so far {}",
            fake.state().conflicts()
        );
        assert_eq!(
            fake.state().conflicts(),
            0,
            "{kind}: two pollers on one token"
        );
    }
    finish_doubling_nothing(traffic, &fake, "Sentinel failovers: messages").await;
}

/// How long after the last renewal a worker may still be seen polling: the fence at 2/3 of
/// the lease, and 300 ms for the poll's close to reach the server on a loaded machine.
const FENCE_SLACK: Duration = Duration::from_millis(300);

/// The cut-off worker's last renewal that reached Redis, as an upper bound on this process's
/// clock: read (right after the link was cut, so no later renewal can land) as the renewal's
/// age by Redis's clock, subtracted from the moment the read was answered. Also answers the
/// lower bound, from the moment of the cut: the earliest instant anyone else may claim its
/// bots is that lower bound plus the lease.
async fn last_renewal(
    coord: &RedisCoordinator,
    worker: &str,
    cut_at: Instant,
) -> (Instant, Instant) {
    let live = coord.live_workers().await.unwrap();
    let read_at = Instant::now();
    let age = live
        .iter()
        .find(|w| w.id.as_str() == worker)
        .map(|w| Duration::from_millis(w.heartbeat_age_ms))
        .unwrap_or_else(|| panic!("{worker} is live when its link is cut"));
    (cut_at - age, read_at - age)
}

/// Checks that every poll of `tokens` the old holder could have made (started before anyone
/// else may claim: `claimable`) ended by `bound`; answers the latest such end.
fn polls_end_by(
    fake: &FakeTelegram,
    tokens: &[String],
    claimable: Instant,
    bound: Instant,
    what: &str,
) -> Instant {
    let mut latest = None::<Instant>;
    for tok in tokens {
        for span in fake.state().poll_spans(tok) {
            if span.started >= claimable {
                continue;
            }
            let ended = span
                .ended
                .unwrap_or_else(|| panic!("{what}: a poll of {tok} still in flight"));
            assert!(
                ended <= bound,
                "{what}: a poll of {tok} ended {:?} past the fence bound",
                ended - bound
            );
            latest = Some(latest.map_or(ended, |l| l.max(ended)));
        }
    }
    latest.unwrap_or(bound)
}

/// A worker whose Redis link hangs (blackholed through a TCP proxy: nothing answers, nothing
/// is refused) or turns slow must stop its bots by 2/3 of its lease after its last renewal,
/// whatever its control loop is awaiting: the fence is kept by each bot's task. 200 Telegram
/// bots and 40 Slack socket bots on three workers, users writing all along; one worker's link
/// is blackholed for 9.5 s, then (after it is back) slowed by 1.5 s each way for 9.5 s. The
/// fake Bot API must never see two pollers on one token, the fake Slack never one app's
/// sockets on two workers; every poll the cut-off worker had in flight ends within 2/3 of the
/// lease (+ 0.3 s) of its last renewal; every message is answered, once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_redis_link_hangs_stops_polling_before_its_lease_ends() {
    const TG: usize = 200;
    const SL: usize = 40;
    let _one = ONE_AT_A_TIME.lock().await;
    let Setup {
        redis,
        fake,
        slack: fake_slack,
        dir,
        db,
        store,
    } = setup_mixed(TG, SL).await;
    // And Discord bots of two shards each.
    const DBOTS: usize = 6;
    let dtoken = |k: usize| format!("DISCORD.cut.{k}");
    let discord = botfleet_testkit::FakeDiscord::start().await.unwrap();
    for k in 0..DBOTS {
        add_discord(&store, &discord, &format!("disc-{k}"), &dtoken(k), 2).await;
    }
    let shards_up = || (0..DBOTS).all(|k| discord.state().connected_shards(&dtoken(k)) == 2);
    let coord = coordinator(&redis).await;
    let link = LinkProxy::start(([127, 0, 0, 1], redis.port()).into())
        .await
        .unwrap();
    // Polls of 30 s: the fence must end them, they do not end by themselves in time.
    let flags = [
        "--lease-ms",
        &LEASE_MS.to_string(),
        "--poll-timeout-s",
        "30",
    ];
    let _procs = [
        spawn_worker_with("w0", &db, &redis.url(), &dir.0, &flags),
        spawn_worker_with("w1", &db, &redis.url(), &dir.0, &flags),
        spawn_worker_with("cut", &db, &link.redis_url(), &dir.0, &flags),
    ];
    let limit = Duration::from_secs(30);
    let t = Instant::now();
    n_polling(
        &fake,
        TG,
        "200 Telegram bots polling on 3 workers",
        t,
        limit,
    )
    .await;
    wait_for("40 Slack bots connected", limit, || async {
        (fake_slack.state().connected_since(t) == SL).then_some(())
    })
    .await;
    wait_for("every Discord shard connected", limit, || async {
        shards_up().then_some(())
    })
    .await;
    let traffic = Traffic::start_mixed(&fake, TG, Some(&fake_slack), SL);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let lease = Duration::from_millis(LEASE_MS);
    let fence = lease * 2 / 3;
    // Each fault lands at a random moment of the renewal cycle (a renewal every lease/3).
    let jitter = || {
        let r = u64::from_str_radix(&nonce()[..8], 16).unwrap();
        Duration::from_millis(r % (LEASE_MS / 3))
    };

    // 1. The link goes dark for 9.5 s.
    let victims = Victims {
        telegram: held_among(&coord, "cut", TG).await,
        slack: held_by(&coord, "cut").await.slack,
    };
    let at = jitter();
    tokio::time::sleep(at).await;
    link.set(LinkMode::Blackhole);
    let cut_at = Instant::now();
    let (earliest, latest) = last_renewal(&coord, "cut", cut_at).await;
    let back = moved_served(
        &fake,
        &fake_slack,
        "the cut-off worker's bots on the others",
        &victims,
        cut_at,
        limit,
    )
    .await;
    let last_poll = polls_end_by(
        &fake,
        &victims.telegram,
        earliest + lease,
        latest + fence + FENCE_SLACK,
        "partition",
    );
    println!(
        "partition (at +{at:?}): the cut-off worker's {} Telegram and {} Slack bots on the others {back:?} after the cut; its last poll ended {:?} after its last renewal (fence at {fence:?})",
        victims.telegram.len(),
        victims.slack.len(),
        last_poll.saturating_duration_since(latest),
    );
    tokio::time::sleep_until((cut_at + Duration::from_millis(9_500)).into()).await;
    link.set(LinkMode::Pass);
    let healed = Instant::now();
    holding(&coord, &dir.0, "cut", 20, limit).await;
    n_polling(
        &fake,
        TG,
        "every bot polling after the link healed",
        healed,
        limit,
    )
    .await;

    // 2. The link turns slow: 1.5 s each way, for 9.5 s.
    let victims = held_among(&coord, "cut", TG).await;
    assert!(!victims.is_empty(), "the worker holds bots again");
    let at = jitter();
    tokio::time::sleep(at).await;
    link.set(LinkMode::Delay(Duration::from_millis(1_500)));
    let slow_at = Instant::now();
    let (earliest, latest) = last_renewal(&coord, "cut", slow_at).await;
    tokio::time::sleep_until((slow_at + Duration::from_millis(9_500)).into()).await;
    let last_poll = polls_end_by(
        &fake,
        &victims,
        earliest + lease,
        latest + fence + FENCE_SLACK,
        "slow link",
    );
    println!(
        "slow link (at +{at:?}): the worker's last poll ended {:?} after its last renewal (fence at {fence:?})",
        last_poll.saturating_duration_since(latest)
    );
    link.set(LinkMode::Pass);
    let healed = Instant::now();
    wait_for_or(
        "every bot polling after the slow link healed",
        limit,
        || async { (fake.state().polled_since(healed) == TG).then_some(()) },
        || {
            let missing: Vec<usize> = (0..TG)
                .filter(|i| fake.state().polled_since_among(&[token(*i)], healed) == 0)
                .collect();
            format!("not polled: {missing:?}\n{}", log_tails(&dir.0))
        },
    )
    .await;

    let (total, dups) = traffic.finish_mixed(&fake, Some(&fake_slack)).await;
    println!(
        "messages: {total} written, lost 0, duplicated {dups}; second pollers (409) {}; Slack apps on two workers {}",
        fake.state().conflicts(),
        fake_slack.state().overlaps()
    );
    assert_eq!(fake.state().conflicts(), 0, "two pollers on one token");
    assert_eq!(
        fake_slack.state().overlaps(),
        0,
        "one Slack app on two workers"
    );
    assert_eq!(dups, 0, "answered twice");
    for k in 0..DBOTS {
        assert_eq!(
            discord.state().max_sessions_per_shard(&dtoken(k)),
            1,
            "a Discord shard ran two sessions"
        );
    }
}
