//! Replies of a Cloud API bot, through the Graph API.

use async_trait::async_trait;
use botfleet_core::{Act, ChatKey, Outbound};
use botfleet_platform::{ErrorKind, PlatformError, Sender};

use crate::{GraphClient, Number};

/// Sends a bot's replies from its number.
pub(crate) struct CloudSender {
    pub(crate) client: GraphClient,
    pub(crate) number: Number,
}

#[async_trait]
impl Sender for CloudSender {
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
        let Act::Send {
            text,
            buttons,
            thread_of,
            files: [],
        } = act
        else {
            return Err(botfleet_platform::unsupported(act));
        };
        let reply_to = thread_of.map(|m| m.message_id.as_str());
        if buttons.is_empty() {
            let id = self
                .client
                .send_text(&self.number, &chat.chat, text, reply_to)
                .await?;
            return Ok(Some(id));
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
        let id = self
            .client
            .send_buttons(&self.number, &chat.chat, text, &replies, reply_to)
            .await?;
        Ok(Some(id))
    }
}

/// What a Cloud API bot does: text, and up to three reply buttons (ids of up to 256
/// characters; titles cut to 20) under a body of up to 1,024 characters. No edits, deletes,
/// typing or answers: the Cloud API has none for sent messages.
pub(crate) const CAPS: botfleet_core::Caps = botfleet_core::Caps {
    buttons: true,
    max_buttons: 3,
    max_button_value: 256,
    max_text: crate::MAX_TEXT_CHARS as u32,
    ..botfleet_core::Caps::TEXT_ONLY
};
