//! What a bot is: its platform, credentials, options and handler.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Serialize};

use crate::{error::InvalidSpec, BotId, Platform, Secret};

/// How a bot answers the messages it receives.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum HandlerSpec {
    /// Replies with the same text to the same chat.
    Echo,
    /// POSTs each message as JSON to `url`, signed with HMAC-SHA256 of `secret`, and sends back
    /// the `text` of the JSON reply.
    Webhook {
        /// Where to POST.
        url: String,
        /// The per-bot signing key; `None` sends unsigned requests.
        secret: Option<Secret>,
    },
    /// A handler compiled into the worker (a Rust `BotHandler` registered under this name by a
    /// worker built as a library): `--handler NAME`.
    Named(String),
}

impl HandlerSpec {
    /// A handler from its parts as flags, import lines and the store hold them.
    ///
    /// # Errors
    /// [`InvalidSpec::UnknownHandler`] for a kind that is neither `echo`, `webhook` nor a
    /// usable name of a compiled-in handler (1–32 of `a-z`, `0-9`, `_`, `-`, starting with a
    /// letter); [`InvalidSpec::Handler`] for a webhook without a URL.
    pub fn from_parts(
        kind: &str,
        url: Option<String>,
        secret: Option<Secret>,
    ) -> Result<Self, InvalidSpec> {
        match kind {
            "echo" => Ok(HandlerSpec::Echo),
            "webhook" => Ok(HandlerSpec::Webhook {
                url: url.ok_or(InvalidSpec::Handler {
                    handler: "webhook",
                    missing: "webhook_url",
                })?,
                secret,
            }),
            name if Self::is_handler_name(name) => Ok(HandlerSpec::Named(name.to_owned())),
            other => Err(InvalidSpec::UnknownHandler(
                other.chars().take(40).collect(),
            )),
        }
    }

    /// Whether `name` can name a compiled-in handler: 1–32 of `a-z`, `0-9`, `_`, `-`, starting
    /// with a letter.
    pub fn is_handler_name(name: &str) -> bool {
        name.len() <= 32
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
    }

    /// The handler's name as used in flags and the store (`echo`, `webhook`, or the name of a
    /// compiled-in one).
    pub fn kind(&self) -> &str {
        match self {
            HandlerSpec::Echo => "echo",
            HandlerSpec::Webhook { .. } => "webhook",
            HandlerSpec::Named(n) => n,
        }
    }
}

/// Optional per-bot settings.
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct BotOptions {
    /// The platform API's base URL; `None` means the platform's public endpoint. Lets a
    /// self-hosted server (Telegram's Bot API server) or a test fake stand in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_url: Option<String>,
    /// Discord: the number of shards; `None` takes the count Discord recommends
    /// (`GET /gateway/bot`), read again when the bot starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<u32>,
    /// Discord: shards per slice. A bot of `shards` S split into slices of K is
    /// `ceil(S / K)` units the fleet places apart; slice `k` owns shards
    /// `[k·K, min((k+1)·K, S))`. `None`: the whole bot is one unit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards_per_slice: Option<u32>,
    /// Set on a unit's spec only (never stored): which slice it runs.
    #[serde(skip)]
    pub slice: Option<u32>,
    /// Discord, `shards` auto and split into slices: the count the slices are derived from,
    /// Discord's recommendation as the fleet read it when the bot last started. Written by the
    /// fleet, never by operators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards_in_use: Option<u32>,
    /// Discord, `shards` auto and split into slices: the recommendation as last read. While it
    /// is not `shards_in_use` (a new recommendation, a restart, a change of the slicing) the
    /// bot is counted again as a whole: every slice stops before any runs on the new count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards_recommended: Option<u32>,
    /// How the bot receives: Telegram `poll` (default) or `webhook`; Slack `socket` (default)
    /// or `events`; WhatsApp `cloud` (default) or `web`; Discord `gateway`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Telegram webhook mode: `max_connections` given to `setWebhook` (1-100, default 40).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
    /// WhatsApp Cloud API: the phone number id replies are sent from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phone_number_id: Option<String>,
    /// The bot's commands, registered with the platform by the holder of its unit when they
    /// change (Telegram, Discord: see the mode's `caps.commands`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<crate::CommandSpec>,
    /// How long one call of the bot's handler may take, in seconds (1-900); `None` takes the
    /// worker's `--handler-timeout-s`. A call cut off is tried again as the next `attempt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler_timeout_s: Option<u32>,
    /// Whether the fleet shows the platform's typing indicator while a turn runs long
    /// (`None`: yes, where the platform has one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub typing: Option<bool>,
    /// How long a turn whose handler answered `202` waits for its answer, in seconds
    /// (10-86,400); `None` takes the worker's `--async-reply-ttl-s`. Then the event is given
    /// up on (`async reply expired`) and the chat goes on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub async_reply_ttl_s: Option<u32>,
    /// How a message the handler keeps editing (a streamed answer) reaches the platform:
    /// `None` is [`StreamMode::Native`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<StreamMode>,
    /// The bot's own send limits, over the workers' (`--rate-limits`) and the platform's
    /// documented ones: a comma-separated list of `off` (none kept for this bot),
    /// `SCOPE=off` or `SCOPE=CALLS/SECONDS[:BURST]`, the scopes its platform has (Telegram
    /// `chat`, `group`, `bot`…), e.g. `bot=100/1,group=off` for a bot on a Bot API server of
    /// its own. `None`: the workers' limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limits: Option<String>,
}

/// How a streamed answer (a message sent with a `ref` and then edited as it grows) reaches
/// the platform.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamMode {
    /// Through the platform's own streaming where it has one for the chat (Slack's
    /// `chat.startStream` in a thread, Telegram's `sendMessageDraft` in a private chat), and
    /// edits elsewhere.
    #[default]
    Native,
    /// Always as edits of one message, paced to the platform's edit limit.
    Edits,
}

impl std::str::FromStr for StreamMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "native" => Ok(StreamMode::Native),
            "edits" => Ok(StreamMode::Edits),
            _ => Err("must be native or edits".into()),
        }
    }
}

impl StreamMode {
    /// Its name on the wire: `native` or `edits`.
    pub fn as_str(self) -> &'static str {
        match self {
            StreamMode::Native => "native",
            StreamMode::Edits => "edits",
        }
    }
}

/// The longest a handler call may be given, in seconds.
pub const MAX_HANDLER_TIMEOUT_S: u32 = 900;

/// The range of a held turn's time to live (`async_reply_ttl_s`), in seconds.
pub const ASYNC_REPLY_TTL_S: std::ops::RangeInclusive<u32> = 10..=86_400;

/// What verifies a webhook bot's deliveries. Never printed.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct HookSecrets {
    /// Telegram's secret token (`X-Telegram-Bot-Api-Secret-Token`), Slack's signing secret,
    /// WhatsApp's app secret (`X-Hub-Signature-256`).
    pub secret: Option<Secret>,
    /// WhatsApp: the verify token of the subscription handshake (`hub.verify_token`).
    pub verify_token: Option<Secret>,
}

/// Everything needed to run one bot.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct BotSpec {
    /// The bot's id.
    pub id: BotId,
    /// Which platform it speaks to.
    pub platform: Platform,
    /// The platform credential (Telegram bot token, Slack bot token `xoxb-…`, ...).
    pub token: Secret,
    /// A second credential where the platform needs one: Slack's app-level token (`xapp-…`)
    /// that opens Socket Mode connections.
    pub app_token: Option<Secret>,
    /// Optional settings.
    pub options: BotOptions,
    /// Webhook verification secrets (webhook modes only).
    pub hook: HookSecrets,
    /// How it answers.
    pub handler: HandlerSpec,
    /// Disabled bots stay registered but are not run.
    pub enabled: bool,
}

impl BotSpec {
    /// The shard count its slices are cut from: the fixed `shards`, or for `shards` auto the
    /// count in use while it is the recommendation last read.
    pub fn shard_total(&self) -> Option<u32> {
        let o = &self.options;
        o.shards.or(match (o.shards_in_use, o.shards_recommended) {
            (Some(n), Some(r)) if n == r => Some(n),
            _ => None,
        })
    }

    /// Whether this is a bot of `shards` auto split into slices whose count is not settled:
    /// it runs as one unit (the bot's own id) that waits for every old slice to stop, reads
    /// the recommendation and records it; then the slices run.
    pub fn is_counting(&self) -> bool {
        self.options.shards_per_slice.is_some_and(|k| k > 0) && self.shard_total().is_none()
    }

    /// What the fleet places and claims for this bot: the bot itself, or for a bot split
    /// into slices one spec per slice (id `{bot}#{k}`, `options.slice = Some(k)`).
    pub fn units(&self) -> Vec<BotSpec> {
        match self.slice_count() {
            Some(n) => (0..n)
                .map(|i| {
                    let mut u = self.clone();
                    u.id = self.id.slice(i);
                    u.options.slice = Some(i);
                    u
                })
                .collect(),
            None => vec![self.clone()],
        }
    }

    /// The ids of [`BotSpec::units`], without copying the spec.
    pub fn unit_ids(&self) -> Vec<BotId> {
        match self.slice_count() {
            Some(n) => (0..n).map(|i| self.id.slice(i)).collect(),
            None => vec![self.id.clone()],
        }
    }

    /// How many slices the bot runs as, when it is split into slices.
    fn slice_count(&self) -> Option<u32> {
        match (self.shard_total(), self.options.shards_per_slice) {
            (Some(s), Some(k)) if k > 0 => Some(s.div_ceil(k)),
            _ => None,
        }
    }

    /// How long one call of its handler may take: its own `handler_timeout_s`, or `default`
    /// (the worker's).
    pub fn handler_timeout(&self, default: std::time::Duration) -> std::time::Duration {
        self.options
            .handler_timeout_s
            .map_or(default, |s| std::time::Duration::from_secs(u64::from(s)))
    }

    /// How long a turn whose handler answered `202` waits for its answer: its own
    /// `async_reply_ttl_s`, or `default` (the worker's).
    pub fn async_reply_ttl(&self, default: std::time::Duration) -> std::time::Duration {
        self.options
            .async_reply_ttl_s
            .map_or(default, |s| std::time::Duration::from_secs(u64::from(s)))
    }

    /// How its streamed answers reach the platform (see [`BotOptions::stream`]).
    pub fn stream_mode(&self) -> StreamMode {
        self.options.stream.unwrap_or_default()
    }

    /// Whether the fleet shows typing while its turns run long (see [`BotOptions::typing`]).
    pub fn shows_typing(&self) -> bool {
        self.options.typing != Some(false)
    }

    /// Whether the bot is split into slices (more than one unit). Only platforms whose
    /// descriptor takes `shards_per_slice` (Discord) get that far.
    pub fn is_sliced(&self) -> bool {
        self.shard_total().is_some() && self.options.shards_per_slice.is_some_and(|k| k > 0)
    }

    /// The shards this spec runs out of `total`: its slice's, or all of them.
    pub fn shard_range(&self, total: u32) -> std::ops::Range<u32> {
        match (self.options.slice, self.options.shards_per_slice) {
            (Some(i), Some(k)) => {
                let start = i.saturating_mul(k).min(total);
                start..start.saturating_add(k).min(total)
            }
            _ => 0..total,
        }
    }

    /// Connections it holds, as capacity counts them: a slice's shards, a whole sharded
    /// bot's shards (1 while its count is `auto`), 1 for every other bot.
    pub fn weight(&self) -> u32 {
        match self.shard_total() {
            Some(s) => {
                let r = self.shard_range(s);
                (r.end - r.start).max(1)
            }
            None => 1,
        }
    }

    /// A bot with the echo handler, enabled, default options.
    pub fn new(id: BotId, platform: Platform, token: impl Into<Secret>) -> Self {
        Self {
            id,
            platform,
            token: token.into(),
            app_token: None,
            options: BotOptions::default(),
            hook: HookSecrets::default(),
            handler: HandlerSpec::Echo,
            enabled: true,
        }
    }

    /// The checks every platform shares: credential shapes, URL shapes, shard counts, the
    /// handler's settings. [`Descriptor::validate`](crate::Descriptor::validate) runs them
    /// together with what the bot's platform and mode take; that is the one entry point.
    ///
    /// # Errors
    /// [`InvalidSpec`] says which field is wrong and why, without echoing the token.
    pub fn validate_shared(&self) -> Result<(), InvalidSpec> {
        crate::check_commands(&self.options.commands)?;
        if let Some(t) = self.options.handler_timeout_s {
            if !(1..=MAX_HANDLER_TIMEOUT_S).contains(&t) {
                return Err(InvalidSpec::HandlerTimeout);
            }
        }
        if let Some(t) = self.options.async_reply_ttl_s {
            if !ASYNC_REPLY_TTL_S.contains(&t) {
                return Err(InvalidSpec::AsyncReplyTtl);
            }
        }
        let token = self.token.expose();
        if token.len() > 4096 {
            return Err(InvalidSpec::Token("is longer than 4096 bytes"));
        }
        if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(InvalidSpec::Token(
                "contains white space or control characters",
            ));
        }
        if let Some(app) = &self.app_token {
            let app = app.expose();
            if app.is_empty()
                || app.len() > 4096
                || app.chars().any(|c| c.is_whitespace() || c.is_control())
            {
                return Err(InvalidSpec::AppToken(
                    "must be 1-4096 bytes without white space",
                ));
            }
        }
        if let Some(n) = self.options.shards {
            if !(1..=MAX_SHARDS).contains(&n) {
                return Err(InvalidSpec::Shards("must be between 1 and 4096"));
            }
        }
        if let Some(k) = self.options.shards_per_slice {
            // With `shards` auto the count is Discord's recommendation, read when the bot
            // starts; a slice then means the same shards for as long as that count stands.
            let most = self.options.shards.unwrap_or(MAX_SHARDS);
            if !(1..=most).contains(&k) {
                return Err(InvalidSpec::Shards(
                    "shards_per_slice must be between 1 and the shard count",
                ));
            }
        }
        for n in [self.options.shards_in_use, self.options.shards_recommended]
            .into_iter()
            .flatten()
        {
            if !(1..=MAX_SHARDS).contains(&n) {
                return Err(InvalidSpec::Shards("must be between 1 and 4096"));
            }
        }
        if self.id.as_str().contains('#') {
            return Err(InvalidSpec::ReservedId(
                "may not contain '#' (reserved for slices)",
            ));
        }
        if let HandlerSpec::Webhook { url, .. } = &self.handler {
            check_http_url("webhook_url", url)?;
        }
        Ok(())
    }
}

/// The most shards a Discord bot may have here.
pub(crate) const MAX_SHARDS: u32 = 4096;

pub(crate) fn check_ws_url(field: &'static str, url: &str) -> Result<(), InvalidSpec> {
    let rest = url
        .strip_prefix("ws://")
        .or_else(|| url.strip_prefix("wss://"))
        .ok_or(InvalidSpec::Url {
            field,
            reason: "must start with ws:// or wss://",
        })?;
    // The same checks as an HTTP URL's (host, no white space).
    check_http_url(field, &format!("http://{rest}"))
}

pub(crate) fn check_http_url(field: &'static str, url: &str) -> Result<(), InvalidSpec> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or(InvalidSpec::Url {
            field,
            reason: "must start with http:// or https://",
        })?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if host.is_empty() {
        return Err(InvalidSpec::Url {
            field,
            reason: "has no host",
        });
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(InvalidSpec::Url {
            field,
            reason: "contains white space",
        });
    }
    Ok(())
}

/// What a bot is doing, as last reported by whoever ran it.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BotStatus {
    /// Registered, not yet started by any worker.
    #[default]
    Pending,
    /// Connected and handling messages.
    Running,
    /// Stopped on purpose (disabled, handed over, worker shutting down).
    Stopped,
    /// Gave up: the platform refused the credentials or the spec is unusable. Needs an operator.
    Failed,
}

impl BotStatus {
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            BotStatus::Pending => "pending",
            BotStatus::Running => "running",
            BotStatus::Stopped => "stopped",
            BotStatus::Failed => "failed",
        }
    }
}

impl fmt::Display for BotStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for BotStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pending" => Ok(BotStatus::Pending),
            "running" => Ok(BotStatus::Running),
            "stopped" => Ok(BotStatus::Stopped),
            "failed" => Ok(BotStatus::Failed),
            other => Err(format!("unknown bot status {other:?}")),
        }
    }
}

impl BotRecord {
    /// This record as the units the fleet places ([`BotSpec::units`]), each with the bot's
    /// status; a bot that is one unit is itself, not a copy.
    pub fn into_units(self) -> Vec<BotRecord> {
        if !self.spec.is_sliced() {
            return vec![self];
        }
        self.spec
            .units()
            .into_iter()
            .map(|spec| BotRecord {
                spec,
                status: self.status,
                last_error: self.last_error.clone(),
                reported_by: self.reported_by.clone(),
                updated_at_ms: self.updated_at_ms,
            })
            .collect()
    }
}

/// A registered bot: its spec plus what the fleet last reported about it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct BotRecord {
    /// The spec as registered.
    pub spec: BotSpec,
    /// The last reported status.
    pub status: BotStatus,
    /// The last error, if the last report was a failure. Never contains the token.
    pub last_error: Option<String>,
    /// The worker that made the last report (in a fleet, the one that ran the bot).
    pub reported_by: Option<String>,
    /// Unix milliseconds of the last change to the spec.
    pub updated_at_ms: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(token: &str) -> BotSpec {
        BotSpec::new(BotId::new("b1").unwrap(), Platform::Telegram, token)
    }

    #[test]
    fn a_sliced_bot_is_one_unit_per_fixed_slice() {
        let mut d = BotSpec::new(BotId::new("big").unwrap(), Platform::Discord, "t");
        assert_eq!(d.units().len(), 1, "unsliced: one unit");
        assert_eq!(d.weight(), 1, "auto: weight 1 until the count is known");
        d.options.shards = Some(14);
        assert_eq!(d.weight(), 14);
        d.options.shards_per_slice = Some(4);
        d.validate_shared().unwrap();
        let units = d.units();
        let ids: Vec<&str> = units.iter().map(|u| u.id.as_str()).collect();
        assert_eq!(ids, ["big#0", "big#1", "big#2", "big#3"]);
        let ranges: Vec<_> = units.iter().map(|u| u.shard_range(14)).collect();
        assert_eq!(ranges, [0..4, 4..8, 8..12, 12..14]);
        assert_eq!(
            units.iter().map(BotSpec::weight).collect::<Vec<_>>(),
            [4, 4, 4, 2]
        );
        assert_eq!(units[3].id.base(), "big");
        assert_eq!(units[3].id.slice_index(), Some(3));
        assert!(BotId::new("big#x").is_err() && BotId::new("#3").is_err());
        d.options.shards = Some(2);
        assert!(
            d.validate_shared().is_err(),
            "more shards per slice than shards"
        );
        // Operators cannot register unit ids.
        let u = BotSpec::new(BotId::new("a#1").unwrap(), Platform::Telegram, "1:x");
        assert!(u.validate_shared().is_err());
    }

    #[test]
    fn an_auto_sliced_bot_is_counted_as_a_whole_then_sliced_on_the_count() {
        let mut d = BotSpec::new(BotId::new("big").unwrap(), Platform::Discord, "t");
        d.options.shards_per_slice = Some(4);
        d.validate_shared().unwrap();
        assert!(d.is_counting() && !d.is_sliced());
        let ids: Vec<String> = d.units().iter().map(|u| u.id.to_string()).collect();
        assert_eq!(ids, ["big"], "one unit, the bot itself, while uncounted");
        assert_eq!(d.weight(), 1);
        d.options.shards_in_use = Some(10);
        d.options.shards_recommended = Some(10);
        assert!(!d.is_counting() && d.is_sliced());
        let units = d.units();
        let ranges: Vec<_> = units.iter().map(|u| u.shard_range(10)).collect();
        assert_eq!(ranges, [0..4, 4..8, 8..10]);
        assert_eq!(units[2].weight(), 2);
        // A new recommendation: counted again as a whole, before any slice runs on it.
        d.options.shards_recommended = Some(12);
        assert!(d.is_counting());
        assert_eq!(d.units().len(), 1);
        d.options.shards_in_use = Some(5000);
        assert!(d.validate_shared().is_err());
    }

    #[test]
    fn checks_tokens_without_echoing_them() {
        assert!(spec("123:abc").validate_shared().is_ok());
        let e = spec("12 3:secret-part").validate_shared().unwrap_err();
        assert!(!e.to_string().contains("secret-part"), "{e}");
        let mut s = spec("1:a");
        s.app_token = Some(Secret::new("x y-secret"));
        let e = s.validate_shared().unwrap_err().to_string();
        assert!(e.contains("app_token") && !e.contains("secret"), "{e}");
    }

    #[test]
    fn checks_the_webhook_url() {
        let mut s = spec("1:a");
        s.handler = HandlerSpec::Webhook {
            url: "nope".into(),
            secret: None,
        };
        assert_eq!(
            s.validate_shared().unwrap_err().to_string(),
            "invalid webhook_url: must start with http:// or https://"
        );
        for bad in ["http:///path", "http://h/a b"] {
            assert!(check_http_url("api_url", bad).is_err(), "{bad}");
        }
        assert!(check_ws_url("api_url", "https://h").is_err());
        assert!(check_ws_url("api_url", "wss:///ws").is_err(), "no host");
        assert!(check_ws_url("api_url", "ws://127.0.0.1:9/ws/chat").is_ok());
    }

    #[test]
    fn debug_of_a_spec_hides_the_token() {
        let mut s = spec("999:top-secret");
        s.handler = HandlerSpec::Webhook {
            url: "http://h/x".into(),
            secret: Some(Secret::new("hmac-key")),
        };
        let d = format!("{s:?}");
        assert!(!d.contains("top-secret") && !d.contains("hmac-key"), "{d}");
    }

    #[test]
    fn handlers_from_parts() {
        assert_eq!(
            HandlerSpec::from_parts("echo", None, None).unwrap(),
            HandlerSpec::Echo
        );
        let e = HandlerSpec::from_parts("webhook", None, None).unwrap_err();
        assert_eq!(e.to_string(), "handler webhook needs webhook_url");
        // Any other usable name is a handler compiled into the workers.
        let named = HandlerSpec::from_parts("support-bot_2", None, None).unwrap();
        assert_eq!(named, HandlerSpec::Named("support-bot_2".into()));
        assert_eq!(named.kind(), "support-bot_2");
        for bad in ["Magic", "2fa", "", "has space", "x/y", &"a".repeat(33)] {
            let e = HandlerSpec::from_parts(bad, None, None).unwrap_err();
            assert!(e.to_string().starts_with("unknown handler"), "{bad}: {e}");
        }
    }

    #[test]
    fn status_round_trips() {
        for s in [
            BotStatus::Pending,
            BotStatus::Running,
            BotStatus::Stopped,
            BotStatus::Failed,
        ] {
            assert_eq!(s.as_str().parse::<BotStatus>().unwrap(), s);
        }
        assert!("zombie".parse::<BotStatus>().is_err());
    }
}
