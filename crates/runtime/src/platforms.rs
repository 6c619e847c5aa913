//! The platforms a worker runs: one readable list. A new platform is a crate implementing
//! `botfleet_platform::Connector` and one line here.

use std::{collections::HashMap, sync::Arc};

use botfleet_coord::Coordinator;
use botfleet_core::{BotSpec, Descriptor, InvalidSpec, Platform};
use botfleet_platform::Connector;

use crate::{WorkerConfig, WorkerError};

/// What every platform this build runs is, in a fixed order: the one list. A platform is
/// its crate's `DESCRIPTOR` here and its connector in `connectors()` below.
pub const DESCRIPTORS: &[&Descriptor] = &[
    &botfleet_telegram::DESCRIPTOR,
    #[cfg(feature = "slack")]
    &botfleet_slack::DESCRIPTOR,
    #[cfg(feature = "discord")]
    &botfleet_discord::DESCRIPTOR,
    #[cfg(feature = "whatsapp")]
    &botfleet_whatsapp::DESCRIPTOR,
];

/// The platforms this build runs, in a fixed order.
pub fn supported() -> Vec<Platform> {
    DESCRIPTORS.iter().map(|d| d.platform).collect()
}

/// What `p` is, when this build runs it.
pub fn descriptor(p: Platform) -> Option<&'static Descriptor> {
    DESCRIPTORS.iter().find(|d| d.platform == p).copied()
}

/// The platform × capability table of the README (Markdown), from the descriptors: what a
/// handler's actions can do on each platform and mode. A test keeps the README's copy true.
pub fn capability_table() -> String {
    let yes = |b: bool| if b { "yes" } else { "—" };
    let mut out = String::from(
        "| platform · mode | buttons (most, value bytes) | edit | delete | typing | answer | ephemeral | threads | files (most a send, MiB each) | text chars | native streams | templates (reply window) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for d in DESCRIPTORS {
        for m in d.modes {
            let c = m.caps;
            let buttons = if c.buttons {
                format!("yes ({}, {})", c.max_buttons, c.max_button_value)
            } else {
                "—".to_owned()
            };
            let files = if c.files {
                format!("yes ({}, {})", c.max_files, c.max_file_bytes >> 20)
            } else {
                "—".to_owned()
            };
            let templates = match (c.templates, c.reply_window_s) {
                (false, _) => "—".to_owned(),
                (true, 0) => "yes".to_owned(),
                (true, s) => format!("yes ({} h)", s / 3_600),
            };
            out.push_str(&format!(
                "| {} · `{}` | {buttons} | {} | {} | {} | {} | {} | {} | {files} | {} | {} | {templates} |\n",
                d.title,
                m.name,
                yes(c.edit),
                yes(c.delete),
                yes(c.typing),
                yes(c.answer),
                yes(c.ephemeral),
                yes(c.threads),
                c.max_text,
                yes(c.streams)
            ));
        }
    }
    out
}

/// Checks `spec` against its platform's descriptor.
///
/// # Errors
/// [`SpecError::NotBuilt`] when this build does not run the platform; the descriptor's
/// [`SpecError::Invalid`] otherwise. Neither names a value.
pub fn validate(spec: &BotSpec) -> Result<&'static Descriptor, SpecError> {
    let d = descriptor(spec.platform).ok_or(SpecError::NotBuilt(spec.platform))?;
    if let Some(text) = &spec.options.rate_limits {
        crate::RateLimits::for_bot(spec.platform, text).map_err(SpecError::RateLimits)?;
    }
    match d.validate(spec) {
        Ok(()) => Ok(d),
        Err(e) => Err(owned_elsewhere(d, &e).unwrap_or(e).into()),
    }
}

/// For a setting no mode of `d`'s platform takes, the error that says which platforms do.
fn owned_elsewhere(d: &Descriptor, e: &InvalidSpec) -> Option<InvalidSpec> {
    let InvalidSpec::NotASetting { field, .. } = e else {
        return None;
    };
    if d.fields().contains(field) {
        return None;
    }
    let owners: Vec<&str> = DESCRIPTORS
        .iter()
        .filter(|o| o.fields().contains(field))
        .map(|o| o.title)
        .collect();
    (!owners.is_empty()).then(|| InvalidSpec::OtherPlatforms {
        field,
        owners: owners.join(" or "),
    })
}

/// What `spec`'s platform mode can do (text only for a platform or mode this build lacks).
pub(crate) fn caps(spec: &BotSpec) -> botfleet_core::Caps {
    descriptor(spec.platform)
        .and_then(|d| d.mode_of(spec))
        .map_or(botfleet_core::Caps::TEXT_ONLY, |m| m.caps)
}

/// The send limits `platform` documents, by scope (what [`botfleet_platform::Sender::buckets`]
/// counts calls against); none for a platform not in this build.
pub fn send_scopes(platform: Platform) -> &'static [(&'static str, botfleet_platform::Limit)] {
    match platform {
        Platform::Telegram => botfleet_telegram::limits::SCOPES,
        #[cfg(feature = "slack")]
        Platform::Slack => botfleet_slack::limits::SCOPES,
        #[cfg(feature = "discord")]
        Platform::Discord => botfleet_discord::limits::SCOPES,
        #[cfg(feature = "whatsapp")]
        Platform::Whatsapp => botfleet_whatsapp::limits::SCOPES,
        #[allow(unreachable_patterns)]
        _ => &[],
    }
}

/// Whether `spec`'s platform POSTs its updates to the fleet's hooks address.
pub fn is_webhook(spec: &BotSpec) -> bool {
    descriptor(spec.platform).is_some_and(|d| d.is_webhook(spec))
}

/// Why a spec cannot run in this build.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// The platform is not in this build.
    #[error("platform {0} does not run in this build yet (it runs: {runs})", runs = names())]
    NotBuilt(Platform),
    /// The spec breaks its platform's rules.
    #[error(transparent)]
    Invalid(#[from] InvalidSpec),
    /// Its `rate_limits` name a scope its platform lacks, or do not parse.
    #[error("invalid rate_limits: {0}")]
    RateLimits(String),
}

fn names() -> String {
    DESCRIPTORS
        .iter()
        .map(|d| d.platform.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// One connector per platform this build runs.
pub(crate) fn connectors(
    cfg: &WorkerConfig,
    coord: &Arc<dyn Coordinator>,
) -> Result<HashMap<Platform, Arc<dyn Connector>>, WorkerError> {
    #[cfg_attr(
        not(any(feature = "slack", feature = "discord", feature = "whatsapp")),
        allow(unused_mut)
    )]
    let mut list: Vec<Arc<dyn Connector>> = vec![Arc::new(
        botfleet_telegram::TelegramConnector::new(cfg.telegram.clone())?,
    )];
    #[cfg(feature = "slack")]
    list.push(Arc::new(
        botfleet_slack::SlackConnector::new(cfg.slack.clone())
            .map_err(|e| WorkerError::Platform(Box::new(e)))?,
    ));
    #[cfg(feature = "discord")]
    list.push(Arc::new(
        botfleet_discord::DiscordConnector::new(
            cfg.discord.clone(),
            Arc::new(discord::CoordGate {
                coord: coord.clone(),
            }),
        )
        .map_err(|e| WorkerError::Platform(Box::new(e)))?,
    ));
    #[cfg(feature = "whatsapp")]
    list.push(Arc::new({
        let c = botfleet_whatsapp::WhatsappConnector::new()
            .map_err(|e| WorkerError::Platform(Box::new(e)))?;
        #[cfg(feature = "whatsapp-web")]
        let c = {
            if botfleet_whatsapp::device::skips_server_certificate() {
                tracing::warn!("this is a test build: it links the WhatsApp Web stand-in and does not check WhatsApp's server certificate; device-link bots dial loopback addresses only");
            }
            let mut web = botfleet_whatsapp::device::WebConfig::default();
            if let Some(v) = &cfg.whatsapp_web_version {
                web.version = Some(
                    botfleet_whatsapp::device::parse_version(v)
                        .map_err(|e| WorkerError::Platform(e.into()))?,
                );
            }
            c.with_web(web)
        };
        c
    }));
    #[cfg(not(feature = "discord"))]
    let _ = coord;
    Ok(list.into_iter().map(|c| (c.platform(), c)).collect())
}

#[cfg(feature = "discord")]
mod discord {
    use std::{sync::Arc, time::Duration};

    use async_trait::async_trait;
    use botfleet_coord::{Coordinator, Permit, RateLimit};
    use tracing::warn;

    /// Discord's identify pace kept fleet-wide: one token per spacing per bot and bucket, from
    /// the coordinator's rate limiter (Redis in a fleet, memory embedded).
    #[derive(Debug)]
    pub(super) struct CoordGate {
        pub(super) coord: Arc<dyn Coordinator>,
    }

    #[async_trait]
    impl botfleet_discord::IdentifyGate for CoordGate {
        async fn wait(&self, bot: &str, bucket: u32, spacing: Duration) {
            let key = format!("identify:discord:{bot}:{bucket}");
            let limit = RateLimit::new(1.0 / spacing.as_secs_f64().max(0.001), 1);
            loop {
                match self.coord.acquire_rate(&key, limit).await {
                    Ok(Permit::Granted) => return,
                    Ok(Permit::Wait(d)) => {
                        tokio::time::sleep(d.max(Duration::from_millis(10))).await
                    }
                    Err(e) => {
                        // Without the coordinator nobody else can be told: wait a whole
                        // spacing, which keeps this process within the rule.
                        warn!(error = %e, "identify gate: coordinator unreachable; waiting a full spacing");
                        tokio::time::sleep(spacing).await;
                        return;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use botfleet_core::BotId;

    use super::*;

    #[test]
    fn every_platform_is_described_once_and_checks_name_the_owner_of_a_setting() {
        let names = supported();
        let mut sorted = names.clone();
        sorted.dedup();
        assert_eq!(names, sorted, "one descriptor per platform");
        assert_eq!(names[0], Platform::Telegram);
        for d in DESCRIPTORS {
            assert!(
                !d.modes.is_empty() && d.connect_rate > 0.0,
                "{}",
                d.platform
            );
        }
        let mut s = BotSpec::new(BotId::new("t").unwrap(), Platform::Telegram, "1:a");
        assert!(validate(&s).is_ok());
        s.options.shards = Some(2);
        let e = validate(&s).unwrap_err().to_string();
        if cfg!(feature = "discord") {
            assert_eq!(e, "invalid shards: only Discord bots have shards");
        } else {
            assert_eq!(
                e,
                "invalid shards: not a setting of telegram bots in mode poll"
            );
        }
        s.options.shards = None;
        s.options.max_connections = Some(3);
        let e = validate(&s).unwrap_err().to_string();
        assert_eq!(
            e, "invalid max_connections: not a setting of telegram bots in mode poll",
            "a setting of another mode of the same platform"
        );
        s.options.mode = Some("webhook".into());
        s.hook.secret = Some(botfleet_core::Secret::new("tok"));
        assert!(is_webhook(&s) && validate(&s).is_ok());
    }
}

#[cfg(all(test, feature = "slack", feature = "discord", feature = "whatsapp"))]
mod readme {
    /// The README's capability table is the one the descriptors make.
    #[test]
    fn the_readme_capability_table_is_the_descriptors() {
        let readme = include_str!("../../../docs/platforms.md");
        let (begin, end) = ("<!-- caps:begin -->\n", "<!-- caps:end -->");
        let start = readme
            .find(begin)
            .expect("docs/platforms.md has the caps table markers")
            + begin.len();
        let stop = readme[start..].find(end).expect("an end marker") + start;
        assert_eq!(
            &readme[start..stop],
            super::capability_table(),
            "regenerate the table in docs/platforms.md from botfleet_runtime::capability_table()"
        );
    }
}
