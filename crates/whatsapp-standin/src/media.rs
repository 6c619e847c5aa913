//! Media: the CDN (plain HTTP on a port of its own, which the `media_conn` answer names as
//! the upload and download host), contacts sending photos and documents (encrypted as a phone
//! encrypts media: AES-256-CBC and HMAC under keys from a random media key, uploaded, and the
//! message carrying the references), and what linked devices send, read back on the contact's
//! side.

use std::{collections::HashMap, sync::Arc};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
};
use wacore::download::{DownloadUtils, MediaType};
use waproto::whatsapp as wa;

use super::Hub;

/// A file as a contact sends it or reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MediaFile {
    /// `image`, `video`, `audio`, `voice`, `document` or `sticker`.
    pub kind: String,
    /// Its MIME type.
    pub mime: Option<String>,
    /// Its file name (documents).
    pub name: Option<String>,
    /// Its caption.
    pub caption: Option<String>,
    /// The bytes, in the clear.
    pub data: Vec<u8>,
}

/// The ciphertexts the CDN holds, by direct path.
#[derive(Default)]
pub(crate) struct MediaStore {
    /// The CDN's `host:port`, as `media_conn` names it.
    pub(crate) host: String,
    blobs: HashMap<String, Vec<u8>>,
    /// Downloads served, by direct path.
    pub(crate) downloads: HashMap<String, usize>,
    next: u64,
}

impl MediaStore {
    /// Keeps `ciphertext`; answers its direct path.
    fn put(&mut self, ciphertext: Vec<u8>) -> String {
        self.next += 1;
        let path = format!("/v/t62.7118-24/{}", 10_000 + self.next);
        self.blobs.insert(path.clone(), ciphertext);
        path
    }
}

fn media_type(kind: &str) -> MediaType {
    match kind {
        "image" => MediaType::Image,
        "video" => MediaType::Video,
        "audio" | "voice" => MediaType::Audio,
        "sticker" => MediaType::Sticker,
        _ => MediaType::Document,
    }
}

/// The references every media message carries.
struct Refs {
    url: String,
    direct_path: String,
    media_key: Vec<u8>,
    file_sha256: Vec<u8>,
    file_enc_sha256: Vec<u8>,
    file_length: u64,
}

/// A message of `file`'s kind carrying `r`.
fn message_of(file: &MediaFile, r: Refs) -> wa::Message {
    use waproto::buffa::MessageField;
    // Every media message has the same six references and a MIME type; the kinds differ
    // only in their extra fields.
    macro_rules! media {
        ($ty:ident { $($extra:ident: $value:expr),* }) => {
            MessageField::some(wa::message::$ty {
                url: Some(r.url),
                direct_path: Some(r.direct_path),
                media_key: Some(r.media_key),
                file_sha256: Some(r.file_sha256),
                file_enc_sha256: Some(r.file_enc_sha256),
                file_length: Some(r.file_length),
                mimetype: file.mime.clone(),
                $($extra: $value,)*
                ..Default::default()
            })
        };
    }
    let caption = file.caption.clone();
    let mut m = wa::Message::default();
    match file.kind.as_str() {
        "image" => m.image_message = media!(ImageMessage { caption: caption }),
        "video" => m.video_message = media!(VideoMessage { caption: caption }),
        "audio" | "voice" => {
            m.audio_message = media!(AudioMessage {
                ptt: Some(file.kind == "voice")
            });
        }
        "sticker" => m.sticker_message = media!(StickerMessage {}),
        _ => {
            m.document_message = media!(DocumentMessage {
                file_name: file.name.clone(),
                caption: caption
            });
        }
    }
    m
}

/// The media of a message a linked device sent: its kind, type, name, caption, direct path
/// and media key.
fn refs_of(m: &wa::Message) -> Option<(MediaFile, String, Vec<u8>)> {
    let file = |kind: &str,
                mime: &Option<String>,
                name: Option<&String>,
                caption: Option<&String>| MediaFile {
        kind: kind.to_owned(),
        mime: mime.clone(),
        name: name.cloned(),
        caption: caption.cloned(),
        data: Vec::new(),
    };
    if let Some(i) = m.image_message.as_option() {
        return Some((
            file("image", &i.mimetype, None, i.caption.as_ref()),
            i.direct_path.clone()?,
            i.media_key.clone()?,
        ));
    }
    if let Some(v) = m.video_message.as_option() {
        return Some((
            file("video", &v.mimetype, None, v.caption.as_ref()),
            v.direct_path.clone()?,
            v.media_key.clone()?,
        ));
    }
    if let Some(a) = m.audio_message.as_option() {
        let kind = if a.ptt == Some(true) {
            "voice"
        } else {
            "audio"
        };
        return Some((
            file(kind, &a.mimetype, None, None),
            a.direct_path.clone()?,
            a.media_key.clone()?,
        ));
    }
    if let Some(s) = m.sticker_message.as_option() {
        return Some((
            file("sticker", &s.mimetype, None, None),
            s.direct_path.clone()?,
            s.media_key.clone()?,
        ));
    }
    let d = m.document_message.as_option()?;
    Some((
        file(
            "document",
            &d.mimetype,
            d.file_name.as_ref(),
            d.caption.as_ref(),
        ),
        d.direct_path.clone()?,
        d.media_key.clone()?,
    ))
}

impl MediaStore {
    /// `file`, encrypted and put on the CDN as a contact's phone uploads it: the message that
    /// carries it.
    pub(crate) fn message(&mut self, file: &MediaFile) -> Result<wa::Message, String> {
        let mt = media_type(&file.kind);
        let enc = wacore::upload::encrypt_media(&file.data, mt).map_err(|e| e.to_string())?;
        let path = self.put(enc.data_to_upload);
        let url = format!("https://{}{path}?oh=standin", self.host);
        Ok(message_of(
            file,
            Refs {
                url,
                direct_path: path,
                media_key: enc.media_key.to_vec(),
                file_sha256: enc.file_sha256.to_vec(),
                file_enc_sha256: enc.file_enc_sha256.to_vec(),
                file_length: file.data.len() as u64,
            },
        ))
    }

    /// The file a linked device sent in `m`, taken from the CDN and decrypted as the
    /// contact's phone would; `None` for a message without media.
    pub(crate) fn read(&self, m: &wa::Message) -> Option<Result<MediaFile, String>> {
        let (mut file, path, key) = refs_of(m)?;
        let Some(blob) = self.blobs.get(&path) else {
            return Some(Err(format!("no upload at {path}")));
        };
        Some(
            DownloadUtils::decrypt_stream(&blob[..], &key, media_type(&file.kind))
                .map(|data| {
                    file.data = data;
                    file
                })
                .map_err(|e| e.to_string()),
        )
    }
}

/// Serves the CDN until the stand-in is dropped: `POST /mms/{type}/{token}` uploads (a
/// `resume=1` check answers that nothing is there yet), `GET {direct path}` downloads. One
/// request per connection.
pub(crate) async fn serve(listener: TcpListener, hub: Arc<Hub>) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => if let Ok((tcp, _)) = accepted {
                conns.spawn(request(tcp, hub.clone()));
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// The largest upload taken.
const MAX_BODY: usize = 100 * 1024 * 1024;

async fn request(mut tcp: TcpStream, hub: Arc<Hub>) {
    let mut buf = Vec::with_capacity(4096);
    let head_end = loop {
        let mut chunk = [0u8; 4096];
        match tcp.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > 64 * 1024 {
            return;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.lines();
    let first: Vec<&str> = lines.next().unwrap_or_default().split(' ').collect();
    let (method, target) = (
        first.first().copied().unwrap_or(""),
        first.get(1).copied().unwrap_or(""),
    );
    let length: usize = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0);
    if length > MAX_BODY {
        let _ = respond(&mut tcp, 413, "text/plain", b"too large").await;
        return;
    }
    let mut body = buf[head_end..].to_vec();
    while body.len() < length {
        let mut chunk = vec![0u8; (length - body.len()).min(1 << 16)];
        match tcp.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let answer = match method {
        "POST" if path.starts_with("/mms/") && query.contains("resume=1") => {
            (200, "application/json", b"{}".to_vec())
        }
        "POST" if path.starts_with("/mms/") && !body.is_empty() => {
            let mut state = hub.lock();
            let direct = state.media.put(body);
            let url = format!("https://{}{direct}?oh=standin", state.media.host);
            let json = format!(r#"{{"url":"{url}","direct_path":"{direct}"}}"#);
            (200, "application/json", json.into_bytes())
        }
        "GET" => {
            let mut state = hub.lock();
            let found = state.media.blobs.get(path).cloned();
            match found {
                Some(blob) => {
                    *state.media.downloads.entry(path.to_owned()).or_default() += 1;
                    (200, "application/octet-stream", blob)
                }
                None => (404, "text/plain", b"not found".to_vec()),
            }
        }
        _ => (400, "text/plain", b"bad request".to_vec()),
    };
    let _ = respond(&mut tcp, answer.0, answer.1, &answer.2).await;
}

async fn respond(tcp: &mut TcpStream, status: u16, ct: &str, body: &[u8]) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        413 => "Payload Too Large",
        _ => "Bad Request",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: {ct}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await?;
    tcp.write_all(body).await?;
    tcp.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_contact_sends_reads_back_as_it_was() {
        let mut store = MediaStore {
            host: "127.0.0.1:9".into(),
            ..MediaStore::default()
        };
        for kind in ["image", "video", "audio", "voice", "document", "sticker"] {
            let file = MediaFile {
                kind: kind.into(),
                mime: Some("application/octet-stream".into()),
                name: (kind == "document").then(|| "a.bin".to_owned()),
                caption: None,
                data: (0..70_000u32).map(|i| (i % 251) as u8).collect(),
            };
            let m = store.message(&file).unwrap();
            let back = store.read(&m).expect("a media message").unwrap();
            assert_eq!(back, file, "{kind}");
        }
        // Keys are per media type: the ciphertext of an image does not open as a document.
        let file = MediaFile {
            kind: "image".into(),
            mime: None,
            name: None,
            caption: Some("look".into()),
            data: b"not really a picture".to_vec(),
        };
        let mut m = store.message(&file).unwrap();
        let image = m.image_message.take().unwrap();
        m.document_message = waproto::buffa::MessageField::some(wa::message::DocumentMessage {
            direct_path: image.direct_path.clone(),
            media_key: image.media_key.clone(),
            ..Default::default()
        });
        assert!(store.read(&m).unwrap().is_err());
        assert!(store.read(&wa::Message::default()).is_none());
    }
}
