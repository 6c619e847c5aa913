//! Handlers: what a bot answers to a message. Every handler is a [`BotHandler`]: `echo` and
//! `webhook` are two, and a worker built as a library adds its own by name
//! ([`HandlerRegistry`], chosen per bot with `--handler NAME`).

use std::{collections::HashMap, sync::Arc, time::Duration};

use async_trait::async_trait;
use botfleet_core::{Action, Attachment, Button, Caps, HandlerSpec, Inbound, Secret, Target};
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The header carrying the webhook signature: `sha256=<hex of HMAC-SHA256(secret, body)>`.
pub const SIGNATURE_HEADER: &str = "x-botfleet-signature";

/// Why a handler produced no answer.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// The webhook could not be reached, or its connection failed.
    #[error("webhook unreachable: {0}")]
    Unreachable(#[source] reqwest::Error),
    /// The handler did not answer within the bot's handler timeout (retried as the next
    /// attempt while the retry period lasts).
    #[error("the handler did not answer within {} s", .0.as_secs_f64())]
    TimedOut(Duration),
    /// The webhook answered with an error status.
    #[error("webhook answered {0}")]
    Status(u16),
    /// The webhook's answer was not JSON (or `text` was not a string).
    #[error("webhook answer unreadable: {0}")]
    BadReply(String),
    /// A compiled-in handler failed; `retry` says whether trying again later may succeed.
    #[error("handler failed: {reason}")]
    Failed {
        /// Why, for the entry and the logs.
        reason: String,
        /// Whether the event is tried again (with backoff, for the worker's retry period).
        retry: bool,
    },
    /// The bot names a compiled-in handler this worker does not have (a worker of another
    /// build): retried, so a worker that has it can answer meanwhile.
    #[error("handler {0:?} is not compiled into this worker")]
    Missing(String),
}

impl HandlerError {
    /// Whether trying again later may succeed: the service was unreachable, timed out, said
    /// it is failing (5xx) or busy (429). Other refusals (4xx) and unreadable answers are not
    /// retried.
    pub fn is_transient(&self) -> bool {
        match self {
            HandlerError::Unreachable(_) | HandlerError::TimedOut(_) => true,
            HandlerError::Status(s) => *s == 429 || *s >= 500,
            HandlerError::BadReply(_) => false,
            HandlerError::Failed { retry, .. } => *retry,
            HandlerError::Missing(_) => true,
        }
    }
}

/// A bot's handler, in Rust: it gets each event with a [`TurnContext`] and says through the
/// context what to do. The actions are done after `handle` returns, by the turn pipeline,
/// in order, each under the chat's fence (exactly once across replays, refused with a reason
/// beyond the platform's [`Caps`]): a handler whose worker lost the chat cannot act.
///
/// A chat's events come one at a time, in order; an event may come again (same
/// `event.event_id`) after a failure or a crash before its answer was recorded.
#[async_trait]
pub trait BotHandler: Send + Sync + 'static {
    /// Answers `event` through `cx`.
    ///
    /// # Errors
    /// [`HandlerError::Failed`]: with `retry`, the event is tried again with backoff; without,
    /// it is recorded undeliverable with the reason.
    async fn handle(&self, event: &Inbound, cx: &mut TurnContext) -> Result<(), HandlerError>;
}

impl std::fmt::Debug for dyn BotHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BotHandler")
    }
}

/// Compiled-in handlers by name (what `--handler NAME` selects), given to a worker built as a
/// library through [`WorkerConfig::handlers`](crate::WorkerConfig::handlers).
pub type HandlerRegistry = Arc<HashMap<String, Arc<dyn BotHandler>>>;

/// What a [`BotHandler`] gets for one event: the chat's state, what the platform can do, and
/// the actions it asks for.
#[derive(Debug)]
pub struct TurnContext {
    caps: Caps,
    state: Option<String>,
    reply: Reply,
    /// What reads the event's files (none outside a worker's turn).
    files: Option<crate::Files>,
    bot: Option<botfleet_core::BotId>,
    /// What finishes this turn later, through `POST /api/v1/replies/{reply_token}` on any worker.
    reply_token: Option<String>,
    /// What takes the parts of a later answer on this worker (none outside a worker's turn).
    replies: Option<crate::Replies>,
}

impl TurnContext {
    /// A context for a chat whose state is `state` (JSON), on a mode that can do `caps`.
    pub fn new(caps: Caps, state: Option<&str>) -> Self {
        Self {
            caps,
            state: state.map(str::to_owned),
            reply: Reply::default(),
            files: None,
            bot: None,
            reply_token: None,
            replies: None,
        }
    }

    /// What finishes this turn later from Rust, after [`Self::answer_later`]: a handle that
    /// outlives `handle` (move it into a task), posting parts as
    /// `POST /api/v1/replies/{reply_token}` does. `None` outside a worker's turn.
    pub fn later(&self) -> Option<LaterReply> {
        Some(LaterReply {
            token: self.reply_token.clone()?,
            replies: self.replies.clone()?,
        })
    }

    /// The reply token of this turn (in a worker's turn): what
    /// `POST /api/v1/replies/{reply_token}` takes, on any worker, to finish the turn after
    /// [`Self::answer_later`]. Bound to the bot, the chat and the event; valid until the turn
    /// ends or its time to live passes.
    pub fn reply_token(&self) -> Option<&str> {
        self.reply_token.as_deref()
    }

    /// Holds the chat's turn open: the answer comes later, through the reply token (what a
    /// webhook handler's `202` says). The chat's next events wait until a part posted with
    /// `"final": true` ends the turn, or its time to live passes. What this context was
    /// asked to do besides is not done.
    pub fn answer_later(&mut self) -> &mut Self {
        self.reply.later = true;
        self
    }

    /// The bytes of `attachment`, a file of the event (at most
    /// [`MAX_READ_BYTES`](crate::MAX_READ_BYTES)), fetched from the platform through the
    /// fleet.
    ///
    /// # Errors
    /// [`HandlerError::Failed`] (to be retried) when the platform or the store failed, or
    /// outside a worker's turn.
    pub async fn file(&self, attachment: &Attachment) -> Result<Vec<u8>, HandlerError> {
        let (Some(files), Some(bot)) = (&self.files, &self.bot) else {
            return Err(HandlerError::Failed {
                reason: "files are read in a worker's turn only".into(),
                retry: false,
            });
        };
        files
            .read(bot, attachment, crate::MAX_READ_BYTES)
            .await
            .map_err(|reason| HandlerError::Failed {
                reason: format!("reading a file: {reason}"),
                retry: true,
            })
    }

    /// What the bot's platform and mode can do.
    pub fn caps(&self) -> &Caps {
        &self.caps
    }

    /// The chat's state as the last turn left it (`None` before any).
    pub fn state(&self) -> Option<serde_json::Value> {
        self.state
            .as_deref()
            .and_then(|s| serde_json::from_str(s).ok())
    }

    /// The chat's new state, given to its next event (up to 64 KiB of JSON).
    pub fn set_state(&mut self, state: &serde_json::Value) {
        self.reply.state = Some(state.to_string());
    }

    /// Sends `text` back, as a plain reply (in the event's thread, where there is one).
    pub fn reply(&mut self, text: impl Into<String>) -> &mut Self {
        let text = text.into();
        if self.reply.text.is_none() && self.reply.actions.is_empty() {
            self.reply.text = Some(text).filter(|t| !t.is_empty());
        } else {
            self.reply.actions.push(Action::Send {
                text,
                buttons: Vec::new(),
                thread: true,
                ref_name: None,
                attachments: Vec::new(),
                ephemeral: false,
            });
        }
        self
    }

    /// Sends `text` with rows of `buttons`, naming the message `ref_name` (so a later turn
    /// can edit or delete it) when given.
    pub fn send(
        &mut self,
        text: impl Into<String>,
        buttons: Vec<Vec<Button>>,
        ref_name: Option<&str>,
    ) -> &mut Self {
        self.act(Action::Send {
            text: text.into(),
            buttons,
            thread: false,
            ref_name: ref_name.map(str::to_owned),
            attachments: Vec::new(),
            ephemeral: false,
        })
    }

    /// Sends `text` back to the user who acted alone, where it answers their interaction (a
    /// Discord command or button press: an ephemeral response); elsewhere as [`Self::reply`].
    pub fn reply_ephemeral(&mut self, text: impl Into<String>) -> &mut Self {
        self.act(Action::Send {
            text: text.into(),
            buttons: Vec::new(),
            thread: true,
            ref_name: None,
            attachments: Vec::new(),
            ephemeral: true,
        })
    }

    /// Replaces the text (and buttons: none unless given) of the message named `ref_name`.
    pub fn edit(
        &mut self,
        ref_name: &str,
        text: impl Into<String>,
        buttons: Vec<Vec<Button>>,
    ) -> &mut Self {
        self.act(Action::Edit {
            target: Target {
                ref_name: Some(ref_name.to_owned()),
                message_id: None,
            },
            text: Some(text.into()),
            buttons,
        })
    }

    /// Deletes the message named `ref_name`.
    pub fn delete(&mut self, ref_name: &str) -> &mut Self {
        self.act(Action::Delete {
            target: Target {
                ref_name: Some(ref_name.to_owned()),
                message_id: None,
            },
        })
    }

    /// Shows that the bot is typing.
    pub fn typing(&mut self) -> &mut Self {
        self.act(Action::Typing {})
    }

    /// Answers the event itself (a button press's toast, a command's reply).
    pub fn answer(&mut self, text: impl Into<String>) -> &mut Self {
        self.act(Action::Answer {
            text: Some(text.into()),
            alert: false,
            ephemeral: false,
        })
    }

    /// Any action, as a webhook would answer it.
    pub fn act(&mut self, action: Action) -> &mut Self {
        self.reply.actions.push(action);
        self
    }

    /// What the handler asked for.
    pub fn into_reply(self) -> Reply {
        self.reply
    }
}

/// A turn's later answer, from Rust ([`TurnContext::later`]): cheap to clone, valid until
/// the turn ends or its time to live passes.
#[derive(Clone)]
pub struct LaterReply {
    token: String,
    replies: crate::Replies,
}

impl std::fmt::Debug for LaterReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a credential for the turn.
        f.debug_struct("LaterReply").finish_non_exhaustive()
    }
}

impl LaterReply {
    /// The turn's reply token (what another process posts to, on any worker).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Posts a part, `{"actions": [...], "state"?, "final": bool}`, under `idempotency_key`.
    ///
    /// # Errors
    /// As the API answers ([`crate::ReplyError`]).
    pub async fn post(
        &self,
        idempotency_key: &str,
        part: &serde_json::Value,
    ) -> Result<crate::Posted, crate::ReplyError> {
        self.replies.post(&self.token, idempotency_key, part).await
    }

    /// An answer streamed into one message, named `ref_name` (as a `send`'s `ref`): the first
    /// push sends it, each next one edits it, and [`AnswerStream::finish`] gives its final
    /// text and ends the turn. Push as fast as the text grows: the fleet coalesces the edits
    /// to the platform's pace and always ends on the final text.
    pub fn stream(&self, ref_name: impl Into<String>) -> AnswerStream {
        AnswerStream {
            later: self.clone(),
            ref_name: ref_name.into(),
            text: String::new(),
            parts: 0,
        }
    }
}

/// An answer streamed into one message ([`LaterReply::stream`]). Each push is a part of the
/// turn's later answer (its key `stream:{ref}:{n}`): kept by the fleet, done in order on
/// whichever worker holds the turn.
#[derive(Debug)]
pub struct AnswerStream {
    later: LaterReply,
    ref_name: String,
    text: String,
    parts: u64,
}

impl AnswerStream {
    /// Adds `delta` to the text shown (a token of a model's answer, say).
    ///
    /// # Errors
    /// As [`LaterReply::post`] (the text stays added: the next push shows it).
    pub async fn append(&mut self, delta: &str) -> Result<crate::Posted, crate::ReplyError> {
        self.text.push_str(delta);
        self.post(false, None).await
    }

    /// Shows `text` in place of what the message shows.
    ///
    /// # Errors
    /// As [`LaterReply::post`].
    pub async fn set(&mut self, text: &str) -> Result<crate::Posted, crate::ReplyError> {
        text.clone_into(&mut self.text);
        self.post(false, None).await
    }

    /// The text shown so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Ends the turn with the text as it stands (and the chat's new `state`, if any): the
    /// turn is over once the platform shows it.
    ///
    /// # Errors
    /// As [`LaterReply::post`].
    pub async fn finish(
        mut self,
        state: Option<&serde_json::Value>,
    ) -> Result<crate::Posted, crate::ReplyError> {
        self.post(true, state).await
    }

    async fn post(
        &mut self,
        last: bool,
        state: Option<&serde_json::Value>,
    ) -> Result<crate::Posted, crate::ReplyError> {
        let action = if self.parts == 0 {
            serde_json::json!({"type": "send", "text": self.text, "ref": self.ref_name})
        } else {
            serde_json::json!({"type": "edit", "text": self.text, "ref": self.ref_name})
        };
        let mut part = serde_json::json!({"actions": [action], "final": last});
        if let Some(s) = state {
            part["state"] = s.clone();
        }
        let key = format!("stream:{}:{}", self.ref_name, self.parts);
        let posted = self.later.post(&key, &part).await?;
        self.parts += 1;
        Ok(posted)
    }
}

/// `echo`: the text back to the chat.
#[derive(Debug, Default)]
pub struct Echo;

#[async_trait]
impl BotHandler for Echo {
    async fn handle(&self, event: &Inbound, cx: &mut TurnContext) -> Result<(), HandlerError> {
        if !event.text.is_empty() {
            cx.reply(event.text.clone());
        }
        Ok(())
    }
}

/// `webhook`: the event POSTed as JSON (see [`request`]), signed when a secret is set; the
/// answer `{text?, state?, actions?}` is what the handler asks for.
#[derive(Debug)]
pub struct Webhook {
    url: String,
    secret: Option<Secret>,
    http: reqwest::Client,
    timeout: Duration,
}

impl Webhook {
    /// A webhook handler POSTing to `url`, through the process's HTTP client.
    pub fn new(
        url: String,
        secret: Option<Secret>,
        http: reqwest::Client,
        timeout: Duration,
    ) -> Self {
        Self {
            url,
            secret,
            http,
            timeout,
        }
    }
}

/// Runs one bot's handler.
#[derive(Clone)]
pub struct Handler {
    imp: Arc<dyn BotHandler>,
    takes_state: bool,
    timeout: Duration,
}

impl std::fmt::Debug for Handler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handler")
            .field("takes_state", &self.takes_state)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// Stands in for a compiled-in handler this worker lacks.
struct MissingHandler(String);

#[async_trait]
impl BotHandler for MissingHandler {
    async fn handle(&self, _: &Inbound, _: &mut TurnContext) -> Result<(), HandlerError> {
        Err(HandlerError::Missing(self.0.clone()))
    }
}

/// `sha256=<hex>` of `body` under `secret`.
pub fn sign(secret: &Secret, body: &[u8]) -> String {
    // HMAC accepts keys of any length, so new_from_slice cannot fail.
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret.expose().as_bytes()) {
        Ok(m) => m,
        Err(_) => return String::new(),
    };
    mac.update(body);
    let bytes = mac.finalize().into_bytes();
    let mut hex = String::with_capacity(7 + bytes.len() * 2);
    hex.push_str("sha256=");
    for b in bytes {
        hex.push_str(&format!("{b:02x}"));
    }
    hex
}

/// The JSON a `webhook` handler is POSTed for `msg` in a chat whose state is `state`, on a
/// platform mode that can do `caps`: the event's fields, the state as `state` and the
/// capabilities as `caps` (see the `HandlerEvent` schema in the OpenAPI document). What the
/// platform needs to answer the event (`answer_handle`) is not shown.
///
/// # Errors
/// A stored state that is not JSON.
pub fn request(
    msg: &Inbound,
    state: Option<&str>,
    caps: &Caps,
) -> Result<serde_json::Value, HandlerError> {
    request_in_turn(msg, state, caps, None)
}

/// [`request`] as a worker's turn POSTs it: with the turn's `reply_token` (what finishes the
/// turn later, after a `202`).
///
/// # Errors
/// A stored state that is not JSON.
pub fn request_in_turn(
    msg: &Inbound,
    state: Option<&str>,
    caps: &Caps,
    reply_token: Option<&str>,
) -> Result<serde_json::Value, HandlerError> {
    let mut doc = serde_json::to_value(msg).map_err(|e| HandlerError::BadReply(e.to_string()))?;
    if let Some(obj) = doc.as_object_mut() {
        obj.remove("answer_handle");
        // What the platform calls a file stays with the fleet: handlers get the link.
        if let Some(files) = obj.get_mut("attachments").and_then(|a| a.as_array_mut()) {
            for f in files.iter_mut().filter_map(|f| f.as_object_mut()) {
                f.remove("source");
            }
        }
        if let Some(st) = state {
            let v: serde_json::Value = serde_json::from_str(st)
                .map_err(|e| HandlerError::BadReply(format!("stored state: {e}")))?;
            obj.insert("state".into(), v);
        }
        let caps = serde_json::to_value(caps).map_err(|e| HandlerError::BadReply(e.to_string()))?;
        obj.insert("caps".into(), caps);
        // Outside a worker's turn (which counts them) a call is the first.
        obj.insert("attempt".into(), msg.attempt.max(1).into());
        if let Some(t) = reply_token {
            obj.insert("reply_token".into(), t.into());
        }
    }
    Ok(doc)
}

/// A handler's answer, and the chat's new conversation state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reply {
    /// The text to send back, if any (one `send`, before `actions`).
    pub text: Option<String>,
    /// The chat's new state (JSON), if the handler gave one: sent with the chat's next message.
    pub state: Option<String>,
    /// What to do, in order, after `text`.
    pub actions: Vec<Action>,
    /// Entries of `actions` that could not be read, each with its reason (the others run).
    pub refused: Vec<String>,
    /// `text` is shown only to the user who acted, where it answers their interaction (a
    /// Discord command or button press).
    pub ephemeral: bool,
    /// The answer comes later (a webhook's `202`, [`TurnContext::answer_later`]): the turn
    /// is held open for it, and the rest of this reply is not done.
    pub later: bool,
}

impl Reply {
    /// Reads a handler's JSON answer `{text?, state?, actions?}`.
    ///
    /// # Errors
    /// `text` that is not a string, `actions` that is not a list.
    pub fn from_json(v: &serde_json::Value) -> Result<Self, HandlerError> {
        let text = match v.get("text") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(s)) if s.is_empty() => None,
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(HandlerError::BadReply("`text` is not a string".into())),
        };
        let state = match v.get("state") {
            None | Some(serde_json::Value::Null) => None,
            Some(s) => Some(s.to_string()),
        };
        let (mut actions, mut refused) = (Vec::new(), Vec::new());
        match v.get("actions") {
            None | Some(serde_json::Value::Null) => {}
            Some(serde_json::Value::Array(items)) => {
                for (i, a) in items.iter().enumerate() {
                    match Action::from_json(i, a) {
                        Ok(a) => actions.push(a),
                        Err(why) => refused.push(why),
                    }
                }
            }
            Some(_) => return Err(HandlerError::BadReply("`actions` is not a list".into())),
        }
        let ephemeral = match v.get("ephemeral") {
            None | Some(serde_json::Value::Null) => false,
            Some(serde_json::Value::Bool(b)) => *b,
            Some(_) => {
                return Err(HandlerError::BadReply(
                    "`ephemeral` is not a boolean".into(),
                ))
            }
        };
        Ok(Reply {
            text,
            state,
            actions,
            refused,
            ephemeral,
            later: false,
        })
    }
}

impl Handler {
    /// A handler for `spec`, sharing the process's HTTP client; a compiled-in one is looked
    /// up in `named`. A call that takes longer than `timeout` is cut off
    /// ([`HandlerError::TimedOut`]).
    pub fn new(
        spec: HandlerSpec,
        http: reqwest::Client,
        timeout: Duration,
        named: &HandlerRegistry,
    ) -> Self {
        let (imp, takes_state): (Arc<dyn BotHandler>, bool) = match spec {
            HandlerSpec::Echo => (Arc::new(Echo), false),
            HandlerSpec::Webhook { url, secret } => {
                (Arc::new(Webhook::new(url, secret, http, timeout)), true)
            }
            HandlerSpec::Named(name) => (
                named
                    .get(&name)
                    .cloned()
                    .unwrap_or_else(|| Arc::new(MissingHandler(name))),
                true,
            ),
        };
        Self {
            imp,
            takes_state,
            timeout,
        }
    }

    /// Whether this handler is given the chat's conversation state (echo keeps none, so its
    /// turns need not read it).
    pub fn takes_state(&self) -> bool {
        self.takes_state
    }

    /// The answer to `msg` in a chat whose state is `state` (JSON), on a platform mode that
    /// can do `caps`.
    ///
    /// # Errors
    /// The handler's failures.
    pub async fn answer_with_state(
        &self,
        msg: &Inbound,
        state: Option<&str>,
        caps: &Caps,
    ) -> Result<Reply, HandlerError> {
        self.answer_in(msg, state, caps, None, None).await
    }

    /// [`Handler::answer_with_state`] in a worker's turn, whose context reads the event's
    /// files through `files` and finishes later through `reply_token`.
    pub(crate) async fn answer_in(
        &self,
        msg: &Inbound,
        state: Option<&str>,
        caps: &Caps,
        files: Option<&crate::Files>,
        later: Option<(String, crate::Replies)>,
    ) -> Result<Reply, HandlerError> {
        let mut cx = TurnContext::new(*caps, state);
        cx.files = files.cloned();
        if let Some((token, replies)) = later {
            cx.reply_token = Some(token);
            cx.replies = Some(replies);
        }
        cx.bot = Some(msg.chat.bot.clone());
        tokio::time::timeout(self.timeout, self.imp.handle(msg, &mut cx))
            .await
            .map_err(|_| HandlerError::TimedOut(self.timeout))??;
        Ok(cx.into_reply())
    }
}

#[async_trait]
impl BotHandler for Webhook {
    async fn handle(&self, msg: &Inbound, cx: &mut TurnContext) -> Result<(), HandlerError> {
        let doc = request_in_turn(
            msg,
            cx.state.as_deref(),
            &cx.caps,
            cx.reply_token.as_deref(),
        )?;
        let body = serde_json::to_vec(&doc).map_err(|e| HandlerError::BadReply(e.to_string()))?;
        let mut req = self
            .http
            .post(&self.url)
            .timeout(self.timeout)
            .header("content-type", "application/json");
        if let Some(s) = &self.secret {
            req = req.header(SIGNATURE_HEADER, sign(s, &body));
        }
        let failed = |e: reqwest::Error| {
            if e.is_timeout() {
                HandlerError::TimedOut(self.timeout)
            } else {
                HandlerError::Unreachable(e.without_url())
            }
        };
        let resp = req.body(body).send().await.map_err(failed)?;
        let status = resp.status();
        if status == reqwest::StatusCode::ACCEPTED {
            // The answer comes later, through the reply token; the body says nothing.
            cx.answer_later();
            return Ok(());
        }
        if !status.is_success() {
            return Err(HandlerError::Status(status.as_u16()));
        }
        let bytes = resp.bytes().await.map_err(failed)?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        let v: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| HandlerError::BadReply(e.to_string()))?;
        cx.reply = Reply::from_json(&v)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_keep_text_and_read_actions_one_by_one() {
        let r = Reply::from_json(&serde_json::json!({
            "text": "hi",
            "state": {"n": 1},
            "actions": [{"type": "typing"}, {"type": "teleport"}, {"type": "send", "text": "b"}],
        }))
        .unwrap();
        assert_eq!(r.text.as_deref(), Some("hi"));
        assert_eq!(r.state.as_deref(), Some(r#"{"n":1}"#));
        assert_eq!(r.actions, [Action::Typing {}, Action::send("b")]);
        assert_eq!(r.refused.len(), 1);
        assert!(r.refused[0].contains("action 1"), "{:?}", r.refused);
        assert!(Reply::from_json(&serde_json::json!({"actions": {"type": "typing"}})).is_err());
        assert!(Reply::from_json(&serde_json::json!({"text": 3})).is_err());
        assert_eq!(
            Reply::from_json(&serde_json::json!({})).unwrap(),
            Reply::default()
        );
    }

    #[test]
    fn signature_matches_a_known_vector() {
        // RFC 4231 test case 2.
        let s = sign(&Secret::new("Jefe"), b"what do ya want for nothing?");
        assert_eq!(
            s,
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
