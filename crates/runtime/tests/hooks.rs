//! Webhook bots on every worker, in one process: three workers on the in-memory hub behind a
//! round-robin proxy, the fake Bot API delivering by webhook. (The multi-process fleet with
//! Redis, kill -9 and SIGTERM is in the CLI crate's tests.)

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{sync::Arc, time::Duration};

use botfleet_coord::{Coordinator, MemoryHub};
use botfleet_core::{BotId, BotSpec, HandlerSpec, Platform, Secret};
use botfleet_runtime::metrics;
use botfleet_store::Store;
use botfleet_testkit::{
    wait_for,
    webhook_suite::{
        commands_and_edits_by_webhook, config, fleet, start, until, webhook_suite,
        HookWorker as Running, WebhookFixture,
    },
    FakeTelegram, RoundRobinProxy, StateHandler,
};

const SECRET: &str = "s3cret-token_1";

/// `bot` registered in `store` (its token added to its fake already), and workers `names` on
/// one hub behind a round-robin balancer: the balancer (kept while the test runs) and the
/// workers.
async fn behind_balancer(
    store: &Arc<dyn Store>,
    bot: BotSpec,
    names: &[&str],
) -> (RoundRobinProxy, Vec<Running>) {
    let proxy = RoundRobinProxy::start(Vec::new()).await;
    store.add_bot(&bot).await.unwrap();
    let workers = fleet(names, &MemoryHub::new(), store, &proxy.url()).await;
    proxy.set_backends(workers.iter().map(|w| w.hooks_url.clone()).collect());
    (proxy, workers)
}

async fn store() -> (botfleet_testkit::TempDir, Arc<dyn Store>) {
    botfleet_testkit::temp_sqlite("botfleet-hooks").await
}

/// An echo webhook bot `id` on a fresh fake Bot API and store, and workers `names` on one hub
/// (no balancer: tests post to a worker's hooks address themselves).
async fn echo_webhook_bot(
    id: &str,
    token: &str,
    names: &[&str],
) -> (
    botfleet_testkit::TempDir,
    Arc<dyn Store>,
    FakeTelegram,
    BotSpec,
    Vec<Running>,
) {
    let (dir, store) = store().await;
    let fake = FakeTelegram::start().await.unwrap();
    fake.state().add_bot(token);
    let mut spec = webhook_bot(id, token, &fake, "http://127.0.0.1:9/");
    spec.handler = HandlerSpec::Echo;
    store.add_bot(&spec).await.unwrap();
    let ws = fleet(names, &MemoryHub::new(), &store, "http://127.0.0.1:9").await;
    (dir, store, fake, spec, ws)
}

fn webhook_bot(id: &str, token: &str, fake: &FakeTelegram, handler: &str) -> BotSpec {
    let mut spec = BotSpec::new(BotId::new(id).unwrap(), Platform::Telegram, token);
    spec.options.api_url = Some(fake.url());
    spec.options.mode = Some("webhook".into());
    spec.options.max_connections = Some(8);
    spec.hook.secret = Some(Secret::new(SECRET));
    spec.handler = HandlerSpec::Webhook {
        url: handler.to_owned(),
        secret: None,
    };
    spec
}

/// A handler service that holds the first message it is asked about until `thaw`, then
/// answers it `late:{text}` with a state saying so, and answers every other `re:{text}`.
struct Hanging {
    url: String,
    thaw: Arc<tokio::sync::Notify>,
    /// Whether the caller of the held call went away before it was answered.
    given_up: Arc<std::sync::atomic::AtomicBool>,
}

async fn hanging_handler() -> Hanging {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

    /// Marks the held call given up unless it answered.
    struct Left(Arc<AtomicBool>, bool);
    impl Drop for Left {
        fn drop(&mut self) {
            if !self.1 {
                self.0.store(true, SeqCst);
            }
        }
    }
    let hang = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", hang.local_addr().unwrap());
    let first = Arc::new(AtomicBool::new(true));
    let thaw = Arc::new(tokio::sync::Notify::new());
    let given_up = Arc::new(AtomicBool::new(false));
    let (f2, t2, g2) = (first, thaw.clone(), given_up.clone());
    let app = axum::Router::new().route(
        "/",
        axum::routing::post(move |axum::Json(v): axum::Json<serde_json::Value>| {
            let (f, t, g) = (f2.clone(), t2.clone(), g2.clone());
            async move {
                let text = v["text"].as_str().unwrap_or("").to_owned();
                if f.swap(false, SeqCst) {
                    let mut left = Left(g, false);
                    t.notified().await;
                    left.1 = true;
                    return axum::Json(
                        serde_json::json!({"text": format!("late:{text}"), "state": {"late": true}}),
                    );
                }
                axum::Json(serde_json::json!({"text": format!("re:{text}")}))
            }
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(hang, app).await;
    });
    Hanging {
        url,
        thaw,
        given_up,
    }
}

/// Delivers a Telegram message update (`id`, in private chat `chat`) to the hooks address
/// `hook`, with the bots' secret: the answer's status.
async fn post_update(hook: &str, id: i64, chat: i64, text: &str) -> u16 {
    reqwest::Client::new()
        .post(hook)
        .header("X-Telegram-Bot-Api-Secret-Token", SECRET)
        .json(&serde_json::json!({
            "update_id": id,
            "message": {"message_id": id, "date": 1_700_000_000, "chat": {"id": chat, "type": "private"}, "text": text}
        }))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// [`post_update`] until it is answered 200 (the worker registers first), for up to 5 s.
async fn acknowledged_at_last(hook: &str, id: i64, chat: i64, text: &str) {
    for _ in 0..50 {
        if post_update(hook, id, chat, text).await == 200 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{hook} never acknowledged message {id}");
}

/// Webhook bot `id` (`token`, on a fresh fake Bot API and store) answered by a
/// [`hanging_handler`].
async fn hanging_bot(
    id: &str,
    token: &str,
) -> (
    botfleet_testkit::TempDir,
    Arc<dyn Store>,
    FakeTelegram,
    Hanging,
) {
    let (dir, store) = store().await;
    let fake = FakeTelegram::start().await.unwrap();
    fake.state().add_bot(token);
    let hanging = hanging_handler().await;
    store
        .add_bot(&webhook_bot(id, token, &fake, &hanging.url))
        .await
        .unwrap();
    (dir, store, fake, hanging)
}

struct TelegramHooksFixture {
    fake: FakeTelegram,
}

const TG_TOKEN: &str = "4242:hook-token";

#[async_trait::async_trait]
impl WebhookFixture for TelegramHooksFixture {
    fn path(&self) -> (&'static str, &'static str) {
        ("telegram", "hooky")
    }
    fn bot(&self, handler: &str) -> BotSpec {
        self.fake.state().add_bot(TG_TOKEN);
        webhook_bot("hooky", TG_TOKEN, &self.fake, handler)
    }
    async fn subscribe(&self, hook: &str) {
        until("the claim holder registers the webhook", 10, || {
            self.fake.state().webhook(TG_TOKEN).as_deref() == Some(hook)
        })
        .await;
    }
    fn user_writes(&self, chat: usize, text: &str) {
        self.fake
            .state()
            .user_writes(TG_TOKEN, 500 + chat as i64, text);
    }
    fn user_commands(&self, chat: usize, name: &str, args: &str) -> bool {
        self.user_writes(chat, &format!("/{name} {args}"));
        true
    }
    fn user_writes_then_edits(&self, chat: usize, text: &str, edited: &str) -> bool {
        let fake = self.fake.state();
        let id = fake.user_writes(TG_TOKEN, 500 + chat as i64, text);
        fake.user_edits(TG_TOKEN, 500 + chat as i64, id, edited);
        true
    }
    fn replies(&self) -> Vec<(String, String)> {
        self.fake
            .state()
            .sent()
            .into_iter()
            .map(|s| (s.chat_id, s.text))
            .collect()
    }
    fn settled(&self) -> bool {
        self.fake.state().pending_updates(TG_TOKEN) == 0
    }
    fn pace_edits(&self, every: Duration) -> bool {
        self.fake.state().pace_edits(Some(every));
        true
    }
    fn edits_paced(&self) -> u64 {
        self.fake.state().edits_paced()
    }
    fn edits(&self) -> Vec<(String, String)> {
        self.fake
            .state()
            .edits(TG_TOKEN)
            .into_iter()
            .map(|e| (e.chat_id, e.text))
            .collect()
    }
    fn user_writes_where_streams_are_native(&self, chat: usize, text: &str) -> bool {
        // Private chats (positive ids), as every chat of this fixture.
        self.user_writes(chat, text);
        true
    }
    fn native_streams(&self) -> Vec<(String, String, bool)> {
        botfleet_testkit::connector_suite::telegram_streams(self.fake.state(), TG_TOKEN)
    }
    fn shown(&self) -> Vec<botfleet_testkit::Shown> {
        botfleet_testkit::connector_suite::telegram_shown(self.fake.state(), TG_TOKEN)
    }
    fn user_presses(&self, chat: usize, message_id: &str, value: &str) -> bool {
        message_id.parse().ok().is_some_and(|id| {
            self.fake
                .state()
                .user_presses(TG_TOKEN, 500 + chat as i64, id, value)
                .is_some()
        })
    }
    fn user_sends_photo(&self, chat: usize, data: Vec<u8>, caption: &str) -> bool {
        self.fake.state().user_sends_file(
            TG_TOKEN,
            500 + chat as i64,
            "photo",
            data,
            None,
            None,
            Some(caption),
        );
        true
    }
    fn typing_shown(&self) -> usize {
        self.fake.state().calls(TG_TOKEN, "sendChatAction").len()
    }
    fn files_sent(&self) -> Vec<botfleet_testkit::connector_suite::FileOut> {
        self.fake
            .state()
            .files_sent()
            .into_iter()
            .map(|s| botfleet_testkit::connector_suite::FileOut {
                chat: 0,
                name: s.name,
                data: s.data,
                caption: s.caption,
            })
            .collect()
    }
    fn revoke(&self) -> bool {
        self.fake.state().revoke(TG_TOKEN);
        true
    }
    fn rotate(&self, spec: &mut BotSpec) -> bool {
        self.fake.state().rotate(TG_TOKEN, "4242:rotated-token");
        spec.token = Secret::new("4242:rotated-token");
        true
    }
    fn forged(&self, http: &reqwest::Client, hook: &str) -> reqwest::RequestBuilder {
        http.post(hook)
            .header("X-Telegram-Bot-Api-Secret-Token", "guess")
            .json(&serde_json::json!({"update_id": 1, "message": {"message_id": 1, "chat": {"id": 1}, "text": "forged"}}))
    }
}

/// Telegram webhook mode passes the suite; the claim holder registered the webhook and the
/// bot is never polled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telegram_webhook_bots_pass_the_webhook_suite() {
    let f = TelegramHooksFixture {
        fake: FakeTelegram::start().await.unwrap(),
    };
    let run = webhook_suite(&f, 6, 12).await;
    assert_eq!(
        f.fake.state().polls(TG_TOKEN),
        0,
        "a webhook bot is never polled"
    );
    run.shutdown().await;
}

/// Deliveries of one chat racing each other (several in flight at once) still get one turn at
/// a time: the state counts every message exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_deliveries_of_one_chat_take_turns() {
    let (_dir, store) = store().await;
    let fake = FakeTelegram::start().await.unwrap();
    fake.state().race_chats(true);
    let handler = StateHandler::start(Duration::from_millis(15)).await;
    let token = "4343:race-token";
    fake.state().add_bot(token);
    let (_proxy, workers) = behind_balancer(
        &store,
        webhook_bot("racy", token, &fake, &handler.url()),
        &["a", "b", "c"],
    )
    .await;
    until("fake.state().webhook(token).is_some()", 10, || {
        fake.state().webhook(token).is_some()
    })
    .await;
    const N: usize = 30;
    for i in 0..N {
        fake.state().user_writes(token, 77, &format!("r{i}"));
    }
    until("fake.state().sent_count() >= N", 30, || {
        fake.state().sent_count() >= N
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sent = fake.state().sent();
    assert_eq!(sent.len(), N);
    let mut counts: Vec<u64> = sent
        .iter()
        .map(|s| s.text.split(':').next().unwrap().parse().unwrap())
        .collect();
    counts.sort_unstable();
    assert_eq!(
        counts,
        (1..=N as u64).collect::<Vec<_>>(),
        "every message saw the state its predecessor left"
    );
    assert_eq!(handler.max_concurrency_per_chat(), 1, "one turn at a time");
    assert!(
        fake.state().deliveries().max_in_flight_per_chat > 1,
        "the deliveries did race"
    );
    for w in workers {
        w.shutdown().await;
    }
}

/// A press delivered by webhook while a slow turn of its chat runs (on whichever worker): the
/// worker that received it stops its spinner within 3 s of the press, though its turn starts
/// seconds later; its answer then comes as a message, after the slow reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_press_queued_behind_a_slow_turn_stops_its_spinner_in_time() {
    use serde_json::{json, Value};
    let (_dir, store) = store().await;
    let fake = FakeTelegram::start().await.unwrap();
    let handler = botfleet_testkit::ScriptedHandler::start(|ev: &Value| {
        match (ev["kind"].as_str(), ev["text"].as_str()) {
            (Some("action"), _) => json!({"actions": [{"type": "answer", "text": "noted"}]}),
            (_, Some("slow")) => json!({"_delay_ms": 5_000, "text": "slow reply"}),
            _ => json!({"actions": [{"type": "send", "text": "Pick",
                "buttons": [[{"text": "A", "value": "a"}]]}]}),
        }
    })
    .await;
    let token = "4545:press-token";
    fake.state().add_bot(token);
    let (_proxy, workers) = behind_balancer(
        &store,
        webhook_bot("presses", token, &fake, &handler.url()),
        &["a", "b"],
    )
    .await;
    until("the webhook registered", 10, || {
        fake.state().webhook(token).is_some()
    })
    .await;
    fake.state().user_writes(token, 88, "menu");
    let menu = wait_for("the menu", Duration::from_secs(20), || async {
        fake.state().sent().into_iter().find(|s| s.text == "Pick")
    })
    .await;
    fake.state().user_writes(token, 88, "slow");
    // Pressed while the slow turn runs: its handler has the message.
    until("the slow turn running", 20, || {
        handler.seen().iter().any(|e| e["text"] == "slow")
    })
    .await;
    let (_, query) = fake
        .state()
        .user_presses(token, 88, menu.message_id, "a")
        .expect("the button");
    until("the press answered", 30, || {
        fake.state().sent().iter().any(|s| s.text == "noted")
    })
    .await;
    let press = fake.state().press(&query).expect("the press");
    let after = press.answered_empty_after().expect("answered empty");
    assert!(
        after < Duration::from_secs(3),
        "within 3 s of the press, not after the slow turn: {after:?}"
    );
    let sent: Vec<String> = fake.state().sent().into_iter().map(|s| s.text).collect();
    assert_eq!(sent, ["Pick", "slow reply", "noted"], "in the chat's order");
    for w in workers {
        w.shutdown().await;
    }
}

/// A webhook bot's chat handed to a person: a message and a press delivered through the
/// balancer reach no handler, and the press's spinner is stopped all the same; once resumed,
/// the chat's next message is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_press_in_a_paused_webhook_chat_is_acknowledged_not_handled() {
    use serde_json::{json, Value};
    let (_dir, store) = store().await;
    let fake = FakeTelegram::start().await.unwrap();
    let handler =
        botfleet_testkit::ScriptedHandler::start(|ev: &Value| match ev["text"].as_str() {
            Some("menu") => json!({"actions": [{"type": "send", "text": "Pick",
                "buttons": [[{"text": "A", "value": "a"}]]}]}),
            _ => json!({"text": format!("re: {}", ev["text"].as_str().unwrap_or("a press"))}),
        })
        .await;
    let token = "4546:paused-token";
    fake.state().add_bot(token);
    let spec = webhook_bot("paused", token, &fake, &handler.url());
    let bot = spec.id.clone();
    let (_proxy, workers) = behind_balancer(&store, spec, &["a", "b"]).await;
    until("the webhook registered", 10, || {
        fake.state().webhook(token).is_some()
    })
    .await;
    fake.state().user_writes(token, 89, "menu");
    let menu = wait_for("the menu", Duration::from_secs(20), || async {
        fake.state().sent().into_iter().find(|s| s.text == "Pick")
    })
    .await;
    let pause = botfleet_store::ChatPause {
        chat: "89".into(),
        until_ms: None,
        reason: None,
        paused_at_ms: botfleet_core::unix_ms(),
    };
    store.chat_pause(&bot, &pause).await.unwrap();
    fake.state().user_writes(token, 89, "hello?");
    let (_, query) = fake
        .state()
        .user_presses(token, 89, menu.message_id, "a")
        .expect("the button");
    until("the press acknowledged", 20, || {
        fake.state()
            .press(&query)
            .is_some_and(|p| p.answer.is_some())
    })
    .await;
    store.chat_resume(&bot, "89", false).await.unwrap();
    fake.state().user_writes(token, 89, "back");
    until("the message after the resume answered", 20, || {
        fake.state().sent().iter().any(|s| s.text == "re: back")
    })
    .await;
    let sent: Vec<String> = fake.state().sent().into_iter().map(|s| s.text).collect();
    assert_eq!(sent, ["Pick", "re: back"], "nothing answered while paused");
    let asked: Vec<Value> = handler.seen();
    assert!(
        asked
            .iter()
            .all(|e| e["kind"] != "action" && e["text"] != "hello?"),
        "{asked:?}"
    );
    for w in workers {
        w.shutdown().await;
    }
}

/// A request without the secret token (or with a wrong one) is refused before anything is
/// stored; a redelivery of an update to another worker is acknowledged and answered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_secrets_are_refused_and_redeliveries_answered_once() {
    let token = "4444:sig-token";
    let (_dir, store, fake, _spec, mut ws) = echo_webhook_bot("sig", token, &["a", "b"]).await;
    let (b, a) = (ws.pop().unwrap(), ws.pop().unwrap());
    let http = reqwest::Client::new();
    let update = serde_json::json!({
        "update_id": 9001,
        "message": {"message_id": 1, "date": 1_700_000_000, "chat": {"id": 5, "type": "private"},
                    "from": {"id": 5, "is_bot": false, "first_name": "u"}, "text": "hello"}
    });
    let post = |url: String, secret: Option<&'static str>| {
        let mut r = http.post(url).json(&update);
        if let Some(s) = secret {
            r = r.header("X-Telegram-Bot-Api-Secret-Token", s);
        }
        r.send()
    };
    // Workers answer 503 until registered: wait for that.
    let path = "/hooks/telegram/sig";
    for (secret, want) in [(None, 401), (Some("wrong"), 401)] {
        let r = post(format!("{}{path}", a.hooks_url), secret)
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), want);
    }
    assert_eq!(
        a.metrics
            .platform_count(metrics::HOOKS_REFUSED_TOTAL, Platform::Telegram),
        2
    );
    assert!(
        store.inbox_stats().await.unwrap().is_empty(),
        "nothing stored for a refused request"
    );
    // Unknown bots and platforms are 404; a GET is not a delivery.
    let r = http
        .post(format!("{}/hooks/telegram/nobody", a.hooks_url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let r = http
        .post(format!("{}/hooks/fax/sig", a.hooks_url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    // The same update to both workers: both acknowledge, one answer.
    let mut ok = 0;
    for _ in 0..100 {
        let ra = post(format!("{}{path}", a.hooks_url), Some(SECRET))
            .await
            .unwrap();
        let rb = post(format!("{}{path}", b.hooks_url), Some(SECRET))
            .await
            .unwrap();
        if ra.status() == 200 && rb.status() == 200 {
            ok += 1;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(ok, 1, "both workers acknowledge once registered");
    until("fake.state().sent_count() >= 1", 10, || {
        fake.state().sent_count() >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(fake.state().sent_count(), 1, "answered once");
    let dups = a
        .metrics
        .platform_count(metrics::HOOKS_DUPLICATES_TOTAL, Platform::Telegram)
        + b.metrics
            .platform_count(metrics::HOOKS_DUPLICATES_TOTAL, Platform::Telegram);
    assert!(dups >= 1, "the second delivery was a duplicate");
    // A body over the limit is refused.
    let big = vec![b'x'; botfleet_runtime::MAX_HOOK_BODY + 1];
    let r = http
        .post(format!("{}{path}", a.hooks_url))
        .header("X-Telegram-Bot-Api-Secret-Token", SECRET)
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 413);
    a.shutdown().await;
    b.shutdown().await;
}

/// A worker frozen holding a chat's turn (its liveness gone, its tasks still there): after its
/// lease the next message's worker takes the turn over and answers the frozen worker's message
/// first, then its own; when the frozen worker's handler finally answers, it acts on nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_workers_turn_is_taken_over_and_it_acts_on_nothing() {
    // A handler that never answers the first message: its worker holds the turn until it dies.
    let token = "4545:dead-token";
    let (_dir, store, fake, Hanging { thaw, .. }) = hanging_bot("deady", token).await;
    let hub = MemoryHub::new();
    let ca = hub.coordinator();
    let a = start(
        config("a", "http://127.0.0.1:9"),
        Arc::new(ca.clone()),
        store.clone(),
    )
    .await;
    let b = start(
        config("b", "http://127.0.0.1:9"),
        Arc::new(hub.coordinator()),
        store.clone(),
    )
    .await;
    until(
        "a.metrics.sent_total() == 0 && fake.state().webhook(token).i",
        10,
        || a.metrics.sent_total() == 0 && fake.state().webhook(token).is_some(),
    )
    .await;
    let (a_hook, b_hook) = (
        format!("{}/hooks/telegram/deady", a.hooks_url),
        format!("{}/hooks/telegram/deady", b.hooks_url),
    );
    acknowledged_at_last(&a_hook, 1, 8, "one").await;
    // b's message waits behind a's turn.
    assert_eq!(post_update(&b_hook, 2, 8, "two").await, 200);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        fake.state().sent_count(),
        0,
        "the second waits for the first's turn"
    );
    // a freezes: its coordinator handle is cut (no renewal gets through), its tasks stay.
    hub.crash(&ca);
    until("fake.state().sent_count() >= 2", 15, || {
        fake.state().sent_count() >= 2
    })
    .await;
    let texts: Vec<String> = fake.state().sent().into_iter().map(|s| s.text).collect();
    assert_eq!(
        texts,
        ["re:one", "re:two"],
        "the frozen worker's message first"
    );
    assert!(
        b.metrics
            .platform_count(metrics::TURN_TAKEOVERS_TOTAL, Platform::Telegram)
            >= 1
    );
    // a thaws: its handler answers at last; a sends nothing and writes no state.
    thaw.notify_waiters();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let texts: Vec<String> = fake.state().sent().into_iter().map(|s| s.text).collect();
    assert_eq!(
        texts,
        ["re:one", "re:two"],
        "the frozen worker acted on nothing"
    );
    let v = store
        .turn_view(&BotId::new("deady").unwrap(), "1", "8")
        .await
        .unwrap();
    assert!(
        !v.state.unwrap_or_default().contains("late"),
        "the frozen worker's state was not written"
    );
    a.abort();
    b.shutdown().await;
}

/// A conversation state over the bound is not stored and is reported to the bot's owner;
/// the reply still goes out and the chat keeps its last state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_too_large_state_is_reported_not_stored() {
    let (_dir, store) = store().await;
    let fake = FakeTelegram::start().await.unwrap();
    let handler = StateHandler::start(Duration::ZERO).await;
    let token = "4747:big-token";
    fake.state().add_bot(token);
    store
        .add_bot(&webhook_bot("biggy", token, &fake, &handler.url()))
        .await
        .unwrap();
    let hub = MemoryHub::new();
    let a = fleet(&["a"], &hub, &store, "http://127.0.0.1:9")
        .await
        .remove(0);
    let http = reqwest::Client::new();
    for (id, text) in [(1, "small"), (2, "big"), (3, "after")] {
        let body = serde_json::json!({"update_id": id, "message": {"message_id": id, "chat": {"id": 4}, "text": text}});
        let mut ok = false;
        for _ in 0..100 {
            let r = http
                .post(format!("{}/hooks/telegram/biggy", a.hooks_url))
                .header("X-Telegram-Bot-Api-Secret-Token", SECRET)
                .json(&body)
                .send()
                .await
                .unwrap();
            if r.status() == 200 {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(ok);
        until("answered", 10, || fake.state().sent_count() == id as usize).await;
    }
    let texts: Vec<String> = fake.state().sent().into_iter().map(|s| s.text).collect();
    // The big state was dropped: "after" continues from "small"'s state (1), not "big"'s (2).
    assert_eq!(texts, ["1:small", "2:big", "2:after"]);
    assert_eq!(
        a.metrics
            .platform_count(metrics::STATE_TOO_LARGE_TOTAL, Platform::Telegram),
        1
    );
    let rec = store
        .get_bot(&BotId::new("biggy").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(
        rec.last_error.unwrap_or_default().contains("over the"),
        "reported to the owner"
    );
    a.shutdown().await;
}

/// Back to polling: the webhook is deleted and the bot is polled again; a removed webhook bot
/// has its webhook deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_to_polling_or_removal_deletes_the_webhook() {
    let token = "4646:mode-token";
    let (_dir, store, fake, mut spec, mut ws) = echo_webhook_bot("modey", token, &["a"]).await;
    let a = ws.remove(0);
    until("fake.state().webhook(token).is_some()", 10, || {
        fake.state().webhook(token).is_some()
    })
    .await;
    spec.options.mode = None;
    spec.hook.secret = None;
    spec.options.max_connections = None;
    store.update_bot(&spec).await.unwrap();
    until("the webhook goes and polling comes back", 15, || {
        fake.state().webhook(token).is_none() && fake.state().is_polling(token)
    })
    .await;
    fake.state().user_writes(token, 3, "polled");
    until("fake.state().sent_count() == 1", 10, || {
        fake.state().sent_count() == 1
    })
    .await;
    // Webhook mode again, then the bot is removed: its webhook goes with it.
    spec.options.mode = Some("webhook".into());
    spec.hook.secret = Some(Secret::new(SECRET));
    store.update_bot(&spec).await.unwrap();
    until("the webhook is set again", 15, || {
        fake.state().webhook(token).is_some()
    })
    .await;
    store.remove_bot(&spec.id).await.unwrap();
    until("a removed bot's webhook is deleted", 15, || {
        fake.state().webhook(token).is_none()
    })
    .await;
    a.shutdown().await;
}

const WA_NUMBER: &str = "1234567";
const WA_ACCESS: &str = "EAAG-access";
const WA_SECRET: &str = "app-secret-1";

struct WhatsappFixture {
    graph: botfleet_testkit::FakeGraph,
}

#[async_trait::async_trait]
impl WebhookFixture for WhatsappFixture {
    fn path(&self) -> (&'static str, &'static str) {
        ("whatsapp", "wa")
    }
    fn bot(&self, handler: &str) -> BotSpec {
        self.graph
            .state()
            .add_number(WA_NUMBER, WA_ACCESS, WA_SECRET);
        // Every message is delivered twice, with a status update after it.
        self.graph.state().duplicate_deliveries(true);
        let mut spec = BotSpec::new(BotId::new("wa").unwrap(), Platform::Whatsapp, WA_ACCESS);
        spec.options.api_url = Some(self.graph.url());
        spec.options.phone_number_id = Some(WA_NUMBER.into());
        spec.hook.secret = Some(Secret::new(WA_SECRET));
        spec.hook.verify_token = Some(Secret::new("verify-me"));
        spec.handler = HandlerSpec::Webhook {
            url: handler.to_owned(),
            secret: None,
        };
        spec
    }
    async fn subscribe(&self, hook: &str) {
        self.graph.state().subscribe(WA_NUMBER, hook);
    }
    fn user_writes(&self, chat: usize, text: &str) {
        let id = self
            .graph
            .state()
            .user_writes(WA_NUMBER, &format!("49170{chat}"), text);
        self.graph.state().status_update(WA_NUMBER, &id);
    }
    fn shown(&self) -> Vec<botfleet_testkit::Shown> {
        self.graph
            .state()
            .sent()
            .into_iter()
            .filter_map(|m| {
                Some(botfleet_testkit::Shown {
                    chat: m.to.strip_prefix("49170")?.parse().ok()?,
                    id: m.wamid,
                    text: m.text,
                    buttons: m.buttons.into_iter().map(|(id, _)| id).collect(),
                    deleted: false,
                })
            })
            .collect()
    }
    fn user_presses(&self, chat: usize, message_id: &str, value: &str) -> bool {
        self.graph
            .state()
            .user_presses(WA_NUMBER, &format!("49170{chat}"), message_id, value)
            .is_some()
    }
    fn replies(&self) -> Vec<(String, String)> {
        self.graph
            .state()
            .sent()
            .into_iter()
            .map(|s| (s.to, s.text))
            .collect()
    }
    fn settled(&self) -> bool {
        self.graph.state().undelivered() == 0
    }
    fn user_sends_photo(&self, chat: usize, data: Vec<u8>, caption: &str) -> bool {
        self.graph.state().user_sends_media(
            WA_NUMBER,
            &format!("49170{chat}"),
            "image",
            "image/jpeg",
            data,
            Some(caption),
            None,
        );
        true
    }
    fn typing_shown(&self) -> usize {
        self.graph.state().typing(WA_NUMBER).len()
    }
    fn files_sent(&self) -> Vec<botfleet_testkit::connector_suite::FileOut> {
        self.graph
            .state()
            .sent()
            .into_iter()
            .filter_map(|s| {
                let m = s.media?;
                Some(botfleet_testkit::connector_suite::FileOut {
                    chat: 0,
                    name: m.name,
                    data: m.data,
                    caption: Some(s.text),
                })
            })
            .collect()
    }
    fn revoke(&self) -> bool {
        self.graph.state().revoke(WA_NUMBER);
        true
    }
    fn rotate(&self, spec: &mut BotSpec) -> bool {
        self.graph.state().set_token(WA_NUMBER, "EAAG-rotated");
        spec.token = Secret::new("EAAG-rotated");
        true
    }
    fn forged(&self, http: &reqwest::Client, hook: &str) -> reqwest::RequestBuilder {
        let body = br#"{"object":"whatsapp_business_account","entry":[{"id":"x","changes":[{"field":"messages","value":{"messages":[{"from":"1","id":"wamid.forged","type":"text","text":{"body":"forged"}}]}}]}]}"#;
        http.post(hook)
            .header(
                "x-hub-signature-256",
                botfleet_whatsapp::sign("wrong", body),
            )
            .body(body.to_vec())
    }
}

/// A WhatsApp Cloud token Graph refuses holds the bot's chats in order until it is replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_whatsapp_token_holds_its_chats_in_order_until_replaced() {
    let f = WhatsappFixture {
        graph: botfleet_testkit::FakeGraph::start().await.unwrap(),
    };
    botfleet_testkit::webhook_suite::refused_tokens_hold_their_chats(&f).await;
}

/// WhatsApp Cloud API passes the suite with every message delivered twice and status updates
/// between; the handshake answers the challenge only with the verify token; replies answer
/// their message; a token Graph refuses (190) fails the bot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whatsapp_cloud_bots_pass_the_webhook_suite() {
    use botfleet_testkit::FakeGraph;
    let f = WhatsappFixture {
        graph: FakeGraph::start().await.unwrap(),
    };
    let (chats, each) = (4, 8);
    let run = webhook_suite(&f, chats, each).await;
    let graph = &f.graph;
    let http = reqwest::Client::new();
    // The subscription handshake.
    let ok = http
        .get(format!(
            "{}?hub.mode=subscribe&hub.challenge=1158201444&hub.verify_token=verify-me",
            run.hook
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(ok.text().await.unwrap(), "1158201444");
    let bad = http
        .get(format!(
            "{}?hub.mode=subscribe&hub.challenge=1&hub.verify_token=guess",
            run.hook
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 403);
    for s in graph.state().sent() {
        assert!(s
            .reply_to
            .as_deref()
            .is_some_and(|r| r.starts_with("wamid.")));
    }
    let total = (chats * each) as u64;
    let dups: u64 = run
        .workers
        .iter()
        .map(|w| {
            w.metrics
                .platform_count(metrics::HOOKS_DUPLICATES_TOTAL, Platform::Whatsapp)
        })
        .sum();
    assert!(
        dups >= total,
        "every second delivery was a duplicate ({dups})"
    );
    // Graph stops taking the token: the bot fails, visibly.
    graph.state().revoke(WA_NUMBER);
    graph.state().user_writes(WA_NUMBER, "491709", "after");
    let id = BotId::new("wa").unwrap();
    let mut failed = false;
    for _ in 0..200 {
        let rec = run.store.get_bot(&id).await.unwrap().unwrap();
        if rec.status == botfleet_core::BotStatus::Failed {
            assert!(rec.last_error.unwrap_or_default().contains("190"));
            failed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(failed, "a refused token fails the bot");
    // Nothing is lost: the message waits while the bot is failed (every copy's turn is
    // refused too), and is answered once after the token works again and the bot is
    // restarted: the sweeper replays what a failed bot left pending.
    let answered_after = || {
        f.replies()
            .iter()
            .filter(|(to, text)| to == "491709" && text.ends_with(":after"))
            .count()
    };
    // Both copies delivered and acknowledged, and the entry kept pending (not given up as
    // undeliverable) while the bot is failed.
    let pending = || async {
        let stats = run.store.inbox_stats().await.ok()?;
        Some(stats.get(&id).copied().unwrap_or_default())
    };
    let kept = wait_for(
        "the refused message kept pending",
        Duration::from_secs(20),
        || async {
            let s = pending().await?;
            (graph.state().undelivered() == 0 && s.pending >= 1).then_some(s)
        },
    )
    .await;
    assert_eq!(kept.undeliverable, 0, "nothing given up");
    assert_eq!(answered_after(), 0, "not answered while the bot is failed");
    // The operator rotates the token and restarts the bot. Right before, a message is
    // refused with the old token, so the workers' cached spec (kept 2 s) is the old one and
    // the refusal's "failed" report may still be on its way to the store; right after, a
    // message whose turn may still use the cached spec is refused with the old token too.
    // Neither may fail the bot again: each was made under the spec the rotation replaced.
    graph.state().user_writes(WA_NUMBER, "491709", "warm");
    until("the warm-up delivered", 20, || {
        graph.state().undelivered() == 0
    })
    .await;
    graph
        .state()
        .add_number(WA_NUMBER, "EAAG-rotated", WA_SECRET);
    graph.state().duplicate_deliveries(true);
    graph.state().subscribe(WA_NUMBER, &run.hook);
    let mut spec = run.store.get_bot(&id).await.unwrap().unwrap().spec;
    spec.token = botfleet_core::Secret::new("EAAG-rotated");
    run.store.update_bot(&spec).await.unwrap();
    run.store
        .set_status(&id, botfleet_core::BotStatus::Pending, None, None)
        .await
        .unwrap();
    graph.state().user_writes(WA_NUMBER, "491709", "rotated");
    let answered = |text: &str| {
        f.replies()
            .iter()
            .filter(|(to, t)| to == "491709" && t.ends_with(text))
            .count()
    };
    until(
        "every waiting message answered after the rotation",
        40,
        || answered(":after") > 0 && answered(":warm") > 0 && answered(":rotated") > 0,
    )
    .await;
    // Once the entries have ended no turn sends them again: the counts are final then.
    wait_for("the entries ended", Duration::from_secs(20), || async {
        (pending().await?.pending == 0).then_some(())
    })
    .await;
    for text in [":warm", ":rotated"] {
        assert_eq!(answered(text), 1, "{text} answered once");
    }
    // In the chat's order: what waited while the token was refused held the chat's turn, so
    // the message written after the rotation came after them.
    let order: Vec<String> = f
        .replies()
        .into_iter()
        .filter(|(to, t)| {
            to == "491709"
                && [":after", ":warm", ":rotated"]
                    .iter()
                    .any(|x| t.ends_with(x))
        })
        .map(|(_, t)| t.rsplit(':').next().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        order,
        ["after", "warm", "rotated"],
        "answered in the chat's order"
    );
    let rec = run.store.get_bot(&id).await.unwrap().unwrap();
    assert_ne!(
        rec.status,
        botfleet_core::BotStatus::Failed,
        "a refusal of the replaced token did not fail the bot: {:?}",
        rec.last_error
    );
    assert_eq!(answered_after(), 1, "answered once");
    run.shutdown().await;
}

const SL_TOKEN: &str = "xoxb-events-1";
const SL_SIGNING: &str = "signing-secret-1";

struct SlackEventsFixture {
    slack: botfleet_testkit::FakeSlack,
}

#[async_trait::async_trait]
impl WebhookFixture for SlackEventsFixture {
    fn path(&self) -> (&'static str, &'static str) {
        ("slack", "sl")
    }
    fn bot(&self, handler: &str) -> BotSpec {
        self.slack.state().add_app(SL_TOKEN, "xapp-unused");
        let mut spec = BotSpec::new(BotId::new("sl").unwrap(), Platform::Slack, SL_TOKEN);
        spec.options.api_url = Some(self.slack.url());
        spec.options.mode = Some("events".into());
        spec.hook.secret = Some(Secret::new(SL_SIGNING));
        spec.handler = HandlerSpec::Webhook {
            url: handler.to_owned(),
            secret: None,
        };
        spec
    }
    async fn subscribe(&self, hook: &str) {
        self.slack
            .state()
            .subscribe_events(SL_TOKEN, hook, SL_SIGNING);
    }
    fn user_writes(&self, chat: usize, text: &str) {
        self.slack
            .state()
            .user_writes(SL_TOKEN, &format!("C00{chat}"), None, text);
    }
    fn user_commands(&self, chat: usize, name: &str, args: &str) -> bool {
        self.slack.state().user_runs_command(
            SL_TOKEN,
            &format!("C00{chat}"),
            &format!("/{name}"),
            args,
        );
        true
    }
    fn user_writes_then_edits(&self, chat: usize, text: &str, edited: &str) -> bool {
        let (fake, channel) = (self.slack.state(), format!("C00{chat}"));
        let ts = fake.user_writes(SL_TOKEN, &channel, None, text);
        fake.user_edits(SL_TOKEN, &channel, &ts, text, edited);
        true
    }
    fn replies(&self) -> Vec<(String, String)> {
        self.slack
            .state()
            .sent()
            .into_iter()
            .map(|p| (p.channel, p.text))
            .collect()
    }
    fn settled(&self) -> bool {
        self.slack.state().events_undelivered() == 0
    }
    fn pace_edits(&self, every: Duration) -> bool {
        self.slack.state().pace_updates(Some(every));
        true
    }
    fn edits_paced(&self) -> u64 {
        self.slack.state().updates_paced()
    }
    fn edits(&self) -> Vec<(String, String)> {
        self.slack
            .state()
            .updates(SL_TOKEN)
            .into_iter()
            .map(|u| (u.channel, u.text))
            .collect()
    }
    fn user_writes_where_streams_are_native(&self, chat: usize, text: &str) -> bool {
        self.slack.state().user_writes(
            SL_TOKEN,
            &format!("C00{chat}"),
            Some("1700000000.000777"),
            text,
        );
        true
    }
    fn native_streams(&self) -> Vec<(String, String, bool)> {
        let fake = self.slack.state();
        fake.streams(SL_TOKEN)
            .into_iter()
            .filter_map(|(channel, ts)| {
                let p = fake.posted(SL_TOKEN, &channel, &ts)?;
                Some((channel, p.text, p.streaming))
            })
            .collect()
    }
    fn user_sends_photo(&self, chat: usize, data: Vec<u8>, caption: &str) -> bool {
        self.slack.state().user_shares_file(
            SL_TOKEN,
            &format!("C00{chat}"),
            "p.jpg",
            "image/jpeg",
            data,
            caption,
        );
        true
    }
    fn files_sent(&self) -> Vec<botfleet_testkit::connector_suite::FileOut> {
        self.slack
            .state()
            .files_shared()
            .into_iter()
            .map(|s| botfleet_testkit::connector_suite::FileOut {
                chat: 0,
                name: Some(s.name),
                data: s.data,
                caption: s.initial_comment,
            })
            .collect()
    }
    fn shown(&self) -> Vec<botfleet_testkit::Shown> {
        botfleet_testkit::connector_suite::slack_shown(self.slack.state(), SL_TOKEN)
    }
    fn user_presses(&self, chat: usize, message_id: &str, value: &str) -> bool {
        self.slack
            .state()
            .user_presses(SL_TOKEN, &format!("C00{chat}"), message_id, value)
            .is_some()
    }
    fn revoke(&self) -> bool {
        self.slack.state().revoke(SL_TOKEN);
        true
    }
    fn rotate(&self, spec: &mut BotSpec) -> bool {
        self.slack.state().rotate(SL_TOKEN, "xoxb-events-rotated");
        spec.token = Secret::new("xoxb-events-rotated");
        true
    }
    fn forged(&self, http: &reqwest::Client, hook: &str) -> reqwest::RequestBuilder {
        let evil = br#"{"type":"event_callback","event":{"type":"message","channel":"C1","user":"U1","text":"forged","ts":"1.000001"}}"#;
        let now = (botfleet_core::unix_ms() / 1000).to_string();
        http.post(hook)
            .header("x-slack-request-timestamp", now.as_str())
            .header(
                "x-slack-signature",
                botfleet_slack::sign("wrong", &now, evil),
            )
            .body(evil.to_vec())
    }
}

/// Slack Events API passes the suite; the url_verification challenge is answered, a stale
/// request is refused, and events mode opens no socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_events_bots_pass_the_webhook_suite() {
    let f = SlackEventsFixture {
        slack: botfleet_testkit::FakeSlack::start().await.unwrap(),
    };
    let run = webhook_suite(&f, 4, 8).await;
    let (status, body) = f.slack.state().verify_url(SL_TOKEN).await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(body, "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P");
    // Correctly signed but older than 5 minutes: refused.
    let evil = br#"{"type":"event_callback","event":{"type":"message","channel":"C1","user":"U1","text":"forged","ts":"1.000002"}}"#;
    let old = (botfleet_core::unix_ms() / 1000 - 600).to_string();
    let r = reqwest::Client::new()
        .post(&run.hook)
        .header("x-slack-request-timestamp", old.as_str())
        .header(
            "x-slack-signature",
            botfleet_slack::sign(SL_SIGNING, &old, evil),
        )
        .body(evil.to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(
        f.slack.state().sockets(SL_TOKEN),
        0,
        "events mode opens no socket"
    );
    run.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telegram_commands_and_edits_by_webhook() {
    let f = TelegramHooksFixture {
        fake: FakeTelegram::start().await.unwrap(),
    };
    commands_and_edits_by_webhook(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_commands_and_edits_by_webhook() {
    let f = SlackEventsFixture {
        slack: botfleet_testkit::FakeSlack::start().await.unwrap(),
    };
    commands_and_edits_by_webhook(&f).await;
}

/// A backend send journaled in a webhook bot's chat goes out in that chat's turn — its text,
/// then its actions, each once, none quoting a message — and calls no handler; its entry
/// ends done and a repeat of its key is known. (Taken up here by the sweeper, as an entry
/// whose ticket was lost; the API's way into the chat's queue comes with the endpoint.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_send_goes_out_in_its_chats_turn_without_a_handler() {
    const TOKEN: &str = "5151:send-token";
    let (_dir, store) = store().await;
    let fake = FakeTelegram::start().await.unwrap();
    fake.state().add_bot(TOKEN);
    let handler = botfleet_testkit::RecordingHandler::start().await;
    let spec = webhook_bot("sendy", TOKEN, &fake, &handler.url());
    let (_proxy, workers) = behind_balancer(&store, spec.clone(), &["a"]).await;
    let key = botfleet_store::send_key("desk-reply-1");
    let send = botfleet_store::InboxItem {
        key: key.clone(),
        chat: "77".into(),
        message: serde_json::json!({
            "text": "from the desk",
            "actions": [{"type": "send", "text": "and a menu", "thread": true,
                         "buttons": [[{"text": "ok", "value": "ok"}]]}],
            "state": {"not": "kept"}
        })
        .to_string(),
    };
    let put = || store.journal_put(&spec.id, std::slice::from_ref(&send), None, None);
    assert_eq!(put().await.unwrap().0, [botfleet_store::Journaled::New]);
    wait_for("the send's turn ended", Duration::from_secs(30), || async {
        let v = store.turn_view(&spec.id, &key, "77").await.ok()?;
        (v.entry?.state == botfleet_store::InboxState::Done).then_some(())
    })
    .await;
    let sent: Vec<_> = fake
        .state()
        .sent()
        .into_iter()
        .filter(|s| s.chat_id == "77")
        .collect();
    let texts: Vec<&str> = sent.iter().map(|s| s.text.as_str()).collect();
    assert_eq!(
        texts,
        ["from the desk", "and a menu"],
        "each once, in order"
    );
    assert!(sent[1].reply_markup.is_some(), "the menu's buttons");
    let quoting = fake
        .state()
        .calls(TOKEN, "sendMessage")
        .iter()
        .filter(|c| c.args.get("reply_parameters").is_some())
        .count();
    assert_eq!(quoting, 0, "a send answers no message of the chat");
    assert!(handler.seen().is_empty(), "no handler is called for a send");
    let v = store.turn_view(&spec.id, &key, "77").await.unwrap();
    assert!(v.state.is_none(), "a send leaves the chat's state as it is");
    assert_eq!(
        put().await.unwrap().0,
        [botfleet_store::Journaled::Known],
        "a repeat of the key is known"
    );
    for w in workers {
        w.shutdown().await;
    }
}

/// A Telegram webhook bot's token answered 401 holds its chats in order until replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_telegram_token_holds_its_chats_in_order_until_replaced() {
    let f = TelegramHooksFixture {
        fake: FakeTelegram::start().await.unwrap(),
    };
    botfleet_testkit::webhook_suite::refused_tokens_hold_their_chats(&f).await;
}

/// A Slack Events API bot's revoked token holds its chats in order until replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_slack_token_holds_its_chats_in_order_until_replaced() {
    let f = SlackEventsFixture {
        slack: botfleet_testkit::FakeSlack::start().await.unwrap(),
    };
    botfleet_testkit::webhook_suite::refused_tokens_hold_their_chats(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telegram_buttons_by_webhook() {
    let f = TelegramHooksFixture {
        fake: FakeTelegram::start().await.unwrap(),
    };
    botfleet_testkit::webhook_suite::buttons_by_webhook(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whatsapp_buttons_by_webhook() {
    let f = WhatsappFixture {
        graph: botfleet_testkit::FakeGraph::start().await.unwrap(),
    };
    botfleet_testkit::webhook_suite::buttons_by_webhook(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telegram_files_by_webhook() {
    let f = TelegramHooksFixture {
        fake: FakeTelegram::start().await.unwrap(),
    };
    botfleet_testkit::webhook_suite::files_by_webhook(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whatsapp_files_by_webhook() {
    let f = WhatsappFixture {
        graph: botfleet_testkit::FakeGraph::start().await.unwrap(),
    };
    botfleet_testkit::webhook_suite::files_by_webhook(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_files_by_webhook() {
    let f = SlackEventsFixture {
        slack: botfleet_testkit::FakeSlack::start().await.unwrap(),
    };
    botfleet_testkit::webhook_suite::files_by_webhook(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_buttons_by_webhook() {
    let f = SlackEventsFixture {
        slack: botfleet_testkit::FakeSlack::start().await.unwrap(),
    };
    botfleet_testkit::webhook_suite::buttons_by_webhook(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telegram_sends_by_webhook() {
    let f = TelegramHooksFixture {
        fake: FakeTelegram::start().await.unwrap(),
    };
    botfleet_testkit::webhook_suite::sends_by_webhook(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whatsapp_sends_by_webhook() {
    let f = WhatsappFixture {
        graph: botfleet_testkit::FakeGraph::start().await.unwrap(),
    };
    botfleet_testkit::webhook_suite::sends_by_webhook(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_sends_by_webhook() {
    let f = SlackEventsFixture {
        slack: botfleet_testkit::FakeSlack::start().await.unwrap(),
    };
    botfleet_testkit::webhook_suite::sends_by_webhook(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telegram_long_turns_by_webhook() {
    let f = TelegramHooksFixture {
        fake: FakeTelegram::start().await.unwrap(),
    };
    botfleet_testkit::webhook_suite::long_turns_by_webhook(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whatsapp_long_turns_by_webhook() {
    let f = WhatsappFixture {
        graph: botfleet_testkit::FakeGraph::start().await.unwrap(),
    };
    botfleet_testkit::webhook_suite::long_turns_by_webhook(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telegram_later_answers_by_webhook() {
    let f = TelegramHooksFixture {
        fake: FakeTelegram::start().await.unwrap(),
    };
    botfleet_testkit::webhook_suite::later_answers_by_webhook(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whatsapp_later_answers_by_webhook() {
    let f = WhatsappFixture {
        graph: botfleet_testkit::FakeGraph::start().await.unwrap(),
    };
    botfleet_testkit::webhook_suite::later_answers_by_webhook(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_later_answers_by_webhook() {
    let f = SlackEventsFixture {
        slack: botfleet_testkit::FakeSlack::start().await.unwrap(),
    };
    botfleet_testkit::webhook_suite::later_answers_by_webhook(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telegram_later_parts_by_webhook() {
    let f = TelegramHooksFixture {
        fake: FakeTelegram::start().await.unwrap(),
    };
    botfleet_testkit::webhook_suite::later_parts_by_webhook(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whatsapp_later_parts_by_webhook() {
    let f = WhatsappFixture {
        graph: botfleet_testkit::FakeGraph::start().await.unwrap(),
    };
    botfleet_testkit::webhook_suite::later_parts_by_webhook(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_later_parts_by_webhook() {
    let f = SlackEventsFixture {
        slack: botfleet_testkit::FakeSlack::start().await.unwrap(),
    };
    botfleet_testkit::webhook_suite::later_parts_by_webhook(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telegram_streamed_parts_by_webhook() {
    let f = TelegramHooksFixture {
        fake: FakeTelegram::start().await.unwrap(),
    };
    botfleet_testkit::webhook_suite::streamed_parts_by_webhook(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_streamed_parts_by_webhook() {
    let f = SlackEventsFixture {
        slack: botfleet_testkit::FakeSlack::start().await.unwrap(),
    };
    botfleet_testkit::webhook_suite::streamed_parts_by_webhook(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telegram_native_stream_by_webhook() {
    let f = TelegramHooksFixture {
        fake: FakeTelegram::start().await.unwrap(),
    };
    botfleet_testkit::webhook_suite::a_native_stream_by_webhook(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_native_stream_by_webhook() {
    let f = SlackEventsFixture {
        slack: botfleet_testkit::FakeSlack::start().await.unwrap(),
    };
    botfleet_testkit::webhook_suite::a_native_stream_by_webhook(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_long_turns_by_webhook() {
    let f = SlackEventsFixture {
        slack: botfleet_testkit::FakeSlack::start().await.unwrap(),
    };
    botfleet_testkit::webhook_suite::long_turns_by_webhook(&f).await;
}

/// WhatsApp has neither commands nor edits: its messages still come as `message` events
/// with ids of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whatsapp_cloud_messages_are_message_events() {
    let f = WhatsappFixture {
        graph: botfleet_testkit::FakeGraph::start().await.unwrap(),
    };
    commands_and_edits_by_webhook(&f).await;
}

/// Where the fleet in [`data_loss_under_a_held_turn`] coordinates, and how it loses it all.
enum LossBackend {
    Memory(MemoryHub),
    Redis(botfleet_testkit::RedisServer),
}

impl LossBackend {
    async fn coordinator(&self) -> Arc<dyn botfleet_coord::Coordinator> {
        match self {
            LossBackend::Memory(hub) => Arc::new(hub.coordinator()),
            LossBackend::Redis(r) => Arc::new(
                botfleet_coord::RedisCoordinator::connect(botfleet_coord::RedisConfig::new(
                    r.url(),
                ))
                .await
                .unwrap(),
            ),
        }
    }

    fn lose_everything(&self) {
        match self {
            LossBackend::Memory(hub) => hub.wipe(),
            LossBackend::Redis(r) => r.flushall().unwrap(),
        }
    }

    /// Telegram webhook bot `id` (token `token`) whose handler keeps a count per chat and
    /// takes `delay` a call, on two workers of this backend behind a balancer, its webhook
    /// registered.
    async fn fleet(&self, id: &str, token: &str, delay: Duration) -> LossFleet {
        let (dir, store) = store().await;
        let fake = FakeTelegram::start().await.unwrap();
        let handler = StateHandler::start(delay).await;
        let proxy = RoundRobinProxy::start(Vec::new()).await;
        fake.state().add_bot(token);
        store
            .add_bot(&webhook_bot(id, token, &fake, &handler.url()))
            .await
            .unwrap();
        let mut workers = Vec::new();
        for name in ["a", "b"] {
            let c = self.coordinator().await;
            workers.push(start(config(name, &proxy.url()), c, store.clone()).await);
        }
        proxy.set_backends(workers.iter().map(|w| w.hooks_url.clone()).collect());
        until("the webhook is registered", 10, || {
            fake.state().webhook(token).is_some()
        })
        .await;
        LossFleet {
            _dir: dir,
            store,
            fake,
            handler,
            _proxy: proxy,
            workers,
            bot: BotId::new(id).unwrap(),
        }
    }

    /// Loses everything, then waits until both workers registered again.
    async fn lose_and_reregister(&self) {
        self.lose_everything();
        let observer = self.coordinator().await;
        wait_for(
            "both workers registered again",
            Duration::from_secs(10),
            || async {
                let live = observer.live_workers().await.unwrap_or_default();
                (live.len() == 2).then_some(())
            },
        )
        .await;
    }
}

/// What [`LossBackend::fleet`] starts (the directory and the balancer kept while it runs).
struct LossFleet {
    _dir: botfleet_testkit::TempDir,
    store: Arc<dyn Store>,
    fake: FakeTelegram,
    handler: StateHandler,
    _proxy: RoundRobinProxy,
    workers: Vec<Running>,
    bot: BotId,
}

impl LossFleet {
    async fn shutdown(self) {
        for w in self.workers {
            w.shutdown().await;
        }
    }
}

/// The coordinator loses everything while one message of a chat is in its handler and the
/// next one waits for the turn (their tickets and the queue go with it), and a third arrives
/// after: nothing of the chat is granted inside the grace window (the first holder may still
/// be acting), then the entries whose tickets were lost are served before the newer one.
/// Every message is answered, in order, each seeing the state its predecessor left, never two
/// at once.
async fn data_loss_under_a_held_turn(backend: LossBackend) {
    // One chat's updates delivered one after another (each after the last was acknowledged,
    // as Telegram does): the journal's order is the chat's order. (Racing deliveries of one
    // chat have no order between them to keep.) The handler is shorter than the grace window
    // (the lease, 1.5 s): the first call of m0, cut off by the loss, has ended before anything
    // of the chat may be granted again.
    let token = "4646:loss-token";
    let f = backend
        .fleet("lossy", token, Duration::from_millis(1200))
        .await;
    let (store, fake, handler, bot) = (&f.store, &f.fake, &f.handler, &f.bot);
    fake.state().user_writes(token, 91, "m0");
    fake.state().user_writes(token, 91, "m1");
    wait_for(
        "m0 in the handler and m1 journaled",
        Duration::from_secs(10),
        || async {
            let pending = store.inbox_pending(bot, 10).await.unwrap().len();
            (handler.calls() == 1 && pending == 2).then_some(())
        },
    )
    .await;
    backend.lose_and_reregister().await;
    fake.state().user_writes(token, 91, "m2");
    wait_for("three answers", Duration::from_secs(30), || async {
        let texts: Vec<String> = fake.state().sent().into_iter().map(|s| s.text).collect();
        let mut distinct: Vec<String> = Vec::new();
        for t in texts {
            if !distinct.contains(&t) {
                distinct.push(t);
            }
        }
        (distinct.len() >= 3).then_some(())
    })
    .await;
    wait_for("the journal settles", Duration::from_secs(10), || async {
        store
            .inbox_pending(bot, 10)
            .await
            .unwrap()
            .is_empty()
            .then_some(())
    })
    .await;
    let texts: Vec<String> = fake.state().sent().into_iter().map(|s| s.text).collect();
    let mut distinct: Vec<String> = Vec::new();
    for t in &texts {
        if !distinct.contains(t) {
            distinct.push(t.clone());
        }
    }
    assert_eq!(
        distinct,
        ["1:m0", "2:m1", "3:m2"],
        "in order, each after its predecessor's state (sent: {texts:?})"
    );
    assert!(
        texts.len() <= 5,
        "repeats only from the send window (a lease lost between a send and its record): {texts:?}"
    );
    assert_eq!(handler.max_concurrency_per_chat(), 1, "one turn at a time");
    f.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_data_loss_under_a_held_turn_keeps_the_chats_order() {
    data_loss_under_a_held_turn(LossBackend::Memory(MemoryHub::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_flushall_under_a_held_turn_keeps_the_chats_order() {
    let redis = botfleet_testkit::RedisServer::start().unwrap();
    data_loss_under_a_held_turn(LossBackend::Redis(redis)).await;
}

/// The coordinator loses everything while a slow handler (slower than the loss's grace
/// window) runs a chat's turn: its worker registers again, and the turn is others' — this
/// worker's newer tasks' or another worker's. The handler call of the lost turn is given up
/// when the worker registers again (so the chat's next holder never runs beside it) and its
/// answer is never sent: the earlier registration's task acts on nothing, though the new
/// registration's lease is safe. Every message is answered once, in order.
async fn a_turn_lost_to_a_new_registration(backend: LossBackend) {
    // The handler takes far past the grace window (the lease, 1.5 s) and the registrations
    // that follow the loss.
    let token = "4747:lost-turn";
    let f = backend
        .fleet("lost-turn", token, Duration::from_secs(6))
        .await;
    let (store, fake, handler, bot) = (&f.store, &f.fake, &f.handler, &f.bot);
    fake.state().user_writes(token, 92, "m0");
    wait_for("m0 in the handler", Duration::from_secs(10), || async {
        (handler.calls() == 1).then_some(())
    })
    .await;
    backend.lose_and_reregister().await;
    fake.state().user_writes(token, 92, "m1");
    wait_for("the journal settles", Duration::from_secs(40), || async {
        let pending = store.inbox_pending(bot, 10).await.unwrap().len();
        (pending == 0 && handler.calls() >= 3).then_some(())
    })
    .await;
    assert_eq!(
        handler.max_concurrency_per_chat(),
        1,
        "the lost turn's handler call ran beside the next holder's: {:?}",
        handler.overlaps()
    );
    let texts: Vec<String> = fake.state().sent().into_iter().map(|s| s.text).collect();
    assert_eq!(
        texts,
        ["1:m0", "2:m1"],
        "each once, in order: the lost turn's answer is never sent"
    );
    f.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_lost_to_a_hub_data_loss_is_given_up_mid_handler() {
    a_turn_lost_to_a_new_registration(LossBackend::Memory(MemoryHub::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_lost_to_a_redis_flushall_is_given_up_mid_handler() {
    let redis = botfleet_testkit::RedisServer::start().unwrap();
    a_turn_lost_to_a_new_registration(LossBackend::Redis(redis)).await;
}

/// WhatsApp Cloud's 24-hour window as the fleet keeps it: a desk's free text to a user the
/// fleet knows last wrote more than a day ago is refused at once with the reason, without
/// asking WhatsApp; a template goes; a location the user shares (a kind no handler gets)
/// opens the window again, and free text goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whatsapp_free_text_past_the_known_window_is_refused_before_whatsapp() {
    const USER: &str = "4917077";
    let (_dir, store) = store().await;
    let graph = botfleet_testkit::FakeGraph::start().await.unwrap();
    let g = graph.state().clone();
    g.add_number(WA_NUMBER, WA_ACCESS, WA_SECRET);
    g.keep_window(WA_NUMBER);
    let handler = botfleet_testkit::RecordingHandler::start().await;
    let mut spec = BotSpec::new(BotId::new("wa-win").unwrap(), Platform::Whatsapp, WA_ACCESS);
    spec.options.api_url = Some(graph.url());
    spec.options.phone_number_id = Some(WA_NUMBER.into());
    spec.hook.secret = Some(Secret::new(WA_SECRET));
    spec.hook.verify_token = Some(Secret::new("verify-me"));
    spec.handler = HandlerSpec::Webhook {
        url: handler.url(),
        secret: None,
    };
    let (proxy, workers) = behind_balancer(&store, spec.clone(), &["a"]).await;
    g.subscribe(WA_NUMBER, &format!("{}/hooks/whatsapp/wa-win", proxy.url()));
    // The user last wrote 25 hours ago, as the fleet and WhatsApp know.
    let day_ago = botfleet_core::unix_ms() - 25 * 3_600_000;
    store
        .chat_seen(&spec.id, &[(USER.to_owned(), day_ago)])
        .await
        .unwrap();
    g.user_wrote_ago(WA_NUMBER, USER, Duration::from_secs(25 * 3_600));
    let sends = workers[0].sends.clone();
    let send = |key: &'static str, body: serde_json::Value| {
        let (sends, store, spec) = (sends.clone(), store.clone(), spec.clone());
        async move {
            wait_for("the send taken", Duration::from_secs(20), || async {
                sends.submit(&spec, USER, key, &body.to_string()).await.ok()
            })
            .await;
            wait_for("the send ended", Duration::from_secs(30), || async {
                let e = store
                    .inbox_entry(&spec.id, &botfleet_store::send_key(key))
                    .await
                    .ok()??;
                (e.state != botfleet_store::InboxState::Pending).then_some(e)
            })
            .await
        }
    };
    let late = send("late", serde_json::json!({"text": "too late"})).await;
    assert_eq!(late.state, botfleet_store::InboxState::Undeliverable);
    let why = late.error.unwrap_or_default();
    assert!(why.contains(botfleet_core::OUTSIDE_WINDOW), "{why}");
    assert_eq!(
        (g.window_refusals(), g.sent_count()),
        (0, 0),
        "refused by the fleet: WhatsApp was not asked"
    );
    let tpl = send(
        "tpl",
        serde_json::json!({"actions": [{"type": "template", "name": "welcome_back",
                                        "language": "de"}]}),
    )
    .await;
    assert_eq!(tpl.state, botfleet_store::InboxState::Done);
    assert_eq!(
        g.sent().last().and_then(|s| s.template.clone()),
        Some(("welcome_back".to_owned(), "de".to_owned()))
    );
    // The user shares a location: no handler gets it, but the window is open again.
    g.user_shares_location(WA_NUMBER, USER);
    until("the location delivered", 20, || g.undelivered() == 0).await;
    let again = send("again", serde_json::json!({"text": "welcome back"})).await;
    assert_eq!(again.state, botfleet_store::InboxState::Done, "{again:?}");
    assert_eq!(g.sent().last().unwrap().text, "welcome back");
    assert_eq!(g.window_refusals(), 0);
    assert!(handler.seen().is_empty(), "a location reaches no handler");
    for w in workers {
        w.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telegram_held_turns_keep_no_task_each_by_webhook() {
    let f = TelegramHooksFixture {
        fake: FakeTelegram::start().await.unwrap(),
    };
    botfleet_testkit::webhook_suite::held_turns_keep_no_task_each_by_webhook(&f).await;
}

/// With more than one coordination group, a chat's turn is held under its own group's part of
/// the lease: when that group loses its data (its keys deleted, as its own node restarted
/// empty would) and is joined again, the turn's holder gives its handler up and acts on
/// nothing — the chat's messages are answered again, once each and in order, under the new
/// incarnation — while a chat of another group is answered on the same worker meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_of_a_group_that_lost_its_data_is_given_up_and_others_go_on() {
    let redis = botfleet_testkit::RedisServer::start().unwrap();
    // A handler that holds the first message until thawed, then answers it "late:".
    let token = "4646:group-token";
    let (_dir, store, fake, Hanging { thaw, given_up, .. }) = hanging_bot("groupy", token).await;
    let ca = redis.coordinator_in_groups(8).await.unwrap();
    let cb = redis.coordinator_in_groups(8).await.unwrap();
    let ks = ca.keyspace().clone();
    // Two chats in two groups, neither the roster's.
    let group_of = |chat: i64| ks.group_of_chat(&format!("groupy/{chat}"));
    let lost_chat = (1..)
        .find(|c| group_of(*c) != botfleet_coord::Group::ZERO)
        .unwrap();
    let g = group_of(lost_chat);
    let other_chat = (1..)
        .find(|c| ![botfleet_coord::Group::ZERO, g].contains(&group_of(*c)))
        .unwrap();
    let lease = Duration::from_secs(3);
    let cfg = |name: &str| {
        let mut c = config(name, "http://127.0.0.1:9");
        c.lease = lease;
        c
    };
    let a = start(cfg("a"), ca.clone(), store.clone()).await;
    let b = start(cfg("b"), cb.clone(), store.clone()).await;
    until("the webhook is set", 10, || {
        fake.state().webhook(token).is_some()
    })
    .await;
    let (a_hook, b_hook) = (
        format!("{}/hooks/telegram/groupy", a.hooks_url),
        format!("{}/hooks/telegram/groupy", b.hooks_url),
    );
    acknowledged_at_last(&a_hook, 1, lost_chat, "one").await;
    // b's message waits behind a's turn.
    assert_eq!(post_update(&b_hook, 2, lost_chat, "two").await, 200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        fake.state().sent_count(),
        0,
        "the second waits for the first"
    );
    // The chat's group loses its data; a finds it lost and joins it again.
    let joined = ca.registration_in(g).unwrap().1;
    let deleted = redis.delete_keys(&format!("{}*", ks.group_tag(g))).unwrap();
    assert!(deleted > 0, "the group had keys");
    until("a joins the lost group again", 10, || {
        ca.registration_in(g).is_some_and(|(_, inc)| inc != joined)
    })
    .await;
    // A chat of another group is answered by a meanwhile, at its first delivery.
    assert_eq!(
        post_update(&a_hook, 3, other_chat, "elsewhere").await,
        200,
        "a takes a chat of a group it still holds"
    );
    until("the other group's chat is answered", 10, || {
        fake.state().sent().iter().any(|s| s.text == "re:elsewhere")
    })
    .await;
    // The lost group's chat: answered again under the new incarnation, in order.
    let in_lost = || -> Vec<String> {
        fake.state()
            .sent()
            .into_iter()
            .filter(|s| s.chat_id == lost_chat.to_string())
            .map(|s| s.text)
            .collect()
    };
    until("the lost group's chat is answered", 20, || {
        in_lost().len() >= 2
    })
    .await;
    assert_eq!(in_lost(), ["re:one", "re:two"], "once each, in order");
    // The turn's holder gave its handler call up once its group's part of the lease was
    // revoked: not left working on the chat beside the turn's new holder.
    until("the lost group's handler call is given up", 10, || {
        given_up.load(std::sync::atomic::Ordering::SeqCst)
    })
    .await;
    // The handler answers at last: nothing is sent, no state written.
    thaw.notify_waiters();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        in_lost(),
        ["re:one", "re:two"],
        "the given-up turn acted on nothing"
    );
    let v = store
        .turn_view(&BotId::new("groupy").unwrap(), "1", &lost_chat.to_string())
        .await
        .unwrap();
    assert!(
        !v.state.unwrap_or_default().contains("late"),
        "the given-up turn's state was not written"
    );
    assert_eq!(fake.state().sent_count(), 3);
    a.shutdown().await;
    b.shutdown().await;
}
