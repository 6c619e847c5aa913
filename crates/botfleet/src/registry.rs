//! Changing the bot registry, once for the CLI and the control API: every change is written
//! to the store and then announced to the fleet as a lifecycle event, so the bot's owner acts
//! within a second. Errors carry a stable code (the API's JSON `code`) and a message that
//! never holds a credential.

use std::{collections::HashMap, fmt, sync::Arc};

use botfleet_coord::{Coordinator, LifecycleEvent};
use botfleet_core::{BotId, BotRecord, BotSpec, BotStatus, HandlerSpec};
use botfleet_store::{BotFilter, Store, StoreError};
use serde::Serialize;

/// Why a registry change was refused or failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RegistryError {
    /// Stable, machine-readable: `invalid`, `not_found`, `exists`, `store_failed`,
    /// `fleet_not_told`.
    pub(crate) code: &'static str,
    /// For people; names fields, never values.
    pub(crate) message: String,
}

impl RegistryError {
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self {
            code: "invalid",
            message: message.into(),
        }
    }

    fn not_found(id: &BotId) -> Self {
        Self {
            code: "not_found",
            message: format!("no bot {id}"),
        }
    }

    fn store(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(id) => Self::not_found(&id),
            StoreError::AlreadyExists(id) => Self {
                code: "exists",
                message: format!("bot {id} exists already"),
            },
            other => Self {
                code: "store_failed",
                message: format!("the registry could not be changed: {other}"),
            },
        }
    }
}

impl fmt::Display for RegistryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RegistryError {}

pub(crate) use crate::lines::{BotLine, BotPatch};

/// A bot about to restart: one on Discord's recommended count reads it again, as a whole
/// (the count in use is kept, so its old slices are waited for); any other bot keeps no count
/// of the fleet's.
fn recount_on_restart(spec: &mut BotSpec) {
    spec.options.shards_recommended = None;
    if spec.options.shards.is_some() || spec.options.shards_per_slice.is_none() {
        spec.options.shards_in_use = None;
    }
}

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Change {
    /// A new bot.
    Added,
    /// An existing bot changed; its owner restarts it with the new spec.
    Updated,
    /// The request matched what was registered; nothing happened.
    Unchanged,
}

/// A bot's sends from the backend of the last 24 hours (they are kept a day after they end),
/// by how they stand.
#[derive(Debug, Clone, Copy, Default, Serialize, utoipa::ToSchema)]
pub(crate) struct SendsView {
    /// Waiting for, or in, their chat's turn.
    queued: u64,
    /// Sent.
    sent: u64,
    /// Given up on: the platform refused, or failing past the retry window.
    failed: u64,
}

impl From<botfleet_store::SendCounts> for SendsView {
    fn from(s: botfleet_store::SendCounts) -> Self {
        Self {
            queued: s.queued,
            sent: s.sent,
            failed: s.failed,
        }
    }
}

/// A bot as the CLI's `bots list --json` and the API show it: never a credential.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub(crate) struct BotView {
    pub(crate) id: String,
    pub(crate) platform: String,
    pub(crate) enabled: bool,
    pub(crate) status: String,
    /// The worker running it (in a fleet: the live claim's holder).
    pub(crate) owner: Option<String>,
    /// Messages recorded and not yet answered.
    pub(crate) pending: u64,
    /// Of the pending messages, those whose turn is held open for an answer that comes
    /// later (their handler answered 202).
    pub(crate) held: u64,
    /// Its chats paused now (handed to a person).
    pub(crate) paused_chats: u64,
    /// Messages given up on (handler or send failed past the retry time, or refused).
    pub(crate) undeliverable: u64,
    /// Its sends from the backend of the last 24 hours, by how they stand.
    pub(crate) sends: SendsView,
    pub(crate) last_error: Option<String>,
    pub(crate) handler: String,
    pub(crate) webhook_url: Option<String>,
    pub(crate) api_url: Option<String>,
    /// Whether a second credential (Slack's app token) is set; never the value.
    pub(crate) has_app_token: bool,
    /// How the bot receives: `poll`/`webhook`, `socket`/`events`, `gateway`, `cloud`/`web`.
    pub(crate) mode: String,
    /// Whether a webhook verification secret is set; never the value.
    pub(crate) has_hook_secret: bool,
    /// Discord: the shard count, or none for Discord's recommendation.
    pub(crate) shards: Option<u32>,
    /// Discord: shards per slice, when the bot is split into slices.
    pub(crate) shards_per_slice: Option<u32>,
    /// Discord, `shards` auto and split into slices: the count its slices run on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) shards_in_use: Option<u32>,
    /// Discord, `shards` auto and split into slices: Discord's recommendation as last read
    /// (none while the bot is being counted again).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) shards_recommended: Option<u32>,
    /// Discord, split into slices: each slice's shards and who runs it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) slices: Vec<SliceView>,
    /// Unix milliseconds of the spec's last change.
    pub(crate) updated_at_ms: i64,
    /// WhatsApp device-link bots: whether a phone linked the device (`bots link`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) linked: Option<bool>,
    /// The bot's commands, as registered with the platform.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Vec<Object>)]
    pub(crate) commands: Vec<botfleet_core::CommandSpec>,
    /// Its own handler timeout in seconds, when it has one (else the workers').
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) handler_timeout_s: Option<u32>,
    /// Its own time to live of held turns in seconds, when it has one (else the workers').
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) async_reply_ttl_s: Option<u32>,
    /// Whether typing is shown while its turns run long (its own `typing`, where its
    /// platform's mode has typing).
    pub(crate) typing: bool,
    /// How its streamed answers go: `native` (the platform's own streams where the chat has
    /// them, edits elsewhere) or `edits`.
    pub(crate) stream: &'static str,
    /// Its own send limits over the workers' `--rate-limits`, when it has them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) rate_limits: Option<String>,
}

/// One slice of a bot split into slices.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub(crate) struct SliceView {
    /// Its unit id (`{bot}#{k}`).
    pub(crate) unit: String,
    /// First shard.
    pub(crate) first_shard: u32,
    /// Shards in it.
    pub(crate) shards: u32,
    /// The worker holding it (a live claim), if any.
    pub(crate) owner: Option<String>,
    /// `running` (a live owner) or `unowned`.
    pub(crate) state: &'static str,
}

/// A bot's line in a report of many changes (import).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub(crate) struct LineResult {
    /// 1-based line number.
    pub(crate) line: usize,
    /// The bot's id when the line named a valid one.
    pub(crate) id: Option<String>,
    /// What happened, or why not.
    #[serde(flatten)]
    pub(crate) outcome: LineOutcome,
}

/// The outcome of one import line.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub(crate) enum LineOutcome {
    /// Done.
    Done {
        /// Added, updated or unchanged.
        change: Change,
    },
    /// Refused.
    Refused {
        /// The error's stable code.
        code: &'static str,
        /// Why.
        error: String,
    },
}

/// The registry and, when there is one, the fleet to tell.
#[derive(Clone)]
pub(crate) struct Registry {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) fleet: Option<Arc<dyn Coordinator>>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("fleet", &self.fleet.is_some())
            .finish_non_exhaustive()
    }
}

impl Registry {
    async fn tell(&self, event: LifecycleEvent) -> Result<(), RegistryError> {
        if let Some(c) = &self.fleet {
            c.publish(&event).await.map_err(|e| RegistryError {
                code: "fleet_not_told",
                message: format!(
                    "the registry changed, but telling the fleet failed ({e}); workers see it at their next refresh"
                ),
            })?;
        }
        Ok(())
    }

    /// The bot `id` names, or `not_found`.
    pub(crate) async fn get(&self, id: &str) -> Result<BotRecord, RegistryError> {
        let id = BotId::new(id).map_err(|e| RegistryError::invalid(e.to_string()))?;
        self.store
            .get_bot(&id)
            .await
            .map_err(RegistryError::store)?
            .ok_or_else(|| RegistryError::not_found(&id))
    }

    /// Registers a new bot (`exists` when the id is taken).
    pub(crate) async fn add(&self, spec: &BotSpec) -> Result<(), RegistryError> {
        self.store
            .add_bot(spec)
            .await
            .map_err(RegistryError::store)?;
        self.tell(LifecycleEvent::Activate(spec.id.clone())).await
    }

    /// Registers `line`'s bot, or brings an existing one to it. A line without `enabled`
    /// keeps an existing bot's setting.
    pub(crate) async fn upsert(&self, line: BotLine) -> Result<Change, RegistryError> {
        let keep_enabled = line.enabled.is_none();
        let mut spec = line.into_spec()?;
        let Some(old) = self
            .store
            .get_bot(&spec.id)
            .await
            .map_err(RegistryError::store)?
        else {
            self.add(&spec).await?;
            return Ok(Change::Added);
        };
        if old.spec.platform != spec.platform {
            return Err(RegistryError::invalid(format!(
                "bot {} is a {} bot: its platform cannot be changed (remove it and add it again)",
                spec.id, old.spec.platform
            )));
        }
        if keep_enabled {
            spec.enabled = old.spec.enabled;
        }
        self.write(&old.spec, spec).await
    }

    /// Applies `patch` to bot `id`.
    pub(crate) async fn update(&self, id: &str, patch: BotPatch) -> Result<Change, RegistryError> {
        let old = self.get(id).await?;
        let next = patch.apply(&old.spec)?;
        self.write(&old.spec, next).await
    }

    /// Writes `next` over `old` and tells the owner: a changed bot restarts on its owner
    /// (stopped first, then started with the new spec: never both at once).
    async fn write(&self, old: &BotSpec, mut next: BotSpec) -> Result<Change, RegistryError> {
        // What the fleet counted is not the operator's to set: kept, and compared as kept.
        next.options.shards_in_use = old.options.shards_in_use;
        next.options.shards_recommended = old.options.shards_recommended;
        if *old == next {
            return Ok(Change::Unchanged);
        }
        recount_on_restart(&mut next);
        self.store
            .update_bot(&next)
            .await
            .map_err(RegistryError::store)?;
        let event = match (old.enabled, next.enabled) {
            (_, false) => LifecycleEvent::Deactivate(next.id.clone()),
            (false, true) => LifecycleEvent::Activate(next.id.clone()),
            (true, true) => LifecycleEvent::Restart(next.id.clone()),
        };
        self.tell(event).await?;
        Ok(Change::Updated)
    }

    /// Unregisters bot `id`.
    pub(crate) async fn remove(&self, id: &str) -> Result<(), RegistryError> {
        let id = BotId::new(id).map_err(|e| RegistryError::invalid(e.to_string()))?;
        if !self
            .store
            .remove_bot(&id)
            .await
            .map_err(RegistryError::store)?
        {
            return Err(RegistryError::not_found(&id));
        }
        self.tell(LifecycleEvent::Deactivate(id)).await
    }

    /// Enables or disables bot `id`.
    pub(crate) async fn set_enabled(
        &self,
        id: &str,
        enabled: bool,
    ) -> Result<Change, RegistryError> {
        self.update(
            id,
            BotPatch {
                enabled: Some(enabled),
                ..BotPatch::default()
            },
        )
        .await
    }

    /// Restarts bot `id` on its owner and clears a `failed` status.
    pub(crate) async fn restart(&self, id: &str) -> Result<(), RegistryError> {
        let mut rec = self.get(id).await?;
        recount_on_restart(&mut rec.spec);
        // Re-writing the spec bumps its change time: embedded workers restart it too.
        self.store
            .update_bot(&rec.spec)
            .await
            .map_err(RegistryError::store)?;
        self.store
            .set_status(&rec.spec.id, BotStatus::Pending, None, None)
            .await
            .map_err(RegistryError::store)?;
        self.tell(LifecycleEvent::Restart(rec.spec.id.clone()))
            .await
    }

    /// Imports JSON lines: each line is added (or, with `upsert`, added or updated) on its
    /// own; a refused line does not stop the others.
    pub(crate) async fn import<I>(
        &self,
        lines: I,
        upsert: bool,
        mut progress: impl FnMut(usize) + Send,
    ) -> Vec<LineResult>
    where
        I: IntoIterator<Item = (usize, Result<String, String>)>,
    {
        let mut out = Vec::new();
        for (n, line) in lines {
            progress(n);
            let line = match line {
                Ok(l) if l.trim().is_empty() => continue,
                Ok(l) => l,
                Err(e) => {
                    out.push(LineResult {
                        line: n,
                        id: None,
                        outcome: LineOutcome::Refused {
                            code: "invalid",
                            error: format!("unreadable: {e}"),
                        },
                    });
                    continue;
                }
            };
            let parsed = BotLine::from_json(&line);
            let id = parsed
                .as_ref()
                .ok()
                .and_then(|l| BotId::new(l.id.clone()).ok())
                .map(|i| i.to_string());
            let result = match parsed {
                Err(e) => Err(e),
                Ok(l) if upsert => self.upsert(l).await,
                Ok(l) => match l.into_spec() {
                    Ok(spec) => self.add(&spec).await.map(|()| Change::Added),
                    Err(e) => Err(e),
                },
            };
            out.push(LineResult {
                line: n,
                id,
                outcome: match result {
                    Ok(change) => LineOutcome::Done { change },
                    Err(e) => LineOutcome::Refused {
                        code: e.code,
                        error: e.message,
                    },
                },
            });
        }
        out
    }

    /// Every bot, as shown to people and clients.
    pub(crate) async fn list(&self) -> Result<Vec<BotView>, RegistryError> {
        let bots = self
            .store
            .list_bots(&BotFilter::default())
            .await
            .map_err(RegistryError::store)?;
        let inbox = self
            .store
            .inbox_stats()
            .await
            .map_err(RegistryError::store)?;
        // A bot its live worker reports running is owned by that worker; only the others
        // cost a coordinator call (10,000 bots are not 10,000 round trips).
        let live: std::collections::HashSet<String> = match &self.fleet {
            Some(c) => c
                .live_workers()
                .await
                .map_err(|e| RegistryError {
                    code: "fleet_unreachable",
                    message: format!("cannot list the workers: {e}"),
                })?
                .into_iter()
                .map(|w| w.id.to_string())
                .collect(),
            None => std::collections::HashSet::new(),
        };
        let mut out = Vec::with_capacity(bots.len());
        for b in bots {
            if b.spec.is_sliced() {
                let v = self.sliced(b, &inbox).await?;
                out.push(v);
                continue;
            }
            let owner = match reported_owner(&b, |w| live.contains(w)) {
                Some(w) => Some(w.to_owned()),
                None => self.owner_of(&b).await?,
            };
            let is_linked = linked(self.store.as_ref(), &b.spec).await?;
            let mut v = view(b, owner, &inbox);
            v.linked = is_linked;
            out.push(v);
        }
        Ok(out)
    }

    /// One bot, as [`Registry::list`] shows it.
    pub(crate) async fn show(&self, id: &str) -> Result<BotView, RegistryError> {
        let rec = self.get(id).await?;
        let inbox = self
            .store
            .inbox_stats()
            .await
            .map_err(RegistryError::store)?;
        if rec.spec.is_sliced() {
            return self.sliced(rec, &inbox).await;
        }
        let owner = self.owner_of(&rec).await?;
        let is_linked = linked(self.store.as_ref(), &rec.spec).await?;
        let mut v = view(rec, owner, &inbox);
        v.linked = is_linked;
        Ok(v)
    }

    /// A bot split into slices: each slice with its shards and owner; the bot's owner is
    /// the list of workers holding its slices; pending counts add up its slices'.
    async fn sliced(
        &self,
        b: BotRecord,
        inbox: &HashMap<BotId, botfleet_store::InboxStats>,
    ) -> Result<BotView, RegistryError> {
        let mut slices = Vec::new();
        let mut owners: Vec<String> = Vec::new();
        let (mut pending, mut held, mut undeliverable) = (0, 0, 0);
        let mut sends = botfleet_store::SendCounts::default();
        let total = b.spec.shard_total().unwrap_or(1);
        for u in b.spec.units() {
            let owner = match &self.fleet {
                Some(c) => c
                    .owner(&u.id)
                    .await
                    .map_err(|e| RegistryError {
                        code: "fleet_unreachable",
                        message: format!("cannot read a slice's owner: {e}"),
                    })?
                    .filter(|o| o.live)
                    .map(|o| o.worker.to_string()),
                None => None,
            };
            if let Some(o) = &owner {
                if !owners.contains(o) {
                    owners.push(o.clone());
                }
            }
            if let Some(s) = inbox.get(&u.id) {
                pending += s.pending;
                held += s.held;
                undeliverable += s.undeliverable;
                sends += s.sends;
            }
            let r = u.shard_range(total);
            slices.push(SliceView {
                unit: u.id.to_string(),
                first_shard: r.start,
                shards: r.end - r.start,
                state: if owner.is_some() {
                    "running"
                } else {
                    "unowned"
                },
                owner,
            });
        }
        owners.sort();
        let owner = (!owners.is_empty()).then(|| owners.join(","));
        let mut v = view(b, owner, inbox);
        v.pending = pending;
        v.held = held;
        v.undeliverable = undeliverable;
        v.sends = sends.into();
        v.slices = slices;
        Ok(v)
    }

    async fn owner_of(&self, b: &BotRecord) -> Result<Option<String>, RegistryError> {
        Ok(match &self.fleet {
            Some(c) => c
                .owner(&b.spec.id)
                .await
                .map_err(|e| RegistryError {
                    code: "fleet_unreachable",
                    message: format!("cannot read the bot's owner: {e}"),
                })?
                .filter(|o| o.live)
                .map(|o| o.worker.to_string()),
            None => b
                .reported_by
                .clone()
                .filter(|_| b.status == BotStatus::Running),
        })
    }
}

/// The worker running `b` by its own report, when that worker is live: no coordinator call
/// needed. A slice's status is its bot's (any slice), so slices are never answered here.
pub(crate) fn reported_owner(b: &BotRecord, is_live: impl Fn(&str) -> bool) -> Option<&str> {
    b.reported_by.as_deref().filter(|w| {
        b.spec.id.slice_index().is_none() && b.status == BotStatus::Running && is_live(w)
    })
}

fn view(
    b: BotRecord,
    owner: Option<String>,
    inbox: &HashMap<BotId, botfleet_store::InboxStats>,
) -> BotView {
    let stats = inbox.get(&b.spec.id);
    BotView {
        id: b.spec.id.to_string(),
        platform: b.spec.platform.as_str().to_owned(),
        enabled: b.spec.enabled,
        status: b.status.as_str().to_owned(),
        owner,
        pending: stats.map_or(0, |s| s.pending),
        held: stats.map_or(0, |s| s.held),
        paused_chats: stats.map_or(0, |s| s.paused_chats),
        undeliverable: stats.map_or(0, |s| s.undeliverable),
        sends: stats.map(|s| s.sends).unwrap_or_default().into(),
        last_error: b.last_error,
        handler: b.spec.handler.kind().to_owned(),
        webhook_url: match &b.spec.handler {
            HandlerSpec::Webhook { url, .. } => Some(url.clone()),
            HandlerSpec::Echo | HandlerSpec::Named(_) => None,
        },
        api_url: b.spec.options.api_url.clone(),
        has_app_token: b.spec.app_token.is_some(),
        mode: botfleet_runtime::descriptor(b.spec.platform)
            .map_or("?", |d| d.mode_name(&b.spec))
            .to_owned(),
        has_hook_secret: b.spec.hook.secret.is_some(),
        shards: b.spec.options.shards,
        shards_per_slice: b.spec.options.shards_per_slice,
        shards_in_use: b.spec.options.shards_in_use,
        shards_recommended: b.spec.options.shards_recommended,
        slices: Vec::new(),
        updated_at_ms: b.updated_at_ms,
        linked: None,
        commands: b.spec.options.commands.clone(),
        handler_timeout_s: b.spec.options.handler_timeout_s,
        async_reply_ttl_s: b.spec.options.async_reply_ttl_s,
        typing: b.spec.shows_typing()
            && botfleet_runtime::descriptor(b.spec.platform)
                .and_then(|d| d.mode_of(&b.spec))
                .is_some_and(|m| m.caps.typing),
        stream: b.spec.stream_mode().as_str(),
        rate_limits: b.spec.options.rate_limits.clone(),
    }
}

/// Whether a device-link bot's stored session holds a linked device (one with its phone
/// number); `None` for every other bot.
pub(crate) async fn linked(
    store: &dyn Store,
    spec: &BotSpec,
) -> Result<Option<bool>, RegistryError> {
    if !botfleet_whatsapp::is_device_link(spec) {
        return Ok(None);
    }
    let device = store
        .session_records(&spec.id, "device")
        .await
        .map_err(RegistryError::store)?;
    #[cfg(feature = "whatsapp-web")]
    let linked = device
        .iter()
        .any(|(_, v)| botfleet_whatsapp::web::device_is_linked(v));
    // A build without device-link cannot read the record: present is as far as it can tell.
    #[cfg(not(feature = "whatsapp-web"))]
    let linked = !device.is_empty();
    Ok(Some(linked))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> Registry {
        Registry {
            store: Arc::new(botfleet_store::MemoryStore::default()),
            fleet: None,
        }
    }

    #[tokio::test]
    async fn update_changes_only_what_it_names_and_refuses_bad_specs() {
        let r = registry();
        let line = BotLine::from_json(r#"{"id":"a","platform":"telegram","token":"1:old","handler":"webhook","webhook_url":"http://127.0.0.1:9/h"}"#).unwrap();
        r.add(&line.into_spec().unwrap()).await.unwrap();
        let c = r
            .update("a", BotPatch::from_json(r#"{"token":"1:new"}"#).unwrap())
            .await
            .unwrap();
        assert_eq!(c, Change::Updated);
        let rec = r.get("a").await.unwrap();
        assert_eq!(rec.spec.token.expose(), "1:new");
        assert_eq!(rec.spec.handler.kind(), "webhook", "the handler is kept");
        // The same value again changes nothing.
        let c = r
            .update("a", BotPatch::from_json(r#"{"token":"1:new"}"#).unwrap())
            .await
            .unwrap();
        assert_eq!(c, Change::Unchanged);
        // Clearing the webhook URL of a webhook bot is refused; nothing changes.
        let e = r
            .update("a", BotPatch::from_json(r#"{"webhook_url":null}"#).unwrap())
            .await
            .unwrap_err();
        assert_eq!(e.code, "invalid");
        assert_eq!(r.get("a").await.unwrap().spec, rec.spec);
        // Back to echo drops the webhook.
        r.update("a", BotPatch::from_json(r#"{"handler":"echo"}"#).unwrap())
            .await
            .unwrap();
        assert_eq!(r.get("a").await.unwrap().spec.handler, HandlerSpec::Echo);
        let e = r.update("nope", BotPatch::default()).await.unwrap_err();
        assert_eq!(e.code, "not_found");
    }

    /// What the fleet counted for a Discord bot on the recommended count is not the
    /// operator's: an unchanged line keeps it (and changes nothing); a change or a restart
    /// has the bot counted again (the count in use kept, so old slices are waited for).
    #[tokio::test]
    async fn a_counted_bot_is_counted_again_on_a_change_or_a_restart() {
        let r = registry();
        let text =
            r#"{"id":"d","platform":"discord","token":"t1","shards":"auto","shards_per_slice":2}"#;
        let line = || BotLine::from_json(text).unwrap();
        assert_eq!(r.upsert(line()).await.unwrap(), Change::Added);
        // The fleet counts it.
        let mut spec = r.get("d").await.unwrap().spec;
        assert!(spec.is_counting());
        spec.options.shards_in_use = Some(6);
        spec.options.shards_recommended = Some(6);
        r.store.update_bot(&spec).await.unwrap();
        assert_eq!(r.upsert(line()).await.unwrap(), Change::Unchanged);
        let now = r.get("d").await.unwrap().spec;
        assert_eq!(now.units().len(), 3, "the count stands");
        let view = r.show("d").await.unwrap();
        assert_eq!(
            (view.shards_in_use, view.shards_recommended),
            (Some(6), Some(6))
        );
        // A change of the token restarts it: counted again, old count kept for the wait.
        let c = r
            .update("d", BotPatch::from_json(r#"{"token":"t2"}"#).unwrap())
            .await
            .unwrap();
        assert_eq!(c, Change::Updated);
        let after = r.get("d").await.unwrap().spec;
        assert!(after.is_counting());
        assert_eq!(after.options.shards_in_use, Some(6));
        // So does a restart.
        r.store.update_bot(&now).await.unwrap();
        r.restart("d").await.unwrap();
        let after = r.get("d").await.unwrap().spec;
        assert!(after.is_counting() && after.options.shards_in_use == Some(6));
        // A fixed count: no count of the fleet's is kept.
        r.update("d", BotPatch::from_json(r#"{"shards":8}"#).unwrap())
            .await
            .unwrap();
        let fixed = r.get("d").await.unwrap().spec;
        assert_eq!(fixed.options.shards_in_use, None);
        assert_eq!(fixed.units().len(), 4);
    }

    #[tokio::test]
    async fn upsert_adds_updates_and_keeps_the_enabled_setting() {
        let r = registry();
        let line = |s: &str| BotLine::from_json(s).unwrap();
        let add = r#"{"id":"a","platform":"telegram","token":"1:a"}"#;
        assert_eq!(r.upsert(line(add)).await.unwrap(), Change::Added);
        assert_eq!(r.upsert(line(add)).await.unwrap(), Change::Unchanged);
        r.set_enabled("a", false).await.unwrap();
        let rotate = r#"{"id":"a","platform":"telegram","token":"1:b"}"#;
        assert_eq!(r.upsert(line(rotate)).await.unwrap(), Change::Updated);
        let rec = r.get("a").await.unwrap();
        assert_eq!(rec.spec.token.expose(), "1:b");
        assert!(
            !rec.spec.enabled,
            "a line without enabled keeps the setting"
        );
        let other = r#"{"id":"a","platform":"slack","token":"xoxb-1","app_token":"xapp-1"}"#;
        assert_eq!(r.upsert(line(other)).await.unwrap_err().code, "invalid");
        // Without upsert an existing id is refused, line by line.
        let report = r
            .import(
                vec![
                    (1, Ok(add.to_owned())),
                    (
                        2,
                        Ok(r#"{"id":"b","platform":"telegram","token":"1:b"}"#.to_owned()),
                    ),
                    (3, Ok("{".to_owned())),
                ],
                false,
                |_| {},
            )
            .await;
        let codes: Vec<String> = report
            .iter()
            .map(|l| match &l.outcome {
                LineOutcome::Done { change } => format!("{change:?}"),
                LineOutcome::Refused { code, .. } => (*code).to_owned(),
            })
            .collect();
        assert_eq!(codes, ["exists", "Added", "invalid"]);
    }
}
