//! The [`Store`] trait.

use async_trait::async_trait;
use botfleet_core::{BotId, BotRecord, BotSpec, BotStatus, Fence, Platform};

use crate::{
    InboxEntry, InboxItem, InboxStats, Result, SessionWrite, StateWrite, TurnRecord, TurnView,
};

/// Which bots [`Store::list_bots`] returns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BotFilter {
    /// Only bots of this platform.
    pub platform: Option<Platform>,
    /// Only enabled (`Some(true)`) or disabled (`Some(false)`) bots.
    pub enabled: Option<bool>,
}

/// A per-bot cursor (e.g. Telegram's update offset) and the fence it was written under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cursor {
    /// The value, opaque to the store.
    pub value: String,
    /// The fence of the write that stored it.
    pub fence: Fence,
}

/// One status report for [`Store::set_statuses`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusReport {
    /// The bot.
    pub id: BotId,
    /// What it is doing.
    pub status: BotStatus,
    /// Why, when it is not well; `None` clears the last error.
    pub last_error: Option<String>,
    /// Which worker says so.
    pub reported_by: Option<String>,
    /// The `updated_at_ms` of the spec the report was made under, when the reporter knows it.
    /// A report made under a spec older than the registered one (a turn that used a token an
    /// operator has since replaced) is stale: it is not applied, and answers `Ok`.
    pub spec_at_ms: Option<i64>,
}

/// Persistence of the bot registry and of per-bot fenced state.
///
/// Every backend (SQLite, Postgres, in-memory) passes one conformance suite in
/// `botfleet-testkit`.
///
/// # Fences
/// The store keeps, per bot, the highest fence it has accepted. A write that carries a lower
/// fence is refused with [`StoreError::StaleFence`](crate::StoreError::StaleFence), so a
/// worker that lost its claim cannot overwrite its successor's state. Fences outlive the bot:
/// removing and re-adding a bot does not reset them.
#[async_trait]
pub trait Store: Send + Sync + std::fmt::Debug {
    /// Registers a new bot (status `pending`).
    ///
    /// # Errors
    /// `AlreadyExists`, `InvalidSpec`, backend failures.
    async fn add_bot(&self, spec: &BotSpec) -> Result<()>;

    /// The bot, if registered.
    ///
    /// # Errors
    /// Backend failures; `Corrupt` for an unreadable row.
    async fn get_bot(&self, id: &BotId) -> Result<Option<BotRecord>>;

    /// Registered bots matching `filter`, sorted by id.
    ///
    /// # Errors
    /// Backend failures; `Corrupt` for an unreadable row.
    async fn list_bots(&self, filter: &BotFilter) -> Result<Vec<BotRecord>>;

    /// Replaces a registered bot's spec (status and last error are kept). Its `updated_at_ms` becomes
    /// strictly later than before (now, or one past the old value): the version of the spec.
    ///
    /// # Errors
    /// `NotFound`, `InvalidSpec`, backend failures.
    async fn update_bot(&self, spec: &BotSpec) -> Result<()>;

    /// [`Store::update_bot`], only while the registered spec is the one changed at
    /// `expected_at_ms` (its `updated_at_ms`): `Ok(false)`, nothing written, when it changed
    /// since. What the fleet writes into a spec (a Discord bot's counted shards) then never
    /// overwrites an operator's change made in between.
    ///
    /// # Errors
    /// `NotFound`, `InvalidSpec`, backend failures.
    async fn update_bot_if(&self, spec: &BotSpec, expected_at_ms: i64) -> Result<bool>;

    /// Unregisters a bot. Answers whether it existed.
    ///
    /// # Errors
    /// Backend failures.
    async fn remove_bot(&self, id: &BotId) -> Result<bool>;

    /// Records what the bot is doing, and which worker says so; `last_error` is cleared when
    /// `None`.
    ///
    /// # Errors
    /// `NotFound`, backend failures.
    async fn set_status(
        &self,
        id: &BotId,
        status: BotStatus,
        last_error: Option<&str>,
        reported_by: Option<&str>,
    ) -> Result<()>;

    /// The bot's cursor, if one was written.
    ///
    /// # Errors
    /// Backend failures.
    async fn cursor(&self, id: &BotId) -> Result<Option<Cursor>>;

    /// Writes the bot's cursor under `fence`.
    ///
    /// # Errors
    /// `StaleFence` when a higher fence was accepted before; backend failures.
    async fn put_cursor(&self, id: &BotId, value: &str, fence: Fence) -> Result<()>;

    /// Records that `fence` was granted for the bot, so every lower fence is refused from now
    /// on. Call it right after a claim, before acting.
    ///
    /// # Errors
    /// `StaleFence` when a higher fence was accepted before; backend failures.
    async fn accept_fence(&self, id: &BotId, fence: Fence) -> Result<()>;

    /// The highest fence accepted for the bot ([`Fence::ZERO`] if none). Pass it as the
    /// claim's minimum so fences never go back, even if the coordinator lost its state.
    ///
    /// # Errors
    /// Backend failures.
    async fn highest_fence(&self, id: &BotId) -> Result<Fence>;

    /// [`Store::highest_fence`] of many bots, in their order, at once (one query where the
    /// backend can: a worker claiming thousands of bots reads their floors in a few).
    ///
    /// # Errors
    /// Backend failures.
    async fn highest_fences(&self, ids: &[BotId]) -> Result<Vec<Fence>> {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            out.push(self.highest_fence(id).await?);
        }
        Ok(out)
    }

    /// [`Store::accept_fence`] of many grants at once (one transaction where the backend
    /// can); each answer is the single call's, in order.
    ///
    /// # Errors
    /// Backend failures of the whole batch (then nothing of it may be assumed written).
    async fn accept_fences(&self, grants: &[(BotId, Fence)]) -> Result<Vec<Result<()>>> {
        let mut out = Vec::with_capacity(grants.len());
        for (id, fence) in grants {
            out.push(self.accept_fence(id, *fence).await);
        }
        Ok(out)
    }

    /// [`Store::set_status`] of many reports, applied in order, at once (one transaction where
    /// the backend can); each answer is the single call's.
    ///
    /// # Errors
    /// Backend failures of the whole batch.
    async fn set_statuses(&self, reports: &[StatusReport]) -> Result<Vec<Result<()>>> {
        let mut out = Vec::with_capacity(reports.len());
        for r in reports {
            // Not atomic with the write below: backends override this with one conditional
            // update.
            if let Some(at) = r.spec_at_ms {
                match self.get_bot(&r.id).await {
                    Ok(Some(b)) if b.updated_at_ms > at => {
                        out.push(Ok(()));
                        continue;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        out.push(Err(e));
                        continue;
                    }
                }
            }
            out.push(
                self.set_status(
                    &r.id,
                    r.status,
                    r.last_error.as_deref(),
                    r.reported_by.as_deref(),
                )
                .await,
            );
        }
        Ok(out)
    }

    /// The bot's pending entries, oldest first, at most `limit`.
    ///
    /// # Errors
    /// Backend failures.
    async fn inbox_pending(&self, bot: &BotId, limit: usize) -> Result<Vec<InboxEntry>>;

    /// The pending entries of one chat of the bot, oldest first, at most `limit` (what a chat
    /// whose turn queue was lost must serve first, however many other chats have pending).
    ///
    /// # Errors
    /// Backend failures.
    async fn inbox_pending_chat(
        &self,
        bot: &BotId,
        chat: &str,
        limit: usize,
    ) -> Result<Vec<InboxEntry>>;

    /// Pending and undeliverable counts of every bot that has any.
    ///
    /// # Errors
    /// Backend failures.
    async fn inbox_stats(&self) -> Result<std::collections::HashMap<BotId, InboxStats>>;

    /// The bot's undeliverable entries, newest first, at most `limit` (for the operator).
    ///
    /// # Errors
    /// Backend failures.
    async fn inbox_undeliverable(&self, bot: &BotId, limit: usize) -> Result<Vec<InboxEntry>>;

    /// Forgets done entries finished before `done_before_ms` and undeliverable ones finished
    /// before `undeliverable_before_ms` (unix ms); a backend send's entry stays at least
    /// [`SEND_KEEP_MS`](crate::SEND_KEEP_MS) after it ended (a repeat of its key finds it).
    /// The parts posted to a held turn go with their entry: once it ended, those posted before
    /// `done_before_ms`. Answers how many entries went.
    ///
    /// # Errors
    /// Backend failures.
    async fn inbox_prune(&self, done_before_ms: i64, undeliverable_before_ms: i64) -> Result<u64>;

    /// A cheap stamp of the registry's specs: `(number of bots, latest spec change in unix
    /// ms)`. It changes when a bot is added, removed or updated (not on status reports), so a
    /// worker re-reads the whole registry only when it differs.
    ///
    /// # Errors
    /// Backend failures.
    async fn registry_stamp(&self) -> Result<(u64, i64)>;

    /// Re-seals every stored credential under the store's first secret key (or, without a
    /// key, stores it plain), leaving specs and their change times alone: running workers
    /// see no change and restart nothing. A value written meanwhile by someone else is left
    /// as that writer sealed it. Answers how many bots were rewritten. Stores that keep
    /// nothing at rest (memory) rewrite nothing.
    ///
    /// # Errors
    /// [`StoreError::Secrets`](crate::StoreError::Secrets) when a value does not open with the keys given; backend
    /// failures.
    async fn reseal_secrets(&self) -> Result<u64> {
        Ok(0)
    }

    /// Journals what `bot` received, each item once, in order: answers per item what became
    /// of it ([`Journaled`](crate::Journaled): a key recorded before is a redelivery and is
    /// left as it is; an event of a chat paused now, see [`Store::chat_pause`], is recorded
    /// [`Paused`](crate::InboxState::Paused) in the same write) and, when `view`
    /// names one of the items, the [`TurnView`] of that item — what a worker that already
    /// holds its chat's turn starts from — in the same call (one round trip where the backend
    /// can).
    ///
    /// `fence` is the claim of a unit's holder (polling, socket, gateway, linked-device bots:
    /// one writer); `None` is any worker journaling a webhook delivery (many at once). Either
    /// way an entry's `seq` is its arrival time in µs since the Unix epoch, above the bot's
    /// last entry wherever one writer journals at a time (a unit's holder; every writer of
    /// SQLite and memory), so the two kinds of entries of one bot keep the order they came in.
    ///
    /// # Errors
    /// `StaleFence` when `fence` is below the bot's accepted fence; backend failures (then
    /// none of the items may be assumed recorded).
    async fn journal_put(
        &self,
        bot: &BotId,
        items: &[InboxItem],
        fence: Option<Fence>,
        view: Option<usize>,
    ) -> Result<(Vec<crate::Journaled>, Option<TurnView>)>;

    /// Pauses `chat` of the bot `bot` (its own id, for every slice of it): from now on the
    /// events of the chat journaled on any worker are recorded
    /// [`Paused`](crate::InboxState::Paused) and no turn answers them, and a turn that reads
    /// the chat paused ([`TurnView::paused`]) ends its event so instead of calling the
    /// handler. Sends from the backend are not paused. A pause given again replaces the one in
    /// effect.
    ///
    /// # Errors
    /// Backend failures.
    async fn chat_pause(&self, bot: &BotId, pause: &crate::ChatPause) -> Result<()>;

    /// Lifts the pause of `chat` of the bot `bot`. With `replay`, the chat's entries that
    /// ended [`Paused`](crate::InboxState::Paused) since the pause began (of every slice of the
    /// bot) are made pending again, for turns to answer in the order they came.
    ///
    /// # Errors
    /// Backend failures (then the pause may or may not have been lifted: lift it again).
    async fn chat_resume(&self, bot: &BotId, chat: &str, replay: bool) -> Result<crate::Resumed>;

    /// The bot's chats paused now, in chat order (pauses that ended by themselves are not
    /// listed).
    ///
    /// # Errors
    /// Backend failures.
    async fn chat_pauses(&self, bot: &BotId) -> Result<Vec<crate::ChatPause>>;

    /// Records that the users of chats (of the bot `bot`, any unit of it) wrote something the
    /// bot does not handle (a location, a reaction), each pair a chat and when (unix ms): not
    /// journaled, but it renews a platform's reply window as a message does
    /// ([`TurnView::last_in_ms`]; never moved back).
    ///
    /// # Errors
    /// Backend failures (then some may have been recorded: record them again).
    async fn chat_seen(&self, bot: &BotId, seen: &[(String, i64)]) -> Result<()>;

    /// A chat's log after the number `after` (0: from its start), oldest first, at most
    /// `limit` items (capped at [`MAX_CHAT_EVENTS`](crate::MAX_CHAT_EVENTS)): its entries
    /// (events and sends from the backend) and what its turns said, see
    /// [`ChatEvent`](crate::ChatEvent). `bot` is the unit that receives the chat.
    ///
    /// # Errors
    /// Backend failures.
    async fn chat_events(
        &self,
        bot: &BotId,
        chat: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<crate::ChatEvent>>;

    /// What a turn on the entry `key` of `chat` starts from (see [`TurnView`]), in one call.
    /// The entry is found by its key alone (`chat` selects the state).
    ///
    /// # Errors
    /// Backend failures.
    async fn turn_view(&self, bot: &BotId, key: &str, chat: &str) -> Result<TurnView>;

    /// The entry `key` of the bot, whatever its chat (a send from the backend, looked up by
    /// its id).
    ///
    /// # Errors
    /// Backend failures.
    async fn inbox_entry(&self, bot: &BotId, key: &str) -> Result<Option<InboxEntry>> {
        Ok(self.turn_view(bot, key, "").await?.entry)
    }

    /// Records that a turn of `chat` under `fence` began (a turn taken over from a dead
    /// worker): a lower fence's state write is refused from now on.
    ///
    /// # Errors
    /// `StaleFence` when a higher fence was accepted for the chat; backend failures.
    async fn turn_accept(&self, bot: &BotId, chat: &str, fence: Fence) -> Result<()>;

    /// Ends a turn: the one way an entry ends, for every bot. In one transaction: the outbox
    /// record of its reply (if sent; a record made before stays), the chat's state by
    /// compare-and-set on the revision (and, for [`TurnFence::Chat`](crate::TurnFence::Chat), the chat's fence), and
    /// the entry's end (if still pending).
    ///
    /// # Errors
    /// `StaleFence` for a [`TurnFence::Claim`](crate::TurnFence::Claim) below the bot's accepted fence (nothing is
    /// written); backend failures (then nothing of it may be assumed written).
    async fn turn_record(&self, bot: &BotId, rec: &TurnRecord) -> Result<StateWrite>;

    /// Records how far a turn of several actions got ([`TurnStep`](crate::TurnStep)), under its
    /// fence, replacing what an earlier step of the entry wrote.
    ///
    /// # Errors
    /// `StaleFence` when the turn is superseded: a claim below the bot's accepted fence, or a
    /// chat turn whose chat accepted a higher fence (nothing is written); backend failures.
    async fn turn_step(&self, bot: &BotId, step: &crate::TurnStep) -> Result<()>;

    /// The progress the last [`Store::turn_step`] of the entry `key` wrote, if any.
    ///
    /// # Errors
    /// Backend failures.
    async fn turn_progress(&self, bot: &BotId, key: &str) -> Result<Option<String>>;

    /// Holds the entry's turn open for an answer that comes later (its handler answered
    /// `202`), under the turn's fence (checked like [`Store::turn_step`]'s). The first hold
    /// of an entry sets when it expires; a later one (a worker taking the turn over) keeps it.
    /// Answers when the hold expires, or `None` when the entry is not pending (ended, or
    /// never journaled).
    ///
    /// # Errors
    /// `StaleFence` when the turn is superseded (nothing is written); backend failures.
    async fn turn_hold(&self, bot: &BotId, hold: &crate::TurnHold) -> Result<Option<i64>>;

    /// Keeps a part of a held turn's answer, posted by any worker, after the parts posted
    /// before it: see [`PostAnswer`](crate::PostAnswer). A part is taken while the entry is
    /// pending (held or not yet: a client may post before its `202` is read), the hold has
    /// not expired and no last part was posted; a key posted before answers as it did then.
    ///
    /// # Errors
    /// Backend failures (then it may or may not have been kept: post it again).
    async fn reply_post(&self, bot: &BotId, post: &crate::ReplyPost) -> Result<crate::PostAnswer>;

    /// The parts posted to the entry `key` after `after_seq`, in order.
    ///
    /// # Errors
    /// Backend failures.
    async fn posted_replies(
        &self,
        bot: &BotId,
        key: &str,
        after_seq: u64,
    ) -> Result<Vec<crate::PostedReply>>;

    /// Which entries, of every bot, had parts posted at or after `since_ms` (unix ms, as the
    /// posting worker's clock said), each with the number of its latest part: one query
    /// however many turns are held (what wakes the turns a worker holds when another worker
    /// took their parts).
    ///
    /// # Errors
    /// Backend failures.
    async fn replies_since(&self, since_ms: i64) -> Result<Vec<(BotId, String, u64)>>;

    /// The values of `names` in the bot's chat, as turns recorded them
    /// ([`TurnRecord::refs`](crate::TurnRecord::refs)); `None` for a name never given or
    /// expired.
    ///
    /// # Errors
    /// Backend failures.
    async fn refs_get(
        &self,
        bot: &BotId,
        chat: &str,
        names: &[String],
    ) -> Result<Vec<Option<String>>>;

    /// Applies `writes` to the bot's linked-device session records, all or none, under
    /// `fence` (the claim's).
    ///
    /// # Errors
    /// `StaleFence` when a higher fence was accepted for the bot (nothing is written);
    /// backend failures (then nothing may be assumed written).
    async fn session_write(&self, bot: &BotId, writes: &[SessionWrite], fence: Fence)
        -> Result<()>;

    /// Every record of `kind` in the bot's session, sorted by key.
    ///
    /// # Errors
    /// Backend failures; `Secrets` when a value does not open.
    async fn session_records(&self, bot: &BotId, kind: &str) -> Result<Vec<(String, Vec<u8>)>>;

    /// The record `key` of `kind` in the bot's session.
    ///
    /// # Errors
    /// Backend failures; `Secrets` when the value does not open.
    async fn session_record(&self, bot: &BotId, kind: &str, key: &str) -> Result<Option<Vec<u8>>>;

    /// Forgets the bot's whole session (logged out, unlinked) under `fence`.
    ///
    /// # Errors
    /// `StaleFence` when a higher fence was accepted for the bot; backend failures.
    async fn session_clear(&self, bot: &BotId, fence: Fence) -> Result<()>;

    /// The fleet-wide secret `name` (what signs the fleet's file links): the one stored, or
    /// `fresh` stored now when there is none. Whoever comes first wins, and every caller
    /// gets the same bytes. Sealed at rest like credentials, and resealed by
    /// [`Store::reseal_secrets`].
    ///
    /// # Errors
    /// `Secrets` when the stored value does not open with the keys given; backend failures.
    async fn fleet_secret(&self, name: &str, fresh: &[u8]) -> Result<Vec<u8>>;

    /// What a bot starting here resumes from: its checkpoint and up to `limit` inbox entries
    /// recorded but not answered, oldest first — in one call (a worker taking thousands of
    /// bots over makes one per bot). Each entry is then answered by a turn that reads its
    /// [`TurnView`] (state, outbox) like any other.
    ///
    /// # Errors
    /// Backend failures.
    async fn resume_point(
        &self,
        bot: &BotId,
        limit: usize,
    ) -> Result<(Option<Cursor>, Vec<InboxEntry>)> {
        Ok((
            self.cursor(bot).await?,
            self.inbox_pending(bot, limit).await?,
        ))
    }
}
