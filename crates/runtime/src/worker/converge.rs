//! Converging on the ring's assignment: claim what is ours, let go of what is not, and drain
//! on shutdown. Part of the worker's state machine (see the parent module).
//!
//! Nothing here waits for a bot task or for a batch of coordinator calls: claims and let-gos
//! are jobs in the worker's `JoinSet`, each reporting back with a [`Signal`].

use std::{
    collections::HashMap,
    sync::{atomic::Ordering, Arc},
    time::Duration,
};

use botfleet_coord::{
    placement::{Ring, RingConfig, DEFAULT_BALANCE},
    ClaimOutcome, Coordinator, LeaseHandle, LeaseLost, LiveWorker, WorkerCommand,
};
use botfleet_core::{BotId, BotStatus, Fence, WorkerId};
use botfleet_store::Store;
use futures_util::{future::join_all, stream, StreamExt};
use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
    time::Instant,
};
use tracing::{debug, info, warn};

use super::{Running, Signal, State};
use crate::{
    bot::{BotCtx, BotExit, BotSettings},
    handler::Handler,
};

/// Coordinator calls the worker's jobs make at once (claims, hand-overs, releases). They are
/// pipelined on one connection, so a thousand keep it busy without queueing for seconds.
pub(super) const COORD_CONCURRENCY: usize = 1_024;

/// Bots claimed together: one store read of their fence floors, their claims pipelined, one
/// store transaction accepting the grants.
const CLAIM_BATCH: usize = 256;

/// How long a stopping bot task may take before it is aborted.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// What the last pass computed, and from what.
#[derive(Debug, Default)]
pub(super) struct Plan {
    /// Members, capacities and registry generation the plan was computed from.
    inputs: Option<u64>,
    /// Bot → the worker that should run it.
    owners: Arc<HashMap<BotId, WorkerId>>,
    /// The bots `owners` gives us, so a pass does not walk the whole fleet's bots.
    mine: Arc<Vec<BotId>>,
}

/// What a let-go job does with the claim once the bot's task has ended.
#[derive(Debug, Clone)]
pub(super) enum After {
    /// Hand it to this worker (released instead if that is us or not live).
    HandOver(WorkerId),
    /// Give it up.
    Release,
    /// Leave it: the lease is not safe, the claim ends with it.
    Keep,
}

/// A claim job's answer for one bot.
#[derive(Debug)]
pub(super) enum ClaimResult {
    Granted(Fence),
    /// A live worker holds it.
    Held(WorkerId),
    /// The coordinator lost its data and the bot may still run elsewhere; ask again then.
    Grace(Duration),
    /// Our liveness is gone, or the call failed; the next pass asks again.
    NotGranted,
}

/// Claims `bots`, each with the store's highest fence as its floor, and records the grants'
/// fences in the store before anything acts on them. One answer per bot.
async fn claim_many(
    coord: &dyn Coordinator,
    store: &dyn Store,
    bots: Vec<BotId>,
) -> Vec<(BotId, ClaimResult)> {
    let mins = match store.highest_fences(&bots).await {
        Ok(m) => m,
        Err(e) => {
            debug!(error = %e, "cannot read the fence floors; not claiming now");
            return bots
                .into_iter()
                .map(|b| (b, ClaimResult::NotGranted))
                .collect();
        }
    };
    let outcomes = join_all(bots.iter().zip(&mins).map(|(b, m)| coord.claim(b, *m))).await;
    let mut out = Vec::with_capacity(bots.len());
    let mut granted = Vec::new();
    for (bot, o) in bots.into_iter().zip(outcomes) {
        match o {
            Ok(ClaimOutcome::Granted(f)) => granted.push((bot, f)),
            Ok(ClaimOutcome::Held(o)) => out.push((bot, ClaimResult::Held(o.worker))),
            Ok(ClaimOutcome::Grace(d)) => out.push((bot, ClaimResult::Grace(d))),
            Ok(ClaimOutcome::NotLive) => out.push((bot, ClaimResult::NotGranted)),
            Err(e) => {
                debug!(%bot, error = %e, "claim failed");
                out.push((bot, ClaimResult::NotGranted));
            }
        }
    }
    if granted.is_empty() {
        return out;
    }
    let answers = match store.accept_fences(&granted).await {
        Ok(a) => a
            .into_iter()
            .map(|r| r.err().map(|e| e.to_string()))
            .collect(),
        Err(e) => vec![Some(e.to_string()); granted.len()],
    };
    for ((bot, f), refused) in granted.into_iter().zip(answers) {
        match refused {
            None => out.push((bot, ClaimResult::Granted(f))),
            Some(why) => {
                warn!(%bot, error = %why, "claim granted but the store did not take its fence");
                let _ = coord.release(&bot, f).await;
                out.push((bot, ClaimResult::NotGranted));
            }
        }
    }
    out
}

/// Hands a held claim over (or releases it); failures leave it to end with our liveness.
async fn give_up(
    coord: &dyn Coordinator,
    bot: &BotId,
    fence: Fence,
    to: Option<&WorkerId>,
    me: &WorkerId,
) -> bool {
    let res = match to.filter(|t| *t != me) {
        Some(t) => coord.hand_over(bot, fence, t).await,
        None => coord.release(bot, fence).await,
    };
    if let Err(e) = &res {
        // The claim then ends with our liveness; nobody runs the bot twice meanwhile.
        warn!(%bot, error = %e, "could not hand over; the claim will expire");
    }
    res.unwrap_or(false)
}

/// Asks a bot task to stop and waits (at most [`STOP_TIMEOUT`]) until it has: its poll is
/// closed before the bot is handed over, so the next owner never meets a second poller.
async fn stop_task(stop: &watch::Sender<bool>, mut task: JoinHandle<()>) {
    let _ = stop.send(true);
    if tokio::time::timeout(STOP_TIMEOUT, &mut task).await.is_err() {
        task.abort();
    }
}

/// The plan's inputs, hashed: live members (id, incarnation, capacity) and the registry
/// generation.
fn inputs_of(live: &[LiveWorker], generation: u64, avoid: &[(BotId, WorkerId)]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for l in live {
        (l.id.as_str(), l.incarnation.as_str(), l.meta.capacity).hash(&mut h);
    }
    generation.hash(&mut h);
    avoid.hash(&mut h);
    h.finish()
}

impl State {
    /// The bounded assignment of the enabled bots over `live`.
    fn assign(&self, live: &[LiveWorker]) -> (HashMap<BotId, WorkerId>, usize) {
        let caps: HashMap<&WorkerId, u32> = live.iter().map(|l| (&l.id, l.meta.capacity)).collect();
        let ring = Ring::new(live.iter().map(|l| &l.id), RingConfig::default());
        let enabled: Vec<BotId> = self
            .registry
            .values()
            .filter(|r| r.spec.enabled)
            .map(|r| r.spec.id.clone())
            .collect();
        // Capacity counts connections: a Discord slice of K shards weighs K. A unit whose
        // transport was down on a worker goes elsewhere for a while.
        let avoid: std::collections::HashSet<(&BotId, &WorkerId)> =
            self.avoid.iter().map(|(b, w)| (b, w)).collect();
        let plan = ring.assign_with(
            &enabled,
            DEFAULT_BALANCE,
            |w| caps.get(w).copied(),
            |u| self.weight(u),
            |u, w| !avoid.contains(&(u, w)),
        );
        (plan.owners, plan.unplaced.len())
    }

    /// The connections unit `u` holds (1 for a unit not in the registry).
    fn weight(&self, u: &BotId) -> u32 {
        self.registry.get(u).map_or(1, |r| r.spec.weight())
    }

    /// Whether `bot` should run here now.
    fn should_run(&self, bot: &BotId) -> bool {
        !self.draining
            && !self.fenced
            && self.plan.owners.get(bot) == Some(self.me())
            && self.registry.get(bot).is_some_and(|r| r.spec.enabled)
    }

    /// Stops `bot` (if it runs here) in a job that then does `after` with its claim.
    pub(super) fn let_go(&mut self, bot: &BotId, after: After) {
        let Some(r) = self.running.remove(bot) else {
            return;
        };
        match &after {
            After::HandOver(to) if to != self.me() => self.note(
                "bot_handed_over",
                Some(bot.as_str()),
                Some(to.as_str()),
                None,
            ),
            _ => self.note("bot_stopped", Some(bot.as_str()), None, None),
        }
        self.stopping.insert(bot.clone());
        let (coord, tx, metrics, slots) = (
            self.w.coord.clone(),
            self.tx.clone(),
            self.w.metrics.clone(),
            self.coord_slots.clone(),
        );
        let (bot, me) = (bot.clone(), self.me().clone());
        self.jobs.spawn(async move {
            stop_task(&r.stop, r.task).await;
            let to = match &after {
                After::Keep => None,
                After::HandOver(to) => Some(to),
                After::Release => None,
            };
            if !matches!(after, After::Keep) {
                let _slot = slots.acquire().await;
                if give_up(&*coord, &bot, r.fence, to, &me).await && to.is_some_and(|t| *t != me) {
                    metrics.handoff();
                }
            }
            let _ = tx.send(Signal::LetGo(bot));
        });
        if let Some(l) = &self.lease {
            l.set_bots_held(self.running.len() as u32);
        }
    }

    /// Converges on our share. Unless `force`d, the placement is recomputed only when its
    /// inputs (members, capacities, registry) changed or some of our share is still unclaimed:
    /// an idle worker with thousands of bots costs one member listing per tick.
    pub(super) async fn reconcile(&mut self, force: bool) {
        if self.draining {
            return;
        }
        let Some(lease) = self.lease.clone() else {
            return;
        };
        if lease.check().is_err() {
            return;
        }
        let mut live = match self.w.coord.live_workers().await {
            Ok(l) => l,
            Err(e) => {
                warn!(error = %e, "cannot list workers; placement unchanged");
                return;
            }
        };
        if !live.iter().any(|l| &l.id == self.me()) {
            return;
        }
        // Workers that announced their leave count as gone (they hand their bots over now);
        // once they are gone for real, forget the announcement.
        self.leaving.retain(|w| live.iter().any(|l| &l.id == w));
        live.retain(|l| !self.leaving.contains(&l.id));
        self.note_members(&live);
        let inputs = inputs_of(&live, self.generation, &self.avoid);
        let changed = self.plan.inputs != Some(inputs);
        if !force && !changed && self.short == 0 && self.takes.is_empty() {
            return;
        }
        if changed {
            let (owners, unplaced) = self.assign(&live);
            let mine = owners
                .iter()
                .filter(|(_, o)| *o == self.me())
                .map(|(b, _)| b.clone())
                .collect();
            self.plan = Plan {
                inputs: Some(inputs),
                owners: Arc::new(owners),
                mine: Arc::new(mine),
            };
            self.w.metrics.set_unplaced(unplaced);
            if unplaced > 0 {
                warn!(count = unplaced, "bots no live worker has room for");
            }
        }
        let me = self.me().clone();
        let owners = self.plan.owners.clone();
        // Let go of what is no longer ours. Only a new plan makes running bots someone
        // else's (we start only our own), so the walk over every running bot happens on a
        // change, and otherwise at most once a second as a safety net.
        let scan = changed || self.last_scan.elapsed() >= Duration::from_secs(1);
        let extra: Vec<BotId> = if scan {
            self.last_scan = Instant::now();
            self.running
                .keys()
                .filter(|b| owners.get(*b) != Some(&me))
                .cloned()
                .collect()
        } else {
            Vec::new()
        };
        if !extra.is_empty() {
            info!(
                bots = extra.len(),
                "letting go of bots that are no longer ours"
            );
        }
        for bot in extra {
            let after = match owners.get(&bot) {
                Some(to) => After::HandOver(to.clone()),
                None => After::Release,
            };
            self.let_go(&bot, after);
        }
        // Pass on bots handed to us that are not ours by our view.
        let pass_on: Vec<(BotId, Option<WorkerId>)> = self
            .takes
            .iter()
            .filter(|b| owners.get(*b) != Some(&me))
            .map(|b| (b.clone(), owners.get(b).cloned()))
            .collect();
        for (bot, _) in &pass_on {
            self.takes.remove(bot);
        }
        if !pass_on.is_empty() {
            let (coord, store, slots, me) = (
                self.w.coord.clone(),
                self.w.store.clone(),
                self.coord_slots.clone(),
                me.clone(),
            );
            self.jobs.spawn(async move {
                for chunk in pass_on.chunks(CLAIM_BATCH) {
                    let _slots = slots.acquire_many(chunk.len() as u32).await;
                    let bots = chunk.iter().map(|(b, _)| b.clone()).collect();
                    let to: HashMap<&BotId, &Option<WorkerId>> =
                        chunk.iter().map(|(b, t)| (b, t)).collect();
                    for (bot, r) in claim_many(&*coord, &*store, bots).await {
                        if let ClaimResult::Granted(f) = r {
                            let to = to.get(&bot).and_then(|t| t.as_ref());
                            give_up(&*coord, &bot, f, to, &me).await;
                        }
                    }
                }
            });
        }
        // Claim what is ours and not running, within capacity. Bots another live worker held
        // at our last try wait for its hand-over (or for the members to change), a lease at
        // most: a Take lost on its way (the hand-over record written, the push onto our
        // command list not) would leave them stopped everywhere till the registry's next read.
        let live_ids: std::collections::HashSet<&WorkerId> = live.iter().map(|l| &l.id).collect();
        let now = Instant::now();
        let retry = self.w.cfg.lease;
        self.held_by
            .retain(|_, (w, at)| live_ids.contains(w) && now.duration_since(*at) < retry);
        // Room in connections: a Discord slice of K shards takes K.
        // Weighed one by one only when some unit weighs more than 1 (a pass stays O(1) here
        // for a fleet of single-connection bots).
        let busy: u64 = if self.heavy {
            self.running
                .keys()
                .chain(self.claiming.iter())
                .chain(self.stopping.iter())
                .map(|u| u64::from(self.weight(u)))
                .sum()
        } else {
            (self.running.len() + self.claiming.len() + self.stopping.len()) as u64
        };
        let mut room = u64::from(self.w.cfg.capacity).saturating_sub(busy);
        let mine = self.plan.mine.clone();
        let mut wanted: Vec<BotId> = Vec::new();
        // Bots of a coordination group not safe now (not renewed in time, or lost and not
        // joined again yet) wait for it: still short, so a later pass asks again.
        let mut waiting = 0;
        for b in mine.iter().filter(|b| {
            !self.running.contains_key(*b)
                && !self.claiming.contains(*b)
                && !self.stopping.contains(*b)
                && (!self.held_by.contains_key(*b) || self.takes.contains(*b))
        }) {
            if lease.check_in(self.w.coord.group_of_bot(b)).is_err() {
                waiting += 1;
                continue;
            }
            let w = u64::from(self.weight(b));
            if w > room {
                continue;
            }
            room -= w;
            wanted.push(b.clone());
            if room == 0 {
                break;
            }
        }
        self.short = waiting;
        if wanted.is_empty() {
            return;
        }
        // Each claim's part of the lease (its group's), taken before it is sent: an answer
        // read after this worker registered again, or joined the bot's group again, belongs
        // to the earlier one.
        let under: Vec<(BotId, LeaseHandle)> = wanted
            .iter()
            .map(|b| (b.clone(), lease.in_group(self.w.coord.group_of_bot(b))))
            .collect();
        debug!(bots = wanted.len(), "claiming");
        self.claiming.extend(wanted.iter().cloned());
        let (coord, store, slots, tx) = (
            self.w.coord.clone(),
            self.w.store.clone(),
            self.coord_slots.clone(),
            self.tx.clone(),
        );
        self.jobs.spawn(async move {
            let chunks: Vec<Vec<(BotId, LeaseHandle)>> =
                under.chunks(CLAIM_BATCH).map(<[_]>::to_vec).collect();
            stream::iter(chunks)
                .for_each_concurrent(4, |chunk| {
                    let (coord, store, slots, tx) =
                        (coord.clone(), store.clone(), slots.clone(), tx.clone());
                    async move {
                        let (bots, mut under): (Vec<BotId>, HashMap<BotId, LeaseHandle>) = (
                            chunk.iter().map(|(b, _)| b.clone()).collect(),
                            chunk.into_iter().collect(),
                        );
                        let results = {
                            let _slots = slots.acquire_many(bots.len() as u32).await;
                            claim_many(&*coord, &*store, bots).await
                        };
                        for (bot, r) in results {
                            if let Some(part) = under.remove(&bot) {
                                let _ = tx.send(Signal::Claimed(bot, r, part));
                            }
                        }
                    }
                })
                .await;
        });
    }

    /// A claim job answered (the claim made under `under`, its group's part of the lease then);
    /// answers whether placement should be looked at again.
    pub(super) fn on_claimed(
        &mut self,
        bot: BotId,
        result: ClaimResult,
        under: LeaseHandle,
    ) -> bool {
        if !self.claiming.remove(&bot) {
            return false;
        }
        match result {
            ClaimResult::Granted(_)
                if self.lease.as_ref().map(LeaseHandle::incarnation)
                    != Some(under.incarnation())
                    || under.check() == Err(LeaseLost::Revoked) =>
            {
                // Asked for under an earlier registration of ours, or in the bot's group
                // before this worker joined it again (the answer was on its way meanwhile):
                // the grant may be the earlier incarnation's, which another worker may take
                // over at any moment. Nothing runs on it; the next pass claims again (a grant
                // that was the new incarnation's is granted again).
                debug!(%bot, "a claim granted to an earlier registration; claiming again");
                true
            }
            ClaimResult::Granted(fence) => {
                self.w.metrics.claim();
                let handed = self.takes.remove(&bot);
                if self.should_run(&bot) && !self.running.contains_key(&bot) {
                    self.start_bot(bot, fence, handed, under);
                    false
                } else if self.fenced {
                    // The claim ends with our lease; the next pass asks again.
                    false
                } else {
                    // The plan moved on while the claim was in flight (or we are draining).
                    let to = self.plan.owners.get(&bot).cloned();
                    let (coord, me) = (self.w.coord.clone(), self.me().clone());
                    self.jobs.spawn(async move {
                        give_up(&*coord, &bot, fence, to.as_ref(), &me).await;
                    });
                    false
                }
            }
            ClaimResult::Held(by) => {
                self.short += 1;
                // Handed to us while our claim was in flight: ask once more at once.
                if self.takes.remove(&bot) {
                    return true;
                }
                let now = Instant::now();
                self.held_by.insert(bot, (by, now));
                // Due a lease from now (the oldest one's wake-up, if sooner, stays armed).
                self.wake_at(now + self.w.cfg.lease);
                false
            }
            ClaimResult::Grace(d) => {
                self.short += 1;
                self.w.metrics.set_grace(d);
                self.wake_at(Instant::now() + d);
                false
            }
            ClaimResult::NotGranted => {
                self.short += 1;
                false
            }
        }
    }

    /// Wakes the loop when the oldest bot another worker held at our last try is due to be
    /// asked for again (a lease after its answer; not sooner than a tick from now, so a pass
    /// that could not get as far as dropping it does not spin).
    pub(super) fn arm_held_retry(&mut self) {
        if let Some(first) = self.held_by.values().map(|(_, at)| *at).min() {
            let soonest = Instant::now() + self.w.cfg.reconcile_every;
            self.wake_at((first + self.w.cfg.lease).max(soonest));
        }
    }

    /// Re-reads the units kept off workers (a transport that was down there) — once a tick,
    /// not every pass: the marks change rarely. The last list stays if the coordinator does
    /// not answer; marks of ours not yet listed stay too.
    pub(super) async fn refresh_avoid(&mut self) {
        match self.w.coord.avoidances().await {
            Ok(mut a) => {
                for m in self
                    .avoid
                    .iter()
                    .filter(|(b, w)| w == self.me() && self.avoid_pending.contains(b))
                {
                    if !a.contains(m) {
                        a.push(m.clone());
                    }
                }
                a.sort();
                self.avoid = a;
            }
            Err(e) => debug!(error = %e, "cannot read the avoided workers; keeping the last list"),
        }
    }

    /// How many bots the current plan gives this worker.
    pub(super) fn plan_share(&self) -> usize {
        self.plan.mine.len()
    }

    /// Journals the workers that joined or left since the last pass.
    fn note_members(&mut self, live: &[LiveWorker]) {
        let now: std::collections::HashSet<WorkerId> = live.iter().map(|l| l.id.clone()).collect();
        if let Some(before) = &self.members_seen {
            for w in now.difference(before) {
                self.note("worker_joined", None, Some(w.as_str()), None);
            }
            for w in before.difference(&now) {
                self.note("worker_left", None, Some(w.as_str()), None);
            }
        }
        self.members_seen = Some(now);
    }

    /// Starts the task of a bot we hold under `fence`; `handed` when its last owner handed
    /// it over (it ran there a moment ago, with credentials the platform accepted).
    fn start_bot(&mut self, bot: BotId, fence: Fence, handed: bool, lease: LeaseHandle) {
        let Some(rec) = self.registry.get(&bot) else {
            return;
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        let platform = rec.spec.platform;
        self.note(
            "bot_started",
            Some(bot.as_str()),
            None,
            Some(if handed { "handed over" } else { "claimed" }),
        );
        let tx = self.tx.clone();
        let b = bot.clone();
        let connector = self.w.connectors.get(&platform).cloned();
        let parked = connector.is_none();
        let task = match connector {
            Some(connector) => {
                let ctx = Box::new(BotCtx {
                    spec: rec.spec.clone(),
                    spec_at_ms: rec.updated_at_ms,
                    fence,
                    worker: self.me().to_string(),
                    store: self.w.store.clone(),
                    coord: self.w.coord.clone(),
                    connector,
                    handler: Handler::new(
                        rec.spec.handler.clone(),
                        self.w.http.clone(),
                        rec.spec.handler_timeout(self.w.cfg.handler_timeout),
                        &self.w.cfg.handlers,
                    ),
                    lease: lease.clone(),
                    metrics: self.w.metrics.clone(),
                    starter: self.starter.clone(),
                    reporter: self.w.reporter.clone(),
                    settings: BotSettings {
                        retry_for: self.w.cfg.handler_retry_for,
                        max_in_flight: self.w.cfg.max_in_flight,
                        verify: !handed,
                        transport_down: self.w.cfg.transport_down,
                        shard_recount: self.w.cfg.shard_recount_every,
                        slots: self.w.slots.clone(),
                        files: self.w.files.clone(),
                        later: self.w.later.clone(),
                        pace: self.w.pace.clone(),
                        mailboxes: self.w.mailboxes.clone(),
                    },
                    stop: stop_rx,
                    down_since: None,
                });
                tokio::spawn(async move {
                    let exit = ctx.run().await;
                    // Unbounded: an exit notice never waits for the loop.
                    let _ = tx.send(Signal::Exited(b, fence, exit));
                })
            }
            None => {
                // A registry written by a newer build, or a build without the platform: the
                // claim is kept (so no other worker of this build loops on it) and reported.
                let why = format!("platform {platform} is not supported by this worker");
                self.w
                    .reporter
                    .report(&bot, BotStatus::Failed, Some(&why), self.me().as_str());
                tokio::spawn(async move {
                    let _ = tx.send(Signal::Exited(b, fence, BotExit::Failed(why)));
                })
            }
        };
        self.running.insert(
            bot,
            Running {
                fence,
                stop: stop_tx,
                task,
                parked,
            },
        );
        lease.set_bots_held(self.running.len() as u32);
    }

    /// Clean shutdown: not ready → stop every bot and hand it to its next owner, all at once
    /// → wait for those jobs (and give up claims still arriving) → unregister.
    pub(super) async fn drain(&mut self, rx: &mut mpsc::UnboundedReceiver<Signal>) {
        self.w.ready.store(false, Ordering::SeqCst);
        self.draining = true;
        if let Some(h) = &self.w.hooks {
            h.begin_drain();
        }
        let started = Instant::now();
        let me = self.me().clone();
        info!(worker = %me, bots = self.running.len(), "draining");
        self.note(
            "draining",
            None,
            None,
            Some(&format!("{} bots to hand over", self.running.len())),
        );
        let others: Vec<LiveWorker> = match self.w.coord.live_workers().await {
            Ok(l) => l.into_iter().filter(|w| w.id != me).collect(),
            Err(_) => Vec::new(),
        };
        let (owners, _) = self.assign(&others);
        self.plan = Plan {
            inputs: None,
            owners: Arc::new(owners),
            mine: Arc::default(),
        };
        // Tell the others first, so that by their plans too our bots are theirs as we hand
        // them over (instead of still ours until we unregister). Commands to one worker keep
        // their order: this comes before any of our hand-overs.
        let note = WorkerCommand::Leaving { worker: me.clone() };
        for w in &others {
            if let Err(e) = self.w.coord.send_command(&w.id, &note).await {
                warn!(worker = %w.id, error = %e, "could not announce the leave; it learns when we unregister");
            }
        }
        let all: Vec<BotId> = self.running.keys().cloned().collect();
        for bot in all {
            let after = match self.plan.owners.get(&bot) {
                Some(to) => After::HandOver(to.clone()),
                None => After::Release,
            };
            self.let_go(&bot, after);
        }
        // Claims still in flight come back as signals: give those up too.
        let deadline = tokio::time::sleep(STOP_TIMEOUT * 2);
        tokio::pin!(deadline);
        while !self.jobs.is_empty() || !self.claiming.is_empty() {
            tokio::select! {
                Some(_) = self.jobs.join_next() => {}
                Some(sig) = rx.recv() => { self.on_signal(sig); }
                () = &mut deadline => {
                    warn!(jobs = self.jobs.len(), "drain jobs still running; the rest ends with our liveness");
                    break;
                }
            }
        }
        self.jobs.abort_all();
        // Turns being handled finish before our liveness ends: nobody takes one over while
        // it is still being answered here.
        if let Some(h) = &self.w.hooks {
            h.wait_idle(STOP_TIMEOUT).await;
        }
        if let Err(e) = self.w.coord.unregister().await {
            warn!(error = %e, "unregister failed; liveness ends with the lease");
        }
        // Nothing of this registration acts any more (the hooks' tasks stop asking).
        self.w.lease_tx.send_replace(None);
        if let Some(k) = self.keeper.take() {
            k.stop();
        }
        info!(worker = %me, elapsed_ms = started.elapsed().as_millis() as u64, "drained");
    }
}
