//! WhatsApp Cloud API on the platform seam: signed webhook deliveries to every worker,
//! replies through the Graph API.

use std::sync::Arc;

use async_trait::async_trait;
use botfleet_core::{BotId, BotSpec, ChatKey, Inbound, Outbound, Platform};
use botfleet_platform::{
    secrets_match, Connection, Connector, ErrorKind, HookAnswer, HookRefusal, HookRequest,
    Identity, PlatformError, Received, Sender, Webhooks,
};
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;

use crate::{GraphClient, Number};

/// `sha256=<hex of HMAC-SHA256(app_secret, body)>`, as Meta signs deliveries
/// (`X-Hub-Signature-256`).
pub fn sign(app_secret: &str, body: &[u8]) -> String {
    let mut out = String::from("sha256=");
    if let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(app_secret.as_bytes()) {
        mac.update(body);
        for b in mac.finalize().into_bytes() {
            out.push_str(&format!("{b:02x}"));
        }
    }
    out
}

/// What one delivery holds for `bot` (whose number is `phone_number_id`, when known): text
/// messages (keyed by their `wamid`), how many changes were of kinds the bot does not handle
/// (statuses, other fields, media, another number of the same app), and how many could not
/// be read.
pub fn parse_delivery(
    bot: &BotId,
    phone_number_id: Option<&str>,
    body: &[u8],
) -> (Vec<Received>, usize, usize) {
    let Ok(doc) = serde_json::from_slice::<Value>(body) else {
        return (Vec::new(), 0, 1);
    };
    let (mut out, mut ignored, mut malformed) = (Vec::new(), 0, 0);
    let Some(entries) = doc["entry"].as_array() else {
        return (out, 0, 1);
    };
    for entry in entries {
        for change in entry["changes"].as_array().into_iter().flatten() {
            if change["field"] != "messages" {
                ignored += 1;
                continue;
            }
            let value = &change["value"];
            // One app's subscription carries every number of it: only this bot's count.
            let number = value["metadata"]["phone_number_id"].as_str();
            if let (Some(mine), Some(got)) = (phone_number_id, number) {
                if mine != got {
                    ignored += 1;
                    continue;
                }
            }
            ignored += value["statuses"].as_array().map_or(0, Vec::len);
            for m in value["messages"].as_array().into_iter().flatten() {
                let (Some(id), Some(from)) = (m["id"].as_str(), m["from"].as_str()) else {
                    malformed += 1;
                    continue;
                };
                if m["type"] != "text" {
                    ignored += 1;
                    continue;
                }
                let Some(text) = m["text"]["body"].as_str() else {
                    malformed += 1;
                    continue;
                };
                let sent_at_ms = m["timestamp"]
                    .as_str()
                    .and_then(|t| t.parse::<i64>().ok())
                    .map(|s| s.saturating_mul(1000));
                out.push(Received {
                    key: id.to_owned(),
                    message: Inbound {
                        platform: Platform::Whatsapp,
                        chat: ChatKey::new(bot.clone(), from.to_owned()),
                        message_id: id.to_owned(),
                        sender: Some(from.to_owned()),
                        text: text.to_owned(),
                        sent_at_ms,
                    },
                });
            }
        }
    }
    (out, ignored, malformed)
}

/// The WhatsApp platform (Cloud API): one Graph client for every bot of the process.
#[derive(Clone, Debug)]
pub struct WhatsappConnector {
    client: GraphClient,
    #[cfg(feature = "web")]
    web: crate::device::WebConfig,
    #[cfg(feature = "web")]
    web_stats: Arc<crate::device::WebStats>,
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

struct CloudSender {
    client: GraphClient,
    number: Number,
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
                let (messages, ignored, malformed) =
                    parse_delivery(&spec.id, spec.options.phone_number_id.as_deref(), req.body);
                Ok(HookAnswer::Deliver {
                    messages,
                    ignored,
                    malformed,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_text_messages_and_skips_the_rest() {
        let bot = BotId::new("wa").unwrap();
        let body = serde_json::json!({
            "object": "whatsapp_business_account",
            "entry": [{"id": "1", "changes": [
                {"field": "messages", "value": {
                    "messaging_product": "whatsapp",
                    "metadata": {"phone_number_id": "123"},
                    "messages": [
                        {"from": "4915", "id": "wamid.A", "timestamp": "1700000000", "type": "text", "text": {"body": "hi"}},
                        {"from": "4915", "id": "wamid.B", "type": "image", "image": {}},
                        {"id": "wamid.C", "type": "text", "text": {"body": "no sender"}}
                    ],
                    "statuses": [{"id": "wamid.X", "status": "delivered"}]
                }},
                {"field": "account_update", "value": {}}
            ]}]
        });
        let (msgs, ignored, malformed) =
            parse_delivery(&bot, Some("123"), body.to_string().as_bytes());
        assert_eq!(msgs.len(), 1);
        assert_eq!(msgs[0].key, "wamid.A");
        assert_eq!(msgs[0].message.chat.chat, "4915");
        assert_eq!(msgs[0].message.text, "hi");
        assert_eq!(msgs[0].message.sent_at_ms, Some(1_700_000_000_000));
        assert_eq!((ignored, malformed), (3, 1));
        assert_eq!(parse_delivery(&bot, None, b"not json").2, 1);
        assert_eq!(parse_delivery(&bot, None, b"{}").2, 1);
        // Another number of the same app: not this bot's.
        let (msgs, ignored, _) = parse_delivery(&bot, Some("999"), body.to_string().as_bytes());
        assert!(msgs.is_empty());
        assert_eq!(ignored, 2);
    }

    #[test]
    fn signatures_follow_the_known_vector() {
        // RFC 4231 test case 2.
        assert_eq!(
            sign("Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
