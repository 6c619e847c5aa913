//! Thousands of bots moving at once between two worker processes on one Redis, and the fleet
//! recovering from Redis losing its data.
//!
//! For each size: worker `a` runs every bot; `b` joins (time from `b`'s first claim pass,
//! when its `/readyz` turns 200, until every bot of its share was polled by it); `a` gets
//! SIGTERM (time until it exits, and until every bot it held was polled by `b`); a third
//! worker joins and is killed with SIGKILL (time until every bot it held was polled again).

use std::{
    io::{Read, Write},
    net::TcpStream,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use botfleet_coord::{
    placement::{Ring, RingConfig, DEFAULT_BALANCE},
    Coordinator, RedisConfig, RedisCoordinator,
};
use botfleet_core::{BotId, WorkerId};
use botfleet_testkit::{free_port, nonce, FakeTelegram, RedisServer};

use crate::{botfleet_bin, registry, spawn, token, Dir, Worker};

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

/// The tokens of `owner`'s share when the live workers are `workers`, as every worker
/// computes it (bounded assignment, every worker at capacity `cap`).
fn share(n: usize, workers: &[&str], owner: &str, cap: u32) -> Vec<String> {
    let ids: Vec<WorkerId> = workers
        .iter()
        .map(|w| WorkerId::new(*w).expect("worker id"))
        .collect();
    let bots: Vec<BotId> = (0..n)
        .map(|i| BotId::new(format!("b{i}")).expect("bot id"))
        .collect();
    let plan = Ring::new(&ids, RingConfig::default()).assign(&bots, DEFAULT_BALANCE, |_| Some(cap));
    let me = WorkerId::new(owner).expect("worker id");
    (0..n)
        .filter(|i| plan.owners.get(&bots[*i]) == Some(&me))
        .map(token)
        .collect()
}

struct Fleet {
    bin: std::path::PathBuf,
    db: String,
    redis: RedisServer,
    lease_ms: u64,
    _dir: Dir,
}

impl Fleet {
    fn worker(&self, id: &str, http_port: u16, poll_s: u64) -> anyhow::Result<Worker> {
        let (lease, port, poll) = (
            self.lease_ms.to_string(),
            format!("127.0.0.1:{http_port}"),
            poll_s.to_string(),
        );
        spawn(
            &self.bin,
            &[
                "--database-url",
                &self.db,
                "--redis-url",
                &self.redis.url(),
                "--worker-id",
                id,
                "--lease-ms",
                &lease,
                "--poll-timeout-s",
                &poll,
                "--connect-rate",
                "100000",
                "--capacity",
                "100000",
                "--http-addr",
                &port,
            ],
        )
    }
}

async fn setup(fake: &FakeTelegram, n: usize, lease_ms: u64) -> anyhow::Result<Fleet> {
    let redis = RedisServer::start()?;
    let dir = Dir(std::env::temp_dir().join(format!("botfleet-bench-{}", nonce())));
    std::fs::create_dir_all(&dir.0)?;
    let db = registry(&dir.0, fake, n).await?;
    Ok(Fleet {
        bin: botfleet_bin()?,
        db,
        redis,
        lease_ms,
        _dir: dir,
    })
}

/// Join, SIGTERM and kill -9 with `n` bots.
pub(crate) async fn moves(n: usize) -> anyhow::Result<()> {
    let fake = FakeTelegram::start().await?;
    let lease_ms = 15_000;
    let fleet = setup(&fake, n, lease_ms).await?;
    let poll_s = 9;
    let limit = Duration::from_secs(300);
    let (pa, pb, pc) = (free_port()?, free_port()?, free_port()?);
    let mut a = fleet.worker("a", pa, poll_s)?;
    let t = Instant::now();
    wait_until("a polls every bot", limit, || {
        fake.state().polled_since(t) == n
    })
    .await?;
    println!(
        "{n:>6} bots on worker a: all polling {:.2} s after start",
        t.elapsed().as_secs_f64()
    );

    // Join.
    let _b = fleet.worker("b", pb, poll_s)?;
    // Watched closely: b's first bots may be polling within milliseconds of it.
    let t = Instant::now();
    while http_status(pb, "/readyz") != Some(200) {
        if t.elapsed() > limit {
            bail!("b's first claim pass: not done after {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let ready = Instant::now();
    let mine_b = share(n, &["a", "b"], "b", 100_000);
    wait_until("b polls its share", limit, || {
        fake.state().polled_since_among(&mine_b, ready) == mine_b.len()
    })
    .await?;
    println!(
        "{n:>6} bots, join: {} bots polled by the newcomer {:.2} s after its first claim pass",
        mine_b.len(),
        ready.elapsed().as_secs_f64()
    );

    // SIGTERM a.
    let mine_a = share(n, &["a", "b"], "a", 100_000);
    let t = Instant::now();
    let ok = Command::new("kill")
        .args(["-TERM", &a.0.id().to_string()])
        .status()?
        .success();
    if !ok {
        bail!("kill -TERM failed");
    }
    let status = tokio::task::spawn_blocking(move || {
        let s = a.0.wait();
        (a, s)
    })
    .await?;
    let exited = t.elapsed();
    if !status
        .1
        .as_ref()
        .is_ok_and(std::process::ExitStatus::success)
    {
        bail!("a exited with {:?}", status.1);
    }
    drop(status.0);
    wait_until("b polls a's bots", limit, || {
        fake.state().polled_since_among(&mine_a, t) == mine_a.len()
    })
    .await?;
    println!(
        "{n:>6} bots, SIGTERM: {} bots handed over, exit {:.2} s after the signal, all polled by b {:.2} s after it",
        mine_a.len(),
        exited.as_secs_f64(),
        t.elapsed().as_secs_f64()
    );

    // kill -9 of a worker that joined.
    let mut c = fleet.worker("c", pc, poll_s)?;
    let mine_c = share(n, &["b", "c"], "c", 100_000);
    let t = Instant::now();
    wait_until("c polls its share", limit, || {
        fake.state().polled_since_among(&mine_c, t) == mine_c.len()
    })
    .await?;
    // Let c settle (its renewals running) before the kill.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t = Instant::now();
    c.0.kill()?;
    let _ = c.0.wait();
    wait_until("b polls c's bots", limit, || {
        fake.state().polled_since_among(&mine_c, t) == mine_c.len()
    })
    .await?;
    println!(
        "{n:>6} bots, kill -9: {} bots polled again {:.2} s after the kill (lease {:.1} s)",
        mine_c.len(),
        t.elapsed().as_secs_f64(),
        lease_ms as f64 / 1000.0
    );
    if fake.state().conflicts() > 0 {
        bail!("{} second pollers", fake.state().conflicts());
    }
    Ok(())
}

/// Redis loses its data (FLUSHALL, then a restart without persistence) under two workers
/// with `n` bots: time until every bot is polled by its new owner, and second pollers (none
/// expected: grants wait one lease after the loss).
pub(crate) async fn data_loss(n: usize) -> anyhow::Result<()> {
    let fake = FakeTelegram::start().await?;
    let lease_ms = 3_000;
    let mut fleet = setup(&fake, n, lease_ms).await?;
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
