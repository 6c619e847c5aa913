//! Thousands of bots moving at once between two worker processes on one Redis, and the fleet
//! recovering from Redis losing its data.
//!
//! For each size: worker `a` runs every bot (above 10,000 bots, `a` and `b` share them); `j`
//! joins (time from `j`'s first claim pass, when its `/readyz` turns 200, until every bot of
//! its share was polled by it); `a` gets SIGTERM (time until it exits, and until every bot it
//! held was polled by the others); `k` joins and is killed with SIGKILL (time until every bot
//! it held was polled again). The fake Bot API runs in shard processes (see shards.rs).

use std::{
    io::{Read, Write},
    net::TcpStream,
    process::Command,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{bail, Context};
use botfleet_coord::{
    placement::{Ring, RingConfig, DEFAULT_BALANCE},
    Coordinator, RedisConfig, RedisCoordinator,
};
use botfleet_core::{BotId, WorkerId};
use botfleet_testkit::{free_port, nonce, FakeTelegram, RedisServer};

use crate::{botfleet_bin, registry_at, shards::Shards, spawn, token, Dir, Worker};

/// The status code of `GET path` on a loopback port, if anything answers.
fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = [0u8; 12];
    s.read_exact(&mut buf).ok()?;
    std::str::from_utf8(&buf[9..12]).ok()?.parse().ok()
}

async fn wait_until<F: FnMut() -> bool>(
    what: &str,
    limit: Duration,
    mut f: F,
) -> anyhow::Result<()> {
    let t = Instant::now();
    while !f() {
        if t.elapsed() > limit {
            bail!("{what}: not done after {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Ok(())
}

/// The indexes of `owner`'s bots when the live workers are `workers`, as every worker
/// computes it (bounded assignment, every worker at the same capacity).
fn share(n: usize, workers: &[&str], owner: &str) -> Vec<usize> {
    let ids: Vec<WorkerId> = workers
        .iter()
        .map(|w| WorkerId::new(*w).expect("worker id"))
        .collect();
    let bots: Vec<BotId> = (0..n)
        .map(|i| BotId::new(format!("b{i}")).expect("bot id"))
        .collect();
    let plan =
        Ring::new(&ids, RingConfig::default()).assign(&bots, DEFAULT_BALANCE, |_| Some(CAPACITY));
    let me = WorkerId::new(owner).expect("worker id");
    (0..n)
        .filter(|i| plan.owners.get(&bots[*i]) == Some(&me))
        .collect()
}

/// Every worker's capacity: never the limit here.
const CAPACITY: u32 = 100_000;

struct Fleet {
    bin: std::path::PathBuf,
    db: String,
    redis: RedisServer,
    redis_url: String,
    lease_ms: u64,
    _dir: Dir,
}

impl Fleet {
    fn worker(&self, id: &str, http_port: u16, poll_s: u64) -> anyhow::Result<Worker> {
        self.worker_with(
            id,
            http_port,
            &[
                "--poll-timeout-s",
                &poll_s.to_string(),
                "--connect-rate",
                "100000",
            ],
        )
    }

    /// A worker with `extra` flags (none: every default but the lease and the capacity).
    fn worker_with(&self, id: &str, http_port: u16, extra: &[&str]) -> anyhow::Result<Worker> {
        let (lease, port, cap) = (
            self.lease_ms.to_string(),
            format!("127.0.0.1:{http_port}"),
            CAPACITY.to_string(),
        );
        let mut args = vec![
            "--database-url",
            &self.db,
            "--redis-url",
            self.redis_url.as_str(),
            "--worker-id",
            id,
            "--lease-ms",
            &lease,
            "--capacity",
            &cap,
            "--http-addr",
            &port,
        ];
        args.extend_from_slice(extra);
        spawn(&self.bin, &args)
    }
}

async fn fleet_at(
    n: usize,
    lease_ms: u64,
    url_of: impl Fn(usize) -> String,
) -> anyhow::Result<Fleet> {
    let redis = RedisServer::start()?;
    let dir = Dir(std::env::temp_dir().join(format!("botfleet-bench-{}", nonce())));
    std::fs::create_dir_all(&dir.0)?;
    let db = registry_at(&dir.0, n, url_of).await?;
    Ok(Fleet {
        bin: botfleet_bin()?,
        db,
        redis_url: redis.url(),
        redis,
        lease_ms,
        _dir: dir,
    })
}

/// Waits until every bot of `bots` was polled at or after `since`; answers when the last of
/// them was first polled, after `since`.
async fn polled(
    shards: &Shards,
    what: &str,
    bots: &[usize],
    since: SystemTime,
    limit: Duration,
) -> anyhow::Result<Duration> {
    let t = Instant::now();
    loop {
        let p = shards.polls(bots, since)?;
        if p.polled == bots.len() {
            return Ok(p
                .last_first
                .and_then(|l| l.duration_since(since).ok())
                .unwrap_or_default());
        }
        if t.elapsed() > limit {
            bail!(
                "{what}: {} of {} polled after {limit:?}",
                p.polled,
                bots.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn sigterm(w: Worker) -> anyhow::Result<Duration> {
    let t = Instant::now();
    if !Command::new("kill")
        .args(["-TERM", &w.0.id().to_string()])
        .status()?
        .success()
    {
        bail!("kill -TERM failed");
    }
    let (w, status) = tokio::task::spawn_blocking(move || {
        let mut w = w;
        let s = w.0.wait();
        (w, s)
    })
    .await?;
    let took = t.elapsed();
    drop(w);
    if !status.as_ref().is_ok_and(std::process::ExitStatus::success) {
        bail!("SIGTERM: exited with {status:?}");
    }
    Ok(took)
}

/// Waits for a worker's first claim pass (its `/readyz` turning 200), watched closely: its
/// first bots may be polling within milliseconds of it.
async fn ready(port: u16, limit: Duration) -> anyhow::Result<SystemTime> {
    let t = Instant::now();
    while http_status(port, "/readyz") != Some(200) {
        if t.elapsed() > limit {
            bail!("first claim pass: not done after {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(SystemTime::now())
}

/// Join, SIGTERM and kill -9 with `n` bots. Up to 10,000 bots, one worker holds them all at
/// first; above that, two (a process may not hold 20,000 connections here: see shards.rs).
pub(crate) async fn moves(n: usize) -> anyhow::Result<()> {
    let shards = Shards::start(n, 10_000)?;
    let lease_ms = 15_000;
    let fleet = fleet_at(n, lease_ms, |i| shards.url_of(i)).await?;
    let poll_s = 9;
    let limit = Duration::from_secs(300);
    let base: &[&str] = if n > 10_000 { &["a", "b"] } else { &["a"] };
    let all: Vec<usize> = (0..n).collect();
    let t = SystemTime::now();
    let mut workers = Vec::new();
    for id in base {
        workers.push(fleet.worker(id, free_port()?, poll_s)?);
    }
    let up = polled(&shards, "every bot polling", &all, t, limit).await?;
    println!(
        "{n:>6} bots on {} worker(s): all polling {:.2} s after start",
        base.len(),
        up.as_secs_f64()
    );

    // Join.
    let pj = free_port()?;
    let _j = fleet.worker("j", pj, poll_s)?;
    let since = ready(pj, limit).await?;
    let members: Vec<&str> = base.iter().copied().chain(["j"]).collect();
    let mine_j = share(n, &members, "j");
    let took = polled(
        &shards,
        "the newcomer polls its share",
        &mine_j,
        since,
        limit,
    )
    .await?;
    println!(
        "{n:>6} bots, join: {} bots polled by the newcomer {:.2} s after its first claim pass",
        mine_j.len(),
        took.as_secs_f64()
    );

    // SIGTERM a.
    let mine_a = share(n, &members, "a");
    let since = SystemTime::now();
    let exited = sigterm(workers.remove(0)).await?;
    let took = polled(&shards, "a's bots polled elsewhere", &mine_a, since, limit).await?;
    println!(
        "{n:>6} bots, SIGTERM: {} bots handed over, exit {:.2} s after the signal, all polled by the others {:.2} s after it",
        mine_a.len(),
        exited.as_secs_f64(),
        took.as_secs_f64()
    );

    // kill -9 of a worker that joined.
    let pk = free_port()?;
    let mut k = fleet.worker("k", pk, poll_s)?;
    let members: Vec<&str> = members[1..].iter().copied().chain(["k"]).collect();
    let mine_k = share(n, &members, "k");
    let since = ready(pk, limit).await?;
    polled(&shards, "k polls its share", &mine_k, since, limit).await?;
    // Let k settle (its renewals running) before the kill.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let since = SystemTime::now();
    k.0.kill()?;
    let _ = k.0.wait();
    let took = polled(&shards, "k's bots polled again", &mine_k, since, limit).await?;
    println!(
        "{n:>6} bots, kill -9: {} bots polled again {:.2} s after the kill (lease {:.1} s)",
        mine_k.len(),
        took.as_secs_f64(),
        lease_ms as f64 / 1000.0
    );
    let conflicts = shards.polls(&[], since)?.conflicts;
    if conflicts > 0 {
        bail!("{conflicts} second pollers");
    }
    Ok(())
}

/// Failover at the defaults (connect rates, poll timeout, lease 15 s): three workers hold
/// `per_worker` bots each; one gets SIGTERM (time until every bot it held is polled by the
/// others), comes back, and is killed with SIGKILL (the same, against lease + 2 s).
pub(crate) async fn failover(per_worker: usize) -> anyhow::Result<()> {
    let n = per_worker * 3;
    let shards = Shards::start(n, 10_000)?;
    let lease_ms = 15_000;
    let fleet = fleet_at(n, lease_ms, |i| shards.url_of(i)).await?;
    let limit = Duration::from_secs(300);
    let names = ["a", "b", "c"];
    let all: Vec<usize> = (0..n).collect();
    let t = SystemTime::now();
    let mut workers = Vec::new();
    for id in names {
        workers.push(fleet.worker_with(id, free_port()?, &[])?);
    }
    let up = polled(&shards, "every bot polling", &all, t, limit).await?;
    let mine_a = share(n, &names, "a");
    println!(
        "{n:>6} bots on 3 workers at the default connect rates: all polling {:.2} s after start; a holds {}",
        up.as_secs_f64(),
        mine_a.len()
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    // CPU seconds each process spends from the signal until the hand-over is done.
    let pids: Vec<(String, u32)> = names
        .iter()
        .zip(&workers)
        .map(|(n, w)| ((*n).to_owned(), w.0.id()))
        .chain(fleet.redis.pid().map(|p| ("redis".to_owned(), p)))
        .chain(shards.pids().into_iter().map(|p| ("fake".to_owned(), p)))
        .collect();
    let ticks0: Vec<u64> = pids.iter().map(|(_, p)| crate::cpu_ticks(*p)).collect();
    let a_ticks = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let since = SystemTime::now();
    let w = workers.remove(0);
    let (a_pid, watch) = (w.0.id(), a_ticks.clone());
    // a's own ticks, read until it exits.
    let sampler = tokio::spawn(async move {
        loop {
            let t = crate::cpu_ticks(a_pid);
            if t == 0 {
                return;
            }
            watch.store(t, std::sync::atomic::Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    let exited = sigterm(w).await?;
    let took = polled(&shards, "a's bots polled elsewhere", &mine_a, since, limit).await?;
    sampler.abort();
    let mut spent: Vec<(String, f64)> = Vec::new();
    for ((name, pid), t0) in pids.iter().zip(ticks0) {
        let t1 = if name == "a" {
            a_ticks.load(std::sync::atomic::Ordering::Relaxed)
        } else {
            crate::cpu_ticks(*pid)
        };
        let s = t1.saturating_sub(t0) as f64 / 100.0;
        match spent.iter_mut().find(|(n, _)| n == name) {
            Some((_, v)) => *v += s,
            None => spent.push((name.clone(), s)),
        }
    }
    let spent: Vec<String> = spent.iter().map(|(n, s)| format!("{n} {s:.2}")).collect();
    println!(
        "{n:>6} bots, SIGTERM of a worker holding {}: exit {:.2} s after the signal, all its bots polled by the others {:.2} s after it (CPU seconds meanwhile: {})",
        mine_a.len(),
        exited.as_secs_f64(),
        took.as_secs_f64(),
        spent.join(", ")
    );
    let pa = free_port()?;
    let mut a = fleet.worker_with("a", pa, &[])?;
    let since = ready(pa, limit).await?;
    polled(&shards, "a polls its share again", &mine_a, since, limit).await?;
    // Let a settle (its renewals running) before the kill.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let since = SystemTime::now();
    a.0.kill()?;
    let _ = a.0.wait();
    let took = polled(&shards, "a's bots polled again", &mine_a, since, limit).await?;
    println!(
        "{n:>6} bots, kill -9 of a worker holding {}: all its bots polled again {:.2} s after the kill (lease {:.1} s: goal {:.1} s)",
        mine_a.len(),
        took.as_secs_f64(),
        lease_ms as f64 / 1000.0,
        lease_ms as f64 / 1000.0 + 2.0
    );
    // Over the whole run: start, SIGTERM, restart and kill.
    let conflicts = shards.polls(&[], t)?.conflicts;
    if conflicts > 0 {
        bail!("{conflicts} second pollers");
    }
    Ok(())
}

/// Redis loses its data (FLUSHALL, then a restart without persistence) under two workers
/// with `n` bots: time until every bot is polled by its new owner, and second pollers (none
/// expected: grants wait one lease after the loss).
pub(crate) async fn data_loss(n: usize) -> anyhow::Result<()> {
    let fake = FakeTelegram::start().await?;
    let lease_ms = 3_000;
    for i in 0..n {
        fake.state().add_bot(&token(i));
    }
    let mut fleet = fleet_at(n, lease_ms, |_| fake.url()).await?;
    let _a = fleet.worker("a", free_port()?, 2)?;
    let _b = fleet.worker("b", free_port()?, 2)?;
    let t = Instant::now();
    let limit = Duration::from_secs(120);
    wait_until("all bots polling", limit, || {
        fake.state().polled_since(t) == n
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for what in ["FLUSHALL", "restart"] {
        let lost = Instant::now();
        if what == "FLUSHALL" {
            fleet.redis.flushall()?;
        } else {
            fleet.redis.restart()?;
        }
        // Every old owner knows within a third of the lease; later polls are new owners'.
        let new_owners = lost + Duration::from_millis(lease_ms / 2);
        wait_until("every bot polled by its new owner", limit, || {
            fake.state().polled_since(new_owners) == n
        })
        .await?;
        let last = fake
            .state()
            .first_polls_since(new_owners)
            .into_iter()
            .max()
            .map_or(Duration::ZERO, |p| p.duration_since(lost));
        let coord = RedisCoordinator::connect(RedisConfig::new(fleet.redis.url())).await?;
        let epoch = coord.epoch().await?.context("no epoch after the loss")?;
        println!(
            "{n:>6} bots, 2 workers, Redis {what}: every bot polled by its new owner {:.2} s after the loss (lease {:.1} s; epoch after a loss: {}); second pollers {}",
            last.as_secs_f64(),
            lease_ms as f64 / 1000.0,
            epoch.after_loss,
            fake.state().conflicts()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    if fake.state().conflicts() > 0 {
        bail!("{} second pollers", fake.state().conflicts());
    }
    Ok(())
}

/// Redis's `INFO commandstats`, summed: (scripts run, every command — a script's own calls
/// included).
fn command_counts(redis: &RedisServer) -> anyhow::Result<(u64, u64)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", redis.port()))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"*2\r\n$4\r\nINFO\r\n$12\r\ncommandstats\r\n")?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n") {
        s.read_exact(&mut byte)?;
        head.push(byte[0]);
    }
    let len: usize = std::str::from_utf8(&head[1..head.len() - 2])?.parse()?;
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)?;
    let (mut scripts, mut all) = (0, 0);
    for line in String::from_utf8_lossy(&body).lines() {
        let Some((name, stats)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let calls: u64 = stats
            .split(',')
            .find_map(|kv| kv.strip_prefix("calls="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        all += calls;
        if name == "evalsha" || name == "eval" {
            scripts += calls;
        }
    }
    Ok((scripts, all))
}

/// Redis load of one worker at steady state (every bot polling, nothing changing), by
/// number of bots and of coordination groups: a renewal per group each lease/3 and the
/// worker's own reads, none per bot.
pub(crate) async fn coord_load(
    sizes: &[usize],
    groups: &[u16],
    window: Duration,
) -> anyhow::Result<()> {
    let lease_ms = 15_000;
    let limit = Duration::from_secs(300);
    for &n in sizes {
        let shards = Shards::start(n, 10_000)?;
        let all: Vec<usize> = (0..n).collect();
        for &g in groups {
            let fleet = fleet_at(n, lease_ms, |i| shards.url_of(i)).await?;
            let t = SystemTime::now();
            let g_arg = g.to_string();
            let _w = fleet.worker_with(
                "a",
                free_port()?,
                &[
                    "--poll-timeout-s",
                    "9",
                    "--connect-rate",
                    "100000",
                    "--coord-groups",
                    &g_arg,
                ],
            )?;
            polled(&shards, "every bot polling", &all, t, limit).await?;
            // Past the start's claims and the first renewals.
            tokio::time::sleep(Duration::from_secs(5)).await;
            let (s0, c0) = command_counts(&fleet.redis)?;
            let t0 = Instant::now();
            tokio::time::sleep(window).await;
            let (s1, c1) = command_counts(&fleet.redis)?;
            let secs = t0.elapsed().as_secs_f64();
            println!(
                "{n:>6} bots, {g:>4} coordination groups: {:.1} scripts/s, {:.1} Redis commands/s (scripts' own calls included), one worker at steady state, lease {:.0} s, over {:.0} s",
                (s1 - s0) as f64 / secs,
                (c1 - c0) as f64 / secs,
                lease_ms as f64 / 1000.0,
                secs
            );
        }
    }
    Ok(())
}
