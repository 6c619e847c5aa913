//! Telegram on the platform seam: `getMe` verifies, `getUpdates` from the stored offset
//! receives, the next offset acknowledges (and is the checkpoint), `sendMessage` sends.

use std::sync::Arc;

use async_trait::async_trait;
use botfleet_core::{BotId, BotSpec, Outbound, Platform};
use botfleet_platform::{
    Ack, Batch, Connection, Connector, ErrorKind, Identity, PlatformError, Received, Receiver,
    Sender,
};

use crate::{
    parse_update, send, BotApi, LongPoll, TelegramClient, TelegramConfig, TelegramError, Update,
};

impl From<TelegramError> for PlatformError {
    fn from(e: TelegramError) -> Self {
        let reason = e.reason();
        let kind = match &e {
            TelegramError::Unauthorized(_) => ErrorKind::Credentials,
            TelegramError::Conflict(_) => ErrorKind::Conflict,
            TelegramError::RateLimited(d) => ErrorKind::RateLimited(*d),
            TelegramError::Server { .. }
            | TelegramError::Network(_)
            | TelegramError::Transport(_) => ErrorKind::Transient,
            TelegramError::Refused { .. } => ErrorKind::Rejected,
            TelegramError::Malformed(_) => ErrorKind::Malformed,
        };
        let message = match &e {
            TelegramError::Unauthorized(d) => format!("Telegram refused the token (401): {d}"),
            other => other.to_string(),
        };
        PlatformError::new(kind, reason, message).with_source(e)
    }
}

/// The Telegram platform: one HTTP pool for every bot of the process.
#[derive(Clone, Debug)]
pub struct TelegramConnector {
    client: TelegramClient,
}

impl TelegramConnector {
    /// A connector with its own connection pool.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(config: TelegramConfig) -> Result<Self, TelegramError> {
        Ok(Self {
            client: TelegramClient::new(config)?,
        })
    }

    fn api(spec: &BotSpec) -> Result<BotApi, PlatformError> {
        BotApi::new(spec.options.api_url.as_deref(), &spec.token)
            .map_err(|e| PlatformError::new(ErrorKind::Rejected, "bad_api_url", e.to_string()))
    }
}

#[async_trait]
impl Connector for TelegramConnector {
    fn platform(&self) -> Platform {
        Platform::Telegram
    }

    async fn verify(&self, spec: &BotSpec) -> Result<Identity, PlatformError> {
        let api = Self::api(spec)?;
        let me = self.client.get_me(&api).await?;
        Ok(Identity {
            user_id: me.id.to_string(),
            name: me.username,
        })
    }

    async fn connect(
        &self,
        spec: &BotSpec,
        checkpoint: Option<&str>,
    ) -> Result<Connection, PlatformError> {
        let api = Arc::new(Self::api(spec)?);
        Ok(Connection {
            receiver: Box::new(Poller {
                poll: self.client.long_poll(),
                api: api.clone(),
                bot: spec.id.clone(),
                offset: checkpoint.and_then(|c| c.parse().ok()).unwrap_or(0),
            }),
            sender: Arc::new(TelegramSender {
                client: self.client.clone(),
                api,
            }),
        })
    }
}

/// Long polling from an offset.
struct Poller {
    poll: LongPoll,
    api: Arc<BotApi>,
    bot: BotId,
    offset: i64,
}

#[async_trait]
impl Receiver for Poller {
    async fn next(&mut self) -> Result<Batch, PlatformError> {
        let updates = self.poll.get_updates(&self.api, self.offset).await?;
        let next = updates
            .iter()
            .filter_map(|u| u.update_id)
            .max()
            .map_or(self.offset, |m| m + 1)
            .max(self.offset);
        if next == self.offset && !updates.is_empty() {
            // Updates without a usable id cannot be confirmed: polling on at once would spin.
            return Err(PlatformError::new(
                ErrorKind::Malformed,
                "malformed_update",
                "updates without update_id",
            ));
        }
        let mut batch = Batch {
            ack: Ack(vec![next.to_string()]),
            ..Batch::default()
        };
        for raw in &updates {
            match parse_update(&self.bot, raw) {
                Update::Message(m) => batch.messages.push(Received {
                    key: m.message_id.clone(),
                    message: m,
                }),
                Update::Ignored => {}
                Update::Malformed(_) => batch.malformed += 1,
            }
        }
        Ok(batch)
    }

    async fn ack(&mut self, ack: Ack) -> Result<Option<String>, PlatformError> {
        // Telegram learns it with the next getUpdates; the offset is the checkpoint.
        if let Some(next) = ack.0.first().and_then(|n| n.parse::<i64>().ok()) {
            self.offset = self.offset.max(next);
        }
        Ok(Some(self.offset.to_string()))
    }

    async fn close(&mut self) {
        // Closing the poll's connection ends a poll the server may still hold.
        self.poll = self.poll.fresh();
    }
}

struct TelegramSender {
    client: TelegramClient,
    api: Arc<BotApi>,
}

#[async_trait]
impl Sender for TelegramSender {
    async fn send(&self, out: &Outbound) -> Result<(), PlatformError> {
        Ok(send(&self.client, &self.api, out).await?)
    }
}
