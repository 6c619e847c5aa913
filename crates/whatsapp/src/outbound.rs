//! Replies of a Cloud API bot, through the Graph API.

use async_trait::async_trait;
use botfleet_core::Outbound;
use botfleet_platform::{PlatformError, Sender};

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
}
