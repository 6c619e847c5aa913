//! Files on the fake Discord: users' attachments (a `MESSAGE_CREATE` whose `attachments` carry
//! a CDN-like `url` the fake serves, as Discord's CDN does, without a token), and the bots'
//! uploads (`POST /channels/{id}/messages` as multipart: `payload_json` and `files[n]`).

use axum::{
    extract::{FromRequest, Multipart, Path, Request, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    Json,
};
use serde_json::{json, Value};

use super::{lock, FakeDiscordState};

/// A file in a message a bot sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentFile {
    /// Its `filename`.
    pub name: String,
    /// Its content type, as the part said.
    pub mime: Option<String>,
    /// Its bytes.
    pub data: Vec<u8>,
}

/// A message's body (a create, an interaction's response or webhook message): JSON, or
/// multipart (`payload_json` and the files, which must be the ones its `attachments` name,
/// as Discord checks).
pub(super) async fn read_body(
    s: &FakeDiscordState,
    req: Request,
) -> Result<(Value, Vec<SentFile>), Response> {
    let bad = |m: &str| {
        (
            StatusCode::BAD_REQUEST,
            Json(json!({"message": m, "code": 50035})),
        )
            .into_response()
    };
    let multipart = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("multipart/form-data"));
    if !multipart {
        return match Json::<Value>::from_request(req, s).await {
            Ok(Json(v)) => Ok((v, Vec::new())),
            Err(_) => Err(bad("Invalid Form Body")),
        };
    }
    let mut form = Multipart::from_request(req, s)
        .await
        .map_err(|_| bad("Invalid Form Body"))?;
    let (mut payload, mut parts) = (None, Vec::new());
    while let Ok(Some(field)) = form.next_field().await {
        let name = field.name().unwrap_or_default().to_owned();
        let file_name = field.file_name().map(str::to_owned);
        let mime = field.content_type().map(str::to_owned);
        let data = field.bytes().await.map_err(|_| bad("Invalid Form Body"))?;
        if name == "payload_json" {
            payload = serde_json::from_slice::<Value>(&data).ok();
        } else if let Some(i) = name
            .strip_prefix("files[")
            .and_then(|n| n.strip_suffix(']'))
            .and_then(|n| n.parse::<usize>().ok())
        {
            parts.push((i, file_name.unwrap_or_default(), mime, data.to_vec()));
        }
    }
    let payload = payload.ok_or_else(|| bad("Invalid Form Body: payload_json"))?;
    // A message's own, or an interaction response's message's (`data`).
    let listed = match &payload["data"]["attachments"] {
        Value::Null => &payload["attachments"],
        a => a,
    };
    let named: Vec<(u64, String)> = listed
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| Some((a["id"].as_u64()?, a["filename"].as_str()?.to_owned())))
        .collect();
    if parts.len() > 10 || named.len() != parts.len() {
        return Err(bad("Invalid Form Body: attachments"));
    }
    parts.sort_by_key(|p| p.0);
    let mut files = Vec::new();
    for (i, name, mime, data) in parts {
        if !named.iter().any(|(id, _)| *id == i as u64) || data.is_empty() {
            return Err(bad("Invalid Form Body: attachments"));
        }
        if data.len() > 10 * 1024 * 1024 {
            return Err((
                StatusCode::PAYLOAD_TOO_LARGE,
                Json(json!({"message": "Request entity too large", "code": 40005})),
            )
                .into_response());
        }
        files.push(SentFile { name, mime, data });
    }
    Ok((payload, files))
}

impl FakeDiscordState {
    /// A user sends a file (with `text`) in `channel` to the bot of `token`: a
    /// `MESSAGE_CREATE` with the attachment. Answers the message id and the attachment's id.
    pub fn user_sends_file(
        &self,
        token: &str,
        channel: u64,
        name: &str,
        mime: &str,
        data: Vec<u8>,
        text: &str,
    ) -> (String, String) {
        let (id, att) = (self.id().to_string(), self.id().to_string());
        let base = lock(&self.inner.url).replacen("ws://", "http://", 1);
        let base = base.trim_end_matches("/gateway");
        let size = data.len();
        lock(&self.inner.attachments).insert(att.clone(), (data, 0));
        let d = json!({
            "id": id, "channel_id": channel.to_string(), "guild_id": super::guild_of(channel).to_string(),
            "author": {"id": "4242", "username": "user"}, "content": text,
            "attachments": [{"id": att, "filename": name, "content_type": mime, "size": size,
                "url": format!("{base}/attachments/{channel}/{att}/{name}?ex=1&is=1&hm=fake"),
                "proxy_url": format!("{base}/attachments/{channel}/{att}/{name}")}],
        });
        self.user_dispatch(token, channel, "MESSAGE_CREATE", d);
        (id, att)
    }

    /// How many times the attachment `id` was downloaded.
    pub fn downloads(&self, id: &str) -> usize {
        lock(&self.inner.attachments).get(id).map_or(0, |(_, n)| *n)
    }
}

/// `GET /attachments/{channel}/{id}/{name}`: the bytes (the CDN needs no token).
pub(super) async fn download(
    State(s): State<FakeDiscordState>,
    Path((_channel, id, _name)): Path<(String, String, String)>,
) -> Response {
    let mut files = lock(&s.inner.attachments);
    match files.get_mut(&id) {
        Some((data, n)) => {
            *n += 1;
            ([("content-type", "application/octet-stream")], data.clone()).into_response()
        }
        None => (StatusCode::NOT_FOUND, "not found").into_response(),
    }
}
