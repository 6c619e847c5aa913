//! The status reporter: bots' status reports go to the store in batches, in order, from one
//! task. A worker starting ten thousand bots writes "running" in a few transactions instead
//! of ten thousand, and a bot never waits on the store to say how it is.

use std::{sync::Arc, time::Duration};

use botfleet_core::{BotId, BotStatus};
use botfleet_store::{StatusReport, Store, StoreError};
use tokio::sync::mpsc;
use tracing::{debug, warn};

/// Most reports written in one batch.
const BATCH: usize = 1_000;
/// Tries of a batch the store failed as a whole.
const TRIES: u32 = 5;

/// A handle to the worker's status reporter; cloning shares it.
#[derive(Clone, Debug)]
pub(crate) struct Reporter {
    tx: mpsc::UnboundedSender<StatusReport>,
}

/// The queue of reports a [`Reporter`] takes, until [`Reports::write`] writes them.
#[derive(Debug)]
pub(crate) struct Reports(mpsc::UnboundedReceiver<StatusReport>);

impl Reports {
    /// Writes the reports to `store` in batches, in order; ends when every [`Reporter`] is
    /// dropped, after writing what was queued.
    pub(crate) async fn write(self, store: Arc<dyn Store>) {
        write(store, self.0).await;
    }
}

impl Reporter {
    /// A reporter and its queue: reports made before the queue's writer starts wait in it
    /// (a worker hands its reporter out before it runs).
    pub(crate) fn new() -> (Self, Reports) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self { tx }, Reports(rx))
    }

    /// Records what `bot` is doing, as `worker` sees it; `error` `None` clears the last error.
    pub(crate) fn report(&self, bot: &BotId, status: BotStatus, error: Option<&str>, worker: &str) {
        self.report_under(bot, status, error, worker, None);
    }

    /// [`Reporter::report`], made under the spec registered at `spec_at_ms` (its
    /// `updated_at_ms`): the store drops it when the spec has changed since (a turn refused
    /// with the token an operator has just replaced does not fail the bot again).
    pub(crate) fn report_under(
        &self,
        bot: &BotId,
        status: BotStatus,
        error: Option<&str>,
        worker: &str,
        spec_at_ms: Option<i64>,
    ) {
        // A slice reports on its bot: any slice running makes the bot running, a refusal
        // (the same token for every slice) makes it failed; a slice stopping says nothing
        // of the others.
        let id = match bot.slice_index() {
            None => bot.clone(),
            Some(_)
                if matches!(status, BotStatus::Running | BotStatus::Failed)
                    || (status == BotStatus::Pending && error.is_some()) =>
            {
                match BotId::new(bot.base()) {
                    Ok(b) => b,
                    Err(_) => return,
                }
            }
            Some(_) => return,
        };
        let _ = self.tx.send(StatusReport {
            id,
            status,
            last_error: error.map(str::to_owned),
            reported_by: Some(worker.to_owned()),
            spec_at_ms,
        });
    }
}

async fn write(store: Arc<dyn Store>, mut rx: mpsc::UnboundedReceiver<StatusReport>) {
    let mut batch = Vec::with_capacity(BATCH);
    while let Some(first) = rx.recv().await {
        batch.push(first);
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        let mut tries = 0;
        loop {
            match store.set_statuses(&batch).await {
                Ok(answers) => {
                    for (r, a) in batch.iter().zip(answers) {
                        match a {
                            Ok(()) => {}
                            // Removed meanwhile: nothing to report on.
                            Err(StoreError::NotFound(_)) => {
                                debug!(bot = %r.id, "status of a removed bot not recorded");
                            }
                            Err(e) => warn!(bot = %r.id, error = %e, "could not record bot status"),
                        }
                    }
                    break;
                }
                Err(e) if tries + 1 < TRIES => {
                    tries += 1;
                    warn!(error = %e, reports = batch.len(), "could not record bot statuses; retrying");
                    tokio::time::sleep(Duration::from_millis(200 << tries)).await;
                }
                Err(e) => {
                    warn!(error = %e, reports = batch.len(), "could not record bot statuses; dropped");
                    break;
                }
            }
        }
        batch.clear();
    }
}
