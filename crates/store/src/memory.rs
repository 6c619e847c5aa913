//! An in-memory store: for tests and throwaway runs. Nothing survives the process.

use std::{
    collections::BTreeMap,
    sync::{Mutex, MutexGuard},
};

use async_trait::async_trait;
use botfleet_core::{BotId, BotRecord, BotSpec, BotStatus, Fence};

use crate::{BotFilter, Cursor, Result, Store, StoreError};

#[derive(Debug, Default)]
struct State {
    bots: BTreeMap<BotId, BotRecord>,
    fences: BTreeMap<BotId, (Fence, Option<String>)>,
    sent: BTreeMap<BotId, std::collections::BTreeSet<String>>,
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
            st.sent.remove(id);
        }
        Ok(())
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn add_bot(&self, spec: &BotSpec) -> Result<()> {
        spec.validate()?;
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
        spec.validate()?;
        let mut st = self.st();
        let rec = st
            .bots
            .get_mut(&spec.id)
            .ok_or_else(|| StoreError::NotFound(spec.id.clone()))?;
        rec.spec = spec.clone();
        rec.updated_at_ms = botfleet_core::unix_ms();
        Ok(())
    }

    async fn remove_bot(&self, id: &BotId) -> Result<bool> {
        Ok(self.st().bots.remove(id).is_some())
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

    async fn mark_sent(&self, id: &BotId, key: &str) -> Result<()> {
        self.st()
            .sent
            .entry(id.clone())
            .or_default()
            .insert(key.to_owned());
        Ok(())
    }

    async fn is_sent(&self, id: &BotId, key: &str) -> Result<bool> {
        Ok(self.st().sent.get(id).is_some_and(|s| s.contains(key)))
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
}
