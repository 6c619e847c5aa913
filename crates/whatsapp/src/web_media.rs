//! Files of device-link bots. WhatsApp media are end-to-end encrypted: a message carries the
//! references (the CDN's direct path, the media key, both hashes, the length), the CDN holds
//! the ciphertext. What the fleet keeps of an incoming file is those references (as the
//! attachment's `source`, never shown to a handler), so any worker can download and decrypt it
//! later without the bot's session; a file a handler sends is encrypted and uploaded by the
//! bot's client, then sent as a media message.

use std::sync::Arc;

use base64::{engine::general_purpose::STANDARD, Engine as _};
use botfleet_core::{Attachment, AttachmentKind, Upload};
use botfleet_platform::{ErrorKind, FileBody, PlatformError};
use serde::{Deserialize, Serialize};
use whatsapp_rust::{
    download::MediaDownloader,
    wacore::download::{Downloadable, MediaHost, MediaRoute, MediaType},
    waproto::whatsapp as wa,
    Client, TokioRuntime, UploadOptions,
};

/// The largest incoming file downloaded (WhatsApp's own bound for documents is 2 GB; the
/// download is held in memory while it is decrypted).
pub(crate) const MAX_IN_BYTES: u64 = 100 * 1024 * 1024;

/// A media message's references, as the attachment's `source` keeps them.
#[derive(Serialize, Deserialize)]
struct Refs {
    /// The media type: `image`, `video`, `audio`, `document` or `sticker` (the keys are
    /// derived per type).
    t: String,
    /// The direct path on the CDN.
    p: String,
    /// The media key, base64.
    k: String,
    /// SHA-256 of the ciphertext, base64 (the CDN's token).
    e: String,
    /// SHA-256 of the plaintext, base64.
    s: String,
    /// The plaintext's length.
    n: u64,
    /// The CDN host the message's URL names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    h: Option<String>,
    /// The MIME type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    m: Option<String>,
}

/// Decoded references, ready for a download.
struct Media {
    kind: MediaType,
    direct_path: String,
    media_key: Vec<u8>,
    enc_sha256: Vec<u8>,
    sha256: Vec<u8>,
    len: u64,
}

impl Downloadable for Media {
    fn direct_path(&self) -> Option<&str> {
        Some(&self.direct_path)
    }
    fn media_key(&self) -> Option<&[u8]> {
        Some(&self.media_key)
    }
    fn file_enc_sha256(&self) -> Option<&[u8]> {
        Some(&self.enc_sha256)
    }
    fn file_sha256(&self) -> Option<&[u8]> {
        Some(&self.sha256)
    }
    fn file_length(&self) -> Option<u64> {
        Some(self.len)
    }
    fn app_info(&self) -> MediaType {
        self.kind
    }
}

/// The fields every media message has.
struct Fields<'a> {
    url: Option<&'a str>,
    direct_path: Option<&'a str>,
    media_key: Option<&'a [u8]>,
    enc_sha256: Option<&'a [u8]>,
    sha256: Option<&'a [u8]>,
    len: Option<u64>,
    mime: Option<&'a str>,
}

macro_rules! fields {
    ($m:expr) => {
        Fields {
            url: $m.url.as_deref(),
            direct_path: $m.direct_path.as_deref(),
            media_key: $m.media_key.as_deref(),
            enc_sha256: $m.file_enc_sha256.as_deref(),
            sha256: $m.file_sha256.as_deref(),
            len: $m.file_length,
            mime: $m.mimetype.as_deref(),
        }
    };
}

/// The file a message carries (`m` unwrapped of its device-sent and ephemeral wrappers); `None`
/// for a message without one, or with references missing.
pub(crate) fn attachment(m: &wa::Message) -> Option<Attachment> {
    let (kind, t, f, name) = if let Some(i) = m.image_message.as_option() {
        (AttachmentKind::Image, "image", fields!(i), None)
    } else if let Some(v) = m.video_message.as_option() {
        (AttachmentKind::Video, "video", fields!(v), None)
    } else if let Some(a) = m.audio_message.as_option() {
        let kind = if a.ptt == Some(true) {
            AttachmentKind::Voice
        } else {
            AttachmentKind::Audio
        };
        (kind, "audio", fields!(a), None)
    } else if let Some(s) = m.sticker_message.as_option() {
        (AttachmentKind::Sticker, "sticker", fields!(s), None)
    } else if let Some(d) = m.document_message.as_option() {
        (
            AttachmentKind::File,
            "document",
            fields!(d),
            d.file_name.as_deref(),
        )
    } else {
        return None;
    };
    let refs = Refs {
        t: t.to_owned(),
        p: f.direct_path.filter(|p| p.starts_with('/'))?.to_owned(),
        k: STANDARD.encode(f.media_key.filter(|k| k.len() == 32)?),
        e: STANDARD.encode(f.enc_sha256.filter(|h| h.len() == 32)?),
        s: STANDARD.encode(f.sha256.filter(|h| h.len() == 32)?),
        n: f.len?,
        h: f.url.and_then(host_of),
        m: f.mime.filter(|m| !m.is_empty()).map(str::to_owned),
    };
    let source = serde_json::to_string(&refs).ok()?;
    Some(
        Attachment::new(kind, source)
            .mime(f.mime)
            .size(Some(refs.n))
            .name(name),
    )
}

/// The host (`host[:port]`) of an `https://` URL.
fn host_of(url: &str) -> Option<String> {
    let rest = url.strip_prefix("https://")?;
    let host = rest.split(['/', '?', '#']).next()?;
    (!host.is_empty()).then(|| host.to_owned())
}

fn media_type(t: &str) -> Option<MediaType> {
    Some(match t {
        "image" => MediaType::Image,
        "video" => MediaType::Video,
        "audio" => MediaType::Audio,
        "document" => MediaType::Document,
        "sticker" => MediaType::Sticker,
        _ => return None,
    })
}

fn bad_source() -> PlatformError {
    PlatformError::new(
        ErrorKind::Rejected,
        "not_found",
        "not a file of a WhatsApp device-link bot",
    )
}

/// Downloads and decrypts the file `source` names (see [`attachment`]), with no session: from
/// WhatsApp's CDN hosts (a build that links the test stand-in: from the loopback host the
/// message named).
pub(crate) async fn fetch(
    http: Arc<dyn whatsapp_rust::http::HttpClient>,
    source: &str,
) -> Result<FileBody, PlatformError> {
    let refs: Refs = serde_json::from_str(source).map_err(|_| bad_source())?;
    let key = |b64: &str| STANDARD.decode(b64).ok().filter(|k| k.len() == 32);
    let media = Media {
        kind: media_type(&refs.t).ok_or_else(bad_source)?,
        direct_path: refs.p.clone(),
        media_key: key(&refs.k).ok_or_else(bad_source)?,
        enc_sha256: key(&refs.e).ok_or_else(bad_source)?,
        sha256: key(&refs.s).ok_or_else(bad_source)?,
        len: refs.n,
    };
    if media.len > MAX_IN_BYTES {
        return Err(botfleet_platform::too_large(media.len, MAX_IN_BYTES));
    }
    let route = match refs.h {
        // Only a build that links the stand-in downloads from where a message says: a
        // contact's message must not point the fleet's workers at hosts of its choosing.
        Some(h)
            if crate::device::skips_server_certificate()
                && crate::device::is_loopback(&format!("https://{h}/")) =>
        {
            MediaRoute::unauthenticated(vec![MediaHost::new(h)])
        }
        _ => MediaRoute::default_hosts(),
    };
    let downloader = MediaDownloader::new(http, Arc::new(TokioRuntime), route);
    let data = downloader.download(&media).await.map_err(|e| {
        use whatsapp_rust::download::MediaDownloadError as E;
        match e {
            E::ReferenceRejected(_) => PlatformError::new(
                ErrorKind::Rejected,
                "not_found",
                "WhatsApp's CDN no longer serves this file (its reference expired)",
            ),
            other => PlatformError::new(
                ErrorKind::Transient,
                "download",
                format!("the file could not be downloaded from WhatsApp: {other}"),
            ),
        }
    })?;
    Ok(FileBody::from_bytes(data, refs.m))
}

/// Whether WhatsApp shows a caption with a file of `kind`.
pub(crate) fn has_caption(kind: AttachmentKind) -> bool {
    matches!(
        kind,
        AttachmentKind::Image | AttachmentKind::Video | AttachmentKind::File
    )
}

/// Encrypts and uploads `f` through the bot's client: the media message that carries it
/// (with `caption` where its kind shows one).
pub(crate) async fn upload(
    client: &Client,
    f: &Upload,
    caption: Option<&str>,
) -> Result<wa::Message, PlatformError> {
    use whatsapp_rust::buffa::MessageField;
    let t = match f.kind {
        AttachmentKind::Image => MediaType::Image,
        AttachmentKind::Video => MediaType::Video,
        AttachmentKind::Audio | AttachmentKind::Voice => MediaType::Audio,
        AttachmentKind::Sticker => MediaType::Sticker,
        AttachmentKind::File => MediaType::Document,
    };
    let up = client
        .upload(f.data.to_vec(), t, UploadOptions::new())
        .await
        .map_err(|e| {
            PlatformError::new(
                ErrorKind::Transient,
                "upload_failed",
                format!("WhatsApp did not take the file {:?}: {e}", f.name),
            )
        })?;
    let caption = caption.filter(|c| !c.is_empty()).map(str::to_owned);
    let mime = Some(f.mime.clone());
    let mut m = wa::Message::default();
    macro_rules! refs {
        ($ty:ident { $($field:ident: $value:expr),* $(,)? }) => {
            wa::message::$ty {
                url: Some(up.url.clone()),
                direct_path: Some(up.direct_path.clone()),
                media_key: Some(up.media_key.to_vec()),
                file_sha256: Some(up.file_sha256.to_vec()),
                file_enc_sha256: Some(up.file_enc_sha256.to_vec()),
                file_length: Some(up.file_length),
                media_key_timestamp: Some(up.media_key_timestamp),
                mimetype: mime,
                $($field: $value,)*
                ..Default::default()
            }
        };
    }
    match f.kind {
        AttachmentKind::Image => {
            m.image_message = MessageField::some(refs!(ImageMessage { caption: caption }));
        }
        AttachmentKind::Video => {
            m.video_message = MessageField::some(refs!(VideoMessage { caption: caption }));
        }
        AttachmentKind::Audio | AttachmentKind::Voice => {
            let ptt = Some(f.kind == AttachmentKind::Voice);
            m.audio_message = MessageField::some(refs!(AudioMessage { ptt: ptt }));
        }
        AttachmentKind::Sticker => {
            m.sticker_message = MessageField::some(refs!(StickerMessage {}));
        }
        AttachmentKind::File => {
            m.document_message = MessageField::some(refs!(DocumentMessage {
                caption: caption,
                file_name: Some(f.name.clone()),
                title: Some(f.name.clone()),
            }));
        }
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(url: Option<&str>) -> wa::Message {
        wa::Message {
            image_message: whatsapp_rust::buffa::MessageField::some(wa::message::ImageMessage {
                url: url.map(str::to_owned),
                direct_path: Some("/v/t62/1".into()),
                media_key: Some(vec![1; 32]),
                file_sha256: Some(vec![2; 32]),
                file_enc_sha256: Some(vec![3; 32]),
                file_length: Some(1234),
                mimetype: Some("image/jpeg".into()),
                caption: Some("look".into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_media_message_keeps_its_references_as_the_source() {
        let a = attachment(&image(Some("https://mmg.whatsapp.net/v/t62/1?oh=x"))).unwrap();
        assert_eq!(a.kind, AttachmentKind::Image);
        assert_eq!(a.mime.as_deref(), Some("image/jpeg"));
        assert_eq!(a.size, Some(1234));
        let refs: Refs = serde_json::from_str(&a.source).unwrap();
        assert_eq!(refs.t, "image");
        assert_eq!(refs.p, "/v/t62/1");
        assert_eq!(STANDARD.decode(&refs.k).unwrap(), vec![1; 32]);
        assert_eq!(refs.h.as_deref(), Some("mmg.whatsapp.net"));
        assert_eq!(refs.n, 1234);
        // Without its URL the CDN hosts are WhatsApp's; without its key it is no file.
        assert!(attachment(&image(None)).is_some());
        let mut m = image(None);
        if let Some(i) = m.image_message.as_option_mut() {
            i.media_key = None;
        }
        assert!(attachment(&m).is_none());
        assert!(attachment(&wa::Message::default()).is_none());
    }

    #[test]
    fn a_voice_note_and_a_document_say_what_they_are() {
        use whatsapp_rust::buffa::MessageField;
        let m = wa::Message {
            audio_message: MessageField::some(wa::message::AudioMessage {
                direct_path: Some("/v/a".into()),
                media_key: Some(vec![1; 32]),
                file_sha256: Some(vec![2; 32]),
                file_enc_sha256: Some(vec![3; 32]),
                file_length: Some(9),
                ptt: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(attachment(&m).unwrap().kind, AttachmentKind::Voice);
        let d = wa::Message {
            document_message: MessageField::some(wa::message::DocumentMessage {
                direct_path: Some("/v/d".into()),
                media_key: Some(vec![1; 32]),
                file_sha256: Some(vec![2; 32]),
                file_enc_sha256: Some(vec![3; 32]),
                file_length: Some(9),
                file_name: Some("report.pdf".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let a = attachment(&d).unwrap();
        assert_eq!(a.kind, AttachmentKind::File);
        assert_eq!(a.name.as_deref(), Some("report.pdf"));
    }

    /// Generated media messages: every field present or not, of any length; what is read has
    /// references a download can use, and nothing panics.
    #[test]
    fn generated_media_messages_are_read_or_skipped() {
        use botfleet_testkit::SeededRng;
        use whatsapp_rust::buffa::MessageField;
        let mut rng = SeededRng::new(900);
        let bytes = |rng: &mut SeededRng| -> Option<Vec<u8>> {
            rng.chance(850).then(|| {
                let len = if rng.chance(850) { 32 } else { rng.below(70) };
                (0..len).map(|_| rng.below(256) as u8).collect()
            })
        };
        let strings = [
            "",
            "/v/t62/1",
            "v/no-slash",
            "https://",
            "https:///x",
            "https://mmg.whatsapp.net/v/t62/1?oh=x",
            "http://127.0.0.1:1/x",
            "\u{0}\u{ffff}/\u{1F600}",
            "/",
        ];
        let (mut read, mut skipped) = (0, 0);
        for _ in 0..3_000 {
            let pick = |rng: &mut SeededRng| -> Option<String> {
                rng.chance(850)
                    .then(|| strings[rng.below(strings.len() as u64) as usize].to_owned())
            };
            let path = if rng.chance(600) {
                Some(format!("/v/{}", rng.next_u64()))
            } else {
                pick(&mut rng)
            };
            let (url, mime) = (pick(&mut rng), pick(&mut rng));
            let (key, enc, sha) = (bytes(&mut rng), bytes(&mut rng), bytes(&mut rng));
            let len = rng.chance(850).then(|| rng.next_u64() >> rng.below(64));
            let mut m = wa::Message::default();
            macro_rules! fill {
                ($field:ident, $ty:ident $(, $extra:ident: $val:expr)*) => {
                    m.$field = MessageField::some(wa::message::$ty {
                        url,
                        direct_path: path,
                        media_key: key,
                        file_sha256: sha,
                        file_enc_sha256: enc,
                        file_length: len,
                        mimetype: mime,
                        $($extra: $val,)*
                        ..Default::default()
                    })
                };
            }
            match rng.below(6) {
                0 => fill!(image_message, ImageMessage),
                1 => fill!(video_message, VideoMessage),
                2 => fill!(audio_message, AudioMessage, ptt: rng.chance(500).then_some(true)),
                3 => fill!(sticker_message, StickerMessage),
                4 => fill!(document_message, DocumentMessage, file_name: pick(&mut rng)),
                _ => {}
            }
            let Some(a) = attachment(&m) else {
                skipped += 1;
                continue;
            };
            read += 1;
            let refs: Refs = serde_json::from_str(&a.source).unwrap();
            assert!(refs.p.starts_with('/') && media_type(&refs.t).is_some());
            for k in [&refs.k, &refs.e, &refs.s] {
                assert_eq!(STANDARD.decode(k).unwrap().len(), 32);
            }
            assert!(refs.h.as_deref().is_none_or(|h| !h.is_empty()));
            assert_eq!(a.size, Some(refs.n));
            assert!(a.url.is_empty(), "a link is the fleet's to make");
        }
        assert!(
            read >= 300 && skipped >= 300,
            "read {read}, skipped {skipped}"
        );
    }

    /// Mutated sources (as a stored event could hold after any corruption): each is refused or
    /// tried against the CDN, never a panic.
    #[tokio::test]
    async fn mutated_sources_are_refused_or_tried() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        struct Down(AtomicUsize);
        #[async_trait::async_trait]
        impl whatsapp_rust::http::HttpClient for Down {
            async fn execute(
                &self,
                _: whatsapp_rust::http::HttpRequest,
            ) -> whatsapp_rust::anyhow::Result<whatsapp_rust::http::HttpResponse> {
                self.0.fetch_add(1, Ordering::Relaxed);
                Err(whatsapp_rust::anyhow::anyhow!("the CDN is unreachable"))
            }
        }
        let http = Arc::new(Down(AtomicUsize::new(0)));
        let source = attachment(&image(Some("https://mmg.whatsapp.net/v/t62/1")))
            .unwrap()
            .source;
        let base: serde_json::Value = serde_json::from_str(&source).unwrap();
        let (mut refused, mut tried) = (0, 0);
        for v in botfleet_testkit::mutate::mutations(&base, 901, 3_000) {
            match fetch(http.clone(), &v.to_string()).await {
                Err(e) if e.kind() == ErrorKind::Rejected => refused += 1,
                Err(_) => tried += 1,
                Ok(_) => panic!("no CDN answered, yet {v} was read"),
            }
        }
        assert!(
            refused >= 300 && tried >= 100,
            "refused {refused}, tried {tried}"
        );
        assert!(http.0.load(Ordering::Relaxed) >= tried);
    }

    #[tokio::test]
    async fn a_source_that_is_not_ours_is_refused_before_any_download() {
        struct Never;
        #[async_trait::async_trait]
        impl whatsapp_rust::http::HttpClient for Never {
            async fn execute(
                &self,
                _: whatsapp_rust::http::HttpRequest,
            ) -> whatsapp_rust::anyhow::Result<whatsapp_rust::http::HttpResponse> {
                panic!("no download for a bad source")
            }
        }
        for bad in [
            "",
            "AgACAgIAAxkBAAI",
            r#"{"t":"image","p":"/x","k":"AA==","e":"AA==","s":"AA==","n":1}"#,
            r#"{"t":"gif","p":"/x","k":"","e":"","s":"","n":1}"#,
        ] {
            let e = fetch(Arc::new(Never), bad).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Rejected, "{bad}");
        }
        let huge = attachment(&image(None))
            .unwrap()
            .source
            .replace("1234", "999999999999");
        let e = fetch(Arc::new(Never), &huge).await.unwrap_err();
        assert!(e.to_string().contains("bound"), "{e}");
    }
}
