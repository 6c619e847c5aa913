//! The connector conformance suite: what every platform must do, written once and run against
//! each platform's fake through [`connector_conformance!`](crate::connector_conformance). It
//! drives the real worker (embedded: the in-memory coordinator, a SQLite registry), so what it
//! proves is what an operator gets.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use botfleet_coord::{Coordinator, MemoryCoordinator, MemoryHub};
use botfleet_core::{BotSpec, BotStatus, HandlerSpec, Platform, WorkerId};
use botfleet_platform::{Connector, ErrorKind};
use botfleet_runtime::{Metrics, Worker, WorkerConfig};
use botfleet_store::{SqliteStore, Store};
use tokio::{sync::oneshot, task::JoinHandle};

use crate::{nonce, wait_for};

mod files;
pub use files::{
    a_photo_in_has_a_link_that_serves_its_bytes, files_out_reach_the_platform, FileOut,
};

/// A platform's fake, as the suite needs it. Chats are numbers (a Telegram chat id, Slack
/// channel `C<n>`); bots are numbered too.
pub trait PlatformFixture: Send + Sync {
    /// The platform under test.
    fn platform(&self) -> Platform;
    /// Registers bot `i` on the fake; answers its spec (its API URL on the fake).
    fn bot(&self, i: usize) -> BotSpec;
    /// A user writes `text` in chat `chat` of bot `i`.
    fn user_writes(&self, i: usize, chat: u32, text: &str);
    /// What bot `i` sent, as (chat, text), in the order the fake received it.
    fn sent(&self, i: usize) -> Vec<(u32, String)>;
    /// The platform refuses bot `i`'s credentials from now on.
    fn revoke(&self, i: usize);
    /// The next send of bot `i` is answered "rate limited, retry after `secs`".
    fn rate_limit_next_send(&self, i: usize, secs: u64);
    /// The next send of bot `i` fails as a server error would.
    fn fail_next_send(&self, i: usize);
    /// Requests bot `i` made to the fake so far (any method).
    fn requests(&self, i: usize) -> u64;
    /// Whether bot `i` is connected now (polling, a socket open).
    fn connected(&self, i: usize) -> bool;
    /// The platform's connector, as a worker builds it.
    fn connector(&self) -> Arc<dyn Connector>;
    /// Every secret of bot `i` (tokens): none may show anywhere.
    fn secrets(&self, i: usize) -> Vec<String>;
    /// A user of bot `i` uses its command `/name args` in chat `chat`; false where the
    /// platform (or its fake) has no commands to give this way.
    fn user_commands(&self, _i: usize, _chat: u32, _name: &str, _args: &str) -> bool {
        false
    }
    /// A user of bot `i` writes `text` in chat `chat`, then edits it to `edited`; false where
    /// the platform tells no edits.
    fn user_writes_then_edits(&self, _i: usize, _chat: u32, _text: &str, _edited: &str) -> bool {
        false
    }
    /// Every message bot `i` sent, as the platform shows it now (after edits and deletes),
    /// in the order sent; empty where the fake does not keep them.
    fn shown(&self, _i: usize) -> Vec<Shown> {
        Vec::new()
    }
    /// A user of bot `i` presses the button whose wire value is `value` under the bot's
    /// message `message_id` in chat `chat`; false where the platform has no such button.
    fn user_presses(&self, _i: usize, _chat: u32, _message_id: &str, _value: &str) -> bool {
        false
    }
    /// How many times bot `i` showed typing.
    fn typing_shown(&self, _i: usize) -> usize {
        0
    }
    /// The answers to bot `i`'s button presses: (the text shown, how long after the press
    /// it came).
    fn press_answers(&self, _i: usize) -> Vec<(String, Duration)> {
        Vec::new()
    }
    /// A user of bot `i` sends a file in chat `chat` (with `caption` as its text); false where
    /// the platform (or its fake) takes no files.
    #[allow(clippy::too_many_arguments)]
    fn user_sends_file(
        &self,
        _i: usize,
        _chat: u32,
        _kind: botfleet_core::AttachmentKind,
        _name: &str,
        _mime: &str,
        _data: Vec<u8>,
        _caption: &str,
    ) -> bool {
        false
    }
    /// How many times the platform served bot `i`'s received files.
    fn file_downloads(&self, _i: usize) -> usize {
        0
    }
    /// The files bot `i` uploaded, in the order the platform received them.
    fn files_sent(&self, _i: usize) -> Vec<FileOut> {
        Vec::new()
    }
    /// The names of the commands bot `i` registered with the platform last (`None`: none),
    /// and how many times it registered them.
    fn registered_commands(&self, _i: usize) -> (Option<Vec<String>>, u64) {
        (None, 0)
    }
    /// Chat `chat` as the platform names it (a Telegram chat id, a Slack channel `C<n>`).
    fn chat_id(&self, chat: u32) -> String {
        chat.to_string()
    }
    /// Paces the edits of each message as the platform does: an edit within `every` of the
    /// message's last change is answered 429 with the wait left. False where the fake cannot
    /// (the cases that need it are skipped there).
    fn pace_edits(&self, _every: Duration) -> bool {
        false
    }
    /// Edits answered 429 for the pace of [`Self::pace_edits`].
    fn edits_paced(&self) -> u64 {
        0
    }
    /// The edits of bot `i`'s messages the platform took, in order: their chats and texts.
    fn edits(&self, _i: usize) -> Vec<(u32, String)> {
        Vec::new()
    }
    /// Answers bot `i`'s next edit with a 429 asking to wait `secs`.
    fn rate_limit_next_edit(&self, _i: usize, _secs: u64) {}
    /// A user writes `text` to bot `i` in chat number `chat`, made one where the platform
    /// streams natively (a Slack thread, a Telegram private chat): the chat's id as the
    /// handler sees it. `None` where the platform has no native streams (the cases that need
    /// them are skipped there).
    fn user_writes_where_streams_are_native(
        &self,
        _i: usize,
        _chat: u32,
        _text: &str,
    ) -> Option<String> {
        None
    }
    /// The native streams bot `i` began, in order: their chat numbers, what they show, and
    /// whether they still stream.
    fn native_streams(&self, _i: usize) -> Vec<(u32, String, bool)> {
        Vec::new()
    }
    /// The platform refuses to begin bot `i`'s native streams from now on (an app not granted
    /// them); false where the fake cannot.
    fn refuse_native_streams(&self, _i: usize) -> bool {
        false
    }
    /// How many of bot `i`'s native streams the platform refused to begin.
    fn native_streams_refused(&self, _i: usize) -> u64 {
        0
    }
}

/// What the bot of `token` sent on the Telegram fake, as shown now.
pub fn telegram_shown(fake: &crate::FakeState, token: &str) -> Vec<Shown> {
    fake.sent()
        .into_iter()
        .filter(|s| s.token == token)
        .filter_map(|s| {
            let m = fake.bot_message(token, &s.chat_id, s.message_id)?;
            let buttons = m
                .reply_markup
                .iter()
                .flat_map(|k| k["inline_keyboard"].as_array().cloned().unwrap_or_default())
                .flat_map(|row| row.as_array().cloned().unwrap_or_default())
                .filter_map(|b| b["callback_data"].as_str().map(str::to_owned))
                .collect();
            Some(Shown {
                chat: u32::try_from(s.chat_id.parse::<i64>().ok()?.unsigned_abs()).ok()?,
                id: s.message_id.to_string(),
                text: m.text,
                buttons,
                deleted: m.deleted,
            })
        })
        .collect()
}

/// The streamed answers of the bot of `token` on the Telegram fake, as message drafts, in
/// order: each draft's chat, the text shown — the message that ended it, as it stands now,
/// once one was sent with the draft's last text; else the draft's last text — and whether it
/// still streams (no message ended it yet).
pub fn telegram_streams(fake: &crate::FakeState, token: &str) -> Vec<(String, String, bool)> {
    let mut streams: Vec<(String, i64, String, std::time::Instant)> = Vec::new();
    for d in fake.drafts(token) {
        match streams
            .iter_mut()
            .find(|(c, id, ..)| *c == d.chat_id && *id == d.draft_id)
        {
            Some(s) => (s.2, s.3) = (d.text, d.at),
            None => streams.push((d.chat_id, d.draft_id, d.text, d.at)),
        }
    }
    let sent: Vec<crate::Sent> = fake
        .sent()
        .into_iter()
        .filter(|s| s.token == token)
        .collect();
    streams
        .into_iter()
        .map(|(chat, _, text, at)| {
            let ended = sent
                .iter()
                .find(|s| s.chat_id == chat && s.at >= at && s.text == text)
                .and_then(|s| fake.bot_message(token, &s.chat_id, s.message_id));
            match ended {
                Some(m) => (chat, m.text, false),
                None => (chat, text, true),
            }
        })
        .collect()
}

/// What the bot of `token` posted on the Slack fake, as shown now (channels `C<n>`).
pub fn slack_shown(fake: &crate::FakeSlackState, token: &str) -> Vec<Shown> {
    fake.sent()
        .into_iter()
        .filter(|p| p.token == token)
        .filter_map(|p| {
            let m = fake.posted(token, &p.channel, &p.ts)?;
            let buttons = m
                .blocks
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|b| b["elements"].as_array().cloned().unwrap_or_default())
                .filter_map(|e| e["value"].as_str().map(str::to_owned))
                .collect();
            Some(Shown {
                chat: p.channel.trim_start_matches('C').parse().ok()?,
                id: p.ts,
                text: m.text,
                buttons,
                deleted: m.deleted,
            })
        })
        .collect()
}

/// A message as the platform shows it (see [`PlatformFixture::shown`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shown {
    /// Its chat.
    pub chat: u32,
    /// The platform's id of it.
    pub id: String,
    /// Its text now.
    pub text: String,
    /// Its buttons' wire values (for value buttons), in order.
    pub buttons: Vec<String>,
    /// Whether it was deleted.
    pub deleted: bool,
}

/// A platform that tells a resend by its key, so a reply it took is never shown twice
/// (Discord's `nonce` with `enforce_nonce`; WhatsApp Web's message id).
pub trait DedupingFixture: PlatformFixture {
    /// The platform takes bot `i`'s next send but its answer never reaches the sender.
    fn lose_next_send_answer(&self, i: usize);
    /// Sends of bot `i` the platform recognised as repeats and did not show again.
    fn resends_told(&self, i: usize) -> u64;
}

/// One test's registry, coordinator and workers.
pub struct Harness {
    store: Arc<dyn Store>,
    hub: MemoryHub,
    dir: std::path::PathBuf,
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A worker started by the harness.
pub struct RunningWorker {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    coord: MemoryCoordinator,
    /// Its metrics.
    pub metrics: Arc<Metrics>,
    /// Where its API's file links are served (`http://127.0.0.1:…`).
    pub api_url: String,
    /// Sends from the backend through it.
    pub sends: botfleet_runtime::Sends,
    files_task: JoinHandle<()>,
}

impl Drop for RunningWorker {
    fn drop(&mut self) {
        self.files_task.abort();
    }
}

impl RunningWorker {
    /// SIGTERM: drains and waits for it (at most 10 s).
    pub async fn shutdown(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), &mut self.task).await;
    }
}

impl Harness {
    /// A fresh SQLite registry with `bots` registered, and a hub.
    pub async fn new(bots: &[BotSpec]) -> Self {
        let dir = std::env::temp_dir().join(format!("botfleet-conn-{}", nonce()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let store: Arc<dyn Store> = Arc::new(
            SqliteStore::open(dir.join("bots.db"))
                .await
                .expect("sqlite"),
        );
        for b in bots {
            store.add_bot(b).await.expect("add bot");
        }
        Self {
            store,
            hub: MemoryHub::new(),
            dir,
        }
    }

    /// The registry.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// A coordinator handle of its own on the hub (a stand-in for another process).
    pub fn coordinator(&self) -> MemoryCoordinator {
        self.hub.coordinator()
    }

    /// Starts worker `name` on the hub.
    pub fn start(&self, name: &str) -> RunningWorker {
        self.start_with(name, |_| {})
    }

    /// [`Harness::start`] with `tune` applied to the worker's configuration last.
    pub fn start_with(&self, name: &str, tune: impl FnOnce(&mut WorkerConfig)) -> RunningWorker {
        let mut c = WorkerConfig::new(WorkerId::new(name).expect("worker id"));
        c.lease = Duration::from_millis(1500);
        c.connect_rate = 1000.0;
        c.reconcile_every = Duration::from_millis(200);
        c.registry_refresh = Duration::from_millis(500);
        c.telegram.poll_timeout = Duration::from_secs(2);
        c.telegram.request_slack = Duration::from_secs(3);
        c.handler_retry_for = Duration::from_secs(20);
        tune(&mut c);
        let coord = self.hub.coordinator();
        let mut w = Worker::new(
            c,
            Arc::new(coord.clone()) as Arc<dyn Coordinator>,
            self.store.clone(),
        )
        .expect("worker");
        let metrics = w.metrics();
        let sends = w.sends();
        // The worker's API, as far as file links and replies go, on a port of its own.
        let files = w.files();
        let replies = w.replies();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let api_url = format!("http://{}", listener.local_addr().expect("addr"));
        files.set_public_url(&api_url);
        let files_task = tokio::spawn(async move {
            if let Ok(l) = tokio::net::TcpListener::from_std(listener) {
                let _ = axum::serve(l, files.router().merge(replies.router())).await;
            }
        });
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(async move {
            let _ = w
                .run(async {
                    let _ = rx.await;
                })
                .await;
        });
        RunningWorker {
            stop: Some(tx),
            task,
            coord,
            metrics,
            api_url,
            sends,
            files_task,
        }
    }

    /// The worker dies: its coordinator handle fails from now on and its loop is gone (its
    /// bots stop acting once its lease is unsafe; the hub holds its liveness until then).
    pub fn crash(&self, w: RunningWorker) {
        self.hub.crash(&w.coord);
        w.task.abort();
    }
}

/// A tenant's webhook: answers the text, after 1 s for texts starting with `slow`. Its URL,
/// and the task serving it.
pub async fn slow_hook() -> (String, JoinHandle<()>) {
    use axum::{routing::post, Json, Router};
    let app = Router::new().route(
        "/hook",
        post(|Json(m): Json<serde_json::Value>| async move {
            let text = m["text"].as_str().unwrap_or_default().to_owned();
            if text.starts_with("slow") {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Json(serde_json::json!({ "text": text }))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, task)
}

/// Points `bot`'s handler at a new [`slow_hook`]: the task serving it.
pub async fn answer_slowly(bot: &mut BotSpec) -> JoinHandle<()> {
    let (url, server) = slow_hook().await;
    bot.handler = HandlerSpec::Webhook { url, secret: None };
    server
}

/// Bot `bot` answering through the webhook handler at `url`, registered and run by worker
/// `a`, once connected.
async fn answered_by<F: PlatformFixture>(
    f: &F,
    bot: &mut BotSpec,
    url: String,
) -> (Harness, RunningWorker) {
    bot.handler = HandlerSpec::Webhook { url, secret: None };
    let h = Harness::new(std::slice::from_ref(bot)).await;
    let w = h.start("a");
    connected(f).await;
    (h, w)
}

/// Waits (up to `within`) until bot `i` has sent `text`.
pub async fn until_sent<F: PlatformFixture>(f: &F, i: usize, text: &str, within: Duration) {
    wait_for(&format!("{text:?} sent"), within, || async {
        f.sent(i).iter().any(|(_, t)| t == text).then_some(())
    })
    .await;
}

/// Waits until bot 0 is connected.
async fn connected<F: PlatformFixture>(f: &F) {
    wait_for("connected", Duration::from_secs(15), || async {
        f.connected(0).then_some(())
    })
    .await;
}

/// What `pick` finds in the bot's record, once it finds something (within 20 s).
async fn on_the_bot<T>(
    what: &str,
    h: &Harness,
    bot: &BotSpec,
    pick: impl Fn(botfleet_core::BotRecord) -> Option<T>,
) -> T {
    wait_for(what, Duration::from_secs(20), || async {
        h.store()
            .get_bot(&bot.id)
            .await
            .ok()
            .flatten()
            .and_then(&pick)
    })
    .await
}

/// The bot's `last_error` once it mentions `needle` (a refusal reported by a turn).
async fn shown_on_the_bot(h: &Harness, bot: &BotSpec, needle: &str) -> String {
    on_the_bot("a reason shown on the bot", h, bot, |r| {
        r.last_error.filter(|e| e.contains(needle))
    })
    .await
}

/// What the mode of `bot` can do.
fn caps_of<F: PlatformFixture>(f: &F, bot: &BotSpec) -> botfleet_core::Caps {
    f.connector()
        .descriptor()
        .mode_of(bot)
        .map_or(botfleet_core::Caps::TEXT_ONLY, |m| m.caps)
}

/// What the mode of `spec` can do, by its platform's descriptor in this build.
pub(crate) fn caps_of_spec(spec: &BotSpec) -> botfleet_core::Caps {
    botfleet_runtime::descriptor(spec.platform)
        .and_then(|d| d.mode_of(spec))
        .map_or(botfleet_core::Caps::TEXT_ONLY, |m| m.caps)
}

/// Every entry of `bot` has ended.
async fn nothing_pending(h: &Harness, bot: &BotSpec) {
    assert!(
        h.store()
            .inbox_pending(&bot.id, 10)
            .await
            .expect("inbox")
            .is_empty(),
        "nothing left pending"
    );
}

/// Texts per chat, in the order sent.
fn by_chat(sent: &[(u32, String)]) -> HashMap<u32, Vec<String>> {
    let mut m: HashMap<u32, Vec<String>> = HashMap::new();
    for (c, t) in sent {
        m.entry(*c).or_default().push(t.clone());
    }
    m
}

/// Refused credentials end as `failed`, with the reason, and are not tried again in a loop.
pub async fn refused_credentials_fail_without_a_retry_loop<F: PlatformFixture>(f: &F) {
    let (good, bad) = (f.bot(0), f.bot(1));
    f.revoke(1);
    let h = Harness::new(&[good.clone(), bad.clone()]).await;
    let w = h.start("w");
    let rec = wait_for("the bad bot fails", Duration::from_secs(15), || async {
        h.store()
            .get_bot(&bad.id)
            .await
            .ok()
            .flatten()
            .filter(|r| r.status == BotStatus::Failed)
    })
    .await;
    let why = rec.last_error.unwrap_or_default();
    assert!(!why.is_empty(), "the reason is recorded");
    wait_for("the good bot runs", Duration::from_secs(15), || async {
        f.connected(0).then_some(())
    })
    .await;
    let calls = f.requests(1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(f.requests(1), calls, "a refused bot is not retried");
    w.shutdown().await;
}

/// A send answered "rate limited, retry after 2 s" goes out again after 2 s, once.
pub async fn retry_after_is_honoured<F: PlatformFixture>(f: &F) {
    let bot = f.bot(0);
    let h = Harness::new(std::slice::from_ref(&bot)).await;
    let w = h.start("w");
    connected(f).await;
    f.rate_limit_next_send(0, 2);
    let t = tokio::time::Instant::now();
    f.user_writes(0, 1, "hello");
    wait_for("answered", Duration::from_secs(15), || async {
        (!f.sent(0).is_empty()).then_some(())
    })
    .await;
    assert!(
        t.elapsed() >= Duration::from_millis(1900),
        "retried after {:?}, before retry-after",
        t.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(f.sent(0), [(1, "hello".to_owned())], "sent once");
    w.shutdown().await;
}

/// Sends that fail as a server error would are retried with backoff and go out once.
pub async fn transient_send_faults_back_off<F: PlatformFixture>(f: &F) {
    let bot = f.bot(0);
    let h = Harness::new(std::slice::from_ref(&bot)).await;
    let w = h.start("w");
    connected(f).await;
    f.fail_next_send(0);
    f.fail_next_send(0);
    f.user_writes(0, 1, "hello");
    wait_for("answered", Duration::from_secs(20), || async {
        (!f.sent(0).is_empty()).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(f.sent(0), [(1, "hello".to_owned())], "sent once");
    let text = w.metrics.render("w");
    assert!(
        text.lines()
            .any(|l| l.starts_with("botfleet_platform_errors_total")
                && l.contains(&format!("platform=\"{}\"", f.platform()))),
        "{text}"
    );
    w.shutdown().await;
}

/// Each chat's messages are answered once, in order; a slow chat does not hold up another.
pub async fn chats_keep_order_and_do_not_wait_for_each_other<F: PlatformFixture>(f: &F) {
    let mut bot = f.bot(0);
    let server = answer_slowly(&mut bot).await;
    let h = Harness::new(std::slice::from_ref(&bot)).await;
    let w = h.start("w");
    connected(f).await;
    f.user_writes(0, 1, "slow-a");
    f.user_writes(0, 1, "slow-b");
    let t = tokio::time::Instant::now();
    f.user_writes(0, 2, "quick");
    wait_for(
        "the quick chat answered",
        Duration::from_secs(10),
        || async { f.sent(0).iter().any(|(c, _)| *c == 2).then_some(()) },
    )
    .await;
    let quick = t.elapsed();
    for m in 0..5 {
        for chat in 3..6 {
            f.user_writes(0, chat, &format!("m{m}"));
        }
    }
    wait_for("everything answered", Duration::from_secs(20), || async {
        (f.sent(0).len() == 2 + 1 + 15).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let chats = by_chat(&f.sent(0));
    assert_eq!(chats[&1], ["slow-a", "slow-b"]);
    assert_eq!(chats[&2], ["quick"]);
    for chat in 3..6 {
        assert_eq!(chats[&chat], ["m0", "m1", "m2", "m3", "m4"], "chat {chat}");
    }
    assert!(
        quick < Duration::from_millis(1500),
        "a message to another chat waited {quick:?} for a slow chat"
    );
    w.shutdown().await;
    server.abort();
}

/// Sends from the backend. Accepted by a worker that does not run the bot, they go out from
/// the one that does: behind the reply in progress in their chat, in the order accepted,
/// once (a repeat of a key sends nothing). The owner killed right after a send was accepted:
/// the next owner sends it, once.
pub async fn sends_from_the_backend_go_out_once_in_the_chats_order<F: PlatformFixture>(f: &F) {
    let mut bot = f.bot(0);
    let server = answer_slowly(&mut bot).await;
    let h = Harness::new(std::slice::from_ref(&bot)).await;
    let mut workers = vec![Some(h.start("a")), Some(h.start("b"))];
    connected(f).await;
    let coord = h.coordinator();
    // The worker that runs the bot now, and the other one.
    let owner = || async {
        let o = coord.owner(&bot.id).await.ok()??;
        o.live.then(|| usize::from(o.worker.as_str() == "b"))
    };
    let run = wait_for("the bot's owner", Duration::from_secs(15), owner).await;
    let other = 1 - run;
    let through: Vec<botfleet_runtime::Sends> = workers
        .iter()
        .map(|w| w.as_ref().expect("running").sends.clone())
        .collect();
    // A reply in progress in chat 1 (its handler takes 1 s) when the sends come.
    f.user_writes(0, 1, "slow-1");
    let store = h.store().clone();
    let one = f.chat_id(1);
    wait_for("the message journaled", Duration::from_secs(10), || async {
        let p = store.inbox_pending(&bot.id, 10).await.ok()?;
        p.iter().any(|e| e.chat == one).then_some(())
    })
    .await;
    let submit = |k: usize, chat: String, key: &'static str, text: &'static str| {
        let (sends, bot) = (through[k].clone(), bot.clone());
        async move { send_text(&sends, &bot, &chat, key, text).await }
    };
    assert!(submit(other, one.clone(), "desk-1", "desk 1").await.new);
    assert!(submit(other, one.clone(), "desk-2", "desk 2").await.new);
    let again = submit(run, one.clone(), "desk-1", "desk 1").await;
    assert!(!again.new, "a repeat of a key is known wherever it comes");
    wait_for("the sends out", Duration::from_secs(20), || async {
        (f.sent(0).iter().filter(|(c, _)| *c == 1).count() >= 3).then_some(())
    })
    .await;
    // The owner dies right after it is told of a send.
    let two = f.chat_id(2);
    assert!(submit(other, two.clone(), "desk-3", "desk 3").await.new);
    let dead = workers[run].take().expect("running");
    h.crash(dead);
    // Accepted while the dead owner still looks alive: its nudge is lost, the journal not.
    assert!(submit(other, two, "desk-4", "desk 4").await.new);
    wait_for(
        "the sends after the crash",
        Duration::from_secs(20),
        || async { (f.sent(0).iter().filter(|(c, _)| *c == 2).count() >= 2).then_some(()) },
    )
    .await;
    // What a lost nudge or a replay could double would show by now: later work of the same
    // bot is done.
    f.user_writes(0, 3, "later");
    until_sent(f, 0, "later", Duration::from_secs(20)).await;
    let chats = by_chat(&f.sent(0));
    assert_eq!(chats[&1], ["slow-1", "desk 1", "desk 2"], "{chats:?}");
    assert_eq!(chats[&2], ["desk 3", "desk 4"], "{chats:?}");
    // A turn ends with its record, a moment after its send.
    wait_for("every entry ended", Duration::from_secs(10), || async {
        let p = h.store().inbox_pending(&bot.id, 10).await.ok()?;
        p.is_empty().then_some(())
    })
    .await;
    for w in workers.into_iter().flatten() {
        w.shutdown().await;
    }
    server.abort();
}

/// Sends `text` to `chat` of `bot` from the backend through `sends` under `key`; it must be
/// accepted.
pub(crate) async fn send_text(
    sends: &botfleet_runtime::Sends,
    bot: &BotSpec,
    chat: &str,
    key: &str,
    text: &str,
) -> botfleet_runtime::Submitted {
    let body = serde_json::json!({ "text": text }).to_string();
    sends.submit(bot, chat, key, &body).await.expect("accepted")
}

/// A worker dies in the middle of a chat's messages: the next worker answers the rest from
/// the inbox, and nothing is answered twice.
pub async fn a_crash_mid_batch_replays_without_a_second_reply<F: PlatformFixture>(f: &F) {
    let mut bot = f.bot(0);
    let server = answer_slowly(&mut bot).await;
    let h = Harness::new(std::slice::from_ref(&bot)).await;
    let a = h.start("a");
    connected(f).await;
    for i in 1..=4 {
        f.user_writes(0, 1, &format!("slow-{i}"));
    }
    wait_for("the first answered", Duration::from_secs(10), || async {
        (!f.sent(0).is_empty()).then_some(())
    })
    .await;
    h.crash(a);
    let b = h.start("b");
    wait_for("all four answered", Duration::from_secs(30), || async {
        (f.sent(0).len() >= 4).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let texts: Vec<String> = f.sent(0).into_iter().map(|(_, t)| t).collect();
    assert_eq!(
        texts,
        ["slow-1", "slow-2", "slow-3", "slow-4"],
        "once each, in order"
    );
    nothing_pending(&h, &bot).await;
    b.shutdown().await;
    server.abort();
}

/// A clean hand-over while users write: the next owner resumes where the first stopped,
/// nothing lost, nothing twice, every chat in order.
pub async fn a_hand_over_resumes_with_nothing_lost<F: PlatformFixture>(f: &F) {
    let bot = f.bot(0);
    let h = Harness::new(std::slice::from_ref(&bot)).await;
    let a = h.start("a");
    connected(f).await;
    let b = h.start("b");
    let mut expected: HashMap<u32, Vec<String>> = HashMap::new();
    let mut a = Some(a);
    for m in 0..30 {
        for chat in 1..3 {
            let text = format!("m{m}");
            f.user_writes(0, chat, &text);
            expected.entry(chat).or_default().push(text);
        }
        if m == 10 {
            if let Some(a) = a.take() {
                a.shutdown().await;
            }
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    wait_for("everything answered", Duration::from_secs(30), || async {
        (f.sent(0).len() >= 60).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = by_chat(&f.sent(0));
    for (chat, texts) in &expected {
        assert_eq!(&got[chat], texts, "chat {chat}: once each, in order");
    }
    assert!(
        b.metrics.sent_total() > 0,
        "the next owner answered part of it"
    );
    b.shutdown().await;
}

/// The chat's conversation state moves with the bot: a handler that counts in `state` goes on
/// counting after a clean hand-over and after the next owner is killed, every count once.
pub async fn state_follows_the_chat_through_a_hand_over_and_a_crash<F: PlatformFixture>(f: &F) {
    let mut bot = f.bot(0);
    let handler = crate::StateHandler::start(Duration::ZERO).await;
    bot.handler = HandlerSpec::Webhook {
        url: handler.url(),
        secret: None,
    };
    let h = Harness::new(std::slice::from_ref(&bot)).await;
    let mut expected = Vec::new();
    let mut n = 0;
    let mut write = |f: &F, count: usize| {
        for _ in 0..count {
            n += 1;
            let text = format!("m{n}");
            f.user_writes(0, 1, &text);
            expected.push(format!("{n}:{text}"));
        }
        expected.len()
    };
    let answered = |want: usize| {
        wait_for(
            "the chat answered",
            Duration::from_secs(30),
            move || async move { (f.sent(0).len() >= want).then_some(()) },
        )
    };
    let a = h.start("a");
    connected(f).await;
    answered(write(f, 4)).await;
    let b = h.start("b");
    a.shutdown().await;
    wait_for("connected again", Duration::from_secs(15), || async {
        f.connected(0).then_some(())
    })
    .await;
    answered(write(f, 3)).await;
    h.crash(b);
    let c = h.start("c");
    answered(write(f, 2)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got: Vec<String> = f.sent(0).into_iter().map(|(_, t)| t).collect();
    assert_eq!(
        got, expected,
        "the count goes on through both moves, once each"
    );
    assert!(
        c.metrics.sent_total() > 0,
        "the last owner answered the last messages"
    );
    c.shutdown().await;
}

/// Commands and edits reach the handler as such, on every platform that has them: `kind`
/// (`command`, `edited`, `message`), the command's name and arguments, the edited message's
/// id, and an `event_id` of their own (an edit is answered, not taken for its message's
/// repeat); today's fields stay as they were.
pub async fn commands_and_edits_reach_the_handler_as_such<F: PlatformFixture>(f: &F) {
    let mut bot = f.bot(0);
    let handler = crate::RecordingHandler::start().await;
    let (_h, w) = answered_by(f, &mut bot, handler.url()).await;
    f.user_writes(0, 1, "hello");
    let mut want = vec!["message:hello".to_owned()];
    if f.user_commands(0, 1, "start", "deep-link") {
        want.push("command:start deep-link".into());
    }
    if f.user_writes_then_edits(0, 1, "teh typo", "the typo") {
        want.push("message:teh typo".into());
        want.push("edited:the typo".into());
    }
    let n = want.len();
    wait_for("every event answered", Duration::from_secs(20), || async {
        (f.sent(0).len() >= n).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let got: Vec<String> = f.sent(0).into_iter().map(|(_, t)| t).collect();
    assert_eq!(got, want, "each event once, in order, as what it is");
    let seen = handler.seen();
    assert_eq!(seen.len(), n);
    let ids: HashSet<&str> = seen
        .iter()
        .map(|e| e["event_id"].as_str().unwrap_or(""))
        .collect();
    assert!(!ids.contains(""), "every event has an id: {seen:?}");
    assert_eq!(ids.len(), n, "ids of their own: {seen:?}");
    for e in &seen {
        assert!(e["event_id"]
            .as_str()
            .is_some_and(|id| id.starts_with(&format!("{}:", bot.id))));
        assert!(e["chat"]["chat"].is_string() && e["message_id"].is_string());
        match e["kind"].as_str() {
            Some("command") => {
                assert_eq!(e["command"]["name"], "start");
                assert_eq!(e["command"]["args"], "deep-link");
                assert!(e["command"]["options"].is_object());
            }
            Some("edited") => {
                assert!(e["edited_message_id"]
                    .as_str()
                    .is_some_and(|s| !s.is_empty()));
                assert_eq!(e["text"], "the typo");
            }
            Some("message") => assert!(e.get("command").is_none()),
            other => panic!("kind {other:?} in {e}"),
        }
    }
    w.shutdown().await;
}

/// Edits, deletes and typing through the one handler contract, where the platform's mode has
/// them: a send named by a `ref` is edited by a later turn and deleted by the one after, each
/// once, on the message it named; typing shows. What the mode lacks is refused with a reason
/// and the rest of the reply goes on.
pub async fn edits_deletes_and_typing_by_ref<F: PlatformFixture>(f: &F) {
    use serde_json::{json, Value};
    let mut bot = f.bot(0);
    let caps = caps_of(f, &bot);
    let handler = crate::ScriptedHandler::start(|ev: &Value| match ev["text"].as_str() {
        Some("draft") => json!({"actions": [
            {"type": "typing"},
            {"type": "send", "text": "a draft", "ref": "d"},
        ]}),
        Some("fix") => json!({"actions": [{"type": "edit", "ref": "d", "text": "the final text"}]}),
        Some("drop") => json!({"actions": [
            {"type": "delete", "ref": "d"},
            {"type": "send", "text": "dropped"},
        ]}),
        _ => json!({}),
    })
    .await;
    let (h, w) = answered_by(f, &mut bot, handler.url()).await;
    f.user_writes(0, 1, "draft");
    until_sent(f, 0, "a draft", Duration::from_secs(20)).await;
    assert_eq!(
        f.typing_shown(0) >= 1,
        caps.typing,
        "typing shows where the mode has it"
    );
    f.user_writes(0, 1, "fix");
    f.user_writes(0, 1, "drop");
    until_sent(f, 0, "dropped", Duration::from_secs(20)).await;
    let sent: Vec<String> = f.sent(0).into_iter().map(|(_, t)| t).collect();
    assert_eq!(sent, ["a draft", "dropped"], "each send once: {sent:?}");
    if caps.edit && caps.delete {
        let shown = f.shown(0);
        let d = shown
            .first()
            .expect("a fixture of a mode that edits shows what the bot sent");
        assert_eq!(
            (d.text.as_str(), d.deleted),
            ("the final text", true),
            "{d:?}"
        );
    }
    if !(caps.edit && caps.typing) {
        let why = shown_on_the_bot(&h, &bot, "caps.").await;
        assert!(why.contains("cannot") || why.contains("no "), "{why}");
    }
    w.shutdown().await;
}

/// The handler of the long-turn cases: "think" takes 6 s on its first call (past a 3 s
/// `handler_timeout_s`: cut off, its answer never sent) and 1.5 s on the next, answering
/// "thought it over".
pub(crate) async fn long_turn_handler() -> crate::ScriptedHandler {
    use serde_json::{json, Value};
    crate::ScriptedHandler::start(|ev: &Value| {
        match (ev["text"].as_str(), ev["attempt"].as_u64()) {
            (Some("think"), Some(1)) => json!({"_delay_ms": 6_000, "text": "too late"}),
            (Some("think"), Some(_)) => json!({"_delay_ms": 1_500, "text": "thought it over"}),
            _ => json!({}),
        }
    })
    .await
}

/// Asserts that [`long_turn_handler`] got "think" twice, as attempts 1 and 2 of one event.
pub(crate) fn called_as_two_attempts(handler: &crate::ScriptedHandler) {
    let calls: Vec<(u64, String)> = handler
        .seen()
        .iter()
        .filter(|e| e["text"] == "think")
        .map(|e| {
            (
                e["attempt"].as_u64().unwrap_or(0),
                e["event_id"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        calls.iter().map(|c| c.0).collect::<Vec<_>>(),
        [1, 2],
        "{calls:?}"
    );
    assert!(
        !calls[0].1.is_empty() && calls[0].1 == calls[1].1,
        "{calls:?}"
    );
}

/// A long turn: a handler call past the bot's `handler_timeout_s` is cut off and the event
/// comes again as its next `attempt` (same `event_id`); only the answer of the call that
/// finished is sent, once; the chat is shown typing meanwhile where the mode has typing.
pub async fn long_turns_come_again_and_show_typing<F: PlatformFixture>(f: &F) {
    let mut bot = f.bot(0);
    let caps = caps_of(f, &bot);
    bot.options.handler_timeout_s = Some(3);
    let handler = long_turn_handler().await;
    let (_h, w) = answered_by(f, &mut bot, handler.url()).await;
    f.user_writes(0, 1, "think");
    until_sent(f, 0, "thought it over", Duration::from_secs(30)).await;
    called_as_two_attempts(&handler);
    assert_eq!(
        f.typing_shown(0) >= 1,
        caps.typing,
        "typing shows while the handler runs, where the mode has it"
    );
    // Once, and never the cut-off call's answer.
    let sent: Vec<String> = f.sent(0).into_iter().map(|(_, t)| t).collect();
    assert_eq!(sent, ["thought it over"], "{sent:?}");
    let text = w.metrics.render("w");
    assert!(
        text.lines()
            .any(|l| l.starts_with("botfleet_handler_timeouts_total{") && l.ends_with(" 1")),
        "{text}"
    );
    w.shutdown().await;
}

/// A handler that answers `202` holds its chat's turn open for an answer that comes later
/// (a reply token in every request): the chat's next message waits, other chats go on, no
/// turn slot is held, typing is kept up where the mode has it, and the handler is not called
/// again, also by the worker that takes the bot over when the one holding the turn dies; the
/// bot's `async_reply_ttl_s` passing with no answer ends the event as undeliverable (`async
/// reply expired`) and the chat goes on.
pub async fn a_later_answer_holds_its_chat_until_its_time_to_live<F: PlatformFixture>(f: &F) {
    let mut bot = f.bot(0);
    let caps = caps_of(f, &bot);
    bot.options.async_reply_ttl_s = Some(10);
    let handler = later_handler().await;
    let (h, w) = answered_by(f, &mut bot, handler.url()).await;
    f.user_writes(0, 1, "later");
    wait_for("the turn held", Duration::from_secs(15), || async {
        let stats = h.store().inbox_stats().await.ok()?;
        (stats.get(&bot.id)?.held == 1).then_some(())
    })
    .await;
    let held_at = tokio::time::Instant::now();
    f.user_writes(0, 1, "next");
    f.user_writes(0, 2, "other");
    until_sent(f, 0, "other", Duration::from_secs(8)).await;
    let text = w.metrics.render("w");
    assert!(
        text.lines()
            .any(|l| l.starts_with("botfleet_turns_held{") && l.ends_with(" 1")),
        "{text}"
    );
    // The worker dies while the turn is held: the next one holds it on.
    h.crash(w);
    let w = h.start("b");
    until_sent(f, 0, "next", Duration::from_secs(40)).await;
    let waited = held_at.elapsed();
    assert!(
        waited >= Duration::from_secs(8),
        "the chat's next message was answered {waited:?} into a 10 s hold"
    );
    let sent: Vec<(u32, String)> = f.sent(0);
    assert!(
        !sent.iter().any(|(_, t)| t == "ignored"),
        "a 202's body was sent: {sent:?}"
    );
    expired_once(&handler, h.store().as_ref(), &bot.id).await;
    assert_eq!(
        f.typing_shown(0) >= 1,
        caps.typing,
        "typing shows while the turn is held, where the mode has it"
    );
    let text = w.metrics.render("b");
    for want in ["botfleet_turns_held{", "botfleet_async_expired_total{"] {
        let want_n = if want.contains("held") { " 0" } else { " 1" };
        assert!(
            text.lines()
                .any(|l| l.starts_with(want) && l.ends_with(want_n)),
            "{want}…{want_n} in {text}"
        );
    }
    wait_for("nothing held", Duration::from_secs(5), || async {
        let stats = h.store().inbox_stats().await.ok()?;
        (stats.get(&bot.id).map_or(0, |s| s.held) == 0).then_some(())
    })
    .await;
    w.shutdown().await;
}

/// The handler of the later-answer cases: `202` (with a body, which is ignored) to "later"
/// and "ask"; the text back to anything else, with the chat's state after it when there is
/// one ("next after {\"n\":2}").
pub async fn later_handler() -> crate::ScriptedHandler {
    use serde_json::json;
    crate::ScriptedHandler::start(|ev: &serde_json::Value| match ev["text"].as_str() {
        Some("later" | "ask") => json!({"_status": 202, "text": "ignored"}),
        Some(t) if ev["state"].is_null() => json!({ "text": t }),
        Some(t) => json!({ "text": format!("{t} after {}", ev["state"]) }),
        None => json!({}),
    })
    .await
}

/// The later answer of "later" expired as the bot's only undeliverable event (`async reply
/// expired`), its handler ([`later_handler`]) asked once, with a reply token: not again by a
/// worker that took the held turn over.
pub async fn expired_once(
    handler: &crate::ScriptedHandler,
    store: &dyn botfleet_store::Store,
    bot: &botfleet_core::BotId,
) {
    let gone = store.inbox_undeliverable(bot, 10).await.expect("inbox");
    assert_eq!(gone.len(), 1, "{gone:?}");
    assert_eq!(gone[0].error.as_deref(), Some("async reply expired"));
    let calls: Vec<serde_json::Value> = handler
        .seen()
        .into_iter()
        .filter(|e| e["text"] == "later")
        .collect();
    assert_eq!(calls.len(), 1, "the handler was called again: {calls:?}");
    let token = calls[0]["reply_token"].as_str().unwrap_or_default();
    assert!(token.starts_with("r1."), "{:?}", calls[0]);
}

/// Waits (up to 15 s) until no entry of `bot` is pending or held: every turn is over, so
/// nothing more is sent, and what was sent can be counted.
pub async fn all_over(store: &dyn botfleet_store::Store, bot: &botfleet_core::BotId) {
    wait_for("every turn over", Duration::from_secs(15), || async {
        let pending = store.inbox_pending(bot, 10).await.ok()?;
        let held = store
            .inbox_stats()
            .await
            .ok()?
            .get(bot)
            .map_or(0, |s| s.held);
        (pending.is_empty() && held == 0).then_some(())
    })
    .await;
}

/// The reply token `handler` got with the event of text `text`, once it got one (within 20 s).
pub async fn asked_token(handler: &crate::ScriptedHandler, text: &str) -> String {
    asked(handler, text, None).await
}

/// [`asked_token`] for "ask" written in the chat of id `chat` (the platform's id, as events
/// carry it).
pub async fn asked_in(handler: &crate::ScriptedHandler, chat: &str) -> String {
    asked(handler, "ask", Some(chat)).await
}

async fn asked(handler: &crate::ScriptedHandler, text: &str, chat: Option<&str>) -> String {
    wait_for("the handler asked", Duration::from_secs(20), || async {
        handler
            .seen()
            .iter()
            .find(|e| e["text"] == text && chat.is_none_or(|c| e["chat"]["chat"] == c))
            .and_then(|e| e["reply_token"].as_str().map(str::to_owned))
    })
    .await
}

/// What [`later_handler`] answers "next" after [`post_three_parts`] left the state.
pub const NEXT_AFTER_PARTS: &str = r#"next after {"n":2}"#;

/// Posts the later answer of the turn `token` in three parts through the API at `api_url`:
/// "one", "two" (with the state `{"n": 2}`) and, last, "three"; each must be taken (`202`).
pub async fn post_three_parts(api_url: &str, token: &str) {
    use serde_json::json;
    let send = |t: &str| json!([{"type": "send", "text": t}]);
    for (key, body) in [
        ("p1", json!({"actions": send("one"), "final": false})),
        (
            "p2",
            json!({"actions": send("two"), "state": {"n": 2}, "final": false}),
        ),
        ("p3", json!({"actions": send("three"), "final": true})),
    ] {
        let (status, answer) = post_part(api_url, token, key, &body).await;
        assert_eq!(status, 202, "{key}: {answer}");
    }
}

/// Posts a part of a later answer through the API at `api_url`: the status and the answer.
pub async fn post_part(
    api_url: &str,
    token: &str,
    key: &str,
    body: &serde_json::Value,
) -> (u16, serde_json::Value) {
    let r = reqwest::Client::new()
        .post(format!("{api_url}/api/v1/replies/{token}"))
        .header("idempotency-key", key)
        .json(body)
        .send()
        .await
        .expect("the API answers");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or_default())
}

/// A later answer in three parts, posted through both workers' APIs (the one running the
/// bot and the other): the parts' actions go out once, in the order posted; the chat's next
/// message is answered only after the last part, with the state the parts left; a repeat of a
/// key answers as the first post and sends nothing, another body under a key is refused
/// (409), a part after the last is refused (410), a forged token is unknown (404).
pub async fn a_later_answer_comes_in_parts_through_any_worker<F: PlatformFixture>(f: &F) {
    use serde_json::json;
    let mut bot = f.bot(0);
    let handler = later_handler().await;
    bot.handler = HandlerSpec::Webhook {
        url: handler.url(),
        secret: None,
    };
    let h = Harness::new(std::slice::from_ref(&bot)).await;
    let (a, b) = (h.start("a"), h.start("b"));
    connected(f).await;
    f.user_writes(0, 1, "ask");
    let token = asked_token(&handler, "ask").await;
    wait_for("the turn held", Duration::from_secs(15), || async {
        let stats = h.store().inbox_stats().await.ok()?;
        (stats.get(&bot.id)?.held == 1).then_some(())
    })
    .await;
    f.user_writes(0, 1, "next");
    let send = |t: &str| json!([{"type": "send", "text": t}]);
    let one = json!({"actions": send("one"), "final": false});
    assert_eq!(post_part(&a.api_url, &token, "k1", &one).await.0, 202);
    until_sent(f, 0, "one", Duration::from_secs(10)).await;
    let two = json!({"actions": send("two"), "state": {"n": 2}, "final": false});
    let (status, answer) = post_part(&b.api_url, &token, "k2", &two).await;
    assert_eq!((status, answer["seq"].as_u64()), (202, Some(2)), "{answer}");
    // A repeat through the other worker: as the first, nothing again.
    let (status, answer) = post_part(&a.api_url, &token, "k2", &two).await;
    assert_eq!(
        (status, answer["repeated"].as_bool()),
        (202, Some(true)),
        "{answer}"
    );
    let other = json!({"actions": send("other"), "final": false});
    assert_eq!(post_part(&a.api_url, &token, "k1", &other).await.0, 409);
    let three = json!({"actions": send("three"), "final": true});
    assert_eq!(post_part(&b.api_url, &token, "k3", &three).await.0, 202);
    let after = json!({"actions": send("after"), "final": true});
    assert_eq!(post_part(&a.api_url, &token, "k4", &after).await.0, 410);
    let forged = format!("{}x", &token[..token.len() - 1]);
    let (status, answer) = post_part(&a.api_url, &forged, "k5", &three).await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (404, Some("unknown_token"))
    );
    let next = "next after {\"n\":2}";
    until_sent(f, 0, next, Duration::from_secs(15)).await;
    all_over(h.store().as_ref(), &bot.id).await;
    let chat: Vec<String> = by_chat(&f.sent(0)).remove(&1).unwrap_or_default();
    assert_eq!(chat, ["one", "two", "three", next], "{chat:?}");
    nothing_pending(&h, &bot).await;
    a.shutdown().await;
    b.shutdown().await;
}

/// The final text of the streams of [`a_streamed_answer_is_paced_and_ends_on_its_final_text`]
/// and the webhook suite's `streamed_parts_by_webhook`.
pub(crate) const STREAM_FINAL: &str = "the whole answer, at last";

/// A stream of "part 1" … "part 49" and [`STREAM_FINAL`] edited into one message, as the
/// platform took it (`edits`, with `paced` edits refused for the pace): at most 7 edits, in
/// order, none refused, ending on the final text.
pub(crate) fn paced_to_the_final_text(edits: &[String], paced: u64) {
    assert!(
        !edits.is_empty() && edits.len() <= 7,
        "{} edits: {edits:?}",
        edits.len()
    );
    assert_eq!(edits.last().map(String::as_str), Some(STREAM_FINAL));
    let order: Vec<u64> = edits
        .iter()
        .map(|t| {
            t.strip_prefix("part ")
                .map_or(51, |n| n.parse().unwrap_or(0))
        })
        .collect();
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "out of order: {edits:?}"
    );
    assert_eq!(paced, 0, "an edit went faster than the pace");
}

/// The edits of the test streams: parts 1 to 50, 100 ms apart, the last one final.
pub(crate) const STREAM_EDITS: u64 = 50;

/// Part `k` of the test streams: 0 sends "…" named "answer"; 1 to [`STREAM_EDITS`] edit it to
/// "part k", the last to [`STREAM_FINAL`], ending the turn.
pub(crate) fn stream_part(k: u64) -> serde_json::Value {
    use serde_json::json;
    if k == 0 {
        return json!({"actions": [{"type": "send", "text": "…", "ref": "answer"}], "final": false});
    }
    let last = k == STREAM_EDITS;
    let text = if last {
        STREAM_FINAL.to_owned()
    } else {
        format!("part {k}")
    };
    json!({"actions": [{"type": "edit", "ref": "answer", "text": text}], "final": last})
}

/// Posts [`stream_part`] `k` to the turn `token` through the API at `api_url`: taken (`202`).
pub(crate) async fn post_stream_part(api_url: &str, token: &str, k: u64) {
    let (status, answer) = post_part(api_url, token, &format!("s{k}"), &stream_part(k)).await;
    assert_eq!(status, 202, "part {k}: {answer}");
}

/// A later answer streamed the way an AI agent streams it, on a fake that paces the edits of
/// a message as the platform does: a send, then 50 parts in 5 s each editing it (the last one
/// final) reach the platform as at most 7 edits, in order, none refused for the pace, ending
/// on the exact final text, and the turn ends (the chat's next message is answered) only once
/// the final text is shown. Then, in another chat, the platform answers the stream's last edit
/// with a 429: the final text still arrives, after the retry-after. The bot's `stream` is
/// `edits`. Runs where the fake paces edits.
pub async fn a_streamed_answer_is_paced_and_ends_on_its_final_text<F: PlatformFixture>(f: &F) {
    if !f.pace_edits(Duration::from_secs(1)) {
        return;
    }
    let mut bot = f.bot(0);
    // Edits, also where the platform would stream natively.
    bot.options.stream = Some(botfleet_core::StreamMode::Edits);
    let handler = later_handler().await;
    let (h, a) = answered_by(f, &mut bot, handler.url()).await;
    f.user_writes(0, 1, "ask");
    let token = asked_in(&handler, &f.chat_id(1)).await;
    post_stream_part(&a.api_url, &token, 0).await;
    let start = tokio::time::Instant::now();
    for k in 1..=STREAM_EDITS {
        tokio::time::sleep_until(start + Duration::from_millis(100 * k)).await;
        post_stream_part(&a.api_url, &token, k).await;
    }
    f.user_writes(0, 1, "next");
    // Edits read before sends: "next" out while the final text was not shown is caught.
    wait_for(
        "the next message answered",
        Duration::from_secs(20),
        || async {
            let shown = f.edits(0).iter().any(|(c, t)| *c == 1 && t == STREAM_FINAL);
            let next = f.sent(0).iter().any(|(c, t)| *c == 1 && t == "next");
            assert!(
                !next || shown,
                "the turn ended before its final text was shown"
            );
            next.then_some(())
        },
    )
    .await;
    let edits: Vec<String> = f
        .edits(0)
        .into_iter()
        .filter(|(c, _)| *c == 1)
        .map(|(_, t)| t)
        .collect();
    paced_to_the_final_text(&edits, f.edits_paced());
    // The last edit answered 429: delayed by its retry-after, not dropped.
    f.user_writes(0, 2, "ask");
    let token = asked_in(&handler, &f.chat_id(2)).await;
    post_stream_part(&a.api_url, &token, 0).await;
    wait_for(
        "the second stream started",
        Duration::from_secs(15),
        || async {
            f.sent(0)
                .iter()
                .any(|(c, t)| *c == 2 && t == "…")
                .then_some(())
        },
    )
    .await;
    f.rate_limit_next_edit(0, 2);
    let posted = tokio::time::Instant::now();
    post_stream_part(&a.api_url, &token, STREAM_EDITS).await;
    wait_for(
        "the final text after the 429",
        Duration::from_secs(20),
        || async {
            f.edits(0)
                .iter()
                .any(|(c, t)| *c == 2 && t == STREAM_FINAL)
                .then_some(())
        },
    )
    .await;
    assert!(
        posted.elapsed() >= Duration::from_secs(2),
        "the retry-after was not waited out"
    );
    all_over(h.store().as_ref(), &bot.id).await;
    nothing_pending(&h, &bot).await;
    a.shutdown().await;
}

/// The words of [`grown`]'s streams.
const GROWING: [&str; 12] = [
    "A", "streamed", "answer", "grows", "word", "by", "word", "and", "ends", "on", "its", "text.",
];

/// The text of part `k` of a growing stream: its first `k + 1` words.
fn grown(k: usize) -> String {
    GROWING[..=k.min(GROWING.len() - 1)].join(" ")
}

/// A streamed answer in a chat where the platform streams natively (a Slack thread, a
/// Telegram private chat): a send with a ref, then parts that extend it, 100 ms apart, go as
/// one native stream (begun, added to, ended with the turn) that shows the exact final text —
/// no edit, no part as a message of its own — and the chat's next message is answered only
/// once the stream has ended. A later
/// turn's edit that does not extend its stream ends it and edits the message it made. Runs
/// where the platform has native streams.
pub async fn a_native_stream_grows_and_ends_with_its_turn<F: PlatformFixture>(f: &F) {
    use serde_json::json;
    let mut bot = f.bot(0);
    let handler = later_handler().await;
    let (h, a) = answered_by(f, &mut bot, handler.url()).await;
    let Some(chat) = f.user_writes_where_streams_are_native(0, 1, "ask") else {
        a.shutdown().await;
        return;
    };
    let token = asked_in(&handler, &chat).await;
    let part = |k: usize, last: bool| {
        let action = if k == 0 {
            json!({"type": "send", "text": grown(0), "ref": "answer"})
        } else {
            json!({"type": "edit", "ref": "answer", "text": grown(k)})
        };
        json!({"actions": [action], "final": last})
    };
    let start = tokio::time::Instant::now();
    for k in 0..GROWING.len() {
        tokio::time::sleep_until(start + Duration::from_millis(100 * k as u64)).await;
        let body = part(k, k + 1 == GROWING.len());
        let (status, answer) = post_part(&a.api_url, &token, &format!("g{k}"), &body).await;
        assert_eq!(status, 202, "part {k}: {answer}");
    }
    let last = grown(GROWING.len() - 1);
    f.user_writes_where_streams_are_native(0, 1, "next");
    wait_for(
        "the next message answered",
        Duration::from_secs(20),
        || async {
            let ended = f.native_streams(0) == [(1, last.clone(), false)];
            let next = f.sent(0).iter().any(|(c, t)| *c == 1 && t == "next");
            assert!(
                !next || ended,
                "the turn ended before its stream: {:?}",
                f.native_streams(0)
            );
            next.then_some(())
        },
    )
    .await;
    assert!(f.edits(0).is_empty(), "{:?}", f.edits(0));
    // No part went as a message of its own; the whole answer at most once (where the
    // platform's stream ends as a message).
    let sent = f.sent(0);
    assert!(
        !sent
            .iter()
            .any(|(_, t)| (0..GROWING.len() - 1).any(|k| *t == grown(k))),
        "a part of a streamed answer went as a message: {sent:?}"
    );
    assert!(
        sent.iter().filter(|(_, t)| *t == last).count() <= 1,
        "{sent:?}"
    );
    // An edit that does not extend the stream ends it, then edits its message.
    f.user_writes_where_streams_are_native(0, 1, "ask");
    let token = wait_for("asked again", Duration::from_secs(20), || async {
        handler
            .seen()
            .iter()
            .filter(|e| e["text"] == "ask")
            .nth(1)
            .and_then(|e| e["reply_token"].as_str().map(str::to_owned))
    })
    .await;
    let body = json!({"actions": [
        {"type": "send", "text": "Thinking", "ref": "draft"},
        {"type": "edit", "ref": "draft", "text": "Rewritten"},
    ], "final": true});
    assert_eq!(post_part(&a.api_url, &token, "r0", &body).await.0, 202);
    wait_for("rewritten", Duration::from_secs(20), || async {
        f.edits(0)
            .iter()
            .any(|(c, t)| *c == 1 && t == "Rewritten")
            .then_some(())
    })
    .await;
    all_over(h.store().as_ref(), &bot.id).await;
    let streams = f.native_streams(0);
    assert_eq!(
        streams,
        [(1, last, false), (1, "Rewritten".to_owned(), false)],
        "{streams:?}"
    );
    nothing_pending(&h, &bot).await;
    a.shutdown().await;
    // A bot whose `stream` is `edits` edits one message there instead.
    let mut edits_bot = f.bot(1);
    edits_bot.options.stream = Some(botfleet_core::StreamMode::Edits);
    let w = edited_in_a_native_chat(f, &handler, edits_bot, 1).await;
    assert!(f.native_streams(1).is_empty(), "{:?}", f.native_streams(1));
    w.shutdown().await;
    // Where the platform refuses to begin a stream, the answer goes as a message and its
    // edits as edits: nothing is lost.
    if !f.refuse_native_streams(2) {
        return;
    }
    let w = edited_in_a_native_chat(f, &handler, f.bot(2), 2).await;
    assert!(f.sent(2).iter().any(|(c, t)| *c == 3 && *t == grown(0)));
    assert!(f.native_streams(2).is_empty(), "{:?}", f.native_streams(2));
    assert!(f.native_streams_refused(2) >= 1, "no stream was asked for");
    w.shutdown().await;
}

/// Bot `i` (`bot`, answered by `handler`) on a worker of its own: a user asks in chat `i + 1`,
/// made one where the platform streams natively, and the later answer sends a message and
/// edits it (extending it); waits until the platform shows the edit and the turn is over.
async fn edited_in_a_native_chat<F: PlatformFixture>(
    f: &F,
    handler: &crate::ScriptedHandler,
    mut bot: BotSpec,
    i: usize,
) -> RunningWorker {
    use serde_json::json;
    bot.handler = HandlerSpec::Webhook {
        url: handler.url(),
        secret: None,
    };
    let h = Harness::new(std::slice::from_ref(&bot)).await;
    let w = h.start("b");
    wait_for("the bot connected", Duration::from_secs(15), || async {
        f.connected(i).then_some(())
    })
    .await;
    let n = u32::try_from(i).unwrap_or(0) + 1;
    let chat = f
        .user_writes_where_streams_are_native(i, n, "ask")
        .expect("as for bot 0");
    let token = asked_in(handler, &chat).await;
    let body = json!({"actions": [
        {"type": "send", "text": grown(0), "ref": "answer"},
        {"type": "edit", "ref": "answer", "text": grown(1)},
    ], "final": true});
    assert_eq!(post_part(&w.api_url, &token, "e0", &body).await.0, 202);
    wait_for("edited", Duration::from_secs(20), || async {
        f.edits(i)
            .iter()
            .any(|(c, t)| *c == n && *t == grown(1))
            .then_some(())
    })
    .await;
    all_over(h.store().as_ref(), &bot.id).await;
    w
}

/// Buttons out and presses in, through the one handler contract: a send with buttons (one
/// value too long for the platform) under a `ref`, typing; the press comes to the handler with
/// its own value and the message's ref, is answered within the platform's deadline, and edits
/// the message; a later turn edits it again by ref, while an unknown ref and an unknown action
/// type are refused with reasons shown on the bot and the rest of the reply still runs; a
/// delete by ref. Runs where the platform's mode has buttons.
pub async fn buttons_presses_and_refs_across_turns<F: PlatformFixture>(f: &F) {
    use serde_json::{json, Value};
    let mut bot = f.bot(0);
    let caps = caps_of(f, &bot);
    if !caps.buttons || !caps.edit {
        return;
    }
    let long = "L".repeat(usize::from(caps.max_button_value) + 100);
    let long2 = long.clone();
    let handler = crate::ScriptedHandler::start(move |ev: &Value| {
        let presses = ev["state"]["presses"].as_u64().unwrap_or(0);
        match (ev["kind"].as_str(), ev["text"].as_str()) {
            (Some("message"), Some("menu")) => json!({
                "state": {"presses": presses},
                "actions": [
                    {"type": "typing"},
                    {"type": "send", "text": "Pick one", "ref": "menu",
                     "buttons": [[{"text": "Short", "value": "s"}, {"text": "Long", "value": long2}]]},
                ],
            }),
            (Some("action"), _) => json!({
                "state": {"presses": presses + 1},
                "actions": [
                    {"type": "answer", "text": "noted"},
                    {"type": "edit", "ref": ev["action"]["message_ref"],
                     "text": format!("picked {} bytes", ev["action"]["value"].as_str().map_or(0, str::len))},
                ],
            }),
            (Some("message"), Some("later")) => json!({
                "actions": [
                    {"type": "edit", "ref": "menu", "text": format!("edited later, after {presses} press")},
                    {"type": "edit", "ref": "no-such-ref", "text": "x"},
                    {"type": "teleport"},
                    {"type": "send", "text": "after the refusals"},
                ],
            }),
            (Some("message"), Some("bye")) => json!({
                "actions": [{"type": "delete", "ref": "menu"}, {"type": "send", "text": "gone"}],
            }),
            _ => json!({}),
        }
    })
    .await;
    let (h, w) = answered_by(f, &mut bot, handler.url()).await;
    f.user_writes(0, 1, "menu");
    let menu = wait_for("the menu shown", Duration::from_secs(20), || async {
        f.shown(0).into_iter().find(|m| m.text == "Pick one")
    })
    .await;
    assert_eq!(menu.buttons.len(), 2, "{menu:?}");
    assert_eq!(menu.buttons[0], "s");
    let wire = menu.buttons[1].clone();
    assert!(
        wire.len() <= usize::from(caps.max_button_value) && wire != long,
        "a long value is stood in for on the wire: {wire:?}"
    );
    if caps.typing {
        assert!(f.typing_shown(0) >= 1, "typing was shown");
    }
    assert!(f.user_presses(0, 1, &menu.id, &wire), "the button is there");
    let edited = format!("picked {} bytes", long.len());

    wait_for(
        "the press edits the menu",
        Duration::from_secs(20),
        || async {
            f.shown(0)
                .into_iter()
                .find(|m| m.id == menu.id && m.text == edited)
        },
    )
    .await;
    if caps.answer {
        let answers = f.press_answers(0);
        assert_eq!(answers.len(), 1, "{answers:?}");
        assert!(answers[0].1 < Duration::from_secs(10), "{answers:?}");
        if answers[0].0.is_empty() {
            // The turn took past the platform's deadline (a busy machine): the press was
            // acknowledged empty, and the answer came after it as a message.
            until_sent(f, 0, "noted", Duration::from_secs(20)).await;
        } else {
            assert_eq!(answers[0].0, "noted");
        }
    }
    let seen = handler.seen();
    let press = seen
        .iter()
        .find(|e| e["kind"] == "action")
        .unwrap_or_else(|| panic!("no action event in {seen:?}"));
    assert_eq!(
        press["action"]["value"],
        long.as_str(),
        "the handler's own value"
    );
    assert_eq!(press["action"]["message_ref"], "menu");
    assert!(press["caps"]["buttons"].as_bool().unwrap_or(false));
    assert!(press.get("answer_handle").is_none());
    // A later turn edits by ref; the refusals are reasons, and the reply goes on.
    f.user_writes(0, 1, "later");
    until_sent(f, 0, "after the refusals", Duration::from_secs(20)).await;
    let now = f.shown(0).into_iter().find(|m| m.id == menu.id).unwrap();
    assert_eq!(now.text, "edited later, after 1 press");
    assert!(
        now.buttons.is_empty(),
        "an edit without buttons leaves none"
    );
    let why = shown_on_the_bot(&h, &bot, "no-such-ref").await;
    assert!(
        why.contains("unknown ref") && why.contains("teleport"),
        "{why}"
    );
    f.user_writes(0, 1, "bye");
    wait_for("the menu deleted", Duration::from_secs(20), || async {
        f.shown(0)
            .into_iter()
            .find(|m| m.id == menu.id && m.deleted)
    })
    .await;
    assert_eq!(
        f.sent(0).iter().filter(|(_, t)| t == "Pick one").count(),
        1,
        "each send once"
    );
    w.shutdown().await;
}

/// The bot's commands are registered with its platform by the unit's holder when they change,
/// not again when the bot moves: registered at the first start, not by the next owner after
/// a hand-over, registered again (once) when an operator changes them. A mode that registers
/// none refuses commands with a reason.
pub async fn commands_are_registered_when_they_change<F: PlatformFixture>(f: &F) {
    let mut bot = f.bot(0);
    let command = |name: &str| botfleet_core::CommandSpec {
        name: name.into(),
        description: format!("does {name}"),
        options: Vec::new(),
    };
    bot.options.commands = vec![command("start"), command("help")];
    if !caps_of(f, &bot).commands {
        let why = botfleet_runtime::validate_spec(&bot)
            .expect_err("commands refused")
            .to_string();
        assert!(why.contains("commands"), "{why}");
        return;
    }
    let h = Harness::new(std::slice::from_ref(&bot)).await;
    let a = h.start("a");
    let names = |want: &'static [&'static str]| async move {
        wait_for(
            "the commands registered",
            Duration::from_secs(20),
            || async {
                let (got, writes) = f.registered_commands(0);
                (got.as_deref()
                    == Some(&want.iter().map(|s| s.to_string()).collect::<Vec<_>>()[..]))
                .then_some(writes)
            },
        )
        .await
    };
    assert_eq!(names(&["start", "help"]).await, 1);
    let b = h.start("b");
    a.shutdown().await;
    on_the_bot("the next owner runs the bot", &h, &bot, |r| {
        (r.reported_by.as_deref() == Some("b") && r.status == BotStatus::Running).then_some(())
    })
    .await;
    // The next owner changes the commands' registration only when an operator does.
    bot.options.commands = vec![command("start"), command("menu"), command("help")];
    h.store().update_bot(&bot).await.expect("update");
    assert_eq!(
        names(&["start", "menu", "help"]).await,
        2,
        "registered at the first start and after the change, not on the move"
    );
    b.shutdown().await;
}

/// Where the platform tells a resend by its key: a reply the platform took just before its
/// sender was killed (the answer never came back, so no record says it was sent) is sent again
/// by the next owner under the same key, and the user sees it once.
pub async fn a_reply_taken_before_a_crash_is_not_shown_twice<F: DedupingFixture>(f: &F) {
    let bot = f.bot(0);
    let h = Harness::new(std::slice::from_ref(&bot)).await;
    let a = h.start("a");
    connected(f).await;
    let sent = |n: usize| {
        wait_for("sent", Duration::from_secs(30), move || async move {
            (f.sent(0).len() >= n).then_some(())
        })
    };
    f.user_writes(0, 1, "m1");
    sent(1).await;
    f.lose_next_send_answer(0);
    f.user_writes(0, 1, "m2");
    // The platform has m2; its sender waits for an answer that does not come.
    sent(2).await;
    h.crash(a);
    let b = h.start("b");
    f.user_writes(0, 1, "m3");
    sent(3).await;
    wait_for(
        "the next owner sent m2 again and the platform told it",
        Duration::from_secs(30),
        || async { (f.resends_told(0) >= 1).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let texts: Vec<String> = f.sent(0).into_iter().map(|(_, t)| t).collect();
    assert_eq!(texts, ["m1", "m2", "m3"], "shown once each, in order");
    nothing_pending(&h, &bot).await;
    b.shutdown().await;
}

/// Tokens show nowhere: not in the recorded error, not in metrics, not in errors or `Debug`
/// of what the connector answers.
pub async fn secrets_never_show<F: PlatformFixture>(f: &F) {
    let bad = f.bot(0);
    f.revoke(0);
    let e = f.connector().verify(&bad).await.expect_err("refused");
    assert_eq!(e.kind(), ErrorKind::Credentials);
    let shown = format!("{e} {e:?} {bad:?}");
    let h = Harness::new(std::slice::from_ref(&bad)).await;
    let w = h.start("w");
    let rec = wait_for("failed", Duration::from_secs(15), || async {
        h.store()
            .get_bot(&bad.id)
            .await
            .ok()
            .flatten()
            .filter(|r| r.status == BotStatus::Failed)
    })
    .await;
    let all = format!(
        "{shown} {:?} {} {rec:?}",
        rec.last_error,
        w.metrics.render("w")
    );
    for s in f.secrets(0) {
        assert!(!all.contains(&s), "a secret shows in: {all}");
    }
    w.shutdown().await;
}

/// Generates a module `conformance_connector` with one `#[tokio::test]` per suite case, each
/// against a fresh fixture from `$fixture` (a future, e.g. an `async` block, awaited per test).
#[macro_export]
macro_rules! connector_conformance {
    ($fixture:expr) => {
        $crate::connector_conformance!(@cases $fixture;
            refused_credentials_fail_without_a_retry_loop,
            retry_after_is_honoured,
            transient_send_faults_back_off,
            chats_keep_order_and_do_not_wait_for_each_other,
            a_crash_mid_batch_replays_without_a_second_reply,
            a_hand_over_resumes_with_nothing_lost,
            state_follows_the_chat_through_a_hand_over_and_a_crash,
            secrets_never_show,
            commands_and_edits_reach_the_handler_as_such,
            buttons_presses_and_refs_across_turns,
            edits_deletes_and_typing_by_ref,
            long_turns_come_again_and_show_typing,
            a_photo_in_has_a_link_that_serves_its_bytes,
            files_out_reach_the_platform,
            commands_are_registered_when_they_change,
            sends_from_the_backend_go_out_once_in_the_chats_order,
            a_later_answer_holds_its_chat_until_its_time_to_live,
            a_later_answer_comes_in_parts_through_any_worker,
            a_streamed_answer_is_paced_and_ends_on_its_final_text,
            a_native_stream_grows_and_ends_with_its_turn,
        );
    };
    (@cases $fixture:expr; $($case:ident),* $(,)?) => {
        mod conformance_connector {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let fixture = $fixture.await;
                    $crate::connector_suite::$case(&fixture).await;
                }
            )*
        }
    };
}
