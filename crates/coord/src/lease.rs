//! Keeping a worker's liveness, and fencing itself when it cannot.
//!
//! [`LeaseKeeper::start`] registers, then renews every `lease / 3`. It remembers `t_ok`, the
//! monotonic time at which it *sent* the last renewal that succeeded: the liveness is good in
//! the backend until at least `t_ok + lease`. [`LeaseHandle::check`] answers whether acting
//! now is safe (`now < t_ok + 2/3 · lease`), and [`LeaseHandle::lost`] resolves as soon as it
//! is not, so the worker stops its bots *before* anyone else can claim them. A process frozen
//! by SIGSTOP wakes with the monotonic clock far ahead, so it acts on nothing it held before.
//!
//! What makes `lost` resolve is a *fence timer* the keeper runs, which depends on nothing but
//! the clock and `t_ok`. Each bot task waits on it beside its poll or socket, so a worker whose
//! control loop is stuck in a coordinator call (a hung Redis link) still stops every bot on
//! time.

use std::{
    sync::{
        atomic::{AtomicU32, AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use botfleet_core::{Clock, Incarnation, WorkerId};
use tokio::{sync::watch, task::JoinHandle};
use tracing::{info, warn};

use crate::{Coordinator, Renewal, Result, WorkerMeta};

/// Why a lease is no longer good.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LeaseLost {
    /// No renewal succeeded for 2/3 of the lease (backend unreachable, or this process was
    /// stalled). The liveness may still exist, but acting on it is no longer safe.
    #[error("lease not renewed for {0} ms")]
    Expired(u64),
    /// The backend says the liveness is gone or belongs to another incarnation.
    #[error("liveness lost in the coordinator")]
    Revoked,
    /// The keeper was stopped (shutdown).
    #[error("lease keeper stopped")]
    Stopped,
}

#[derive(Debug)]
struct Shared {
    clock: Arc<dyn Clock>,
    lease_ms: u64,
    /// Monotonic ms at which the last successful renewal was sent; `u64::MAX` once revoked.
    t_ok: AtomicU64,
    bots_held: AtomicU32,
}

impl Shared {
    fn check(&self) -> Result<(), LeaseLost> {
        let t_ok = self.t_ok.load(Ordering::SeqCst);
        if t_ok == u64::MAX {
            return Err(LeaseLost::Revoked);
        }
        let age = self.clock.now_ms().saturating_sub(t_ok);
        if age >= self.lease_ms * 2 / 3 {
            return Err(LeaseLost::Expired(age));
        }
        Ok(())
    }
}

/// A cheap, cloneable view of a running [`LeaseKeeper`].
#[derive(Clone, Debug)]
pub struct LeaseHandle {
    shared: Arc<Shared>,
    /// `true` while acting is not safe; flipped by the keeper's fence timer on transitions
    /// only, so its waiters are not woken by every renewal.
    fence: watch::Receiver<bool>,
    worker: WorkerId,
    incarnation: Incarnation,
}

impl LeaseHandle {
    /// Whether acting now is safe. Call it before every act others can observe: handling an
    /// update, sending a reply, advancing a cursor, polling again.
    ///
    /// # Errors
    /// [`LeaseLost`] says why not.
    pub fn check(&self) -> Result<(), LeaseLost> {
        self.shared.check()
    }

    /// Resolves when the lease is no longer safe to act on (see [`LeaseHandle::check`]); at
    /// once if it already is not. Driven by the keeper's own fence timer, never by a
    /// coordinator call: it resolves at the latest a few milliseconds after
    /// `t_ok + 2/3 · lease`, whatever else the worker is awaiting. It takes `&self`, wakes
    /// only when the lease turns unsafe (not on every renewal) and holds no timer of its own,
    /// so thousands of bot tasks can wait on it beside their polls.
    pub async fn lost(&self) -> LeaseLost {
        let mut fence = self.fence.clone();
        loop {
            if let Err(e) = self.shared.check() {
                return e;
            }
            // Safe now. A raised flag is stale (a renewal landed since): wait for the timer to
            // lower it; a lowered one, for the timer to raise it.
            let up = *fence.borrow_and_update();
            if fence.wait_for(|f| *f != up).await.is_err() {
                // Keeper gone.
                return self.shared.check().err().unwrap_or(LeaseLost::Stopped);
            }
        }
    }

    /// Sets the bot count reported on the next renewal.
    pub fn set_bots_held(&self, n: u32) {
        self.shared.bots_held.store(n, Ordering::Relaxed);
    }

    /// The worker id.
    pub fn worker(&self) -> &WorkerId {
        &self.worker
    }

    /// The incarnation this lease belongs to.
    pub fn incarnation(&self) -> &Incarnation {
        &self.incarnation
    }
}

/// Registers a worker and renews its liveness in a background task.
///
/// The task is owned by the keeper: [`LeaseKeeper::stop`] (or dropping the keeper) ends it.
#[derive(Debug)]
pub struct LeaseKeeper {
    handle: LeaseHandle,
    task: JoinHandle<()>,
    /// The fence timer (see [`LeaseHandle::lost`]).
    timer: JoinHandle<()>,
}

impl LeaseKeeper {
    /// Registers `worker` on `coord` and starts renewing every `lease / 3`.
    ///
    /// # Errors
    /// Registration failures (backend unreachable, lease out of range).
    pub async fn start(
        coord: Arc<dyn Coordinator>,
        clock: Arc<dyn Clock>,
        worker: WorkerId,
        meta: WorkerMeta,
        lease: Duration,
    ) -> Result<Self> {
        let t_send = clock.now_ms();
        let incarnation = coord.register(&worker, &meta, lease).await?;
        let lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
        let shared = Arc::new(Shared {
            clock,
            lease_ms,
            t_ok: AtomicU64::new(t_send),
            bots_held: AtomicU32::new(meta.bots_held),
        });
        let (tx, rx) = watch::channel(t_send);
        let (fence_tx, fence_rx) = watch::channel(false);
        let task = tokio::spawn(renew_loop(coord, shared.clone(), tx, worker.clone()));
        let timer = tokio::spawn(fence_timer(shared.clone(), rx, fence_tx));
        Ok(Self {
            handle: LeaseHandle {
                shared,
                fence: fence_rx,
                worker,
                incarnation,
            },
            task,
            timer,
        })
    }

    /// A handle to check and watch the lease.
    pub fn handle(&self) -> LeaseHandle {
        self.handle.clone()
    }

    /// Stops renewing (the liveness then ends by unregistering or by expiry).
    pub fn stop(self) {
        self.task.abort();
        self.timer.abort();
    }
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        self.task.abort();
        // Its sender dropped, every `lost` waiter resolves (`Stopped`).
        self.timer.abort();
    }
}

/// Flips `fence` to `true` at `t_ok + 2/3 · lease` and back to `false` when a renewal makes
/// acting safe again. It awaits only the clock and `t_ok`'s changes, never the coordinator:
/// however long a renewal (or any other call) hangs on a dead link, the fence falls on time.
async fn fence_timer(
    shared: Arc<Shared>,
    mut changed: watch::Receiver<u64>,
    fence: watch::Sender<bool>,
) {
    loop {
        let unsafe_now = shared.check().is_err();
        fence.send_if_modified(|f| {
            let flip = *f != unsafe_now;
            *f = unsafe_now;
            flip
        });
        let t_ok = shared.t_ok.load(Ordering::SeqCst);
        if t_ok == u64::MAX {
            // Revoked for good; the flag stays up.
            return;
        }
        // Until the lease turns unsafe (or, once it has, until a renewal lands).
        let wait = if unsafe_now {
            None
        } else {
            let stop_at = t_ok.saturating_add(shared.lease_ms * 2 / 3);
            Some(stop_at.saturating_sub(shared.clock.now_ms()))
        };
        tokio::select! {
            r = changed.changed() => if r.is_err() {
                // The renewals ended (keeper stopped): nothing will make acting safe again.
                fence.send_replace(true);
                return;
            },
            () = async {
                match wait {
                    Some(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                    None => std::future::pending().await,
                }
            } => {}
        }
    }
}

async fn renew_loop(
    coord: Arc<dyn Coordinator>,
    shared: Arc<Shared>,
    tx: watch::Sender<u64>,
    worker: WorkerId,
) {
    let period = Duration::from_millis((shared.lease_ms / 3).max(1));
    // After a failure, try again sooner, but not in a tight loop.
    let retry = Duration::from_millis((shared.lease_ms / 10).clamp(20, 1000));
    let mut next = period;
    loop {
        tokio::time::sleep(next).await;
        let t_send = shared.clock.now_ms();
        // A renewal that takes longer than the lease is useless: its answer would be stale.
        let answer = tokio::time::timeout(
            Duration::from_millis(shared.lease_ms / 3),
            coord.renew_with(shared.bots_held.load(Ordering::Relaxed), rss_bytes()),
        )
        .await;
        match answer {
            Ok(Ok(Renewal::Renewed)) => {
                if shared.t_ok.load(Ordering::SeqCst) != u64::MAX {
                    shared.t_ok.store(t_send, Ordering::SeqCst);
                    let _ = tx.send(t_send);
                }
                next = period;
            }
            Ok(Ok(Renewal::Lost)) => {
                warn!(%worker, "liveness lost in the coordinator; stopping bots");
                shared.t_ok.store(u64::MAX, Ordering::SeqCst);
                let _ = tx.send(u64::MAX);
                return;
            }
            Ok(Err(e)) => {
                warn!(%worker, error = %e, "lease renewal failed; retrying");
                next = retry;
            }
            Err(_) => {
                warn!(%worker, "lease renewal timed out; retrying");
                next = retry;
            }
        }
        if shared.check().is_err() {
            // Wake watchers so they notice the expiry even though nothing was renewed.
            let _ = tx.send(shared.t_ok.load(Ordering::SeqCst));
            info!(%worker, "lease no longer safe to act on");
        }
    }
}

/// This process's resident memory in bytes (Linux: `/proc/self/statm`); 0 when unknown.
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages.saturating_mul(4096))
}
