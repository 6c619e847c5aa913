//! The lot: a worker's held turns of webhook bots, kept as data.
//!
//! ```text
//! a ticket's turn held open (the handler answered 202) → its task hands the turn to the lot
//!   and ends (the chat's turn stays held, the entry marked active) → the lot looks at it
//!   again in a short task when a part is posted (woken through `Posted`) or one of its
//!   timers is due (typing, the platform's deadline, a paced edit, its time to live) → held
//!   still: back to the lot → ended: the ticket's task's last work — its deadline disarmed,
//!   the chat's turn released (for a turn taken over: then its own ticket's turn, in a task
//!   again) → halted (a lease not safe, credentials refused): its ticket's turn is asked for
//!   again and served as before, which holds it again without asking the handler
//! ```
//!
//! A thousand held turns cost a thousand records, not a thousand tasks. A worker that
//! registered again drops its earlier registration's held turns (their tickets are others'
//! to take over; the entries are seen through as the new registration); a worker that leaves
//! drops them all (taken over once it unregisters).

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    sync::Arc,
    time::Instant,
};

use botfleet_core::{BotSpec, Fence};
use tokio::sync::mpsc;

use super::{lock, Grant, Hooks, Taken, TurnHold};
use crate::{
    chats::sleep_until_timer,
    later::EntryOf,
    turn::{self, Halt, Parked},
};

/// A held turn in the lot, with what its ticket's task is to do once it ends.
pub(super) struct Lodged {
    pub(super) turn: Box<Parked>,
    /// When it is to be looked at though no part was posted.
    pub(super) due: Instant,
    /// The spec it was held under (its parts go out under it), and when that spec was
    /// registered, if known.
    pub(super) spec: Arc<BotSpec>,
    pub(super) spec_at: Option<i64>,
    /// Its chat's key in the turn queues.
    pub(super) ck: Box<str>,
    /// The entry of the ticket its task asked with, when it is not the held turn's (a turn
    /// taken over): kept once per held turn, not twice.
    pub(super) key: Option<Box<str>>,
    /// The ticket its task asked with.
    pub(super) own: u64,
    /// The ticket whose turn is held: `own`, or the ticket of a worker that left, taken over.
    pub(super) ticket: u64,
    /// The fence of the chat's turn.
    pub(super) fence: Fence,
    /// What the turn was granted as.
    pub(super) grant: Grant,
}

impl Lodged {
    /// The entry of the ticket its task asked with.
    pub(super) fn key(&self) -> &str {
        self.key.as_deref().unwrap_or(self.turn.key())
    }

    /// Its chat's key and the entry its task asked with, as owned strings, and its chat.
    fn names(&self) -> (String, String, String) {
        (
            self.ck.to_string(),
            self.key().to_owned(),
            self.turn.chat().to_owned(),
        )
    }
}

/// What the lot is told.
pub(super) enum ToLot {
    /// A held turn to keep: just held (false), or looked at and held still (true).
    Keep(Box<Lodged>, bool),
    /// A look ended its turn's hold (or its hold was halted).
    Over(EntryOf),
}

/// The held turns, owned by the lot's task.
#[derive(Default)]
struct Lot {
    /// Each held turn between looks, with when it is due.
    parked: HashMap<EntryOf, (Instant, Box<Lodged>)>,
    /// The parked turns by when they are due, earliest first.
    timers: BTreeSet<(Instant, EntryOf)>,
    /// Held turns being looked at now, and whether a part was posted for one meanwhile (it
    /// is looked at again as soon as it is back).
    running: HashMap<EntryOf, bool>,
    /// Wake-ups for turns not in the lot yet (on their way from the task that held them,
    /// which may be doing the parts posted before the hold for minutes), kept while their
    /// entry is watched.
    early: HashSet<EntryOf>,
}

impl Hooks {
    /// Hands a held turn to the lot. Without the lot (the worker is stopping) it is dropped:
    /// its hold stays in the store, and its turn is taken over once the worker unregisters.
    pub(super) fn lodge(&self, l: Box<Lodged>) {
        self.to_lot(ToLot::Keep(l, false));
    }

    fn to_lot(&self, m: ToLot) {
        if let Err(mpsc::error::SendError(ToLot::Keep(l, _))) = self.inner.lot.send(m) {
            self.unclaim_local(&l.spec.id, l.key());
        }
    }

    /// The lot's task: keeps the held turns handed to it and looks at each again when a part
    /// of its answer is posted or it is due. Runs until aborted.
    pub(super) async fn keep_lot(self) {
        let Some(mut rx) = lock(&self.inner.lot_rx).take() else {
            return;
        };
        let mut lot = Lot::default();
        let mut lease = self.inner.lease.clone();
        let mut leased = true;
        let mut closed = self.inner.closed.subscribe();
        let mut open = true;
        loop {
            tokio::select! {
                m = rx.recv() => match m {
                    Some(ToLot::Keep(l, looked)) => lot.keep(&self, l, looked),
                    Some(ToLot::Over(entry)) => lot.over(entry),
                    None => return,
                },
                entries = self.inner.posted.next() => lot.posted(&self, entries),
                () = sleep_until_timer(&lot.timers), if !lot.timers.is_empty() => lot.due(&self),
                r = lease.changed(), if leased => match r {
                    Ok(()) => lot.registered(&self),
                    Err(_) => leased = false,
                },
                r = closed.changed(), if open => {
                    open = r.is_ok() && !*closed.borrow_and_update();
                    if !open {
                        lot.leave(&self);
                    }
                }
            }
        }
    }

    /// Looks at a held turn again (`posted`: a part may have been posted): hands it back to
    /// the lot while it is held, else does what its ticket's task would have done next.
    async fn look(self, mut l: Box<Lodged>, posted: bool) {
        let entry = l.turn.entry();
        // Its parts go out under the bot's spec as it is now (a token rotated while the turn
        // was held is used), while the bot is a webhook bot still.
        if let Ok(Some(now)) = self.spec_of(&l.spec.id).await {
            if now.enabled && crate::is_webhook(&now) && !Arc::ptr_eq(&now, &l.spec) {
                l.spec_at = self.spec_at(&now);
                l.spec = now;
            }
        }
        let r = {
            let _busy = self.busy();
            let ctx = self.turn_ctx(&l.spec, l.spec_at);
            let hold = TurnHold {
                hooks: &self,
                grant: &l.grant,
                parks: None,
            };
            let r = turn::step_held(&ctx, &hold, &mut l.turn, posted).await;
            if let Ok(false) = r {
                l.due = l.turn.due(&ctx);
            }
            r
        };
        match r {
            Ok(false) => self.to_lot(ToLot::Keep(l, true)),
            Ok(true) => {
                self.to_lot(ToLot::Over(entry));
                self.held_ended(l).await;
            }
            Err(halt) => {
                self.to_lot(ToLot::Over(entry));
                self.held_halted(l, halt).await;
            }
        }
    }

    /// A held turn's entry ended: its deadline is disarmed and the chat's turn released, as
    /// its ticket's task does after any entry; for a turn taken over, its own ticket's turn
    /// comes next.
    async fn held_ended(&self, l: Box<Lodged>) {
        let (ck, key, chat) = l.names();
        let Lodged {
            turn,
            spec,
            own,
            ticket,
            fence,
            grant,
            ..
        } = *l;
        self.disarm(&spec.id, turn.key(), turn.armed());
        drop(turn);
        // Answered under a newer spec than the one refused: nothing is held any more.
        lock(&self.inner.refused).remove(&spec.id);
        if self.release(&ck, ticket, fence, &grant).await && ticket != own {
            self.serve_own_again(spec, ck, chat, key, own, grant).await;
        } else {
            self.ticket_over(spec, ck, chat, key, grant);
        }
    }

    /// A held turn was halted: asked to stop, its ticket's task is over; else (a lease not
    /// safe, the worker registered again, credentials refused) its ticket's turn is asked for
    /// again once this worker may act, and served as its task serves it (held again, the
    /// handler not asked again), or left to be taken over.
    async fn held_halted(&self, l: Box<Lodged>, halt: Halt) {
        let (ck, key, chat) = l.names();
        let Lodged {
            turn,
            spec,
            spec_at,
            own,
            grant,
            ..
        } = *l;
        // Its hold ends here (counted, watched and kept no longer): the ticket's turn may be
        // served again for long (until the bot's spec changes, after a refusal).
        drop(turn);
        let spec = if let Halt::Failed(_) = halt {
            // Its entry and the chat's later ones wait until the bot's spec changes (unless it
            // changed since the refusal: then the turn goes on under the new one).
            let now = match self.spec_of(&spec.id).await {
                Ok(Some(now)) => now,
                _ => spec,
            };
            let now_at = self.spec_at(&now);
            if spec_at.is_none() || now_at == spec_at {
                lock(&self.inner.refused).insert(now.id.clone(), now_at);
            }
            now
        } else {
            spec
        };
        if !matches!(halt, Halt::Stopped) && self.recover(&grant).await {
            self.serve_own_again(spec, ck, chat, key, own, grant).await;
        } else {
            self.ticket_over(spec, ck, chat, key, grant);
        }
    }

    /// Serves the ticket `own` (of the entry `key`) on from its turn's next answer, asked for
    /// now, as its task would; or ends that task's work once what `grant` was granted
    /// under ended.
    async fn serve_own_again(
        &self,
        spec: Arc<BotSpec>,
        ck: String,
        chat: String,
        key: String,
        own: u64,
        grant: Grant,
    ) {
        match self.try_again(&ck, own, &grant).await {
            Some(next) => {
                let t = Taken {
                    ticket: own,
                    turn: next,
                    grant,
                };
                Box::pin(self.run_ticket(spec, ck, chat, key, t, Instant::now(), None)).await;
            }
            None => self.ticket_over(spec, ck, chat, key, grant),
        }
    }
}

impl Lot {
    /// Keeps a held turn until a part of its answer is posted or it is due; at once again
    /// when a part came before it was back.
    fn keep(&mut self, h: &Hooks, mut l: Box<Lodged>, looked: bool) {
        if h.closed() {
            // Leaving: taken over once the worker unregisters.
            h.unclaim_local(&l.spec.id, l.key());
            return;
        }
        let entry = l.turn.entry();
        if h.registered_again(&l.grant) {
            // An earlier registration's: let go (seen through as the new one).
            self.over(entry);
            let_go(h, l, LOST);
            return;
        }
        let posted = if looked {
            self.running.remove(&entry) == Some(true)
        } else {
            self.early.remove(&entry)
        };
        if posted {
            self.look(h, l, true);
            return;
        }
        if let Some((due, other)) = self.parked.remove(&entry) {
            // Two held turns of one entry: an earlier registration's and this one's. The
            // earlier one is let go (seen through as the new registration).
            self.timers.remove(&(due, entry));
            let (keep, go) = if !h.registered_again(&other.grant) && h.registered_again(&l.grant) {
                (other, l)
            } else {
                (l, other)
            };
            l = keep;
            let_go(h, go, "a newer hold of the entry is kept");
        }
        self.timers.insert((l.due, entry));
        self.parked.insert(entry, (l.due, l));
    }

    /// A look ended its turn's hold (or handed it on: it may come back held again, from the
    /// task that serves its ticket anew; a part posted meanwhile is kept for then).
    fn over(&mut self, entry: EntryOf) {
        if self.running.remove(&entry) == Some(true) {
            self.early.insert(entry);
        }
        if self.running.is_empty() && self.parked.is_empty() && self.early.is_empty() {
            // No turn held: what a burst grew is given back.
            *self = Self::default();
        }
    }

    /// Looks at a held turn again, in a task of its own.
    fn look(&mut self, h: &Hooks, l: Box<Lodged>, posted: bool) {
        self.running.insert(l.turn.entry(), false);
        tokio::spawn(h.clone().look(l, posted));
    }

    /// Parts may have been posted for `entries`: their turns are looked at (or will be, when
    /// they are back, or when they arrive).
    fn posted(&mut self, h: &Hooks, entries: Vec<EntryOf>) {
        if !self.early.is_empty() {
            let later = &h.inner.settings.later;
            self.early.retain(|e| later.watched(*e));
        }
        for entry in entries {
            if let Some((due, l)) = self.parked.remove(&entry) {
                self.timers.remove(&(due, entry));
                self.look(h, l, true);
            } else if let Some(posted) = self.running.get_mut(&entry) {
                *posted = true;
            } else {
                self.early.insert(entry);
            }
        }
    }

    /// Looks at the held turns whose time came.
    fn due(&mut self, h: &Hooks) {
        let now = Instant::now();
        while let Some(&(due, entry)) = self.timers.first() {
            if due > now {
                break;
            }
            self.timers.pop_first();
            if let Some((_, l)) = self.parked.remove(&entry) {
                self.look(h, l, false);
            }
        }
    }

    /// The worker's registration changed: the held turns of an earlier one are let go (their
    /// tickets are others' to take over; their entries are seen through as the new one).
    fn registered(&mut self, h: &Hooks) {
        let stale: Vec<EntryOf> = self
            .parked
            .iter()
            .filter(|(_, (_, l))| h.registered_again(&l.grant))
            .map(|(e, _)| *e)
            .collect();
        for entry in stale {
            if let Some((due, l)) = self.parked.remove(&entry) {
                self.timers.remove(&(due, entry));
                let_go(h, l, LOST);
            }
        }
    }

    /// The worker is leaving: its held turns stay held in the store, taken over once it
    /// unregisters.
    fn leave(&mut self, h: &Hooks) {
        for (_, (_, l)) in self.parked.drain() {
            h.unclaim_local(&l.spec.id, l.key());
        }
        *self = Self::default();
    }
}

/// Why an earlier registration's held turn is let go.
const LOST: &str = "the held turn was lost (the worker registered again)";

/// Lets a held turn go from the lot (`why`: for the log), in a task of its own: its ticket's
/// turn is asked for again as its registration, or left to be taken over.
fn let_go(h: &Hooks, l: Box<Lodged>, why: &'static str) {
    let h = h.clone();
    tokio::spawn(async move { h.held_halted(l, Halt::Fenced(why.into())).await });
}
