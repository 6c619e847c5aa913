//! The suite's file cases: files in (a link that serves the bytes on any worker) and files out
//! (bytes from `data`, from a URL, from a file link of the fleet's own), with reasons for
//! what cannot go.

use std::time::Duration;

use base64::Engine;
use botfleet_core::AttachmentKind;
use serde_json::{json, Value};

use super::{answered_by, caps_of, shown_on_the_bot, PlatformFixture};
use crate::wait_for;

/// A file a bot uploaded, as its platform's fake received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileOut {
    /// Its chat.
    pub chat: u32,
    /// The upload's file name, when the platform keeps one.
    pub name: Option<String>,
    /// Its bytes.
    pub data: Vec<u8>,
    /// The text that went with it (its caption), when any.
    pub caption: Option<String>,
}

/// Bytes of every value, longer than one read of a socket.
fn sample(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ salt)
        .collect()
}

/// `GET url`: (status, content type, body).
async fn get(url: &str) -> (u16, String, Vec<u8>) {
    let r = reqwest::Client::new()
        .get(url)
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .expect("the file link answers");
    let status = r.status().as_u16();
    let ct = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (status, ct, r.bytes().await.expect("a body").to_vec())
}

/// Files in, where the platform's mode has them: a photo with a caption reaches the handler
/// as an attachment (its kind, its size when the platform says, a link, never the platform's
/// reference to it) with the caption as the text; the link serves the same bytes with the
/// file's type, from the worker that made it and from another; a link altered in any way is
/// refused (403) and reaches no platform.
pub async fn a_photo_in_has_a_link_that_serves_its_bytes<F: PlatformFixture>(f: &F) {
    let mut bot = f.bot(0);
    let caps = caps_of(f, &bot);
    let handler = crate::ScriptedHandler::start(|ev: &Value| {
        let n = ev["attachments"].as_array().map_or(0, Vec::len);
        json!({ "text": format!("{n} files: {}", ev["text"].as_str().unwrap_or("")) })
    })
    .await;
    let (h, a) = answered_by(f, &mut bot, handler.url()).await;
    let photo = sample(70_000, 5);
    if !f.user_sends_file(
        0,
        1,
        AttachmentKind::Image,
        "photo.jpg",
        "image/jpeg",
        photo.clone(),
        "look",
    ) {
        assert!(!caps.files, "a mode with files takes them in");
        a.shutdown().await;
        return;
    }
    let b = h.start("b");
    super::until_sent(f, 0, "1 files: look", Duration::from_secs(20)).await;
    let ev = handler.first_with_attachments();
    assert_eq!(ev["kind"], "message");
    let att = &ev["attachments"][0];
    assert_eq!(att["kind"], "image", "{att}");
    assert!(
        att.get("source").is_none(),
        "the platform's reference stays: {att}"
    );
    if let Some(size) = att["size"].as_u64() {
        assert_eq!(size, photo.len() as u64, "{att}");
    }
    let url = att["url"].as_str().expect("a link").to_owned();
    // Made by whichever worker held the turn (the join may have moved the bot).
    let (maker, other) = if url.starts_with(&a.api_url) {
        (&a, &b)
    } else {
        (&b, &a)
    };
    let path = url
        .strip_prefix(&maker.api_url)
        .unwrap_or_else(|| panic!("{url} is on neither worker's API"))
        .to_owned();
    assert!(path.starts_with("/api/v1/files/"), "{path}");
    let (status, ct, body) = get(&url).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert!(
        body == photo,
        "the same bytes ({} of {})",
        body.len(),
        photo.len()
    );
    assert!(ct.starts_with("image/"), "{ct}");
    let (status, _, body) = get(&format!("{}{path}", other.api_url)).await;
    assert_eq!(status, 200, "another worker serves it too");
    assert!(body == photo);
    let served = f.file_downloads(0);
    for bad in [
        format!("{path}x"),
        path.replacen("/files/", "/files/A", 1),
        path[..path.len() - 2].to_owned(),
    ] {
        let (status, _, body) = get(&format!("{}{bad}", maker.api_url)).await;
        assert_eq!(status, 403, "{bad}");
        let v: Value = serde_json::from_slice(&body).unwrap_or_default();
        assert_eq!(v["code"], "bad_signature", "{v}");
    }
    assert_eq!(
        f.file_downloads(0),
        served,
        "a refused link reaches no platform"
    );
    let shown = maker.metrics.render("m");
    assert!(
        shown.contains("botfleet_file_links_refused_total{worker_id=\"m\"} 3"),
        "{shown}"
    );
    drop(h);
    b.shutdown().await;
    a.shutdown().await;
}

/// Files out, where the platform's mode has them: a send with a file from `data` and one from
/// a URL reaches the platform with both files' bytes and the text; a file a user sent is
/// sent back through its own link (read through the fleet); more files than the mode takes,
/// an unreachable URL and bad base64 are refused with reasons shown on the bot, and the
/// reply's other actions still run. A mode without files refuses them with a reason.
pub async fn files_out_reach_the_platform<F: PlatformFixture>(f: &F) {
    let mut bot = f.bot(0);
    let caps = caps_of(f, &bot);
    let (a_bytes, b_bytes) = (sample(3_000, 1), sample(90_000, 2));
    let (served, server) = crate::hooks::serve_bytes(b_bytes.clone(), "application/pdf").await;
    let b64 = base64::engine::general_purpose::STANDARD;
    let a_data = b64.encode(&a_bytes);
    let too_many = usize::from(caps.max_files) + 1;
    let handler = crate::ScriptedHandler::start(move |ev: &Value| match ev["text"].as_str() {
        Some("files please") => json!({"actions": [
            {"type": "send", "text": "two files", "attachments": [
                {"data": a_data, "name": "a.txt", "mime": "text/plain"},
                {"url": format!("{served}/report.pdf")},
            ]},
        ]}),
        Some("bad files") => json!({"actions": [
            {"type": "send", "text": "many", "attachments": vec![json!({"data": "aGk="}); too_many]},
            {"type": "send", "text": "gone", "attachments": [{"url": "http://127.0.0.1:1/gone.png"}]},
            {"type": "send", "text": "junk", "attachments": [{"data": "!!!"}]},
            {"type": "send", "text": "after the refusals"},
        ]}),
        _ => match ev["attachments"][0]["url"].as_str() {
            Some(url) => json!({"actions": [
                {"type": "send", "text": "yours back", "attachments": [{"url": url, "name": "back.jpg"}]},
            ]}),
            None => json!({}),
        },
    })
    .await;
    let (h, w) = answered_by(f, &mut bot, handler.url()).await;
    f.user_writes(0, 1, "files please");
    if !caps.files {
        let why = shown_on_the_bot(&h, &bot, "caps.files").await;
        assert!(why.contains("no files"), "{why}");
        w.shutdown().await;
        server.abort();
        return;
    }
    let two = wait_for("both files sent", Duration::from_secs(20), || async {
        let sent = f.files_sent(0);
        (sent.len() >= 2).then_some(sent)
    })
    .await;
    assert_eq!(two.len(), 2, "{two:?}");
    assert!(
        two[0].data == a_bytes && two[1].data == b_bytes,
        "the bytes as given"
    );
    assert!(two.iter().all(|s| s.chat == 1));
    if let Some(n) = &two[0].name {
        assert_eq!(n, "a.txt");
    }
    if let Some(n) = &two[1].name {
        assert_eq!(n, "report.pdf", "a URL's file keeps its name");
    }
    let texts: Vec<String> = f.sent(0).into_iter().map(|(_, t)| t).collect();
    let captions: Vec<&str> = two.iter().filter_map(|s| s.caption.as_deref()).collect();
    assert!(
        texts.iter().any(|t| t == "two files") || captions.contains(&"two files"),
        "the text goes with the files: {texts:?} {captions:?}"
    );
    let photo = sample(20_000, 9);
    if f.user_sends_file(
        0,
        1,
        AttachmentKind::Image,
        "p.jpg",
        "image/jpeg",
        photo.clone(),
        "",
    ) {
        let back = wait_for("the photo sent back", Duration::from_secs(20), || async {
            f.files_sent(0).into_iter().nth(2)
        })
        .await;
        assert!(
            back.data == photo,
            "a file link of the fleet's own is read through it"
        );
    }
    f.user_writes(0, 1, "bad files");
    super::until_sent(f, 0, "after the refusals", Duration::from_secs(20)).await;
    let why = shown_on_the_bot(&h, &bot, "caps.max_files").await;
    assert!(
        why.contains("cannot be fetched") && why.contains("not base64"),
        "{why}"
    );
    let texts: Vec<String> = f.sent(0).into_iter().map(|(_, t)| t).collect();
    for refused in ["many", "gone", "junk"] {
        assert!(
            !texts.iter().any(|t| t == refused),
            "{refused} was refused: {texts:?}"
        );
    }
    w.shutdown().await;
    server.abort();
}
