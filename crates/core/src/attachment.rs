//! Files: what comes with an event ([`Attachment`]), what a handler asks to send
//! ([`OutFile`]), and what a platform is given to upload once the fleet has the bytes
//! ([`Upload`]).

use serde::{Deserialize, Serialize};

/// What a file is, as a handler sees it (and may say when it sends one).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttachmentKind {
    /// A picture (Telegram's photo, an `image/*` file).
    Image,
    /// A video (Telegram's video, video note and animation).
    Video,
    /// A sound file or a song.
    Audio,
    /// A voice note recorded in the app.
    Voice,
    /// Any other file (a document).
    #[default]
    File,
    /// A sticker.
    Sticker,
}

impl AttachmentKind {
    /// Every kind, in a fixed order.
    pub const ALL: [AttachmentKind; 6] = [
        AttachmentKind::Image,
        AttachmentKind::Video,
        AttachmentKind::Audio,
        AttachmentKind::Voice,
        AttachmentKind::File,
        AttachmentKind::Sticker,
    ];

    /// Its name on the wire (`image`, `video`, `audio`, `voice`, `file`, `sticker`).
    pub fn as_str(self) -> &'static str {
        match self {
            AttachmentKind::Image => "image",
            AttachmentKind::Video => "video",
            AttachmentKind::Audio => "audio",
            AttachmentKind::Voice => "voice",
            AttachmentKind::File => "file",
            AttachmentKind::Sticker => "sticker",
        }
    }

    /// The kind a MIME type suggests: `image/*` an image, `video/*` a video, `audio/*` audio,
    /// anything else a file.
    pub fn of_mime(mime: &str) -> Self {
        let top = mime.split('/').next().unwrap_or("").trim();
        match top.to_ascii_lowercase().as_str() {
            "image" => AttachmentKind::Image,
            "video" => AttachmentKind::Video,
            "audio" => AttachmentKind::Audio,
            _ => AttachmentKind::File,
        }
    }
}

/// A file that came with an event: a photo, a voice note, a document… A handler reads its
/// bytes at `url` (a link to any worker's `GET /api/v1/files/{id}`, signed and expiring, so
/// it needs no platform token), or through the Rust handler's turn context.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Attachment {
    /// What it is.
    pub kind: AttachmentKind,
    /// Its MIME type, when the platform says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime: Option<String>,
    /// Its size in bytes, when the platform says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Its file name, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A signed link that serves its bytes, made for each turn (absent in the journal).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub url: String,
    /// What the platform calls the file (Telegram's `file_id`, Slack's `url_private`, a
    /// media id): journaled with the event, never shown to a handler.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
}

impl Attachment {
    /// A file the platform calls `source`.
    pub fn new(kind: AttachmentKind, source: impl Into<String>) -> Self {
        Self {
            kind,
            mime: None,
            size: None,
            name: None,
            url: String::new(),
            source: source.into(),
        }
    }

    /// With its MIME type, when given and not empty.
    #[must_use]
    pub fn mime(mut self, mime: Option<&str>) -> Self {
        self.mime = mime.filter(|m| !m.is_empty()).map(str::to_owned);
        self
    }

    /// With its size, when given.
    #[must_use]
    pub fn size(mut self, size: Option<u64>) -> Self {
        self.size = size;
        self
    }

    /// With its file name, when given and not empty.
    #[must_use]
    pub fn name(mut self, name: Option<&str>) -> Self {
        self.name = name.filter(|n| !n.is_empty()).map(str::to_owned);
        self
    }
}

/// A file a handler asks to send with a `send` action: the bytes come from `url` (which
/// the worker downloads; a file link of the fleet's own is read through the fleet) or
/// `data` (base64), one of the two.
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct OutFile {
    /// What to send it as; by default what its MIME type suggests (a file otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<AttachmentKind>,
    /// Where the worker fetches the bytes (`http://` or `https://`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The bytes, base64 (standard alphabet, padding optional).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// The file name shown (by default one made from the kind).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its MIME type (by default what the download says, else `application/octet-stream`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime: Option<String>,
}

/// A file ready to upload: its bytes, with a kind, a name and a MIME type settled.
#[derive(Clone, PartialEq, Eq)]
pub struct Upload {
    /// What it is sent as.
    pub kind: AttachmentKind,
    /// The file name.
    pub name: String,
    /// The MIME type.
    pub mime: String,
    /// The bytes, shared: every attempt of the upload (and every platform call) reads the
    /// same copy.
    pub data: bytes::Bytes,
}

impl std::fmt::Debug for Upload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the bytes: files are megabytes.
        f.debug_struct("Upload")
            .field("kind", &self.kind)
            .field("name", &self.name)
            .field("mime", &self.mime)
            .field("len", &self.data.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kinds_follow_mime_types_and_keep_their_wire_names() {
        assert_eq!(AttachmentKind::of_mime("image/png"), AttachmentKind::Image);
        assert_eq!(AttachmentKind::of_mime("VIDEO/mp4"), AttachmentKind::Video);
        assert_eq!(AttachmentKind::of_mime("audio/ogg"), AttachmentKind::Audio);
        assert_eq!(
            AttachmentKind::of_mime("application/pdf"),
            AttachmentKind::File
        );
        assert_eq!(AttachmentKind::of_mime(""), AttachmentKind::File);
        for k in AttachmentKind::ALL {
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
        }
    }

    #[test]
    fn an_attachment_keeps_its_source_apart_and_files_out_read_from_json() {
        let a = Attachment::new(AttachmentKind::Image, "file-1")
            .mime(Some("image/jpeg"))
            .size(Some(12))
            .name(Some(""));
        let v = serde_json::to_value(&a).unwrap();
        assert_eq!(
            v,
            json!({"kind": "image", "mime": "image/jpeg", "size": 12, "source": "file-1"})
        );
        let back: Attachment = serde_json::from_value(v).unwrap();
        assert_eq!(back, a);
        let f: OutFile =
            serde_json::from_value(json!({"data": "aGk=", "name": "hi.txt", "extra": 1})).unwrap();
        assert_eq!(
            (f.kind, f.data.as_deref(), f.name.as_deref()),
            (None, Some("aGk="), Some("hi.txt"))
        );
        assert!(serde_json::from_value::<OutFile>(json!({"kind": "hologram"})).is_err());
        let u = Upload {
            kind: AttachmentKind::File,
            name: "a".into(),
            mime: "text/plain".into(),
            data: vec![7; 1000].into(),
        };
        let shown = format!("{u:?}");
        assert!(
            shown.contains("len: 1000") && !shown.contains("7, 7"),
            "{shown}"
        );
    }
}
