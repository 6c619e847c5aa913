//! The traits a platform implements.

use std::sync::Arc;

use async_trait::async_trait;
use botfleet_core::{Act, BotSpec, ChatKey, Descriptor, Inbound, Outbound, Platform};

use crate::PlatformError;

/// Who the platform says the bot is, once its credentials are accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The platform's id of the bot's user.
    pub user_id: String,
    /// Its name or handle, when the platform gives one.
    pub name: Option<String>,
}

/// One message of a batch, with the key the platform delivered it under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    /// The delivery's id (Telegram `update_id`, Slack `event_id`): the same key delivered
    /// again is a redelivery and is handled once.
    pub key: String,
    /// The message, normalised.
    pub message: Inbound,
}

/// What acknowledges a batch to the platform: opaque to the runtime (Telegram: the next
/// offset; Slack: the envelope ids).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ack(pub Vec<String>);

/// What a receiver yields: messages to handle, what acknowledges them, and how many
/// deliveries were skipped as unreadable or irrelevant.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    /// Messages to handle, in the order the platform sent them.
    pub messages: Vec<Received>,
    /// Acknowledges every delivery of the batch (including skipped ones) once recorded.
    pub ack: Ack,
    /// Deliveries that could not be read (counted as malformed).
    pub malformed: usize,
    /// Deliveries the platform says it made before (e.g. a Slack envelope not acknowledged
    /// in time): counted; the inbox keeps them from being handled twice.
    pub redelivered: usize,
}

/// A bot's open connection: inbound batches, and a sender any task may use.
pub struct Connection {
    /// Inbound side; owned by the bot's receive loop.
    pub receiver: Box<dyn Receiver>,
    /// Outbound side; shared by the bot's chat queues.
    pub sender: Arc<dyn Sender>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").finish_non_exhaustive()
    }
}

/// A platform, as the runtime sees it: one per process, shared by all its bots.
#[async_trait]
pub trait Connector: Send + Sync + std::fmt::Debug {
    /// What the platform is: its modes, credentials, rules and defaults (the platform
    /// crate's `DESCRIPTOR`).
    fn descriptor(&self) -> &'static Descriptor;

    /// Which platform this is.
    fn platform(&self) -> Platform {
        self.descriptor().platform
    }

    /// The shard count the platform recommends for the bot now (Discord's `GET /gateway/bot`
    /// `shards`), for a bot that leaves its count to the platform; `None` for a platform
    /// without shards.
    ///
    /// # Errors
    /// As [`Connector::verify`].
    async fn recommended_shards(&self, spec: &BotSpec) -> Result<Option<u32>, PlatformError> {
        let _ = spec;
        Ok(None)
    }

    /// The shard whose session receives the events of `chat`, for a bot on `total` shards
    /// (Discord: the shard of the channel's guild, shard 0 for a direct message); `None` for a
    /// platform without shards.
    ///
    /// # Errors
    /// As [`Connector::verify`]; [`ErrorKind::Rejected`](crate::ErrorKind::Rejected) when the
    /// platform knows no such chat (or the bot cannot see it).
    async fn shard_of_chat(
        &self,
        spec: &BotSpec,
        chat: &str,
        total: u32,
    ) -> Result<Option<u32>, PlatformError> {
        let _ = (spec, chat, total);
        Ok(None)
    }

    /// Checks the bot's credentials with the platform.
    ///
    /// # Errors
    /// [`ErrorKind::Credentials`](crate::ErrorKind::Credentials) when refused; other kinds
    /// for everything else.
    async fn verify(&self, spec: &BotSpec) -> Result<Identity, PlatformError>;

    /// Opens the bot's connection, resuming from `checkpoint` (what [`Receiver::ack`] last
    /// answered and the runtime stored), if any.
    ///
    /// # Errors
    /// As [`Connector::verify`].
    async fn connect(
        &self,
        spec: &BotSpec,
        checkpoint: Option<&str>,
    ) -> Result<Connection, PlatformError>;

    /// [`Connector::connect`] for a connection that acts on its own between batches
    /// (reconnecting, resuming: Discord's shards): it asks `may_act` before every such act
    /// and stops when the answer is no (the worker's lease is no longer safe, or the bot is
    /// stopping), so a worker that lost the bot never takes it back from its successor.
    /// Platforms that only act when asked keep the default, which ignores the guard.
    ///
    /// # Errors
    /// As [`Connector::connect`].
    async fn connect_guarded(
        &self,
        spec: &BotSpec,
        checkpoint: Option<&str>,
        may_act: MayAct,
    ) -> Result<Connection, PlatformError> {
        let _ = may_act;
        self.connect(spec, checkpoint).await
    }

    /// [`Connector::connect_guarded`] for a platform whose client keeps a session between
    /// connections (a linked WhatsApp device): `session` reads it and writes it under the
    /// claim's fence. The runtime always calls this one; platforms without a session keep the
    /// default, which ignores it.
    ///
    /// # Errors
    /// As [`Connector::connect`].
    async fn connect_with_session(
        &self,
        spec: &BotSpec,
        checkpoint: Option<&str>,
        may_act: MayAct,
        session: Arc<dyn crate::SessionKv>,
    ) -> Result<Connection, PlatformError> {
        let _ = session;
        self.connect_guarded(spec, checkpoint, may_act).await
    }

    /// The bot was removed from the registry while this worker ran it: undo what its unit set
    /// up at the platform (Telegram's webhook). The default has nothing to undo.
    ///
    /// # Errors
    /// The platform's failures (reported, not retried).
    async fn removed(&self, spec: &BotSpec) -> Result<(), PlatformError> {
        let _ = spec;
        Ok(())
    }

    /// Opens the bytes of a file a user sent the bot: `source` is what the platform's inbound
    /// parser put in [`Attachment::source`](botfleet_core::Attachment::source) (Telegram's
    /// `file_id`, Slack's `url_private`, a media id). Any worker may be asked, for any of the
    /// platform's bots; the default serves none.
    ///
    /// # Errors
    /// `Rejected` for a file the platform does not know (or a mode without files);
    /// `Credentials`, `RateLimited`, `Transient` as for any call.
    async fn fetch_file(
        &self,
        spec: &BotSpec,
        source: &str,
    ) -> Result<crate::FileBody, PlatformError> {
        let _ = (spec, source);
        Err(crate::files::no_files())
    }

    /// Registers `spec`'s commands (`spec.options.commands`) with the platform, replacing
    /// what it had; none removes them. The runtime calls it from the unit's holder when they
    /// changed since they were last registered. The default has nothing to register.
    ///
    /// # Errors
    /// The platform's failures (reported on the bot, tried again at the next start).
    async fn register_commands(&self, spec: &BotSpec) -> Result<(), PlatformError> {
        let _ = spec;
        Ok(())
    }

    /// The platform's webhook side, when it has bots that receive by webhook.
    fn webhooks(&self) -> Option<Arc<dyn crate::Webhooks>> {
        None
    }

    /// Connections this platform holds open now (Slack's sockets), for a gauge; `None` for a
    /// platform that holds none between requests.
    fn open_connections(&self) -> Option<u64> {
        None
    }

    /// The platform's own figures for the metrics endpoint, shown as
    /// `botfleet_{name}{worker_id,platform}`: counters and gauges only it knows (Discord's
    /// IDENTIFYs and RESUMEs).
    fn stats(&self) -> Vec<Stat> {
        Vec::new()
    }
}

/// Whether a bot's connection may act now (see [`Connector::connect_guarded`]).
pub type MayAct = Arc<dyn Fn() -> bool + Send + Sync>;

/// One figure of [`Connector::stats`].
#[derive(Clone, Debug, PartialEq)]
pub struct Stat {
    /// The metric's name without the `botfleet_` prefix.
    pub name: &'static str,
    /// What it counts.
    pub help: &'static str,
    /// `counter` or `gauge`.
    pub kind: &'static str,
    /// Its value.
    pub value: f64,
}

/// The inbound side of a bot's connection.
#[async_trait]
pub trait Receiver: Send {
    /// Waits for the next batch (a Telegram long poll; Slack envelopes as they come).
    ///
    /// # Errors
    /// The platform's failures, classified.
    async fn next(&mut self) -> Result<Batch, PlatformError>;

    /// The batch's messages are recorded: tell the platform (or remember it for the next
    /// request). Answers the checkpoint to store, if the platform has one.
    ///
    /// # Errors
    /// The platform's failures, classified.
    async fn ack(&mut self, ack: Ack) -> Result<Option<String>, PlatformError>;

    /// The checkpoint as far as acknowledged batches go, when it has moved since the last one
    /// [`Receiver::ack`] answered (a platform that writes it behind, as Discord's sessions
    /// are). Asked once before [`Receiver::close`] on a stop or hand-over, so the next owner
    /// resumes from the latest point. The default has none.
    fn pending_checkpoint(&mut self) -> Option<String> {
        None
    }

    /// Closes the connection, so the platform lets the next owner connect at once.
    async fn close(&mut self);
}

/// The outbound side of a bot's connection.
#[async_trait]
pub trait Sender: Send + Sync {
    /// How long after its turn starts `event` may wait for the handler's answer before the
    /// platform's deadline asks for an acknowledgement ([`Act::Defer`]): Discord's
    /// interactions (3 s), Telegram's button presses. `None` (the default) for events
    /// without a deadline.
    fn defer_after(&self, event: &botfleet_core::Inbound) -> Option<std::time::Duration> {
        let _ = event;
        None
    }

    /// Whether a text the bot sends in answer to `event` goes as the event's own answer
    /// ([`Act::Answer`]) rather than as a message to the chat: Discord's interactions, whose
    /// response shows under the user's command and needs no right to post in the channel.
    /// `false` (the default) elsewhere: a Telegram press's text stays in the chat, a Slack
    /// command answers through its `response_url` only when asked to.
    fn answers_in_place(&self, event: &botfleet_core::Inbound) -> bool {
        let _ = event;
        false
    }

    /// How often the typing indicator ([`Sender::show_typing`]) is shown again to keep it up
    /// while a handler answers `event` slowly: a little less than the platform shows it for
    /// (Telegram 5 s, Discord 10 s). `None` (the default) for a platform without one, or an
    /// event the platform shows its own progress for.
    fn typing_every(&self, event: &botfleet_core::Inbound) -> Option<std::time::Duration> {
        let _ = event;
        None
    }

    /// Shows typing in the chat of `event` (what the handler is answering): [`Act::Typing`]
    /// by default; a platform whose indicator goes with a message of the user's overrides it
    /// (WhatsApp Cloud's, with the read receipt).
    ///
    /// # Errors
    /// As [`Sender::act`].
    async fn show_typing(
        &self,
        event: &botfleet_core::Inbound,
        key: &str,
    ) -> Result<(), PlatformError> {
        self.act(&event.chat, &Act::Typing, key).await.map(|_| ())
    }

    /// Sends `out` (in its thread, where the platform has threads).
    ///
    /// # Errors
    /// The platform's failures, classified: `RateLimited` carries the platform's wait.
    async fn send(&self, out: &Outbound) -> Result<(), PlatformError>;

    /// Does one action of a handler's reply in `chat`; `key` is the action's idempotency key
    /// (for platforms that drop repeats of one). Answers the platform's id of the message a
    /// `send` made, when the platform gives one (what a `ref` then names).
    ///
    /// The default sends a plain text through [`Sender::send`] and refuses everything else
    /// (a platform whose [`Caps`](botfleet_core::Caps) promise more overrides it).
    ///
    /// # Errors
    /// As [`Sender::send`]; `Rejected` for an action the platform cannot do.
    async fn act(
        &self,
        chat: &ChatKey,
        act: &Act<'_>,
        key: &str,
    ) -> Result<Option<String>, PlatformError> {
        match act {
            Act::Send {
                text,
                buttons: [],
                thread_of,
                files: [],
            } => {
                let out = Outbound {
                    chat: chat.clone(),
                    text: (*text).to_owned(),
                    reply_to: thread_of.map(|m| m.message_id.clone()),
                    idempotency_key: key.to_owned(),
                };
                self.send(&out).await.map(|()| None)
            }
            other => Err(unsupported(other)),
        }
    }

    /// The buckets of the platform's rate limits that `call` in `chat` counts against (the
    /// chat's, the group's, the bot's own…): the runtime takes a token from each, shared by
    /// every worker of the fleet, before making the call. None (the default) for a platform
    /// without documented limits, and for calls its limits leave out (an interaction's answer
    /// is not counted by Discord).
    fn buckets(&self, chat: &ChatKey, call: crate::Call<'_>) -> Vec<crate::Bucket> {
        let _ = (chat, call);
        Vec::new()
    }

    /// After `call` in `chat` was answered (also with a 429): one of its buckets the
    /// platform said it has no call left in, and until it refills (Discord's
    /// `X-RateLimit-Remaining: 0` and `-Reset-After`). The runtime pauses that bucket for the
    /// whole fleet, so no worker's next call meets the 429. `None` (the default) for a
    /// platform that does not say.
    fn drained(
        &self,
        chat: &ChatKey,
        call: crate::Call<'_>,
    ) -> Option<(crate::Bucket, std::time::Duration)> {
        let _ = (chat, call);
        None
    }

    /// The platform's limit on refused calls (answers that are
    /// [`PlatformError::is_invalid`](crate::PlatformError::is_invalid)), past which it bans
    /// the caller: the fleet-wide budget the fleet keeps under it ([`crate::Bucket::fleet`],
    /// its scope named in `--rate-limits`). Every refused call takes a token from it; when it
    /// is spent, the platform's calls stop on every worker until a tenth of it is back.
    /// `None` (the default) for a platform without such a limit.
    fn invalid_budget(&self) -> Option<crate::Bucket> {
        None
    }

    /// Whether a streamed answer to `event` can go as the platform's own stream
    /// ([`Sender::stream`]) in the event's chat: `false` (the default) where the platform has
    /// none there, and the answer goes as edits of one message.
    fn streams_in(&self, event: &botfleet_core::Inbound) -> bool {
        let _ = event;
        false
    }

    /// Does one step of a native stream answering `event` (see [`Sender::streams_in`]);
    /// `key` is the step's idempotency key. Answers the streamed message's id for
    /// [`StreamStep::Start`], and for [`StreamStep::Stop`] the id of the message that shows the
    /// answer from then on when it is another one (Telegram's drafts end as a message of their
    /// own).
    ///
    /// # Errors
    /// As [`Sender::act`]; `Rejected` where the platform has no streams (the default).
    async fn stream(
        &self,
        event: &botfleet_core::Inbound,
        step: StreamStep<'_>,
        key: &str,
    ) -> Result<Option<String>, PlatformError> {
        let _ = (event, step, key);
        Err(PlatformError::new(
            crate::ErrorKind::Rejected,
            "unsupported",
            "this platform's mode has no native streams",
        ))
    }
}

/// One step of a streamed answer done through the platform's own streaming.
#[derive(Clone, Copy, Debug)]
pub enum StreamStep<'a> {
    /// A message that shows `text` and grows, answering the event.
    Start {
        /// What it shows first.
        text: &'a str,
    },
    /// `added` appended to the streamed message `message_id`, which then shows `text`.
    Append {
        /// The streamed message.
        message_id: &'a str,
        /// Its whole text now.
        text: &'a str,
        /// What was added to it.
        added: &'a str,
    },
    /// The stream of `message_id` ends, showing `text` (what it shows).
    Stop {
        /// The streamed message.
        message_id: &'a str,
        /// Its whole text.
        text: &'a str,
    },
}

/// The refusal of an action a platform cannot do.
pub fn unsupported(act: &Act<'_>) -> PlatformError {
    let what = match act {
        Act::Send { files: [], .. } => "buttons",
        Act::Send { .. } => "files",
        Act::Edit { .. } => "edit",
        Act::Delete { .. } => "delete",
        Act::Typing => "typing",
        Act::Answer { .. } | Act::Defer { .. } => "answer",
        Act::Template { .. } => "templates",
    };
    PlatformError::new(
        crate::ErrorKind::Rejected,
        "unsupported",
        format!("this platform's mode cannot do {what}"),
    )
}
