//! What a `bots import` line, `bots add`/`bots update` flags and the API's bodies say about a
//! bot, read with serde-derived types. Which fields a bot takes is its platform's descriptor's
//! say (`botfleet_runtime::DESCRIPTORS`), not this file's. Errors name the field (and the
//! import line, in a report), never a value: a token may be in any field.

use std::fmt;

use botfleet_core::{
    BotId, BotOptions, BotSpec, Descriptor, HandlerSpec, HookSecrets, Need, Platform, Secret,
    Setting,
};
use serde::{de::DeserializeOwned, Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use crate::registry::RegistryError;

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
    "commands",
    "handler_timeout_s",
    "typing",
    "async_reply_ttl_s",
    "stream",
    "rate_limits",
];

/// The fields of a change (`PATCH /api/v1/bots/{id}`): every bot field but the two that name
/// it.
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
    "commands",
    "handler_timeout_s",
    "typing",
    "async_reply_ttl_s",
    "stream",
    "rate_limits",
];

/// One bot as `bots add` flags, a `bots import` line or `POST /api/v1/bots` describe it.
#[derive(Default, Deserialize, Serialize, utoipa::ToSchema)]
#[schema(as = NewBot)]
#[serde(deny_unknown_fields)]
pub(crate) struct BotLine {
    /// Letters, digits, `- _ . @`; at most 128. Required.
    #[serde(default)]
    pub(crate) id: String,
    /// `telegram`, `slack`, `discord` or `whatsapp`. Required.
    #[serde(default)]
    pub(crate) platform: String,
    /// The platform token (Telegram bot token, Slack `xoxb-…`). Never returned. Required,
    /// except for a WhatsApp device-link bot (`mode` `web`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) token: String,
    /// Slack's app-level token (`xapp-…`). Never returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) app_token: Option<String>,
    /// The platform API's base URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) api_url: Option<String>,
    /// `echo` (default) or `webhook`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) handler: Option<String>,
    /// Where the webhook handler POSTs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) webhook_url: Option<String>,
    /// The webhook's HMAC-SHA256 key. Never returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) webhook_secret: Option<String>,
    /// Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) enabled: Option<bool>,
    /// Discord: `"auto"` (default: what Discord recommends) or a count from 1 to 4096.
    #[serde(
        default,
        deserialize_with = "shard_count",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>)]
    pub(crate) shards: Option<u32>,
    /// Discord: split the shards into slices of this many, placed apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) shards_per_slice: Option<u32>,
    /// How the bot receives: telegram `poll` (default) or `webhook`; slack `socket` (default)
    /// or `events`; discord `gateway`; whatsapp `cloud` (default) or `web`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) mode: Option<String>,
    /// Telegram webhook mode: the secret every delivery carries. Never returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) secret_token: Option<String>,
    /// Slack Events API: the signing secret. Never returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) signing_secret: Option<String>,
    /// WhatsApp Cloud API: the app secret. Never returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) app_secret: Option<String>,
    /// WhatsApp Cloud API: the subscription's verify token. Never returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) verify_token: Option<String>,
    /// WhatsApp Cloud API: the sending phone number's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) phone_number_id: Option<String>,
    /// Telegram webhook mode: deliveries in flight at once (1-100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max_connections: Option<u32>,
    /// Telegram, Discord: the bot's commands, `[{name, description, options}]`, registered
    /// with the platform by the fleet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub(crate) commands: Option<Vec<botfleet_core::CommandSpec>>,
    /// How long one handler call may take, in seconds (1-900; default: the workers'
    /// `--handler-timeout-s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) handler_timeout_s: Option<u32>,
    /// Whether typing is shown while a turn runs long (default true, where the platform has
    /// it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) typing: Option<bool>,
    /// How long a turn whose handler answered `202` waits for its answer, in seconds
    /// (10-86400; default: the workers' `--async-reply-ttl-s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) async_reply_ttl_s: Option<u32>,
    /// How a streamed answer goes: `native` (default: the platform's own streams where the
    /// chat has them, edits elsewhere) or `edits`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub(crate) stream: Option<botfleet_core::StreamMode>,
    /// The bot's own send limits over the workers' `--rate-limits`: `off`, `SCOPE=off` or
    /// `SCOPE=CALLS/SECONDS[:BURST]`, comma-separated, of its platform's scopes (e.g.
    /// `bot=100/1,group=off`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) rate_limits: Option<String>,
}

/// What a change may touch (`bots update`, `PATCH /api/v1/bots/{id}`): a field left out is
/// kept, `null` clears an optional one (back to its default), and for the receive settings an
/// empty text clears too.
#[derive(Default, Deserialize, Serialize, utoipa::ToSchema)]
#[schema(as = BotChange)]
#[serde(deny_unknown_fields)]
pub(crate) struct BotPatch {
    /// A new platform token. Never returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) token: Option<String>,
    /// A new app-level token; `null` removes it.
    #[serde(
        default,
        deserialize_with = "given",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>)]
    pub(crate) app_token: Option<Option<String>>,
    /// A new API base; `null` goes back to the platform's.
    #[serde(
        default,
        deserialize_with = "given",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>)]
    pub(crate) api_url: Option<Option<String>>,
    /// A new handler (`echo`, `webhook`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) handler: Option<String>,
    /// Where the webhook handler POSTs.
    #[serde(
        default,
        deserialize_with = "given",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>)]
    pub(crate) webhook_url: Option<Option<String>>,
    /// A new signing key; `null` sends unsigned requests.
    #[serde(
        default,
        deserialize_with = "given",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>)]
    pub(crate) webhook_secret: Option<Option<String>>,
    /// Run it or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) enabled: Option<bool>,
    /// Discord: a count, or `"auto"` (or `null`) for Discord's recommendation.
    #[serde(
        default,
        deserialize_with = "given_shards",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>)]
    pub(crate) shards: Option<Option<u32>>,
    /// Discord: shards per slice; `null` makes the bot one unit again.
    #[serde(
        default,
        deserialize_with = "given",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<u32>)]
    pub(crate) shards_per_slice: Option<Option<u32>>,
    /// See the bot's field of the same name.
    #[serde(
        default,
        deserialize_with = "null_clears",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) mode: Option<String>,
    /// See the bot's field of the same name.
    #[serde(
        default,
        deserialize_with = "null_clears",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) secret_token: Option<String>,
    /// See the bot's field of the same name.
    #[serde(
        default,
        deserialize_with = "null_clears",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) signing_secret: Option<String>,
    /// See the bot's field of the same name.
    #[serde(
        default,
        deserialize_with = "null_clears",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) app_secret: Option<String>,
    /// See the bot's field of the same name.
    #[serde(
        default,
        deserialize_with = "null_clears",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) verify_token: Option<String>,
    /// See the bot's field of the same name.
    #[serde(
        default,
        deserialize_with = "null_clears",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) phone_number_id: Option<String>,
    /// See the bot's field of the same name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max_connections: Option<u32>,
    /// The bot's commands, replaced; `null` or `[]` removes them.
    #[serde(
        default,
        deserialize_with = "given",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<Vec<Object>>)]
    pub(crate) commands: Option<Option<Vec<botfleet_core::CommandSpec>>>,
    /// A new handler timeout in seconds; `null` goes back to the workers'.
    #[serde(
        default,
        deserialize_with = "given",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<u32>)]
    pub(crate) handler_timeout_s: Option<Option<u32>>,
    /// Typing shown or not; `null` goes back to the default (shown).
    #[serde(
        default,
        deserialize_with = "given",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<bool>)]
    pub(crate) typing: Option<Option<bool>>,
    /// A new time to live of held turns in seconds; `null` goes back to the workers'.
    #[serde(
        default,
        deserialize_with = "given",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<u32>)]
    pub(crate) async_reply_ttl_s: Option<Option<u32>>,
    /// How streamed answers go (`native` or `edits`); `null` goes back to `native`.
    #[serde(
        default,
        deserialize_with = "given",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>)]
    pub(crate) stream: Option<Option<botfleet_core::StreamMode>>,
    /// The bot's own send limits (as a new bot's); `null` or `""` goes back to the workers'.
    #[serde(
        default,
        deserialize_with = "given",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>)]
    pub(crate) rate_limits: Option<Option<String>>,
}

/// Names the fields that are set, never their values.
fn set_fields(v: &impl Serialize) -> Vec<String> {
    match serde_json::to_value(v) {
        Ok(Value::Object(o)) => o.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

impl fmt::Debug for BotLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BotLine")
            .field("id", &self.id)
            .field("platform", &self.platform)
            .field("fields", &set_fields(self))
            .finish()
    }
}

impl fmt::Debug for BotPatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BotPatch")
            .field("fields", &set_fields(self))
            .finish()
    }
}

/// A present field's value, `null` included (`Some(None)`); a field left out stays `None`.
fn given<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// A receive setting of a change: `null` clears it, like an empty text.
fn null_clears<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Some(Option::<String>::deserialize(d)?.unwrap_or_default()))
}

/// `shards`: `"auto"` (or `null`) for Discord's recommendation, else a count (a number or
/// its digits).
fn shard_count<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    use serde::de::Error;
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Count(u64),
        Text(String),
    }
    match Option::<Raw>::deserialize(d)? {
        None => Ok(None),
        Some(Raw::Text(s)) if s == "auto" => Ok(None),
        Some(Raw::Text(s)) => s.parse().map(Some).map_err(|_| D::Error::custom("shards")),
        Some(Raw::Count(n)) => u32::try_from(n)
            .map(Some)
            .map_err(|_| D::Error::custom("shards")),
    }
}

fn given_shards<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<u32>>, D::Error> {
    shard_count(d).map(Some)
}

/// What a field must be, for an error that names it and never echoes what it held.
fn expected(field: &str) -> &'static str {
    match field {
        "enabled" => "must be true or false",
        "shards" => "must be \"auto\" or a number from 1 to 4096",
        "shards_per_slice" => "must be a number from 1 to 4096",
        "max_connections" => "must be 1-100",
        "handler_timeout_s" => "must be a number of seconds from 1 to 900",
        "typing" => "must be true or false",
        "async_reply_ttl_s" => "must be a number of seconds from 10 to 86400",
        "stream" => "must be \"native\" or \"edits\"",
        f if f.starts_with("commands") => {
            "must be a list of {name, description, options: [{name, description, type, required}]}"
        }
        _ => "must be a string",
    }
}

/// Reads a JSON object of `known` fields into `T`. Errors name the place or the field, never
/// a value (a token may be anywhere); `refuse` turns away fields before their types are read.
fn read<T: DeserializeOwned>(
    text: &str,
    known: &[&str],
    refuse: impl Fn(&str, &Value) -> Option<RegistryError>,
) -> Result<T, RegistryError> {
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
    let Value::Object(obj) = v else {
        return Err(RegistryError::invalid("not a JSON object"));
    };
    for (k, v) in &obj {
        if let Some(e) = refuse(k, v) {
            return Err(e);
        }
        if !known.contains(&k.as_str()) {
            let shown: String = k.chars().take(40).collect();
            return Err(RegistryError::invalid(format!(
                "unknown field {shown:?} (known: {})",
                known.join(", ")
            )));
        }
    }
    serde_path_to_error::deserialize(Value::Object(obj)).map_err(|e| {
        let field = e.path().to_string();
        RegistryError::invalid(format!("field {field} {}", expected(&field)))
    })
}

/// The receive settings a line or a change gives: `None` keeps, an empty text clears.
#[derive(Default)]
struct HookFields {
    mode: Option<String>,
    secrets: [(&'static str, Option<String>); 3],
    verify_token: Option<String>,
    phone_number_id: Option<String>,
    max_connections: Option<u32>,
}

impl HookFields {
    fn new(
        mode: Option<String>,
        [secret_token, signing_secret, app_secret]: [Option<String>; 3],
        verify_token: Option<String>,
        phone_number_id: Option<String>,
        max_connections: Option<u32>,
    ) -> Self {
        Self {
            mode,
            secrets: [
                ("secret_token", secret_token),
                ("signing_secret", signing_secret),
                ("app_secret", app_secret),
            ],
            verify_token,
            phone_number_id,
            max_connections,
        }
    }

    /// Applies the settings to `spec` as its platform's descriptor `d` allows: a secret under
    /// another platform's name is refused; settings the bot's (new) mode does not take and this
    /// change did not give are forgotten (back to polling drops the webhook's).
    fn apply(self, spec: &mut BotSpec, d: &Descriptor) -> Result<(), RegistryError> {
        let clear = |v: String| Some(v).filter(|v| !v.is_empty());
        if let Some(m) = self.mode {
            spec.options.mode = clear(m);
        }
        let mut gave_secret = false;
        for (name, v) in self.secrets {
            let Some(v) = v else { continue };
            if d.secret_field != Some(name) {
                return Err(RegistryError::invalid(format!(
                    "field {name} is not a {} setting{}",
                    spec.platform,
                    d.secret_field
                        .map(|own| format!(" (it takes {own})"))
                        .unwrap_or_default()
                )));
            }
            gave_secret |= !v.is_empty();
            spec.hook.secret = clear(v).map(Secret::new);
        }
        let gave_verify = self.verify_token.is_some();
        if let Some(v) = self.verify_token {
            spec.hook.verify_token = clear(v).map(Secret::new);
        }
        let mut gave = Vec::new();
        if let Some(v) = self.phone_number_id {
            gave.push(Setting::PhoneNumberId);
            spec.options.phone_number_id = clear(v);
        }
        if let Some(n) = self.max_connections {
            gave.push(Setting::MaxConnections);
            spec.options.max_connections = Some(n);
        }
        let Some(mode) = d.mode_of(spec) else {
            return Ok(()); // the descriptor's check names the mode
        };
        if gave_secret && !mode.webhook {
            let hooks: Vec<&str> = d
                .modes
                .iter()
                .filter(|m| m.webhook)
                .map(|m| m.name)
                .collect();
            return Err(RegistryError::invalid(format!(
                "a webhook secret needs mode {}",
                hooks.join(" or ")
            )));
        }
        // Leaving a mode forgets what only it used.
        if !mode.webhook {
            spec.hook.secret = None;
        }
        if mode.verify_token == Need::Unused && !gave_verify {
            spec.hook.verify_token = None;
        }
        for s in [Setting::PhoneNumberId, Setting::MaxConnections] {
            if mode.setting(s) == Need::Unused && !gave.contains(&s) {
                s.clear(spec);
            }
        }
        Ok(())
    }
}

/// The platform's descriptor, or why this build cannot register the platform's bots.
fn descriptor_of(platform: Platform) -> Result<&'static Descriptor, RegistryError> {
    botfleet_runtime::descriptor(platform).ok_or_else(|| {
        RegistryError::invalid(botfleet_runtime::SpecError::NotBuilt(platform).to_string())
    })
}

/// Checks a finished spec against its platform.
fn validated(spec: BotSpec) -> Result<BotSpec, RegistryError> {
    botfleet_runtime::validate_spec(&spec).map_err(|e| RegistryError::invalid(e.to_string()))?;
    Ok(spec)
}

impl BotLine {
    /// Reads one JSON object (an import line, an API body).
    pub(crate) fn from_json(line: &str) -> Result<Self, RegistryError> {
        let out: BotLine = read(line, BOT_FIELDS, |_, _| None)?;
        for (field, value) in [("id", &out.id), ("platform", &out.platform)] {
            if value.is_empty() {
                return Err(RegistryError::invalid(format!("missing field {field}")));
            }
        }
        Ok(out)
    }

    /// The line as JSON (what `POST /api/v1/bots` takes).
    pub(crate) fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or_else(|_| Value::Object(Map::new()))
    }

    /// The spec this line describes, validated against its platform's descriptor.
    pub(crate) fn into_spec(self) -> Result<BotSpec, RegistryError> {
        let bad = |e: &dyn fmt::Display| RegistryError::invalid(e.to_string());
        let id = BotId::new(self.id).map_err(|e| bad(&e))?;
        let platform: Platform = self.platform.parse().map_err(|e| bad(&e))?;
        let d = descriptor_of(platform)?;
        let mode = match &self.mode {
            None => Some(d.default_mode()),
            Some(m) => d.modes.iter().find(|x| x.name == m),
        };
        if self.token.is_empty() && mode.is_none_or(|m| m.token == Need::Required) {
            return Err(RegistryError::invalid("missing field token"));
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
                commands: self.commands.unwrap_or_default(),
                handler_timeout_s: self.handler_timeout_s,
                typing: self.typing,
                async_reply_ttl_s: self.async_reply_ttl_s,
                stream: self.stream,
                rate_limits: self.rate_limits.filter(|r| !r.trim().is_empty()),
                ..BotOptions::default()
            },
            hook: HookSecrets::default(),
            handler,
            enabled: self.enabled.unwrap_or(true),
        };
        HookFields::new(
            self.mode,
            [self.secret_token, self.signing_secret, self.app_secret],
            self.verify_token,
            self.phone_number_id,
            self.max_connections,
        )
        .apply(&mut spec, d)?;
        validated(spec)
    }
}

impl BotPatch {
    /// Reads a JSON object of [`PATCH_FIELDS`]; `null` clears an optional field.
    pub(crate) fn from_json(body: &str) -> Result<Self, RegistryError> {
        read(body, PATCH_FIELDS, |k, v| match k {
            "id" | "platform" => Some(RegistryError::invalid(format!(
                "field {k} cannot be changed (remove the bot and add it again)"
            ))),
            "token" if v.is_null() => Some(RegistryError::invalid("field token cannot be cleared")),
            "handler" if v.is_null() => Some(RegistryError::invalid(
                "field handler cannot be cleared (echo is the default)",
            )),
            "enabled" if v.is_null() => Some(RegistryError::invalid(
                "field enabled must be true or false",
            )),
            _ => None,
        })
    }

    /// The patch as JSON (what `PATCH /api/v1/bots/{id}` takes): `null` clears.
    pub(crate) fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or_else(|_| Value::Object(Map::new()))
    }

    /// Whether it changes nothing.
    pub(crate) fn is_empty(&self) -> bool {
        set_fields(self).is_empty()
    }

    /// `spec` with this patch applied, validated against its platform's descriptor.
    pub(crate) fn apply(self, spec: &BotSpec) -> Result<BotSpec, RegistryError> {
        let d = descriptor_of(spec.platform)?;
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
        if let Some(c) = self.commands {
            next.options.commands = c.unwrap_or_default();
        }
        if let Some(t) = self.handler_timeout_s {
            next.options.handler_timeout_s = t;
        }
        if let Some(t) = self.typing {
            next.options.typing = t;
        }
        if let Some(t) = self.async_reply_ttl_s {
            next.options.async_reply_ttl_s = t;
        }
        if let Some(m) = self.stream {
            next.options.stream = m;
        }
        if let Some(r) = self.rate_limits {
            next.options.rate_limits = r.filter(|r| !r.trim().is_empty());
        }
        let (mut url, mut secret) = match &spec.handler {
            HandlerSpec::Echo | HandlerSpec::Named(_) => (None, None),
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
        HookFields::new(
            self.mode,
            [self.secret_token, self.signing_secret, self.app_secret],
            self.verify_token,
            self.phone_number_id,
            self.max_connections,
        )
        .apply(&mut next, d)?;
        validated(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let e =
            BotLine::from_json(r#"{"id":"a","platform":"telegram","token":12345678}"#).unwrap_err();
        assert_eq!(e.message, "field token must be a string");
        let e = BotLine::from_json(
            r#"{"id":"a","platform":"discord","token":"t","shards":"many-sekrit"}"#,
        )
        .unwrap_err();
        assert_eq!(
            e.message,
            "field shards must be \"auto\" or a number from 1 to 4096"
        );
        let e = BotPatch::from_json(r#"{"platform": "slack"}"#).unwrap_err();
        assert!(e.message.contains("cannot be changed"), "{e}");
        let e = BotLine::from_json(r#"{"platform":"telegram","token":"1:a"}"#).unwrap_err();
        assert_eq!(e.message, "missing field id");
        let e = BotLine::from_json(r#"{"id":"a","platform":"telegram","token":"1:sekrit""#)
            .unwrap_err();
        assert!(e.message.starts_with("not JSON (line 1"), "{e}");
        assert!(!e.message.contains("sekrit"));
        let debug = format!(
            "{:?} {:?}",
            BotLine::from_json(r#"{"id":"a","platform":"telegram","token":"1:sekrit"}"#).unwrap(),
            BotPatch::from_json(r#"{"token":"1:sekrit"}"#).unwrap()
        );
        assert!(
            !debug.contains("sekrit") && debug.contains("token"),
            "{debug}"
        );
    }

    #[test]
    fn lines_and_patches_round_trip_through_json() {
        let text = r#"{"id":"d","platform":"discord","token":"t","shards":"8","shards_per_slice":4,"enabled":false}"#;
        let line = BotLine::from_json(text).unwrap();
        assert_eq!((line.shards, line.shards_per_slice), (Some(8), Some(4)));
        let again = BotLine::from_json(&line.to_json().to_string()).unwrap();
        assert_eq!(again.to_json(), line.to_json());
        let spec = again.into_spec().unwrap();
        assert_eq!(spec.units().len(), 2);
        assert!(!spec.enabled);
        let p = BotPatch::from_json(
            r#"{"shards":"auto","shards_per_slice":null,"api_url":null,"mode":null}"#,
        )
        .unwrap();
        assert_eq!(p.shards, Some(None));
        assert_eq!(p.shards_per_slice, Some(None));
        assert_eq!(p.api_url, Some(None));
        assert_eq!(p.mode.as_deref(), Some(""), "null clears a receive setting");
        let back = BotPatch::from_json(&p.to_json().to_string()).unwrap();
        assert_eq!(back.to_json(), p.to_json());
        assert!(BotPatch::default().is_empty() && !p.is_empty());
        let next = p.apply(&spec).unwrap();
        assert_eq!(next.options.shards, None);
        assert_eq!(next.units().len(), 1);
    }

    #[test]
    fn the_descriptor_decides_which_fields_a_bot_takes() {
        let line = |s: &str| BotLine::from_json(s).unwrap().into_spec();
        let e = line(r#"{"id":"t","platform":"telegram","token":"1:a","shards":2}"#).unwrap_err();
        assert!(e.message.contains("shards"), "{e}");
        let e = line(r#"{"id":"t","platform":"telegram","token":"1:a","phone_number_id":"1"}"#)
            .unwrap_err();
        assert!(e.message.contains("phone_number_id"), "{e}");
        let e = line(r#"{"id":"t","platform":"slack","token":"xoxb-1","mode":"events","secret_token":"abc"}"#)
            .unwrap_err();
        assert_eq!(
            e.message,
            "field secret_token is not a slack setting (it takes signing_secret)"
        );
        let e = line(r#"{"id":"t","platform":"telegram","token":"1:a","secret_token":"abc"}"#)
            .unwrap_err();
        assert_eq!(e.message, "a webhook secret needs mode webhook");
        let hook = line(
            r#"{"id":"t","platform":"telegram","token":"1:a","mode":"webhook","secret_token":"abc","max_connections":5}"#,
        )
        .unwrap();
        assert!(botfleet_runtime::is_webhook(&hook));
        // Back to polling forgets the webhook's settings.
        let poll = BotPatch::from_json(r#"{"mode":"poll"}"#)
            .unwrap()
            .apply(&hook)
            .unwrap();
        assert_eq!(poll.hook, HookSecrets::default());
        assert_eq!(poll.options.max_connections, None);
        let e = line(r#"{"id":"t","platform":"telegram"}"#).unwrap_err();
        assert_eq!(e.message, "missing field token");
    }

    #[test]
    fn commands_come_with_a_bot_and_follow_the_platforms_rules() {
        let line = |s: &str| BotLine::from_json(s).and_then(BotLine::into_spec);
        let spec = line(
            r#"{"id":"t","platform":"telegram","token":"1:a","commands":[{"name":"start","description":"Begin"}]}"#,
        )
        .unwrap();
        assert_eq!(spec.options.commands[0].name, "start");
        let e = line(
            r#"{"id":"t","platform":"telegram","token":"1:a","commands":[{"name":"Start!","description":"x"}]}"#,
        )
        .unwrap_err();
        assert!(e.message.contains("invalid commands"), "{e}");
        let e = line(r#"{"id":"t","platform":"telegram","token":"1:a","commands":[{"name":"x"}]}"#)
            .unwrap_err();
        assert!(e.message.starts_with("field commands"), "{e}");
        let e = line(
            r#"{"id":"s","platform":"slack","token":"xoxb-1","app_token":"xapp-1","commands":[{"name":"a","description":"b"}]}"#,
        )
        .unwrap_err();
        assert!(
            e.message.contains("commands") && e.message.contains("slack"),
            "{e}"
        );
        let cleared = BotPatch::from_json(r#"{"commands": null}"#)
            .unwrap()
            .apply(&spec)
            .unwrap();
        assert!(cleared.options.commands.is_empty());
        let kept = BotPatch::from_json(r#"{"enabled": false}"#)
            .unwrap()
            .apply(&spec)
            .unwrap();
        assert_eq!(kept.options.commands, spec.options.commands);
    }

    #[test]
    fn handler_timeouts_and_typing_are_per_bot_settings() {
        let line = |s: &str| BotLine::from_json(s).and_then(BotLine::into_spec);
        let spec = line(
            r#"{"id":"t","platform":"telegram","token":"1:a","handler_timeout_s":600,"typing":false}"#,
        )
        .unwrap();
        assert_eq!(spec.options.handler_timeout_s, Some(600));
        assert_eq!(
            spec.handler_timeout(std::time::Duration::from_secs(120)),
            std::time::Duration::from_secs(600)
        );
        assert!(!spec.shows_typing());
        for bad in ["0", "901"] {
            let e = line(&format!(
                r#"{{"id":"t","platform":"telegram","token":"1:a","handler_timeout_s":{bad}}}"#
            ))
            .unwrap_err();
            assert!(e.message.contains("handler_timeout_s"), "{e}");
        }
        let e = line(r#"{"id":"t","platform":"telegram","token":"1:a","handler_timeout_s":"x"}"#)
            .unwrap_err();
        assert_eq!(
            e.message,
            "field handler_timeout_s must be a number of seconds from 1 to 900"
        );
        let e =
            line(r#"{"id":"t","platform":"telegram","token":"1:a","typing":"no"}"#).unwrap_err();
        assert_eq!(e.message, "field typing must be true or false");
        let back = BotPatch::from_json(r#"{"handler_timeout_s": null, "typing": null}"#)
            .unwrap()
            .apply(&spec)
            .unwrap();
        assert_eq!(back.options.handler_timeout_s, None);
        assert!(back.shows_typing());
        let e = BotPatch::from_json(r#"{"handler_timeout_s": 1000}"#)
            .unwrap()
            .apply(&spec)
            .unwrap_err();
        assert!(e.message.contains("1-900"), "{e}");
    }

    #[test]
    fn a_bots_own_rate_limits_are_checked_against_its_platform() {
        let line = |s: &str| BotLine::from_json(s).and_then(BotLine::into_spec);
        let spec = line(
            r#"{"id":"t","platform":"telegram","token":"1:a","rate_limits":"bot=100/1,group=off"}"#,
        )
        .unwrap();
        assert_eq!(
            spec.options.rate_limits.as_deref(),
            Some("bot=100/1,group=off")
        );
        let e =
            line(r#"{"id":"t","platform":"telegram","token":"1:a","rate_limits":"channel=1/1"}"#)
                .unwrap_err();
        assert!(
            e.message.contains("invalid rate_limits: `channel=1/1`: telegram has no send limit `channel` (it has: chat, group, bot)"),
            "{}",
            e.message
        );
        let cleared = BotPatch::from_json(r#"{"rate_limits": ""}"#)
            .unwrap()
            .apply(&spec)
            .unwrap();
        assert_eq!(cleared.options.rate_limits, None);
        let e = BotPatch::from_json(r#"{"rate_limits": "bot=fast"}"#)
            .unwrap()
            .apply(&spec)
            .unwrap_err();
        assert!(e.message.contains("invalid rate_limits"), "{}", e.message);
    }

    #[test]
    fn streams_are_native_unless_a_bot_asks_for_edits() {
        let line = |s: &str| BotLine::from_json(s).and_then(BotLine::into_spec);
        let spec =
            line(r#"{"id":"t","platform":"slack","token":"xoxb-1","app_token":"xapp-1"}"#).unwrap();
        assert_eq!(spec.stream_mode(), botfleet_core::StreamMode::Native);
        let spec = line(
            r#"{"id":"t","platform":"slack","token":"xoxb-1","app_token":"xapp-1","stream":"edits"}"#,
        )
        .unwrap();
        assert_eq!(spec.stream_mode(), botfleet_core::StreamMode::Edits);
        let e = line(r#"{"id":"t","platform":"telegram","token":"1:a","stream":"chunks"}"#)
            .unwrap_err();
        assert_eq!(e.message, "field stream must be \"native\" or \"edits\"");
        let back = BotPatch::from_json(r#"{"stream": null}"#)
            .unwrap()
            .apply(&spec)
            .unwrap();
        assert_eq!(back.stream_mode(), botfleet_core::StreamMode::Native);
        assert_eq!(back.options.stream, None);
    }

    #[test]
    fn async_reply_ttls_are_per_bot_settings() {
        let line = |s: &str| BotLine::from_json(s).and_then(BotLine::into_spec);
        let spec = line(r#"{"id":"t","platform":"telegram","token":"1:a","async_reply_ttl_s":60}"#)
            .unwrap();
        let worker = std::time::Duration::from_secs(900);
        assert_eq!(
            spec.async_reply_ttl(worker),
            std::time::Duration::from_secs(60)
        );
        for bad in ["9", "86401"] {
            let e = line(&format!(
                r#"{{"id":"t","platform":"telegram","token":"1:a","async_reply_ttl_s":{bad}}}"#
            ))
            .unwrap_err();
            assert!(
                e.message.contains("async_reply_ttl_s: must be 10-86400"),
                "{e}"
            );
        }
        let e = line(r#"{"id":"t","platform":"telegram","token":"1:a","async_reply_ttl_s":-1}"#)
            .unwrap_err();
        assert_eq!(
            e.message,
            "field async_reply_ttl_s must be a number of seconds from 10 to 86400"
        );
        let changed = BotPatch::from_json(r#"{"async_reply_ttl_s": 86400}"#)
            .unwrap()
            .apply(&spec)
            .unwrap();
        assert_eq!(changed.options.async_reply_ttl_s, Some(86_400));
        let back = BotPatch::from_json(r#"{"async_reply_ttl_s": null}"#)
            .unwrap()
            .apply(&changed)
            .unwrap();
        assert_eq!(back.async_reply_ttl(worker), worker);
    }
}
