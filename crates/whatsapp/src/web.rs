//! WhatsApp device-link (`--mode web`, feature `web`): the linked session's storage.
//!
//! `whatsapp-rust` keeps a linked device's state (its identity, Signal sessions and keys,
//! app-state keys, device lists) behind `wacore`'s storage traits. [`FencedBackend`]
//! implements them over a [`SessionKv`]: records of a kind and a key, kept in memory for the
//! client's many reads, every change written through to the shared store under the claim's
//! fence (the runtime implements `SessionKv` over `Store::session_write`), so the bot's next
//! owner reads the session whole and a worker that lost the bot cannot corrupt it.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, RwLock},
};

use async_trait::async_trait;
use bytes::Bytes;
use wacore::{
    appstate::{hash::HashState, processor::AppStateMutationMAC},
    store::{
        error::{Result, StoreError},
        traits::{
            AppStateSyncKey, AppSyncStore, DeviceListRecord, DeviceStore, LidPnMappingEntry,
            MsgSecretEntry, MsgSecretStore, ProtocolStore, SignalStore, TcTokenEntry,
        },
        Device,
    },
};

pub use botfleet_platform::{KvWrite, SessionError, SessionKv};

/// The kinds of record a linked session has.
pub const KINDS: &[&str] = &[
    "device",
    "identity",
    "session",
    "prekey",
    "signed_prekey",
    "sender_key",
    "sync_key",
    "app_version",
    "mutation_mac",
    "sk_device",
    "lid",
    "base_key",
    "device_list",
    "group_meta",
    "tc_token",
    "sent_message",
    "msg_secret",
    "pending_inbound",
];

type Records = HashMap<&'static str, BTreeMap<String, Vec<u8>>>;

/// `wacore`'s storage over a [`SessionKv`], cached in memory, written through.
pub struct FencedBackend {
    kv: Arc<dyn SessionKv>,
    refused: Arc<std::sync::atomic::AtomicU64>,
    // std RwLock: held for map operations only, never across .await.
    cache: RwLock<Records>,
    /// Makes taking a sent message (read, then delete) one step.
    taking: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for FencedBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedBackend").finish_non_exhaustive()
    }
}

/// Whether a stored `device` record (what [`DeviceStore::save`] wrote) is a linked device:
/// one that has its phone number.
pub fn device_is_linked(record: &[u8]) -> bool {
    de::<Device>(record).is_ok_and(|d| d.pn.is_some())
}

/// Kinds kept in memory: small, read often. The others grow with contacts and messages
/// (Signal sessions, identities, sender keys, prekeys, message secrets) and are read from the
/// store when the client asks — it keeps the ones in use in its own bounded cache.
fn cached(k: &str) -> bool {
    matches!(
        k,
        "device"
            | "signed_prekey"
            | "sync_key"
            | "app_version"
            | "lid"
            | "device_list"
            | "group_meta"
            | "sk_device"
    )
}

fn kind(k: &str) -> &'static str {
    KINDS.iter().copied().find(|x| *x == k).unwrap_or("other")
}

fn db_err(e: String) -> StoreError {
    StoreError::Database(e.into())
}

fn ser<T: serde::Serialize>(v: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(v).map_err(|e| StoreError::Serialization(Box::new(e)))
}

fn de<T: serde::de::DeserializeOwned>(v: &[u8]) -> Result<T> {
    serde_json::from_slice(v).map_err(|e| StoreError::Serialization(Box::new(e)))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .filter_map(|i| u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

fn now_s() -> i64 {
    botfleet_core::unix_ms() / 1000
}

impl FencedBackend {
    /// The session `kv` holds, read whole.
    ///
    /// # Errors
    /// When the store cannot be read.
    pub async fn load(kv: Arc<dyn SessionKv>) -> Result<Self> {
        let mut cache: Records = HashMap::new();
        for k in KINDS.iter().copied().filter(|k| cached(k)) {
            let rows = kv.load(k).await.map_err(|e| db_err(e.to_string()))?;
            cache.insert(k, rows.into_iter().collect());
        }
        Ok(Self {
            kv,
            refused: Arc::default(),
            cache: RwLock::new(cache),
            taking: tokio::sync::Mutex::new(()),
        })
    }

    /// Counts refused writes in `counter` (shared by every session of a process).
    #[must_use]
    pub fn counting(mut self, counter: Arc<std::sync::atomic::AtomicU64>) -> Self {
        self.refused = counter;
        self
    }

    /// Writes refused because a newer owner holds the bot (each one changed nothing).
    pub fn refused_writes(&self) -> u64 {
        self.refused.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether a device is linked: the session holds a device that has its phone number.
    pub fn is_linked(&self) -> bool {
        self.read(|c| c.get("device").and_then(|m| m.get("self")).cloned())
            .is_some_and(|v| device_is_linked(&v))
    }

    fn read<T>(&self, f: impl FnOnce(&Records) -> T) -> T {
        f(&self.cache.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// One record: from memory for the kinds kept there, else from the store.
    async fn fetch(&self, k: &str, key: &str) -> Result<Option<Vec<u8>>> {
        let k = kind(k);
        if cached(k) {
            return Ok(self.read(|c| c.get(k).and_then(|m| m.get(key)).cloned()));
        }
        self.kv.get(k, key).await.map_err(|e| db_err(e.to_string()))
    }

    /// Every record of a kind, sorted by key.
    async fn fetch_all(&self, k: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let k = kind(k);
        if cached(k) {
            return Ok(self.read(|c| {
                c.get(k)
                    .map(|m| m.iter().map(|(a, b)| (a.clone(), b.clone())).collect())
                    .unwrap_or_default()
            }));
        }
        self.kv.load(k).await.map_err(|e| db_err(e.to_string()))
    }

    /// Writes through, then updates the cache (a refused write changes nothing here either).
    async fn apply(&self, writes: Vec<KvWrite>) -> Result<()> {
        if writes.is_empty() {
            return Ok(());
        }
        if let Err(e) = self.kv.write(writes.clone()).await {
            if e == SessionError::Stale {
                self.refused
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            return Err(db_err(e.to_string()));
        }
        let mut c = self.cache.write().unwrap_or_else(|e| e.into_inner());
        for w in writes {
            match w {
                KvWrite::Put(k, key, v) => {
                    if cached(kind(&k)) {
                        c.entry(kind(&k)).or_default().insert(key, v);
                    }
                }
                KvWrite::Delete(k, key) => {
                    if let Some(m) = c.get_mut(kind(&k)) {
                        m.remove(&key);
                    }
                }
            }
        }
        Ok(())
    }

    async fn put(&self, k: &str, key: impl Into<String>, v: Vec<u8>) -> Result<()> {
        self.apply(vec![KvWrite::Put(k.into(), key.into(), v)])
            .await
    }

    /// Sets many records of one kind in one fenced write: all or none.
    async fn put_all(
        &self,
        k: &str,
        rows: impl IntoIterator<Item = (String, Vec<u8>)>,
    ) -> Result<()> {
        self.apply(
            rows.into_iter()
                .map(|(key, v)| KvWrite::Put(k.into(), key, v))
                .collect(),
        )
        .await
    }

    async fn del(&self, k: &str, key: impl Into<String>) -> Result<()> {
        self.apply(vec![KvWrite::Delete(k.into(), key.into())])
            .await
    }
}

/// A prekey as stored: one byte saying whether it was uploaded, then the record (compact: a
/// session keeps dozens of them in memory).
fn prekey_value(record: &[u8], uploaded: bool) -> Vec<u8> {
    let mut v = Vec::with_capacity(record.len() + 1);
    v.push(u8::from(uploaded));
    v.extend_from_slice(record);
    v
}

/// The record of a stored prekey.
fn prekey_record(v: &[u8]) -> Result<&[u8]> {
    match v.split_first() {
        Some((0 | 1, record)) => Ok(record),
        _ => Err(db_err("a stored prekey is malformed".into())),
    }
}

/// A sent message kept for retries, with when it was sent.
#[derive(serde::Serialize, serde::Deserialize)]
struct SentMessage {
    payload: Vec<u8>,
    at: i64,
}

/// Records keyed by a Signal address, as stored.
fn by_address(rows: &[(Arc<str>, Bytes)]) -> impl Iterator<Item = (String, Vec<u8>)> + '_ {
    rows.iter().map(|(a, v)| (a.to_string(), v.to_vec()))
}

fn prekey_key(id: u32) -> String {
    format!("{id:010}")
}

#[async_trait]
impl SignalStore for FencedBackend {
    async fn put_identity(&self, address: &str, key: [u8; 32]) -> Result<()> {
        self.put("identity", address, key.to_vec()).await
    }
    async fn load_identity(&self, address: &str) -> Result<Option<[u8; 32]>> {
        Ok(self
            .fetch("identity", address)
            .await?
            .and_then(|v| <[u8; 32]>::try_from(v.as_slice()).ok()))
    }
    async fn delete_identity(&self, address: &str) -> Result<()> {
        self.del("identity", address).await
    }
    async fn get_session(&self, address: &str) -> Result<Option<Bytes>> {
        Ok(self.fetch("session", address).await?.map(Bytes::from))
    }
    async fn put_session(&self, address: &str, session: &[u8]) -> Result<()> {
        self.put("session", address, session.to_vec()).await
    }
    async fn delete_session(&self, address: &str) -> Result<()> {
        self.del("session", address).await
    }
    // The batches the client flushes its Signal state in: one fenced write each, all or none.
    async fn put_identities_batch(&self, identities: &[(Arc<str>, [u8; 32])]) -> Result<()> {
        self.put_all(
            "identity",
            identities.iter().map(|(a, k)| (a.to_string(), k.to_vec())),
        )
        .await
    }
    async fn put_sessions_batch(&self, sessions: &[(Arc<str>, Bytes)]) -> Result<()> {
        self.put_all("session", by_address(sessions)).await
    }
    async fn store_prekeys_batch(&self, keys: &[(u32, Bytes)], uploaded: bool) -> Result<()> {
        self.put_all(
            "prekey",
            keys.iter()
                .map(|(id, r)| (prekey_key(*id), prekey_value(r, uploaded))),
        )
        .await
    }
    async fn put_sender_keys_batch(&self, sender_keys: &[(Arc<str>, Bytes)]) -> Result<()> {
        self.put_all("sender_key", by_address(sender_keys)).await
    }
    async fn store_prekey(&self, id: u32, record: &[u8], uploaded: bool) -> Result<()> {
        self.put("prekey", prekey_key(id), prekey_value(record, uploaded))
            .await
    }
    async fn load_prekey(&self, id: u32) -> Result<Option<Bytes>> {
        match self.fetch("prekey", &prekey_key(id)).await? {
            Some(v) => Ok(Some(Bytes::copy_from_slice(prekey_record(&v)?))),
            None => Ok(None),
        }
    }
    async fn mark_prekeys_uploaded(&self, ids: &[u32]) -> Result<()> {
        let mut writes = Vec::new();
        for id in ids {
            if let Some(v) = self.fetch("prekey", &prekey_key(*id)).await? {
                let v = prekey_value(prekey_record(&v)?, true);
                writes.push(KvWrite::Put("prekey".into(), prekey_key(*id), v));
            }
        }
        self.apply(writes).await
    }
    async fn remove_prekey(&self, id: u32) -> Result<()> {
        self.del("prekey", prekey_key(id)).await
    }
    async fn get_max_prekey_id(&self) -> Result<u32> {
        Ok(self
            .fetch_all("prekey")
            .await?
            .iter()
            .filter_map(|(k, _)| k.parse::<u32>().ok())
            .max()
            .unwrap_or(0))
    }
    async fn store_signed_prekey(&self, id: u32, record: &[u8]) -> Result<()> {
        self.put("signed_prekey", prekey_key(id), record.to_vec())
            .await
    }
    async fn load_signed_prekey(&self, id: u32) -> Result<Option<Vec<u8>>> {
        Ok(self.fetch("signed_prekey", &prekey_key(id)).await?)
    }
    async fn load_all_signed_prekeys(&self) -> Result<Vec<(u32, Vec<u8>)>> {
        Ok(self
            .fetch_all("signed_prekey")
            .await?
            .into_iter()
            .filter_map(|(k, v)| Some((k.parse().ok()?, v)))
            .collect())
    }
    async fn remove_signed_prekey(&self, id: u32) -> Result<()> {
        self.del("signed_prekey", prekey_key(id)).await
    }
    async fn put_sender_key(&self, address: &str, record: &[u8]) -> Result<()> {
        self.put("sender_key", address, record.to_vec()).await
    }
    async fn get_sender_key(&self, address: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.fetch("sender_key", address).await?)
    }
    async fn delete_sender_key(&self, address: &str) -> Result<()> {
        self.del("sender_key", address).await
    }
}

#[async_trait]
impl AppSyncStore for FencedBackend {
    async fn get_sync_key(&self, key_id: &[u8]) -> Result<Option<AppStateSyncKey>> {
        self.fetch("sync_key", &hex(key_id))
            .await?
            .map(|v| de(&v))
            .transpose()
    }
    async fn set_sync_key(&self, key_id: &[u8], key: AppStateSyncKey) -> Result<()> {
        self.put("sync_key", hex(key_id), ser(&key)?).await
    }
    async fn get_version(&self, name: &str) -> Result<HashState> {
        match self.fetch("app_version", name).await? {
            Some(v) => de(&v),
            None => Ok(HashState::default()),
        }
    }
    async fn set_version(&self, name: &str, state: HashState) -> Result<()> {
        self.put("app_version", name, ser(&state)?).await
    }
    async fn put_mutation_macs(
        &self,
        name: &str,
        _version: u64,
        mutations: &[AppStateMutationMAC],
    ) -> Result<()> {
        let writes = mutations
            .iter()
            .map(|m| {
                KvWrite::Put(
                    "mutation_mac".into(),
                    format!("{name}:{}", hex(&m.index_mac)),
                    m.value_mac.clone(),
                )
            })
            .collect();
        self.apply(writes).await
    }
    async fn get_mutation_mac(&self, name: &str, index_mac: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self
            .fetch("mutation_mac", &format!("{name}:{}", hex(index_mac)))
            .await?)
    }
    async fn delete_mutation_macs(&self, name: &str, index_macs: &[Vec<u8>]) -> Result<()> {
        let writes = index_macs
            .iter()
            .map(|m| KvWrite::Delete("mutation_mac".into(), format!("{name}:{}", hex(m))))
            .collect();
        self.apply(writes).await
    }
    async fn clear_mutation_macs(&self, name: &str) -> Result<()> {
        let prefix = format!("{name}:");
        let writes = self
            .fetch_all("mutation_mac")
            .await?
            .into_iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .map(|(k, _)| KvWrite::Delete("mutation_mac".into(), k))
            .collect();
        self.apply(writes).await
    }
    async fn get_latest_sync_key_id(&self) -> Result<Option<Vec<u8>>> {
        let mut best: Option<(i64, String)> = None;
        for (k, v) in self.fetch_all("sync_key").await? {
            let key: AppStateSyncKey = de(&v)?;
            if best.as_ref().is_none_or(|(t, _)| key.timestamp > *t) {
                best = Some((key.timestamp, k));
            }
        }
        Ok(best.map(|(_, k)| unhex(&k)))
    }
}

#[async_trait]
impl ProtocolStore for FencedBackend {
    async fn get_sender_key_devices(&self, group_jid: &str) -> Result<Vec<(String, bool)>> {
        let prefix = format!("{group_jid}|");
        Ok(self
            .fetch_all("sk_device")
            .await?
            .into_iter()
            .filter_map(|(k, v)| {
                let dev = k.strip_prefix(&prefix)?.to_owned();
                Some((dev, v.first() == Some(&1)))
            })
            .collect())
    }
    async fn set_sender_key_status(&self, group_jid: &str, entries: &[(&str, bool)]) -> Result<()> {
        let writes = entries
            .iter()
            .map(|(d, ok)| {
                KvWrite::Put(
                    "sk_device".into(),
                    format!("{group_jid}|{d}"),
                    vec![u8::from(*ok)],
                )
            })
            .collect();
        self.apply(writes).await
    }
    async fn clear_sender_key_devices(&self, group_jid: &str) -> Result<()> {
        let prefix = format!("{group_jid}|");
        let writes = self
            .fetch_all("sk_device")
            .await?
            .into_iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .map(|(k, _)| KvWrite::Delete("sk_device".into(), k))
            .collect();
        self.apply(writes).await
    }
    async fn delete_sender_key_device_rows(&self, device_jids: &[&str]) -> Result<()> {
        let writes = self
            .fetch_all("sk_device")
            .await?
            .into_iter()
            .filter(|(k, _)| {
                k.rsplit_once('|')
                    .is_some_and(|(_, d)| device_jids.contains(&d))
            })
            .map(|(k, _)| KvWrite::Delete("sk_device".into(), k))
            .collect();
        self.apply(writes).await
    }
    async fn clear_all_sender_key_devices(&self) -> Result<()> {
        let writes = self
            .fetch_all("sk_device")
            .await?
            .into_iter()
            .map(|(k, _)| KvWrite::Delete("sk_device".into(), k))
            .collect();
        self.apply(writes).await
    }
    async fn get_lid_mapping(&self, lid: &str) -> Result<Option<LidPnMappingEntry>> {
        self.fetch("lid", lid).await?.map(|v| de(&v)).transpose()
    }
    async fn get_pn_mapping(&self, phone: &str) -> Result<Option<LidPnMappingEntry>> {
        // A number can have had more than one LID: the one learned last is the current one.
        let mut latest: Option<LidPnMappingEntry> = None;
        for (_, v) in self.fetch_all("lid").await? {
            let e: LidPnMappingEntry = de(&v)?;
            if e.phone_number == phone
                && latest.as_ref().is_none_or(|l| e.updated_at >= l.updated_at)
            {
                latest = Some(e);
            }
        }
        Ok(latest)
    }
    async fn put_lid_mapping(&self, entry: &LidPnMappingEntry) -> Result<()> {
        self.put("lid", entry.lid.clone(), ser(entry)?).await
    }
    async fn put_lid_mappings(&self, entries: &[LidPnMappingEntry]) -> Result<()> {
        let rows = entries
            .iter()
            .map(|e| Ok((e.lid.clone(), ser(e)?)))
            .collect::<Result<Vec<_>>>()?;
        self.put_all("lid", rows).await
    }
    async fn get_all_lid_mappings(&self) -> Result<Vec<LidPnMappingEntry>> {
        self.fetch_all("lid")
            .await?
            .iter()
            .map(|(_, v)| de(v))
            .collect()
    }
    async fn save_base_key(&self, address: &str, message_id: &str, base_key: &[u8]) -> Result<()> {
        self.put(
            "base_key",
            format!("{address}|{message_id}"),
            base_key.to_vec(),
        )
        .await
    }
    async fn has_same_base_key(
        &self,
        address: &str,
        message_id: &str,
        current_base_key: &[u8],
    ) -> Result<bool> {
        Ok(self
            .fetch("base_key", &format!("{address}|{message_id}"))
            .await?
            .is_some_and(|v| v == current_base_key))
    }
    async fn delete_base_key(&self, address: &str, message_id: &str) -> Result<()> {
        self.del("base_key", format!("{address}|{message_id}"))
            .await
    }
    async fn update_device_list(&self, record: DeviceListRecord) -> Result<()> {
        self.put("device_list", record.user.clone(), ser(&record)?)
            .await
    }
    async fn get_devices(&self, user: &str) -> Result<Option<DeviceListRecord>> {
        self.fetch("device_list", user)
            .await?
            .map(|v| de(&v))
            .transpose()
    }
    async fn delete_devices(&self, user: &str) -> Result<()> {
        self.del("device_list", user).await
    }
    async fn get_group_metadata(&self, group_jid: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.fetch("group_meta", group_jid).await?)
    }
    async fn put_group_metadata(&self, group_jid: &str, blob: &[u8]) -> Result<()> {
        self.put("group_meta", group_jid, blob.to_vec()).await
    }
    async fn delete_group_metadata(&self, group_jid: &str) -> Result<()> {
        self.del("group_meta", group_jid).await
    }
    async fn get_tc_token(&self, jid: &str) -> Result<Option<TcTokenEntry>> {
        self.fetch("tc_token", jid)
            .await?
            .map(|v| de(&v))
            .transpose()
    }
    async fn put_tc_token(&self, jid: &str, entry: &TcTokenEntry) -> Result<()> {
        self.put("tc_token", jid, ser(entry)?).await
    }
    async fn delete_tc_token(&self, jid: &str) -> Result<()> {
        self.del("tc_token", jid).await
    }
    async fn get_all_tc_token_jids(&self) -> Result<Vec<String>> {
        Ok(self
            .fetch_all("tc_token")
            .await?
            .into_iter()
            .map(|(k, _)| k)
            .collect())
    }
    async fn delete_expired_tc_tokens(&self, token_cutoff: i64, sender_cutoff: i64) -> Result<u32> {
        let mut writes = Vec::new();
        for (k, v) in self.fetch_all("tc_token").await? {
            let e: TcTokenEntry = de(&v)?;
            let sender_old = e.sender_timestamp.is_none_or(|t| t < sender_cutoff);
            let token_old = e.token.is_empty() || e.token_timestamp < token_cutoff;
            if token_old && sender_old {
                writes.push(KvWrite::Delete("tc_token".into(), k));
            }
        }
        let n = u32::try_from(writes.len()).unwrap_or(u32::MAX);
        self.apply(writes).await?;
        Ok(n)
    }
    async fn store_sent_message(
        &self,
        chat_jid: &str,
        message_id: &str,
        payload: &[u8],
    ) -> Result<()> {
        let v = ser(&SentMessage {
            payload: payload.to_vec(),
            at: now_s(),
        })?;
        self.put("sent_message", format!("{chat_jid}|{message_id}"), v)
            .await
    }
    async fn take_sent_message(&self, chat_jid: &str, message_id: &str) -> Result<Option<Vec<u8>>> {
        let key = format!("{chat_jid}|{message_id}");
        // Two retry receipts for one message at once: only one of them gets it to resend.
        let _one = self.taking.lock().await;
        match self.fetch("sent_message", &key).await? {
            Some(v) => {
                let m: SentMessage = de(&v)?;
                self.del("sent_message", key).await?;
                Ok(Some(m.payload))
            }
            None => Ok(None),
        }
    }
    async fn delete_expired_sent_messages(&self, cutoff_timestamp: i64) -> Result<u32> {
        let mut writes = Vec::new();
        for (k, v) in self.fetch_all("sent_message").await? {
            if de::<SentMessage>(&v)?.at < cutoff_timestamp {
                writes.push(KvWrite::Delete("sent_message".into(), k));
            }
        }
        let n = u32::try_from(writes.len()).unwrap_or(u32::MAX);
        self.apply(writes).await?;
        Ok(n)
    }

    // Messages decrypted and not yet recorded by the runtime (the durability hook): replayed
    // on redelivery instead of lost with the ratchet that decrypted them.
    async fn store_pending_inbound(
        &self,
        chat: &str,
        sender: &str,
        id: &str,
        message: &[u8],
    ) -> Result<()> {
        let p = SentMessage {
            payload: message.to_vec(),
            at: now_s(),
        };
        self.put("pending_inbound", format!("{chat}|{sender}|{id}"), ser(&p)?)
            .await
    }

    async fn get_pending_inbound(
        &self,
        chat: &str,
        sender: &str,
        id: &str,
    ) -> Result<Option<Vec<u8>>> {
        self.fetch("pending_inbound", &format!("{chat}|{sender}|{id}"))
            .await?
            .map(|v| de::<SentMessage>(&v).map(|p| p.payload))
            .transpose()
    }

    async fn delete_pending_inbound(&self, chat: &str, sender: &str, id: &str) -> Result<()> {
        self.del("pending_inbound", format!("{chat}|{sender}|{id}"))
            .await
    }

    async fn delete_expired_pending_inbound(&self, cutoff_timestamp: i64) -> Result<u32> {
        let mut writes = Vec::new();
        for (k, v) in self.fetch_all("pending_inbound").await? {
            if de::<SentMessage>(&v)?.at < cutoff_timestamp {
                writes.push(KvWrite::Delete("pending_inbound".into(), k));
            }
        }
        let n = u32::try_from(writes.len()).unwrap_or(u32::MAX);
        self.apply(writes).await?;
        Ok(n)
    }

    async fn store_pending_inbound_batch(
        &self,
        rows: &[wacore::store::traits::PendingInboundRow<'_>],
    ) -> Result<()> {
        let mut writes = Vec::with_capacity(rows.len());
        for r in rows {
            let p = SentMessage {
                payload: r.message.to_vec(),
                at: now_s(),
            };
            writes.push(KvWrite::Put(
                "pending_inbound".into(),
                format!("{}|{}|{}", r.chat, r.sender, r.id),
                ser(&p)?,
            ));
        }
        self.apply(writes).await
    }

    async fn delete_pending_inbound_batch(
        &self,
        keys: &[wacore::store::traits::PendingInboundKey<'_>],
    ) -> Result<()> {
        let writes = keys
            .iter()
            .map(|k| {
                KvWrite::Delete(
                    "pending_inbound".into(),
                    format!("{}|{}|{}", k.chat, k.sender, k.id),
                )
            })
            .collect();
        self.apply(writes).await
    }
}

#[async_trait]
impl MsgSecretStore for FencedBackend {
    async fn put_msg_secrets(&self, entries: Vec<MsgSecretEntry>) -> Result<usize> {
        let n = entries.len();
        let mut writes = Vec::with_capacity(n);
        for e in &entries {
            let key = format!("{}|{}|{}", e.chat, e.sender, e.msg_id);
            let mut e = e.clone();
            // A redelivery or an edit never shortens a window nor forgets a known time.
            if let Some(v) = self.fetch("msg_secret", &key).await? {
                let old: MsgSecretEntry = de(&v)?;
                e.expires_at =
                    wacore::store::traits::merge_msg_secret_expiry(old.expires_at, e.expires_at);
                e.message_ts = wacore::store::traits::merge_msg_secret_message_ts(
                    old.message_ts,
                    e.message_ts,
                );
            }
            writes.push(KvWrite::Put("msg_secret".into(), key, ser(&e)?));
        }
        self.apply(writes).await?;
        Ok(n)
    }
    async fn get_msg_secret_with_ts(
        &self,
        chat: &str,
        sender: &str,
        msg_id: &str,
    ) -> Result<Option<(Vec<u8>, i64)>> {
        match self
            .fetch("msg_secret", &format!("{chat}|{sender}|{msg_id}"))
            .await?
        {
            Some(v) => {
                let e: MsgSecretEntry = de(&v)?;
                Ok(Some((e.secret.to_vec(), e.message_ts)))
            }
            None => Ok(None),
        }
    }
    async fn get_msg_secret(
        &self,
        chat: &str,
        sender: &str,
        msg_id: &str,
    ) -> Result<Option<Vec<u8>>> {
        Ok(self
            .get_msg_secret_with_ts(chat, sender, msg_id)
            .await?
            .map(|(secret, _)| secret))
    }
    async fn delete_expired_msg_secrets(&self, cutoff_timestamp: i64) -> Result<u32> {
        let mut writes = Vec::new();
        for (k, v) in self.fetch_all("msg_secret").await? {
            let e: MsgSecretEntry = de(&v)?;
            if e.expires_at != 0 && e.expires_at <= cutoff_timestamp {
                writes.push(KvWrite::Delete("msg_secret".into(), k));
            }
        }
        let n = u32::try_from(writes.len()).unwrap_or(u32::MAX);
        self.apply(writes).await?;
        Ok(n)
    }
}

#[async_trait]
impl DeviceStore for FencedBackend {
    async fn save(&self, device: &Device) -> Result<()> {
        self.put("device", "self", ser(device)?).await
    }
    async fn load(&self) -> Result<Option<Device>> {
        self.fetch("device", "self")
            .await?
            .map(|v| de(&v))
            .transpose()
    }
    async fn exists(&self) -> Result<bool> {
        Ok(self.fetch("device", "self").await?.is_some())
    }
    async fn create(&self) -> Result<i32> {
        // One linked device per bot: its id is always 1.
        Ok(1)
    }
}
