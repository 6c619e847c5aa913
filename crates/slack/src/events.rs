//! The Slack Events API (`--mode events`): Slack POSTs each event to every worker's hooks
//! address, signed with the app's signing secret.

use std::sync::Arc;

use botfleet_core::BotSpec;
use botfleet_platform::{
    secrets_match, HookAnswer, HookRefusal, HookRequest, PlatformError, Received, Sender, Webhooks,
};
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;

use crate::{parse_command, parse_event, parse_interactive, Event, Me, SlackClient};

/// How old a request's timestamp may be (either way), as Slack advises: older ones are
/// refused as possible replays.
pub const MAX_SKEW_S: i64 = 300;

/// `v0=<hex of HMAC-SHA256(signing_secret, "v0:{timestamp}:{body}")>`, Slack's
/// `X-Slack-Signature`.
pub fn sign(signing_secret: &str, timestamp: &str, body: &[u8]) -> String {
    let mut out = String::from("v0=");
    if let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(signing_secret.as_bytes()) {
        mac.update(b"v0:");
        mac.update(timestamp.as_bytes());
        mac.update(b":");
        mac.update(body);
        for b in mac.finalize().into_bytes() {
            out.push_str(&format!("{b:02x}"));
        }
    }
    out
}

/// Slack's Events API deliveries for bots in `events` mode.
#[derive(Clone, Debug)]
pub struct SlackEvents {
    pub(crate) client: SlackClient,
}

impl Webhooks for SlackEvents {
    fn platform(&self) -> botfleet_core::Platform {
        botfleet_core::Platform::Slack
    }

    fn receive(&self, spec: &BotSpec, req: &HookRequest<'_>) -> Result<HookAnswer, HookRefusal> {
        if req.method != "POST" {
            return Err(HookRefusal {
                status: 405,
                reason: "method",
            });
        }
        let ts = req.header("x-slack-request-timestamp").unwrap_or("");
        let fresh = ts.parse::<i64>().is_ok_and(|t| {
            let now = botfleet_core::unix_ms() / 1000;
            now.abs_diff(t) <= MAX_SKEW_S.unsigned_abs()
        });
        if !fresh {
            return Err(HookRefusal {
                status: 401,
                reason: "stale_timestamp",
            });
        }
        let given = req.header("x-slack-signature").unwrap_or("");
        let ok = spec.hook.secret.as_ref().is_some_and(|s| {
            secrets_match(sign(s.expose(), ts, req.body).as_bytes(), given.as_bytes())
        });
        if !ok {
            return Err(HookRefusal {
                status: 401,
                reason: "bad_signature",
            });
        }
        // Slash commands come as a form (`command=/name&text=…`), signed the same way. An
        // empty 200 acknowledges one without a visible answer; the reply follows in the
        // channel.
        if req
            .header("content-type")
            .is_some_and(|t| t.starts_with("application/x-www-form-urlencoded"))
        {
            let form = Value::Object(
                botfleet_platform::form_pairs(req.body)
                    .into_iter()
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect(),
            );
            // Interactions (a button pressed) come to the app's Interactivity Request URL as
            // a form with their JSON in `payload`; commands as the form's fields.
            let event = match form.get("payload").and_then(Value::as_str) {
                Some(p) => match serde_json::from_str::<Value>(p) {
                    Ok(p) => parse_interactive(&spec.id, &p),
                    Err(e) => Event::Malformed(format!("interaction payload: {e}")),
                },
                None => parse_command(&spec.id, &form),
            };
            let (messages, ignored, malformed) = match event {
                Event::Message(key, message) => (vec![Received { key, message }], 0, 0),
                Event::Ignored => (Vec::new(), 1, 0),
                Event::Malformed(_) => (Vec::new(), 0, 1),
            };
            return Ok(HookAnswer::Deliver {
                messages,
                seen: Vec::new(),
                ignored,
                malformed,
            });
        }
        let Ok(doc) = serde_json::from_slice::<Value>(req.body) else {
            return Ok(HookAnswer::Deliver {
                messages: Vec::new(),
                seen: Vec::new(),
                ignored: 0,
                malformed: 1,
            });
        };
        match doc["type"].as_str() {
            Some("url_verification") => Ok(HookAnswer::Respond {
                status: 200,
                content_type: "text/plain",
                body: doc["challenge"].as_str().unwrap_or("").to_owned(),
            }),
            Some("event_callback") => {
                // The bot's own user (messages from it are not answered); bots' messages are
                // left out by their bot_id anyway. A person's authorization is not the bot.
                let me = Me {
                    user_id: doc["authorizations"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|a| a["is_bot"] == true)
                        .and_then(|a| a["user_id"].as_str())
                        .unwrap_or("")
                        .to_owned(),
                    bot_id: None,
                };
                let (messages, ignored, malformed) = match parse_event(&spec.id, &me, &doc) {
                    Event::Message(key, message) => (vec![Received { key, message }], 0, 0),
                    Event::Ignored => (Vec::new(), 1, 0),
                    Event::Malformed(_) => (Vec::new(), 0, 1),
                };
                Ok(HookAnswer::Deliver {
                    messages,
                    seen: Vec::new(),
                    ignored,
                    malformed,
                })
            }
            // app_rate_limited and the like: taken, nothing to answer.
            _ => Ok(HookAnswer::Deliver {
                messages: Vec::new(),
                seen: Vec::new(),
                ignored: 1,
                malformed: 0,
            }),
        }
    }

    fn sender(&self, spec: &BotSpec) -> Result<Arc<dyn Sender>, PlatformError> {
        Ok(Arc::new(crate::connector::SlackSender::new(
            self.client.clone(),
            crate::SlackConnector::api(spec)?,
            None,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_match_slacks_documented_example() {
        // The example of Slack's "Verifying requests from Slack" guide.
        let body = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
        assert_eq!(
            sign("8f742231b10e8888abcd99yyyzzz85a5", "1531420618", body),
            "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"
        );
    }
}
