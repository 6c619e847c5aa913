//! A bot's session records (a linked WhatsApp device) over the store, under the claim's
//! fence: what a platform client keeps between connections moves with the bot.

use std::sync::Arc;

use crate::{SessionWrite, Store, StoreError};
use async_trait::async_trait;
use botfleet_core::{BotId, Fence};
use botfleet_platform::{KvWrite, SessionError, SessionKv};

/// [`SessionKv`] over [`Store::session_write`] and friends, for one bot under one fence.
#[derive(Debug, Clone)]
pub struct StoreSession {
    store: Arc<dyn Store>,
    bot: BotId,
    fence: Fence,
}

impl StoreSession {
    /// The session of `bot`, written under `fence` (the claim's).
    pub fn new(store: Arc<dyn Store>, bot: BotId, fence: Fence) -> Self {
        Self { store, bot, fence }
    }

    /// The session of `bot` for a writer outside any claim (`bots link`): under a new fence
    /// above every one granted so far, which the store takes first. From then on an earlier
    /// writer — a worker that ran the bot, a link of it started before — is refused, and the
    /// bot's next claim is granted above it. The fence steps up by a jittered amount, so that
    /// two links started at the same moment almost never share one.
    ///
    /// # Errors
    /// `StaleFence` when a higher fence was taken meanwhile (another link); backend failures.
    pub async fn above_all(store: Arc<dyn Store>, bot: BotId) -> Result<Self, StoreError> {
        let jitter = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::from(d.subsec_nanos()) % 65_536);
        let fence = Fence(store.highest_fence(&bot).await?.0 + 1 + jitter);
        store.accept_fence(&bot, fence).await?;
        Ok(Self::new(store, bot, fence))
    }

    /// The fence this session writes under.
    pub fn fence(&self) -> Fence {
        self.fence
    }
}

fn err(e: StoreError) -> SessionError {
    match e {
        StoreError::StaleFence { .. } => SessionError::Stale,
        e => SessionError::Store(e.to_string()),
    }
}

#[async_trait]
impl SessionKv for StoreSession {
    async fn write(&self, writes: Vec<KvWrite>) -> Result<(), SessionError> {
        let writes: Vec<SessionWrite> = writes
            .into_iter()
            .map(|w| match w {
                KvWrite::Put(kind, key, value) => SessionWrite::Put { kind, key, value },
                KvWrite::Delete(kind, key) => SessionWrite::Delete { kind, key },
            })
            .collect();
        self.store
            .session_write(&self.bot, &writes, self.fence)
            .await
            .map_err(err)
    }

    async fn get(&self, kind: &str, key: &str) -> Result<Option<Vec<u8>>, SessionError> {
        self.store
            .session_record(&self.bot, kind, key)
            .await
            .map_err(err)
    }

    async fn load(&self, kind: &str) -> Result<Vec<(String, Vec<u8>)>, SessionError> {
        self.store
            .session_records(&self.bot, kind)
            .await
            .map_err(err)
    }

    async fn clear(&self) -> Result<(), SessionError> {
        self.store
            .session_clear(&self.bot, self.fence)
            .await
            .map_err(err)
    }
}
