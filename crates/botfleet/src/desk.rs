//! A chat handed to a person: `POST /api/v1/bots/{id}/chats/{chat}/pause` and
//! `POST /api/v1/bots/{id}/chats/{chat}/resume`. While a chat is paused its handler is not
//! called for it on any worker (from the moment the pause is answered); what its users write
//! is still journaled, acknowledged to the platform and recorded `paused`; sends through
//! `POST /api/v1/bots/{id}/messages` go on, so a person answers from a desk. The desk reads
//! the chat through `GET /api/v1/bots/{id}/chats/{chat}/events` (its log after a cursor, as
//! JSON or as server-sent events), from any worker.

use std::{collections::VecDeque, convert::Infallible, sync::Arc, time::Duration};

use axum::{
    body::Bytes,
    extract::{Path, Query, State},
    http::{header, HeaderMap, StatusCode},
    response::{
        sse::{Event as SseEvent, KeepAlive, Sse},
        IntoResponse, Response,
    },
    Json,
};
use botfleet_core::{BotId, BotSpec};
use botfleet_store::{ChatEvent, ChatPause, Store, MAX_CHAT_EVENTS, MAX_PAUSE_REASON};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use crate::api::{chat_fits, utf8, ApiError, ApiResult, ApiState};

/// The body of a pause (it may be empty: paused until resumed).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PauseRequest {
    /// Unix ms when the pause ends by itself (absent: when it is resumed).
    #[serde(default)]
    until_ms: Option<i64>,
    /// Why, for people (at most 500 bytes).
    #[serde(default)]
    reason: Option<String>,
}

/// The body of a resume (it may be empty: nothing replayed).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResumeRequest {
    /// Hand what was recorded during the pause to the handler, in the order it came (default:
    /// no, the person answered it).
    #[serde(default)]
    replay: bool,
}

/// A chat's pause, as it stands after the call.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ChatPauseView {
    /// The bot.
    bot: String,
    /// The chat, as the platform names it.
    chat: String,
    /// Whether the chat is paused now.
    paused: bool,
    /// Unix ms when the pause ends by itself (`null`: when it is resumed).
    until_ms: Option<i64>,
    /// Why, as given.
    reason: Option<String>,
    /// Unix ms when the pause began (a pause given again keeps it).
    paused_at_ms: Option<i64>,
    /// (resume) Whether the chat was paused.
    #[serde(skip_serializing_if = "Option::is_none")]
    was_paused: Option<bool>,
    /// (resume) How many messages recorded during the pause go to the handler now.
    #[serde(skip_serializing_if = "Option::is_none")]
    replayed: Option<usize>,
}

/// The body as `T`; an empty body is `T`'s default.
fn body_of<T: Default + serde::de::DeserializeOwned>(body: &Bytes) -> ApiResult<T> {
    let text = utf8(body)?;
    if text.trim().is_empty() {
        return Ok(T::default());
    }
    serde_json::from_str(text)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid", format!("the body: {e}")))
}

/// The bot `id` (its spec) and its chat `chat`, checked: 404 for an unknown bot, 422 for a
/// chat the platform cannot have.
async fn bot_chat(s: &ApiState, id: &str, chat: &str) -> ApiResult<BotSpec> {
    let rec = s.registry.get(id).await?;
    if !chat_fits(rec.spec.platform, chat) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_chat",
            format!(
                "{:?} is no {} chat",
                chat.chars().take(64).collect::<String>(),
                rec.spec.platform
            ),
        ));
    }
    Ok(rec.spec)
}

/// The store could not be read or written: nothing changed, retry.
fn store_failed(e: botfleet_store::StoreError) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "store_failed",
        format!("retry: {e}"),
    )
}

#[utoipa::path(post, path = "/api/v1/bots/{id}/chats/{chat}/pause",
    params(("id" = String, Path), ("chat" = String, Path, description = "The chat, as the platform names it")),
    request_body = PauseRequest,
    responses((status = 200, description = "Paused, on every worker from now on; paused again, the pause's end and reason are replaced.", body = ChatPauseView),
              (status = 400, description = "`invalid`: the body", body = ApiError),
              (status = 404, body = ApiError),
              (status = 422, description = "`invalid_chat`; `invalid`: `until_ms` is not ahead", body = ApiError),
              (status = 503, body = ApiError)))]
pub(crate) async fn pause_chat(
    State(s): State<ApiState>,
    Path((id, chat)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<Json<ChatPauseView>> {
    let req: PauseRequest = body_of(&body)?;
    let bot = bot_chat(&s, &id, &chat).await?.id;
    let now = botfleet_core::unix_ms();
    if let Some(until) = req.until_ms.filter(|u| *u <= now) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            format!("`until_ms` {until} is not ahead of now ({now}): leave it out to pause until resumed"),
        ));
    }
    if let Some(r) = &req.reason {
        if r.len() > MAX_PAUSE_REASON || r.chars().any(char::is_control) {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid",
                format!("`reason` takes at most {MAX_PAUSE_REASON} bytes of text on one line"),
            ));
        }
    }
    let pause = ChatPause {
        chat: chat.clone(),
        until_ms: req.until_ms,
        reason: req.reason.filter(|r| !r.is_empty()),
        paused_at_ms: now,
    };
    let store = &s.registry.store;
    store.chat_pause(&bot, &pause).await.map_err(store_failed)?;
    // As recorded (paused again, it keeps when it began).
    let now_paused = store
        .chat_pauses(&bot)
        .await
        .map_err(store_failed)?
        .into_iter()
        .find(|p| p.chat == chat)
        .unwrap_or(pause);
    Ok(Json(ChatPauseView {
        bot: id,
        chat,
        paused: true,
        until_ms: now_paused.until_ms,
        reason: now_paused.reason,
        paused_at_ms: Some(now_paused.paused_at_ms),
        was_paused: None,
        replayed: None,
    }))
}

#[utoipa::path(post, path = "/api/v1/bots/{id}/chats/{chat}/resume",
    params(("id" = String, Path), ("chat" = String, Path, description = "The chat, as the platform names it")),
    request_body = ResumeRequest,
    responses((status = 200, description = "Resumed (also when it was not paused): the chat's next messages go to the handler.", body = ChatPauseView),
              (status = 400, description = "`invalid`: the body", body = ApiError),
              (status = 404, body = ApiError),
              (status = 422, description = "`invalid_chat`", body = ApiError),
              (status = 503, body = ApiError)))]
pub(crate) async fn resume_chat(
    State(s): State<ApiState>,
    Path((id, chat)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<Json<ChatPauseView>> {
    let req: ResumeRequest = body_of(&body)?;
    let spec = bot_chat(&s, &id, &chat).await?;
    if req.replay && s.sends.is_none() {
        // (Nothing changed: without a worker here, nobody would be told to answer them.)
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no_worker",
            "this process runs no worker to replay through: resume through a worker's API",
        ));
    }
    let r = s
        .registry
        .store
        .chat_resume(&spec.id, &chat, req.replay)
        .await
        .map_err(store_failed)?;
    if !r.replayed.is_empty() {
        // Told now where this process can; else the sweeper or the unit's next claim.
        if let Some(sends) = &s.sends {
            sends.replayed(&spec, &chat, &r.replayed).await;
        }
    }
    Ok(Json(ChatPauseView {
        bot: id,
        chat,
        paused: false,
        until_ms: None,
        reason: r.pause.as_ref().and_then(|p| p.reason.clone()),
        paused_at_ms: r.pause.as_ref().map(|p| p.paused_at_ms),
        was_paused: Some(r.pause.is_some()),
        replayed: Some(r.replayed.len()),
    }))
}

/// Which chats `GET /api/v1/bots/{id}/chats` lists.
#[derive(Debug, Deserialize, IntoParams)]
pub(crate) struct ChatsQuery {
    /// `true`: the chats paused now (the only listing there is).
    #[serde(default)]
    paused: Option<bool>,
}

/// The bot's chats paused now, in chat order.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ChatList {
    chats: Vec<ChatPauseView>,
}

#[utoipa::path(get, path = "/api/v1/bots/{id}/chats",
    params(("id" = String, Path), ChatsQuery),
    responses((status = 200, description = "The chats paused now", body = ChatList),
              (status = 400, description = "`invalid`: without `paused=true`", body = ApiError),
              (status = 404, body = ApiError),
              (status = 503, body = ApiError)))]
pub(crate) async fn list_chats(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    Query(q): Query<ChatsQuery>,
) -> ApiResult<Json<ChatList>> {
    if q.paused != Some(true) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid",
            "list the paused chats with `?paused=true` (a bot's other chats are not listed)",
        ));
    }
    let rec = s.registry.get(&id).await?;
    let pauses = s
        .registry
        .store
        .chat_pauses(&rec.spec.id)
        .await
        .map_err(store_failed)?;
    Ok(Json(ChatList {
        chats: pauses
            .into_iter()
            .map(|p| ChatPauseView {
                bot: id.clone(),
                chat: p.chat,
                paused: true,
                until_ms: p.until_ms,
                reason: p.reason,
                paused_at_ms: Some(p.paused_at_ms),
                was_paused: None,
                replayed: None,
            })
            .collect(),
    }))
}

/// Which part of a chat's log to read.
#[derive(Debug, Deserialize, IntoParams)]
pub(crate) struct EventsQuery {
    /// Only what came after this cursor (an item's `cursor`; default 0: from the oldest kept).
    /// A stream resumes from `Last-Event-ID` instead, when sent.
    #[serde(default)]
    after: Option<u64>,
    /// At most this many (default 100, at most 1,000); a stream reads this many at a time.
    #[serde(default)]
    limit: Option<usize>,
}

/// An item of a chat's log.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ChatEventView {
    /// Its place in the chat's log: pass it as `after` (or `Last-Event-ID`) to read on.
    cursor: u64,
    /// `received` (a user's event), `send` (a send from the backend: a desk's answer), or
    /// `said` (what a turn of the bot did: one action).
    #[serde(rename = "type")]
    kind: &'static str,
    /// The journal entry: the event's or the send's key; for `said`, the entry whose turn did
    /// it.
    entry: String,
    /// (`received`, `send`) Where the entry is now: `pending`, `done`, `undeliverable`,
    /// `paused`.
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<&'static str>,
    /// Unix ms when it was recorded.
    at_ms: i64,
    /// `received`: the event as the handler gets it; `send`: the send as it was asked;
    /// `said`: the action as the handler gave it (a sent message's platform id in
    /// `message_id`). Files show without their bytes or the platform's name for them.
    #[schema(value_type = Object)]
    data: Value,
}

impl From<ChatEvent> for ChatEventView {
    fn from(e: ChatEvent) -> Self {
        let mut data = serde_json::from_str(&e.body).unwrap_or(Value::String(e.body));
        shown_data(&mut data);
        Self {
            cursor: e.n,
            kind: e.kind.as_str(),
            entry: e.entry,
            state: e.state.map(botfleet_store::InboxState::as_str),
            at_ms: e.at_ms,
            data,
        }
    }
}

/// An item's data without what is not for display: what answers an event on the platform
/// (a Discord interaction's token), what the platform calls a user's file (Slack's private
/// URL, Telegram's `file_id`: a handler never sees them either), and the bytes of files sent.
fn shown_data(data: &mut Value) {
    let Some(o) = data.as_object_mut() else {
        return;
    };
    o.remove("answer_handle");
    let files = |v: &mut Value| {
        for f in v.as_array_mut().into_iter().flatten() {
            if let Some(f) = f.as_object_mut() {
                f.remove("source");
                f.remove("data");
            }
        }
    };
    if let Some(a) = o.get_mut("attachments") {
        files(a);
    }
    for a in o
        .get_mut("actions")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if let Some(f) = a.get_mut("attachments") {
            files(f);
        }
    }
}

/// A part of a chat's log.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ChatEvents {
    /// The bot.
    bot: String,
    /// The chat, as the platform names it.
    chat: String,
    /// Oldest first.
    events: Vec<ChatEventView>,
    /// Where to read on from: the last item's `cursor` (the `after` given when there was none).
    cursor: u64,
}

/// How often a stream of a chat's log looks for what came (it reads the store: the chat's
/// items may be written by any worker).
const STREAM_LOOK: Duration = Duration::from_millis(250);

/// A chat's log after `after`, oldest first, at most `limit`: from each of the bot's units
/// (a chat is received by one of them).
async fn read_log(
    store: &dyn Store,
    units: &[BotId],
    chat: &str,
    after: u64,
    limit: usize,
) -> botfleet_store::Result<Vec<ChatEvent>> {
    let mut events = Vec::new();
    for u in units {
        events.extend(store.chat_events(u, chat, after, limit).await?);
    }
    if units.len() > 1 {
        events.sort_by_key(|e| e.n);
        events.truncate(limit);
    }
    Ok(events)
}

#[utoipa::path(get, path = "/api/v1/bots/{id}/chats/{chat}/events",
    params(("id" = String, Path), ("chat" = String, Path, description = "The chat, as the platform names it"), EventsQuery,
        ("Last-Event-ID" = Option<u64>, Header, description = "A stream resumes after this cursor")),
    responses((status = 200, description = "The chat's log after `after`, oldest first: what its users sent (`received`), the sends from the backend (`send`) and what the bot's turns did (`said`), each with its `cursor`. With `Accept: text/event-stream`, server-sent events: the same items (`id` the cursor, `event` the type, `data` the item as JSON), then each new one as it is recorded by any worker (looked for every 250 ms). Kept as long as the inbox keeps entries: answered ones an hour, paused and undeliverable ones 7 days.", body = ChatEvents),
              (status = 400, description = "`invalid`: `after`, `limit` or `Last-Event-ID`", body = ApiError),
              (status = 404, body = ApiError),
              (status = 422, description = "`invalid_chat`", body = ApiError),
              (status = 503, body = ApiError)))]
pub(crate) async fn chat_events(
    State(s): State<ApiState>,
    Path((id, chat)): Path<(String, String)>,
    Query(q): Query<EventsQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let spec = bot_chat(&s, &id, &chat).await?;
    let limit = match q.limit {
        None => 100,
        Some(n) if (1..=MAX_CHAT_EVENTS).contains(&n) => n,
        Some(n) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid",
                format!("`limit` {n}: from 1 to {MAX_CHAT_EVENTS}"),
            ))
        }
    };
    let units = spec.unit_ids();
    let store = s.registry.store.clone();
    let streamed = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    if !streamed {
        let after = q.after.unwrap_or(0);
        let events = read_log(&*store, &units, &chat, after, limit)
            .await
            .map_err(store_failed)?;
        let cursor = events.last().map_or(after, |e| e.n);
        return Ok(Json(ChatEvents {
            bot: id,
            chat,
            events: events.into_iter().map(ChatEventView::from).collect(),
            cursor,
        })
        .into_response());
    }
    let resumed = match headers.get("last-event-id") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "invalid",
                        "`Last-Event-ID` is not a cursor (a number an item's `id` gave)",
                    )
                })?,
        ),
    };
    let after = resumed.or(q.after).unwrap_or(0);
    let log = Log {
        store,
        units: units.into(),
        chat: chat.into(),
        after,
        limit,
        queue: VecDeque::new(),
        at_once: true,
    };
    let stream = futures_util::stream::unfold(log, |mut log| async move {
        let e = log.next().await;
        Some((Ok::<_, Infallible>(e), log))
    });
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

/// A stream of a chat's log: what it read and not sent yet, and where it is.
struct Log {
    store: Arc<dyn Store>,
    units: Arc<[BotId]>,
    chat: Arc<str>,
    after: u64,
    limit: usize,
    queue: VecDeque<ChatEvent>,
    /// Read again without waiting (the first read, or the last one read all it could).
    at_once: bool,
}

impl Log {
    /// The next item, read when it comes (a store that cannot be read is asked again).
    async fn next(&mut self) -> SseEvent {
        loop {
            if let Some(e) = self.queue.pop_front() {
                let id = e.n.to_string();
                let v = ChatEventView::from(e);
                let data = serde_json::to_string(&v).unwrap_or_default();
                return SseEvent::default().id(id).event(v.kind).data(data);
            }
            if !std::mem::take(&mut self.at_once) {
                tokio::time::sleep(STREAM_LOOK).await;
            }
            match read_log(
                &*self.store,
                &self.units,
                &self.chat,
                self.after,
                self.limit,
            )
            .await
            {
                Ok(events) => {
                    self.at_once = events.len() >= self.limit;
                    if let Some(last) = events.last() {
                        self.after = last.n;
                    }
                    self.queue.extend(events);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "cannot read a chat's log; trying again");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn shown_data_leaves_out_handles_file_sources_and_bytes() {
        let mut received = json!({"text": "hi", "answer_handle": "interaction-token",
            "attachments": [{"kind": "photo", "source": "file-id-1", "name": "a.jpg"}]});
        super::shown_data(&mut received);
        assert_eq!(
            received,
            json!({"text": "hi", "attachments": [{"kind": "photo", "name": "a.jpg"}]})
        );
        let mut send = json!({"actions": [{"type": "send", "text": "x",
            "attachments": [{"data": "aGVsbG8=", "name": "h.txt"}]}]});
        super::shown_data(&mut send);
        assert_eq!(
            send,
            json!({"actions": [{"type": "send", "text": "x", "attachments": [{"name": "h.txt"}]}]})
        );
        let mut text = json!("not an object");
        super::shown_data(&mut text);
        assert_eq!(text, json!("not an object"));
    }
}
