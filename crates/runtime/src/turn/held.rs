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

use std::time::{Duration, Instant};

use botfleet_core::Inbound;
use botfleet_store::TurnHold;
use tracing::debug;

use super::{
    actions::{self, Parts},
    deadline::Deadline,
    while_handler_runs, while_recording, End, Halt, Hold, Slot, TurnCtx, Waiting,
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

/// What a held turn needs of the turn that held it.
pub(super) struct Held<'a, 'e> {
    /// The event.
    pub(super) msg: &'a Inbound,
    /// When the hold expires (unix ms): the token's expiry, or the hold a predecessor wrote.
    pub(super) until_ms: i64,
    /// The entry it ends.
    pub(super) end: End<'e>,
    /// The chat state's revision the turn read (the last part's state is written on it).
    pub(super) revision: u64,
    /// When the event arrived (typing and the platform deadline count from it).
    pub(super) since: Instant,
}

/// Holds the turn open, doing the parts of its answer as they are posted, until the last
/// part ends it or its time to live passes (then it ends as undeliverable, [`EXPIRED`]).
/// `Ok` once the entry ended (also when it had ended already).
///
/// # Errors
/// Why the entry was left pending, still held, for whoever answers the chat next ([`Halt`]).
pub(super) async fn wait(
    ctx: &TurnCtx,
    hold: &impl Hold,
    slot: Slot,
    held: Held<'_, '_>,
    deadline: &mut Deadline,
) -> Result<(), Halt> {
    // A held turn holds no slot: a thousand of them cost memory only.
    drop(slot);
    let Held {
        msg,
        until_ms,
        end,
        revision,
        since,
    } = held;
    let h = TurnHold {
        key: end.key.to_owned(),
        chat: end.chat.to_owned(),
        fence: end.fence,
        until_ms,
    };
    // The handler answered: the hold is what keeps a replay from asking it again, so a stop
    // (a hand-over) does not cut its write short.
    let held_until = while_recording(ctx, hold, "hold a turn", || {
        ctx.store.turn_hold(&ctx.bot, &h)
    })
    .await?;
    let Some(until_ms) = held_until else {
        return Ok(()); // ended meanwhile
    };
    let _counted = Counted::new(ctx, hold);
    let watch = ctx.later.watch(&ctx.bot, end.key);
    debug!(bot = %ctx.bot, chat = %end.chat, key = %end.key, until_ms, "turn held for an answer that comes later");
    let mut sent = false;
    loop {
        let due = botfleet_core::unix_ms() >= until_ms;
        match actions::run_parts(ctx, hold, msg, deadline, since, end.again(), revision, due)
            .await?
        {
            Parts::Ended { expired } => {
                if expired {
                    ctx.metrics.count(ASYNC_EXPIRED_TOTAL, ctx.platform, 1);
                }
                return Ok(());
            }
            Parts::Waiting { sent: s } => sent |= s,
        }
        let left =
            Duration::from_millis((until_ms - botfleet_core::unix_ms()).max(0).unsigned_abs());
        let mut waiting = Waiting::new(ctx, msg, since);
        if sent {
            // Typing is kept up until the first message of the answer.
            waiting.next = None;
        }
        let next = async {
            tokio::select! {
                () = tokio::time::sleep(left) => {}
                () = watch.posted() => {}
            }
        };
        tokio::select! {
            () = while_handler_runs(ctx, hold, msg, next, deadline, &mut waiting) => {}
            () = hold.gone() => {
                return Err(Halt::Fenced(
                    "the held turn was lost (the worker registered again)".into(),
                ))
            }
            () = crate::retry::stopped(hold.stop()) => return Err(Halt::Stopped),
        }
    }
}
