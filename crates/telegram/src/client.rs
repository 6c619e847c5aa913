//! The Bot API client: one HTTP connection pool shared by every bot for its calls, and a
//! connection of its own for each bot's long poll (see [`crate::poll`]).

use std::{sync::Arc, time::Duration};

use botfleet_core::Secret;
use serde::{de::DeserializeOwned, Deserialize};
use serde_json::json;

use crate::{
    inbound::{split_updates, RawUpdate},
    poll::{PollConn, Target, Tls},
    TelegramConfig, TelegramError, DEFAULT_API_URL,
};

/// One bot's Bot API endpoints, parsed once: `{api_url}/bot{token}/{method}`.
///
/// The URLs hold the token, so `Debug` prints nothing of them.
#[derive(Clone)]
pub struct BotApi {
    get_me: reqwest::Url,
    send_message: reqwest::Url,
    delete_webhook: reqwest::Url,
    /// `{api_url}/file/bot{token}/`: where files are downloaded from.
    files: reqwest::Url,
    /// `getUpdates`, parsed for the long poll's own connection.
    poll: Target,
}

impl std::fmt::Debug for BotApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BotApi(<redacted>)")
    }
}

impl BotApi {
    /// The endpoints of the bot with `token` on `api_url` (default [`DEFAULT_API_URL`]).
    ///
    /// # Errors
    /// [`TelegramError::Malformed`] when the base URL does not parse or is not `http(s)://`
    /// (the message does not repeat the token).
    pub fn new(api_url: Option<&str>, token: &Secret) -> Result<Self, TelegramError> {
        let base = api_url.unwrap_or(DEFAULT_API_URL).trim_end_matches('/');
        let url = |method: &str| {
            reqwest::Url::parse(&format!("{base}/bot{}/{method}", token.expose()))
                .map_err(|e| TelegramError::Malformed(format!("API URL does not parse: {e}")))
        };
        Ok(Self {
            poll: Target::new(&url("getUpdates")?)?,
            get_me: url("getMe")?,
            send_message: url("sendMessage")?,
            delete_webhook: url("deleteWebhook")?,
            files: reqwest::Url::parse(&format!("{base}/file/bot{}/", token.expose()))
                .map_err(|e| TelegramError::Malformed(format!("API URL does not parse: {e}")))?,
        })
    }
}

/// What `getMe` says about a bot.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct BotUser {
    /// The bot's user id.
    pub id: i64,
    /// The bot's username, when it has one.
    #[serde(default)]
    pub username: Option<String>,
}

#[derive(Deserialize)]
struct Reply<T> {
    ok: bool,
    result: Option<T>,
    #[serde(default)]
    error_code: Option<u16>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    parameters: Option<ReplyParameters>,
}

#[derive(Deserialize)]
struct ReplyParameters {
    #[serde(default)]
    retry_after: Option<u64>,
}

/// A Bot API client shared by all bots of a process.
///
/// Requests go to a bot's [`BotApi`] endpoints, so each bot may have its own base
/// (`--api-url`, e.g. a self-hosted Bot API server). Cloning shares the pool.
#[derive(Clone, Debug)]
pub struct TelegramClient {
    http: reqwest::Client,
    config: Arc<TelegramConfig>,
    tls: Tls,
    /// Calls in flight through the shared pool, at most `max_concurrent_calls`.
    calls: Arc<tokio::sync::Semaphore>,
}

impl TelegramClient {
    /// A client with its own connection pool.
    ///
    /// # Errors
    /// [`TelegramError::Network`] if the TLS backend cannot be set up;
    /// [`TelegramError::Malformed`] if the extra root certificates do not parse.
    pub fn new(config: TelegramConfig) -> Result<Self, TelegramError> {
        let mut http = reqwest::Client::builder()
            .pool_max_idle_per_host(config.pool_idle_per_host)
            .connect_timeout(Duration::from_secs(10));
        let pem = config.extra_root_certs_pem.as_deref();
        if let Some(pem) = pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem.as_bytes()).map_err(|e| {
                TelegramError::Malformed(format!("extra root certificates: {}", e.without_url()))
            })?;
            for cert in certs {
                http = http.add_root_certificate(cert);
            }
        }
        let http = http
            .build()
            .map_err(|e| TelegramError::Network(e.without_url()))?;
        let tls = Tls::new(pem)?;
        Ok(Self {
            http,
            calls: Arc::new(tokio::sync::Semaphore::new(
                config.max_concurrent_calls.max(1),
            )),
            config: Arc::new(config),
            tls,
        })
    }

    /// The settings.
    pub fn config(&self) -> &TelegramConfig {
        &self.config
    }

    /// A long poll of its own for one bot: a connection kept between its polls.
    pub fn long_poll(&self) -> LongPoll {
        LongPoll {
            client: self.clone(),
            conn: PollConn::new(),
        }
    }

    async fn call<T: DeserializeOwned>(
        &self,
        url: &reqwest::Url,
        method: &str,
        body: serde_json::Value,
        timeout: Duration,
    ) -> Result<T, TelegramError> {
        let req = self.http.post(url.clone()).json(&body).timeout(timeout);
        self.exchange(req, method).await
    }

    /// Sends `req` (one of the pool's calls in flight) and decodes the reply of `method`.
    async fn exchange<T: DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
        method: &str,
    ) -> Result<T, TelegramError> {
        // Never closed, so the permit always comes; bounded by the request's timeout anyway.
        let _turn = self.calls.acquire().await;
        // `without_url` everywhere: the URL holds the token.
        let resp = req
            .send()
            .await
            .map_err(|e| TelegramError::Network(e.without_url()))?;
        let status = resp.status().as_u16();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| TelegramError::Network(e.without_url()))?;
        decode(status, &bytes, method)
    }

    /// `getMe`: checks the token. A wrong token fails fast with `Unauthorized`.
    ///
    /// # Errors
    /// See [`TelegramError`].
    pub async fn get_me(&self, api: &BotApi) -> Result<BotUser, TelegramError> {
        self.call(&api.get_me, "getMe", json!({}), self.config.request_slack)
            .await
    }

    /// `getUpdates` from `offset` (confirming every update below it), waiting up to the
    /// configured poll timeout for the first one, on a connection opened for this one call.
    /// A bot that polls again and again keeps one with [`TelegramClient::long_poll`].
    ///
    /// # Errors
    /// See [`TelegramError`].
    pub async fn get_updates(
        &self,
        api: &BotApi,
        offset: i64,
    ) -> Result<Vec<RawUpdate>, TelegramError> {
        self.long_poll().get_updates(api, offset).await
    }

    /// `sendMessage` of `text` to `chat_id`, as a reply to `reply_to` when given.
    ///
    /// # Errors
    /// See [`TelegramError`].
    pub async fn send_message(
        &self,
        api: &BotApi,
        chat_id: &str,
        text: &str,
        reply_to: Option<i64>,
    ) -> Result<(), TelegramError> {
        let mut body = json!({ "chat_id": chat_id, "text": text });
        if let Some(id) = reply_to {
            body["reply_parameters"] =
                json!({ "message_id": id, "allow_sending_without_reply": true });
        }
        self.send_message_body(api, body).await.map(|_| ())
    }

    /// `sendMessageDraft`: shows `text` as the draft `draft_id` (non-zero; changes of one
    /// draft are animated) of a message being written in the private chat `chat_id` — a
    /// preview that lasts seconds, not a message: the answer itself goes by `sendMessage`.
    ///
    /// # Errors
    /// See [`TelegramError`].
    pub async fn send_message_draft(
        &self,
        api: &BotApi,
        chat_id: &str,
        draft_id: i64,
        text: &str,
    ) -> Result<(), TelegramError> {
        let body = json!({ "chat_id": chat_id, "draft_id": draft_id, "text": text });
        self.call_method(api, "sendMessageDraft", body)
            .await
            .map(|_| ())
    }

    /// Any Bot API `method` of the bot with a JSON `body`: its `result`. The URL is derived
    /// from one the bot keeps parsed, so no more are kept per bot.
    ///
    /// # Errors
    /// See [`TelegramError`].
    pub async fn call_method(
        &self,
        api: &BotApi,
        method: &str,
        body: serde_json::Value,
    ) -> Result<serde_json::Value, TelegramError> {
        let mut target = api.delete_webhook.clone();
        if let Ok(mut segs) = target.path_segments_mut() {
            segs.pop().push(method);
        }
        self.call(&target, method, body, self.config.request_slack)
            .await
    }

    /// Any Bot API `method` of the bot with a multipart `form` (uploads): its `result`.
    ///
    /// # Errors
    /// See [`TelegramError`].
    pub async fn call_multipart(
        &self,
        api: &BotApi,
        method: &str,
        form: reqwest::multipart::Form,
    ) -> Result<serde_json::Value, TelegramError> {
        let mut target = api.delete_webhook.clone();
        if let Ok(mut segs) = target.path_segments_mut() {
            segs.pop().push(method);
        }
        // Uploads take longer than calls: a minute more than the usual slack.
        let req = self
            .http
            .post(target)
            .multipart(form)
            .timeout(self.config.request_slack + Duration::from_secs(60));
        self.exchange(req, method).await
    }

    /// A file the bot was sent, by its `file_id`: `getFile`, then the download (its body
    /// not read yet). The Bot API serves files of up to 20 MB this way.
    ///
    /// # Errors
    /// See [`TelegramError`]; `Refused` (404) when the file is gone.
    pub async fn download(
        &self,
        api: &BotApi,
        file_id: &str,
    ) -> Result<reqwest::Response, TelegramError> {
        let file = self
            .call_method(api, "getFile", json!({ "file_id": file_id }))
            .await?;
        let path = file["file_path"]
            .as_str()
            .filter(|p| !p.is_empty() && !p.starts_with('/') && !p.contains(".."))
            .ok_or_else(|| TelegramError::Malformed("getFile: no usable file_path".into()))?;
        let url = api
            .files
            .join(path)
            .map_err(|e| TelegramError::Malformed(format!("getFile: file_path: {e}")))?;
        let resp = self
            .http
            .get(url)
            .timeout(self.config.request_slack + Duration::from_secs(300))
            .send()
            .await
            .map_err(|e| TelegramError::Network(e.without_url()))?;
        let status = resp.status().as_u16();
        match status {
            200..=299 => Ok(resp),
            401 => Err(TelegramError::Unauthorized("file download refused".into())),
            429 => Err(TelegramError::RateLimited(Duration::from_secs(1))),
            500..=599 => Err(TelegramError::Server {
                status,
                description: "file download failed".into(),
            }),
            _ => Err(TelegramError::Refused {
                status,
                description: "file download refused".into(),
            }),
        }
    }

    /// `sendMessage` of `body` (`chat_id`, `text`, `reply_markup`, …): the sent message's id.
    ///
    /// # Errors
    /// See [`TelegramError`].
    pub async fn send_message_body(
        &self,
        api: &BotApi,
        body: serde_json::Value,
    ) -> Result<Option<i64>, TelegramError> {
        let sent: serde_json::Value = self
            .call(
                &api.send_message,
                "sendMessage",
                body,
                self.config.request_slack,
            )
            .await?;
        Ok(sent.get("message_id").and_then(serde_json::Value::as_i64))
    }

    /// `setWebhook`: Telegram POSTs the bot's updates to `url`, each with `secret_token` in
    /// `X-Telegram-Bot-Api-Secret-Token`, at most `max_connections` at once; `getUpdates`
    /// answers 409 from then on.
    ///
    /// # Errors
    /// See [`TelegramError`].
    pub async fn set_webhook(
        &self,
        api: &BotApi,
        url: &str,
        secret_token: &Secret,
        max_connections: u32,
    ) -> Result<(), TelegramError> {
        // Derived from deleteWebhook's URL: one more parsed URL per bot is memory for nothing.
        let mut target = api.delete_webhook.clone();
        if let Ok(mut segs) = target.path_segments_mut() {
            segs.pop().push("setWebhook");
        }
        let body = json!({
            "url": url,
            "secret_token": secret_token.expose(),
            "max_connections": max_connections,
            "allowed_updates": ["message", "edited_message", "channel_post", "edited_channel_post", "callback_query"],
        });
        let _: serde_json::Value = self
            .call(&target, "setWebhook", body, self.config.request_slack)
            .await?;
        Ok(())
    }

    /// `deleteWebhook`: long polling fails with 409 while a webhook is set.
    ///
    /// # Errors
    /// See [`TelegramError`].
    pub async fn delete_webhook(&self, api: &BotApi) -> Result<(), TelegramError> {
        let _: serde_json::Value = self
            .call(
                &api.delete_webhook,
                "deleteWebhook",
                json!({}),
                self.config.request_slack,
            )
            .await?;
        Ok(())
    }
}

/// The Bot API reply of `method` with HTTP `status` and body `bytes`: its result, or its
/// error classified.
fn decode<T: DeserializeOwned>(
    status: u16,
    bytes: &[u8],
    method: &str,
) -> Result<T, TelegramError> {
    let reply: Reply<T> = match serde_json::from_slice(bytes) {
        Ok(r) => r,
        Err(e) if status >= 500 => {
            return Err(TelegramError::Server {
                status,
                description: format!("non-JSON reply ({e})"),
            })
        }
        Err(e) => return Err(TelegramError::Malformed(format!("{method}: {e}"))),
    };
    if reply.ok {
        return reply
            .result
            .ok_or_else(|| TelegramError::Malformed(format!("{method}: ok without result")));
    }
    let code = reply.error_code.unwrap_or(status);
    let description = reply.description.unwrap_or_default();
    Err(match code {
        401 | 404 if method == "getMe" || code == 401 => TelegramError::Unauthorized(description),
        409 => TelegramError::Conflict(description),
        429 => TelegramError::RateLimited(Duration::from_secs(
            reply
                .parameters
                .and_then(|p| p.retry_after)
                .unwrap_or(1)
                .clamp(1, 3600),
        )),
        500..=599 => TelegramError::Server {
            status: code,
            description,
        },
        _ => TelegramError::Refused {
            status: code,
            description,
        },
    })
}

/// One bot's long poll: `getUpdates` over a connection of its own, kept between polls, that
/// holds no buffer while it waits. Dropping a poll in flight closes its connection, which
/// ends the poll on the server.
#[derive(Debug)]
pub struct LongPoll {
    client: TelegramClient,
    conn: PollConn,
}

impl LongPoll {
    /// The same poll on a new connection (the old one closes).
    pub(crate) fn fresh(&self) -> Self {
        self.client.long_poll()
    }

    /// `getUpdates` from `offset` (confirming every update below it), waiting up to the
    /// configured poll timeout for the first one.
    ///
    /// # Errors
    /// See [`TelegramError`]; after any error the next poll opens a new connection.
    pub async fn get_updates(
        &mut self,
        api: &BotApi,
        offset: i64,
    ) -> Result<Vec<RawUpdate>, TelegramError> {
        let cfg = &self.client.config;
        let timeout = cfg.poll_timeout.min(Duration::from_secs(50));
        let body = serde_json::to_vec(&json!({
            "offset": offset,
            "limit": cfg.batch.clamp(1, 100),
            "timeout": timeout.as_secs(),
        }))
        .map_err(|e| TelegramError::Malformed(e.to_string()))?;
        let limit = timeout + cfg.request_slack;
        let reply =
            match tokio::time::timeout(limit, self.conn.post(&api.poll, &self.client.tls, &body))
                .await
            {
                Ok(r) => r?,
                Err(_) => {
                    // The connection is in an unknown state: start over on a new one.
                    self.conn = PollConn::new();
                    return Err(TelegramError::Transport(format!(
                        "getUpdates timed out after {limit:?}"
                    )));
                }
            };
        let result: serde_json::Value = decode(reply.status, &reply.body, "getUpdates")?;
        split_updates(result).map_err(TelegramError::Malformed)
    }
}
