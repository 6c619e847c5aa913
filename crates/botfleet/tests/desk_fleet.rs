//! A chat handed to a person, on a fleet of two `botfleet worker` processes (a private
//! Redis, one SQLite registry, a Telegram bot polling the fake Bot API, a webhook handler):
//! the chat is paused through the worker that does not run the bot; the messages written
//! right after the pause, and one that waited behind a slow turn of the chat, reach no
//! handler and are counted paused; other chats go on; a send from the desk goes out; after a
//! resume the next message is answered, and a resume with a replay hands what came during
//! the pause to the handler in order; a timed pause ends by itself. Bad requests get clear
//! errors. In a binary of its own, so it adds no load to the other drills.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use botfleet_coord::{Coordinator, RedisConfig, RedisCoordinator};
use botfleet_core::{BotId, BotSpec, HandlerSpec, Platform};
use botfleet_store::{SqliteStore, Store};
use botfleet_testkit::{
    fleet_worker, log_tails, wait_for_or, FakeTelegram, Proc, RedisServer, ScriptedHandler, TempDir,
};
use serde_json::{json, Value};

const TOKEN: &str = "8500:desk";
const BOT: &str = "desk-0";
/// A bot answering with the built-in echo (its turns of a message just received read
/// nothing first), and its chat that is paused.
const ECHO_TOKEN: &str = "8501:desk-echo";
const ECHO: &str = "desk-echo";
const ECHO_CHAT: i64 = 300;
/// The chat handed to a person, and one that never is.
const DESK: i64 = 100;
const FREE: i64 = 200;

/// POSTs `body` to `path` of the API at `url`: (status, answer).
async fn call(http: &reqwest::Client, url: &str, path: &str, body: &str) -> (u16, Value) {
    let r = http
        .post(format!("{url}/api/v1{path}"))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Runs `botfleet ARGS`: (exit code, standard output, standard error).
async fn cli(args: Vec<String>) -> (i32, String, String) {
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_botfleet"))
            .args(&args)
            .env_remove("BOTFLEET_API_URL")
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

/// `botfleet chats ARGS --api-url URL`, which must succeed: its standard output.
async fn chats(url: &str, args: &[&str]) -> String {
    let mut all: Vec<String> = vec!["chats".into()];
    all.extend(args.iter().map(|a| (*a).to_owned()));
    all.extend(["--api-url".to_owned(), url.to_owned()]);
    let (code, out, err) = cli(all).await;
    assert_eq!(code, 0, "botfleet chats {args:?}: {out}{err}");
    out
}

/// Waits until both workers counted at least `n` events paused (`what` they are).
async fn paused_at_least(
    http: &reqwest::Client,
    urls: &[String],
    n: u64,
    what: &str,
    logs: impl FnOnce() -> String,
) {
    wait_for_or(
        what,
        Duration::from_secs(20),
        || async { (paused_count(http, urls).await >= n).then_some(()) },
        logs,
    )
    .await;
}

/// Events counted paused by both workers.
async fn paused_count(http: &reqwest::Client, urls: &[String]) -> u64 {
    let mut n = 0;
    for u in urls {
        let Ok(r) = http.get(format!("{u}/metrics")).send().await else {
            continue;
        };
        let text = r.text().await.unwrap_or_default();
        n += text
            .lines()
            .filter(|l| l.starts_with("botfleet_events_paused_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum::<u64>();
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_chat_reaches_no_handler_on_any_worker_until_resumed() {
    let redis = RedisServer::start().unwrap();
    let fake = FakeTelegram::start().await.unwrap();
    let handler = ScriptedHandler::start(|ev: &Value| {
        let text = ev["text"].as_str().unwrap_or_default();
        if text == "buttons" {
            return json!({"actions": [{"type": "send", "text": "pick",
                                        "buttons": [[{"text": "A", "value": "a"}]]}]});
        }
        if text.starts_with("slow") {
            return json!({"text": format!("re: {text}"), "_delay_ms": 15_000});
        }
        json!({ "text": format!("re: {text}") })
    })
    .await;
    let dir = TempDir::new("botfleet-desk");
    let path = dir.0.join("bots.db");
    let db = format!("sqlite://{}", path.display());
    let store = SqliteStore::open(&path).await.unwrap();
    fake.state().add_bot(TOKEN);
    let mut spec = BotSpec::new(BotId::new(BOT).unwrap(), Platform::Telegram, TOKEN);
    spec.options.api_url = Some(fake.url());
    spec.handler = HandlerSpec::Webhook {
        url: handler.url(),
        secret: None,
    };
    store.add_bot(&spec).await.unwrap();
    fake.state().add_bot(ECHO_TOKEN);
    let mut echo = BotSpec::new(BotId::new(ECHO).unwrap(), Platform::Telegram, ECHO_TOKEN);
    echo.options.api_url = Some(fake.url());
    store.add_bot(&echo).await.unwrap();
    let coord = RedisCoordinator::connect(RedisConfig::new(redis.url()).prefix("desk"))
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
                "desk",
            )
            .args(["--lease-ms", "3000", "--poll-timeout-s", "2"]),
            &dir.0,
        )
    };
    let procs = [spawn("d0"), spawn("d1")];
    let mut urls = Vec::new();
    for p in &procs {
        urls.push(p.api_url().await);
    }
    let tg = fake.state();
    let logs = || log_tails(&dir.0);
    let owner: usize = wait_for_or(
        "the bots polling",
        Duration::from_secs(30),
        || async {
            let o = coord.owner(&BotId::new(BOT).unwrap()).await.ok()??;
            let e = coord.owner(&BotId::new(ECHO).unwrap()).await.ok()??;
            (o.live && e.live && tg.is_polling(TOKEN) && tg.is_polling(ECHO_TOKEN))
                .then(|| usize::from(o.worker.as_str() == "d1"))
        },
        logs,
    )
    .await;
    let (own, other) = (urls[owner].clone(), urls[1 - owner].clone());
    let http = reqwest::Client::new();
    let pause = format!("/bots/{BOT}/chats/{DESK}/pause");
    let resume = format!("/bots/{BOT}/chats/{DESK}/resume");

    // Bad requests: a clear error each, nothing paused.
    for (path, body, status, code) in [
        ("/bots/nobody/chats/100/pause", "", 404, "not_found"),
        (
            &format!("/bots/{BOT}/chats/abc/pause")[..],
            "",
            422,
            "invalid_chat",
        ),
        (&pause[..], r#"{"until_ms": 1}"#, 422, "invalid"),
        (&pause[..], "{", 400, "invalid"),
        (&pause[..], r#"{"until": 5}"#, 400, "invalid"),
        (&resume[..], r#"{"replay": "yes"}"#, 400, "invalid"),
    ] {
        let (got, v) = call(&http, &other, path, body).await;
        assert_eq!(
            (got, v["code"].as_str()),
            (status, Some(code)),
            "{path} {body}: {v}"
        );
    }
    let long = json!({ "reason": "x".repeat(501) }).to_string();
    assert_eq!(call(&http, &other, &pause, &long).await.0, 400);

    let sent_to = |chat: i64| -> Vec<String> {
        tg.sent()
            .into_iter()
            .filter(|s| s.chat_id == chat.to_string())
            .map(|s| s.text)
            .collect()
    };
    let asked = || -> Vec<String> {
        handler
            .seen()
            .iter()
            .filter_map(|e| e["text"].as_str().map(str::to_owned))
            .collect()
    };
    let dir_path = dir.0.clone();
    let sent_or = |what: &'static str, chat: i64, text: &'static str| {
        let (sent_to, asked, dir_path) = (&sent_to, &asked, &dir_path);
        async move {
            wait_for_or(
                what,
                Duration::from_secs(30),
                || async { sent_to(chat).iter().any(|t| t == text).then_some(()) },
                || {
                    format!(
                        "sent {:?}, asked {:?}\n{}",
                        sent_to(chat),
                        asked(),
                        log_tails(dir_path)
                    )
                },
            )
            .await;
        }
    };

    // A message with a button, pressed later while the chat is paused.
    tg.user_writes(TOKEN, DESK, "buttons");
    sent_or("the buttons", DESK, "pick").await;
    let pick = tg
        .sent()
        .iter()
        .find(|s| s.text == "pick")
        .unwrap()
        .message_id;

    // A slow turn of the chat, and a message waiting behind it (journaled: the bot polled on
    // after it).
    tg.user_writes(TOKEN, DESK, "slow 1");
    wait_for_or(
        "the slow turn asked",
        Duration::from_secs(20),
        || async { asked().iter().any(|t| t == "slow 1").then_some(()) },
        logs,
    )
    .await;
    let polls = tg.polls(TOKEN);
    tg.user_writes(TOKEN, DESK, "q1");
    wait_for_or(
        "q1 journaled",
        Duration::from_secs(20),
        || async { (tg.pending_updates(TOKEN) == 0 && tg.polls(TOKEN) >= polls + 2).then_some(()) },
        logs,
    )
    .await;
    // Paused through the worker that does not run the bot, and written to at once.
    let (status, v) = call(&http, &other, &pause, r#"{"reason": "a person answers"}"#).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (&v["paused"], &v["until_ms"], &v["reason"]),
        (&json!(true), &Value::Null, &json!("a person answers")),
        "{v}"
    );
    tg.user_writes(TOKEN, DESK, "p1");
    tg.user_writes(TOKEN, FREE, "free 1");
    // A press in the paused chat: not the handler's, but its spinner is stopped.
    let (_, query) = tg.user_presses(TOKEN, DESK, pick, "a").unwrap();
    sent_or("the other chat answered", FREE, "re: free 1").await;
    sent_or("the slow turn answered", DESK, "re: slow 1").await;
    paused_at_least(
        &http,
        &urls,
        3,
        "q1, p1 and the press recorded paused",
        logs,
    )
    .await;
    wait_for_or(
        "the press in the paused chat acknowledged",
        Duration::from_secs(20),
        || async { tg.press(&query)?.answer.map(|_| ()) },
        logs,
    )
    .await;
    // A person answers from the desk.
    let r = http
        .post(format!("{other}/api/v1/bots/{BOT}/messages"))
        .header("idempotency-key", "desk-1")
        .json(&json!({"chat": DESK.to_string(), "text": "a person here"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    sent_or("the desk's send", DESK, "a person here").await;

    // Resumed (through the bot's own worker): the next message is answered, and only it.
    let (status, v) = call(&http, &own, &resume, "").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (&v["paused"], &v["was_paused"], &v["replayed"]),
        (&json!(false), &json!(true), &json!(0)),
        "{v}"
    );
    tg.user_writes(TOKEN, DESK, "after 1");
    sent_or("the next message answered", DESK, "re: after 1").await;

    // Paused again; resumed with a replay: what came meanwhile is answered, in order.
    assert_eq!(call(&http, &own, &pause, "").await.0, 200);
    tg.user_writes(TOKEN, DESK, "p2");
    tg.user_writes(TOKEN, DESK, "p3");
    paused_at_least(&http, &urls, 5, "p2 and p3 recorded paused", logs).await;
    let out = chats(&other, &["resume", BOT, "100", "--replay"]).await;
    assert_eq!(
        out.trim(),
        format!("resumed {BOT} 100: 2 message(s) replayed")
    );
    sent_or("the replay answered", DESK, "re: p3").await;
    tg.user_writes(TOKEN, DESK, "after 2");
    sent_or("the next message answered", DESK, "re: after 2").await;

    // A timed pause (through the CLI) ends by itself; while it lasts it is listed, and
    // counted on the bot.
    let before = botfleet_core::unix_ms();
    let out = chats(
        &other,
        &["pause", BOT, "100", "--for-s", "2", "--reason", "lunch"],
    )
    .await;
    assert!(
        out.starts_with(&format!("paused {BOT} 100 until 20")),
        "{out}"
    );
    let listed = chats(&own, &["list", BOT, "--json"]).await;
    let listed: Vec<Value> = listed
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        (&listed[0]["chat"], &listed[0]["reason"]),
        (&json!("100"), &json!("lunch"))
    );
    let until = listed[0]["until_ms"].as_i64().unwrap();
    assert!(
        (before + 2_000..=botfleet_core::unix_ms() + 2_000).contains(&until),
        "{until}"
    );
    let table = chats(&own, &["list", BOT]).await;
    assert!(
        table
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("100 ") && l.ends_with("lunch")),
        "{table}"
    );
    let (code, out, err) = cli(vec![
        "bots".into(),
        "list".into(),
        "--json".into(),
        "--api-url".into(),
        own.clone(),
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    let row: Value = out
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|r| r["id"] == BOT)
        .unwrap();
    assert_eq!(row["paused_chats"], 1, "{row}");
    let (status, v) = call(&http, &other, &format!("/bots/{BOT}/chats"), "").await;
    assert_eq!(status, 405, "{v}");
    let r = http
        .get(format!("{other}/api/v1/bots/{BOT}/chats"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    tg.user_writes(TOKEN, DESK, "t1");
    paused_at_least(&http, &urls, 6, "t1 recorded paused", logs).await;
    wait_for_or(
        "the pause's end",
        Duration::from_secs(10),
        || async { (botfleet_core::unix_ms() > until).then_some(()) },
        logs,
    )
    .await;
    tg.user_writes(TOKEN, DESK, "t2");
    sent_or("a message after the pause's end answered", DESK, "re: t2").await;

    assert_eq!(
        sent_to(DESK),
        [
            "pick",
            "re: slow 1",
            "a person here",
            "re: after 1",
            "re: p2",
            "re: p3",
            "re: after 2",
            "re: t2"
        ],
        "{:?}",
        asked()
    );
    let desk_asked: Vec<String> = asked().into_iter().filter(|t| t != "free 1").collect();
    assert_eq!(
        desk_asked,
        ["buttons", "slow 1", "after 1", "p2", "p3", "after 2", "t2"],
        "the handler was asked about a paused message"
    );
    assert_eq!(sent_to(FREE), ["re: free 1"]);
    assert!(
        handler.seen().iter().all(|e| e["kind"] != "action"),
        "the handler was asked about a press in the paused chat"
    );

    // The echo bot's paused chat: nothing echoed until it is resumed.
    let out = chats(&other, &["pause", ECHO, "300"]).await;
    assert_eq!(out.trim(), format!("paused {ECHO} 300 until resumed"));
    let (code, _, err) = cli(vec![
        "chats".into(),
        "pause".into(),
        ECHO.into(),
        "300".into(),
        "--for-s".into(),
        "0".into(),
    ])
    .await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--for-s"), "{err}");
    tg.user_writes(ECHO_TOKEN, ECHO_CHAT, "e1");
    paused_at_least(&http, &urls, 7, "e1 recorded paused", logs).await;
    let out = chats(&own, &["resume", ECHO, "300"]).await;
    assert_eq!(
        out.trim(),
        format!("resumed {ECHO} 300: 0 message(s) replayed")
    );
    let out = chats(&own, &["resume", ECHO, "300"]).await;
    assert_eq!(out.trim(), format!("{ECHO} 300 was not paused"));
    tg.user_writes(ECHO_TOKEN, ECHO_CHAT, "e2");
    sent_or("the echo after the resume", ECHO_CHAT, "e2").await;
    assert_eq!(sent_to(ECHO_CHAT), ["e2"]);
}
