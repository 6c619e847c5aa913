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
