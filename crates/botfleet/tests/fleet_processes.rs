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
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use botfleet_coord::{Coordinator, RedisConfig, RedisCoordinator};
use botfleet_core::{BotId, BotSpec, Platform};
use botfleet_store::{SqliteStore, Store};
use botfleet_testkit::{nonce, wait_for, FakeTelegram, RedisServer};

const BOTS: usize = 300;

/// Per (token, chat): the texts, in order.
type Chats = HashMap<(String, String), Vec<String>>;
const LEASE_MS: u64 = 3_000;

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {}", self.name);
    }
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<_> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // SIGCONT first in case the test stopped it, then SIGKILL by pid.
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What every test here starts from: a private Redis, the fake Bot API, and a SQLite registry
/// (in a temp directory, removed on drop) with `bots` echo bots on the fake.
struct Setup {
    redis: RedisServer,
    fake: FakeTelegram,
    dir: Dir,
    db: String,
    store: SqliteStore,
}

async fn setup(bots: usize) -> Setup {
    let redis = RedisServer::start().unwrap();
    let fake = FakeTelegram::start().await.unwrap();
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
    Setup {
        redis,
        fake,
        dir,
        db,
        store,
    }
}

/// Runs `botfleet ARGS…` against this fleet's registry and Redis; fails the test on a non-zero
/// exit, with its stderr.
fn fleet_cli(db: &str, redis: &RedisServer, args: &[&str]) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_botfleet"))
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

fn spawn_worker(name: &str, db: &str, redis: &str, dir: &Path) -> Proc {
    let log = dir.join(format!("{name}.log"));
    let child = Command::new(env!("CARGO_BIN_EXE_botfleet"))
        .args(["worker", "--worker-id", name, "--http-addr", "127.0.0.1:0"])
        .args([
            "--database-url",
            db,
            "--redis-url",
            redis,
            "--prefix",
            "itest",
        ])
        .args(["--lease-ms", &LEASE_MS.to_string(), "--poll-timeout-s", "2"])
        .args(["--connect-rate", "2000"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    Proc {
        name: name.into(),
        child,
        log,
    }
}

/// The tokens of the bots `worker` holds now.
async fn held_by(coord: &RedisCoordinator, worker: &str) -> Vec<String> {
    let mut out = Vec::new();
    for i in 0..BOTS {
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
async fn all_polling(fake: &FakeTelegram, what: &str, since: Instant, limit: Duration) -> Duration {
    wait_for(what, limit, || async {
        (fake.state().polled_since(since) == BOTS).then_some(())
    })
    .await;
    since.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_survive_kill_join_term_and_stop() {
    let Setup {
        redis,
        fake,
        dir,
        db,
        store: _store,
    } = setup(BOTS).await;
    let coord = RedisCoordinator::connect(RedisConfig::new(redis.url()).prefix("itest"))
        .await
        .unwrap();
    let mut procs: Vec<Proc> = (0..3)
        .map(|i| spawn_worker(&format!("w{i}"), &db, &redis.url(), &dir.0))
        .collect();
    let startup = all_polling(
        &fake,
        "300 bots polling on 3 workers",
        Instant::now(),
        Duration::from_secs(30),
    )
    .await;
    println!("start: all {BOTS} bots polling after {startup:?}");

    // Users write all along: message n of each chat says "n".
    let stop_writing = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let expected: Arc<Mutex<Chats>> = Arc::default();
    let writer = {
        let (state, stop, written, expected) = (
            fake.state().clone(),
            stop_writing.clone(),
            written.clone(),
            expected.clone(),
        );
        tokio::spawn(async move {
            let mut x: u64 = 0x1234_5678;
            let mut next: HashMap<(usize, i64), u64> = HashMap::new();
            while !stop.load(Ordering::SeqCst) {
                for _ in 0..5 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let bot = (x % BOTS as u64) as usize;
                    let chat = ((x >> 40) % 2) as i64 + 1;
                    let n = next.entry((bot, chat)).or_default();
                    state.user_writes(&token(bot), chat, &n.to_string());
                    expected
                        .lock()
                        .unwrap()
                        .entry((token(bot), chat.to_string()))
                        .or_default()
                        .push(n.to_string());
                    *n += 1;
                    written.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let budget = Duration::from_millis(LEASE_MS + 1_000);
    // Upper bounds of the waits, not the budgets asserted below.
    let slack = Duration::from_secs(30);

    // 1. kill -9 w1.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let victims = held_by(&coord, "w1").await;
    let killed_at = Instant::now();
    procs[1].child.kill().unwrap();
    let _ = procs[1].child.wait();
    let after_kill = moved_polling(
        &fake,
        "w1's bots back after kill -9",
        &victims,
        killed_at,
        slack,
    )
    .await;
    all_polling(&fake, "every bot served after kill -9", killed_at, slack).await;
    println!("kill -9: all bots polling again {after_kill:?} after the kill (lease {LEASE_MS} ms)");

    // 2. w3 joins and takes its share.
    let joined_at = Instant::now();
    procs.push(spawn_worker("w3", &db, &redis.url(), &dir.0));
    wait_for("w3 holds bots", slack, || async {
        let live = coord.live_workers().await.ok()?;
        live.iter()
            .find(|w| w.id.as_str() == "w3" && w.meta.bots_held > 50)
            .map(|_| ())
    })
    .await;
    all_polling(&fake, "bots polling after the join", joined_at, slack).await;
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
    let exited_at = Instant::now();
    let after_term = moved_polling(
        &fake,
        "w2's bots back after SIGTERM",
        &victims,
        term_at,
        slack,
    )
    .await;
    // And served by the others: polled again after w2 was gone.
    all_polling(&fake, "bots served after w2 exited", exited_at, slack).await;
    println!("SIGTERM: w2 exited 0; all bots polling again {after_term:?} after the signal");

    // 4. SIGSTOP w0 past its lease, then SIGCONT.
    let victims = held_by(&coord, "w0").await;
    let stopped_at = Instant::now();
    procs[0].signal("-STOP");
    wait_for("w0's liveness ends", slack, || async {
        let live = coord.live_workers().await.ok()?;
        (!live.iter().any(|w| w.id.as_str() == "w0")).then_some(())
    })
    .await;
    let t_stop = moved_polling(
        &fake,
        "w0's bots back after SIGSTOP",
        &victims,
        stopped_at,
        slack,
    )
    .await;
    println!("SIGSTOP: all bots polling on the others {t_stop:?} after the freeze");
    procs[0].signal("-CONT");
    let thawed = Instant::now();
    wait_for("w0 rejoins and takes bots again", slack, || async {
        let live = coord.live_workers().await.ok()?;
        live.iter()
            .find(|w| w.id.as_str() == "w0" && w.meta.bots_held > 0)
            .map(|_| ())
    })
    .await;
    all_polling(&fake, "bots polling after w0 rejoined", thawed, slack).await;

    // Stop writing; every message must be answered.
    stop_writing.store(true, Ordering::SeqCst);
    writer.await.unwrap();
    let total = written.load(Ordering::SeqCst) as usize;
    let answered = wait_for(
        "every message answered",
        Duration::from_secs(30),
        || async {
            let sent = fake.state().sent();
            let mut got: Chats = HashMap::new();
            for s in sent {
                got.entry((s.token, s.chat_id)).or_default().push(s.text);
            }
            let want = expected.lock().unwrap().clone();
            want.iter()
                .all(|(k, v)| got.get(k).is_some_and(|g| v.iter().all(|t| g.contains(t))))
                .then_some(got)
        },
    )
    .await;
    let want = expected.lock().unwrap().clone();
    let mut dups = 0;
    for (chat, texts) in &want {
        let got = &answered[chat];
        dups += got.len() - texts.len();
        // In order: the first answer to each message follows the order of the messages.
        let mut firsts: Vec<&String> = Vec::new();
        for t in got {
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
    println!(
        "messages: {total} written, {} answers, lost 0, duplicated {dups}, second pollers (409) {}",
        total + dups,
        fake.state().conflicts()
    );
    assert_eq!(fake.state().conflicts(), 0, "two pollers on one token");
    for (what, d) in [("kill -9", after_kill), ("SIGTERM", after_term)] {
        assert!(d <= budget, "{what}: {d:?} > lease + 1 s");
    }
    // A frozen worker's bots wait for its lease: they are back within lease + 1 s of the
    // moment its liveness could have ended (its last renewal before the freeze).
    assert!(
        t_stop <= budget + Duration::from_millis(LEASE_MS / 3),
        "SIGSTOP: {t_stop:?}"
    );

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
    let Setup {
        redis,
        fake,
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
    let coord = RedisCoordinator::connect(RedisConfig::new(redis.url()).prefix("itest"))
        .await
        .unwrap();
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

/// Redis restarts empty under two running workers: they notice their liveness is gone, stop
/// their bots, register again and re-claim with fences above the old ones; every bot polls
/// again, never twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_recover_when_redis_restarts_empty() {
    let n = 60;
    let Setup {
        mut redis,
        fake,
        dir,
        db,
        store,
    } = setup(n).await;
    let _a = spawn_worker("a", &db, &redis.url(), &dir.0);
    let _b = spawn_worker("b", &db, &redis.url(), &dir.0);
    let polling = |want: usize| {
        let state = fake.state().clone();
        move || {
            let state = state.clone();
            async move { (state.polling_tokens() == want).then_some(()) }
        }
    };
    wait_for("all polling", Duration::from_secs(30), polling(n)).await;
    let before = store
        .highest_fence(&BotId::new("bot-0").unwrap())
        .await
        .unwrap();
    let t = Instant::now();
    redis.restart().unwrap();
    wait_for(
        "bots polling after the restart",
        Duration::from_secs(30),
        || async {
            // Every bot re-claimed under a fence above the one before the restart.
            let f = store
                .highest_fence(&BotId::new("bot-0").unwrap())
                .await
                .ok()?;
            (f > before && fake.state().polling_tokens() == n).then_some(())
        },
    )
    .await;
    println!(
        "Redis restarted empty: all bots polling again under new fences {:?} later",
        t.elapsed()
    );
    let coord = RedisCoordinator::connect(RedisConfig::new(redis.url()).prefix("itest"))
        .await
        .unwrap();
    assert_eq!(coord.live_workers().await.unwrap().len(), 2);
    fake.state().user_writes(&token(0), 1, "still there?");
    wait_for("answered", Duration::from_secs(10), || async {
        fake.state()
            .sent()
            .iter()
            .any(|s| s.text == "still there?")
            .then_some(())
    })
    .await;
    assert_eq!(fake.state().conflicts(), 0);
}
