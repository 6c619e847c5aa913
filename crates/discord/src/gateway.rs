//! One shard's gateway session: connect, HELLO, IDENTIFY (through the gate) or RESUME,
//! heartbeats with zombie detection, dispatches, op 7 RECONNECT, op 9 INVALID_SESSION and
//! close codes. The session (`session_id`, `resume_gateway_url`, the last sequence) lives in
//! memory here; the connector writes it behind as the bot's checkpoint.

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicI64, AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use botfleet_core::BotId;
use botfleet_platform::Received;
use futures_util::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::{
    connect_async_with_config,
    tungstenite::{
        protocol::{frame::coding::CloseCode, CloseFrame, WebSocketConfig},
        Message,
    },
};
use tracing::{debug, info, warn};

use crate::{
    connector::IdentifyGate,
    error::{close_action, CloseAction},
    inbound::{parse_edit, parse_message},
    DiscordApi, DiscordConfig, DiscordError,
};

/// The intents a bot needs to answer messages: guild messages, direct messages, message
/// content.
pub const INTENTS: u64 = (1 << 9) | (1 << 12) | (1 << 15);

/// Added to the identify spacing (see [`DiscordConfig::identify_spacing`]).
const IDENTIFY_MARGIN: Duration = Duration::from_millis(100);

/// A shard's resumable session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardSession {
    /// `session_id` from READY.
    pub id: String,
    /// `resume_gateway_url` from READY.
    pub url: String,
    /// The last sequence number recorded.
    pub seq: u64,
}

/// What a bot stores to resume its shards elsewhere: the shard count and each shard's session.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The shard count the sessions belong to.
    pub shards: u32,
    /// Shard id → session.
    pub sessions: BTreeMap<u32, ShardSession>,
}

/// What a shard tells its bot.
#[derive(Debug)]
pub(crate) enum ShardEvent {
    /// A message to handle, at this sequence number.
    Message {
        shard: u32,
        seq: u64,
        // Boxed: the other events are small, and a queue holds many.
        received: Box<Received>,
    },
    /// A dispatch that could not be read.
    Malformed { shard: u32, seq: u64 },
    /// A new session (READY), or none (invalidated: the next connection identifies).
    Session {
        shard: u32,
        session: Option<ShardSession>,
    },
    /// The shard stopped for good: the bot fails with this.
    Fatal(DiscordError),
}

/// Counters the connector shows.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) identifies: AtomicU64,
    pub(crate) resumes: AtomicU64,
    pub(crate) open: AtomicI64,
    /// Milliseconds shards waited for the identify gate.
    pub(crate) identify_wait_ms: AtomicU64,
    /// The identify budget left, as `gateway/bot` last said (the lowest of the bots seen).
    pub(crate) budget_left: AtomicU64,
}

/// Everything one shard's task needs.
pub(crate) struct Shard {
    pub(crate) config: DiscordConfig,
    pub(crate) api: DiscordApi,
    pub(crate) bot: BotId,
    /// The bot's own id (without a slice suffix): Discord's identify rule is per bot.
    pub(crate) gate_key: String,
    pub(crate) me: String,
    pub(crate) id: u32,
    pub(crate) total: u32,
    pub(crate) bucket: u32,
    pub(crate) gateway_url: String,
    pub(crate) gate: Arc<dyn IdentifyGate>,
    pub(crate) tx: mpsc::UnboundedSender<ShardEvent>,
    pub(crate) stop: watch::Receiver<bool>,
    pub(crate) counters: Arc<Counters>,
    /// Asked before every connect, IDENTIFY and RESUME: no means stop (the worker lost the
    /// bot, or it is stopping).
    pub(crate) may_act: botfleet_platform::MayAct,
}

/// How one connection ended.
enum End {
    Stopped,
    Fatal(DiscordError),
    /// Connect again: `identify` when the session is gone, `clean` when Discord asked (no
    /// backoff).
    Again {
        identify: bool,
        clean: bool,
    },
}

/// The gateway URL with the version and encoding: `wss://gateway.discord.gg/?v=10&…`, or
/// `…/path?v=10&…` when the URL has a path.
fn with_query(url: &str) -> String {
    let base = url.trim_end_matches('/');
    let has_path = base
        .split_once("://")
        .is_some_and(|(_, rest)| rest.contains('/'));
    if has_path {
        format!("{base}?v=10&encoding=json")
    } else {
        format!("{base}/?v=10&encoding=json")
    }
}

/// A small random number in `0..n` (from the clock; only for jitter).
fn jitter(n: u64) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::from(d.subsec_nanos()));
    if n == 0 {
        0
    } else {
        nanos.wrapping_mul(0x9e37_79b9_7f4a_7c15) % n
    }
}

impl Shard {
    /// Runs the shard until stopped or refused for good.
    pub(crate) async fn run(mut self, mut session: Option<ShardSession>) {
        let mut backoff = Duration::from_secs(1);
        loop {
            if *self.stop.borrow() || !(self.may_act)() {
                return;
            }
            match self.connection(&mut session).await {
                End::Stopped => return,
                End::Fatal(e) => {
                    warn!(bot = %self.bot, shard = self.id, error = %e, "shard stopped for good");
                    let _ = self.tx.send(ShardEvent::Fatal(e));
                    return;
                }
                End::Again { identify, clean } => {
                    if identify && session.take().is_some() {
                        let _ = self.tx.send(ShardEvent::Session {
                            shard: self.id,
                            session: None,
                        });
                    }
                    if clean {
                        backoff = Duration::from_secs(1);
                        continue;
                    }
                    let wait = backoff + Duration::from_millis(jitter(1000));
                    backoff = (backoff * 2).min(Duration::from_secs(60));
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        _ = self.stop.changed() => return,
                    }
                }
            }
        }
    }

    fn ws_config(&self) -> WebSocketConfig {
        WebSocketConfig::default()
            .read_buffer_size(self.config.read_buffer)
            .write_buffer_size(0)
            .max_write_buffer_size(1 << 20)
            .max_message_size(Some(self.config.max_message))
            .max_frame_size(Some(self.config.max_message))
    }

    async fn connection(&mut self, session: &mut Option<ShardSession>) -> End {
        let url = with_query(session.as_ref().map_or(&self.gateway_url, |s| &s.url));
        let limit = self.config.connect_timeout;
        let ws = match tokio::time::timeout(
            limit,
            connect_async_with_config(url.as_str(), Some(self.ws_config()), true),
        )
        .await
        {
            Ok(Ok((ws, _))) => ws,
            Ok(Err(e)) => {
                debug!(bot = %self.bot, shard = self.id, error = %e, "gateway connect failed");
                return End::Again {
                    identify: false,
                    clean: false,
                };
            }
            Err(_) => {
                return End::Again {
                    identify: false,
                    clean: false,
                }
            }
        };
        self.counters.open.fetch_add(1, Ordering::Relaxed);
        let end = self.session(ws, session).await;
        self.counters.open.fetch_sub(1, Ordering::Relaxed);
        end
    }

    // Each arm of the frame match reads as the protocol does; collapsing a send into a guard
    // would hide it.
    #[allow(clippy::collapsible_match)]
    async fn session(
        &mut self,
        mut ws: tokio_tungstenite::WebSocketStream<
            tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
        >,
        session: &mut Option<ShardSession>,
    ) -> End {
        // HELLO first.
        let hello = tokio::time::timeout(self.config.connect_timeout, ws.next()).await;
        let interval = match hello {
            Ok(Some(Ok(Message::Text(t)))) => {
                let v: Value = serde_json::from_str(&t).unwrap_or(Value::Null);
                match (v["op"].as_u64(), v["d"]["heartbeat_interval"].as_u64()) {
                    (Some(10), Some(ms)) if ms > 0 => Duration::from_millis(ms),
                    _ => {
                        return End::Again {
                            identify: false,
                            clean: false,
                        }
                    }
                }
            }
            Ok(Some(Ok(Message::Close(frame)))) => {
                return self.closed(frame.map(|f| u16::from(f.code)))
            }
            _ => {
                return End::Again {
                    identify: false,
                    clean: false,
                }
            }
        };
        let token = self.api.token().expose().to_owned();
        let first = match session.as_ref() {
            Some(s) => {
                self.counters.resumes.fetch_add(1, Ordering::Relaxed);
                debug!(bot = %self.bot, shard = self.id, seq = s.seq, "resuming");
                json!({"op": 6, "d": {"token": token, "session_id": s.id, "seq": s.seq}})
            }
            None => {
                let waited = std::time::Instant::now();
                tokio::select! {
                    // A margin over Discord's spacing: the gap Discord measures is between
                    // arrivals, which network jitter can shorten.
                    () = self.gate.wait(&self.gate_key, self.bucket, self.config.identify_spacing + IDENTIFY_MARGIN) => {}
                    _ = self.stop.changed() => return End::Stopped,
                }
                self.counters.identify_wait_ms.fetch_add(
                    u64::try_from(waited.elapsed().as_millis()).unwrap_or(u64::MAX),
                    Ordering::Relaxed,
                );
                self.counters.identifies.fetch_add(1, Ordering::Relaxed);
                info!(bot = %self.bot, shard = self.id, shards = self.total, "identifying");
                json!({"op": 2, "d": {
                    "token": token,
                    "intents": INTENTS,
                    "properties": {"os": std::env::consts::OS, "browser": "botfleet", "device": "botfleet"},
                    "shard": [self.id, self.total],
                }})
            }
        };
        // The gate may have waited: ask again right before the act Discord sees.
        if !(self.may_act)() {
            let _ = tokio::time::timeout(Duration::from_secs(1), ws.close(None)).await;
            return End::Stopped;
        }
        if ws.send(Message::text(first.to_string())).await.is_err() {
            return End::Again {
                identify: false,
                clean: false,
            };
        }
        let mut seq: Option<u64> = session.as_ref().map(|s| s.seq);
        let mut acked = true;
        let first_beat =
            Duration::from_millis(jitter(u64::try_from(interval.as_millis()).unwrap_or(1000)));
        let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + first_beat, interval);
        loop {
            tokio::select! {
                _ = self.stop.changed() => {
                    // 4000 keeps the session resumable (1000/1001 would end it).
                    let _ = tokio::time::timeout(Duration::from_secs(1), ws.close(Some(CloseFrame {
                        code: CloseCode::Library(4000),
                        reason: "handing over".into(),
                    }))).await;
                    return End::Stopped;
                }
                _ = beat.tick() => {
                    if !acked {
                        info!(bot = %self.bot, shard = self.id, "no heartbeat ACK: zombie connection; resuming");
                        let _ = tokio::time::timeout(Duration::from_secs(1), ws.close(Some(CloseFrame {
                            code: CloseCode::Library(4000),
                            reason: "zombie".into(),
                        }))).await;
                        return End::Again { identify: false, clean: true };
                    }
                    acked = false;
                    if ws.send(Message::text(json!({"op": 1, "d": seq}).to_string())).await.is_err() {
                        return End::Again { identify: false, clean: false };
                    }
                }
                frame = ws.next() => {
                    let text = match frame {
                        Some(Ok(Message::Text(t))) => t,
                        Some(Ok(Message::Close(f))) => return self.closed(f.map(|f| u16::from(f.code))),
                        Some(Ok(_)) => continue,
                        Some(Err(_)) | None => return End::Again { identify: false, clean: false },
                    };
                    let v: Value = match serde_json::from_str(&text) {
                        Ok(v) => v,
                        Err(_) => continue,
                    };
                    match v["op"].as_u64() {
                        Some(0) => {
                            if let Some(s) = v["s"].as_u64() {
                                seq = Some(s);
                                if let Some(sess) = session.as_mut() {
                                    sess.seq = s;
                                }
                            }
                            let s = seq.unwrap_or(0);
                            match v["t"].as_str() {
                                Some("READY") => {
                                    let (Some(id), Some(url)) = (v["d"]["session_id"].as_str(), v["d"]["resume_gateway_url"].as_str()) else {
                                        return End::Again { identify: true, clean: false };
                                    };
                                    let new = ShardSession { id: id.to_owned(), url: url.to_owned(), seq: s };
                                    *session = Some(new.clone());
                                    let _ = self.tx.send(ShardEvent::Session { shard: self.id, session: Some(new) });
                                }
                                Some("RESUMED") => debug!(bot = %self.bot, shard = self.id, "resumed"),
                                Some(t @ ("MESSAGE_CREATE" | "MESSAGE_UPDATE" | "INTERACTION_CREATE")) => {
                                    let parse = match t {
                                        "MESSAGE_CREATE" => parse_message,
                                        "MESSAGE_UPDATE" => parse_edit,
                                        _ => |bot: &BotId, d: &Value, _me: &str| crate::interactions::parse_interaction(bot, d),
                                    };
                                    let ev = match parse(&self.bot, &v["d"], &self.me) {
                                        Ok(Some(received)) => ShardEvent::Message { shard: self.id, seq: s, received: Box::new(received) },
                                        Ok(None) => continue,
                                        Err(why) => {
                                            debug!(bot = %self.bot, shard = self.id, why, "unreadable message");
                                            ShardEvent::Malformed { shard: self.id, seq: s }
                                        }
                                    };
                                    if self.tx.send(ev).is_err() {
                                        return End::Stopped;
                                    }
                                }
                                _ => {}
                            }
                        }
                        Some(1) => {
                            if ws.send(Message::text(json!({"op": 1, "d": seq}).to_string())).await.is_err() {
                                return End::Again { identify: false, clean: false };
                            }
                        }
                        Some(7) => {
                            debug!(bot = %self.bot, shard = self.id, "RECONNECT asked");
                            let _ = tokio::time::timeout(Duration::from_secs(1), ws.close(Some(CloseFrame {
                                code: CloseCode::Library(4000),
                                reason: "reconnect".into(),
                            }))).await;
                            return End::Again { identify: false, clean: true };
                        }
                        Some(9) => {
                            let resumable = v["d"].as_bool() == Some(true);
                            info!(bot = %self.bot, shard = self.id, resumable, "INVALID_SESSION");
                            // Discord asks for a wait of 1-5 s before the next IDENTIFY.
                            let wait = Duration::from_millis(1000 + jitter(4000));
                            tokio::select! {
                                () = tokio::time::sleep(wait) => {}
                                _ = self.stop.changed() => return End::Stopped,
                            }
                            let _ = tokio::time::timeout(Duration::from_secs(1), ws.close(None)).await;
                            return End::Again { identify: !resumable, clean: true };
                        }
                        Some(11) => acked = true,
                        _ => {}
                    }
                }
            }
        }
    }

    fn closed(&self, code: Option<u16>) -> End {
        let code = code.unwrap_or(1006);
        match close_action(code) {
            (CloseAction::Fail, Some(e)) => End::Fatal(e),
            (CloseAction::Identify, _) => End::Again {
                identify: true,
                clean: false,
            },
            _ => {
                debug!(bot = %self.bot, shard = self.id, code, "gateway closed; resuming");
                End::Again {
                    identify: false,
                    clean: false,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_urls_get_the_version() {
        assert_eq!(
            with_query("wss://gateway.discord.gg"),
            "wss://gateway.discord.gg/?v=10&encoding=json"
        );
        assert_eq!(
            with_query("ws://127.0.0.1:5/gateway"),
            "ws://127.0.0.1:5/gateway?v=10&encoding=json"
        );
    }
}
