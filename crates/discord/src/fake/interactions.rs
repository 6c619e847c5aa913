//! Interactions on the fake Discord: users' slash commands and button presses
//! (`INTERACTION_CREATE` on the channel's shard), the interaction responses as Discord checks
//! them (within 3 s of the interaction, once: a second is `40060`, a late one `10062`), the
//! original response's edits and deletion and follow-ups (for 15 minutes), message components
//! as Discord validates them, and the application's commands (`PUT
//! /applications/{id}/commands`).

use std::time::{Duration, Instant};

use std::collections::HashMap;

use axum::{
    extract::{Path, Query, Request, State},
    http::{HeaderMap, Method, StatusCode},
    response::{IntoResponse, Response},
    Json,
};
use serde_json::{json, Value};

use super::{lock, FakeDiscordState};

/// How an interaction's answer reached the user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answered {
    /// `response` (callback type 4), `original` (an edit of the deferred response) or
    /// `followup`.
    pub how: &'static str,
    /// What it says.
    pub text: String,
    /// Whether only the user sees it.
    pub ephemeral: bool,
    /// How long after the interaction it came.
    pub after: Duration,
    /// The message that shows it (a press on its buttons names it).
    pub id: String,
    /// Its buttons' `custom_id`s, in order.
    pub buttons: Vec<String>,
    /// The names of the files it shows.
    pub files: Vec<String>,
}

/// One interaction the fake dispatched, and what was made of it.
#[derive(Clone, Debug)]
pub struct Interaction {
    /// The bot's token.
    pub bot: String,
    /// Its own token (in the dispatch).
    pub token: String,
    /// A command (or a component).
    pub command: bool,
    /// The channel it came from.
    pub channel: u64,
    /// When it was dispatched.
    pub at: Instant,
    /// The callback types received, with how long after the interaction each came.
    pub callbacks: Vec<(u64, Duration)>,
    /// The answers shown.
    pub answers: Vec<Answered>,
    /// Whether the original response was deleted.
    pub original_deleted: bool,
    /// Whether a deferral of a command (type 5) was ephemeral (flags 64): the response it
    /// stands for stays as visible as it was deferred.
    pub deferred_ephemeral: bool,
    /// The message of the original response, once there is one.
    pub original: Option<String>,
}

/// Checks components as Discord does for what the fleet sends: at most 5 action rows (type 1)
/// of 1–5 buttons (type 2), each with a label of 1–80 characters and either a `custom_id` of
/// 1–100 characters, unique in the message (styles 1 to 4), or a `url` (style 5). Answers
/// the custom ids in order.
pub(super) fn check_components(v: &Value) -> Result<Vec<String>, &'static str> {
    let Some(rows) = v.as_array() else {
        return if v.is_null() {
            Ok(Vec::new())
        } else {
            Err("components")
        };
    };
    if rows.len() > 5 {
        return Err("components: at most 5 rows");
    }
    let mut ids = Vec::new();
    for row in rows {
        let buttons = row["components"].as_array().ok_or("components: a row")?;
        if row["type"] != 1 || buttons.is_empty() || buttons.len() > 5 {
            return Err("components: a row of 1 to 5");
        }
        for b in buttons {
            let label_ok = b["label"]
                .as_str()
                .is_some_and(|l| (1..=80).contains(&l.chars().count()));
            if b["type"] != 2 || !label_ok {
                return Err("components: a button");
            }
            match (
                b["style"].as_u64(),
                b["custom_id"].as_str(),
                b["url"].as_str(),
            ) {
                (Some(5), None, Some(_)) => {}
                (Some(1..=4), Some(id), None)
                    if (1..=100).contains(&id.chars().count()) && !ids.iter().any(|x| x == id) =>
                {
                    ids.push(id.to_owned());
                }
                _ => return Err("components: a button's custom_id or url"),
            }
        }
    }
    Ok(ids)
}

fn bad(code: u64, message: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(json!({"message": message, "code": code})),
    )
        .into_response()
}

fn unknown_message() -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(json!({"message": "Unknown Message", "code": 10008})),
    )
        .into_response()
}

fn unknown() -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(json!({"message": "Unknown interaction", "code": 10062})),
    )
        .into_response()
}

impl FakeDiscordState {
    /// The bot's application id (its user id, as for bots made since 2019).
    fn app_of(&self, token: &str) -> Option<String> {
        lock(&self.inner.bots).get(token).map(|b| b.user_id.clone())
    }

    fn interaction(&self, token: &str, channel: u64, command: bool, data: Value) -> String {
        let id = self.id().to_string();
        let itoken = format!("itok-{id}");
        let app = self.app_of(token).unwrap_or_default();
        lock(&self.inner.interactions).insert(
            id.clone(),
            Interaction {
                bot: token.to_owned(),
                token: itoken.clone(),
                command,
                channel,
                at: Instant::now(),
                callbacks: Vec::new(),
                answers: Vec::new(),
                original_deleted: false,
                deferred_ephemeral: false,
                original: None,
            },
        );
        let mut d = json!({
            "id": id, "application_id": app, "type": if command { 2 } else { 3 },
            "token": itoken, "version": 1, "channel_id": channel.to_string(),
            "guild_id": super::guild_of(channel).to_string(),
            "member": {"user": {"id": "4242", "username": "user"}},
        });
        for (k, v) in data.as_object().into_iter().flatten() {
            d[k] = v.clone();
        }
        self.user_dispatch(token, channel, "INTERACTION_CREATE", d);
        id
    }

    /// A user runs the bot's slash command `name` with `options` (`[{name, type, value}]`) in
    /// `channel`: an `INTERACTION_CREATE` of type 2. Answers the interaction's id.
    pub fn user_runs_command(
        &self,
        token: &str,
        channel: u64,
        name: &str,
        options: Value,
    ) -> String {
        self.interaction(
            token,
            channel,
            true,
            json!({"data": {"id": "1", "name": name, "type": 1, "options": options}}),
        )
    }

    /// A user presses the button `custom_id` of the bot's message `message_id` in `channel`:
    /// an `INTERACTION_CREATE` of type 3. `None` when that message has no such button.
    pub fn user_presses(
        &self,
        token: &str,
        channel: u64,
        message_id: &str,
        custom_id: &str,
    ) -> Option<String> {
        let has = lock(&self.inner.bots)
            .get(token)
            .and_then(|b| b.shown.get(message_id))
            .is_some_and(|m| !m.deleted && m.buttons.iter().any(|b| b == custom_id));
        has.then(|| {
            self.interaction(
                token,
                channel,
                false,
                json!({"message": {"id": message_id, "channel_id": channel.to_string()},
                    "data": {"custom_id": custom_id, "component_type": 2}}),
            )
        })
    }

    /// Lets interaction `id`'s token run out, as 15 minutes would: its webhook answers
    /// `50027` from now on.
    pub fn expire_interaction(&self, id: &str) {
        if let Some(i) = lock(&self.inner.interactions).get_mut(id) {
            if let Some(long_ago) = Instant::now().checked_sub(Duration::from_secs(16 * 60)) {
                i.at = long_ago;
            }
        }
    }

    /// The interaction `id`, as it stands.
    pub fn interaction_of(&self, id: &str) -> Option<Interaction> {
        lock(&self.inner.interactions).get(id).cloned()
    }

    /// Every interaction of the bot of `token`, in the order they came.
    pub fn interactions(&self, token: &str) -> Vec<Interaction> {
        let mut all: Vec<Interaction> = lock(&self.inner.interactions)
            .values()
            .filter(|i| i.bot == token)
            .cloned()
            .collect();
        all.sort_by_key(|i| i.at);
        all
    }

    /// What the bot of `token` showed in its channels, in the order it came: the messages
    /// it posted and its answers to interactions, each as `(channel, text)`.
    pub fn shown_in_channels(&self, token: &str) -> Vec<(String, String)> {
        let mut all: Vec<(Instant, String, String)> = self
            .sent_by(token)
            .into_iter()
            .map(|p| (p.at, p.channel, p.content))
            .collect();
        for i in self.interactions(token) {
            for a in i.answers {
                all.push((i.at + a.after, i.channel.to_string(), a.text));
            }
        }
        all.sort_by_key(|(at, ..)| *at);
        all.into_iter().map(|(_, c, t)| (c, t)).collect()
    }

    /// The application commands the bot of `token` registered last (`None`: never).
    pub fn commands(&self, token: &str) -> Option<Value> {
        lock(&self.inner.bots)
            .get(token)
            .and_then(|b| b.commands.clone())
    }

    /// How many times the bot of `token` overwrote its commands.
    pub fn command_writes(&self, token: &str) -> u64 {
        lock(&self.inner.bots)
            .get(token)
            .map_or(0, |b| b.command_writes)
    }
}

/// `POST /interactions/{id}/{token}/callback` (JSON, or multipart with files for a type 4):
/// 204, or with `?with_response=true` Discord's account of it, the message a type 4 made
/// as its `resource.message`.
pub(super) async fn callback(
    State(s): State<FakeDiscordState>,
    Path((id, token)): Path<(String, String)>,
    Query(query): Query<HashMap<String, String>>,
    req: Request,
) -> Response {
    let (body, files) = match super::files::read_body(&s, req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let mut all = lock(&s.inner.interactions);
    let Some(i) = all.get_mut(&id).filter(|i| i.token == token) else {
        return unknown();
    };
    let after = i.at.elapsed();
    if after > Duration::from_secs(3) {
        return unknown();
    }
    if !i.callbacks.is_empty() {
        return bad(40060, "Interaction has already been acknowledged.");
    }
    let kind = body["type"].as_u64().unwrap_or(0);
    if kind != 4 && !files.is_empty() {
        return bad(50035, "Invalid Form Body: files");
    }
    let mut show = None;
    match kind {
        4 => {
            let data = &body["data"];
            let text = data["content"].as_str().unwrap_or_default();
            if (text.is_empty() && files.is_empty()) || text.chars().count() > 2000 {
                return bad(50035, "Invalid Form Body");
            }
            let Ok(buttons) = check_components(&data["components"]) else {
                return bad(50035, "Invalid Form Body: components");
            };
            let id = s.id().to_string();
            let ephemeral = data["flags"].as_u64().is_some_and(|f| f & 64 != 0);
            i.original = Some(id.clone());
            let answer = Answered {
                how: "response",
                text: text.to_owned(),
                ephemeral,
                after,
                id,
                buttons,
                files: files.iter().map(|f| f.name.clone()).collect(),
            };
            i.answers.push(answer.clone());
            show = Some((i.bot.clone(), i.channel, answer));
        }
        5 => i.deferred_ephemeral = body["data"]["flags"].as_u64().is_some_and(|f| f & 64 != 0),
        6 if !i.command => {}
        _ => return bad(50035, "Invalid Form Body: type"),
    }
    i.callbacks.push((kind, after));
    let interaction = json!({"id": id, "type": if i.command { 2 } else { 3 }});
    drop(all);
    let message = show.map(|(bot, channel, a)| {
        let m = json!({"id": a.id, "channel_id": channel.to_string(), "content": a.text});
        s.show(&bot, channel, &a);
        m
    });
    if query.get("with_response").map(String::as_str) != Some("true") {
        return StatusCode::NO_CONTENT.into_response();
    }
    let mut resource = json!({ "type": kind });
    if let Some(m) = message {
        resource["message"] = m;
    }
    Json(json!({"interaction": interaction, "resource": resource})).into_response()
}

impl FakeDiscordState {
    /// Shows answer `a` of the bot of `token` in `channel` (with its buttons, so a user can
    /// press them, and its files).
    fn show(&self, token: &str, channel: u64, a: &Answered) {
        if let Some(b) = lock(&self.inner.bots).get_mut(token) {
            let m = b.shown.entry(a.id.clone()).or_default();
            m.content.clone_from(&a.text);
            m.buttons.clone_from(&a.buttons);
            m.channel = channel.to_string();
            m.ephemeral = a.ephemeral;
            m.files.clone_from(&a.files);
        }
    }
}

/// Discord's answer to an interaction token that no longer answers.
fn invalid_webhook_token() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        Json(json!({"message": "Invalid Webhook Token", "code": 50027})),
    )
        .into_response()
}

/// `PATCH`/`DELETE /webhooks/{app}/{token}/messages/{@original|id}` and `POST
/// /webhooks/{app}/{token}` (a follow-up), JSON or multipart with files, for an interaction
/// answered or deferred within the last 15 minutes (an unknown token is `10015`, one
/// older than that `50027`). A message id must be one of the interaction's answers.
pub(super) async fn webhook(
    State(s): State<FakeDiscordState>,
    method: Method,
    Path(rest): Path<String>,
    req: Request,
) -> Response {
    let parts: Vec<&str> = rest.split('/').collect();
    let (token, target) = match parts.as_slice() {
        [_app, token] => (*token, None),
        [_app, token, "messages", m] => (*token, Some(*m)),
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    let (body, files) = if method == Method::DELETE {
        (Value::Null, Vec::new())
    } else {
        match super::files::read_body(&s, req).await {
            Ok(b) => b,
            Err(r) => return r,
        }
    };
    let mut all = lock(&s.inner.interactions);
    let Some(i) = all.values_mut().find(|i| i.token == token) else {
        return (
            StatusCode::NOT_FOUND,
            Json(json!({"message": "Unknown Webhook", "code": 10015})),
        )
            .into_response();
    };
    let after = i.at.elapsed();
    if after > Duration::from_secs(15 * 60) {
        return invalid_webhook_token();
    }
    if i.callbacks.is_empty() {
        return unknown();
    }
    let text = body["content"].as_str().unwrap_or_default().to_owned();
    let ephemeral = body["flags"].as_u64().is_some_and(|f| f & 64 != 0);
    let Ok(buttons) = check_components(&body["components"]) else {
        return bad(50035, "Invalid Form Body: components");
    };
    let file_names: Vec<String> = files.iter().map(|f| f.name.clone()).collect();
    // A message of this interaction by its id: an edit or a delete of one answer.
    if let Some(m) = target.filter(|m| *m != "@original") {
        if !i.answers.iter().any(|a| a.id == m) {
            return unknown_message();
        }
        let (bot, m) = (i.bot.clone(), m.to_owned());
        drop(all);
        return s.change_answer(&bot, &m, method, &body, file_names);
    }
    let original = target.is_some();
    let answer = match (method, original) {
        (Method::DELETE, true) => {
            i.original_deleted = true;
            return StatusCode::NO_CONTENT.into_response();
        }
        (m, _) if text.is_empty() && files.is_empty() && m != Method::DELETE => {
            return bad(50006, "Cannot send an empty message")
        }
        (Method::PATCH, true) if i.original_deleted => return unknown_message(),
        (Method::PATCH, true) | (Method::POST, false) => {
            let deferred = i.callbacks.first().is_some_and(|c| c.0 == 5);
            // As Discord does: the first follow-up after a command's deferral edits its
            // "thinking…" message; the response keeps the visibility it was given first.
            let edits = original || (deferred && i.answers.is_empty() && !i.original_deleted);
            let (how, ephemeral) = match (edits, deferred) {
                (false, _) => ("followup", ephemeral),
                (true, true) => ("original", i.deferred_ephemeral),
                (true, false) => ("original", i.answers.first().is_some_and(|a| a.ephemeral)),
            };
            let id = if edits {
                i.original.get_or_insert_with(|| s.id().to_string()).clone()
            } else {
                s.id().to_string()
            };
            Answered {
                how,
                text: text.clone(),
                ephemeral,
                after,
                id,
                buttons,
                files: file_names,
            }
        }
        _ => return StatusCode::METHOD_NOT_ALLOWED.into_response(),
    };
    i.answers.push(answer.clone());
    let (bot, channel) = (i.bot.clone(), i.channel);
    drop(all);
    s.show(&bot, channel, &answer);
    Json(json!({"id": answer.id, "channel_id": channel.to_string(), "content": text}))
        .into_response()
}

impl FakeDiscordState {
    /// An edit (`PATCH`) or a delete of answer `id` of the bot of `token`, through its
    /// interaction's webhook.
    fn change_answer(
        &self,
        token: &str,
        id: &str,
        method: Method,
        body: &Value,
        files: Vec<String>,
    ) -> Response {
        let mut bots = lock(&self.inner.bots);
        let Some(m) = bots
            .get_mut(token)
            .and_then(|b| b.shown.get_mut(id))
            .filter(|m| !m.deleted)
        else {
            return unknown_message();
        };
        match method {
            Method::DELETE => {
                m.deleted = true;
                StatusCode::NO_CONTENT.into_response()
            }
            Method::PATCH => {
                if let Some(c) = body["content"].as_str() {
                    if c.is_empty() || c.chars().count() > 2000 {
                        return bad(50035, "Invalid Form Body");
                    }
                    c.clone_into(&mut m.content);
                }
                if let Some(c) = body.get("components") {
                    match check_components(c) {
                        Ok(b) => m.buttons = b,
                        Err(_) => return bad(50035, "Invalid Form Body: components"),
                    }
                }
                if !files.is_empty() {
                    m.files = files;
                }
                m.edits += 1;
                m.hook_edits += 1;
                Json(json!({"id": id, "channel_id": m.channel, "content": m.content}))
                    .into_response()
            }
            _ => StatusCode::METHOD_NOT_ALLOWED.into_response(),
        }
    }
}

/// `GET /applications/@me`.
pub(super) async fn application(State(s): State<FakeDiscordState>, headers: HeaderMap) -> Response {
    let Some(token) = s.auth(&headers) else {
        return super::unauthorized();
    };
    Json(json!({"id": s.app_of(&token), "name": "fake"})).into_response()
}

/// `PUT /applications/{app}/commands`: the bot's commands, replaced, checked as Discord
/// checks them (at most 100; names of 1–32 lowercase letters, digits, `-` and `_`;
/// descriptions of 1–100 characters; at most 25 options each).
pub(super) async fn put_commands(
    State(s): State<FakeDiscordState>,
    Path(app): Path<String>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let Some(token) = s.auth(&headers) else {
        return super::unauthorized();
    };
    if s.app_of(&token).as_deref() != Some(app.as_str()) {
        return (
            StatusCode::FORBIDDEN,
            Json(json!({"message": "Missing Access", "code": 50001})),
        )
            .into_response();
    }
    let Some(list) = body.as_array() else {
        return bad(50035, "Invalid Form Body");
    };
    let name_ok = |n: &str| {
        (1..=32).contains(&n.chars().count())
            && n.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
    };
    let ok = list.len() <= 100
        && list.iter().all(|c| {
            c["name"].as_str().is_some_and(name_ok)
                && c["description"]
                    .as_str()
                    .is_some_and(|d| (1..=100).contains(&d.chars().count()))
                && c["options"].as_array().map_or(0, Vec::len) <= 25
        });
    if !ok {
        return bad(50035, "Invalid Form Body: commands");
    }
    if let Some(b) = lock(&s.inner.bots).get_mut(&token) {
        b.commands = Some(body.clone());
        b.command_writes += 1;
    }
    Json(body).into_response()
}
