//! WhatsApp on the platform seam: Cloud API bots (signed webhook deliveries to every worker,
//! replies through the Graph API) and, with the `web` feature, device-link bots.

use std::sync::Arc;

use async_trait::async_trait;
use botfleet_core::{BotSpec, Platform};
use botfleet_platform::{
    secrets_match, Connection, Connector, ErrorKind, HookAnswer, HookRefusal, HookRequest,
    Identity, PlatformError, Sender, Webhooks,
};

use crate::{outbound::CloudSender, parse_delivery, sign, GraphClient, Number};

/// The WhatsApp platform (Cloud API): one Graph client for every bot of the process.
#[derive(Clone, Debug)]
pub struct WhatsappConnector {
    client: GraphClient,
    #[cfg(feature = "web")]
    web: crate::device::WebConfig,
    #[cfg(feature = "web")]
    web_stats: Arc<crate::device::WebStats>,
    /// Downloads of device-link bots' files (any worker, no session).
    #[cfg(feature = "web")]
    web_http: Arc<crate::device::Http>,
}

impl WhatsappConnector {
    /// A connector with its own connection pool.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new() -> Result<Self, crate::WhatsappError> {
        Ok(Self {
            client: GraphClient::new()?,
            #[cfg(feature = "web")]
            web: crate::device::WebConfig::default(),
            #[cfg(feature = "web")]
            web_stats: Arc::default(),
            #[cfg(feature = "web")]
            web_http: Arc::new(
                crate::device::Http::new()
                    .map_err(|e| crate::WhatsappError::Network(e.without_url()))?,
            ),
        })
    }

    /// How device-link bots (`--mode web`) connect.
    #[cfg(feature = "web")]
    #[must_use]
    pub fn with_web(mut self, web: crate::device::WebConfig) -> Self {
        self.web = web;
        self
    }

    /// The webhook side, sharing the connection pool.
    pub fn hooks(&self) -> CloudHooks {
        CloudHooks {
            client: self.client.clone(),
        }
    }
}

fn number(spec: &BotSpec) -> Result<Number, PlatformError> {
    let id = spec.options.phone_number_id.as_deref().ok_or_else(|| {
        PlatformError::new(
            ErrorKind::Rejected,
            "no_phone_number_id",
            "a Cloud API bot needs its phone number id",
        )
    })?;
    Ok(Number::new(
        spec.options.api_url.as_deref(),
        id,
        &spec.token,
    ))
}

#[async_trait]
impl Connector for WhatsappConnector {
    fn descriptor(&self) -> &'static botfleet_core::Descriptor {
        &crate::DESCRIPTOR
    }

    fn webhooks(&self) -> Option<Arc<dyn Webhooks>> {
        Some(Arc::new(self.hooks()))
    }

    #[cfg(feature = "web")]
    fn open_connections(&self) -> Option<u64> {
        Some(
            self.web_stats
                .open
                .load(std::sync::atomic::Ordering::Relaxed)
                .max(0)
                .unsigned_abs(),
        )
    }

    #[cfg(feature = "web")]
    fn stats(&self) -> Vec<botfleet_platform::Stat> {
        use std::sync::atomic::Ordering::Relaxed;
        let s = &self.web_stats;
        vec![
            botfleet_platform::Stat {
                name: "whatsapp_session_writes_refused_total",
                help: "Linked-session writes refused because a newer owner held the bot.",
                kind: "counter",
                value: s.refused_writes.load(Relaxed) as f64,
            },
            botfleet_platform::Stat {
                name: "whatsapp_logged_out_total",
                help: "Linked sessions logged out by the phone (the bot fails: link again).",
                kind: "counter",
                value: s.logged_out.load(Relaxed) as f64,
            },
            botfleet_platform::Stat {
                name: "whatsapp_replaced_total",
                help: "Linked sessions another connection took over (the bot stops).",
                kind: "counter",
                value: s.replaced.load(Relaxed) as f64,
            },
        ]
    }

    async fn fetch_file(
        &self,
        spec: &BotSpec,
        source: &str,
    ) -> Result<botfleet_platform::FileBody, PlatformError> {
        if crate::DESCRIPTOR.mode_name(spec) == "web" {
            #[cfg(feature = "web")]
            return crate::web_media::fetch(self.web_http.clone(), source).await;
            #[cfg(not(feature = "web"))]
            return Err(botfleet_platform::no_files());
        }
        let resp = self.client.download_media(&number(spec)?, source).await?;
        Ok(botfleet_platform::FileBody::from_response(resp))
    }

    async fn verify(&self, spec: &BotSpec) -> Result<Identity, PlatformError> {
        if crate::DESCRIPTOR.mode_name(spec) == "web" {
            // A linked device has no token to check: its session is checked on connecting.
            web_in_build()?;
            return Ok(Identity {
                user_id: spec.id.to_string(),
                name: None,
            });
        }
        let n = number(spec)?;
        let shown = self.client.verify(&n).await?;
        Ok(Identity {
            user_id: spec.options.phone_number_id.clone().unwrap_or_default(),
            name: Some(shown),
        })
    }

    async fn connect_with_session(
        &self,
        spec: &BotSpec,
        checkpoint: Option<&str>,
        may_act: botfleet_platform::MayAct,
        session: Arc<dyn botfleet_platform::SessionKv>,
    ) -> Result<Connection, PlatformError> {
        if crate::DESCRIPTOR.mode_name(spec) == "web" {
            web_in_build()?;
            #[cfg(feature = "web")]
            return crate::device::connect(&self.web, &self.web_stats, spec, may_act, session)
                .await;
        }
        let _ = (may_act, session);
        self.connect(spec, checkpoint).await
    }

    async fn connect(
        &self,
        spec: &BotSpec,
        _checkpoint: Option<&str>,
    ) -> Result<Connection, PlatformError> {
        if crate::DESCRIPTOR.mode_name(spec) == "web" {
            return Err(PlatformError::new(
                ErrorKind::Rejected,
                "no_session",
                "a device-link bot connects with its session (connect_with_session)",
            ));
        }
        // Deliveries reach every worker's hooks address (the subscription is set in the
        // Meta app); the unit only watches the credentials.
        Ok(Connection {
            receiver: Box::new(botfleet_platform::NoDeliveries),
            sender: Arc::new(CloudSender {
                client: self.client.clone(),
                number: number(spec)?,
            }),
        })
    }
}

/// Refuses device-link bots in a build without the `web` feature.
fn web_in_build() -> Result<(), PlatformError> {
    if cfg!(feature = "web") {
        Ok(())
    } else {
        Err(PlatformError::new(
            ErrorKind::Rejected,
            "mode",
            "WhatsApp device-link (mode web) is not in this build (cargo feature `web`)",
        ))
    }
}

/// Cloud API deliveries: `GET` is the subscription handshake, `POST` a signed change.
#[derive(Clone, Debug)]
pub struct CloudHooks {
    client: GraphClient,
}

impl Webhooks for CloudHooks {
    fn platform(&self) -> Platform {
        Platform::Whatsapp
    }

    fn receive(&self, spec: &BotSpec, req: &HookRequest<'_>) -> Result<HookAnswer, HookRefusal> {
        match req.method {
            "GET" => {
                let token = req.query_param("hub.verify_token").unwrap_or_default();
                let ok =
                    req.query_param("hub.mode").as_deref() == Some("subscribe")
                        && spec.hook.verify_token.as_ref().is_some_and(|v| {
                            secrets_match(v.expose().as_bytes(), token.as_bytes())
                        });
                if !ok {
                    return Err(HookRefusal {
                        status: 403,
                        reason: "bad_verify_token",
                    });
                }
                Ok(HookAnswer::Respond {
                    status: 200,
                    content_type: "text/plain",
                    body: req.query_param("hub.challenge").unwrap_or_default(),
                })
            }
            "POST" => {
                let given = req.header("x-hub-signature-256").unwrap_or("");
                let ok = spec.hook.secret.as_ref().is_some_and(|s| {
                    secrets_match(sign(s.expose(), req.body).as_bytes(), given.as_bytes())
                });
                if !ok {
                    return Err(HookRefusal {
                        status: 401,
                        reason: "bad_signature",
                    });
                }
                let d = parse_delivery(&spec.id, spec.options.phone_number_id.as_deref(), req.body);
                Ok(HookAnswer::Deliver {
                    messages: d.messages,
                    seen: d.seen,
                    ignored: d.ignored,
                    malformed: d.malformed,
                })
            }
            _ => Err(HookRefusal {
                status: 405,
                reason: "method",
            }),
        }
    }

    fn sender(&self, spec: &BotSpec) -> Result<Arc<dyn Sender>, PlatformError> {
        Ok(Arc::new(CloudSender {
            client: self.client.clone(),
            number: number(spec)?,
        }))
    }
}
