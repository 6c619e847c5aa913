//! Replies as `POST /channels/{id}/messages`; edits, deletes and typing.

use botfleet_core::{Act, EventKind, Outbound};
use botfleet_platform::PlatformError;

use crate::{DiscordApi, DiscordClient, DiscordError};

/// Discord's limit on a message's content, in characters.
const MAX_CONTENT: usize = 2000;

/// What Discord bots do here: buttons (message components: up to 5 rows of 5, values of up to
/// 100 characters as their `custom_id`), edits, deletes and typing in the channel, answers to
/// commands and button presses (interactions; ephemeral when asked), files in and out (up to
/// 10 a message, 10 MiB each: Discord's limit for a bot in an unboosted server). Buttons (message
/// components) and answers come with interactions, which this version does not read yet.
pub const CAPS: botfleet_core::Caps = botfleet_core::Caps {
    buttons: true,
    max_buttons: 25,
    max_button_value: 100,
    answer: true,
    ephemeral: true,
    edit: true,
    delete: true,
    typing: true,
    files: true,
    max_files: 10,
    max_file_bytes: 10 * 1024 * 1024,
    max_text: MAX_CONTENT as u32,
    commands: true,
    streams: false,
    ..botfleet_core::Caps::TEXT_ONLY
};

/// Does one resolved action in `channel`: the id of the (first) message a `send` made.
pub(crate) async fn act(
    client: &DiscordClient,
    api: &DiscordApi,
    channel: &str,
    act: &Act<'_>,
    key: &str,
) -> Result<Option<String>, PlatformError> {
    let r = match act {
        Act::Send {
            text,
            buttons: [],
            thread_of,
            files: [],
        } => {
            let reply_to = thread_of.filter(|m| replies_to(m)).map(|m| m.message_id.as_str());
            return Ok(send_text(client, api, channel, text, reply_to, key).await?);
        }
        Act::Send {
            text,
            buttons,
            thread_of,
            files,
        } => {
            // One message: the text (cut to Discord's 2,000 characters), its buttons and
            // every file.
            let mut body = serde_json::json!({
                "content": text.chars().take(MAX_CONTENT).collect::<String>(),
                "nonce": nonce_of(key, 0),
                "enforce_nonce": true,
            });
            if !buttons.is_empty() {
                body["components"] = components(buttons)?;
            }
            if let Some(m) = thread_of.filter(|m| replies_to(m)) {
                body["message_reference"] =
                    serde_json::json!({ "message_id": m.message_id, "fail_if_not_exists": false });
            }
            return Ok(client
                .create_message_with(api, channel, body, files)
                .await?);
        }
        Act::Edit {
            message_id,
            via,
            text,
            buttons,
        } => {
            let text = text.map(|t| t.chars().take(MAX_CONTENT).collect::<String>());
            let components = components(buttons)?;
            if let Some(h) = via {
                // An interaction's answer: through its webhook while the token answers.
                let mut body = serde_json::json!({ "components": components.clone() });
                if let Some(t) = &text {
                    body["content"] = serde_json::Value::from(t.as_str());
                }
                if crate::interactions::change(client, api, h, message_id, Some(body)).await? {
                    return Ok(None);
                }
            }
            client
                .edit_message(api, channel, message_id, text.as_deref(), components)
                .await
        }
        Act::Delete { message_id, via } => {
            let through_hook = match via {
                Some(h) => crate::interactions::change(client, api, h, message_id, None).await,
                None => Ok(false),
            };
            match through_hook {
                Ok(true) => Ok(()),
                Ok(false) => client.delete_message(api, channel, message_id).await,
                Err(e) => Err(e),
            }
        }
        Act::Typing => client.trigger_typing(api, channel).await,
        Act::Answer {
            event,
            text,
            ephemeral,
            deferred,
            answered,
            buttons,
            files,
            ..
        } => match event.answer_handle.as_deref() {
            Some(h) => {
                let reply = crate::interactions::Reply {
                    text: *text,
                    ephemeral: *ephemeral,
                    components: if buttons.is_empty() {
                        None
                    } else {
                        Some(components(buttons)?)
                    },
                    files,
                };
                return Ok(
                    crate::interactions::answer(client, api, h, &reply, *deferred, *answered)
                        .await?,
                );
            }
            // A message, not an interaction: nothing waits for an answer.
            None if text.is_none() => Ok(()),
            None => {
                return Err(PlatformError::new(
                    botfleet_platform::ErrorKind::Rejected,
                    "unsupported",
                    "only a command or a button press (an interaction) is answered on Discord; send a message instead",
                ))
            }
        },
        Act::Template { .. } => return Err(botfleet_platform::unsupported(act)),
        Act::Defer { event } => match event.answer_handle.as_deref() {
            Some(h) => crate::interactions::defer(client, api, h).await,
            None => Ok(()),
        },
    };
    match r {
        // Deleted before (a replayed delete), or the message is gone: nothing left to do.
        Err(DiscordError::Rejected { status: 404, .. }) if matches!(act, Act::Delete { .. }) => {
            Ok(None)
        }
        r => Ok(r.map(|()| None)?),
    }
}

/// Whether a reply to `m` can quote it: a message's id names a message; an interaction's
/// does not.
fn replies_to(m: &botfleet_core::Inbound) -> bool {
    !matches!(m.kind, EventKind::Command | EventKind::Action)
}

/// Buttons as message components: each row an action row (type 1) of buttons (type 2), a
/// value button primary (style 1) with the value as its `custom_id`, a link button style 5.
///
/// # Errors
/// `Rejected` for two buttons of one message with the same value (Discord needs each
/// `custom_id` once), or more than 5 rows of 5.
fn components(rows: &[Vec<botfleet_core::Button>]) -> Result<serde_json::Value, PlatformError> {
    use serde_json::json;
    let refuse =
        |why: &str| PlatformError::new(botfleet_platform::ErrorKind::Rejected, "unsupported", why);
    let rows: Vec<&Vec<botfleet_core::Button>> = rows.iter().filter(|r| !r.is_empty()).collect();
    if rows.len() > 5 || rows.iter().any(|r| r.len() > 5) {
        return Err(refuse("Discord shows at most 5 rows of 5 buttons"));
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let mut buttons = Vec::with_capacity(row.len());
        for b in row {
            let label: String = b.text.chars().take(80).collect();
            match (&b.url, &b.value) {
                (Some(url), _) => {
                    buttons.push(json!({"type": 2, "style": 5, "label": label, "url": url}))
                }
                (None, Some(v)) => {
                    if !seen.insert(v.clone()) {
                        return Err(refuse(
                            "two buttons of one Discord message need values of their own",
                        ));
                    }
                    buttons.push(json!({"type": 2, "style": 1, "label": label, "custom_id": v}));
                }
                (None, None) => return Err(refuse("a button needs a value or a url")),
            }
        }
        out.push(json!({"type": 1, "components": buttons}));
    }
    Ok(json!(out))
}

/// Sends `out` to its channel (as a reply to the message it answers). Longer texts go out in
/// pieces of at most 2,000 characters. Answers the first piece's id.
pub(crate) async fn send(
    client: &DiscordClient,
    api: &DiscordApi,
    out: &Outbound,
) -> Result<Option<String>, DiscordError> {
    send_text(
        client,
        api,
        &out.chat.chat,
        &out.text,
        out.reply_to.as_deref(),
        &out.idempotency_key,
    )
    .await
}

/// [`send`] of `text` to `channel`, answering `reply_to`, under the idempotency key `key`.
async fn send_text(
    client: &DiscordClient,
    api: &DiscordApi,
    channel: &str,
    text: &str,
    reply_to: Option<&str>,
    key: &str,
) -> Result<Option<String>, DiscordError> {
    let mut first = None;
    let chars: Vec<char> = text.chars().collect();
    let pieces: Vec<String> = if chars.is_empty() {
        vec![String::new()]
    } else {
        chars
            .chunks(MAX_CONTENT)
            .map(|c| c.iter().collect())
            .collect()
    };
    for (i, piece) in pieces.iter().enumerate() {
        // The nonce makes a retried send land once: from the idempotency key, at most 25
        // characters.
        let nonce = nonce_of(key, i);
        let id = client
            .create_message(
                api,
                channel,
                piece,
                if i == 0 { reply_to } else { None },
                &nonce,
            )
            .await?;
        if i == 0 {
            first = id;
        }
    }
    Ok(first)
}

/// A 25-character nonce from a key and a piece number (FNV-1a, hex).
fn nonce_of(key: &str, piece: usize) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes().chain(piece.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("bf{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_are_stable_short_and_distinct() {
        assert_eq!(nonce_of("a:1:reply", 0), nonce_of("a:1:reply", 0));
        assert_ne!(nonce_of("a:1:reply", 0), nonce_of("a:1:reply", 1));
        assert!(nonce_of("a:1:reply", 0).len() <= 25);
    }
}

/// Discord's documented limits for what a bot sends: 50 requests a second over all of a
/// bot's REST calls (interactions' answers aside), and per route — the one counted here ahead
/// of its headers is a channel's messages, 5 every 5 seconds; every route's own bucket is
/// learnt from Discord's answers (`route`, see [`limits::route`]).
pub mod limits {
    use botfleet_core::Act;
    use botfleet_platform::{Bucket, Call, Limit};

    /// Every REST call of a bot (its global limit).
    pub const GLOBAL: Limit = Limit::every(50, 1, 50);
    /// Messages posted to one channel.
    pub const CHANNEL: Limit = Limit::every(5, 5, 5);
    /// A learnt route's bucket: its limit is Discord's, as its answers announce it (`off`
    /// leaves learnt buckets out; a limit given instead replaces the learnt one).
    pub const ROUTE: Limit = Limit::every(5, 5, 5);

    /// The fleet's budget of invalid requests (401, 403, 429 but a shared resource's):
    /// Discord bans an IP for 10,000 in 10 minutes; the fleet keeps under it (4,000 at once
    /// and 4,000 more over 10 minutes at most), and when the budget is spent every Discord
    /// call of the fleet stops until a tenth of it is back.
    pub const INVALID: Limit = Limit::every(4000, 600, 4000);

    /// Every scope and its limit.
    pub const SCOPES: &[(&str, Limit)] = &[
        ("channel", CHANNEL),
        ("global", GLOBAL),
        (crate::routes::ROUTE, ROUTE),
        ("invalid", INVALID),
    ];

    /// The fleet's budget of invalid requests ([`INVALID`]), shared by every Discord bot.
    pub fn invalid_budget() -> Bucket {
        Bucket::fleet("invalid", "budget", INVALID)
    }

    /// The buckets `call` in `channel` counts against: an interaction's answer (and its
    /// deferral) counts against none (Discord leaves interactions out of the global limit);
    /// every other call against the bot's global bucket, and a message against its
    /// channel's too.
    pub fn buckets(channel: &str, call: Call<'_>) -> Vec<Bucket> {
        match call {
            Call::Act(Act::Answer { .. } | Act::Defer { .. }) => Vec::new(),
            Call::Act(Act::Send { .. }) => vec![
                Bucket::of("channel", channel, CHANNEL),
                Bucket::bot("global", GLOBAL),
            ],
            _ => vec![Bucket::bot("global", GLOBAL)],
        }
    }

    /// The channel route `call` goes by, whose bucket Discord's answers announce (what the
    /// client calls it): a message made, edited or deleted in the channel, typing; `None`
    /// for an interaction's answer and for a change made through an interaction's webhook.
    pub fn route(call: Call<'_>) -> Option<&'static str> {
        match call {
            Call::Act(Act::Send { .. }) => Some("create message"),
            Call::Act(Act::Edit { via: None, .. }) => Some("edit message"),
            Call::Act(Act::Delete { via: None, .. }) => Some("delete message"),
            Call::Act(Act::Typing) => Some("typing"),
            _ => None,
        }
    }
}
