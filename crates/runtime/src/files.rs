//! Files through the fleet.
//!
//! ```text
//! in:  an event's attachment (the platform's file reference, journaled) → a signed link per
//!      turn: {api-public-url}/api/v1/files/{claim}.{signature} → any worker: signature and
//!      expiry checked → the bot's spec → the platform's download (Telegram getFile, Slack
//!      url_private with the bot token, …) → streamed to the caller
//! out: a send's attachment (`url` the worker downloads — a file link of the fleet's own is
//!      read through the fleet — or `data` in base64) → bytes within the mode's bound →
//!      the platform's upload
//! ```
//!
//! A link is a claim (the bot, the platform's reference, the file's kind, type, name and
//! expiry) and an HMAC-SHA256 of it under a fleet-wide key the store keeps (made once by
//! whichever worker asks first, sealed like credentials), so any worker can check a link any
//! other made, and a handler's service reads files without holding a platform token.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, RwLock},
    time::{Duration, Instant},
};

use axum::{
    body::Body,
    extract::{Path, State},
    http::{header, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Router,
};
use base64::Engine;
use botfleet_core::{Attachment, AttachmentKind, BotId, BotSpec, OutFile, Platform, Upload};
use botfleet_platform::{Connector, ErrorKind, FileBody, PlatformError};
use botfleet_store::{Store, StoreError};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use tracing::{debug, warn};

use crate::metrics::{Metrics, FILES_SERVED_TOTAL};

/// The store's name of the key that signs file links.
const LINK_KEY: &str = "file-links";

/// Where links point, under the API's public URL.
pub const FILES_PATH: &str = "/api/v1/files/";

/// How long a bot's spec is reused before it is read again.
const SPEC_TTL: Duration = Duration::from_secs(2);

/// The most bytes a Rust handler reads of one file ([`crate::TurnContext::file`]).
pub const MAX_READ_BYTES: u64 = 64 * 1024 * 1024;

/// Bytes of a link's signature kept (160 bits).
const SIG_BYTES: usize = 20;

/// What a link says: whose file, which, and until when.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
struct Claim {
    /// The bot.
    b: String,
    /// The platform's reference to the file.
    s: String,
    /// Its kind.
    k: AttachmentKind,
    /// Its MIME type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    m: Option<String>,
    /// Its name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    n: Option<String>,
    /// Unix seconds after which the link is refused.
    e: i64,
}

/// Why a link was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Not a link this fleet signed (or altered).
    BadSignature,
    /// Signed, but past its expiry.
    Expired,
}

/// The fleet's files on one worker: signs links, serves them ([`Files::router`]), reads the
/// files handlers receive and fetches the ones they send. Cheap to clone.
#[derive(Clone)]
pub struct Files {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Files {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Files").finish_non_exhaustive()
    }
}

/// A spec as read at an instant (`None`: no such bot).
type CachedSpec = (Instant, Option<Arc<BotSpec>>);

struct Inner {
    store: Arc<dyn Store>,
    connectors: HashMap<Platform, Arc<dyn Connector>>,
    http: reqwest::Client,
    metrics: Arc<Metrics>,
    /// The API's public URL links are built on (no trailing `/`).
    // std RwLock: read per link, written once at start, never held across .await.
    base: RwLock<String>,
    ttl: Duration,
    key: tokio::sync::OnceCell<Vec<u8>>,
    // std Mutex: one map operation at a time, never across .await.
    specs: Mutex<HashMap<BotId, CachedSpec>>,
}

/// What a failed file operation answers over HTTP: status, code, message.
struct Failure(StatusCode, &'static str, String, Option<Duration>);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let Failure(status, code, message, retry) = self;
        let mut r = (
            status,
            axum::Json(serde_json::json!({ "code": code, "message": message })),
        )
            .into_response();
        if let Some(d) = retry {
            if let Ok(v) = header::HeaderValue::from_str(&d.as_secs().max(1).to_string()) {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        r
    }
}

impl Files {
    /// The files of a worker whose API others reach at `public_url` (no trailing `/`), links
    /// valid for `ttl`.
    pub(crate) fn new(
        store: Arc<dyn Store>,
        connectors: HashMap<Platform, Arc<dyn Connector>>,
        http: reqwest::Client,
        metrics: Arc<Metrics>,
        public_url: String,
        ttl: Duration,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                connectors,
                http,
                metrics,
                base: RwLock::new(public_url),
                ttl,
                key: tokio::sync::OnceCell::new(),
                specs: Mutex::default(),
            }),
        }
    }

    /// Sets the URL links are built on (`--api-public-url`, or the HTTP address once it is
    /// bound): how handlers reach the workers' API.
    pub fn set_public_url(&self, url: &str) {
        let mut b = self.inner.base.write().unwrap_or_else(|e| e.into_inner());
        *b = url.trim_end_matches('/').to_owned();
    }

    /// The URL links are built on.
    pub fn public_url(&self) -> String {
        self.inner
            .base
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// `GET /api/v1/files/{id}`: the file a link names, streamed from its platform. Needs no
    /// API token (the signature is the permission); a bad or expired signature is 403 and
    /// reaches no platform.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/api/v1/files/{id}", get(serve))
            .with_state(self.clone())
    }

    /// The link key, made and stored once for the fleet.
    ///
    /// # Errors
    /// The store's failures (tried again by the next caller).
    pub(crate) async fn key(&self) -> Result<&[u8], StoreError> {
        let k = self
            .inner
            .key
            .get_or_try_init(|| crate::reply_token::fleet_key(self.inner.store.as_ref(), LINK_KEY))
            .await?;
        Ok(k.as_slice())
    }

    fn mac(key: &[u8], payload: &str) -> Vec<u8> {
        // HMAC accepts keys of any length: new_from_slice cannot fail.
        match Hmac::<Sha256>::new_from_slice(key) {
            Ok(mut m) => {
                m.update(payload.as_bytes());
                m.finalize().into_bytes()[..SIG_BYTES].to_vec()
            }
            Err(_) => Vec::new(),
        }
    }

    /// The link to `a`, a file `bot` was sent, with the key given; `now_s` is unix seconds.
    fn link_with(&self, key: &[u8], bot: &BotId, a: &Attachment, now_s: i64) -> String {
        let claim = Claim {
            b: bot.to_string(),
            s: a.source.clone(),
            k: a.kind,
            m: a.mime.clone(),
            n: a.name.clone(),
            e: now_s + i64::try_from(self.inner.ttl.as_secs()).unwrap_or(i64::MAX / 4),
        };
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let payload = b64.encode(serde_json::to_vec(&claim).unwrap_or_default());
        let sig = b64.encode(Self::mac(key, &payload));
        format!("{}{FILES_PATH}{payload}.{sig}", self.public_url())
    }

    /// The link key, as bytes of its own.
    ///
    /// # Errors
    /// The store's failures.
    pub(crate) async fn link_key(&self) -> Result<Vec<u8>, StoreError> {
        self.key().await.map(<[u8]>::to_vec)
    }

    /// Gives each of `atts` (files `bot` was sent) its link, signed with `key`.
    pub(crate) fn sign_all(&self, key: &[u8], bot: &BotId, atts: &mut [Attachment]) {
        let now_s = botfleet_core::unix_ms() / 1000;
        for a in atts {
            a.url = self.link_with(key, bot, a, now_s);
        }
    }

    /// What link id `id` claims, when this fleet signed it and it has not expired.
    fn verify_with(key: &[u8], id: &str, now_s: i64) -> Result<Claim, Refusal> {
        let (payload, sig) = id.split_once('.').ok_or(Refusal::BadSignature)?;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let sig = b64.decode(sig).map_err(|_| Refusal::BadSignature)?;
        let want = Self::mac(key, payload);
        if want.is_empty() || !botfleet_platform::secrets_match(&sig, &want) {
            return Err(Refusal::BadSignature);
        }
        let raw = b64.decode(payload).map_err(|_| Refusal::BadSignature)?;
        let claim: Claim = serde_json::from_slice(&raw).map_err(|_| Refusal::BadSignature)?;
        if claim.e < now_s {
            return Err(Refusal::Expired);
        }
        Ok(claim)
    }

    /// The bot's spec, read again at most every [`SPEC_TTL`].
    async fn spec(&self, bot: &BotId) -> Result<Option<Arc<BotSpec>>, StoreError> {
        {
            let specs = self.inner.specs.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((at, spec)) = specs.get(bot) {
                if at.elapsed() < SPEC_TTL {
                    return Ok(spec.clone());
                }
            }
        }
        let spec = self
            .inner
            .store
            .get_bot(bot)
            .await?
            .map(|r| Arc::new(r.spec));
        let mut specs = self.inner.specs.lock().unwrap_or_else(|e| e.into_inner());
        if specs.len() > 10_000 {
            specs.clear();
        }
        specs.insert(bot.clone(), (Instant::now(), spec.clone()));
        Ok(spec)
    }

    /// Opens the file `source` of `bot` at its platform.
    async fn open(&self, bot: &BotId, source: &str) -> Result<FileBody, Failure> {
        let spec = self
            .spec(bot)
            .await
            .map_err(|e| {
                Failure(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store_failed",
                    format!("the bot registry cannot be read: {e}"),
                    Some(Duration::from_secs(1)),
                )
            })?
            .ok_or_else(|| {
                Failure(
                    StatusCode::NOT_FOUND,
                    "not_found",
                    "the bot the file was sent to is no longer registered".into(),
                    None,
                )
            })?;
        let connector = self.inner.connectors.get(&spec.platform).ok_or_else(|| {
            Failure(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("{} is not built into this worker", spec.platform),
                None,
            )
        })?;
        let body = connector
            .fetch_file(&spec, source)
            .await
            .map_err(|e| platform_failure(&e))?;
        self.inner
            .metrics
            .count(FILES_SERVED_TOTAL, spec.platform, 1);
        Ok(body)
    }

    /// Every byte of `a`, a file `bot` was sent (at most `max`).
    ///
    /// # Errors
    /// Why it cannot be read.
    pub(crate) async fn read(
        &self,
        bot: &BotId,
        a: &Attachment,
        max: u64,
    ) -> Result<Vec<u8>, String> {
        let body = self.open(bot, &a.source).await.map_err(|f| f.2)?;
        body.read_all(max).await.map_err(|e| e.to_string())
    }

    /// The bytes of a file a handler asks `bot` to send, within `max` bytes: from `data`,
    /// from a file link of this fleet (read through the fleet), or downloaded from `url`.
    ///
    /// # Errors
    /// Why it cannot be sent (a reason for the action).
    pub(crate) async fn fetch_out(&self, f: &OutFile, max: u64) -> Result<Upload, String> {
        let (data, found_mime, found_name) = match (&f.data, &f.url) {
            (Some(_), Some(_)) => return Err("give `url` or `data`, not both".into()),
            (None, None) => return Err("an attachment needs a `url` or `data`".into()),
            (Some(d), None) => {
                // Base64 is 4 characters per 3 bytes: refuse before decoding a huge one.
                if (d.len() as u64).saturating_mul(3) / 4 > max.saturating_add(3) {
                    return Err(format!("`data` is over the {max}-byte bound of this mode"));
                }
                let engine = base64::engine::GeneralPurpose::new(
                    &base64::alphabet::STANDARD,
                    base64::engine::GeneralPurposeConfig::new()
                        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
                );
                let bytes = engine
                    .decode(d.trim())
                    .map_err(|e| format!("`data` is not base64: {e}"))?;
                (bytes, None, None)
            }
            (None, Some(url)) => self.download(url, max).await?,
        };
        if data.is_empty() {
            return Err("the file is empty".into());
        }
        if data.len() as u64 > max {
            return Err(format!(
                "the file is {} bytes, over the {max}-byte bound of this mode",
                data.len()
            ));
        }
        if let Some(m) = f.mime.as_deref().filter(|m| !is_mime(m)) {
            return Err(format!(
                "`mime` {:?} is not a MIME type (type/subtype)",
                m.chars().take(64).collect::<String>()
            ));
        }
        let mime = f
            .mime
            .clone()
            .or(found_mime.filter(|m| m != "application/octet-stream"))
            .or_else(|| f.name.as_deref().and_then(mime_of_name).map(str::to_owned))
            .unwrap_or_else(|| "application/octet-stream".into());
        let kind = f.kind.unwrap_or_else(|| AttachmentKind::of_mime(&mime));
        let name = f
            .name
            .clone()
            .or(found_name)
            .unwrap_or_else(|| format!("{}.{}", kind.as_str(), ext_of_mime(&mime)));
        Ok(Upload {
            kind,
            name,
            mime,
            data: data.into(),
        })
    }

    /// The bytes at `url` (a file link of this fleet, or `http(s)://`), with the type and
    /// name the source gives.
    async fn download(
        &self,
        url: &str,
        max: u64,
    ) -> Result<(Vec<u8>, Option<String>, Option<String>), String> {
        let own = format!("{}{FILES_PATH}", self.public_url());
        if let Some(id) = url.strip_prefix(&own) {
            let key = self.key().await.map_err(|e| e.to_string())?.to_vec();
            let claim = Self::verify_with(&key, id, botfleet_core::unix_ms() / 1000)
                .map_err(|r| format!("the file link is refused: {}", refusal_text(r)))?;
            let bot = BotId::new(&claim.b).map_err(|e| e.to_string())?;
            let body = self.open(&bot, &claim.s).await.map_err(|f| f.2)?;
            let bytes = body.read_all(max).await.map_err(|e| e.to_string())?;
            return Ok((bytes, claim.m, claim.n));
        }
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err("an attachment's `url` must be http:// or https://".into());
        }
        let resp = self
            .inner
            .http
            .get(url)
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .map_err(|e| {
                format!(
                    "the attachment's url cannot be fetched: {}",
                    e.without_url()
                )
            })?;
        if !resp.status().is_success() {
            return Err(format!(
                "the attachment's url answered {}",
                resp.status().as_u16()
            ));
        }
        let name = resp
            .url()
            .path_segments()
            .and_then(|mut s| s.next_back().map(str::to_owned))
            .filter(|n| n.contains('.') && n.len() <= 128);
        let body = FileBody::from_response(resp);
        let mime = body.mime.clone();
        let bytes = body
            .read_all(max)
            .await
            .map_err(|e| format!("the attachment's url: {e}"))?;
        Ok((bytes, mime, name))
    }
}

/// What a refusal says.
fn refusal_text(r: Refusal) -> &'static str {
    match r {
        Refusal::BadSignature => "its signature is not this fleet's",
        Refusal::Expired => "it has expired (ask for a new one: every event carries fresh links)",
    }
}

/// A platform's failure to serve a file, as an HTTP answer.
fn platform_failure(e: &PlatformError) -> Failure {
    let m = e.to_string();
    match e.kind() {
        ErrorKind::Rejected | ErrorKind::Malformed => {
            Failure(StatusCode::NOT_FOUND, "not_found", m, None)
        }
        ErrorKind::RateLimited(d) => {
            Failure(StatusCode::SERVICE_UNAVAILABLE, "rate_limited", m, Some(d))
        }
        ErrorKind::Credentials => Failure(StatusCode::BAD_GATEWAY, "platform_refused", m, None),
        _ => Failure(StatusCode::BAD_GATEWAY, "platform_failed", m, None),
    }
}

/// `GET /api/v1/files/{id}`.
async fn serve(State(files): State<Files>, Path(id): Path<String>) -> Response {
    let key = match files.key().await {
        Ok(k) => k.to_vec(),
        Err(e) => {
            warn!(error = %e, "cannot read the file-link key");
            return Failure(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_failed",
                "the file-link key cannot be read".into(),
                Some(Duration::from_secs(1)),
            )
            .into_response();
        }
    };
    let claim = match Files::verify_with(&key, &id, botfleet_core::unix_ms() / 1000) {
        Ok(c) => c,
        Err(r) => {
            files.inner.metrics.file_link_refused();
            let code = match r {
                Refusal::BadSignature => "bad_signature",
                Refusal::Expired => "expired",
            };
            return Failure(
                StatusCode::FORBIDDEN,
                code,
                format!("the file link is refused: {}", refusal_text(r)),
                None,
            )
            .into_response();
        }
    };
    let Ok(bot) = BotId::new(&claim.b) else {
        return Failure(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such bot".into(),
            None,
        )
        .into_response();
    };
    let mut body = match files.open(&bot, &claim.s).await {
        Ok(b) => b,
        Err(f) => {
            debug!(%bot, code = f.1, "a file link's file cannot be served");
            return f.into_response();
        }
    };
    let mime = claim
        .m
        .clone()
        .or(body.mime.take())
        .unwrap_or_else(|| "application/octet-stream".into());
    let mut r = Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, mime)
        .header(header::CACHE_CONTROL, "private, max-age=300")
        .header("x-content-type-options", "nosniff");
    if let Some(n) = body.len {
        r = r.header(header::CONTENT_LENGTH, n);
    }
    if let Some(name) = claim.n.as_deref().map(safe_name).filter(|n| !n.is_empty()) {
        r = r.header(
            header::CONTENT_DISPOSITION,
            format!("inline; filename=\"{name}\""),
        );
    }
    let stream = futures_util::stream::unfold(body, |mut b| async move {
        match b.chunk().await {
            Ok(Some(c)) => Some((Ok::<_, std::io::Error>(c), b)),
            Ok(None) => None,
            Err(e) => Some((Err(std::io::Error::other(e.to_string())), b)),
        }
    });
    r.body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// Whether `m` reads as a MIME type: `type/subtype`, then parameters, in token characters.
fn is_mime(m: &str) -> bool {
    let token = |s: &str| {
        !s.is_empty()
            && s.len() <= 127
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&^_.+-".contains(&b))
    };
    let essence = m.split(';').next().unwrap_or("").trim();
    matches!(essence.split_once('/'), Some((t, s)) if token(t) && token(s))
        && m.len() <= 255
        && m.bytes().all(|b| (0x20..0x7f).contains(&b))
}

/// A file name fit for a header: printable ASCII without quotes or backslashes.
fn safe_name(n: &str) -> String {
    n.chars()
        .filter(|c| c.is_ascii_graphic() || *c == ' ')
        .filter(|c| !matches!(c, '"' | '\\' | ';'))
        .take(128)
        .collect()
}

/// The MIME type a file name's extension suggests, for the common ones.
fn mime_of_name(name: &str) -> Option<&'static str> {
    let ext = name.rsplit_once('.')?.1.to_ascii_lowercase();
    TYPES.iter().find(|(e, _)| *e == ext).map(|(_, m)| *m)
}

/// An extension for a MIME type (`bin` when unknown).
fn ext_of_mime(mime: &str) -> &'static str {
    let m = mime.split(';').next().unwrap_or("").trim();
    TYPES
        .iter()
        .find(|(_, t)| t.eq_ignore_ascii_case(m))
        .map_or("bin", |(e, _)| *e)
}

/// Extensions and MIME types, the first of a type being its usual extension.
const TYPES: &[(&str, &str)] = &[
    ("jpg", "image/jpeg"),
    ("jpeg", "image/jpeg"),
    ("png", "image/png"),
    ("gif", "image/gif"),
    ("webp", "image/webp"),
    ("mp4", "video/mp4"),
    ("webm", "video/webm"),
    ("mp3", "audio/mpeg"),
    ("ogg", "audio/ogg"),
    ("oga", "audio/ogg"),
    ("m4a", "audio/mp4"),
    ("wav", "audio/wav"),
    ("pdf", "application/pdf"),
    ("txt", "text/plain"),
    ("csv", "text/csv"),
    ("json", "application/json"),
    ("zip", "application/zip"),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn files() -> Files {
        Files::new(
            Arc::new(botfleet_store::MemoryStore::new()),
            HashMap::new(),
            reqwest::Client::new(),
            Arc::new(Metrics::default()),
            "http://api.example:8080/".into(),
            Duration::from_secs(3600),
        )
    }

    #[test]
    fn links_verify_until_they_expire_and_not_when_altered() {
        let f = files();
        f.set_public_url("https://bots.example.com/");
        let bot = BotId::new("b1").unwrap();
        let a = Attachment::new(AttachmentKind::Image, "file-9").mime(Some("image/png"));
        let key = [7u8; 32];
        let url = f.link_with(&key, &bot, &a, 1_000);
        let id = url
            .strip_prefix("https://bots.example.com/api/v1/files/")
            .unwrap_or_else(|| panic!("{url}"));
        let c = Files::verify_with(&key, id, 1_000).unwrap();
        assert_eq!(
            (c.b.as_str(), c.s.as_str(), c.k),
            ("b1", "file-9", AttachmentKind::Image)
        );
        assert_eq!(Files::verify_with(&key, id, 1_000 + 3_600), Ok(c.clone()));
        assert_eq!(
            Files::verify_with(&key, id, 1_000 + 3_601),
            Err(Refusal::Expired)
        );
        assert_eq!(
            Files::verify_with(&[8u8; 32], id, 1_000),
            Err(Refusal::BadSignature),
            "another fleet's key"
        );
        // Another file under the same signature.
        let (payload, sig) = id.split_once('.').unwrap();
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let mut other = c.clone();
        other.s = "file-10".into();
        let forged = format!("{}.{sig}", b64.encode(serde_json::to_vec(&other).unwrap()));
        assert_ne!(payload, forged.split_once('.').unwrap().0);
        assert_eq!(
            Files::verify_with(&key, &forged, 1_000),
            Err(Refusal::BadSignature)
        );
        for junk in ["", ".", "abc", "a.b", "%%%.%%%"] {
            assert_eq!(
                Files::verify_with(&key, junk, 1_000),
                Err(Refusal::BadSignature),
                "{junk}"
            );
        }
    }

    #[tokio::test]
    async fn files_out_come_from_data_within_the_bound() {
        let f = files();
        let up = f
            .fetch_out(
                &OutFile {
                    data: Some("aGVsbG8".into()),
                    name: Some("hi.txt".into()),
                    ..OutFile::default()
                },
                100,
            )
            .await
            .unwrap();
        assert_eq!(&up.data[..], b"hello");
        assert_eq!(
            (up.kind, up.mime.as_str(), up.name.as_str()),
            (AttachmentKind::File, "text/plain", "hi.txt")
        );
        let png = f
            .fetch_out(
                &OutFile {
                    data: Some("iVBORw==".into()),
                    mime: Some("image/png".into()),
                    ..OutFile::default()
                },
                100,
            )
            .await
            .unwrap();
        assert_eq!(
            (png.kind, png.name.as_str()),
            (AttachmentKind::Image, "image.png")
        );
        for (bad, why) in [
            (OutFile::default(), "needs a `url` or `data`"),
            (
                OutFile {
                    data: Some("!!".into()),
                    ..OutFile::default()
                },
                "not base64",
            ),
            (
                OutFile {
                    data: Some("a".repeat(400)),
                    ..OutFile::default()
                },
                "bound",
            ),
            (
                OutFile {
                    url: Some("ftp://x/y".into()),
                    ..OutFile::default()
                },
                "http",
            ),
            (
                OutFile {
                    url: Some("http://127.0.0.1:1/none".into()),
                    ..OutFile::default()
                },
                "cannot be fetched",
            ),
        ] {
            let e = f.fetch_out(&bad, 100).await.unwrap_err();
            assert!(e.contains(why), "{e}");
        }
    }

    #[tokio::test]
    async fn the_route_refuses_expired_and_forged_links_and_says_which() {
        let f = files();
        let key = f.link_key().await.unwrap();
        assert_eq!(f.link_key().await.unwrap(), key, "made once");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        f.set_public_url(&format!("http://{addr}"));
        let app = f.router();
        let task = tokio::spawn(async move { axum::serve(listener, app).await });
        let bot = BotId::new("b1").unwrap();
        let a = Attachment::new(AttachmentKind::File, "x");
        let now = botfleet_core::unix_ms() / 1000;
        let answer = |url: String| async move {
            let r = reqwest::get(url).await.unwrap();
            let status = r.status().as_u16();
            let v: serde_json::Value = r.json().await.unwrap();
            (status, v["code"].as_str().unwrap_or_default().to_owned())
        };
        assert_eq!(
            answer(f.link_with(&key, &bot, &a, now - 7_200)).await,
            (403, "expired".into())
        );
        assert_eq!(
            answer(f.link_with(&[0; 32], &bot, &a, now)).await,
            (403, "bad_signature".into())
        );
        assert_eq!(
            answer(f.link_with(&key, &bot, &a, now)).await,
            (404, "not_found".into()),
            "a good link of a bot no longer registered"
        );
        assert!(f
            .inner
            .metrics
            .render("w")
            .contains("botfleet_file_links_refused_total{worker_id=\"w\"} 2"));
        task.abort();
    }

    #[test]
    fn mime_types_are_told_from_junk() {
        for ok in [
            "image/png",
            "application/vnd.ms-excel",
            "text/plain; charset=utf-8",
        ] {
            assert!(is_mime(ok), "{ok}");
        }
        for bad in ["", "png", "image/", "/png", "a b/c", "image/png\n", "é/x"] {
            assert!(!is_mime(bad), "{bad:?}");
        }
    }

    #[test]
    fn names_and_types_go_together() {
        assert_eq!(mime_of_name("Report.PDF"), Some("application/pdf"));
        assert_eq!(mime_of_name("noext"), None);
        assert_eq!(ext_of_mime("image/jpeg"), "jpg");
        assert_eq!(ext_of_mime("application/x-unknown"), "bin");
        assert_eq!(safe_name("a\"b\\c;d é.txt"), "abcd .txt");
    }
}
