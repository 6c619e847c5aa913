//! The Graph API calls a Cloud API bot makes: read its phone number, send a text.

use std::time::Duration;

use botfleet_core::Secret;
use serde_json::{json, Value};

use crate::{error::OUTSIDE_WINDOW_CODE, WhatsappError, DEFAULT_API_URL, MAX_TEXT_CHARS};

/// One bot's number: where and as whom it sends. `Debug` hides the token.
#[derive(Clone)]
pub struct Number {
    base: String,
    phone_number_id: String,
    token: Secret,
}

impl std::fmt::Debug for Number {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Number")
            .field("phone_number_id", &self.phone_number_id)
            .finish_non_exhaustive()
    }
}

impl Number {
    /// The number `phone_number_id` on `api_url` (default [`DEFAULT_API_URL`]), sending with
    /// the access `token`.
    pub fn new(api_url: Option<&str>, phone_number_id: &str, token: &Secret) -> Self {
        Self {
            base: api_url
                .unwrap_or(DEFAULT_API_URL)
                .trim_end_matches('/')
                .to_owned(),
            phone_number_id: phone_number_id.to_owned(),
            token: token.clone(),
        }
    }
}

/// A Graph API client shared by every bot of the process.
#[derive(Clone, Debug)]
pub struct GraphClient {
    http: reqwest::Client,
}

impl GraphClient {
    /// A client with its own connection pool.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new() -> Result<Self, WhatsappError> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(20))
            .pool_max_idle_per_host(64)
            .build()
            .map_err(|e| WhatsappError::Network(e.without_url()))?;
        Ok(Self { http })
    }

    async fn call(&self, req: reqwest::RequestBuilder) -> Result<Value, WhatsappError> {
        let resp = req
            .send()
            .await
            .map_err(|e| WhatsappError::Network(e.without_url()))?;
        let status = resp.status().as_u16();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| WhatsappError::Network(e.without_url()))?;
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if (200..300).contains(&status) {
            if body.is_null() {
                return Err(WhatsappError::Malformed("not JSON".into()));
            }
            return Ok(body);
        }
        let err = &body["error"];
        let code = err["code"].as_i64().unwrap_or(0);
        let message: String = err["message"]
            .as_str()
            .unwrap_or("")
            .chars()
            .take(300)
            .collect();
        Err(match (status, code) {
            (_, 190) | (401, _) => WhatsappError::Credentials { code, message },
            (_, 4 | 80007 | 130_429 | 131_056) | (429, _) => WhatsappError::RateLimited { code },
            (_, OUTSIDE_WINDOW_CODE) => WhatsappError::OutsideWindow,
            (s, _) if s >= 500 => WhatsappError::Server(s),
            _ => WhatsappError::Refused { code, message },
        })
    }

    /// `GET /{phone_number_id}`: the number's display number (checks the token).
    ///
    /// # Errors
    /// See [`WhatsappError`].
    pub async fn verify(&self, n: &Number) -> Result<String, WhatsappError> {
        let v = self
            .call(
                self.http
                    .get(format!("{}/{}", n.base, n.phone_number_id))
                    .bearer_auth(n.token.expose()),
            )
            .await?;
        Ok(v["display_phone_number"]
            .as_str()
            .unwrap_or(&n.phone_number_id)
            .to_owned())
    }

    /// `POST /{phone_number_id}/messages`: a text to `to` (a WhatsApp id), in reply to the
    /// message `reply_to` when given. Answers the sent message's id.
    ///
    /// # Errors
    /// See [`WhatsappError`].
    pub async fn send_text(
        &self,
        n: &Number,
        to: &str,
        body: &str,
        reply_to: Option<&str>,
    ) -> Result<String, WhatsappError> {
        let body = botfleet_core::fit_text(body, MAX_TEXT_CHARS);
        let doc = json!({
            "messaging_product": "whatsapp",
            "recipient_type": "individual",
            "to": to,
            "type": "text",
            "text": { "body": body },
        });
        self.send_doc(n, doc, reply_to).await
    }

    /// `POST /{phone_number_id}/messages`: an `interactive` message of type `button` to `to`:
    /// `body` (cut to 1,024 characters) and reply `buttons` as (id, title) (titles cut to 20
    /// characters). Answers the sent message's id.
    ///
    /// # Errors
    /// See [`WhatsappError`].
    pub async fn send_buttons(
        &self,
        n: &Number,
        to: &str,
        body: &str,
        buttons: &[(&str, &str)],
        reply_to: Option<&str>,
    ) -> Result<String, WhatsappError> {
        let buttons: Vec<Value> = buttons
            .iter()
            .map(|(id, title)| {
                json!({"type": "reply", "reply": {"id": id, "title": botfleet_core::fit_text(title, 20)}})
            })
            .collect();
        let doc = json!({
            "messaging_product": "whatsapp",
            "recipient_type": "individual",
            "to": to,
            "type": "interactive",
            "interactive": {
                "type": "button",
                "body": { "text": botfleet_core::fit_text(body, 1024) },
                "action": { "buttons": buttons },
            },
        });
        self.send_doc(n, doc, reply_to).await
    }

    /// `POST /{phone_number_id}/messages`: an `interactive` message of type `list` to `to`:
    /// `body`, a `button` label that opens the list, and its `rows` as (id, title) (titles
    /// cut to 24 characters) in one section. Answers the sent message's id.
    ///
    /// # Errors
    /// See [`WhatsappError`].
    pub async fn send_list(
        &self,
        n: &Number,
        to: &str,
        body: &str,
        button: &str,
        rows: &[(&str, &str)],
        reply_to: Option<&str>,
    ) -> Result<String, WhatsappError> {
        let rows: Vec<Value> = rows
            .iter()
            .map(|(id, title)| json!({"id": id, "title": botfleet_core::fit_text(title, 24)}))
            .collect();
        let doc = json!({
            "messaging_product": "whatsapp",
            "recipient_type": "individual",
            "to": to,
            "type": "interactive",
            "interactive": {
                "type": "list",
                "body": { "text": botfleet_core::fit_text(body, 4096) },
                "action": {
                    "button": botfleet_core::fit_text(button, 20),
                    "sections": [{ "title": botfleet_core::fit_text(button, 24), "rows": rows }],
                },
            },
        });
        self.send_doc(n, doc, reply_to).await
    }

    /// `POST /{phone_number_id}/messages`: the approved template `name` in `language` to `to`,
    /// with its `components` (their parameters) when given. Answers the sent message's id.
    ///
    /// # Errors
    /// See [`WhatsappError`].
    pub async fn send_template(
        &self,
        n: &Number,
        to: &str,
        name: &str,
        language: &str,
        components: Option<&Value>,
    ) -> Result<String, WhatsappError> {
        let mut template = json!({ "name": name, "language": { "code": language } });
        if let Some(c) = components {
            template["components"] = c.clone();
        }
        let doc = json!({
            "messaging_product": "whatsapp",
            "recipient_type": "individual",
            "to": to,
            "type": "template",
            "template": template,
        });
        self.send_doc(n, doc, None).await
    }

    /// `POST /{phone_number_id}/media`: uploads a file for the number to send; its media id.
    ///
    /// # Errors
    /// See [`WhatsappError`].
    pub async fn upload_media(
        &self,
        n: &Number,
        f: &botfleet_core::Upload,
    ) -> Result<String, WhatsappError> {
        let part = botfleet_platform::upload_part(f).map_err(|e| WhatsappError::Refused {
            code: 100,
            message: e.to_string(),
        })?;
        let form = reqwest::multipart::Form::new()
            .text("messaging_product", "whatsapp")
            .text("type", f.mime.clone())
            .part("file", part);
        let v = self
            .call(
                self.http
                    .post(format!("{}/{}/media", n.base, n.phone_number_id))
                    .bearer_auth(n.token.expose())
                    .timeout(Duration::from_secs(120))
                    .multipart(form),
            )
            .await?;
        v["id"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| WhatsappError::Malformed("no media id in the answer".into()))
    }

    /// `POST /{phone_number_id}/messages`: the uploaded media `media_id` as a message of
    /// `kind` (`image`, `video`, `audio`, `document`, `sticker`), with a `caption` where the
    /// kind has one and the document's `filename`. Answers the sent message's id.
    ///
    /// # Errors
    /// See [`WhatsappError`].
    #[allow(clippy::too_many_arguments)]
    pub async fn send_media(
        &self,
        n: &Number,
        to: &str,
        kind: &str,
        media_id: &str,
        caption: Option<&str>,
        filename: Option<&str>,
        reply_to: Option<&str>,
    ) -> Result<String, WhatsappError> {
        let mut media = json!({ "id": media_id });
        if let Some(c) = caption.filter(|c| !c.is_empty()) {
            media["caption"] = json!(botfleet_core::fit_text(c, 1024));
        }
        if let Some(f) = filename.filter(|_| kind == "document") {
            media["filename"] = json!(f);
        }
        let mut doc = json!({
            "messaging_product": "whatsapp",
            "recipient_type": "individual",
            "to": to,
            "type": kind,
        });
        doc[kind] = media;
        self.send_doc(n, doc, reply_to).await
    }

    /// A file a user sent the number, by its media id: `GET /{media_id}` for its URL, then the
    /// download with the token (its body not read yet). Only Meta's media hosts (over HTTPS)
    /// or the bot's own Graph host are called with the token.
    ///
    /// # Errors
    /// See [`WhatsappError`]; `Refused` for a media URL elsewhere.
    pub async fn download_media(
        &self,
        n: &Number,
        media_id: &str,
    ) -> Result<reqwest::Response, WhatsappError> {
        if media_id.is_empty() || media_id.contains(['/', '?', '#']) {
            return Err(WhatsappError::Refused {
                code: 100,
                message: "not a media id".into(),
            });
        }
        let info = self
            .call(
                self.http
                    .get(format!("{}/{media_id}", n.base))
                    .bearer_auth(n.token.expose()),
            )
            .await?;
        let refused = || WhatsappError::Refused {
            code: 100,
            message: "the media URL is not Meta's".into(),
        };
        let url = info["url"]
            .as_str()
            .and_then(|u| reqwest::Url::parse(u).ok())
            .ok_or_else(refused)?;
        let graph_host = reqwest::Url::parse(&n.base)
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned));
        let host = url.host_str().unwrap_or("");
        let meta = url.scheme() == "https"
            && [".fbsbx.com", ".facebook.com", ".whatsapp.net", ".fbcdn.net"]
                .iter()
                .any(|d| host.ends_with(d));
        let web = matches!(url.scheme(), "http" | "https");
        if !web || !(meta || graph_host.as_deref() == Some(host)) {
            return Err(refused());
        }
        let resp = self
            .http
            .get(url)
            .bearer_auth(n.token.expose())
            .timeout(Duration::from_secs(300))
            .send()
            .await
            .map_err(|e| WhatsappError::Network(e.without_url()))?;
        match resp.status().as_u16() {
            200..=299 => Ok(resp),
            401 => Err(WhatsappError::Credentials {
                code: 190,
                message: "the media download was refused".into(),
            }),
            429 => Err(WhatsappError::RateLimited { code: 130_429 }),
            s if s >= 500 => Err(WhatsappError::Server(s)),
            _ => Err(WhatsappError::Refused {
                code: 100,
                message: "the media is gone".into(),
            }),
        }
    }

    /// `POST /{phone_number_id}/messages`: the user's message `message_id` marked read, with
    /// the typing indicator shown in its chat (until the reply, at most 25 s).
    ///
    /// # Errors
    /// See [`WhatsappError`].
    pub async fn show_typing(&self, n: &Number, message_id: &str) -> Result<(), WhatsappError> {
        let doc = json!({
            "messaging_product": "whatsapp",
            "status": "read",
            "message_id": message_id,
            "typing_indicator": { "type": "text" },
        });
        self.call(
            self.http
                .post(format!("{}/{}/messages", n.base, n.phone_number_id))
                .bearer_auth(n.token.expose())
                .json(&doc),
        )
        .await?;
        Ok(())
    }

    /// Sends one message document, in reply to `reply_to` when given: its id.
    async fn send_doc(
        &self,
        n: &Number,
        mut doc: Value,
        reply_to: Option<&str>,
    ) -> Result<String, WhatsappError> {
        if let Some(id) = reply_to {
            doc["context"] = json!({ "message_id": id });
        }
        let v = self
            .call(
                self.http
                    .post(format!("{}/{}/messages", n.base, n.phone_number_id))
                    .bearer_auth(n.token.expose())
                    .json(&doc),
            )
            .await?;
        v["messages"][0]["id"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| WhatsappError::Malformed("no message id in the answer".into()))
    }
}
