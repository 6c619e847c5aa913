//! A fake Telegram Bot API server (feature `fake`) that speaks the real JSON: `getMe`, `getUpdates` (offset,
//! limit, timeout), `sendMessage`, `setWebhook`/`deleteWebhook`. As the real server does, a
//! `getUpdates` that arrives while another is pending on the same token ends the older one
//! with 409 ("terminated by other getUpdates request"; at most one per 3 s per bot, later
//! ones wait), counted as a conflict when that older client is still connected. It can inject
//! 401/429/5xx, and records what it received. With a webhook set it delivers updates by
//! POST, as Telegram does: the secret token in `X-Telegram-Bot-Api-Secret-Token`, up to
//! `max_connections` at once, one chat's in order (or racing, on request), retrying what did
//! not get a 2xx.

use std::{
    collections::{HashMap, VecDeque},
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use axum::{
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::post,
    Json, Router,
};
use serde_json::{json, Value};
use tokio::sync::Notify;

mod files;
pub use files::SentFile;

/// A fault to answer the next call of a token with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// 401 Unauthorized.
    Unauthorized,
    /// 429 with `retry_after` seconds.
    TooManyRequests(u64),
    /// 500.
    ServerError,
    /// 200 with a body that is not JSON.
    Garbage,
}

/// A message the fake received through `sendMessage`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    /// The token it was sent with.
    pub token: String,
    /// `chat_id` as text.
    pub chat_id: String,
    /// The text.
    pub text: String,
    /// When the fake received it.
    pub at: std::time::Instant,
    /// The id the fake gave the message (per token, from 1000 up).
    pub message_id: i64,
    /// Its `reply_markup`, if it had one.
    pub reply_markup: Option<Value>,
}

/// A message the bot sent, as it stands now (after edits and deletes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BotMessage {
    /// The text now.
    pub text: String,
    /// The `reply_markup` now (`None` without buttons).
    pub reply_markup: Option<Value>,
    /// Edits made to it.
    pub edits: u32,
    /// Whether it was deleted.
    pub deleted: bool,
    /// When it last changed (sent or edited).
    pub changed_at: std::time::Instant,
}

/// A draft of a message the fake showed (`sendMessageDraft`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Draft {
    /// The token it was made with.
    pub token: String,
    /// `chat_id` as text (a private chat).
    pub chat_id: String,
    /// Its `draft_id`.
    pub draft_id: i64,
    /// The text shown.
    pub text: String,
    /// When the fake took it.
    pub at: std::time::Instant,
}

/// An edit of a bot's message the fake took (`editMessageText`, `editMessageReplyMarkup`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Edited {
    /// The token it was made with.
    pub token: String,
    /// `chat_id` as text.
    pub chat_id: String,
    /// The message.
    pub message_id: i64,
    /// Its text after the edit.
    pub text: String,
    /// When the fake took it.
    pub at: std::time::Instant,
}

/// A call of a method other than `getUpdates`/`sendMessage` (`sendChatAction`,
/// `answerCallbackQuery`, `editMessageText`, …), as received.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    /// The token.
    pub token: String,
    /// The method.
    pub method: String,
    /// Its JSON arguments.
    pub args: Value,
    /// When it arrived.
    pub at: std::time::Instant,
}

/// A button press the fake delivered as a `callback_query`, and how it was answered.
#[derive(Clone, Debug, PartialEq)]
pub struct Press {
    /// When the user pressed.
    pub at: std::time::Instant,
    /// `answerCallbackQuery`'s arguments and when it came, once answered.
    pub answer: Option<(Value, std::time::Instant)>,
}

impl Press {
    /// How long after the press its query was answered without a text (the spinner stopped,
    /// nothing shown); `None` while unanswered or when answered with a text.
    pub fn answered_empty_after(&self) -> Option<std::time::Duration> {
        let (args, at) = self.answer.as_ref()?;
        args.get("text").is_none().then(|| *at - self.at)
    }
}

#[derive(Default)]
struct TokenState {
    /// Updates not yet confirmed (id >= the last offset seen).
    pending: VecDeque<Value>,
    next_update: i64,
    pollers: u32,
    /// Bumped by every accepted `getUpdates`: a pending poll of an older generation ends.
    poll_gen: u64,
    revoked: bool,
    faults: VecDeque<Fault>,
    /// Faults for `sendMessage` only.
    send_faults: VecDeque<Fault>,
    /// Faults for edits only (`editMessageText`, `editMessageReplyMarkup`).
    edit_faults: VecDeque<Fault>,
    webhook: Option<String>,
    /// `setWebhook`'s secret token, sent with every delivery.
    webhook_secret: Option<String>,
    /// `setWebhook`'s max_connections: deliveries in flight at once.
    max_connections: usize,
    /// Whether this token's delivery loop runs.
    delivering: bool,
    /// Update ids being delivered now.
    in_flight: std::collections::HashSet<i64>,
    /// Update id → when a failed delivery may be tried again.
    retry_at: HashMap<i64, std::time::Instant>,
    /// Failed deliveries per update id (the backoff grows with them).
    attempts: HashMap<i64, u32>,
    polls: u64,
    /// Requests made with this token, of any method.
    requests: u64,
    /// When the last `getUpdates` was accepted.
    last_poll: Option<std::time::Instant>,
    /// When the last 409 to an older poll went out: the server sends at most one per 3 s.
    last_conflict: Option<tokio::time::Instant>,
    /// The last 64 `getUpdates`, each with when it was accepted and when it ended (answered,
    /// or its client went away), in the order they were accepted.
    poll_spans: VecDeque<PollSpan>,
    /// Wakes this token's pending poll (one per token: thousands of idle polls are not woken
    /// by every other token's news).
    wake: Arc<Notify>,
    /// The next id of a message the bot sends (0: not started, 1000 is the first).
    next_message: i64,
    /// The commands `setMyCommands` set last (`None`: none).
    commands: Option<Value>,
    /// `setMyCommands` and `deleteMyCommands` calls.
    command_writes: u64,
}

impl Inner {
    /// A message the bot of `token` sends to `chat_id`: its id (per token, from 1000 up).
    fn new_message(
        &mut self,
        token: &str,
        chat_id: &str,
        text: &str,
        reply_markup: Option<Value>,
    ) -> i64 {
        let message_id = match self.tokens.get_mut(token) {
            Some(t) => {
                t.next_message = t.next_message.max(1000) + 1;
                t.next_message - 1
            }
            None => 1000,
        };
        self.messages.insert(
            (token.to_owned(), chat_id.to_owned(), message_id),
            BotMessage {
                text: text.to_owned(),
                reply_markup,
                edits: 0,
                deleted: false,
                changed_at: std::time::Instant::now(),
            },
        );
        message_id
    }
}

#[derive(Default)]
struct Inner {
    tokens: HashMap<String, TokenState>,
    /// A token given in place of a revoked one → the token its bot's state is kept under.
    rotated: HashMap<String, String>,
    sent: Vec<Sent>,
    /// (token, chat id, message id) → the bot's message as it stands.
    messages: HashMap<(String, String, i64), BotMessage>,
    calls: Vec<Call>,
    /// Callback query id → the press.
    presses: HashMap<String, Press>,
    next_press: u64,
    /// `file_id` → (the token it was sent to, its bytes).
    files: HashMap<String, (String, Vec<u8>)>,
    next_file: u64,
    /// Downloads served, by `file_id`.
    downloads: Vec<String>,
    /// The bots' uploads.
    files_sent: Vec<SentFile>,
    /// The edits taken, in order.
    edited: Vec<Edited>,
    /// The drafts shown, in order.
    drafts: Vec<Draft>,
    /// Edits of one message closer than this to its last change are answered 429.
    edit_pace: Option<Duration>,
    /// Edits answered 429 for that pace.
    edits_paced: u64,
    /// A message to a chat closer than this to the bot's last one there is answered 429.
    chat_pace: Option<Duration>,
    /// (token, chat id) → when the bot's last message there was taken.
    last_message: HashMap<(String, String), std::time::Instant>,
    /// Messages answered 429 for that pace (or a group's limit).
    messages_paced: u64,
    /// A group's limit: messages in any window of this length.
    group_limit: Option<(usize, Duration)>,
    /// (token, group id) → when the bot's messages there within the window were taken.
    group_sent: HashMap<(String, String), std::collections::VecDeque<std::time::Instant>>,
}

/// What the fake's webhook deliveries did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeliveryStats {
    /// Deliveries answered 2xx.
    pub delivered: u64,
    /// Deliveries answered otherwise or not at all (each is retried).
    pub failed: u64,
    /// The most deliveries of one chat in flight at once.
    pub max_in_flight_per_chat: u64,
}

/// Shared state of the fake; cheap to clone.
#[derive(Clone, Default)]
pub struct FakeState {
    inner: Arc<Mutex<Inner>>,
    /// Webhook deliveries of one chat may race (several in flight at once) instead of going
    /// one after another as Telegram sends them.
    race_chats: Arc<std::sync::atomic::AtomicBool>,
    deliveries: Arc<Mutex<DeliveryStats>>,
    stopped: Arc<std::sync::atomic::AtomicBool>,
    conflicts: Arc<AtomicU64>,
    requests: Arc<AtomicU64>,
    accepted: Arc<AtomicU64>,
    /// How long every `sendMessage` takes to be answered, ms.
    send_delay_ms: Arc<AtomicU64>,
    /// `sendMessage` calls being answered now, and the most at once so far.
    sends_in_flight: Arc<AtomicU64>,
    most_sends_in_flight: Arc<AtomicU64>,
}

impl FakeState {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Connections accepted so far (TCP; a TLS one counts before its handshake).
    pub fn connections_accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Adds a bot: `token` becomes valid (`<digits>:<anything>`, as Telegram's).
    pub fn add_bot(&self, token: &str) {
        self.lock()
            .tokens
            .entry(token.to_owned())
            .or_insert_with(|| TokenState {
                next_update: 1,
                ..TokenState::default()
            });
    }

    /// Makes `token` answer 401 from now on.
    pub fn revoke(&self, token: &str) {
        if let Some(t) = self.lock().tokens.get_mut(token) {
            t.revoked = true;
        }
    }

    /// Gives `token`'s bot a new token, as BotFather's revoke does: `new` answers for the same
    /// bot (its chats, updates and webhook) from now on, `token` answers 401. The fake's
    /// helpers keep naming the bot by `token`.
    pub fn rotate(&self, token: &str, new: &str) {
        let mut g = self.lock();
        if let Some(t) = g.tokens.get_mut(token) {
            t.revoked = false;
        }
        g.rotated.insert(new.to_owned(), token.to_owned());
        g.rotated.insert(token.to_owned(), String::new());
    }

    /// Sets a webhook on `token`, as `setWebhook` would: `getUpdates` then answers 409.
    pub fn set_webhook(&self, token: &str, url: &str) {
        if let Some(t) = self.lock().tokens.get_mut(token) {
            t.webhook = Some(url.to_owned());
        }
    }

    /// Lets webhook deliveries of one chat race: several in flight at once, as a platform
    /// that does not order a chat's deliveries would send them. Off by default: Telegram
    /// sends one chat's updates one after another, the next once the last got a 2xx.
    pub fn race_chats(&self, on: bool) {
        self.race_chats.store(on, Ordering::SeqCst);
    }

    /// What webhook deliveries did so far.
    pub fn deliveries(&self) -> DeliveryStats {
        *self.deliveries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The webhook URL set on `token`, if any.
    pub fn webhook(&self, token: &str) -> Option<String> {
        self.lock()
            .tokens
            .get(token)
            .and_then(|t| t.webhook.clone())
    }

    /// Updates of `token` not delivered (or polled) yet.
    pub fn pending_updates(&self, token: &str) -> usize {
        self.lock().tokens.get(token).map_or(0, |t| t.pending.len())
    }

    /// Answers the next call of `token` with `fault`.
    pub fn inject(&self, token: &str, fault: Fault) {
        if let Some(t) = self.lock().tokens.get_mut(token) {
            t.faults.push_back(fault);
        }
    }

    /// Answers the next `sendMessage` of `token` with `fault` (polls go on as usual).
    pub fn inject_send(&self, token: &str, fault: Fault) {
        if let Some(t) = self.lock().tokens.get_mut(token) {
            t.send_faults.push_back(fault);
        }
    }

    /// Answers the next edit (`editMessageText`, `editMessageReplyMarkup`) of `token` with
    /// `fault`.
    pub fn inject_edit(&self, token: &str, fault: Fault) {
        if let Some(t) = self.lock().tokens.get_mut(token) {
            t.edit_faults.push_back(fault);
        }
    }

    /// Drops the faults still queued for `token` (any call's, `sendMessage`'s and edits').
    pub fn clear_faults(&self, token: &str) {
        if let Some(t) = self.lock().tokens.get_mut(token) {
            t.faults.clear();
            t.send_faults.clear();
            t.edit_faults.clear();
        }
    }

    /// Paces the edits of each message as Telegram does: an edit within `every` of the
    /// message's last change (its send or edit) is answered 429 with the seconds left as
    /// `retry_after` (counted in [`Self::edits_paced`]). `None`: no pace (the default).
    pub fn pace_edits(&self, every: Option<Duration>) {
        self.lock().edit_pace = every;
    }

    /// Edits answered 429 for the pace set by [`Self::pace_edits`].
    pub fn edits_paced(&self) -> u64 {
        self.lock().edits_paced
    }

    /// Keeps a chat's limit as Telegram does (about one message a second): a message (a
    /// text, a file) a bot sends to a chat within `every` of its last one there is answered
    /// 429 with the seconds left, rounded up, as `retry_after` (counted in
    /// [`Self::messages_paced`]). `None`: no limit (the default).
    pub fn pace_chats(&self, every: Option<Duration>) {
        self.lock().chat_pace = every;
    }

    /// Keeps a group's limit as Telegram does (20 messages a minute): a message a bot sends
    /// to a group (a negative chat id) that would make it more than `limit` within any
    /// `window` is answered 429 with the seconds until the oldest leaves the window, rounded
    /// up, as `retry_after` (counted in [`Self::messages_paced`]). `None`: no limit (the
    /// default).
    pub fn limit_groups(&self, limit: Option<(usize, Duration)>) {
        self.lock().group_limit = limit;
    }

    /// Messages answered 429 for the limits set by [`Self::pace_chats`] and
    /// [`Self::limit_groups`].
    pub fn messages_paced(&self) -> u64 {
        self.lock().messages_paced
    }

    /// The drafts `token`'s bot showed, in order.
    pub fn drafts(&self, token: &str) -> Vec<Draft> {
        self.lock()
            .drafts
            .iter()
            .filter(|d| d.token == token)
            .cloned()
            .collect()
    }

    /// The edits of `token`'s messages the fake took, in order.
    pub fn edits(&self, token: &str) -> Vec<Edited> {
        self.lock()
            .edited
            .iter()
            .filter(|e| e.token == token)
            .cloned()
            .collect()
    }

    /// A user writes `text` in chat `chat_id` to the bot of `token`; returns the update id.
    pub fn user_writes(&self, token: &str, chat_id: i64, text: &str) -> i64 {
        let id = {
            let mut g = self.lock();
            let t = g
                .tokens
                .entry(token.to_owned())
                .or_insert_with(|| TokenState {
                    next_update: 1,
                    ..TokenState::default()
                });
            let id = t.next_update;
            t.next_update += 1;
            t.pending.push_back(json!({
                "update_id": id,
                "message": {
                    "message_id": id,
                    "date": 1_700_000_000,
                    "chat": {"id": chat_id, "type": "private"},
                    "from": {"id": chat_id, "is_bot": false, "first_name": "user"},
                    "text": text,
                }
            }));
            (id, t.wake.clone())
        };
        let (id, wake) = id;
        wake.notify_waiters();
        id
    }

    /// The user of chat `chat_id` edits their message `message_id` to `text`: an
    /// `edited_message` update. Answers its `update_id`.
    pub fn user_edits(&self, token: &str, chat_id: i64, message_id: i64, text: &str) -> i64 {
        let id = self.lock().tokens.get(token).map_or(1, |t| t.next_update);
        self.push_raw(
            token,
            json!({
                "update_id": id,
                "edited_message": {
                    "message_id": message_id,
                    "date": 1_700_000_000,
                    "edit_date": 1_700_000_100,
                    "chat": {"id": chat_id, "type": "private"},
                    "from": {"id": chat_id, "is_bot": false, "first_name": "user"},
                    "text": text,
                }
            }),
        );
        id
    }

    /// The user of chat `chat_id` presses the button with `callback_data` `data` under the
    /// bot's message `message_id`: a `callback_query` update. Answers (update id, query id),
    /// or `None` when that message has no such button (a user cannot press one that is not
    /// there).
    pub fn user_presses(
        &self,
        token: &str,
        chat_id: i64,
        message_id: i64,
        data: &str,
    ) -> Option<(i64, String)> {
        let (id, query) = {
            let mut g = self.lock();
            let key = (token.to_owned(), chat_id.to_string(), message_id);
            let m = g.messages.get(&key).filter(|m| !m.deleted)?;
            let has = m.reply_markup.as_ref().is_some_and(|k| {
                k["inline_keyboard"].as_array().is_some_and(|rows| {
                    rows.iter().any(|r| {
                        r.as_array()
                            .is_some_and(|r| r.iter().any(|b| b["callback_data"] == data))
                    })
                })
            });
            if !has {
                return None;
            }
            g.next_press += 1;
            // Telegram's query ids are long numbers; unique per press here.
            let query = (4_000_000_000 + g.next_press).to_string();
            g.presses.insert(
                query.clone(),
                Press {
                    at: std::time::Instant::now(),
                    answer: None,
                },
            );
            let id = g.tokens.get(token).map_or(1, |t| t.next_update);
            (id, query)
        };
        self.push_raw(
            token,
            json!({
                "update_id": id,
                "callback_query": {
                    "id": query,
                    "from": {"id": chat_id, "is_bot": false, "first_name": "user"},
                    "chat_instance": "ci",
                    "data": data,
                    "message": {
                        "message_id": message_id,
                        "date": 1_700_000_000,
                        "chat": {"id": chat_id, "type": "private"},
                        "from": {"id": 1, "is_bot": true, "first_name": "fake"},
                    }
                }
            }),
        );
        Some((id, query))
    }

    /// The bot's message `message_id` in `chat_id`, as it stands now.
    pub fn bot_message(&self, token: &str, chat_id: &str, message_id: i64) -> Option<BotMessage> {
        self.lock()
            .messages
            .get(&(token.to_owned(), chat_id.to_owned(), message_id))
            .cloned()
    }

    /// Every call of `method` with `token` so far, in arrival order.
    pub fn calls(&self, token: &str, method: &str) -> Vec<Call> {
        self.lock()
            .calls
            .iter()
            .filter(|c| c.token == token && c.method == method)
            .cloned()
            .collect()
    }

    /// The press of callback query `query`, and its answer once made.
    pub fn press(&self, query: &str) -> Option<Press> {
        self.lock().presses.get(query).cloned()
    }

    /// Queues a raw update (any JSON) for `token`, e.g. a malformed one. An integer
    /// `update_id` in it also moves the fake's numbering past it.
    pub fn push_raw(&self, token: &str, update: Value) {
        let wake = self.lock().tokens.get_mut(token).map(|t| {
            if let Some(id) = update["update_id"].as_i64() {
                t.next_update = t.next_update.max(id + 1);
            }
            t.pending.push_back(update);
            t.wake.clone()
        });
        if let Some(w) = wake {
            w.notify_waiters();
        }
    }

    /// Every `sendMessage` takes `d` to be answered (a distant server), so callers' sends
    /// overlap.
    pub fn set_send_delay(&self, d: std::time::Duration) {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        self.send_delay_ms.store(ms, Ordering::Relaxed);
    }

    /// The most `sendMessage` calls that were being answered at once.
    pub fn most_sends_in_flight(&self) -> u64 {
        self.most_sends_in_flight.load(Ordering::Relaxed)
    }

    /// The command names the bot of `token` set last (`None`: never, or deleted), and how
    /// many times it set or deleted them.
    pub fn my_commands(&self, token: &str) -> (Option<Vec<String>>, u64) {
        let g = self.lock();
        let Some(t) = g.tokens.get(token) else {
            return (None, 0);
        };
        let names = t.commands.as_ref().map(|c| {
            c.as_array()
                .into_iter()
                .flatten()
                .filter_map(|x| x["command"].as_str().map(str::to_owned))
                .collect()
        });
        (names, t.command_writes)
    }

    /// Everything received through `sendMessage`, in arrival order.
    pub fn sent(&self) -> Vec<Sent> {
        self.lock().sent.clone()
    }

    /// How many `sendMessage` calls were received.
    pub fn sent_count(&self) -> usize {
        self.lock().sent.len()
    }

    /// How many pending `getUpdates` were ended by a newer one on the same token while their
    /// client was still connected: second pollers (the older one got 409).
    pub fn conflicts(&self) -> u64 {
        self.conflicts.load(Ordering::SeqCst)
    }

    /// How many tokens have a `getUpdates` in flight now.
    pub fn polling_tokens(&self) -> usize {
        self.lock()
            .tokens
            .values()
            .filter(|t| t.pollers > 0)
            .count()
    }

    /// Whether `token` has a `getUpdates` in flight now.
    pub fn is_polling(&self, token: &str) -> bool {
        self.lock().tokens.get(token).is_some_and(|t| t.pollers > 0)
    }

    /// How many tokens had a `getUpdates` accepted at or after `since`: after a worker dies,
    /// the bots it ran count again once their new owner polls. (Counting tokens polling *at
    /// one instant* undercounts busy bots, which are between polls while they answer.)
    pub fn polled_since(&self, since: std::time::Instant) -> usize {
        self.lock()
            .tokens
            .values()
            .filter(|t| t.last_poll.is_some_and(|p| p >= since))
            .count()
    }

    /// The tokens that had no `getUpdates` accepted at or after `since`, sorted: what a test
    /// names when a wait for every bot to poll fails.
    pub fn not_polled_since(&self, since: std::time::Instant) -> Vec<String> {
        let mut out: Vec<String> = self
            .lock()
            .tokens
            .iter()
            .filter(|(_, t)| t.last_poll.is_none_or(|p| p < since))
            .map(|(k, _)| k.clone())
            .collect();
        out.sort();
        out
    }

    /// How many of `tokens` had a `getUpdates` accepted at or after `since`.
    pub fn polled_since_among(&self, tokens: &[String], since: std::time::Instant) -> usize {
        let g = self.lock();
        tokens
            .iter()
            .filter(|tok| {
                g.tokens
                    .get(*tok)
                    .and_then(|t| t.last_poll)
                    .is_some_and(|p| p >= since)
            })
            .count()
    }

    /// For every token polled at or after `since`, when its first such poll was accepted
    /// (among its last 64 polls): after a loss, when each bot's new owner first polled.
    pub fn first_polls_since(&self, since: std::time::Instant) -> Vec<std::time::Instant> {
        self.first_poll_per_token_since(since)
            .into_iter()
            .map(|(_, t)| t)
            .collect()
    }

    /// [`FakeState::first_polls_since`], with the token each first poll came for.
    pub fn first_poll_per_token_since(
        &self,
        since: std::time::Instant,
    ) -> Vec<(String, std::time::Instant)> {
        self.lock()
            .tokens
            .iter()
            .filter_map(|(tok, t)| {
                let first = t.poll_spans.iter().find(|p| p.started >= since)?;
                Some((tok.clone(), first.started))
            })
            .collect()
    }

    /// `token`'s last 64 `getUpdates`, oldest first, with when each started and ended.
    pub fn poll_spans(&self, token: &str) -> Vec<PollSpan> {
        self.lock()
            .tokens
            .get(token)
            .map(|t| t.poll_spans.iter().copied().collect())
            .unwrap_or_default()
    }

    /// How many `getUpdates` calls `token` made.
    pub fn polls(&self, token: &str) -> u64 {
        self.lock().tokens.get(token).map_or(0, |t| t.polls)
    }

    /// How many requests (any method) came with `token`.
    pub fn requests_of(&self, token: &str) -> u64 {
        self.lock().tokens.get(token).map_or(0, |t| t.requests)
    }

    /// How many requests the fake answered in all.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

/// How long an ended poll waits before it counts as a second poller: more than the server
/// takes to notice a closed connection even when it serves thousands of polls.
const ABANDONED_POLL_NOTICE: Duration = Duration::from_millis(500);

/// The server ends older polls with 409 at most this often per bot (later ones wait).
const CONFLICT_EVERY: Duration = Duration::from_secs(3);

/// The chat of an update, if it has one.
fn chat_of(update: &Value) -> Option<i64> {
    ["message", "edited_message", "channel_post"]
        .iter()
        .find_map(|k| update.get(*k))
        .and_then(|m| m["chat"]["id"].as_i64())
}

/// Delivers `token`'s updates to its webhook as Telegram does: POST with the secret token,
/// up to max_connections at once, one chat's after another (unless chats race), a failed
/// one retried with a growing delay while that chat's later ones wait.
async fn deliver(state: FakeState, token: String) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_default();
    let in_flight_of_chat: Arc<Mutex<HashMap<i64, u64>>> = Arc::default();
    loop {
        if state.stopped.load(Ordering::SeqCst) {
            return;
        }
        let race = state.race_chats.load(Ordering::SeqCst);
        let now = std::time::Instant::now();
        let (picks, url, secret, wake) = {
            let mut g = state.lock();
            let Some(t) = g.tokens.get_mut(&token) else {
                return;
            };
            let Some(url) = t.webhook.clone() else {
                t.delivering = false;
                return;
            };
            let mut picks = Vec::new();
            let mut blocked = std::collections::HashSet::new();
            for u in &t.pending {
                let Some(id) = u["update_id"].as_i64() else {
                    continue;
                };
                let chat = chat_of(u);
                let busy =
                    t.in_flight.contains(&id) || t.retry_at.get(&id).is_some_and(|at| *at > now);
                if busy {
                    if let Some(c) = chat {
                        blocked.insert(c);
                    }
                    continue;
                }
                if !race && chat.is_some_and(|c| blocked.contains(&c)) {
                    continue;
                }
                if t.in_flight.len() >= t.max_connections {
                    break;
                }
                t.in_flight.insert(id);
                if let Some(c) = chat {
                    blocked.insert(c);
                }
                picks.push((id, chat, u.clone()));
            }
            (picks, url, t.webhook_secret.clone(), t.wake.clone())
        };
        for (id, chat, update) in picks {
            let (state, http, url, secret, token, per_chat) = (
                state.clone(),
                http.clone(),
                url.clone(),
                secret.clone(),
                token.clone(),
                in_flight_of_chat.clone(),
            );
            if let Some(c) = chat {
                let mut m = per_chat.lock().unwrap_or_else(|e| e.into_inner());
                let n = m.entry(c).or_default();
                *n += 1;
                let mut d = state.deliveries.lock().unwrap_or_else(|e| e.into_inner());
                d.max_in_flight_per_chat = d.max_in_flight_per_chat.max(*n);
            }
            tokio::spawn(async move {
                let mut req = http.post(&url).json(&update);
                if let Some(s) = &secret {
                    req = req.header("X-Telegram-Bot-Api-Secret-Token", s);
                }
                let ok = req.send().await.is_ok_and(|r| r.status().is_success());
                if let Some(c) = chat {
                    if let Some(n) = per_chat
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get_mut(&c)
                    {
                        *n = n.saturating_sub(1);
                    }
                }
                let wake = {
                    let mut g = state.lock();
                    let Some(t) = g.tokens.get_mut(&token) else {
                        return;
                    };
                    t.in_flight.remove(&id);
                    if ok {
                        t.pending.retain(|u| u["update_id"].as_i64() != Some(id));
                        t.retry_at.remove(&id);
                        t.attempts.remove(&id);
                    } else {
                        let n = t.attempts.entry(id).or_default();
                        *n += 1;
                        let wait = Duration::from_millis(100u64 << (*n).min(5));
                        t.retry_at.insert(id, std::time::Instant::now() + wait);
                    }
                    t.wake.clone()
                };
                {
                    let mut d = state.deliveries.lock().unwrap_or_else(|e| e.into_inner());
                    if ok {
                        d.delivered += 1;
                    } else {
                        d.failed += 1;
                    }
                }
                wake.notify_waiters();
            });
        }
        let notified = wake.notified();
        tokio::select! {
            () = notified => {}
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
}

fn tg_error(status: StatusCode, description: &str, retry_after: Option<u64>) -> Response {
    let mut body = json!({"ok": false, "error_code": status.as_u16(), "description": description});
    if let Some(r) = retry_after {
        body["parameters"] = json!({"retry_after": r});
    }
    (status, Json(body)).into_response()
}

fn ok(result: Value) -> Response {
    Json(json!({"ok": true, "result": result})).into_response()
}

/// Releases a token's poller slot when the request ends, even if the client went away and
/// the server dropped the handler.
struct PollGuard {
    state: FakeState,
    token: String,
    /// The poll's generation: which span it ends.
    generation: u64,
}

impl Drop for PollGuard {
    fn drop(&mut self) {
        if let Some(t) = self.state.lock().tokens.get_mut(&self.token) {
            t.pollers = t.pollers.saturating_sub(1);
            if let Some(s) = t
                .poll_spans
                .iter_mut()
                .rev()
                .find(|s| s.generation == self.generation)
            {
                s.ended = Some(std::time::Instant::now());
            }
        }
    }
}

/// One `getUpdates`, as the server saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PollSpan {
    generation: u64,
    /// When the server accepted it.
    pub started: std::time::Instant,
    /// When it ended (answered, or its client went away); `None` while it is in flight.
    pub ended: Option<std::time::Instant>,
}

async fn handle(
    State(state): State<FakeState>,
    Path((bot, method)): Path<(String, String)>,
    req: axum::extract::Request,
) -> Response {
    state.requests.fetch_add(1, Ordering::Relaxed);
    let Some(token) = bot.strip_prefix("bot").map(str::to_owned) else {
        return tg_error(StatusCode::NOT_FOUND, "Not Found", None);
    };
    // A rotated token: the new one stands for the bot, the old one for nothing.
    let token = match state.lock().rotated.get(&token) {
        Some(old) if old.is_empty() => {
            return tg_error(StatusCode::UNAUTHORIZED, "Unauthorized", None)
        }
        Some(old) => old.clone(),
        None => token,
    };
    let (args, parts) = files::read_args(&state, req).await;
    // Token checks and injected faults.
    {
        let mut g = state.lock();
        let Some(t) = g.tokens.get_mut(&token) else {
            return tg_error(StatusCode::UNAUTHORIZED, "Unauthorized", None);
        };
        t.requests += 1;
        if t.revoked {
            return tg_error(StatusCode::UNAUTHORIZED, "Unauthorized", None);
        }
        let method_fault =
            if method == "sendMessage" || (method.starts_with("send") && !parts.is_empty()) {
                t.send_faults.pop_front()
            } else if method == "editMessageText" || method == "editMessageReplyMarkup" {
                t.edit_faults.pop_front()
            } else {
                None
            };
        let message = method == "sendMessage" || (method.starts_with("send") && !parts.is_empty());
        if let Some(f) = t.faults.pop_front().or(method_fault) {
            return match f {
                Fault::Unauthorized => tg_error(StatusCode::UNAUTHORIZED, "Unauthorized", None),
                Fault::TooManyRequests(s) => tg_error(
                    StatusCode::TOO_MANY_REQUESTS,
                    "Too Many Requests: retry later",
                    Some(s),
                ),
                Fault::ServerError => tg_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "Internal Server Error",
                    None,
                ),
                Fault::Garbage => (StatusCode::OK, "<html>bad gateway</html>").into_response(),
            };
        }
        if message && (g.chat_pace.is_some() || g.group_limit.is_some()) {
            let chat = match &args["chat_id"] {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let now = std::time::Instant::now();
            let key = (token.clone(), chat.clone());
            let last = g.last_message.get(&key).copied();
            let chat_left = g
                .chat_pace
                .zip(last)
                .and_then(|(every, at)| every.checked_sub(now.duration_since(at)));
            let group = g.group_limit.filter(|_| chat.starts_with('-'));
            let group_left = group.and_then(|(limit, window)| {
                let sent = g.group_sent.entry(key.clone()).or_default();
                while sent
                    .front()
                    .is_some_and(|at| now.duration_since(*at) >= window)
                {
                    sent.pop_front();
                }
                (sent.len() >= limit)
                    .then(|| sent.front().map(|at| window - now.duration_since(*at)))
                    .flatten()
            });
            if let Some(left) = chat_left.max(group_left) {
                g.messages_paced += 1;
                let secs = left.as_secs_f64().ceil().max(1.0) as u64;
                return tg_error(
                    StatusCode::TOO_MANY_REQUESTS,
                    &format!("Too Many Requests: retry after {secs}"),
                    Some(secs),
                );
            }
            if group.is_some() {
                g.group_sent.entry(key.clone()).or_default().push_back(now);
            }
            g.last_message.insert(key, now);
        }
    }
    match method.as_str() {
        "getMe" => {
            let id: i64 = token
                .split(':')
                .next()
                .and_then(|s| s.parse().ok())
                .unwrap_or(1);
            ok(
                json!({"id": id, "is_bot": true, "first_name": "fake", "username": format!("bot{id}")}),
            )
        }
        "getUpdates" => get_updates(state, token, args).await,
        "sendMessage" => {
            let chat_id = match &args["chat_id"] {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                _ => {
                    return tg_error(
                        StatusCode::BAD_REQUEST,
                        "Bad Request: chat_id is empty",
                        None,
                    )
                }
            };
            let Some(text) = args["text"].as_str().filter(|t| !t.is_empty()) else {
                return tg_error(
                    StatusCode::BAD_REQUEST,
                    "Bad Request: message text is empty",
                    None,
                );
            };
            let markup = args.get("reply_markup").cloned();
            if let Some(m) = &markup {
                if let Err(why) = check_markup(m) {
                    return tg_error(StatusCode::BAD_REQUEST, &why, None);
                }
            }
            let now = state.sends_in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            state.most_sends_in_flight.fetch_max(now, Ordering::SeqCst);
            let delay = state.send_delay_ms.load(Ordering::Relaxed);
            if delay > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
            }
            state.sends_in_flight.fetch_sub(1, Ordering::SeqCst);
            let mut g = state.lock();
            let message_id = g.new_message(&token, &chat_id, text, markup.clone());
            g.sent.push(Sent {
                token,
                chat_id: chat_id.clone(),
                text: text.to_owned(),
                at: std::time::Instant::now(),
                message_id,
                reply_markup: markup,
            });
            ok(
                json!({"message_id": message_id, "date": 1_700_000_000, "chat": {"id": chat_id}, "text": text}),
            )
        }
        "sendMessageDraft" => draft(&state, &token, &args),
        "getFile" => files::get_file(&state, &token, &args),
        "setMyCommands" | "deleteMyCommands" | "getMyCommands" => {
            my_commands(&state, &token, &method, &args)
        }
        "sendPhoto" | "sendDocument" | "sendVideo" | "sendAudio" | "sendVoice" | "sendSticker"
        | "sendMediaGroup" => files::send_files(&state, &token, &method, &args, parts),
        "editMessageText"
        | "editMessageReplyMarkup"
        | "deleteMessage"
        | "sendChatAction"
        | "answerCallbackQuery" => act(&state, &token, &method, args),
        "setWebhook" => {
            let Some(url) = args["url"].as_str().filter(|u| !u.is_empty()) else {
                return tg_error(
                    StatusCode::BAD_REQUEST,
                    "Bad Request: bad webhook: URL is empty",
                    None,
                );
            };
            let start = {
                let mut g = state.lock();
                let Some(t) = g.tokens.get_mut(&token) else {
                    return tg_error(StatusCode::UNAUTHORIZED, "Unauthorized", None);
                };
                t.webhook = Some(url.to_owned());
                t.webhook_secret = args["secret_token"].as_str().map(str::to_owned);
                t.max_connections = args["max_connections"]
                    .as_u64()
                    .map_or(40, |n| n.clamp(1, 100) as usize);
                !std::mem::replace(&mut t.delivering, true)
            };
            if start {
                tokio::spawn(deliver(state.clone(), token.clone()));
            }
            ok(json!(true))
        }
        "deleteWebhook" => {
            if let Some(t) = state.lock().tokens.get_mut(&token) {
                t.webhook = None;
                t.webhook_secret = None;
            }
            ok(json!(true))
        }
        _ => tg_error(StatusCode::NOT_FOUND, "Not Found: method not found", None),
    }
}

/// `setMyCommands` (checked as Telegram does: at most 100, names of 1–32 of `a-z0-9_`,
/// descriptions of 1–256 characters), `deleteMyCommands`, `getMyCommands`.
fn my_commands(state: &FakeState, token: &str, method: &str, args: &Value) -> Response {
    let mut g = state.lock();
    let Some(t) = g.tokens.get_mut(token) else {
        return tg_error(StatusCode::UNAUTHORIZED, "Unauthorized", None);
    };
    match method {
        "getMyCommands" => ok(t.commands.clone().unwrap_or_else(|| json!([]))),
        "deleteMyCommands" => {
            t.commands = None;
            t.command_writes += 1;
            ok(json!(true))
        }
        _ => {
            let Some(list) = args["commands"].as_array() else {
                return tg_error(
                    StatusCode::BAD_REQUEST,
                    "Bad Request: commands are empty",
                    None,
                );
            };
            let valid = list.len() <= 100
                && list.iter().all(|c| {
                    let name = c["command"].as_str().unwrap_or_default();
                    let desc = c["description"].as_str().unwrap_or_default();
                    (1..=32).contains(&name.len())
                        && name
                            .bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                        && (1..=256).contains(&desc.chars().count())
                });
            if !valid {
                return tg_error(
                    StatusCode::BAD_REQUEST,
                    "Bad Request: BOT_COMMAND_INVALID",
                    None,
                );
            }
            t.commands = Some(Value::Array(list.clone()));
            t.command_writes += 1;
            ok(json!(true))
        }
    }
}

/// Checks an `inline_keyboard` as Telegram does: at most 100 buttons, each with a text and
/// either a `url` or `callback_data` of 1–64 bytes.
fn check_markup(m: &Value) -> Result<(), String> {
    let Some(rows) = m["inline_keyboard"].as_array() else {
        return Err("Bad Request: can't parse reply keyboard markup JSON object".into());
    };
    let mut n = 0;
    for row in rows {
        for b in row.as_array().map(Vec::as_slice).unwrap_or_default() {
            n += 1;
            if b["text"].as_str().is_none_or(str::is_empty) {
                return Err(
                    "Bad Request: text buttons are unallowed in the inline keyboard".into(),
                );
            }
            let data_ok = b["callback_data"]
                .as_str()
                .is_some_and(|d| (1..=64).contains(&d.len()));
            if !data_ok && b["url"].as_str().is_none() {
                return Err("Bad Request: BUTTON_DATA_INVALID".into());
            }
        }
    }
    if n > 100 {
        return Err("Bad Request: reply markup is too long".into());
    }
    Ok(())
}

/// Edits, deletes, typing and callback answers, as Telegram checks and does them.
fn act(state: &FakeState, token: &str, method: &str, args: Value) -> Response {
    let bad = |d: &str| tg_error(StatusCode::BAD_REQUEST, &format!("Bad Request: {d}"), None);
    let mut g = state.lock();
    // Fields borrowed apart (a message and the fake's counters).
    let g = &mut *g;
    g.calls.push(Call {
        token: token.to_owned(),
        method: method.to_owned(),
        args: args.clone(),
        at: std::time::Instant::now(),
    });
    let chat_id = match &args["chat_id"] {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    };
    if method == "answerCallbackQuery" {
        let q = args["callback_query_id"].as_str().unwrap_or_default();
        let Some(p) = g.presses.get_mut(q) else {
            return bad("query is too old and response timeout expired or query ID is invalid");
        };
        if p.answer.is_some() || p.at.elapsed() > Duration::from_secs(15) {
            return bad("query is too old and response timeout expired or query ID is invalid");
        }
        p.answer = Some((args.clone(), std::time::Instant::now()));
        return ok(json!(true));
    }
    if chat_id.is_empty() {
        return bad("chat_id is empty");
    }
    if method == "sendChatAction" {
        return ok(json!(true));
    }
    let Some(id) = args["message_id"].as_i64() else {
        return bad("message identifier is not specified");
    };
    let Some(m) = g
        .messages
        .get_mut(&(token.to_owned(), chat_id.clone(), id))
        .filter(|m| !m.deleted)
    else {
        return bad(if method == "deleteMessage" {
            "message to delete not found"
        } else {
            "message to edit not found"
        });
    };
    if method == "deleteMessage" {
        m.deleted = true;
        return ok(json!(true));
    }
    let markup = args.get("reply_markup").cloned();
    if let Some(k) = &markup {
        if let Err(why) = check_markup(k) {
            return tg_error(StatusCode::BAD_REQUEST, &why, None);
        }
    }
    let text = if method == "editMessageText" {
        match args["text"].as_str().filter(|t| !t.is_empty()) {
            Some(t) => t.to_owned(),
            None => return bad("message text is empty"),
        }
    } else {
        m.text.clone()
    };
    // Telegram drops the keyboard on an edit that gives none.
    if text == m.text && markup == m.reply_markup {
        return bad("message is not modified: specified new message content and reply markup are exactly the same as a current content and reply markup of the message");
    }
    let now = std::time::Instant::now();
    if let Some(pace) = g.edit_pace {
        let since = now.saturating_duration_since(m.changed_at);
        if since < pace {
            let left = (pace - since).as_secs_f64().ceil().max(1.0) as u64;
            g.edits_paced += 1;
            return tg_error(
                StatusCode::TOO_MANY_REQUESTS,
                &format!("Too Many Requests: retry after {left}"),
                Some(left),
            );
        }
    }
    m.text = text.clone();
    m.reply_markup = markup;
    m.edits += 1;
    m.changed_at = now;
    g.edited.push(Edited {
        token: token.to_owned(),
        chat_id: chat_id.clone(),
        message_id: id,
        text: text.clone(),
        at: now,
    });
    ok(json!({"message_id": id, "chat": {"id": args["chat_id"]}, "text": text}))
}

/// `sendMessageDraft`, as Telegram checks it: a private chat (a user's id, positive), a
/// non-zero `draft_id`, a text of at most 4,096 characters.
fn draft(state: &FakeState, token: &str, args: &Value) -> Response {
    let bad = |d: &str| tg_error(StatusCode::BAD_REQUEST, &format!("Bad Request: {d}"), None);
    let chat = match &args["chat_id"] {
        Value::String(s) => s.parse::<i64>().ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    };
    let Some(chat) = chat else {
        return bad("chat_id is empty");
    };
    if chat <= 0 {
        return bad("drafts can be sent only to private chats");
    }
    let draft_id = args["draft_id"].as_i64().unwrap_or(0);
    if draft_id == 0 {
        return bad("draft_id must be non-zero");
    }
    let text = args["text"].as_str().unwrap_or_default();
    if text.chars().count() > 4096 {
        return bad("text is too long");
    }
    state.lock().drafts.push(Draft {
        token: token.to_owned(),
        chat_id: chat.to_string(),
        draft_id,
        text: text.to_owned(),
        at: std::time::Instant::now(),
    });
    ok(json!(true))
}

async fn get_updates(state: FakeState, token: String, args: Value) -> Response {
    let offset = args["offset"].as_i64().unwrap_or(0);
    let limit = args["limit"].as_u64().unwrap_or(100).clamp(1, 100) as usize;
    let timeout = Duration::from_secs(args["timeout"].as_u64().unwrap_or(0).min(50));
    let (_guard, my_gen, wake) = {
        let mut g = state.lock();
        let Some(t) = g.tokens.get_mut(&token) else {
            return tg_error(StatusCode::UNAUTHORIZED, "Unauthorized", None);
        };
        if t.webhook.is_some() {
            return tg_error(
                StatusCode::CONFLICT,
                "Conflict: can't use getUpdates method while webhook is active",
                None,
            );
        }
        // The real server ends the *older* request, if any; the new one goes on.
        t.pollers += 1;
        t.poll_gen += 1;
        t.polls += 1;
        let now = std::time::Instant::now();
        t.last_poll = Some(now);
        t.poll_spans.push_back(PollSpan {
            generation: t.poll_gen,
            started: now,
            ended: None,
        });
        if t.poll_spans.len() > 64 {
            t.poll_spans.pop_front();
        }
        // Confirm everything below the offset.
        while t
            .pending
            .front()
            .and_then(|u| u["update_id"].as_i64())
            .is_some_and(|id| id < offset)
        {
            t.pending.pop_front();
        }
        (
            PollGuard {
                state: state.clone(),
                token: token.clone(),
                generation: t.poll_gen,
            },
            t.poll_gen,
            t.wake.clone(),
        )
    };
    // Wake the older poll, if any, so it ends now.
    wake.notify_waiters();
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let notified = wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let batch: Option<Vec<Value>> = {
            let g = state.lock();
            g.tokens
                .get(&token)
                .map(|t| {
                    if t.poll_gen != my_gen {
                        return None;
                    }
                    Some(
                        t.pending
                            .iter()
                            .filter(|u| u["update_id"].as_i64().is_none_or(|id| id >= offset))
                            .take(limit)
                            .cloned()
                            .collect(),
                    )
                })
                .unwrap_or(Some(Vec::new()))
        };
        let Some(batch) = batch else {
            // A newer poll ended this one. It is a second poller only if its client is still
            // there: a client that went away (a worker that stopped the bot before handing it
            // over) has its request dropped by the server meanwhile, and this never runs on.
            tokio::time::sleep(ABANDONED_POLL_NOTICE).await;
            // At most one such 409 per 3 s per bot; a later one waits its turn.
            let at = {
                let mut g = state.lock();
                let now = tokio::time::Instant::now();
                let at = g
                    .tokens
                    .get(&token)
                    .and_then(|t| t.last_conflict)
                    .map_or(now, |last| (last + CONFLICT_EVERY).max(now));
                if let Some(t) = g.tokens.get_mut(&token) {
                    t.last_conflict = Some(at);
                }
                at
            };
            tokio::time::sleep_until(at).await;
            state.conflicts.fetch_add(1, Ordering::SeqCst);
            return tg_error(
                StatusCode::CONFLICT,
                "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running",
                None,
            );
        };
        if !batch.is_empty() {
            return ok(Value::Array(batch));
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return ok(json!([]));
        }
    }
}

/// The fake's routes, callable without a socket.
pub fn app(state: FakeState) -> Router {
    Router::new()
        .route("/{bot}/{method}", post(handle).get(handle))
        .route("/file/{bot}/{*path}", axum::routing::get(files::download))
        // Bots upload files of up to 50 MB.
        .layer(axum::extract::DefaultBodyLimit::max(64 * 1024 * 1024))
        .with_state(state)
}

/// The private CA that signs the certificate of [`FakeTelegram::start_tls`]: give it to the
/// client as an extra root (`TelegramConfig::extra_root_certs_pem`). Test-only: its key is
/// public.
pub const TEST_CA_PEM: &str = include_str!("../testdata/test-ca.pem");
const TEST_SERVER_CHAIN_PEM: &str = include_str!("../testdata/test-server-chain.pem");
const TEST_SERVER_KEY_PEM: &str = include_str!("../testdata/test-server-key.pem");

/// A running fake on `127.0.0.1:<free port>`; stops when dropped.
pub struct FakeTelegram {
    addr: SocketAddr,
    tls: bool,
    state: FakeState,
    task: tokio::task::JoinHandle<()>,
}

/// Accepts connections (TLS handshakes run beside the accept loop) and counts them.
struct Accepting {
    rx: tokio::sync::mpsc::Receiver<(Conn, SocketAddr)>,
    addr: SocketAddr,
}

/// A served connection, plain or TLS.
enum Conn {
    Plain(tokio::net::TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>),
}

impl tokio::io::AsyncRead for Conn {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl tokio::io::AsyncWrite for Conn {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => std::pin::Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl axum::serve::Listener for Accepting {
    type Io = Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Conn, SocketAddr) {
        match self.rx.recv().await {
            Some(c) => c,
            // The accept loop ended (its listener failed): serve nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.addr)
    }
}

fn acceptor() -> std::io::Result<tokio_rustls::TlsAcceptor> {
    use tokio_rustls::rustls::{
        self,
        pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer},
    };
    let bad = |e: &dyn std::fmt::Display| std::io::Error::other(e.to_string());
    let chain = CertificateDer::pem_slice_iter(TEST_SERVER_CHAIN_PEM.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(&e))?;
    let key = PrivateKeyDer::from_pem_slice(TEST_SERVER_KEY_PEM.as_bytes()).map_err(|e| bad(&e))?;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(&e))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| bad(&e))?;
    Ok(tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config)))
}

impl FakeTelegram {
    /// Binds `127.0.0.1:0` and serves plain HTTP in the background.
    ///
    /// # Errors
    /// When no loopback port can be bound.
    pub async fn start() -> std::io::Result<Self> {
        Self::serve(None).await
    }

    /// Binds `127.0.0.1:0` and serves HTTPS with a certificate for `localhost` and
    /// `127.0.0.1` signed by [`TEST_CA_PEM`], as the real Bot API does over TLS.
    ///
    /// # Errors
    /// When no loopback port can be bound.
    pub async fn start_tls() -> std::io::Result<Self> {
        Self::serve(Some(acceptor()?)).await
    }

    async fn serve(tls: Option<tokio_rustls::TlsAcceptor>) -> std::io::Result<Self> {
        let state = FakeState::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let router = app(state.clone());
        let (tx, rx) = tokio::sync::mpsc::channel(1024);
        let accepted = state.accepted.clone();
        let is_tls = tls.is_some();
        let accept_loop = async move {
            loop {
                let Ok((tcp, peer)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                accepted.fetch_add(1, Ordering::SeqCst);
                let _ = tcp.set_nodelay(true);
                match &tls {
                    None => {
                        if tx.send((Conn::Plain(tcp), peer)).await.is_err() {
                            return;
                        }
                    }
                    Some(acceptor) => {
                        let (acceptor, tx) = (acceptor.clone(), tx.clone());
                        tokio::spawn(async move {
                            if let Ok(s) = acceptor.accept(tcp).await {
                                let _ = tx.send((Conn::Tls(Box::new(s)), peer)).await;
                            }
                        });
                    }
                }
            }
        };
        let task = tokio::spawn(async move {
            let serve = axum::serve(Accepting { rx, addr }, router);
            tokio::select! {
                _ = serve => {}
                () = accept_loop => {}
            }
        });
        Ok(Self {
            addr,
            tls: is_tls,
            state,
            task,
        })
    }

    /// `http://127.0.0.1:<port>` (`https://localhost:<port>` when serving TLS): pass as the
    /// bots' API URL.
    pub fn url(&self) -> String {
        if self.tls {
            format!("https://localhost:{}", self.addr.port())
        } else {
            format!("http://{}", self.addr)
        }
    }

    /// The shared state: add bots, write as users, read what was sent.
    pub fn state(&self) -> &FakeState {
        &self.state
    }
}

impl Drop for FakeTelegram {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::SeqCst);
        self.task.abort();
    }
}
