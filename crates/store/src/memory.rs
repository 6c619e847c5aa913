//! An in-memory store: for tests and throwaway runs. Nothing survives the process.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Mutex, MutexGuard},
};

use async_trait::async_trait;
use botfleet_core::{BotId, BotRecord, BotSpec, BotStatus, Fence};

use crate::{
    reply_key, BotFilter, Cursor, InboxEntry, InboxItem, InboxState, InboxStats, Result,
    StateWrite, StatusReport, Store, StoreError, TurnRecord, TurnView,
};

#[derive(Debug, Default)]
struct State {
    bots: BTreeMap<BotId, BotRecord>,
    fences: BTreeMap<BotId, (Fence, Option<String>)>,
    /// Per bot: key → (entry, unix ms it finished).
    inbox: BTreeMap<BotId, BTreeMap<String, (InboxEntry, Option<i64>)>>,
    /// Per bot: reply key → (fence, unix ms sent).
    outbox: BTreeMap<BotId, BTreeMap<String, (Fence, i64)>>,
    /// Per (bot, chat): (revision, fence, state).
    chats: BTreeMap<(BotId, String), (u64, Fence, Option<String>)>,
    /// (bot, entry key) → (progress, unix ms written): the outbox's progress rows.
    progress: BTreeMap<(BotId, String), (String, i64)>,
    /// (bot, chat, name) → (value, unix ms it expires).
    refs: BTreeMap<(BotId, String, String), (String, i64)>,
    /// Per bot: (kind, key) → value of its linked-device session.
    sessions: BTreeMap<BotId, BTreeMap<(String, String), Vec<u8>>>,
    /// Fleet-wide secrets by name.
    secrets: HashMap<String, Vec<u8>>,
    /// (bot, entry key) → its held turn and the parts posted to it.
    held: BTreeMap<(BotId, String), Held>,
    /// (bot's own id, chat) → its pause.
    pauses: BTreeMap<(String, String), crate::ChatPause>,
    /// (bot's own id, chat) → the last number its log took (one count across the slices),
    /// and when its user last wrote (unix ms).
    heads: BTreeMap<(String, String), (u64, Option<i64>)>,
    /// (bot, chat) → its log's numbered items (an entry by its key, read from the inbox; what
    /// a turn said, kept here).
    logs: BTreeMap<(BotId, String), BTreeMap<u64, Logged>>,
}

/// Numbers `items` in `chat`'s log, after what it has.
fn log_into(
    heads: &mut BTreeMap<(String, String), (u64, Option<i64>)>,
    logs: &mut BTreeMap<(BotId, String), BTreeMap<u64, Logged>>,
    bot: &BotId,
    chat: &str,
    items: impl IntoIterator<Item = Logged>,
) {
    let (head, last_in) = heads
        .entry((bot.base().to_owned(), chat.to_owned()))
        .or_default();
    let log = logs.entry((bot.clone(), chat.to_owned())).or_default();
    for it in items {
        if let Logged::Entry(key) = &it {
            if InboxEntry::kind_of(key) == crate::EntryKind::Event {
                *last_in = (*last_in).max(Some(botfleet_core::unix_ms()));
            }
        }
        *head += 1;
        log.insert(*head, it);
    }
}

/// An item of a chat's log, as the memory store keeps it.
#[derive(Debug)]
enum Logged {
    /// The entry of this key.
    Entry(String),
    /// What the turn of the entry `.0` said (`.1`), when (`.2`, unix ms).
    Said(String, String, i64),
}

/// An entry's answer that comes later: the SQL backends' `held_until_ms`, `posts`,
/// `posts_closed` and `replies` rows.
#[derive(Debug, Default)]
struct Held {
    until_ms: Option<i64>,
    posts: u64,
    closed: bool,
    /// (number, hashed key, body digest, part).
    parts: Vec<(u64, String, String, crate::PostedReply)>,
}

impl State {
    /// Records each item not recorded before (numbered by `next_seq`), an event of a paused
    /// chat as paused; answers what became of each.
    fn record(
        &mut self,
        bot: &BotId,
        items: &[InboxItem],
        mut next_seq: impl FnMut() -> u64,
    ) -> Vec<crate::Journaled> {
        let now = botfleet_core::unix_ms();
        let State {
            inbox,
            pauses,
            heads,
            logs,
            ..
        } = self;
        let inbox = inbox.entry(bot.clone()).or_default();
        items
            .iter()
            .map(|item| {
                if inbox.contains_key(&item.key) {
                    return crate::Journaled::Known;
                }
                let paused = crate::InboxEntry::kind_of(&item.key) == crate::EntryKind::Event
                    && pauses
                        .get(&(bot.base().to_owned(), item.chat.clone()))
                        .is_some_and(|p| p.in_effect(now));
                let entry = InboxEntry {
                    bot: bot.clone(),
                    key: item.key.clone(),
                    seq: next_seq(),
                    chat: item.chat.clone(),
                    message: item.message.clone(),
                    state: if paused {
                        InboxState::Paused
                    } else {
                        InboxState::Pending
                    },
                    error: None,
                    received_at_ms: now,
                };
                inbox.insert(item.key.clone(), (entry, paused.then_some(now)));
                log_into(
                    heads,
                    logs,
                    bot,
                    &item.chat,
                    [Logged::Entry(item.key.clone())],
                );
                if paused {
                    crate::Journaled::Paused
                } else {
                    crate::Journaled::New
                }
            })
            .collect()
    }

    /// `Ok` while `fence` holds the chat's turn: the bot's accepted fence for a claim's
    /// turn, the chat's for a chat's turn.
    fn check_turn(&self, bot: &BotId, chat: &str, fence: crate::TurnFence) -> Result<()> {
        match fence {
            crate::TurnFence::Claim(f) => self.check_fence(bot, f),
            crate::TurnFence::Chat(f) => match self.chats.get(&(bot.clone(), chat.to_owned())) {
                Some((_, current, _)) if *current > f => Err(StoreError::StaleFence {
                    bot: bot.clone(),
                    offered: f,
                    current: *current,
                }),
                _ => Ok(()),
            },
        }
    }

    fn check_fence(&self, id: &BotId, fence: Fence) -> Result<()> {
        match self.fences.get(id) {
            Some((current, _)) if *current > fence => Err(StoreError::StaleFence {
                bot: id.clone(),
                offered: fence,
                current: *current,
            }),
            _ => Ok(()),
        }
    }
}

/// A [`Store`] in process memory.
#[derive(Debug, Default)]
pub struct MemoryStore {
    // std Mutex: never held across .await.
    state: Mutex<State>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn st(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn fenced(&self, id: &BotId, fence: Fence, value: Option<&str>) -> Result<()> {
        let mut st = self.st();
        let entry = st.fences.entry(id.clone()).or_insert((Fence::ZERO, None));
        if entry.0 > fence {
            return Err(StoreError::StaleFence {
                bot: id.clone(),
                offered: fence,
                current: entry.0,
            });
        }
        entry.0 = fence;
        if let Some(v) = value {
            entry.1 = Some(v.to_owned());
        }
        Ok(())
    }
}

impl MemoryStore {
    /// `bot`'s inbox entries in `state`, in no order.
    fn entries_in(&self, bot: &BotId, state: InboxState) -> Vec<InboxEntry> {
        self.st()
            .inbox
            .get(bot)
            .map(|i| {
                i.values()
                    .filter(|(e, _)| e.state == state)
                    .map(|(e, _)| e.clone())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl MemoryStore {
    /// Replaces a bot's spec, only over version `expected` when given. The change time is
    /// the spec's version: strictly later than the one replaced, even within a millisecond.
    fn replace_spec(&self, spec: &BotSpec, expected: Option<i64>) -> Result<bool> {
        spec.validate_shared()?;
        let mut st = self.st();
        let rec = st
            .bots
            .get_mut(&spec.id)
            .ok_or_else(|| StoreError::NotFound(spec.id.clone()))?;
        if expected.is_some_and(|at| rec.updated_at_ms != at) {
            return Ok(false);
        }
        rec.spec = spec.clone();
        rec.updated_at_ms = botfleet_core::unix_ms().max(rec.updated_at_ms + 1);
        Ok(true)
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn add_bot(&self, spec: &BotSpec) -> Result<()> {
        spec.validate_shared()?;
        let mut st = self.st();
        if st.bots.contains_key(&spec.id) {
            return Err(StoreError::AlreadyExists(spec.id.clone()));
        }
        st.bots.insert(
            spec.id.clone(),
            BotRecord {
                spec: spec.clone(),
                status: BotStatus::Pending,
                last_error: None,
                reported_by: None,
                updated_at_ms: botfleet_core::unix_ms(),
            },
        );
        Ok(())
    }

    async fn get_bot(&self, id: &BotId) -> Result<Option<BotRecord>> {
        Ok(self.st().bots.get(id).cloned())
    }

    async fn list_bots(&self, filter: &BotFilter) -> Result<Vec<BotRecord>> {
        Ok(self
            .st()
            .bots
            .values()
            .filter(|b| filter.platform.is_none_or(|p| b.spec.platform == p))
            .filter(|b| filter.enabled.is_none_or(|e| b.spec.enabled == e))
            .cloned()
            .collect())
    }

    async fn update_bot(&self, spec: &BotSpec) -> Result<()> {
        self.replace_spec(spec, None).map(|_| ())
    }

    async fn update_bot_if(&self, spec: &BotSpec, expected_at_ms: i64) -> Result<bool> {
        self.replace_spec(spec, Some(expected_at_ms))
    }

    async fn remove_bot(&self, id: &BotId) -> Result<bool> {
        let mut st = self.st();
        st.sessions.remove(id);
        Ok(st.bots.remove(id).is_some())
    }

    async fn set_status(
        &self,
        id: &BotId,
        status: BotStatus,
        last_error: Option<&str>,
        reported_by: Option<&str>,
    ) -> Result<()> {
        let mut st = self.st();
        let rec = st
            .bots
            .get_mut(id)
            .ok_or_else(|| StoreError::NotFound(id.clone()))?;
        rec.status = status;
        rec.last_error = last_error.map(str::to_owned);
        rec.reported_by = reported_by.map(str::to_owned);
        Ok(())
    }

    async fn set_statuses(&self, reports: &[StatusReport]) -> Result<Vec<Result<()>>> {
        let mut st = self.st();
        Ok(reports
            .iter()
            .map(|r| {
                let rec = st
                    .bots
                    .get_mut(&r.id)
                    .ok_or_else(|| StoreError::NotFound(r.id.clone()))?;
                // A report made under an older spec than the registered one is stale.
                if r.spec_at_ms.is_none_or(|at| rec.updated_at_ms <= at) {
                    rec.status = r.status;
                    rec.last_error.clone_from(&r.last_error);
                    rec.reported_by.clone_from(&r.reported_by);
                }
                Ok(())
            })
            .collect())
    }

    async fn cursor(&self, id: &BotId) -> Result<Option<Cursor>> {
        Ok(self
            .st()
            .fences
            .get(id)
            .and_then(|(f, v)| v.clone().map(|value| Cursor { value, fence: *f })))
    }

    async fn put_cursor(&self, id: &BotId, value: &str, fence: Fence) -> Result<()> {
        self.fenced(id, fence, Some(value))
    }

    async fn accept_fence(&self, id: &BotId, fence: Fence) -> Result<()> {
        self.fenced(id, fence, None)
    }

    async fn registry_stamp(&self) -> Result<(u64, i64)> {
        let st = self.st();
        let max = st.bots.values().map(|b| b.updated_at_ms).max().unwrap_or(0);
        Ok((st.bots.len() as u64, max))
    }

    async fn highest_fence(&self, id: &BotId) -> Result<Fence> {
        Ok(self.st().fences.get(id).map_or(Fence::ZERO, |(f, _)| *f))
    }

    async fn inbox_pending(&self, bot: &BotId, limit: usize) -> Result<Vec<InboxEntry>> {
        let mut out = self.entries_in(bot, InboxState::Pending);
        out.sort_by_key(|e| e.seq);
        out.truncate(limit);
        Ok(out)
    }

    async fn inbox_pending_chat(
        &self,
        bot: &BotId,
        chat: &str,
        limit: usize,
    ) -> Result<Vec<InboxEntry>> {
        let mut out = self.entries_in(bot, InboxState::Pending);
        out.retain(|e| e.chat == chat);
        out.sort_by_key(|e| e.seq);
        out.truncate(limit);
        Ok(out)
    }

    async fn inbox_stats(&self) -> Result<HashMap<BotId, InboxStats>> {
        let st = self.st();
        let mut out = HashMap::new();
        for (bot, entries) in &st.inbox {
            let mut s = InboxStats::default();
            for (e, _) in entries.values() {
                match e.state {
                    InboxState::Pending => s.pending += 1,
                    InboxState::Undeliverable => s.undeliverable += 1,
                    InboxState::Done | InboxState::Paused => {}
                }
                let held = st
                    .held
                    .get(&(bot.clone(), e.key.clone()))
                    .is_some_and(|h| h.until_ms.is_some());
                if held && e.state == InboxState::Pending {
                    s.held += 1;
                }
                if e.key.starts_with(crate::SEND_KEY_PREFIX) {
                    match e.state {
                        InboxState::Pending | InboxState::Paused => s.sends.queued += 1,
                        InboxState::Done => s.sends.sent += 1,
                        InboxState::Undeliverable => s.sends.failed += 1,
                    }
                }
            }
            if s != InboxStats::default() {
                out.insert(bot.clone(), s);
            }
        }
        let now = botfleet_core::unix_ms();
        for ((bot, _), p) in &st.pauses {
            if !p.in_effect(now) {
                continue;
            }
            if let Ok(bot) = BotId::new(bot.clone()) {
                out.entry(bot).or_default().paused_chats += 1;
            }
        }
        Ok(out)
    }

    async fn inbox_undeliverable(&self, bot: &BotId, limit: usize) -> Result<Vec<InboxEntry>> {
        let mut out = self.entries_in(bot, InboxState::Undeliverable);
        out.sort_by_key(|e| std::cmp::Reverse(e.seq));
        out.truncate(limit);
        Ok(out)
    }

    async fn session_write(
        &self,
        bot: &BotId,
        writes: &[crate::SessionWrite],
        fence: Fence,
    ) -> Result<()> {
        let mut st = self.st();
        st.check_fence(bot, fence)?;
        let recs = st.sessions.entry(bot.clone()).or_default();
        for w in writes {
            match w {
                crate::SessionWrite::Put { kind, key, value } => {
                    recs.insert((kind.clone(), key.clone()), value.clone());
                }
                crate::SessionWrite::Delete { kind, key } => {
                    recs.remove(&(kind.clone(), key.clone()));
                }
            }
        }
        Ok(())
    }

    async fn session_records(&self, bot: &BotId, kind: &str) -> Result<Vec<(String, Vec<u8>)>> {
        Ok(self
            .st()
            .sessions
            .get(bot)
            .map(|recs| {
                recs.iter()
                    .filter(|((k, _), _)| k == kind)
                    .map(|((_, key), v)| (key.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn fleet_secret(&self, name: &str, fresh: &[u8]) -> Result<Vec<u8>> {
        Ok(self
            .st()
            .secrets
            .entry(name.to_owned())
            .or_insert_with(|| fresh.to_vec())
            .clone())
    }

    async fn session_record(&self, bot: &BotId, kind: &str, key: &str) -> Result<Option<Vec<u8>>> {
        Ok(self
            .st()
            .sessions
            .get(bot)
            .and_then(|recs| recs.get(&(kind.to_owned(), key.to_owned())))
            .cloned())
    }

    async fn session_clear(&self, bot: &BotId, fence: Fence) -> Result<()> {
        let mut st = self.st();
        st.check_fence(bot, fence)?;
        st.sessions.remove(bot);
        Ok(())
    }

    async fn journal_put(
        &self,
        bot: &BotId,
        items: &[InboxItem],
        fence: Option<Fence>,
        view: Option<usize>,
    ) -> Result<(Vec<crate::Journaled>, Option<TurnView>)> {
        let new = {
            let mut st = self.st();
            if let Some(fence) = fence {
                st.check_fence(bot, fence)?;
            }
            // Arrival time in µs, above the bot's last: one writer here either way.
            let mut seq = st
                .inbox
                .get(bot)
                .and_then(|i| i.values().map(|(e, _)| e.seq).max())
                .unwrap_or(0);
            st.record(bot, items, || {
                seq = (seq + 1).max(crate::turns::arrival_seq().max(0).unsigned_abs());
                seq
            })
        };
        let view = match view.and_then(|i| items.get(i)) {
            Some(it) => Some(self.turn_view(bot, &it.key, &it.chat).await?),
            None => None,
        };
        Ok((new, view))
    }

    async fn chat_events(
        &self,
        bot: &BotId,
        chat: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<crate::ChatEvent>> {
        let st = self.st();
        let Some(log) = st.logs.get(&(bot.clone(), chat.to_owned())) else {
            return Ok(Vec::new());
        };
        let inbox = st.inbox.get(bot);
        let events = log
            .range(after.saturating_add(1)..)
            .filter_map(|(n, it)| match it {
                Logged::Entry(key) => {
                    let (e, _) = inbox?.get(key)?;
                    Some(crate::ChatEvent {
                        n: *n,
                        kind: match e.kind() {
                            crate::EntryKind::Event => crate::ChatEventKind::Received,
                            crate::EntryKind::Send => crate::ChatEventKind::Send,
                        },
                        entry: key.clone(),
                        body: e.message.clone(),
                        state: Some(e.state),
                        at_ms: e.received_at_ms,
                    })
                }
                Logged::Said(entry, body, at) => Some(crate::ChatEvent {
                    n: *n,
                    kind: crate::ChatEventKind::Said,
                    entry: entry.clone(),
                    body: body.clone(),
                    state: None,
                    at_ms: *at,
                }),
            })
            .take(limit.min(crate::MAX_CHAT_EVENTS))
            .collect();
        Ok(events)
    }

    async fn turn_view(&self, bot: &BotId, key: &str, chat: &str) -> Result<TurnView> {
        let st = self.st();
        let entry = st
            .inbox
            .get(bot)
            .and_then(|i| i.get(key))
            .map(|(e, _)| e.clone());
        let (revision, state) = st
            .chats
            .get(&(bot.clone(), chat.to_owned()))
            .map_or((0, None), |(r, _, s)| (*r, s.clone()));
        let sent = st
            .outbox
            .get(bot)
            .is_some_and(|o| o.contains_key(&reply_key(key)));
        let held_until_ms = st
            .held
            .get(&(bot.clone(), key.to_owned()))
            .and_then(|h| h.until_ms);
        let paused = st
            .pauses
            .get(&(bot.base().to_owned(), chat.to_owned()))
            .is_some_and(|p| p.in_effect(botfleet_core::unix_ms()));
        let last_in_ms = st
            .heads
            .get(&(bot.base().to_owned(), chat.to_owned()))
            .and_then(|h| h.1);
        Ok(TurnView {
            entry,
            state,
            revision,
            sent,
            held_until_ms,
            paused,
            last_in_ms,
        })
    }

    async fn chat_seen(&self, bot: &BotId, seen: &[(String, i64)]) -> Result<()> {
        let mut st = self.st();
        for (chat, at_ms) in seen {
            let at_ms = *at_ms;
            let (_, last_in) = st
                .heads
                .entry((bot.base().to_owned(), chat.clone()))
                .or_default();
            *last_in = (*last_in).max(Some(at_ms));
        }
        Ok(())
    }

    async fn chat_pause(&self, bot: &BotId, pause: &crate::ChatPause) -> Result<()> {
        let mut p = pause.clone();
        let mut st = self.st();
        let slot = (bot.base().to_owned(), pause.chat.clone());
        // Paused again while paused: it is still the same pause (its replay goes back to
        // when it began).
        if let Some(was) = st.pauses.get(&slot).filter(|w| w.in_effect(p.paused_at_ms)) {
            p.paused_at_ms = was.paused_at_ms;
        }
        st.pauses.insert(slot, p);
        Ok(())
    }

    async fn chat_resume(&self, bot: &BotId, chat: &str, replay: bool) -> Result<crate::Resumed> {
        let mut st = self.st();
        let now = botfleet_core::unix_ms();
        let Some(pause) = st.pauses.remove(&(bot.base().to_owned(), chat.to_owned())) else {
            return Ok(crate::Resumed::default());
        };
        let mut replayed = Vec::new();
        if replay {
            for (unit, entries) in &mut st.inbox {
                if unit.base() != bot.base() {
                    continue;
                }
                for (e, finished) in entries.values_mut() {
                    if e.chat == chat
                        && e.state == InboxState::Paused
                        && finished.is_some_and(|t| t >= pause.paused_at_ms)
                    {
                        e.state = InboxState::Pending;
                        *finished = None;
                        replayed.push((e.seq, unit.clone(), e.key.clone()));
                    }
                }
            }
        }
        replayed.sort();
        Ok(crate::Resumed {
            pause: Some(pause).filter(|p| p.in_effect(now)),
            replayed: replayed.into_iter().map(|(_, u, k)| (u, k)).collect(),
        })
    }

    async fn chat_pauses(&self, bot: &BotId) -> Result<Vec<crate::ChatPause>> {
        let now = botfleet_core::unix_ms();
        Ok(self
            .st()
            .pauses
            .iter()
            .filter(|((b, _), p)| b == bot.base() && p.in_effect(now))
            .map(|(_, p)| p.clone())
            .collect())
    }

    async fn turn_hold(&self, bot: &BotId, hold: &crate::TurnHold) -> Result<Option<i64>> {
        let mut st = self.st();
        st.check_turn(bot, &hold.chat, hold.fence)?;
        let pending = st
            .inbox
            .get(bot)
            .and_then(|i| i.get(&hold.key))
            .is_some_and(|(e, _)| e.state == InboxState::Pending);
        if !pending {
            return Ok(None);
        }
        let h = st.held.entry((bot.clone(), hold.key.clone())).or_default();
        Ok(Some(*h.until_ms.get_or_insert(hold.until_ms)))
    }

    async fn reply_post(&self, bot: &BotId, post: &crate::ReplyPost) -> Result<crate::PostAnswer> {
        use crate::PostAnswer;
        let mut st = self.st();
        let now = botfleet_core::unix_ms();
        let pending = match st.inbox.get(bot).and_then(|i| i.get(&post.key)) {
            None => return Ok(PostAnswer::Unknown),
            Some((e, _)) => e.state == InboxState::Pending,
        };
        let (key, digest) = (
            crate::held::digest(&post.idempotency_key),
            crate::held::digest(&post.body),
        );
        let h = st.held.entry((bot.clone(), post.key.clone())).or_default();
        if let Some((seq, _, d, _)) = h.parts.iter().find(|(_, k, _, _)| *k == key) {
            return Ok(crate::held::answer_again(*seq, d, &digest));
        }
        if !pending || h.closed || h.until_ms.is_some_and(|u| u <= now) {
            return Ok(PostAnswer::Ended);
        }
        h.posts += 1;
        h.closed = post.last;
        let part = crate::PostedReply {
            seq: h.posts,
            body: post.body.clone(),
            last: post.last,
            posted_at_ms: now,
        };
        h.parts.push((h.posts, key, digest, part));
        Ok(PostAnswer::Accepted(h.posts))
    }

    async fn replies_since(&self, since_ms: i64) -> Result<Vec<(BotId, String, u64)>> {
        Ok(self
            .st()
            .held
            .iter()
            .filter_map(|((bot, key), h)| {
                h.parts
                    .iter()
                    .filter(|(.., p)| p.posted_at_ms >= since_ms)
                    .map(|(seq, ..)| *seq)
                    .max()
                    .map(|seq| (bot.clone(), key.clone(), seq))
            })
            .collect())
    }

    async fn posted_replies(
        &self,
        bot: &BotId,
        key: &str,
        after_seq: u64,
    ) -> Result<Vec<crate::PostedReply>> {
        Ok(self
            .st()
            .held
            .get(&(bot.clone(), key.to_owned()))
            .map(|h| {
                h.parts
                    .iter()
                    .filter(|(seq, ..)| *seq > after_seq)
                    .map(|(.., p)| p.clone())
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn turn_accept(&self, bot: &BotId, chat: &str, fence: Fence) -> Result<()> {
        let mut st = self.st();
        let row = st
            .chats
            .entry((bot.clone(), chat.to_owned()))
            .or_insert((0, Fence::ZERO, None));
        if row.1 > fence {
            return Err(StoreError::StaleFence {
                bot: bot.clone(),
                offered: fence,
                current: row.1,
            });
        }
        row.1 = fence;
        Ok(())
    }

    async fn turn_record(&self, bot: &BotId, rec: &TurnRecord) -> Result<StateWrite> {
        let mut st = self.st();
        let now = botfleet_core::unix_ms();
        let (fence, claim) = (rec.fence.fence(), rec.fence.claim().is_some());
        if let Some(f) = rec.fence.claim() {
            st.check_fence(bot, f)?;
        }
        if rec.outcome == crate::InboxOutcome::Paused {
            let paused = st
                .pauses
                .get(&(bot.base().to_owned(), rec.chat.clone()))
                .is_some_and(|p| p.in_effect(now));
            let superseded = !claim
                && st
                    .chats
                    .get(&(bot.clone(), rec.chat.clone()))
                    .is_some_and(|(_, f, _)| *f > fence);
            if !paused && !superseded {
                return Ok(StateWrite::Unpaused);
            }
        }
        // A claim's turn ends its entry in this same write: the entry's end is its outbox
        // record (see the SQL backends).
        if rec.sent && !claim {
            st.outbox
                .entry(bot.clone())
                .or_default()
                .entry(reply_key(&rec.key))
                .or_insert((fence, now));
        }
        let mut written = StateWrite::Unchanged;
        if let Some((expected, state)) = &rec.state {
            let row =
                st.chats
                    .entry((bot.clone(), rec.chat.clone()))
                    .or_insert((0, Fence::ZERO, None));
            if (!claim && row.1 > fence) || row.0 != *expected {
                written = StateWrite::Stale;
            } else {
                // A claim's turn leaves the chat's own fence as it was.
                let kept = if claim { row.1 } else { fence };
                *row = (expected + 1, kept, Some(state.clone()));
                written = StateWrite::Written(expected + 1);
            }
        }
        // A chat turn superseded by a newer one leaves the entry to that one.
        let superseded = !claim
            && st
                .chats
                .get(&(bot.clone(), rec.chat.clone()))
                .is_some_and(|(_, f, _)| *f > fence);
        let mut ended = false;
        if let Some((entry, finished)) = st
            .inbox
            .get_mut(bot)
            .and_then(|i| i.get_mut(&rec.key))
            .filter(|_| !superseded)
        {
            if entry.state == InboxState::Pending {
                let (state, _) = crate::turns::outcome_parts(&rec.outcome);
                entry.state = state.parse().unwrap_or(InboxState::Done);
                entry.error = rec.error();
                *finished = Some(now);
                ended = true;
            }
        }
        if ended {
            let said = rec
                .said
                .iter()
                .map(|b| Logged::Said(rec.key.clone(), b.clone(), now));
            let State { heads, logs, .. } = &mut *st;
            log_into(heads, logs, bot, &rec.chat, said);
        }
        if !superseded {
            for (name, value) in &rec.refs {
                st.refs.insert(
                    (bot.clone(), rec.chat.clone(), name.clone()),
                    (value.clone(), now + crate::REFS_TTL_MS),
                );
            }
        }
        Ok(written)
    }

    async fn turn_step(&self, bot: &BotId, step: &crate::TurnStep) -> Result<()> {
        let mut st = self.st();
        st.check_turn(bot, &step.chat, step.fence)?;
        st.progress.insert(
            (bot.clone(), step.key.clone()),
            (step.progress.clone(), botfleet_core::unix_ms()),
        );
        Ok(())
    }

    async fn turn_progress(&self, bot: &BotId, key: &str) -> Result<Option<String>> {
        Ok(self
            .st()
            .progress
            .get(&(bot.clone(), key.to_owned()))
            .map(|(p, _)| p.clone()))
    }

    async fn refs_get(
        &self,
        bot: &BotId,
        chat: &str,
        names: &[String],
    ) -> Result<Vec<Option<String>>> {
        let st = self.st();
        let now = botfleet_core::unix_ms();
        Ok(names
            .iter()
            .map(|n| {
                st.refs
                    .get(&(bot.clone(), chat.to_owned(), n.clone()))
                    .filter(|(_, exp)| *exp > now)
                    .map(|(v, _)| v.clone())
            })
            .collect())
    }

    async fn inbox_prune(&self, done_before_ms: i64, undeliverable_before_ms: i64) -> Result<u64> {
        let mut st = self.st();
        let mut gone = 0;
        let sends_before = botfleet_core::unix_ms() - crate::SEND_KEEP_MS;
        for entries in st.inbox.values_mut() {
            entries.retain(|_, (e, finished)| {
                let keep = match (e.state, *finished) {
                    (InboxState::Done, Some(t)) => t >= done_before_ms,
                    (InboxState::Undeliverable | InboxState::Paused, Some(t)) => {
                        t >= undeliverable_before_ms
                    }
                    _ => true,
                } || (e.kind() == crate::EntryKind::Send
                    && finished.is_some_and(|t| t >= sends_before));
                if !keep {
                    gone += 1;
                }
                keep
            });
        }
        for sent in st.outbox.values_mut() {
            sent.retain(|_, (_, at)| *at >= done_before_ms);
        }
        st.progress.retain(|_, (_, at)| *at >= done_before_ms);
        let State { held, inbox, .. } = &mut *st;
        held.retain(|(bot, key), h| {
            let pending = inbox
                .get(bot)
                .and_then(|i| i.get(key))
                .is_some_and(|(e, _)| e.state == InboxState::Pending);
            if !pending {
                h.parts.retain(|(.., p)| p.posted_at_ms >= done_before_ms);
            }
            // The counters go with the entry.
            inbox.get(bot).is_some_and(|i| i.contains_key(key))
        });
        let now = botfleet_core::unix_ms();
        st.refs.retain(|_, (_, exp)| *exp > now);
        let State { logs, inbox, .. } = &mut *st;
        for ((bot, _), log) in logs.iter_mut() {
            let kept = |key: &String| inbox.get(bot).is_some_and(|i| i.contains_key(key));
            log.retain(|_, it| match it {
                Logged::Entry(key) => kept(key),
                Logged::Said(entry, _, at) => *at >= done_before_ms || kept(entry),
            });
        }
        Ok(gone)
    }
}
