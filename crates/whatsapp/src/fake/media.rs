//! Media on the fake Graph API: users' media messages (by media id: `GET /{media_id}` gives
//! a URL the fake serves to the number's token, as Meta's media host does), the bots'
//! uploads (`POST /{phone_number_id}/media`, multipart) and their media messages.

use axum::{
    extract::{FromRequest, Multipart, Path, Request, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    Json,
};
use serde_json::{json, Value};

use super::{bearer, graph_error, message_doc, refusal, FakeGraphState};

/// A media file the fake holds: a user's or a bot's upload.
pub(super) struct StoredMedia {
    /// The number it was sent to or uploaded by.
    number: String,
    mime: String,
    name: Option<String>,
    data: Vec<u8>,
    downloads: usize,
}

/// The file of a media message a bot sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentMedia {
    /// `image`, `video`, `audio`, `document` or `sticker`.
    pub kind: String,
    /// The upload's file name (a document's `filename` when given).
    pub name: Option<String>,
    /// The upload's MIME type.
    pub mime: String,
    /// Its bytes.
    pub data: Vec<u8>,
}

impl FakeGraphState {
    /// A user `from` sends the number a media message of `kind` (`image`, `audio`, `video`,
    /// `document`, `sticker`): answers its `wamid` and the media id.
    #[allow(clippy::too_many_arguments)]
    pub fn user_sends_media(
        &self,
        phone_number_id: &str,
        from: &str,
        kind: &str,
        mime: &str,
        data: Vec<u8>,
        caption: Option<&str>,
        filename: Option<&str>,
    ) -> (String, String) {
        let n = self
            .next_id
            .fetch_add(2, std::sync::atomic::Ordering::SeqCst);
        let (id, media_id) = (format!("wamid.{}", n + 1), format!("{}", 900_000 + n));
        self.lock().media.insert(
            media_id.clone(),
            StoredMedia {
                number: phone_number_id.to_owned(),
                mime: mime.to_owned(),
                name: filename.map(str::to_owned),
                data,
                downloads: 0,
            },
        );
        let mut file = json!({"id": media_id, "mime_type": mime, "sha256": "fake"});
        if let Some(c) = caption {
            file["caption"] = json!(c);
        }
        if let Some(f) = filename {
            file["filename"] = json!(f);
        }
        let mut m = json!({"from": from, "id": id, "timestamp": "1700000000", "type": kind});
        m[kind] = file;
        let doc = message_doc(phone_number_id, from, m);
        self.enqueue(phone_number_id, id.clone(), Some(from.to_owned()), &doc);
        (id, media_id)
    }

    /// How many times the media `id` was downloaded.
    pub fn media_downloads(&self, id: &str) -> usize {
        self.lock().media.get(id).map_or(0, |m| m.downloads)
    }

    /// The media `id` a bot uploaded: (its MIME type, its name, its bytes).
    pub(super) fn uploaded(&self, number: &str, id: &str) -> Option<SentMedia> {
        let g = self.lock();
        let m = g.media.get(id).filter(|m| m.number == number)?;
        Some(SentMedia {
            kind: String::new(),
            name: m.name.clone(),
            mime: m.mime.clone(),
            data: m.data.clone(),
        })
    }
}

/// `GET /{media_id}`: the media's URL, for the token of the number it belongs to.
pub(super) fn info(state: &FakeGraphState, id: &str, headers: &HeaderMap) -> Option<Response> {
    let g = state.lock();
    let m = g.media.get(id)?;
    let owner = g.numbers.get(&m.number).map(|n| n.token.clone());
    if owner.is_none() || owner.as_deref() != bearer(headers) {
        return Some(graph_error(
            StatusCode::UNAUTHORIZED,
            190,
            "Error validating access token",
        ));
    }
    let base = state.base.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Some(
        Json(
            json!({"messaging_product": "whatsapp", "url": format!("{base}/media-files/{id}"),
            "mime_type": m.mime, "sha256": "fake", "file_size": m.data.len(), "id": id}),
        )
        .into_response(),
    )
}

/// `GET /media-files/{id}`: the bytes, for the owning number's token.
pub(super) async fn download(
    State(state): State<FakeGraphState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let token = bearer(&headers);
    let mut g = state.lock();
    let owner_token = g
        .media
        .get(&id)
        .and_then(|m| g.numbers.get(&m.number))
        .map(|n| n.token.clone());
    match (owner_token, g.media.get_mut(&id)) {
        (Some(t), Some(m)) if Some(t.as_str()) == token => {
            m.downloads += 1;
            ([("content-type", m.mime.clone())], m.data.clone()).into_response()
        }
        (_, Some(_)) => StatusCode::UNAUTHORIZED.into_response(),
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

/// `POST /{phone_number_id}/media`: a bot's upload (`messaging_product`, `type`, `file`).
pub(super) async fn upload(
    State(state): State<FakeGraphState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    req: Request,
) -> Response {
    if let Some(r) = refusal(&state, &id, &headers) {
        return r;
    }
    let bad = || graph_error(StatusCode::BAD_REQUEST, 100, "Invalid parameter");
    let Ok(mut form) = Multipart::from_request(req, &state).await else {
        return bad();
    };
    let (mut product, mut mime, mut file) = (None, None, None);
    while let Ok(Some(f)) = form.next_field().await {
        let name = f.name().unwrap_or_default().to_owned();
        let file_name = f.file_name().map(str::to_owned);
        let Ok(data) = f.bytes().await else {
            return bad();
        };
        match name.as_str() {
            "messaging_product" => product = Some(String::from_utf8_lossy(&data).into_owned()),
            "type" => mime = Some(String::from_utf8_lossy(&data).into_owned()),
            "file" => file = Some((file_name, data.to_vec())),
            _ => {}
        }
    }
    let (Some("whatsapp"), Some(mime), Some((name, data))) = (product.as_deref(), mime, file)
    else {
        return bad();
    };
    if data.is_empty() {
        return bad();
    }
    let media_id = format!(
        "{}",
        800_000
            + state
                .next_id
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    );
    state.lock().media.insert(
        media_id.clone(),
        StoredMedia {
            number: id,
            mime,
            name,
            data,
            downloads: 0,
        },
    );
    Json(json!({ "id": media_id })).into_response()
}

/// The file of a media message document (`type` `image`, `video`, …): its uploaded media,
/// and the caption, checked as the Cloud API does (a caption only on images, videos and
/// documents, of at most 1,024 characters).
pub(super) fn media_message(
    state: &FakeGraphState,
    number: &str,
    doc: &Value,
) -> Result<(SentMedia, String), &'static str> {
    let kind = doc["type"].as_str().unwrap_or_default();
    let m = &doc[kind];
    let id = m["id"]
        .as_str()
        .ok_or("Parameter value is not valid: media id")?;
    let mut sent = state
        .uploaded(number, id)
        .ok_or("Media upload error: no such media id")?;
    let caption = m["caption"].as_str().unwrap_or_default().to_owned();
    if !caption.is_empty() && !matches!(kind, "image" | "video" | "document") {
        return Err("Parameter value is not valid: caption on this media type");
    }
    if caption.chars().count() > 1024 {
        return Err("Parameter value is not valid: caption too long");
    }
    sent.kind = kind.to_owned();
    if let Some(f) = m["filename"].as_str() {
        sent.name = Some(f.to_owned());
    }
    Ok((sent, caption))
}
