//! The start queue: bot starts go through the fleet-wide rate limiter in batches per worker,
//! instead of every waiting bot asking the limiter (a stampede of its own) or the queue asking
//! once per bot (thousands of round trips when thousands of bots move at once).

use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
    time::Duration,
};

use botfleet_coord::{Coordinator, RateLimit};
use botfleet_core::Platform;
use tokio::sync::{mpsc, oneshot};
use tracing::warn;

/// Most tokens asked for in one call.
const BATCH: usize = 1_000;

type Request = (Platform, oneshot::Sender<()>);

/// A handle to the worker's start queue.
#[derive(Clone, Debug)]
pub(crate) struct Starter {
    tx: mpsc::UnboundedSender<Request>,
}

impl Starter {
    /// Starts the queue's task, `rate(p)` starts a second for platform `p`; it ends when every
    /// handle is dropped.
    pub(crate) fn spawn(coord: Arc<dyn Coordinator>, rate: impl Fn(Platform) -> f64) -> Self {
        let (tx, rx) = mpsc::unbounded_channel::<Request>();
        // A bucket of a tenth of a second's starts: a cold fleet ramps at the rate from the
        // first second on, instead of a one-second burst.
        let limits: HashMap<Platform, RateLimit> = Platform::ALL
            .into_iter()
            .map(|p| {
                let r = rate(p);
                (p, RateLimit::new(r, (r / 10.0).ceil().max(1.0) as u32))
            })
            .collect();
        tokio::spawn(serve(coord, limits, rx));
        Self { tx }
    }

    /// Asks for a start slot; `go` fires when the bot may connect.
    pub(crate) async fn request(&self, platform: Platform, go: oneshot::Sender<()>) {
        let _ = self.tx.send((platform, go));
    }
}

async fn serve(
    coord: Arc<dyn Coordinator>,
    limits: HashMap<Platform, RateLimit>,
    mut rx: mpsc::UnboundedReceiver<Request>,
) {
    let mut waiting: HashMap<Platform, VecDeque<oneshot::Sender<()>>> = HashMap::new();
    loop {
        // Take what is queued; block only when nobody waits.
        if waiting.values().all(VecDeque::is_empty) {
            let Some((p, go)) = rx.recv().await else {
                return;
            };
            waiting.entry(p).or_default().push_back(go);
        }
        while let Ok((p, go)) = rx.try_recv() {
            waiting.entry(p).or_default().push_back(go);
        }
        let mut next = Duration::ZERO;
        for (platform, queue) in &mut waiting {
            // Bots stopped while they waited need no slot.
            queue.retain(|go| !go.is_closed());
            if queue.is_empty() {
                continue;
            }
            let n = queue.len().min(BATCH) as u32;
            let key = format!("connect:{platform}");
            let limit = limits
                .get(platform)
                .copied()
                .unwrap_or(RateLimit::new(1_000.0, 100));
            match coord.acquire_rate_many(&key, limit, n).await {
                Ok(g) => {
                    for go in queue.drain(..g.taken as usize) {
                        let _ = go.send(());
                    }
                    if !queue.is_empty() {
                        next = next.max(g.wait);
                    }
                }
                Err(e) => {
                    warn!(error = %e, "rate limiter unreachable; retrying");
                    next = next.max(Duration::from_millis(200));
                }
            }
        }
        if next.is_zero() {
            continue;
        }
        // Wait for the next token; requests arriving meanwhile join the queue.
        let sleep = tokio::time::sleep(next);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                () = &mut sleep => break,
                r = rx.recv() => match r {
                    Some((p, go)) => waiting.entry(p).or_default().push_back(go),
                    None => return,
                },
            }
        }
    }
}
