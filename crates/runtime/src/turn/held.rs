//! A turn held open for an answer that comes later: the handler answered `202` (or
//! [`TurnContext::answer_later`](crate::TurnContext::answer_later)) and finishes through its
//! reply token, on any worker.
//!
//! ```text
//! handler answers 202 → the hold, under the turn's fence (its expiry: the token's) → no
//!   slot; typing kept up (until a message goes out) and the event acknowledged at its
//!   platform deadline, as for a slow handler → a part posted (woken by the worker that took
//!   it, or by the poll for parts taken elsewhere) → its actions done in order, the progress
//!   recorded → the last part: the entry ends with the state → or the time to live passes:
//!   undeliverable, "async reply expired" (what the parts did is kept)
//! a replay of a held entry (a successor, a take-over) → the same wait, the handler not
//!   called again, the parts done before not done again
//! ```
//!
//! The chat's next events wait behind the held turn like behind any other; other chats go on.
//! A bot's chat queues keep their held turns as data ([`Parked`]: no task or future each,
//! looked at again when a part is posted or a timer of theirs is due), and so does the
//! worker's lot of a webhook bot's held turns (`hooks/lot.rs`); a turn held while its chat's
//! older entries are answered first (after a loss of coordination data) waits in the task
//! that holds its chat's turn ([`wait`]).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use botfleet_core::Inbound;
use botfleet_store::{TurnFence, TurnHold};
use tracing::debug;

use super::{
    actions::{self, Parts},
    deadline::{Armed, Deadline},
    defer_at, while_recording, End, Halt, Hold, TurnCtx, Waiting,
};
use crate::{
    later::{EntryOf, Watch},
    metrics::{Metrics, ASYNC_EXPIRED_TOTAL},
};

/// Why a held turn whose time ran out is given up on.
pub(crate) const EXPIRED: &str = "async reply expired";

/// A turn held open: what its wait needs of the turn that held it (owned, so the held
/// turn keeps nothing else of it).
pub(super) struct Held<'e> {
    /// The event.
    pub(super) msg: Inbound,
    /// When the hold expires (unix ms): the token's expiry, or the hold a predecessor wrote.
    pub(super) until_ms: i64,
    /// The entry it ends.
    pub(super) end: End<'e>,
    /// The chat state's revision the turn read (the last part's state is written on it).
    pub(super) revision: u64,
    /// When the event arrived (typing and the platform deadline count from it).
    pub(super) since: Instant,
    /// The event's platform deadline.
    pub(super) deadline: Deadline,
}

/// A held turn kept as data between its looks at the parts posted: no task and no future
/// wait for it. Its owner looks again ([`step`]) when a part may have been posted (its
/// [`entry`](Parked::entry) woken) or at its [`due`](Parked::due) time.
pub(crate) struct Parked {
    msg: Inbound,
    key: Box<str>,
    chat: Box<str>,
    fence: TurnFence,
    /// When the hold expires (unix ms).
    until_ms: i64,
    revision: u64,
    deadline: Deadline,
    /// Typing, and when the event arrived (typing and the platform deadline count from it).
    typing: Waiting,
    /// The platform's deadline was tried (once while held, as once per handler call).
    defer_tried: bool,
    /// When an edit waiting for its message's pace is due.
    paced: Option<Instant>,
    /// When the chat's user last wrote, as the turn read it (for the reply window).
    last_in_ms: Option<i64>,
    watch: Watch,
    _counted: Counted,
}

/// Counts a held turn in `botfleet_turns_held` while it lives.
struct Counted(Arc<Metrics>);

impl Counted {
    fn new(metrics: &Arc<Metrics>) -> Self {
        metrics.turns_held(1);
        Self(metrics.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.turns_held(-1);
    }
}

impl Parked {
    /// Its chat.
    pub(crate) fn chat(&self) -> &str {
        &self.chat
    }

    /// Its entry's key.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// Its entry, as the wake-ups of posted parts name it.
    pub(crate) fn entry(&self) -> EntryOf {
        self.watch.entry()
    }

    /// The deadline armed for its event on receipt, if one was.
    pub(crate) fn armed(&self) -> Option<Arc<Armed>> {
        self.deadline.armed.clone()
    }

    /// When it is to be looked at again though no part was posted: an edit waiting for its
    /// message's pace, the time to live, typing, or the platform's deadline.
    pub(crate) fn due(&self, ctx: &TurnCtx) -> Instant {
        let look = self.look();
        self.typing
            .due(self.defer_at(ctx))
            .map_or(look, |t| t.min(look))
    }

    /// When its parts are looked at again though none was posted: a paced edit, or the expiry.
    fn look(&self) -> Instant {
        let left = (self.until_ms - botfleet_core::unix_ms())
            .max(0)
            .unsigned_abs();
        let expiry = Instant::now() + Duration::from_millis(left);
        self.paced.map_or(expiry, |d| d.min(expiry))
    }

    fn defer_at(&self, ctx: &TurnCtx) -> Option<Instant> {
        (!self.defer_tried)
            .then(|| defer_at(ctx, &self.msg, &self.deadline, self.typing.since))
            .flatten()
    }
}

/// Holds the turn: writes the hold under the turn's fence, watches its entry (into the hold's
/// chat queues when they keep held turns as data, [`Hold::parks`]) and does the parts posted
/// so far. `None` once the entry ended (also when it had ended already).
///
/// # Errors
/// Why the entry was left pending, still held, for whoever answers the chat next ([`Halt`]).
pub(super) async fn park<H: Hold>(
    ctx: &TurnCtx,
    hold: &H,
    held: Held<'_>,
) -> Result<Option<Parked>, Halt> {
    let Held {
        msg,
        until_ms,
        end,
        revision,
        since,
        deadline,
    } = held;
    let Some(until_ms) = Box::pin(write_hold(ctx, hold, &end, until_ms)).await? else {
        return Ok(None); // ended meanwhile
    };
    let watch = match hold.parks() {
        Some(posted) => ctx.later.watch_into(&ctx.bot, end.key, posted),
        None => ctx.later.watch(&ctx.bot, end.key),
    };
    debug!(bot = %ctx.bot, chat = %end.chat, key = %end.key, until_ms, "turn held for an answer that comes later");
    let typing = Waiting::new(ctx, &msg, since);
    let mut p = Parked {
        msg,
        key: end.key.into(),
        chat: end.chat.into(),
        last_in_ms: end.last_in_ms,
        fence: end.fence,
        until_ms,
        revision,
        deadline,
        typing,
        defer_tried: false,
        paced: None,
        watch,
        _counted: Counted::new(&ctx.metrics),
    };
    // The parts posted before the hold (or before a take-over) are done at once.
    Ok((!step(ctx, hold, &mut p, true).await?).then_some(p))
}

/// Looks at a parked turn again, because a part may have been posted (`posted`) or its
/// [`due`](Parked::due) time came: does the parts posted (the last ends the entry), ends it
/// when its time to live passed, or else keeps typing and the platform's deadline. True once
/// the entry ended.
///
/// # Errors
/// Why the entry was left pending, still held, for whoever answers the chat next ([`Halt`]).
pub(crate) async fn step(
    ctx: &TurnCtx,
    hold: &impl Hold,
    p: &mut Parked,
    posted: bool,
) -> Result<bool, Halt> {
    let now = Instant::now();
    // The expiry by the clock the hold was written with (an instant made from it now would
    // always lie a little ahead of `now`).
    let expired = botfleet_core::unix_ms() >= p.until_ms;
    if posted || expired || p.paced.is_some_and(|d| d <= now) {
        let end = End {
            key: &p.key,
            chat: &p.chat,
            fence: p.fence,
            refs: Vec::new(),
            notes: None,
            said: Vec::new(),
            last_in_ms: p.last_in_ms,
        };
        // Boxed: doing parts takes kilobytes that the wait between them need not keep.
        let parts = actions::run_parts(
            ctx,
            hold,
            &p.msg,
            &mut p.deadline,
            p.typing.since,
            end,
            p.revision,
            expired,
        );
        match Box::pin(parts).await? {
            Parts::Ended { expired } => {
                if expired {
                    ctx.metrics.count(ASYNC_EXPIRED_TOTAL, ctx.platform, 1);
                }
                return Ok(true);
            }
            Parts::Waiting { sent, due } => {
                // Typing is kept up until the first message of the answer.
                if sent {
                    p.typing.next = None;
                }
                p.paced = due;
            }
        }
    } else if p.defer_at(ctx).is_some_and(|d| d <= now) {
        p.defer_tried = true;
        Box::pin(p.deadline.defer(ctx, hold, &p.msg)).await;
    } else if p.typing.next.is_some_and(|t| t <= now) {
        Box::pin(p.typing.show(ctx, hold, &p.msg)).await;
    }
    Ok(false)
}

/// Holds the turn open in the caller's task, doing the parts of its answer as they are
/// posted, until the last part ends it or its time to live passes (then it ends as
/// undeliverable, [`EXPIRED`]). `Ok` once the entry ended (also when it had ended already).
/// (A bot's chat queues keep their held turns as data instead: [`park`], [`step`].)
///
/// # Errors
/// Why the entry was left pending, still held, for whoever answers the chat next ([`Halt`]).
pub(super) async fn wait<H: Hold>(ctx: &TurnCtx, hold: &H, held: Held<'_>) -> Result<(), Halt> {
    let Some(mut p) = park(ctx, hold, held).await? else {
        return Ok(());
    };
    let stop = hold.stop();
    loop {
        let at = p.due(ctx);
        let posted = tokio::select! {
            () = p.watch.posted() => true,
            () = tokio::time::sleep_until(at.into()) => false,
            () = hold.gone() => {
                return Err(Halt::Fenced(
                    "the held turn was lost (the worker registered again)".into(),
                ))
            }
            () = crate::retry::stopped(stop.clone()) => return Err(Halt::Stopped),
        };
        if step(ctx, hold, &mut p, posted).await? {
            return Ok(());
        }
    }
}

/// Writes the hold under the turn's fence: the time it ends (unix ms; the first hold's, if
/// the turn was held before), `None` when the entry ended meanwhile. The handler answered:
/// the hold is what keeps a replay from asking it again, so a stop (a hand-over) does not cut
/// its write short.
async fn write_hold(
    ctx: &TurnCtx,
    hold: &impl Hold,
    end: &End<'_>,
    until_ms: i64,
) -> Result<Option<i64>, Halt> {
    let h = TurnHold {
        key: end.key.to_owned(),
        chat: end.chat.to_owned(),
        fence: end.fence,
        until_ms,
    };
    while_recording(ctx, hold, "hold a turn", || {
        ctx.store.turn_hold(&ctx.bot, &h)
    })
    .await
}
