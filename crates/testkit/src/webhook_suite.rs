//! The webhook half of the connector suite: what every platform's webhook mode must do
//! (Telegram `webhook`, Slack `events`, WhatsApp `cloud`), written once and run against each
//! platform's fake. Three workers on the in-memory hub behind a round-robin proxy (the load
//! balancer); the platform delivers to `/hooks/{platform}/{bot}` on whichever worker the
//! proxy picks.

use std::{collections::HashMap, sync::Arc, time::Duration};

use botfleet_coord::{Coordinator, MemoryHub};
use botfleet_core::{BotSpec, WorkerId};
use botfleet_runtime::{Metrics, Worker, WorkerConfig};
use botfleet_store::Store;
use botfleet_telegram::TelegramConfig;
use tokio::{sync::oneshot, task::JoinHandle};

use crate::{wait_for, RoundRobinProxy, StateHandler, TempDir};

/// A worker's settings for the suite: short lease and refresh; Telegram webhooks registered
/// under `public_url`.
pub fn config(name: &str, public_url: &str) -> WorkerConfig {
    let mut c = WorkerConfig::new(WorkerId::new(name).expect("worker id"));
    c.lease = Duration::from_millis(1500);
    c.reconcile_every = Duration::from_millis(200);
    c.registry_refresh = Duration::from_millis(300);
    c.telegram = TelegramConfig {
        poll_timeout: Duration::from_secs(2),
        request_slack: Duration::from_secs(3),
        public_url: Some(public_url.to_owned()),
        ..TelegramConfig::default()
    };
    c
}

/// A worker serving its hooks address.
pub struct HookWorker {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    http: JoinHandle<()>,
    api: JoinHandle<()>,
    /// Its hooks address (`http://127.0.0.1:port`).
    pub hooks_url: String,
    /// Where its API's file links are served (`http://127.0.0.1:port`).
    pub api_url: String,
    /// Its file links (to point them at a balancer).
    pub files: botfleet_runtime::Files,
    /// Its metrics.
    pub metrics: Arc<Metrics>,
    /// Sends from the backend through it.
    pub sends: botfleet_runtime::Sends,
    /// Its coordinator handle on the hub, when it is on one (what [`HookWorker::crash`]
    /// fails).
    hub: Option<(MemoryHub, botfleet_coord::MemoryCoordinator)>,
}

impl HookWorker {
    /// SIGTERM: drains and waits for it (at most 10 s).
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(10), &mut self.task)
            .await
            .expect("drains in time")
            .expect("the worker task");
        self.http.abort();
        self.api.abort();
    }

    /// Gone without a word (the process died): its tasks end where they are.
    pub fn abort(self) {
        self.task.abort();
        self.http.abort();
        self.api.abort();
    }

    /// Dies as a process does (kill -9): [`HookWorker::abort`], and every call of its
    /// coordinator handle fails from now on, so a turn it had spawned cannot act once its
    /// lease is unsafe (a dead process's turns do nothing at all; its liveness lasts until
    /// its lease ends, as its Redis key would).
    pub fn crash(mut self) {
        if let Some((hub, coord)) = self.hub.take() {
            hub.crash(&coord);
        }
        self.abort();
    }
}

/// Starts a worker on `coord` and `store`, its hooks address on a free loopback port.
pub async fn start(
    cfg: WorkerConfig,
    coord: Arc<dyn Coordinator>,
    store: Arc<dyn Store>,
) -> HookWorker {
    let mut w = Worker::new(cfg, coord, store).expect("worker");
    let metrics = w.metrics();
    let router = w.hooks().router();
    let sends = w.sends();
    let addr = "127.0.0.1:0".parse().expect("address");
    let (addr, http) = botfleet_runtime::http::serve_router(addr, router)
        .await
        .expect("hooks address");
    let files = w.files();
    let (api_addr, api) = botfleet_runtime::http::serve_router(
        "127.0.0.1:0".parse().expect("address"),
        files.router().merge(w.replies().router()),
    )
    .await
    .expect("API address");
    let api_url = format!("http://{api_addr}");
    files.set_public_url(&api_url);
    let (tx, rx) = oneshot::channel();
    let task = tokio::spawn(async move {
        w.run(async {
            let _ = rx.await;
        })
        .await
        .expect("the worker runs");
    });
    HookWorker {
        stop: Some(tx),
        task,
        http,
        api,
        hooks_url: format!("http://{addr}"),
        api_url,
        files,
        metrics,
        sends,
        hub: None,
    }
}

/// Workers `names` on one in-memory hub and `store`, registering webhooks under `public`.
pub async fn fleet(
    names: &[&str],
    hub: &MemoryHub,
    store: &Arc<dyn Store>,
    public: &str,
) -> Vec<HookWorker> {
    let mut out = Vec::new();
    for name in names {
        let coord = hub.coordinator();
        let mut w = start(config(name, public), Arc::new(coord.clone()), store.clone()).await;
        w.hub = Some((hub.clone(), coord));
        out.push(w);
    }
    out
}

/// Waits (10 ms steps) until `f` holds, or fails naming `what`.
pub async fn until(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    wait_for(what, Duration::from_secs(secs), || {
        let ok = f();
        async move { ok.then_some(()) }
    })
    .await;
}
/// A webhook platform's fake, as the shared suite drives it.
#[async_trait::async_trait]
pub trait WebhookFixture: Send + Sync {
    /// The platform's path segment and the bot's id: deliveries go to `/hooks/{0}/{1}`.
    fn path(&self) -> (&'static str, &'static str);
    /// The bot, registered on the fake, answering through `handler`.
    fn bot(&self, handler: &str) -> BotSpec;
    /// Points the platform's deliveries at `hook` (Telegram: waits for the unit's setWebhook).
    async fn subscribe(&self, hook: &str);
    /// A user writes `text` in chat `chat`.
    fn user_writes(&self, chat: usize, text: &str);
    /// The replies, as (chat, text), in the order the platform received them.
    fn replies(&self) -> Vec<(String, String)>;
    /// Whether every delivery got its 2xx.
    fn settled(&self) -> bool;
    /// A delivery signed with the wrong secret.
    fn forged(&self, http: &reqwest::Client, hook: &str) -> reqwest::RequestBuilder;
    /// Paces the edits of each message as the platform does (a 429 with the wait left to an
    /// edit within `every` of the message's last change); false where the fake cannot.
    fn pace_edits(&self, _every: Duration) -> bool {
        false
    }
    /// Edits answered 429 for that pace.
    fn edits_paced(&self) -> u64 {
        0
    }
    /// The edits of the bot's messages the platform took, as (chat, text), in order.
    fn edits(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    /// A user uses the bot's command `/name args` in chat `chat`; false where the platform
    /// (or its fake) has no commands to give this way.
    fn user_commands(&self, _chat: usize, _name: &str, _args: &str) -> bool {
        false
    }
    /// A user writes `text` in chat `chat`, then edits it to `edited`; false where the
    /// platform tells no edits.
    fn user_writes_then_edits(&self, _chat: usize, _text: &str, _edited: &str) -> bool {
        false
    }
    /// Every message the bot sent, as the platform shows it now; empty where the fake does
    /// not keep them.
    fn shown(&self) -> Vec<crate::Shown> {
        Vec::new()
    }
    /// A user presses the button with wire value `value` under the bot's message
    /// `message_id` in chat `chat`; false where there is no such button.
    fn user_presses(&self, _chat: usize, _message_id: &str, _value: &str) -> bool {
        false
    }
    /// A user sends a photo (with `caption`) in chat `chat`; false where the platform's
    /// webhook mode takes no files.
    fn user_sends_photo(&self, _chat: usize, _data: Vec<u8>, _caption: &str) -> bool {
        false
    }
    /// The files the bot uploaded, in order.
    fn files_sent(&self) -> Vec<crate::connector_suite::FileOut> {
        Vec::new()
    }
    /// How many times the bot showed typing.
    fn typing_shown(&self) -> usize {
        0
    }
    /// The platform stops taking the bot's token from now on; false where the fake cannot.
    fn revoke(&self) -> bool {
        false
    }
    /// The platform takes a new token for the bot from now on (the old one is refused),
    /// given to `spec`; false where the fake cannot.
    fn rotate(&self, _spec: &mut BotSpec) -> bool {
        false
    }
    /// A user writes `text` in chat `chat`, made one where the platform streams natively (a
    /// Slack thread); false where the platform has no native streams.
    fn user_writes_where_streams_are_native(&self, _chat: usize, _text: &str) -> bool {
        false
    }
    /// The native streams the bot began, in order: their chats, what they show, and whether
    /// they still stream.
    fn native_streams(&self) -> Vec<(String, String, bool)> {
        Vec::new()
    }
}

/// A fresh registry with the fixture's bot answering through `handler`, and workers `names`
/// on one hub behind a round-robin proxy (the balancer).
async fn behind_proxy(
    f: &impl WebhookFixture,
    handler: &str,
    names: &[&str],
) -> (TempDir, Arc<dyn Store>, RoundRobinProxy, Vec<HookWorker>) {
    behind_proxy_as(f.bot(handler), names).await
}

/// [`behind_proxy`] for the fixture's bot as `bot` has it.
async fn behind_proxy_as(
    bot: BotSpec,
    names: &[&str],
) -> (TempDir, Arc<dyn Store>, RoundRobinProxy, Vec<HookWorker>) {
    let (dir, store) = crate::temp_sqlite("botfleet-hooks").await;
    let proxy = RoundRobinProxy::start(Vec::new()).await;
    store.add_bot(&bot).await.expect("the suite");
    let hub = MemoryHub::new();
    let workers = fleet(names, &hub, &store, &proxy.url()).await;
    proxy.set_backends(workers.iter().map(|w| w.hooks_url.clone()).collect());
    (dir, store, proxy, workers)
}

/// Commands and edits delivered by webhook reach the handler as such (see the connector
/// suite's case of the same name): two workers behind the proxy, a recording handler; each
/// event answered once, in order, as what it is, each with an `event_id` of its own.
pub async fn commands_and_edits_by_webhook(f: &impl WebhookFixture) {
    let handler = crate::RecordingHandler::start().await;
    let (_dir, _store, proxy, workers) = behind_proxy(f, &handler.url(), &["a", "b"]).await;
    let (platform, bot) = f.path();
    f.subscribe(&format!("{}/hooks/{platform}/{bot}", proxy.url()))
        .await;
    f.user_writes(1, "hello");
    let mut want = vec!["message:hello".to_owned()];
    if f.user_commands(1, "start", "deep-link") {
        want.push("command:start deep-link".into());
    }
    if f.user_writes_then_edits(1, "teh typo", "the typo") {
        want.push("message:teh typo".into());
        want.push("edited:the typo".into());
    }
    let n = want.len();
    until("every event answered", 20, || {
        f.replies().len() >= n && f.settled()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let got: Vec<String> = f.replies().into_iter().map(|(_, t)| t).collect();
    assert_eq!(got, want, "each event once, in order, as what it is");
    let seen = handler.seen();
    let ids: std::collections::HashSet<&str> = seen
        .iter()
        .filter_map(|e| e["event_id"].as_str())
        .filter(|id| id.starts_with(&format!("{bot}:")))
        .collect();
    assert_eq!(ids.len(), n, "an id of its own for every event: {seen:?}");
    for e in &seen {
        match e["kind"].as_str() {
            Some("command") => assert_eq!(e["command"]["name"], "start"),
            Some("edited") => assert!(e["edited_message_id"].is_string()),
            Some("message") => {}
            other => panic!("kind {other:?} in {e}"),
        }
    }
    for w in workers {
        w.shutdown().await;
    }
}

/// Buttons by webhook, across workers: a send with buttons under a `ref` (one value longer
/// than the platform carries) is answered by one worker, the press by whichever the balancer
/// picks, which finds the handler's own value and the message by its ref in the store and
/// edits it (or, where sent messages cannot change, answers with a message naming the ref); a
/// later turn edits it again by ref. Runs where the mode has buttons.
pub async fn buttons_by_webhook(f: &impl WebhookFixture) {
    use serde_json::{json, Value};
    let probe = f.bot("http://127.0.0.1:9/");
    let caps = crate::connector_suite::caps_of_spec(&probe);
    if !caps.buttons {
        return;
    }
    let edits = caps.edit;
    let long = "V".repeat(usize::from(caps.max_button_value) + 1);
    let long2 = long.clone();
    let most = usize::from(caps.max_buttons);
    let handler = crate::ScriptedHandler::start(move |ev: &Value| {
        match (ev["kind"].as_str(), ev["text"].as_str()) {
            (Some("message"), Some("many")) => {
                // The most buttons the mode shows (a WhatsApp list past three), rows of 5.
                let all: Vec<Value> = (0..most)
                    .map(|i| json!({"text": format!("Option {i}"), "value": format!("opt-{i}")}))
                    .collect();
                let rows: Vec<Value> = all.chunks(5).map(|r| json!(r)).collect();
                json!({"actions": [{"type": "send", "text": "Many", "buttons": rows}]})
            }
            (Some("action"), _) if ev["action"]["value"].as_str().is_some_and(|v| v.starts_with("opt-")) => {
                json!({"actions": [{"type": "send", "text": format!("picked {}", ev["action"]["value"].as_str().unwrap_or(""))}]})
            }
            (Some("message"), Some("menu")) => json!({"actions": [
                {"type": "send", "text": "Choose", "ref": "menu",
                 "buttons": [[{"text": "Long", "value": long2}]]},
            ]}),
            (Some("action"), _) => {
                let text = format!(
                    "chose {} bytes",
                    ev["action"]["value"].as_str().map_or(0, str::len)
                );
                if edits {
                    json!({"actions": [{"type": "edit", "ref": ev["action"]["message_ref"], "text": text}]})
                } else {
                    // Where sent messages cannot change, the press is answered with a new one.
                    json!({"actions": [{"type": "send", "text": format!("{text} on {}", ev["action"]["message_ref"].as_str().unwrap_or("?"))}]})
                }
            }
            (Some("message"), Some("again")) => json!({"actions": [
                {"type": "edit", "ref": "menu", "text": "edited again"},
                {"type": "send", "text": "done"},
            ]}),
            _ => json!({}),
        }
    })
    .await;
    let (_dir, _store, proxy, workers) = behind_proxy(f, &handler.url(), &["a", "b"]).await;
    let (platform, bot) = f.path();
    f.subscribe(&format!("{}/hooks/{platform}/{bot}", proxy.url()))
        .await;
    f.user_writes(1, "menu");
    until("the menu shown", 20, || {
        f.shown().iter().any(|m| m.text == "Choose")
    })
    .await;
    let menu = f.shown().into_iter().find(|m| m.text == "Choose").unwrap();
    assert_eq!(menu.buttons.len(), 1, "{menu:?}");
    assert_ne!(menu.buttons[0], long, "stood in for on the wire");
    assert!(f.user_presses(1, &menu.id, &menu.buttons[0]));
    let chose = format!("chose {} bytes", long.len());
    if !edits {
        let want = format!("{chose} on menu");
        until("the press answered", 20, || {
            f.replies().iter().any(|(_, t)| *t == want) && f.settled()
        })
        .await;
        let sends: Vec<String> = f.replies().into_iter().map(|(_, t)| t).collect();
        assert_eq!(sends, ["Choose".to_owned(), want], "each send once");
        the_most_buttons(f, most).await;
        for w in workers {
            w.shutdown().await;
        }
        return;
    }
    until("the press edits the menu", 20, || {
        f.shown().iter().any(|m| m.id == menu.id && m.text == chose)
    })
    .await;
    f.user_writes(1, "again");
    until("the later turn", 20, || {
        f.replies().iter().any(|(_, t)| t == "done") && f.settled()
    })
    .await;
    let now = f.shown().into_iter().find(|m| m.id == menu.id).unwrap();
    assert_eq!(now.text, "edited again");
    let sends: Vec<String> = f.replies().into_iter().map(|(_, t)| t).collect();
    assert_eq!(sends, ["Choose", "done"], "each send once");
    let press = handler
        .seen()
        .into_iter()
        .find(|e| e["kind"] == "action")
        .unwrap();
    assert_eq!(press["action"]["value"], long.as_str());
    assert_eq!(press["action"]["message_ref"], "menu");
    the_most_buttons(f, most).await;
    for w in workers {
        w.shutdown().await;
    }
}

/// A message with the most buttons the mode shows is shown with all of them, and a press of
/// the last comes back with its value.
async fn the_most_buttons(f: &impl WebhookFixture, most: usize) {
    f.user_writes(1, "many");
    until("the many buttons shown", 20, || {
        f.shown().iter().any(|m| m.text == "Many")
    })
    .await;
    let many = f.shown().into_iter().find(|m| m.text == "Many").unwrap();
    assert_eq!(many.buttons.len(), most, "{many:?}");
    let last = format!("opt-{}", most - 1);
    assert_eq!(many.buttons.last(), Some(&last));
    assert!(f.user_presses(1, &many.id, &last));
    let want = format!("picked {last}");
    until("the last button pressed", 20, || {
        f.replies().iter().any(|(_, t)| *t == want) && f.settled()
    })
    .await;
}

/// Files by webhook, across workers behind balancers (one for the hooks, one for the API): a
/// photo delivered to one worker reaches the handler with a link on the API's balancer,
/// which serves the same bytes from every worker; the handler sends it back by that link,
/// and the platform receives the bytes. Runs where the mode has files.
pub async fn files_by_webhook(f: &impl WebhookFixture) {
    use serde_json::{json, Value};
    let probe = f.bot("http://127.0.0.1:9/");
    if !crate::connector_suite::caps_of_spec(&probe).files {
        return;
    }
    let handler =
        crate::ScriptedHandler::start(|ev: &Value| match ev["attachments"][0]["url"].as_str() {
            Some(url) => json!({"actions": [{"type": "send", "text": "back to you",
                "attachments": [{"url": url, "name": "back.jpg"}]}]}),
            None => json!({}),
        })
        .await;
    let (_dir, _store, proxy, workers) = behind_proxy(f, &handler.url(), &["a", "b"]).await;
    let api = RoundRobinProxy::start(workers.iter().map(|w| w.api_url.clone()).collect()).await;
    for w in &workers {
        w.files.set_public_url(&api.url());
    }
    let (platform, bot) = f.path();
    f.subscribe(&format!("{}/hooks/{platform}/{bot}", proxy.url()))
        .await;
    let photo: Vec<u8> = (0..40_000u32).map(|i| (i * 7 % 256) as u8).collect();
    assert!(
        f.user_sends_photo(1, photo.clone(), "look"),
        "a mode with files takes them"
    );
    let sent = wait_for("the photo sent back", Duration::from_secs(20), || async {
        f.files_sent().into_iter().next()
    })
    .await;
    assert!(sent.data == photo, "the bytes as the user sent them");
    let ev = handler.first_with_attachments();
    assert_eq!(ev["text"], "look");
    let url = ev["attachments"][0]["url"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(url.starts_with(&api.url()), "{url}");
    for _ in 0..2 {
        let r = reqwest::get(&url).await.expect("the link answers");
        assert_eq!(r.status().as_u16(), 200);
        assert!(r.bytes().await.expect("a body").to_vec() == photo);
    }
    assert_eq!(
        api.served().len(),
        2,
        "both workers served the link: {:?}",
        api.served()
    );
    for w in workers {
        w.shutdown().await;
    }
}

/// A long turn by webhook (see the connector suite's case of the same kind): two workers
/// behind the proxy; a call past the bot's 3 s `handler_timeout_s` comes again as attempt 2
/// with the same `event_id`, whose answer is sent once; typing shows meanwhile where the
/// mode has it.
pub async fn long_turns_by_webhook(f: &impl WebhookFixture) {
    let handler = crate::connector_suite::long_turn_handler().await;
    let mut bot = f.bot(&handler.url());
    let caps = crate::connector_suite::caps_of_spec(&bot);
    bot.options.handler_timeout_s = Some(3);
    let (_dir, _store, proxy, workers) = behind_proxy_as(bot, &["a", "b"]).await;
    let (platform, id) = f.path();
    f.subscribe(&format!("{}/hooks/{platform}/{id}", proxy.url()))
        .await;
    f.user_writes(0, "think");
    until("the answer", 30, || {
        f.replies().iter().any(|(_, t)| t == "thought it over")
    })
    .await;
    crate::connector_suite::called_as_two_attempts(&handler);
    let replies: Vec<String> = f.replies().into_iter().map(|(_, t)| t).collect();
    assert_eq!(replies, ["thought it over"], "once: {replies:?}");
    assert_eq!(
        f.typing_shown() >= 1,
        caps.typing,
        "typing shows while the handler runs, where the mode has it"
    );
    for w in workers {
        w.shutdown().await;
    }
}

/// Which of `workers` holds a turn open for a later answer.
fn holding(workers: &[HookWorker]) -> Option<usize> {
    workers.iter().position(|w| w.metrics.turns_held_now() == 1)
}

/// A later answer by webhook (see the connector suite's case): two workers behind the proxy;
/// a handler answers `202` with a reply token in its request; the chat's next message waits,
/// another chat goes on. The worker holding the turn dies: the survivor takes the held turn
/// over without calling the handler again, and when the bot's 10 s `async_reply_ttl_s` has
/// passed the event ends undeliverable (`async reply expired`) and the next message is
/// answered.
pub async fn later_answers_by_webhook(f: &impl WebhookFixture) {
    let handler = crate::connector_suite::later_handler().await;
    let mut bot = f.bot(&handler.url());
    bot.options.async_reply_ttl_s = Some(10);
    let (_dir, store, proxy, mut workers) = behind_proxy_as(bot.clone(), &["a", "b"]).await;
    let (platform, id) = f.path();
    f.subscribe(&format!("{}/hooks/{platform}/{id}", proxy.url()))
        .await;
    f.user_writes(0, "later");
    until("the turn held", 20, || holding(&workers).is_some()).await;
    let held_at = tokio::time::Instant::now();
    f.user_writes(0, "next");
    f.user_writes(1, "other");
    until("the other chat answered", 10, || {
        f.replies().iter().any(|(_, t)| t == "other")
    })
    .await;
    // Held by one worker (a worker starved past its lease on busy cores lets the turn go
    // for a moment, and it is held again).
    let holder = crate::wait_for(
        "one worker holds the turn",
        Duration::from_secs(10),
        || async { holding(&workers) },
    )
    .await;
    workers.remove(holder).crash();
    proxy.set_backends(workers.iter().map(|w| w.hooks_url.clone()).collect());
    until("the next message answered", 40, || {
        f.replies().iter().any(|(_, t)| t == "next")
    })
    .await;
    let waited = held_at.elapsed();
    assert!(
        waited >= Duration::from_secs(8),
        "the chat's next message was answered {waited:?} into a 10 s hold"
    );
    crate::connector_suite::expired_once(&handler, store.as_ref(), &bot.id).await;
    let replies: Vec<String> = f.replies().into_iter().map(|(_, t)| t).collect();
    let mut sorted = replies.clone();
    sorted.sort();
    assert_eq!(sorted, ["next", "other"], "once each: {replies:?}");
    let text = workers[0].metrics.render("survivor");
    assert!(
        text.lines()
            .any(|l| l.starts_with("botfleet_async_expired_total{") && l.ends_with(" 1")),
        "{text}"
    );
    for w in workers {
        w.shutdown().await;
    }
}

/// A webhook bot's held turns are kept as data, not as a task each: 100 chats' turns held
/// open (the handler answered `202`) on two workers behind the proxy add next to no task to
/// the runtime (fewer than a quarter of them) (each kept the task of its ticket before), and each is still finished by its
/// last part, posted through either worker's API, and only then is its chat's next message
/// answered.
pub async fn held_turns_keep_no_task_each_by_webhook(f: &impl WebhookFixture) {
    const CHATS: usize = 100;
    let handler = crate::connector_suite::later_handler().await;
    let mut bot = f.bot(&handler.url());
    // No typing: a held turn's looks (and the connections they open) are not counted.
    bot.options.typing = Some(false);
    let (_dir, store, proxy, workers) = behind_proxy_as(bot.clone(), &["a", "b"]).await;
    let (platform, id) = f.path();
    f.subscribe(&format!("{}/hooks/{platform}/{id}", proxy.url()))
        .await;
    let tasks = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    let held = || {
        workers
            .iter()
            .map(|w| w.metrics.turns_held_now())
            .sum::<u64>()
    };
    // A burst answered at once first: the connections a burst of deliveries opens (the
    // platform's, the proxy's) are open before the count.
    for chat in 0..CHATS {
        f.user_writes(chat, "hi");
    }
    until("the first burst answered", 60, || {
        f.replies().iter().filter(|(_, t)| t == "hi").count() == CHATS
    })
    .await;
    crate::connector_suite::all_over(store.as_ref(), &bot.id).await;
    let before = tasks();
    for chat in 0..CHATS {
        f.user_writes(chat, "ask");
    }
    until("every turn held", 60, || held() == CHATS as u64).await;
    // (The tasks that held them may take a moment to end on busy cores; a held turn that
    // kept its task would keep it until its answer.)
    crate::wait_for(
        "fewer tasks than a quarter of the held turns",
        Duration::from_secs(20),
        || async { (tasks() < before + CHATS / 4).then_some(()) },
    )
    .await;
    assert_eq!(held(), CHATS as u64);
    // The next message of each chat waits behind its held turn.
    for chat in 0..CHATS {
        f.user_writes(chat, "next");
    }
    let tokens: Vec<String> =
        crate::wait_for("every chat asked", Duration::from_secs(20), || async {
            let seen: Vec<String> = handler
                .seen()
                .iter()
                .filter(|e| e["text"] == "ask")
                .filter_map(|e| e["reply_token"].as_str().map(str::to_owned))
                .collect();
            (seen.len() == CHATS).then_some(seen)
        })
        .await;
    assert!(
        !f.replies().iter().any(|(_, t)| t == "next"),
        "a next message was answered while its chat's turn was held"
    );
    let last = serde_json::json!({"actions": [{"type": "send", "text": "done"}], "final": true});
    for (i, token) in tokens.iter().enumerate() {
        let api = &workers[i % workers.len()].api_url;
        let (status, answer) = crate::connector_suite::post_part(api, token, "last", &last).await;
        assert_eq!(status, 202, "{answer}");
    }
    until("every held turn finished, then the next", 60, || {
        let replies = f.replies();
        let count = |text: &str| replies.iter().filter(|(_, t)| t == text).count();
        count("done") == CHATS && count("next") == CHATS && held() == 0
    })
    .await;
    // Each chat: its held turn's answer, then its next message's, once each.
    let mut by_chat: std::collections::HashMap<String, Vec<String>> = Default::default();
    for (chat, text) in f.replies() {
        by_chat.entry(chat).or_default().push(text);
    }
    assert_eq!(by_chat.len(), CHATS);
    for (chat, texts) in &by_chat {
        assert_eq!(texts, &["hi", "done", "next"], "chat {chat}");
    }
    for w in workers {
        w.shutdown().await;
    }
}

/// The registry's directory, the store, the proxy, the workers, the bot and a held turn's
/// reply token (see [`asked_and_held`]).
type Held = (
    TempDir,
    Arc<dyn Store>,
    RoundRobinProxy,
    Vec<HookWorker>,
    BotSpec,
    String,
);

/// Two workers behind the proxy running `f`'s bot (its `stream` as given), answered by
/// `handler` (the connector suite's `later_handler`); "ask" written in chat 0 and its turn
/// held.
async fn asked_and_held(
    f: &impl WebhookFixture,
    handler: &crate::ScriptedHandler,
    stream: botfleet_core::StreamMode,
) -> Held {
    let asked = asked_and_held_by(f, handler, stream, || {
        f.user_writes(0, "ask");
        true
    });
    asked.await.expect("every fixture writes")
}

/// [`asked_and_held`], "ask" written by `ask`; `None` (the workers stopped) when `ask` could
/// not write it (the fixture cannot).
async fn asked_and_held_by(
    f: &impl WebhookFixture,
    handler: &crate::ScriptedHandler,
    stream: botfleet_core::StreamMode,
    ask: impl FnOnce() -> bool,
) -> Option<Held> {
    let mut bot = f.bot(&handler.url());
    bot.options.stream = Some(stream);
    let (dir, store, proxy, workers) = behind_proxy_as(bot.clone(), &["a", "b"]).await;
    let (platform, id) = f.path();
    f.subscribe(&format!("{}/hooks/{platform}/{id}", proxy.url()))
        .await;
    if !ask() {
        for w in workers {
            w.shutdown().await;
        }
        return None;
    }
    until("the turn held", 20, || holding(&workers).is_some()).await;
    let token = crate::connector_suite::asked_token(handler, "ask").await;
    Some((dir, store, proxy, workers, bot, token))
}

/// A later answer in parts by webhook: two workers behind the proxy; the worker holding the
/// turn is killed right after its handler answered `202`; three parts posted through the
/// survivor's API go out once, in order, and the chat's next message is answered after the
/// last, with the state the parts left.
pub async fn later_parts_by_webhook(f: &impl WebhookFixture) {
    let handler = crate::connector_suite::later_handler().await;
    let (_dir, store, proxy, mut workers, bot, token) =
        asked_and_held(f, &handler, botfleet_core::StreamMode::Native).await;
    let holder = holding(&workers).expect("a worker holds the turn");
    workers.remove(holder).crash();
    proxy.set_backends(workers.iter().map(|w| w.hooks_url.clone()).collect());
    f.user_writes(0, "next");
    // The survivor takes the held turn over (once the dead worker's lease ended), without
    // calling the handler again.
    until("the held turn taken over", 20, || {
        workers[0].metrics.turns_held_now() == 1
    })
    .await;
    crate::connector_suite::post_three_parts(&workers[0].api_url, &token).await;
    let next = crate::connector_suite::NEXT_AFTER_PARTS;
    until("the next message answered", 30, || {
        f.replies().iter().any(|(_, t)| t == next)
    })
    .await;
    crate::connector_suite::all_over(store.as_ref(), &bot.id).await;
    let replies: Vec<String> = f.replies().into_iter().map(|(_, t)| t).collect();
    assert_eq!(replies, ["one", "two", "three", next], "{replies:?}");
    let asked = handler.seen().iter().filter(|e| e["text"] == "ask").count();
    assert_eq!(asked, 1, "the handler was called again");
    assert!(
        store
            .inbox_pending(&bot.id, 10)
            .await
            .expect("inbox")
            .is_empty(),
        "nothing left pending"
    );
    for w in workers {
        w.shutdown().await;
    }
}

/// A later answer streamed by webhook (see the connector suite's case), through both
/// workers' APIs, on a fake that paces a message's edits as the platform does: a send, then
/// 50 parts in 5 s each editing it, the last final; the worker holding the turn is killed
/// halfway. The survivor takes the held turn over and the stream goes on: the platform gets
/// at most 7 edits, in order, none refused for the pace, ending on the exact final text, and
/// the chat's next message is answered after it. The bot's `stream` is `edits`. Runs where
/// the fake paces edits.
pub async fn streamed_parts_by_webhook(f: &impl WebhookFixture) {
    use crate::connector_suite::{post_stream_part, STREAM_EDITS, STREAM_FINAL as FINAL};
    if !f.pace_edits(Duration::from_secs(1)) {
        return;
    }
    let handler = crate::connector_suite::later_handler().await;
    let (_dir, store, proxy, mut workers, bot, token) =
        asked_and_held(f, &handler, botfleet_core::StreamMode::Edits).await;
    post_stream_part(&workers[0].api_url, &token, 0).await;
    let parts = usize::try_from(STREAM_EDITS).unwrap_or(0);
    post_parts_killing_the_holder(&mut workers, &proxy, &token, parts, 100, |i| {
        let k = i as u64 + 1;
        (format!("s{k}"), crate::connector_suite::stream_part(k))
    })
    .await;
    f.user_writes(0, "next");
    until("the next message answered", 40, || {
        let shown = f.edits().iter().any(|(_, t)| t == FINAL);
        let next = f.replies().iter().any(|(_, t)| t == "next");
        assert!(
            !next || shown,
            "the turn ended before its final text was shown"
        );
        next
    })
    .await;
    crate::connector_suite::all_over(store.as_ref(), &bot.id).await;
    let edits: Vec<String> = f.edits().into_iter().map(|(_, t)| t).collect();
    crate::connector_suite::paced_to_the_final_text(&edits, f.edits_paced());
    let replies: Vec<String> = f.replies().into_iter().map(|(_, t)| t).collect();
    assert_eq!(replies, ["…", "next"], "{replies:?}");
    let asked = handler.seen().iter().filter(|e| e["text"] == "ask").count();
    assert_eq!(asked, 1, "the handler was called again");
    for w in workers {
        w.shutdown().await;
    }
}

/// Posts the parts `part(k)` (its idempotency key and body) for `k` in `0..n` to the held
/// turn `token`, `every_ms` apart, through one worker's API then the other's; at part `n / 2`
/// the worker holding the turn is killed and the balancer left with the survivor, which takes
/// the rest. Each must be taken (`202`).
async fn post_parts_killing_the_holder(
    workers: &mut Vec<HookWorker>,
    proxy: &RoundRobinProxy,
    token: &str,
    n: usize,
    every_ms: u64,
    part: impl Fn(usize) -> (String, serde_json::Value),
) {
    let apis: Vec<String> = workers.iter().map(|w| w.api_url.clone()).collect();
    let start = tokio::time::Instant::now();
    let mut dead: Option<usize> = None;
    for k in 0..n {
        tokio::time::sleep_until(start + Duration::from_millis(every_ms * k as u64)).await;
        if k == n / 2 {
            let holder = holding(workers).expect("a worker holds the turn");
            workers.remove(holder).crash();
            proxy.set_backends(workers.iter().map(|w| w.hooks_url.clone()).collect());
            dead = Some(holder);
        }
        // Through one worker, then the other (only the survivor once one is dead).
        let api = match dead {
            Some(d) => &apis[1 - d],
            None => &apis[k % 2],
        };
        let (key, body) = part(k);
        let (status, answer) = crate::connector_suite::post_part(api, token, &key, &body).await;
        assert_eq!(status, 202, "part {k}: {answer}");
    }
}

/// A streamed answer by webhook in a chat where the platform streams natively (a Slack
/// thread, a Telegram private chat; see the connector suite's case): a send with a ref, then parts extending it through both workers'
/// APIs, the worker holding the turn killed halfway. The survivor takes the held turn over
/// and goes on with the same stream: one stream, never an edit, showing the exact final text
/// and ended with the turn, before the chat's next message is answered. Runs where the
/// platform has native streams.
pub async fn a_native_stream_by_webhook(f: &impl WebhookFixture) {
    use serde_json::json;
    let handler = crate::connector_suite::later_handler().await;
    let ask = || f.user_writes_where_streams_are_native(0, "ask");
    let native = botfleet_core::StreamMode::Native;
    let Some((_dir, store, proxy, mut workers, bot, token)) =
        asked_and_held_by(f, &handler, native, ask).await
    else {
        return;
    };
    const PARTS: usize = 16;
    let text = |k: usize| {
        format!(
            "word{}",
            (0..=k).map(|i| format!(" {i}")).collect::<String>()
        )
    };
    post_parts_killing_the_holder(&mut workers, &proxy, &token, PARTS, 150, |k| {
        let action = if k == 0 {
            json!({"type": "send", "text": text(0), "ref": "answer"})
        } else {
            json!({"type": "edit", "ref": "answer", "text": text(k)})
        };
        let body = json!({"actions": [action], "final": k + 1 == PARTS});
        (format!("n{k}"), body)
    })
    .await;
    let last = text(PARTS - 1);
    f.user_writes_where_streams_are_native(0, "next");
    until("the next message answered", 40, || {
        let streams = f.native_streams();
        let ended = streams.len() == 1 && streams[0].1 == last && !streams[0].2;
        let next = f.replies().iter().any(|(_, t)| t == "next");
        assert!(
            !next || ended,
            "the turn ended before its stream: {streams:?}"
        );
        next
    })
    .await;
    crate::connector_suite::all_over(store.as_ref(), &bot.id).await;
    assert!(f.edits().is_empty(), "{:?}", f.edits());
    // Nothing but "next" as a message of its own, and the whole answer where the platform's
    // stream ends as a message.
    let replies: Vec<String> = f.replies().into_iter().map(|(_, t)| t).collect();
    let others: Vec<&String> = replies.iter().filter(|t| **t != last).collect();
    assert_eq!(others, ["next"], "{replies:?}");
    assert!(
        replies.iter().filter(|t| **t == last).count() <= 1,
        "{replies:?}"
    );
    let asked = handler.seen().iter().filter(|e| e["text"] == "ask").count();
    assert_eq!(asked, 1, "the handler was called again");
    for w in workers {
        w.shutdown().await;
    }
}

/// Sends from the backend to a webhook bot, through any worker: each takes its chat's turn
/// (behind the reply in progress), in the order accepted, once (a repeat of a key, through
/// another worker, sends nothing); the worker that accepted one dies at once: another takes
/// its turn over and sends it, once.
pub async fn sends_by_webhook(f: &impl WebhookFixture) {
    let (hook, server) = crate::connector_suite::slow_hook().await;
    let bot = f.bot(&hook);
    let (_dir, store, proxy, mut workers) = behind_proxy_as(bot.clone(), &["a", "b"]).await;
    let (platform, id) = f.path();
    f.subscribe(&format!("{}/hooks/{platform}/{id}", proxy.url()))
        .await;
    // A reply in progress in the chat (its handler takes 1 s) when the sends come.
    f.user_writes(1, "slow-1");
    let chat = wait_for("the message journaled", Duration::from_secs(20), || async {
        let p = store.inbox_pending(&bot.id, 10).await.ok()?;
        p.first().map(|e| e.chat.clone())
    })
    .await;
    let submit = |w: &HookWorker, key: &'static str, text: &'static str| {
        let (sends, bot, chat) = (w.sends.clone(), bot.clone(), chat.clone());
        async move { crate::connector_suite::send_text(&sends, &bot, &chat, key, text).await }
    };
    assert!(submit(&workers[1], "desk-1", "desk 1").await.new);
    assert!(submit(&workers[1], "desk-2", "desk 2").await.new);
    let again = submit(&workers[0], "desk-1", "desk 1").await;
    assert!(!again.new, "a repeat of a key is known on every worker");
    let of_chat = || -> Vec<String> {
        f.replies()
            .into_iter()
            .filter(|(c, _)| *c == chat)
            .map(|(_, t)| t)
            .collect()
    };
    until("the sends out", 20, || of_chat().len() >= 3 && f.settled()).await;
    // A send queued behind a slow turn; the worker that accepted it dies at once: its
    // ticket is taken over.
    f.user_writes(1, "slow-2");
    wait_for("the message journaled", Duration::from_secs(20), || async {
        let p = store.inbox_pending(&bot.id, 10).await.ok()?;
        p.iter().any(|e| e.message.contains("slow-2")).then_some(())
    })
    .await;
    assert!(submit(&workers[0], "desk-3", "desk 3").await.new);
    workers.remove(0).abort();
    until("the send after the death", 30, || of_chat().len() >= 5).await;
    f.user_writes(2, "later");
    until("later work done", 20, || {
        f.replies().iter().any(|(_, t)| t == "later") && f.settled()
    })
    .await;
    assert_eq!(
        of_chat(),
        ["slow-1", "desk 1", "desk 2", "slow-2", "desk 3"]
    );
    for w in workers {
        w.shutdown().await;
    }
    server.abort();
}

/// A token the platform refuses holds its bot's chats, as a failed polling bot's are held:
/// what users write meanwhile waits, in order, behind the refused message, and once the
/// operator replaces the token (the spec alone, no restart) all of it is answered once, in
/// the chat's order, before what is written after. Skipped where the fixture cannot revoke.
pub async fn refused_tokens_hold_their_chats(f: &impl WebhookFixture) {
    let handler = crate::RecordingHandler::start().await;
    let bot = f.bot(&handler.url());
    let (_dir, store, proxy, workers) = behind_proxy_as(bot.clone(), &["a", "b"]).await;
    let (platform, id) = f.path();
    f.subscribe(&format!("{}/hooks/{platform}/{id}", proxy.url()))
        .await;
    let answered = || -> Vec<String> {
        f.replies()
            .into_iter()
            .map(|(_, t)| t)
            .filter(|t| t.starts_with("message:"))
            .collect()
    };
    f.user_writes(0, "first");
    until("the first answer", 20, || answered().len() == 1).await;
    if !f.revoke() {
        for w in workers {
            w.shutdown().await;
        }
        return;
    }
    f.user_writes(0, "m1");
    crate::wait_for("the bot failed", Duration::from_secs(20), || async {
        let rec = store.get_bot(&bot.id).await.ok()??;
        (rec.status == botfleet_core::BotStatus::Failed).then_some(())
    })
    .await;
    f.user_writes(0, "m2");
    until("the deliveries acknowledged", 20, || f.settled()).await;
    let calls = |text: &str| handler.seen().iter().filter(|e| e["text"] == text).count();
    // A window to see nothing in: a held chat calls no handler, so this cannot fail where
    // the chat is held, only show a chat that is not.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        (calls("m1"), calls("m2")),
        (1, 0),
        "the refused message's handler ran once; the one behind it waits its turn"
    );
    let mut spec = bot.clone();
    assert!(f.rotate(&mut spec), "a fixture that revokes rotates too");
    store.update_bot(&spec).await.expect("the registry");
    f.user_writes(0, "m3");
    until("every message answered", 30, || answered().len() >= 4).await;
    crate::wait_for("the entries ended", Duration::from_secs(20), || async {
        let pending = store.inbox_pending(&bot.id, 10).await.ok()?;
        pending.is_empty().then_some(())
    })
    .await;
    assert_eq!(
        answered(),
        ["message:first", "message:m1", "message:m2", "message:m3"],
        "each once, in the chat's order"
    );
    // Answering again under the new token shows: the bot is no longer failed.
    crate::wait_for("the bot running again", Duration::from_secs(20), || async {
        let rec = store.get_bot(&bot.id).await.ok()??;
        (rec.status == botfleet_core::BotStatus::Running).then_some(())
    })
    .await;
    for w in workers {
        w.shutdown().await;
    }
}

/// What the suite leaves for a platform's own checks.
pub struct SuiteRun {
    /// The registry.
    pub store: Arc<dyn Store>,
    /// The three workers.
    pub workers: Vec<HookWorker>,
    /// The bot's hooks URL on the balancer.
    pub hook: String,
    _dir: TempDir,
    _proxy: RoundRobinProxy,
    _handler: StateHandler,
}

/// The suite every webhook platform passes: three workers behind a round-robin proxy; a
/// forged delivery is refused and never handled; each chat's messages are answered once, in
/// order, the conversation state moving with the chat from worker to worker, one turn at a
/// time; every worker takes deliveries.
pub async fn webhook_suite(f: &impl WebhookFixture, chats: usize, each: usize) -> SuiteRun {
    let handler = StateHandler::start(Duration::from_millis(5)).await;
    let (dir, store, proxy, workers) = behind_proxy(f, &handler.url(), &["a", "b", "c"]).await;
    let (platform, bot) = f.path();
    let hook = format!("{}/hooks/{platform}/{bot}", proxy.url());
    let forged = f
        .forged(&reqwest::Client::new(), &hook)
        .send()
        .await
        .expect("the suite");
    assert_eq!(forged.status(), 401, "a forged delivery is refused");
    f.subscribe(&hook).await;
    for round in 0..each {
        for chat in 0..chats {
            f.user_writes(chat, &format!("m{round}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let total = chats * each;
    until("every message answered", 30, || {
        f.replies().len() >= total && f.settled()
    })
    .await;
    // No late duplicates.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let replies = f.replies();
    assert_eq!(replies.len(), total, "each message answered once");
    let mut per_chat: HashMap<String, Vec<String>> = HashMap::new();
    for (chat, text) in replies {
        assert!(!text.contains("forged"), "a forged delivery was handled");
        per_chat.entry(chat).or_default().push(text);
    }
    assert_eq!(per_chat.len(), chats);
    for (chat, texts) in per_chat {
        let want: Vec<String> = (0..each).map(|i| format!("{}:m{i}", i + 1)).collect();
        assert_eq!(
            texts, want,
            "chat {chat}: in order, the count carried across workers"
        );
    }
    assert_eq!(handler.max_concurrency_per_chat(), 1, "one turn at a time");
    let served = proxy.served();
    assert_eq!(served.len(), 3, "every worker took deliveries: {served:?}");
    SuiteRun {
        store,
        workers,
        hook,
        _dir: dir,
        _proxy: proxy,
        _handler: handler,
    }
}

impl SuiteRun {
    /// Shuts every worker down.
    pub async fn shutdown(self) {
        for w in self.workers {
            w.shutdown().await;
        }
    }
}
