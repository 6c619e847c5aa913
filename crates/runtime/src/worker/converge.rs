//! Converging on the ring's assignment: claim what is ours, let go of what is not, and drain
//! on shutdown. Part of the worker's state machine (see the parent module).

use std::{collections::HashMap, sync::atomic::Ordering, time::Duration};

use botfleet_coord::{
    placement::{Ring, RingConfig, DEFAULT_BALANCE},
    ClaimOutcome,
};
use botfleet_core::{BotId, BotStatus, Fence, Platform, WorkerId};
use futures_util::{stream, StreamExt};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use super::{Running, Signal, State};
use crate::{
    bot::{BotCtx, BotExit},
    handler::Handler,
    starter::Starter,
};

impl State {
    /// Stops `bot` and hands it to `to` (or releases it).
    pub(super) async fn let_go(&mut self, bot: &BotId, to: Option<&WorkerId>) {
        let Some(r) = self.running.remove(bot) else {
            return;
        };
        let fence = r.fence;
        stop_task(r).await;
        let res = match to.filter(|t| *t != self.me()) {
            Some(t) => {
                self.w.metrics.handoff();
                self.w.coord.hand_over(bot, fence, t).await
            }
            None => self.w.coord.release(bot, fence).await,
        };
        if let Err(e) = res {
            // The claim then ends with our liveness; nobody runs the bot twice meanwhile.
            warn!(%bot, error = %e, "could not hand over; the claim will expire");
        }
    }

    /// Converges on our share. Unless `force`d, the placement is recomputed only when its
    /// inputs (members, capacities, registry) changed or some of our share is still unclaimed:
    /// an idle worker with thousands of bots costs one member listing per tick.
    pub(super) async fn reconcile(
        &mut self,
        starter: &Starter,
        tx: &mpsc::Sender<Signal>,
        force: bool,
    ) {
        let Some(lease) = self.lease.clone() else {
            return;
        };
        if lease.check().is_err() {
            return;
        }
        let live = match self.w.coord.live_workers().await {
            Ok(l) => l,
            Err(e) => {
                warn!(error = %e, "cannot list workers; placement unchanged");
                return;
            }
        };
        if !live.iter().any(|l| &l.id == self.me()) {
            return;
        }
        let inputs = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            for l in &live {
                (l.id.as_str(), l.incarnation.as_str(), l.meta.capacity).hash(&mut h);
            }
            self.generation.hash(&mut h);
            h.finish()
        };
        if !force && self.short == 0 && self.last_inputs == Some(inputs) {
            return;
        }
        self.last_inputs = Some(inputs);
        let caps: HashMap<WorkerId, u32> = live
            .iter()
            .map(|l| (l.id.clone(), l.meta.capacity))
            .collect();
        let ring = Ring::new(live.iter().map(|l| &l.id), RingConfig::default());
        let enabled: Vec<BotId> = self
            .registry
            .values()
            .filter(|r| r.spec.enabled)
            .map(|r| r.spec.id.clone())
            .collect();
        let plan = ring.assign(&enabled, DEFAULT_BALANCE, |w| caps.get(w).copied());
        self.w.metrics.set_unplaced(plan.unplaced.len());
        if !plan.unplaced.is_empty() {
            warn!(
                count = plan.unplaced.len(),
                "bots no live worker has room for"
            );
        }
        let me = self.me().clone();
        // Let go of what is no longer ours.
        let extra: Vec<BotId> = self
            .running
            .keys()
            .filter(|b| plan.owners.get(*b) != Some(&me))
            .cloned()
            .collect();
        for bot in extra {
            let to = plan.owners.get(&bot).cloned();
            self.let_go(&bot, to.as_ref()).await;
        }
        // Pass on bots handed to us that are not ours by our view.
        let takes: Vec<BotId> = self.takes.drain().collect();
        for bot in takes {
            match plan.owners.get(&bot) {
                Some(o) if *o == me => {}
                other => {
                    let min = self
                        .w
                        .store
                        .highest_fence(&bot)
                        .await
                        .unwrap_or(Fence::ZERO);
                    if let Ok(ClaimOutcome::Granted(f)) = self.w.coord.claim(&bot, min).await {
                        let _ = self.w.store.accept_fence(&bot, f).await;
                        let _ = match other {
                            Some(to) => self.w.coord.hand_over(&bot, f, to).await,
                            None => self.w.coord.release(&bot, f).await,
                        };
                    }
                }
            }
        }
        // Claim what is ours and not running, within capacity.
        let room = (self.w.cfg.capacity as usize).saturating_sub(self.running.len());
        let wanted: Vec<BotId> = plan
            .bots_of(&me)
            .into_iter()
            .filter(|b| !self.running.contains_key(*b))
            .take(room)
            .cloned()
            .collect();
        let asked = wanted.len();
        let (coord, store) = (self.w.coord.clone(), self.w.store.clone());
        let granted: Vec<(BotId, Fence)> = stream::iter(wanted)
            .map(|bot| {
                let (coord, store) = (coord.clone(), store.clone());
                async move {
                    let min = store.highest_fence(&bot).await.ok()?;
                    match coord.claim(&bot, min).await {
                        Ok(ClaimOutcome::Granted(f)) => match store.accept_fence(&bot, f).await {
                            Ok(()) => Some((bot, f)),
                            Err(e) => {
                                warn!(%bot, error = %e, "claim granted but the store refused its fence");
                                let _ = coord.release(&bot, f).await;
                                None
                            }
                        },
                        Ok(_) => None,
                        Err(e) => {
                            debug!(%bot, error = %e, "claim failed");
                            None
                        }
                    }
                }
            })
            .buffer_unordered(32)
            .filter_map(|x| async move { x })
            .collect()
            .await;
        self.short = asked - granted.len();
        for (bot, fence) in granted {
            self.w.metrics.claim();
            let Some(rec) = self.registry.get(&bot) else {
                continue;
            };
            let (stop_tx, stop_rx) = watch::channel(false);
            let ctx = BotCtx {
                spec: rec.spec.clone(),
                fence,
                worker: me.to_string(),
                store: self.w.store.clone(),
                telegram: self.w.telegram.clone(),
                handler: Handler::new(
                    rec.spec.handler.clone(),
                    self.w.http.clone(),
                    self.w.cfg.webhook_timeout,
                ),
                lease: lease.clone(),
                metrics: self.w.metrics.clone(),
                starter: starter.clone(),
                stop: stop_rx,
            };
            let platform = rec.spec.platform;
            let parked = platform != Platform::Telegram;
            let tx = tx.clone();
            let b = bot.clone();
            let task = tokio::spawn(async move {
                let exit = if platform == Platform::Telegram {
                    ctx.run().await
                } else {
                    BotExit::Failed(format!(
                        "platform {platform} is not supported by this worker yet"
                    ))
                };
                let _ = tx.send(Signal::Exited(b, fence, exit)).await;
            });
            if parked {
                let _ = self
                    .w
                    .store
                    .set_status(
                        &bot,
                        BotStatus::Failed,
                        Some("platform not supported yet"),
                        Some(me.as_str()),
                    )
                    .await;
            }
            self.running.insert(
                bot,
                Running {
                    fence,
                    platform,
                    stop: stop_tx,
                    task,
                    parked,
                },
            );
        }
        lease.set_bots_held(self.running.len() as u32);
    }

    /// Clean shutdown: not ready → stop each bot → hand it to its next owner → unregister.
    pub(super) async fn drain(&mut self) {
        self.w.ready.store(false, Ordering::SeqCst);
        let me = self.me().clone();
        info!(worker = %me, bots = self.running.len(), "draining");
        let others: Vec<WorkerId> = match self.w.coord.live_workers().await {
            Ok(l) => l.into_iter().map(|w| w.id).filter(|w| *w != me).collect(),
            Err(_) => Vec::new(),
        };
        let ring = Ring::new(&others, RingConfig::default());
        let running: Vec<(BotId, Running)> = self.running.drain().collect();
        let fences: Vec<(BotId, Fence, Platform, bool)> = running
            .iter()
            .map(|(b, r)| (b.clone(), r.fence, r.platform, r.parked))
            .collect();
        stream::iter(running.into_iter().map(|(_, r)| r))
            .for_each_concurrent(256, stop_task)
            .await;
        let coord = self.w.coord.clone();
        let metrics = self.w.metrics.clone();
        stream::iter(fences)
            .for_each_concurrent(64, |(bot, fence, _, _)| {
                let (coord, metrics) = (coord.clone(), metrics.clone());
                let to = ring.owner_of(&bot).cloned();
                async move {
                    let r = match to {
                        Some(t) => {
                            metrics.handoff();
                            coord.hand_over(&bot, fence, &t).await
                        }
                        None => coord.release(&bot, fence).await,
                    };
                    if let Err(e) = r {
                        warn!(%bot, error = %e, "hand-over failed; the claim ends with our liveness");
                    }
                }
            })
            .await;
        if let Err(e) = self.w.coord.unregister().await {
            warn!(error = %e, "unregister failed; liveness ends with the lease");
        }
        if let Some(k) = self.keeper.take() {
            k.stop();
        }
        info!(worker = %me, "drained");
    }
}

/// Asks a bot task to stop and waits (briefly) until it has: its poll is closed before the
/// bot is handed over, so the next owner never meets a second poller.
pub(super) async fn stop_task(r: Running) {
    let _ = r.stop.send(true);
    let mut task = r.task;
    if tokio::time::timeout(Duration::from_secs(5), &mut task)
        .await
        .is_err()
    {
        task.abort();
    }
}
