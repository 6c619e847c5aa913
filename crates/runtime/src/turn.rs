//! One turn: how every bot's message is answered, whatever its transport.
//!
//! ```text
//! view (the entry, the chat's state, whether the outbox has the reply) → decode → handler
//!   with the chat's state (transient failures retried) → lease check → send, unless the
//!   outbox has it (retried; refused credentials fail the bot) → one record: outbox, new
//!   state, entry end, under the turn's fence
//! ```
//!
//! Transports differ only in how a chat's turn is held ([`Hold`], and the [`TurnFence`] its
//! writes carry): the unit's claim for polling, socket, gateway and linked-device bots (the
//! chat queues of [`crate::chats`]), a ticket queue across workers for webhook bots
//! ([`crate::hooks`]).
//!
//! Exactly once: a reply goes out under an idempotency key derived from its message and is
//! recorded in the same write that ends the entry. A replay (a successor, a taken-over turn,
//! a redelivery) finds the entry ended, or (for a webhook turn that was superseded after it
//! sent, so ended no entry) the reply's outbox row, and sends nothing. What is left is the
//! window between the platform accepting a reply and that write: a crash inside it sends the
//! reply again, except where the platform drops repeats of the key (Discord's `nonce` with
//! `enforce_nonce`, WhatsApp Web's message id). The window is measured on every platform
//! (`botfleet_outbox_window_seconds`).

mod actions;
mod deadline;
mod held;

pub(crate) use actions::sent_name;
pub(crate) use deadline::Armed;
use deadline::Deadline;
pub(crate) use held::{step as step_held, Parked};

use std::{
    future::Future,
    sync::Arc,
    time::{Duration, Instant},
};

use botfleet_core::{
    Act, Action, BotId, BotSpec, BotStatus, Caps, ChatKey, Inbound, Outbound, Platform,
};
use botfleet_platform::{Bucket, Call, ErrorKind, PlatformError, Sender};
use botfleet_store::{
    EntryKind, InboxOutcome, InboxState, StateWrite, Store, StoreError, TurnFence, TurnRecord,
    TurnView, MAX_STATE_BYTES,
};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tracing::{debug, warn};

use crate::{
    handler::{Handler, Reply},
    metrics::{
        Metrics, EVENTS_PAUSED_TOTAL, HANDLER_TIMEOUTS_TOTAL, INVALID_GUARD_SHUT_TOTAL,
        INVALID_REQUESTS_TOTAL, OUTBOX_SKIPPED_TOTAL, STATE_REFUSED_TOTAL, STATE_TOO_LARGE_TOTAL,
        TYPING_SHOWN_TOTAL, TYPING_SKIPPED_TOTAL,
    },
    reporter::Reporter,
    retry::{backoff, sleep_or_stop, wait_after},
};

/// Why a turn stopped before its entry ended. The entry stays pending in every case, for
/// whoever answers the chat next.
#[derive(Debug)]
pub(crate) enum Halt {
    /// Asked to stop (a hand-over, a shutdown).
    Stopped,
    /// This worker may not act for the turn: its lease is not safe, or a newer fence holds
    /// the bot.
    Fenced(String),
    /// The platform refused the bot's credentials while sending: the bot was reported
    /// failed, and its messages wait until an operator restarts it.
    Failed(PlatformError),
}

/// How a chat's turn is held: what the pipeline asks before every act the platform or
/// another worker can observe, and how it waits between tries.
pub(crate) trait Hold: Sync {
    /// `Ok` while this worker may act for the turn.
    ///
    /// # Errors
    /// Why not: stopping, or fenced.
    fn check(&self) -> Result<(), Halt>;

    /// What says a stop is asked for (a hand-over, a shutdown).
    fn stop(&self) -> watch::Receiver<bool>;

    /// Resolves once the turn is surely lost for good (not merely unsafe for a while): a
    /// handler still running for it is then given up. Never, unless the hold says otherwise.
    fn gone(&self) -> impl Future<Output = ()> + Send {
        std::future::pending()
    }

    /// Where the turns of this hold that are held open for an answer that comes later are
    /// woken, when their owner keeps them as data ([`run_or_park`]); `None` when each waits
    /// in its own task ([`run`]).
    fn parks(&self) -> Option<&Arc<crate::later::Posted>> {
        None
    }

    /// Waits `d`, ending at once when a stop is asked for.
    ///
    /// # Errors
    /// [`Halt::Stopped`] when it was.
    fn pause(&self, d: Duration) -> impl Future<Output = Result<(), Halt>> + Send {
        let mut stop = self.stop();
        async move {
            if sleep_or_stop(d, &mut stop).await {
                Err(Halt::Stopped)
            } else {
                Ok(())
            }
        }
    }
}

/// The turn slots of one worker: how many turns may be at work at once over every bot and
/// transport (reading and decoding the entry, a quick handler, sending, recording), and how
/// many bots may be recording what they received. More wait for a slot, in order.
///
/// A handler still working after [`QUICK_HANDLER`] gives its turn's slot back until it
/// answers: a handler that takes minutes (an AI agent) holds none, and the other bots' turns
/// go on. So do the waits between tries (a 429 may ask for minutes).
///
/// A burst (every bot written to at once) then costs what `n` turns at a time cost, not what
/// all of them would at once: the allocator keeps the high-water of a burst for good.
#[derive(Clone, Debug)]
pub(crate) struct Slots(Arc<Semaphore>);

/// How long a handler may run before its turn gives its slot back.
pub(crate) const QUICK_HANDLER: Duration = Duration::from_millis(250);

/// A turn's slot, when it holds one.
pub(crate) type Slot = Option<OwnedSemaphorePermit>;

impl Slots {
    /// `n` slots (at least one).
    pub(crate) fn new(n: usize) -> Self {
        Self(Arc::new(Semaphore::new(n.max(1))))
    }

    /// A slot if one is free now (and nobody is waiting for one).
    pub(crate) fn try_take(&self) -> Option<OwnedSemaphorePermit> {
        self.0.clone().try_acquire_owned().ok()
    }

    /// Waits for a slot (cancel-safe: dropped while waiting, it takes none).
    pub(crate) async fn next(&self) -> Option<OwnedSemaphorePermit> {
        self.0.clone().acquire_owned().await.ok()
    }

    /// Makes sure `slot` holds one, waiting for it unless a stop is asked for.
    ///
    /// # Errors
    /// [`Halt::Stopped`] when it was.
    async fn ensure(&self, slot: &mut Slot, hold: &impl Hold) -> Result<(), Halt> {
        if slot.is_none() {
            *slot = match self.try_take() {
                Some(p) => Some(p),
                None => tokio::select! {
                    p = self.next() => p,
                    () = crate::retry::stopped(hold.stop()) => return Err(Halt::Stopped),
                },
            };
        }
        Ok(())
    }
}

/// What the turns of one bot share.
pub(crate) struct TurnCtx {
    pub(crate) bot: BotId,
    pub(crate) platform: Platform,
    pub(crate) store: Arc<dyn Store>,
    /// How replies go out, or why none can (shown as the entry's reason).
    pub(crate) sender: Result<Arc<dyn Sender>, String>,
    pub(crate) handler: Handler,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) reporter: Reporter,
    /// This worker's id, for status reports.
    pub(crate) worker: Arc<str>,
    /// How long transient failures of one message are retried.
    pub(crate) retry_for: Duration,
    /// The `updated_at_ms` of the spec the turns run under, when known: a refusal of its
    /// credentials fails the bot only while that spec is still the registered one.
    pub(crate) spec_at_ms: Option<i64>,
    /// The worker's turn slots.
    pub(crate) slots: Slots,
    /// What the bot's platform mode can do (given to the handler; actions beyond it are
    /// refused).
    pub(crate) caps: Caps,
    /// The worker's file links (an event's attachments get theirs; a send's are fetched).
    pub(crate) files: crate::Files,
    /// The bot's `typing`: whether the platform's typing indicator (where `caps.typing`) is
    /// shown while a handler runs long.
    pub(crate) typing: bool,
    /// The bot's `stream`: whether a streamed answer goes through the platform's own streams
    /// where the chat has them.
    pub(crate) native_streams: bool,
    /// The reply-token key.
    pub(crate) later: crate::later::Later,
    /// How long a turn whose handler answered `202` waits for its answer (the bot's own, or
    /// the worker's).
    pub(crate) async_ttl: Duration,
    /// The fleet's send buckets.
    pub(crate) pace: crate::pace::Pace,
}

/// What every turn of a worker shares, whatever the bot's transport.
#[derive(Clone)]
pub(crate) struct TurnBase {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) reporter: Reporter,
    /// This worker's id, for status reports.
    pub(crate) worker: Arc<str>,
    /// How long transient failures of one message are retried.
    pub(crate) retry_for: Duration,
    /// The worker's turn slots.
    pub(crate) slots: Slots,
    /// The worker's file links.
    pub(crate) files: crate::Files,
    /// The worker's answers that come later.
    pub(crate) later: crate::later::Later,
    /// The fleet's send buckets.
    pub(crate) pace: crate::pace::Pace,
}

impl TurnCtx {
    /// The one place a bot's turns get their context, for polled, socket and webhook bots
    /// alike: what the bot's spec (registered at `spec_at_ms`) says — its platform mode's
    /// caps, its typing — is read here from `spec`.
    pub(crate) fn new(
        spec: &BotSpec,
        spec_at_ms: Option<i64>,
        sender: Result<Arc<dyn Sender>, String>,
        handler: Handler,
        base: TurnBase,
    ) -> Self {
        Self {
            bot: spec.id.clone(),
            platform: spec.platform,
            store: base.store,
            sender,
            handler,
            metrics: base.metrics,
            reporter: base.reporter,
            worker: base.worker,
            retry_for: base.retry_for,
            spec_at_ms,
            slots: base.slots,
            caps: crate::platforms::caps(spec),
            files: base.files,
            typing: spec.shows_typing(),
            native_streams: spec.stream_mode() == botfleet_core::StreamMode::Native,
            async_ttl: spec.async_reply_ttl(base.later.ttl()),
            later: base.later,
            pace: base.pace.for_bot(spec),
        }
    }
}

/// One entry to answer.
pub(crate) struct Job<'a> {
    pub(crate) key: &'a str,
    pub(crate) chat: &'a str,
    pub(crate) fence: TurnFence,
    /// What the turn starts from, when the caller read it already (in the same store call as
    /// the journal write); read here otherwise.
    pub(crate) view: Option<TurnView>,
    /// When the platform's request arrived (webhook bots: the reply latency counts from it).
    pub(crate) arrived: Option<Instant>,
    /// The turn's slot, when its caller waited for it already (the chat queues do, before
    /// they start a turn); taken here otherwise.
    pub(crate) slot: Slot,
    /// The event's deadline, when it was armed on receipt (the chat queues arm those of
    /// what their bot's connection delivers).
    pub(crate) armed: Option<Arc<Armed>>,
}

/// Answers one journaled entry and ends it: `Ok` once it is ended (answered, found
/// undeliverable, or done before), or when there was nothing to answer.
///
/// # Errors
/// Why the entry was left pending ([`Halt`]).
pub(crate) fn run<'a, H: Hold>(
    ctx: &'a TurnCtx,
    hold: &'a H,
    job: Job<'a>,
) -> impl Future<Output = Result<(), Halt>> + Send + 'a {
    // Each stage boxed (the job moved into the first at once), the first gone before the
    // second: a turn held open for an answer that comes later keeps only what its wait
    // needs, not the frame of the turn that held it (kilobytes; a thousand held turns would
    // keep a thousand of them).
    let answering = Box::pin(answer_turn(ctx, hold, job));
    async move {
        match answering.await? {
            None => Ok(()),
            Some(held) => Box::pin(held::wait(ctx, hold, held)).await,
        }
    }
}

/// [`run`], but a turn held open for an answer that comes later is handed back as data
/// (`Some`) once its hold is written and the parts posted so far are done: its owner looks at
/// it again ([`held::step`]) when a part is posted or at its due time. `Ok(None)` once the
/// entry is ended.
///
/// # Errors
/// Why the entry was left pending ([`Halt`]).
pub(crate) fn run_or_park<'a, H: Hold>(
    ctx: &'a TurnCtx,
    hold: &'a H,
    job: Job<'a>,
) -> impl Future<Output = Result<Option<Box<Parked>>, Halt>> + Send + 'a {
    let answering = Box::pin(answer_turn(ctx, hold, job));
    async move {
        match answering.await? {
            None => Ok(None),
            Some(held) => Ok(Box::pin(held::park(ctx, hold, held)).await?.map(Box::new)),
        }
    }
}

/// [`run`] up to the end of its entry, or to its hold: `Some` (what its wait needs) when the
/// handler answers later.
async fn answer_turn<'a, H: Hold>(
    ctx: &'a TurnCtx,
    hold: &'a H,
    job: Job<'a>,
) -> Result<Option<held::Held<'a>>, Halt> {
    let mut slot = job.slot;
    ctx.slots.ensure(&mut slot, hold).await?;
    let view = match job.view {
        Some(v) => v,
        None => read_view(ctx, hold, job.key, job.chat).await?,
    };
    let Some(entry) = view.entry.as_ref() else {
        return Ok(None); // never journaled (the delivery was refused)
    };
    if entry.state != InboxState::Pending {
        if entry.state == InboxState::Paused && job.armed.is_some() {
            // Recorded paused on arrival (its chat handed to a person), an event the
            // platform waits on: acknowledged, not answered.
            if let Ok(msg) = serde_json::from_str::<Inbound>(&entry.message) {
                Deadline::armed(job.armed).defer(ctx, hold, &msg).await;
            }
        }
        return Ok(None); // ended already (a redelivery's ticket, a replay)
    }
    debug!(bot = %ctx.bot, chat = %job.chat, key = %job.key, fence = job.fence.fence().get(), revision = view.revision, has_state = view.state.is_some(), sent = view.sent, "answering a message");
    let mut end = End {
        key: job.key,
        chat: job.chat,
        fence: job.fence,
        refs: Vec::new(),
        notes: None,
        said: Vec::new(),
        last_in_ms: view.last_in_ms,
    };
    let started = Instant::now();
    if entry.kind() == EntryKind::Send {
        return run_send(ctx, hold, slot, &view, &entry.message, end, started)
            .await
            .map(|()| None);
    }
    let mut msg: Inbound = match serde_json::from_str::<Inbound>(&entry.message) {
        Ok(mut m) => {
            // Stable across redeliveries and replays: the entry's key is.
            m.event_id = format!("{}:{}", ctx.bot, end.key);
            m
        }
        Err(e) => {
            let why = format!("recorded message unreadable: {e}");
            return end.undeliverable(ctx, hold, slot, why).await.map(|()| None);
        }
    };
    actions::resolve_event(ctx, hold, &mut msg).await?;
    if !msg.attachments.is_empty() {
        let key =
            through_store(ctx, hold, "read the file-link key", || ctx.files.link_key()).await?;
        ctx.files.sign_all(&key, &ctx.bot, &mut msg.attachments);
    }
    let mut deadline = Deadline::armed(job.armed);
    if view.paused && view.held_until_ms.is_none() && !view.sent {
        // Its chat is handed to a person (paused after it was recorded): kept, not answered;
        // an event the platform waits on is acknowledged. (A turn held open was answered by
        // the handler before, and a reply sent before a crash was answered: they go on.)
        let armed = deadline.armed.clone();
        let w = end
            .record(ctx, hold, slot, InboxOutcome::Paused, None, None)
            .await?;
        if w != StateWrite::Unpaused {
            debug!(bot = %ctx.bot, chat = %job.chat, key = %job.key, "chat paused: the message is recorded, not answered");
            ctx.metrics.count(EVENTS_PAUSED_TOTAL, ctx.platform, 1);
            if msg.answer_handle.is_some() {
                deadline.defer(ctx, hold, &msg).await;
            }
            return Ok(None);
        }
        // Resumed since the view was read, before this was recorded paused: a resume's replay
        // did not see it, so it is answered now, as the chat's next.
        debug!(bot = %ctx.bot, chat = %job.chat, key = %job.key, "chat resumed meanwhile: answering the message");
        let again = Job {
            key: job.key,
            chat: job.chat,
            fence: job.fence,
            view: None,
            arrived: job.arrived,
            slot: None,
            armed,
        };
        return Box::pin(answer_turn(ctx, hold, again)).await;
    }
    let began = Began {
        turn: started,
        event: arrived_at(entry.received_at_ms, started),
    };
    let (reply, until_ms) = match view.held_until_ms {
        // Held before (here, or by a worker this turn was taken from): the handler answered
        // already, and its answer comes through the reply token.
        Some(until_ms) => (
            Reply {
                later: true,
                ..Reply::default()
            },
            until_ms,
        ),
        None => match answer(
            ctx,
            hold,
            &mut slot,
            &mut msg,
            view.state.as_deref(),
            began,
            &mut deadline,
            (job.chat, job.key),
        )
        .await?
        {
            Ok(r) => r,
            Err(why) => return end.undeliverable(ctx, hold, slot, why).await.map(|()| None),
        },
    };
    if reply.later {
        // A held turn holds no slot: a thousand of them cost memory only.
        drop(slot);
        let held = held::Held {
            msg,
            until_ms,
            end,
            revision: view.revision,
            since: began.event,
            deadline,
        };
        return Ok(Some(held));
    }
    if !actions::is_plain(&reply) || actions::needs_answer(ctx, &msg) {
        let turn = actions::Answered {
            reply,
            revision: view.revision,
            already_sent: view.sent,
            deadline,
            arrived: began.event,
        };
        return actions::run(ctx, hold, slot, &msg, turn, end, started)
            .await
            .map(|()| None);
    }
    let mut sent = None;
    if let Some(text) = reply.text {
        // (As a plain reply goes: quoting or threading where the platform does.)
        let said = actions::said(
            &Action::Send {
                text: text.clone(),
                buttons: Vec::new(),
                thread: true,
                ref_name: None,
                attachments: Vec::new(),
                ephemeral: false,
            },
            None,
        );
        if view.sent {
            // Sent before a crash, and recorded: not again.
            ctx.metrics.count(OUTBOX_SKIPPED_TOTAL, ctx.platform, 1);
            end.said.push(said);
        } else {
            let key = end.key;
            if let Err(why) = actions::window(ctx, hold, key, job.chat, &mut end.last_in_ms).await?
            {
                return end.undeliverable(ctx, hold, slot, why).await.map(|()| None);
            }
            match send(
                ctx,
                hold,
                &mut slot,
                &Outbound::reply_to(&msg, text),
                started,
            )
            .await?
            {
                Ok(at) => {
                    match job.arrived {
                        Some(a) => ctx.metrics.hook_reply_latency(ctx.platform, a.elapsed()),
                        None => ctx.metrics.reply_latency(ctx.platform, started.elapsed()),
                    }
                    sent = Some(at);
                    end.said.push(said);
                }
                Err(why) => return end.undeliverable(ctx, hold, slot, why).await.map(|()| None),
            }
        }
    }
    let state = checked_state(ctx, job.chat, reply.state).map(|s| (view.revision, s));
    end.record(ctx, hold, slot, InboxOutcome::Done, sent, state)
        .await
        .map(|_| None)
}

/// A backend send's turn: no handler is called; the body the API accepted, read as a
/// handler's answer (`text`, `actions`), goes out in the chat's order under the turn's
/// fence, each action once across replays. It answers no message of the chat: its text is a
/// message of its own, nothing is quoted or threaded under, and it leaves the chat's state
/// as it is.
async fn run_send(
    ctx: &TurnCtx,
    hold: &impl Hold,
    slot: Slot,
    view: &TurnView,
    body: &str,
    end: End<'_>,
    started: Instant,
) -> Result<(), Halt> {
    let read = serde_json::from_str::<serde_json::Value>(body)
        .map_err(|e| e.to_string())
        .and_then(|v| Reply::from_json(&v).map_err(|e| e.to_string()));
    let mut reply = match read {
        Ok(r) => r,
        Err(why) => {
            let why = format!("recorded send unreadable: {why}");
            return end.undeliverable(ctx, hold, slot, why).await;
        }
    };
    reply.state = None;
    if let Some(text) = reply.text.take() {
        reply.actions.insert(
            0,
            Action::Send {
                text,
                buttons: Vec::new(),
                thread: false,
                ref_name: None,
                attachments: Vec::new(),
                ephemeral: false,
            },
        );
    }
    for a in &mut reply.actions {
        if let Action::Send { thread, .. } = a {
            *thread = false;
        }
    }
    // The chat it goes to, as an event of its own: its actions are keyed from the entry's
    // key, unique per send.
    let mut msg = Inbound::message(
        ctx.platform,
        ChatKey::new(ctx.bot.clone(), end.chat),
        end.key,
        None,
        "",
        None,
    );
    msg.event_id = format!("{}:{}", ctx.bot, end.key);
    let turn = actions::Answered {
        reply,
        revision: view.revision,
        already_sent: view.sent,
        deadline: Deadline::armed(None),
        arrived: started,
    };
    actions::run(ctx, hold, slot, &msg, turn, end, started).await
}

/// When an event received at `received_at_ms` (unix ms) arrived, on the clock of `now`. The
/// journal's clock is the wall clock: what it says of the event's age is near enough for a
/// platform's deadline of seconds (an age past an hour is taken as an hour).
pub(crate) fn arrived_at(received_at_ms: i64, now: Instant) -> Instant {
    let age = u64::try_from(botfleet_core::unix_ms().saturating_sub(received_at_ms))
        .unwrap_or(0)
        .min(3_600_000);
    now.checked_sub(Duration::from_millis(age)).unwrap_or(now)
}

/// The turn's view, through store failures while the worker may act.
async fn read_view(
    ctx: &TurnCtx,
    hold: &impl Hold,
    key: &str,
    chat: &str,
) -> Result<TurnView, Halt> {
    through_store(ctx, hold, "read a message's turn", || {
        ctx.store.turn_view(&ctx.bot, key, chat)
    })
    .await
}

/// Calls the store (`call`, which does `what`), retrying through its failures while the
/// worker may act; a write refused for a newer fence halts the turn.
async fn through_store<T, F, Fut>(
    ctx: &TurnCtx,
    hold: &impl Hold,
    what: &str,
    call: F,
) -> Result<T, Halt>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    retry_store(ctx, hold, what, false, call).await
}

/// [`through_store`] for a write that records what was done already (an answer came): a stop
/// asked for meanwhile (a hand-over, a shutdown) does not cut it short, so the next owner
/// finds it and does not do it again; a few tries, then the stop wins. A fenced worker gives
/// up at once (its successor replays).
pub(super) async fn while_recording<T, F, Fut>(
    ctx: &TurnCtx,
    hold: &impl Hold,
    what: &str,
    call: F,
) -> Result<T, Halt>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    retry_store(ctx, hold, what, true, call).await
}

async fn retry_store<T, F, Fut>(
    ctx: &TurnCtx,
    hold: &impl Hold,
    what: &str,
    recording: bool,
    mut call: F,
) -> Result<T, Halt>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut attempt = 0;
    loop {
        match hold.check() {
            Err(Halt::Stopped) if recording && attempt < 6 => {}
            Err(halt) => return Err(halt),
            Ok(()) => {}
        }
        match call().await {
            Ok(v) => return Ok(v),
            Err(StoreError::StaleFence { current, .. }) => {
                return Err(Halt::Fenced(format!(
                    "a newer fence {current} owns this turn"
                )))
            }
            Err(e) => {
                warn!(bot = %ctx.bot, error = %e, "cannot {what}; retrying");
                if recording {
                    tokio::time::sleep(backoff(attempt).min(Duration::from_secs(2))).await;
                } else {
                    hold.pause(backoff(attempt).min(Duration::from_secs(5)))
                        .await?;
                }
                attempt += 1;
            }
        }
    }
}

/// When a turn started, and when the event it answers arrived (as near as the journal says).
#[derive(Clone, Copy)]
struct Began {
    turn: Instant,
    event: Instant,
}

/// The handler's answer (`Err` inside: why the message is undeliverable), transient failures
/// (a timeout among them) retried for `retry_for` while the other chats go on, each call with
/// the next `attempt` and a reply token for the turn (the entry `entry` of `chat`); with it,
/// when that token expires (unix ms: what a hold of the turn lasts, if the answer comes
/// later). An event with a platform
/// deadline is acknowledged when the handler takes past it (`deadline` says so).
#[allow(clippy::too_many_arguments)]
async fn answer(
    ctx: &TurnCtx,
    hold: &impl Hold,
    slot: &mut Slot,
    msg: &mut Inbound,
    state: Option<&str>,
    began: Began,
    deadline: &mut Deadline,
    (chat, entry): (&str, &str),
) -> Result<Result<(Reply, i64), String>, Halt> {
    let mut attempt = 0;
    let mut waiting = Waiting::new(ctx, msg, began.event);
    let replies = crate::Replies::new(ctx.later.clone());
    let key = through_store(ctx, hold, "read the reply-token key", || async {
        ctx.later.key().await.map(<[u8]>::to_vec)
    })
    .await?;
    loop {
        hold.check()?;
        msg.attempt = attempt + 1;
        let msg: &Inbound = msg;
        let ttl_ms = i64::try_from(ctx.async_ttl.as_millis()).unwrap_or(i64::MAX);
        let claim = crate::reply_token::ReplyClaim {
            bot: ctx.bot.clone(),
            chat: chat.to_owned(),
            entry: entry.to_owned(),
            expires_ms: botfleet_core::unix_ms().saturating_add(ttl_ms),
        };
        let token = crate::reply_token::sign(&key, &claim);
        // Boxed: a webhook call's future is kilobytes, which a waiting turn need not carry.
        let call = ctx.handler.answer_in(
            msg,
            state,
            &ctx.caps,
            Some(&ctx.files),
            Some((token, replies.clone())),
        );
        let mut call = Box::pin(while_handler_runs(
            ctx,
            hold,
            msg,
            call,
            deadline,
            &mut waiting,
        ));
        let run = async {
            if slot.is_some() {
                match tokio::time::timeout(QUICK_HANDLER, &mut call).await {
                    Ok(r) => r,
                    Err(_) => {
                        // A slow handler: the slot goes to others until it answers.
                        *slot = None;
                        call.await
                    }
                }
            } else {
                call.await
            }
        };
        // A turn that is others' now: its handler's answer could never be used, and the
        // handler should not work on the chat beside the turn's new holder.
        let r = tokio::select! {
            r = run => r,
            () = hold.gone() => {
                return Err(Halt::Fenced(
                    "the turn was lost while its handler ran (the worker registered again)".into(),
                ))
            }
        };
        if let Err(crate::HandlerError::TimedOut(_)) = &r {
            ctx.metrics.count(HANDLER_TIMEOUTS_TOTAL, ctx.platform, 1);
        }
        match r {
            Ok(r) => return Ok(Ok((r, claim.expires_ms))),
            Err(e) if e.is_transient() && began.turn.elapsed() < ctx.retry_for => {
                ctx.metrics.handler_retry(ctx.platform);
                let wait = backoff(attempt);
                warn!(bot = %ctx.bot, chat = %msg.chat.chat, error = %e, wait_ms = wait.as_millis() as u64, "handler failed; retrying this chat's message");
                *slot = None;
                hold.pause(wait).await?;
                attempt += 1;
            }
            Err(e) => {
                ctx.metrics.platform_error(ctx.platform, "handler");
                return Ok(Err(format!("handler: {e}")));
            }
        }
    }
}

/// How long a handler runs before the chat is shown typing.
pub(crate) const TYPING_AFTER: Duration = Duration::from_secs(1);

/// What the fleet keeps up while a turn's handler runs: the typing indicator (shown once the
/// handler has run [`TYPING_AFTER`], then again every [`Sender::typing_every`] while it runs,
/// retries included, until it answers) and the platform's deadline for the event, counted
/// from when the event arrived (a press queued behind a slow turn is acknowledged at once).
struct Waiting {
    /// When typing is next due (`None`: never, for this event).
    next: Option<Instant>,
    every: Duration,
    /// When the event arrived, as near as the journal says.
    since: Instant,
}

impl Waiting {
    fn new(ctx: &TurnCtx, msg: &Inbound, since: Instant) -> Self {
        let every = match &ctx.sender {
            Ok(s) if ctx.typing && ctx.caps.typing => s.typing_every(msg),
            _ => None,
        };
        Self {
            next: every.map(|_| Instant::now() + TYPING_AFTER),
            every: every.unwrap_or(Duration::MAX),
            since,
        }
    }

    /// When typing or the platform's deadline (`defer_at`) comes first, if either does.
    fn due(&self, defer_at: Option<Instant>) -> Option<Instant> {
        [defer_at, self.next].into_iter().flatten().min()
    }

    /// Shows typing in `msg`'s chat, when the worker may act; a failure is logged and counted
    /// (the turn goes on). Typing takes a token from the buckets it counts against (Discord's
    /// global one), leaving their reserve to messages, but never waits for one: when a bucket
    /// is short it is the first call left out (counted), and tried again at its next turn.
    async fn show(&mut self, ctx: &TurnCtx, hold: &impl Hold, msg: &Inbound) {
        self.next = Instant::now().checked_add(self.every);
        let Ok(sender) = &ctx.sender else { return };
        if hold.check().is_err() {
            return;
        }
        let guard = ctx.pace.guard(ctx.platform, sender.invalid_budget());
        let typing = (&msg.chat, Call::Act(&Act::Typing));
        let buckets = call_buckets(ctx, sender.as_ref(), guard.as_ref(), typing);
        if !buckets.is_empty() {
            let scopes = crate::pace::Pace::scopes(ctx.platform, &ctx.bot, &buckets);
            // Yielding: it leaves the buckets' reserve to messages. (The coordinator away:
            // shown unpaced, as a send would go.)
            if let Ok(t) = ctx.pace.take(&scopes, true).await {
                if !t.taken() {
                    let scope = buckets.get(t.short).map_or("?", |b| b.scope);
                    ctx.metrics.count(TYPING_SKIPPED_TOTAL, ctx.platform, 1);
                    debug!(bot = %ctx.bot, scope, "a send bucket is short: typing left out");
                    return;
                }
            }
        }
        let key = format!("{}:typing", Outbound::reply_key(msg));
        match sender.show_typing(msg, &key).await {
            Ok(()) => ctx.metrics.count(TYPING_SHOWN_TOTAL, ctx.platform, 1),
            Err(e) => {
                ctx.metrics.platform_error(ctx.platform, e.reason());
                debug!(bot = %ctx.bot, chat = %msg.chat.chat, error = %e, "cannot show typing");
                if let Some(g) = guard.as_ref().filter(|_| e.is_invalid()) {
                    refused_counted(ctx, g).await;
                }
            }
        }
    }
}

/// When `at` comes; never for `None`.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Awaits `call` (the handler) while keeping the chat's typing indicator up, and
/// acknowledges `msg` to its platform once the platform's deadline for it comes
/// ([`Sender::defer_after`], counted from the event's arrival) and the handler has not
/// answered: once per call, while the worker may act. Typing never holds up the handler's
/// answer nor the acknowledgement.
async fn while_handler_runs<F: Future>(
    ctx: &TurnCtx,
    hold: &impl Hold,
    msg: &Inbound,
    call: F,
    deadline: &mut Deadline,
    waiting: &mut Waiting,
) -> F::Output {
    tokio::pin!(call);
    let mut defer_tried = false;
    loop {
        let defer_at = (!defer_tried)
            .then(|| defer_at(ctx, msg, deadline, waiting.since))
            .flatten();
        let Some(at) = waiting.due(defer_at) else {
            return call.await;
        };
        tokio::select! {
            r = &mut call => return r,
            () = tokio::time::sleep_until(at.into()) => {}
        }
        if defer_at.is_some_and(|d| d <= Instant::now()) {
            // Once per call: a failure is not tried again until the next attempt.
            defer_tried = true;
            deadline.defer(ctx, hold, msg).await;
        } else if waiting.next.is_some_and(|t| t <= Instant::now()) {
            let show = waiting.show(ctx, hold, msg);
            tokio::pin!(show);
            tokio::select! {
                r = &mut call => return r,
                () = &mut show => {}
                // A slow typing call gives way to the deadline (typing is due again later).
                () = sleep_until_some(defer_at) => {}
            }
        }
    }
}

/// When `msg` (arrived at `since`) is to be acknowledged to its platform unless answered by
/// then ([`Sender::defer_after`]); `None` when it needs no acknowledgement or has had it.
fn defer_at(ctx: &TurnCtx, msg: &Inbound, deadline: &Deadline, since: Instant) -> Option<Instant> {
    match &ctx.sender {
        Ok(s) if !deadline.deferred => s.defer_after(msg).map(|after| since + after),
        _ => None,
    }
}

/// Sends `out`: `Ok(Ok(when the platform accepted it))`, `Ok(Err(why))` when it cannot go
/// (refused as it is, or failing past `retry_for`).
async fn send(
    ctx: &TurnCtx,
    hold: &impl Hold,
    slot: &mut Slot,
    out: &Outbound,
    started: Instant,
) -> Result<Result<Instant, String>, Halt> {
    let act = Act::Send {
        text: &out.text,
        buttons: &[],
        thread_of: None,
        files: &[],
    };
    let call = (&out.chat, Call::Act(&act));
    let r = attempt(ctx, hold, slot, started, call, |s| async move {
        s.send(out).await
    })
    .await?;
    Ok(r.map(|()| Instant::now()))
}

/// Makes one platform call through the bot's sender (`call`, which does `what` in its
/// chat): `Ok(Ok(its answer))`, `Ok(Err(why))` when it cannot succeed (refused as it is, or
/// failing past `retry_for`). Every try first takes a token from each of the platform's send
/// buckets the call counts against. Anything but a refusal is retried, an unreadable answer
/// included (it may hide a sent message: at least once, not at most).
async fn attempt<T, F, Fut>(
    ctx: &TurnCtx,
    hold: &impl Hold,
    slot: &mut Slot,
    started: Instant,
    what: (&ChatKey, Call<'_>),
    call: F,
) -> Result<Result<T, String>, Halt>
where
    F: FnMut(Arc<dyn Sender>) -> Fut,
    Fut: Future<Output = Result<T, PlatformError>>,
{
    attempt_or_give_way(ctx, hold, slot, started, what, None, call).await
}

/// [`attempt`], for a call that a newer one may make needless (an edit of a held turn's
/// message, which a newer part may edit again): with `gave_way`, when one of its buckets is
/// short, the call is not waited for — `Ok(Err(_))`, and `gave_way` says when a token is due
/// — so that the newer call, if it comes first, goes instead.
pub(super) async fn attempt_or_give_way<T, F, Fut>(
    ctx: &TurnCtx,
    hold: &impl Hold,
    slot: &mut Slot,
    started: Instant,
    what: (&ChatKey, Call<'_>),
    mut gave_way: Option<&mut Option<Instant>>,
    mut call: F,
) -> Result<Result<T, String>, Halt>
where
    F: FnMut(Arc<dyn Sender>) -> Fut,
    Fut: Future<Output = Result<T, PlatformError>>,
{
    let sender = match &ctx.sender {
        Ok(s) => s,
        Err(why) => return Ok(Err(format!("send: {why}"))),
    };
    let guard = ctx.pace.guard(ctx.platform, sender.invalid_budget());
    let mut attempt = 0;
    loop {
        // Asked again for every try: a try's answer may have taught the sender a bucket.
        let buckets = call_buckets(ctx, sender.as_ref(), guard.as_ref(), what);
        let gives_way = gave_way.is_some();
        match paced(ctx, hold, slot, &buckets, started, gives_way).await? {
            Paced::Go => {}
            Paced::TooLong(why) => return Ok(Err(why)),
            Paced::Short(due) => {
                if let Some(out) = gave_way.as_deref_mut() {
                    *out = Some(due);
                }
                return Ok(Err("gave way while a send bucket is short".into()));
            }
        }
        ctx.slots.ensure(slot, hold).await?;
        // Checked before every call: a frozen or fenced worker does nothing.
        hold.check()?;
        let answer = call(sender.clone()).await;
        if let (Err(e), Some(g)) = (&answer, &guard) {
            if e.is_invalid() {
                refused_counted(ctx, g).await;
            }
        }
        let drained = drained_pause(ctx, sender.as_ref(), what).await;
        match answer {
            Ok(v) => {
                ctx.metrics.sent();
                return Ok(Ok(v));
            }
            Err(e) if e.kind() == ErrorKind::Credentials => {
                ctx.metrics.platform_error(ctx.platform, e.reason());
                warn!(bot = %ctx.bot, reason = e.reason(), error = %e, "credentials refused while sending; the bot fails until restarted");
                ctx.reporter.report_under(
                    &ctx.bot,
                    BotStatus::Failed,
                    Some(&e.to_string()),
                    &ctx.worker,
                    ctx.spec_at_ms,
                );
                return Err(Halt::Failed(e));
            }
            Err(e) => {
                ctx.metrics.platform_error(ctx.platform, e.reason());
                let shared = match e.kind() {
                    ErrorKind::RateLimited(wait) => {
                        shared_pause(ctx, &buckets, &e, wait).await | drained
                    }
                    _ => false,
                };
                if e.kind() == ErrorKind::Rejected || started.elapsed() >= ctx.retry_for {
                    return Ok(Err(format!("send: {e}")));
                }
                debug!(bot = %ctx.bot, error = %e, "send failed; retrying");
                // No slot across the wait (a 429 may ask for minutes).
                *slot = None;
                if !shared {
                    hold.pause(wait_after(&e, attempt)).await?;
                }
                attempt += 1;
            }
        }
    }
}

/// The buckets `what` (a call in a chat) takes a token from: the platform's for it, as the
/// bot and the worker keep them, and — for a call that counts against any — the gate of the
/// platform's guard against a ban for refused calls, last.
fn call_buckets(
    ctx: &TurnCtx,
    sender: &dyn Sender,
    guard: Option<&crate::pace::Guard>,
    what: (&ChatKey, Call<'_>),
) -> Vec<Bucket> {
    let mut buckets = ctx.pace.kept(ctx.platform, sender.buckets(what.0, what.1));
    if let Some(g) = guard.filter(|_| !buckets.is_empty()) {
        buckets.push(g.gate.clone());
    }
    buckets
}

/// A call the platform counts as refused (`Discord`: 401, 403, 429) takes a token from the
/// fleet's budget of them; when the budget is spent, the gate every call of the platform
/// takes from shuts for every worker, short of the platform's ban.
async fn refused_counted(ctx: &TurnCtx, g: &crate::pace::Guard) {
    ctx.metrics.count(INVALID_REQUESTS_TOTAL, ctx.platform, 1);
    let scopes = crate::pace::Pace::scopes(ctx.platform, &ctx.bot, std::slice::from_ref(&g.budget));
    match ctx.pace.take(&scopes, false).await {
        Ok(t) if t.taken() => {}
        Ok(_) => {
            ctx.metrics.count(INVALID_GUARD_SHUT_TOTAL, ctx.platform, 1);
            // Once per shut, about: no call of the platform goes while the gate is shut.
            warn!(
                platform = %ctx.platform,
                shut_s = g.shut_for.as_secs(),
                "the fleet spent its budget of refused calls ({}): every call of the platform waits, short of its ban for refused calls",
                g.budget.scope
            );
            pause_for_fleet(
                ctx,
                &g.gate,
                g.shut_for,
                "the budget of refused calls is spent",
            )
            .await;
        }
        Err(e) => {
            debug!(bot = %ctx.bot, error = %e, "a refused call could not be counted for the fleet")
        }
    }
}

/// A 429 (`e`, asking for `wait`) pauses the bucket of `buckets` it was for on every worker:
/// true when it did, and the retry then waits for the bucket (as any other call of the
/// bucket does, here or elsewhere); false when the call has no bucket or the coordinator is
/// away (the retry waits here alone).
async fn shared_pause(
    ctx: &TurnCtx,
    buckets: &[Bucket],
    e: &PlatformError,
    wait: Duration,
) -> bool {
    let Some(b) = crate::pace::limited(buckets, e.scope()) else {
        ctx.metrics.rate_limited(ctx.platform, "none");
        return false;
    };
    ctx.metrics.rate_limited(ctx.platform, b.scope);
    pause_for_fleet(ctx, b, wait, "rate limited").await
}

/// Pauses `b` for every worker for `wait` (`why`, for the log): true when it did.
async fn pause_for_fleet(ctx: &TurnCtx, b: &Bucket, wait: Duration, why: &str) -> bool {
    match ctx.pace.pause(ctx.platform, &ctx.bot, b, wait).await {
        Ok(()) => {
            debug!(bot = %ctx.bot, scope = b.scope, wait_ms = wait.as_millis() as u64, "{why}: the bucket paused for the fleet");
            true
        }
        Err(err) => {
            debug!(bot = %ctx.bot, error = %err, "{why}: the pause could not be shared");
            false
        }
    }
}

/// After a call (`what`) was answered: the bucket its platform said it emptied
/// ([`Sender::drained`]: Discord's announced route limits), paused for the whole fleet until
/// it refills, so no worker's next call meets the 429. True when it was paused.
async fn drained_pause(ctx: &TurnCtx, sender: &dyn Sender, what: (&ChatKey, Call<'_>)) -> bool {
    let Some((bucket, until)) = sender.drained(what.0, what.1) else {
        return false;
    };
    let Some(b) = ctx.pace.kept(ctx.platform, vec![bucket]).pop() else {
        return false; // its scope is not kept
    };
    pause_for_fleet(ctx, &b, until, "the platform said a send bucket is empty").await
}

/// What became of a call's wait for its send buckets ([`paced`]).
enum Paced {
    /// A token from each: the call goes.
    Go,
    /// The wait would end past the call's `retry_for`: why it cannot go.
    TooLong(String),
    /// A bucket is short and the call gives way (it was asked to): when a token is due.
    Short(Instant),
}

/// Waits until each of `buckets` (a platform call's) gives a token, the turn's slot given back
/// meanwhile: [`Paced::TooLong`] when the wait would end past the call's `retry_for` (counted
/// from `started`), [`Paced::Short`] at once when `gives_way`. Without the coordinator the
/// call goes unpaced: the platform's 429s still pace it.
async fn paced(
    ctx: &TurnCtx,
    hold: &impl Hold,
    slot: &mut Slot,
    buckets: &[Bucket],
    started: Instant,
    gives_way: bool,
) -> Result<Paced, Halt> {
    if buckets.is_empty() {
        return Ok(Paced::Go);
    }
    let scopes = crate::pace::Pace::scopes(ctx.platform, &ctx.bot, buckets);
    let since = Instant::now();
    loop {
        hold.check()?;
        // A call that gives way also yields: it leaves the buckets' reserve to the others.
        match ctx.pace.take(&scopes, gives_way).await {
            Ok(t) if t.taken() => break,
            Ok(t) => {
                let scope = buckets.get(t.short).map_or("?", |b| b.scope);
                ctx.metrics.bucket_wait(ctx.platform, scope);
                if started.elapsed() + t.wait > ctx.retry_for {
                    let held = match buckets.get(t.short) {
                        Some(b) if b.fleet => format!(
                            "the fleet's guard against the platform's ban for refused calls (its {scope} budget is spent)"
                        ),
                        _ => format!("the platform's {scope} rate limit"),
                    };
                    return Ok(Paced::TooLong(format!(
                        "send: {held} holds it {} s more, past the {} s a send is tried for",
                        t.wait.as_secs(),
                        ctx.retry_for.as_secs()
                    )));
                }
                if gives_way {
                    debug!(bot = %ctx.bot, scope, wait_ms = t.wait.as_millis() as u64, "a send bucket is empty; giving way to a newer part");
                    return Ok(Paced::Short(Instant::now() + t.wait));
                }
                debug!(bot = %ctx.bot, scope, wait_ms = t.wait.as_millis() as u64, "a send bucket is empty; waiting");
                *slot = None;
                hold.pause(t.wait).await?;
            }
            Err(e) => {
                debug!(bot = %ctx.bot, error = %e, "send buckets unreachable; sending unpaced");
                break;
            }
        }
    }
    ctx.metrics.send_wait(ctx.platform, since.elapsed());
    Ok(Paced::Go)
}

/// The handler's new state, unless it is over [`MAX_STATE_BYTES`] (then reported to the
/// bot's owner and dropped: the chat keeps its last state).
fn checked_state(ctx: &TurnCtx, chat: &str, state: Option<String>) -> Option<String> {
    let s = state?;
    if s.len() <= MAX_STATE_BYTES {
        return Some(s);
    }
    ctx.metrics.count(STATE_TOO_LARGE_TOTAL, ctx.platform, 1);
    let why = format!(
        "the handler's conversation state is {} bytes, over the {MAX_STATE_BYTES}-byte bound: not stored (the chat keeps its last state)",
        s.len()
    );
    warn!(bot = %ctx.bot, chat = %chat, "{why}");
    // Shown in `bots list`; the bot keeps running.
    ctx.reporter
        .report(&ctx.bot, BotStatus::Running, Some(&why), &ctx.worker);
    None
}

/// The entry a turn ends.
struct End<'a> {
    key: &'a str,
    chat: &'a str,
    fence: TurnFence,
    /// Names the turn gave in its chat (refs, long button values), recorded with the end.
    refs: Vec<(String, String)>,
    /// What the turn refused, with reasons, kept on the entry.
    notes: Option<String>,
    /// What the turn did in the chat, for the chat's log (one action's JSON each).
    said: Vec<String>,
    /// When the chat's user last wrote, as the turn read it (for the reply window).
    last_in_ms: Option<i64>,
}

impl End<'_> {
    /// Ends the entry as undeliverable (nothing was sent).
    async fn undeliverable(
        self,
        ctx: &TurnCtx,
        hold: &impl Hold,
        slot: Slot,
        why: String,
    ) -> Result<(), Halt> {
        warn!(bot = %ctx.bot, key = %self.key, reason = %why, "message undeliverable");
        ctx.metrics.undeliverable(ctx.platform);
        self.record(
            ctx,
            hold,
            slot,
            InboxOutcome::Undeliverable(why),
            None,
            None,
        )
        .await
        .map(|_| ())
    }

    /// Writes what the turn leaves in one record (with the refs and notes it gathered),
    /// retrying through store failures: once a reply is out, recording it is what keeps a
    /// replay from sending it again, so a stop does not cut this short (a fenced worker gives
    /// up: its successor replays). Answers what became of it.
    async fn record(
        self,
        ctx: &TurnCtx,
        hold: &impl Hold,
        slot: Slot,
        outcome: InboxOutcome,
        sent: Option<Instant>,
        state: Option<(u64, String)>,
    ) -> Result<StateWrite, Halt> {
        let mut rec = TurnRecord::new(
            self.key,
            self.chat,
            self.fence,
            outcome,
            sent.is_some(),
            state,
        );
        rec.refs = self.refs;
        rec.notes = self.notes;
        rec.said = self.said;
        // Waited for whether or not a stop is asked for: once a reply is out, this write
        // must be made either way.
        let _slot = match slot {
            Some(p) => Some(p),
            None => ctx.slots.next().await,
        };
        let mut attempt = 0;
        loop {
            let r = ctx.store.turn_record(&ctx.bot, &rec).await;
            if let (Ok(_), Some(at)) = (&r, sent) {
                // What is left of the duplicate window: a crash before this write sends the
                // reply again on replay.
                ctx.metrics.outbox_window(ctx.platform, at.elapsed());
            }
            match r {
                Ok(StateWrite::Stale) => {
                    ctx.metrics.count(STATE_REFUSED_TOTAL, ctx.platform, 1);
                    warn!(bot = %ctx.bot, chat = %self.chat, "conversation state refused: a newer turn wrote first; this result is dropped");
                    return Ok(StateWrite::Stale);
                }
                Ok(w) => return Ok(w),
                Err(StoreError::StaleFence { current, .. }) => {
                    return Err(Halt::Fenced(format!(
                        "a newer fence {current} owns this bot"
                    )));
                }
                Err(e) => {
                    match hold.check() {
                        Err(Halt::Stopped) if attempt < 6 => {}
                        Err(halt) => {
                            warn!(bot = %ctx.bot, error = %e, "cannot record an answered message; whoever answers next may send it again");
                            return Err(halt);
                        }
                        Ok(()) => {}
                    }
                    warn!(bot = %ctx.bot, error = %e, "cannot record an answered message; retrying");
                    tokio::time::sleep(backoff(attempt).min(Duration::from_secs(2))).await;
                    attempt += 1;
                }
            }
        }
    }
}
