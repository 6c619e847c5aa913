//! The platforms a worker runs: one readable list. A new platform is a crate implementing
//! `botfleet_platform::Connector` and one line here.

use std::{collections::HashMap, sync::Arc};

use botfleet_coord::Coordinator;
use botfleet_core::Platform;
use botfleet_platform::Connector;

use crate::{WorkerConfig, WorkerError};

/// The platforms this build runs, in a fixed order.
pub fn supported() -> Vec<Platform> {
    let mut out = vec![Platform::Telegram];
    if cfg!(feature = "slack") {
        out.push(Platform::Slack);
    }
    if cfg!(feature = "discord") {
        out.push(Platform::Discord);
    }
    if cfg!(feature = "whatsapp") {
        out.push(Platform::Whatsapp);
    }
    out
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
                tracing::warn!("this is a test build: it does not check WhatsApp's server certificate (feature standin); never run it against WhatsApp");
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

        /// Discord's global REST limit, 50 requests a second per bot, kept across the fleet
        /// (every worker running a slice of the bot draws from one bucket).
        async fn rest(&self, bot: &str) {
            let key = format!("rest:discord:{bot}");
            let limit = RateLimit::new(50.0, 50);
            for _ in 0..100 {
                match self.coord.acquire_rate(&key, limit).await {
                    Ok(Permit::Granted) => return,
                    Ok(Permit::Wait(d)) => {
                        tokio::time::sleep(d.max(Duration::from_millis(5))).await
                    }
                    // The coordinator is away: Discord's 429s still pace the bot.
                    Err(_) => return,
                }
            }
        }
    }
}
