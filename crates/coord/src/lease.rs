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
//!
//! With its coordination groups kept apart ([`LeaseKeeper::start_with`]), the keeper keeps a
//! `t_ok` per group: a group that does not answer fences only the handles of that group
//! ([`LeaseHandle::in_group`]), and a group where the liveness was lost (its data lost, or
//! this worker's deadline there passed) is joined again under a fresh incarnation at once,
//! its earlier handles revoked for good. The roster's group (0) is the whole lease: lost
//! there, the worker registers again.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU32, AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use botfleet_core::{Clock, Incarnation, WorkerId};
use tokio::{sync::watch, task::JoinHandle};
use tracing::{info, warn};

use crate::{Coordinator, Group, Renewal, Result, WorkerMeta};

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

/// One coordination group's renewals, when groups are kept apart.
#[derive(Debug)]
struct GroupState {
    /// Monotonic ms at which the last renewal that succeeded in the group was sent;
    /// `u64::MAX` while the liveness there is lost (until the group is joined again).
    t_ok: AtomicU64,
    /// How many times the group was joined again: a handle of an earlier one is revoked.
    generation: AtomicU64,
}

#[derive(Debug)]
struct Shared {
    clock: Arc<dyn Clock>,
    lease_ms: u64,
    /// Monotonic ms at which the last successful renewal was sent; `u64::MAX` once revoked.
    /// With groups kept apart, the roster's (group 0's); else one that every group answered.
    t_ok: AtomicU64,
    /// Each group's, in group order, when groups are kept apart (else empty).
    groups: Vec<GroupState>,
    bots_held: AtomicU32,
}

impl Shared {
    /// Whether acting on a renewal sent at `t_ok` is safe now.
    fn fresh(&self, t_ok: u64) -> Result<(), LeaseLost> {
        if t_ok == u64::MAX {
            return Err(LeaseLost::Revoked);
        }
        let age = self.clock.now_ms().saturating_sub(t_ok);
        if age >= self.lease_ms * 2 / 3 {
            return Err(LeaseLost::Expired(age));
        }
        Ok(())
    }

    fn check(&self) -> Result<(), LeaseLost> {
        self.fresh(self.t_ok.load(Ordering::SeqCst))
    }

    /// The check of a handle of group `k` (its `generation`): revoked with the whole lease
    /// (the roster's liveness lost: every group's is), else the group's own renewals.
    fn check_group(&self, k: usize, generation: u64) -> Result<(), LeaseLost> {
        let whole = self.t_ok.load(Ordering::SeqCst);
        if whole == u64::MAX {
            return Err(LeaseLost::Revoked);
        }
        match self.groups.get(k).filter(|_| k > 0) {
            None => self.fresh(whole),
            Some(g) => {
                // `t_ok` before the generation: the keeper bumps the generation before it
                // stores a rejoined group's `t_ok`, so a handle that sees the new `t_ok` sees
                // the new generation too (and an earlier handle is refused).
                let t_ok = g.t_ok.load(Ordering::SeqCst);
                if g.generation.load(Ordering::SeqCst) != generation {
                    return Err(LeaseLost::Revoked);
                }
                self.fresh(t_ok)
            }
        }
    }

    /// Group `k`'s generation now (0 without groups kept apart).
    fn generation(&self, k: usize) -> u64 {
        self.groups
            .get(k)
            .map_or(0, |s| s.generation.load(Ordering::SeqCst))
    }

    /// How each part stands now (safe, late or revoked), with its generation: the whole
    /// lease, then each group's. Any change is a transition its handles' waiters must see (a
    /// late group found lost, and a group lost and joined again between two looks, included).
    fn standings(&self) -> Vec<(Standing, u64)> {
        std::iter::once((Standing::of(self.check()), 0))
            .chain(self.groups.iter().skip(1).map(|g| {
                let t_ok = g.t_ok.load(Ordering::SeqCst);
                (
                    Standing::of(self.fresh(t_ok)),
                    g.generation.load(Ordering::SeqCst),
                )
            }))
            .collect()
    }

    /// When the next part now safe turns unsafe (monotonic ms), if any is safe.
    fn next_fall(&self) -> Option<u64> {
        let span = self.lease_ms * 2 / 3;
        std::iter::once(self.t_ok.load(Ordering::SeqCst))
            .chain(
                self.groups
                    .iter()
                    .skip(1)
                    .map(|g| g.t_ok.load(Ordering::SeqCst)),
            )
            .filter(|t| *t != u64::MAX)
            .map(|t| t.saturating_add(span))
            .filter(|at| *at > self.clock.now_ms())
            .min()
    }
}

/// How a part of the lease stands, for the fence timer's transitions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Standing {
    Safe,
    Late,
    Revoked,
}

impl Standing {
    fn of(check: Result<(), LeaseLost>) -> Self {
        match check {
            Ok(()) => Self::Safe,
            Err(LeaseLost::Revoked) => Self::Revoked,
            Err(_) => Self::Late,
        }
    }
}

/// A cheap, cloneable view of a running [`LeaseKeeper`]: of the whole lease, or of one
/// coordination group's part of it ([`LeaseHandle::in_group`]).
#[derive(Clone, Debug)]
pub struct LeaseHandle {
    shared: Arc<Shared>,
    /// Bumped by the keeper's fence timer each time some part turns unsafe or safe again
    /// (transitions only, so its waiters are not woken by every renewal).
    fence: watch::Receiver<u64>,
    worker: WorkerId,
    incarnation: Incarnation,
    /// The group this handle is for, and its generation then (`None`: the whole lease).
    group: Option<(usize, u64)>,
}

impl LeaseHandle {
    /// Whether acting now is safe. Call it before every act others can observe: handling an
    /// update, sending a reply, advancing a cursor, polling again.
    ///
    /// # Errors
    /// [`LeaseLost`] says why not.
    pub fn check(&self) -> Result<(), LeaseLost> {
        match self.group {
            None => self.shared.check(),
            Some((k, generation)) => self.shared.check_group(k, generation),
        }
    }

    /// Resolves when the lease is no longer safe to act on (see [`LeaseHandle::check`]); at
    /// once if it already is not. Driven by the keeper's own fence timer, never by a
    /// coordinator call: it resolves at the latest a few milliseconds after
    /// `t_ok + 2/3 · lease`, whatever else the worker is awaiting. It takes `&self`, wakes
    /// only when some part of the lease turns unsafe or safe again (not on every renewal) and
    /// holds no timer of its own, so thousands of bot tasks can wait on it beside their polls.
    pub async fn lost(&self) -> LeaseLost {
        self.until(Result::err).await.unwrap_or(LeaseLost::Stopped)
    }

    /// Resolves once this handle is revoked for good ([`LeaseLost::Revoked`]: the liveness
    /// it stands for is gone, or its group was found lost or joined again), never while it is
    /// merely late; never either once the keeper stopped without revoking it. Woken like
    /// [`LeaseHandle::lost`], by the keeper's transitions only.
    pub async fn revoked(&self) {
        let revoked = |r: Result<(), LeaseLost>| (r == Err(LeaseLost::Revoked)).then_some(());
        if self.until(revoked).await.is_none() {
            std::future::pending().await
        }
    }

    /// Waits, woken by the keeper's transitions, until `f` of [`LeaseHandle::check`] answers
    /// something; `None` once the keeper is gone and it still answers nothing.
    async fn until<T>(&self, f: impl Fn(Result<(), LeaseLost>) -> Option<T>) -> Option<T> {
        let mut fence = self.fence.clone();
        loop {
            // Marked seen before the check: a flip after it wakes the wait below.
            fence.borrow_and_update();
            if let Some(t) = f(self.check()) {
                return Some(t);
            }
            if fence.changed().await.is_err() {
                return f(self.check());
            }
        }
    }

    /// The view of group `g`'s part of the lease: with groups kept apart, it fails when `g`
    /// is not renewed in time (the roster's group late does not fail the others), when the
    /// whole lease is revoked, and for good once `g` is joined again (the grants it guards
    /// were the earlier incarnation's there); a handle taken while `g` is lost, before it is
    /// joined again, stays revoked. Take it before the call whose grant it guards. Without groups kept apart, the
    /// whole lease. [`LeaseHandle::incarnation`] stays the registration's: a group's own is
    /// [`Coordinator::registration_in`].
    #[must_use]
    pub fn in_group(&self, g: Group) -> Self {
        let k = usize::from(g.index());
        let generation = self.shared.generation(k);
        Self {
            group: Some((k, generation)),
            ..self.clone()
        }
    }

    /// [`LeaseHandle::check`] of group `g`'s part as it is now: whether a grant in `g`
    /// asked for now could be acted on (see [`LeaseHandle::in_group`]).
    ///
    /// # Errors
    /// [`LeaseLost`] says why not.
    pub fn check_in(&self, g: Group) -> Result<(), LeaseLost> {
        let k = usize::from(g.index());
        self.shared.check_group(k, self.shared.generation(k))
    }

    /// How many times a coordination group was joined again under this lease (with groups
    /// kept apart; else 0): when it moves, a group lost its data or this worker's liveness
    /// there, and its grace window (if any) may have begun.
    pub fn groups_rejoined(&self) -> u64 {
        self.shared
            .groups
            .iter()
            .map(|g| g.generation.load(Ordering::SeqCst))
            .sum()
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
    /// Registers `worker` on `coord` and starts renewing every `lease / 3`; a group lost or
    /// not answering counts for the whole lease.
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
        Self::start_with(coord, clock, worker, meta, lease, false).await
    }

    /// [`LeaseKeeper::start`], with the coordination groups kept apart when `groups_apart`
    /// (see the module's notes): the whole lease is then the roster's group's.
    ///
    /// # Errors
    /// Registration failures (backend unreachable, lease out of range).
    pub async fn start_with(
        coord: Arc<dyn Coordinator>,
        clock: Arc<dyn Clock>,
        worker: WorkerId,
        meta: WorkerMeta,
        lease: Duration,
        groups_apart: bool,
    ) -> Result<Self> {
        let t_send = clock.now_ms();
        let incarnation = coord.register(&worker, &meta, lease).await?;
        let lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
        let groups = if groups_apart {
            coord
                .all_groups()
                .iter()
                .map(|_| GroupState {
                    t_ok: AtomicU64::new(t_send),
                    generation: AtomicU64::new(0),
                })
                .collect()
        } else {
            Vec::new()
        };
        let shared = Arc::new(Shared {
            clock,
            lease_ms,
            t_ok: AtomicU64::new(t_send),
            groups,
            bots_held: AtomicU32::new(meta.bots_held),
        });
        let (tx, rx) = watch::channel(0u64);
        let (fence_tx, fence_rx) = watch::channel(0u64);
        let task = tokio::spawn(renew_loop(coord, shared.clone(), tx, worker.clone()));
        let timer = tokio::spawn(fence_timer(shared.clone(), rx, fence_tx, worker.clone()));
        Ok(Self {
            handle: LeaseHandle {
                shared,
                fence: fence_rx,
                worker,
                incarnation,
                group: None,
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

/// Bumps `fence` when a part of the lease turns unsafe (at its `t_ok + 2/3 · lease`) and when
/// a renewal makes it safe again. It awaits only the clock and the renewals' notices, never
/// the coordinator: however long a renewal (or any other call) hangs on a dead link, the
/// fence falls on time. O(groups) a wake-up.
async fn fence_timer(
    shared: Arc<Shared>,
    mut changed: watch::Receiver<u64>,
    fence: watch::Sender<u64>,
    worker: WorkerId,
) {
    let mut was = shared.standings();
    loop {
        let now = shared.standings();
        if now != was {
            log_groups(&worker, &was, &now);
            was = now;
            fence.send_modify(|n| *n = n.wrapping_add(1));
        }
        if shared.t_ok.load(Ordering::SeqCst) == u64::MAX {
            // Revoked for good: every handle fails from now on.
            fence.send_modify(|n| *n = n.wrapping_add(1));
            return;
        }
        // Until the next part turns unsafe (or, with none safe, until a renewal lands).
        let wait = shared
            .next_fall()
            .map(|at| at.saturating_sub(shared.clock.now_ms()));
        tokio::select! {
            r = changed.changed() => if r.is_err() {
                // The renewals ended (keeper stopped): nothing will make acting safe again.
                fence.send_modify(|n| *n = n.wrapping_add(1));
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

/// Says which coordination groups (kept apart) turned unsafe, and which safe again, between
/// two looks of the fence timer: one line each way, naming the first few (a Redis away makes
/// every group late at once).
fn log_groups(worker: &WorkerId, was: &[(Standing, u64)], now: &[(Standing, u64)]) {
    const NAMED: usize = 8;
    let (mut fell, mut back) = (Vec::new(), Vec::new());
    // Part 0 is the whole lease (the roster's group), logged by the renewals.
    for (k, (before, after)) in was.iter().zip(now).enumerate().skip(1) {
        match (before.0, after.0) {
            (Standing::Safe, Standing::Late | Standing::Revoked) => fell.push(k),
            (Standing::Late | Standing::Revoked, Standing::Safe) => back.push(k),
            _ => {}
        }
    }
    // As a group shows itself (`g3`).
    let names = |gs: &[usize]| {
        let mut s: Vec<String> = gs.iter().take(NAMED).map(|k| format!("g{k}")).collect();
        if gs.len() > NAMED {
            s.push(format!("and {} more", gs.len() - NAMED));
        }
        s.join(", ")
    };
    if !fell.is_empty() {
        warn!(%worker, groups = fell.len(), which = %names(&fell), "lease not safe in coordination groups; their bots and chats are fenced");
    }
    if !back.is_empty() {
        info!(%worker, groups = back.len(), which = %names(&back), "lease safe again in coordination groups");
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
    let budget = Duration::from_millis(shared.lease_ms / 3);
    let expected = coord.all_groups().len();
    let mut due = tokio::time::Instant::now() + period;
    // Lost groups being joined again, each apart from the renewals (one at a time per
    // group): a join that hangs delays no group's renewal.
    let mut joining = tokio::task::JoinSet::new();
    let mut in_flight: HashMap<tokio::task::Id, Group> = HashMap::new();
    let mut join_failures = Failures::default();
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(due) => {}
            Some(done) = joining.join_next_with_id(), if !joining.is_empty() => {
                match done {
                    Ok((id, (g, t_join, r))) => {
                        in_flight.remove(&id);
                        joined(&shared, &worker, g, t_join, r, &mut join_failures);
                    }
                    Err(e) => {
                        in_flight.remove(&e.id());
                    }
                }
                tx.send_modify(|n| *n = n.wrapping_add(1));
                continue;
            }
        }
        let t_send = shared.clock.now_ms();
        // A renewal that takes longer than the lease is useless: its answer would be stale.
        let answer = tokio::time::timeout(
            budget,
            coord.renew_groups(shared.bots_held.load(Ordering::Relaxed), rss_bytes()),
        )
        .await;
        let next = match answer {
            Ok(answers) => match take_answers(&shared, &worker, t_send, answers, expected) {
                None => {
                    warn!(%worker, "liveness lost in the coordinator; stopping bots");
                    shared.t_ok.store(u64::MAX, Ordering::SeqCst);
                    tx.send_modify(|n| *n = n.wrapping_add(1));
                    return;
                }
                Some((all, lost)) => {
                    for g in lost {
                        if in_flight.values().any(|f| *f == g) {
                            continue;
                        }
                        let (coord, clock) = (coord.clone(), shared.clock.clone());
                        let task = joining.spawn(async move {
                            let t_join = clock.now_ms();
                            (
                                g,
                                t_join,
                                tokio::time::timeout(budget, coord.rejoin_group(g)).await,
                            )
                        });
                        in_flight.insert(task.id(), g);
                    }
                    if all {
                        period
                    } else {
                        retry
                    }
                }
            },
            Err(_) => {
                warn!(%worker, "lease renewal timed out; retrying");
                retry
            }
        };
        join_failures.log(
            &worker,
            "cannot join lost coordination groups again; retrying",
        );
        due = tokio::time::Instant::now() + next;
        // Wake the timer: a part may be safe again, lost, or (nothing renewed) due to fall.
        tx.send_modify(|n| *n = n.wrapping_add(1));
        if shared.check().is_err() {
            info!(%worker, "lease no longer safe to act on");
        }
    }
}

/// Failures of one kind in a round, logged once: the count and the first.
#[derive(Default)]
struct Failures {
    count: usize,
    first: Option<(Group, String)>,
}

impl Failures {
    fn add(&mut self, g: Group, why: String) {
        self.count += 1;
        self.first.get_or_insert((g, why));
    }

    fn log(&mut self, worker: &WorkerId, what: &str) {
        if let Some((g, why)) = self.first.take() {
            warn!(%worker, groups = self.count, first = %g, error = %why, "{what}");
        }
        self.count = 0;
    }
}

/// Takes one round of renewals (sent at `t_send`; `expected` groups): `None` when the whole
/// lease is lost (a group lost, or with groups kept apart the roster's), else whether every
/// group renewed and, with groups kept apart, the groups lost now (fenced for good until
/// joined again: [`joined`]).
fn take_answers(
    shared: &Shared,
    worker: &WorkerId,
    t_send: u64,
    answers: Vec<(Group, Result<Renewal>)>,
    expected: usize,
) -> Option<(bool, Vec<Group>)> {
    let mut all = answers.len() >= expected.max(1);
    if !all {
        warn!(%worker, answered = answers.len(), expected, "a renewal round left groups unanswered");
    }
    let mut lost = Vec::new();
    let mut failed = Failures::default();
    for (g, r) in answers {
        match r {
            Ok(Renewal::Renewed) => {
                if let Some(s) = shared.groups.get(usize::from(g.index())) {
                    if s.t_ok.load(Ordering::SeqCst) != u64::MAX {
                        s.t_ok.store(t_send, Ordering::SeqCst);
                    }
                }
            }
            Ok(Renewal::Lost) => {
                all = false;
                lost.push(g);
            }
            Err(e) => {
                all = false;
                failed.add(g, e.to_string());
            }
        }
    }
    failed.log(worker, "lease renewal failed; retrying");
    let apart = !shared.groups.is_empty();
    if lost.contains(&Group::ZERO) || (!apart && !lost.is_empty()) {
        return None;
    }
    if !apart {
        if all && shared.t_ok.load(Ordering::SeqCst) != u64::MAX {
            shared.t_ok.store(t_send, Ordering::SeqCst);
        }
        return Some((all, Vec::new()));
    }
    // The whole lease is the roster's group's.
    if let Some(roster) = shared.groups.first() {
        shared
            .t_ok
            .store(roster.t_ok.load(Ordering::SeqCst), Ordering::SeqCst);
    }
    for g in &lost {
        if let Some(s) = shared.groups.get(usize::from(g.index())) {
            s.t_ok.store(u64::MAX, Ordering::SeqCst);
        }
    }
    Some((all, lost))
}

/// A join of lost group `g` again (sent at `t_join`) answered: the group's generation moves on
/// (its earlier handles revoked for good), then its `t_ok`; a failure leaves it fenced (the
/// next round answers it lost again, and it is tried again).
fn joined(
    shared: &Shared,
    worker: &WorkerId,
    g: Group,
    t_join: u64,
    r: std::result::Result<Result<Incarnation>, tokio::time::error::Elapsed>,
    failures: &mut Failures,
) {
    let Some(s) = shared.groups.get(usize::from(g.index())) else {
        return;
    };
    match r {
        Ok(Ok(inc)) => {
            // The generation first: a handle of the earlier one never sees the new t_ok.
            s.generation.fetch_add(1, Ordering::SeqCst);
            s.t_ok.store(t_join, Ordering::SeqCst);
            info!(%worker, group = %g, incarnation = %inc, "liveness lost in one coordination group; joined it again");
        }
        Ok(Err(e)) => failures.add(g, e.to_string()),
        Err(_) => failures.add(g, "timed out".to_owned()),
    }
}

/// This process's resident memory in bytes (Linux: `/proc/self/statm`); 0 when unknown.
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages.saturating_mul(4096))
}
