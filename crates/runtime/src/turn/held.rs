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

use std::{
    future::Future,
    time::{Duration, Instant},
};

use botfleet_core::Inbound;
use botfleet_store::TurnHold;
use tracing::debug;

use super::{
    actions::{self, Parts},
    deadline::Deadline,
    defer_at, while_recording, End, Halt, Hold, TurnCtx, Waiting,
};
use crate::metrics::ASYNC_EXPIRED_TOTAL;

/// Why a held turn whose time ran out is given up on.
pub(crate) const EXPIRED: &str = "async reply expired";

/// Counts a held turn in `botfleet_turns_held` and with its hold while it lives.
struct Counted<'a, H: Hold>(&'a TurnCtx, &'a H);

impl<'a, H: Hold> Counted<'a, H> {
    fn new(ctx: &'a TurnCtx, hold: &'a H) -> Self {
        ctx.metrics.turns_held(1);
        hold.holding(true);
        Self(ctx, hold)
    }
}

impl<H: Hold> Drop for Counted<'_, H> {
    fn drop(&mut self) {
        self.0.metrics.turns_held(-1);
        self.1.holding(false);
    }
}

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

/// Holds the turn open, doing the parts of its answer as they are posted, until the last
/// part ends it or its time to live passes (then it ends as undeliverable, [`EXPIRED`]).
/// `Ok` once the entry ended (also when it had ended already).
///
/// What waits between parts is kept small (one timer, the watch of the entry, the stop): a
/// thousand held turns cost memory only, and little of it.
///
/// # Errors
/// Why the entry was left pending, still held, for whoever answers the chat next ([`Halt`]).
#[allow(clippy::manual_async_fn)] // an async fn would keep its arguments twice
pub(super) fn wait<'a, H: Hold>(
    ctx: &'a TurnCtx,
    hold: &'a H,
    mut held: Held<'a>,
) -> impl Future<Output = Result<(), Halt>> + Send + 'a {
    // An async block, not an async fn (which would keep a second copy of its arguments), with
    // `held` used in place, not taken apart: the future keeps one copy of it.
    async move {
        let h = &mut held;
        let (msg, end, since) = (&h.msg, &h.end, h.since);
        let deadline = &mut h.deadline;
        let Some(until_ms) = Box::pin(write_hold(ctx, hold, end, h.until_ms)).await? else {
            return Ok(()); // ended meanwhile
        };
        let _counted = Counted::new(ctx, hold);
        let watch = ctx.later.watch(&ctx.bot, end.key);
        debug!(bot = %ctx.bot, chat = %end.chat, key = %end.key, until_ms, "turn held for an answer that comes later");
        let mut typing = Waiting::new(ctx, msg, since);
        let stop = hold.stop();
        // The platform's deadline is tried once while held (as once per handler call).
        let mut defer_tried = false;
        loop {
            let due = botfleet_core::unix_ms() >= until_ms;
            // Boxed: doing parts takes kilobytes that the wait between them need not keep.
            let parts = actions::run_parts(
                ctx,
                hold,
                msg,
                deadline,
                since,
                end.again(),
                h.revision,
                due,
            );
            let paced = match Box::pin(parts).await? {
                Parts::Ended { expired } => {
                    if expired {
                        ctx.metrics.count(ASYNC_EXPIRED_TOTAL, ctx.platform, 1);
                    }
                    return Ok(());
                }
                Parts::Waiting { sent, due } => {
                    // Typing is kept up until the first message of the answer.
                    if sent {
                        typing.next = None;
                    }
                    due
                }
            };
            // Until a part may have come, an edit waiting for its message's pace is due, or
            // the time to live passed; typing and the platform's deadline kept meanwhile.
            loop {
                let left = (until_ms - botfleet_core::unix_ms()).max(0).unsigned_abs();
                let expiry = Instant::now() + Duration::from_millis(left);
                // The parts are looked at again at the expiry, or sooner for a paced edit.
                let look = paced.map_or(expiry, |d| d.min(expiry));
                let defer_at = (!defer_tried)
                    .then(|| defer_at(ctx, msg, deadline, since))
                    .flatten();
                let at = typing.due(defer_at).map_or(look, |t| t.min(look));
                tokio::select! {
                    () = watch.posted() => break,
                    () = tokio::time::sleep_until(at.into()) => {}
                    () = hold.gone() => {
                        return Err(Halt::Fenced(
                            "the held turn was lost (the worker registered again)".into(),
                        ))
                    }
                    () = crate::retry::stopped(stop.clone()) => return Err(Halt::Stopped),
                }
                let now = Instant::now();
                if look <= now {
                    break;
                }
                if defer_at.is_some_and(|d| d <= now) {
                    defer_tried = true;
                    Box::pin(deadline.defer(ctx, hold, msg)).await;
                } else if typing.next.is_some_and(|t| t <= now) {
                    // A slow typing call gives way to a part.
                    tokio::select! {
                        () = Box::pin(typing.show(ctx, hold, msg)) => {}
                        () = watch.posted() => break,
                    }
                }
            }
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
