//! What a worker's turns share for answers that come later (a handler that answers `202`):
//! the fleet's reply-token key, read once, the worker's time to live of a held turn, and
//! what wakes a held turn when a part of its answer is posted.
//!
//! A part posted through this worker wakes its turn at once when the turn is held here. Parts
//! posted through other workers are found by one store query per [`POLL_EVERY`] for all the
//! turns held here ([`Store::replies_since`]), made only while some are held: a thousand held
//! turns cost one query per interval, none per turn. A turn waits for its wake-up in its own
//! task ([`Later::watch`]), or is kept as data — by its bot's chat queues, or for a webhook
//! bot by the worker's lot of held turns —, which are told which of their turns to look at
//! ([`Later::watch_into`], [`Posted`]).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use botfleet_core::BotId;
use botfleet_store::{Store, StoreError};
use tokio::sync::Notify;
use tracing::debug;

/// How often a worker holding turns looks for parts posted through other workers.
pub(crate) const POLL_EVERY: Duration = Duration::from_millis(250);

/// How far back each look reaches, beyond the last: the workers' clocks may differ by this
/// much and a part is still found.
const CLOCK_SLACK_MS: i64 = 5_000;

/// A held turn's entry, as a hash of its bot and key: what a watch costs is a number, not
/// two strings. The hash is keyed per worker and 64 bits wide: two entries held on one
/// worker that hash alike are not expected (a wake-up shared by two would only make one look
/// for nothing; two turns of one bot would share one place in its chat queues).
pub(crate) type EntryOf = u64;

/// The worker's side of answers that come later (cheap to clone).
#[derive(Clone)]
pub(crate) struct Later {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    /// `--async-reply-ttl-s`: a bot's own `async_reply_ttl_s` overrides it.
    ttl: Duration,
    key: tokio::sync::OnceCell<Vec<u8>>,
    /// Hashes entries (keyed per worker: no one can choose entries that hash alike).
    hasher: std::collections::hash_map::RandomState,
    // std Mutex: one map operation at a time, never across .await.
    held: Mutex<Held>,
}

/// The turns held on this worker and what wakes them.
#[derive(Default)]
struct Held {
    /// Each held entry: what wakes it.
    watched: HashMap<EntryOf, Watched>,
    /// Whether the poller runs.
    polling: bool,
}

/// What wakes a held entry.
struct Watched {
    /// A turn waiting in its own task, when one is.
    notify: Option<Arc<Notify>>,
    /// The chat queues (or the lot of held webhook turns) keeping the turn as data, when
    /// they are.
    posted: Option<Arc<Posted>>,
    /// How many of its watchers take their wake-ups through `posted`.
    into: usize,
    /// How many turns watch it.
    watchers: usize,
    /// The latest part number woken for.
    woken: u64,
}

impl Watched {
    fn wake(&self, entry: EntryOf) {
        if let Some(n) = &self.notify {
            n.notify_one();
        }
        if let Some(p) = &self.posted {
            p.push(entry);
        }
    }
}

/// The wake-ups of turns kept as data (a bot's chat queues): which of them may have had a
/// part posted.
#[derive(Default)]
pub(crate) struct Posted {
    notify: Notify,
    // std Mutex: one push or take at a time, never across .await.
    entries: Mutex<Vec<EntryOf>>,
}

impl Posted {
    fn push(&self, entry: EntryOf) {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(entry);
        self.notify.notify_one();
    }

    /// The entries woken since the last call (waits for one). Cancel-safe: an entry is taken
    /// only by the call that returns it.
    pub(crate) async fn next(&self) -> Vec<EntryOf> {
        loop {
            self.notify.notified().await;
            let taken =
                std::mem::take(&mut *self.entries.lock().unwrap_or_else(|e| e.into_inner()));
            if !taken.is_empty() {
                return taken;
            }
        }
    }
}

impl std::fmt::Debug for Later {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Later")
            .field("ttl", &self.inner.ttl)
            .finish_non_exhaustive()
    }
}

impl Later {
    /// Reply tokens signed with the fleet's key in `store`; held turns live `ttl` unless their
    /// bot says otherwise.
    pub(crate) fn new(store: Arc<dyn Store>, ttl: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                ttl,
                key: tokio::sync::OnceCell::new(),
                hasher: std::collections::hash_map::RandomState::new(),
                held: Mutex::default(),
            }),
        }
    }

    /// The entry `key` of `bot` as a watch knows it.
    pub(crate) fn entry(&self, bot: &BotId, key: &str) -> EntryOf {
        use std::hash::BuildHasher;
        self.inner.hasher.hash_one((bot.as_str(), key))
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.inner.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Watches the entry `key` of `bot` while the returned guard lives: it is notified when a
    /// part of its answer is posted (through this worker at once, through others within a
    /// poll).
    pub(crate) fn watch(&self, bot: &BotId, key: &str) -> Watch {
        self.watch_as(bot, key, None)
    }

    /// Watches the entry `key` of `bot` while the returned guard lives, for a turn kept as
    /// data: `posted` is told the entry when a part of its answer may have been posted.
    pub(crate) fn watch_into(&self, bot: &BotId, key: &str, posted: &Arc<Posted>) -> Watch {
        self.watch_as(bot, key, Some(posted))
    }

    fn watch_as(&self, bot: &BotId, key: &str, into: Option<&Arc<Posted>>) -> Watch {
        let entry = self.entry(bot, key);
        let (waker, start) = {
            let mut held = self.held();
            let w = held.watched.entry(entry).or_insert_with(|| Watched {
                notify: None,
                posted: None,
                into: 0,
                watchers: 0,
                woken: 0,
            });
            w.watchers += 1;
            let waker = match into {
                Some(p) => {
                    if w.posted.as_ref().is_some_and(|mine| Arc::ptr_eq(mine, p)) {
                        w.into += 1;
                    } else {
                        w.posted = Some(p.clone());
                        w.into = 1;
                    }
                    Waker::Into(p.clone())
                }
                None => Waker::Own(w.notify.get_or_insert_with(Arc::default).clone()),
            };
            let start = !held.polling;
            held.polling = true;
            (waker, start)
        };
        if start {
            let me = self.clone();
            tokio::spawn(async move { me.poll().await });
        }
        Watch {
            later: self.clone(),
            entry,
            waker,
        }
    }

    /// Whether a held turn watches `entry` here.
    pub(crate) fn watched(&self, entry: EntryOf) -> bool {
        self.held().watched.contains_key(&entry)
    }

    /// A part of the entry `key` of `bot` was posted (through this worker).
    pub(crate) fn wake(&self, bot: &BotId, key: &str) {
        let entry = self.entry(bot, key);
        if let Some(w) = self.held().watched.get(&entry) {
            w.wake(entry);
        }
    }

    /// While turns are held here: wakes those whose parts came through other workers.
    async fn poll(self) {
        let mut since = botfleet_core::unix_ms() - CLOCK_SLACK_MS;
        loop {
            tokio::time::sleep(POLL_EVERY).await;
            {
                let mut held = self.held();
                if held.watched.is_empty() {
                    held.polling = false;
                    return;
                }
            }
            let now = botfleet_core::unix_ms();
            match self.inner.store.replies_since(since).await {
                Ok(rows) => {
                    let entries: Vec<_> = rows
                        .into_iter()
                        .map(|(bot, key, seq)| (self.entry(&bot, &key), seq))
                        .collect();
                    let mut held = self.held();
                    for (entry, seq) in entries {
                        if let Some(w) = held.watched.get_mut(&entry) {
                            if seq > w.woken {
                                w.woken = seq;
                                w.wake(entry);
                            }
                        }
                    }
                    since = now - CLOCK_SLACK_MS;
                }
                Err(e) => debug!(error = %e, "cannot look for posted replies; trying again"),
            }
        }
    }

    /// The store the parts are kept in.
    pub(crate) fn store(&self) -> &dyn Store {
        self.inner.store.as_ref()
    }

    /// The worker's time to live of a held turn.
    pub(crate) fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// The fleet's reply-token key (read from the store once, made there by the first worker
    /// that needs it).
    ///
    /// # Errors
    /// The store's failures.
    pub(crate) async fn key(&self) -> Result<&[u8], StoreError> {
        let k = self
            .inner
            .key
            .get_or_try_init(|| crate::reply_token::key(self.inner.store.as_ref()))
            .await?;
        Ok(k.as_slice())
    }
}

/// A held turn's watch of its entry (see [`Later::watch`], [`Later::watch_into`]).
pub(crate) struct Watch {
    later: Later,
    entry: EntryOf,
    waker: Waker,
}

/// Where a watch's wake-ups go.
enum Waker {
    /// Its own (a turn waiting in its task).
    Own(Arc<Notify>),
    /// The chat queues keeping the turn.
    Into(Arc<Posted>),
}

impl Watch {
    /// Resolves when a part may have been posted since the last call (or since the watch
    /// began: a post in between is not missed). Never, for a turn kept as data.
    pub(crate) async fn posted(&self) {
        match &self.waker {
            Waker::Own(n) => n.notified().await,
            Waker::Into(_) => std::future::pending().await,
        }
    }

    /// The entry it watches.
    pub(crate) fn entry(&self) -> EntryOf {
        self.entry
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut held = self.later.held();
        if let Some(w) = held.watched.get_mut(&self.entry) {
            w.watchers -= 1;
            if w.watchers == 0 {
                held.watched.remove(&self.entry);
            } else if let Waker::Into(mine) = &self.waker {
                // Chat queues that let the turn go (a bot's run ending while its next
                // run holds the turn) no longer take its wake-ups; newer ones keep them, and
                // so does another watch into the same place (two held turns of one entry in
                // the lot of held webhook turns, an earlier registration's and this one's).
                if w.posted.as_ref().is_some_and(|p| Arc::ptr_eq(p, mine)) {
                    w.into = w.into.saturating_sub(1);
                    if w.into == 0 {
                        w.posted = None;
                    }
                }
            }
        }
    }
}
