//! An event's platform deadline (Discord's 3 s for an interaction, Telegram's spinner on a
//! pressed button), kept from the event's arrival whatever its chat's turn is doing.
//!
//! ```text
//! received → armed (the chat queues: at arrival + Sender::defer_after)
//!   the deadline comes first → acknowledged (Act::Defer) → the turn's answer follows up
//!   the turn answers first   → done: nothing acknowledged, the answer is the response
//! ```
//!
//! The timer and the turn take turns on the event's [`Stage`], so the event is acknowledged
//! once, never after it was answered, and the answer knows whether it follows up. An event
//! no queue armed (a webhook bot's, a replay's) is acknowledged by its turn alone, at the
//! same deadline, once the turn has started.

use std::{sync::Arc, time::Instant};

use botfleet_core::{Act, Inbound, Outbound};
use tokio::sync::{Mutex, OwnedMutexGuard};
use tracing::{debug, warn};

use super::{Hold, TurnCtx};

/// Where an armed event is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Stage {
    /// Neither answered nor acknowledged yet.
    Waiting,
    /// Acknowledged before its answer: the answer follows up.
    Deferred,
    /// Answered, or its turn is over: nothing more to acknowledge.
    Done,
}

/// A received event's deadline, shared by its timer and its turn.
pub(crate) struct Armed {
    /// The event, as received (what acknowledges it).
    event: Inbound,
    /// When it is to be acknowledged, unless answered by then.
    pub(crate) at: Instant,
    stage: Arc<Mutex<Stage>>,
}

impl Armed {
    /// `event`'s deadline, due at `at`.
    pub(crate) fn new(event: Inbound, at: Instant) -> Arc<Self> {
        Arc::new(Self {
            event,
            at,
            stage: Arc::new(Mutex::new(Stage::Waiting)),
        })
    }

    /// At the deadline: acknowledges the event, unless its turn answered it (or is answering
    /// it now, then this waits and finds it answered).
    pub(crate) async fn expire(&self, ctx: &TurnCtx, hold: &impl Hold) {
        let mut stage = self.stage.lock().await;
        if *stage == Stage::Waiting && acknowledge(ctx, hold, &self.event).await {
            *stage = Stage::Deferred;
        }
    }

    /// Its turn is over: the timer does nothing more.
    pub(crate) fn disarm(&self) {
        // Held only while the event is acknowledged or answered, both of which end it too.
        if let Ok(mut s) = self.stage.try_lock() {
            *s = Stage::Done;
        }
    }
}

/// What a turn knows of its event's deadline.
#[derive(Default)]
pub(crate) struct Deadline {
    /// The event was acknowledged before its answer.
    pub(crate) deferred: bool,
    /// The timer armed at receipt, when there is one.
    pub(crate) armed: Option<Arc<Armed>>,
}

impl Deadline {
    /// A deadline kept by `armed`, when there is one.
    pub(crate) fn armed(armed: Option<Arc<Armed>>) -> Self {
        Self {
            deferred: false,
            armed,
        }
    }

    /// The turn's own deadline came while its handler works: acknowledges `msg` unless that
    /// was done (by the timer) or it was answered.
    pub(crate) async fn defer(&mut self, ctx: &TurnCtx, hold: &impl Hold, msg: &Inbound) {
        let Some(armed) = self.armed.clone() else {
            self.deferred = acknowledge(ctx, hold, msg).await;
            return;
        };
        let mut stage = armed.stage.lock().await;
        if *stage == Stage::Waiting && acknowledge(ctx, hold, msg).await {
            *stage = Stage::Deferred;
        }
        self.deferred |= *stage == Stage::Deferred;
    }

    /// Before the turn answers the event: holds the timer off until the answer is done
    /// ([`Answering::done`]), and says (in `deferred`) whether the event was acknowledged
    /// meanwhile.
    pub(crate) async fn answering(&mut self) -> Answering {
        let guard = match &self.armed {
            Some(a) => Some(a.stage.clone().lock_owned().await),
            None => None,
        };
        if guard.as_deref() == Some(&Stage::Deferred) {
            self.deferred = true;
        }
        Answering { guard }
    }
}

/// The turn answering its event, with the timer held off.
pub(crate) struct Answering {
    guard: Option<OwnedMutexGuard<Stage>>,
}

impl Answering {
    /// The event is answered: the timer has nothing more to do.
    pub(crate) fn done(mut self) {
        if let Some(g) = self.guard.as_mut() {
            **g = Stage::Done;
        }
    }
}

/// Acknowledges `msg` before its platform's deadline ([`Act::Defer`]), while the worker may
/// act: whether it was.
async fn acknowledge(ctx: &TurnCtx, hold: &impl Hold, msg: &Inbound) -> bool {
    let Ok(sender) = &ctx.sender else {
        return false;
    };
    if hold.check().is_err() {
        return false;
    }
    let key = format!("{}:defer", Outbound::reply_key(msg));
    match sender
        .act(&msg.chat, &Act::Defer { event: msg }, &key)
        .await
    {
        Ok(_) => {
            debug!(bot = %ctx.bot, chat = %msg.chat.chat, "not answered near its deadline: the event was acknowledged");
            true
        }
        Err(e) => {
            ctx.metrics.platform_error(ctx.platform, e.reason());
            warn!(bot = %ctx.bot, error = %e, "cannot acknowledge an event before its deadline");
            false
        }
    }
}
