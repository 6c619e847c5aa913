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

/// An item of a chat's log as a stream gave it: (`id`, `event`, `data`).
type Streamed = (u64, String, Value);

/// Reads the server-sent events of `GET url` (resuming after `last_id`) into `into` until the
/// stream ends or the task is aborted.
async fn read_stream(
    http: reqwest::Client,
    url: String,
    last_id: Option<u64>,
    into: std::sync::Arc<std::sync::Mutex<Vec<Streamed>>>,
) {
    let mut r = http.get(url).header("accept", "text/event-stream");
    if let Some(id) = last_id {
        r = r.header("last-event-id", id.to_string());
    }
    let mut resp = r.send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let mut buf = String::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(i) = buf.find("\n\n") {
            let block: String = buf.drain(..i + 2).collect();
            let (mut id, mut event, mut data) = (None, String::new(), None);
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = v.trim().parse::<u64>().ok();
                } else if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data = Some(serde_json::from_str::<Value>(v.trim()).unwrap());
                }
            }
            if let (Some(id), Some(data)) = (id, data) {
                into.lock().unwrap().push((id, event, data));
            }
        }
    }
}

/// A chat's whole log through `GET /api/v1/bots/{id}/chats/{chat}/events` at `url`, read
/// `limit` at a time.
async fn chat_log(
    http: &reqwest::Client,
    url: &str,
    bot: &str,
    chat: i64,
    limit: usize,
) -> Vec<Value> {
    let mut all = Vec::new();
    let mut after = 0;
    loop {
        let r = http
            .get(format!(
                "{url}/api/v1/bots/{bot}/chats/{chat}/events?after={after}&limit={limit}"
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let v: Value = r.json().await.unwrap();
        let items = v["events"].as_array().unwrap().clone();
        if items.is_empty() {
            assert_eq!(v["cursor"], after, "{v}");
            return all;
        }
        assert_eq!(v["cursor"], items.last().unwrap()["cursor"], "{v}");
        after = v["cursor"].as_u64().unwrap();
        all.extend(items);
    }
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
    // A desk follows the chat from here, through the worker that does not run the bot.
    let paused_at = chat_log(&http, &other, BOT, DESK, 2).await;
    let c0 = paused_at.last().unwrap()["cursor"].as_u64().unwrap();
    let streamed = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Streamed>::new()));
    let follower = tokio::spawn(read_stream(
        http.clone(),
        format!("{other}/api/v1/bots/{BOT}/chats/{DESK}/events?limit=3"),
        Some(c0),
        streamed.clone(),
    ));
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

    // The chat's log, as a desk reads it from either worker: what the users wrote, in order
    // and as it stands (paused, answered), the desk's send, and what the bot said.
    let log = chat_log(&http, &other, BOT, DESK, 4).await;
    assert_eq!(log, chat_log(&http, &own, BOT, DESK, 1000).await);
    let cursors: Vec<u64> = log.iter().map(|i| i["cursor"].as_u64().unwrap()).collect();
    assert!(cursors.windows(2).all(|w| w[0] < w[1]), "{cursors:?}");
    let of = |kind: &str| -> Vec<(String, String)> {
        log.iter()
            .filter(|i| i["type"] == kind)
            .map(|i| {
                let d = &i["data"];
                let what = d["text"]
                    .as_str()
                    .filter(|t| !t.is_empty())
                    .or(d["action"]["value"].as_str())
                    .unwrap_or_default();
                (
                    what.to_owned(),
                    i["state"].as_str().unwrap_or("-").to_owned(),
                )
            })
            .collect()
    };
    let st = |t: &str, s: &str| (t.to_owned(), s.to_owned());
    assert_eq!(
        of("received"),
        [
            st("buttons", "done"),
            st("slow 1", "done"),
            st("q1", "paused"),
            st("p1", "paused"),
            st("a", "paused"),
            st("after 1", "done"),
            st("p2", "done"),
            st("p3", "done"),
            st("after 2", "done"),
            st("t1", "paused"),
            st("t2", "done"),
        ],
        "{log:#?}"
    );
    assert_eq!(of("send"), [st("a person here", "done")]);
    let said: Vec<String> = of("said").into_iter().map(|(t, _)| t).collect();
    assert_eq!(
        said,
        sent_to(DESK)
            .into_iter()
            .filter(|t| t != "a person here")
            .collect::<Vec<_>>()
    );
    let pick_said = log.iter().find(|i| i["type"] == "said").unwrap();
    assert_eq!(
        pick_said["data"]["message_id"],
        pick.to_string(),
        "{pick_said}"
    );
    assert_eq!(pick_said["data"]["buttons"][0][0]["value"], "a");
    for i in log.iter().filter(|i| i["type"] == "said") {
        let answered = log
            .iter()
            .find(|r| r["type"] == "received" && r["entry"] == i["entry"])
            .unwrap();
        assert!(
            answered["cursor"].as_u64() < i["cursor"].as_u64(),
            "{i} before {answered}"
        );
    }
    assert!(log.iter().all(|i| i["data"].get("answer_handle").is_none()));
    // The stream that followed from the pause gave the same items, in order, as they came.
    let wanted: Vec<Streamed> = log
        .iter()
        .filter(|i| i["cursor"].as_u64().unwrap() > c0)
        .map(|i| {
            (
                i["cursor"].as_u64().unwrap(),
                i["type"].as_str().unwrap().to_owned(),
                i.clone(),
            )
        })
        .collect();
    let last = wanted.last().unwrap().0;
    wait_for_or(
        "the stream up to the log's end",
        Duration::from_secs(10),
        || async {
            streamed
                .lock()
                .unwrap()
                .last()
                .is_some_and(|s| s.0 >= last)
                .then_some(())
        },
        logs,
    )
    .await;
    follower.abort();
    let got: Vec<(u64, String, Value)> = streamed
        .lock()
        .unwrap()
        .iter()
        .map(|(id, ev, d)| {
            // Items streamed before their entry ended showed it as it was then.
            let mut d = d.clone();
            let now = log.iter().find(|i| i["cursor"] == d["cursor"]).unwrap();
            if let Some(st) = now.get("state") {
                d["state"] = st.clone();
            }
            (*id, ev.clone(), d)
        })
        .collect();
    assert_eq!(got, wanted);
    // A stream resumed with `Last-Event-ID` goes on after it.
    let resumed = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Streamed>::new()));
    let again = tokio::spawn(read_stream(
        http.clone(),
        format!("{own}/api/v1/bots/{BOT}/chats/{DESK}/events?after=0"),
        Some(wanted[wanted.len() - 2].0),
        resumed.clone(),
    ));
    wait_for_or(
        "the resumed stream",
        Duration::from_secs(10),
        || async { (!resumed.lock().unwrap().is_empty()).then_some(()) },
        logs,
    )
    .await;
    again.abort();
    assert_eq!(resumed.lock().unwrap()[0].0, last);
    // The CLI shows the same.
    let tail = chats(&other, &["tail", BOT, "100", "--no-follow", "--json"]).await;
    let tail: Vec<Value> = tail
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(tail, log);
    let tail = chats(
        &other,
        &[
            "tail",
            BOT,
            "100",
            "--no-follow",
            "--after",
            &c0.to_string(),
        ],
    )
    .await;
    let first = tail.lines().next().unwrap();
    assert!(
        first.starts_with(&format!("{:<8} ", wanted[0].0)) && first.contains(" received paused "),
        "{tail}"
    );
    assert!(
        tail.lines()
            .any(|l| l.contains(" said ") && l.ends_with("[send] re: t2")),
        "{tail}"
    );
    assert!(
        tail.lines()
            .any(|l| l.contains(" send ") && l.ends_with("a person here")),
        "{tail}"
    );
    // Bad reads: a clear error each.
    let events = format!("{other}/api/v1/bots/{BOT}/chats/{DESK}/events");
    for (url, status) in [
        (format!("{events}?limit=0"), 400),
        (format!("{events}?limit=1001"), 400),
        (format!("{events}?after=x"), 400),
        (format!("{other}/api/v1/bots/nobody/chats/100/events"), 404),
        (format!("{other}/api/v1/bots/{BOT}/chats/abc/events"), 422),
    ] {
        let r = http.get(&url).send().await.unwrap();
        assert_eq!(r.status().as_u16(), status, "{url}");
    }
    let r = http
        .get(&events)
        .header("accept", "text/event-stream")
        .header("last-event-id", "x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);

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
    // `chats tail` follows the chat: what comes shows as it comes.
    let mut tail = std::process::Command::new(env!("CARGO_BIN_EXE_botfleet"))
        .args(["chats", "tail", ECHO, "300", "--api-url", &own])
        .env_remove("BOTFLEET_API_URL")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let out = tail.stdout.take().unwrap();
    let reader = {
        let lines = lines.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(l);
            }
        })
    };
    wait_for_or(
        "tail shows e1",
        Duration::from_secs(10),
        || async {
            lines
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.ends_with(" e1"))
                .then_some(())
        },
        logs,
    )
    .await;
    tg.user_writes(ECHO_TOKEN, ECHO_CHAT, "e2");
    sent_or("the echo after the resume", ECHO_CHAT, "e2").await;
    assert_eq!(sent_to(ECHO_CHAT), ["e2"]);
    wait_for_or(
        "tail follows",
        Duration::from_secs(10),
        || async {
            lines
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.contains(" said ") && l.ends_with("[send] e2"))
                .then_some(())
        },
        || format!("{:?}", lines.lock().unwrap()),
    )
    .await;
    tail.kill().unwrap();
    tail.wait().unwrap();
    reader.join().unwrap();
    let shown = lines.lock().unwrap().clone();
    assert!(
        shown[0].contains(" received paused ") && shown[0].ends_with(" e1"),
        "{shown:?}"
    );
    assert!(
        shown
            .iter()
            .any(|l| l.contains(" received done ") && l.ends_with(" e2")),
        "{shown:?}"
    );
}
