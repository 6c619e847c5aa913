//! The start queue: bot starts go through the fleet-wide rate limiter one at a time per
//! worker, instead of every waiting bot asking the limiter (a stampede of its own).

use std::{sync::Arc, time::Duration};

use botfleet_coord::{Coordinator, Permit, RateLimit};
use botfleet_core::Platform;
use tokio::sync::{mpsc, oneshot};
use tracing::warn;

/// A handle to the worker's start queue.
#[derive(Clone, Debug)]
pub(crate) struct Starter {
    tx: mpsc::UnboundedSender<(Platform, oneshot::Sender<()>)>,
}

impl Starter {
    /// Starts the queue's task; it ends when every handle is dropped.
    pub(crate) fn spawn(coord: Arc<dyn Coordinator>, per_second: f64) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<(Platform, oneshot::Sender<()>)>();
        // A bucket of a tenth of a second's starts: a cold fleet ramps at the rate from the
        // first second on, instead of a one-second burst.
        let limit = RateLimit::new(per_second, (per_second / 10.0).ceil().max(1.0) as u32);
        tokio::spawn(async move {
            while let Some((platform, go)) = rx.recv().await {
                let key = format!("connect:{platform}");
                loop {
                    if go.is_closed() {
                        break; // the bot was stopped while it waited
                    }
                    match coord.acquire_rate(&key, limit).await {
                        Ok(Permit::Granted) => {
                            let _ = go.send(());
                            break;
                        }
                        Ok(Permit::Wait(d)) => tokio::time::sleep(d).await,
                        Err(e) => {
                            warn!(error = %e, "rate limiter unreachable; retrying");
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
                }
            }
        });
        Self { tx }
    }

    /// Asks for a start slot; `go` fires when the bot may connect.
    pub(crate) async fn request(&self, platform: Platform, go: oneshot::Sender<()>) {
        let _ = self.tx.send((platform, go));
    }
}
