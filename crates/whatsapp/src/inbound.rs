//! What a Cloud API delivery holds: its signature (`X-Hub-Signature-256`) and its text
//! messages, normalised.

use botfleet_core::{BotId, ChatKey, Inbound, Platform};
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

/// What one delivery holds for `bot` (whose number is `phone_number_id`, when known): text
/// messages (keyed by their `wamid`), how many changes were of kinds the bot does not handle
/// (statuses, other fields, media, another number of the same app), and how many could not
/// be read.
pub fn parse_delivery(
    bot: &BotId,
    phone_number_id: Option<&str>,
    body: &[u8],
) -> (Vec<Received>, usize, usize) {
    let Ok(doc) = serde_json::from_slice::<Value>(body) else {
        return (Vec::new(), 0, 1);
    };
    let (mut out, mut ignored, mut malformed) = (Vec::new(), 0, 0);
    let Some(entries) = doc["entry"].as_array() else {
        return (out, 0, 1);
    };
    for entry in entries {
        for change in entry["changes"].as_array().into_iter().flatten() {
            if change["field"] != "messages" {
                ignored += 1;
                continue;
            }
            let value = &change["value"];
            // One app's subscription carries every number of it: only this bot's count.
            let number = value["metadata"]["phone_number_id"].as_str();
            if let (Some(mine), Some(got)) = (phone_number_id, number) {
                if mine != got {
                    ignored += 1;
                    continue;
                }
            }
            ignored += value["statuses"].as_array().map_or(0, Vec::len);
            for m in value["messages"].as_array().into_iter().flatten() {
                let (Some(id), Some(from)) = (m["id"].as_str(), m["from"].as_str()) else {
                    malformed += 1;
                    continue;
                };
                if m["type"] != "text" {
                    ignored += 1;
                    continue;
                }
                let Some(text) = m["text"]["body"].as_str() else {
                    malformed += 1;
                    continue;
                };
                let sent_at_ms = m["timestamp"]
                    .as_str()
                    .and_then(|t| t.parse::<i64>().ok())
                    .map(|s| s.saturating_mul(1000));
                out.push(Received {
                    key: id.to_owned(),
                    message: Inbound::message(
                        Platform::Whatsapp,
                        ChatKey::new(bot.clone(), from.to_owned()),
                        id,
                        Some(from.to_owned()),
                        text,
                        sent_at_ms,
                    ),
                });
            }
        }
    }
    (out, ignored, malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

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
                        {"id": "wamid.C", "type": "text", "text": {"body": "no sender"}}
                    ],
                    "statuses": [{"id": "wamid.X", "status": "delivered"}]
                }},
                {"field": "account_update", "value": {}}
            ]}]
        });
        let (msgs, ignored, malformed) =
            parse_delivery(&bot, Some("123"), body.to_string().as_bytes());
        assert_eq!(msgs.len(), 1);
        assert_eq!(msgs[0].key, "wamid.A");
        assert_eq!(msgs[0].message.chat.chat, "4915");
        assert_eq!(msgs[0].message.text, "hi");
        assert_eq!(msgs[0].message.sent_at_ms, Some(1_700_000_000_000));
        assert_eq!((ignored, malformed), (3, 1));
        assert_eq!(parse_delivery(&bot, None, b"not json").2, 1);
        assert_eq!(parse_delivery(&bot, None, b"{}").2, 1);
        // Another number of the same app: not this bot's.
        let (msgs, ignored, _) = parse_delivery(&bot, Some("999"), body.to_string().as_bytes());
        assert!(msgs.is_empty());
        assert_eq!(ignored, 2);
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
