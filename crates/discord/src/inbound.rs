//! `MESSAGE_CREATE` and `MESSAGE_UPDATE` dispatches as normalized events.

use botfleet_core::{Attachment, AttachmentKind, BotId, ChatKey, EventKind, Inbound, Platform};
use botfleet_platform::Received;
use serde_json::Value;

/// A message from a dispatch's `d`: `Ok(None)` for messages the bot does not answer (its own,
/// other bots', webhooks'), `Err` for a dispatch that cannot be read.
pub fn parse_message(bot: &BotId, d: &Value, me: &str) -> Result<Option<Received>, String> {
    let id = d["id"].as_str().ok_or("message without id")?;
    let channel = d["channel_id"]
        .as_str()
        .ok_or("message without channel_id")?;
    let author = &d["author"];
    let author_id = author["id"].as_str().ok_or("message without author")?;
    if id.is_empty() || channel.is_empty() || author_id.is_empty() {
        return Err("message with an empty id, channel_id or author".into());
    }
    if author["bot"].as_bool() == Some(true) || author_id == me || d["webhook_id"].is_string() {
        return Ok(None);
    }
    let sent_at_ms = id
        .parse::<u64>()
        .ok()
        // A snowflake's top 42 bits are milliseconds since 2015-01-01.
        .map(|s| i64::try_from((s >> 22) + 1_420_070_400_000).unwrap_or(0));
    let mut message = Inbound::message(
        Platform::Discord,
        ChatKey::new(bot.clone(), channel),
        id,
        Some(author_id.to_owned()),
        d["content"].as_str().unwrap_or_default(),
        sent_at_ms,
    );
    message.attachments = attachments(d);
    Ok(Some(Received {
        key: id.to_owned(),
        message,
    }))
}

/// A message's flag saying it is a voice message.
const IS_VOICE_MESSAGE: u64 = 1 << 13;

/// A message's `attachments` (their CDN `url`; a voice message's one file is a voice note)
/// and `sticker_items` (a sticker's image on Discord's media host; Lottie stickers, which are
/// not images, are left out).
fn attachments(d: &Value) -> Vec<Attachment> {
    let voice = d["flags"]
        .as_u64()
        .is_some_and(|f| f & IS_VOICE_MESSAGE != 0);
    let mut out: Vec<Attachment> = d["attachments"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| {
            let url = a["url"]
                .as_str()
                .filter(|u| u.starts_with("https://") || u.starts_with("http://"))?;
            let mime = a["content_type"].as_str();
            let kind = match mime.map(AttachmentKind::of_mime) {
                _ if voice => AttachmentKind::Voice,
                Some(k) => k,
                None => AttachmentKind::File,
            };
            Some(
                Attachment::new(kind, url)
                    .mime(mime)
                    .size(a["size"].as_u64())
                    .name(a["filename"].as_str()),
            )
        })
        .collect();
    for s in d["sticker_items"].as_array().into_iter().flatten() {
        let (Some(id), Some(format)) = (s["id"].as_str(), s["format_type"].as_u64()) else {
            continue;
        };
        let (ext, mime) = match format {
            1 | 2 => ("png", "image/png"),
            4 => ("gif", "image/gif"),
            _ => continue,
        };
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        out.push(
            Attachment::new(
                AttachmentKind::Sticker,
                format!("https://media.discordapp.net/stickers/{id}.{ext}"),
            )
            .mime(Some(mime))
            .name(s["name"].as_str()),
        );
    }
    out
}

/// An edit older than this (by its `edited_timestamp`) is not taken for a new one.
const EDIT_MAX_AGE_S: i64 = 300;

/// Unix seconds of an ISO 8601 UTC time as Discord writes them
/// (`2026-12-02T10:00:00.123456+00:00`); `None` when unreadable.
fn unix_s(ts: &str) -> Option<i64> {
    let b = ts.as_bytes();
    let seps = [(4, b'-'), (7, b'-'), (10, b'T'), (13, b':'), (16, b':')];
    if b.len() < 19 || seps.iter().any(|(i, c)| b[*i] != *c) {
        return None;
    }
    let num = |from: usize, to: usize| -> Option<i64> {
        let part = ts.get(from..to)?;
        part.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    let (y, mo, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (h, mi, s) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    // Days since 1970-01-01 of a proleptic Gregorian date (eras of 400 years).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((mo + 9) % 12) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + h * 3_600 + mi * 60 + s)
}

/// The ISO 8601 UTC time Discord writes for unix `ms` (the fake's `edited_timestamp`).
#[cfg(any(test, feature = "fake"))]
pub fn iso_of_unix_ms(ms: i64) -> String {
    let (y, m, d, h, mi, s, milli) = botfleet_core::utc_of_unix_ms(ms);
    let us = milli * 1_000;
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{us:06}+00:00")
}

/// An edit from a `MESSAGE_UPDATE` dispatch: `Ok(None)` for updates that are not a person
/// changing the text (an embed resolved, a pin: no new `edited_timestamp` or no content; the
/// bot's own, other bots' and webhooks' messages). Each edit is an event of its own, keyed by
/// the message and the edit's time; `message_id` stays the edited message's (replies refer to
/// it).
pub fn parse_edit(bot: &BotId, d: &Value, me: &str) -> Result<Option<Received>, String> {
    let (Some(edited_at), Some(_)) = (d["edited_timestamp"].as_str(), d["content"].as_str()) else {
        return Ok(None);
    };
    // A pin or a thread made on a message edited long ago carries that old edit's time: not
    // an edit now (its event left the journal long ago; it would be answered again).
    let now_s = botfleet_core::unix_ms() / 1000;
    if unix_s(edited_at).is_none_or(|t| now_s - t > EDIT_MAX_AGE_S) {
        return Ok(None);
    }
    if d["author"].is_null() {
        return Ok(None);
    }
    let Some(mut r) = parse_message(bot, d, me)? else {
        return Ok(None);
    };
    r.key = format!("{}:edit:{edited_at}", r.key);
    r.message.kind = EventKind::Edited;
    r.message.edited_message_id = Some(r.message.message_id.clone());
    r.message.sent_at_ms = None;
    Ok(Some(r))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn attachments_stickers_and_voice_messages_come_in_as_files() {
        let bot = BotId::new("d").unwrap();
        let m = json!({"id": "11", "channel_id": "42", "author": {"id": "9"}, "content": "pics",
            "attachments": [
                {"id": "1", "filename": "a.png", "content_type": "image/png", "size": 10,
                 "url": "https://cdn.discordapp.com/attachments/42/1/a.png?ex=1&is=2&hm=3"},
                {"id": "2", "filename": "b.bin", "size": 3},
                {"id": "3", "filename": "x", "url": 7},
            ],
            "sticker_items": [{"id": "555", "name": "wave", "format_type": 1},
                              {"id": "556", "name": "lottie", "format_type": 3}]});
        let r = parse_message(&bot, &m, "1").unwrap().unwrap().message;
        let kinds: Vec<_> = r.attachments.iter().map(|a| a.kind).collect();
        assert_eq!(
            kinds,
            [AttachmentKind::Image, AttachmentKind::Sticker],
            "{:?}",
            r.attachments
        );
        assert!(r.attachments[0]
            .source
            .starts_with("https://cdn.discordapp.com/"));
        assert_eq!(
            r.attachments[1].source,
            "https://media.discordapp.net/stickers/555.png"
        );
        let v = json!({"id": "12", "channel_id": "42", "author": {"id": "9"}, "content": "",
            "flags": 8192, "attachments": [{"id": "1", "filename": "voice-message.ogg",
            "content_type": "audio/ogg", "duration_secs": 2.5, "waveform": "AAA=",
            "url": "https://cdn.discordapp.com/attachments/42/1/voice-message.ogg"}]});
        let r = parse_message(&bot, &v, "1").unwrap().unwrap().message;
        assert_eq!(r.attachments[0].kind, AttachmentKind::Voice);
    }

    #[test]
    fn reads_users_messages_and_skips_bots() {
        let bot = BotId::new("d").unwrap();
        let m = json!({"id": "1100000000000000000", "channel_id": "42", "guild_id": "7",
                       "author": {"id": "9", "username": "u"}, "content": "hi"});
        let r = parse_message(&bot, &m, "1").unwrap().unwrap();
        assert_eq!(
            (
                r.key.as_str(),
                r.message.chat.chat.as_str(),
                r.message.text.as_str()
            ),
            ("1100000000000000000", "42", "hi")
        );
        assert!(r.message.sent_at_ms.unwrap() > 1_420_070_400_000);
        let own = json!({"id": "2", "channel_id": "42", "author": {"id": "1"}, "content": "x"});
        assert!(parse_message(&bot, &own, "1").unwrap().is_none());
        let other_bot = json!({"id": "3", "channel_id": "42", "author": {"id": "5", "bot": true}, "content": "x"});
        assert!(parse_message(&bot, &other_bot, "1").unwrap().is_none());
        assert!(parse_message(&bot, &json!({"id": "4"}), "1").is_err());
        let no_channel =
            json!({"id": "5", "channel_id": "", "author": {"id": "9"}, "content": "x"});
        assert!(parse_message(&bot, &no_channel, "1").is_err());
    }

    #[test]
    fn discords_times_read_and_write() {
        assert_eq!(
            unix_s("2026-12-02T10:00:00.000000+00:00"),
            Some(1_796_205_600)
        );
        assert_eq!(unix_s("2000-02-29T23:59:59+00:00"), Some(951_868_799));
        assert_eq!(unix_s("1970-01-01T00:00:00"), Some(0));
        for bad in [
            "",
            "2026-13-02T10:00:00",
            "2026-12-02 10:00:00",
            "20x6-12-02T10:00:00",
            "2026-12-02T10:00:0",
        ] {
            assert_eq!(unix_s(bad), None, "{bad:?}");
        }
        assert_eq!(
            iso_of_unix_ms(1_796_205_600_123),
            "2026-12-02T10:00:00.123000+00:00"
        );
        assert_eq!(
            iso_of_unix_ms(951_868_799_000),
            "2000-02-29T23:59:59.000000+00:00"
        );
        for ms in [
            0,
            86_399_999,
            951_782_400_000,
            1_796_205_600_000,
            4_102_444_800_000,
        ] {
            assert_eq!(unix_s(&iso_of_unix_ms(ms)), Some(ms / 1000), "{ms}");
        }
    }

    #[test]
    fn edits_are_events_of_their_own() {
        let bot = BotId::new("d").unwrap();
        let edit = |at: &str| {
            json!({"id": "1100000000000000000", "channel_id": "42", "author": {"id": "9"},
                   "content": "fixed", "edited_timestamp": at})
        };
        let now = botfleet_core::unix_ms();
        let r = parse_edit(&bot, &edit(&iso_of_unix_ms(now)), "1")
            .unwrap()
            .unwrap();
        assert_eq!(r.message.kind, EventKind::Edited);
        assert_eq!(r.message.message_id, "1100000000000000000");
        assert_eq!(
            r.message.edited_message_id.as_deref(),
            Some("1100000000000000000")
        );
        assert_eq!(r.message.text, "fixed");
        let again = parse_edit(&bot, &edit(&iso_of_unix_ms(now + 1)), "1")
            .unwrap()
            .unwrap();
        assert_ne!(r.key, again.key, "a second edit is a second event");
        assert_ne!(r.key, "1100000000000000000", "nor the message's own key");
        // An embed resolved: no edit time, or no content; the bot's own edit.
        let embed = json!({"id": "5", "channel_id": "42", "embeds": []});
        assert!(parse_edit(&bot, &embed, "1").unwrap().is_none());
        let mut own = edit(&iso_of_unix_ms(now));
        own["author"]["id"] = json!("1");
        assert!(parse_edit(&bot, &own, "1").unwrap().is_none());
        // A message pinned an hour after its edit: the update carries the old edit's time.
        let pinned = edit(&iso_of_unix_ms(now - 3_600_000));
        assert!(parse_edit(&bot, &pinned, "1").unwrap().is_none());
        assert!(parse_edit(&bot, &edit("yesterday"), "1").unwrap().is_none());
        let no_channel = json!({"id": "6", "author": {"id": "9"}, "content": "x",
            "edited_timestamp": iso_of_unix_ms(now)});
        assert!(parse_edit(&bot, &no_channel, "1").is_err());
    }
}
