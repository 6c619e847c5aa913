//! Every platform's inbound parser against generated and mutated payloads of every event kind
//! it reads (thousands of cases per kind, from fixed seeds): nothing panics; each variant is
//! read or counted (ignored or malformed); what is read keeps the chat key usable.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use botfleet_core::{BotId, EventKind, Inbound};
use botfleet_testkit::mutate::mutations;
use serde_json::{json, Value};

const CASES: usize = 3_000;

fn bot() -> BotId {
    BotId::new("prop-bot").unwrap()
}

/// What every parsed event must hold, whatever the input.
fn sane(m: &Inbound) {
    assert!(!m.message_id.is_empty(), "{m:?}");
    assert!(!m.chat.chat.is_empty(), "{m:?}");
    for a in &m.attachments {
        assert!(!a.source.is_empty() && a.url.is_empty(), "{a:?}");
    }
    match m.kind {
        EventKind::Command => {
            let c = m.command.as_ref().expect("a command event has its command");
            assert!(
                !c.name.is_empty() && !c.name.contains(['/', '@', ' ']),
                "{c:?}"
            );
        }
        EventKind::Edited => assert!(m.edited_message_id.is_some(), "{m:?}"),
        EventKind::Message => assert!(m.command.is_none()),
        EventKind::Action => {
            let a = m.action.as_ref().expect("an action event has its action");
            assert!(
                a.message_id.as_deref().is_some_and(|id| !id.is_empty()),
                "{a:?}"
            );
        }
    }
}

#[test]
fn telegram_updates() {
    let kinds = [
        json!({"update_id": 10, "message": {"message_id": 3, "date": 1_700_000_000,
            "chat": {"id": -42, "type": "group"}, "from": {"id": 7, "is_bot": false}, "text": "hi"}}),
        json!({"update_id": 11, "message": {"message_id": 4, "chat": {"id": 5, "type": "private"},
            "text": "/start@fleet_bot deep", "entities": [{"type": "bot_command", "offset": 0, "length": 15}]}}),
        json!({"update_id": 12, "edited_message": {"message_id": 3, "chat": {"id": 5},
            "date": 1, "edit_date": 2, "text": "fixed"}}),
        json!({"update_id": 13, "channel_post": {"message_id": 9, "chat": {"id": -100, "type": "channel"}, "text": "post"}}),
        json!({"update_id": 14, "message": {"message_id": 6, "chat": {"id": 5},
            "photo": [{"file_id": "a", "file_unique_id": "b", "width": 90, "height": 90}], "caption": "c"}}),
        json!({"update_id": 15, "callback_query": {"id": "q", "from": {"id": 7}, "data": "x",
            "chat_instance": "c", "message": {"message_id": 8, "date": 1, "chat": {"id": 5}}}}),
        json!({"update_id": 16, "message": {"message_id": 7, "chat": {"id": 5}, "caption": "doc",
            "document": {"file_id": "d", "file_unique_id": "d", "file_name": "a.pdf",
                "mime_type": "application/pdf", "file_size": 1234}}}),
        json!({"update_id": 17, "message": {"message_id": 8, "chat": {"id": 5},
            "voice": {"file_id": "v", "file_unique_id": "v", "duration": 3, "mime_type": "audio/ogg", "file_size": 9},
            "video_note": {"file_id": "n", "file_unique_id": "n", "length": 240, "duration": 2}}}),
        json!({"update_id": 18, "message": {"message_id": 9, "chat": {"id": 5},
            "animation": {"file_id": "g", "file_unique_id": "g", "width": 1, "height": 1, "duration": 1},
            "document": {"file_id": "g", "file_unique_id": "g"},
            "sticker": {"file_id": "s", "file_unique_id": "s", "type": "regular", "is_animated": true, "is_video": false}}}),
        json!({"update_id": 19, "message": {"message_id": 10, "chat": {"id": 5},
            "video": {"file_id": "m", "file_unique_id": "m", "width": 1, "height": 1, "duration": 1, "file_name": "v.mp4"},
            "audio": {"file_id": "au", "file_unique_id": "au", "duration": 1, "title": "t"}}}),
    ];
    let (mut read, mut other) = (0, 0);
    for (k, base) in kinds.iter().enumerate() {
        let cases = mutations(&json!([base]), 100 + k as u64, CASES);
        for v in cases {
            let Ok(raw) = botfleet_telegram::split_updates(v) else {
                other += 1;
                continue;
            };
            for r in &raw {
                match botfleet_telegram::parse_update(&bot(), r) {
                    botfleet_telegram::Update::Message(m) => {
                        sane(&m);
                        read += 1;
                    }
                    _ => other += 1,
                }
            }
        }
    }
    assert!(read >= 100 && other >= 100, "read {read}, other {other}");
}

#[test]
fn slack_events_commands_and_frames() {
    use botfleet_slack::{parse_command, parse_event, parse_frame, parse_interactive, Event, Me};
    let me = Me {
        user_id: "UBOT".into(),
        bot_id: Some("BBOT".into()),
    };
    let events = [
        json!({"event": {"type": "message", "channel": "C1", "user": "U1", "text": "hi",
            "ts": "1700000000.000100"}}),
        json!({"event": {"type": "app_mention", "channel": "C1", "user": "U1", "text": "<@UBOT> hi",
            "ts": "1700000000.000100", "thread_ts": "1699999999.000001"}}),
        json!({"event": {"type": "message", "subtype": "message_changed", "channel": "C1",
            "ts": "1700000100.000200", "message": {"user": "U1", "text": "new",
            "ts": "1700000000.000100"}, "previous_message": {"user": "U1", "text": "old"}}}),
        json!({"event": {"type": "message", "subtype": "file_share", "channel": "C1", "user": "U1",
            "text": "see", "ts": "1700000000.000300", "files": [{"id": "F1", "name": "a.png",
            "mimetype": "image/png", "size": 9, "url_private": "https://files.slack.com/files-pri/T-F1/a.png",
            "url_private_download": "https://files.slack.com/files-pri/T-F1/download/a.png"},
            {"id": "F2", "name": "c.webm", "mimetype": "audio/webm", "subtype": "slack_audio",
            "url_private": "https://files.slack.com/files-pri/T-F2/c.webm"}]}}),
    ];
    let (mut read, mut other) = (0, 0);
    let mut count = |e: Event| match e {
        Event::Message(key, m) => {
            assert!(!key.is_empty());
            sane(&m);
            read += 1;
        }
        Event::Ignored | Event::Malformed(_) => other += 1,
    };
    for (k, base) in events.iter().enumerate() {
        for v in mutations(base, 200 + k as u64, CASES) {
            count(parse_event(&bot(), &me, &v));
            // The same, as a Socket Mode frame's text.
            let frame = json!({"envelope_id": "e", "type": "events_api", "payload": v});
            assert!(parse_frame(&frame.to_string()).is_ok());
        }
    }
    let command = json!({"command": "/weather", "text": "94070", "channel_id": "C7",
        "user_id": "U1", "trigger_id": "1.2.abc", "response_url": "https://x.invalid/"});
    for v in mutations(&command, 300, CASES) {
        count(parse_command(&bot(), &v));
    }
    let press = json!({"type": "block_actions", "user": {"id": "U1"}, "trigger_id": "1.2.p",
        "container": {"type": "message", "message_ts": "1700000001.000002", "channel_id": "C1"},
        "channel": {"id": "C1"}, "message": {"ts": "1700000001.000002"},
        "response_url": "https://hooks.slack.com/actions/1",
        "actions": [{"action_id": "bf0_0", "value": "v", "type": "button", "action_ts": "1.2"}]});
    let presses = mutations(&press, 302, CASES)
        .iter()
        .map(|v| parse_interactive(&bot(), v))
        .filter(|e| matches!(e, Event::Message(..)))
        .count();
    assert!(presses >= 100, "presses read: {presses}");
    for v in mutations(&press, 302, CASES) {
        count(parse_interactive(&bot(), &v));
    }
    for v in mutations(&json!({"type": "hello", "num_connections": 1}), 301, CASES) {
        let _ = parse_frame(&v.to_string());
    }
    assert!(read >= 100 && other >= 100, "read {read}, other {other}");
}

#[test]
fn discord_dispatches() {
    let create = json!({"id": "1100000000000000000", "channel_id": "42", "guild_id": "7",
        "author": {"id": "9", "username": "u"}, "content": "hi"});
    let mut update = create.clone();
    update["edited_timestamp"] = json!(botfleet_discord::iso_of_unix_ms(botfleet_core::unix_ms()));
    let mut files = create.clone();
    files["attachments"] = json!([
        {"id": "1", "filename": "a.png", "content_type": "image/png", "size": 10,
         "url": "https://cdn.discordapp.com/attachments/42/1/a.png?ex=1"},
        {"id": "2", "filename": "voice-message.ogg", "content_type": "audio/ogg", "duration_secs": 1.0,
         "url": "https://cdn.discordapp.com/attachments/42/2/voice-message.ogg"}]);
    files["sticker_items"] = json!([{"id": "555", "name": "wave", "format_type": 1}]);
    files["flags"] = json!(0);
    let (mut read, mut other) = (0, 0);
    for (k, (base, edit)) in [(create, false), (update, true), (files, false)]
        .into_iter()
        .enumerate()
    {
        let before = read;
        for v in mutations(&base, 400 + k as u64, CASES) {
            let r = if edit {
                botfleet_discord::parse_edit(&bot(), &v, "1")
            } else {
                botfleet_discord::parse_message(&bot(), &v, "1")
            };
            match r {
                Ok(Some(r)) => {
                    assert!(!r.key.is_empty());
                    sane(&r.message);
                    read += 1;
                }
                Ok(None) | Err(_) => other += 1,
            }
        }
        assert!(
            read - before >= 100,
            "kind {k}: only {} read",
            read - before
        );
    }
    assert!(read >= 100 && other >= 100, "read {read}, other {other}");
}

#[test]
fn whatsapp_cloud_deliveries() {
    let base = json!({"object": "whatsapp_business_account", "entry": [{"id": "WABA", "changes": [{
        "field": "messages", "value": {"messaging_product": "whatsapp",
        "metadata": {"display_phone_number": "15550001111", "phone_number_id": "PN1"},
        "contacts": [{"wa_id": "4915112345678", "profile": {"name": "A"}}],
        "messages": [{"from": "4915112345678", "id": "wamid.X", "timestamp": "1700000000",
            "type": "text", "text": {"body": "hi"}}]}}]}]});
    let mut tap = base.clone();
    tap["entry"][0]["changes"][0]["value"]["messages"][0] = json!({"from": "4915112345678",
        "id": "wamid.T", "timestamp": "1700000000", "type": "interactive",
        "context": {"from": "15550001111", "id": "wamid.out.1"},
        "interactive": {"type": "button_reply", "button_reply": {"id": "yes", "title": "Yes"}}});
    let mut kinds = vec![base.clone(), tap];
    for (t, file) in [
        (
            "image",
            json!({"id": "m1", "mime_type": "image/jpeg", "sha256": "x", "caption": "c"}),
        ),
        (
            "audio",
            json!({"id": "m2", "mime_type": "audio/ogg", "voice": true}),
        ),
        ("video", json!({"id": "m3", "mime_type": "video/mp4"})),
        (
            "document",
            json!({"id": "m4", "mime_type": "application/pdf", "filename": "a.pdf"}),
        ),
        (
            "sticker",
            json!({"id": "m5", "mime_type": "image/webp", "animated": false}),
        ),
    ] {
        let mut m = base.clone();
        let msg = &mut m["entry"][0]["changes"][0]["value"]["messages"][0];
        msg["type"] = json!(t);
        msg[t] = file;
        kinds.push(m);
    }
    let (mut read, mut other) = (0, 0);
    for (k, base) in kinds.iter().enumerate() {
        let before = read;
        for v in mutations(base, 500 + k as u64, CASES) {
            let d =
                botfleet_whatsapp::parse_delivery(&bot(), Some("PN1"), v.to_string().as_bytes());
            for r in &d.messages {
                sane(&r.message);
            }
            read += d.messages.len();
            other += d.ignored + d.malformed;
        }
        assert!(
            read - before >= 100,
            "kind {k}: only {} read",
            read - before
        );
    }
    let d = botfleet_whatsapp::parse_delivery(&bot(), None, b"\xff{not json");
    assert!(d.messages.is_empty() && d.malformed == 1);
    assert!(read >= 100 && other >= 100, "read {read}, other {other}");
}

#[test]
fn mutations_reach_every_field() {
    // The generator is what makes the cases above worth anything.
    let base: Value = json!({"a": {"b": {"c": "deep"}}});
    let touched = mutations(&base, 1, 2_000)
        .iter()
        .filter(|v| v["a"]["b"]["c"] != "deep")
        .count();
    assert!(
        touched > 200,
        "the deepest field changed in {touched} of 2000"
    );
}
