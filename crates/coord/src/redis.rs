//! The Redis backend: one fleet's coordination state in one Redis (or one Cluster slot).

use std::{
    collections::{HashMap, HashSet},
    sync::{atomic::Ordering, Arc},
    time::Duration,
};

use async_trait::async_trait;
use botfleet_core::{BotId, Fence, Incarnation, WorkerId};
use futures_util::future::{join_all, try_join_all};
use redis::{
    streams::{StreamRangeReply, StreamReadReply},
    Script,
};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::{
    coordinator::{check_key, check_key_len, check_ttl, nonce, Knowledge, SeqAt},
    link::{Blocking, Link, RedisMode},
    BucketTake, ClaimOutcome, CoordError, Coordinator, EpochInfo, EventCursor, Group, KeySpace,
    LifecycleEvent, LiveWorker, LockGuard, Owner, RateGrant, RateLimit, Renewal, Result, Turn,
    WorkerCommand, WorkerMeta,
};

/// Settings of a [`RedisCoordinator`]. `Debug` hides the URL (it may hold a password).
#[derive(Clone)]
pub struct RedisConfig {
    pub(crate) url: String,
    prefix: String,
    /// How the URL is read: one Redis (default), or Sentinels naming the primary.
    pub mode: RedisMode,
    /// How long one call may wait for Redis. Default 2 s.
    pub response_timeout: Duration,
    /// How long connecting may take. Default 2 s.
    pub connect_timeout: Duration,
    /// Lifecycle events kept in the stream (approximate trim). Default 10,000.
    pub max_events: usize,
    /// How long a worker's unread commands are kept. Default 10 min.
    pub command_ttl: Duration,
    /// How many replicas must have a grant before it is acted on; `None`: the mode's default
    /// (see [`RedisConfig::min_replicas`]).
    min_replicas: Option<u32>,
    /// How many coordination groups the keys fall in (see [`RedisConfig::groups`]).
    groups: u16,
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &"<redacted>")
            .field("prefix", &self.prefix)
            .field("mode", &self.mode)
            .field("response_timeout", &self.response_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("max_events", &self.max_events)
            .field("command_ttl", &self.command_ttl)
            .field("min_replicas", &self.replicas_wanted())
            .field("groups", &self.groups)
            .finish()
    }
}

impl RedisConfig {
    /// Settings for the Redis at `url` (`redis://[:password@]host:port[/db]`), keys under
    /// `prefix` (default `botfleet`).
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            prefix: "botfleet".into(),
            mode: RedisMode::Standalone,
            response_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            max_events: 10_000,
            command_ttl: Duration::from_secs(600),
            min_replicas: None,
            groups: 1,
        }
    }

    /// Splits the coordination keys into `groups` groups (1–[`crate::MAX_GROUPS`], default
    /// 1), each under a hash tag of its own, with its own view of the workers' liveness and
    /// its own epoch (see [`KeySpace`]): every script then touches one group's keys, which a
    /// Redis Cluster keeps in one slot. A worker registers and renews in every group. One
    /// group is the layout every fleet had before groups. [`RedisCoordinator::connect`]
    /// refuses a count out of range.
    #[must_use]
    pub fn groups(mut self, groups: u16) -> Self {
        self.groups = groups;
        self
    }

    /// How many replicas must have a grant (a bot's claim, a chat's turn, a fenced lock)
    /// before the caller is told it holds it: Redis's `WAIT` after the granting script, in
    /// short waits until the call's deadline; fewer by then fails the call as an outage does
    /// ([`CoordError::Unreplicated`]) and the caller asks again. A failover may promote a
    /// replica that missed the primary's last writes; a grant it forgot would be granted a
    /// second time while its first holder still acts. Default: 1 in sentinel mode (a primary
    /// with no replica attached grants nothing), 0 for one Redis.
    #[must_use]
    pub fn min_replicas(mut self, n: u32) -> Self {
        self.min_replicas = Some(n);
        self
    }

    /// The replicas a grant waits for: [`RedisConfig::min_replicas`], else the mode's default.
    pub fn replicas_wanted(&self) -> u32 {
        self.min_replicas.unwrap_or(match self.mode {
            RedisMode::Standalone => 0,
            RedisMode::Sentinel { .. } => 1,
        })
    }

    /// Keys under `prefix` instead of `botfleet`; see [`KeySpace`].
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Sentinel mode: the URL is a comma-separated list of Redis Sentinels
    /// (`redis://[:password@]host:port`), and the keys live on the primary they name `master`.
    /// The URLs' password (and the first one's database) serve the primary; a Sentinel is
    /// asked without a password unless it answers `NOAUTH`. A failover is followed within
    /// seconds.
    #[must_use]
    pub fn sentinel(mut self, master: impl Into<String>) -> Self {
        self.mode = RedisMode::Sentinel {
            master: master.into(),
        };
        self
    }
}

struct Scripts {
    register: Script,
    renew: Script,
    unregister: Script,
    live: Script,
    claim: Script,
    release: Script,
    hand_over: Script,
    owner: Script,
    rate: Script,
    buckets: Script,
    bucket_pause: Script,
    lock_acquire: Script,
    lock_renew: Script,
    lock_release: Script,
    epoch_info: Script,
    turn: Script,
}

/// A script that needs the fleet epoch (see `lua/epoch.lua`), which is prepended to it.
fn with_epoch(body: &str) -> Script {
    Script::new(&format!("{}\n{body}", include_str!("lua/epoch.lua")))
}

static SCRIPTS: std::sync::LazyLock<Scripts> = std::sync::LazyLock::new(|| Scripts {
    register: with_epoch(include_str!("lua/register.lua")),
    renew: with_epoch(include_str!("lua/renew.lua")),
    unregister: Script::new(include_str!("lua/unregister.lua")),
    live: with_epoch(include_str!("lua/live.lua")),
    claim: with_epoch(include_str!("lua/claim.lua")),
    release: Script::new(include_str!("lua/release.lua")),
    hand_over: Script::new(include_str!("lua/hand_over.lua")),
    owner: Script::new(include_str!("lua/owner.lua")),
    rate: Script::new(include_str!("lua/rate.lua")),
    buckets: Script::new(include_str!("lua/buckets.lua")),
    bucket_pause: Script::new(include_str!("lua/bucket_pause.lua")),
    turn: with_epoch(include_str!("lua/turn.lua")),
    lock_acquire: with_epoch(include_str!("lua/lock_acquire.lua")),
    lock_renew: Script::new(include_str!("lua/lock_renew.lua")),
    lock_release: Script::new(include_str!("lua/lock_release.lua")),
    epoch_info: with_epoch(include_str!("lua/epoch_info.lua")),
});

#[derive(Debug, Clone)]
struct Registration {
    worker: WorkerId,
    incarnation: Incarnation,
    lease_ms: u64,
    meta: crate::WorkerMeta,
    /// Groups joined again on their own, with the incarnation there (the others hold
    /// `incarnation`).
    rejoined: HashMap<Group, Incarnation>,
    /// Groups where the liveness was found lost: not renewed until joined again.
    out: HashSet<Group>,
}

impl Registration {
    /// The incarnation this registration holds in group `g`.
    fn inc_in(&self, g: Group) -> &Incarnation {
        self.rejoined.get(&g).unwrap_or(&self.incarnation)
    }
}

/// A [`Coordinator`] on Redis. Cloning shares the connections and the registration.
///
/// Reconnects by itself after Redis restarts; calls made while Redis is away fail with
/// [`CoordError::Unreachable`] within the response timeout.
#[derive(Clone)]
pub struct RedisCoordinator {
    /// The server (in sentinel mode: the primary now) and the connections to it.
    link: Arc<Link>,
    ks: KeySpace,
    config: Arc<RedisConfig>,
    reg: Arc<std::sync::Mutex<Option<Registration>>>,
    known: Arc<Knowledge>,
    lead_token: String,
    /// When (unix ms) a grant short of replicas was last logged: once per
    /// [`UNREPLICATED_LOG_EVERY_MS`], not once per bot.
    unreplicated_logged: Arc<std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for RedisCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may hold a password: show only the key space.
        f.debug_struct("RedisCoordinator")
            .field("keyspace", &self.ks)
            .finish_non_exhaustive()
    }
}

impl RedisCoordinator {
    /// Takes a token from every bucket of `scopes` (buckets.lua), `yields` as
    /// [`Coordinator::take_buckets_yielding`].
    async fn take_buckets_as(
        &self,
        scopes: &[(&str, RateLimit)],
        yields: bool,
    ) -> Result<BucketTake> {
        crate::coordinator::check_scopes(scopes)?;
        let mut inv = SCRIPTS.buckets.prepare_invoke();
        for (key, limit) in scopes {
            inv.key(self.ks.bucket(key))
                .arg(format!("{:.12}", limit.per_second / 1000.0))
                .arg(limit.burst);
        }
        inv.arg(u8::from(yields));
        let (wait, short): (i64, i64) = self.run("take send buckets", inv).await?;
        Ok(BucketTake {
            wait: Duration::from_millis(wait.max(0).unsigned_abs()),
            short: usize::try_from(short).unwrap_or(0).min(scopes.len() - 1),
        })
    }

    /// Connects to Redis (in sentinel mode: asks the Sentinels for the primary first).
    ///
    /// # Errors
    /// [`CoordError::InvalidUrl`] for a malformed URL or prefix, [`CoordError::Unreachable`]
    /// when Redis (or every Sentinel) does not answer within the connect timeout.
    pub async fn connect(config: RedisConfig) -> Result<Self> {
        let ks = KeySpace::with_groups(&config.prefix, config.groups)?;
        let known = Arc::new(Knowledge::with_groups(ks.groups()));
        let config = Arc::new(config);
        let link = Link::connect(config.clone()).await?;
        Ok(Self {
            link,
            ks,
            config,
            reg: Arc::new(std::sync::Mutex::new(None)),
            known,
            lead_token: nonce(),
            unreplicated_logged: Arc::default(),
        })
    }

    /// The key space in use.
    pub fn keyspace(&self) -> &KeySpace {
        &self.ks
    }

    /// How many coordination groups the fleet's workers use, as its roster records it: `None`
    /// when no worker recorded it (a fleet that began before groups has one).
    ///
    /// # Errors
    /// Backend failures; a record that is not a number.
    pub async fn fleet_groups(&self) -> Result<Option<u16>> {
        let v: Option<String> = self
            .query(
                "read the fleet's layout",
                redis::cmd("HGET").arg(self.ks.layout()).arg("groups"),
            )
            .await?;
        v.map(|v| {
            v.parse().map_err(|_| CoordError::Protocol {
                what: "read the fleet's layout",
                detail: format!("groups is {v:?}"),
            })
        })
        .transpose()
    }

    fn reg(&self) -> Result<Registration> {
        self.reg
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(CoordError::NotRegistered)
    }

    /// The worker and its incarnation in group `g`: what a call in `g` acts for.
    fn member_in(&self, g: Group) -> Result<(WorkerId, Incarnation)> {
        self.reg
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|r| (r.worker.clone(), r.inc_in(g).clone()))
            .ok_or(CoordError::NotRegistered)
    }

    /// How long one call may take: twice the response timeout (a script load and its retry),
    /// and once registered at most half the lease. A call that hangs on a dead or slow link
    /// counts as failed before the lease could end: whoever awaits it (the worker's control
    /// loop) never stalls a lease on one call.
    fn deadline(&self) -> Duration {
        let base = self.config.response_timeout * 2;
        let lease_ms = self
            .reg
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|r| r.lease_ms);
        match lease_ms {
            Some(ms) => base.min(Duration::from_millis((ms / 2).max(50))),
            None => base,
        }
    }

    /// The outcome of a call made on `node`: a failure that says the server may no longer be
    /// the primary makes the link look for it (sentinel mode).
    fn checked<T>(
        &self,
        node: &Arc<crate::link::Node>,
        what: &'static str,
        deadline: Duration,
        r: std::result::Result<redis::RedisResult<T>, tokio::time::error::Elapsed>,
    ) -> Result<T> {
        match r {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                self.link.failed(node, Some(&e));
                Err(CoordError::redis(what, e))
            }
            Err(_) => {
                self.link.failed(node, None);
                Err(CoordError::Timeout(deadline))
            }
        }
    }

    /// Runs a script with a deadline (the response timeout covers a script load + retry).
    async fn run<T: redis::FromRedisValue>(
        &self,
        what: &'static str,
        inv: redis::ScriptInvocation<'_>,
    ) -> Result<T> {
        self.run_granting(what, inv, |_| false).await
    }

    /// [`RedisCoordinator::run`] for a script that may grant something: when `granted` says it
    /// did, the answer is given only once [`RedisConfig::replicas_wanted`] replicas have it
    /// (`WAIT` on the same connection, so it covers the script's writes), within the call's
    /// deadline. A grant not replicated in time fails the call; it stays written, and the
    /// caller asking again is granted again (claims and turns are granted again to their
    /// holder).
    async fn run_granting<T: redis::FromRedisValue>(
        &self,
        what: &'static str,
        inv: redis::ScriptInvocation<'_>,
        granted: impl FnOnce(&T) -> bool,
    ) -> Result<T> {
        let node = self.link.node();
        let mut conn = node.conn.clone();
        let deadline = self.deadline();
        let started = std::time::Instant::now();
        let r = tokio::time::timeout(deadline, inv.invoke_async(&mut conn)).await;
        let v = self.checked(&node, what, deadline, r)?;
        let wanted = self.config.replicas_wanted();
        if wanted == 0 || !granted(&v) {
            return Ok(v);
        }
        let mut rounds = 0u32;
        loop {
            rounds += 1;
            // Short waits: a WAIT holds the shared connection (the calls behind it queue)
            // until the replicas answer or its time is up (which Redis notices on its next
            // tick, up to 100 ms later at its default `hz`).
            let mut cmd = redis::cmd("WAIT");
            cmd.arg(wanted)
                .arg(u64::try_from(WAIT_SLICE.as_millis()).unwrap_or(10));
            let budget = WAIT_SLICE + self.config.response_timeout;
            let r = tokio::time::timeout(budget, cmd.query_async::<u64>(&mut conn)).await;
            let acked = self.checked(&node, what, budget, r)?;
            if acked >= u64::from(wanted) {
                if rounds > 1 {
                    debug!(what, rounds, took = ?started.elapsed(), "a grant waited for its replicas");
                }
                return Ok(v);
            }
            if started.elapsed() >= deadline {
                let now = wall_ms();
                let last = self.unreplicated_logged.load(Ordering::Relaxed);
                if now.saturating_sub(last) >= UNREPLICATED_LOG_EVERY_MS
                    && self
                        .unreplicated_logged
                        .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                        .is_ok()
                {
                    warn!(
                        what,
                        acked,
                        wanted,
                        primary = %node.addr,
                        "grants reach too few replicas in time (--redis-min-replicas): not acted on, asked again later"
                    );
                }
                return Err(CoordError::Unreplicated {
                    what,
                    acked,
                    wanted,
                    within: deadline,
                });
            }
        }
    }

    async fn query<T: redis::FromRedisValue>(
        &self,
        what: &'static str,
        cmd: &redis::Cmd,
    ) -> Result<T> {
        let node = self.link.node();
        let mut conn = node.conn.clone();
        let deadline = self.deadline();
        let r = tokio::time::timeout(deadline, cmd.query_async(&mut conn)).await;
        self.checked(&node, what, deadline, r)
    }

    /// Runs `lua/turn.lua`.
    async fn turn_call(
        &self,
        op: &'static str,
        chat: &str,
        arg: &str,
        fence: Fence,
    ) -> Result<(Vec<String>, SeqAt)> {
        check_key_len("chat key", chat, 300)?;
        let g = self.ks.group_of_chat(chat);
        let (worker, inc) = self.member_in(g)?;
        let at = self.known.seq_at(g);
        let mut inv = SCRIPTS.turn.prepare_invoke();
        let grace = self.known.grace_ms();
        inv.key(self.ks.workers_in(g))
            .key(self.ks.deadlines_in(g))
            .key(self.ks.turn(chat))
            .key(self.ks.epoch_in(g))
            .key(self.ks.seqs_in(g))
            .arg(op)
            .arg(worker.as_str())
            .arg(inc.as_str())
            .arg(arg)
            .arg(fence.0)
            .arg(self.ks.turn_wake_prefix())
            .arg(chat)
            .arg(abandoned_after_ms(grace))
            .arg(self.known.epoch(g))
            .arg(grace)
            .arg(nonce())
            .arg(after_loss_settle_ms(grace))
            .arg(at.seq);
        // A grant answers `granted` or `takeover` (after the ticket, for a take).
        let r = self
            .run_granting("turn", inv, |r: &Vec<String>| {
                r.iter().take(2).any(|a| a == "granted" || a == "takeover")
            })
            .await?;
        Ok((r, at))
    }

    /// A turn answer (`r`, to a call sent at `at`) about `chat`, the caller's new write
    /// sequence in its group noted.
    fn turn_answer(&self, chat: &str, at: SeqAt, r: &[String]) -> Result<Turn> {
        let (turn, seq) = parse_turn(r)?;
        self.known.saw_seq_at(self.ks.group_of_chat(chat), at, seq);
        Ok(turn)
    }

    /// How long a worker's command list is kept (ms).
    fn command_ttl_ms(&self) -> u64 {
        u64::try_from(self.config.command_ttl.as_millis()).unwrap_or(600_000)
    }

    /// The roster's membership keys, as `live.lua` reads them: workers, deadlines, metadata,
    /// renewals.
    fn membership_keys<'a, 's>(
        &self,
        inv: &'a mut redis::ScriptInvocation<'s>,
    ) -> &'a mut redis::ScriptInvocation<'s> {
        inv.key(self.ks.workers())
            .key(self.ks.deadlines())
            .key(self.ks.meta())
            .key(self.ks.beats())
    }

    /// Group `g`'s liveness keys as `register.lua` and `renew.lua` take them: workers,
    /// deadlines, epoch, write sequences, and for the roster (group 0) its metadata and
    /// renewals.
    fn liveness_keys<'a, 's>(
        &self,
        g: Group,
        inv: &'a mut redis::ScriptInvocation<'s>,
    ) -> &'a mut redis::ScriptInvocation<'s> {
        inv.key(self.ks.workers_in(g))
            .key(self.ks.deadlines_in(g))
            .key(self.ks.epoch_in(g))
            .key(self.ks.seqs_in(g));
        if g == Group::ZERO {
            inv.key(self.ks.meta()).key(self.ks.beats());
        }
        inv
    }

    /// `register.lua`'s keys in group `g`: its liveness keys, and the roster's layout.
    fn register_keys<'a, 's>(
        &self,
        g: Group,
        inv: &'a mut redis::ScriptInvocation<'s>,
    ) -> &'a mut redis::ScriptInvocation<'s> {
        self.liveness_keys(g, inv);
        if g == Group::ZERO {
            inv.key(self.ks.layout());
        }
        inv
    }

    /// Registers `worker` as incarnation `inc` in group `g` (`register.lua`): the roster
    /// announces the join. Notes the group's epoch and first write sequence.
    async fn register_in(
        &self,
        g: Group,
        worker: &WorkerId,
        inc: &Incarnation,
        lease_ms: u64,
        meta: &str,
    ) -> Result<()> {
        let roster = g == Group::ZERO;
        let mut inv = SCRIPTS.register.prepare_invoke();
        self.register_keys(g, &mut inv)
            .arg(worker.as_str())
            .arg(inc.as_str())
            .arg(lease_ms)
            .arg(if roster { meta } else { "" })
            .arg(if roster {
                self.ks.members_channel()
            } else {
                String::new()
            })
            .arg(self.known.epoch(g))
            .arg(self.known.grace_ms())
            .arg(nonce())
            .arg(self.ks.groups());
        let r: Vec<String> = self.run("register", inv).await?;
        let (epoch, seq) = match r.as_slice() {
            [what, fleet] if what == "groups" => {
                return Err(match fleet.parse() {
                    Ok(fleet) => CoordError::GroupsMismatch {
                        ours: self.ks.groups(),
                        fleet,
                    },
                    Err(_) => CoordError::Protocol {
                        what: "register",
                        detail: format!("the fleet's number of groups is {fleet:?}"),
                    },
                });
            }
            [_now, epoch, seq] => (
                epoch,
                seq.parse().map_err(|_| CoordError::Protocol {
                    what: "register",
                    detail: format!("write sequence {seq:?}"),
                })?,
            ),
            _ => {
                return Err(CoordError::Protocol {
                    what: "register",
                    detail: format!("reply has {} fields", r.len()),
                })
            }
        };
        self.known.saw_epoch(g, epoch);
        self.known.reset_seq(g, seq);
        Ok(())
    }

    /// Renews `reg` in group `g` (`renew.lua`): `false` when its liveness there is lost.
    async fn renew_in(&self, g: Group, reg: &Registration, meta: &str) -> Result<bool> {
        let roster = g == Group::ZERO;
        let at = self.known.seq_at(g);
        let mut inv = SCRIPTS.renew.prepare_invoke();
        self.liveness_keys(g, &mut inv)
            .arg(reg.worker.as_str())
            .arg(reg.inc_in(g).as_str())
            .arg(reg.lease_ms)
            .arg(if roster { meta } else { "" })
            .arg(self.known.epoch(g))
            .arg(at.seq)
            .arg(self.known.grace_ms())
            .arg(nonce());
        let seq: u64 = self.run("renew", inv).await?;
        if seq == 0 {
            return Ok(false);
        }
        self.known.saw_seq_at(g, at, seq);
        Ok(true)
    }

    /// Ends `reg`'s liveness in group `g` (`unregister.lua`): the roster announces the leave.
    async fn unregister_in(&self, g: Group, reg: &Registration) -> Result<()> {
        let mut inv = SCRIPTS.unregister.prepare_invoke();
        inv.key(self.ks.workers_in(g))
            .key(self.ks.deadlines_in(g))
            .key(self.ks.seqs_in(g));
        let channel = if g == Group::ZERO {
            inv.key(self.ks.meta()).key(self.ks.beats());
            self.ks.members_channel()
        } else {
            String::new()
        };
        inv.arg(reg.worker.as_str())
            .arg(reg.inc_in(g).as_str())
            .arg(channel);
        let _: i64 = self.run("unregister", inv).await?;
        Ok(())
    }

    /// Group `g`'s epoch (`epoch_info.lua`), `None` when it has none.
    async fn epoch_in(&self, g: Group) -> Result<Option<EpochInfo>> {
        let mut inv = SCRIPTS.epoch_info.prepare_invoke();
        inv.key(self.ks.epoch_in(g));
        let r: Vec<String> = self.run("epoch", inv).await?;
        if r.is_empty() {
            return Ok(None);
        }
        let ms = |s: &str| Duration::from_millis(s.parse().unwrap_or(0));
        match r.as_slice() {
            [id, age, left, lost] => Ok(Some(EpochInfo {
                id: id.clone(),
                age: ms(age),
                grace_left: ms(left),
                after_loss: lost == "1",
            })),
            _ => Err(CoordError::Protocol {
                what: "epoch",
                detail: format!("reply has {} fields", r.len()),
            }),
        }
    }
}

fn parse_fence(what: &'static str, s: &str) -> Result<Fence> {
    s.parse::<u64>()
        .map(Fence)
        .map_err(|_| CoordError::Protocol {
            what,
            detail: format!("fence {s:?} is not a number"),
        })
}

fn parse_worker(what: &'static str, s: &str) -> Result<WorkerId> {
    WorkerId::new(s).map_err(|e| CoordError::Protocol {
        what,
        detail: e.to_string(),
    })
}

fn parse_cursor(what: &'static str, s: &str) -> Result<EventCursor> {
    s.parse()
        .map_err(|detail| CoordError::Protocol { what, detail })
}

/// A worker command as it is pushed onto a command list (`what`: the operation, for errors).
fn command_json(what: &'static str, command: &WorkerCommand) -> Result<String> {
    serde_json::to_string(command).map_err(|e| CoordError::Protocol {
        what,
        detail: e.to_string(),
    })
}

fn meta_json(meta: &WorkerMeta) -> String {
    // Serialising a plain struct of strings and integers cannot fail.
    serde_json::to_string(meta).unwrap_or_else(|_| "{}".into())
}

#[async_trait]
impl Coordinator for RedisCoordinator {
    async fn register(
        &self,
        worker: &WorkerId,
        meta: &WorkerMeta,
        lease: Duration,
    ) -> Result<Incarnation> {
        let lease_ms = check_ttl("lease", lease)?;
        self.known.saw_lease(lease_ms);
        let inc = Incarnation::from_nonce(nonce());
        let json = meta_json(meta);
        let reg = Registration {
            worker: worker.clone(),
            incarnation: inc.clone(),
            lease_ms,
            meta: meta.clone(),
            rejoined: HashMap::new(),
            out: HashSet::new(),
        };
        let others = || {
            try_join_all(
                self.ks
                    .all_groups()
                    .skip(1)
                    .map(|g| self.register_in(g, worker, &inc, lease_ms, &json)),
            )
        };
        if self.fleet_groups().await?.unwrap_or(1) != self.ks.groups() {
            // The roster records another number of groups: it refuses this worker while the
            // fleet has live workers, so it is asked first, before anything is written in the
            // other groups; else this worker's number is recorded, and it joins them all.
            self.register_in(Group::ZERO, worker, &inc, lease_ms, &json)
                .await?;
            others().await?;
        } else {
            // The other groups first, together, and the roster last: a worker told of the
            // join finds the newcomer live in every group (a bot handed to it there is not
            // dropped as handed to a dead worker). A group that fails fails the registration;
            // what the others wrote expires with the lease (the next registration there
            // prunes it).
            others().await?;
            // The roster refuses a worker whose number of groups is not the live fleet's (it
            // changed since it was read): what it wrote in the other groups goes again.
            if let Err(e) = self
                .register_in(Group::ZERO, worker, &inc, lease_ms, &json)
                .await
            {
                if matches!(e, CoordError::GroupsMismatch { .. }) {
                    let _ = try_join_all(
                        self.ks
                            .all_groups()
                            .skip(1)
                            .map(|g| self.unregister_in(g, &reg)),
                    )
                    .await;
                }
                return Err(e);
            }
        }
        *self.reg.lock().unwrap_or_else(|e| e.into_inner()) = Some(reg);
        debug!(%worker, incarnation = %inc, lease_ms, "registered");
        Ok(inc)
    }

    async fn renew_with(&self, bots_held: u32, rss_bytes: u64) -> Result<Renewal> {
        crate::coordinator::whole_lease(self.renew_groups(bots_held, rss_bytes).await)
    }

    async fn renew_groups(&self, bots_held: u32, rss_bytes: u64) -> Vec<(Group, Result<Renewal>)> {
        let mut reg = match self.reg() {
            Ok(r) => r,
            Err(_) => {
                return self
                    .ks
                    .all_groups()
                    .map(|g| (g, Err(CoordError::NotRegistered)))
                    .collect()
            }
        };
        reg.meta.bots_held = bots_held;
        reg.meta.rss_bytes = rss_bytes;
        let json = meta_json(&reg.meta);
        // Every group at once (on one connection, pipelined), but a group already found lost.
        let renewed = join_all(self.ks.all_groups().map(|g| {
            let (reg, json) = (&reg, &json);
            async move {
                if reg.out.contains(&g) {
                    return (g, Ok(Renewal::Lost));
                }
                let r = self.renew_in(g, reg, json).await;
                (
                    g,
                    r.map(|ok| if ok { Renewal::Renewed } else { Renewal::Lost }),
                )
            }
        }))
        .await;
        let lost: Vec<Group> = renewed
            .iter()
            .filter(|(g, r)| matches!(r, Ok(Renewal::Lost)) && !reg.out.contains(g))
            .map(|(g, _)| *g)
            .collect();
        if !lost.is_empty() {
            // Out until joined again — unless this worker registered or joined the group again
            // while the renewal was on its way (then it was the earlier incarnation's loss).
            let mut cur = self.reg.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(cur) = cur.as_mut().filter(|c| c.incarnation == reg.incarnation) {
                for g in lost {
                    if cur.inc_in(g) == reg.inc_in(g) {
                        cur.out.insert(g);
                    }
                }
            }
        }
        renewed
    }

    async fn rejoin_group(&self, g: Group) -> Result<Incarnation> {
        if g.index() >= self.ks.groups() {
            return Err(CoordError::InvalidArgument(format!(
                "no coordination group {g}: this coordinator has {}",
                self.ks.groups()
            )));
        }
        let reg = self.reg()?;
        // A fresh incarnation: a call of the earlier one still on its way (a claim, a turn)
        // is refused there, not taken for the new one's.
        let inc = Incarnation::from_nonce(nonce());
        self.register_in(g, &reg.worker, &inc, reg.lease_ms, &meta_json(&reg.meta))
            .await?;
        let mut cur = self.reg.lock().unwrap_or_else(|e| e.into_inner());
        match cur.as_mut().filter(|c| c.incarnation == reg.incarnation) {
            Some(c) => {
                c.rejoined.insert(g, inc.clone());
                c.out.remove(&g);
                debug!(worker = %reg.worker, group = %g, incarnation = %inc, "joined a group again");
                Ok(inc)
            }
            // Registered again (or unregistered) meanwhile: that registration is the one.
            None => Err(CoordError::NotRegistered),
        }
    }

    async fn unregister(&self) -> Result<()> {
        let Ok(reg) = self.reg() else {
            return Ok(());
        };
        try_join_all(self.ks.all_groups().map(|g| self.unregister_in(g, &reg))).await?;
        *self.reg.lock().unwrap_or_else(|e| e.into_inner()) = None;
        Ok(())
    }

    fn registration(&self) -> Option<(WorkerId, Incarnation)> {
        self.reg
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|r| (r.worker.clone(), r.incarnation.clone()))
    }

    fn registration_in(&self, g: Group) -> Option<(WorkerId, Incarnation)> {
        self.member_in(g).ok()
    }

    async fn live_workers(&self) -> Result<Vec<LiveWorker>> {
        let mut inv = SCRIPTS.live.prepare_invoke();
        self.membership_keys(&mut inv)
            .key(self.ks.epoch())
            .arg(self.known.epoch(Group::ZERO))
            .arg(self.known.grace_ms())
            .arg(nonce());
        let flat: Vec<String> = self.run("list workers", inv).await?;
        let [now, _epoch, rest @ ..] = flat.as_slice() else {
            return Err(CoordError::Protocol {
                what: "list workers",
                detail: "short reply".into(),
            });
        };
        let now: u64 = now.parse().unwrap_or(0);
        let mut out = Vec::with_capacity(rest.len() / 5);
        for chunk in rest.chunks_exact(5) {
            let Ok(id) = WorkerId::new(chunk[0].as_str()) else {
                warn!(worker = %chunk[0].escape_debug(), "skipping a member with an invalid id");
                continue;
            };
            let meta: WorkerMeta = match serde_json::from_str(&chunk[2]) {
                Ok(m) => m,
                Err(e) => {
                    warn!(%id, error = %e, "member metadata unreadable; showing defaults");
                    WorkerMeta {
                        host: String::new(),
                        capacity: 0,
                        started_at_ms: 0,
                        bots_held: 0,
                        rss_bytes: 0,
                    }
                }
            };
            let beat: u64 = chunk[3].parse().unwrap_or(now);
            // The deadline is the last renewal plus the lease.
            let lease_ms = chunk[4].parse::<u64>().unwrap_or(0).saturating_sub(beat);
            self.known.saw_lease(lease_ms);
            out.push(LiveWorker {
                id,
                incarnation: Incarnation::from_nonce(chunk[1].clone()),
                meta,
                heartbeat_age_ms: now.saturating_sub(beat),
                lease: Duration::from_millis(lease_ms),
            });
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    async fn member_signal(&self) -> Result<mpsc::Receiver<()>> {
        let (tx, rx) = mpsc::channel(1);
        let link = self.link.clone();
        let channel = self.ks.members_channel();
        // Said once the first subscription is in place: a caller that lists the members after
        // this returns misses no join signalled in between.
        let (ready_tx, ready) = tokio::sync::oneshot::channel::<()>();
        let mut ready_tx = Some(ready_tx);
        // Owned by the receiver: the task ends once the receiver is dropped.
        tokio::spawn(async move {
            use futures_util::StreamExt;
            let mut moved = link.changes();
            while !tx.is_closed() {
                moved.borrow_and_update();
                let client = link.node().client.clone();
                let sub = async {
                    let mut ps = client.get_async_pubsub().await?;
                    ps.subscribe(&channel).await?;
                    Ok::<_, redis::RedisError>(ps)
                };
                match tokio::time::timeout(Duration::from_secs(2), sub).await {
                    Ok(Ok(ps)) => {
                        match ready_tx.take() {
                            Some(r) => {
                                let _ = r.send(());
                            }
                            // Subscribed again after a break: what changed meanwhile went
                            // unsignalled, so say "look again" now that signals flow.
                            None => {
                                let _ = tx.try_send(());
                            }
                        }
                        let mut stream = ps.into_on_message();
                        loop {
                            tokio::select! {
                                m = stream.next() => match m {
                                    Some(_) => { let _ = tx.try_send(()); }
                                    None => break,
                                },
                                // A new primary: subscribe there.
                                _ = moved.changed() => break,
                                () = tx.closed() => return,
                            }
                        }
                        // The subscription broke (Redis restarted, or a failover): membership
                        // may have changed.
                        let _ = tx.try_send(());
                    }
                    Ok(Err(e)) => debug!(error = %e, "member signal: subscribe failed; retrying"),
                    Err(_) => debug!("member signal: subscribe timed out; retrying"),
                }
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    () = tx.closed() => return,
                }
            }
        });
        // Not forever: without Redis the caller's poll still sees joins, later.
        let _ = tokio::time::timeout(Duration::from_secs(3), ready).await;
        Ok(rx)
    }

    async fn claim(&self, bot: &BotId, min_fence: Fence) -> Result<ClaimOutcome> {
        let g = self.ks.group_of_bot(bot);
        let (worker, inc) = self.member_in(g)?;
        let at = self.known.seq_at(g);
        let mut inv = SCRIPTS.claim.prepare_invoke();
        inv.key(self.ks.workers_in(g))
            .key(self.ks.deadlines_in(g))
            .key(self.ks.owner(bot))
            .key(self.ks.fence(bot))
            .key(self.ks.epoch_in(g))
            .key(self.ks.seqs_in(g))
            .arg(worker.as_str())
            .arg(inc.as_str())
            .arg(min_fence.0)
            .arg(self.known.epoch(g))
            .arg(self.known.grace_ms())
            .arg(nonce())
            .arg(at.seq);
        let r: Vec<String> = self
            .run_granting("claim", inv, |r: &Vec<String>| {
                r.first().is_some_and(|a| a == "granted")
            })
            .await?;
        match r.first().map(String::as_str) {
            Some("granted") if r.len() == 3 => {
                self.known.saw_seq_at(g, at, r[2].parse().unwrap_or(0));
                Ok(ClaimOutcome::Granted(parse_fence("claim", &r[1])?))
            }
            Some("grace") if r.len() == 2 => Ok(ClaimOutcome::Grace(Duration::from_millis(
                r[1].parse().unwrap_or(0),
            ))),
            Some("held") if r.len() == 5 => Ok(ClaimOutcome::Held(Owner {
                worker: parse_worker("claim", &r[1])?,
                incarnation: Incarnation::from_nonce(r[2].clone()),
                fence: parse_fence("claim", &r[3])?,
                live: true,
                handed_over: r[4] == "1",
            })),
            Some("notlive") => Ok(ClaimOutcome::NotLive),
            _ => Err(CoordError::Protocol {
                what: "claim",
                detail: format!("reply {r:?}"),
            }),
        }
    }

    async fn release(&self, bot: &BotId, fence: Fence) -> Result<bool> {
        let g = self.ks.group_of_bot(bot);
        let (worker, _) = self.member_in(g)?;
        let at = self.known.seq_at(g);
        let mut inv = SCRIPTS.release.prepare_invoke();
        inv.key(self.ks.owner(bot))
            .key(self.ks.seqs_in(g))
            .arg(worker.as_str())
            .arg(fence.0)
            .arg(at.seq);
        let seq: i64 = self.run("release", inv).await?;
        self.known.saw_seq_at(g, at, seq.max(0).unsigned_abs());
        Ok(seq >= 0)
    }

    async fn hand_over(&self, bot: &BotId, fence: Fence, to: &WorkerId) -> Result<bool> {
        // The target's command list is the roster's: pushed in the script when the bot's keys
        // share its tag (group 0, so always with one group), else right after it.
        let g = self.ks.group_of_bot(bot);
        let (worker, _) = self.member_in(g)?;
        let take = WorkerCommand::Take {
            bot: bot.clone(),
            from: worker.clone(),
        };
        let in_script = g == Group::ZERO;
        let at = self.known.seq_at(g);
        let mut inv = SCRIPTS.hand_over.prepare_invoke();
        inv.key(self.ks.workers_in(g))
            .key(self.ks.deadlines_in(g))
            .key(self.ks.owner(bot))
            .key(self.ks.seqs_in(g))
            .arg(worker.as_str())
            .arg(fence.0)
            .arg(to.as_str())
            .arg(at.seq);
        if in_script {
            inv.key(self.ks.commands(to))
                .arg(command_json("hand over", &take)?)
                .arg(self.command_ttl_ms());
        }
        let answer: Result<(i64, u64)> = self.run("hand over", inv).await;
        // Not in the script: told also when the script's answer was lost (it may have run; a
        // Take for a bot not handed over is answered `Held` and dropped).
        if !in_script && matches!(answer, Ok((1, _)) | Err(_)) {
            if let Err(e) = self.send_command(to, &take).await {
                warn!(%bot, to = %to, error = %e, "cannot tell the target of a hand-over to take the bot");
            }
        }
        let (r, seq) = answer?;
        self.known.saw_seq_at(g, at, seq);
        Ok(r != 0)
    }

    async fn owner(&self, bot: &BotId) -> Result<Option<Owner>> {
        let g = self.ks.group_of_bot(bot);
        let mut inv = SCRIPTS.owner.prepare_invoke();
        inv.key(self.ks.workers_in(g))
            .key(self.ks.deadlines_in(g))
            .key(self.ks.owner(bot))
            .arg(self.known.grace_ms());
        let r: Vec<String> = self.run("owner", inv).await?;
        if r.is_empty() {
            return Ok(None);
        }
        if r.len() != 5 {
            return Err(CoordError::Protocol {
                what: "owner",
                detail: format!("reply has {} fields", r.len()),
            });
        }
        Ok(Some(Owner {
            worker: parse_worker("owner", &r[0])?,
            incarnation: Incarnation::from_nonce(r[1].clone()),
            fence: parse_fence("owner", &r[2])?,
            handed_over: r[3] == "1",
            live: r[4] == "1",
        }))
    }

    async fn publish(&self, event: &LifecycleEvent) -> Result<EventCursor> {
        let json = serde_json::to_string(event).map_err(|e| CoordError::Protocol {
            what: "publish",
            detail: e.to_string(),
        })?;
        let id: String = self
            .query(
                "publish",
                redis::cmd("XADD")
                    .arg(self.ks.events())
                    .arg("MAXLEN")
                    .arg("~")
                    .arg(self.config.max_events)
                    .arg("*")
                    .arg("e")
                    .arg(json),
            )
            .await?;
        parse_cursor("publish", &id)
    }

    async fn events_head(&self) -> Result<EventCursor> {
        let r: StreamRangeReply = self
            .query(
                "events head",
                redis::cmd("XREVRANGE")
                    .arg(self.ks.events())
                    .arg("+")
                    .arg("-")
                    .arg("COUNT")
                    .arg(1),
            )
            .await?;
        match r.ids.first() {
            Some(e) => parse_cursor("events head", &e.id),
            None => Ok(EventCursor::START),
        }
    }

    async fn read_events(
        &self,
        after: &EventCursor,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<(EventCursor, LifecycleEvent)>> {
        let max = max.clamp(1, 10_000);
        let deadline = tokio::time::Instant::now() + wait;
        let mut after = after.clone();
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let mut cmd = redis::cmd("XREAD");
            cmd.arg("COUNT").arg(max);
            let block_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
            if block_ms > 0 {
                cmd.arg("BLOCK").arg(block_ms);
            }
            cmd.arg("STREAMS")
                .arg(self.ks.events())
                .arg(after.to_string());
            let reply: Option<StreamReadReply> = if block_ms > 0 {
                let node = self.link.node();
                let conn = node.blocking(Blocking::Events, &self.config).await?;
                let mut conn = conn.lock().await;
                let limit = left + self.config.response_timeout;
                let r = tokio::time::timeout(limit, cmd.query_async(&mut *conn)).await;
                drop(conn);
                self.checked(&node, "read events", limit, r)?
            } else {
                self.query("read events", &cmd).await?
            };
            let Some(reply) = reply else {
                return Ok(Vec::new());
            };
            let mut out = Vec::new();
            for entry in reply.keys.into_iter().flat_map(|k| k.ids) {
                let cursor = parse_cursor("read events", &entry.id)?;
                let event = entry
                    .map
                    .get("e")
                    .and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
                    .and_then(|s| serde_json::from_str::<LifecycleEvent>(&s).ok());
                match event {
                    Some(ev) => out.push((cursor.clone(), ev)),
                    None => warn!(event_id = %entry.id, "skipping an unreadable lifecycle event"),
                }
                after = cursor;
            }
            // Only unreadable entries: read on past them rather than returning an empty batch
            // that would make the caller spin.
            if !out.is_empty() || left.is_zero() {
                return Ok(out);
            }
        }
    }

    async fn send_command(&self, to: &WorkerId, command: &WorkerCommand) -> Result<()> {
        let json = command_json("send command", command)?;
        let key = self.ks.commands(to);
        let ttl = self.command_ttl_ms();
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("RPUSH")
            .arg(&key)
            .arg(json)
            .ignore()
            .cmd("PEXPIRE")
            .arg(&key)
            .arg(ttl)
            .ignore();
        let node = self.link.node();
        let mut conn = node.conn.clone();
        let deadline = self.deadline();
        let r = tokio::time::timeout(deadline, pipe.query_async::<()>(&mut conn)).await;
        self.checked(&node, "send command", deadline, r)
    }

    async fn journal_append(&self, entries: &[String]) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let n = entries.len() as u64;
        let last: u64 = self
            .query(
                "append to the journal",
                redis::cmd("INCRBY").arg(self.ks.journal_seq()).arg(n),
            )
            .await?;
        let key = self.ks.journal();
        let mut add = redis::cmd("ZADD");
        add.arg(&key);
        for (i, e) in entries.iter().enumerate() {
            let pos = last + 1 - n + i as u64;
            add.arg(pos).arg(format!("{pos}|{e}"));
        }
        let _: i64 = self.query("append to the journal", &add).await?;
        let keep = i64::try_from(crate::JOURNAL_KEEP).unwrap_or(i64::MAX);
        let _: i64 = self
            .query(
                "trim the journal",
                redis::cmd("ZREMRANGEBYRANK")
                    .arg(&key)
                    .arg(0)
                    .arg(-keep - 1),
            )
            .await?;
        Ok(())
    }

    async fn journal_read(&self, after: Option<u64>, max: usize) -> Result<Vec<(u64, String)>> {
        let key = self.ks.journal();
        let max = i64::try_from(max.max(1)).unwrap_or(i64::MAX);
        let raw: Vec<String> = match after {
            Some(a) => {
                self.query(
                    "read the journal",
                    redis::cmd("ZRANGEBYSCORE")
                        .arg(&key)
                        .arg(format!("({a}"))
                        .arg("+inf")
                        .arg("LIMIT")
                        .arg(0)
                        .arg(max),
                )
                .await?
            }
            None => {
                self.query(
                    "read the journal",
                    redis::cmd("ZRANGE").arg(&key).arg(-max).arg(-1),
                )
                .await?
            }
        };
        Ok(raw
            .into_iter()
            .filter_map(|m| {
                let (pos, e) = m.split_once('|')?;
                Some((pos.parse().ok()?, e.to_owned()))
            })
            .collect())
    }

    async fn avoid(&self, bot: &BotId, worker: &WorkerId, for_: Duration) -> Result<()> {
        let until = wall_ms() + check_ttl("avoid time", for_)?;
        let _: i64 = self
            .query(
                "avoid",
                redis::cmd("HSET")
                    .arg(self.ks.avoid())
                    .arg(format!("{}|{}", bot.as_str(), worker.as_str()))
                    .arg(until),
            )
            .await?;
        Ok(())
    }

    async fn avoidances(&self) -> Result<Vec<(BotId, WorkerId)>> {
        let all: HashMap<String, u64> = self
            .query("avoidances", redis::cmd("HGETALL").arg(self.ks.avoid()))
            .await?;
        let now = wall_ms();
        let mut out = Vec::new();
        let mut expired = Vec::new();
        for (field, until) in all {
            if until <= now {
                expired.push(field);
                continue;
            }
            let parsed = field
                .split_once('|')
                .and_then(|(b, w)| Some((BotId::new(b).ok()?, WorkerId::new(w).ok()?)));
            match parsed {
                Some(p) => out.push(p),
                None => expired.push(field),
            }
        }
        if !expired.is_empty() {
            let _: std::result::Result<i64, _> = self
                .query(
                    "avoidances",
                    redis::cmd("HDEL").arg(self.ks.avoid()).arg(&expired),
                )
                .await;
        }
        out.sort();
        Ok(out)
    }

    async fn turn_take(&self, chat: &str, entry: &str) -> Result<(u64, Turn)> {
        let (r, at) = self.turn_call("take", chat, entry, Fence::ZERO).await?;
        let ticket =
            r.first()
                .and_then(|t| t.parse().ok())
                .ok_or_else(|| CoordError::Protocol {
                    what: "turn take",
                    detail: format!("reply {r:?}"),
                })?;
        Ok((ticket, self.turn_answer(chat, at, &r[1..])?))
    }

    async fn turn_try(&self, chat: &str, ticket: u64) -> Result<Turn> {
        let (r, at) = self
            .turn_call("try", chat, &ticket.to_string(), Fence::ZERO)
            .await?;
        self.turn_answer(chat, at, &r)
    }

    async fn turn_release(&self, chat: &str, ticket: u64, fence: Fence) -> Result<bool> {
        let (r, at) = self
            .turn_call("release", chat, &ticket.to_string(), fence)
            .await?;
        if let Some(seq) = r.get(1).and_then(|s| s.parse().ok()) {
            self.known.saw_seq_at(self.ks.group_of_chat(chat), at, seq);
        }
        Ok(r.first().is_some_and(|v| v == "1"))
    }

    async fn turn_wakeups(&self) -> Result<mpsc::Receiver<String>> {
        use futures_util::StreamExt;
        let reg = self.reg()?;
        let (tx, rx) = mpsc::channel(1024);
        let link = self.link.clone();
        let channel = self.ks.turn_wake(&reg.worker);
        let subscribe = |client: redis::Client, channel: String| async move {
            let sub = async {
                let mut ps = client.get_async_pubsub().await?;
                ps.subscribe(&channel).await?;
                Ok::<_, redis::RedisError>(ps)
            };
            match tokio::time::timeout(Duration::from_secs(2), sub).await {
                Ok(r) => r.map_err(|e| CoordError::redis("subscribe to turn wake-ups", e)),
                Err(_) => Err(CoordError::Timeout(Duration::from_secs(2))),
            }
        };
        // Subscribed before answering: a release after this call wakes the caller.
        let mut moved = link.changes();
        let mut ps = Some(subscribe(link.node().client.clone(), channel.clone()).await?);
        tokio::spawn(async move {
            while !tx.is_closed() {
                let current = match ps.take() {
                    Some(p) => Ok(p),
                    None => {
                        moved.borrow_and_update();
                        subscribe(link.node().client.clone(), channel.clone()).await
                    }
                };
                if let Ok(p) = current {
                    let mut stream = p.into_on_message();
                    loop {
                        tokio::select! {
                            m = stream.next() => match m {
                                Some(m) => {
                                    if let Ok(chat) = m.get_payload::<String>() {
                                        let _ = tx.try_send(chat);
                                    }
                                }
                                None => break,
                            },
                            // A new primary: subscribe there.
                            _ = moved.changed() => break,
                            () = tx.closed() => return,
                        }
                    }
                } else {
                    debug!("turn wake-ups: subscribe failed; retrying");
                }
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    () = tx.closed() => return,
                }
            }
        });
        Ok(rx)
    }

    async fn recv_commands(&self, max: usize, wait: Duration) -> Result<Vec<WorkerCommand>> {
        let reg = self.reg()?;
        let key = self.ks.commands(&reg.worker);
        let max = max.clamp(1, 10_000);
        let mut raw: Vec<String> = self
            .query("receive commands", redis::cmd("LPOP").arg(&key).arg(max))
            .await
            .map(|v: Option<Vec<String>>| v.unwrap_or_default())?;
        if raw.is_empty() && !wait.is_zero() {
            let node = self.link.node();
            let conn = node.blocking(Blocking::Commands, &self.config).await?;
            let mut conn = conn.lock().await;
            let limit = wait + self.config.response_timeout;
            let r = tokio::time::timeout(
                limit,
                redis::cmd("BLPOP")
                    .arg(&key)
                    .arg(wait.as_secs_f64())
                    .query_async(&mut *conn),
            )
            .await;
            drop(conn);
            let got: Option<(String, String)> =
                self.checked(&node, "receive commands", limit, r)?;
            if let Some((_, v)) = got {
                raw.push(v);
                // A burst (a worker handing thousands of bots over) woke us: take what else
                // queued up at once, instead of one blocking read per command.
                if max > 1 {
                    let more: Option<Vec<String>> = self
                        .query(
                            "receive commands",
                            redis::cmd("LPOP").arg(&key).arg(max - 1),
                        )
                        .await?;
                    raw.extend(more.unwrap_or_default());
                }
            }
        }
        Ok(raw
            .into_iter()
            .filter_map(|s| match serde_json::from_str(&s) {
                Ok(c) => Some(c),
                Err(e) => {
                    warn!(error = %e, "skipping an unreadable worker command");
                    None
                }
            })
            .collect())
    }

    async fn acquire_rate_many(&self, key: &str, limit: RateLimit, n: u32) -> Result<RateGrant> {
        check_key("rate limiter key", key)?;
        let n = n.max(1);
        let mut inv = SCRIPTS.rate.prepare_invoke();
        inv.key(self.ks.rate(key))
            .arg(format!("{:.12}", limit.per_second / 1000.0))
            .arg(limit.burst)
            .arg(n);
        let (taken, wait): (i64, i64) = self.run("rate limit", inv).await?;
        Ok(RateGrant {
            taken: u32::try_from(taken.clamp(0, i64::from(n))).unwrap_or(0),
            wait: Duration::from_millis(wait.max(0).unsigned_abs()),
        })
    }

    async fn take_buckets(&self, scopes: &[(&str, RateLimit)]) -> Result<BucketTake> {
        self.take_buckets_as(scopes, false).await
    }

    async fn take_buckets_yielding(&self, scopes: &[(&str, RateLimit)]) -> Result<BucketTake> {
        self.take_buckets_as(scopes, true).await
    }

    async fn pause_bucket(&self, key: &str, for_: Duration) -> Result<()> {
        check_key("send bucket key", key)?;
        let ms = crate::coordinator::check_pause(for_)?;
        let mut inv = SCRIPTS.bucket_pause.prepare_invoke();
        inv.key(self.ks.bucket(key)).arg(ms);
        let _: i64 = self.run("pause a send bucket", inv).await?;
        Ok(())
    }

    async fn epoch(&self) -> Result<Option<EpochInfo>> {
        // With groups: the roster's epoch, in the window of the group that waits longest (a
        // group that lost its data makes its bots wait, not the others').
        Ok(EpochInfo::combine(
            self.group_epochs().await?.into_iter().map(|(_, e)| e),
        ))
    }

    fn groups(&self) -> u16 {
        self.ks.groups()
    }

    fn group_of_bot(&self, bot: &BotId) -> Group {
        self.ks.group_of_bot(bot)
    }

    fn group_of_chat(&self, chat: &str) -> Group {
        self.ks.group_of_chat(chat)
    }

    fn all_groups(&self) -> Vec<Group> {
        self.ks.all_groups().collect()
    }

    async fn group_epochs(&self) -> Result<Vec<(Group, EpochInfo)>> {
        let each = try_join_all(self.ks.all_groups().map(|g| self.epoch_in(g))).await?;
        Ok(self
            .ks
            .all_groups()
            .zip(each)
            .filter_map(|(g, e)| Some((g, e?)))
            .collect())
    }

    async fn try_lead(&self, name: &str, ttl: Duration) -> Result<Option<Fence>> {
        check_key("leader name", name)?;
        let lock = format!("lead:{name}");
        let g = lock_acquire(self, &lock, &self.lead_token, ttl).await?;
        Ok(g.map(|g| g.fence))
    }

    async fn acquire_lock_fenced(&self, key: &str, ttl: Duration) -> Result<Option<LockGuard>> {
        check_key("lock key", key)?;
        let g = lock_acquire(self, &format!("lock:{key}"), &nonce(), ttl).await?;
        Ok(g.map(|mut g| {
            g.key = key.to_owned();
            g
        }))
    }

    async fn renew_lock(&self, guard: &LockGuard, ttl: Duration) -> Result<bool> {
        let ttl = check_ttl("lock ttl", ttl)?;
        let mut inv = SCRIPTS.lock_renew.prepare_invoke();
        inv.key(self.ks.lock(&format!("lock:{}", guard.key)))
            .arg(&guard.token)
            .arg(ttl);
        let r: i64 = self.run("renew lock", inv).await?;
        Ok(r == 1)
    }

    async fn release_lock(&self, guard: &LockGuard) -> Result<bool> {
        let mut inv = SCRIPTS.lock_release.prepare_invoke();
        inv.key(self.ks.lock(&format!("lock:{}", guard.key)))
            .arg(&guard.token);
        let r: i64 = self.run("release lock", inv).await?;
        Ok(r == 1)
    }
}

async fn lock_acquire(
    c: &RedisCoordinator,
    name: &str,
    token: &str,
    ttl: Duration,
) -> Result<Option<LockGuard>> {
    let ttl = check_ttl("lock ttl", ttl)?;
    let mut inv = SCRIPTS.lock_acquire.prepare_invoke();
    inv.key(c.ks.lock(name))
        .key(c.ks.lock_fence(name))
        .key(c.ks.epoch())
        .arg(token)
        .arg(ttl)
        .arg(c.known.epoch(Group::ZERO))
        .arg(c.known.grace_ms())
        .arg(nonce());
    let (fence, epoch): (i64, String) = c
        .run_granting("acquire lock", inv, |(fence, _): &(i64, String)| *fence > 0)
        .await?;
    c.known.saw_epoch(Group::ZERO, &epoch);
    Ok((fence > 0).then(|| LockGuard {
        key: name.to_owned(),
        token: token.to_owned(),
        fence: Fence(fence.unsigned_abs()),
    }))
}

/// How often, at most, grants short of replicas are logged (ms).
const UNREPLICATED_LOG_EVERY_MS: u64 = 10_000;

/// The longest one `WAIT` for a grant's replicas holds the shared connection.
const WAIT_SLICE: Duration = Duration::from_millis(10);

/// This machine's wall clock in unix ms (for marks that only need to expire roughly on time).
/// After how long a ticket whose turn came, held by nobody, counts as abandoned although its
/// taker is live: a lease (the longest the fleet uses), at least 5 s. A live taker asks again
/// within half its lease even when a wake-up was lost.
pub(crate) fn abandoned_after_ms(lease_ms: u64) -> u64 {
    lease_ms.max(5_000)
}

/// How long after a loss's grace window (`grace_ms`) turns report `after_loss`.
pub(crate) fn after_loss_settle_ms(grace_ms: u64) -> u64 {
    let floor = u64::try_from(crate::AFTER_LOSS_SETTLE.as_millis()).unwrap_or(u64::MAX);
    grace_ms.saturating_mul(10).max(floor)
}

/// Reads a turn answer (see `lua/turn.lua`).
/// A turn answer of turn.lua and, for a grant, the caller's new write sequence (0 otherwise).
fn parse_turn(r: &[String]) -> Result<(Turn, u64)> {
    let bad = || CoordError::Protocol {
        what: "turn",
        detail: format!("reply {r:?}"),
    };
    let num = |s: &String| s.parse::<u64>().map_err(|_| bad());
    match r.first().map(String::as_str) {
        Some("granted") if r.len() == 5 => Ok((
            Turn::Granted {
                ticket: num(&r[1])?,
                fence: Fence(num(&r[2])?),
                after_loss: r[3] == "1",
            },
            num(&r[4])?,
        )),
        Some("takeover") if r.len() == 6 => Ok((
            Turn::TakeOver {
                ticket: num(&r[1])?,
                entry: r[2].clone(),
                fence: Fence(num(&r[3])?),
                after_loss: r[4] == "1",
            },
            num(&r[5])?,
        )),
        Some("wait") => Ok((Turn::Wait, 0)),
        Some("passed") => Ok((Turn::Passed, 0)),
        Some("notlive") => Ok((Turn::NotLive, 0)),
        _ => Err(bad()),
    }
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
