//! The Slack Web API methods a bot host needs: `auth.test`, `apps.connections.open`,
//! `chat.postMessage`. One HTTP pool for every bot of the process.

use std::time::Duration;

use botfleet_core::Secret;
use serde::{de::DeserializeOwned, Deserialize};
use serde_json::{json, Value};

use crate::{SlackConfig, SlackError, DEFAULT_API_URL};

/// One bot's Web API base and tokens. `Debug` prints no token.
#[derive(Clone)]
pub struct SlackApi {
    base: String,
    bot_token: Secret,
    app_token: Secret,
}

impl std::fmt::Debug for SlackApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlackApi")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl SlackApi {
    /// A bot's API: `api_url` (default [`DEFAULT_API_URL`]), its bot token (`xoxb-…`) and app
    /// token (`xapp-…`).
    pub fn new(api_url: Option<&str>, bot_token: &Secret, app_token: &Secret) -> Self {
        let mut base = api_url.unwrap_or(DEFAULT_API_URL).to_owned();
        if !base.ends_with('/') {
            base.push('/');
        }
        Self {
            base,
            bot_token: bot_token.clone(),
            app_token: app_token.clone(),
        }
    }
}

/// What `auth.test` says about a bot token.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct AuthInfo {
    /// The bot's user id.
    pub user_id: String,
    /// The bot's id (messages it posts carry it as `bot_id`).
    #[serde(default)]
    pub bot_id: Option<String>,
    /// The workspace.
    #[serde(default)]
    pub team_id: Option<String>,
}

#[derive(Deserialize)]
struct ConnectionsOpen {
    url: String,
}

/// A Slack Web API client shared by all Slack bots of a process. Cloning shares the pool.
#[derive(Clone, Debug)]
pub struct SlackClient {
    http: reqwest::Client,
    config: SlackConfig,
    /// Calls in flight, at most `max_concurrent_calls`.
    calls: std::sync::Arc<tokio::sync::Semaphore>,
}

/// Error codes that mean the token is refused: the bot needs an operator.
const AUTH_ERRORS: &[&str] = &[
    "invalid_auth",
    "not_authed",
    "account_inactive",
    "token_revoked",
    "token_expired",
    "not_allowed_token_type",
    "user_removed_from_team",
    "team_disabled",
];

/// Error codes of a Slack that is failing: retried.
const SERVER_ERRORS: &[&str] = &[
    "internal_error",
    "fatal_error",
    "service_unavailable",
    "request_timeout",
];

fn retry_after(headers: &reqwest::header::HeaderMap) -> Duration {
    let secs = headers
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(30);
    Duration::from_secs(secs.clamp(1, 3600))
}

impl SlackClient {
    /// A client with its own connection pool.
    ///
    /// # Errors
    /// [`SlackError::Network`] if the TLS backend cannot be set up.
    pub fn new(config: SlackConfig) -> Result<Self, SlackError> {
        let http = reqwest::Client::builder()
            .connect_timeout(config.request_timeout)
            .pool_max_idle_per_host(config.idle_connections())
            .build()
            .map_err(|e| {
                let e = e.without_url();
                SlackError::network_from(e.to_string(), e)
            })?;
        let calls = std::sync::Arc::new(tokio::sync::Semaphore::new(
            config.max_concurrent_calls.max(1),
        ));
        Ok(Self {
            http,
            config,
            calls,
        })
    }

    /// The settings.
    pub fn config(&self) -> &SlackConfig {
        &self.config
    }

    async fn call<T: DeserializeOwned>(
        &self,
        api: &SlackApi,
        method: &'static str,
        app: bool,
        body: Value,
    ) -> Result<T, SlackError> {
        let (token, which) = if app {
            (&api.app_token, "app")
        } else {
            (&api.bot_token, "bot")
        };
        let req = self
            .http
            .post(format!("{}{method}", api.base))
            .bearer_auth(token.expose())
            .header("content-type", "application/json; charset=utf-8")
            .body(body.to_string());
        self.exchange(req, method, which).await
    }

    /// A Web API `method` with the bot token and a form body (`files.*` take no JSON).
    async fn call_form<T: DeserializeOwned>(
        &self,
        api: &SlackApi,
        method: &'static str,
        form: &[(&str, String)],
    ) -> Result<T, SlackError> {
        let req = self
            .http
            .post(format!("{}{method}", api.base))
            .bearer_auth(api.bot_token.expose())
            .form(form);
        self.exchange(req, method, "bot").await
    }

    /// Sends `req` (one of the pool's calls in flight) and reads Slack's `{ok, error}` answer.
    async fn exchange<T: DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
        method: &'static str,
        which: &'static str,
    ) -> Result<T, SlackError> {
        // Never closed, so a permit always comes.
        let _turn = self.calls.acquire().await;
        let resp = req
            .timeout(self.config.request_timeout)
            .send()
            .await
            .map_err(|e| {
                let e = e.without_url();
                SlackError::network_from(format!("{method}: {e}"), e)
            })?;
        let status = resp.status().as_u16();
        if status == 429 {
            return Err(SlackError::RateLimited(retry_after(resp.headers())));
        }
        let wait = retry_after(resp.headers());
        let bytes = resp.bytes().await.map_err(|e| {
            let e = e.without_url();
            SlackError::network_from(format!("{method}: {e}"), e)
        })?;
        if status >= 500 {
            return Err(SlackError::Server {
                method,
                detail: format!("HTTP {status}"),
            });
        }
        let v: Value = serde_json::from_slice(&bytes)
            .map_err(|e| SlackError::Malformed(format!("{method}: {e}")))?;
        if v["ok"].as_bool() == Some(true) {
            return serde_json::from_value(v)
                .map_err(|e| SlackError::Malformed(format!("{method}: {e}")));
        }
        let code = v["error"]
            .as_str()
            .unwrap_or("unknown_error")
            .chars()
            .take(80)
            .collect::<String>();
        Err(if AUTH_ERRORS.contains(&code.as_str()) {
            SlackError::Unauthorized { which, code }
        } else if code == "ratelimited" || code == "rate_limited" {
            SlackError::RateLimited(wait)
        } else if SERVER_ERRORS.contains(&code.as_str()) {
            SlackError::Server {
                method,
                detail: code,
            }
        } else {
            SlackError::Refused { method, code }
        })
    }

    /// `auth.test` with the bot token.
    ///
    /// # Errors
    /// See [`SlackError`].
    pub async fn auth_test(&self, api: &SlackApi) -> Result<AuthInfo, SlackError> {
        self.call(api, "auth.test", false, json!({})).await
    }

    /// `apps.connections.open` with the app token: the URL of a new Socket Mode connection.
    ///
    /// # Errors
    /// See [`SlackError`].
    pub async fn connections_open(&self, api: &SlackApi) -> Result<String, SlackError> {
        let r: ConnectionsOpen = self
            .call(api, "apps.connections.open", true, json!({}))
            .await?;
        Ok(r.url)
    }

    /// `chat.postMessage` of `text` to `channel`, in the thread `thread_ts` when given.
    ///
    /// # Errors
    /// See [`SlackError`].
    pub async fn post_message(
        &self,
        api: &SlackApi,
        channel: &str,
        text: &str,
        thread_ts: Option<&str>,
    ) -> Result<(), SlackError> {
        let mut body = json!({ "channel": channel, "text": text });
        if let Some(ts) = thread_ts {
            body["thread_ts"] = json!(ts);
        }
        let _: Value = self.call(api, "chat.postMessage", false, body).await?;
        Ok(())
    }

    /// `chat.startStream`: a message streamed into the thread `thread_ts` of `channel`
    /// (streamed messages answer a user, in a thread), starting with `markdown_text` when
    /// given; `recipient` (team id, user id) is who reads it, which Slack requires outside a
    /// DM. The message's `ts`.
    ///
    /// # Errors
    /// See [`SlackError`].
    pub async fn start_stream(
        &self,
        api: &SlackApi,
        channel: &str,
        thread_ts: &str,
        recipient: Option<(&str, &str)>,
        markdown_text: Option<&str>,
    ) -> Result<String, SlackError> {
        let mut body = json!({ "channel": channel, "thread_ts": thread_ts });
        if let Some((team, user)) = recipient {
            body["recipient_team_id"] = json!(team);
            body["recipient_user_id"] = json!(user);
        }
        if let Some(t) = markdown_text {
            body["markdown_text"] = json!(t);
        }
        let r: Value = self.call(api, "chat.startStream", false, body).await?;
        r["ts"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| SlackError::Malformed("chat.startStream: no ts".into()))
    }

    /// `chat.appendStream`: `markdown_text` added to what the streamed message `ts` shows.
    ///
    /// # Errors
    /// See [`SlackError`].
    pub async fn append_stream(
        &self,
        api: &SlackApi,
        channel: &str,
        ts: &str,
        markdown_text: &str,
    ) -> Result<(), SlackError> {
        let body = json!({ "channel": channel, "ts": ts, "markdown_text": markdown_text });
        let _: Value = self.call(api, "chat.appendStream", false, body).await?;
        Ok(())
    }

    /// `chat.stopStream`: ends the stream of message `ts`, `markdown_text` added last when
    /// given.
    ///
    /// # Errors
    /// See [`SlackError`].
    pub async fn stop_stream(
        &self,
        api: &SlackApi,
        channel: &str,
        ts: &str,
        markdown_text: Option<&str>,
    ) -> Result<(), SlackError> {
        let mut body = json!({ "channel": channel, "ts": ts });
        if let Some(t) = markdown_text {
            body["markdown_text"] = json!(t);
        }
        let _: Value = self.call(api, "chat.stopStream", false, body).await?;
        Ok(())
    }

    /// A Web API `method` (`chat.postMessage`, `chat.update`, `chat.delete`) with the bot
    /// token and a JSON `body`: the reply.
    ///
    /// # Errors
    /// See [`SlackError`].
    pub async fn bot_call(
        &self,
        api: &SlackApi,
        method: &'static str,
        body: Value,
    ) -> Result<Value, SlackError> {
        self.call(api, method, false, body).await
    }

    /// POSTs `body` to an interaction's `response_url` (no token: the URL is the credential).
    /// Only a URL on Slack's hooks host or on the bot's own API host is called, so a forged
    /// event cannot make a worker call anywhere else.
    ///
    /// # Errors
    /// See [`SlackError`]; `Refused` for a URL on another host.
    pub async fn respond(
        &self,
        api: &SlackApi,
        response_url: &str,
        body: Value,
    ) -> Result<(), SlackError> {
        let url = slack_url(api, response_url, |h| h == "hooks.slack.com").ok_or_else(|| {
            SlackError::Refused {
                method: "response_url",
                code: "response_url_not_slack".into(),
            }
        })?;
        let _turn = self.calls.acquire().await;
        let resp = self
            .http
            .post(url)
            .json(&body)
            .timeout(self.config.request_timeout)
            .send()
            .await
            .map_err(|e| {
                let e = e.without_url();
                SlackError::network_from(format!("response_url: {e}"), e)
            })?;
        http_status(&resp, "response_url").map(|_| ())
    }

    /// A file users shared with the bot, by its `url_private`: the download (its body not
    /// read yet), with the bot token. Only a URL on Slack's own hosts (`*.slack.com`, over
    /// HTTPS) or on the bot's API host is called, so the token goes nowhere else.
    ///
    /// # Errors
    /// See [`SlackError`]; `Refused` for a URL elsewhere or a file Slack does not serve.
    pub async fn download(
        &self,
        api: &SlackApi,
        url_private: &str,
    ) -> Result<reqwest::Response, SlackError> {
        let url = slack_url(api, url_private, |h| h.ends_with(".slack.com")).ok_or_else(|| {
            SlackError::Refused {
                method: "files.download",
                code: "file_url_not_slack".into(),
            }
        })?;
        let resp = self
            .http
            .get(url)
            .bearer_auth(api.bot_token.expose())
            .timeout(self.config.request_timeout + Duration::from_secs(300))
            .send()
            .await
            .map_err(|e| {
                let e = e.without_url();
                SlackError::network_from(format!("files.download: {e}"), e)
            })?;
        http_status(&resp, "files.download")?;
        // A file the token may not read is answered with a login page, not an error status.
        let html = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|c| c.starts_with("text/html"));
        if html {
            return Err(SlackError::Refused {
                method: "files.download",
                code: "file_not_readable".into(),
            });
        }
        Ok(resp)
    }

    /// Uploads `files` to `channel` (in `thread_ts` when given) the way Slack takes them now:
    /// `files.getUploadURLExternal` per file, its bytes POSTed to the URL it gives, then one
    /// `files.completeUploadExternal` sharing them all.
    ///
    /// # Errors
    /// See [`SlackError`].
    pub async fn upload(
        &self,
        api: &SlackApi,
        channel: &str,
        thread_ts: Option<&str>,
        files: &[botfleet_core::Upload],
    ) -> Result<(), SlackError> {
        let mut ids = Vec::with_capacity(files.len());
        for f in files {
            let target: UploadTarget = self
                .call_form(
                    api,
                    "files.getUploadURLExternal",
                    &[
                        ("filename", f.name.clone()),
                        ("length", f.data.len().to_string()),
                    ],
                )
                .await?;
            let url = slack_url(api, &target.upload_url, |h| h.ends_with(".slack.com"))
                .ok_or_else(|| SlackError::Refused {
                    method: "files.upload",
                    code: "upload_url_not_slack".into(),
                })?;
            let _turn = self.calls.acquire().await;
            let resp = self
                .http
                .post(url)
                .header("content-type", f.mime.clone())
                .body(botfleet_platform::upload_body(f))
                .timeout(self.config.request_timeout + Duration::from_secs(300))
                .send()
                .await
                .map_err(|e| {
                    let e = e.without_url();
                    SlackError::network_from(format!("files.upload: {e}"), e)
                })?;
            http_status(&resp, "files.upload")?;
            ids.push(json!({ "id": target.file_id, "title": f.name }));
        }
        let mut form = vec![
            ("files", Value::Array(ids).to_string()),
            ("channel_id", channel.to_owned()),
        ];
        if let Some(ts) = thread_ts {
            form.push(("thread_ts", ts.to_owned()));
        }
        let _: Value = self
            .call_form(api, "files.completeUploadExternal", &form)
            .await?;
        Ok(())
    }
}

/// What `files.getUploadURLExternal` answers.
#[derive(Deserialize)]
struct UploadTarget {
    upload_url: String,
    file_id: String,
}

/// `raw` as a URL the bot may call with its credentials: HTTP(S) on the bot's own API host
/// (a self-hosted or fake Slack), or HTTPS on a host `slack_host` accepts.
fn slack_url(api: &SlackApi, raw: &str, slack_host: impl Fn(&str) -> bool) -> Option<reqwest::Url> {
    let url = reqwest::Url::parse(raw).ok()?;
    let api_host = reqwest::Url::parse(&api.base)
        .ok()
        .and_then(|u| u.host_str().map(str::to_owned));
    let host = url.host_str().unwrap_or("");
    let slack = url.scheme() == "https" && slack_host(host);
    let web = matches!(url.scheme(), "http" | "https");
    (web && (slack || api_host.as_deref() == Some(host))).then_some(url)
}

/// A plain HTTP answer of Slack's (a `response_url`, a file URL) as a result.
fn http_status(resp: &reqwest::Response, method: &'static str) -> Result<u16, SlackError> {
    match resp.status().as_u16() {
        s @ 200..=299 => Ok(s),
        429 => Err(SlackError::RateLimited(retry_after(resp.headers()))),
        s if s >= 500 => Err(SlackError::Server {
            method,
            detail: format!("HTTP {s}"),
        }),
        s => Err(SlackError::Refused {
            method,
            code: format!("http_{s}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `response_url` comes inside an event: only Slack's hooks host (or the bot's own API
    /// host, where a test's fake answers) is called, and only over HTTP(S); anything else is
    /// refused at once, not retried.
    #[tokio::test]
    async fn response_urls_elsewhere_are_refused_without_a_call() {
        let client = SlackClient::new(crate::SlackConfig::default()).unwrap();
        let api = SlackApi::new(
            Some("http://127.0.0.1:9/api/"),
            &Secret::new("xoxb-1"),
            &Secret::new("xapp-1"),
        );
        for url in [
            "ws://127.0.0.1:9/response/1",
            "https://evil.example/response/1",
            "http://hooks.slack.com/actions/1",
            "not a url",
        ] {
            match client.respond(&api, url, json!({"text": "x"})).await {
                Err(SlackError::Refused { code, .. }) => {
                    assert_eq!(code, "response_url_not_slack", "{url}")
                }
                other => panic!("{url}: {other:?}"),
            }
        }
    }
}
