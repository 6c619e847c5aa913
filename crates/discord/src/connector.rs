//! Discord on the platform seam: `users/@me` verifies; a connection runs one gateway session
//! per shard, resuming the sessions of the stored checkpoint; messages are acknowledged by
//! recording their sequence numbers, written behind as the checkpoint every few seconds (a
//! successor that resumes from a slightly older sequence gets those dispatches again, and the
//! inbox answers each message once).

use std::{
    collections::HashMap,
    sync::{atomic::Ordering, Arc, Mutex},
    time::{Duration, Instant},
};

use async_trait::async_trait;
use botfleet_core::{BotSpec, Outbound};
use botfleet_platform::{
    Ack, Batch, Connection, Connector, ErrorKind, Identity, MayAct, PlatformError, Receiver,
    Sender, Stat,
};
use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
};
use tracing::warn;

use crate::{
    gateway::{Checkpoint, Counters, Shard, ShardEvent},
    lock,
    outbound::send,
    DiscordApi, DiscordClient, DiscordConfig, DiscordError,
};

/// Keeps IDENTIFYs to Discord's pace: one per `spacing` per bot and bucket
/// (`shard % max_concurrency`). The runtime backs it with the coordinator, so the pace holds
/// across the fleet; [`LocalGate`] holds it within one process.
#[async_trait]
pub trait IdentifyGate: Send + Sync + std::fmt::Debug {
    /// Returns when `bot`'s shard of `bucket` may IDENTIFY.
    async fn wait(&self, bot: &str, bucket: u32, spacing: Duration);
}

/// An [`IdentifyGate`] for one process.
#[derive(Debug, Default)]
pub struct LocalGate {
    next: Mutex<HashMap<(String, u32), Instant>>,
}

#[async_trait]
impl IdentifyGate for LocalGate {
    async fn wait(&self, bot: &str, bucket: u32, spacing: Duration) {
        let at = {
            let mut m = self
                .next
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let now = Instant::now();
            let slot = m.entry((bot.to_owned(), bucket)).or_insert(now);
            let at = (*slot).max(now);
            *slot = at + spacing;
            at
        };
        tokio::time::sleep_until(at.into()).await;
    }
}

/// The Discord platform: one REST pool for every bot of the process, the identify gate, and
/// counts of sessions.
#[derive(Clone, Debug)]
pub struct DiscordConnector {
    client: DiscordClient,
    gate: Arc<dyn IdentifyGate>,
    counters: Arc<Counters>,
    /// Channel → its guild (`None`: a DM), as Discord answered.
    guilds: Arc<Mutex<HashMap<String, Option<String>>>>,
}

/// Channels whose guilds are remembered at most (forgotten all at once past it).
const GUILDS_REMEMBERED: usize = 100_000;

/// The shard Discord routes a guild's events to, on `total` shards: `(guild_id >> 22) %
/// total`; a DM's (no guild) come on shard 0.
pub fn shard_of_guild(guild: Option<&str>, total: u32) -> u32 {
    let Some(id) = guild.and_then(|g| g.parse::<u64>().ok()) else {
        return 0;
    };
    u32::try_from((id >> 22) % u64::from(total.max(1))).unwrap_or(0)
}

impl DiscordConnector {
    /// A connector with its own pool, identifying at a pace `gate` keeps.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(config: DiscordConfig, gate: Arc<dyn IdentifyGate>) -> Result<Self, DiscordError> {
        Ok(Self {
            client: DiscordClient::new(config)?,
            gate,
            counters: Arc::new(Counters::default()),
            guilds: Arc::default(),
        })
    }

    /// IDENTIFYs sent so far.
    pub fn identifies(&self) -> u64 {
        self.counters.identifies.load(Ordering::Relaxed)
    }

    /// RESUMEs sent so far.
    pub fn resumes(&self) -> u64 {
        self.counters.resumes.load(Ordering::Relaxed)
    }

    fn api(spec: &BotSpec) -> DiscordApi {
        DiscordApi::new(spec.options.api_url.as_deref(), &spec.token)
    }
}

#[async_trait]
impl Connector for DiscordConnector {
    fn descriptor(&self) -> &'static botfleet_core::Descriptor {
        &crate::DESCRIPTOR
    }

    async fn fetch_file(
        &self,
        spec: &BotSpec,
        source: &str,
    ) -> Result<botfleet_platform::FileBody, PlatformError> {
        let resp = self.client.download(&Self::api(spec), source).await?;
        Ok(botfleet_platform::FileBody::from_response(resp))
    }

    async fn register_commands(&self, spec: &BotSpec) -> Result<(), PlatformError> {
        Ok(self
            .client
            .overwrite_commands(&Self::api(spec), &spec.options.commands)
            .await?)
    }

    async fn verify(&self, spec: &BotSpec) -> Result<Identity, PlatformError> {
        let me = self.client.me(&Self::api(spec)).await?;
        Ok(Identity {
            user_id: me.id,
            name: Some(me.username),
        })
    }

    async fn recommended_shards(&self, spec: &BotSpec) -> Result<Option<u32>, PlatformError> {
        let info = self.client.gateway_bot(&Self::api(spec)).await?;
        Ok(Some(info.shards.max(1)))
    }

    async fn shard_of_chat(
        &self,
        spec: &BotSpec,
        chat: &str,
        total: u32,
    ) -> Result<Option<u32>, PlatformError> {
        // A channel never changes guilds: asked once per channel while this process lasts.
        let known = lock(&self.guilds).get(chat).cloned();
        let guild = match known {
            Some(g) => g,
            None => {
                let g = self.client.channel_guild(&Self::api(spec), chat).await?;
                let mut guilds = lock(&self.guilds);
                if guilds.len() >= GUILDS_REMEMBERED {
                    guilds.clear();
                }
                guilds.insert(chat.to_owned(), g.clone());
                g
            }
        };
        Ok(Some(shard_of_guild(guild.as_deref(), total)))
    }

    async fn connect(
        &self,
        spec: &BotSpec,
        checkpoint: Option<&str>,
    ) -> Result<Connection, PlatformError> {
        self.connect_guarded(spec, checkpoint, Arc::new(|| true))
            .await
    }

    async fn connect_guarded(
        &self,
        spec: &BotSpec,
        checkpoint: Option<&str>,
        may_act: MayAct,
    ) -> Result<Connection, PlatformError> {
        let api = Self::api(spec);
        let me = self.client.me(&api).await?;
        let info = self.client.gateway_bot(&api).await?;
        // A slice's count is the one its bot was cut on, never a fresher recommendation.
        let total = spec.shard_total().unwrap_or(info.shards).max(1);
        // A slice runs its own shards only: [k·K, min((k+1)·K, total)).
        let mine = spec.shard_range(total);
        // Sessions of another shard count cannot be resumed.
        let stored: Checkpoint = checkpoint
            .and_then(|c| serde_json::from_str::<Checkpoint>(c).ok())
            .filter(|c| c.shards == total)
            .unwrap_or_default();
        let to_identify = mine
            .clone()
            .filter(|s| !stored.sessions.contains_key(s))
            .count();
        self.counters.budget_left.store(
            u64::from(info.session_start_limit.remaining),
            Ordering::Relaxed,
        );
        let remaining = info.session_start_limit.remaining as usize;
        // Keep a margin of the daily budget: a bot about to run out stops identifying and
        // says so, instead of burning the rest and being locked out for a day.
        let margin = 5;
        if to_identify > 0 && remaining < to_identify + margin {
            return Err(PlatformError::new(
                ErrorKind::RateLimited(Duration::from_millis(info.session_start_limit.reset_after.max(1000))),
                "identify_budget",
                format!(
                    "Discord's daily session budget is nearly spent ({remaining} left, {to_identify} shards to identify): waiting for it to reset"
                ),
            ));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let (stop_tx, stop_rx) = watch::channel(false);
        let concurrency = info.session_start_limit.max_concurrency.max(1);
        let mut tasks = Vec::new();
        for id in mine {
            let shard = Shard {
                config: self.client.config().clone(),
                api: api.clone(),
                bot: spec.id.clone(),
                gate_key: spec.id.base().to_owned(),
                me: me.id.clone(),
                id,
                total,
                bucket: id % concurrency,
                gateway_url: info.url.clone(),
                gate: self.gate.clone(),
                tx: tx.clone(),
                stop: stop_rx.clone(),
                counters: self.counters.clone(),
                may_act: may_act.clone(),
            };
            tasks.push(tokio::spawn(shard.run(stored.sessions.get(&id).cloned())));
        }
        Ok(Connection {
            receiver: Box::new(DiscordReceiver {
                rx,
                checkpoint: Checkpoint {
                    shards: total,
                    sessions: stored
                        .sessions
                        .into_iter()
                        .filter(|(s, _)| spec.shard_range(total).contains(s))
                        .collect(),
                },
                dirty: false,
                saved: Instant::now(),
                every: self.client.config().checkpoint_every,
                stop: stop_tx,
                tasks,
            }),
            sender: Arc::new(DiscordSender {
                client: self.client.clone(),
                api,
            }),
        })
    }

    fn open_connections(&self) -> Option<u64> {
        Some(
            self.counters
                .open
                .load(Ordering::Relaxed)
                .max(0)
                .unsigned_abs(),
        )
    }

    fn stats(&self) -> Vec<Stat> {
        let c = &self.counters;
        let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed) as f64;
        vec![
            Stat {
                name: "shards_running",
                help: "Discord shard sessions connected now.",
                kind: "gauge",
                value: c.open.load(Ordering::Relaxed).max(0) as f64,
            },
            Stat {
                name: "discord_identifies_total",
                help: "IDENTIFYs sent (new sessions).",
                kind: "counter",
                value: n(&c.identifies),
            },
            Stat {
                name: "discord_resumes_total",
                help: "RESUMEs sent (sessions continued after a drop or a move).",
                kind: "counter",
                value: n(&c.resumes),
            },
            Stat {
                name: "discord_identify_wait_seconds_total",
                help: "Seconds shards waited in the fleet-wide identify queue.",
                kind: "counter",
                value: n(&c.identify_wait_ms) / 1000.0,
            },
            Stat {
                name: "discord_identify_budget_remaining",
                help: "Session starts left today, as Discord last said.",
                kind: "gauge",
                value: n(&c.budget_left),
            },
        ]
    }
}

/// The inbound side: every shard's messages, merged in arrival order (order within a shard,
/// hence within a channel, is Discord's).
struct DiscordReceiver {
    rx: mpsc::UnboundedReceiver<ShardEvent>,
    /// The sessions as far as recorded messages go.
    checkpoint: Checkpoint,
    dirty: bool,
    saved: Instant,
    every: Duration,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl DiscordReceiver {
    /// Folds one event into `batch`; a fatal one is the error to return.
    fn take(
        &mut self,
        ev: ShardEvent,
        batch: &mut Batch,
        seqs: &mut HashMap<u32, u64>,
    ) -> Option<PlatformError> {
        match ev {
            ShardEvent::Message {
                shard,
                seq,
                received,
            } => {
                batch.messages.push(*received);
                let s = seqs.entry(shard).or_default();
                *s = (*s).max(seq);
            }
            ShardEvent::Malformed { shard, seq } => {
                batch.malformed += 1;
                let s = seqs.entry(shard).or_default();
                *s = (*s).max(seq);
            }
            ShardEvent::Session { shard, session } => {
                match session {
                    Some(s) => self.checkpoint.sessions.insert(shard, s),
                    None => self.checkpoint.sessions.remove(&shard),
                };
                // A new or lost session is written at the next acknowledgement.
                self.dirty = true;
                self.saved = Instant::now() - self.every;
            }
            ShardEvent::Fatal(e) => return Some(e.into()),
        }
        None
    }
}

#[async_trait]
impl Receiver for DiscordReceiver {
    async fn next(&mut self) -> Result<Batch, PlatformError> {
        let mut batch = Batch::default();
        let mut seqs = HashMap::new();
        let Some(first) = self.rx.recv().await else {
            return Err(PlatformError::new(
                ErrorKind::Transient,
                "stopped",
                "every shard of the bot stopped",
            ));
        };
        if let Some(e) = self.take(first, &mut batch, &mut seqs) {
            return Err(e);
        }
        for _ in 0..255 {
            let Ok(ev) = self.rx.try_recv() else { break };
            if let Some(e) = self.take(ev, &mut batch, &mut seqs) {
                return Err(e);
            }
        }
        batch.ack = Ack(seqs.iter().map(|(s, q)| format!("{s}:{q}")).collect());
        Ok(batch)
    }

    async fn ack(&mut self, ack: Ack) -> Result<Option<String>, PlatformError> {
        for a in &ack.0 {
            let Some((shard, seq)) = a.split_once(':') else {
                continue;
            };
            let (Ok(shard), Ok(seq)) = (shard.parse::<u32>(), seq.parse::<u64>()) else {
                continue;
            };
            if let Some(s) = self.checkpoint.sessions.get_mut(&shard) {
                if seq > s.seq {
                    s.seq = seq;
                    self.dirty = true;
                }
            }
        }
        if !self.dirty || self.saved.elapsed() < self.every {
            return Ok(None);
        }
        self.dirty = false;
        self.saved = Instant::now();
        match serde_json::to_string(&self.checkpoint) {
            Ok(s) => Ok(Some(s)),
            Err(e) => {
                warn!(error = %e, "cannot write the Discord checkpoint");
                Ok(None)
            }
        }
    }

    fn pending_checkpoint(&mut self) -> Option<String> {
        if !self.dirty {
            return None;
        }
        self.dirty = false;
        self.saved = Instant::now();
        serde_json::to_string(&self.checkpoint).ok()
    }

    async fn close(&mut self) {
        let _ = self.stop.send(true);
        for t in self.tasks.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(2), t).await;
        }
    }
}

impl Drop for DiscordReceiver {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

struct DiscordSender {
    client: DiscordClient,
    api: DiscordApi,
}

#[async_trait]
impl Sender for DiscordSender {
    fn defer_after(&self, event: &botfleet_core::Inbound) -> Option<std::time::Duration> {
        // An interaction is answered within 3 s or never.
        event
            .answer_handle
            .is_some()
            .then_some(std::time::Duration::from_secs(2))
    }

    fn answers_in_place(&self, event: &botfleet_core::Inbound) -> bool {
        // A command's or a press's answer is the interaction's response (or follows it).
        event.answer_handle.is_some()
    }

    fn typing_every(&self, event: &botfleet_core::Inbound) -> Option<std::time::Duration> {
        // The typing endpoint shows for 10 s, or until the bot's next message. An interaction
        // shows its own "thinking…" once deferred (and its channel may be one the bot cannot
        // post typing to).
        event
            .answer_handle
            .is_none()
            .then_some(std::time::Duration::from_secs(8))
    }

    fn buckets(
        &self,
        chat: &botfleet_core::ChatKey,
        call: botfleet_platform::Call<'_>,
    ) -> Vec<botfleet_platform::Bucket> {
        let mut buckets = crate::outbound::limits::buckets(&chat.chat, call);
        // A learnt route's own bucket first: the narrowest, what a route's 429 was for.
        let learnt = crate::outbound::limits::route(call)
            .and_then(|r| self.api.routes().bucket(r, &chat.chat));
        if let Some(b) = learnt {
            buckets.insert(0, b);
        }
        buckets
    }

    fn invalid_budget(&self) -> Option<botfleet_platform::Bucket> {
        Some(crate::outbound::limits::invalid_budget())
    }

    fn drained(
        &self,
        chat: &botfleet_core::ChatKey,
        call: botfleet_platform::Call<'_>,
    ) -> Option<(botfleet_platform::Bucket, std::time::Duration)> {
        let route = crate::outbound::limits::route(call)?;
        self.api.routes().empty(route, &chat.chat)
    }

    async fn send(&self, out: &Outbound) -> Result<(), PlatformError> {
        send(&self.client, &self.api, out).await?;
        Ok(())
    }

    async fn act(
        &self,
        chat: &botfleet_core::ChatKey,
        act: &botfleet_core::Act<'_>,
        key: &str,
    ) -> Result<Option<String>, PlatformError> {
        crate::outbound::act(&self.client, &self.api, &chat.chat, act, key).await
    }
}
