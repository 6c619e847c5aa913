//! Values that cross the [`Coordinator`](crate::Coordinator) seam.

use std::{fmt, str::FromStr, time::Duration};

use botfleet_core::{BotId, Fence, Incarnation, WorkerId};
use serde::{Deserialize, Serialize};

/// What a worker says about itself when it registers and on every renewal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerMeta {
    /// Host name (or any label the operator recognises).
    pub host: String,
    /// How many bots it accepts at most.
    pub capacity: u32,
    /// Unix milliseconds when the process started.
    pub started_at_ms: i64,
    /// How many bots it runs now; refreshed on renewal.
    pub bots_held: u32,
    /// Its resident memory in bytes at the last renewal (0: unknown).
    #[serde(default)]
    pub rss_bytes: u64,
}

/// A worker whose liveness is current.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveWorker {
    /// Its id.
    pub id: WorkerId,
    /// The incarnation that holds its liveness.
    pub incarnation: Incarnation,
    /// What it last said about itself.
    pub meta: WorkerMeta,
    /// Milliseconds since its last renewal, by the coordinator's clock.
    pub heartbeat_age_ms: u64,
    /// The lease it registered with.
    pub lease: Duration,
}

/// A change in the set of live workers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberEvent {
    /// A worker registered (or re-registered with a new incarnation).
    Joined(WorkerId),
    /// A worker unregistered or its liveness expired.
    Left(WorkerId),
}

/// Answer of a renewal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// Liveness extended by one lease from the moment the request was handled.
    Renewed,
    /// Liveness is gone or belongs to another incarnation: every claim of this incarnation is
    /// void. Stop all bots and register again.
    Lost,
}

/// Who holds a bot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// The holding worker.
    pub worker: WorkerId,
    /// The incarnation it held the claim under.
    pub incarnation: Incarnation,
    /// The fence of the grant.
    pub fence: Fence,
    /// Whether the holder's liveness still carries that incarnation (and, handed over, the
    /// hand-over has not lapsed: see [`Coordinator::hand_over`](crate::Coordinator::hand_over)).
    /// A record whose holder is not live is free to claim.
    pub live: bool,
    /// The bot was handed over to `worker`, which has not claimed it yet.
    pub handed_over: bool,
}

/// Answer of [`Coordinator::claim`](crate::Coordinator::claim).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The caller holds the bot under this fence, greater than every fence granted before.
    Granted(Fence),
    /// A live worker holds it (or it was handed over to a live worker); the caller must wait
    /// for a hand-over or for that worker's liveness to end.
    Held(Owner),
    /// The caller's own liveness is missing or belongs to another incarnation: it may not
    /// claim anything until it registers again.
    NotLive,
    /// The backend lost data (a restart without persistence, a failover that dropped writes)
    /// and forgot a grant the store saw (`min_fence` above what it remembers): the bot's old
    /// owner may still run it by its own clock. Ask again after this long, when that owner
    /// must have stopped.
    Grace(Duration),
}

/// The fleet's epoch: the lifetime of the backend's current data. A backend that lost its
/// data starts a new epoch, and grants the store saw but the backend forgot wait out a grace
/// window of one lease (the longest in the fleet).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpochInfo {
    /// The epoch's id (random, new after every loss).
    pub id: String,
    /// How long ago it began, by the backend's clock.
    pub age: Duration,
    /// Time left in a grace window after a loss: fenced grants that may still be held by an
    /// old owner wait until it ends. Zero outside such a window.
    pub grace_left: Duration,
    /// Whether the epoch follows a data loss (as opposed to a fleet's first start).
    pub after_loss: bool,
}

impl EpochInfo {
    /// The fleet's epoch from its groups' (`each`, in group order): the first one's id (the
    /// roster's, unless it has none yet), the youngest age, the longest grace window, after a
    /// loss if any group is. `None` when there is none.
    pub fn combine(each: impl IntoIterator<Item = EpochInfo>) -> Option<EpochInfo> {
        let mut each = each.into_iter();
        let mut out = each.next()?;
        for e in each {
            out.age = out.age.min(e.age);
            out.grace_left = out.grace_left.max(e.grace_left);
            out.after_loss |= e.after_loss;
        }
        Some(out)
    }
}

/// A bot lifecycle event, published by the CLI or an API and seen by every worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "bot", rename_all = "lowercase")]
pub enum LifecycleEvent {
    /// The bot was added or enabled: whoever should run it, start it.
    Activate(BotId),
    /// The bot was disabled or removed: whoever runs it, stop it.
    Deactivate(BotId),
    /// The bot's spec changed or an operator asked: whoever runs it, restart it.
    Restart(BotId),
}

/// Position in the lifecycle event stream. Reading after a cursor returns only later events.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventCursor {
    pub(crate) ms: u64,
    pub(crate) seq: u64,
}

impl EventCursor {
    /// Before every event.
    pub const START: EventCursor = EventCursor { ms: 0, seq: 0 };
}

impl fmt::Display for EventCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

impl FromStr for EventCursor {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (ms, seq) = s
            .split_once('-')
            .ok_or_else(|| format!("event cursor {s:?} is not <ms>-<seq>"))?;
        Ok(Self {
            ms: ms
                .parse()
                .map_err(|_| format!("event cursor {s:?} is not <ms>-<seq>"))?,
            seq: seq
                .parse()
                .map_err(|_| format!("event cursor {s:?} is not <ms>-<seq>"))?,
        })
    }
}

/// An order to one worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WorkerCommand {
    /// Stop running the bot and release it.
    Stop {
        /// The bot.
        bot: BotId,
    },
    /// Stop and start the bot again.
    Restart {
        /// The bot.
        bot: BotId,
    },
    /// Hand the bot over to another worker.
    HandOver {
        /// The bot.
        bot: BotId,
        /// The worker to hand it to.
        to: WorkerId,
    },
    /// The bot was handed over to you: claim it now.
    Take {
        /// The bot.
        bot: BotId,
        /// The worker that handed it over.
        from: WorkerId,
    },
    /// The sender is shutting down and hands its bots over: place bots as if it were gone
    /// already (it still holds them until each is handed over).
    Leaving {
        /// The worker that is leaving.
        worker: WorkerId,
    },
    /// Another worker journaled an entry of `chat` of the unit `bot` you run (a send from
    /// the backend): queue the chat's pending entries behind its messages. Only a nudge: a
    /// worker that does not run the unit drops it, and the unit's next owner finds the
    /// entry pending.
    Inbox {
        /// The unit (a bot, or a slice of one).
        bot: BotId,
        /// The entry's chat.
        chat: String,
    },
}

/// A token bucket: `rate` tokens a second, at most `burst` banked.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateLimit {
    /// Tokens added per second; above 0.
    pub per_second: f64,
    /// Bucket size; at least 1.
    pub burst: u32,
}

impl RateLimit {
    /// The tokens a bucket keeps for the calls that do not yield
    /// ([`Coordinator::take_buckets_yielding`](crate::Coordinator::take_buckets_yielding)):
    /// a fifth of it, rounded down (none for a bucket of fewer than 5).
    pub fn reserve(&self) -> u32 {
        self.burst / 5
    }

    /// `per_second` tokens a second with a bucket of `burst`. Out-of-range values are clamped
    /// (rate to at least 0.001/s, burst to at least 1).
    pub fn new(per_second: f64, burst: u32) -> Self {
        let per_second = if per_second.is_finite() {
            per_second.max(0.001)
        } else {
            0.001
        };
        Self {
            per_second,
            burst: burst.max(1),
        }
    }
}

/// Answer of [`Coordinator::take_buckets`](crate::Coordinator::take_buckets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketTake {
    /// Zero: a token was taken from every bucket. Else how long until every bucket could
    /// give one (nothing was taken).
    pub wait: Duration,
    /// When waiting, the index (in the scopes asked for) of the bucket that holds the call
    /// longest.
    pub short: usize,
}

impl BucketTake {
    /// A token taken from every bucket.
    pub const TAKEN: Self = Self {
        wait: Duration::ZERO,
        short: 0,
    };

    /// Whether the tokens were taken.
    pub fn taken(&self) -> bool {
        self.wait.is_zero()
    }
}

/// Answer of a rate limiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Permit {
    /// Go now; a token was taken.
    Granted,
    /// No token; ask again after this long.
    Wait(Duration),
}

/// Answer of [`Coordinator::acquire_rate_many`](crate::Coordinator::acquire_rate_many).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateGrant {
    /// Tokens taken (at most the number asked for).
    pub taken: u32,
    /// When fewer were taken than asked: how long until the next token. Zero otherwise.
    pub wait: Duration,
}

/// A held fenced lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockGuard {
    /// The lock's key (without the coordinator's prefix).
    pub key: String,
    /// Proof of holding: only this token renews or releases.
    pub token: String,
    /// Grows on every grant of this lock; pass it to writes the lock protects.
    pub fence: Fence,
}

/// Where a message stands in its chat's turn queue (see
/// [`Coordinator::turn_take`](crate::Coordinator::turn_take)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Turn {
    /// The caller's ticket has the chat's turn, under this fence (above every fence of the
    /// chat's turns before it). Release it when the message is done.
    Granted {
        /// The ticket.
        ticket: u64,
        /// The turn's fence: conversation state and outbox records carry it.
        fence: Fence,
        /// The coordinator lost data recently (see [`Turn::after_loss`]).
        after_loss: bool,
    },
    /// An earlier ticket has the turn (or its live taker is about to): wait for a wake-up
    /// (see [`Coordinator::turn_wakeups`](crate::Coordinator::turn_wakeups)) and ask again.
    Wait,
    /// The ticket being served belongs to a worker whose liveness is gone: the caller now
    /// holds that ticket's turn and must handle its entry (if the store has it and it is
    /// still pending) before its own, then release it.
    TakeOver {
        /// The dead worker's ticket.
        ticket: u64,
        /// The journal key its taker recorded with it.
        entry: String,
        /// The turn's fence.
        fence: Fence,
        /// The coordinator lost data recently (see [`Turn::after_loss`]).
        after_loss: bool,
    },
    /// The ticket was served already (taken over while its taker was thought dead).
    Passed,
    /// The caller's own liveness is missing or foreign: it may act on nothing.
    NotLive,
}

impl Turn {
    /// Whether this grant comes soon after the coordinator lost data (a restart without
    /// persistence, a failover to a replica that missed writes): within
    /// [`AFTER_LOSS_SETTLE`](crate::AFTER_LOSS_SETTLE) (or ten grace windows, if longer)
    /// after the loss's grace window. Entries of the chat journaled before the loss may then
    /// be pending with no ticket (their queue was forgotten) until someone takes one for
    /// them: the holder serves the chat's older pending entries before its own, so the chat
    /// keeps its order. No turn is granted inside the grace window itself (a holder from
    /// before the loss may still be acting by its own clock).
    pub fn after_loss(&self) -> bool {
        match self {
            Turn::Granted { after_loss, .. } | Turn::TakeOver { after_loss, .. } => *after_loss,
            Turn::Wait | Turn::Passed | Turn::NotLive => false,
        }
    }
}
