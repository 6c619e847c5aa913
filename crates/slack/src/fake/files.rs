//! Files on the fake Slack: users sharing files (a `file_share` message whose `files` carry a
//! `url_private` the fake serves to the bot token, as Slack does), and the bot's uploads the
//! way Slack takes them now (`files.getUploadURLExternal`, the bytes POSTed to the URL it
//! gave, `files.completeUploadExternal`).

use axum::{
    body::Bytes,
    extract::{Path, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    Json,
};
use serde_json::{json, Value};

use super::{bearer, slack_error, FakeSlackState, Inner};

/// The fake's HTTP base from the base it keeps for its sockets (`ws://…`).
fn http_base(base: &str) -> String {
    base.replacen("ws://", "http://", 1)
}

/// A file users shared or the bot is uploading.
pub(super) struct StoredFile {
    /// The bot token that may read it (or that uploads it).
    token: String,
    name: String,
    mime: String,
    /// The bytes (for an upload: once POSTed).
    data: Option<Vec<u8>>,
    /// The length `files.getUploadURLExternal` was told.
    length: usize,
}

/// A file the bot shared through `files.completeUploadExternal`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedFile {
    /// The bot token.
    pub token: String,
    /// `channel_id`.
    pub channel: String,
    /// `thread_ts`, when given.
    pub thread_ts: Option<String>,
    /// The file's name.
    pub name: String,
    /// Its title.
    pub title: Option<String>,
    /// Its bytes.
    pub data: Vec<u8>,
    /// `initial_comment`, when given.
    pub initial_comment: Option<String>,
}

impl FakeSlackState {
    /// A user shares a file (with `text`) in `channel` with the app of `bot_token`: a
    /// `file_share` message whose file the bot can download. Answers the message's `ts` and
    /// the file's id.
    pub fn user_shares_file(
        &self,
        bot_token: &str,
        channel: &str,
        name: &str,
        mime: &str,
        data: Vec<u8>,
        text: &str,
    ) -> (String, String) {
        let ts = self.next_ts();
        let base = http_base(&self.base.lock().unwrap_or_else(|e| e.into_inner()));
        let id = {
            let mut g = self.lock();
            g.next_id += 1;
            let id = format!("F{:08}", g.next_id);
            g.files.insert(
                id.clone(),
                StoredFile {
                    token: bot_token.to_owned(),
                    name: name.to_owned(),
                    mime: mime.to_owned(),
                    length: data.len(),
                    data: Some(data.clone()),
                },
            );
            id
        };
        let file = json!({
            "id": id, "name": name, "title": name, "mimetype": mime,
            "filetype": name.rsplit('.').next().unwrap_or("bin"), "size": data.len(),
            "mode": "hosted", "is_external": false,
            "url_private": format!("{base}/files-pri/T0001-{id}/{name}"),
            "url_private_download": format!("{base}/files-pri/T0001-{id}/download/{name}"),
        });
        self.push_event(
            bot_token,
            json!({
                "type": "message", "subtype": "file_share", "channel": channel,
                "user": "U000USER", "text": text, "ts": ts, "event_ts": ts,
                "channel_type": "channel", "upload": false, "files": [file],
            }),
        );
        (ts, id)
    }

    /// Every file the bots shared, in order.
    pub fn files_shared(&self) -> Vec<SharedFile> {
        self.lock().shared.clone()
    }

    /// How many times the file `id` was downloaded.
    pub fn downloads(&self, id: &str) -> usize {
        self.lock().downloads.iter().filter(|d| *d == id).count()
    }
}

/// `GET /files-pri/T…-{id}/[download/]{name}`: the bytes, to the bot token it was shared
/// with (any other is shown Slack's login page, as Slack does).
pub(super) async fn download(
    State(state): State<FakeSlackState>,
    Path(rest): Path<String>,
    headers: HeaderMap,
) -> Response {
    let token = bearer(&headers);
    let id = rest
        .split('/')
        .next()
        .and_then(|s| s.split_once('-'))
        .map_or("", |(_, id)| id)
        .to_owned();
    let mut g = state.lock();
    let found = g
        .files
        .get(&id)
        .filter(|f| f.token == token)
        .and_then(|f| f.data.clone().map(|d| (d, f.mime.clone())));
    match found {
        Some((data, mime)) => {
            g.downloads.push(id);
            ([("content-type", mime)], data).into_response()
        }
        None => (
            [("content-type", "text/html")],
            "<html>sign in to Slack</html>",
        )
            .into_response(),
    }
}

/// `POST /upload/{id}`: the bytes of an upload, which must be as long as announced.
pub(super) async fn upload(
    State(state): State<FakeSlackState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let mut g = state.lock();
    match g.files.get_mut(&id) {
        Some(f) if f.data.is_none() && f.length == body.len() => {
            f.data = Some(body.to_vec());
            (StatusCode::OK, format!("OK - {}", body.len())).into_response()
        }
        Some(_) => (StatusCode::BAD_REQUEST, "length mismatch").into_response(),
        None => (StatusCode::NOT_FOUND, "no such upload").into_response(),
    }
}

/// `files.getUploadURLExternal` and `files.completeUploadExternal`, as Slack checks them.
pub(super) fn web_method(
    g: &mut Inner,
    base: &str,
    token: &str,
    method: &str,
    args: &Value,
) -> Response {
    if !g.apps.contains_key(token) {
        return slack_error("invalid_auth");
    }
    match method {
        "files.getUploadURLExternal" => {
            let (Some(name), Some(length)) = (
                args["filename"].as_str().filter(|n| !n.is_empty()),
                args["length"]
                    .as_str()
                    .and_then(|l| l.parse::<usize>().ok()),
            ) else {
                return slack_error("invalid_arguments");
            };
            if length == 0 {
                return slack_error("invalid_arguments");
            }
            g.next_id += 1;
            let id = format!("F{:08}", g.next_id);
            g.files.insert(
                id.clone(),
                StoredFile {
                    token: token.to_owned(),
                    name: name.to_owned(),
                    mime: String::new(),
                    data: None,
                    length,
                },
            );
            let base = http_base(base);
            Json(json!({"ok": true, "upload_url": format!("{base}/upload/{id}"), "file_id": id}))
                .into_response()
        }
        _ => {
            let files: Vec<Value> = args["files"]
                .as_str()
                .and_then(|f| serde_json::from_str(f).ok())
                .unwrap_or_default();
            let Some(channel) = args["channel_id"].as_str().filter(|c| !c.is_empty()) else {
                return slack_error("invalid_arguments");
            };
            if files.is_empty() {
                return slack_error("invalid_arguments");
            }
            let mut shared = Vec::new();
            for f in &files {
                let id = f["id"].as_str().unwrap_or_default();
                let Some(stored) = g.files.get(id).filter(|s| s.token == token) else {
                    return slack_error("file_not_found");
                };
                let Some(data) = stored.data.clone() else {
                    return slack_error("file_upload_not_complete");
                };
                shared.push(SharedFile {
                    token: token.to_owned(),
                    channel: channel.to_owned(),
                    thread_ts: args["thread_ts"].as_str().map(str::to_owned),
                    name: stored.name.clone(),
                    title: f["title"].as_str().map(str::to_owned),
                    data,
                    initial_comment: args["initial_comment"].as_str().map(str::to_owned),
                });
            }
            g.shared.extend(shared);
            Json(json!({"ok": true, "files": files})).into_response()
        }
    }
}
