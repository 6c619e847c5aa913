//! What a Cloud API delivery holds: its signature (`X-Hub-Signature-256`) and its text
//! messages, normalised.

use botfleet_core::{
    ActionEvent, Attachment, AttachmentKind, BotId, ChatKey, EventKind, Inbound, Platform,
};
use botfleet_platform::Received;
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;

/// `sha256=<hex of HMAC-SHA256(app_secret, body)>`, as Meta signs deliveries
/// (`X-Hub-Signature-256`).
pub fn sign(app_secret: &str, body: &[u8]) -> String {
    let mut out = String::from("sha256=");
    if let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(app_secret.as_bytes()) {
        mac.update(body);
        for b in mac.finalize().into_bytes() {
            out.push_str(&format!("{b:02x}"));
        }
    }
    out
}

/// What one delivery holds for a bot, see [`parse_delivery`].
#[derive(Debug, Default)]
pub struct Delivery {
    /// Text, media and taps, in the order sent.
    pub messages: Vec<Received>,
    /// The users (their numbers, once each) who wrote something else — a location, a
    /// contact, a reaction, a message that could not be read — or called, and when (unix ms:
    /// the message's own time, never later than now). Not handled, but it renews the user's
    /// 24-hour window as any message does.
    pub seen: Vec<(String, i64)>,
    /// Changes of kinds the bot does not handle (statuses, other fields, reactions, another
    /// number of the same app).
    pub ignored: usize,
    /// What could not be read.
    pub malformed: usize,
}

/// What one delivery holds for `bot` (whose number is `phone_number_id`, when known): text,
/// media (by their media id) and taps on buttons and list rows (keyed by their `wamid`), who
/// wrote something the bot does not handle, how many changes were of kinds the bot does not
/// handle (statuses, other fields, reactions, another number of the same app), and how many
/// could not be read.
pub fn parse_delivery(bot: &BotId, phone_number_id: Option<&str>, body: &[u8]) -> Delivery {
    let mut d = Delivery::default();
    let now = botfleet_core::unix_ms();
    // When a message or call was made (its `timestamp`, seconds), never later than now.
    let when = |m: &Value| {
        m["timestamp"]
            .as_str()
            .and_then(|t| t.parse::<i64>().ok())
            .map_or(now, |s| s.saturating_mul(1000).min(now))
    };
    let Ok(doc) = serde_json::from_slice::<Value>(body) else {
        d.malformed = 1;
        return d;
    };
    let Some(entries) = doc["entry"].as_array() else {
        d.malformed = 1;
        return d;
    };
    for entry in entries {
        for change in entry["changes"].as_array().into_iter().flatten() {
            let calls = change["field"] == "calls";
            if change["field"] != "messages" && !calls {
                d.ignored += 1;
                continue;
            }
            let value = &change["value"];
            // One app's subscription carries every number of it: only this bot's count.
            let number = value["metadata"]["phone_number_id"].as_str();
            if let (Some(mine), Some(got)) = (phone_number_id, number) {
                if mine != got {
                    d.ignored += 1;
                    continue;
                }
            }
            if calls {
                // A user's call (Calling API) opens the window as a message does.
                for c in value["calls"].as_array().into_iter().flatten() {
                    d.ignored += 1;
                    if c["direction"] != "BUSINESS_INITIATED" {
                        d.saw(c["from"].as_str(), when(c));
                    }
                }
                continue;
            }
            d.ignored += value["statuses"].as_array().map_or(0, Vec::len);
            for m in value["messages"].as_array().into_iter().flatten() {
                let (Some(id), Some(from)) = (m["id"].as_str(), m["from"].as_str()) else {
                    d.malformed += 1;
                    d.saw(m["from"].as_str(), when(m));
                    continue;
                };
                let sent_at_ms = m["timestamp"]
                    .as_str()
                    .and_then(|t| t.parse::<i64>().ok())
                    .map(|s| s.saturating_mul(1000));
                let at = |text: &str| {
                    Inbound::message(
                        Platform::Whatsapp,
                        ChatKey::new(bot.clone(), from.to_owned()),
                        id,
                        Some(from.to_owned()),
                        text,
                        sent_at_ms,
                    )
                };
                let message = match m["type"].as_str() {
                    Some("text") => match m["text"]["body"].as_str() {
                        Some(text) => at(text),
                        None => {
                            d.malformed += 1;
                            d.saw(Some(from), when(m));
                            continue;
                        }
                    },
                    Some(t @ ("image" | "audio" | "video" | "document" | "sticker")) => {
                        match media_of(t, &m[t]) {
                            Some(a) => {
                                let mut ev = at(m[t]["caption"].as_str().unwrap_or_default());
                                ev.attachments = vec![a];
                                ev
                            }
                            None => {
                                d.malformed += 1;
                                d.saw(Some(from), when(m));
                                continue;
                            }
                        }
                    }
                    Some("interactive" | "button") => match reply_of(m) {
                        Some((reply, title, on)) => {
                            let mut ev = at(title);
                            ev.kind = EventKind::Action;
                            ev.action = Some(Box::new(ActionEvent {
                                id: reply.to_owned(),
                                value: reply.to_owned(),
                                message_ref: None,
                                message_id: Some(on.to_owned()),
                            }));
                            ev
                        }
                        None => {
                            d.malformed += 1;
                            d.saw(Some(from), when(m));
                            continue;
                        }
                    },
                    _ => {
                        d.ignored += 1;
                        d.saw(Some(from), when(m));
                        continue;
                    }
                };
                d.messages.push(Received {
                    key: id.to_owned(),
                    message,
                });
            }
        }
    }
    // Once per user, at the latest time.
    d.seen.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    d.seen.dedup_by(|a, b| a.0 == b.0);
    d
}

impl Delivery {
    /// The user `from` (when named) wrote or called at `at`.
    fn saw(&mut self, from: Option<&str>, at: i64) {
        if let Some(f) = from.filter(|f| !f.is_empty()) {
            self.seen.push((f.to_owned(), at));
        }
    }
}

/// A media message's file (`image`, `audio`, `video`, `document`, `sticker`), by its media
/// id: a voice note is `audio` with `voice: true`.
fn media_of(t: &str, v: &Value) -> Option<Attachment> {
    let id = v["id"]
        .as_str()
        .filter(|s| !s.is_empty() && !s.contains('/'))?;
    let kind = match t {
        "image" => AttachmentKind::Image,
        "video" => AttachmentKind::Video,
        "audio" if v["voice"] == true => AttachmentKind::Voice,
        "audio" => AttachmentKind::Audio,
        "sticker" => AttachmentKind::Sticker,
        _ => AttachmentKind::File,
    };
    Some(
        Attachment::new(kind, id)
            .mime(v["mime_type"].as_str())
            .name(v["filename"].as_str()),
    )
}

/// A tap on a reply button or a list row (`interactive` `button_reply`/`list_reply`, or a
/// template's quick reply, `button`): (its id, its title, the message that carried it).
fn reply_of(m: &Value) -> Option<(&str, &str, &str)> {
    let on = m["context"]["id"].as_str().filter(|s| !s.is_empty())?;
    let (id, title) = if m["type"] == "button" {
        (
            m["button"]["payload"].as_str()?,
            m["button"]["text"].as_str()?,
        )
    } else {
        let i = &m["interactive"];
        let r = match i["type"].as_str()? {
            "button_reply" => &i["button_reply"],
            "list_reply" => &i["list_reply"],
            _ => return None,
        };
        (r["id"].as_str()?, r["title"].as_str().unwrap_or_default())
    };
    (!id.is_empty()).then_some((id, title, on))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_button_tap_is_an_action_on_its_message() {
        let body = serde_json::to_vec(&serde_json::json!({"entry": [{"changes": [{"field": "messages", "value": {
            "metadata": {"phone_number_id": "P1"},
            "messages": [
                {"from": "4915", "id": "wamid.T", "type": "interactive", "context": {"id": "wamid.out.1"},
                 "interactive": {"type": "button_reply", "button_reply": {"id": "yes", "title": "Yes"}}},
                {"from": "4915", "id": "wamid.L", "type": "interactive", "context": {"id": "wamid.out.2"},
                 "interactive": {"type": "list_reply", "list_reply": {"id": "row-2", "title": "Two"}}},
                {"from": "4915", "id": "wamid.Q", "type": "button", "context": {"id": "wamid.out.3"},
                 "button": {"payload": "stop", "text": "Stop"}},
                {"from": "4915", "id": "wamid.X", "type": "interactive",
                 "interactive": {"type": "button_reply", "button_reply": {"id": "yes"}}}
            ]}}]}]})).unwrap();
        let d = parse_delivery(&BotId::new("b").unwrap(), Some("P1"), &body);
        let got = d.messages;
        assert_eq!(
            (got.len(), d.ignored, d.malformed),
            (3, 0, 1),
            "one without its message is malformed"
        );
        let who: Vec<&str> = d.seen.iter().map(|s| s.0.as_str()).collect();
        assert_eq!(who, ["4915"], "who wrote it is seen");
        let a = got[0].message.action.as_deref().unwrap();
        assert_eq!(got[0].message.kind, botfleet_core::EventKind::Action);
        assert_eq!(
            (a.value.as_str(), a.message_id.as_deref()),
            ("yes", Some("wamid.out.1"))
        );
        assert_eq!(got[0].message.text, "Yes");
        assert_eq!(got[1].message.action.as_deref().unwrap().value, "row-2");
        assert_eq!(got[2].message.action.as_deref().unwrap().value, "stop");
    }

    #[test]
    fn parses_text_messages_and_skips_the_rest() {
        let bot = BotId::new("wa").unwrap();
        let body = serde_json::json!({
            "object": "whatsapp_business_account",
            "entry": [{"id": "1", "changes": [
                {"field": "messages", "value": {
                    "messaging_product": "whatsapp",
                    "metadata": {"phone_number_id": "123"},
                    "messages": [
                        {"from": "4915", "id": "wamid.A", "timestamp": "1700000000", "type": "text", "text": {"body": "hi"}},
                        {"from": "4915", "id": "wamid.B", "type": "image", "image": {}},
                        {"from": "4916", "id": "wamid.R", "timestamp": "1700000100", "type": "reaction", "reaction": {"emoji": "x"}},
                        {"from": "4917", "id": "wamid.L", "type": "location", "location": {"latitude": 52.5, "longitude": 13.4}},
                        {"from": "4917", "id": "wamid.K", "type": "contacts", "contacts": []},
                        {"id": "wamid.C", "type": "text", "text": {"body": "no sender"}}
                    ],
                    "statuses": [{"id": "wamid.X", "status": "delivered"}]
                }},
                {"field": "account_update", "value": {}},
                {"field": "calls", "value": {
                    "metadata": {"phone_number_id": "123"},
                    "calls": [
                        {"id": "c1", "from": "4918", "direction": "USER_INITIATED", "event": "connect", "timestamp": "1700000200"},
                        {"id": "c2", "from": "4919", "direction": "BUSINESS_INITIATED", "event": "connect"},
                        {"id": "c3", "from": "", "event": "connect"}
                    ]
                }}
            ]}]
        });
        let d = parse_delivery(&bot, Some("123"), body.to_string().as_bytes());
        let (msgs, ignored, malformed) = (d.messages, d.ignored, d.malformed);
        assert_eq!(msgs.len(), 1);
        assert_eq!(msgs[0].key, "wamid.A");
        assert_eq!(msgs[0].message.chat.chat, "4915");
        assert_eq!(msgs[0].message.text, "hi");
        assert_eq!(msgs[0].message.sent_at_ms, Some(1_700_000_000_000));
        assert_eq!(
            (ignored, malformed),
            (8, 2),
            "an image without its media id is malformed"
        );
        let now = botfleet_core::unix_ms();
        let who: Vec<&str> = d.seen.iter().map(|s| s.0.as_str()).collect();
        assert_eq!(
            who,
            ["4915", "4916", "4917", "4918"],
            "who wrote what is not handled or called, once each: the window's renewal"
        );
        assert_eq!(d.seen[1].1, 1_700_000_100_000, "at the message's time");
        assert_eq!(d.seen[3].1, 1_700_000_200_000, "at the call's time");
        assert!(
            d.seen[2].1 > now - 60_000 && d.seen[2].1 <= now,
            "no time: when it came"
        );
        assert_eq!(parse_delivery(&bot, None, b"not json").malformed, 1);
        assert_eq!(parse_delivery(&bot, None, b"{}").malformed, 1);
        // Another number of the same app: not this bot's.
        let d = parse_delivery(&bot, Some("999"), body.to_string().as_bytes());
        assert!(d.messages.is_empty() && d.seen.is_empty());
        assert_eq!(d.ignored, 3);
    }

    #[test]
    fn media_come_in_as_attachments_by_their_media_id() {
        let body = serde_json::json!({"entry": [{"changes": [{"field": "messages", "value": {
        "metadata": {"phone_number_id": "P1"},
        "messages": [
            {"from": "4915", "id": "wamid.I", "type": "image",
             "image": {"id": "m1", "mime_type": "image/jpeg", "sha256": "x", "caption": "look"}},
            {"from": "4915", "id": "wamid.V", "type": "audio",
             "audio": {"id": "m2", "mime_type": "audio/ogg; codecs=opus", "voice": true}},
            {"from": "4915", "id": "wamid.D", "type": "document",
             "document": {"id": "m3", "mime_type": "application/pdf", "filename": "a.pdf"}},
            {"from": "4915", "id": "wamid.S", "type": "sticker", "sticker": {"id": "m4", "mime_type": "image/webp"}},
        ]}}]}]});
        let d = parse_delivery(
            &BotId::new("b").unwrap(),
            Some("P1"),
            body.to_string().as_bytes(),
        );
        let got = d.messages;
        assert_eq!((got.len(), d.ignored, d.malformed), (4, 0, 0));
        assert!(d.seen.is_empty());
        let a = &got[0].message.attachments[0];
        assert_eq!(
            (a.kind, a.source.as_str(), got[0].message.text.as_str()),
            (AttachmentKind::Image, "m1", "look")
        );
        let kinds: Vec<_> = got.iter().map(|r| r.message.attachments[0].kind).collect();
        assert_eq!(
            kinds,
            [
                AttachmentKind::Image,
                AttachmentKind::Voice,
                AttachmentKind::File,
                AttachmentKind::Sticker
            ]
        );
        assert_eq!(got[2].message.attachments[0].name.as_deref(), Some("a.pdf"));
    }

    #[test]
    fn signatures_follow_the_known_vector() {
        // RFC 4231 test case 2.
        assert_eq!(
            sign("Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
