//! What a chat's turn reads and writes: the journal entry it handles, the chat's
//! conversation state (compare-and-set on a revision, fenced by whoever holds the turn), and
//! the outbox record of the reply it sent. Every bot's turns read and write these, whatever
//! its transport; only what fences the writes differs (see [`TurnFence`]).

use crate::{InboxEntry, InboxOutcome};
use botfleet_core::Fence;

/// Largest conversation state the store takes (bytes of JSON).
pub const MAX_STATE_BYTES: usize = 64 * 1024;

/// What a turn starts from, read in one call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TurnView {
    /// The journal entry, if recorded.
    pub entry: Option<InboxEntry>,
    /// The chat's state (JSON), if one was written.
    pub state: Option<String>,
    /// The state's revision (0: never written); the compare-and-set expects it.
    pub revision: u64,
    /// Whether the entry's reply is in the outbox (sent before).
    pub sent: bool,
    /// When the entry's turn is held open for an answer that comes later: unix ms when the
    /// hold expires (see [`Store::turn_hold`](crate::Store::turn_hold)).
    pub held_until_ms: Option<i64>,
    /// Whether the chat is paused now ([`ChatPause`](crate::ChatPause)): an event's turn
    /// records its entry [`Paused`](crate::InboxState::Paused) instead of answering it.
    pub paused: bool,
    /// When the chat's user last wrote (unix ms: the last event journaled, by the journal's
    /// clock; `None`: not since this was recorded): what a platform's reply window (WhatsApp
    /// Cloud's 24 hours) counts from.
    pub last_in_ms: Option<i64>,
}

/// Who holds a chat's turn, and so what fences the turn's writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TurnFence {
    /// The bot's claim (a unit with an exclusive transport: polling, socket, gateway, linked
    /// device): the unit's holder is the only one answering the bot's chats. A write under a
    /// claim lower than the bot's accepted fence is refused with
    /// [`StoreError::StaleFence`](crate::StoreError::StaleFence); the chat's own fence is
    /// neither checked nor changed.
    Claim(Fence),
    /// The chat's turn from the coordinator (webhook bots, answered by any worker): a turn
    /// superseded by a higher fence of the chat leaves the entry and the state to that one.
    Chat(Fence),
}

impl TurnFence {
    /// The fence itself, whichever kind.
    pub fn fence(self) -> Fence {
        match self {
            TurnFence::Claim(f) | TurnFence::Chat(f) => f,
        }
    }

    /// The claim, for a turn the bot's claim holds: what its writes are checked against.
    pub fn claim(self) -> Option<Fence> {
        match self {
            TurnFence::Claim(f) => Some(f),
            TurnFence::Chat(_) => None,
        }
    }
}

/// What a turn leaves, written in one transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TurnRecord {
    /// The journal entry handled.
    pub key: String,
    /// Its chat.
    pub chat: String,
    /// Who held the turn.
    pub fence: TurnFence,
    /// How the entry ends.
    pub outcome: InboxOutcome,
    /// A reply was sent: record it in the outbox under the entry's idempotency key. A
    /// [`TurnFence::Claim`] turn's write is all or nothing, so its entry's end is the record
    /// and no outbox row is kept; a [`TurnFence::Chat`] turn superseded after it sent ends no
    /// entry, and its row is what keeps the newer turn from sending again.
    pub sent: bool,
    /// The new state (JSON) and the revision it was computed from, if the handler gave one.
    pub state: Option<(u64, String)>,
    /// Names this turn gives in its chat (a `send`'s `ref` → the platform's message id; a long
    /// button value's key → the value), kept [`REFS_TTL_MS`]; a name given again is replaced.
    pub refs: Vec<(String, String)>,
    /// What the handler asked for that could not be done (a refused action, with its reason),
    /// kept as the entry's error though it ends `done`.
    pub notes: Option<String>,
    /// What the turn did in its chat, for the chat's log ([`ChatEvent`](crate::ChatEvent)):
    /// one JSON document per action, in order. Logged only when the entry ends with this
    /// record.
    pub said: Vec<String>,
}

impl TurnRecord {
    /// A record with no refs and no notes.
    pub fn new(
        key: impl Into<String>,
        chat: impl Into<String>,
        fence: TurnFence,
        outcome: InboxOutcome,
        sent: bool,
        state: Option<(u64, String)>,
    ) -> Self {
        Self {
            key: key.into(),
            chat: chat.into(),
            fence,
            outcome,
            sent,
            state,
            refs: Vec::new(),
            notes: None,
            said: Vec::new(),
        }
    }

    /// The entry's error column: the outcome's reason, or the notes of a done entry.
    pub(crate) fn error(&self) -> Option<String> {
        match &self.outcome {
            InboxOutcome::Done => self.notes.clone(),
            InboxOutcome::Undeliverable(why) => Some(why.clone()),
            InboxOutcome::Paused => None,
        }
    }
}

/// How long a chat's refs are kept: 48 h.
pub const REFS_TTL_MS: i64 = 48 * 3600 * 1000;

/// A step of a turn that does several actions: what it has done so far, written under the
/// turn's fence before its next action, so a replay of the entry goes on from there instead of
/// doing them again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TurnStep {
    /// The journal entry.
    pub key: String,
    /// Its chat.
    pub chat: String,
    /// Who holds the turn.
    pub fence: TurnFence,
    /// The progress document (opaque to the store; the turn pipeline's JSON).
    pub progress: String,
}

/// The outbox key of the progress of the entry `key`'s actions.
pub fn progress_key(key: &str) -> String {
    format!("{key}:progress")
}

/// What became of a [`TurnRecord`]'s state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateWrite {
    /// No state was given.
    Unchanged,
    /// Written at this revision.
    Written(u64),
    /// Refused: a turn with a higher fence, or a write at another revision, came first. The
    /// state given is dropped.
    Stale,
    /// A [`Paused`](crate::InboxOutcome::Paused) outcome not recorded: the chat's pause was
    /// lifted before it (a resume racing the turn). The entry is still pending, for the turn
    /// to answer now: a resume's replay would not see it.
    Unpaused,
}

/// The outbox key of the reply to the entry `key`.
pub fn reply_key(key: &str) -> String {
    format!("{key}:reply")
}

/// How a finished entry's outcome is stored: (state, error).
pub(crate) fn outcome_parts(o: &InboxOutcome) -> (&'static str, Option<String>) {
    match o {
        InboxOutcome::Done => ("done", None),
        InboxOutcome::Undeliverable(why) => ("undeliverable", Some(why.clone())),
        InboxOutcome::Paused => ("paused", None),
    }
}

/// The µs clock used as a journal entry's sequence (arrival order across workers).
pub(crate) fn arrival_seq() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}
