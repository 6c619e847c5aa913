//! WhatsApp device-link bots on a fleet of `botfleet worker` processes (one Redis, one SQLite
//! registry), against the stand-in at the client's transport boundary. Bots are added and
//! linked with the CLI (`bots link` shows the QR code; the stand-in scans it as the phone).
//! One worker is killed with SIGKILL, another stopped with SIGTERM: every bot comes back on a
//! survivor, and no device ever has two connections at once.

#![cfg(feature = "whatsapp-web")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use botfleet_core::{BotId, BotStatus};
use botfleet_store::{SqliteStore, Store};
use botfleet_testkit::{fleet_worker, wait_for, Proc, RedisServer, TempDir};
use botfleet_whatsapp_standin::StandIn;
use tokio::io::{AsyncBufReadExt, BufReader};

const LEASE_MS: u64 = 3_000;
const VERSION: &str = "2.3000.1";

fn cli(db: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_botfleet"))
        .args(args)
        .args(["--database-url", db])
        .env("BOTFLEET_WHATSAPP_WEB_VERSION", VERSION)
        .env_remove("BOTFLEET_API_TOKEN")
        .env_remove("BOTFLEET_TOKEN")
        .output()
        .unwrap()
}

/// `bots add ID --platform whatsapp --mode web` against the stand-in at `url`.
fn add(db: &str, id: &str, url: &str) {
    let out = cli(
        db,
        &[
            "bots",
            "add",
            id,
            "--platform",
            "whatsapp",
            "--mode",
            "web",
            "--api-url",
            url,
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn spawn_worker(name: &str, db: &str, redis: &str, dir: &Path) -> Proc {
    Proc::spawn(
        name,
        fleet_worker(env!("CARGO_BIN_EXE_botfleet"), name, db, redis, "waweb")
            .args(["--lease-ms", &LEASE_MS.to_string()])
            .args(["--whatsapp-web-version", VERSION])
            .env(
                "RUST_LOG",
                std::env::var("WAWEB_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            ),
        dir,
    )
}

/// A `bots link ID` under way, past its first QR code.
struct Linking {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    qr: String,
}

/// Starts `bots link ID` and reads until it shows a QR code (drawn, and as `QR data:`).
async fn start_link(db: &str, id: &str) -> Linking {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_botfleet"))
        .args(["bots", "link", id, "--database-url", db, "--timeout", "60"])
        .env("BOTFLEET_WHATSAPP_WEB_VERSION", VERSION)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut printed = String::new();
    let qr = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(l) = lines.next_line().await.unwrap() {
            printed.push_str(&l);
            printed.push('\n');
            if let Some(q) = l.strip_prefix("QR data: ") {
                return q.to_owned();
            }
        }
        panic!("no QR data printed: {printed}");
    })
    .await
    .expect("a QR code in time");
    assert!(
        printed.contains("Linked devices"),
        "tells where to scan: {printed}"
    );
    assert!(
        printed.lines().count() > 10,
        "draws the QR code in the terminal: {printed}"
    );
    Linking { child, lines, qr }
}

impl Linking {
    /// Waits for the command to end: whether it succeeded, and what it printed since the QR
    /// code (stdout, then stderr).
    async fn finish(mut self) -> (bool, String) {
        let mut rest = String::new();
        while let Some(l) = self.lines.next_line().await.unwrap() {
            rest.push_str(&l);
            rest.push('\n');
        }
        let out = tokio::time::timeout(Duration::from_secs(60), self.child.wait_with_output())
            .await
            .expect("link ends")
            .unwrap();
        rest.push_str(&String::from_utf8_lossy(&out.stderr));
        (out.status.success(), rest)
    }
}

/// Runs `bots link ID`, scanning the QR code it prints as the phone `user` would.
async fn link(db: &str, standin: &StandIn, id: &str, user: &str) {
    let linking = start_link(db, id).await;
    standin.scan(&linking.qr, user).await.unwrap();
    let (ok, rest) = linking.finish().await;
    assert!(ok, "bots link {id}: {rest}");
    assert!(rest.contains(&format!("linked {id} as {user}")), "{rest}");
}

fn contact(i: usize) -> String {
    format!("1555777000{i}")
}

/// Asserts that the replies `got` answer `m0`..`m{rounds-1}`, each first answered in order;
/// answers how many were answered more than once.
fn in_order(got: &[String], rounds: usize, bot: &str) -> usize {
    let mut first: Vec<&String> = Vec::new();
    for t in got {
        if !first.contains(&t) {
            first.push(t);
        }
    }
    let want: Vec<String> = (0..rounds).map(|r| format!("m{r}")).collect();
    assert_eq!(
        first.into_iter().cloned().collect::<Vec<_>>(),
        want,
        "{bot}: every message answered, in order"
    );
    got.len() - rounds
}

async fn owner(store: &SqliteStore, id: &str) -> Option<String> {
    let r = store
        .get_bot(&BotId::new(id).unwrap())
        .await
        .ok()
        .flatten()?;
    (r.status == BotStatus::Running).then_some(r.reported_by?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linked_sessions_move_across_kill_and_sigterm_without_two_connections() {
    let redis = RedisServer::start().unwrap();
    let standin = std::sync::Arc::new(StandIn::start().await.unwrap());
    let dir = TempDir::new("botfleet-waweb-fleet");
    let db_path = dir.0.join("bots.db");
    let db = format!("sqlite://{}", db_path.display());
    let url = standin.url();

    let bots: Vec<(String, String)> = (0..4)
        .map(|i| (format!("wa-{i}"), format!("1555010000{i}")))
        .collect();
    for (id, _) in &bots {
        add(&db, id, &url);
    }
    let list = cli(&db, &["bots", "list"]);
    let text = String::from_utf8_lossy(&list.stdout);
    assert_eq!(
        text.lines().filter(|l| l.contains("unlinked")).count(),
        4,
        "shown as unlinked: {text}"
    );

    // Nobody scans: a clear message, and a failure exit.
    let out = cli(&db, &["bots", "link", "wa-0", "--timeout", "2"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no phone confirmed the link within 2 s"),
        "{err}"
    );
    // WhatsApp out of reach: said so, not blamed on the phone.
    add(&db, "wa-dead", "ws://127.0.0.1:1/ws/chat");
    let out = cli(&db, &["bots", "link", "wa-dead", "--timeout", "2"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("WhatsApp did not answer within 2 s"), "{err}");
    let out = cli(&db, &["bots", "remove", "wa-dead"]);
    assert!(out.status.success());
    // Bad input is refused before anything starts.
    let out = cli(&db, &["bots", "link", "wa-0", "--phone", "+1 555"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("digits only"));

    for (id, user) in &bots {
        link(&db, &standin, id, user).await;
    }
    let list = cli(&db, &["bots", "list", "--json"]);
    let text = String::from_utf8_lossy(&list.stdout);
    assert_eq!(
        text.lines()
            .filter(|l| l.contains("\"linked\":true"))
            .count(),
        4,
        "{text}"
    );
    // Linked already: refused without --force.
    let out = cli(&db, &["bots", "link", "wa-0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("linked already"));
    // Replacing the session of a bot a worker may be running is refused: disabled first.
    let out = cli(&db, &["bots", "link", "wa-0", "--force"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is enabled") && err.contains("botfleet bots disable wa-0"),
        "{err}"
    );

    let store = SqliteStore::open(&db_path).await.unwrap();
    let mut workers: Vec<Proc> = ["w1", "w2", "w3"]
        .iter()
        .map(|n| spawn_worker(n, &db, &redis.url(), &dir.0))
        .collect();
    let all_up = |exclude: Vec<String>| {
        let standin = &standin;
        let store = &store;
        let bots = &bots;
        async move {
            for (id, user) in bots {
                if standin.connected(user) != 1 {
                    return None;
                }
                let o = owner(store, id).await?;
                if exclude.contains(&o) {
                    return None;
                }
            }
            Some(())
        }
    };
    wait_for("every bot connected", Duration::from_secs(60), || {
        all_up(Vec::new())
    })
    .await;

    // Contacts write to every bot at a human pace through the kill and the SIGTERM.
    let writing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sent = std::sync::Arc::new(std::sync::Mutex::new(0usize));
    let writer = {
        let (standin, bots, writing, sent) =
            (standin.clone(), bots.clone(), writing.clone(), sent.clone());
        tokio::spawn(async move {
            let mut round = 0;
            while writing.load(std::sync::atomic::Ordering::Relaxed) {
                for (i, (_, user)) in bots.iter().enumerate() {
                    standin
                        .send_text(&contact(i), user, &format!("m{round}"))
                        .await
                        .unwrap();
                }
                round += 1;
                *sent.lock().unwrap() = round;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };

    // SIGKILL the busiest worker: its bots come back on the others within a lease or so.
    let mut count = std::collections::HashMap::<String, usize>::new();
    for (id, _) in &bots {
        if let Some(o) = owner(&store, id).await {
            *count.entry(o).or_default() += 1;
        }
    }
    let victim = count.iter().max_by_key(|(_, n)| **n).unwrap().0.clone();
    let mut moved = Vec::new();
    for (id, user) in &bots {
        if owner(&store, id).await.as_deref() == Some(victim.as_str()) {
            moved.push(user.clone());
        }
    }
    assert!(!moved.is_empty());
    let i = workers.iter().position(|w| w.name == victim).unwrap();
    let mut killed = workers.remove(i);
    killed.signal("-KILL");
    let _ = killed.child.wait();
    wait_for(
        "every bot back after the kill",
        Duration::from_secs(60),
        || all_up(vec![victim.clone()]),
    )
    .await;

    // SIGTERM the next busiest: a clean hand-over.
    let mut count = std::collections::HashMap::<String, usize>::new();
    for (id, _) in &bots {
        if let Some(o) = owner(&store, id).await {
            *count.entry(o).or_default() += 1;
        }
    }
    let second = count.iter().max_by_key(|(_, n)| **n).unwrap().0.clone();
    let i = workers.iter().position(|w| w.name == second).unwrap();
    let mut stopped = workers.remove(i);
    stopped.signal("-TERM");
    let status = tokio::task::spawn_blocking(move || {
        let s = stopped.child.wait();
        (s, stopped)
    })
    .await
    .unwrap();
    assert!(status.0.unwrap().success(), "{}", status.1.log_tail());
    wait_for(
        "every bot on the last worker",
        Duration::from_secs(60),
        || all_up(vec![victim.clone(), second.clone()]),
    )
    .await;

    writing.store(false, std::sync::atomic::Ordering::Relaxed);
    writer.await.unwrap();
    let rounds = *sent.lock().unwrap();
    assert!(rounds > 5, "contacts wrote through the moves");
    wait_for(
        "every message answered",
        Duration::from_secs(60),
        || async {
            bots.iter()
                .enumerate()
                .all(|(i, (_, user))| {
                    standin.unacked(user) == 0
                        && standin.replies_to(user, &contact(i)).len() >= rounds
                })
                .then_some(())
        },
    )
    .await;
    let mut duplicated = 0;
    for (i, (id, user)) in bots.iter().enumerate() {
        duplicated += in_order(&standin.replies_to(user, &contact(i)), rounds, id);
    }
    eprintln!(
        "{} messages, 0 lost, {duplicated} answered twice (a reply in flight at the kill)",
        rounds * bots.len()
    );
    assert!(duplicated <= 2, "{duplicated} answered twice");

    for (id, user) in &bots {
        assert_eq!(
            standin.max_concurrent(user),
            1,
            "{id}: never two connections of one device"
        );
    }
    for user in &moved {
        assert!(
            standin.logins(user) >= 2,
            "{user} reconnected after the kill"
        );
    }
    for w in &mut workers {
        w.signal("-TERM");
        let _ = w.child.wait();
    }
}

/// A worker frozen (SIGSTOP) past its lease while its bot is connected: the bot comes back on
/// the other worker, whose login replaces the frozen connection as WhatsApp does. Woken
/// (SIGCONT), the old worker learns it lost the bot and lets the session go: it does not
/// report the replaced stream (the bot is not failed), does not dial again (no second
/// takeover), and every message written through it is answered once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_worker_woken_after_its_successor_took_the_session_does_not_fight() {
    let redis = RedisServer::start().unwrap();
    let standin = std::sync::Arc::new(StandIn::start().await.unwrap());
    standin.take_over();
    let dir = TempDir::new("botfleet-waweb-freeze");
    let db_path = dir.0.join("bots.db");
    let db = format!("sqlite://{}", db_path.display());
    let (id, user) = ("wa-z", "15550300001");
    add(&db, id, &standin.url());
    link(&db, &standin, id, user).await;

    let store = SqliteStore::open(&db_path).await.unwrap();
    let mut workers: Vec<Proc> = ["f1", "f2"]
        .iter()
        .map(|n| spawn_worker(n, &db, &redis.url(), &dir.0))
        .collect();
    let first = wait_for("the bot connected", Duration::from_secs(60), || async {
        let o = owner(&store, id).await?;
        (standin.connected(user) == 1).then_some(o)
    })
    .await;
    let frozen = workers.iter().position(|w| w.name == first).unwrap();
    let logins = standin.logins(user);

    // Contacts keep writing through the freeze and the wake-up.
    let writing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sent = std::sync::Arc::new(std::sync::Mutex::new(0usize));
    let writer = {
        let (standin, writing, sent) = (standin.clone(), writing.clone(), sent.clone());
        tokio::spawn(async move {
            let mut round = 0;
            while writing.load(std::sync::atomic::Ordering::Relaxed) {
                standin
                    .send_text(&contact(0), user, &format!("m{round}"))
                    .await
                    .unwrap();
                round += 1;
                *sent.lock().unwrap() = round;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };

    workers[frozen].freeze_between_writes(&db_path);
    let second = wait_for(
        "the bot taken over by the other worker",
        Duration::from_secs(60),
        || async {
            let o = owner(&store, id).await?;
            (o != first && standin.takeovers(user) == 1 && standin.connected(user) == 1)
                .then_some(o)
        },
    )
    .await;
    assert!(standin.logins(user) > logins);

    workers[frozen].signal("-CONT");
    wait_for(
        "the woken worker learns it lost its lease",
        Duration::from_secs(30),
        || async { (!workers[frozen].log_about("liveness lost").is_empty()).then_some(()) },
    )
    .await;
    // A few more rounds after the wake-up, answered by whoever runs the bot now.
    let woke_at = *sent.lock().unwrap();
    wait_for(
        "rounds after the wake-up",
        Duration::from_secs(30),
        || async { (*sent.lock().unwrap() >= woke_at + 5).then_some(()) },
    )
    .await;
    writing.store(false, std::sync::atomic::Ordering::Relaxed);
    writer.await.unwrap();
    let rounds = *sent.lock().unwrap();
    wait_for(
        "every message answered",
        Duration::from_secs(60),
        || async {
            (standin.unacked(user) == 0 && standin.replies_to(user, &contact(0)).len() >= rounds)
                .then_some(())
        },
    )
    .await;
    let twice = in_order(&standin.replies_to(user, &contact(0)), rounds, id);
    assert!(
        twice <= 1,
        "{twice} answered twice (at most a reply in flight at the freeze)"
    );
    // The woken worker never fought for the session, nor reported it replaced.
    assert_eq!(standin.takeovers(user), 1, "no second takeover");
    assert_eq!(standin.connected(user), 1);
    let r = store
        .get_bot(&BotId::new(id).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.status, BotStatus::Running, "{:?}", r.last_error);
    assert!(r.last_error.is_none(), "{:?}", r.last_error);
    assert!(
        workers[frozen].log_about("stream replaced").is_empty(),
        "the woken worker reported nothing about the session: {}",
        workers[frozen].log_tail()
    );
    eprintln!("{rounds} messages through a freeze of {first}; taken over by {second}");
    if std::env::var_os("WAWEB_TEST_LOG").is_some() {
        eprintln!("{first}'s log:\n{}", workers[frozen].log_tail());
    }
    for w in &mut workers {
        w.signal("-TERM");
        let _ = w.child.wait();
    }
}

/// Two `bots link` of one bot at once (an operator's script run twice): the later one owns
/// the session. The earlier one, scanned first, says it is void instead of storing a second
/// device over the first; the later one links.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_link_of_a_bot_voids_the_first() {
    let standin = StandIn::start().await.unwrap();
    let dir = TempDir::new("botfleet-waweb-links");
    let db = format!("sqlite://{}", dir.0.join("bots.db").display());
    let (id, user) = ("wa-twice", "15550400001");
    add(&db, id, &standin.url());
    let first = start_link(&db, id).await;
    let second = start_link(&db, id).await;
    // Whether the phone's side completes depends on how far the client gets before its
    // refused write: either way the command must say the link is void.
    let _ = standin.scan(&first.qr, user).await;
    let (ok, said) = first.finish().await;
    assert!(!ok, "{said}");
    assert!(
        said.contains("another link of this bot began meanwhile"),
        "{said}"
    );
    standin.scan(&second.qr, user).await.unwrap();
    let (ok, said) = second.finish().await;
    assert!(ok, "{said}");
    assert!(said.contains(&format!("linked {id} as {user}")), "{said}");
    let list = cli(&db, &["bots", "list", "--json"]);
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(text.contains("\"linked\":true"), "{text}");
}
