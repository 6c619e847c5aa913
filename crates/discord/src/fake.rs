//! A fake Discord (feature `fake`) speaking the real JSON: REST (`GET /users/@me`,
//! `GET /gateway/bot`, `POST /channels/{id}/messages`) under `/api/v10`, and a gateway at
//! `/gateway` with HELLO, heartbeats and ACKs, IDENTIFY (one per 5 s per bucket: a faster one
//! is counted as a violation and closed with 4008, as Discord rate-limits), READY with a
//! `resume_gateway_url`, RESUME with a replay of what the session missed and RESUMED, op 7
//! RECONNECT and op 9 INVALID_SESSION drills, zombie shards (heartbeats not ACKed), close codes,
//! and a count of sessions attached per shard (two at once is a failure of the host).
//!
//! Bots are registered with [`FakeDiscordState::add_bot`]; a user writes with
//! [`FakeDiscordState::user_writes`], which this fake routes as Discord does, by guild:
//! every channel is its own guild, [`guild_of`] it, so it lands on shard `channel % shards`.
//! `GET /channels/{id}` names a channel's guild. Sessions live for the
//! fake's life, so a host killed mid-session can RESUME, as Discord allows for a while.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use axum::{
    extract::{
        ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade},
        Path, State,
    },
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::{any, get, post},
    Json, Router,
};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::lock;

mod files;
mod interactions;
pub use files::SentFile;
pub use interactions::{Answered, Interaction};

/// A message the fake received through `POST /channels/{id}/messages`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    /// The bot token it was sent with.
    pub token: String,
    /// The channel.
    pub channel: String,
    /// The content.
    pub content: String,
    /// The message it answers, if any.
    pub reply_to: Option<String>,
    /// When the fake received it.
    pub at: Instant,
    /// The id the fake gave it.
    pub id: String,
    /// The files it carried.
    pub files: Vec<SentFile>,
}

/// A message a bot sent, as it stands now (after edits and deletes).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Shown {
    /// Its content now.
    pub content: String,
    /// Edits made to it.
    pub edits: u32,
    /// Whether it was deleted.
    pub deleted: bool,
    /// Its buttons' `custom_id`s now, in order.
    pub buttons: Vec<String>,
    /// The channel it is in.
    pub channel: String,
    /// Only the user who acted sees it (an ephemeral answer): no channel route reaches it.
    pub ephemeral: bool,
    /// The names of the files it shows.
    pub files: Vec<String>,
    /// Edits made through an interaction's webhook (of [`Shown::edits`]).
    pub hook_edits: u32,
    /// When it last changed through the channel's routes (created or edited).
    pub changed_at: Option<Instant>,
}

/// An edit of a bot's message the fake took (`PATCH /channels/{channel}/messages/{id}`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Edited {
    /// The channel.
    pub channel: String,
    /// The message.
    pub id: String,
    /// Its content after the edit.
    pub content: String,
    /// When the fake took it.
    pub at: Instant,
}

/// A fault to answer the next message create of a bot with.
#[derive(Clone, Debug, PartialEq)]
pub enum SendFault {
    /// HTTP 429 with `retry_after` seconds.
    TooManyRequests(f64),
    /// HTTP 429 with `retry_after` seconds and `"global": true` (the bot's global limit),
    /// as Discord answers it (with `X-RateLimit-Global` and `X-RateLimit-Scope: global`).
    GlobalTooManyRequests(f64),
    /// HTTP 500.
    ServerError,
    /// The message is taken (and shows in `sent`), but its answer is held back for a minute,
    /// as if the connection hung after Discord accepted it: the sender cannot tell it went out.
    AnswerLost,
}

/// What goes to a connected socket.
enum Out {
    Frame(Value),
    Close(u16),
}

struct Session {
    token: String,
    shard: u32,
    seq: u64,
    /// Every dispatch of the session, for RESUME.
    events: Vec<(u64, Value)>,
    /// The socket it is attached to, if any.
    attached: Option<(u64, mpsc::UnboundedSender<Out>)>,
}

#[derive(Default)]
struct BotState {
    user_id: String,
    shards: u32,
    max_concurrency: u32,
    remaining: u32,
    revoked: bool,
    /// Shard → its current session id.
    current: HashMap<u32, String>,
    /// Shard → sockets attached now, and the most ever at once.
    attached: HashMap<u32, u32>,
    max_attached: u32,
    last_identify: HashMap<u32, Instant>,
    identifies: u64,
    resumes: u64,
    replayed: u64,
    violations: u64,
    dropped: u64,
    zombies: HashSet<u32>,
    /// Shard → when a session last started or resumed on it.
    served: HashMap<u32, Instant>,
    posts: Vec<Sent>,
    /// Message id → the message as it stands.
    shown: HashMap<String, Shown>,
    /// Channels the bot showed typing in, one entry per call.
    typing: Vec<String>,
    /// `{channel}/{nonce}` → the id of the message first sent with it.
    nonces: HashMap<String, String>,
    duplicates: u64,
    faults: VecDeque<SendFault>,
    /// Faults for edits of messages only.
    edit_faults: VecDeque<SendFault>,
    /// The edits taken, in order.
    edited: Vec<Edited>,
    /// Edits answered 429 for the pace.
    edits_paced: u64,
    /// Channel → its message route's window: when it began, the messages taken in it.
    windows: HashMap<String, (Instant, u32)>,
    /// Messages answered 429 for the route's limit ([`FakeDiscordState::limit_messages`]).
    routes_limited: u64,
    /// The application commands last registered.
    commands: Option<Value>,
    command_writes: u64,
    /// Channels the bot may not post in (no Send Messages permission there).
    muted: HashSet<String>,
}

#[derive(Default)]
struct Inner {
    bots: Mutex<HashMap<String, BotState>>,
    sessions: Mutex<HashMap<String, Session>>,
    url: Mutex<String>,
    /// Requests per token (REST calls, IDENTIFYs, RESUMEs), refused ones included.
    requests: Mutex<HashMap<String, u64>>,
    heartbeat_ms: AtomicU64,
    next_id: AtomicU64,
    /// The last `edited_timestamp` given, in unix ms.
    last_edit_ms: Mutex<i64>,
    /// Users' attachments by id: the bytes, and how many times they were downloaded.
    attachments: Mutex<HashMap<String, (Vec<u8>, usize)>>,
    /// Interactions dispatched, by id.
    interactions: Mutex<HashMap<String, Interaction>>,
    /// Edits of one message closer than this to its last change are answered 429.
    edit_pace: Mutex<Option<Duration>>,
    /// The message route's limit per channel: messages a window, the window.
    message_limit: Mutex<Option<(u32, Duration)>>,
}

/// The fake's state, shared with the test. Cloning shares it.
#[derive(Clone, Default)]
pub struct FakeDiscordState {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for FakeDiscordState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeDiscordState").finish_non_exhaustive()
    }
}

/// The guild of `channel` here: `channel << 22`, so that Discord's routing,
/// `(guild_id >> 22) % shards`, sends it to shard `channel % shards`.
pub fn guild_of(channel: u64) -> u64 {
    channel << 22
}

impl FakeDiscordState {
    fn id(&self) -> u64 {
        // Snowflake-like ids, increasing.
        (1 << 40) + self.inner.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Registers a bot token with `shards` recommended shards and `max_concurrency` identify
    /// buckets.
    pub fn add_bot(&self, token: &str, shards: u32, max_concurrency: u32) {
        let user_id = self.id().to_string();
        lock(&self.inner.bots).insert(
            token.to_owned(),
            BotState {
                user_id,
                shards: shards.max(1),
                max_concurrency: max_concurrency.max(1),
                remaining: 1000,
                ..BotState::default()
            },
        );
    }

    /// Discord now recommends `shards` for the bot (`GET /gateway/bot`), and routes its
    /// users' messages over that many; like Discord for a bot that outgrew its count, an
    /// IDENTIFY with fewer is refused (4011).
    pub fn set_shards(&self, token: &str, shards: u32) {
        if let Some(b) = lock(&self.inner.bots).get_mut(token) {
            b.shards = shards.max(1);
        }
    }

    /// The token is refused from now on (REST 401; its sockets closed with 4004).
    pub fn revoke(&self, token: &str) {
        if let Some(b) = lock(&self.inner.bots).get_mut(token) {
            b.revoked = true;
        }
        let sessions = lock(&self.inner.sessions);
        for s in sessions.values().filter(|s| s.token == token) {
            if let Some((_, tx)) = &s.attached {
                let _ = tx.send(Out::Close(4004));
            }
        }
    }

    /// Sets the identify budget left today.
    pub fn set_remaining(&self, token: &str, remaining: u32) {
        if let Some(b) = lock(&self.inner.bots).get_mut(token) {
            b.remaining = remaining;
        }
    }

    /// The heartbeat interval HELLO announces (default 41,250 ms).
    pub fn set_heartbeat(&self, interval: Duration) {
        self.inner.heartbeat_ms.store(
            u64::try_from(interval.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
            Ordering::Relaxed,
        );
    }

    /// A user writes `text` in `channel`: a `MESSAGE_CREATE` on shard `channel % shards`, in
    /// the shard's current session (buffered for RESUME when no socket is attached; lost, as
    /// on Discord, when the shard never had a session). Answers the message id.
    pub fn user_writes(&self, token: &str, channel: u64, text: &str) -> String {
        let id = self.id().to_string();
        let d = json!({
            "id": id, "channel_id": channel.to_string(), "guild_id": guild_of(channel).to_string(),
            "author": {"id": "4242", "username": "user"}, "content": text,
        });
        self.user_dispatch(token, channel, "MESSAGE_CREATE", d);
        id
    }

    /// The user edits their message `id` in `channel` to `text`: a `MESSAGE_UPDATE` with the
    /// whole message and its new `edited_timestamp`, in the shard's current session.
    pub fn user_edits(&self, token: &str, channel: u64, id: &str, text: &str) {
        // Now, a millisecond apart from the fake's last edit: each edit has its own time.
        let at = {
            let mut last = lock(&self.inner.last_edit_ms);
            *last = botfleet_core::unix_ms().max(*last + 1);
            *last
        };
        let d = json!({
            "id": id, "channel_id": channel.to_string(), "guild_id": guild_of(channel).to_string(),
            "author": {"id": "4242", "username": "user"}, "content": text,
            "edited_timestamp": crate::inbound::iso_of_unix_ms(at),
        });
        self.user_dispatch(token, channel, "MESSAGE_UPDATE", d);
    }

    /// A user's dispatch `t` in `channel`, on shard `channel % shards`.
    fn user_dispatch(&self, token: &str, channel: u64, t: &str, d: Value) {
        let (shard, session) = {
            let bots = lock(&self.inner.bots);
            let Some(b) = bots.get(token) else {
                return;
            };
            let guild = guild_of(channel).to_string();
            let shard = crate::shard_of_guild(Some(&guild), b.shards);
            (shard, b.current.get(&shard).cloned())
        };
        match session {
            Some(sid) => self.dispatch(&sid, t, d),
            None => {
                if let Some(b) = lock(&self.inner.bots).get_mut(token) {
                    b.dropped += 1;
                }
            }
        }
        let _ = shard;
    }

    /// Sends a dispatch in session `sid` (recorded for RESUME; to its socket if attached).
    fn dispatch(&self, sid: &str, t: &str, d: Value) {
        let mut sessions = lock(&self.inner.sessions);
        let Some(s) = sessions.get_mut(sid) else {
            return;
        };
        s.seq += 1;
        let frame = json!({"op": 0, "t": t, "s": s.seq, "d": d});
        s.events.push((s.seq, frame.clone()));
        if let Some((_, tx)) = &s.attached {
            let _ = tx.send(Out::Frame(frame));
        }
    }

    fn to_shard(&self, token: &str, shard: u32, out: impl Fn() -> Out) {
        let Some(sid) = lock(&self.inner.bots)
            .get(token)
            .and_then(|b| b.current.get(&shard).cloned())
        else {
            return;
        };
        if let Some((_, tx)) = lock(&self.inner.sessions)
            .get(&sid)
            .and_then(|s| s.attached.as_ref())
        {
            let _ = tx.send(out());
        }
    }

    /// Sends op 7 RECONNECT to the shard's socket.
    pub fn reconnect(&self, token: &str, shard: u32) {
        self.to_shard(token, shard, || Out::Frame(json!({"op": 7, "d": null})));
    }

    /// Sends op 9 INVALID_SESSION (`resumable` or not) to the shard's socket; a session that
    /// cannot be resumed is forgotten.
    pub fn invalidate(&self, token: &str, shard: u32, resumable: bool) {
        self.to_shard(token, shard, || {
            Out::Frame(json!({"op": 9, "d": resumable}))
        });
        if !resumable {
            let sid = lock(&self.inner.bots)
                .get_mut(token)
                .and_then(|b| b.current.remove(&shard));
            if let Some(sid) = sid {
                lock(&self.inner.sessions).remove(&sid);
            }
        }
    }

    /// Closes the shard's socket with `code`.
    pub fn close(&self, token: &str, shard: u32, code: u16) {
        self.to_shard(token, shard, || Out::Close(code));
    }

    /// Stops (or resumes) ACKing the shard's heartbeats: a zombie connection.
    pub fn zombie(&self, token: &str, shard: u32, on: bool) {
        if let Some(b) = lock(&self.inner.bots).get_mut(token) {
            if on {
                b.zombies.insert(shard);
            } else {
                b.zombies.remove(&shard);
            }
        }
    }

    /// Takes from the bot of `token` the right to post in `channel`, as a server's
    /// permissions (or a user-installed app) do: its message creates and typing there are
    /// refused with 403 `Missing Permissions` (50013). Its interactions there can still be
    /// answered.
    pub fn mute(&self, token: &str, channel: u64) {
        if let Some(b) = lock(&self.inner.bots).get_mut(token) {
            b.muted.insert(channel.to_string());
        }
    }

    /// The next edit of a message of the bot fails with `fault`.
    pub fn inject_edit(&self, token: &str, fault: SendFault) {
        if let Some(b) = lock(&self.inner.bots).get_mut(token) {
            b.edit_faults.push_back(fault);
        }
    }

    /// Paces the edits of each message as Discord's per-route limit does (about one a
    /// second per message over a stream): an edit within `every` of the message's last change
    /// is answered 429 with the seconds left as `retry_after` (counted in
    /// [`Self::edits_paced`]). `None`: no pace (the default).
    pub fn pace_edits(&self, every: Option<Duration>) {
        *lock(&self.inner.edit_pace) = every;
    }

    /// Keeps Discord's per-route limit of a channel's messages (`POST
    /// /channels/{id}/messages`) as `limit` a `window` per bot and channel, and announces it
    /// as Discord does on every answer of the route (`X-RateLimit-Bucket`, `-Limit`,
    /// `-Remaining`, `-Reset-After`); a message past it is answered 429 with the time left
    /// (counted in [`Self::messages_limited`]). `None`: no limit, no headers (the default).
    pub fn limit_messages(&self, limit: Option<(u32, Duration)>) {
        *lock(&self.inner.message_limit) = limit;
    }

    /// The bot's messages answered 429 for the limit of [`Self::limit_messages`].
    pub fn messages_limited(&self, token: &str) -> u64 {
        self.read(token, |b| b.routes_limited).unwrap_or(0)
    }

    /// The bot's edits answered 429 for the pace of [`Self::pace_edits`].
    pub fn edits_paced(&self, token: &str) -> u64 {
        self.read(token, |b| b.edits_paced).unwrap_or(0)
    }

    /// The bot's edits of its messages the fake took, in order.
    pub fn edits(&self, token: &str) -> Vec<Edited> {
        self.read(token, |b| b.edited.clone()).unwrap_or_default()
    }

    /// The next message create of the bot fails with `fault`.
    pub fn inject_send(&self, token: &str, fault: SendFault) {
        if let Some(b) = lock(&self.inner.bots).get_mut(token) {
            b.faults.push_back(fault);
        }
    }

    fn read<T>(&self, token: &str, f: impl FnOnce(&BotState) -> T) -> Option<T> {
        lock(&self.inner.bots).get(token).map(f)
    }

    /// IDENTIFYs the bot sent.
    pub fn identifies(&self, token: &str) -> u64 {
        self.read(token, |b| b.identifies).unwrap_or(0)
    }

    /// RESUMEs the bot sent that found their session.
    pub fn resumes(&self, token: &str) -> u64 {
        self.read(token, |b| b.resumes).unwrap_or(0)
    }

    /// Messages RESUMEs sent again (the session's checkpoint was behind them).
    pub fn replayed(&self, token: &str) -> u64 {
        self.read(token, |b| b.replayed).unwrap_or(0)
    }

    /// IDENTIFYs sooner than 5 s after another in the same bucket.
    pub fn identify_violations(&self, token: &str) -> u64 {
        self.read(token, |b| b.violations).unwrap_or(0)
    }

    /// The most sessions ever live at once on one shard of the bot (above 1: two hosts
    /// identified the shard and ran it at the same time; a RESUME moves a session and does not
    /// count twice).
    pub fn max_sessions_per_shard(&self, token: &str) -> u32 {
        self.read(token, |b| b.max_attached).unwrap_or(0)
    }

    /// Shards with a socket attached now.
    pub fn connected_shards(&self, token: &str) -> u32 {
        self.read(token, |b| {
            u32::try_from(b.attached.values().filter(|n| **n > 0).count()).unwrap_or(0)
        })
        .unwrap_or(0)
    }

    /// How many of `tokens` had every shard's session start or resume at or after `since`.
    pub fn served_since_among(&self, tokens: &[String], since: Instant) -> usize {
        let bots = lock(&self.inner.bots);
        tokens
            .iter()
            .filter(|t| {
                bots.get(*t).is_some_and(|b| {
                    (0..b.shards).all(|s| b.served.get(&s).is_some_and(|at| *at >= since))
                })
            })
            .count()
    }

    /// Shard sessions with a socket now, over every bot.
    pub fn connected_total(&self) -> u32 {
        lock(&self.inner.bots)
            .values()
            .map(|b| b.attached.values().filter(|n| **n > 0).count() as u32)
            .sum()
    }

    /// The bot's message `id` as it stands now.
    pub fn message(&self, token: &str, id: &str) -> Option<Shown> {
        self.read(token, |b| b.shown.get(id).cloned()).flatten()
    }

    /// Channels the bot showed typing in, one per call.
    pub fn typing(&self, token: &str) -> Vec<String> {
        self.read(token, |b| b.typing.clone()).unwrap_or_default()
    }

    /// Every message the fake received, of every bot, in order.
    pub fn sent(&self) -> Vec<Sent> {
        let mut all: Vec<Sent> = lock(&self.inner.bots)
            .values()
            .flat_map(|b| b.posts.iter().cloned())
            .collect();
        all.sort_by_key(|p| p.at);
        all
    }

    /// Messages written while their shard had no session (lost, as on Discord).
    pub fn dropped(&self, token: &str) -> u64 {
        self.read(token, |b| b.dropped).unwrap_or(0)
    }

    /// What the bot sent, in order.
    pub fn sent_by(&self, token: &str) -> Vec<Sent> {
        self.read(token, |b| b.posts.clone()).unwrap_or_default()
    }

    /// Sends Discord dropped as repeats of an earlier nonce.
    pub fn duplicate_sends(&self, token: &str) -> u64 {
        self.read(token, |b| b.duplicates).unwrap_or(0)
    }

    fn count(&self, token: &str) {
        *lock(&self.inner.requests)
            .entry(token.to_owned())
            .or_default() += 1;
    }

    /// Requests made with `token` (REST calls, IDENTIFYs, RESUMEs), refused ones included.
    pub fn requests_of(&self, token: &str) -> u64 {
        lock(&self.inner.requests).get(token).copied().unwrap_or(0)
    }

    fn auth(&self, headers: &HeaderMap) -> Option<String> {
        let token = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bot "))
            .unwrap_or_default()
            .to_owned();
        self.count(&token);
        match lock(&self.inner.bots).get(&token) {
            Some(b) if !b.revoked => Some(token),
            _ => None,
        }
    }
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        Json(json!({"message": "401: Unauthorized", "code": 0})),
    )
        .into_response()
}

async fn me(State(s): State<FakeDiscordState>, headers: HeaderMap) -> Response {
    match s.auth(&headers) {
        Some(token) => {
            let id = s.read(&token, |b| b.user_id.clone()).unwrap_or_default();
            Json(json!({"id": id, "username": "fakebot", "bot": true})).into_response()
        }
        None => unauthorized(),
    }
}

async fn gateway_bot(State(s): State<FakeDiscordState>, headers: HeaderMap) -> Response {
    match s.auth(&headers) {
        Some(token) => {
            let url = lock(&s.inner.url).clone();
            let (shards, remaining, conc) = s
                .read(&token, |b| (b.shards, b.remaining, b.max_concurrency))
                .unwrap_or((1, 0, 1));
            Json(json!({
                "url": url, "shards": shards,
                "session_start_limit": {"total": 1000, "remaining": remaining,
                                        "reset_after": 3_600_000, "max_concurrency": conc},
            }))
            .into_response()
        }
        None => unauthorized(),
    }
}

/// `GET /channels/{id}`: a guild text channel (every channel is its own guild here); an id
/// that is not a snowflake is Discord's 404 `10003` (Unknown Channel).
async fn get_channel(
    State(s): State<FakeDiscordState>,
    Path(channel): Path<String>,
    headers: HeaderMap,
) -> Response {
    if s.auth(&headers).is_none() {
        return unauthorized();
    }
    match channel.parse::<u64>() {
        Ok(id) => Json(json!({
            "id": channel, "type": 0, "guild_id": guild_of(id).to_string(),
        }))
        .into_response(),
        Err(_) => (
            StatusCode::NOT_FOUND,
            Json(json!({"message": "Unknown Channel", "code": 10003})),
        )
            .into_response(),
    }
}

async fn create_message(
    State(s): State<FakeDiscordState>,
    Path(channel): Path<String>,
    headers: HeaderMap,
    req: axum::extract::Request,
) -> Response {
    let (body, files) = match files::read_body(&s, req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let (answer, lost) = take_message(&s, channel, &headers, &body, files);
    if lost {
        tokio::time::sleep(Duration::from_secs(60)).await;
    }
    answer
}

/// The message create itself; `true` when its answer is to be held back
/// ([`SendFault::AnswerLost`]).
fn take_message(
    s: &FakeDiscordState,
    channel: String,
    headers: &HeaderMap,
    body: &Value,
    files: Vec<SentFile>,
) -> (Response, bool) {
    let answer = |r: Response| (r, false);
    let Some(token) = s.auth(headers) else {
        return answer(unauthorized());
    };
    let mut bots = lock(&s.inner.bots);
    let Some(b) = bots.get_mut(&token) else {
        return answer(StatusCode::UNAUTHORIZED.into_response());
    };
    if b.muted.contains(&channel) {
        return answer(missing_permissions());
    }
    // The route's window, as Discord keeps it: counted before the message is looked at.
    let limit = *lock(&s.inner.message_limit);
    let announced = limit.map(|(limit, window)| {
        let now = Instant::now();
        let w = b.windows.entry(channel.clone()).or_insert((now, 0));
        if now >= w.0 + window {
            *w = (now, 0);
        }
        let reset = (w.0 + window).saturating_duration_since(now);
        let over = w.1 >= limit;
        if !over {
            w.1 += 1;
        }
        (limit, limit - w.1, reset, over)
    });
    if let Some((limit, _, reset, true)) = announced {
        b.routes_limited += 1;
        let mut r = rate_limited((reset.as_secs_f64() * 1000.0).ceil() / 1000.0);
        announce(&mut r, limit, 0, reset);
        return answer(r);
    }
    let answer = |mut r: Response| {
        if let Some((limit, left, reset, _)) = announced {
            announce(&mut r, limit, left, reset);
        }
        (r, false)
    };
    let mut lost = false;
    match b.faults.pop_front() {
        Some(SendFault::TooManyRequests(secs)) => return answer(rate_limited(secs)),
        Some(SendFault::GlobalTooManyRequests(secs)) => return answer(globally_limited(secs)),
        Some(SendFault::ServerError) => {
            return answer(StatusCode::INTERNAL_SERVER_ERROR.into_response())
        }
        Some(SendFault::AnswerLost) => lost = true,
        None => {}
    }
    let content = body["content"]
        .as_str()
        .filter(|c| !c.is_empty() || !files.is_empty());
    let Some(content) = content else {
        return answer(
            (
                StatusCode::BAD_REQUEST,
                Json(json!({"message": "Cannot send an empty message", "code": 50006})),
            )
                .into_response(),
        );
    };
    if content.chars().count() > 2000 {
        return answer(
            (
                StatusCode::BAD_REQUEST,
                Json(json!({"message": "Invalid Form Body", "code": 50035})),
            )
                .into_response(),
        );
    }
    let buttons = match interactions::check_components(&body["components"]) {
        Ok(b) => b,
        Err(why) => {
            return answer(
                (
                    StatusCode::BAD_REQUEST,
                    Json(json!({"message": format!("Invalid Form Body: {why}"), "code": 50035})),
                )
                    .into_response(),
            )
        }
    };
    let id = s.id().to_string();
    if let Some(n) = body["nonce"]
        .as_str()
        .filter(|_| body["enforce_nonce"] == true)
    {
        // As Discord does: the repeat answers the message first sent with the nonce.
        if let Some(first) = b.nonces.get(&format!("{channel}/{n}")) {
            b.duplicates += 1;
            return answer(
                Json(json!({"id": first, "channel_id": channel, "content": content}))
                    .into_response(),
            );
        }
        b.nonces.insert(format!("{channel}/{n}"), id.clone());
    }
    b.posts.push(Sent {
        token: token.clone(),
        channel: channel.clone(),
        content: content.to_owned(),
        reply_to: body["message_reference"]["message_id"]
            .as_str()
            .map(str::to_owned),
        at: Instant::now(),
        id: id.clone(),
        files,
    });
    b.shown.insert(
        id.clone(),
        Shown {
            content: content.to_owned(),
            buttons,
            channel: channel.clone(),
            changed_at: Some(Instant::now()),
            ..Shown::default()
        },
    );
    drop(bots);
    let (r, _) =
        answer(Json(json!({"id": id, "channel_id": channel, "content": content})).into_response());
    (r, lost)
}

/// The bucket hash the fake's message route announces.
pub const MESSAGES_BUCKET: &str = "6d1f0c3e9b2a4c7d8e5f1a2b3c4d5e6f";

/// Adds Discord's headers of the message route's bucket to `r`.
fn announce(r: &mut Response, limit: u32, remaining: u32, reset: Duration) {
    let h = r.headers_mut();
    let mut put = |name: &'static str, v: String| {
        if let Ok(v) = axum::http::HeaderValue::from_str(&v) {
            h.insert(name, v);
        }
    };
    put("x-ratelimit-bucket", MESSAGES_BUCKET.to_owned());
    put("x-ratelimit-limit", limit.to_string());
    put("x-ratelimit-remaining", remaining.to_string());
    // To the millisecond, as Discord gives it (rounded up: never before the window ends).
    let ms = (reset.as_secs_f64() * 1000.0).ceil() / 1000.0;
    put("x-ratelimit-reset-after", format!("{ms:.3}"));
}

/// Discord's 429 for a route, asking to wait `secs`.
fn rate_limited(secs: f64) -> Response {
    (
        StatusCode::TOO_MANY_REQUESTS,
        Json(
            json!({"message": "You are being rate limited.", "retry_after": secs, "global": false}),
        ),
    )
        .into_response()
}

fn globally_limited(secs: f64) -> Response {
    (
        StatusCode::TOO_MANY_REQUESTS,
        [
            ("x-ratelimit-global", "true"),
            ("x-ratelimit-scope", "global"),
        ],
        Json(
            json!({"message": "You are being rate limited.", "retry_after": secs, "global": true}),
        ),
    )
        .into_response()
}

/// `PATCH` and `DELETE` of a bot's message, as Discord checks them: 404 `Unknown Message`
/// (code 10008) for one it does not have.
async fn change_message(
    State(s): State<FakeDiscordState>,
    Path((_channel, id)): Path<(String, String)>,
    method: axum::http::Method,
    headers: HeaderMap,
    body: Option<Json<Value>>,
) -> Response {
    let Some(token) = s.auth(&headers) else {
        return unauthorized();
    };
    let mut bots = lock(&s.inner.bots);
    let Some(b) = bots.get_mut(&token) else {
        return unauthorized();
    };
    // As Discord: a bot changes its messages only where it may post; an ephemeral answer
    // is no channel's message at all.
    if b.shown
        .get(&id)
        .is_some_and(|m| b.muted.contains(&m.channel))
    {
        return missing_permissions();
    }
    let Some(m) = b.shown.get_mut(&id).filter(|m| !m.deleted && !m.ephemeral) else {
        return (
            StatusCode::NOT_FOUND,
            Json(json!({"message": "Unknown Message", "code": 10008})),
        )
            .into_response();
    };
    if method == axum::http::Method::DELETE {
        m.deleted = true;
        return StatusCode::NO_CONTENT.into_response();
    }
    match b.edit_faults.pop_front() {
        Some(SendFault::TooManyRequests(secs)) => return rate_limited(secs),
        Some(SendFault::GlobalTooManyRequests(secs)) => return globally_limited(secs),
        Some(SendFault::ServerError) => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        Some(SendFault::AnswerLost) | None => {}
    }
    let now = Instant::now();
    let pace = *lock(&s.inner.edit_pace);
    let left = m
        .changed_at
        .zip(pace)
        .and_then(|(at, pace)| pace.checked_sub(now.saturating_duration_since(at)));
    if let Some(left) = left {
        b.edits_paced += 1;
        return rate_limited((left.as_secs_f64() * 1000.0).ceil() / 1000.0);
    }
    let Some(m) = b.shown.get_mut(&id) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let body = body.map(|Json(b)| b).unwrap_or_default();
    if let Some(c) = body["content"].as_str() {
        if c.is_empty() || c.chars().count() > 2000 {
            return (
                StatusCode::BAD_REQUEST,
                Json(json!({"message": "Invalid Form Body", "code": 50035})),
            )
                .into_response();
        }
        m.content = c.to_owned();
    }
    if let Some(c) = body.get("components") {
        match interactions::check_components(c) {
            Ok(b) => m.buttons = b,
            Err(why) => {
                return (
                    StatusCode::BAD_REQUEST,
                    Json(json!({"message": format!("Invalid Form Body: {why}"), "code": 50035})),
                )
                    .into_response()
            }
        }
    }
    m.edits += 1;
    m.changed_at = Some(now);
    let content = m.content.clone();
    b.edited.push(Edited {
        channel: m.channel.clone(),
        id: id.clone(),
        content: content.clone(),
        at: now,
    });
    Json(json!({"id": id, "content": content})).into_response()
}

/// `POST /channels/{id}/typing`.
async fn typing(
    State(s): State<FakeDiscordState>,
    Path(channel): Path<String>,
    headers: HeaderMap,
) -> Response {
    let Some(token) = s.auth(&headers) else {
        return unauthorized();
    };
    if let Some(b) = lock(&s.inner.bots).get_mut(&token) {
        if b.muted.contains(&channel) {
            return missing_permissions();
        }
        b.typing.push(channel);
    }
    StatusCode::NO_CONTENT.into_response()
}

/// Discord's answer to a bot posting where it may not.
fn missing_permissions() -> Response {
    (
        StatusCode::FORBIDDEN,
        Json(json!({"message": "Missing Permissions", "code": 50013})),
    )
        .into_response()
}

async fn gateway(State(s): State<FakeDiscordState>, ws: WebSocketUpgrade) -> Response {
    ws.on_upgrade(move |socket| connection(s, socket))
}

/// One gateway socket.
async fn connection(s: FakeDiscordState, socket: WebSocket) {
    let (mut sink, mut stream) = socket.split();
    let conn = s.inner.next_id.fetch_add(1, Ordering::Relaxed);
    let interval = match s.inner.heartbeat_ms.load(Ordering::Relaxed) {
        0 => 41_250,
        n => n,
    };
    let hello = json!({"op": 10, "d": {"heartbeat_interval": interval}});
    if sink
        .send(Message::Text(hello.to_string().into()))
        .await
        .is_err()
    {
        return;
    }
    let (tx, mut rx) = mpsc::unbounded_channel::<Out>();
    // The session this socket is attached to: (token, shard, session id).
    let mut attached: Option<(String, u32, String)> = None;
    loop {
        tokio::select! {
            out = rx.recv() => {
                let Some(out) = out else { break };
                let msg = match out {
                    Out::Frame(v) => Message::Text(v.to_string().into()),
                    Out::Close(code) => {
                        let _ = sink.send(Message::Close(Some(CloseFrame { code, reason: "".into() }))).await;
                        break;
                    }
                };
                if sink.send(msg).await.is_err() {
                    break;
                }
            }
            frame = stream.next() => {
                let Some(Ok(Message::Text(text))) = frame else {
                    match frame {
                        Some(Ok(_)) => continue,
                        _ => break,
                    }
                };
                let Ok(v) = serde_json::from_str::<Value>(&text) else { continue };
                match v["op"].as_u64() {
                    Some(1) => {
                        let zombie = attached.as_ref().is_some_and(|(t, shard, _)| {
                            s.read(t, |b| b.zombies.contains(shard)).unwrap_or(false)
                        });
                        if !zombie {
                            let _ = tx.send(Out::Frame(json!({"op": 11})));
                        }
                    }
                    Some(2) if attached.is_none() => match identify(&s, &v["d"], conn, &tx) {
                        Ok(a) => attached = Some(a),
                        Err(code) => { let _ = tx.send(Out::Close(code)); }
                    },
                    Some(6) if attached.is_none() => match resume(&s, &v["d"], conn, &tx) {
                        Some(a) => attached = Some(a),
                        None => { let _ = tx.send(Out::Frame(json!({"op": 9, "d": false}))); }
                    },
                    _ => {}
                }
            }
        }
    }
    if let Some((token, shard, sid)) = attached {
        if let Some(sess) = lock(&s.inner.sessions).get_mut(&sid) {
            if sess.attached.as_ref().is_some_and(|(c, _)| *c == conn) {
                sess.attached = None;
            }
        }
        recount(&s, &token, shard);
    }
}

/// Counts the sessions of the bot's shard that have a socket now (distinct sessions: a
/// RESUME moves a session, it does not add one), and keeps the most ever.
fn recount(s: &FakeDiscordState, token: &str, shard: u32) {
    let n = lock(&s.inner.sessions)
        .values()
        .filter(|x| x.token == token && x.shard == shard && x.attached.is_some())
        .count();
    let n = u32::try_from(n).unwrap_or(u32::MAX);
    if let Some(b) = lock(&s.inner.bots).get_mut(token) {
        b.attached.insert(shard, n);
        b.max_attached = b.max_attached.max(n);
    }
}

/// A session started or resumed on the shard now.
fn served(s: &FakeDiscordState, token: &str, shard: u32) {
    if let Some(b) = lock(&s.inner.bots).get_mut(token) {
        b.served.insert(shard, Instant::now());
    }
}

/// IDENTIFY: a new session, or the close code refusing it.
fn identify(
    s: &FakeDiscordState,
    d: &Value,
    conn: u64,
    tx: &mpsc::UnboundedSender<Out>,
) -> Result<(String, u32, String), u16> {
    let token = d["token"].as_str().unwrap_or_default().to_owned();
    s.count(&token);
    let shard_arr = d["shard"].as_array();
    let (shard, total) = match shard_arr.map(|a| {
        (
            a.first().and_then(Value::as_u64),
            a.get(1).and_then(Value::as_u64),
        )
    }) {
        Some((Some(i), Some(n))) => (
            u32::try_from(i).unwrap_or(u32::MAX),
            u32::try_from(n).unwrap_or(0),
        ),
        _ => (0, 1),
    };
    let sid = format!("sess{}", s.id());
    {
        let mut bots = lock(&s.inner.bots);
        let Some(b) = bots.get_mut(&token).filter(|b| !b.revoked) else {
            return Err(4004);
        };
        if total == 0 || shard >= total {
            return Err(4010);
        }
        if total < b.shards {
            return Err(4011);
        }
        let bucket = shard % b.max_concurrency;
        let now = Instant::now();
        if b.last_identify
            .get(&bucket)
            .is_some_and(|t| now.duration_since(*t) < Duration::from_secs(5))
        {
            b.violations += 1;
            return Err(4008);
        }
        b.last_identify.insert(bucket, now);
        b.identifies += 1;
        b.remaining = b.remaining.saturating_sub(1);
        b.current.insert(shard, sid.clone());
    }
    lock(&s.inner.sessions).insert(
        sid.clone(),
        Session {
            token: token.clone(),
            shard,
            seq: 0,
            events: Vec::new(),
            attached: Some((conn, tx.clone())),
        },
    );
    recount(s, &token, shard);
    served(s, &token, shard);
    let user = s.read(&token, |b| b.user_id.clone()).unwrap_or_default();
    let url = lock(&s.inner.url).clone();
    s.dispatch(
        &sid,
        "READY",
        json!({"v": 10, "session_id": sid, "resume_gateway_url": url,
               "user": {"id": user, "username": "fakebot", "bot": true},
               "shard": [shard, total], "guilds": []}),
    );
    Ok((token, shard, sid))
}

/// RESUME: the session's missed dispatches and RESUMED, or `None` (INVALID_SESSION).
fn resume(
    s: &FakeDiscordState,
    d: &Value,
    conn: u64,
    tx: &mpsc::UnboundedSender<Out>,
) -> Option<(String, u32, String)> {
    let token = d["token"].as_str()?.to_owned();
    s.count(&token);
    let sid = d["session_id"].as_str()?.to_owned();
    let after = d["seq"].as_u64().unwrap_or(0);
    let (shard, replayed) = {
        let mut sessions = lock(&s.inner.sessions);
        let sess = sessions.get_mut(&sid).filter(|x| x.token == token)?;
        if s.read(&token, |b| b.revoked).unwrap_or(true) {
            return None;
        }
        let mut replayed = 0;
        for (seq, frame) in &sess.events {
            if *seq > after {
                if frame["t"] == "MESSAGE_CREATE" {
                    replayed += 1;
                }
                let _ = tx.send(Out::Frame(frame.clone()));
            }
        }
        // Discord moves a resumed session to the new socket and closes the old one.
        if let Some((_, old)) = sess.attached.replace((conn, tx.clone())) {
            let _ = old.send(Out::Close(4000));
        }
        (sess.shard, replayed)
    };
    if let Some(b) = lock(&s.inner.bots).get_mut(&token) {
        b.resumes += 1;
        b.replayed += replayed;
    }
    recount(s, &token, shard);
    served(s, &token, shard);
    s.dispatch(&sid, "RESUMED", json!({}));
    Some((token, shard, sid))
}

/// The fake's routes.
pub fn app(state: FakeDiscordState) -> Router {
    Router::new()
        .route("/api/v10/users/@me", get(me))
        .route("/api/v10/gateway/bot", get(gateway_bot))
        .route("/api/v10/channels/{channel}", get(get_channel))
        .route("/api/v10/channels/{channel}/messages", post(create_message))
        .route(
            "/api/v10/channels/{channel}/messages/{id}",
            axum::routing::patch(change_message).delete(change_message),
        )
        .route("/api/v10/channels/{channel}/typing", post(typing))
        .route("/attachments/{channel}/{id}/{name}", get(files::download))
        .route(
            "/api/v10/interactions/{id}/{token}/callback",
            post(interactions::callback),
        )
        .route(
            "/api/v10/webhooks/{*rest}",
            post(interactions::webhook)
                .patch(interactions::webhook)
                .delete(interactions::webhook),
        )
        .route("/api/v10/applications/@me", get(interactions::application))
        .route(
            "/api/v10/applications/{app}/commands",
            axum::routing::put(interactions::put_commands),
        )
        .route("/gateway", any(gateway))
        // Discord takes up to 10 files of 10 MiB in one message.
        .layer(axum::extract::DefaultBodyLimit::max(110 * 1024 * 1024))
        .with_state(state)
}

/// A running fake Discord on a loopback port; stops when dropped.
#[derive(Debug)]
pub struct FakeDiscord {
    addr: SocketAddr,
    state: FakeDiscordState,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeDiscord {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeDiscord {
    /// Starts the fake on a free loopback port.
    ///
    /// # Errors
    /// When no port can be bound.
    pub async fn start() -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = FakeDiscordState::default();
        *lock(&state.inner.url) = format!("ws://{addr}/gateway");
        let router = app(state.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(Self { addr, state, task })
    }

    /// The REST base to give bots as their `api_url` (`http://…/api/v10`).
    pub fn url(&self) -> String {
        format!("http://{}/api/v10", self.addr)
    }

    /// The state, to register bots, write as users and read what happened.
    pub fn state(&self) -> &FakeDiscordState {
        &self.state
    }
}
