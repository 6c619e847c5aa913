//! A reply of several actions (`actions`, or `text` with buttons, edits, typing…): each done
//! in order under the turn's fence, each refused with a reason when it cannot be done (the
//! rest go on), and exactly once across replays.
//!
//! ```text
//! progress (an earlier attempt's, if any) → for each action not done: check it against the
//!   mode's caps, resolve refs → do it (retried like a send) → before the next action that
//!   changes something, record the progress under the fence → the turn's one record: the
//!   entry's end, the refs, the notes of what was refused
//! ```
//!
//! The progress holds the reply itself, so a replay goes on with what the first attempt was
//! answered, not with a new answer. What is left is the window of each action between the
//! platform doing it and the next progress write, as for a single reply.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use botfleet_core::{Act, Action, Button, Caps, EventKind, Inbound, OutFile, Target, Upload};
use botfleet_platform::{Call, StreamStep};
use botfleet_store::{InboxOutcome, TurnStep};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tracing::{debug, warn};

use super::{
    attempt, attempt_or_give_way, checked_state, deadline::Deadline, through_store, End, Halt,
    Hold, Slot, TurnCtx,
};
use crate::{
    coalesce::{self, Marks, Next},
    handler::Reply,
    metrics::{ACTION_REFUSED_TOTAL, FILES_SENT_TOTAL},
};

/// The prefix of a long button value's stand-in on the wire (a value that starts with it is
/// always stood in for, so a handler's own value is never mistaken for a key).
const VALUE_KEY_PREFIX: &str = "bf~";

/// Ref names in the store: a handler's ref → the message id; a message id → its ref; a value
/// key → the value.
fn ref_name(name: &str) -> String {
    format!("r:{name}")
}
fn message_name(id: &str) -> String {
    format!("m:{id}")
}
fn value_name(key: &str) -> String {
    format!("v:{key}")
}
/// A send from the backend (its entry's key) → the platform's ids of what it sent (JSON).
pub(crate) fn sent_name(key: &str) -> String {
    format!("s:{key}")
}
/// A message made by answering an event → until when (Unix ms) and through which answer
/// handle it can still be changed ([`Act::Edit::via`]).
fn hook_name(id: &str) -> String {
    format!("h:{id}")
}

/// What a multi-action turn recorded of itself.
#[derive(Serialize, Deserialize, Default, Clone)]
struct Progress {
    /// The actions, as the handler first answered (a `text` as the first `send`).
    actions: Vec<Action>,
    /// The state the handler gave with them.
    #[serde(default)]
    state: Option<String>,
    /// How many are done (or refused).
    done: usize,
    /// Names given so far (store names → values).
    #[serde(default)]
    refs: Vec<(String, String)>,
    /// What was refused, with reasons.
    #[serde(default)]
    notes: Vec<String>,
    /// Whether a message went out.
    #[serde(default)]
    sent: bool,
    /// Whether the event was answered (an `answer` action, or the turn's acknowledgement).
    #[serde(default)]
    answered: bool,
    /// The platform's ids of the messages sent so far.
    #[serde(default)]
    ids: Vec<String>,
    /// A held turn: the number of the last part of its answer taken in (its actions added
    /// to `actions`).
    #[serde(default)]
    parts: u64,
    /// A held turn: its last part was taken in.
    #[serde(default)]
    last: bool,
    /// What the messages sent or edited show and when they changed: an edit that would show
    /// the same is not sent, and a message changes at most once per the platform's pace.
    #[serde(default)]
    marks: Marks,
    /// What was done in the chat, for its log: the actions' indexes, with the platform's id
    /// of a message a `send` made.
    #[serde(default)]
    said: Vec<(usize, Option<String>)>,
}

impl Progress {
    /// What a handler's `reply` starts (its `text` as the first `send`), its refused actions
    /// counted.
    fn from_reply(ctx: &TurnCtx, reply: Reply) -> Self {
        let mut actions = Vec::with_capacity(reply.actions.len() + 1);
        if let Some(t) = reply.text {
            actions.push(Action::Send {
                text: t,
                buttons: Vec::new(),
                // As a plain reply goes (quoting or threading where the platform does).
                thread: true,
                ref_name: None,
                attachments: Vec::new(),
                ephemeral: reply.ephemeral,
            });
        }
        actions.extend(reply.actions);
        let notes = reply.refused;
        for _ in &notes {
            refuse_metric(ctx);
        }
        Progress {
            actions,
            state: reply.state,
            notes,
            ..Progress::default()
        }
    }
}

/// What a held turn's look at the parts posted to it came to.
pub(super) enum Parts {
    /// The entry ended: its last part was done (or it had ended already), or it expired.
    Ended {
        /// It ended for its time to live.
        expired: bool,
    },
    /// Waiting for more parts; whether a message went out so far.
    Waiting {
        /// A message went out.
        sent: bool,
        /// An edit waits for its message's pace: look again then, if no part came first.
        due: Option<Instant>,
    },
}

/// How much later than the platform's reply window a message may still be tried: workers'
/// clocks differ a little, and when in doubt the platform decides (it refuses with the same
/// reason).
const WINDOW_SLACK_MS: i64 = 60_000;

/// Whether a message in the bot's own words (not a template) may go to `chat` now, given the
/// platform's reply window ([`Caps::reply_window_s`]): `Err` with
/// [`OUTSIDE_WINDOW`](botfleet_core::OUTSIDE_WINDOW) when the user last wrote before it.
/// `known` is when the turn last knew the user wrote: enough when it says inside (it only
/// grows); otherwise the store is read again (the user may have written since), and `known`
/// updated. A chat whose last message the fleet does not know is left to the platform.
pub(super) async fn window(
    ctx: &TurnCtx,
    hold: &impl Hold,
    key: &str,
    chat: &str,
    known: &mut Option<i64>,
) -> Result<Result<(), String>, Halt> {
    let limit = i64::from(ctx.caps.reply_window_s) * 1000;
    let open = |t: Option<i64>| {
        limit == 0 || t.is_none_or(|t| botfleet_core::unix_ms() - t <= limit + WINDOW_SLACK_MS)
    };
    if open(*known) {
        return Ok(Ok(()));
    }
    let view = through_store(ctx, hold, "read when the chat's user last wrote", || {
        ctx.store.turn_view(&ctx.bot, key, chat)
    })
    .await?;
    *known = (*known).max(view.last_in_ms);
    Ok(match open(*known) {
        true => Ok(()),
        false => Err(botfleet_core::OUTSIDE_WINDOW.to_owned()),
    })
}

/// Whether `reply` is a plain text answer (handled by the one-send path).
pub(super) fn is_plain(reply: &Reply) -> bool {
    reply.actions.is_empty() && reply.refused.is_empty()
}

/// Whether `msg` waits for an answer from the bot at its platform (a button press's
/// spinner, an interaction): the turn acknowledges it at its end if the handler did not
/// answer it.
pub(super) fn needs_answer(ctx: &TurnCtx, msg: &Inbound) -> bool {
    ctx.caps.answer
        && msg.answer_handle.is_some()
        && matches!(msg.kind, EventKind::Action | EventKind::Command)
}

/// What the handler answered, and what the turn knew before.
pub(super) struct Answered {
    /// The answer.
    pub(super) reply: Reply,
    /// The chat state's revision the turn read.
    pub(super) revision: u64,
    /// Whether the outbox had the reply already.
    pub(super) already_sent: bool,
    /// The event's deadline: whether it was acknowledged while the handler worked, and
    /// the timer armed on receipt.
    pub(super) deadline: Deadline,
    /// When the event arrived (as near as the journal says).
    pub(super) arrived: Instant,
}

/// How long after an interaction arrived a text may still go as its answer (Discord's
/// interaction token answers for 15 minutes), less a margin for the call itself.
const ANSWER_TOKEN_LIFE: Duration = Duration::from_secs(14 * 60 + 30);

/// For an `action` event: the handler's own value back (for a long one the fleet stood in
/// for) and the ref of the message that carried the button.
pub(super) async fn resolve_event(
    ctx: &TurnCtx,
    hold: &impl Hold,
    msg: &mut Inbound,
) -> Result<(), Halt> {
    if msg.kind != EventKind::Action {
        return Ok(());
    }
    let Some(a) = msg.action.as_deref_mut() else {
        return Ok(());
    };
    let mut names = Vec::with_capacity(2);
    if let Some(id) = &a.message_id {
        names.push(message_name(id));
    }
    let key = a
        .value
        .starts_with(VALUE_KEY_PREFIX)
        .then(|| value_name(&a.value));
    names.extend(key.clone());
    if names.is_empty() {
        return Ok(());
    }
    let found = read_refs(ctx, hold, &msg.chat.chat, &names).await?;
    let mut found = names.into_iter().zip(found).collect::<HashMap<_, _>>();
    if let Some(id) = &a.message_id {
        a.message_ref = found.remove(&message_name(id)).flatten();
    }
    if let Some(k) = key {
        match found.remove(&k).flatten() {
            Some(v) => a.value = v,
            None => {
                warn!(bot = %ctx.bot, "a button's long value is no longer known (kept 48 h); the handler gets its key")
            }
        }
    }
    Ok(())
}

/// Reads refs through store failures while the worker may act.
async fn read_refs(
    ctx: &TurnCtx,
    hold: &impl Hold,
    chat: &str,
    names: &[String],
) -> Result<Vec<Option<String>>, Halt> {
    through_store(ctx, hold, "read a chat's refs", || {
        ctx.store.refs_get(&ctx.bot, chat, names)
    })
    .await
}

/// The turn's state as it goes.
struct Run<'a> {
    ctx: &'a TurnCtx,
    msg: &'a Inbound,
    p: Progress,
    /// Whether something changed at the platform since the last progress write.
    dirty: bool,
    /// Where the idempotency keys of the actions start.
    key_base: String,
    /// The event's deadline (whether it was acknowledged before its answer).
    deadline: Deadline,
    /// When the event arrived.
    arrived: Instant,
    /// The last action began a native stream.
    streamed: bool,
    /// The turn is held for an answer that comes later (in parts, as an agent streams it):
    /// only then does a send with a ref begin a native stream (a reply given at once goes
    /// as it is).
    held: bool,
    /// The next edit gives way when one of its send buckets is short (a newer part may edit
    /// the message again): set while [`Run::drive`] does an edit with [`Pace::Yield`].
    gives_way: bool,
    /// When an edit that gave way has its token: set by the edit, taken by [`Run::drive`].
    gave_way: Option<Instant>,
    /// When the chat's user last wrote, as far as the turn knows (for the reply window).
    last_in: Option<i64>,
}

/// What an edit not due yet does ([`Next::Wait`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pace {
    /// Waits for it (a reply, the last part of a later answer: nothing newer can come).
    Wait,
    /// Gives way: a newer part may come first and coalesce it.
    Yield,
}

/// Does `reply`'s actions for `msg` and ends the entry.
pub(super) async fn run(
    ctx: &TurnCtx,
    hold: &impl Hold,
    mut slot: Slot,
    msg: &Inbound,
    answered: Answered,
    end: End<'_>,
    started: Instant,
) -> Result<(), Halt> {
    let Answered {
        reply,
        revision,
        already_sent,
        deadline,
        arrived,
    } = answered;
    let earlier = read_progress(ctx, hold, end.key).await?;
    let p = match earlier {
        Some(p) => p,
        None => Progress::from_reply(ctx, reply),
    };
    let mut run = Run::new(ctx, msg, p, deadline, arrived);
    if already_sent {
        // A superseded chat turn did them all and recorded only that: not again.
        run.p.done = run.p.actions.len();
    }
    run.drive(hold, &mut slot, &end, started, Pace::Wait)
        .await?;
    run.finish(hold, slot, end, (revision, started), None).await
}

/// A held turn: takes in the parts posted to it since it last looked (their actions after
/// the ones taken before, their state as the chat's new one) and does their actions; the last
/// part ends the entry. With `expired`, the entry ends whatever came (undeliverable, [`EXPIRED`](super::held::EXPIRED),
/// keeping what its parts did).
#[allow(clippy::too_many_arguments)]
pub(super) async fn run_parts(
    ctx: &TurnCtx,
    hold: &impl Hold,
    msg: &Inbound,
    deadline: &mut Deadline,
    arrived: Instant,
    end: End<'_>,
    revision: u64,
    expired: bool,
) -> Result<Parts, Halt> {
    let started = Instant::now();
    let mut p = read_progress(ctx, hold, end.key).await?.unwrap_or_default();
    let parts = through_store(ctx, hold, "read the parts posted", || {
        ctx.store.posted_replies(&ctx.bot, end.key, p.parts)
    })
    .await?;
    let mut taken = false;
    for part in parts {
        taken = true;
        p.parts = part.seq;
        p.last |= part.last;
        let read = serde_json::from_str::<serde_json::Value>(&part.body)
            .map_err(|e| e.to_string())
            .and_then(|v| Reply::from_json(&v).map_err(|e| e.to_string()));
        match read {
            Ok(reply) => {
                let next = Progress::from_reply(ctx, reply);
                p.actions.extend(next.actions);
                p.notes.extend(next.notes);
                if next.state.is_some() {
                    p.state = next.state;
                }
            }
            Err(why) => {
                refuse_metric(ctx);
                p.notes
                    .push(format!("part {}: unreadable: {why}", part.seq));
            }
        }
    }
    let mut run = Run::new(ctx, msg, p, std::mem::take(deadline), arrived);
    run.held = true;
    // What was taken in is recorded before it is done: a replay goes on from it.
    run.dirty |= taken;
    let mut slot: Slot = None;
    let pace = if run.p.last || expired {
        Pace::Wait
    } else {
        Pace::Yield
    };
    let driven = run.drive(hold, &mut slot, &end, started, pace).await;
    *deadline = std::mem::take(&mut run.deadline);
    let due = driven?;
    if run.p.last {
        run.finish(hold, slot, end, (revision, started), None)
            .await?;
        return Ok(Parts::Ended { expired: false });
    }
    if expired {
        let why = super::held::EXPIRED.to_owned();
        run.finish(hold, slot, end, (revision, started), Some(why))
            .await?;
        return Ok(Parts::Ended { expired: true });
    }
    if run.dirty {
        run.step(hold, &end).await?;
    }
    Ok(Parts::Waiting {
        sent: run.p.sent,
        due,
    })
}

impl<'a> Run<'a> {
    fn new(
        ctx: &'a TurnCtx,
        msg: &'a Inbound,
        p: Progress,
        deadline: Deadline,
        arrived: Instant,
    ) -> Self {
        Self {
            ctx,
            msg,
            p,
            dirty: false,
            key_base: botfleet_core::Outbound::reply_key(msg),
            deadline,
            arrived,
            streamed: false,
            held: false,
            gives_way: false,
            gave_way: None,
            last_in: None,
        }
    }

    /// Does the actions not done yet, in order, recording the progress before each one that
    /// changes something after one that did. An edit not due yet (its message's pace) is
    /// waited for, or with [`Pace::Yield`] left for the next look: when it is due.
    async fn drive(
        &mut self,
        hold: &impl Hold,
        slot: &mut Slot,
        end: &End<'_>,
        started: Instant,
        pace: Pace,
    ) -> Result<Option<Instant>, Halt> {
        let ctx = self.ctx;
        let msg = self.msg;
        let run = self;
        run.last_in = run.last_in.max(end.last_in_ms);
        let every = coalesce::pace(ctx.platform);
        while run.p.done < run.p.actions.len() {
            let i = run.p.done;
            let now = botfleet_core::unix_ms();
            let not_sent = match run.p.marks.next(&mut run.p.actions, i, now, every) {
                Next::Go => None,
                // A later edit of the message goes instead, or it would show what the message
                // shows.
                Next::Coalesced => Some(coalesce::COALESCED),
                Next::Skipped => Some(coalesce::SKIPPED),
                Next::Wait(wait) => {
                    if pace == Pace::Yield {
                        return Ok(Some(Instant::now() + wait));
                    }
                    // No slot across the wait.
                    *slot = None;
                    hold.pause(wait).await?;
                    continue;
                }
            };
            if let Some(outcome) = not_sent {
                ctx.metrics.stream_edit(ctx.platform, outcome);
                run.p.done += 1;
                continue;
            }
            let action = run.p.actions[i].clone();
            if run.dirty && changes_something(&action) {
                run.step(hold, end).await?;
            }
            run.gives_way = pace == Pace::Yield && matches!(action, Action::Edit { .. });
            let ids = run.p.ids.len();
            // A message of the bot's own words (not an interaction's answer in place, not a
            // stream: neither is on a platform with a reply window).
            let own_words = matches!(action, Action::Send { .. })
                && !run.answers_in_place(&action)
                && !run.streams(&action);
            let r = match own_words {
                true => window(ctx, hold, end.key, &msg.chat.chat, &mut run.last_in).await,
                false => Ok(Ok(())),
            };
            let r = match r {
                Ok(Ok(())) => run.one(hold, slot, i, &action, started).await,
                refused => refused,
            };
            run.gives_way = false;
            if let Some(due) = run.gave_way.take() {
                // One of its buckets is short: looked at again when it has a token, unless a
                // newer part edits the message first (then this edit is coalesced).
                return Ok(Some(due));
            }
            match r? {
                Ok(()) => {
                    if matches!(action, Action::Edit { .. }) {
                        ctx.metrics.stream_edit(ctx.platform, coalesce::SENT);
                    }
                    if !matches!(action, Action::Typing {}) {
                        let id = run.p.ids.get(ids..).and_then(<[String]>::last).cloned();
                        run.p.said.push((i, id));
                    }
                    run.p.marks.changed(&action, botfleet_core::unix_ms());
                    if let (true, Action::Send { text, .. }, Some(t)) =
                        (std::mem::take(&mut run.streamed), &action, shown(&action))
                    {
                        run.p.marks.set_streaming(&t, Some(text));
                    }
                }
                Err(why) => {
                    let note = format!("action {i} ({}): {why}", action.kind());
                    warn!(bot = %ctx.bot, chat = %msg.chat.chat, reason = %note, "action refused");
                    refuse_metric(ctx);
                    run.p.notes.push(note);
                }
            }
            run.p.done += 1;
        }
        Ok(None)
    }

    /// Ends the entry with what the actions did: acknowledges an event nothing answered,
    /// records the refs, the notes, the state (computed from `revision`) and the outcome
    /// (`undeliverable`: given up on with that reason, keeping what was done).
    async fn finish(
        self,
        hold: &impl Hold,
        slot: Slot,
        mut end: End<'_>,
        (revision, started): (u64, Instant),
        undeliverable: Option<String>,
    ) -> Result<(), Halt> {
        let ctx = self.ctx;
        let msg = self.msg;
        let mut run = self;
        let mut slot = slot;
        // Native streams end with the turn: the user's client stops showing them as growing.
        run.end_streams(hold, &mut slot, started).await?;
        if !run.p.answered && needs_answer(ctx, msg) {
            // Nothing answered the press or the command: acknowledged, so the user's client
            // stops waiting.
            let key = format!("{}:ack", run.key_base);
            let ack = Answer {
                text: None,
                alert: false,
                ephemeral: false,
                buttons: &[],
                files: &[],
            };
            match run.answer(hold, &mut slot, ack, &key, started).await {
                Ok(Ok(_)) => {}
                Ok(Err(why)) => {
                    warn!(bot = %ctx.bot, chat = %msg.chat.chat, reason = %why, "cannot acknowledge an unanswered event");
                }
                // Stopping (a hand-over): what the turn did is still recorded below; only the
                // acknowledgement is left out.
                Err(Halt::Stopped) => {
                    debug!(bot = %ctx.bot, chat = %msg.chat.chat, "stopping: an unanswered event is left unacknowledged");
                }
                Err(halt) => return Err(halt),
            }
        }
        let Run { p, .. } = run;
        let state = checked_state(ctx, end.chat, p.state).map(|s| (revision, s));
        if !p.notes.is_empty() {
            // Shown in `bots list`; the bot keeps running.
            ctx.reporter.report(
                &ctx.bot,
                botfleet_core::BotStatus::Running,
                Some(&p.notes.join("; ")),
                &ctx.worker,
            );
        }
        end.notes = (!p.notes.is_empty()).then(|| p.notes.join("; "));
        end.refs = p.refs;
        if botfleet_store::InboxEntry::kind_of(end.key) == botfleet_store::EntryKind::Event {
            // (A send from the backend is in the chat's log as itself.)
            end.said = p
                .said
                .iter()
                .filter_map(|(i, id)| Some(said(p.actions.get(*i)?, id.as_deref())))
                .collect();
        }
        let mut outcome = match undeliverable {
            Some(why) => {
                ctx.metrics.undeliverable(ctx.platform);
                InboxOutcome::Undeliverable(why)
            }
            None => InboxOutcome::Done,
        };
        if botfleet_store::InboxEntry::kind_of(end.key) == botfleet_store::EntryKind::Send {
            // What a send from the backend made, for its status.
            let ids = serde_json::to_string(&p.ids).unwrap_or_else(|_| "[]".into());
            end.refs.push((sent_name(end.key), ids));
            if p.ids.is_empty() {
                if let Some(why) = &end.notes {
                    // Every action it had was refused: the send failed (and is counted so).
                    ctx.metrics.undeliverable(ctx.platform);
                    outcome = InboxOutcome::Undeliverable(why.clone());
                }
            }
        }
        let sent = p.sent.then(Instant::now);
        end.record(ctx, hold, slot, outcome, sent, state)
            .await
            .map(|_| ())
    }
}

/// How the chat's log shows an action done (a message sent with the platform's id of it,
/// `message_id`): as the handler gave it, less the bytes of its files.
pub(super) fn said(action: &Action, message_id: Option<&str>) -> String {
    let mut a = action.clone();
    if let Action::Send { attachments, .. } = &mut a {
        for f in attachments {
            f.data = None;
        }
    }
    let mut v = serde_json::to_value(&a).unwrap_or_default();
    if let (Some(id), Some(o)) = (message_id, v.as_object_mut()) {
        o.entry("message_id")
            .or_insert_with(|| serde_json::Value::String(id.to_owned()));
    }
    v.to_string()
}

/// Counts a refused action.
fn refuse_metric(ctx: &TurnCtx) {
    ctx.metrics.count(ACTION_REFUSED_TOTAL, ctx.platform, 1);
}

/// The message `a` sends (by its ref) or edits, as its marks name it.
fn shown(a: &Action) -> Option<Target> {
    match a {
        Action::Send {
            ref_name: Some(name),
            ..
        } => Some(Target {
            ref_name: Some(name.clone()),
            message_id: None,
        }),
        Action::Edit { target, .. } => Some(target.clone()),
        _ => None,
    }
}

/// Whether doing `a` twice would show (everything but typing).
fn changes_something(a: &Action) -> bool {
    !matches!(a, Action::Typing {})
}

/// The progress an earlier attempt of the entry recorded, through store failures.
async fn read_progress(
    ctx: &TurnCtx,
    hold: &impl Hold,
    key: &str,
) -> Result<Option<Progress>, Halt> {
    let doc = through_store(ctx, hold, "read a turn's progress", || {
        ctx.store.turn_progress(&ctx.bot, key)
    })
    .await?;
    Ok(doc.and_then(|doc| match serde_json::from_str(&doc) {
        Ok(p) => Some(p),
        Err(e) => {
            warn!(bot = %ctx.bot, key, error = %e, "a turn's recorded progress is unreadable; starting over");
            None
        }
    }))
}

impl Run<'_> {
    /// Records the progress under the turn's fence. A stop asked for meanwhile (a hand-over)
    /// does not cut this short: what was done is recorded, so the next owner does not do it
    /// again; a fenced worker gives up (its successor replays).
    async fn step(&mut self, hold: &impl Hold, end: &End<'_>) -> Result<(), Halt> {
        let progress = serde_json::to_string(&self.recorded()).unwrap_or_default();
        let step = TurnStep {
            key: end.key.to_owned(),
            chat: end.chat.to_owned(),
            fence: end.fence,
            progress,
        };
        let ctx = self.ctx;
        super::while_recording(ctx, hold, "record a turn's progress", || {
            ctx.store.turn_step(&ctx.bot, &step)
        })
        .await?;
        self.dirty = false;
        Ok(())
    }

    /// The progress as recorded: the files of actions done keep no bytes (a replay never
    /// sends them again, and a record need not hold megabytes).
    fn recorded(&self) -> std::borrow::Cow<'_, Progress> {
        let heavy = self.p.actions[..self.p.done.min(self.p.actions.len())]
            .iter()
            .any(|a| matches!(a, Action::Send { attachments, .. } if attachments.iter().any(|f| f.data.is_some())));
        if !heavy {
            return std::borrow::Cow::Borrowed(&self.p);
        }
        let mut p = self.p.clone();
        for a in &mut p.actions[..self.p.done] {
            if let Action::Send { attachments, .. } = a {
                for f in attachments {
                    f.data = None;
                }
            }
        }
        std::borrow::Cow::Owned(p)
    }

    /// The message a target names: a ref given earlier (in this turn or a stored one), or a
    /// message id.
    async fn target(&self, hold: &impl Hold, t: &Target) -> Result<Result<String, String>, Halt> {
        match (&t.ref_name, &t.message_id) {
            (Some(_), Some(_)) => Ok(Err("give `ref` or `message_id`, not both".into())),
            (None, Some(id)) if !id.is_empty() => Ok(Ok(id.clone())),
            (None, _) => Ok(Err("names no message (`ref` or `message_id`)".into())),
            (Some(r), None) => {
                let name = ref_name(r);
                if let Some((_, v)) = self.p.refs.iter().rev().find(|(n, _)| *n == name) {
                    return Ok(Ok(v.clone()));
                }
                let found = read_refs(self.ctx, hold, &self.msg.chat.chat, &[name]).await?;
                Ok(found.into_iter().next().flatten().ok_or_else(|| {
                    format!(
                        "unknown ref {:?} (refs name messages this chat's turns sent, for 48 h)",
                        r.chars().take(64).collect::<String>()
                    )
                }))
            }
        }
    }

    /// Buttons as the platform takes them: checked against the caps, long values stood in for
    /// by keys (remembered with the turn's refs).
    fn buttons(&mut self, rows: &[Vec<Button>], caps: &Caps) -> Result<Vec<Vec<Button>>, String> {
        if rows.iter().all(Vec::is_empty) {
            return Ok(Vec::new());
        }
        if !caps.buttons {
            return Err("this platform's mode shows no buttons (caps.buttons)".into());
        }
        let n: usize = rows.iter().map(Vec::len).sum();
        if n > usize::from(caps.max_buttons) {
            return Err(format!(
                "{n} buttons, over the {} this platform shows (caps.max_buttons)",
                caps.max_buttons
            ));
        }
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let mut r = Vec::with_capacity(row.len());
            for b in row {
                if b.text.is_empty() {
                    return Err("a button has no text".into());
                }
                match (&b.value, &b.url) {
                    (Some(_), Some(_)) | (None, None) => {
                        return Err(format!(
                            "button {:?} needs a `value` or a `url` (one of them)",
                            b.text.chars().take(32).collect::<String>()
                        ))
                    }
                    (None, Some(_)) => r.push(b.clone()),
                    (Some(v), None) => {
                        let long = v.is_empty()
                            || v.len() > usize::from(caps.max_button_value)
                            || v.starts_with(VALUE_KEY_PREFIX);
                        let value = if long {
                            let key = value_key(v);
                            self.p.refs.push((value_name(&key), v.clone()));
                            key
                        } else {
                            v.clone()
                        };
                        r.push(Button {
                            text: b.text.clone(),
                            value: Some(value),
                            url: None,
                        });
                    }
                }
            }
            out.push(r);
        }
        Ok(out)
    }

    /// The files of a send, fetched within the mode's bounds: `Err(why)` when one cannot be
    /// sent (the action is refused with it).
    async fn uploads(&self, files: &[OutFile], caps: &Caps) -> Result<Vec<Upload>, String> {
        if files.is_empty() {
            return Ok(Vec::new());
        }
        if !caps.files {
            return Err("this platform's mode sends no files (caps.files)".into());
        }
        if files.len() > usize::from(caps.max_files) {
            return Err(format!(
                "{} attachments, over the {} this platform takes in one send (caps.max_files)",
                files.len(),
                caps.max_files
            ));
        }
        let mut out = Vec::with_capacity(files.len());
        for (j, f) in files.iter().enumerate() {
            match self.ctx.files.fetch_out(f, caps.max_file_bytes).await {
                Ok(u) => out.push(u),
                Err(why) => return Err(format!("attachment {j}: {why}")),
            }
        }
        Ok(out)
    }

    /// Does action `i`: `Ok(Err(why))` when it is refused or cannot be done.
    async fn one(
        &mut self,
        hold: &impl Hold,
        slot: &mut Slot,
        i: usize,
        action: &Action,
        started: Instant,
    ) -> Result<Result<(), String>, Halt> {
        let caps = self.ctx.caps;
        let key = format!("{}:{i}", self.key_base);
        let msg: &Inbound = self.msg;
        let chat = &msg.chat;
        match action {
            Action::Send {
                text,
                buttons,
                thread,
                ref_name: name,
                attachments,
                ephemeral,
            } => {
                if text.is_empty() && attachments.is_empty() {
                    return Ok(Err("a send needs a text or attachments".into()));
                }
                if self.answers_in_place(action) {
                    // The interaction's own answer (or one more under it): where the user
                    // looks, and needing no right to post in the channel.
                    let rows = match self.buttons(buttons, &caps) {
                        Ok(r) => r,
                        Err(why) => return Ok(Err(why)),
                    };
                    let uploads = match self.uploads(attachments, &caps).await {
                        Ok(u) => u,
                        Err(why) => return Ok(Err(why)),
                    };
                    let answer = Answer {
                        text: Some(text),
                        alert: false,
                        ephemeral: *ephemeral,
                        buttons: &rows,
                        files: &uploads,
                    };
                    let r = self.answer(hold, slot, answer, &key, started).await?;
                    if let Ok(id) = &r {
                        self.ctx.metrics.count(
                            FILES_SENT_TOTAL,
                            self.ctx.platform,
                            uploads.len() as u64,
                        );
                        self.named(name.as_deref(), id.as_deref(), true);
                    }
                    return Ok(r.map(|_| ()));
                }
                if self.streams(action) {
                    let step = StreamStep::Start { text };
                    match self.stream(hold, slot, step, &key, started).await? {
                        Ok(id) => {
                            self.p.sent = true;
                            self.named(name.as_deref(), id.as_deref(), false);
                            self.streamed = true;
                            return Ok(Ok(()));
                        }
                        // Refused (a Slack app without the streaming scope…): the answer goes
                        // as a message, and its edits as edits.
                        Err(why) => {
                            warn!(bot = %self.ctx.bot, chat = %msg.chat.chat, reason = %why, "a native stream could not begin; sending the answer as a message");
                        }
                    }
                }
                let rows = match self.buttons(buttons, &caps) {
                    Ok(r) => r,
                    Err(why) => return Ok(Err(why)),
                };
                let uploads = match self.uploads(attachments, &caps).await {
                    Ok(u) => u,
                    Err(why) => return Ok(Err(why)),
                };
                let act = Act::Send {
                    text,
                    buttons: &rows,
                    thread_of: thread.then_some(msg),
                    files: &uploads,
                };
                let r = attempt(
                    self.ctx,
                    hold,
                    slot,
                    started,
                    (chat, Call::Act(&act)),
                    |s| {
                        let (act, key) = (&act, key.as_str());
                        async move { s.act(chat, act, key).await }
                    },
                )
                .await?;
                match r {
                    Ok(id) => {
                        self.p.sent = true;
                        self.dirty = true;
                        self.ctx.metrics.count(
                            FILES_SENT_TOTAL,
                            self.ctx.platform,
                            uploads.len() as u64,
                        );
                        self.named(name.as_deref(), id.as_deref(), false);
                        Ok(Ok(()))
                    }
                    Err(why) => Ok(Err(why)),
                }
            }
            Action::Edit {
                target,
                text,
                buttons,
            } => {
                if !caps.edit {
                    return Ok(Err("this platform's mode cannot edit (caps.edit)".into()));
                }
                if text.as_deref() == Some("") {
                    return Ok(Err("an edit's text cannot be empty".into()));
                }
                let mut id = match self.target(hold, target).await? {
                    Ok(id) => id,
                    Err(why) => return Ok(Err(why)),
                };
                if self.p.marks.streaming(target) {
                    let from = text
                        .as_deref()
                        .filter(|_| buttons.is_empty())
                        .and_then(|t| self.p.marks.extends(target, t).map(|at| (t, at)));
                    if let Some((text, at)) = from {
                        // What it adds goes on the stream.
                        let step = StreamStep::Append {
                            message_id: &id,
                            text,
                            added: &text[at..],
                        };
                        let r = self.stream(hold, slot, step, &key, started).await?;
                        return Ok(r.map(|_| ()));
                    }
                    // Anything else ends the stream, then edits the message it made.
                    match self
                        .end_stream(hold, slot, target, &id, &format!("{key}:end"), started)
                        .await?
                    {
                        Ok(now) => id = now,
                        Err(why) => return Ok(Err(why)),
                    }
                }
                let rows = match self.buttons(buttons, &caps) {
                    Ok(r) => r,
                    Err(why) => return Ok(Err(why)),
                };
                let via = self.via(hold, &id).await?;
                let act = Act::Edit {
                    message_id: &id,
                    via: via.as_deref(),
                    text: text.as_deref(),
                    buttons: &rows,
                };
                let r = self.done(hold, slot, &act, &key, started).await?;
                Ok(r.map(|_| ()))
            }
            Action::Delete { target } => {
                if !caps.delete {
                    return Ok(Err(
                        "this platform's mode cannot delete (caps.delete)".into()
                    ));
                }
                let mut id = match self.target(hold, target).await? {
                    Ok(id) => id,
                    Err(why) => return Ok(Err(why)),
                };
                if self.p.marks.streaming(target) {
                    // Ended first: a platform's stream may not be a message until it ends.
                    match self
                        .end_stream(hold, slot, target, &id, &format!("{key}:end"), started)
                        .await?
                    {
                        Ok(now) => id = now,
                        Err(why) => return Ok(Err(why)),
                    }
                }
                let via = self.via(hold, &id).await?;
                let act = Act::Delete {
                    message_id: &id,
                    via: via.as_deref(),
                };
                let r = self.done(hold, slot, &act, &key, started).await?;
                Ok(r.map(|_| ()))
            }
            Action::Typing {} => {
                if !caps.typing {
                    return Ok(Err(
                        "this platform's mode shows no typing (caps.typing)".into()
                    ));
                }
                let (msg, key): (&Inbound, &str) = (self.msg, &key);
                let call = (&msg.chat, Call::Act(&Act::Typing));
                attempt(self.ctx, hold, slot, started, call, |s| async move {
                    s.show_typing(msg, key).await
                })
                .await
            }
            Action::Answer {
                text,
                alert,
                ephemeral,
            } => {
                if !caps.answer {
                    return Ok(Err(
                        "this platform's mode cannot answer (caps.answer)".into()
                    ));
                }
                if *ephemeral && !caps.ephemeral {
                    return Ok(Err(
                        "this platform has no ephemeral answers (caps.ephemeral)".into(),
                    ));
                }
                if !matches!(self.msg.kind, EventKind::Action | EventKind::Command) {
                    return Ok(Err(
                        "`answer` answers an action or a command event; send a message instead"
                            .into(),
                    ));
                }
                let answer = Answer {
                    text: text.as_deref(),
                    alert: *alert,
                    ephemeral: *ephemeral,
                    buttons: &[],
                    files: &[],
                };
                let r = self.answer(hold, slot, answer, &key, started).await?;
                Ok(r.map(|_| ()))
            }
            Action::Template {
                name,
                language,
                components,
            } => {
                if !caps.templates {
                    return Ok(Err(
                        "this platform's mode sends no templates (caps.templates)".into(),
                    ));
                }
                if name.trim().is_empty() || language.trim().is_empty() {
                    return Ok(Err("a template needs its `name` and `language`".into()));
                }
                let act = Act::Template {
                    name,
                    language,
                    components: components.as_ref(),
                };
                let r = self.done(hold, slot, &act, &key, started).await?;
                if let Ok(id) = &r {
                    self.p.sent = true;
                    self.named(None, id.as_deref(), false);
                }
                Ok(r.map(|_| ()))
            }
        }
    }

    /// Answers the event, with its deadline's timer held off meanwhile: as a follow-up
    /// when the event was acknowledged before (by the turn or the timer) or answered.
    /// Answers the id of the message that shows the answer, where the platform makes one.
    async fn answer(
        &mut self,
        hold: &impl Hold,
        slot: &mut Slot,
        a: Answer<'_>,
        key: &str,
        started: Instant,
    ) -> Result<Result<Option<String>, String>, Halt> {
        let answering = self.deadline.answering().await;
        let act = Act::Answer {
            event: self.msg,
            text: a.text,
            alert: a.alert,
            ephemeral: a.ephemeral,
            deferred: self.deadline.deferred,
            answered: self.p.answered,
            buttons: a.buttons,
            files: a.files,
        };
        let r = self.done(hold, slot, &act, key, started).await?;
        if r.is_ok() {
            answering.done();
        }
        Ok(r)
    }

    /// Whether send `action` goes as a native stream of the platform's: the bot streams
    /// natively, the event's chat has streams, the turn's answer comes later, and the send is
    /// a text with a ref (what a streamed answer starts with) and nothing a stream cannot
    /// carry.
    fn streams(&self, action: &Action) -> bool {
        let Action::Send {
            text,
            buttons,
            ref_name: Some(_),
            attachments,
            ..
        } = action
        else {
            return false;
        };
        let Ok(sender) = &self.ctx.sender else {
            return false;
        };
        self.held
            && self.ctx.native_streams
            && !text.is_empty()
            && buttons.is_empty()
            && attachments.is_empty()
            && sender.streams_in(self.msg)
    }

    /// Does `step` of a native stream answering the event.
    async fn stream(
        &mut self,
        hold: &impl Hold,
        slot: &mut Slot,
        step: StreamStep<'_>,
        key: &str,
        started: Instant,
    ) -> Result<Result<Option<String>, String>, Halt> {
        let msg: &Inbound = self.msg;
        let call = (&msg.chat, Call::Stream(step));
        let r = attempt(self.ctx, hold, slot, started, call, |s| async move {
            s.stream(msg, step, key).await
        })
        .await?;
        if r.is_ok() {
            self.dirty = true;
        }
        Ok(r)
    }

    /// Ends the native streams the turn began and has not ended. One that cannot be ended
    /// is noted (the platform ends it by itself in time).
    async fn end_streams(
        &mut self,
        hold: &impl Hold,
        slot: &mut Slot,
        started: Instant,
    ) -> Result<(), Halt> {
        for (j, target) in self.p.marks.streams().into_iter().enumerate() {
            let key = format!("{}:end{j}", self.key_base);
            let ended = match self.target(hold, &target).await? {
                Ok(id) => {
                    self.end_stream(hold, slot, &target, &id, &key, started)
                        .await?
                }
                Err(why) => Err(why),
            };
            if let Err(why) = ended {
                let note = format!("ending a stream: {why}");
                warn!(bot = %self.ctx.bot, chat = %self.msg.chat.chat, reason = %note, "action refused");
                refuse_metric(self.ctx);
                self.p.notes.push(note);
                self.p.marks.set_streaming(&target, None);
            }
        }
        Ok(())
    }

    /// Ends the native stream `target` (the message `id`): the id of the message that shows
    /// it from then on (another one where the platform's stream ends as a message of its own:
    /// its ref names that one then).
    async fn end_stream(
        &mut self,
        hold: &impl Hold,
        slot: &mut Slot,
        target: &Target,
        id: &str,
        key: &str,
        started: Instant,
    ) -> Result<Result<String, String>, Halt> {
        let text = self
            .p
            .marks
            .stream_text(target)
            .unwrap_or_default()
            .to_owned();
        let step = StreamStep::Stop {
            message_id: id,
            text: &text,
        };
        let now = match self.stream(hold, slot, step, key, started).await? {
            Ok(Some(now)) if now != id => {
                self.renamed(target, id, &now);
                now
            }
            Ok(_) => id.to_owned(),
            Err(why) => return Ok(Err(why)),
        };
        self.p.marks.set_streaming(target, None);
        Ok(Ok(now))
    }

    /// The message `was` of `target` is `now` from here on: its ref names it, and what the
    /// turn made lists it.
    fn renamed(&mut self, target: &Target, was: &str, now: &str) {
        for id in &mut self.p.ids {
            if id == was {
                now.clone_into(id);
            }
        }
        if let Some(name) = &target.ref_name {
            let (by_name, by_id) = (ref_name(name), message_name(was));
            self.p.refs.retain(|(n, _)| *n != by_name && *n != by_id);
            self.p.refs.push((by_name, now.to_owned()));
            self.p.refs.push((message_name(now), name.clone()));
        }
    }

    /// Remembers what a send made: its ref `name` → message `id` and back, and, for an
    /// answer made `in_place`, until when its event's answer handle can change it.
    fn named(&mut self, name: Option<&str>, id: Option<&str>, in_place: bool) {
        if let Some(id) = id {
            self.p.ids.push(id.to_owned());
        }
        match (name, id) {
            (Some(n), Some(id)) => {
                self.p.refs.push((ref_name(n), id.to_owned()));
                self.p.refs.push((message_name(id), n.to_owned()));
            }
            (Some(_), None) => {
                warn!(bot = %self.ctx.bot, "the platform gave no message id for a send with a ref; the ref names nothing");
            }
            _ => {}
        }
        if let (true, Some(id), Some(handle)) = (in_place, id, &self.msg.answer_handle) {
            let left = ANSWER_TOKEN_LIFE.saturating_sub(self.arrived.elapsed());
            let until = botfleet_core::unix_ms() + i64::try_from(left.as_millis()).unwrap_or(0);
            self.p
                .refs
                .push((hook_name(id), format!("{until} {handle}")));
        }
    }

    /// The answer handle message `id` can still be changed through (it was an answer to an
    /// event whose handle still answers), if any.
    async fn via(&self, hold: &impl Hold, id: &str) -> Result<Option<String>, Halt> {
        // Only a platform that answers in place with messages of their own makes them.
        if !(self.ctx.caps.answer && self.ctx.caps.ephemeral) {
            return Ok(None);
        }
        let name = hook_name(id);
        let value = match self.p.refs.iter().rev().find(|(n, _)| *n == name) {
            Some((_, v)) => Some(v.clone()),
            None => read_refs(self.ctx, hold, &self.msg.chat.chat, &[name])
                .await?
                .into_iter()
                .next()
                .flatten(),
        };
        Ok(value.and_then(|v| {
            let (until, handle) = v.split_once(' ')?;
            (until.parse::<i64>().ok()? > botfleet_core::unix_ms()).then(|| handle.to_owned())
        }))
    }

    /// Whether send `action` goes as the event's answer: a text (with buttons, files and a
    /// ref, or none) for an interaction of a platform that answers those in place
    /// ([`botfleet_platform::Sender::answers_in_place`]), while its token still answers.
    fn answers_in_place(&self, action: &Action) -> bool {
        let Action::Send {
            text, attachments, ..
        } = action
        else {
            return false;
        };
        let Ok(sender) = &self.ctx.sender else {
            return false;
        };
        (!text.is_empty() || !attachments.is_empty())
            && self.ctx.caps.answer
            && matches!(self.msg.kind, EventKind::Action | EventKind::Command)
            && sender.answers_in_place(self.msg)
            && self.arrived.elapsed() < ANSWER_TOKEN_LIFE
    }

    /// Does `act` (one that makes no new message of the chat's own; an answer may make
    /// one: its id).
    async fn done(
        &mut self,
        hold: &impl Hold,
        slot: &mut Slot,
        act: &Act<'_>,
        key: &str,
        started: Instant,
    ) -> Result<Result<Option<String>, String>, Halt> {
        let msg: &Inbound = self.msg;
        let chat = &msg.chat;
        let gives_way =
            (self.gives_way && matches!(act, Act::Edit { .. })).then_some(&mut self.gave_way);
        let r = attempt_or_give_way(
            self.ctx,
            hold,
            slot,
            started,
            (chat, Call::Act(act)),
            gives_way,
            |s| async move { s.act(chat, act, key).await },
        )
        .await?;
        if r.is_ok() && !matches!(act, Act::Typing) {
            self.dirty = true;
            // An answer to a command may be a message (Telegram's).
            let answer = matches!(act, Act::Answer { .. });
            self.p.sent |= answer;
            self.p.answered |= answer;
        }
        Ok(r)
    }
}

/// An answer to the event, as [`Act::Answer`] takes it.
struct Answer<'a> {
    text: Option<&'a str>,
    alert: bool,
    ephemeral: bool,
    buttons: &'a [Vec<Button>],
    files: &'a [Upload],
}

/// The short key that stands in for a long button value on the wire: `bf~` and 18
/// characters of its hash (21 bytes, within every platform's limit).
fn value_key(v: &str) -> String {
    let h = Sha256::digest(v.as_bytes());
    let mut s = String::with_capacity(VALUE_KEY_PREFIX.len() + 18);
    s.push_str(VALUE_KEY_PREFIX);
    for b in &h[..9] {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_keys_are_short_stable_and_marked() {
        let k = value_key(&"x".repeat(500));
        assert!(k.starts_with(VALUE_KEY_PREFIX) && k.len() <= 64, "{k}");
        assert_eq!(k, value_key(&"x".repeat(500)));
        assert_ne!(k, value_key(&"y".repeat(500)));
    }
}
