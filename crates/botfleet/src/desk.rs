//! A chat handed to a person: `POST /api/v1/bots/{id}/chats/{chat}/pause` and
//! `POST /api/v1/bots/{id}/chats/{chat}/resume`. While a chat is paused its handler is not
//! called for it on any worker (from the moment the pause is answered); what its users write
//! is still journaled, acknowledged to the platform and recorded `paused`; sends through
//! `POST /api/v1/bots/{id}/messages` go on, so a person answers from a desk.

use axum::{
    body::Bytes,
    extract::{Path, Query, State},
    http::StatusCode,
    Json,
};
use botfleet_core::BotSpec;
use botfleet_store::{ChatPause, MAX_PAUSE_REASON};
use serde::{Deserialize, Serialize};
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
