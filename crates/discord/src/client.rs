//! The Discord REST calls a bot host needs: `GET /users/@me`, `GET /gateway/bot`,
//! `POST /channels/{id}/messages`. One HTTP pool for every bot of the process.

use std::{sync::Arc, time::Duration};

use botfleet_core::Secret;
use serde::Deserialize;
use serde_json::Value;

use crate::{
    routes::{Announced, Routes},
    DiscordConfig, DiscordError,
};

/// Discord's REST base, with the API version.
pub const DEFAULT_API_URL: &str = "https://discord.com/api/v10";

/// One bot's REST base and token. `Debug` prints no token.
#[derive(Clone)]
pub struct DiscordApi {
    base: String,
    token: Secret,
    /// The routes' rate limits learnt from this bot's answers (shared by its clones).
    routes: Arc<Routes>,
}

impl std::fmt::Debug for DiscordApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiscordApi")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl DiscordApi {
    /// A bot's API: `api_url` (default [`DEFAULT_API_URL`]) and its bot token.
    pub fn new(api_url: Option<&str>, token: &Secret) -> Self {
        Self {
            base: api_url
                .unwrap_or(DEFAULT_API_URL)
                .trim_end_matches('/')
                .to_owned(),
            token: token.clone(),
            routes: Arc::default(),
        }
    }

    pub(crate) fn token(&self) -> &Secret {
        &self.token
    }

    /// The routes' rate limits learnt from this bot's answers.
    pub(crate) fn routes(&self) -> &Routes {
        &self.routes
    }
}

/// What `GET /gateway/bot` says.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct GatewayInfo {
    /// The gateway URL (`wss://gateway.discord.gg`).
    pub url: String,
    /// The recommended number of shards.
    pub shards: u32,
    /// The identify budget.
    pub session_start_limit: SessionStartLimit,
}

/// The daily identify budget and the concurrency of identifies.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct SessionStartLimit {
    /// Session starts a day.
    pub total: u32,
    /// Left today.
    pub remaining: u32,
    /// Milliseconds until the budget resets.
    pub reset_after: u64,
    /// Identify buckets: shard `i` is in bucket `i % max_concurrency`.
    pub max_concurrency: u32,
}

/// The bot's own user.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Me {
    /// Its snowflake id.
    pub id: String,
    /// Its name.
    pub username: String,
}

/// The REST client shared by every Discord bot of a process. Cloning shares the pool.
#[derive(Clone, Debug)]
pub struct DiscordClient {
    http: reqwest::Client,
    config: DiscordConfig,
    /// Calls in flight, at most `max_concurrent_calls`.
    calls: Arc<tokio::sync::Semaphore>,
}

impl DiscordClient {
    /// A client with its own pool.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(config: DiscordConfig) -> Result<Self, DiscordError> {
        let http = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .timeout(config.request_timeout)
            .user_agent("DiscordBot (https://github.com/botfleet, 0.1) botfleet")
            .build()
            .map_err(|e| {
                let e = e.without_url();
                DiscordError::network_from(e.to_string(), e)
            })?;
        Ok(Self {
            calls: Arc::new(tokio::sync::Semaphore::new(
                config.max_concurrent_calls.max(1),
            )),
            http,
            config,
        })
    }

    /// The settings.
    pub fn config(&self) -> &DiscordConfig {
        &self.config
    }

    async fn call(
        &self,
        api: &DiscordApi,
        what: &'static str,
        req: reqwest::RequestBuilder,
    ) -> Result<Value, DiscordError> {
        self.call_in(api, what, None, req).await
    }

    /// [`DiscordClient::call`] on a route of `channel` (its major parameter): what the
    /// answer announces of the route's rate limit is learnt ([`Routes`]).
    async fn call_in(
        &self,
        api: &DiscordApi,
        what: &'static str,
        channel: Option<&str>,
        req: reqwest::RequestBuilder,
    ) -> Result<Value, DiscordError> {
        let _slot = self.calls.acquire().await;
        let resp = req
            .header("authorization", format!("Bot {}", api.token.expose()))
            .send()
            .await
            .map_err(|e| {
                let e = e.without_url();
                DiscordError::network_from(format!("{what}: {e}"), e)
            })?;
        let status = resp.status();
        let retry_header = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<f64>().ok());
        let global = resp
            .headers()
            .get("x-ratelimit-global")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
        let shared = resp
            .headers()
            .get("x-ratelimit-scope")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"shared"));
        if let Some((ch, a)) = channel.zip(Announced::read(resp.headers())) {
            api.routes.heard(what, ch, a);
        }
        let body = resp.bytes().await.map_err(|e| {
            let e = e.without_url();
            DiscordError::network_from(format!("{what}: {e}"), e)
        })?;
        match status.as_u16() {
            200..=299 => {
                if body.is_empty() {
                    return Ok(Value::Null);
                }
                serde_json::from_slice(&body)
                    .map_err(|e| DiscordError::Malformed(format!("{what}: {e}")))
            }
            401 => Err(DiscordError::Unauthorized),
            429 => {
                let parsed = serde_json::from_slice::<Value>(&body).ok();
                let from_body = parsed.as_ref().and_then(|v| v["retry_after"].as_f64());
                let secs = from_body.or(retry_header).unwrap_or(1.0).clamp(0.0, 3600.0);
                let wait = Duration::from_secs_f64(secs);
                if global || parsed.is_some_and(|v| v["global"] == true) {
                    Err(DiscordError::GlobalRateLimited(wait))
                } else if shared {
                    Err(DiscordError::SharedRateLimited(wait))
                } else {
                    Err(DiscordError::RateLimited(wait))
                }
            }
            s @ 500..=599 => Err(DiscordError::Server {
                what,
                detail: format!("HTTP {s}"),
            }),
            s => Err(DiscordError::Rejected {
                what,
                status: s,
                code: serde_json::from_slice::<Value>(&body)
                    .ok()
                    .and_then(|v| v["code"].as_u64())
                    .unwrap_or(0),
            }),
        }
    }

    /// `GET /users/@me`: checks the token.
    ///
    /// # Errors
    /// [`DiscordError::Unauthorized`] for a refused token; others as classified.
    pub async fn me(&self, api: &DiscordApi) -> Result<Me, DiscordError> {
        let v = self
            .call(
                api,
                "users/@me",
                self.http.get(format!("{}/users/@me", api.base)),
            )
            .await?;
        serde_json::from_value(v).map_err(|e| DiscordError::Malformed(format!("users/@me: {e}")))
    }

    /// `GET /gateway/bot`: where to connect, how many shards, the identify budget.
    ///
    /// # Errors
    /// As [`DiscordClient::me`].
    pub async fn gateway_bot(&self, api: &DiscordApi) -> Result<GatewayInfo, DiscordError> {
        let v = self
            .call(
                api,
                "gateway/bot",
                self.http.get(format!("{}/gateway/bot", api.base)),
            )
            .await?;
        serde_json::from_value(v).map_err(|e| DiscordError::Malformed(format!("gateway/bot: {e}")))
    }

    /// `GET /channels/{channel}`: the id of the guild the channel is in (`None` for a DM or a
    /// group DM).
    ///
    /// # Errors
    /// As [`DiscordClient::me`]; 403/404 are [`DiscordError::Rejected`].
    pub async fn channel_guild(
        &self,
        api: &DiscordApi,
        channel: &str,
    ) -> Result<Option<String>, DiscordError> {
        check_snowflakes("get channel", &[channel])?;
        let v = self
            .call(
                api,
                "get channel",
                self.http.get(format!("{}/channels/{channel}", api.base)),
            )
            .await?;
        Ok(v.get("guild_id").and_then(Value::as_str).map(str::to_owned))
    }

    /// `POST /channels/{channel}/messages` with `content`, answering `reply_to` when given.
    ///
    /// # Errors
    /// As [`DiscordClient::me`]; 403/404 are [`DiscordError::Rejected`].
    pub async fn create_message(
        &self,
        api: &DiscordApi,
        channel: &str,
        content: &str,
        reply_to: Option<&str>,
        nonce: &str,
    ) -> Result<Option<String>, DiscordError> {
        check_snowflakes("create message", &[channel])?;
        let mut body = serde_json::json!({ "content": content });
        // Discord drops a second message with the same nonce sent within a few minutes.
        if nonce.len() <= 25 {
            body["nonce"] = Value::from(nonce);
            body["enforce_nonce"] = Value::from(true);
        }
        if let Some(id) = reply_to {
            body["message_reference"] =
                serde_json::json!({ "message_id": id, "fail_if_not_exists": false });
        }
        self.create_message_with(api, channel, body, &[]).await
    }

    /// `POST /channels/{channel}/messages` of a whole message `body` (`content`,
    /// `components`, `nonce`, …) with `files` (multipart: the body as `payload_json`, each
    /// file as `files[n]`): the message's id.
    ///
    /// # Errors
    /// As [`DiscordClient::create_message`].
    pub async fn create_message_with(
        &self,
        api: &DiscordApi,
        channel: &str,
        mut body: Value,
        files: &[botfleet_core::Upload],
    ) -> Result<Option<String>, DiscordError> {
        check_snowflakes("create message", &[channel])?;
        let req = self
            .http
            .post(format!("{}/channels/{channel}/messages", api.base));
        let req = with_files(req, &mut body, |b| b, files)?;
        let sent = self
            .call_in(api, "create message", Some(channel), req)
            .await?;
        Ok(sent["id"].as_str().map(str::to_owned))
    }

    /// A file a user sent the bot, by its CDN `url` (no token: Discord's attachment URLs are
    /// signed): the download, its body not read yet. Only Discord's CDN hosts (over HTTPS) or
    /// the bot's own API host are called.
    ///
    /// # Errors
    /// `Rejected` for a URL elsewhere or a file the CDN no longer serves; others as classified.
    pub async fn download(
        &self,
        api: &DiscordApi,
        url: &str,
    ) -> Result<reqwest::Response, DiscordError> {
        let parsed = reqwest::Url::parse(url).ok();
        let api_host = reqwest::Url::parse(&api.base)
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned));
        let ok = parsed.as_ref().is_some_and(|u| {
            let host = u.host_str().unwrap_or("");
            let cdn = u.scheme() == "https"
                && matches!(host, "cdn.discordapp.com" | "media.discordapp.net");
            let web = matches!(u.scheme(), "http" | "https");
            web && (cdn || api_host.as_deref() == Some(host))
        });
        let Some(url) = parsed.filter(|_| ok) else {
            return Err(DiscordError::Rejected {
                what: "download",
                status: 400,
                code: 0,
            });
        };
        let _slot = self.calls.acquire().await;
        let resp = self.http.get(url).send().await.map_err(|e| {
            let e = e.without_url();
            DiscordError::network_from(format!("download: {e}"), e)
        })?;
        match resp.status().as_u16() {
            200..=299 => Ok(resp),
            429 => Err(DiscordError::RateLimited(Duration::from_secs(1))),
            s @ 500..=599 => Err(DiscordError::Server {
                what: "download",
                detail: format!("HTTP {s}"),
            }),
            s => Err(DiscordError::Rejected {
                what: "download",
                status: s,
                code: 0,
            }),
        }
    }

    /// `PATCH /channels/{channel}/messages/{id}`: the new `content` (kept when `None`), and
    /// `components` (none when empty).
    ///
    /// # Errors
    /// As [`DiscordClient::create_message`].
    pub async fn edit_message(
        &self,
        api: &DiscordApi,
        channel: &str,
        id: &str,
        content: Option<&str>,
        components: Value,
    ) -> Result<(), DiscordError> {
        check_snowflakes("edit message", &[channel, id])?;
        let mut body = serde_json::json!({ "components": components });
        if let Some(c) = content {
            body["content"] = Value::from(c);
        }
        self.call_in(
            api,
            "edit message",
            Some(channel),
            self.http
                .patch(format!("{}/channels/{channel}/messages/{id}", api.base))
                .json(&body),
        )
        .await
        .map(|_| ())
    }

    /// `DELETE /channels/{channel}/messages/{id}`.
    ///
    /// # Errors
    /// As [`DiscordClient::create_message`].
    pub async fn delete_message(
        &self,
        api: &DiscordApi,
        channel: &str,
        id: &str,
    ) -> Result<(), DiscordError> {
        check_snowflakes("delete message", &[channel, id])?;
        self.call_in(
            api,
            "delete message",
            Some(channel),
            self.http
                .delete(format!("{}/channels/{channel}/messages/{id}", api.base)),
        )
        .await
        .map(|_| ())
    }

    /// `POST /channels/{channel}/typing`: the bot shows as typing for about 10 s.
    ///
    /// # Errors
    /// As [`DiscordClient::create_message`].
    pub async fn trigger_typing(
        &self,
        api: &DiscordApi,
        channel: &str,
    ) -> Result<(), DiscordError> {
        check_snowflakes("typing", &[channel])?;
        self.call_in(
            api,
            "typing",
            Some(channel),
            self.http
                .post(format!("{}/channels/{channel}/typing", api.base)),
        )
        .await
        .map(|_| ())
    }
}

impl DiscordClient {
    /// `POST /interactions/{id}/{token}/callback`: the interaction's response.
    ///
    /// # Errors
    /// As [`DiscordClient::create_message`]; code 40060 when it was answered before.
    ///
    /// Asked `with_response`: answers Discord's account of it, whose `resource.message` is
    /// the message a response of type 4 made. `files` go with a type 4's message (its
    /// `data`), as multipart.
    pub(crate) async fn interaction_callback(
        &self,
        api: &DiscordApi,
        id: &str,
        token: &str,
        mut body: Value,
        files: &[botfleet_core::Upload],
    ) -> Result<Value, DiscordError> {
        let url = format!(
            "{}/interactions/{id}/{token}/callback?with_response=true",
            api.base
        );
        let req = with_files(self.http.post(url), &mut body, |b| &mut b["data"], files)?;
        self.call(api, "interaction response", req).await
    }

    /// The bot's application commands replaced by `commands` (slash commands, `CHAT_INPUT`):
    /// `GET /applications/@me` for the application's id, then `PUT
    /// /applications/{id}/commands`, Discord's bulk overwrite.
    ///
    /// # Errors
    /// As [`DiscordClient::create_message`].
    pub async fn overwrite_commands(
        &self,
        api: &DiscordApi,
        commands: &[botfleet_core::CommandSpec],
    ) -> Result<(), DiscordError> {
        use botfleet_core::OptionKind;
        let app = self
            .call(
                api,
                "application",
                self.http.get(format!("{}/applications/@me", api.base)),
            )
            .await?;
        let id = app["id"]
            .as_str()
            .ok_or_else(|| DiscordError::Malformed("application without an id".into()))?
            .to_owned();
        check_snowflakes("commands", &[&id])?;
        let body: Vec<Value> = commands
            .iter()
            .map(|c| {
                let options: Vec<Value> = c
                    .options
                    .iter()
                    .map(|o| {
                        let kind = match o.kind {
                            OptionKind::String => 3,
                            OptionKind::Integer => 4,
                            OptionKind::Boolean => 5,
                            OptionKind::User => 6,
                            OptionKind::Channel => 7,
                            OptionKind::Role => 8,
                            OptionKind::Number => 10,
                        };
                        serde_json::json!({"type": kind, "name": o.name,
                            "description": o.description, "required": o.required})
                    })
                    .collect();
                serde_json::json!({"type": 1, "name": c.name, "description": c.description,
                    "options": options})
            })
            .collect();
        let req = self
            .http
            .put(format!("{}/applications/{id}/commands", api.base))
            .json(&body);
        self.call(api, "commands", req).await.map(|_| ())
    }

    /// A call on the interaction's webhook (`/webhooks/{application}/{token}{path}`): `PATCH`
    /// of `/messages/@original` edits the first response, `DELETE` of it removes it, `POST`
    /// of nothing is a follow-up message.
    ///
    /// # Errors
    /// As [`DiscordClient::create_message`].
    ///
    /// Answers the message made or edited (`Null` for a delete). `files` go with the body,
    /// as multipart. An interaction token that no longer answers (Discord's 401 `50027`,
    /// "Invalid Webhook Token") is `Rejected`, never taken for a refused bot token.
    pub(crate) async fn interaction_webhook(
        &self,
        api: &DiscordApi,
        method: reqwest::Method,
        (app, token, path): (&str, &str, &str),
        body: Option<Value>,
        files: &[botfleet_core::Upload],
    ) -> Result<Value, DiscordError> {
        let url = format!("{}/webhooks/{app}/{token}{path}", api.base);
        let mut req = self.http.request(method, url);
        if let Some(mut b) = body {
            req = with_files(req, &mut b, |b| b, files)?;
        }
        match self.call(api, "interaction webhook", req).await {
            Err(DiscordError::Unauthorized) => Err(DiscordError::Rejected {
                what: "interaction webhook",
                status: 401,
                code: INVALID_WEBHOOK_TOKEN,
            }),
            r => r,
        }
    }
}

/// Discord's code for an interaction token (a webhook's) that no longer answers.
pub(crate) const INVALID_WEBHOOK_TOKEN: u64 = 50027;

/// `req` with `body` as JSON, or, with `files`, as multipart: the body as `payload_json`
/// (its message, `message(body)`, naming each file in `attachments`), each file as
/// `files[n]`.
fn with_files(
    req: reqwest::RequestBuilder,
    body: &mut Value,
    message: impl FnOnce(&mut Value) -> &mut Value,
    files: &[botfleet_core::Upload],
) -> Result<reqwest::RequestBuilder, DiscordError> {
    if files.is_empty() {
        return Ok(req.json(&*body));
    }
    message(body)["attachments"] = files
        .iter()
        .enumerate()
        .map(|(i, f)| serde_json::json!({ "id": i, "filename": f.name }))
        .collect();
    let mut form = reqwest::multipart::Form::new().part(
        "payload_json",
        reqwest::multipart::Part::text(body.to_string())
            .mime_str("application/json")
            .map_err(|e| DiscordError::Malformed(e.without_url().to_string()))?,
    );
    for (i, f) in files.iter().enumerate() {
        let part = botfleet_platform::upload_part(f).map_err(|_| DiscordError::Rejected {
            what: "a file's MIME type",
            status: 400,
            code: 0,
        })?;
        form = form.part(format!("files[{i}]"), part);
    }
    Ok(req.multipart(form))
}

/// Refuses ids that are not Discord snowflakes (digits), before they become path segments.
fn check_snowflakes(what: &'static str, ids: &[&str]) -> Result<(), DiscordError> {
    if ids
        .iter()
        .all(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
    {
        Ok(())
    } else {
        Err(DiscordError::Rejected {
            what,
            status: 400,
            code: 0,
        })
    }
}
