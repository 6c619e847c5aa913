//! A coordinator wrapper that can cut a worker off from the backend, or make every call hang
//! as on a blackholed link, to test self-fencing on any backend.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use botfleet_coord::{
    BucketTake, ClaimOutcome, CoordError, Coordinator, EpochInfo, EventCursor, Group,
    LifecycleEvent, LiveWorker, LockGuard, Owner, RateGrant, RateLimit, Renewal, Result,
    WorkerCommand, WorkerMeta,
};
use botfleet_core::{BotId, Fence, Incarnation, WorkerId};
use tokio::sync::mpsc;

/// Wraps a coordinator; while [`Partition::cut`] is on, every call fails as if the backend
/// were unreachable; while [`Partition::hang`] is on, every call waits (with no answer and no
/// error, as on a link whose packets are dropped) until the link is healed; while
/// [`Partition::hold_claim_answers`] is on, a claim reaches the backend but its answer waits
/// (as on a link slow on the way back).
#[derive(Debug, Clone)]
pub struct Partition {
    inner: Arc<dyn Coordinator>,
    cut: Arc<AtomicBool>,
    hung: tokio::sync::watch::Sender<bool>,
    claims_held: tokio::sync::watch::Sender<bool>,
    /// Claims the backend answered whose answers are waiting now.
    waiting: Arc<std::sync::atomic::AtomicUsize>,
}

impl Partition {
    /// Wraps `inner`, connected.
    pub fn new(inner: Arc<dyn Coordinator>) -> Self {
        Self {
            inner,
            cut: Arc::new(AtomicBool::new(false)),
            hung: tokio::sync::watch::Sender::new(false),
            claims_held: tokio::sync::watch::Sender::new(false),
            waiting: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        }
    }

    /// Holds the answers of claims (`true`) — each claim is made, its answer kept from the
    /// caller — until let go (`false`).
    pub fn hold_claim_answers(&self, on: bool) {
        self.claims_held.send_replace(on);
    }

    /// Claims made whose answers [`Self::hold_claim_answers`] is keeping now.
    pub fn claim_answers_held(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Makes every call hang (`true`) until healed (`false`); calls hung meanwhile then go on.
    pub fn hang(&self, on: bool) {
        self.hung.send_replace(on);
    }

    /// Cuts (`true`) or heals (`false`) the link.
    pub fn cut(&self, on: bool) {
        self.cut.store(on, Ordering::SeqCst);
    }

    async fn check(&self) -> Result<()> {
        // The sender lives as long as `self`: this ends only when healed.
        let _ = self.hung.subscribe().wait_for(|h| !*h).await;
        if self.cut.load(Ordering::SeqCst) {
            return Err(CoordError::Unreachable {
                what: "partitioned by test".into(),
                source: None,
            });
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Coordinator for Partition {
    async fn register(&self, w: &WorkerId, m: &WorkerMeta, l: Duration) -> Result<Incarnation> {
        self.check().await?;
        self.inner.register(w, m, l).await
    }
    async fn renew_with(&self, n: u32, rss: u64) -> Result<Renewal> {
        self.check().await?;
        self.inner.renew_with(n, rss).await
    }
    async fn unregister(&self) -> Result<()> {
        self.check().await?;
        self.inner.unregister().await
    }
    fn registration(&self) -> Option<(WorkerId, Incarnation)> {
        self.inner.registration()
    }
    fn registration_in(&self, g: Group) -> Option<(WorkerId, Incarnation)> {
        self.inner.registration_in(g)
    }
    async fn renew_groups(&self, n: u32, rss: u64) -> Vec<(Group, Result<Renewal>)> {
        match self.check().await {
            Ok(()) => self.inner.renew_groups(n, rss).await,
            Err(_) => self
                .inner
                .all_groups()
                .into_iter()
                .map(|g| {
                    let e = CoordError::Unreachable {
                        what: "partitioned by test".into(),
                        source: None,
                    };
                    (g, Err(e))
                })
                .collect(),
        }
    }
    async fn rejoin_group(&self, g: Group) -> Result<Incarnation> {
        self.check().await?;
        self.inner.rejoin_group(g).await
    }
    async fn live_workers(&self) -> Result<Vec<LiveWorker>> {
        self.check().await?;
        self.inner.live_workers().await
    }
    async fn member_signal(&self) -> Result<mpsc::Receiver<()>> {
        self.check().await?;
        self.inner.member_signal().await
    }
    async fn claim(&self, b: &BotId, f: Fence) -> Result<ClaimOutcome> {
        self.check().await?;
        let answer = self.inner.claim(b, f).await;
        let mut held = self.claims_held.subscribe();
        if *held.borrow() {
            /// Counts a held answer while it waits, also when its caller goes away.
            struct Waiting<'a>(&'a std::sync::atomic::AtomicUsize);
            impl Drop for Waiting<'_> {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Ordering::SeqCst);
                }
            }
            self.waiting.fetch_add(1, Ordering::SeqCst);
            let _waiting = Waiting(&self.waiting);
            // The sender lives as long as `self`: this ends only when let go.
            let _ = held.wait_for(|h| !*h).await;
        }
        answer
    }
    async fn release(&self, b: &BotId, f: Fence) -> Result<bool> {
        self.check().await?;
        self.inner.release(b, f).await
    }
    async fn hand_over(&self, b: &BotId, f: Fence, to: &WorkerId) -> Result<bool> {
        self.check().await?;
        self.inner.hand_over(b, f, to).await
    }
    async fn owner(&self, b: &BotId) -> Result<Option<Owner>> {
        self.check().await?;
        self.inner.owner(b).await
    }
    async fn publish(&self, e: &LifecycleEvent) -> Result<EventCursor> {
        self.check().await?;
        self.inner.publish(e).await
    }
    async fn events_head(&self) -> Result<EventCursor> {
        self.check().await?;
        self.inner.events_head().await
    }
    async fn read_events(
        &self,
        a: &EventCursor,
        m: usize,
        w: Duration,
    ) -> Result<Vec<(EventCursor, LifecycleEvent)>> {
        self.check().await?;
        self.inner.read_events(a, m, w).await
    }
    async fn send_command(&self, to: &WorkerId, c: &WorkerCommand) -> Result<()> {
        self.check().await?;
        self.inner.send_command(to, c).await
    }
    async fn recv_commands(&self, m: usize, w: Duration) -> Result<Vec<WorkerCommand>> {
        self.check().await?;
        self.inner.recv_commands(m, w).await
    }
    async fn epoch(&self) -> Result<Option<EpochInfo>> {
        self.check().await?;
        self.inner.epoch().await
    }
    fn groups(&self) -> u16 {
        self.inner.groups()
    }
    fn group_of_bot(&self, bot: &BotId) -> Group {
        self.inner.group_of_bot(bot)
    }
    fn group_of_chat(&self, chat: &str) -> Group {
        self.inner.group_of_chat(chat)
    }
    fn all_groups(&self) -> Vec<Group> {
        self.inner.all_groups()
    }
    async fn group_epochs(&self) -> Result<Vec<(Group, EpochInfo)>> {
        self.check().await?;
        self.inner.group_epochs().await
    }
    async fn acquire_rate_many(&self, k: &str, l: RateLimit, n: u32) -> Result<RateGrant> {
        self.check().await?;
        self.inner.acquire_rate_many(k, l, n).await
    }
    async fn take_buckets(&self, scopes: &[(&str, RateLimit)]) -> Result<BucketTake> {
        self.check().await?;
        self.inner.take_buckets(scopes).await
    }
    async fn take_buckets_yielding(&self, scopes: &[(&str, RateLimit)]) -> Result<BucketTake> {
        self.check().await?;
        self.inner.take_buckets_yielding(scopes).await
    }
    async fn pause_bucket(&self, k: &str, d: Duration) -> Result<()> {
        self.check().await?;
        self.inner.pause_bucket(k, d).await
    }
    async fn try_lead(&self, n: &str, t: Duration) -> Result<Option<Fence>> {
        self.check().await?;
        self.inner.try_lead(n, t).await
    }
    async fn acquire_lock_fenced(&self, k: &str, t: Duration) -> Result<Option<LockGuard>> {
        self.check().await?;
        self.inner.acquire_lock_fenced(k, t).await
    }
    async fn journal_append(&self, entries: &[String]) -> Result<()> {
        self.check().await?;
        self.inner.journal_append(entries).await
    }
    async fn journal_read(&self, after: Option<u64>, max: usize) -> Result<Vec<(u64, String)>> {
        self.check().await?;
        self.inner.journal_read(after, max).await
    }
    async fn avoid(&self, bot: &BotId, worker: &WorkerId, for_: Duration) -> Result<()> {
        self.check().await?;
        self.inner.avoid(bot, worker, for_).await
    }
    async fn avoidances(&self) -> Result<Vec<(BotId, WorkerId)>> {
        self.check().await?;
        self.inner.avoidances().await
    }
    async fn turn_take(&self, chat: &str, entry: &str) -> Result<(u64, botfleet_coord::Turn)> {
        self.check().await?;
        self.inner.turn_take(chat, entry).await
    }
    async fn turn_try(&self, chat: &str, ticket: u64) -> Result<botfleet_coord::Turn> {
        self.check().await?;
        self.inner.turn_try(chat, ticket).await
    }
    async fn turn_release(&self, chat: &str, ticket: u64, fence: Fence) -> Result<bool> {
        self.check().await?;
        self.inner.turn_release(chat, ticket, fence).await
    }
    async fn turn_wakeups(&self) -> Result<mpsc::Receiver<String>> {
        self.check().await?;
        self.inner.turn_wakeups().await
    }
    async fn renew_lock(&self, g: &LockGuard, t: Duration) -> Result<bool> {
        self.check().await?;
        self.inner.renew_lock(g, t).await
    }
    async fn release_lock(&self, g: &LockGuard) -> Result<bool> {
        self.check().await?;
        self.inner.release_lock(g).await
    }
}
