//! Sends from the backend: a message to a chat that no inbound message started (a person
//! answering from a desk, a finished job, a reminder). Each is a journal entry of its chat,
//! of kind `send`, keyed by the client's `Idempotency-Key`, and runs in the chat's turn like
//! an inbound message, on the worker that holds the turn (`turn::run_send` runs its actions
//! without a handler):
//!
//! ```text
//! webhook bot:   journal and a turn ticket, on any worker → its turn, after the chat's
//!                earlier tickets (here, or taken over from a worker that died)
//! connector bot: journal, on any worker → a nudge to the unit's owner (a worker command,
//!                or this worker's own mailbox) → its bot task queues the entry behind the
//!                chat's messages
//! ```
//!
//! The journal comes first and is all that counts: a nudge lost (the owner died, the unit
//! moved) leaves the entry pending, and whoever claims the unit next replays it. A repeat of
//! a key finds the entry the first one made and journals nothing.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use botfleet_coord::{Coordinator, WorkerCommand};
use botfleet_core::{BotId, BotSpec, Platform, WorkerId};
use botfleet_platform::{Connector, ErrorKind};
use botfleet_store::{send_key, InboxItem, InboxState, Store, StoreError};
use tokio::sync::Notify;
use tracing::debug;

/// Why a send was not accepted: nothing was recorded, and a retry with the same key is safe.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The store could not journal it.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The chat's turn queue could not be joined (the coordinator is unreachable).
    #[error("cannot join the chat's turn queue: {0}")]
    Coordinator(String),
    /// The key was used before for another chat or body: the first send stands.
    #[error("this Idempotency-Key was used for another send to this bot")]
    KeyReused,
    /// The platform knows no such chat (or the bot cannot see it): a bot in slices asks it
    /// where a chat's events come from.
    #[error("the platform knows no such chat: {0}")]
    UnknownChat(String),
    /// The platform could not say where the chat's events come from (a bot in slices).
    #[error("cannot ask the platform where the chat is: {0}")]
    Platform(String),
}

/// A send from the backend as its client sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SendStatus {
    /// Its id: what [`Sends::submit`] and the API answer for it.
    pub id: String,
    /// `queued` (waiting for, or in, its chat's turn), `sent`, or `failed`.
    pub status: &'static str,
    /// The platform's ids of the messages it sent, in order.
    pub platform_ids: Vec<String>,
    /// Why it failed (what the platform or the fleet refused).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What [`Sends::submit`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    /// The unit whose journal holds the entry (the bot, or for a bot in slices its chat's slice).
    pub unit: BotId,
    /// The entry's key: `send:` and the hashed `Idempotency-Key`.
    pub key: String,
    /// False when the key was known: the send it made first is the one that counts.
    pub new: bool,
}

impl Submitted {
    /// The send's id for its client: the key without its `send:` prefix.
    pub fn id(&self) -> &str {
        self.key
            .strip_prefix(botfleet_store::SEND_KEY_PREFIX)
            .unwrap_or(&self.key)
    }
}

/// Sends from the backend through this worker. Cheap to clone.
#[derive(Clone)]
pub struct Sends {
    inner: Arc<Inner>,
}

struct Inner {
    me: WorkerId,
    store: Arc<dyn Store>,
    coord: Arc<dyn Coordinator>,
    connectors: HashMap<Platform, Arc<dyn Connector>>,
    hooks: Option<crate::Hooks>,
    mailboxes: Arc<Mailboxes>,
}

impl Sends {
    pub(crate) fn new(
        me: WorkerId,
        store: Arc<dyn Store>,
        coord: Arc<dyn Coordinator>,
        connectors: HashMap<Platform, Arc<dyn Connector>>,
        hooks: Option<crate::Hooks>,
        mailboxes: Arc<Mailboxes>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                me,
                store,
                coord,
                connectors,
                hooks,
                mailboxes,
            }),
        }
    }

    /// Journals `body` (a handler's answer: `{"text"}` or `{"actions": [...]}`) as a send
    /// to `chat` of `spec`'s bot under `idempotency_key`, and gets it into the chat's turn
    /// queue wherever that is held. Once this answers, the send is recorded: it goes out
    /// once, in the chat's order, whichever worker dies meanwhile.
    ///
    /// # Errors
    /// [`SendError`] when the entry could not be recorded: nothing was accepted, and a retry
    /// with the same key is safe.
    pub async fn submit(
        &self,
        spec: &BotSpec,
        chat: &str,
        idempotency_key: &str,
        body: &str,
    ) -> Result<Submitted, SendError> {
        let i = &self.inner;
        let item = InboxItem {
            key: send_key(idempotency_key),
            chat: chat.to_owned(),
            message: body.to_owned(),
        };
        let unit = self.unit_for(spec, chat).await?;
        if spec.is_sliced() {
            // The key may be known on another slice (another chat's): the first send stands.
            for other in spec.unit_ids().into_iter().filter(|u| *u != unit) {
                if let Some(first) = i.store.inbox_entry(&other, &item.key).await? {
                    if !repeats(&first, &item) {
                        return Err(SendError::KeyReused);
                    }
                    return Ok(Submitted {
                        unit: other,
                        key: item.key,
                        new: false,
                    });
                }
            }
        }
        let webhook = self.is_webhook(spec);
        // A webhook bot's send takes its chat's ticket here (without hooks here, a worker's
        // sweeper serves it); a connector bot's is journaled, and its owner told.
        let new = match i.hooks.as_ref().filter(|_| webhook) {
            Some(h) => h.inject(Arc::new(spec.clone()), &item).await?,
            None => {
                let (new, _) = i
                    .store
                    .journal_put(&unit, std::slice::from_ref(&item), None, None)
                    .await?;
                new.first().is_some_and(|n| n.is_new())
            }
        };
        if !new {
            // A repeat: the same send, or a key reused for another.
            let first = i.store.inbox_entry(&unit, &item.key).await?;
            if !first.is_some_and(|e| repeats(&e, &item)) {
                return Err(SendError::KeyReused);
            }
        }
        if !webhook {
            self.nudge(&unit, &item.chat).await;
        }
        Ok(Submitted {
            unit,
            key: item.key,
            new,
        })
    }

    /// Gets the entries of `chat` of `spec`'s bot made pending again (`(unit, key)`, oldest
    /// first: a paused chat resumed with a replay,
    /// [`Store::chat_resume`](botfleet_store::Store::chat_resume)) answered in their chat's
    /// turns: a webhook bot's take tickets here, a connector bot's owner is told. Whatever
    /// cannot be told now is still answered: by the sweeper (webhook bots) or by the unit's
    /// next claim.
    pub async fn replayed(&self, spec: &BotSpec, chat: &str, entries: &[(BotId, String)]) {
        let i = &self.inner;
        let webhook = self.is_webhook(spec);
        let mut units: Vec<&BotId> = entries.iter().map(|(u, _)| u).collect();
        units.sort();
        units.dedup();
        for unit in units {
            match i.hooks.as_ref().filter(|_| webhook) {
                Some(h) => {
                    let keys: Vec<String> = entries
                        .iter()
                        .filter(|(u, _)| u == unit)
                        .map(|(_, k)| k.clone())
                        .collect();
                    h.replay(Arc::new(spec.clone()), unit, chat, &keys).await;
                }
                None if webhook => {} // the sweeper's
                None => self.nudge(unit, chat).await,
            }
        }
    }

    /// Whether `spec`'s bot takes its events through webhooks (its chats' turns are tickets).
    fn is_webhook(&self, spec: &BotSpec) -> bool {
        self.inner
            .connectors
            .get(&spec.platform)
            .is_some_and(|c| c.descriptor().is_webhook(spec))
    }

    /// The send `id` of `spec`'s bot (what [`Submitted::id`] answered), if it is known
    /// (sends are kept 24 hours after they end).
    ///
    /// # Errors
    /// The store's.
    pub async fn status(&self, spec: &BotSpec, id: &str) -> Result<Option<SendStatus>, StoreError> {
        if id.len() != 64 || !id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Ok(None);
        }
        let i = &self.inner;
        let key = format!("{}{id}", botfleet_store::SEND_KEY_PREFIX);
        // A bot in slices journals each send on the slice of its chat.
        let mut found = None;
        for unit in spec.unit_ids() {
            if let Some(e) = i.store.inbox_entry(&unit, &key).await? {
                found = Some((unit, e));
                break;
            }
        }
        let Some((unit, e)) = found else {
            return Ok(None);
        };
        let platform_ids: Vec<String> = if e.state == InboxState::Pending {
            Vec::new()
        } else {
            let name = crate::turn::sent_name(&key);
            i.store
                .refs_get(&unit, &e.chat, &[name])
                .await?
                .into_iter()
                .flatten()
                .next()
                .and_then(|v| serde_json::from_str(&v).ok())
                .unwrap_or_default()
        };
        let (status, reason) = match e.state {
            // (A send is never paused.)
            InboxState::Pending | InboxState::Paused => ("queued", None),
            InboxState::Undeliverable => ("failed", e.error),
            // Done, though nothing went out: every action was refused.
            InboxState::Done if platform_ids.is_empty() && e.error.is_some() => ("failed", e.error),
            InboxState::Done => ("sent", None),
        };
        Ok(Some(SendStatus {
            id: id.to_owned(),
            status,
            platform_ids,
            reason,
        }))
    }

    /// The unit whose turns answer `chat`: the bot, or for a bot in slices the slice running
    /// the shard that `chat`'s events come on (so a send takes its place behind the chat's
    /// messages, and finds the refs its turns gave).
    async fn unit_for(&self, spec: &BotSpec, chat: &str) -> Result<BotId, SendError> {
        let (Some(total), Some(k)) = (
            spec.shard_total(),
            spec.options.shards_per_slice.filter(|k| *k > 0),
        ) else {
            return Ok(spec.id.clone());
        };
        let Some(c) = self.inner.connectors.get(&spec.platform) else {
            return Ok(spec.id.slice(0));
        };
        match c.shard_of_chat(spec, chat, total).await {
            Ok(shard) => Ok(spec.id.slice(shard.unwrap_or(0) / k)),
            Err(e) if e.kind() == ErrorKind::Rejected => Err(SendError::UnknownChat(e.to_string())),
            Err(e) => Err(SendError::Platform(e.to_string())),
        }
    }

    /// Tells the unit's owner, if it has a live one, that `chat` has an entry journaled.
    async fn nudge(&self, unit: &BotId, chat: &str) {
        let i = &self.inner;
        let owner = match i.coord.owner(unit).await {
            Ok(Some(o)) if o.live => o.worker,
            // Nobody runs it now: whoever claims it replays the entry.
            Ok(_) => return,
            Err(e) => {
                debug!(bot = %unit, error = %e, "cannot read the unit's owner; its next claim replays the send");
                return;
            }
        };
        if owner == i.me {
            i.mailboxes.post(unit, chat);
            return;
        }
        let cmd = WorkerCommand::Inbox {
            bot: unit.clone(),
            chat: chat.to_owned(),
        };
        if let Err(e) = i.coord.send_command(&owner, &cmd).await {
            debug!(bot = %unit, error = %e, "cannot tell the unit's owner about a send; its next claim replays it");
        }
    }
}

/// Whether `first`, the entry a send's key names already, is that very send again (the same
/// chat and body), not the key reused for another.
fn repeats(first: &botfleet_store::InboxEntry, item: &InboxItem) -> bool {
    first.chat == item.chat && same_body(&first.message, &item.message)
}

/// Whether two send bodies say the same (as JSON values: spacing and key order aside).
fn same_body(a: &str, b: &str) -> bool {
    match (
        serde_json::from_str::<serde_json::Value>(a),
        serde_json::from_str::<serde_json::Value>(b),
    ) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// The mailboxes of the units whose bot tasks run on this worker: where entries journaled
/// elsewhere reach them.
#[derive(Default, Debug)]
pub(crate) struct Mailboxes {
    open: Mutex<HashMap<BotId, Arc<Mailbox>>>,
}

/// One unit's mailbox: the chats with entries posted, and a wake-up for its task.
#[derive(Default, Debug)]
pub(crate) struct Mailbox {
    chats: Mutex<Vec<String>>,
    notify: Notify,
}

impl Mailboxes {
    /// Opens the mailbox of `unit` for its bot task, until the guard is dropped.
    pub(crate) fn open(self: &Arc<Self>, unit: &BotId) -> MailboxGuard {
        let mb = Arc::new(Mailbox::default());
        lock(&self.open).insert(unit.clone(), mb.clone());
        MailboxGuard {
            boxes: self.clone(),
            unit: unit.clone(),
            mailbox: mb,
        }
    }

    /// Tells `unit`'s task, if it runs here, that `chat` has entries journaled elsewhere
    /// (dropped otherwise: they are in the journal for whoever runs the unit). The task
    /// reads the chat's pending entries and queues those it has not, in the journal's order,
    /// so a nudge that overtakes another cannot reorder the sends.
    pub(crate) fn post(&self, unit: &BotId, chat: &str) {
        let Some(mb) = lock(&self.open).get(unit).cloned() else {
            return;
        };
        {
            let mut chats = lock(&mb.chats);
            if !chats.iter().any(|c| c == chat) {
                chats.push(chat.to_owned());
            }
        }
        mb.notify.notify_one();
    }
}

/// A unit's open mailbox, closed when dropped.
pub(crate) struct MailboxGuard {
    boxes: Arc<Mailboxes>,
    unit: BotId,
    mailbox: Arc<Mailbox>,
}

impl MailboxGuard {
    /// When something was posted.
    pub(crate) async fn posted(&self) {
        self.mailbox.notify.notified().await;
    }

    /// The chats posted since the last take, in order.
    pub(crate) fn take(&self) -> Vec<String> {
        std::mem::take(&mut *lock(&self.mailbox.chats))
    }

    /// Posts `chat` again in a second (its entries could not be read now).
    pub(crate) fn again_later(&self, chat: String) {
        let mb = self.mailbox.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            lock(&mb.chats).push(chat);
            mb.notify.notify_one();
        });
    }
}

impl Drop for MailboxGuard {
    fn drop(&mut self) {
        let mut open = lock(&self.boxes.open);
        // A newer task's box (the unit claimed again here) stays.
        if open
            .get(&self.unit)
            .is_some_and(|m| Arc::ptr_eq(m, &self.mailbox))
        {
            open.remove(&self.unit);
        }
    }
}
