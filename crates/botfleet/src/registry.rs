//! Changing the bot registry, once for the CLI and the control API: every change is written
//! to the store and then announced to the fleet as a lifecycle event, so the bot's owner acts
//! within a second. Errors carry a stable code (the API's JSON `code`) and a message that
//! never holds a credential.

use std::{collections::HashMap, fmt, sync::Arc};

use botfleet_coord::{Coordinator, LifecycleEvent};
use botfleet_core::{
    BotId, BotOptions, BotRecord, BotSpec, BotStatus, HandlerSpec, Platform, Secret,
};
use botfleet_store::{BotFilter, Store, StoreError};
use serde::Serialize;
use serde_json::{Map, Value};

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

/// The fields of an import line (and of `POST /api/v1/bots`).
pub(crate) const BOT_FIELDS: &[&str] = &[
    "id",
    "platform",
    "token",
    "app_token",
    "api_url",
    "handler",
    "webhook_url",
    "webhook_secret",
    "enabled",
    "shards",
    "shards_per_slice",
    "mode",
    "secret_token",
    "signing_secret",
    "app_secret",
    "verify_token",
    "phone_number_id",
    "max_connections",
];

/// One bot as `bots add` flags, a `bots import` line or an API request describe it.
#[derive(Debug, Default)]
pub(crate) struct BotLine {
    pub(crate) id: String,
    pub(crate) platform: String,
    pub(crate) token: String,
    pub(crate) app_token: Option<String>,
    pub(crate) api_url: Option<String>,
    pub(crate) handler: Option<String>,
    pub(crate) webhook_url: Option<String>,
    pub(crate) webhook_secret: Option<String>,
    pub(crate) enabled: Option<bool>,
    /// Discord: `auto` (None) or a count.
    pub(crate) shards: Option<u32>,
    /// Discord: shards per slice (None: one unit).
    pub(crate) shards_per_slice: Option<u32>,
    /// Webhook settings.
    pub(crate) hook: HookFields,
}

/// How a bot receives and what verifies its webhook deliveries, as the fields name them.
#[derive(Debug, Default)]
pub(crate) struct HookFields {
    /// `poll`/`webhook` (Telegram), `socket`/`events` (Slack), `cloud`/`web` (WhatsApp).
    pub(crate) mode: Option<String>,
    /// Telegram webhook mode's secret token.
    pub(crate) secret_token: Option<String>,
    /// Slack Events API's signing secret.
    pub(crate) signing_secret: Option<String>,
    /// WhatsApp Cloud API's app secret.
    pub(crate) app_secret: Option<String>,
    /// WhatsApp Cloud API's verify token.
    pub(crate) verify_token: Option<String>,
    /// WhatsApp Cloud API's phone number id.
    pub(crate) phone_number_id: Option<String>,
    /// Telegram webhook mode: `max_connections` for `setWebhook`.
    pub(crate) max_connections: Option<u32>,
}

impl HookFields {
    /// Reads one field; `Ok(false)` when `k` is not a hook field.
    fn read(&mut self, k: &str, v: &Value) -> Result<bool, RegistryError> {
        match k {
            "mode" => self.mode = text(k, v)?,
            "secret_token" => self.secret_token = text(k, v)?,
            "signing_secret" => self.signing_secret = text(k, v)?,
            "app_secret" => self.app_secret = text(k, v)?,
            "verify_token" => self.verify_token = text(k, v)?,
            "phone_number_id" => self.phone_number_id = text(k, v)?,
            "max_connections" => {
                self.max_connections =
                    match v {
                        Value::Null => None,
                        Value::Number(n) => {
                            Some(n.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(
                                || RegistryError::invalid("field max_connections must be 1-100"),
                            )?)
                        }
                        _ => {
                            return Err(RegistryError::invalid(
                                "field max_connections must be 1-100",
                            ))
                        }
                    };
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn write(&self, o: &mut Map<String, Value>) {
        put_texts(
            o,
            [
                ("mode", &self.mode),
                ("secret_token", &self.secret_token),
                ("signing_secret", &self.signing_secret),
                ("app_secret", &self.app_secret),
                ("verify_token", &self.verify_token),
                ("phone_number_id", &self.phone_number_id),
            ],
        );
        if let Some(n) = self.max_connections {
            o.insert("max_connections".into(), n.into());
        }
    }

    pub(crate) fn any(&self) -> bool {
        self.mode.is_some()
            || self.secret_token.is_some()
            || self.signing_secret.is_some()
            || self.app_secret.is_some()
            || self.verify_token.is_some()
            || self.phone_number_id.is_some()
            || self.max_connections.is_some()
    }

    /// Applies the fields to `spec` (an empty text clears), checking each secret's name fits
    /// the platform.
    fn apply(self, spec: &mut BotSpec) -> Result<(), RegistryError> {
        let clear = |v: String| Some(v).filter(|v| !v.is_empty());
        let gave_secret = [&self.secret_token, &self.signing_secret, &self.app_secret]
            .iter()
            .any(|v| v.as_deref().is_some_and(|v| !v.is_empty()));
        if let Some(m) = self.mode {
            spec.options.mode = clear(m);
        }
        let own = match spec.platform {
            Platform::Telegram => "secret_token",
            Platform::Slack => "signing_secret",
            Platform::Whatsapp => "app_secret",
            Platform::Discord => "",
        };
        for (name, v) in [
            ("secret_token", self.secret_token),
            ("signing_secret", self.signing_secret),
            ("app_secret", self.app_secret),
        ] {
            if let Some(v) = v {
                if name != own {
                    return Err(RegistryError::invalid(format!(
                        "field {name} is not a {} setting{}",
                        spec.platform,
                        if own.is_empty() {
                            String::new()
                        } else {
                            format!(" (it takes {own})")
                        }
                    )));
                }
                spec.hook.secret = clear(v).map(Secret::new);
            }
        }
        if spec.platform != Platform::Whatsapp
            && (self.verify_token.is_some() || self.phone_number_id.is_some())
        {
            return Err(RegistryError::invalid(
                "fields verify_token and phone_number_id are WhatsApp settings",
            ));
        }
        if let Some(v) = self.verify_token {
            spec.hook.verify_token = clear(v).map(Secret::new);
        }
        if let Some(v) = self.phone_number_id {
            spec.options.phone_number_id = clear(v);
        }
        if let Some(n) = self.max_connections {
            if spec.platform != Platform::Telegram {
                return Err(RegistryError::invalid(
                    "field max_connections is a Telegram webhook setting",
                ));
            }
            spec.options.max_connections = Some(n);
        }
        if spec.platform == Platform::Whatsapp
            && spec.mode() == "web"
            && !cfg!(feature = "whatsapp-web")
        {
            return Err(RegistryError::invalid(
                "WhatsApp device-link (mode web) is not in this build (cargo feature whatsapp-web); mode cloud (the Cloud API) is",
            ));
        }
        if gave_secret && !spec.is_webhook() && spec.platform != Platform::Whatsapp {
            return Err(RegistryError::invalid(format!(
                "a webhook secret needs mode {}",
                if spec.platform == Platform::Slack {
                    "events"
                } else {
                    "webhook"
                }
            )));
        }
        // Leaving a webhook mode forgets the settings only it uses.
        if !spec.is_webhook() && spec.platform != Platform::Whatsapp {
            spec.hook = botfleet_core::HookSecrets::default();
            spec.options.max_connections = None;
        }
        Ok(())
    }
}

/// Puts the fields that are set into `o` as strings.
fn put_texts<const N: usize>(o: &mut Map<String, Value>, fields: [(&str, &Option<String>); N]) {
    for (k, v) in fields {
        if let Some(v) = v {
            o.insert(k.into(), v.clone().into());
        }
    }
}

/// Reads a JSON object. Errors name the place, never a value (a token may be anywhere).
fn object(text: &str) -> Result<Map<String, Value>, RegistryError> {
    let v: Value = serde_json::from_str(text).map_err(|e| {
        RegistryError::invalid(format!(
            "not JSON (line {}, column {}): {}",
            e.line(),
            e.column(),
            match e.classify() {
                serde_json::error::Category::Eof => "it ends early",
                serde_json::error::Category::Syntax => "a syntax error",
                _ => "unreadable",
            }
        ))
    })?;
    match v {
        Value::Object(o) => Ok(o),
        _ => Err(RegistryError::invalid("not a JSON object")),
    }
}

/// A field's string value: `Ok(None)` for null, an error naming the field otherwise.
fn text(name: &str, v: &Value) -> Result<Option<String>, RegistryError> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        _ => Err(RegistryError::invalid(format!(
            "field {name} must be a string"
        ))),
    }
}

fn flag(name: &str, v: &Value) -> Result<Option<bool>, RegistryError> {
    match v {
        Value::Null => Ok(None),
        Value::Bool(b) => Ok(Some(*b)),
        _ => Err(RegistryError::invalid(format!(
            "field {name} must be true or false"
        ))),
    }
}

/// `shards`: `"auto"` (or null) for Discord's recommendation, else a count.
pub(crate) fn shards(v: &Value) -> Result<Option<u32>, RegistryError> {
    let bad = || RegistryError::invalid("field shards must be \"auto\" or a number from 1 to 4096");
    match v {
        Value::Null => Ok(None),
        Value::String(s) if s == "auto" => Ok(None),
        Value::String(s) => s.parse::<u32>().map(Some).map_err(|_| bad()),
        Value::Number(n) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(bad),
        _ => Err(bad()),
    }
}

/// `shards_per_slice`: a number from 1 to 4096, or null for none.
pub(crate) fn per_slice(v: &Value) -> Result<Option<u32>, RegistryError> {
    match v {
        Value::Null => Ok(None),
        Value::Number(n) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| (1..=4096).contains(n))
            .map(Some)
            .ok_or_else(|| {
                RegistryError::invalid("field shards_per_slice must be a number from 1 to 4096")
            }),
        _ => Err(RegistryError::invalid(
            "field shards_per_slice must be a number from 1 to 4096",
        )),
    }
}

fn unknown(key: &str, known: &[&str]) -> RegistryError {
    let shown: String = key.chars().take(40).collect();
    RegistryError::invalid(format!(
        "unknown field {shown:?} (known: {})",
        known.join(", ")
    ))
}

impl BotLine {
    /// Reads one JSON object (an import line, an API body).
    pub(crate) fn from_json(line: &str) -> Result<Self, RegistryError> {
        let obj = object(line)?;
        let mut out = BotLine::default();
        for (k, v) in &obj {
            match k.as_str() {
                "id" => out.id = text(k, v)?.unwrap_or_default(),
                "platform" => out.platform = text(k, v)?.unwrap_or_default(),
                "token" => out.token = text(k, v)?.unwrap_or_default(),
                "app_token" => out.app_token = text(k, v)?,
                "api_url" => out.api_url = text(k, v)?,
                "handler" => out.handler = text(k, v)?,
                "webhook_url" => out.webhook_url = text(k, v)?,
                "webhook_secret" => out.webhook_secret = text(k, v)?,
                "enabled" => out.enabled = flag(k, v)?,
                "shards" => out.shards = shards(v)?,
                "shards_per_slice" => out.shards_per_slice = per_slice(v)?,
                _ if out.hook.read(k, v)? => {}
                _ => return Err(unknown(k, BOT_FIELDS)),
            }
        }
        // A WhatsApp device-link bot has no token: a linked session stands for it.
        let device_link = out.platform == "whatsapp" && out.hook.mode.as_deref() == Some("web");
        for (field, value) in [
            ("id", &out.id),
            ("platform", &out.platform),
            ("token", &out.token),
        ] {
            if value.is_empty() && !(field == "token" && device_link) {
                return Err(RegistryError::invalid(format!("missing field {field}")));
            }
        }
        Ok(out)
    }

    /// The line as JSON (what `POST /api/v1/bots` takes).
    pub(crate) fn to_json(&self) -> Value {
        let mut o = Map::new();
        o.insert("id".into(), self.id.clone().into());
        o.insert("platform".into(), self.platform.clone().into());
        o.insert("token".into(), self.token.clone().into());
        put_texts(
            &mut o,
            [
                ("app_token", &self.app_token),
                ("api_url", &self.api_url),
                ("handler", &self.handler),
                ("webhook_url", &self.webhook_url),
                ("webhook_secret", &self.webhook_secret),
            ],
        );
        if let Some(e) = self.enabled {
            o.insert("enabled".into(), e.into());
        }
        if let Some(n) = self.shards {
            o.insert("shards".into(), n.into());
        }
        if let Some(n) = self.shards_per_slice {
            o.insert("shards_per_slice".into(), n.into());
        }
        self.hook.write(&mut o);
        Value::Object(o)
    }

    /// The spec this line describes, validated.
    pub(crate) fn into_spec(self) -> Result<BotSpec, RegistryError> {
        let bad = |e: &dyn fmt::Display| RegistryError::invalid(e.to_string());
        let id = BotId::new(self.id).map_err(|e| bad(&e))?;
        let platform: Platform = self.platform.parse().map_err(|e| bad(&e))?;
        let supported = botfleet_runtime::supported_platforms();
        if !supported.contains(&platform) {
            let names: Vec<&str> = supported.iter().map(|p| p.as_str()).collect();
            return Err(RegistryError::invalid(format!(
                "platform {platform} does not run in this build yet (it runs: {})",
                names.join(", ")
            )));
        }
        let handler = HandlerSpec::from_parts(
            self.handler.as_deref().unwrap_or("echo"),
            self.webhook_url,
            self.webhook_secret.map(Secret::new),
        )
        .map_err(|e| bad(&e))?;
        let mut spec = BotSpec {
            id,
            platform,
            token: Secret::new(self.token),
            app_token: self.app_token.map(Secret::new),
            options: BotOptions {
                api_url: self.api_url,
                shards: self.shards,
                shards_per_slice: self.shards_per_slice,
                ..BotOptions::default()
            },
            hook: botfleet_core::HookSecrets::default(),
            handler,
            enabled: self.enabled.unwrap_or(true),
        };
        self.hook.apply(&mut spec)?;
        spec.validate().map_err(|e| bad(&e))?;
        Ok(spec)
    }
}

/// The fields a change may touch (`bots update`, `PATCH /api/v1/bots/{id}`). `None`: keep;
/// `Some(None)`: clear (back to the default); `Some(Some(v))`: set.
#[derive(Debug, Default)]
pub(crate) struct BotPatch {
    pub(crate) token: Option<String>,
    pub(crate) app_token: Option<Option<String>>,
    pub(crate) api_url: Option<Option<String>>,
    pub(crate) handler: Option<String>,
    pub(crate) webhook_url: Option<Option<String>>,
    pub(crate) webhook_secret: Option<Option<String>>,
    pub(crate) enabled: Option<bool>,
    /// Discord: `Some(None)` back to `auto`.
    pub(crate) shards: Option<Option<u32>>,
    /// Discord: `Some(None)` back to one unit.
    pub(crate) shards_per_slice: Option<Option<u32>>,
    /// Webhook settings (an empty text clears one).
    pub(crate) hook: HookFields,
}

/// The fields of a patch.
pub(crate) const PATCH_FIELDS: &[&str] = &[
    "token",
    "app_token",
    "api_url",
    "handler",
    "webhook_url",
    "webhook_secret",
    "enabled",
    "shards",
    "shards_per_slice",
    "mode",
    "secret_token",
    "signing_secret",
    "app_secret",
    "verify_token",
    "phone_number_id",
    "max_connections",
];

impl BotPatch {
    /// Reads a JSON object of [`PATCH_FIELDS`]; `null` clears an optional field.
    pub(crate) fn from_json(body: &str) -> Result<Self, RegistryError> {
        let obj = object(body)?;
        let mut p = BotPatch::default();
        for (k, v) in &obj {
            match k.as_str() {
                "token" => {
                    p.token =
                        Some(text(k, v)?.ok_or_else(|| {
                            RegistryError::invalid("field token cannot be cleared")
                        })?);
                }
                "app_token" => p.app_token = Some(text(k, v)?),
                "api_url" => p.api_url = Some(text(k, v)?),
                "handler" => {
                    p.handler = Some(text(k, v)?.ok_or_else(|| {
                        RegistryError::invalid(
                            "field handler cannot be cleared (echo is the default)",
                        )
                    })?);
                }
                "webhook_url" => p.webhook_url = Some(text(k, v)?),
                "webhook_secret" => p.webhook_secret = Some(text(k, v)?),
                "shards" => p.shards = Some(shards(v)?),
                "shards_per_slice" => p.shards_per_slice = Some(per_slice(v)?),
                "enabled" => {
                    p.enabled = Some(flag(k, v)?.ok_or_else(|| {
                        RegistryError::invalid("field enabled must be true or false")
                    })?);
                }
                "id" | "platform" => {
                    return Err(RegistryError::invalid(format!(
                        "field {k} cannot be changed (remove the bot and add it again)"
                    )))
                }
                _ if v.is_null()
                    && k != "max_connections"
                    && p.hook.read(k, &Value::String(String::new()))? => {}
                _ if p.hook.read(k, v)? => {}
                _ => return Err(unknown(k, PATCH_FIELDS)),
            }
        }
        Ok(p)
    }

    /// The patch as JSON (what `PATCH /api/v1/bots/{id}` takes): `null` clears.
    pub(crate) fn to_json(&self) -> Value {
        let mut o = Map::new();
        if let Some(t) = &self.token {
            o.insert("token".into(), t.clone().into());
        }
        if let Some(h) = &self.handler {
            o.insert("handler".into(), h.clone().into());
        }
        if let Some(e) = self.enabled {
            o.insert("enabled".into(), e.into());
        }
        if let Some(n) = self.shards {
            o.insert("shards".into(), n.map_or(Value::from("auto"), Value::from));
        }
        if let Some(n) = self.shards_per_slice {
            o.insert(
                "shards_per_slice".into(),
                n.map_or(Value::Null, Value::from),
            );
        }
        for (k, v) in [
            ("app_token", &self.app_token),
            ("api_url", &self.api_url),
            ("webhook_url", &self.webhook_url),
            ("webhook_secret", &self.webhook_secret),
        ] {
            if let Some(v) = v {
                o.insert(k.into(), v.clone().map_or(Value::Null, Value::from));
            }
        }
        self.hook.write(&mut o);
        Value::Object(o)
    }

    /// `spec` with this patch applied, validated.
    fn apply(self, spec: &BotSpec) -> Result<BotSpec, RegistryError> {
        let mut next = spec.clone();
        if let Some(t) = self.token {
            next.token = Secret::new(t);
        }
        if let Some(t) = self.app_token {
            next.app_token = t.map(Secret::new);
        }
        if let Some(u) = self.api_url {
            next.options.api_url = u;
        }
        if let Some(e) = self.enabled {
            next.enabled = e;
        }
        if let Some(n) = self.shards {
            next.options.shards = n;
        }
        if let Some(n) = self.shards_per_slice {
            next.options.shards_per_slice = n;
        }
        let (mut url, mut secret) = match &spec.handler {
            HandlerSpec::Echo => (None, None),
            HandlerSpec::Webhook { url, secret } => (Some(url.clone()), secret.clone()),
        };
        if let Some(u) = self.webhook_url {
            url = u;
        }
        if let Some(s) = self.webhook_secret {
            secret = s.map(Secret::new);
        }
        let kind = self
            .handler
            .unwrap_or_else(|| spec.handler.kind().to_owned());
        next.handler = HandlerSpec::from_parts(&kind, url, secret)
            .map_err(|e| RegistryError::invalid(e.to_string()))?;
        self.hook.apply(&mut next)?;
        next.validate()
            .map_err(|e| RegistryError::invalid(e.to_string()))?;
        Ok(next)
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
    /// Messages given up on (handler or send failed past the retry time, or refused).
    pub(crate) undeliverable: u64,
    pub(crate) last_error: Option<String>,
    pub(crate) handler: &'static str,
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
    /// Discord, split into slices: each slice's shards and who runs it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) slices: Vec<SliceView>,
    /// Unix milliseconds of the spec's last change.
    pub(crate) updated_at_ms: i64,
    /// WhatsApp device-link bots: whether a phone linked the device (`bots link`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) linked: Option<bool>,
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
    async fn write(&self, old: &BotSpec, next: BotSpec) -> Result<Change, RegistryError> {
        if *old == next {
            return Ok(Change::Unchanged);
        }
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
        let rec = self.get(id).await?;
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
            if b.spec.options.shards_per_slice.is_some() {
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
        if rec.spec.options.shards_per_slice.is_some() {
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
        let (mut pending, mut undeliverable) = (0, 0);
        let total = b.spec.options.shards.unwrap_or(1);
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
                undeliverable += s.undeliverable;
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
        v.undeliverable = undeliverable;
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
        undeliverable: stats.map_or(0, |s| s.undeliverable),
        last_error: b.last_error,
        handler: b.spec.handler.kind(),
        webhook_url: match &b.spec.handler {
            HandlerSpec::Webhook { url, .. } => Some(url.clone()),
            HandlerSpec::Echo => None,
        },
        api_url: b.spec.options.api_url.clone(),
        has_app_token: b.spec.app_token.is_some(),
        mode: b.spec.mode().to_owned(),
        has_hook_secret: b.spec.hook.secret.is_some(),
        shards: b.spec.options.shards,
        shards_per_slice: b.spec.options.shards_per_slice,
        slices: Vec::new(),
        updated_at_ms: b.updated_at_ms,
        linked: None,
    }
}

/// Whether a device-link bot's stored session holds a linked device (one with its phone
/// number); `None` for every other bot.
pub(crate) async fn linked(
    store: &dyn Store,
    spec: &BotSpec,
) -> Result<Option<bool>, RegistryError> {
    if spec.platform != Platform::Whatsapp || spec.mode() != "web" {
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

    #[test]
    fn errors_name_fields_never_values() {
        let e =
            BotLine::from_json(r#"{"id":"a","platform":"telegram","token":"1:sekrit","tokn":"x"}"#)
                .unwrap_err();
        assert_eq!(e.code, "invalid");
        assert!(e.message.contains("\"tokn\""), "{e}");
        assert!(!e.message.contains("sekrit"));
        let e = BotPatch::from_json(r#"{"token": 5}"#).unwrap_err();
        assert_eq!(e.message, "field token must be a string");
        let e = BotPatch::from_json(r#"{"platform": "slack"}"#).unwrap_err();
        assert!(e.message.contains("cannot be changed"), "{e}");
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
