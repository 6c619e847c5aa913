//! Files on the fake: users sending photos and documents (kept under a `file_id`, served by
//! `getFile` and `/file/bot{token}/{path}` as the Bot API serves them), and the bot's uploads
//! (`sendPhoto`, `sendDocument`, … and `sendMediaGroup`, multipart as Telegram takes them).

use axum::{
    extract::{FromRequest, Multipart, Path, Request, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    Json,
};
use serde_json::{json, Value};

use super::{ok, tg_error, FakeState};

/// A file the bot uploaded, as the fake received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentFile {
    /// The token it was sent with.
    pub token: String,
    /// `chat_id` as text.
    pub chat_id: String,
    /// The method (`sendPhoto`, `sendDocument`, …; `sendMediaGroup` for a group's files).
    pub method: String,
    /// The `InputMedia` type or the method's field (`photo`, `document`, …).
    pub field: String,
    /// The upload's file name.
    pub name: Option<String>,
    /// The upload's MIME type.
    pub mime: Option<String>,
    /// Its bytes.
    pub data: Vec<u8>,
    /// Its caption.
    pub caption: Option<String>,
    /// The id the fake gave the message.
    pub message_id: i64,
    /// Its `reply_markup`, if it had one.
    pub reply_markup: Option<Value>,
    /// When the fake received it.
    pub at: std::time::Instant,
}

/// One part of a multipart body.
pub(super) struct Part {
    name: String,
    file_name: Option<String>,
    mime: Option<String>,
    data: Vec<u8>,
}

/// A request's arguments: a JSON body, or a multipart form's text fields (JSON values parsed
/// where they are JSON, as Telegram reads `reply_markup` and `media`) and its files.
pub(super) async fn read_args(state: &FakeState, req: Request) -> (Value, Vec<Part>) {
    let multipart = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("multipart/form-data"));
    if !multipart {
        return match Json::<Value>::from_request(req, state).await {
            Ok(Json(v)) => (v, Vec::new()),
            Err(_) => (json!({}), Vec::new()),
        };
    }
    let mut args = serde_json::Map::new();
    let mut parts = Vec::new();
    let Ok(mut form) = Multipart::from_request(req, state).await else {
        return (json!({}), parts);
    };
    while let Ok(Some(field)) = form.next_field().await {
        let name = field.name().unwrap_or_default().to_owned();
        let file_name = field.file_name().map(str::to_owned);
        let mime = field.content_type().map(str::to_owned);
        let Ok(data) = field.bytes().await else {
            break;
        };
        if file_name.is_some() {
            parts.push(Part {
                name,
                file_name,
                mime,
                data: data.to_vec(),
            });
        } else {
            let text = String::from_utf8_lossy(&data).into_owned();
            let v = serde_json::from_str::<Value>(&text)
                .ok()
                .filter(|v| v.is_object() || v.is_array())
                .unwrap_or(Value::String(text));
            args.insert(name, v);
        }
    }
    (Value::Object(args), parts)
}

impl FakeState {
    /// A user sends a file in chat `chat_id` to the bot of `token`: `field` is the message's
    /// field (`photo`, `document`, `voice`, `video`, `audio`, `sticker`, …), `caption` its
    /// text. Answers the update id and the file's `file_id`.
    #[allow(clippy::too_many_arguments)]
    pub fn user_sends_file(
        &self,
        token: &str,
        chat_id: i64,
        field: &str,
        data: Vec<u8>,
        name: Option<&str>,
        mime: Option<&str>,
        caption: Option<&str>,
    ) -> (i64, String) {
        let file_id = {
            let mut g = self.lock();
            g.next_file += 1;
            let id = format!("file-{}-{}", g.next_file, field);
            g.files.insert(id.clone(), (token.to_owned(), data));
            id
        };
        let size = self.lock().files.get(&file_id).map_or(0, |(_, d)| d.len());
        let mut file =
            json!({"file_id": file_id, "file_unique_id": format!("u{file_id}"), "file_size": size});
        if let Some(n) = name {
            file["file_name"] = json!(n);
        }
        if let Some(m) = mime {
            file["mime_type"] = json!(m);
        }
        if field == "photo" {
            file["width"] = json!(800);
            file["height"] = json!(600);
            file = json!([{"file_id": format!("{file_id}-thumb"), "file_unique_id": "t", "width": 90, "height": 90, "file_size": 1}, file]);
        }
        let id = self.lock().tokens.get(token).map_or(1, |t| t.next_update);
        let mut msg = json!({
            "message_id": id,
            "date": 1_700_000_000,
            "chat": {"id": chat_id, "type": "private"},
            "from": {"id": chat_id, "is_bot": false, "first_name": "user"},
        });
        msg[field] = file;
        if let Some(c) = caption {
            msg["caption"] = json!(c);
        }
        self.push_raw(token, json!({"update_id": id, "message": msg}));
        (id, file_id)
    }

    /// Every file the bots uploaded, in arrival order.
    pub fn files_sent(&self) -> Vec<SentFile> {
        self.lock().files_sent.clone()
    }

    /// How many times the file `file_id` was downloaded.
    pub fn downloads(&self, file_id: &str) -> usize {
        self.lock()
            .downloads
            .iter()
            .filter(|d| d.as_str() == file_id)
            .count()
    }
}

/// `getFile`: the file's path for the download, for the bot it was sent to.
pub(super) fn get_file(state: &FakeState, token: &str, args: &Value) -> Response {
    let id = args["file_id"].as_str().unwrap_or_default();
    let g = state.lock();
    match g.files.get(id) {
        Some((owner, data)) if owner == token => ok(json!({
            "file_id": id, "file_unique_id": format!("u{id}"), "file_size": data.len(),
            "file_path": format!("documents/{id}.bin"),
        })),
        _ => tg_error(
            StatusCode::BAD_REQUEST,
            "Bad Request: invalid file_id",
            None,
        ),
    }
}

/// `GET /file/bot{token}/{path}`: the bytes, for the bot the file was sent to.
pub(super) async fn download(
    State(state): State<FakeState>,
    Path((bot, path)): Path<(String, String)>,
) -> Response {
    let token = bot.strip_prefix("bot").unwrap_or_default();
    let id = path
        .strip_prefix("documents/")
        .and_then(|p| p.strip_suffix(".bin"))
        .unwrap_or_default();
    let mut g = state.lock();
    let found = g
        .files
        .get(id)
        .filter(|(owner, _)| owner == token)
        .map(|(_, d)| d.clone());
    match found {
        Some(data) => {
            g.downloads.push(id.to_owned());
            ([("content-type", "application/octet-stream")], data).into_response()
        }
        None => (StatusCode::NOT_FOUND, "Not Found").into_response(),
    }
}

/// The longest caption Telegram takes.
const MAX_CAPTION: usize = 1024;

/// `sendPhoto`, `sendDocument`, … (one file in the method's field) and `sendMediaGroup`
/// (`media`: `InputMedia` items naming `attach://` parts), checked as Telegram checks them.
pub(super) fn send_files(
    state: &FakeState,
    token: &str,
    method: &str,
    args: &Value,
    parts: Vec<Part>,
) -> Response {
    let bad = |d: &str| tg_error(StatusCode::BAD_REQUEST, &format!("Bad Request: {d}"), None);
    let chat_id = match &args["chat_id"] {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => return bad("chat_id is empty"),
    };
    let markup = args.get("reply_markup").cloned();
    if let Some(m) = &markup {
        if let Err(why) = super::check_markup(m) {
            return tg_error(StatusCode::BAD_REQUEST, &why, None);
        }
    }
    // (field, the part, caption) of each message to make.
    let mut items: Vec<(String, Part, Option<String>)> = Vec::new();
    let mut parts = parts;
    let mut take = |name: &str| -> Option<Part> {
        let i = parts.iter().position(|p| p.name == name)?;
        Some(parts.swap_remove(i))
    };
    if method == "sendMediaGroup" {
        let Some(media) = args["media"].as_array() else {
            return bad("media is empty");
        };
        if !(2..=10).contains(&media.len()) {
            return bad("media must include 2-10 items");
        }
        for m in media {
            let kind = m["type"].as_str().unwrap_or_default();
            if !["photo", "video", "audio", "document"].contains(&kind) {
                return bad("unsupported media type");
            }
            let Some(name) = m["media"]
                .as_str()
                .and_then(|s| s.strip_prefix("attach://"))
            else {
                return bad("wrong file identifier/HTTP URL specified");
            };
            let Some(p) = take(name) else {
                return bad("wrong file identifier/HTTP URL specified");
            };
            items.push((kind.to_owned(), p, m["caption"].as_str().map(str::to_owned)));
        }
    } else {
        let field = match method {
            "sendPhoto" => "photo",
            "sendDocument" => "document",
            "sendVideo" => "video",
            "sendAudio" => "audio",
            "sendVoice" => "voice",
            "sendSticker" => "sticker",
            _ => return bad("method not found"),
        };
        let Some(p) = take(field) else {
            return bad(&format!("there is no {field} in the request"));
        };
        items.push((
            field.to_owned(),
            p,
            args["caption"].as_str().map(str::to_owned),
        ));
    }
    if items
        .iter()
        .any(|(_, _, c)| c.as_ref().is_some_and(|c| c.chars().count() > MAX_CAPTION))
    {
        return bad("message caption is too long");
    }
    if items.iter().any(|(_, p, _)| p.data.is_empty()) {
        return bad("file must be non-empty");
    }
    let mut g = state.lock();
    let mut answers = Vec::new();
    for (field, p, caption) in items {
        let message_id = g.new_message(
            token,
            &chat_id,
            caption.as_deref().unwrap_or_default(),
            markup.clone(),
        );
        g.files_sent.push(SentFile {
            token: token.to_owned(),
            chat_id: chat_id.clone(),
            method: method.to_owned(),
            field: field.clone(),
            name: p.file_name,
            mime: p.mime,
            data: p.data,
            caption: caption.clone(),
            message_id,
            reply_markup: markup.clone(),
            at: std::time::Instant::now(),
        });
        let mut m =
            json!({"message_id": message_id, "date": 1_700_000_000, "chat": {"id": chat_id}});
        m[field.as_str()] = json!({"file_id": format!("sent-{message_id}")});
        if let Some(c) = caption {
            m["caption"] = json!(c);
        }
        answers.push(m);
    }
    if method == "sendMediaGroup" {
        ok(Value::Array(answers))
    } else {
        ok(answers.pop().unwrap_or(Value::Null))
    }
}
