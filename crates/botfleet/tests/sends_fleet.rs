//! Sends from the backend on a fleet of `botfleet worker` processes (a private Redis, one
//! SQLite registry, Telegram bots polling the fake Bot API): each send is POSTed to a worker
//! that does not run its bot. One worker accepts sends and is frozen right after its 202s;
//! more sends come for its own bots through the other worker (their nudges reach the frozen
//! one); then it is killed with SIGKILL. Every send goes out once, in the order accepted per
//! chat (the frozen worker's bots' only after the survivor claimed them); a repeat of each key
//! through the survivor answers the same id and sends nothing again; every status ends `sent`
//! with the platform's message id. In a binary of its own, so it adds no load to the other
//! drills.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use botfleet_coord::{Coordinator, RedisConfig, RedisCoordinator};
use botfleet_core::{BotId, BotSpec, Platform};
use botfleet_store::{SqliteStore, Store};
use botfleet_testkit::{
    fleet_worker, log_tails, wait_for, wait_for_or, FakeTelegram, Proc, RedisServer, TempDir,
};
use serde_json::{json, Value};

const LEASE_MS: u64 = 3_000;
const BOTS: usize = 6;
/// The chat every send goes to.
const CHAT: &str = "100";

fn token(i: usize) -> String {
    format!("{}:sends-{i}", 8300 + i)
}

/// POSTs send `text` to `CHAT` of bot `i` through the API at `url` under `key`: its id.
async fn post(http: &reqwest::Client, url: &str, i: usize, key: &str, text: &str) -> String {
    let r = http
        .post(format!("{url}/api/v1/bots/sends-{i}/messages"))
        .header("idempotency-key", key)
        .json(&json!({"chat": CHAT, "text": text}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let v: Value = r.json().await.unwrap();
    assert_eq!(status, 202, "{v}");
    v["id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_go_out_once_in_order_through_any_worker_and_a_kill() {
    let redis = RedisServer::start().unwrap();
    let fake = FakeTelegram::start().await.unwrap();
    let dir = TempDir::new("botfleet-sends");
    let path = dir.0.join("bots.db");
    let db = format!("sqlite://{}", path.display());
    let store = SqliteStore::open(&path).await.unwrap();
    for i in 0..BOTS {
        fake.state().add_bot(&token(i));
        let mut spec = BotSpec::new(
            BotId::new(format!("sends-{i}")).unwrap(),
            Platform::Telegram,
            token(i),
        );
        spec.options.api_url = Some(fake.url());
        store.add_bot(&spec).await.unwrap();
    }
    let coord = RedisCoordinator::connect(RedisConfig::new(redis.url()).prefix("sends"))
        .await
        .unwrap();
    let spawn = |name: &str| {
        Proc::spawn(
            name,
            fleet_worker(
                env!("CARGO_BIN_EXE_botfleet"),
                name,
                &db,
                &redis.url(),
                "sends",
            )
            .args(["--lease-ms", &LEASE_MS.to_string(), "--poll-timeout-s", "2"]),
            &dir.0,
        )
    };
    let mut procs = [Some(spawn("s0")), Some(spawn("s1"))];
    let mut urls = Vec::new();
    for p in procs.iter().flatten() {
        urls.push(p.api_url().await);
    }
    let tg = fake.state();
    // Every bot polling, each on one worker (both hold some: the test needs both ways).
    let owners: Vec<usize> = wait_for_or(
        "every bot polling and placed on both workers",
        Duration::from_secs(30),
        || async {
            let mut owners = Vec::new();
            for i in 0..BOTS {
                let o = coord
                    .owner(&BotId::new(format!("sends-{i}")).unwrap())
                    .await
                    .ok()??;
                if !o.live || !tg.is_polling(&token(i)) {
                    return None;
                }
                owners.push(usize::from(o.worker.as_str() == "s1"));
            }
            (owners.contains(&0) && owners.contains(&1)).then_some(owners)
        },
        || log_tails(&dir.0),
    )
    .await;
    let http = reqwest::Client::new();
    // Two sends per bot, each through the worker that does not run it: s1's bots' through
    // s0, which then freezes; s0's bots' through s1, whose nudges reach a frozen s0; then s0
    // is killed. s1 sends the first from its nudges, the others once it has claimed s0's bots.
    let mut ids = Vec::new();
    for round in [1, 0] {
        if round == 0 {
            procs[0].as_ref().unwrap().freeze_between_writes(&path);
        }
        for i in (0..BOTS).filter(|i| owners[*i] == round) {
            let via = &urls[1 - round];
            for n in 1..=2 {
                let key = format!("ticket-{i}-{n}");
                let id = post(&http, via, i, &key, &format!("d{i}-{n}")).await;
                ids.push((i, key, id));
            }
        }
    }
    let s0 = procs[0].as_mut().unwrap();
    s0.child.kill().unwrap();
    let _ = s0.child.wait();
    let killed = std::time::Instant::now();
    // Every key again, through the survivor: the same id.
    for (i, key, id) in &ids {
        let again = post(
            &http,
            &urls[1],
            *i,
            key,
            &format!("d{i}-{}", &key[key.len() - 1..]),
        )
        .await;
        assert_eq!(&again, id, "a repeat of {key} made another send");
    }
    let texts = || -> Vec<(String, String)> {
        tg.sent()
            .into_iter()
            .filter(|s| s.chat_id == CHAT)
            .map(|s| (s.token, s.text))
            .collect()
    };
    wait_for_or(
        "every send out",
        Duration::from_secs(30),
        || async { (texts().len() >= 2 * BOTS).then_some(()) },
        || format!("{:?}\n{}", texts(), log_tails(&dir.0)),
    )
    .await;
    for (i, owner) in owners.iter().enumerate() {
        let got: Vec<String> = texts()
            .into_iter()
            .filter(|(t, _)| *t == token(i))
            .map(|(_, x)| x)
            .collect();
        assert_eq!(
            got,
            [format!("d{i}-1"), format!("d{i}-2")],
            "bot {i}, owned by s{owner}"
        );
    }
    // s0's bots' sends went out after s0 died: their owner was frozen when they came.
    for s in tg.sent().iter().filter(|s| s.chat_id == CHAT) {
        let i: usize = s.token.rsplit('-').next().unwrap().parse().unwrap();
        if owners[i] == 0 {
            assert!(s.at > killed, "{} went out before s0 died", s.text);
        }
    }
    // Each says it was sent, and with which message.
    for (i, key, id) in &ids {
        let v: Value = wait_for("sent", Duration::from_secs(20), || async {
            let v: Value = http
                .get(format!("{}/api/v1/bots/sends-{i}/messages/{id}", urls[1]))
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            (v["status"] == "sent").then_some(v)
        })
        .await;
        let pid = v["platform_ids"][0].as_str().unwrap().to_owned();
        let text = format!("d{i}-{}", &key[key.len() - 1..]);
        assert!(
            tg.sent()
                .iter()
                .any(|s| s.text == text && s.message_id.to_string() == pid),
            "{key}: {v}"
        );
    }
    assert_eq!(texts().len(), 2 * BOTS, "nothing sent twice");
}
