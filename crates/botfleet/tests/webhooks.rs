//! Webhook bots of all three platforms on a fleet of `botfleet worker` processes behind a
//! round-robin proxy (the load balancer), one Redis, one SQLite registry. Users write at a
//! human pace in many chats while one worker is killed with SIGKILL, another stopped with
//! SIGTERM, a new one joins, and one is frozen (SIGSTOP) past its lease and thawed. Every message must be answered, in order per chat, with the
//! conversation state carried from worker to worker; forged requests are refused and never
//! handled.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{
    collections::HashMap,
    path::Path,
    time::{Duration, Instant},
};

use botfleet_core::{BotId, BotSpec, HandlerSpec, Platform, Secret};
use botfleet_store::{SqliteStore, Store};
use botfleet_testkit::{
    fleet_worker, wait_for, FakeGraph, FakeSlack, FakeTelegram, Proc, RedisServer, RoundRobinProxy,
    StateHandler, TempDir,
};

const LEASE_MS: u64 = 3_000;
const TG_SECRET: &str = "tg-secret_1";
const SIGNING: &str = "slack-signing-1";
const APP_SECRET: &str = "wa-app-secret";

/// The worker's hooks address, from its first lines.
async fn hooks_url(w: &Proc) -> String {
    let log = w.log.clone();
    wait_for(
        "the worker's hooks address",
        Duration::from_secs(20),
        || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let url = text
                .lines()
                .find_map(|l| l.split(" hooks on ").nth(1).map(|u| u.trim().to_owned()));
            async move { url }
        },
    )
    .await
}

fn spawn_worker(name: &str, db: &str, redis: &str, public: &str, dir: &Path) -> Proc {
    Proc::spawn(
        name,
        fleet_worker(env!("CARGO_BIN_EXE_botfleet"), name, db, redis, "hooks")
            .args(["--lease-ms", &LEASE_MS.to_string(), "--public-url", public])
            .env(
                "RUST_LOG",
                std::env::var("HOOKS_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            ),
        dir,
    )
}

fn with_handler(mut spec: BotSpec, url: &str) -> BotSpec {
    spec.handler = HandlerSpec::Webhook {
        url: url.to_owned(),
        secret: None,
    };
    spec
}

/// Replies per chat, in the order the platform received them.
type Replies = HashMap<String, Vec<String>>;

fn replies(tg: &FakeTelegram, wa: &FakeGraph, sl: &FakeSlack) -> Replies {
    let mut out: Replies = HashMap::new();
    for s in tg.state().sent() {
        out.entry(format!("tg/{}/{}", s.token, s.chat_id))
            .or_default()
            .push(s.text);
    }
    for s in wa.state().sent() {
        out.entry(format!("wa/{}/{}", s.phone_number_id, s.to))
            .or_default()
            .push(s.text);
    }
    for p in sl.state().sent() {
        out.entry(format!("sl/{}/{}", p.token, p.channel))
            .or_default()
            .push(p.text);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_bots_survive_kill_and_sigterm_behind_a_load_balancer() {
    let redis = RedisServer::start().unwrap();
    let tg = FakeTelegram::start().await.unwrap();
    let wa = FakeGraph::start().await.unwrap();
    let sl = FakeSlack::start().await.unwrap();
    let handler = StateHandler::start(Duration::from_millis(20)).await;
    // A frozen worker does not answer: the balancer gives up on it after a second and tries
    // the next (the platform would retry otherwise).
    let proxy = RoundRobinProxy::start_with_timeout(Vec::new(), Duration::from_secs(1)).await;
    let dir = TempDir::new("botfleet-hooks-fleet");
    let db_path = dir.0.join("bots.db");
    let db = format!("sqlite://{}", db_path.display());
    let store = SqliteStore::open(&db_path).await.unwrap();

    // Three bots per platform.
    let tg_tokens: Vec<String> = (0..3).map(|i| format!("{}:hook-{i}", 7000 + i)).collect();
    for (i, t) in tg_tokens.iter().enumerate() {
        tg.state().add_bot(t);
        let mut s = BotSpec::new(
            BotId::new(format!("tg-{i}")).unwrap(),
            Platform::Telegram,
            t.as_str(),
        );
        s.options.api_url = Some(tg.url());
        s.options.mode = Some("webhook".into());
        s.hook.secret = Some(Secret::new(TG_SECRET));
        store
            .add_bot(&with_handler(s, &handler.url()))
            .await
            .unwrap();
    }
    let numbers: Vec<String> = (0..3).map(|i| format!("10000{i}")).collect();
    for (i, n) in numbers.iter().enumerate() {
        let access = format!("EAAG-{i}");
        wa.state().add_number(n, &access, APP_SECRET);
        let mut s = BotSpec::new(
            BotId::new(format!("wa-{i}")).unwrap(),
            Platform::Whatsapp,
            access,
        );
        s.options.api_url = Some(wa.url());
        s.options.phone_number_id = Some(n.clone());
        s.hook.secret = Some(Secret::new(APP_SECRET));
        s.hook.verify_token = Some(Secret::new("verify"));
        store
            .add_bot(&with_handler(s, &handler.url()))
            .await
            .unwrap();
    }
    let sl_tokens: Vec<String> = (0..3).map(|i| format!("xoxb-hook-{i}")).collect();
    for (i, t) in sl_tokens.iter().enumerate() {
        sl.state().add_app(t, &format!("xapp-hook-{i}"));
        let mut s = BotSpec::new(
            BotId::new(format!("sl-{i}")).unwrap(),
            Platform::Slack,
            t.as_str(),
        );
        s.options.api_url = Some(sl.url());
        s.options.mode = Some("events".into());
        s.hook.secret = Some(Secret::new(SIGNING));
        store
            .add_bot(&with_handler(s, &handler.url()))
            .await
            .unwrap();
    }

    let public = proxy.url();
    let mut workers: Vec<Proc> = ["w1", "w2", "w3"]
        .iter()
        .map(|n| spawn_worker(n, &db, &redis.url(), &public, &dir.0))
        .collect();
    let mut backends = Vec::new();
    for w in &workers {
        backends.push(hooks_url(w).await);
    }
    proxy.set_backends(backends.clone());
    for (i, n) in numbers.iter().enumerate() {
        wa.state()
            .subscribe(n, &format!("{public}/hooks/whatsapp/wa-{i}"));
    }
    for (i, t) in sl_tokens.iter().enumerate() {
        sl.state()
            .subscribe_events(t, &format!("{public}/hooks/slack/sl-{i}"), SIGNING);
    }
    wait_for(
        "every Telegram webhook registered",
        Duration::from_secs(20),
        || {
            let all = tg_tokens.iter().enumerate().all(|(i, t)| {
                tg.state().webhook(t).as_deref()
                    == Some(format!("{public}/hooks/telegram/tg-{i}").as_str())
            });
            async move { all.then_some(()) }
        },
    )
    .await;

    // Users write at a human pace: every chat a message every ~300 ms, 32 rounds; a worker
    // is killed with SIGKILL at round 6, another stopped with SIGTERM at round 12 while a new
    // one joins, a third frozen with SIGSTOP from round 16 to 28 (about 4 s, past its lease).
    const ROUNDS: usize = 32;
    const CHATS: usize = 2;
    let http = reqwest::Client::new();
    let mut forged = 0;
    let mut killed_at = None;
    for round in 0..ROUNDS {
        for c in 0..CHATS {
            let text = format!("m{round}");
            for t in &tg_tokens {
                tg.state().user_writes(t, 900 + c as i64, &text);
            }
            for n in &numbers {
                wa.state().user_writes(n, &format!("4917{c}"), &text);
            }
            for t in &sl_tokens {
                sl.state().user_writes(t, &format!("C{c}"), None, &text);
            }
        }
        if round == 6 {
            workers[0].signal("-KILL");
            killed_at = Some(Instant::now());
        }
        if round == 12 {
            workers[1].signal("-TERM");
            let w4 = spawn_worker("w4", &db, &redis.url(), &public, &dir.0);
            backends.push(hooks_url(&w4).await);
            proxy.set_backends(backends.clone());
            workers.push(w4);
        }
        if round == 16 {
            // Frozen past its lease (3 s) while holding turns and tickets, then thawed.
            workers[2].freeze_between_writes(&db_path);
        }
        if round == 28 {
            workers[2].signal("-CONT");
        }
        if round % 4 == 1 {
            // Forged deliveries on every platform: refused, never handled.
            let bodies = [
                ("telegram/tg-0", serde_json::json!({"update_id": 1, "message": {"message_id": 1, "chat": {"id": 1}, "text": "forged"}}).to_string(), vec![("x-telegram-bot-api-secret-token", "guess".to_owned())]),
                ("whatsapp/wa-0", r#"{"entry":[{"changes":[{"field":"messages","value":{"messages":[{"from":"1","id":"wamid.f","type":"text","text":{"body":"forged"}}]}}]}]}"#.to_owned(), vec![("x-hub-signature-256", "sha256=00".to_owned())]),
                ("slack/sl-0", r#"{"type":"event_callback","event":{"type":"message","channel":"C9","user":"U1","text":"forged","ts":"1.1"}}"#.to_owned(), vec![("x-slack-request-timestamp", (botfleet_core::unix_ms() / 1000).to_string()), ("x-slack-signature", "v0=00".to_owned())]),
            ];
            for (path, body, headers) in bodies {
                let mut r = http.post(format!("{public}/hooks/{path}")).body(body);
                for (k, v) in headers {
                    r = r.header(k, v);
                }
                let status = r.send().await.unwrap().status();
                assert!(status == 401 || status == 502, "{path}: {status}");
                forged += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let per_chat = 3 * CHATS * 3; // platforms x chats x bots
    let total = per_chat * ROUNDS;
    let all_in = Instant::now();
    wait_for("every message answered", Duration::from_secs(90), || {
        let r = replies(&tg, &wa, &sl);
        let distinct: usize = r
            .values()
            .map(|v| {
                let mut v = v.clone();
                v.dedup();
                v.len()
            })
            .sum();
        async move { (distinct >= total).then_some(()) }
    })
    .await;
    eprintln!(
        "all {total} answered {:.2} s after the last write ({:.2} s after the kill)",
        all_in.elapsed().as_secs_f64(),
        killed_at.unwrap().elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = replies(&tg, &wa, &sl);
    assert_eq!(r.len(), per_chat, "every chat answered: {:?}", r.keys());
    let mut duplicates = 0;
    for (chat, texts) in &r {
        assert!(
            !texts.iter().any(|t| t.contains("forged")),
            "{chat}: a forged message was handled"
        );
        let mut seen = texts.clone();
        seen.dedup();
        duplicates += texts.len() - seen.len();
        let want: Vec<String> = (0..ROUNDS).map(|i| format!("{}:m{i}", i + 1)).collect();
        assert_eq!(
            seen,
            want,
            "{chat}: every message once, in order, the count carried across workers\n{}",
            workers
                .iter()
                .map(|w| format!(
                    "--- {}\n{}",
                    w.name,
                    w.log_about(chat.rsplit('/').next().unwrap_or(""))
                ))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    eprintln!(
        "{total} messages in {per_chat} chats: 0 lost, {duplicates} duplicated, {forged} forged requests refused; served per worker {:?}",
        proxy.served()
    );
    assert!(duplicates <= 3, "{duplicates} duplicates (goal 0)");
    assert_eq!(
        handler.max_concurrency_per_chat(),
        1,
        "one turn at a time per chat"
    );
    assert!(
        proxy.served().len() >= 3,
        "deliveries spread over the workers"
    );
}
