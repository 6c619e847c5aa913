//! Telegram on the platform seam: `getMe` verifies, `getUpdates` from the stored offset
//! receives, the next offset acknowledges (and is the checkpoint), `sendMessage` sends.

use std::sync::Arc;

use async_trait::async_trait;
use botfleet_core::{Act, BotId, BotSpec, ChatKey, Outbound, Platform};
use botfleet_platform::{
    secrets_match, Ack, Batch, Connection, Connector, ErrorKind, HookAnswer, HookRefusal,
    HookRequest, Identity, PlatformError, Received, Receiver, Sender, Webhooks,
};

use crate::{
    parse_update, send, BotApi, LongPoll, RawUpdate, TelegramClient, TelegramConfig, TelegramError,
    Update,
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
    fn descriptor(&self) -> &'static botfleet_core::Descriptor {
        &crate::DESCRIPTOR
    }

    fn webhooks(&self) -> Option<Arc<dyn Webhooks>> {
        Some(Arc::new(self.hooks()))
    }

    async fn fetch_file(
        &self,
        spec: &BotSpec,
        source: &str,
    ) -> Result<botfleet_platform::FileBody, PlatformError> {
        let api = Self::api(spec)?;
        let resp = self.client.download(&api, source).await?;
        Ok(botfleet_platform::FileBody::from_response(resp))
    }

    async fn register_commands(&self, spec: &BotSpec) -> Result<(), PlatformError> {
        let api = Self::api(spec)?;
        let commands = &spec.options.commands;
        if commands.is_empty() {
            self.client
                .call_method(&api, "deleteMyCommands", serde_json::json!({}))
                .await?;
            return Ok(());
        }
        // Telegram's menu has a name and a description; options are what the user writes
        // after the command.
        let list: Vec<serde_json::Value> = commands
            .iter()
            .map(|c| serde_json::json!({"command": c.name, "description": c.description}))
            .collect();
        self.client
            .call_method(
                &api,
                "setMyCommands",
                serde_json::json!({ "commands": list }),
            )
            .await?;
        Ok(())
    }

    async fn removed(&self, spec: &BotSpec) -> Result<(), PlatformError> {
        if crate::DESCRIPTOR.is_webhook(spec) {
            // Telegram would go on delivering to the fleet for a bot nobody answers.
            self.client.delete_webhook(&Self::api(spec)?).await?;
        }
        Ok(())
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
        if crate::DESCRIPTOR.is_webhook(spec) {
            // The unit's one exclusive act: tell Telegram where to deliver. Updates then come
            // to every worker's hooks address; this connection only holds the registration.
            let Some(base) = self.client.config().public_url.as_deref() else {
                return Err(PlatformError::new(
                    ErrorKind::Rejected,
                    "no_public_url",
                    "a webhook bot needs the worker's --public-url (where Telegram reaches the hooks address)",
                ));
            };
            let url = hook_url(base, spec);
            let secret = spec.hook.secret.as_ref().ok_or_else(|| {
                PlatformError::new(
                    ErrorKind::Rejected,
                    "no_secret_token",
                    "webhook mode needs a secret token",
                )
            })?;
            self.client
                .set_webhook(
                    &api,
                    &url,
                    secret,
                    spec.options.max_connections.unwrap_or(40),
                )
                .await?;
            return Ok(Connection {
                receiver: Box::new(botfleet_platform::NoDeliveries),
                sender: Arc::new(TelegramSender {
                    client: self.client.clone(),
                    api,
                }),
            });
        }
        Ok(Connection {
            receiver: Box::new(Poller {
                poll: self.client.long_poll(),
                api: api.clone(),
                bot: spec.id.clone(),
                offset: checkpoint.and_then(|c| c.parse().ok()).unwrap_or(0),
                client: self.client.clone(),
                webhook_cleared: false,
            }),
            sender: Arc::new(TelegramSender {
                client: self.client.clone(),
                api,
            }),
        })
    }
}

/// `{public_url}/hooks/telegram/{bot}`.
fn hook_url(base: &str, spec: &BotSpec) -> String {
    format!(
        "{}/hooks/telegram/{}",
        base.trim_end_matches('/'),
        spec.id.as_str()
    )
}

/// Long polling from an offset.
struct Poller {
    poll: LongPoll,
    api: Arc<BotApi>,
    bot: BotId,
    offset: i64,
    client: TelegramClient,
    /// A webhook left from webhook mode was deleted once already (a second 409 is another
    /// poller's, reported as a conflict).
    webhook_cleared: bool,
}

#[async_trait]
impl Receiver for Poller {
    async fn next(&mut self) -> Result<Batch, PlatformError> {
        let updates = match self.poll.get_updates(&self.api, self.offset).await {
            Err(TelegramError::Conflict(d)) if d.contains("webhook") && !self.webhook_cleared => {
                // The bot went back to polling from webhook mode: the webhook goes first.
                self.webhook_cleared = true;
                self.client.delete_webhook(&self.api).await?;
                self.poll.get_updates(&self.api, self.offset).await?
            }
            r => r?,
        };
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
    fn defer_after(&self, event: &botfleet_core::Inbound) -> Option<std::time::Duration> {
        // A button's spinner: Telegram lets a query be answered for about 15 s.
        event
            .answer_handle
            .is_some()
            .then_some(crate::outbound::CALLBACK_DEFER)
    }

    fn typing_every(&self, _: &botfleet_core::Inbound) -> Option<std::time::Duration> {
        // `sendChatAction` shows for 5 s, or until the bot's next message.
        Some(std::time::Duration::from_secs(4))
    }

    async fn send(&self, out: &Outbound) -> Result<(), PlatformError> {
        Ok(send(&self.client, &self.api, out).await?)
    }

    async fn act(
        &self,
        chat: &ChatKey,
        act: &Act<'_>,
        _key: &str,
    ) -> Result<Option<String>, PlatformError> {
        Ok(crate::act(&self.client, &self.api, &chat.chat, act).await?)
    }

    fn buckets(
        &self,
        chat: &ChatKey,
        call: botfleet_platform::Call<'_>,
    ) -> Vec<botfleet_platform::Bucket> {
        crate::outbound::limits::buckets(&chat.chat, call)
    }

    /// In a private chat, as message drafts.
    fn streams_in(&self, event: &botfleet_core::Inbound) -> bool {
        crate::outbound::drafts_in(&event.chat.chat)
    }

    async fn stream(
        &self,
        event: &botfleet_core::Inbound,
        step: botfleet_platform::StreamStep<'_>,
        key: &str,
    ) -> Result<Option<String>, PlatformError> {
        Ok(crate::outbound::stream(&self.client, &self.api, &event.chat.chat, step, key).await?)
    }
}

/// Telegram's webhook mode: deliveries carry the bot's secret token in
/// `X-Telegram-Bot-Api-Secret-Token`; the body is one `Update`.
#[derive(Clone, Debug)]
pub struct TelegramHooks {
    client: TelegramClient,
}

impl TelegramConnector {
    /// The webhook side of this connector (sharing its connection pool).
    pub fn hooks(&self) -> TelegramHooks {
        TelegramHooks {
            client: self.client.clone(),
        }
    }
}

impl Webhooks for TelegramHooks {
    fn platform(&self) -> Platform {
        Platform::Telegram
    }

    fn receive(&self, spec: &BotSpec, req: &HookRequest<'_>) -> Result<HookAnswer, HookRefusal> {
        if req.method != "POST" {
            return Err(HookRefusal {
                status: 405,
                reason: "method",
            });
        }
        let given = req.header("x-telegram-bot-api-secret-token").unwrap_or("");
        let ok = spec
            .hook
            .secret
            .as_ref()
            .is_some_and(|s| secrets_match(s.expose().as_bytes(), given.as_bytes()));
        if !ok {
            return Err(HookRefusal {
                status: 401,
                reason: "bad_secret_token",
            });
        }
        let mut answer = (Vec::new(), 0, 0);
        match serde_json::from_slice::<serde_json::Value>(req.body) {
            Ok(json) => {
                let raw = RawUpdate {
                    update_id: json.get("update_id").and_then(serde_json::Value::as_i64),
                    json,
                };
                match parse_update(&spec.id, &raw) {
                    Update::Message(m) => answer.0.push(Received {
                        key: m.message_id.clone(),
                        message: m,
                    }),
                    Update::Ignored => answer.1 += 1,
                    Update::Malformed(_) => answer.2 += 1,
                }
            }
            Err(_) => answer.2 += 1,
        }
        Ok(HookAnswer::Deliver {
            messages: answer.0,
            seen: Vec::new(),
            ignored: answer.1,
            malformed: answer.2,
        })
    }

    fn sender(&self, spec: &BotSpec) -> Result<Arc<dyn Sender>, PlatformError> {
        Ok(Arc::new(TelegramSender {
            client: self.client.clone(),
            api: Arc::new(TelegramConnector::api(spec)?),
        }))
    }
}
