//! Replies of a Cloud API bot, through the Graph API.

use async_trait::async_trait;
use botfleet_core::{Act, AttachmentKind, ChatKey, Outbound};
use botfleet_platform::{ErrorKind, PlatformError, Sender};

use crate::{GraphClient, Number};

/// Sends a bot's replies from its number.
pub(crate) struct CloudSender {
    pub(crate) client: GraphClient,
    pub(crate) number: Number,
}

#[async_trait]
impl Sender for CloudSender {
    fn buckets(
        &self,
        chat: &ChatKey,
        call: botfleet_platform::Call<'_>,
    ) -> Vec<botfleet_platform::Bucket> {
        limits::buckets(&chat.chat, call)
    }

    fn typing_every(&self, _: &botfleet_core::Inbound) -> Option<std::time::Duration> {
        // Shown until the reply, at most 25 s.
        Some(std::time::Duration::from_secs(20))
    }

    async fn show_typing(
        &self,
        event: &botfleet_core::Inbound,
        _key: &str,
    ) -> Result<(), PlatformError> {
        // The indicator goes with the read receipt of the user's message.
        Ok(self
            .client
            .show_typing(&self.number, &event.message_id)
            .await?)
    }

    async fn send(&self, out: &Outbound) -> Result<(), PlatformError> {
        if out.text.is_empty() {
            return Ok(());
        }
        self.client
            .send_text(
                &self.number,
                &out.chat.chat,
                &out.text,
                out.reply_to.as_deref(),
            )
            .await?;
        Ok(())
    }

    async fn act(
        &self,
        chat: &ChatKey,
        act: &Act<'_>,
        _key: &str,
    ) -> Result<Option<String>, PlatformError> {
        if let Act::Template {
            name,
            language,
            components,
        } = act
        {
            let id = self
                .client
                .send_template(&self.number, &chat.chat, name, language, *components)
                .await?;
            return Ok(Some(id));
        }
        let Act::Send {
            text,
            buttons,
            thread_of,
            files,
        } = act
        else {
            return Err(botfleet_platform::unsupported(act));
        };
        let reply_to = thread_of.map(|m| m.message_id.as_str());
        let to = chat.chat.as_str();
        // The text goes as the first file's caption where it can (no buttons, a kind with
        // captions, within 1,024 characters); else as a message of its own, first.
        let captioned = buttons.is_empty()
            && files
                .first()
                .is_some_and(|f| has_caption(f.kind) && text.chars().count() <= 1024);
        let mut first = None;
        if !text.is_empty() && !captioned {
            first = Some(
                self.send_text_or_choices(to, text, buttons, reply_to)
                    .await?,
            );
        }
        for (i, f) in files.iter().enumerate() {
            let media = self.client.upload_media(&self.number, f).await?;
            let caption = (i == 0 && captioned).then_some(*text);
            let id = self
                .client
                .send_media(
                    &self.number,
                    to,
                    media_type(f.kind),
                    &media,
                    caption,
                    Some(&f.name),
                    if first.is_none() { reply_to } else { None },
                )
                .await?;
            first.get_or_insert(id);
        }
        Ok(first)
    }
}

impl CloudSender {
    /// A text, under reply buttons (1–3) or a list (4–10 rows) when it has choices.
    async fn send_text_or_choices(
        &self,
        to: &str,
        text: &str,
        buttons: &[Vec<botfleet_core::Button>],
        reply_to: Option<&str>,
    ) -> Result<String, PlatformError> {
        if buttons.iter().all(Vec::is_empty) {
            return Ok(self
                .client
                .send_text(&self.number, to, text, reply_to)
                .await?);
        }
        let mut replies = Vec::new();
        for b in buttons.iter().flatten() {
            match (&b.value, &b.url) {
                (Some(v), None) => replies.push((v.as_str(), b.text.as_str())),
                _ => {
                    return Err(PlatformError::new(
                        ErrorKind::Rejected,
                        "unsupported",
                        "WhatsApp reply buttons cannot open links",
                    ))
                }
            }
        }
        let id = if replies.len() <= MAX_REPLY_BUTTONS {
            self.client
                .send_buttons(&self.number, to, text, &replies, reply_to)
                .await?
        } else {
            if replies.iter().any(|(v, _)| v.chars().count() > MAX_ROW_ID) {
                return Err(PlatformError::new(
                    ErrorKind::Rejected,
                    "unsupported",
                    format!("a WhatsApp list row's value is at most {MAX_ROW_ID} characters"),
                ));
            }
            self.client
                .send_list(&self.number, to, text, LIST_BUTTON, &replies, reply_to)
                .await?
        };
        Ok(id)
    }
}

/// Reply buttons a message carries at most; more choices (up to [`MAX_LIST_ROWS`]) go as a
/// list.
const MAX_REPLY_BUTTONS: usize = 3;
/// Rows of a list message at most.
const MAX_LIST_ROWS: u16 = 10;
/// A list row's id, at most (a reply button's is 256).
const MAX_ROW_ID: usize = 200;
/// The label of the button that opens a list.
const LIST_BUTTON: &str = "Choose";

/// The Cloud API's message type for a file of `kind`.
fn media_type(kind: AttachmentKind) -> &'static str {
    match kind {
        AttachmentKind::Image => "image",
        AttachmentKind::Video => "video",
        AttachmentKind::Audio | AttachmentKind::Voice => "audio",
        AttachmentKind::Sticker => "sticker",
        AttachmentKind::File => "document",
    }
}

/// Whether the Cloud API shows a caption with a file of `kind`.
fn has_caption(kind: AttachmentKind) -> bool {
    matches!(
        kind,
        AttachmentKind::Image | AttachmentKind::Video | AttachmentKind::File
    )
}

/// What a Cloud API bot does: text, up to three reply buttons (titles cut to 20 characters)
/// under a body of up to 1,024 characters, or a list of up to ten rows (values of up to 200
/// characters, titles cut to 24), and media (up to 10 files a send, 16 MiB each, one
/// message each), typing (with the read receipt of the user's message), and approved
/// templates (the one message allowed 24 hours after the user's last: other messages are
/// refused then, by the fleet when it knows, else by WhatsApp). No edits, deletes or
/// answers: the Cloud API has none for sent messages.
pub(crate) const CAPS: botfleet_core::Caps = botfleet_core::Caps {
    buttons: true,
    typing: true,
    max_buttons: MAX_LIST_ROWS,
    max_button_value: MAX_ROW_ID as u16,
    files: true,
    max_files: 10,
    max_file_bytes: 16 * 1024 * 1024,
    max_text: crate::MAX_TEXT_CHARS as u32,
    templates: true,
    reply_window_s: REPLY_WINDOW_S,
    ..botfleet_core::Caps::TEXT_ONLY
};

/// WhatsApp's customer service window: a business sends free-form messages to a user up to
/// 24 hours after the user's last message, templates only after.
pub(crate) const REPLY_WINDOW_S: u32 = 86_400;

/// WhatsApp Cloud's documented limits for what a business number sends: 80 messages a
/// second (the default throughput of a number), and to one user one message every 6 seconds
/// on average, in bursts of up to 45 (the pair rate limit).
pub mod limits {
    use botfleet_core::Act;
    use botfleet_platform::{Bucket, Call, Limit};

    /// Messages from the bot's number.
    pub const NUMBER: Limit = Limit::every(80, 1, 80);
    /// Messages to one user.
    pub const PAIR: Limit = Limit::every(1, 6, 45);

    /// Every scope and its limit.
    pub const SCOPES: &[(&str, Limit)] = &[("pair", PAIR), ("number", NUMBER)];

    /// The buckets `call` to the user `chat` counts against: a message counts against the
    /// number and the pair; the read receipt that shows typing is not counted.
    pub fn buckets(chat: &str, call: Call<'_>) -> Vec<Bucket> {
        match call {
            Call::Act(Act::Send { .. } | Act::Template { .. }) => vec![
                Bucket::of("pair", chat, PAIR),
                Bucket::bot("number", NUMBER),
            ],
            _ => Vec::new(),
        }
    }
}
