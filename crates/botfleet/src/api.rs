//! The control API under `/api/v1`, served by every worker on `--http-addr` beside
//! `/healthz`, `/readyz` and `/metrics`: the registry (the same operations as `botfleet bots`,
//! told to the fleet the same way), the fleet's state and this worker's journal. JSON in and
//! out; errors are `{"code": …, "message": …}` with a stable code; credentials are accepted,
//! never returned.
//!
//! Access: with a token configured (`--api-token-file`, `BOTFLEET_API_TOKEN`) every request
//! carries `Authorization: Bearer TOKEN` (compared in constant time); without one, only
//! loopback clients are answered.

use std::{net::SocketAddr, sync::Arc};

use axum::{
    body::Bytes,
    extract::{ConnectInfo, DefaultBodyLimit, Path, Query, Request, State},
    http::{header, HeaderMap, StatusCode},
    middleware::{self, Next},
    response::{
        sse::{Event as SseEvent, KeepAlive, Sse},
        IntoResponse, Response,
    },
    routing::{get, post},
    Json, Router,
};
use botfleet_coord::Coordinator;
use botfleet_runtime::{Journal, JournalEntry};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use utoipa::{IntoParams, OpenApi, ToSchema};

use crate::registry::{
    BotLine, BotPatch, BotView, Change, LineOutcome, LineResult, Registry, RegistryError,
};

/// Largest request body, except imports.
pub(crate) const MAX_BODY: usize = 64 * 1024;
/// Largest import body (JSON lines).
pub(crate) const MAX_IMPORT_BODY: usize = 32 * 1024 * 1024;

/// What the API's handlers read.
#[derive(Clone)]
pub(crate) struct ApiState {
    pub(crate) registry: Registry,
    pub(crate) coord: Arc<dyn Coordinator>,
    /// `embedded` or `fleet`.
    pub(crate) mode: &'static str,
    pub(crate) journal: Arc<Journal>,
    /// SHA-256 of the bearer token; `None`: loopback clients only.
    pub(crate) token_digest: Option<[u8; 32]>,
    /// The last fleet document and when it was made: pages refreshing every second share
    /// one computation a second (it reads the whole registry).
    pub(crate) fleet_cache:
        Arc<tokio::sync::Mutex<Option<(std::time::Instant, serde_json::Value)>>>,
    /// Sends from the backend through this process's worker (`None`: the API has none, and
    /// answers `no_worker`).
    pub(crate) sends: Option<botfleet_runtime::Sends>,
    /// The worker's metrics, for the API's own counts.
    pub(crate) metrics: Option<Arc<botfleet_runtime::Metrics>>,
}

/// An API error: a status, a stable code and a message for people.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ApiError {
    /// Stable, machine-readable: `unauthorized`, `loopback_only`, `invalid`, `not_found`,
    /// `exists`, `too_large`, `no_route`, `method_not_allowed`, `store_failed`,
    /// `fleet_not_told`, `fleet_unreachable`.
    code: &'static str,
    /// For people; never holds a credential.
    message: String,
    #[serde(skip)]
    #[schema(ignore)]
    status: u16,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            status: status.as_u16(),
        }
    }
}

impl From<RegistryError> for ApiError {
    fn from(e: RegistryError) -> Self {
        let status = match e.code {
            "invalid" => StatusCode::BAD_REQUEST,
            "not_found" => StatusCode::NOT_FOUND,
            "exists" => StatusCode::CONFLICT,
            "fleet_not_told" => StatusCode::BAD_GATEWAY,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        };
        Self::new(status, e.code, e.message)
    }
}

impl From<anyhow::Error> for ApiError {
    fn from(e: anyhow::Error) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "fleet_unreachable",
            format!("{e:#}"),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut r = (status, Json(&self)).into_response();
        if self.code == "unauthorized" {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        r
    }
}

pub(crate) type ApiResult<T> = Result<T, ApiError>;

pub(crate) fn utf8(body: &Bytes) -> ApiResult<&str> {
    std::str::from_utf8(body)
        .map_err(|_| ApiError::new(StatusCode::BAD_REQUEST, "invalid", "the body is not UTF-8"))
}

/// The SHA-256 of a token, as the API compares it.
pub(crate) fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Equal digests, in time that does not depend on where they differ.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn guard(
    State(s): State<ApiState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    req: Request,
    next: Next,
) -> Response {
    match &s.token_digest {
        Some(want) => {
            let given = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(|t| digest(t.trim()));
            if !given.is_some_and(|g| same(&g, want)) {
                return ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "a valid `Authorization: Bearer TOKEN` header is required",
                )
                .into_response();
            }
        }
        None if !peer.ip().is_loopback() => {
            return ApiError::new(
                StatusCode::FORBIDDEN,
                "loopback_only",
                "no API token is configured (--api-token-file, BOTFLEET_API_TOKEN): the API answers loopback clients only",
            )
            .into_response();
        }
        None => {}
    }
    next.run(req).await
}

/// A bot and what the request did to it.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct BotChanged {
    bot: BotView,
    change: Change,
}

/// Every bot.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct BotList {
    bots: Vec<BotView>,
}

/// Filters of `GET /bots`.
#[derive(Debug, Deserialize, IntoParams)]
pub(crate) struct BotQuery {
    /// Only this platform.
    platform: Option<String>,
    /// Only this status (`pending`, `running`, `stopped`, `failed`).
    status: Option<String>,
}

/// Options of `POST /bots/import`.
#[derive(Debug, Deserialize, IntoParams)]
pub(crate) struct ImportQuery {
    /// Update bots that exist already instead of refusing them.
    #[serde(default)]
    upsert: bool,
}

/// What an import did: counts, and every refused line with why.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ImportReport {
    added: usize,
    updated: usize,
    unchanged: usize,
    refused: Vec<LineResult>,
}

/// Options of `GET /events`.
#[derive(Debug, Deserialize, IntoParams)]
pub(crate) struct EventQuery {
    /// Only entries after this sequence number.
    #[serde(default)]
    after: u64,
    /// At most this many (default 200, at most 1,000).
    limit: Option<usize>,
}

/// This worker's journal.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Events {
    /// Oldest first.
    #[schema(value_type = Vec<Object>)]
    events: Vec<JournalEntry>,
}

#[utoipa::path(get, path = "/api/v1/bots", params(BotQuery),
    responses((status = 200, body = BotList), (status = 401, body = ApiError)))]
async fn list_bots(
    State(s): State<ApiState>,
    Query(q): Query<BotQuery>,
) -> ApiResult<Json<BotList>> {
    let bots = s
        .registry
        .list()
        .await?
        .into_iter()
        .filter(|b| q.platform.as_deref().is_none_or(|p| b.platform == p))
        .filter(|b| q.status.as_deref().is_none_or(|st| b.status == st))
        .collect();
    Ok(Json(BotList { bots }))
}

#[utoipa::path(post, path = "/api/v1/bots", request_body = BotLine,
    responses((status = 201, body = BotChanged), (status = 400, body = ApiError),
              (status = 409, body = ApiError)))]
async fn add_bot(
    State(s): State<ApiState>,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<BotChanged>)> {
    let spec = BotLine::from_json(utf8(&body)?)?.into_spec()?;
    s.registry.add(&spec).await?;
    let bot = s.registry.show(spec.id.as_str()).await?;
    Ok((
        StatusCode::CREATED,
        Json(BotChanged {
            bot,
            change: Change::Added,
        }),
    ))
}

#[utoipa::path(get, path = "/api/v1/bots/{id}", params(("id" = String, Path)),
    responses((status = 200, body = BotView), (status = 404, body = ApiError)))]
async fn get_bot(State(s): State<ApiState>, Path(id): Path<String>) -> ApiResult<Json<BotView>> {
    Ok(Json(s.registry.show(&id).await?))
}

#[utoipa::path(patch, path = "/api/v1/bots/{id}", params(("id" = String, Path)),
    request_body = BotPatch,
    responses((status = 200, body = BotChanged), (status = 400, body = ApiError),
              (status = 404, body = ApiError)))]
async fn patch_bot(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<BotChanged>> {
    let patch = BotPatch::from_json(utf8(&body)?)?;
    let change = s.registry.update(&id, patch).await?;
    Ok(Json(BotChanged {
        bot: s.registry.show(&id).await?,
        change,
    }))
}

#[utoipa::path(delete, path = "/api/v1/bots/{id}", params(("id" = String, Path)),
    responses((status = 204), (status = 404, body = ApiError)))]
async fn delete_bot(State(s): State<ApiState>, Path(id): Path<String>) -> ApiResult<StatusCode> {
    s.registry.remove(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/api/v1/bots/{id}/enable", params(("id" = String, Path)),
    responses((status = 200, body = BotChanged), (status = 404, body = ApiError)))]
async fn enable_bot(s: State<ApiState>, id: Path<String>) -> ApiResult<Json<BotChanged>> {
    set_enabled(s, id, true).await
}

#[utoipa::path(post, path = "/api/v1/bots/{id}/disable", params(("id" = String, Path)),
    responses((status = 200, body = BotChanged), (status = 404, body = ApiError)))]
async fn disable_bot(s: State<ApiState>, id: Path<String>) -> ApiResult<Json<BotChanged>> {
    set_enabled(s, id, false).await
}

async fn set_enabled(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    enabled: bool,
) -> ApiResult<Json<BotChanged>> {
    let change = s.registry.set_enabled(&id, enabled).await?;
    Ok(Json(BotChanged {
        bot: s.registry.show(&id).await?,
        change,
    }))
}

#[utoipa::path(post, path = "/api/v1/bots/{id}/restart", params(("id" = String, Path)),
    responses((status = 200, body = BotChanged), (status = 404, body = ApiError)))]
async fn restart_bot(
    State(s): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<Json<BotChanged>> {
    s.registry.restart(&id).await?;
    Ok(Json(BotChanged {
        bot: s.registry.show(&id).await?,
        change: Change::Updated,
    }))
}

#[utoipa::path(post, path = "/api/v1/bots/import", params(ImportQuery),
    request_body(content = String, description = "JSON lines, one NewBot per line", content_type = "application/x-ndjson"),
    responses((status = 200, body = ImportReport), (status = 400, body = ApiError)))]
async fn import_bots(
    State(s): State<ApiState>,
    Query(q): Query<ImportQuery>,
    body: Bytes,
) -> ApiResult<Json<ImportReport>> {
    let text = utf8(&body)?;
    let lines: Vec<(usize, Result<String, String>)> = text
        .lines()
        .enumerate()
        .map(|(n, l)| (n + 1, Ok(l.to_owned())))
        .collect();
    let results = s.registry.import(lines, q.upsert, |_| {}).await;
    let mut report = ImportReport {
        added: 0,
        updated: 0,
        unchanged: 0,
        refused: Vec::new(),
    };
    for r in results {
        match r.outcome {
            LineOutcome::Done {
                change: Change::Added,
            } => report.added += 1,
            LineOutcome::Done {
                change: Change::Updated,
            } => report.updated += 1,
            LineOutcome::Done {
                change: Change::Unchanged,
            } => report.unchanged += 1,
            LineOutcome::Refused { .. } => report.refused.push(r),
        }
    }
    Ok(Json(report))
}

#[utoipa::path(get, path = "/api/v1/fleet",
    responses((status = 200, description = "workers (heartbeat age, capacity, bots held), enabled bots, bots with no live owner and why, the grace window after a Redis data loss", body = Object)))]
async fn fleet(State(s): State<ApiState>) -> ApiResult<Json<serde_json::Value>> {
    // One computation at a time; callers within a second of it share its answer.
    let mut cached = s.fleet_cache.lock().await;
    if let Some((at, doc)) = cached.as_ref() {
        if at.elapsed() < FLEET_CACHE_FOR {
            return Ok(Json(doc.clone()));
        }
    }
    let doc = crate::fleet::status_doc(&*s.registry.store, Some(&*s.coord), s.mode).await?;
    *cached = Some((std::time::Instant::now(), doc.clone()));
    Ok(Json(doc))
}

/// How long a fleet document is served again.
const FLEET_CACHE_FOR: std::time::Duration = std::time::Duration::from_millis(900);

#[utoipa::path(get, path = "/api/v1/events", params(EventQuery),
    responses((status = 200, description = "this worker's journal: bots started, stopped, handed over, failed; workers joining and leaving; self-fencing; draining; registry changes", body = Events)))]
async fn events(State(s): State<ApiState>, Query(q): Query<EventQuery>) -> Json<Events> {
    let limit = q
        .limit
        .unwrap_or(200)
        .clamp(1, botfleet_runtime::JOURNAL_CAPACITY);
    Json(Events {
        events: s.journal.since(q.after, limit),
    })
}

#[utoipa::path(get, path = "/api/v1/events/stream", params(EventQuery),
    responses((status = 200, content_type = "text/event-stream", description = "server-sent events: the journal entries after `after`, then each new one as it happens (`id` is its `seq`, `data` the entry as JSON); `event: lagged` when the follower fell behind (read /api/v1/events?after= to catch up)")))]
async fn event_stream(
    State(s): State<ApiState>,
    Query(q): Query<EventQuery>,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, std::convert::Infallible>>> {
    // Follow first, then read the backlog: nothing falls between the two.
    let live = s.journal.follow();
    let backlog = s.journal.since(
        q.after,
        q.limit
            .unwrap_or(200)
            .clamp(1, botfleet_runtime::JOURNAL_CAPACITY),
    );
    let last = backlog.last().map_or(q.after, |e| e.seq);
    let first = futures_util::stream::iter(backlog.into_iter().map(|e| Ok(entry_event(&e))));
    let rest = futures_util::stream::unfold((live, last), |(mut live, last)| async move {
        loop {
            match live.recv().await {
                Ok(e) if e.seq <= last => continue,
                Ok(e) => {
                    let seq = e.seq;
                    return Some((Ok(entry_event(&e)), (live, seq)));
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    let ev = SseEvent::default().event("lagged").data(n.to_string());
                    return Some((Ok(ev), (live, last)));
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    Sse::new(futures_util::StreamExt::chain(first, rest))
        .keep_alive(KeepAlive::new().interval(std::time::Duration::from_secs(15)))
}

/// Options of the fleet's journal.
#[derive(Debug, Deserialize, IntoParams)]
pub(crate) struct FleetEventQuery {
    /// Only entries after this position.
    after: Option<u64>,
    /// At most this many (default 200, at most 5,000).
    limit: Option<usize>,
}

/// Entries of the fleet's journal as JSON, each with its `pos`.
async fn fleet_entries(
    coord: &dyn Coordinator,
    after: Option<u64>,
    limit: usize,
) -> ApiResult<Vec<Value>> {
    let raw = coord.journal_read(after, limit).await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "fleet_unreachable",
            e.to_string(),
        )
    })?;
    Ok(raw
        .into_iter()
        .filter_map(|(pos, e)| {
            let mut v: Value = serde_json::from_str(&e).ok()?;
            v["pos"] = Value::from(pos);
            Some(v)
        })
        .collect())
}

#[utoipa::path(get, path = "/api/v1/fleet/events", params(FleetEventQuery),
    responses((status = 200, description = "the whole fleet's journal (every worker's entries, as /api/v1/events shows one worker's), each with `pos`; the newest 5,000 are kept", body = Object)))]
async fn fleet_events(
    State(s): State<ApiState>,
    Query(q): Query<FleetEventQuery>,
) -> ApiResult<Json<Value>> {
    let limit = q
        .limit
        .unwrap_or(200)
        .clamp(1, botfleet_coord::JOURNAL_KEEP);
    let events = fleet_entries(&*s.coord, q.after, limit).await?;
    Ok(Json(serde_json::json!({ "events": events })))
}

#[utoipa::path(get, path = "/api/v1/fleet/events/stream", params(FleetEventQuery),
    responses((status = 200, content_type = "text/event-stream", description = "server-sent events: the fleet's journal after `after` (or the newest `limit`), then new entries as workers share them (every 250 ms); `id` is the entry's `pos`")))]
async fn fleet_event_stream(
    State(s): State<ApiState>,
    Query(q): Query<FleetEventQuery>,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, std::convert::Infallible>>> {
    let limit = q
        .limit
        .unwrap_or(200)
        .clamp(1, botfleet_coord::JOURNAL_KEEP);
    let stream = futures_util::stream::unfold(
        (
            s.coord.clone(),
            q.after,
            true,
            std::collections::VecDeque::<Value>::new(),
        ),
        move |(coord, mut after, mut first, mut queue)| async move {
            loop {
                if let Some(v) = queue.pop_front() {
                    let ev = SseEvent::default()
                        .id(v["pos"].to_string())
                        .data(v.to_string());
                    return Some((Ok(ev), (coord, after, first, queue)));
                }
                if !first {
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                }
                let ask = if first { limit } else { 1_000 };
                first = false;
                if let Ok(entries) = fleet_entries(&*coord, after, ask).await {
                    if let Some(last) = entries.last().and_then(|v| v["pos"].as_u64()) {
                        after = Some(last);
                    }
                    queue.extend(entries);
                }
            }
        },
    );
    Sse::new(stream).keep_alive(KeepAlive::new().interval(std::time::Duration::from_secs(15)))
}

fn entry_event(e: &JournalEntry) -> SseEvent {
    SseEvent::default()
        .id(e.seq.to_string())
        .data(serde_json::to_string(e).unwrap_or_default())
}

/// The live fleet page: one file, no build step, no outside assets; its data comes from the
/// API with the token the viewer gives.
async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        include_str!("page.html"),
    )
        .into_response()
}

/// `GET /api/v1/files/{id}`, served by the runtime's file links (`botfleet_runtime::Files`)
/// beside this API; documented here.
#[utoipa::path(get, path = "/api/v1/files/{id}", params(("id" = String, Path, description = "what an attachment's `url` names: a claim and its signature")),
    responses(
        (status = 200, description = "the file's bytes, streamed from its platform, with its `Content-Type` (and `Content-Length`, `Content-Disposition` when known). Needs no API token: the signature is the permission", content_type = "application/octet-stream"),
        (status = 403, description = "`bad_signature` (not this fleet's link, or altered) or `expired`: nothing was asked of the platform", body = ApiError),
        (status = 404, description = "`not_found`: the bot is no longer registered, or the platform no longer has the file", body = ApiError),
        (status = 502, description = "`platform_failed`, `platform_refused`: the platform's download failed", body = ApiError),
        (status = 503, description = "`store_failed`, `rate_limited` (with `Retry-After`)", body = ApiError)))]
#[allow(dead_code)]
fn file_link() {}

/// A part of a later answer (`{"actions": [...], "state"?, "final": true|false}`).
#[derive(Deserialize, ToSchema)]
#[allow(dead_code)]
struct ReplyPart {
    /// Actions of the handler contract, done in the held turn in the order posted.
    #[schema(value_type = Option<Vec<Object>>)]
    actions: Option<Vec<Value>>,
    /// The chat's new state, recorded like a handler's answer's.
    #[schema(value_type = Option<Object>)]
    state: Option<Value>,
    /// `true` ends the turn (the chat's next event is handled); `false` waits for more.
    #[serde(rename = "final")]
    last: bool,
}

/// `POST /api/v1/replies/{reply_token}`, served by the runtime (`botfleet_runtime::Replies`)
/// beside this API; documented here.
#[utoipa::path(post, path = "/api/v1/replies/{reply_token}",
    params(("reply_token" = String, Path, description = "the `reply_token` of the handler request the handler answered `202`"),
           ("Idempotency-Key" = String, Header, description = "1 to 200 printable characters, one per part: a repeat answers as the first post and does nothing again")),
    request_body = ReplyPart,
    responses(
        (status = 202, description = "Kept: its actions run in the held turn, after the parts before it, under the turn's fence. `{\"status\": \"accepted\", \"seq\", \"repeated\"}`. Needs no API token: the reply token is the permission"),
        (status = 400, description = "`invalid`: the body, or the `Idempotency-Key` header", body = ApiError),
        (status = 404, description = "`unknown_token`: not this fleet's token, or its turn is unknown (the same answer for both)", body = ApiError),
        (status = 409, description = "`key_reused`: the key was posted to this turn with another body", body = ApiError),
        (status = 410, description = "`turn_ended`: the turn already ended, expired, or had its last part", body = ApiError),
        (status = 503, description = "`store_failed`: post again with the same key", body = ApiError)))]
#[allow(dead_code)]
fn post_reply() {}

/// The API's OpenAPI document, generated from the handlers and their types.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "botfleet control API",
        description = "Manage the bot registry and look at the fleet. Every request needs `Authorization: Bearer TOKEN` when the worker has an API token; without one only loopback clients are answered."
    ),
    paths(
        list_bots,
        add_bot,
        get_bot,
        patch_bot,
        delete_bot,
        enable_bot,
        disable_bot,
        restart_bot,
        send_message,
        get_message,
        crate::desk::pause_chat,
        crate::desk::resume_chat,
        crate::desk::list_chats,
        crate::desk::chat_events,
        import_bots,
        fleet,
        events,
        event_stream,
        fleet_events,
        fleet_event_stream,
        file_link,
        post_reply
    ),
    components(schemas(
        ApiError,
        ReplyPart,
        SendRequest,
        SendView,
        crate::desk::PauseRequest,
        crate::desk::ResumeRequest,
        crate::desk::ChatPauseView,
        crate::desk::ChatList,
        crate::desk::ChatEvents,
        crate::desk::ChatEventView,
        BotLine,
        BotPatch,
        BotChanged,
        BotList,
        BotView,
        crate::registry::SliceView,
        crate::registry::SendsView,
        Change,
        ImportReport,
        LineResult,
        Events,
        crate::handler_schema::HandlerEvent,
        crate::handler_schema::HandlerEventKind,
        crate::handler_schema::HandlerChat,
        crate::handler_schema::HandlerCommand,
        crate::handler_schema::HandlerActionEvent,
        crate::handler_schema::HandlerCaps,
        crate::handler_schema::HandlerButton,
        crate::handler_schema::HandlerActionType,
        crate::handler_schema::HandlerAction,
        crate::handler_schema::HandlerAnswer,
        crate::handler_schema::HandlerFileKind,
        crate::handler_schema::HandlerAttachment,
        crate::handler_schema::HandlerOutFile
    ))
)]
pub(crate) struct ApiDoc;

async fn openapi() -> Response {
    match ApiDoc::openapi().to_json() {
        Ok(doc) => ([(header::CONTENT_TYPE, "application/json")], doc).into_response(),
        Err(e) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("cannot render the document: {e}"),
        )
        .into_response(),
    }
}

async fn no_route() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no_route", "no such API route")
}

async fn too_large_as_json(req: Request, next: Next) -> Response {
    let r = next.run(req).await;
    match r.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            "the request body is too large",
        )
        .into_response(),
        StatusCode::METHOD_NOT_ALLOWED => ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "this route does not take that method",
        )
        .into_response(),
        _ => r,
    }
}

/// A send from the backend: the chat, and what to send as a handler answers it (`text`,
/// `actions`; at least one).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SendRequest {
    /// The chat, as the platform names it (a Telegram chat id, a Slack channel `C…`, a
    /// Discord channel id, a WhatsApp number or JID).
    chat: String,
    /// A text: the first message sent.
    #[serde(default)]
    text: Option<String>,
    /// Actions of the handler contract (`send` with buttons and files, `edit` and `delete`
    /// by `ref`, `typing`), done in order after the text.
    #[serde(default)]
    #[schema(value_type = Option<Vec<crate::handler_schema::HandlerAction>>)]
    actions: Option<Vec<Value>>,
}

/// A send from the backend, as its client sees it.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SendView {
    /// The send's id (the same for every repeat of its `Idempotency-Key`).
    id: String,
    /// `queued` (waiting for, or in, its chat's turn), `sent` or `failed`.
    status: String,
    /// The platform's ids of the messages it sent, in order (once sent).
    #[serde(skip_serializing_if = "Option::is_none")]
    platform_ids: Option<Vec<String>>,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

impl From<botfleet_runtime::SendStatus> for SendView {
    fn from(s: botfleet_runtime::SendStatus) -> Self {
        Self {
            id: s.id,
            status: s.status.to_owned(),
            platform_ids: Some(s.platform_ids),
            reason: s.reason,
        }
    }
}

/// The request's `Idempotency-Key`: 1 to 200 printable characters.
fn idempotency_key(headers: &HeaderMap) -> ApiResult<String> {
    let bad = |why: &str| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid",
            format!("the `Idempotency-Key` header {why}"),
        )
    };
    let v = headers.get("idempotency-key").ok_or_else(|| {
        bad("is required: 1 to 200 printable characters, the same for every retry of one send")
    })?;
    let k = v
        .to_str()
        .map_err(|_| bad("must be printable ASCII characters"))?;
    if !botfleet_runtime::idempotency_key_fits(k) {
        return Err(bad("must be 1 to 200 printable characters"));
    }
    Ok(k.to_owned())
}

/// Whether `platform` can take `chat` as a chat to send to.
pub(crate) fn chat_fits(platform: botfleet_core::Platform, chat: &str) -> bool {
    use botfleet_core::Platform as P;
    let digits = |s: &str, min: usize, max: usize| {
        (min..=max).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit())
    };
    match platform {
        // A chat id (negative for groups and channels) or a public `@channelusername`.
        P::Telegram => {
            chat.parse::<i64>().is_ok()
                || chat.strip_prefix('@').is_some_and(|u| {
                    (5..=32).contains(&u.len())
                        && u.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                })
        }
        // A channel, group or direct message (`C…`, `G…`, `D…`) or a user (`U…`, `W…`).
        P::Slack => {
            (2..=32).contains(&chat.len())
                && chat.starts_with(['C', 'G', 'D', 'U', 'W'])
                && chat
                    .bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
        }
        // A channel's snowflake.
        P::Discord => digits(chat, 1, 20),
        // A phone number (Cloud API) or a JID (`…@s.whatsapp.net`, `…@g.us`).
        P::Whatsapp => {
            digits(chat, 6, 15)
                || (chat.len() <= 100
                    && chat.split_once('@').is_some_and(|(user, server)| {
                        !user.is_empty()
                            && !server.is_empty()
                            && !chat.chars().any(|c| c.is_whitespace() || c.is_control())
                    }))
        }
    }
}

/// The body of a send, as its entry keeps it: `{text?, actions?}`, checked as a handler's
/// answer is.
fn send_body(req: &SendRequest) -> ApiResult<String> {
    let bad = |m: String| ApiError::new(StatusCode::BAD_REQUEST, "invalid", m);
    let mut body = serde_json::Map::new();
    if let Some(t) = &req.text {
        if t.is_empty() {
            return Err(bad("`text` is empty: leave it out, or say something".into()));
        }
        body.insert("text".into(), Value::from(t.as_str()));
    }
    if let Some(a) = &req.actions {
        if !a.is_empty() {
            body.insert("actions".into(), Value::from(a.clone()));
        }
    }
    if body.is_empty() {
        return Err(bad("nothing to send: give `text` or `actions`".into()));
    }
    let body = Value::Object(body);
    let reply = botfleet_runtime::Reply::from_json(&body).map_err(|e| bad(e.to_string()))?;
    if let Some(why) = reply.refused.first() {
        return Err(bad(why.clone()));
    }
    Ok(body.to_string())
}

#[utoipa::path(post, path = "/api/v1/bots/{id}/messages",
    params(("id" = String, Path),
           ("Idempotency-Key" = String, Header, description = "1 to 200 printable characters, the same for every retry of one send: a repeat within 24 hours answers the same `id` and sends nothing again.")),
    request_body = SendRequest,
    responses((status = 202, description = "Recorded: it goes out in its chat's turn, once.", body = SendView),
              (status = 400, description = "`invalid`: the body, or the `Idempotency-Key` header", body = ApiError),
              (status = 404, body = ApiError),
              (status = 409, description = "`bot_disabled`, `bot_failed`", body = ApiError),
              (status = 413, body = ApiError),
              (status = 422, description = "`invalid_chat`; `key_reused`: the key was used for another send", body = ApiError),
              (status = 503, body = ApiError)))]
async fn send_message(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<SendView>)> {
    let key = idempotency_key(&headers)?;
    let req: SendRequest = serde_json::from_str(utf8(&body)?)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid", format!("the body: {e}")))?;
    let send = send_body(&req)?;
    let rec = s.registry.get(&id).await?;
    let platform = rec.spec.platform;
    let count = |status| {
        if let Some(m) = &s.metrics {
            m.api_send(platform, status);
        }
    };
    let refuse = |status: StatusCode, code: &'static str, m: String| {
        count("refused");
        ApiError::new(status, code, m)
    };
    if !rec.spec.enabled {
        return Err(refuse(
            StatusCode::CONFLICT,
            "bot_disabled",
            format!("bot {id} is disabled: enable it to send"),
        ));
    }
    if rec.status == botfleet_core::BotStatus::Failed {
        return Err(refuse(
            StatusCode::CONFLICT,
            "bot_failed",
            format!(
                "bot {id} is failed ({}): fix it and enable it again to send",
                rec.last_error.as_deref().unwrap_or("no reason recorded")
            ),
        ));
    }
    if !chat_fits(platform, &req.chat) {
        return Err(refuse(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_chat",
            format!(
                "{:?} is no {platform} chat",
                req.chat.chars().take(64).collect::<String>()
            ),
        ));
    }
    let Some(sends) = &s.sends else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no_worker",
            "this process runs no worker to send through",
        ));
    };
    let done = match sends.submit(&rec.spec, &req.chat, &key, &send).await {
        Ok(d) => d,
        Err(botfleet_runtime::SendError::KeyReused) => {
            return Err(refuse(
                StatusCode::UNPROCESSABLE_ENTITY,
                "key_reused",
                "this Idempotency-Key was used for another send to this bot (another chat or body): the first stands".into(),
            ))
        }
        Err(botfleet_runtime::SendError::UnknownChat(why)) => {
            return Err(refuse(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_chat",
                format!("{platform} knows no such chat: {why}"),
            ))
        }
        Err(e @ botfleet_runtime::SendError::Platform(_)) => {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "platform_unavailable",
                format!("not recorded, retry with the same key: {e}"),
            ))
        }
        Err(e) => {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_failed",
                format!("not recorded, retry with the same key: {e}"),
            ))
        }
    };
    count(if done.new { "accepted" } else { "repeated" });
    let queued = SendView {
        id: done.id().to_owned(),
        status: "queued".into(),
        platform_ids: None,
        reason: None,
    };
    // A new send is queued; a repeat says how the first one went.
    let view = match done.new {
        true => queued,
        false => match sends.status(&rec.spec, done.id()).await {
            Ok(Some(st)) => SendView::from(st),
            _ => queued,
        },
    };
    Ok((StatusCode::ACCEPTED, Json(view)))
}

#[utoipa::path(get, path = "/api/v1/bots/{id}/messages/{msg}",
    params(("id" = String, Path), ("msg" = String, Path, description = "The send's id")),
    responses((status = 200, body = SendView), (status = 404, body = ApiError)))]
async fn get_message(
    State(s): State<ApiState>,
    Path((id, msg)): Path<(String, String)>,
) -> ApiResult<Json<SendView>> {
    let rec = s.registry.get(&id).await?;
    let Some(sends) = &s.sends else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no_worker",
            "this process runs no worker to send through",
        ));
    };
    match sends.status(&rec.spec, &msg).await {
        Ok(Some(st)) => Ok(Json(st.into())),
        Ok(None) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!(
                "no send {:?} of bot {id} (sends are kept 24 hours after they end)",
                msg.chars().take(80).collect::<String>()
            ),
        )),
        Err(e) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_failed",
            e.to_string(),
        )),
    }
}

/// The `/api/v1` routes (serve with `ConnectInfo<SocketAddr>`).
pub(crate) fn routes(state: ApiState) -> Router {
    let import = Router::new()
        .route("/bots/import", post(import_bots))
        .layer(DefaultBodyLimit::max(MAX_IMPORT_BODY));
    let api = Router::new()
        .route("/bots", get(list_bots).post(add_bot))
        .route(
            "/bots/{id}",
            get(get_bot).patch(patch_bot).delete(delete_bot),
        )
        .route("/bots/{id}/enable", post(enable_bot))
        .route("/bots/{id}/disable", post(disable_bot))
        .route("/bots/{id}/restart", post(restart_bot))
        .route("/bots/{id}/messages", post(send_message))
        .route("/bots/{id}/messages/{msg}", get(get_message))
        .route("/bots/{id}/chats", get(crate::desk::list_chats))
        .route(
            "/bots/{id}/chats/{chat}/pause",
            post(crate::desk::pause_chat),
        )
        .route(
            "/bots/{id}/chats/{chat}/resume",
            post(crate::desk::resume_chat),
        )
        .route(
            "/bots/{id}/chats/{chat}/events",
            get(crate::desk::chat_events),
        )
        .route("/fleet", get(fleet))
        .route("/events", get(events))
        .route("/events/stream", get(event_stream))
        .route("/fleet/events", get(fleet_events))
        .route("/fleet/events/stream", get(fleet_event_stream))
        .route("/openapi.json", get(openapi))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .merge(import)
        .fallback(no_route)
        .layer(middleware::from_fn(too_large_as_json))
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state);
    Router::new().route("/", get(page)).nest("/api/v1", api)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The handler contract's schema names every field a worker sends, and every field it
    /// requires is sent, for each kind of event.
    #[test]
    fn the_handler_schema_is_what_workers_send() {
        use botfleet_core::{BotId, ChatKey, Command, EventKind, Inbound, Platform};
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        let schema = &doc["components"]["schemas"]["HandlerEvent"];
        let props = schema["properties"].as_object().expect("properties");
        let required: Vec<&str> = schema["required"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let chat = ChatKey::new(BotId::new("b").unwrap(), "7");
        let mut plain = Inbound::message(Platform::Telegram, chat, "12", None, "hi", Some(1));
        plain.event_id = "b:12".into();
        let mut command = plain.clone();
        command.kind = EventKind::Command;
        command.command = Some(Box::new(Command::new("start", "x")));
        let mut edited = plain.clone();
        edited.kind = EventKind::Edited;
        edited.edited_message_id = Some("3".into());
        let mut pressed = plain.clone();
        pressed.kind = EventKind::Action;
        pressed.action = Some(Box::new(botfleet_core::ActionEvent {
            id: "x".into(),
            value: "x".into(),
            message_ref: Some("menu".into()),
            message_id: Some("9".into()),
        }));
        pressed.answer_handle = Some("query-secret".into());
        let kinds: Vec<&str> = doc["components"]["schemas"]["HandlerEventKind"]["enum"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let mut photo = plain.clone();
        photo.attachments = vec![botfleet_core::Attachment {
            url: "http://w/api/v1/files/x.y".into(),
            ..botfleet_core::Attachment::new(botfleet_core::AttachmentKind::Image, "file-id-secret")
                .mime(Some("image/jpeg"))
                .size(Some(3))
                .name(Some("p.jpg"))
        }];
        for ev in [plain, command, edited, pressed, photo] {
            let caps = botfleet_telegram::CAPS;
            let body = botfleet_runtime::handler_request_in_turn(
                &ev,
                Some(r#"{"n":1}"#),
                &caps,
                Some("r1.token"),
            )
            .unwrap();
            assert!(
                !body.to_string().contains("query-secret"),
                "what answers an event is not shown to the handler"
            );
            assert!(
                !body.to_string().contains("file-id-secret"),
                "what the platform calls a file is not shown to the handler"
            );
            let documented = &doc["components"]["schemas"]["HandlerAttachment"]["properties"];
            for f in body["attachments"].as_array().into_iter().flatten() {
                for key in f.as_object().into_iter().flatten().map(|(k, _)| k) {
                    assert!(
                        documented.get(key).is_some(),
                        "attachments[].{key} is not documented"
                    );
                }
            }
            for (name, schema) in [("action", "HandlerActionEvent"), ("caps", "HandlerCaps")] {
                let documented = &doc["components"]["schemas"][schema]["properties"];
                for key in body[name].as_object().into_iter().flatten().map(|(k, _)| k) {
                    assert!(
                        documented.get(key).is_some(),
                        "{name}.{key} is not documented"
                    );
                }
            }
            let sent = body.as_object().unwrap();
            for key in sent.keys() {
                assert!(props.contains_key(key), "{key} is sent but not documented");
            }
            for key in &required {
                assert!(sent.contains_key(*key), "{key} is required but not sent");
            }
            assert!(kinds.contains(&ev.kind.as_str()));
            let c = &doc["components"]["schemas"]["HandlerCommand"]["properties"];
            for key in body["command"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, _)| k)
            {
                assert!(c.get(key).is_some(), "command.{key} is not documented");
            }
        }
        let answer = &doc["components"]["schemas"]["HandlerAnswer"]["properties"];
        assert!(answer.get("text").is_some() && answer.get("state").is_some());
        assert!(answer.get("actions").is_some() && answer.get("ephemeral").is_some());
        // Every action type the fleet reads is documented, with the fields it reads.
        let types: Vec<&str> = doc["components"]["schemas"]["HandlerActionType"]["enum"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let fields = &doc["components"]["schemas"]["HandlerAction"]["properties"];
        for a in [
            serde_json::json!({"type": "send", "text": "x", "ref": "r", "thread": true, "ephemeral": true,
                "buttons": [[{"text": "a", "value": "v"}]],
                "attachments": [{"url": "https://x/y.png", "kind": "image", "name": "y.png", "mime": "image/png"}, {"data": "aGk="}]}),
            serde_json::json!({"type": "edit", "ref": "r", "text": "y"}),
            serde_json::json!({"type": "delete", "message_id": "9"}),
            serde_json::json!({"type": "typing"}),
            serde_json::json!({"type": "answer", "text": "ok", "alert": true, "ephemeral": false}),
            serde_json::json!({"type": "template", "name": "order_update", "language": "en_US",
                "components": [{"type": "body", "parameters": [{"type": "text", "text": "42"}]}]}),
        ] {
            let parsed = botfleet_core::Action::from_json(0, &a).unwrap();
            assert!(types.contains(&parsed.kind()));
            for key in serde_json::to_value(&parsed)
                .unwrap()
                .as_object()
                .unwrap()
                .keys()
            {
                assert!(
                    fields.get(key).is_some(),
                    "action field {key} is not documented"
                );
            }
        }
        assert!(schema["example"]["event_id"].is_string(), "with an example");
    }

    #[test]
    fn the_documented_bodies_are_the_parsed_ones() {
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        // A schema's properties, through `allOf` and `$ref` (flattened parts).
        fn collect(doc: &Value, schema: &Value, out: &mut Vec<String>) {
            if let Some(r) = schema["$ref"].as_str() {
                let name = r.rsplit('/').next().unwrap_or("");
                collect(doc, &doc["components"]["schemas"][name], out);
            }
            if let Some(p) = schema["properties"].as_object() {
                out.extend(p.keys().cloned());
            }
            for part in schema["allOf"].as_array().into_iter().flatten() {
                collect(doc, part, out);
            }
        }
        let props = |name: &str| -> Vec<String> {
            let mut v = Vec::new();
            collect(&doc, &doc["components"]["schemas"][name], &mut v);
            v.sort();
            v
        };
        let mut fields: Vec<String> = crate::lines::BOT_FIELDS
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        fields.sort();
        assert_eq!(props("NewBot"), fields);
        let mut fields: Vec<String> = crate::lines::PATCH_FIELDS
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        fields.sort();
        assert_eq!(props("BotChange"), fields);
        for path in [
            "/api/v1/bots",
            "/api/v1/bots/{id}",
            "/api/v1/bots/{id}/restart",
            "/api/v1/bots/import",
            "/api/v1/fleet",
            "/api/v1/events",
        ] {
            assert!(doc["paths"][path].is_object(), "{path} missing");
        }
    }

    fn state(token: Option<&str>) -> ApiState {
        let store: Arc<dyn botfleet_store::Store> =
            Arc::new(botfleet_store::MemoryStore::default());
        let coord: Arc<dyn Coordinator> = Arc::new(botfleet_coord::MemoryHub::new().coordinator());
        ApiState {
            registry: Registry {
                store,
                fleet: Some(coord.clone()),
            },
            coord,
            mode: "embedded",
            journal: Journal::new(10),
            token_digest: token.map(digest),
            fleet_cache: Default::default(),
            sends: None,
            metrics: None,
        }
    }

    async fn status_from(app: Router, peer: &str, bearer: Option<&str>) -> (u16, String) {
        use tower::ServiceExt;
        let mut req = axum::http::Request::get("/api/v1/bots");
        if let Some(t) = bearer {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let mut req = req.body(axum::body::Body::empty()).unwrap();
        req.extensions_mut()
            .insert(ConnectInfo(peer.parse::<SocketAddr>().unwrap()));
        let resp = app.oneshot(req).await.unwrap();
        let status = resp.status().as_u16();
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn without_a_token_only_loopback_clients_are_answered() {
        let app = routes(state(None));
        assert_eq!(
            status_from(app.clone(), "127.0.0.1:5000", None).await.0,
            200
        );
        assert_eq!(status_from(app.clone(), "[::1]:5000", None).await.0, 200);
        let (s, body) = status_from(app, "10.1.2.3:5000", None).await;
        assert_eq!(s, 403);
        assert!(body.contains("loopback_only"), "{body}");
        // With a token, the address does not matter; the token does.
        let app = routes(state(Some("a-long-enough-token-1234")));
        assert_eq!(
            status_from(app.clone(), "127.0.0.1:5000", None).await.0,
            401
        );
        let ok = status_from(
            app.clone(),
            "10.1.2.3:5000",
            Some("a-long-enough-token-1234"),
        );
        assert_eq!(ok.await.0, 200);
        let bad = status_from(app, "10.1.2.3:5000", Some("a-long-enough-token-1235"));
        assert_eq!(bad.await.0, 401);
    }

    #[test]
    fn digests_compare_equal_only_when_equal() {
        assert!(same(&digest("a"), &digest("a")));
        assert!(!same(&digest("a"), &digest("b")));
    }
}
