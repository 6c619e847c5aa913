//! [`Outbound`] messages → `chat.postMessage`.

use botfleet_core::Outbound;

use crate::{SlackApi, SlackClient, SlackError};

/// The longest text sent, in characters; Slack truncates beyond 40,000 (longer texts are cut
/// here, and marked).
pub const MAX_TEXT_CHARS: usize = 40_000;

/// The channel and thread of a chat key's chat: `C123` or `C123/1700000000.000100`.
pub fn channel_and_thread(chat: &str) -> (&str, Option<&str>) {
    match chat.split_once('/') {
        Some((c, t)) if !t.is_empty() => (c, Some(t)),
        _ => (chat, None),
    }
}

/// Sends `out` through `client`, in its thread when the message answered was in one. Empty
/// texts are not sent.
///
/// # Errors
/// See [`SlackError`].
pub async fn send(client: &SlackClient, api: &SlackApi, out: &Outbound) -> Result<(), SlackError> {
    if out.text.is_empty() {
        return Ok(());
    }
    let text = fit(&out.text, MAX_TEXT_CHARS);
    let (channel, thread) = channel_and_thread(&out.chat.chat);
    client.post_message(api, channel, &text, thread).await
}

/// What Slack bots do: Block Kit buttons (one `actions` block per row, at most 25 buttons,
/// values of up to 2,000 bytes), `chat.update`, `chat.delete`, and answers to a button press
/// or a slash command through its `response_url` (ephemeral when asked), files in and out (up
/// to 10 a send, 50 MiB each, through `files.getUploadURLExternal`). No typing: Slack has
/// none for bots.
pub const CAPS: botfleet_core::Caps = botfleet_core::Caps {
    buttons: true,
    max_buttons: 25,
    max_button_value: 2000,
    edit: true,
    delete: true,
    typing: false,
    answer: true,
    ephemeral: true,
    threads: false,
    files: true,
    max_files: 10,
    max_file_bytes: 50 * 1024 * 1024,
    max_text: MAX_TEXT_CHARS as u32,
    // Slash commands are set in the Slack app's configuration, not by the bot.
    commands: false,
    streams: true,
    templates: false,
    reply_window_s: 0,
};

/// A section block's longest text.
const MAX_SECTION_CHARS: usize = 3000;

use botfleet_core::fit_text as fit;

/// The blocks of a message with `text` and rows of `buttons`: the text in a section, each row
/// an `actions` block; `[]` without buttons (a plain message, or an edit that drops them).
pub fn blocks(text: &str, rows: &[Vec<botfleet_core::Button>]) -> serde_json::Value {
    use serde_json::json;
    if rows.iter().all(Vec::is_empty) {
        return json!([]);
    }
    let mut out = vec![json!({
        "type": "section",
        "text": {"type": "mrkdwn", "text": fit(text, MAX_SECTION_CHARS)},
    })];
    for (r, row) in rows.iter().enumerate() {
        let elements: Vec<serde_json::Value> = row
            .iter()
            .enumerate()
            .map(|(c, b)| {
                let mut e = json!({
                    "type": "button",
                    "text": {"type": "plain_text", "text": fit(&b.text, 75)},
                    "action_id": format!("bf{r}_{c}"),
                });
                match (&b.url, &b.value) {
                    (Some(u), _) => e["url"] = json!(u),
                    (None, Some(v)) => e["value"] = json!(v),
                    (None, None) => {}
                }
                e
            })
            .collect();
        out.push(json!({"type": "actions", "elements": elements}));
    }
    json!(out)
}

/// Does one resolved action in the chat `chat` (`C…` or `C…/thread`): a `send`'s `ts`.
///
/// # Errors
/// See [`SlackError`].
pub async fn act(
    client: &SlackClient,
    api: &SlackApi,
    chat: &str,
    act: &botfleet_core::Act<'_>,
) -> Result<Option<String>, SlackError> {
    use botfleet_core::Act;
    use serde_json::json;
    let (channel, thread) = channel_and_thread(chat);
    let refused = |code: &str| SlackError::Refused {
        method: "action",
        code: code.to_owned(),
    };
    match act {
        Act::Send {
            text,
            buttons,
            files,
            ..
        } => {
            // The text (with its buttons) is a message of its own, which a ref names and an
            // edit changes; the files follow it, shared in the same channel and thread.
            let mut ts = None;
            if !text.is_empty() {
                let text = fit(text, MAX_TEXT_CHARS);
                let mut body = json!({ "channel": channel, "text": text });
                if !buttons.is_empty() {
                    body["blocks"] = blocks(&text, buttons);
                }
                if let Some(ts) = thread {
                    body["thread_ts"] = json!(ts);
                }
                let sent = client.bot_call(api, "chat.postMessage", body).await?;
                ts = sent["ts"].as_str().map(str::to_owned);
            }
            if !files.is_empty() {
                client.upload(api, channel, thread, files).await?;
            }
            Ok(ts)
        }
        Act::Edit {
            message_id,
            text,
            buttons,
            ..
        } => {
            // Slack's chat.update takes the whole message: the fleet does not keep texts.
            let Some(text) = text else {
                return Err(refused("an edit on Slack needs its text"));
            };
            let text = fit(text, MAX_TEXT_CHARS);
            let body = json!({ "channel": channel, "ts": message_id, "text": text,
                "blocks": blocks(&text, buttons) });
            client.bot_call(api, "chat.update", body).await?;
            Ok(None)
        }
        Act::Delete { message_id, .. } => {
            let body = json!({ "channel": channel, "ts": message_id });
            match client.bot_call(api, "chat.delete", body).await {
                // Gone before (a replayed delete): done.
                Err(SlackError::Refused { code, .. }) if code == "message_not_found" => Ok(None),
                r => r.map(|_| None),
            }
        }
        Act::Typing => Err(refused("Slack shows no typing for bots")),
        Act::Template { .. } => Err(refused("Slack has no message templates")),
        // Slack's deadline is the envelope's (or the request's), acknowledged on receipt.
        Act::Defer { .. } => Ok(None),
        Act::Answer {
            event,
            text,
            ephemeral,
            ..
        } => {
            let Some(url) = event.answer_handle.as_deref() else {
                return Err(refused("this event has no response_url to answer"));
            };
            let Some(text) = text.filter(|t| !t.is_empty()) else {
                // Nothing to show: the press was acknowledged with its envelope already.
                return Ok(None);
            };
            let body = json!({
                "text": fit(text, MAX_TEXT_CHARS),
                "response_type": if *ephemeral { "ephemeral" } else { "in_channel" },
                "replace_original": false,
            });
            client.respond(api, url, body).await?;
            Ok(None)
        }
    }
}

/// The longest `markdown_text` one streaming call takes; a longer text goes in pieces.
pub(crate) const MAX_STREAM_CHUNK_CHARS: usize = 12_000;

/// The streamed messages of one channel: `chat.startStream`, `chat.appendStream` and
/// `chat.stopStream` on the bot's behalf.
pub(crate) struct Streams<'a> {
    pub(crate) client: &'a SlackClient,
    pub(crate) api: &'a SlackApi,
    pub(crate) channel: &'a str,
}

impl Streams<'_> {
    /// Does `step` of a message streamed in `thread` to `recipient` (team, user; `None` in a
    /// DM): the new message's `ts` for a start.
    pub(crate) async fn step(
        &self,
        thread: &str,
        recipient: Option<(&str, &str)>,
        step: botfleet_platform::StreamStep<'_>,
    ) -> Result<Option<String>, SlackError> {
        use botfleet_platform::StreamStep;
        match step {
            StreamStep::Start { text } => {
                let mut pieces = pieces(text);
                let first = pieces.next();
                let ts = self
                    .client
                    .start_stream(self.api, self.channel, thread, recipient, first)
                    .await?;
                self.append(&ts, pieces).await?;
                Ok(Some(ts))
            }
            StreamStep::Append {
                message_id, added, ..
            } => {
                self.append(message_id, pieces(added)).await?;
                Ok(None)
            }
            StreamStep::Stop { message_id, .. } => {
                match self
                    .client
                    .stop_stream(self.api, self.channel, message_id, None)
                    .await
                {
                    // Ended before (a replayed stop): done.
                    Err(SlackError::Refused { code, .. })
                        if code == "message_not_in_streaming_state" =>
                    {
                        Ok(None)
                    }
                    r => r.map(|()| None),
                }
            }
        }
    }

    async fn append<'t>(
        &self,
        ts: &str,
        pieces: impl Iterator<Item = &'t str>,
    ) -> Result<(), SlackError> {
        for piece in pieces {
            self.client
                .append_stream(self.api, self.channel, ts, piece)
                .await?;
        }
        Ok(())
    }
}

/// `text` in pieces of at most [`MAX_STREAM_CHUNK_CHARS`] characters (none for an empty one).
fn pieces(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let cut = rest
            .char_indices()
            .nth(MAX_STREAM_CHUNK_CHARS)
            .map_or(rest.len(), |(i, _)| i);
        let (piece, more) = rest.split_at(cut);
        rest = more;
        Some(piece)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chats_name_their_thread() {
        assert_eq!(channel_and_thread("C1"), ("C1", None));
        assert_eq!(channel_and_thread("C1/1.2"), ("C1", Some("1.2")));
        assert_eq!(channel_and_thread("C1/"), ("C1/", None));
    }

    #[test]
    fn long_stream_texts_go_in_pieces_of_whole_characters() {
        assert_eq!(pieces("").count(), 0);
        assert_eq!(pieces("abc").collect::<Vec<_>>(), ["abc"]);
        let long = "é".repeat(MAX_STREAM_CHUNK_CHARS * 2 + 5);
        let p: Vec<&str> = pieces(&long).collect();
        assert_eq!(
            p.iter().map(|s| s.chars().count()).collect::<Vec<_>>(),
            [MAX_STREAM_CHUNK_CHARS, MAX_STREAM_CHUNK_CHARS, 5]
        );
        assert_eq!(p.concat(), long);
    }
}

/// Slack's documented limits for what a bot sends: about one message a second in a channel
/// (`chat.postMessage`), and the per-method tiers, per app and workspace (`chat.update`,
/// `chat.delete`: Tier 3, 50 a minute; the file upload calls: Tier 4, 100 a minute).
pub mod limits {
    use botfleet_core::Act;
    use botfleet_platform::{Bucket, Call, Limit, StreamStep};

    /// Messages to one channel.
    pub const CHANNEL: Limit = Limit::every(1, 1, 1);
    /// Tier 3 methods.
    pub const TIER_3: Limit = Limit::every(50, 60, 10);
    /// Tier 4 methods.
    pub const TIER_4: Limit = Limit::every(100, 60, 10);

    /// Every scope and its limit.
    pub const SCOPES: &[(&str, Limit)] = &[
        ("channel", CHANNEL),
        ("chat.update", TIER_3),
        ("chat.delete", TIER_3),
        ("files", TIER_4),
    ];

    /// The buckets `call` in `chat` (a channel, or `channel/thread`) counts against. Typing,
    /// answers through a command's `response_url` and a stream's appends and stop are not
    /// counted (Slack paces them with its own 429s).
    pub fn buckets(chat: &str, call: Call<'_>) -> Vec<Bucket> {
        let (channel, _) = super::channel_and_thread(chat);
        match call {
            Call::Act(Act::Send { files, .. }) => {
                // A message, or files shared in the channel (which show as one).
                let mut b = vec![Bucket::of("channel", channel, CHANNEL)];
                if !files.is_empty() {
                    b.push(Bucket::bot("files", TIER_4));
                }
                b
            }
            Call::Act(Act::Edit { .. }) => vec![Bucket::bot("chat.update", TIER_3)],
            Call::Act(Act::Delete { .. }) => vec![Bucket::bot("chat.delete", TIER_3)],
            Call::Stream(StreamStep::Start { .. }) => vec![Bucket::of("channel", channel, CHANNEL)],
            _ => Vec::new(),
        }
    }
}
