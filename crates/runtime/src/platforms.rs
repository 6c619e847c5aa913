//! The platforms a worker runs: one readable list. A new platform is a crate implementing
//! `botfleet_platform::Connector` and one line here.

use std::{collections::HashMap, sync::Arc};

use botfleet_core::Platform;
use botfleet_platform::Connector;

use crate::{WorkerConfig, WorkerError};

/// The platforms this build runs, in a fixed order.
pub fn supported() -> Vec<Platform> {
    let mut out = vec![Platform::Telegram];
    if cfg!(feature = "slack") {
        out.push(Platform::Slack);
    }
    out
}

/// One connector per platform this build runs.
pub(crate) fn connectors(
    cfg: &WorkerConfig,
) -> Result<HashMap<Platform, Arc<dyn Connector>>, WorkerError> {
    #[cfg_attr(not(feature = "slack"), allow(unused_mut))]
    let mut list: Vec<Arc<dyn Connector>> = vec![Arc::new(
        botfleet_telegram::TelegramConnector::new(cfg.telegram.clone())?,
    )];
    #[cfg(feature = "slack")]
    list.push(Arc::new(
        botfleet_slack::SlackConnector::new(cfg.slack.clone())
            .map_err(|e| WorkerError::Platform(e.to_string()))?,
    ));
    Ok(list.into_iter().map(|c| (c.platform(), c)).collect())
}
