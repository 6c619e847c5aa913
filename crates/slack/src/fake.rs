//! A fake Slack (feature `fake`) speaking the real JSON: the Web API methods a bot host uses
//! (`auth.test`, `apps.connections.open`, `chat.postMessage`) and a Socket Mode server that
//! says `hello`, delivers each event to one of an app's sockets, delivers it again (with
//! `retry_attempt`, `retry_reason: "timeout"`) when it is not acknowledged within 3 s, sends
//! `disconnect` drills (`warning`, `refresh_requested`, `link_disabled`), pings idle sockets,
//! caps an app at 10 sockets (`too_many_websockets`) and records what it received.
//!
//! Tokens are registered with [`FakeSlackState::add_app`]; a user writes with
//! [`FakeSlackState::user_writes`]. An app subscribed to the Events API
//! ([`FakeSlackState::subscribe_events`]) gets its events as signed POSTs instead, retried
//! until they get a 2xx.

use std::{
    collections::{HashMap, VecDeque},
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use axum::{
    extract::{
        ws::{Message, WebSocket, WebSocketUpgrade},
        Path, Query, State,
    },
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::{any, post},
    Json, Router,
};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::sync::{mpsc, Notify};

mod files;
pub use files::SharedFile;

/// A message the fake received through `chat.postMessage`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    /// The bot token it was sent with.
    pub token: String,
    /// The channel.
    pub channel: String,
    /// The thread, when the reply was in one.
    pub thread_ts: Option<String>,
    /// The text.
    pub text: String,
    /// When the fake received it.
    pub at: Instant,
    /// The `ts` the fake gave it.
    pub ts: String,
}

/// A message a bot posted, as it stands now (after `chat.update` and `chat.delete`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Posted {
    /// The text now.
    pub text: String,
    /// The blocks now (`[]` without).
    pub blocks: Value,
    /// Updates made to it.
    pub edits: u32,
    /// Whether it was deleted.
    pub deleted: bool,
    /// When it last changed (posted or updated).
    pub changed_at: Instant,
    /// A message of `chat.startStream` that `chat.stopStream` has not ended yet.
    pub streaming: bool,
}

/// A `chat.update` the fake took.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Updated {
    /// The bot token it was made with.
    pub token: String,
    /// The channel.
    pub channel: String,
    /// The message's `ts`.
    pub ts: String,
    /// Its text after the update.
    pub text: String,
    /// When the fake took it.
    pub at: Instant,
}

/// A POST to an interaction's `response_url`, with when the interaction happened.
#[derive(Clone, Debug, PartialEq)]
pub struct Responded {
    /// The body.
    pub body: Value,
    /// When the user acted.
    pub pressed_at: Instant,
    /// When the response came.
    pub at: Instant,
}

/// A fault to answer the next `chat.postMessage` of a bot with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SendFault {
    /// HTTP 429 with `Retry-After` seconds.
    TooManyRequests(u64),
    /// HTTP 500.
    ServerError,
    /// `ok: false` with this error code (HTTP 200).
    Error(String),
}

struct Event {
    payload: Value,
    attempts: u64,
    /// The envelope's `type`: `events_api`, `slash_commands` or `interactive`.
    kind: &'static str,
}

struct InFlight {
    event: Event,
    socket: u64,
    sent_at: Instant,
}

struct SocketRec {
    app: String,
    tx: mpsc::UnboundedSender<Message>,
    /// When its client last showed life (a pong, an acknowledgement): a frozen client stops
    /// answering pings, and Slack stops counting on such a socket.
    last_seen: Instant,
    /// Told to go away (`refresh_requested`, `warning`): a new socket beside it is expected.
    refreshing: bool,
}

#[derive(Default)]
struct App {
    id: String,
    app_token: String,
    user_id: String,
    bot_id: String,
    pending: VecDeque<Event>,
    next_socket: usize,
    max_sockets: usize,
    /// When its last socket said `hello`.
    last_hello: Option<Instant>,
    link_disabled: bool,
    post_faults: VecDeque<SendFault>,
    /// Faults for `chat.update` only.
    update_faults: VecDeque<SendFault>,
}

#[derive(Default)]
struct Inner {
    apps: HashMap<String, App>,
    sockets: HashMap<u64, SocketRec>,
    in_flight: HashMap<String, InFlight>,
    posts: Vec<Sent>,
    /// The `chat.update`s taken, in order.
    updated: Vec<Updated>,
    /// Updates of one message closer than this to its last change are answered 429.
    update_pace: Option<Duration>,
    /// Updates answered 429 for that pace.
    updates_paced: u64,
    /// The messages `chat.startStream` began, as (token, channel, ts), in order.
    streams: Vec<(String, String, String)>,
    /// Tokens whose `chat.startStream` is answered `missing_scope` (an app not granted it),
    /// with the number so answered.
    streams_refused: HashMap<String, u64>,
    ack_latencies: Vec<Duration>,
    tickets: HashMap<String, String>,
    revoked: std::collections::HashSet<String>,
    /// A token given in place of a revoked one → the token its app is kept under.
    rotated: HashMap<String, String>,
    /// Web API calls per token.
    requests: HashMap<String, u64>,
    next_id: u64,
    /// (bot token, channel, ts) → the message as it stands.
    messages: HashMap<(String, String, String), Posted>,
    /// `response_url` id → (bot token, when the user acted, the responses so far).
    interactions: HashMap<String, (String, Instant, Vec<Responded>)>,
    /// File id → a file users shared or the bot uploads.
    files: HashMap<String, files::StoredFile>,
    /// Downloads served, by file id.
    downloads: Vec<String>,
    /// The bots' shared uploads.
    shared: Vec<SharedFile>,
}

/// Shared state of the fake; cheap to clone.
#[derive(Clone)]
pub struct FakeSlackState {
    inner: Arc<Mutex<Inner>>,
    wake: Arc<Notify>,
    base: Arc<Mutex<String>>,
    redeliveries: Arc<AtomicU64>,
    overlaps: Arc<AtomicU64>,
    ack_deadline_ms: Arc<AtomicU64>,
    ping_every_ms: Arc<AtomicU64>,
    /// Events API subscriptions, per bot token.
    events: Arc<Mutex<HashMap<String, EventsSub>>>,
    events_delivered: Arc<AtomicU64>,
    events_failed: Arc<AtomicU64>,
}

/// An app subscribed to the Events API: where its events go and how they are signed.
struct EventsSub {
    url: String,
    secret: String,
    user_id: String,
    queue: Vec<EventDelivery>,
}

struct EventDelivery {
    id: String,
    channel: String,
    payload: Value,
    /// A slash command's form body (posted as `application/x-www-form-urlencoded`), instead
    /// of `payload` as JSON.
    form: Option<String>,
    attempts: u32,
    retry_at: Option<Instant>,
    in_flight: bool,
}

impl Default for FakeSlackState {
    fn default() -> Self {
        Self {
            inner: Arc::default(),
            wake: Arc::default(),
            base: Arc::default(),
            redeliveries: Arc::default(),
            overlaps: Arc::default(),
            ack_deadline_ms: Arc::new(AtomicU64::new(3_000)),
            ping_every_ms: Arc::new(AtomicU64::new(20_000)),
            events: Arc::default(),
            events_delivered: Arc::default(),
            events_failed: Arc::default(),
        }
    }
}

fn lock(m: &Mutex<Inner>) -> std::sync::MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl FakeSlackState {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    /// Registers an app: its bot token (`xoxb-…`) and app token (`xapp-…`) become valid.
    /// Answers the app id.
    pub fn add_app(&self, bot_token: &str, app_token: &str) -> String {
        let mut g = self.lock();
        g.next_id += 1;
        let n = g.next_id;
        let id = format!("A{n:06}");
        g.apps.insert(
            bot_token.to_owned(),
            App {
                id: id.clone(),
                app_token: app_token.to_owned(),
                user_id: format!("UB{n:06}"),
                bot_id: format!("B{n:06}"),
                ..App::default()
            },
        );
        id
    }

    /// The bot's user id (as `auth.test` says).
    pub fn bot_user(&self, bot_token: &str) -> Option<String> {
        self.lock().apps.get(bot_token).map(|a| a.user_id.clone())
    }

    /// A user writes `text` in `channel` (in the thread `thread_ts`, if given) to the app of
    /// `bot_token`: a `message` event is queued for its sockets. Answers the message's `ts`.
    pub fn user_writes(
        &self,
        bot_token: &str,
        channel: &str,
        thread_ts: Option<&str>,
        text: &str,
    ) -> String {
        let ts = self.next_ts();
        let mut event = json!({
            "type": "message", "channel": channel, "user": "U000USER", "text": text,
            "ts": ts, "event_ts": ts, "channel_type": "channel",
        });
        if let Some(t) = thread_ts {
            event["thread_ts"] = json!(t);
        }
        self.push_event(bot_token, event);
        ts
    }

    /// A new message `ts`, above every one given before.
    fn next_ts(&self) -> String {
        let mut g = self.lock();
        g.next_id += 1;
        format!("1700000000.{:06}", g.next_id)
    }

    /// A user edits the message `ts` they wrote in `channel` to `text`: a `message_changed`
    /// event, as Slack sends it (the new message and the previous one). Answers the event's
    /// own `ts`.
    pub fn user_edits(
        &self,
        bot_token: &str,
        channel: &str,
        ts: &str,
        before: &str,
        text: &str,
    ) -> String {
        let event_ts = self.next_ts();
        self.push_event(
            bot_token,
            json!({
                "type": "message", "subtype": "message_changed", "hidden": true,
                "channel": channel, "ts": event_ts, "event_ts": event_ts,
                "channel_type": "channel",
                "message": {"type": "message", "user": "U000USER", "text": text, "ts": ts,
                    "edited": {"user": "U000USER", "ts": event_ts}},
                "previous_message": {"type": "message", "user": "U000USER", "text": before,
                    "ts": ts},
            }),
        );
        event_ts
    }

    /// A user runs the slash command `command` (`/name`) with `text` in `channel`: a
    /// `slash_commands` envelope for the app's sockets, or, for an app on the Events API, a
    /// signed form POST to its URL (as Slack posts to a command's Request URL). Answers the
    /// command's `trigger_id`.
    pub fn user_runs_command(
        &self,
        bot_token: &str,
        channel: &str,
        command: &str,
        text: &str,
    ) -> String {
        let mut g = self.lock();
        g.next_id += 1;
        let trigger = format!(
            "{}.{}.fake{:08}",
            1_000_000 + g.next_id,
            g.next_id,
            g.next_id
        );
        let app_id = g
            .apps
            .get(bot_token)
            .map(|a| a.id.clone())
            .unwrap_or_default();
        let fields = [
            ("token", "verification-token"),
            ("team_id", "T0001"),
            ("api_app_id", app_id.as_str()),
            ("channel_id", channel),
            ("user_id", "U000USER"),
            ("command", command),
            ("text", text),
            (
                "response_url",
                "https://hooks.slack.invalid/commands/T0001/1/x",
            ),
            ("trigger_id", trigger.as_str()),
        ];
        let mut ev = self.events.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(sub) = ev.get_mut(bot_token) {
            let form = fields
                .iter()
                .map(|(k, v)| format!("{}={}", form_escape(k), form_escape(v)))
                .collect::<Vec<_>>()
                .join("&");
            sub.queue.push(EventDelivery {
                id: trigger.clone(),
                channel: channel.to_owned(),
                payload: Value::Null,
                form: Some(form),
                attempts: 0,
                retry_at: None,
                in_flight: false,
            });
        } else if let Some(app) = g.apps.get_mut(bot_token) {
            let payload: serde_json::Map<String, Value> = fields
                .iter()
                .map(|(k, v)| ((*k).to_owned(), json!(v)))
                .collect();
            app.pending.push_back(Event {
                payload: Value::Object(payload),
                attempts: 0,
                kind: "slash_commands",
            });
        }
        drop(ev);
        drop(g);
        self.wake.notify_waiters();
        trigger
    }

    /// The message `ts` the bot of `bot_token` posted in `channel`, as it stands now.
    pub fn posted(&self, bot_token: &str, channel: &str, ts: &str) -> Option<Posted> {
        self.lock()
            .messages
            .get(&(bot_token.to_owned(), channel.to_owned(), ts.to_owned()))
            .cloned()
    }

    /// What the bot of `bot_token` POSTed to its interactions' `response_url`s, in order.
    pub fn responses(&self, bot_token: &str) -> Vec<Responded> {
        let g = self.lock();
        let mut all: Vec<Responded> = g
            .interactions
            .values()
            .filter(|(t, _, _)| t == bot_token)
            .flat_map(|(_, _, r)| r.iter().cloned())
            .collect();
        all.sort_by_key(|r| r.at);
        all
    }

    /// A user presses the button with `value` under the bot's message `ts` in `channel`: a
    /// `block_actions` interaction, over the app's sockets (an `interactive` envelope) or, for
    /// an app on the Events API, as a signed form POST of `payload` to its URL. Answers the
    /// interaction's `trigger_id`, or `None` when the message has no such button.
    pub fn user_presses(
        &self,
        bot_token: &str,
        channel: &str,
        ts: &str,
        value: &str,
    ) -> Option<String> {
        let mut g = self.lock();
        let m = g
            .messages
            .get(&(bot_token.to_owned(), channel.to_owned(), ts.to_owned()))
            .filter(|m| !m.deleted)?;
        let (block_id, action_id) =
            m.blocks.as_array()?.iter().enumerate().find_map(|(i, b)| {
                b["elements"].as_array()?.iter().find_map(|e| {
                    (e["value"] == value).then(|| {
                        (
                            format!("b{i}"),
                            e["action_id"].as_str().unwrap_or("").to_owned(),
                        )
                    })
                })
            })?;
        let message = json!({"type": "message", "ts": ts, "text": m.text, "blocks": m.blocks});
        g.next_id += 1;
        let n = g.next_id;
        let trigger = format!("{}.{n}.press{n:08}", 2_000_000 + n);
        let response_id = format!("r{n}");
        g.interactions.insert(
            response_id.clone(),
            (bot_token.to_owned(), Instant::now(), Vec::new()),
        );
        let app_id = g
            .apps
            .get(bot_token)
            .map(|a| a.id.clone())
            .unwrap_or_default();
        let base = self.base.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let payload = json!({
            "type": "block_actions",
            "user": {"id": "U000USER", "username": "user", "team_id": "T0001"},
            "api_app_id": app_id,
            "trigger_id": trigger,
            "team": {"id": "T0001"},
            "container": {"type": "message", "message_ts": ts, "channel_id": channel, "is_ephemeral": false},
            "channel": {"id": channel, "name": "general"},
            "message": message,
            "response_url": format!("{}/response/{response_id}", base.replacen("ws://", "http://", 1)),
            "actions": [{"action_id": action_id, "block_id": block_id, "value": value,
                "type": "button", "action_ts": format!("1700000003.{n:06}")}],
        });
        let mut ev = self.events.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(sub) = ev.get_mut(bot_token) {
            sub.queue.push(EventDelivery {
                id: trigger.clone(),
                channel: channel.to_owned(),
                payload: Value::Null,
                form: Some(format!("payload={}", form_escape(&payload.to_string()))),
                attempts: 0,
                retry_at: None,
                in_flight: false,
            });
        } else if let Some(app) = g.apps.get_mut(bot_token) {
            app.pending.push_back(Event {
                payload,
                attempts: 0,
                kind: "interactive",
            });
        }
        drop(ev);
        drop(g);
        self.wake.notify_waiters();
        Some(trigger)
    }

    /// Subscribes the app of `bot_token` to the Events API: its events are POSTed to `url`
    /// from now on (not to sockets), signed with `signing_secret` as Slack signs them
    /// (`X-Slack-Request-Timestamp`, `X-Slack-Signature`), one channel's after another, a
    /// failed one retried (`X-Slack-Retry-Num`) while that channel's later ones wait.
    pub fn subscribe_events(&self, bot_token: &str, url: &str, signing_secret: &str) {
        let user_id = self.bot_user(bot_token).unwrap_or_default();
        let start = {
            let mut ev = self.events.lock().unwrap_or_else(|e| e.into_inner());
            let fresh = !ev.contains_key(bot_token);
            ev.insert(
                bot_token.to_owned(),
                EventsSub {
                    url: url.to_owned(),
                    secret: signing_secret.to_owned(),
                    user_id,
                    queue: Vec::new(),
                },
            );
            fresh
        };
        if start {
            tokio::spawn(deliver_events(self.clone(), bot_token.to_owned()));
        }
    }

    /// Sends the `url_verification` challenge to the app's events URL, signed; answers the
    /// response's status and body.
    pub async fn verify_url(&self, bot_token: &str) -> Option<(u16, String)> {
        let (url, secret) = {
            let ev = self.events.lock().unwrap_or_else(|e| e.into_inner());
            let sub = ev.get(bot_token)?;
            (sub.url.clone(), sub.secret.clone())
        };
        let body = json!({"token": "verification-token", "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P", "type": "url_verification"}).to_string();
        let ts = (botfleet_core::unix_ms() / 1000).to_string();
        let r = reqwest::Client::new()
            .post(url)
            .header("content-type", "application/json")
            .header("x-slack-request-timestamp", &ts)
            .header(
                "x-slack-signature",
                crate::sign(&secret, &ts, body.as_bytes()),
            )
            .body(body)
            .send()
            .await
            .ok()?;
        let status = r.status().as_u16();
        Some((status, r.text().await.unwrap_or_default()))
    }

    /// Events API deliveries answered 2xx, and ones that were not (each retried).
    pub fn events_deliveries(&self) -> (u64, u64) {
        (
            self.events_delivered.load(Ordering::SeqCst),
            self.events_failed.load(Ordering::SeqCst),
        )
    }

    /// Events API deliveries not acknowledged yet.
    pub fn events_undelivered(&self) -> usize {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|s| s.queue.len())
            .sum()
    }

    /// Queues any event (e.g. a malformed one, or an edit) for the app of `bot_token`.
    pub fn push_event(&self, bot_token: &str, event: Value) {
        {
            let mut g = self.lock();
            g.next_id += 1;
            let event_id = format!("Ev{:08}", g.next_id);
            let mut ev = self.events.lock().unwrap_or_else(|e| e.into_inner());
            if let (Some(sub), Some(app)) = (ev.get_mut(bot_token), g.apps.get(bot_token)) {
                let channel = event["channel"].as_str().unwrap_or("").to_owned();
                let payload = json!({
                    "token": "verification-token", "team_id": "T0001", "api_app_id": app.id,
                    "event": event, "type": "event_callback", "event_id": event_id,
                    "event_time": 1_700_000_000,
                    "authorizations": [{"team_id": "T0001", "user_id": sub.user_id, "is_bot": true}],
                });
                sub.queue.push(EventDelivery {
                    id: event_id,
                    channel,
                    payload,
                    form: None,
                    attempts: 0,
                    retry_at: None,
                    in_flight: false,
                });
                drop(ev);
                drop(g);
                self.wake.notify_waiters();
                return;
            }
            drop(ev);
            if let Some(app) = g.apps.get_mut(bot_token) {
                let payload = json!({
                    "token": "verification-token", "team_id": "T0001", "api_app_id": app.id,
                    "event": event, "type": "event_callback", "event_id": event_id,
                    "event_time": 1_700_000_000,
                });
                app.pending.push_back(Event {
                    payload,
                    attempts: 0,
                    kind: "events_api",
                });
            }
        }
        self.wake.notify_waiters();
    }

    /// How many messages `chat.postMessage` received.
    pub fn sent_count(&self) -> usize {
        self.lock().posts.len()
    }

    /// What `chat.postMessage` received from the `from`-th message on, in arrival order.
    pub fn sent_from(&self, from: usize) -> Vec<Sent> {
        self.lock()
            .posts
            .get(from..)
            .map(<[Sent]>::to_vec)
            .unwrap_or_default()
    }

    /// Everything received through `chat.postMessage`, in arrival order.
    pub fn sent(&self) -> Vec<Sent> {
        self.lock().posts.clone()
    }

    /// Sockets the app of `bot_token` has open now.
    pub fn sockets(&self, bot_token: &str) -> usize {
        let g = self.lock();
        let Some(app) = g.apps.get(bot_token) else {
            return 0;
        };
        g.sockets.values().filter(|s| s.app == app.id).count()
    }

    /// The most sockets the app of `bot_token` ever had open at once.
    pub fn max_sockets(&self, bot_token: &str) -> usize {
        self.lock().apps.get(bot_token).map_or(0, |a| a.max_sockets)
    }

    /// How many apps had a socket say `hello` at or after `since`.
    pub fn connected_since(&self, since: Instant) -> usize {
        self.lock()
            .apps
            .values()
            .filter(|a| a.last_hello.is_some_and(|t| t >= since))
            .count()
    }

    /// Which of `bot_tokens` had a socket say `hello` at or after `since`.
    pub fn connected_since_among(&self, bot_tokens: &[String], since: Instant) -> usize {
        let g = self.lock();
        bot_tokens
            .iter()
            .filter(|t| {
                g.apps
                    .get(*t)
                    .and_then(|a| a.last_hello)
                    .is_some_and(|h| h >= since)
            })
            .count()
    }

    /// Apps with at least one socket open.
    pub fn connected_apps(&self) -> usize {
        let g = self.lock();
        let mut ids: Vec<&str> = g.sockets.values().map(|s| s.app.as_str()).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    }

    /// Sockets of one app opened while another of its sockets stayed open for half a second
    /// or more without having been asked to refresh: two holders of one app.
    pub fn overlaps(&self) -> u64 {
        self.overlaps.load(Ordering::SeqCst)
    }

    /// Deliveries made again because the first was not acknowledged in time.
    pub fn redeliveries(&self) -> u64 {
        self.redeliveries.load(Ordering::SeqCst)
    }

    /// Time from each delivery to its acknowledgement.
    pub fn ack_latencies(&self) -> Vec<Duration> {
        self.lock().ack_latencies.clone()
    }

    /// Events not yet delivered or not yet acknowledged, all apps.
    pub fn undelivered(&self) -> usize {
        let g = self.lock();
        g.in_flight.len() + g.apps.values().map(|a| a.pending.len()).sum::<usize>()
    }

    /// Web API calls made with `token` (bot or app) so far.
    pub fn requests_of(&self, token: &str) -> u64 {
        self.lock().requests.get(token).copied().unwrap_or(0)
    }

    /// Makes `token` (bot or app) refused from now on.
    pub fn revoke(&self, token: &str) {
        self.lock().revoked.insert(token.to_owned());
    }

    /// Gives the app of `token` (revoked or not) a new bot token, as reinstalling the app
    /// does: `new` answers for the same app from now on, `token` is refused. The fake's
    /// helpers keep naming the app by `token`.
    pub fn rotate(&self, token: &str, new: &str) {
        let mut g = self.lock();
        g.revoked.insert(token.to_owned());
        g.rotated.insert(new.to_owned(), token.to_owned());
    }

    /// Answers the next `chat.postMessage` of `bot_token` with `fault`.
    pub fn inject_send(&self, bot_token: &str, fault: SendFault) {
        if let Some(a) = self.lock().apps.get_mut(bot_token) {
            a.post_faults.push_back(fault);
        }
    }

    /// Answers the next `chat.update` of `bot_token` with `fault`.
    pub fn inject_update(&self, bot_token: &str, fault: SendFault) {
        if let Some(a) = self.lock().apps.get_mut(bot_token) {
            a.update_faults.push_back(fault);
        }
    }

    /// Paces the updates of each message as Slack does (`chat.update`, about one a second
    /// per message): an update within `every` of the message's last change is answered 429
    /// with the seconds left in `Retry-After` (counted in [`Self::updates_paced`]). `None`: no
    /// pace (the default).
    pub fn pace_updates(&self, every: Option<Duration>) {
        self.lock().update_pace = every;
    }

    /// From now on `chat.startStream` of `bot_token` is answered `missing_scope`, as for an
    /// app not granted streaming.
    pub fn refuse_streams(&self, bot_token: &str) {
        self.lock()
            .streams_refused
            .entry(bot_token.to_owned())
            .or_default();
    }

    /// How many `chat.startStream`s of `bot_token` were answered `missing_scope`.
    pub fn streams_refused(&self, bot_token: &str) -> u64 {
        self.lock()
            .streams_refused
            .get(bot_token)
            .copied()
            .unwrap_or(0)
    }

    /// Updates answered 429 for the pace set by [`Self::pace_updates`].
    pub fn updates_paced(&self) -> u64 {
        self.lock().updates_paced
    }

    /// The messages `chat.startStream` began for `bot_token`, as (channel, ts), in order; what
    /// each shows now is [`Self::posted`].
    pub fn streams(&self, bot_token: &str) -> Vec<(String, String)> {
        self.lock()
            .streams
            .iter()
            .filter(|(t, _, _)| t == bot_token)
            .map(|(_, c, ts)| (c.clone(), ts.clone()))
            .collect()
    }

    /// The `chat.update`s of `bot_token` the fake took, in order.
    pub fn updates(&self, bot_token: &str) -> Vec<Updated> {
        self.lock()
            .updated
            .iter()
            .filter(|u| u.token == bot_token)
            .cloned()
            .collect()
    }

    /// How long a delivery may go unacknowledged before it is made again. Default 3 s.
    pub fn set_ack_deadline(&self, d: Duration) {
        self.ack_deadline_ms.store(
            u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }

    /// How often idle sockets are pinged. Default 20 s.
    pub fn set_ping_every(&self, d: Duration) {
        self.ping_every_ms.store(
            u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }

    fn send_disconnect(&self, bot_token: &str, reason: &str, refreshing: bool) -> usize {
        let mut g = self.lock();
        let Some(app) = g.apps.get(bot_token).map(|a| a.id.clone()) else {
            return 0;
        };
        let frame = json!({"type": "disconnect", "reason": reason,
            "debug_info": {"host": "fake-slack"}})
        .to_string();
        let mut n = 0;
        for s in g.sockets.values_mut().filter(|s| s.app == app) {
            s.refreshing |= refreshing;
            let _ = s.tx.send(Message::Text(frame.clone().into()));
            n += 1;
        }
        n
    }

    /// Asks every socket of the app of `bot_token` to be replaced (`refresh_requested`), as
    /// Slack does every few hours; the old sockets are closed 10 s later if still open.
    /// Answers how many sockets were asked.
    pub fn refresh(&self, bot_token: &str) -> usize {
        let n = self.send_disconnect(bot_token, "refresh_requested", true);
        let (inner, token) = (self.inner.clone(), bot_token.to_owned());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(10)).await;
            let g = lock(&inner);
            if let Some(app) = g.apps.get(&token) {
                for s in g
                    .sockets
                    .values()
                    .filter(|s| s.app == app.id && s.refreshing)
                {
                    let _ = s.tx.send(Message::Close(None));
                }
            }
        });
        n
    }

    /// Warns every socket of the app of `bot_token` that it will be disconnected.
    pub fn warning(&self, bot_token: &str) -> usize {
        self.send_disconnect(bot_token, "warning", true)
    }

    /// Turns Socket Mode off for the app of `bot_token` (`link_disabled`).
    pub fn link_disabled(&self, bot_token: &str) {
        if let Some(a) = self.lock().apps.get_mut(bot_token) {
            a.link_disabled = true;
        }
        self.send_disconnect(bot_token, "link_disabled", false);
    }

    /// Drops every socket of the app of `bot_token` without a word (a network failure).
    pub fn drop_sockets(&self, bot_token: &str) {
        let g = self.lock();
        if let Some(app) = g.apps.get(bot_token) {
            for s in g.sockets.values().filter(|s| s.app == app.id) {
                let _ = s.tx.send(Message::Close(None));
            }
        }
    }

    /// Delivers what is pending to sockets, and again what was not acknowledged in time.
    fn deliver(&self) {
        let deadline = Duration::from_millis(self.ack_deadline_ms.load(Ordering::SeqCst));
        let mut g = self.lock();
        let g = &mut *g;
        // Not acknowledged in time: back to the front of its app's queue.
        let mut late: Vec<(Instant, String)> = g
            .in_flight
            .iter()
            .filter(|(_, f)| f.sent_at.elapsed() >= deadline)
            .map(|(k, f)| (f.sent_at, k.clone()))
            .collect();
        late.sort();
        for (_, envelope) in late.into_iter().rev() {
            if let Some(f) = g.in_flight.remove(&envelope) {
                let app = g.sockets.get(&f.socket).map(|s| s.app.clone()).or_else(|| {
                    let api = f.event.payload["api_app_id"].as_str().map(str::to_owned);
                    api
                });
                if let Some(a) = g.apps.values_mut().find(|a| Some(&a.id) == app.as_ref()) {
                    a.pending.push_front(f.event);
                }
            }
        }
        let alive_for = Duration::from_millis(self.ping_every_ms.load(Ordering::SeqCst) * 3);
        // A socket whose client stopped answering pings is given up: closed, and what it was
        // given and did not acknowledge goes back to the front of its app's queue, in order.
        let dead: Vec<u64> = g
            .sockets
            .iter()
            .filter(|(_, s)| s.last_seen.elapsed() >= alive_for)
            .map(|(id, _)| *id)
            .collect();
        for id in dead {
            if let Some(sock) = g.sockets.remove(&id) {
                let _ = sock.tx.send(Message::Close(None));
                let mut orphans: Vec<(Instant, String)> = g
                    .in_flight
                    .iter()
                    .filter(|(_, f)| f.socket == id)
                    .map(|(k, f)| (f.sent_at, k.clone()))
                    .collect();
                orphans.sort();
                for (_, k) in orphans.into_iter().rev() {
                    if let Some(f) = g.in_flight.remove(&k) {
                        if let Some(a) = g.apps.values_mut().find(|a| a.id == sock.app) {
                            a.pending.push_front(f.event);
                        }
                    }
                }
            }
        }
        // Sockets whose client answers, per app: a frozen one gets nothing more.
        let mut live: HashMap<String, Vec<u64>> = HashMap::new();
        for (id, s) in &g.sockets {
            if !s.refreshing && s.last_seen.elapsed() < alive_for {
                live.entry(s.app.clone()).or_default().push(*id);
            }
        }
        for app in g.apps.values_mut() {
            if app.pending.is_empty() {
                continue;
            }
            let mine = match live.get_mut(&app.id) {
                Some(v) => {
                    v.sort_unstable();
                    v.clone()
                }
                None => Vec::new(),
            };
            if mine.is_empty() {
                continue;
            }
            while let Some(mut ev) = app.pending.pop_front() {
                app.next_socket = app.next_socket.wrapping_add(1);
                let sock = mine[app.next_socket % mine.len()];
                g.next_id += 1;
                let envelope_id = format!("env-{:08}", g.next_id);
                let frame = json!({
                    "envelope_id": envelope_id, "type": ev.kind,
                    "accepts_response_payload": false, "retry_attempt": ev.attempts,
                    "retry_reason": if ev.attempts > 0 { "timeout" } else { "" },
                    "payload": ev.payload,
                });
                if ev.attempts > 0 {
                    self.redeliveries.fetch_add(1, Ordering::SeqCst);
                }
                ev.attempts += 1;
                let Some(s) = g.sockets.get(&sock) else {
                    app.pending.push_front(ev);
                    break;
                };
                let _ = s.tx.send(Message::Text(frame.to_string().into()));
                g.in_flight.insert(
                    envelope_id,
                    InFlight {
                        event: ev,
                        socket: sock,
                        sent_at: Instant::now(),
                    },
                );
            }
        }
    }
}

fn slack_error(code: &str) -> Response {
    Json(json!({"ok": false, "error": code})).into_response()
}

fn bearer(headers: &HeaderMap) -> String {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("")
        .to_owned()
}

async fn web_api(
    State(state): State<FakeSlackState>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let token = bearer(&headers);
    if token.is_empty() {
        return slack_error("not_authed");
    }
    let args: Value = serde_json::from_str(&body).unwrap_or_else(|_| {
        // A form body (`files.*` take no JSON), as an object of strings.
        let pairs = botfleet_platform::form_pairs(body.as_bytes());
        Value::Object(
            pairs
                .into_iter()
                .map(|(k, v)| (k, Value::String(v)))
                .collect(),
        )
    });
    let base = state.base.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut g = state.lock();
    *g.requests.entry(token.clone()).or_default() += 1;
    if g.revoked.contains(&token) {
        return slack_error("token_revoked");
    }
    // A rotated token stands for its app's first one.
    let token = g.rotated.get(&token).cloned().unwrap_or(token);
    match method.as_str() {
        "auth.test" => {
            let Some(app) = g.apps.get(&token) else {
                return slack_error(if token.starts_with("xapp-") {
                    "not_allowed_token_type"
                } else {
                    "invalid_auth"
                });
            };
            Json(
                json!({"ok": true, "url": "https://fake.slack.com/", "team": "Fake",
                "user": "bot", "team_id": "T0001", "user_id": app.user_id, "bot_id": app.bot_id}),
            )
            .into_response()
        }
        "apps.connections.open" => {
            let Some(app) = g.apps.values().find(|a| a.app_token == token) else {
                return slack_error(if token.starts_with("xoxb-") {
                    "not_allowed_token_type"
                } else {
                    "invalid_auth"
                });
            };
            if app.link_disabled {
                return slack_error("link_disabled");
            }
            let app_id = app.id.clone();
            g.next_id += 1;
            let ticket = format!("ticket-{:08}", g.next_id);
            g.tickets.insert(ticket.clone(), app_id.clone());
            let base = state.base.lock().unwrap_or_else(|e| e.into_inner()).clone();
            Json(json!({"ok": true,
                "url": format!("{base}/link/?ticket={ticket}&app_id={app_id}")}))
            .into_response()
        }
        "chat.postMessage" => {
            let Some(app) = g.apps.get_mut(&token) else {
                return slack_error("invalid_auth");
            };
            if let Some(f) = app.post_faults.pop_front() {
                return send_fault(f);
            }
            let (Some(channel), Some(text)) = (args["channel"].as_str(), args["text"].as_str())
            else {
                return slack_error("no_text");
            };
            if text.is_empty() {
                return slack_error("no_text");
            }
            let blocks = args.get("blocks").cloned().unwrap_or_else(|| json!([]));
            if let Err(code) = check_blocks(&blocks) {
                return slack_error(code);
            }
            g.next_id += 1;
            let ts = format!("1700000001.{:06}", g.next_id);
            g.messages.insert(
                (token.clone(), channel.to_owned(), ts.clone()),
                Posted {
                    text: text.to_owned(),
                    blocks,
                    edits: 0,
                    deleted: false,
                    changed_at: Instant::now(),
                    streaming: false,
                },
            );
            g.posts.push(Sent {
                token,
                channel: channel.to_owned(),
                thread_ts: args["thread_ts"].as_str().map(str::to_owned),
                text: text.to_owned(),
                at: Instant::now(),
                ts: ts.clone(),
            });
            Json(json!({"ok": true, "channel": channel, "ts": ts,
                "message": {"type": "message", "text": text, "ts": ts}}))
            .into_response()
        }
        "chat.update" | "chat.delete" => {
            let Some(app) = g.apps.get_mut(&token) else {
                return slack_error("invalid_auth");
            };
            if method == "chat.update" {
                if let Some(f) = app.update_faults.pop_front() {
                    return send_fault(f);
                }
            }
            let (Some(channel), Some(ts)) = (args["channel"].as_str(), args["ts"].as_str()) else {
                return slack_error("message_not_found");
            };
            let key = (token.clone(), channel.to_owned(), ts.to_owned());
            let Some(m) = g.messages.get_mut(&key).filter(|m| !m.deleted) else {
                return slack_error("message_not_found");
            };
            if method == "chat.delete" {
                m.deleted = true;
                return Json(json!({"ok": true, "channel": channel, "ts": ts})).into_response();
            }
            let Some(text) = args["text"].as_str().filter(|t| !t.is_empty()) else {
                return slack_error("no_text");
            };
            if let Some(b) = args.get("blocks") {
                if let Err(code) = check_blocks(b) {
                    return slack_error(code);
                }
            }
            let now = Instant::now();
            let since = now.saturating_duration_since(m.changed_at);
            if let Some(left) = g.update_pace.and_then(|p| p.checked_sub(since)) {
                g.updates_paced += 1;
                let secs = left.as_secs_f64().ceil().max(1.0) as u64;
                return send_fault(SendFault::TooManyRequests(secs));
            }
            let Some(m) = g.messages.get_mut(&key) else {
                return slack_error("message_not_found");
            };
            if let Some(b) = args.get("blocks") {
                m.blocks = b.clone();
            }
            m.text = text.to_owned();
            m.edits += 1;
            m.changed_at = now;
            g.updated.push(Updated {
                token: token.clone(),
                channel: channel.to_owned(),
                ts: ts.to_owned(),
                text: text.to_owned(),
                at: now,
            });
            Json(json!({"ok": true, "channel": channel, "ts": ts, "text": text})).into_response()
        }
        "chat.startStream" | "chat.appendStream" | "chat.stopStream" => {
            if !g.apps.contains_key(&token) {
                return slack_error("invalid_auth");
            }
            stream(&mut g, &token, &method, &args)
        }
        "files.getUploadURLExternal" | "files.completeUploadExternal" => {
            files::web_method(&mut g, &base, &token, &method, &args)
        }
        _ => slack_error("unknown_method"),
    }
}

/// The longest `markdown_text` a streaming method takes.
const MAX_MARKDOWN: usize = 12_000;

/// `chat.startStream` (a reply in a thread, to a named recipient outside a DM),
/// `chat.appendStream` (text added to a message still streaming) and `chat.stopStream` (the
/// stream ended, with its last text), as Slack checks them.
fn stream(g: &mut Inner, token: &str, method: &str, args: &Value) -> Response {
    let Some(channel) = args["channel"].as_str().filter(|c| !c.is_empty()) else {
        return slack_error("channel_not_found");
    };
    let markdown = args["markdown_text"].as_str();
    if markdown.is_some_and(|m| m.chars().count() > MAX_MARKDOWN) {
        return slack_error("msg_too_long");
    }
    if method == "chat.startStream" {
        if let Some(n) = g.streams_refused.get_mut(token) {
            *n += 1;
            return slack_error("missing_scope");
        }
        // Streamed messages answer a user: always in a thread, and outside a DM to a named
        // recipient.
        let thread = args["thread_ts"].as_str().filter(|t| !t.is_empty());
        let recipient = args["recipient_user_id"].as_str().is_some()
            && args["recipient_team_id"].as_str().is_some();
        if thread.is_none() || (!channel.starts_with('D') && !recipient) {
            return slack_error("invalid_arguments");
        }
        g.next_id += 1;
        let ts = format!("1700000002.{:06}", g.next_id);
        g.messages.insert(
            (token.to_owned(), channel.to_owned(), ts.clone()),
            Posted {
                text: markdown.unwrap_or_default().to_owned(),
                blocks: json!([]),
                edits: 0,
                deleted: false,
                changed_at: Instant::now(),
                streaming: true,
            },
        );
        g.streams
            .push((token.to_owned(), channel.to_owned(), ts.clone()));
        return Json(json!({"ok": true, "channel": channel, "ts": ts})).into_response();
    }
    let Some(ts) = args["ts"].as_str() else {
        return slack_error("invalid_arguments");
    };
    let Some(m) = g
        .messages
        .get_mut(&(token.to_owned(), channel.to_owned(), ts.to_owned()))
        .filter(|m| !m.deleted)
    else {
        return slack_error("message_not_found");
    };
    if !m.streaming {
        return slack_error("message_not_in_streaming_state");
    }
    if method == "chat.appendStream" {
        let Some(more) = markdown.filter(|t| !t.is_empty()) else {
            return slack_error("invalid_arguments");
        };
        m.text.push_str(more);
        m.edits += 1;
        m.changed_at = Instant::now();
        return Json(json!({"ok": true, "channel": channel, "ts": ts})).into_response();
    }
    if let Some(last) = markdown {
        m.text.push_str(last);
    }
    m.streaming = false;
    m.changed_at = Instant::now();
    Json(json!({"ok": true, "channel": channel, "ts": ts,
        "message": {"type": "message", "text": m.text, "ts": ts}}))
    .into_response()
}

/// The answer of a Web API call given `f`.
fn send_fault(f: SendFault) -> Response {
    match f {
        SendFault::TooManyRequests(s) => (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", s.to_string())],
            Json(json!({"ok": false, "error": "ratelimited"})),
        )
            .into_response(),
        SendFault::ServerError => {
            (StatusCode::INTERNAL_SERVER_ERROR, "upstream failure").into_response()
        }
        SendFault::Error(code) => slack_error(&code),
    }
}

/// Checks blocks as Slack does for what the fleet sends: at most 50 blocks, an `actions`
/// block of 1–25 buttons with a text, a unique `action_id`, and a `value` of at most 2,000
/// characters or a `url`.
fn check_blocks(blocks: &Value) -> Result<(), &'static str> {
    let Some(list) = blocks.as_array() else {
        return Err("invalid_blocks_format");
    };
    if list.len() > 50 {
        return Err("invalid_blocks");
    }
    let mut ids = std::collections::HashSet::new();
    for b in list {
        if b["type"] != "actions" {
            continue;
        }
        let elements = b["elements"].as_array().ok_or("invalid_blocks")?;
        if elements.is_empty() || elements.len() > 25 {
            return Err("invalid_blocks");
        }
        for e in elements {
            let id = e["action_id"].as_str().ok_or("invalid_blocks")?;
            let texted = e["text"]["text"].as_str().is_some_and(|t| !t.is_empty());
            let value_ok = e["value"]
                .as_str()
                .is_some_and(|v| v.chars().count() <= 2000);
            if !ids.insert(id.to_owned()) || !texted || !(value_ok || e["url"].is_string()) {
                return Err("invalid_blocks");
            }
        }
    }
    Ok(())
}

/// An interaction's `response_url`: usable five times within 30 minutes, as Slack's.
async fn respond(
    State(state): State<FakeSlackState>,
    Path(id): Path<String>,
    Json(body): Json<Value>,
) -> Response {
    let mut g = state.lock();
    let Some((_, pressed_at, rs)) = g.interactions.get_mut(&id) else {
        return (StatusCode::NOT_FOUND, "no_such_response_url").into_response();
    };
    if rs.len() >= 5 || pressed_at.elapsed() > Duration::from_secs(1800) {
        return (StatusCode::NOT_FOUND, "expired_url").into_response();
    }
    rs.push(Responded {
        body,
        pressed_at: *pressed_at,
        at: Instant::now(),
    });
    (StatusCode::OK, "ok").into_response()
}

async fn link(
    State(state): State<FakeSlackState>,
    Query(q): Query<HashMap<String, String>>,
    ws: WebSocketUpgrade,
) -> Response {
    let ticket = q.get("ticket").cloned().unwrap_or_default();
    let Some(app) = state.lock().tickets.remove(&ticket) else {
        return (StatusCode::UNAUTHORIZED, "unknown or used ticket").into_response();
    };
    ws.read_buffer_size(8 * 1024)
        .write_buffer_size(0)
        .on_upgrade(move |socket| session(state, app, socket))
}

/// One Socket Mode connection.
async fn session(state: FakeSlackState, app: String, socket: WebSocket) {
    let (mut sink, mut stream) = socket.split();
    let (tx, mut rx) = mpsc::unbounded_channel::<Message>();
    let registered = {
        let mut g = state.lock();
        g.next_id += 1;
        let id = g.next_id;
        let count = g.sockets.values().filter(|s| s.app == app).count();
        if count >= 10 {
            None
        } else {
            let others: Vec<u64> = g
                .sockets
                .iter()
                .filter(|(_, s)| s.app == app && !s.refreshing)
                .map(|(k, _)| *k)
                .collect();
            g.sockets.insert(
                id,
                SocketRec {
                    app: app.clone(),
                    tx: tx.clone(),
                    last_seen: Instant::now(),
                    refreshing: false,
                },
            );
            if let Some(a) = g.apps.values_mut().find(|a| a.id == app) {
                a.max_sockets = a.max_sockets.max(count + 1);
            }
            Some((id, others))
        }
    };
    let Some((id, others)) = registered else {
        let frame = json!({"type": "disconnect", "reason": "too_many_websockets",
            "debug_info": {"host": "fake-slack"}});
        let _ = sink.send(Message::Text(frame.to_string().into())).await;
        let _ = sink.close().await;
        return;
    };
    if !others.is_empty() {
        // Another socket that was not asked to go: two holders, unless it turns out to be one
        // its client already closed (the server has not read that close yet), or one whose
        // client stopped answering pings (a frozen process: Slack no longer counts on it).
        let (inner, overlaps) = (state.inner.clone(), state.overlaps.clone());
        let alive_for = Duration::from_millis(state.ping_every_ms.load(Ordering::SeqCst) * 3);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let g = lock(&inner);
            if others.iter().any(|o| {
                g.sockets
                    .get(o)
                    .is_some_and(|s| !s.refreshing && s.last_seen.elapsed() < alive_for)
            }) {
                overlaps.fetch_add(1, Ordering::SeqCst);
            }
        });
    }
    let hello = json!({"type": "hello", "num_connections": 1,
        "debug_info": {"host": "fake-slack", "build_number": 1, "approximate_connection_time": 18060},
        "connection_info": {"app_id": app}});
    if sink
        .send(Message::Text(hello.to_string().into()))
        .await
        .is_ok()
    {
        if let Some(a) = state.lock().apps.values_mut().find(|a| a.id == app) {
            a.last_hello = Some(Instant::now());
        }
        state.wake.notify_waiters();
        let ping_every = Duration::from_millis(state.ping_every_ms.load(Ordering::SeqCst));
        let mut ping = tokio::time::interval(ping_every);
        ping.tick().await;
        loop {
            tokio::select! {
                m = stream.next() => match m {
                    Some(Ok(Message::Text(t))) => {
                        let mut g = state.lock();
                        if let Some(s) = g.sockets.get_mut(&id) {
                            s.last_seen = Instant::now();
                        }
                        if let Ok(v) = serde_json::from_str::<Value>(&t) {
                            if let Some(env) = v["envelope_id"].as_str() {
                                if let Some(f) = g.in_flight.remove(env) {
                                    let took = f.sent_at.elapsed();
                                    let deadline = Duration::from_millis(
                                        state.ack_deadline_ms.load(Ordering::SeqCst),
                                    );
                                    g.ack_latencies.push(took);
                                    if took >= deadline {
                                        // Too late: Slack has already decided to retry.
                                        if let Some(a) =
                                            g.apps.values_mut().find(|a| a.id == app)
                                        {
                                            a.pending.push_front(f.event);
                                        }
                                        drop(g);
                                        state.wake.notify_waiters();
                                    }
                                }
                            }
                        }
                    }
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                    Some(Ok(_)) => {
                        if let Some(s) = state.lock().sockets.get_mut(&id) {
                            s.last_seen = Instant::now();
                        }
                    }
                },
                out = rx.recv() => match out {
                    Some(Message::Close(c)) => {
                        let _ = sink.send(Message::Close(c)).await;
                        break;
                    }
                    Some(m) => if sink.send(m).await.is_err() { break },
                    None => break,
                },
                _ = ping.tick() => {
                    if sink.send(Message::Ping(Vec::new().into())).await.is_err() { break }
                }
            }
        }
    }
    // Gone: what it was given and did not acknowledge goes to the app's other sockets.
    let mut g = state.lock();
    g.sockets.remove(&id);
    let mut orphans: Vec<(Instant, String)> = g
        .in_flight
        .iter()
        .filter(|(_, f)| f.socket == id)
        .map(|(k, f)| (f.sent_at, k.clone()))
        .collect();
    // Back to the front of the queue in the order they were sent.
    orphans.sort();
    for (_, k) in orphans.into_iter().rev() {
        if let Some(f) = g.in_flight.remove(&k) {
            if let Some(a) = g.apps.values_mut().find(|a| a.id == app) {
                a.pending.push_front(f.event);
            }
        }
    }
    drop(g);
    state.wake.notify_waiters();
}

/// The fake's routes, callable without a socket.
pub fn app(state: FakeSlackState) -> Router {
    Router::new()
        .route("/api/{method}", post(web_api))
        .route("/response/{id}", post(respond))
        .route("/files-pri/{*rest}", axum::routing::get(files::download))
        .route("/upload/{id}", post(files::upload))
        .layer(axum::extract::DefaultBodyLimit::max(64 * 1024 * 1024))
        .route("/link/", any(link))
        .with_state(state)
}

/// `application/x-www-form-urlencoded` escaping of one component.
fn form_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'*' => {
                out.push(char::from(b));
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Delivers an Events API subscriber's queue (see [`FakeSlackState::subscribe_events`]).
async fn deliver_events(state: FakeSlackState, bot_token: String) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_default();
    loop {
        let woken = state.wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let now = Instant::now();
        let picks = {
            let mut ev = state.events.lock().unwrap_or_else(|e| e.into_inner());
            let Some(sub) = ev.get_mut(&bot_token) else {
                return;
            };
            let (url, secret) = (sub.url.clone(), sub.secret.clone());
            let in_flight = sub.queue.iter().filter(|d| d.in_flight).count();
            let mut busy = std::collections::HashSet::new();
            let mut picks = Vec::new();
            for d in &mut sub.queue {
                let waiting = d.in_flight || d.retry_at.is_some_and(|t| t > now);
                let blocked = !busy.insert(d.channel.clone());
                if waiting || blocked || in_flight + picks.len() >= 8 {
                    continue;
                }
                d.in_flight = true;
                let (body, content_type) = match &d.form {
                    Some(f) => (f.clone(), "application/x-www-form-urlencoded"),
                    None => (d.payload.to_string(), "application/json"),
                };
                picks.push((
                    d.id.clone(),
                    body,
                    content_type,
                    d.attempts,
                    url.clone(),
                    secret.clone(),
                ));
            }
            picks
        };
        for (id, body, content_type, attempts, url, secret) in picks {
            let (state, http, bot_token) = (state.clone(), http.clone(), bot_token.clone());
            tokio::spawn(async move {
                let ts = (botfleet_core::unix_ms() / 1000).to_string();
                let mut req = http
                    .post(&url)
                    .header("content-type", content_type)
                    .header("x-slack-request-timestamp", &ts)
                    .header(
                        "x-slack-signature",
                        crate::sign(&secret, &ts, body.as_bytes()),
                    );
                if attempts > 0 {
                    req = req
                        .header("x-slack-retry-num", attempts.to_string())
                        .header("x-slack-retry-reason", "http_error");
                }
                let ok = req
                    .body(body)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success());
                {
                    let mut ev = state.events.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(sub) = ev.get_mut(&bot_token) {
                        if let Some(pos) = sub.queue.iter().position(|d| d.id == id) {
                            if ok {
                                sub.queue.remove(pos);
                            } else {
                                let d = &mut sub.queue[pos];
                                d.in_flight = false;
                                d.attempts += 1;
                                d.retry_at = Some(
                                    Instant::now()
                                        + Duration::from_millis(100u64 << d.attempts.min(5)),
                                );
                            }
                        }
                    }
                }
                if ok {
                    state.events_delivered.fetch_add(1, Ordering::SeqCst);
                } else {
                    state.events_failed.fetch_add(1, Ordering::SeqCst);
                }
                state.wake.notify_waiters();
            });
        }
        tokio::select! {
            () = woken => {}
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

/// A running fake Slack on `127.0.0.1:<free port>`; stops when dropped.
pub struct FakeSlack {
    addr: SocketAddr,
    state: FakeSlackState,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl FakeSlack {
    /// Binds `127.0.0.1:0` and serves in the background, with a delivery loop.
    ///
    /// # Errors
    /// When no loopback port can be bound.
    pub async fn start() -> std::io::Result<Self> {
        let state = FakeSlackState::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        *state.base.lock().unwrap_or_else(|e| e.into_inner()) = format!("ws://{addr}");
        let router = app(state.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        let s = state.clone();
        let delivery = tokio::spawn(async move {
            loop {
                let woken = s.wake.notified();
                tokio::pin!(woken);
                woken.as_mut().enable();
                s.deliver();
                tokio::select! {
                    () = woken => {}
                    () = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
            }
        });
        Ok(Self {
            addr,
            state,
            tasks: vec![server, delivery],
        })
    }

    /// `http://127.0.0.1:<port>/api/`: pass as the bots' API URL.
    pub fn url(&self) -> String {
        format!("http://{}/api/", self.addr)
    }

    /// The shared state: add apps, write as users, read what was posted.
    pub fn state(&self) -> &FakeSlackState {
        &self.state
    }
}

impl Drop for FakeSlack {
    fn drop(&mut self) {
        // Ends the Events API delivery loops.
        self.state
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        for t in &self.tasks {
            t.abort();
        }
    }
}
