//! Slack on the platform seam: `auth.test` verifies, Socket Mode receives (envelopes
//! acknowledged once recorded), `chat.postMessage` sends. No checkpoint: what was received and
//! not answered is in the inbox.

use std::sync::{
    atomic::{AtomicI64, Ordering},
    Arc,
};

use async_trait::async_trait;
use botfleet_core::{BotSpec, Outbound};
use botfleet_platform::{Connection, Connector, ErrorKind, Identity, PlatformError, Sender};

use crate::{
    inbound::Me, send, socket::SocketReceiver, SlackApi, SlackClient, SlackConfig, SlackError,
};

/// The Slack platform: one HTTP pool for every bot of the process, and a count of its sockets.
#[derive(Clone, Debug)]
pub struct SlackConnector {
    client: SlackClient,
    open: Arc<AtomicI64>,
}

impl SlackConnector {
    /// A connector with its own connection pool.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(config: SlackConfig) -> Result<Self, SlackError> {
        Ok(Self {
            client: SlackClient::new(config)?,
            open: Arc::new(AtomicI64::new(0)),
        })
    }

    pub(crate) fn api(spec: &BotSpec) -> Result<SlackApi, PlatformError> {
        if crate::DESCRIPTOR.is_webhook(spec) {
            // No socket to open: the app token is never used (the bot token stands in).
            let app = spec.app_token.as_ref().unwrap_or(&spec.token);
            return Ok(SlackApi::new(
                spec.options.api_url.as_deref(),
                &spec.token,
                app,
            ));
        }
        let app = spec.app_token.as_ref().ok_or_else(|| {
            PlatformError::new(
                ErrorKind::Rejected,
                "no_app_token",
                "a Slack bot needs an app token (xapp-…) for Socket Mode",
            )
        })?;
        Ok(SlackApi::new(
            spec.options.api_url.as_deref(),
            &spec.token,
            app,
        ))
    }
}

#[async_trait]
impl Connector for SlackConnector {
    fn descriptor(&self) -> &'static botfleet_core::Descriptor {
        &crate::DESCRIPTOR
    }

    async fn fetch_file(
        &self,
        spec: &BotSpec,
        source: &str,
    ) -> Result<botfleet_platform::FileBody, PlatformError> {
        let resp = self.client.download(&Self::api(spec)?, source).await?;
        Ok(botfleet_platform::FileBody::from_response(resp))
    }

    async fn verify(&self, spec: &BotSpec) -> Result<Identity, PlatformError> {
        let info = self.client.auth_test(&Self::api(spec)?).await?;
        Ok(Identity {
            user_id: info.user_id,
            name: info.bot_id,
        })
    }

    async fn connect(
        &self,
        spec: &BotSpec,
        _checkpoint: Option<&str>,
    ) -> Result<Connection, PlatformError> {
        let api = Self::api(spec)?;
        let info = self.client.auth_test(&api).await?;
        if crate::DESCRIPTOR.is_webhook(spec) {
            return Ok(Connection {
                receiver: Box::new(botfleet_platform::NoDeliveries),
                sender: Arc::new(SlackSender::new(self.client.clone(), api, info.team_id)),
            });
        }
        let mut receiver = SocketReceiver::new(
            self.client.clone(),
            api.clone(),
            spec.id.clone(),
            Me {
                user_id: info.user_id,
                bot_id: info.bot_id,
            },
            self.open.clone(),
        );
        // Open the socket now: a refused app token fails the bot here, not later.
        receiver.open_now().await?;
        Ok(Connection {
            receiver: Box::new(receiver),
            sender: Arc::new(SlackSender::new(self.client.clone(), api, info.team_id)),
        })
    }

    fn webhooks(&self) -> Option<Arc<dyn botfleet_platform::Webhooks>> {
        Some(Arc::new(crate::SlackEvents {
            client: self.client.clone(),
        }))
    }

    fn open_connections(&self) -> Option<u64> {
        Some(self.open.load(Ordering::Relaxed).max(0).unsigned_abs())
    }
}

pub(crate) struct SlackSender {
    client: SlackClient,
    api: SlackApi,
    /// The bot's workspace (`auth.test`'s `team_id`): the recipient's team of a stream
    /// outside a DM. Asked for when first needed when the connection did not tell it.
    team: tokio::sync::OnceCell<String>,
}

impl SlackSender {
    pub(crate) fn new(client: SlackClient, api: SlackApi, team: Option<String>) -> Self {
        Self {
            client,
            api,
            team: tokio::sync::OnceCell::new_with(team),
        }
    }

    async fn team(&self) -> Result<&str, SlackError> {
        let team = self
            .team
            .get_or_try_init(|| async {
                let info = self.client.auth_test(&self.api).await?;
                info.team_id
                    .ok_or_else(|| SlackError::Malformed("auth.test: no team_id".into()))
            })
            .await?;
        Ok(team)
    }
}

#[async_trait]
impl Sender for SlackSender {
    async fn send(&self, out: &Outbound) -> Result<(), PlatformError> {
        Ok(send(&self.client, &self.api, out).await?)
    }

    async fn act(
        &self,
        chat: &botfleet_core::ChatKey,
        act: &botfleet_core::Act<'_>,
        _key: &str,
    ) -> Result<Option<String>, PlatformError> {
        Ok(crate::outbound::act(&self.client, &self.api, &chat.chat, act).await?)
    }

    fn buckets(
        &self,
        chat: &botfleet_core::ChatKey,
        call: botfleet_platform::Call<'_>,
    ) -> Vec<botfleet_platform::Bucket> {
        crate::outbound::limits::buckets(&chat.chat, call)
    }

    /// In a thread (where the answer goes anyway: Slack streams only replies in a thread),
    /// to the user who wrote.
    fn streams_in(&self, event: &botfleet_core::Inbound) -> bool {
        crate::outbound::channel_and_thread(&event.chat.chat)
            .1
            .is_some()
            && event.sender.is_some()
    }

    async fn stream(
        &self,
        event: &botfleet_core::Inbound,
        step: botfleet_platform::StreamStep<'_>,
        _key: &str,
    ) -> Result<Option<String>, PlatformError> {
        let (channel, thread) = crate::outbound::channel_and_thread(&event.chat.chat);
        let user = event.sender.as_deref();
        let (Some(thread), Some(user)) = (thread, user) else {
            return Err(PlatformError::new(
                ErrorKind::Rejected,
                "unsupported",
                "a Slack stream answers a user in a thread",
            ));
        };
        let recipient = if channel.starts_with('D') {
            None
        } else {
            Some((self.team().await?, user))
        };
        let streams = crate::outbound::Streams {
            client: &self.client,
            api: &self.api,
            channel,
        };
        Ok(streams.step(thread, recipient, step).await?)
    }
}
