//! A fake WhatsApp Cloud API (feature `fake`): the Graph endpoints a bot calls
//! (`GET /{phone_number_id}`, `POST /{phone_number_id}/messages`, bearer tokens, Graph error
//! JSON) and Meta's side of the webhook: signed deliveries (`X-Hub-Signature-256`) of text
//! messages and status updates to a subscribed URL, one chat's after another, retried until
//! they get a 2xx, and duplicated on request.

use std::{
    collections::{HashMap, HashSet},
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use axum::{
    extract::{Path, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::{get, post},
    Json, Router,
};
use serde_json::{json, Value};
use tokio::sync::Notify;

use crate::sign;

mod media;
pub use media::SentMedia;

/// A text the fake received through `POST /{phone_number_id}/messages`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    /// The sending number's id.
    pub phone_number_id: String,
    /// The recipient.
    pub to: String,
    /// The text body.
    pub text: String,
    /// The message it answers (`context.message_id`), if any.
    pub reply_to: Option<String>,
    /// The id the fake gave it.
    pub wamid: String,
    /// Its reply buttons, as (id, title), for an `interactive` message of type `button`
    /// (or the rows of one of type `list`).
    pub buttons: Vec<(String, String)>,
    /// Whether its choices are a list's rows (a tap is a `list_reply`).
    pub list: bool,
    /// The file of a media message (`text` is its caption).
    pub media: Option<SentMedia>,
    /// A template message: its name and language (`text` is empty; its components in
    /// `components`).
    pub template: Option<(String, String)>,
    /// A template's components, as sent.
    pub components: Option<Value>,
}

/// An error to answer the next send of a number with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendFault {
    /// 401 with Graph code 190 (token expired).
    TokenExpired,
    /// 400 with code 131047 (outside the 24-hour window): refused.
    Refused,
    /// 429 with code 130429.
    RateLimited,
    /// 500.
    ServerError,
}

struct Number {
    token: String,
    app_secret: String,
    webhook: Option<String>,
    faults: Vec<SendFault>,
    /// The number's throughput, when kept: (messages a second, tokens left, when counted).
    throughput: Option<(f64, f64, Instant)>,
    /// The customer service window is kept: only templates go to a user whose last message
    /// is older than 24 hours (or who never wrote).
    window: bool,
}

/// How long after a user's last message a business may send them more than templates.
const WINDOW_MS: i64 = 24 * 3_600_000;

struct Pending {
    id: String,
    chat: Option<String>,
    body: Vec<u8>,
    attempts: u32,
    retry_at: Option<Instant>,
    in_flight: bool,
}

#[derive(Default)]
struct Inner {
    numbers: HashMap<String, Number>,
    sent: Vec<Sent>,
    /// Per number: deliveries not acknowledged yet, oldest first.
    pending: HashMap<String, Vec<Pending>>,
    delivering: HashSet<String>,
    /// Media by id: users' and uploads.
    media: HashMap<String, media::StoredMedia>,
    /// Typing indicators shown: (phone number id, the user's message it answers, when).
    typing: Vec<(String, String, std::time::Instant)>,
    /// When each message of `sent` was taken.
    sent_at: Vec<Instant>,
    /// Messages answered 429 for a number's throughput.
    throttled: u64,
    /// (number, user) → unix ms of the user's last message to it.
    last_in: HashMap<(String, String), i64>,
    /// Messages refused with 131047 (outside the window).
    outside_window: u64,
}

/// Shared state of the fake; cheap to clone.
#[derive(Clone, Default)]
pub struct FakeGraphState {
    inner: Arc<Mutex<Inner>>,
    wake: Arc<Notify>,
    next_id: Arc<AtomicU64>,
    delivered: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    duplicate: Arc<AtomicBool>,
    stopped: Arc<AtomicBool>,
    /// `http://127.0.0.1:<port>`, for the media URLs it gives.
    base: Arc<Mutex<String>>,
}

impl FakeGraphState {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds the number `phone_number_id`, reachable with `token`, signing with `app_secret`.
    pub fn add_number(&self, phone_number_id: &str, token: &str, app_secret: &str) {
        self.lock().numbers.insert(
            phone_number_id.to_owned(),
            Number {
                token: token.to_owned(),
                app_secret: app_secret.to_owned(),
                webhook: None,
                faults: Vec::new(),
                throughput: None,
                window: false,
            },
        );
    }

    /// Keeps WhatsApp's customer service window for the number: a message other than a
    /// template to a user who last wrote more than 24 hours ago, or never, is answered 400
    /// with code 131047 (counted in [`Self::window_refusals`]).
    pub fn keep_window(&self, phone_number_id: &str) {
        if let Some(n) = self.lock().numbers.get_mut(phone_number_id) {
            n.window = true;
        }
    }

    /// Makes the user `from`'s last message to the number `ago` old (as if time passed).
    pub fn user_wrote_ago(&self, phone_number_id: &str, from: &str, ago: std::time::Duration) {
        let at = unix_ms() - i64::try_from(ago.as_millis()).unwrap_or(i64::MAX / 2);
        self.lock()
            .last_in
            .insert((phone_number_id.to_owned(), from.to_owned()), at);
    }

    /// Messages refused for the customer service window (code 131047).
    pub fn window_refusals(&self) -> u64 {
        self.lock().outside_window
    }

    /// Keeps the number's throughput as WhatsApp does: `per_second` messages a second, in
    /// bursts of as many (and a tenth more, for the time a message takes to arrive); a message
    /// past it is answered 429 with code 130429 (counted in [`Self::throttled`]).
    pub fn limit_throughput(&self, phone_number_id: &str, per_second: u32) {
        if let Some(n) = self.lock().numbers.get_mut(phone_number_id) {
            let rate = f64::from(per_second.max(1));
            n.throughput = Some((rate, rate * 1.1, Instant::now()));
        }
    }

    /// Messages answered 429 for a number's throughput ([`Self::limit_throughput`]).
    pub fn throttled(&self) -> u64 {
        self.lock().throttled
    }

    /// When each message of [`Self::sent`] was taken, in the same order.
    pub fn sent_times(&self) -> Vec<Instant> {
        self.lock().sent_at.clone()
    }

    /// Makes the number's token answer 401/190 from now on.
    pub fn revoke(&self, phone_number_id: &str) {
        if let Some(n) = self.lock().numbers.get_mut(phone_number_id) {
            n.token = format!("revoked-{}", n.token);
        }
    }

    /// Gives the number a new token (an operator's rotation): the old one is refused from
    /// now on; the subscription stays.
    pub fn set_token(&self, phone_number_id: &str, token: &str) {
        if let Some(n) = self.lock().numbers.get_mut(phone_number_id) {
            n.token = token.to_owned();
        }
    }

    /// Subscribes `url` to the number's changes (what the Meta app dashboard does).
    pub fn subscribe(&self, phone_number_id: &str, url: &str) {
        if let Some(n) = self.lock().numbers.get_mut(phone_number_id) {
            n.webhook = Some(url.to_owned());
        }
        self.wake.notify_waiters();
    }

    /// Delivers every message twice (the second after the first got its 2xx), as Meta may.
    pub fn duplicate_deliveries(&self, on: bool) {
        self.duplicate.store(on, Ordering::SeqCst);
    }

    /// Answers the number's next send with `fault`.
    pub fn inject_send(&self, phone_number_id: &str, fault: SendFault) {
        if let Some(n) = self.lock().numbers.get_mut(phone_number_id) {
            n.faults.push(fault);
        }
    }

    fn enqueue(&self, phone_number_id: &str, id: String, chat: Option<String>, doc: &Value) {
        let body = doc.to_string().into_bytes();
        let copies = if self.duplicate.load(Ordering::SeqCst) && chat.is_some() {
            2
        } else {
            1
        };
        let mut g = self.lock();
        if let Some(from) = &chat {
            // A user's message opens (or renews) the window.
            g.last_in
                .insert((phone_number_id.to_owned(), from.clone()), unix_ms());
        }
        let q = g.pending.entry(phone_number_id.to_owned()).or_default();
        for _ in 0..copies {
            q.push(Pending {
                id: id.clone(),
                chat: chat.clone(),
                body: body.clone(),
                attempts: 0,
                retry_at: None,
                in_flight: false,
            });
        }
        let start = g.delivering.insert(phone_number_id.to_owned());
        drop(g);
        if start {
            tokio::spawn(deliver(self.clone(), phone_number_id.to_owned()));
        }
        self.wake.notify_waiters();
    }

    /// A user `from` writes `text` to the number; answers the message's `wamid`.
    pub fn user_writes(&self, phone_number_id: &str, from: &str, text: &str) -> String {
        let id = format!("wamid.{}", self.next_id.fetch_add(1, Ordering::SeqCst) + 1);
        let doc = message_doc(
            phone_number_id,
            from,
            json!({"from": from, "id": id, "timestamp": "1700000000", "type": "text", "text": {"body": text}}),
        );
        self.enqueue(phone_number_id, id.clone(), Some(from.to_owned()), &doc);
        id
    }

    /// A user `from` shares a location with the number (a message kind bots do not handle,
    /// which renews the window all the same); answers the message's `wamid`.
    pub fn user_shares_location(&self, phone_number_id: &str, from: &str) -> String {
        let id = format!("wamid.{}", self.next_id.fetch_add(1, Ordering::SeqCst) + 1);
        let doc = message_doc(
            phone_number_id,
            from,
            json!({"from": from, "id": id, "timestamp": (unix_ms() / 1000).to_string(), "type": "location",
                "location": {"latitude": 52.52, "longitude": 13.405, "name": "Alexanderplatz"}}),
        );
        self.enqueue(phone_number_id, id.clone(), Some(from.to_owned()), &doc);
        id
    }

    /// The user `from` taps the reply button `button_id` of the bot's interactive message
    /// `wamid`: an `interactive` `button_reply` message whose `context.id` is that message.
    /// Answers the reply's own id, or `None` when that message has no such button.
    pub fn user_presses(
        &self,
        phone_number_id: &str,
        from: &str,
        wamid: &str,
        button_id: &str,
    ) -> Option<String> {
        let (title, list) = {
            let g = self.lock();
            let sent = g.sent.iter().find(|s| s.wamid == wamid && s.to == from)?;
            let title = sent
                .buttons
                .iter()
                .find(|(id, _)| id == button_id)?
                .1
                .clone();
            (title, sent.list)
        };
        let reply = if list {
            json!({"type": "list_reply", "list_reply": {"id": button_id, "title": title}})
        } else {
            json!({"type": "button_reply", "button_reply": {"id": button_id, "title": title}})
        };
        let id = format!("wamid.{}", self.next_id.fetch_add(1, Ordering::SeqCst) + 1);
        let doc = message_doc(
            phone_number_id,
            from,
            json!({"from": from, "id": id, "timestamp": "1700000000", "type": "interactive",
                "context": {"from": "15550000000", "id": wamid},
                "interactive": reply}),
        );
        self.enqueue(phone_number_id, id.clone(), Some(from.to_owned()), &doc);
        Some(id)
    }

    /// A status update (`delivered`) of `wamid`: taken and ignored by a bot.
    pub fn status_update(&self, phone_number_id: &str, wamid: &str) {
        let doc = json!({
            "object": "whatsapp_business_account",
            "entry": [{"id": "waba", "changes": [{"field": "messages", "value": {
                "messaging_product": "whatsapp",
                "metadata": {"phone_number_id": phone_number_id},
                "statuses": [{"id": wamid, "status": "delivered", "timestamp": "1700000001", "recipient_id": "1"}]
            }}]}]
        });
        let id = format!("status.{}", self.next_id.fetch_add(1, Ordering::SeqCst) + 1);
        self.enqueue(phone_number_id, id, None, &doc);
    }

    /// Everything sent, in arrival order.
    pub fn sent(&self) -> Vec<Sent> {
        self.lock().sent.clone()
    }

    /// The typing indicators number `phone_number_id` showed (a read receipt with
    /// `typing_indicator`), as (the user's message id, when), in order.
    pub fn typing(&self, phone_number_id: &str) -> Vec<(String, std::time::Instant)> {
        self.lock()
            .typing
            .iter()
            .filter(|t| t.0 == phone_number_id)
            .map(|t| (t.1.clone(), t.2))
            .collect()
    }

    /// How many sends arrived.
    pub fn sent_count(&self) -> usize {
        self.lock().sent.len()
    }

    /// Deliveries answered 2xx, and deliveries that were not (each retried).
    pub fn deliveries(&self) -> (u64, u64) {
        (
            self.delivered.load(Ordering::SeqCst),
            self.failed.load(Ordering::SeqCst),
        )
    }

    /// Deliveries not acknowledged yet, over every number.
    pub fn undelivered(&self) -> usize {
        self.lock().pending.values().map(Vec::len).sum()
    }
}

/// Delivers a number's queue: up to 8 at once, one chat's after another, a failure retried
/// with a growing delay while that chat's later ones wait.
async fn deliver(state: FakeGraphState, number: String) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_default();
    loop {
        if state.stopped.load(Ordering::SeqCst) {
            return;
        }
        let notified = state.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let now = Instant::now();
        let target = state
            .lock()
            .numbers
            .get(&number)
            .and_then(|n| Some((n.webhook.clone()?, n.app_secret.clone())));
        let Some((url, secret)) = target else {
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
            continue;
        };
        let picks = {
            let mut g = state.lock();
            let mut picks = Vec::new();
            let mut busy_chats = HashSet::new();
            let q = g.pending.entry(number.clone()).or_default();
            let in_flight = q.iter().filter(|p| p.in_flight).count();
            for (i, p) in q.iter_mut().enumerate() {
                let waiting = p.in_flight || p.retry_at.is_some_and(|t| t > now);
                let chat_busy = p.chat.as_ref().is_some_and(|c| busy_chats.contains(c));
                if let Some(c) = &p.chat {
                    busy_chats.insert(c.clone());
                }
                if waiting || chat_busy || in_flight + picks.len() >= 8 {
                    continue;
                }
                p.in_flight = true;
                picks.push((i, p.id.clone(), p.body.clone(), url.clone(), secret.clone()));
            }
            picks
        };
        for (_, id, body, url, secret) in picks {
            let (state, http, number) = (state.clone(), http.clone(), number.clone());
            tokio::spawn(async move {
                let ok = http
                    .post(&url)
                    .header("content-type", "application/json")
                    .header("x-hub-signature-256", sign(&secret, &body))
                    .body(body.clone())
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success());
                {
                    let mut g = state.lock();
                    let q = g.pending.entry(number).or_default();
                    if let Some(pos) = q.iter().position(|p| p.in_flight && p.id == id) {
                        if ok {
                            q.remove(pos);
                        } else {
                            let p = &mut q[pos];
                            p.in_flight = false;
                            p.attempts += 1;
                            p.retry_at = Some(
                                Instant::now() + Duration::from_millis(100u64 << p.attempts.min(5)),
                            );
                        }
                    }
                }
                if ok {
                    state.delivered.fetch_add(1, Ordering::SeqCst);
                } else {
                    state.failed.fetch_add(1, Ordering::SeqCst);
                }
                state.wake.notify_waiters();
            });
        }
        tokio::select! {
            () = notified => {}
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
}

fn graph_error(status: StatusCode, code: i64, message: &str) -> Response {
    (
        status,
        Json(json!({"error": {"message": message, "type": "OAuthException", "code": code, "fbtrace_id": "fake"}})),
    )
        .into_response()
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get("authorization")?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

/// The Graph error for a request on number `id` with these headers, if it is not allowed.
fn refusal(state: &FakeGraphState, id: &str, headers: &HeaderMap) -> Option<Response> {
    let g = state.lock();
    match (g.numbers.get(id), bearer(headers)) {
        (Some(n), Some(t)) if n.token == t => None,
        (None, Some(_)) => Some(graph_error(
            StatusCode::BAD_REQUEST,
            100,
            "Unsupported get request: the object does not exist",
        )),
        _ => Some(graph_error(
            StatusCode::UNAUTHORIZED,
            190,
            "Error validating access token: Session has expired",
        )),
    }
}

async fn number_info(
    State(state): State<FakeGraphState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = media::info(&state, &id, &headers) {
        return r;
    }
    if let Some(r) = refusal(&state, &id, &headers) {
        return r;
    }
    Json(json!({"verified_name": "Fake", "display_phone_number": "+1 555-0100", "id": id}))
        .into_response()
}

async fn messages(
    State(state): State<FakeGraphState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Option<Json<Value>>,
) -> Response {
    if let Some(r) = refusal(&state, &id, &headers) {
        return r;
    }
    let Some(Json(doc)) = body else {
        return graph_error(StatusCode::BAD_REQUEST, 100, "Invalid parameter");
    };
    // A read receipt, with the typing indicator when asked (shown until the reply, at most
    // 25 s); the faults a test queued are for sends.
    if doc["status"] == "read" {
        let Some(read) = doc["message_id"]
            .as_str()
            .filter(|m| m.starts_with("wamid."))
        else {
            return graph_error(StatusCode::BAD_REQUEST, 100, "Invalid parameter");
        };
        if doc["messaging_product"] != "whatsapp" {
            return graph_error(StatusCode::BAD_REQUEST, 100, "Invalid parameter");
        }
        if !doc["typing_indicator"].is_null() {
            if doc["typing_indicator"]["type"] != "text" {
                return graph_error(StatusCode::BAD_REQUEST, 100, "Invalid parameter");
            }
            state
                .lock()
                .typing
                .push((id, read.to_owned(), std::time::Instant::now()));
        }
        return Json(json!({"success": true})).into_response();
    }
    let fault = state
        .lock()
        .numbers
        .get_mut(&id)
        .and_then(|n| (!n.faults.is_empty()).then(|| n.faults.remove(0)));
    match fault {
        Some(SendFault::TokenExpired) => {
            return graph_error(StatusCode::UNAUTHORIZED, 190, "Session has expired")
        }
        Some(SendFault::Refused) => {
            return graph_error(StatusCode::BAD_REQUEST, 131_047, "Re-engagement message")
        }
        Some(SendFault::RateLimited) => {
            return graph_error(StatusCode::TOO_MANY_REQUESTS, 130_429, "Rate limit hit")
        }
        Some(SendFault::ServerError) => {
            return graph_error(StatusCode::INTERNAL_SERVER_ERROR, 1, "An unknown error")
        }
        None => {}
    }
    if !throughput_left(&state, &id) {
        return graph_error(StatusCode::TOO_MANY_REQUESTS, 130_429, "Rate limit hit");
    }
    let template = doc["type"] == "template";
    let to = doc["to"].as_str().filter(|t| !t.is_empty());
    if !template && to.is_some_and(|to| outside_window(&state, &id, to)) {
        return graph_error(
            StatusCode::BAD_REQUEST,
            131_047,
            "Re-engagement message: more than 24 hours have passed since the recipient last replied",
        );
    }
    if template {
        return template_message(&state, id, &doc);
    }
    let interactive = doc["type"] == "interactive";
    let is_media = matches!(
        doc["type"].as_str(),
        Some("image" | "video" | "audio" | "document" | "sticker")
    );
    let media = if is_media {
        match media::media_message(&state, &id, &doc) {
            Ok(m) => Some(m),
            Err(why) => return graph_error(StatusCode::BAD_REQUEST, 131_009, why),
        }
    } else {
        None
    };
    let text = if interactive {
        doc["interactive"]["body"]["text"].as_str()
    } else if let Some((_, caption)) = &media {
        Some(caption.as_str())
    } else {
        doc["text"]["body"].as_str()
    };
    let (Some(to), Some(text)) = (doc["to"].as_str(), text) else {
        return graph_error(StatusCode::BAD_REQUEST, 100, "Invalid parameter");
    };
    if doc["messaging_product"] != "whatsapp" || (text.is_empty() && media.is_none()) {
        return graph_error(StatusCode::BAD_REQUEST, 100, "Invalid parameter");
    }
    let list = interactive && doc["interactive"]["type"] == "list";
    let buttons = if list {
        match list_rows(&doc["interactive"]) {
            Ok(b) => b,
            Err(why) => return graph_error(StatusCode::BAD_REQUEST, 131_009, why),
        }
    } else if interactive {
        match reply_buttons(&doc["interactive"], text) {
            Ok(b) => b,
            Err(why) => return graph_error(StatusCode::BAD_REQUEST, 131_009, why),
        }
    } else {
        Vec::new()
    };
    taken(
        &state,
        Sent {
            phone_number_id: id,
            to: to.to_owned(),
            text: text.to_owned(),
            reply_to: doc["context"]["message_id"].as_str().map(str::to_owned),
            wamid: String::new(),
            buttons,
            list,
            media: media.map(|(m, _)| m),
            template: None,
            components: None,
        },
    )
}

/// Records a message taken (with the id it gets) and answers as Graph does.
fn taken(state: &FakeGraphState, mut sent: Sent) -> Response {
    sent.wamid = format!(
        "wamid.out.{}",
        state.next_id.fetch_add(1, Ordering::SeqCst) + 1
    );
    let answer = json!({"messaging_product": "whatsapp",
        "contacts": [{"input": sent.to, "wa_id": sent.to}], "messages": [{"id": sent.wamid}]});
    let mut g = state.lock();
    g.sent_at.push(Instant::now());
    g.sent.push(sent);
    Json(answer).into_response()
}

/// Whether the number keeps the window and `to` last wrote to it more than 24 hours ago (or
/// never): then only a template may go (the refusal is counted).
fn outside_window(state: &FakeGraphState, id: &str, to: &str) -> bool {
    let mut g = state.lock();
    if !g.numbers.get(id).is_some_and(|n| n.window) {
        return false;
    }
    let last = g.last_in.get(&(id.to_owned(), to.to_owned())).copied();
    let outside = last.is_none_or(|t| unix_ms() - t > WINDOW_MS);
    if outside {
        g.outside_window += 1;
    }
    outside
}

/// A `template` message: a name and a language code (`{"code": …}`), and components if
/// any, as an array; recorded with an empty text.
fn template_message(state: &FakeGraphState, id: String, doc: &Value) -> Response {
    let t = &doc["template"];
    let (Some(to), Some(name), Some(language)) = (
        doc["to"].as_str(),
        t["name"].as_str().filter(|n| !n.is_empty()),
        t["language"]["code"].as_str().filter(|c| !c.is_empty()),
    ) else {
        return graph_error(StatusCode::BAD_REQUEST, 100, "Invalid parameter");
    };
    let components = t.get("components").cloned();
    if components.as_ref().is_some_and(|c| !c.is_array()) || doc["messaging_product"] != "whatsapp"
    {
        return graph_error(StatusCode::BAD_REQUEST, 100, "Invalid parameter");
    }
    taken(
        state,
        Sent {
            phone_number_id: id,
            to: to.to_owned(),
            text: String::new(),
            reply_to: None,
            wamid: String::new(),
            buttons: Vec::new(),
            list: false,
            media: None,
            template: Some((name.to_owned(), language.to_owned())),
            components,
        },
    )
}

/// Unix ms now.
fn unix_ms() -> i64 {
    botfleet_core::unix_ms()
}

/// Takes a message from the number's throughput, when it is kept: false (counted) when
/// none is left.
fn throughput_left(state: &FakeGraphState, id: &str) -> bool {
    let mut g = state.lock();
    let Some(n) = g.numbers.get_mut(id) else {
        return true;
    };
    let Some((rate, tokens, at)) = n.throughput.as_mut() else {
        return true;
    };
    let now = Instant::now();
    *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * *rate).min(*rate * 1.1);
    *at = now;
    if *tokens < 1.0 {
        g.throttled += 1;
        return false;
    }
    *tokens -= 1.0;
    true
}

/// A webhook delivery of one `message` from `from` to the number `phone_number_id`.
fn message_doc(phone_number_id: &str, from: &str, message: Value) -> Value {
    json!({
        "object": "whatsapp_business_account",
        "entry": [{"id": "waba", "changes": [{"field": "messages", "value": {
            "messaging_product": "whatsapp",
            "metadata": {"display_phone_number": "15550000000", "phone_number_id": phone_number_id},
            "contacts": [{"profile": {"name": "user"}, "wa_id": from}],
            "messages": [message]
        }}]}]
    })
}

/// An `interactive` message of type `button`, checked as the Cloud API does: a body of at
/// most 1,024 characters and 1–3 reply buttons, each with a unique id of at most 256
/// characters and a title of 1–20.
fn reply_buttons(i: &Value, body: &str) -> Result<Vec<(String, String)>, &'static str> {
    if i["type"] != "button" {
        return Err("Parameter value is not valid: interactive.type");
    }
    if body.chars().count() > 1024 {
        return Err("Parameter value is not valid: body.text too long");
    }
    let list = i["action"]["buttons"].as_array().ok_or("buttons missing")?;
    if list.is_empty() || list.len() > 3 {
        return Err("Parameter value is not valid: 1 to 3 buttons");
    }
    let mut out: Vec<(String, String)> = Vec::new();
    for b in list {
        let (Some(id), Some(title)) = (b["reply"]["id"].as_str(), b["reply"]["title"].as_str())
        else {
            return Err("Parameter value is not valid: reply.id and reply.title");
        };
        let title_ok = (1..=20).contains(&title.chars().count());
        if b["type"] != "reply" || id.is_empty() || id.chars().count() > 256 || !title_ok {
            return Err("Parameter value is not valid: button");
        }
        if out.iter().any(|(x, _)| x == id) {
            return Err("Parameter value is not valid: duplicate button id");
        }
        out.push((id.to_owned(), title.to_owned()));
    }
    Ok(out)
}

/// An `interactive` message of type `list`, checked as the Cloud API does: a button label of
/// 1–20 characters and 1–10 rows over its sections, each with a unique id of at most 200
/// characters and a title of 1–24.
fn list_rows(i: &Value) -> Result<Vec<(String, String)>, &'static str> {
    let label = i["action"]["button"].as_str().unwrap_or_default();
    if !(1..=20).contains(&label.chars().count()) {
        return Err("Parameter value is not valid: action.button");
    }
    let mut out: Vec<(String, String)> = Vec::new();
    for section in i["action"]["sections"].as_array().into_iter().flatten() {
        for r in section["rows"].as_array().into_iter().flatten() {
            let (Some(id), Some(title)) = (r["id"].as_str(), r["title"].as_str()) else {
                return Err("Parameter value is not valid: row id and title");
            };
            let ok = !id.is_empty()
                && id.chars().count() <= 200
                && (1..=24).contains(&title.chars().count());
            if !ok || out.iter().any(|(x, _)| x == id) {
                return Err("Parameter value is not valid: row");
            }
            out.push((id.to_owned(), title.to_owned()));
        }
    }
    if out.is_empty() || out.len() > 10 {
        return Err("Parameter value is not valid: 1 to 10 rows");
    }
    Ok(out)
}

/// The fake's routes, callable without a socket.
pub fn app(state: FakeGraphState) -> Router {
    Router::new()
        .route("/{id}", get(number_info))
        .route("/{id}/messages", post(messages))
        .route("/{id}/media", post(media::upload))
        .route("/media-files/{id}", get(media::download))
        .layer(axum::extract::DefaultBodyLimit::max(64 * 1024 * 1024))
        .with_state(state)
}

/// A fake Graph API on `127.0.0.1:0`.
pub struct FakeGraph {
    addr: SocketAddr,
    state: FakeGraphState,
    task: tokio::task::JoinHandle<()>,
}

impl FakeGraph {
    /// Binds a loopback port and serves.
    ///
    /// # Errors
    /// When no loopback port can be bound.
    pub async fn start() -> std::io::Result<Self> {
        let state = FakeGraphState::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        *state.base.lock().unwrap_or_else(|e| e.into_inner()) = format!("http://{addr}");
        let router = app(state.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(Self { addr, state, task })
    }

    /// `http://127.0.0.1:<port>`: the bots' API URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The shared state.
    pub fn state(&self) -> &FakeGraphState {
        &self.state
    }
}

impl Drop for FakeGraph {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::SeqCst);
        self.task.abort();
    }
}
